//! `podset-apiserver check`: does the install work, as seen through kube-apiserver (as cert-manager's `cmctl check
//! api`)? One line per check, exit status 0 only when every check passes. Everything goes through the main API
//! server, as a user's requests do, so what it proves is what `kubectl get podsets` needs.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroup, APIResourceList};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::api::{Version, GROUP, KIND, PLURAL};

#[derive(Debug, Clone, Args)]
pub struct CheckOptions {
    /// Namespace of the dry-run PodSet create.
    #[arg(long, default_value = "default")]
    pub namespace: String,

    /// Check again until every check passes or this much time has gone (e.g. 2m); 0: check once.
    #[arg(long, default_value = "0s", value_parser = super::options::duration)]
    pub wait: Duration,

    /// Kubeconfig of the main API server; in a cluster, the in-cluster config is used.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// A check's name and, if it failed, why.
type Outcome = (String, Result<String, String>);

/// Each request gets this long: an unreachable replica must not hold the whole check up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn run(opts: CheckOptions) -> anyhow::Result<()> {
    // No retries in the client: a failing check is an answer, and --wait does the retrying.
    let client = super::options::client_from(opts.kubeconfig.as_deref(), false)
        .await?
        .context("no --kubeconfig and not in a cluster: nothing to check")?;
    let deadline = Instant::now() + opts.wait;
    loop {
        let outcomes = check_all(&client, &opts.namespace).await;
        let failed = outcomes.iter().filter(|(_, r)| r.is_err()).count();
        if failed == 0 || Instant::now() >= deadline {
            for (name, result) in &outcomes {
                match result {
                    Ok(detail) if detail.is_empty() => println!("{name}: ok"),
                    Ok(detail) => println!("{name}: ok ({detail})"),
                    Err(why) => println!("{name}: FAILED: {why}"),
                }
            }
            if failed == 0 {
                return Ok(());
            }
            // A failed check is an answer, not an error of the program: no error chain or backtrace.
            eprintln!("{failed} of {} checks failed", outcomes.len());
            std::io::Write::flush(&mut std::io::stdout())?;
            std::process::exit(1);
        }
        eprintln!("{failed} of {} checks failed; checking again", outcomes.len());
        tokio::time::sleep(Duration::from_secs(2).min(deadline - Instant::now())).await;
    }
}

async fn check_all(client: &Client, namespace: &str) -> Vec<Outcome> {
    let mut out = Vec::new();
    // 1. The APIServices: the versions registered are the ones the rest checks.
    let apiservices: Api<APIService> = Api::all(client.clone());
    let mut registered = Vec::new();
    for version in Version::ALL.into_iter().rev() {
        let name = format!("{}.{GROUP}", version.as_str());
        match timed(apiservices.get_opt(&name)).await {
            Ok(Some(a)) => {
                out.push((format!("APIService {name} Available"), available(&a)));
                registered.push((version, a));
            }
            Ok(None) => {}
            Err(e) => out.push((format!("APIService {name} Available"), Err(e))),
        }
    }
    if registered.is_empty() && out.is_empty() {
        let names: Vec<String> = Version::ALL.iter().map(|v| format!("{}.{GROUP}", v.as_str())).collect();
        out.push(("APIServices of demo.k8s.io".into(), Err(format!("none of {names:?} exists: not installed"))));
    }
    // 2. Discovery through the aggregator, as kubectl finds the resource.
    if !registered.is_empty() {
        let versions: Vec<Version> = registered.iter().map(|(v, _)| *v).collect();
        out.push((format!("discovery of {GROUP}"), group_discovery(client, &versions).await));
        for v in &versions {
            out.push((format!("discovery of {GROUP}/{}", v.as_str()), version_discovery(client, *v).await));
        }
    }
    // 3. A dry-run create: authentication, authorization, admission, conversion and storage all answer it.
    for (v, _) in &registered {
        let name = format!("dry-run create of a {}/{} PodSet in {namespace}", GROUP, v.as_str());
        out.push((name, dry_run_create(client, *v, namespace).await));
    }
    // 4. Each replica's /readyz, behind the Services the APIServices name.
    let mut services: BTreeSet<(String, String, i32)> = BTreeSet::new();
    for (_, a) in &registered {
        if let Some(s) = a.spec.as_ref().and_then(|s| s.service.as_ref()) {
            let (ns, name) = (s.namespace.clone().unwrap_or_default(), s.name.clone().unwrap_or_default());
            services.insert((ns, name, s.port.unwrap_or(443)));
        }
    }
    let mut seen = BTreeSet::new();
    for (ns, name, port) in services {
        replicas(client, &ns, &name, port, &mut seen, &mut out).await;
    }
    out
}

