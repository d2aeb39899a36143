//! The controller, from Pod counts sampled during the run: a PodSet never owns more active Pods than the most
//! `spec.replicas` it may have had within one reconcile before (a scale-down is done within one reconcile), and
//! never twice that (two leaders at work); never more than a spec the controller reported done; once settled,
//! Pods, `status.replicas` and `observedGeneration` agree with the spec.

use super::truth::Finding;
use crate::model::history::{History, PodCount, ReplicasSet, Time};

/// How long a create the controller sent may still be on its way after it wrote its status: a request's time.
const IN_FLIGHT: Time = crate::model::history::ANSWER_WITHIN;

/// The largest `spec.replicas` the key may have had at some moment in `[from, to]`: a value holds from its write's
/// start until a later write (started after it was acknowledged) is acknowledged.
fn most_wanted(sets: &[&ReplicasSet], from: Time, to: Time) -> Option<u32> {
    sets.iter()
        .filter(|s| s.call <= to)
        .filter(|s| {
            let replaced = sets.iter().filter(|n| n.call > s.ret).map(|n| n.ret).min().unwrap_or(Time::MAX);
            replaced >= from
        })
        .map(|s| s.replicas)
        .max()
}

fn line(p: &PodCount) -> String {
    format!("{}: {} active Pods read in [{:.3}s, {:.3}s]", p.key, p.active, p.call as f64 / 1e9, p.ret as f64 / 1e9)
}

pub fn check(history: &History) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in &history.pod_counts {
        let sets: Vec<&ReplicasSet> = history.replicas_sets.iter().filter(|s| s.key == p.key).collect();
        let Some(allowed) = most_wanted(&sets, p.call.saturating_sub(history.reconcile_grace), p.ret) else {
            continue;
        };
        if p.active > allowed {
            let what = if p.active >= 2 * allowed.max(1) {
                "twice the Pods asked for (two controllers at work?)"
            } else {
                "more Pods than spec.replicas for longer than one reconcile"
            };
            let wants: Vec<String> = sets
                .iter()
                .map(|s| {
                    format!(
                        "  replicas={} set in [{:.3}s, {:.3}s]",
                        s.replicas,
                        s.call as f64 / 1e9,
                        s.ret as f64 / 1e9
                    )
                })
                .collect();
            out.push((what.to_owned(), [vec![line(p), format!("at most {allowed} allowed")], wants].concat()));
        }
    }
    // Once the controller reported a spec done, Pods beyond it (and beyond any spec set while they were read, or
    // shortly before: as kube's ReplicaSet controller, it reports the generation it saw while creates it sent for
    // the spec before may still be on their way) were made by someone acting on an older view: a second leader.
    for p in history.pod_counts.iter().filter(|p| p.settled) {
        let meanwhile = history
            .replicas_sets
            .iter()
            .filter(|s| s.key == p.key && s.call <= p.ret && s.ret >= p.call.saturating_sub(IN_FLIGHT))
            .map(|s| s.replicas)
            .max()
            .unwrap_or(0);
        let allowed = p.replicas.max(meanwhile);
        if p.active > allowed {
            out.push((
                "more Pods than a spec the controller reported done".into(),
                vec![line(p), format!("spec.replicas {} reported done; at most {allowed} allowed", p.replicas)],
            ));
        }
    }
    for s in &history.settled {
        let ok = s.active == s.replicas
            && s.status_replicas == Some(s.replicas)
            && s.observed_generation == Some(s.generation);
        if !ok {
            out.push(("did not converge".into(), vec![format!("{s:?}")]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::history::Settled;

    const S: Time = 1_000_000_000;

    fn set(call: Time, ret: Time, replicas: u32) -> ReplicasSet {
        ReplicasSet { key: "ns/a".into(), call, ret, replicas }
    }
    fn count(call: Time, active: u32) -> PodCount {
        PodCount { key: "ns/a".into(), call, ret: call + S / 10, active, replicas: 0, settled: false }
    }
    fn found(sets: Vec<ReplicasSet>, counts: Vec<PodCount>) -> Vec<String> {
        let h = History { replicas_sets: sets, pod_counts: counts, reconcile_grace: 5 * S, ..Default::default() };
        check(&h).into_iter().map(|f| f.0).collect()
    }

    #[test]
    fn pods_may_lag_a_scale_down_by_one_reconcile() {
        let sets = vec![set(0, S, 4), set(10 * S, 11 * S, 1)];
        let counts = vec![count(2 * S, 4), count(12 * S, 4), count(20 * S, 1)];
        assert_eq!(found(sets, counts), Vec::<String>::new());
    }

    #[test]
    fn too_many_pods_after_a_reconcile_are_found() {
        let sets = vec![set(0, S, 4), set(10 * S, 11 * S, 2)];
        assert_eq!(
            found(sets.clone(), vec![count(20 * S, 3)]),
            ["more Pods than spec.replicas for longer than one reconcile"]
        );
        assert_eq!(found(sets, vec![count(20 * S, 4)]), ["twice the Pods asked for (two controllers at work?)"]);
        assert_eq!(
            found(vec![set(0, S, 2)], vec![count(2 * S, 4)]),
            ["twice the Pods asked for (two controllers at work?)"]
        );
    }

    #[test]
    fn pods_beyond_a_spec_reported_done_are_found() {
        let done = |call, active, replicas| PodCount { replicas, settled: true, ..count(call, active) };
        // Scaled to 3 while the Pods were read: 3 is allowed.
        let sets = vec![set(0, S, 1), set(10 * S, 10 * S + S / 20, 3)];
        assert_eq!(found(sets.clone(), vec![done(2 * S, 1, 1), done(10 * S, 3, 1)]), Vec::<String>::new());
        // Within a reconcile of a scale-down from 3, but the controller had reported 1 done long after any create
        // for 3 could still be on its way.
        let sets = vec![set(0, S, 3), set(2 * S, 2 * S + S / 20, 1)];
        let f = found(sets, vec![done(15 * S, 2, 1)]);
        assert!(f.contains(&"more Pods than a spec the controller reported done".to_owned()), "{f:?}");
        // Scaled to 3 then at once to 0: the creates for 3 land after the controller reported 0 done, as kube's
        // ReplicaSet controller does too; the deletes follow.
        let sets = vec![set(10 * S, 10 * S + S / 20, 3), set(10 * S + S / 10, 10 * S + S / 5, 0)];
        assert_eq!(found(sets, vec![done(10 * S + S / 2, 3, 0)]), Vec::<String>::new());
    }

    #[test]
    fn a_settled_podset_must_agree_with_its_spec() {
        let good = Settled {
            key: "ns/a".into(),
            generation: 3,
            replicas: 2,
            active: 2,
            status_replicas: Some(2),
            observed_generation: Some(3),
        };
        let h = History {
            settled: vec![
                good.clone(),
                Settled { active: 3, ..good.clone() },
                Settled { observed_generation: Some(2), ..good },
            ],
            ..Default::default()
        };
        let found: Vec<String> = check(&h).into_iter().map(|f| f.0).collect();
        assert_eq!(found, ["did not converge", "did not converge"]);
    }
}
