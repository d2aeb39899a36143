//! Backup, restore and moving between backends, one path for all three: a backup is `kubectl get podsets -A -o json
//! --show-managed-fields` of a running server (a chunked list: every PodSet at one revision, writers never paused);
//! `podset-apiserver restore` writes it into an empty store of either backend. Tested sled → etcd → sled.

mod common;

use std::path::Path;
use std::process::Command;

use common::{assets_dir, TestServer, BIN};
use kube::api::{Api, Patch, PatchParams, PostParams};
use podset_apiserver::api::PodSet;
use podset_envtest::etcd::Etcd;
use serde_json::{json, Value};

/// A backup through kubectl 1.37, in small chunks so it takes several pages.
fn backup(server: &TestServer, dir: &Path, name: &str) -> Value {
    let kubeconfig = server.write_kubeconfig(dir);
    let out = Command::new(assets_dir().join("kubectl"))
        // In v1alpha1, as docs/install.md takes a backup before an upgrade: what every build restores.
        .args(["get", "podsets.v1alpha1.demo.k8s.io", "-A", "-o", "json", "--show-managed-fields", "--chunk-size=7"])
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .env("HOME", dir)
        .output()
        .expect("kubectl");
    assert!(out.status.success(), "kubectl: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(dir.join(name), &out.stdout).unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

fn restore(file: &Path, data_dir: &Path, storage: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("restore")
        .arg("--from")
        .arg(file)
        .arg("--data-dir")
        .arg(data_dir)
        .args(storage)
        .env("RUST_LOG", "warn")
        .output()
        .expect("podset-apiserver restore")
}

/// Every PodSet by namespace/name, without what a restore changes (resourceVersion).
fn objects(list: &Value) -> std::collections::BTreeMap<String, Value> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let mut o = o.clone();
            o["metadata"].as_object_mut().unwrap().remove("resourceVersion");
            (format!("{}/{}", o["metadata"]["namespace"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap()), o)
        })
        .collect()
}

async fn populate(server: &TestServer) -> u64 {
    let client = server.client();
    let mut last = 0;
    for ns in ["team-a", "team-b"] {
        let api: Api<PodSet> = Api::namespaced(client.clone(), ns);
        for i in 0..12 {
            let mut body = common::podset(&format!("web-{i}"), i % 3);
            body["metadata"]["finalizers"] = json!(["example.com/keep"]);
            body["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "example.com/v1", "kind": "App", "name": "owner", "uid": format!("owner-{i}")
            }]);
            let ps: PodSet = serde_json::from_value(body).unwrap();
            api.create(&PostParams::default(), &ps).await.unwrap();
            // A spec change (generation 2), a status write, and an apply by a second manager.
            api.patch(&format!("web-{i}"), &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": i}})))
                .await
                .unwrap();
            let status = json!({"status": {"replicas": i, "readyReplicas": 0, "observedGeneration": 2}});
            api.patch_status(&format!("web-{i}"), &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
            let apply = json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet",
                               "metadata": {"name": format!("web-{i}"), "labels": {"tier": "front"}}});
            let written =
                api.patch(&format!("web-{i}"), &PatchParams::apply("labeller"), &Patch::Apply(apply)).await.unwrap();
            last = written.metadata.resource_version.unwrap().parse().unwrap();
        }
    }
    last
}