fn available(a: &APIService) -> Result<String, String> {
    let conditions = a.status.as_ref().and_then(|s| s.conditions.as_ref());
    match conditions.into_iter().flatten().find(|c| c.type_ == "Available") {
        Some(c) if c.status == "True" => Ok(String::new()),
        Some(c) => Err(format!(
            "Available={}: {}: {}",
            c.status,
            c.reason.as_deref().unwrap_or("no reason"),
            c.message.as_deref().unwrap_or("no message")
        )),
        None => Err("no Available condition yet".into()),
    }
}

async fn group_discovery(client: &Client, versions: &[Version]) -> Result<String, String> {
    let req = get(&format!("/apis/{GROUP}"))?;
    let group: APIGroup = timed(client.request(req)).await?;
    let listed: Vec<&str> = group.versions.iter().map(|v| v.version.as_str()).collect();
    let missing: Vec<&str> = versions.iter().map(|v| v.as_str()).filter(|v| !listed.contains(v)).collect();
    if !missing.is_empty() {
        return Err(format!("lists versions {listed:?}, not {missing:?}"));
    }
    Ok(format!("versions {listed:?}"))
}

async fn version_discovery(client: &Client, v: Version) -> Result<String, String> {
    let req = get(&format!("/apis/{}", v.api_version()))?;
    let list: APIResourceList = timed(client.request(req)).await?;
    if !list.resources.iter().any(|r| r.name == PLURAL) {
        return Err(format!("does not list {PLURAL}"));
    }
    Ok(PLURAL.into())
}

async fn dry_run_create(client: &Client, v: Version, namespace: &str) -> Result<String, String> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &super::podsets_in(v));
    // No replicas: nothing would be made even if it were stored. v1beta1 requires a selector.
    let mut spec = json!({
        "replicas": 0,
        "template": {
            "metadata": {"labels": {"app": "podset-apiserver-check"}},
            "spec": {"containers": [{"name": "main", "image": "podset-apiserver-check"}]},
        },
    });
    if v == Version::V1beta1 {
        spec["selector"] = json!({"matchLabels": {"app": "podset-apiserver-check"}});
    }
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": v.api_version(),
        "kind": KIND,
        "metadata": {"generateName": "podset-apiserver-check-"},
        "spec": spec,
    }))
    .map_err(|e| e.to_string())?;
    let params = PostParams { dry_run: true, ..Default::default() };
    let made = timed(api.create(&params, &object)).await?;
    Ok(format!("admitted as {}", made.metadata.name.unwrap_or_default()))
}

