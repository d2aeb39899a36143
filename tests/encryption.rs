//! Encryption at rest (`--encryption-provider-config`): values in sled and etcd as kube-apiserver writes them, keys
//! rotated without a value any replica cannot read, and a value no provider reads an error for that object alone.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use podset_apiserver::cmd::encryption::config::{EncryptionConfig, KmsConfiguration};
use podset_apiserver::resources::podset::INFO;
use podset_apiserver::storage::value::{Provider, ProviderTable, Providers, Transformer};
use podset_apiserver::storage::{
    Cacher, Draft, EtcdBackend, EtcdOptions, HistoryLimits, ListOptions, SledBackend, SledOptions, StorageError, Store,
};
use serde_json::json;

const KEY_A: &str = "YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE="; // 32 x 'a'
const KEY_B: &str = "YmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmI="; // 32 x 'b'
/// A string that must never be found at rest.
const MARKER: &str = "s3cr3t-marker-8f1d";

fn no_kms(_: &KmsConfiguration) -> Result<Provider, String> {
    Err("no KMS in this test".into())
}

/// An EncryptionConfiguration for PodSets with `providers` (YAML list items, indented by four).
fn config(providers: &str) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
         - resources: [podsets.demo.k8s.io]\n  providers:\n{providers}"
    )
}

fn aescbc(name: &str, secret: &str) -> String {
    format!("  - aescbc:\n      keys:\n      - name: {name}\n        secret: {secret}\n")
}

/// `providers` (as `config` takes them) written to `dir/encryption.yaml`: the file, and the flag naming it.
fn config_file(dir: &Path, providers: &str) -> (std::path::PathBuf, String) {
    let file = dir.join("encryption.yaml");
    std::fs::write(&file, config(providers)).unwrap();
    let flag = format!("--encryption-provider-config={}", file.display());
    (file, flag)
}

/// A PodSet named `name` whose template carries `MARKER` in an env value.
fn marked_podset(name: &str) -> serde_json::Value {
    let mut ps = common::podset(name, 0);
    ps["spec"]["template"] = json!({"metadata": {"labels": {"app": name}}, "spec": {"containers": [
        {"name": "c", "image": "busybox", "env": [{"name": "TOKEN", "value": MARKER}]}]}});
    ps
}

fn providers(text: &str) -> Providers {
    let config = EncryptionConfig::parse("test.yaml", text.as_bytes().to_vec()).expect("valid configuration");
    config.providers_for("podsets", "demo.k8s.io", &no_kms).unwrap().expect("covers podsets")
}

/// PodSets' providers, the table of a store of PodSets.
fn table(text: &str) -> ProviderTable {
    ProviderTable::new().with(INFO.key_root, providers(text))
}

fn transformer(text: &str) -> Transformer {
    Transformer::new(table(text))
}

fn draft(name: &str) -> Draft {
    let v = json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "env": [{"name": "TOKEN", "value": MARKER}]}]}}}});
    Draft::new(&v, &[]).unwrap()
}

async fn sled(dir: &Path, values: Transformer) -> Arc<dyn Store> {
    let backend = SledBackend::open(dir, SledOptions { values, ..Default::default() }).expect("open sled");
    Arc::new(Cacher::new(Arc::new(backend), HistoryLimits::default()).await.expect("load"))
}

async fn etcd_store(url: &str, values: Transformer) -> Arc<dyn Store> {
    let options = EtcdOptions {
        servers: vec![url.to_owned()],
        group: "demo.k8s.io".into(),
        compaction_interval: Duration::ZERO,
        request_timeout: Duration::from_secs(3),
        values,
        ..Default::default()
    };
    Arc::new(
        Cacher::new(Arc::new(EtcdBackend::connect(options).await.unwrap()), HistoryLimits::default()).await.unwrap(),
    )
}

/// Every byte of every file under `dir`.
fn files_contain(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in walk(dir) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        if bytes.windows(needle.len()).any(|w| w == needle) {
            found.push(entry.display().to_string());
        }
    }
    found
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn list_all() -> ListOptions {
    ListOptions { prefix: "/podsets/".into(), ..Default::default() }
}

