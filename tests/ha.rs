//! High availability on etcd, on the real control plane: two podset-apiservers on two addresses behind one Service
//! (kube-apiserver with `--enable-aggregator-routing` picks one per request), sharing the cluster's etcd. The
//! controller's leader is killed under kubectl load.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{in_namespace, runtime, wait};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use podset_apiserver::api::PodSet;
use podset_envtest::{Cluster, Credential, ServerCommand};
use serde_json::Value;

fn podset_yaml(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: demo.k8s.io/v1alpha1\nkind: PodSet\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  \
         template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      containers:\n      - {{name: main, image: busybox}}\n"
    )
}

/// Runs kubectl until it succeeds (a request that lands on a replica just killed fails; a client retries), up to
/// 30 s. Returns the output, or the last error.
fn kubectl_retrying(c: &Cluster, args: &[&str]) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match c.kubectl_try(args) {
            Ok(out) => return Ok(out),
            // A create whose first attempt was applied but not answered: the object is there, acknowledged.
            Err(e) if e.contains("AlreadyExists") => return Ok(e),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

/// Active (not terminating) Pods per controlling PodSet uid, and each PodSet's uid → (name, spec.replicas).
/// Pods per owner uid, and PodSets by uid: (name, spec.replicas).
type Ownership = (BTreeMap<String, u64>, BTreeMap<String, (String, u64)>);

fn ownership(c: &Cluster) -> Option<Ownership> {
    let pods: Value = serde_json::from_str(&c.kubectl_try(&["get", "pods", "-o", "json"]).ok()?).ok()?;
    // PodSets are read after Pods: with replicas only growing in this test, a Pod count is never compared with a
    // smaller wish than the one it was made for.
    let sets: Value = serde_json::from_str(&c.kubectl_try(&["get", "podsets", "-o", "json"]).ok()?).ok()?;
    let mut owned = BTreeMap::new();
    for p in pods["items"].as_array()? {
        if p["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        for r in p["metadata"]["ownerReferences"].as_array().into_iter().flatten() {
            if r["controller"] == true && r["kind"] == "PodSet" {
                *owned.entry(r["uid"].as_str()?.to_owned()).or_insert(0) += 1;
            }
        }
    }
    let wanted = sets["items"]
        .as_array()?
        .iter()
        .filter_map(|s| {
            let uid = s["metadata"]["uid"].as_str()?.to_owned();
            Some((uid, (s["metadata"]["name"].as_str()?.to_owned(), s["spec"]["replicas"].as_u64()?)))
        })
        .collect();
    Some((owned, wanted))
}

#[test]
fn two_replicas_on_etcd_survive_losing_the_leader() {
    in_namespace("two_replicas_on_etcd_survive_losing_the_leader", || {
        let mut c = Cluster::start_replicated(ServerCommand { program: common::BIN.into(), args: Vec::new() }, 2);
        for i in 0..3 {
            c.apply_text(&format!("ps-{i}.yaml"), &podset_yaml(&format!("ps-{i}"), 2));
        }
        c.wait_for("a leader", Duration::from_secs(60), |c| c.controller_leader().is_some());
        let first = c.controller_leader().unwrap();
        let survivor = 1 - first;
        c.wait_for("the leader's controller to make 6 Pods", Duration::from_secs(90), |c| {
            c.kubectl_try(&["get", "pods", "-o", "name"]).is_ok_and(|o| o.lines().count() == 6)
        });

        // Both replicas serve every write at once: a write on one, a consistent read and a watch on the other.
        let admin = c.client_cert("ca", "ha-admin", Some("system:masters"));
        runtime().block_on(async {
            let a: Api<PodSet> = Api::namespaced(c.replica_client(0, Credential::Cert(&admin)), "default");
            let b: Api<PodSet> = Api::namespaced(c.replica_client(1, Credential::Cert(&admin)), "default");
            let from = b.get("ps-0").await.unwrap().metadata.resource_version.unwrap();
            let mut events = b.watch(&WatchParams::default(), &from).await.unwrap().boxed();
            for i in 0..10 {
                let ps: PodSet = serde_yaml::from_str(&podset_yaml(&format!("direct-{i}"), 0)).unwrap();
                let made = a.create(&PostParams::default(), &ps).await.unwrap();
                let seen = b.get(&format!("direct-{i}")).await.expect("a write on A is read at once on B");
                // The same write or a newer one (the controller writes status at once).
                let rv = |p: &PodSet| p.metadata.resource_version.as_deref().unwrap().parse::<u64>().unwrap();
                assert!(rv(&seen) >= rv(&made), "B read {} after A wrote {}", rv(&seen), rv(&made));
            }
            let mut added = Vec::new();
            while added.len() < 10 {
                let ev = tokio::time::timeout(Duration::from_secs(10), events.next()).await.unwrap().unwrap().unwrap();
                // (ps-1 and ps-2 were created after ps-0's revision too.)
                if let WatchEvent::Added(ps) = ev {
                    added.extend(ps.metadata.name.filter(|n| n.starts_with("direct-")));
                }
            }
            assert_eq!(added, (0..10).map(|i| format!("direct-{i}")).collect::<Vec<_>>(), "in order, once each");
        });

        // kubectl load through the aggregator, and a check that no PodSet ever owns more Pods than it asked for.
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(BTreeSet::new()));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let over = Arc::new(Mutex::new(Vec::new()));
        let checks = Arc::new(Mutex::new(0usize));
        std::thread::scope(|scope| {
            let c = &c;
            let load = scope.spawn({
                let (stop, acked, failures) = (stop.clone(), acked.clone(), failures.clone());
                move || {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let name = format!("load-{i}");
                        let path = c.dir.path().join(format!("{name}.yaml"));
                        std::fs::write(&path, podset_yaml(&name, 1)).unwrap();
                        match kubectl_retrying(c, &["create", "-f", path.to_str().unwrap()]) {
                            Ok(_) => drop(acked.lock().unwrap().insert(name)),
                            Err(e) => failures.lock().unwrap().push(format!("create {name}: {e}")),
                        }
                        if let Err(e) = kubectl_retrying(c, &["get", "podsets"]) {
                            failures.lock().unwrap().push(format!("list: {e}"));
                        }
                        if i % 3 == 0 {
                            let replicas = format!("--replicas={}", 3 + i / 3);
                            if let Err(e) = kubectl_retrying(c, &["scale", "podset", "ps-0", &replicas]) {
                                failures.lock().unwrap().push(format!("scale: {e}"));
                            }
                        }
                        i += 1;
                    }
                }
            });
            let monitor = scope.spawn({
                let (stop, over, checks) = (stop.clone(), over.clone(), checks.clone());
                move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Some((owned, wanted)) = ownership(c) {
                            *checks.lock().unwrap() += 1;
                            for (uid, n) in owned {
                                if let Some((name, want)) = wanted.get(&uid).filter(|(_, want)| n > *want) {
                                    over.lock().unwrap().push(format!("{name} owns {n} Pods, wants {want}"));
                                }
                            }
                        }
                        std::thread::sleep(Duration::from_millis(300));
                    }
                }
            });

            std::thread::sleep(Duration::from_secs(5));
            let killed_at = Instant::now();
            // SIGKILL, as a lost node: no graceful step-down, the Lease has to expire.
            let pid = c.replica_pid(first).expect("the leader runs").to_string();
            assert!(std::process::Command::new("kill").args(["-9", &pid]).status().unwrap().success());
            // What the endpoints controller does once the dead pod fails its readiness probe.
            std::thread::sleep(Duration::from_secs(2));
            c.set_ready_replicas(&[survivor]);
            let deadline = killed_at + Duration::from_secs(20);
            while c.controller_leader() != Some(survivor) {
                assert!(Instant::now() < deadline, "replica {survivor} did not take the lease within 20 s");
                std::thread::sleep(Duration::from_millis(200));
            }
            eprintln!("lease taken over {:.1}s after the leader was killed", killed_at.elapsed().as_secs_f64());
            std::thread::sleep(Duration::from_secs(8));
            stop.store(true, Ordering::Relaxed);
            load.join().unwrap();
            monitor.join().unwrap();
        });
        c.kill_replica(first);
        let failures = failures.lock().unwrap().clone();
        assert!(failures.is_empty(), "requests that never succeeded: {failures:#?}");
        assert!(over.lock().unwrap().is_empty(), "over-owned: {:#?}", over.lock().unwrap());
        assert!(*checks.lock().unwrap() >= 10, "the ownership check ran");
        let acked = acked.lock().unwrap().clone();
        assert!(acked.len() >= 5, "the load made progress: {acked:?}");

        // The new leader reconciles: every load PodSet gets its Pod, ps-0 its scaled count; nothing acknowledged
        // is lost.
        let want_ps0 =
            c.kubectl(&["get", "podset", "ps-0", "-o", "jsonpath={.spec.replicas}"]).parse::<usize>().unwrap();
        c.wait_for("the new leader to reconcile everything", Duration::from_secs(90), |c| {
            let Some((owned, wanted)) = ownership(c) else { return false };
            wanted.iter().all(|(uid, (_, want))| owned.get(uid).copied().unwrap_or(0) == *want)
        });
        let names = c.kubectl(&["get", "podsets", "-o", "jsonpath={.items[*].metadata.name}"]);
        let names: BTreeSet<String> = names.split_whitespace().map(String::from).collect();
        assert!(acked.is_subset(&names), "acknowledged but lost: {:?}", acked.difference(&names).collect::<Vec<_>>());
        let ps0_pods = c.kubectl(&["get", "pods", "-l", "app=ps-0", "-o", "name"]).lines().count();
        assert_eq!(ps0_pods, want_ps0);

        // The killed replica comes back and serves the same data.
        c.start_replica(first);
        c.set_ready_replicas(&[0, 1]);
        runtime().block_on(async {
            let back: Api<PodSet> = Api::namespaced(c.replica_client(first, Credential::Cert(&admin)), "default");
            let deadline = Instant::now() + Duration::from_secs(60);
            let listed = loop {
                match back.list(&Default::default()).await {
                    Ok(l) => break l,
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        tokio::time::sleep(Duration::from_millis(300)).await
                    }
                    Err(e) => panic!("the restarted replica does not serve: {e}"),
                }
            };
            let listed: BTreeSet<String> = listed.items.into_iter().filter_map(|p| p.metadata.name).collect();
            assert_eq!(listed, names);
        });
        assert!(c.replica_log(survivor).contains("became leader"), "{}", c.replica_log(survivor));
    });
}