/// The replicas in a Service's Endpoints: a Pod's /readyz through kube-apiserver's pods proxy; an address that is
/// no Pod (a selectorless Service) cannot be reached that way, so the Endpoints' own readiness is reported.
async fn replicas(
    client: &Client,
    ns: &str,
    service: &str,
    port: i32,
    seen: &mut BTreeSet<String>,
    out: &mut Vec<Outcome>,
) {
    let what = format!("replicas of Service {ns}/{service}");
    let svc = match timed(Api::<Service>::namespaced(client.clone(), ns).get(service)).await {
        Ok(s) => s,
        Err(e) => return out.push((what, Err(e))),
    };
    let port_name = svc.spec.and_then(|s| s.ports).into_iter().flatten().find(|p| p.port == port).and_then(|p| p.name);
    let endpoints = match timed(Api::<Endpoints>::namespaced(client.clone(), ns).get_opt(service)).await {
        Ok(e) => e,
        Err(e) => return out.push((what, Err(e))),
    };
    let mut any = false;
    for subset in endpoints.and_then(|e| e.subsets).into_iter().flatten() {
        let ports = subset.ports.unwrap_or_default();
        let Some(target) = ports.iter().find(|p| p.name == port_name).or(ports.first()).map(|p| p.port) else {
            continue;
        };
        let ready = subset.addresses.into_iter().flatten().map(|a| (a, true));
        let not_ready = subset.not_ready_addresses.into_iter().flatten().map(|a| (a, false));
        for (address, ready) in ready.chain(not_ready) {
            any = true;
            if !seen.insert(format!("{}:{target}", address.ip)) {
                continue;
            }
            let pod = address.target_ref.filter(|r| r.kind.as_deref() == Some("Pod"));
            match pod {
                Some(pod) => {
                    let (pod_ns, name) = (pod.namespace.unwrap_or_else(|| ns.to_owned()), pod.name.unwrap_or_default());
                    out.push((format!("/readyz of Pod {pod_ns}/{name}"), readyz(client, &pod_ns, &name, target).await));
                }
                None => {
                    let name = format!("readiness of {}:{target} (in the Endpoints of {ns}/{service})", address.ip);
                    let why = "no Pod behind it, so its /readyz cannot be reached through kube-apiserver";
                    out.push((
                        name,
                        if ready {
                            Ok(format!("listed ready; {why}"))
                        } else {
                            Err(format!("listed not ready; {why}"))
                        },
                    ));
                }
            }
        }
    }
    if !any {
        out.push((what, Err("the Service's Endpoints list no replica".into())));
    }
}

/// `/readyz?verbose` over HTTPS through the pods proxy; kube-apiserver's proxy presents no credentials, and
/// /readyz is one of --authorization-always-allow-paths.
async fn readyz(client: &Client, ns: &str, pod: &str, port: i32) -> Result<String, String> {
    let req = get(&format!("/api/v1/namespaces/{ns}/pods/https:{pod}:{port}/proxy/readyz?verbose"))?;
    let res = timed(client.send(req.map(Into::into))).await?;
    let status = res.status();
    let body = timed(res.into_body().collect()).await?.to_bytes();
    let text = String::from_utf8_lossy(&body);
    if status.is_success() {
        return Ok(String::new());
    }
    // The failing checks of the verbose list, else the whole answer.
    let failing: Vec<&str> = text.lines().filter(|l| l.starts_with("[-]")).collect();
    let why = if failing.is_empty() { text.trim().to_owned() } else { failing.join("; ") };
    Err(format!("{status}: {why}"))
}

fn get(path: &str) -> Result<http::Request<Vec<u8>>, String> {
    http::Request::get(path).body(Vec::new()).map_err(|e| e.to_string())
}

/// A request bounded by [`REQUEST_TIMEOUT`], its error as a reason to print: a refusal's Status message.
async fn timed<T, E: std::fmt::Display + 'static>(
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(r) => r.map_err(|e| match (&e as &dyn std::any::Any).downcast_ref::<kube::Error>() {
            // kube's own Display adds the Status's debug dump; a body that is no Status (the aggregator's 503) has
            // a made-up reason.
            Some(kube::Error::Api(s)) if s.reason.is_empty() || s.reason.starts_with("Failed to parse") => {
                format!("{}: {}", s.code, s.message.trim())
            }
            Some(kube::Error::Api(s)) => format!("{} {}: {}", s.code, s.reason, s.message),
            _ => e.to_string(),
        }),
        Err(_) => Err(format!("no answer in {REQUEST_TIMEOUT:?}")),
    }
}
