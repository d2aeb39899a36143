//! Expressions from Kubernetes' docs ("Common Expression Language in Kubernetes") and k8s.io/apiserver's library
//! tests, with the results kube documents.

use std::sync::Mutex;

use serde_json::json;

use super::*;

const DECLARED: &[&str] = &["object", "oldObject", "request", "params", "namespaceObject", "variables", "authorizer"];

fn object() -> serde_json::Value {
    json!({
        "apiVersion": "demo.k8s.io/v1beta1",
        "kind": "PodSet",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web", "app.kubernetes.io/name": "web"}},
        "spec": {
            "replicas": 3,
            "template": {"spec": {"containers": [
                {"name": "main", "image": "registry.example.com/web:1.2", "securityContext": {"privileged": false}},
                {"name": "sidecar", "image": "docker.io/library/envoy:1.30"}
            ]}}
        }
    })
}

fn activation() -> Activation {
    let mut a = Activation::new();
    a.bind("object", value::from_json(&object()));
    a.bind("oldObject", Value::Null);
    a
}

/// Evaluates `expr` against [`object`], and again against only what it reads of it: both must agree.
fn eval(expr: &str) -> Result<serde_json::Value, String> {
    let p = compile(expr, DECLARED).map_err(|e| e.to_string())?;
    let run = |a: &Activation| {
        p.eval(a, &mut Budget::default())
            .map(|v| value::to_json(&v).unwrap_or_else(|| json!(format!("{v:?}"))))
            .map_err(|e| e.to_string())
    };
    let whole = run(&activation());
    let mut projected = Activation::new();
    projected.bind("object", p.projection("object").project(Some(&object())));
    projected.bind("oldObject", Value::Null);
    assert_eq!(run(&projected), whole, "{expr}: the projection of the object changes the result");
    whole
}

/// What an expression reads of `object`.
fn reads(expr: &str) -> serde_json::Value {
    let p = compile(expr, DECLARED).unwrap();
    value::to_json(&p.projection("object").project(Some(&object()))).unwrap()
}

#[test]
fn an_expression_is_given_only_what_it_reads() {
    assert_eq!(reads("object.spec.replicas <= 5"), json!({"spec": {"replicas": 3}}));
    assert_eq!(
        reads("has(object.metadata.annotations) || object.metadata.?labels.?app == optional.of('web')"),
        json!({"metadata": {"labels": {"app": "web"}}})
    );
    assert_eq!(
        reads("object.spec.template.spec.containers[0].name == 'main'"),
        json!({"spec": {"template": {"spec": {"containers": object()["spec"]["template"]["spec"]["containers"]}}}})
    );
    // A comprehension's variable hides the name: nothing of the object is read.
    assert_eq!(reads("[{'spec': 1}].all(object, object.spec == 1)"), json!(null));
    assert_eq!(reads("object == object"), object());
    assert_eq!(reads("1 == 1"), json!(null));
}