#[test]
fn backups_restore_into_either_backend_as_they_were() {
    common::cluster::runtime().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let sled = TestServer::start(&[]);
        let last_rv = populate(&sled).await;

        // A backup while another client keeps writing: the list is one revision, whatever happens meanwhile.
        let writer = {
            let client = sled.client();
            tokio::spawn(async move {
                let api: Api<PodSet> = Api::namespaced(client, "team-c");
                for i in 0..40 {
                    let ps: PodSet = serde_json::from_value(common::podset(&format!("late-{i}"), 0)).unwrap();
                    api.create(&PostParams::default(), &ps).await.unwrap();
                }
            })
        };
        let first = tokio::task::spawn_blocking({
            let (dir, kubeconfig) = (tmp.path().to_owned(), sled.write_kubeconfig(tmp.path()));
            move || {
                let out = Command::new(assets_dir().join("kubectl"))
                    // In v1alpha1, as docs/install.md takes a backup before an upgrade: what every build restores.
                    .args([
                        "get",
                        "podsets.v1alpha1.demo.k8s.io",
                        "-A",
                        "-o",
                        "json",
                        "--show-managed-fields",
                        "--chunk-size=7",
                    ])
                    .arg(format!("--kubeconfig={}", kubeconfig.display()))
                    .env("HOME", &dir)
                    .output()
                    .expect("kubectl");
                assert!(out.status.success(), "kubectl: {}", String::from_utf8_lossy(&out.stderr));
                std::fs::write(dir.join("sled-backup.json"), &out.stdout).unwrap();
                serde_json::from_slice::<Value>(&out.stdout).unwrap()
            }
        })
        .await
        .unwrap();
        writer.await.unwrap();
        let items = first["items"].as_array().unwrap();
        let max_rv =
            items.iter().map(|o| o["metadata"]["resourceVersion"].as_str().unwrap().parse::<u64>().unwrap()).max();
        // The same list, read again at the revision of the last object it holds, has exactly its objects: no
        // object of a later revision slipped into a later page.
        let again: Value = sled
            .client()
            .request(
                http::Request::get(format!(
                    "/apis/demo.k8s.io/v1alpha1/podsets?resourceVersion={}&resourceVersionMatch=Exact",
                    max_rv.unwrap()
                ))
                .body(Vec::new())
                .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(objects(&first).keys().collect::<Vec<_>>(), objects(&again).keys().collect::<Vec<_>>());
        assert!(items.len() >= 24, "the 24 PodSets, and the late ones made before the backup's revision");

        // sled → etcd.
        let etcd = Etcd::start(&tmp.path().join("etcd"));
        let etcd_flags = ["--storage-backend=etcd".to_owned(), format!("--etcd-servers={}", etcd.url())];
        let flags: Vec<&str> = etcd_flags.iter().map(String::as_str).collect();
        let out = restore(&tmp.path().join("sled-backup.json"), &tmp.path().join("restore-1"), &flags);
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "restore into etcd: {text}");
        assert!(text.contains(&format!("restored {} PodSets", items.len())), "{text}");

        let mut args = vec!["--insecure-allow-all".to_owned(), "--enable-controller=false".to_owned()];
        args.extend(etcd_flags.iter().cloned());
        let on_etcd = TestServer::start_in(tmp.path().join("etcd-server"), None, args);
        let second = backup(&on_etcd, tmp.path(), "etcd-backup.json");
        assert_eq!(
            objects(&second),
            objects(&first),
            "uid, timestamps, generation, finalizers, owners, managedFields, status: as they were"
        );
        let web = &objects(&second)["team-a/web-5"];
        assert_eq!(web["metadata"]["generation"], 2);
        assert_eq!(web["metadata"]["managedFields"].as_array().unwrap().len(), 3, "{web}");

        // resourceVersions from before the restore: a watch from one is refused (410 or too large), never a
        // silent stream of different history.
        // (One plain request each: kube's client would retry the 504.)
        for old in [2, last_rv] {
            let url = format!(
                "/apis/demo.k8s.io/v1alpha1/namespaces/team-a/podsets?watch=1&resourceVersion={old}&timeoutSeconds=2"
            );
            let req = http::Request::get(url).header("host", "x").body(Vec::new()).unwrap();
            let (code, body) = common::request_once(on_etcd.addr, &on_etcd.ca, req).await;
            let body = String::from_utf8_lossy(&body);
            let refused = (code == 200 && body.contains("\"code\":410"))
                || (code == 504 && body.contains("Too large resource version"));
            assert!(refused, "watch from {old}: {code} {body}");
        }

        // A restore never merges into a store that holds PodSets: refused, nothing changed.
        let out = restore(&tmp.path().join("sled-backup.json"), &tmp.path().join("restore-2"), &flags);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("already holds PodSets"), "{out:?}");

        // etcd → sled.
        let out = restore(&tmp.path().join("etcd-backup.json"), &tmp.path().join("sled-2"), &[]);
        assert!(out.status.success(), "restore into sled: {out:?}");
        let back = TestServer::start_in(
            tmp.path().join("sled-2"),
            None,
            vec!["--insecure-allow-all".to_owned(), "--enable-controller=false".to_owned()],
        );
        let third = backup(&back, tmp.path(), "sled-2-backup.json");
        assert_eq!(objects(&third), objects(&first));
        // ... and it serves writes as usual, from the next revision on.
        let api: Api<PodSet> = Api::namespaced(back.client(), "team-b");
        let scaled = api.patch("web-5", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 7}}))).await;
        assert_eq!(scaled.unwrap().metadata.generation, Some(3));

        // A broken item is named; as the only one, it leaves the store empty for a second try.
        let no_uid = json!({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet",
                            "metadata": {"name": "no-uid", "namespace": "x"}, "spec": {"replicas": 1}});
        let bad = json!({"kind": "List", "items": [no_uid]});
        std::fs::write(tmp.path().join("bad.json"), bad.to_string()).unwrap();
        let out = restore(&tmp.path().join("bad.json"), &tmp.path().join("sled-3"), &[]);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("x/no-uid") && !stderr.contains("empty it"), "{out:?}");

        // A namespace that is not a DNS label would become part of the storage key: refused.
        let mut slashed = first["items"][0].clone();
        slashed["metadata"]["namespace"] = json!("a/b");
        std::fs::write(tmp.path().join("slashed.json"), json!({"kind": "List", "items": [slashed]}).to_string())
            .unwrap();
        let out = restore(&tmp.path().join("slashed.json"), &tmp.path().join("sled-4"), &[]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("metadata.namespace"), "{out:?}");

        // A broken item after many good ones (more than are written at once): those are stored, and the error
        // says the store must be emptied; a second try is refused until it is.
        let mut items: Vec<Value> = (0..600)
            .map(|i| {
                let mut o = first["items"][0].clone();
                o["metadata"]["name"] = json!(format!("many-{i:03}"));
                o["metadata"]["uid"] = json!(format!("00000000-0000-0000-0000-{i:012}"));
                o
            })
            .collect();
        items.push(no_uid);
        std::fs::write(tmp.path().join("partial.json"), json!({"kind": "List", "items": items}).to_string()).unwrap();
        let out = restore(&tmp.path().join("partial.json"), &tmp.path().join("sled-5"), &[]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("empty it before restoring again"), "{out:?}");
        let again = restore(&tmp.path().join("partial.json"), &tmp.path().join("sled-5"), &[]);
        assert!(String::from_utf8_lossy(&again.stderr).contains("already holds PodSets"), "{again:?}");

        // A backup cut short in its last line is an error, not a smaller restore.
        let lines: String = (0..3).map(|i| format!("{}\n", items[i])).collect();
        let cut = &lines[..lines.len() - 20];
        std::fs::write(tmp.path().join("cut.ndjson"), cut).unwrap();
        let out = restore(&tmp.path().join("cut.ndjson"), &tmp.path().join("sled-6"), &[]);
        assert!(!out.status.success(), "{out:?}");
    });
}