/// sled: what is written under a key is on disk only encrypted; the same store read without the key fails for
/// that object alone, loudly, and reads again once the key is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sled_keeps_nothing_of_an_object_in_the_clear_and_an_unreadable_one_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    {
        let store = sled(&db, transformer(&config(&aescbc("a", KEY_A)))).await;
        store.create("/podsets/ns/one", draft("one")).await.unwrap();
        let two = store.create("/podsets/ns/two", draft("two")).await.unwrap();
        store.update("/podsets/ns/two", draft("two"), Some(two.mod_revision)).await.unwrap();
        store.delete("/podsets/ns/one", None).await.unwrap();
        let read = store.get("/podsets/ns/two").await.unwrap().unwrap();
        assert!(String::from_utf8_lossy(&read.bytes).contains(MARKER), "served decrypted");
    }
    assert_eq!(files_contain(dir.path(), MARKER.as_bytes()), Vec::<String>::new(), "the marker at rest");
    assert!(!files_contain(dir.path(), b"k8s:enc:aescbc:v1:a:").is_empty(), "values carry kube's prefix");

    // Another key only: the object is there, unreadable, and says which value and why.
    let b_only = sled(&db, transformer(&config(&aescbc("b", KEY_B)))).await;
    let err = b_only.get("/podsets/ns/two").await.unwrap_err();
    assert!(matches!(&err, StorageError::Unreadable { key, .. } if key == "/podsets/ns/two"), "{err}");
    assert!(err.to_string().contains("no matching prefix found (the value starts \"k8s:enc:aescbc:v1:a:\")"), "{err}");
    assert!(matches!(b_only.list(list_all()).await.unwrap_err(), StorageError::Unreadable { .. }), "never skipped");
    // Other objects and the store itself are fine; the server's own readers list what reads.
    b_only.create("/podsets/ns/three", draft("three")).await.unwrap();
    let readable = b_only.list(ListOptions { skip_unreadable: true, ..list_all() }).await.unwrap();
    assert_eq!(readable.items.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), ["/podsets/ns/three"]);
    assert!(b_only.get("/podsets/ns/three").await.unwrap().is_some());
    b_only.check_alive().unwrap();
    drop(b_only);

    // Both keys, the new one writing: everything reads; what the old key wrote is stale until written again.
    let both = sled(&db, transformer(&(config(&aescbc("b", KEY_B)) + &aescbc("a", KEY_A)[..]))).await;
    let two = both.get("/podsets/ns/two").await.unwrap().unwrap();
    assert!(both.is_stale(&two), "written by the old key");
    assert_eq!(both.list(list_all()).await.unwrap().items.len(), 2);
    let rewritten = both.update("/podsets/ns/two", draft("two"), Some(two.mod_revision)).await.unwrap();
    assert!(!both.is_stale(&rewritten));
}

/// A store without any configuration meets encrypted values: they are unreadable objects, not ciphertext served
/// as JSON, and not a store that fails to load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_store_refuses_encrypted_values_per_object() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    sled(&db, transformer(&config(&aescbc("a", KEY_A)))).await.create("/podsets/ns/x", draft("x")).await.unwrap();
    let plain = sled(&db, Transformer::plain()).await;
    let err = plain.get("/podsets/ns/x").await.unwrap_err().to_string();
    assert!(err.contains("identity transformer tried to read encrypted data"), "{err}");
}