#[test]
fn expressions_evaluate_as_kubernetes_documents() {
    let cases: &[(&str, serde_json::Value)] = &[
        // Objects and fields.
        ("object.spec.replicas <= 5", json!(true)),
        ("object.metadata.name == 'web'", json!(true)),
        ("object.metadata.labels['app.kubernetes.io/name']", json!("web")),
        ("has(object.spec.replicas)", json!(true)),
        ("has(object.spec.paused)", json!(false)),
        ("has(object.metadata.annotations)", json!(false)),
        ("'app' in object.metadata.labels", json!(true)),
        ("oldObject == null", json!(true)),
        ("object.spec.replicas + 1", json!(4)),
        ("object.spec.replicas / 2", json!(1)),
        ("double(object.spec.replicas) / 2.0", json!(1.5)),
        // Macros.
        (
            "object.spec.template.spec.containers.all(c, !has(c.securityContext) || !has(c.securityContext.privileged) || !c.securityContext.privileged)",
            json!(true),
        ),
        ("object.spec.template.spec.containers.exists(c, c.name == 'sidecar')", json!(true)),
        ("object.spec.template.spec.containers.exists_one(c, c.image.startsWith('docker.io/'))", json!(true)),
        ("object.spec.template.spec.containers.map(c, c.name)", json!(["main", "sidecar"])),
        ("object.spec.template.spec.containers.filter(c, c.image.startsWith('registry.example.com/')).size()", json!(1)),
        ("[1, 2, 3].all(x, x > 0)", json!(true)),
        ("[1, 2, 3].map(x, x * 2)", json!([2, 4, 6])),
        ("size(object.metadata.labels)", json!(2)),
        // Optional fields.
        ("object.?spec.?paused.orValue(false)", json!(false)),
        ("object.spec.?replicas.hasValue()", json!(true)),
        ("object.metadata.?annotations.hasValue()", json!(false)),
        // Strings (cel-go ext.Strings).
        ("'hello'.charAt(1)", json!("e")),
        ("'hello mellow'.indexOf('ello')", json!(1)),
        ("'hello mellow'.lastIndexOf('ello')", json!(7)),
        ("'TacoCat'.lowerAscii()", json!("tacocat")),
        ("'TacoCat'.upperAscii()", json!("TACOCAT")),
        ("'hello hello'.replace('he', 'we')", json!("wello wello")),
        ("'hello hello hello'.split(' ')", json!(["hello", "hello", "hello"])),
        ("'tacocat'.substring(4)", json!("cat")),
        ("'tacocat'.substring(0, 4)", json!("taco")),
        ("'  \\ttrim\\n    '.trim()", json!("trim")),
        ("['hello', 'mellow'].join(' ')", json!("hello mellow")),
        ("'%s is %d'.format(['x', 3])", json!("x is 3")),
        ("object.spec.template.spec.containers.all(c, c.image.matches('^[a-z.]+/'))", json!(true)),
        // Lists (k8s library).
        ("[1, 2, 3].isSorted()", json!(true)),
        ("[1, 2, 3].sum()", json!(6)),
        ("[1, 2, 3].min()", json!(1)),
        ("[1, 2, 3].max()", json!(3)),
        ("[1, 2, 3, 2].indexOf(2)", json!(1)),
        ("[1, 2, 3, 2].lastIndexOf(2)", json!(3)),
        // Sets.
        ("sets.contains([1, 2, 3, 4], [2, 3])", json!(true)),
        ("sets.equivalent([1, 2, 3], [3, 2, 1])", json!(true)),
        ("sets.intersects([1, 2, 3], [3, 4])", json!(true)),
        // Regex.
        ("'abc 123'.find('[0-9]+')", json!("123")),
        ("'123 abc 456'.findAll('[0-9]+')", json!(["123", "456"])),
        // URLs.
        ("url('https://example.com:80/path?query=val').getScheme()", json!("https")),
        ("url('https://example.com:80/path?query=val').getHost()", json!("example.com:80")),
        ("url('https://example.com:80/path?query=val').getHostname()", json!("example.com")),
        ("url('https://example.com:80/path?query=val').getPort()", json!("80")),
        ("url('https://example.com/path with spaces/').getEscapedPath()", json!("/path%20with%20spaces/")),
        ("isURL('https://example.com/')", json!(true)),
        // IP and CIDR.
        ("isIP('127.0.0.1')", json!(true)),
        ("ip('127.0.0.1').family()", json!(4)),
        ("ip('::1').isLoopback()", json!(true)),
        ("cidr('192.168.0.0/24').containsIP(ip('192.168.0.1'))", json!(true)),
        ("cidr('192.168.0.0/24').containsIP('192.168.1.1')", json!(false)),
        ("cidr('192.168.0.0/16').prefixLength()", json!(16)),
        // Quantity.
        ("quantity('1Gi').isGreaterThan(quantity('500Mi'))", json!(true)),
        ("quantity('50k').asInteger()", json!(50000)),
        ("isQuantity('1.3G')", json!(true)),
        ("isQuantity('1.3Gz')", json!(false)),
        ("quantity('1Gi').compareTo(quantity('1024Mi'))", json!(0)),
        // Semver.
        ("semver('1.2.3').isLessThan(semver('1.10.0'))", json!(true)),
        ("semver('2.0.0').major()", json!(2)),
        ("isSemver('1.2.3-alpha')", json!(true)),
        // JSON patch keys.
        // Where cel-rust differs from cel-go, as Kubernetes sees it.
        ("object.metadata.?annotations.?foo.orValue('none')", json!("none")),
        ("object.?spec.?absent.orValue(1)", json!(1)),
        ("{'a': 1}.?b.orValue(0)", json!(0)),
        ("object.spec.replicas == 3.0", json!(true)),
        ("1 != 1.0", json!(false)),
        ("'héllo'.size()", json!(5)),
        ("size('héllo')", json!(5)),
        // What the projection of the object must keep.
        ("object.metadata == object.metadata", json!(true)),
        ("size(object.metadata) == 3", json!(true)),
        ("object.spec.template.spec.containers[1].name", json!("sidecar")),
        ("[object.spec.replicas].all(x, x == 3)", json!(true)),
        ("object.spec.replicas.foo", json!(false)),
        ("[1].all(object, object == 1)", json!(true)),
        ("object.spec.template.spec.containers.all(object, has(object.name))", json!(true)),
        ("object.metadata.labels.exists(k, k == 'app')", json!(true)),
        ("has(object.spec.template.spec)", json!(true)),
    ];
    let mut failures = Vec::new();
    for (expr, want) in cases {
        match eval(expr) {
            Ok(got) if got == *want => {}
            got => failures.push(format!("{expr}: got {got:?}, kube documents {want}")),
        }
    }
    assert!(failures.is_empty(), "{} of {} differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn errors_are_kubes() {
    let cases: &[(&str, &str)] = &[
        ("object.spec.paused", "no such key: paused"),
        ("has(object.spec.template.spec.volumes[0])", "ERROR: <input>:1:38: invalid argument to has() macro"),
        ("object.spec.replicas / 0", "division by zero"),
        ("[1, 2][5]", "index out of range"),
        ("nope == 1", "undeclared reference to 'nope' (in container '')"),
        ("[1].all(x, y > 0)", "undeclared reference to 'y' (in container '')"),
        ("Object{spec: 1}", "object construction (Type{...}) is not supported"),
        ("object.spec.replicas >", "ERROR: <input>:1:23: Syntax error"),
        ("math.greatest([1, 2])", "undeclared reference to 'math.greatest' (in container '')"),
        ("'x'.fooBar()", "undeclared reference to 'fooBar' (in container '')"),
    ];
    for (expr, want) in cases {
        let got = eval(expr).expect_err(expr);
        assert!(got.contains(want), "{expr}: {got:?} does not say {want:?}");
    }
    // A comprehension's variable is in scope only inside it.
    assert_eq!(eval("[1, 2].exists(x, x == 2) && [3].all(y, y == 3)"), Ok(json!(true)));
}

#[test]
fn nesting_too_deep_fails_to_compile_instead_of_overflowing_the_stack() {
    let deep = format!("{}1{}", "(".repeat(5000), ")".repeat(5000));
    assert!(compile(&deep, DECLARED).is_err());
    let long = vec!["1"; 100].join(" + ");
    let e = compile(&long, DECLARED).unwrap_err().to_string();
    assert!(e.contains("nested more than"), "{e}");
    let huge = "a".repeat(MAX_EXPRESSION_LENGTH + 1);
    assert!(compile(&huge, DECLARED).unwrap_err().to_string().contains("exceeds limit"));
    // The deepest expression allowed evaluates on a small stack (a request's task's).
    let ok = vec!["object.spec.replicas"; check::MAX_DEPTH - 3].join(" + ");
    let p = compile(&ok, DECLARED).unwrap();
    let got = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || p.eval(&activation(), &mut Budget::default()).map(|v| value::to_json(&v)))
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(got, Ok(Some(json!(3 * (check::MAX_DEPTH - 3)))));
    // A long chain of && is balanced, as cel-go's parser balances it.
    let chain = vec!["object.spec.replicas > 0"; 500].join(" && ");
    let p = compile(&chain, DECLARED).unwrap();
    assert_eq!(p.eval(&activation(), &mut Budget::default()), Ok(Value::Bool(true)));
}