/// A leader stopped (SIGSTOP) in the middle of creating Pods, for longer than its Lease: the other replica takes
/// over and settles the PodSet at its new, smaller size; the stopped one, woken, must not go on with the creates it
/// had decided on before (its Lease lapsed while it slept), so no Pod of that PodSet is created after it wakes.
#[test]
fn a_leader_woken_after_its_lease_lapsed_creates_no_pods() {
    in_namespace("a_leader_woken_after_its_lease_lapsed_creates_no_pods", || {
        // One create a second, so that a batch of creates is still waiting for the rate limit when it stops.
        let args = vec!["--controller-qps=1".into(), "--controller-burst=2".into()];
        let c = Cluster::start_replicated(ServerCommand { program: common::BIN.into(), args }, 2);
        c.wait_for("a leader", Duration::from_secs(60), |c| c.controller_leader().is_some());
        let leader = c.controller_leader().unwrap();
        let other = 1 - leader;
        c.apply_text("slow.yaml", &podset_yaml("slow", 40));
        c.wait_for("the leader to be creating Pods", Duration::from_secs(60), |c| {
            c.kubectl_try(&["get", "pods", "-l", "app=slow", "-o", "name"]).is_ok_and(|o| o.lines().count() >= 4)
        });
        let pid = c.replica_pid(leader).unwrap().to_string();
        assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
        // Requests go to the other replica only, as once the stopped one fails its readiness probe.
        c.set_ready_replicas(&[other]);
        let admin = c.client_cert("ca", "ha-admin", Some("system:masters"));
        runtime().block_on(async {
            let sets: Api<PodSet> = Api::namespaced(c.replica_client(other, Credential::Cert(&admin)), "default");
            let patch = kube::api::Patch::Merge(serde_json::json!({"spec": {"replicas": 0}}));
            sets.patch("slow", &kube::api::PatchParams::default(), &patch).await.unwrap();
        });
        c.wait_for("the other replica to lead and delete the Pods", Duration::from_secs(90), |c| {
            c.controller_leader() == Some(other)
                && c.kubectl_try(&["get", "pods", "-l", "app=slow", "-o", "name"]).is_ok_and(|o| o.trim().is_empty())
        });
        runtime().block_on(async {
            let pods: Api<Pod> = Api::namespaced(c.client().await, "default");
            let from = pods.list(&Default::default()).await.unwrap().metadata.resource_version.unwrap();
            let mut events = pods.watch(&WatchParams::default().labels("app=slow"), &from).await.unwrap().boxed();
            assert!(std::process::Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
            let mut created = Vec::new();
            let until = tokio::time::Instant::now() + Duration::from_secs(8);
            while let Ok(Some(ev)) = tokio::time::timeout_at(until, events.next()).await {
                if let WatchEvent::Added(p) = ev.unwrap() {
                    created.extend(p.metadata.name);
                }
            }
            assert!(created.is_empty(), "the woken leader created {created:?} for a PodSet scaled to 0");
        });
        c.wait_for("the woken replica to step down", Duration::from_secs(30), |c| {
            c.replica_log(leader).contains("lost leadership")
        });
    });
}

/// Whether a Pod names the PodSet `uid` (or a PodSet called `name`) among its owners.
fn owned_by(pod: &Pod, name: &str, uid: &str) -> bool {
    pod.metadata.owner_references.iter().flatten().any(|r| r.uid == uid || (r.kind == "PodSet" && r.name == name))
}

/// A PodSet deleted with propagationPolicy=Orphan through the replica that does not lead, while the leader's cached
/// reads still show it alive (`late-deletes`, planted in both replicas as either may lead): the garbage collector
/// orphans its Pods, and the leader must not adopt them back. The test's finalizer keeps the PodSet, being deleted,
/// until the leader has refused once; then it goes, and the leader refuses again. `planted`: more bugs to plant.
/// Err names a Pod adopted back, or deleted.
fn orphans_of_a_deleted_podset_stay_orphans(planted: &[&str]) -> Result<(), String> {
    const HOLD: &str = "example.com/hold";
    let args = ["late-deletes"].iter().chain(planted).map(|b| format!("--planted-bug={b}").into()).collect();
    let c = Cluster::start_replicated(ServerCommand { program: common::BIN.into(), args }, 2);
    c.wait_for("a leader", Duration::from_secs(60), |c| c.controller_leader().is_some());
    let leader = c.controller_leader().unwrap();
    let admin = c.client_cert("ca", "ha-admin", Some("system:masters"));
    let result = runtime().block_on(async {
        let sets: Api<PodSet> = Api::namespaced(c.replica_client(1 - leader, Credential::Cert(&admin)), "default");
        let pods: Api<Pod> = Api::namespaced(c.client().await, "default");
        let mut ps: PodSet = serde_yaml::from_str(&podset_yaml("kept", 2)).unwrap();
        ps.metadata.finalizers = Some(vec![HOLD.into()]);
        let uid = sets.create(&PostParams::default(), &ps).await.unwrap().metadata.uid.unwrap();
        let selected = ListParams::default().labels("app=kept");
        wait(
            Duration::from_secs(60),
            || async {
                let items = pods.list(&selected).await.unwrap().items;
                items.len() == 2 && items.iter().all(|p| owned_by(p, "kept", &uid))
            },
            "the leader to make 2 Pods",
        )
        .await;

        let from = pods.list(&selected).await.unwrap().metadata.resource_version.unwrap();
        let mut events = pods.watch(&WatchParams::default().labels("app=kept"), &from).await.unwrap().boxed();
        let deleted_at = tokio::time::Instant::now();
        sets.delete("kept", &DeleteParams::orphan()).await.unwrap();
        // Until the leader's window of stale reads is surely over.
        let until = deleted_at + podset_apiserver::planted::LATE_DELETES + Duration::from_secs(1);
        let mut orphans = BTreeSet::new();
        let mut released = false;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => break,
                ev = events.next() => match ev.expect("the Pod watch ended").unwrap() {
                    WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                        let name = p.metadata.name.clone().unwrap();
                        if !owned_by(&p, "kept", &uid) {
                            orphans.insert(name);
                        } else if orphans.contains(&name) {
                            let owners = p.metadata.owner_references;
                            return Err(format!("orphan {name} adopted again by the deleted PodSet: {owners:?}"));
                        }
                    }
                    WatchEvent::Deleted(p) => return Err(format!("orphan {:?} deleted", p.metadata.name)),
                    WatchEvent::Bookmark(_) => {}
                    WatchEvent::Error(e) => panic!("Pod watch: {e:?}"),
                },
                _ = tick.tick(), if !released && orphans.len() == 2 => {
                    // Only the test's finalizer left: the garbage collector is done.
                    let done = sets.get("kept").await.unwrap().metadata.finalizers == Some(vec![HOLD.into()]);
                    if done && c.replica_log(leader).contains("has just been deleted") {
                        let gone = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
                        sets.patch("kept", &PatchParams::default(), &gone).await.unwrap();
                        released = true;
                    }
                }
            }
        }
        let log = c.replica_log(leader);
        assert!(released, "no refused adoption of a PodSet being deleted within {:?}:\n{log}", until - deleted_at);
        assert!(sets.get_opt("kept").await.unwrap().is_none(), "the PodSet is gone");
        // The stale path was taken both ways: the fresh read found the PodSet being deleted, then gone.
        let refused = |why: &str| log.lines().any(|l| l.contains("can't adopt Pod") && l.contains(why));
        assert!(refused("has just been deleted") && refused("not found"), "{log}");
        assert_eq!(c.controller_leader(), Some(leader), "the same leader throughout");
        let items = pods.list(&selected).await.unwrap().items;
        assert!(items.len() == 2 && items.iter().all(|p| !owned_by(p, "kept", &uid)), "{items:#?}");
        Ok(())
    });
    result
}

#[test]
fn a_leader_with_a_stale_cache_adopts_no_orphan_of_a_deleted_podset() {
    in_namespace("a_leader_with_a_stale_cache_adopts_no_orphan_of_a_deleted_podset", || {
        orphans_of_a_deleted_podset_stay_orphans(&[]).unwrap();
    });
}

#[test]
fn without_the_adoption_recheck_a_leader_with_a_stale_cache_adopts_the_orphans() {
    in_namespace("without_the_adoption_recheck_a_leader_with_a_stale_cache_adopts_the_orphans", || {
        let e = orphans_of_a_deleted_podset_stay_orphans(&["no-adoption-recheck"])
            .expect_err("the test above fails when the recheck is gone");
        assert!(e.contains("adopted again by the deleted PodSet"), "{e}");
    });
}