/// etcd, three replicas: the key is rotated as docs/operate.md says (a reader first, then the writer, then every
/// object rewritten, then the old key removed) while they write, and no replica ever meets a value it cannot
/// read; the values end up under the new key alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_replicas_rotate_a_key_without_meeting_an_unreadable_value() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = podset_envtest::etcd::Etcd::start(&dir.path().join("etcd"));
    let steps = [
        config(&aescbc("a", KEY_A)),
        config(&aescbc("a", KEY_A)) + &aescbc("b", KEY_B)[..],
        config(&aescbc("b", KEY_B)) + &aescbc("a", KEY_A)[..],
        config(&aescbc("b", KEY_B)),
    ];
    let values: Vec<Transformer> = (0..3).map(|_| transformer(&steps[0])).collect();
    let mut replicas = Vec::new();
    for v in &values {
        replicas.push(etcd_store(&etcd.url(), v.clone()).await);
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = replicas
        .iter()
        .enumerate()
        .map(|(r, store)| {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let mut written = Vec::new();
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let key = format!("/podsets/ns/r{r}-{}", i % 40);
                    let res = match store.get(&key).await.expect("every value readable") {
                        None => store.create(&key, draft(&format!("r{r}-{}", i % 40))).await,
                        Some(o) => store.update(&key, draft(&format!("r{r}-{}", i % 40)), Some(o.mod_revision)).await,
                    };
                    match res {
                        Ok(o) => written.push((key, o.mod_revision)),
                        // The rewrite got there first: read again.
                        Err(StorageError::Conflict { .. }) => {}
                        Err(e) => panic!("write {key}: {e}"),
                    }
                    store.list(list_all()).await.expect("every list readable");
                    i += 1;
                }
                written
            })
        })
        .collect();
    // Each step reaches every replica (one at a time, as a rollout does) before the next starts.
    for step in &steps[1..] {
        for v in &values {
            tokio::time::sleep(Duration::from_millis(300)).await;
            v.replace(table(step));
        }
        if step == &steps[2] {
            // The rewrite: every object the old key wrote, written again unchanged (the migration pass).
            tokio::time::sleep(Duration::from_millis(300)).await;
            let store = &replicas[0];
            store.sync().await.unwrap();
            for o in store.list(list_all()).await.unwrap().items {
                if store.is_stale(&o) {
                    let d = Draft::new(&o.parse().unwrap(), &[]).unwrap();
                    match store.update(&o.key, d, Some(o.mod_revision)).await {
                        Ok(_) | Err(StorageError::Conflict { .. }) => {}
                        Err(e) => panic!("rewrite {}: {e}", o.key),
                    }
                }
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // Each key's last acknowledged write (one writer per key).
    let (mut writes, mut keys) = (0, std::collections::BTreeMap::new());
    for w in writers {
        let written = w.await.unwrap();
        writes += written.len();
        for (key, revision) in written {
            let last = keys.entry(key).or_insert(0);
            *last = revision.max(*last);
        }
    }
    assert!(writes > 100, "{writes} writes under load");

    // Every value in etcd is now the new key's: the old one can go.
    let mut client = etcd_client::Client::connect([etcd.url()], None).await.unwrap();
    let all = client.get("/registry/demo.k8s.io/podsets/", Some(etcd_client::GetOptions::new().with_prefix())).await;
    let all = all.unwrap();
    assert_eq!(all.kvs().len(), keys.len());
    for kv in all.kvs() {
        assert!(kv.value().starts_with(b"k8s:enc:aescbc:v1:b:"), "{}", String::from_utf8_lossy(kv.key()));
    }
    // No write lost: every replica holds each key at its last acknowledged write or later (the rewrite).
    for store in &replicas {
        store.sync().await.unwrap();
        let items = store.list(list_all()).await.unwrap().items;
        assert_eq!(items.len(), keys.len());
        for o in items {
            assert!(o.mod_revision >= keys[&o.key], "{}: {} < acknowledged {}", o.key, o.mod_revision, keys[&o.key]);
        }
    }
}

/// The same keys given to kube-apiserver 1.20 (for built-in types) and to us (for PodSets, on etcd): for each
/// provider, both values in etcd start with the same prefix and have the provider's layout; our code reads
/// kube-apiserver's value (bound to its etcd key), and kube-apiserver reads a value our code wrote for it.
#[test]
fn kube_apiserver_and_we_encrypt_values_alike() {
    use common::cluster::{in_namespace, runtime};
    in_namespace("kube_apiserver_and_we_encrypt_values_alike", || {
        let mut c = common::cluster::start();
        c.kubectl(&["create", "namespace", "enc"]);
        let dir = c.dir.path().to_owned();
        let key = |name: &str, secret: &str| format!("      keys:\n      - name: {name}\n        secret: {secret}\n");
        let gcm_key = "MTIzNDU2Nzg5MDEyMzQ1Ng=="; // 16 bytes: AES-128
                                                  // (provider, kube's resource in the file, its group, how much each layout adds, a manifest, a field)
        let cases = [
            ("aescbc", "configmaps", "", KEY_A, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: NAME, namespace: enc}\ndata: {token: MARKER}\n", "{.data.token}"),
            ("aesgcm", "podtemplates", "", gcm_key, "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: NAME, namespace: enc}\ntemplate:\n  spec:\n    containers: [{name: c, image: busybox, env: [{name: TOKEN, value: MARKER}]}]\n", "{.template.spec.containers[0].env[0].value}"),
            ("secretbox", "controllerrevisions", "apps", KEY_B, "apiVersion: apps/v1\nkind: ControllerRevision\nmetadata: {name: NAME, namespace: enc}\nrevision: 1\ndata: {token: MARKER}\n", "{.data.token}"),
        ];
        let mut kube_config =
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n".to_owned();
        for (provider, resource, group, secret, ..) in &cases {
            let name = if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") };
            // identity after: what the cluster stored before reads on.
            kube_config += &format!(
                "- resources: [{name}]\n  providers:\n  - {provider}:\n{}  - identity: {{}}\n",
                key("k1", secret)
            );
        }
        let kube_file = dir.join("kube-encryption.yaml");
        std::fs::write(&kube_file, &kube_config).unwrap();
        c.restart_apiserver_with(&[format!("--encryption-provider-config={}", kube_file.display())]);
        let ours = dir.join("podset-encryption.yaml");
        std::fs::write(&ours, config(&aescbc("k1", KEY_A))).unwrap();
        let flags = [
            "--storage-backend=etcd".into(),
            format!("--etcd-servers={}", c.etcd_url()),
            "--etcd-prefix=/podsets-enc".into(),
            format!("--encryption-provider-config={}", ours.display()),
        ];
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.restart_podset_apiserver_with(&flags))).is_err() {
            panic!("{}", c.podset_log());
        }
        let kube_values = EncryptionConfig::parse("kube", kube_config.into_bytes()).unwrap();
        runtime().block_on(async {
            let mut etcd = etcd_client::Client::connect([c.etcd_url()], None).await.unwrap();
            // Each provider writes in turn; the earlier ones still read what they wrote.
            let mut readers = String::new();
            for (provider, resource, group, secret, manifest, field) in cases {
                readers = format!("  - {provider}:\n{}{readers}", key("k1", secret));
                std::fs::write(&ours, config(&readers)).unwrap();
                c.restart_podset_apiserver();
                let name = format!("{provider}-web");
                c.apply_text(&name, &manifest.replace("NAME", &name).replace("MARKER", MARKER));
                let mut ps = marked_podset(&name);
                ps["metadata"]["namespace"] = "enc".into();
                c.apply_text(&format!("ps-{name}"), &serde_json::to_string(&ps).unwrap());

                let kube_key = format!("/registry/{resource}/enc/{name}");
                let our_key = format!("/podsets-enc/demo.k8s.io/podsets/enc/{name}");
                let value = |kv: etcd_client::GetResponse| kv.kvs().first().expect("stored").value().to_vec();
                let kube_value = value(etcd.get(kube_key.as_str(), None).await.unwrap());
                let our_value = value(etcd.get(our_key.as_str(), None).await.unwrap());
                let prefix = format!("k8s:enc:{provider}:v1:k1:");
                for (who, v) in [("kube-apiserver", &kube_value), ("we", &our_value)] {
                    assert!(
                        v.starts_with(prefix.as_bytes()),
                        "{who}: {}",
                        String::from_utf8_lossy(&v[..40.min(v.len())])
                    );
                    assert!(!v.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()), "{who} stored the marker");
                    let body = v.len() - prefix.len();
                    let laid_out = match provider {
                        "aescbc" => body >= 32 && body % 16 == 0,
                        "aesgcm" => body >= 12 + 16,
                        _ => body >= 24 + 16,
                    };
                    assert!(laid_out, "{who}: {provider} value of {body} bytes");
                }
                // Our code reads kube-apiserver's value, bound to its etcd key.
                let theirs = kube_values.providers_for(resource, group, &no_kms).unwrap().expect("configured");
                let theirs = Transformer::new(ProviderTable::new().with("/registry/", theirs));
                let plain =
                    theirs.from_storage(&kube_key, &kube_value, kube_key.as_bytes()).expect("we read kube's value");
                let plain = plain.bytes;
                assert!(plain.starts_with(b"k8s\0"), "kube-apiserver stores protobuf");
                assert!(plain.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()), "the marker");
                // kube-apiserver reads what our code writes: the same object with a marker of the same length.
                let changed = "t0p-s3cr3t-mark-99";
                assert_eq!(changed.len(), MARKER.len());
                // Everywhere (kubectl's last-applied annotation holds it too).
                let mut edited = plain.clone();
                while let Some(at) = edited.windows(MARKER.len()).position(|w| w == MARKER.as_bytes()) {
                    edited[at..at + MARKER.len()].copy_from_slice(changed.as_bytes());
                }
                let (sealed, _) = theirs.to_storage(&kube_key, &edited, kube_key.as_bytes()).unwrap();
                etcd.put(kube_key.as_str(), sealed, None).await.unwrap();
                let kind = if group.is_empty() { resource.to_owned() } else { format!("{resource}.{group}") };
                c.wait_for("kube-apiserver to read our value", Duration::from_secs(30), |c| {
                    c.kubectl_try(&["get", &kind, "-n", "enc", &name, "-o", &format!("jsonpath={field}")])
                        .is_ok_and(|out| out.trim() == changed)
                });
                // And we serve our own, decrypted.
                let served = c.kubectl(&[
                    "get",
                    "podsets",
                    "-n",
                    "enc",
                    &name,
                    "-o",
                    "jsonpath={.spec.template.spec.containers[0].env[0].value}",
                ]);
                assert_eq!(served.trim(), MARKER);
            }
        });
    });
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name)).map_or(0.0, |v| v.trim().parse().unwrap_or(0.0))
}