/// `podset-apiserver backup`, what the in-cluster CronJob runs (deploy/backup), writes what kubectl writes.
#[test]
fn the_backup_subcommand_writes_what_kubectl_writes_and_restore_reads_it() {
    common::cluster::runtime().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let server = TestServer::start(&[]);
        populate(&server).await;
        let by_kubectl = backup(&server, tmp.path(), "kubectl.json");
        let kubeconfig = server.write_kubeconfig(tmp.path());
        let ours = |args: &[&str]| {
            Command::new(BIN)
                .arg("backup")
                .args(args)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .env("RUST_LOG", "warn")
                .output()
                .unwrap()
        };

        let file = tmp.path().join("ours.json");
        let out = ours(&["--to", file.to_str().unwrap(), "--chunk-size=7"]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("backed up 24 PodSets to {}\n", file.display()));
        let by_us: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!((&by_us["kind"], &by_us["apiVersion"]), (&json!("List"), &json!("v1")));
        assert_eq!(by_us["items"][0]["kind"], "PodSet");
        // In v1alpha1, the version every build's restore reads; in v1beta1 when asked, and restore reads that too.
        assert_eq!(by_us["items"][0]["apiVersion"], "demo.k8s.io/v1alpha1");
        assert_eq!(objects(&by_us), objects(&by_kubectl));
        let beta = tmp.path().join("beta.json");
        let out = ours(&["--to", beta.to_str().unwrap(), "--output-version=v1beta1"]);
        assert!(out.status.success(), "{out:?}");
        let in_beta: Value = serde_json::from_slice(&std::fs::read(&beta).unwrap()).unwrap();
        assert_eq!(in_beta["items"][0]["apiVersion"], "demo.k8s.io/v1beta1");
        assert_eq!(objects(&in_beta).keys().collect::<Vec<_>>(), objects(&by_us).keys().collect::<Vec<_>>());
        let out = restore(&beta, &tmp.path().join("restored-beta"), &[]);
        assert!(String::from_utf8_lossy(&out.stdout).contains("restored 24 PodSets"), "{out:?}");

        // Into a directory, the newest --keep kept, latest.json naming the newest.
        let dir = tmp.path().join("backups");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("podsets-20200101T000000Z.json"), "old").unwrap();
        std::fs::write(dir.join("podsets-20200102T000000Z.json"), "old").unwrap();
        let out = ours(&["--to-dir", dir.to_str().unwrap(), "--keep=2"]);
        assert!(out.status.success(), "{out:?}");
        let mut names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        names.sort();
        assert_eq!(names.len(), 3, "{names:?}");
        assert_eq!(names[0], "latest.json");
        assert_eq!(names[1], "podsets-20200102T000000Z.json");
        assert_eq!(std::fs::read_link(dir.join("latest.json")).unwrap(), Path::new(&names[2]));
        let latest: Value = serde_json::from_slice(&std::fs::read(dir.join("latest.json")).unwrap()).unwrap();
        assert_eq!(objects(&latest), objects(&by_kubectl));

        let out = restore(&dir.join("latest.json"), &tmp.path().join("restored"), &[]);
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("restored 24 PodSets"), "{out:?}");

        // The server gone: an error, and no file, not even a partial one.
        drop(server);
        let failed = tmp.path().join("failed.json");
        let out = ours(&["--to", failed.to_str().unwrap()]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("listing PodSets"), "{out:?}");
        assert!(!failed.exists() && !tmp.path().join("failed.json.partial").exists());
    });
}