#[test]
fn the_cost_limit_stops_an_expression_and_the_budget_spans_expressions() {
    // 100 × 100 × 100 steps: over the per-call limit.
    let cubic = "lists.range(100).all(a, lists.range(100).all(b, lists.range(100).all(c, a + b + c >= 0)))";
    let p = compile(cubic, DECLARED).unwrap();
    let mut budget = Budget::default();
    assert_eq!(p.eval(&Activation::new(), &mut budget), Err(EvalError::CostLimit));
    assert_eq!(EvalError::CostLimit.to_string(), LIMIT_EXCEEDED);
    // 100 × 100: within it, and charged.
    let square = compile("lists.range(100).all(a, lists.range(100).all(b, a + b >= 0))", DECLARED).unwrap();
    let mut budget = Budget::default();
    assert_eq!(square.eval(&Activation::new(), &mut budget), Ok(Value::Bool(true)));
    let one = RUNTIME_BUDGET - budget.remaining();
    assert!(one > 10_000 && one < PER_CALL_LIMIT, "{one}");
    // The budget runs out over several evaluations.
    let mut budget = Budget::new(one * 3 + one / 2);
    for _ in 0..3 {
        assert_eq!(square.eval(&Activation::new(), &mut budget), Ok(Value::Bool(true)));
    }
    assert_eq!(square.eval(&Activation::new(), &mut budget), Err(EvalError::OutOfBudget));
}