async fn metrics(client: &kube::Client) -> String {
    let (code, _, body) = common::raw(client, http::Request::get("/metrics").body(vec![]).unwrap()).await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    String::from_utf8_lossy(&body).into_owned()
}

async fn until(what: &str, client: &kube::Client, ok: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = metrics(client).await;
        if ok(&text) {
            return text;
        }
        assert!(std::time::Instant::now() < deadline, "waiting for {what}:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A served server: a reloaded configuration takes over writes and the migration moves every PodSet to the new
/// key (so the old one can go); a file that does not load is counted and changes nothing; and a PodSet no
/// configured key reads is a 500 Status naming it, for a get and for a list, while the server stays alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rotate_by_reload_and_a_lost_key_is_a_clear_error() {
    use common::{json, podset, raw, TestServer};
    use http::Request;
    let dir = tempfile::tempdir().unwrap();
    let (file, flag) = config_file(dir.path(), &aescbc("a", KEY_A));
    let server = TestServer::start(&[
        &flag,
        "--encryption-provider-config-automatic-reload",
        "--encryption-provider-config-reload-interval=200ms",
    ]);
    let client = server.client();
    let path = "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets";
    for i in 0..5 {
        let body = serde_json::to_vec(&podset(&format!("p{i}"), 0)).unwrap();
        let req = Request::post(path).header("content-type", "application/json").body(body).unwrap();
        assert_eq!(raw(&client, req).await.0, 201);
    }
    let id = |text: &str| {
        text.contains("apiserver_encryption_config_controller_last_config_info{apiserver_id_hash=\"sha256:")
    };
    assert!(id(&metrics(&client).await), "the configuration in use is named");

    // The new key reads first, then writes; the migration rewrites all five with it.
    std::fs::write(&file, config(&aescbc("b", KEY_B)) + &aescbc("a", KEY_A)[..]).unwrap();
    let success = "apiserver_encryption_config_controller_automatic_reloads_total{status=\"success\",";
    let written_b = r#"apiserver_storage_transformation_operations_total{resource="podsets.demo.k8s.io",transformation_type="to_storage",transformer_prefix="b:",status="OK"}"#;
    until("the reload and the migration", &client, |t| {
        t.lines().any(|l| l.starts_with(success))
            && metric(t, written_b) >= 5.0
            && metric(t, "podset_storage_migration_remaining") == 0.0
    })
    .await;
    std::fs::write(&file, config(&aescbc("b", KEY_B))).unwrap();
    until("the second reload", &client, |t| {
        t.lines().filter(|l| l.starts_with(success)).any(|l| l.trim_end().ends_with(" 2"))
    })
    .await;
    for i in 0..5 {
        let (code, _, body) = raw(&client, Request::get(format!("{path}/p{i}")).body(vec![]).unwrap()).await;
        assert_eq!(code, 200, "p{i} reads with key b alone: {}", String::from_utf8_lossy(&body));
    }

    // A file that does not load: counted, the running configuration kept.
    std::fs::write(&file, "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources: []\n")
        .unwrap();
    let failure = "apiserver_encryption_config_controller_automatic_reloads_total{status=\"failure\",";
    until("the failed reload", &client, |t| t.lines().any(|l| l.starts_with(failure))).await;
    let body = serde_json::to_vec(&podset("p5", 0)).unwrap();
    let req = Request::post(path).header("content-type", "application/json").body(body).unwrap();
    assert_eq!(raw(&client, req).await.0, 201);
    assert!(server.log_contains("error processing encryption config file"));

    // Restarted with another key only: each PodSet is a clear 500, and the server lives on.
    let mut server = server;
    server.terminate();
    std::fs::write(&file, config(&aescbc("c", KEY_A))).unwrap();
    let server = TestServer::start_in(server.data_dir.clone(), None, vec!["--insecure-allow-all".into(), flag.clone()]);
    let client = server.client();
    let (code, _, body) = raw(&client, Request::get(format!("{path}/p1")).body(vec![]).unwrap()).await;
    let status = json(&body);
    assert_eq!(code, 500, "{status}");
    assert_eq!(status["reason"], "InternalError");
    let message = status["message"].as_str().unwrap();
    assert!(message.contains("/podsets/default/p1") && message.contains("k8s:enc:aescbc:v1:b:"), "{message}");
    let (code, _, body) = raw(&client, Request::get(path).body(vec![]).unwrap()).await;
    assert_eq!(code, 500, "a list is never short of an object: {}", String::from_utf8_lossy(&body));
    let (code, _, _) = raw(&client, Request::get("/livez").body(vec![]).unwrap()).await;
    assert_eq!(code, 200);
    let failed = r#"apiserver_storage_transformation_operations_total{resource="podsets.demo.k8s.io",transformation_type="from_storage",transformer_prefix="unknown",status="unknown-non-grpc"}"#;
    // Counted as still to migrate: never a false 0 while PodSets no key reads are stored.
    let text =
        until("the unreadable counted", &client, |t| metric(t, "podset_storage_migration_remaining") == 6.0).await;
    assert!(
        metric(&text, failed) >= 6.0,
        "each unreadable value counted at load:\n{}",
        text.lines().filter(|l| l.contains("transformation_operations")).collect::<Vec<_>>().join("\n")
    );
}

/// Decrypting for a rollback (`identity` first, then the migration) leaves nothing encrypted on disk, history
/// included: the build before encryption at rest, which reads every value as JSON, loads the store. The history the
/// pass leaves behind is dropped (as etcd's compaction drops old revisions), so a watch from before it is 410 Gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decrypted_for_a_rollback_the_store_loads_in_the_build_before_encryption() {
    use common::{raw, TestServer};
    use http::Request;
    let dir = tempfile::tempdir().unwrap();
    let (file, flag) = config_file(dir.path(), &(aescbc("a", KEY_A) + "  - identity: {}\n"));
    let mut server = TestServer::start(&[
        &flag,
        "--encryption-provider-config-automatic-reload",
        "--encryption-provider-config-reload-interval=200ms",
    ]);
    let client = server.client();
    let path = "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets";
    let mut first = String::new();
    for i in 0..3 {
        let body = serde_json::to_vec(&marked_podset(&format!("p{i}"))).unwrap();
        let req = Request::post(path).header("content-type", "application/json").body(body).unwrap();
        let (code, _, body) = raw(&client, req).await;
        assert_eq!(code, 201);
        if i == 0 {
            first = common::json(&body)["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
        }
    }
    // History: an update and a delete, each event holding the encrypted state before it.
    let patch = Request::patch(format!("{path}/p1"))
        .header("content-type", "application/merge-patch+json")
        .body(br#"{"metadata":{"labels":{"updated":"yes"}}}"#.to_vec())
        .unwrap();
    assert_eq!(raw(&client, patch).await.0, 200);
    assert_eq!(raw(&client, Request::delete(format!("{path}/p2")).body(vec![]).unwrap()).await.0, 200);

    std::fs::write(&file, config(&("  - identity: {}\n".to_owned() + &aescbc("a", KEY_A)))).unwrap();
    until("the reload and the migration", &client, |t| {
        t.contains("apiserver_encryption_config_controller_automatic_reloads_total{status=\"success\",")
            && metric(t, "podset_storage_migration_remaining") == 0.0
    })
    .await;
    let started = std::time::Instant::now();
    while !server.log_contains("history up to here dropped") {
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "{}", server.logs());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let watch = Request::get(format!("{path}?watch=1&resourceVersion={first}&timeoutSeconds=2")).body(vec![]).unwrap();
    let (code, _, body) = raw(&client, watch).await;
    let text = String::from_utf8_lossy(&body);
    assert!(code == 410 || text.contains("\"code\":410"), "a watch from before the pass: {code} {text}");
    assert!(server.terminate().success());

    // The build before encryption at rest, on the same data directory.
    let old = TestServer::start_program(
        &common::old_release_binary(),
        server.data_dir.clone(),
        None,
        vec!["--insecure-allow-all".into()],
    );
    let client = old.client();
    for name in ["p0", "p1"] {
        let (code, _, body) = raw(&client, Request::get(format!("{path}/{name}")).body(vec![]).unwrap()).await;
        assert_eq!(code, 200, "{name}: {}\n{}", String::from_utf8_lossy(&body), old.logs());
        assert!(String::from_utf8_lossy(&body).contains(MARKER));
    }
    assert_eq!(raw(&client, Request::get(format!("{path}/p2")).body(vec![]).unwrap()).await.0, 404);
}

/// A configuration that does not load stops the start, naming the file, the field and why.
#[test]
fn a_bad_configuration_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let (_, flag) =
        config_file(dir.path(), "  - aescbc:\n      keys:\n      - name: short\n        secret: MTIzNDU2Nzg=\n");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_podset-apiserver"))
        .args(["--insecure-allow-all", "--secure-port=0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg(flag)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("resources[0].providers[0].aescbc.keys[0].secret: Invalid value: \"REDACTED\": secret is not of the expected length, got 8, expected one of [16 24 32]"),
        "{err}"
    );
}

/// KMS v2 through a plugin on a unix socket (envtest's, as kube's own tests use one): values are kube-apiserver's
/// envelope (one seed for many writes, each value's key derived from it); the plugin's outage fails /readyz at
/// once and writes after the write TTL, with a clear Status, and when it is back nothing is lost; a new key ID
/// gives a new seed, and the objects of the old one count as still to migrate until a restart's pass rewrites them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kms_v2_encrypts_through_its_plugin_and_survives_its_outage() {
    use aes_gcm::aead::{Aead, KeyInit, Payload};
    use common::{json, raw, TestServer};
    use http::Request;
    use podset_apiserver::storage::value::kmsv2::api::EncryptedObject;
    use prost::Message;

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kms.sock");
    let plugin = podset_envtest::kms::KmsPlugin::start(&socket);
    let etcd = podset_envtest::etcd::Etcd::start(&dir.path().join("etcd"));
    let provider = format!(
        "  - kms:\n      apiVersion: v2\n      name: test-kms\n      endpoint: unix://{}\n      timeout: 2s\n",
        socket.display()
    );
    let (_, flag) = config_file(dir.path(), &provider);
    let args = [
        "--storage-backend=etcd".to_owned(),
        format!("--etcd-servers={}", etcd.url()),
        flag,
        "--encryption-provider-kms-poll-interval=500ms".into(),
        "--encryption-provider-kms-write-ttl=3s".into(),
    ];
    let server = TestServer::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let client = server.client();
    let path = "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets";
    let create = |name: String| {
        let client = client.clone();
        async move {
            let ps = marked_podset(&name);
            let req = Request::post(path).header("content-type", "application/json");
            let (code, _, body) = raw(&client, req.body(serde_json::to_vec(&ps).unwrap()).unwrap()).await;
            (code, json(&body))
        }
    };
    for i in 0..10 {
        assert_eq!(create(format!("p{i}")).await.0, 201);
    }
    let (encrypts, decrypts, _) = plugin.calls();
    assert_eq!((encrypts, decrypts), (1, 0), "one seed for every write, no call per write");
    assert!(plugin.authorities().iter().all(|a| a == "localhost"), "{:?}", plugin.authorities());
    let text = metrics(&client).await;
    for series in [
        r#"apiserver_envelope_encryption_key_id_hash_total{transformation_type="to_storage",provider_name="test-kms","#,
        r#"apiserver_envelope_encryption_kms_operations_latency_seconds_count{provider_name="test-kms",method_name="/v2.KeyManagementService/Encrypt",grpc_status_code="OK"}"#,
        r#"apiserver_envelope_encryption_dek_source_cache_size{provider_name="test-kms"} 1"#,
    ] {
        assert!(text.contains(series), "{series}");
    }

    // The values: kube-apiserver's envelope, read here without our code: HKDF-SHA256 from the seed the plugin
    // was given, AES-256-GCM bound to the etcd key.
    let seed = plugin.last_encrypt_plaintext().expect("the seed");
    let mut etcd_client = etcd_client::Client::connect([etcd.url()], None).await.unwrap();
    let all = etcd_client
        .get("/registry/demo.k8s.io/podsets/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(all.kvs().len(), 10);
    let mut sources = std::collections::BTreeSet::new();
    for kv in all.kvs() {
        let body = kv.value().strip_prefix(b"k8s:enc:kms:v2:test-kms:").expect("kube's KMS v2 prefix");
        let object = EncryptedObject::decode(body).unwrap();
        assert_eq!((object.key_id.as_str(), object.encrypted_dek_source_type), ("1", 1));
        assert_eq!(
            object.annotations.get("local-kek.kms.kubernetes.io").map(Vec::as_slice),
            Some(&b"encrypted-local-kek"[..])
        );
        sources.insert(object.encrypted_dek_source.clone());
        let (info, rest) = object.encrypted_data.split_at(32);
        let (nonce, sealed) = rest.split_at(12);
        let mut key = [0u8; 32];
        hkdf::Hkdf::<sha2::Sha256>::from_prk(&seed).unwrap().expand(info, &mut key).unwrap();
        let gcm = aes_gcm::Aes256Gcm::new_from_slice(&key).unwrap();
        let plain = gcm.decrypt(nonce.into(), Payload { msg: sealed, aad: kv.key() }).expect("our envelope opens");
        assert!(String::from_utf8_lossy(&plain).contains(MARKER));
        assert!(!kv.value().windows(MARKER.len()).any(|w| w == MARKER.as_bytes()));
    }
    assert_eq!(sources.len(), 1, "every value shares the one seed");
    let code = |p: &str| {
        let (client, req) = (client.clone(), Request::get(p).body(vec![]).unwrap());
        async move { raw(&client, req).await }
    };
    assert_eq!(code("/readyz").await.0, 200);
    assert_eq!(code("/healthz/kms-providers").await.0, 200);

    // The plugin goes away: /readyz says so; writes go on for the write TTL, then fail clearly.
    plugin.stop();
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let (status, _, body) = code("/healthz/kms-providers").await;
        if status == 500 {
            let text = String::from_utf8_lossy(&body);
            assert!(
                text.contains(
                    "kms-provider-0: failed to perform status section of the healthz check for KMS Provider test-kms"
                ),
                "{text}"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "kms-providers still passing");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(code("/readyz").await.0, 500);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (status, refused) = create("late".into()).await;
    assert_eq!(status, 500, "{refused}");
    assert!(refused["message"].as_str().unwrap().contains("expired at"), "{refused}");
    assert_eq!(code(&format!("{path}/p3")).await.0, 200, "reads go on from the cache");

    // Back: writes again, nothing lost.
    plugin.resume();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while create("after".into()).await.0 != 201 {
        assert!(std::time::Instant::now() < deadline, "writes did not come back");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (_, _, body) = code(path).await;
    assert_eq!(json(&body)["items"].as_array().unwrap().len(), 11);

    // A new key ID: a new seed; the old key's objects are counted as still to migrate, and a restart's pass
    // rewrites them (each read once through the plugin after the restart: a cache miss per seed).
    plugin.set_key_id("2");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while plugin.calls().0 < 2 {
        assert!(std::time::Instant::now() < deadline, "no new seed for key 2");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(create("p-new".into()).await.0, 201);
    let remaining =
        until("the stale count", &client, |t| metric(t, "podset_storage_migration_remaining") >= 11.0).await;
    assert_eq!(metric(&remaining, "podset_storage_migration_remaining"), 11.0);
    let mut server = server;
    server.terminate();
    let server = server.restart();
    let client = server.client();
    until("the migration", &client, |t| metric(t, "podset_storage_migration_remaining") == 0.0).await;
    let all = etcd_client
        .get("/registry/demo.k8s.io/podsets/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(all.kvs().len(), 12);
    for kv in all.kvs() {
        let object = EncryptedObject::decode(&kv.value()[b"k8s:enc:kms:v2:test-kms:".len()..]).unwrap();
        assert_eq!(object.key_id, "2", "{}", String::from_utf8_lossy(kv.key()));
    }
    assert!(plugin.calls().1 >= 1, "the restart read the old seeds through the plugin");
}

/// A backup holds PodSets decrypted (it is read through the API); a restore writes them through the providers it is
/// given, so the restored store holds nothing in the clear, and a server with the same configuration reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_encrypts_what_it_writes() {
    use common::{raw, TestServer};
    use http::Request;
    let dir = tempfile::tempdir().unwrap();
    let (_, flag) = config_file(dir.path(), &aescbc("a", KEY_A));
    let source = TestServer::start(&[&flag]);
    let client = source.client();
    let path = "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets";
    let ps = marked_podset("web");
    let req = Request::post(path).header("content-type", "application/json");
    assert_eq!(raw(&client, req.body(serde_json::to_vec(&ps).unwrap()).unwrap()).await.0, 201);
    let (_, _, list) = raw(&client, Request::get("/apis/demo.k8s.io/v1alpha1/podsets").body(vec![]).unwrap()).await;
    assert!(String::from_utf8_lossy(&list).contains(MARKER), "the backup is decrypted");
    let backup = dir.path().join("backup.json");
    std::fs::write(&backup, &list).unwrap();

    let target = dir.path().join("restored");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_podset-apiserver"))
        .args(["restore", "--from"])
        .arg(&backup)
        .arg("--data-dir")
        .arg(&target)
        .arg(&flag)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(files_contain(&target, MARKER.as_bytes()), Vec::<String>::new());
    let restored = TestServer::start_in(target, None, vec!["--insecure-allow-all".into(), flag]);
    let (code, _, body) = raw(&restored.client(), Request::get(format!("{path}/web")).body(vec![]).unwrap()).await;
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&body).contains(MARKER));
}

/// KMS v2 on sled: after a restart the load (on a blocking thread) reads the seed back through the plugin; a
/// restart while the plugin is down waits for it before loading, so nothing reads as unreadable once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kms_v2_on_sled_reads_back_after_a_restart() {
    use common::{raw, TestServer};
    use http::Request;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kms.sock");
    let plugin = podset_envtest::kms::KmsPlugin::start(&socket);
    let provider =
        format!("  - kms:\n      apiVersion: v2\n      name: sled-kms\n      endpoint: unix://{}\n", socket.display());
    let (_, flag) = config_file(dir.path(), &provider);
    let mut server = TestServer::start(&[&flag]);
    let path = "/apis/demo.k8s.io/v1alpha1/namespaces/default/podsets";
    let body = serde_json::to_vec(&common::podset("web", 0)).unwrap();
    let req = Request::post(path).header("content-type", "application/json").body(body).unwrap();
    assert_eq!(raw(&server.client(), req).await.0, 201);
    server.terminate();
    let server = server.restart();
    let (code, _, _) = raw(&server.client(), Request::get(format!("{path}/web")).body(vec![]).unwrap()).await;
    assert_eq!(code, 200);
    assert!(plugin.calls().1 >= 1, "the seed was decrypted by the plugin at the load");
    assert_eq!(files_contain(&server.data_dir.join("db"), b"\"app\":\"web\""), Vec::<String>::new());

    let mut server = server;
    server.terminate();
    plugin.stop();
    let plugin = std::sync::Arc::new(plugin);
    let back = {
        let plugin = plugin.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(3));
            plugin.resume();
        })
    };
    let server = server.restart();
    back.join().unwrap();
    assert!(server.log_contains("waiting for the KMS v2 plugins to answer before loading the store"));
    let (code, _, body) = raw(&server.client(), Request::get(format!("{path}/web")).body(vec![]).unwrap()).await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
}