#[test]
fn variables_are_evaluated_lazily_once_and_in_order() {
    let declared = &["object", "variables"];
    let defs = vec![
        ("names".to_string(), compile("object.spec.template.spec.containers.map(c, c.name)", declared).map(Arc::new)),
        ("hasMain".to_string(), compile("'main' in variables.names", declared).map(Arc::new)),
        ("broken".to_string(), compile("object.spec.nope", declared).map(Arc::new)),
    ];
    let vars = Arc::new(Variables::new(defs));
    let mut a = activation();
    a.bind_variables(vars);
    let p = compile("variables.hasMain && size(variables.names) == 2", DECLARED).unwrap();
    assert_eq!(p.variables_read(), ["hasMain", "names"]);
    assert_eq!(p.eval(&a, &mut Budget::default()), Ok(Value::Bool(true)));
    // An unread variable's error does not matter; a read one's does.
    let p = compile("variables.broken == 1", DECLARED).unwrap();
    assert_eq!(p.eval(&a, &mut Budget::default()), Err(EvalError::Runtime("no such key: nope".into())));
}

/// Answers from a table and records what was asked.
#[derive(Default, Debug)]
struct Recording(Mutex<Vec<(String, String, Check)>>);

impl Authorizer for Recording {
    fn authorize(&self, user: &crate::api::UserInfo, verb: &str, check: &Check) -> Decision {
        self.0.lock().unwrap().push((user.name.clone(), verb.to_owned(), check.clone()));
        let allowed = matches!(check, Check::Resource(r) if r.resource == "podsets" && verb != "delete");
        Decision { allowed, reason: if allowed { "rbac" } else { "" }.into(), error: None }
    }
}

#[test]
fn the_authorizer_library_asks_the_authorizer() {
    let recording = Arc::new(Recording::default());
    let request = ResourceCheck {
        group: "demo.k8s.io".into(),
        version: "v1beta1".into(),
        resource: "podsets".into(),
        namespace: "default".into(),
        name: "web".into(),
        ..Default::default()
    };
    let user = crate::api::UserInfo::named("alice", vec![]);
    let mut a = Activation::new();
    a.bind("authorizer", AuthorizerValue::new(recording.clone(), user, request).into_value());
    let run = |expr: &str| {
        let p = compile(expr, DECLARED).unwrap();
        assert!(p.uses("authorizer"));
        p.eval(&a, &mut Budget::default()).map(|v| value::to_json(&v).unwrap())
    };
    assert_eq!(
        run("authorizer.group('demo.k8s.io').resource('podsets').namespace('default').name('web').check('update').allowed()"),
        Ok(json!(true))
    );
    assert_eq!(run("authorizer.requestResource.check('delete').allowed()"), Ok(json!(false)));
    assert_eq!(run("authorizer.requestResource.check('get').reason()"), Ok(json!("rbac")));
    assert_eq!(run("authorizer.path('/healthz').check('get').errored()"), Ok(json!(false)));
    assert_eq!(
        run("authorizer.serviceAccount('kube-system', 'gc').group('').resource('pods').check('list').allowed()"),
        Ok(json!(false))
    );
    // A check costs enough that an expression makes at most two.
    let three = "authorizer.path('/a').check('get').allowed() || authorizer.path('/b').check('get').allowed() || \
                 authorizer.path('/c').check('get').allowed()";
    assert_eq!(run(three), Err(EvalError::CostLimit));
    let asked = recording.0.lock().unwrap().clone();
    let Check::Resource(r) = &asked[0].2 else { panic!("{asked:?}") };
    assert_eq!(
        (r.group.as_str(), r.resource.as_str(), r.name.as_str(), asked[0].1.as_str()),
        ("demo.k8s.io", "podsets", "web", "update")
    );
    assert_eq!(asked[4].0, "system:serviceaccount:kube-system:gc");
    assert_eq!(asked[1].2, Check::Resource(ResourceCheck { version: "v1beta1".into(), ..r.clone() }));
}

#[test]
fn evaluation_survives_a_library_panic() {
    // cel-rust negates without a check (a panic in debug builds, as the tests are): the request gets an error.
    let p = compile("-(-9223372036854775807 - 1)", DECLARED).unwrap();
    let got = p.eval(&Activation::new(), &mut Budget::default());
    assert!(matches!(&got, Err(EvalError::Runtime(_))), "{got:?}");
    // Whatever a library does with odd arguments, the request gets an answer, not a panic.
    for expr in ["'abc'.charAt()", "[].min()", "'x'.format()", "lists.range(-1)", "'%'.format([1])"] {
        if let Ok(p) = compile(expr, DECLARED) {
            let _ = p.eval(&Activation::new(), &mut Budget::default());
        }
    }
}
