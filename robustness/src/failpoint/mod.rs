//! Faults, as etcd's failpoints: what a seed schedules (replicas killed, paused, cut off or slowed; etcd members
//! killed, restarted or given a slow disk) and how each is done and undone on the running cluster.

use std::process::Command;
use std::time::Duration;

use podset_envtest::{Cluster, APISERVER_ROUTES, REPLICA_IPS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::harness::Options;
use crate::model::history::ReplicaStart;
use crate::traffic::{replica_route, Recorder};

pub mod disk;
pub mod etcd_cluster;
pub mod rollout;

pub use etcd_cluster::EtcdCluster;
pub use rollout::Rollout;

/// A pause outlasts the controller's Lease (15 s) and the server's request timeout (30 s).
const PAUSE: Duration = Duration::from_secs(32);

/// Replica `i` dials etcd at this address, so it can be cut off (or slowed) alone.
pub(crate) fn etcd_route(i: usize) -> String {
    format!("10.250.2.{}", i + 1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL a replica, start it again later.
    KillReplica(usize),
    /// SIGSTOP the replica leading the controller longer than its Lease, then SIGCONT.
    PauseLeader,
    PauseReplica(usize),
    /// Drop every packet between a replica and etcd, and between it and its clients.
    PartitionReplica(usize),
    /// Every packet to a replica, from etcd and from clients, through a 256 kbit/s link.
    SlowReplica(usize),
    /// A fifth of the packets to a replica, from etcd and from clients, lost (netem is not in every kernel; the
    /// loss is iptables' random match).
    LossyReplica(usize),
    KillEtcdMember(usize),
    KillEtcdLeader,
    /// SIGTERM a member and start it again at once.
    RestartEtcdMember(usize),
    /// Cut the controller's leader from everything: etcd, its clients and the main API server. It runs on while
    /// its Lease lapses and another replica takes over: the split brain the Lease check before each write is for.
    IsolateLeader,
    /// Cut etcd's leader from its peers (its clients still reach it): the others elect a new leader, the old one
    /// must stop answering as one.
    PartitionEtcdLeader,
    /// etcd's leader writes to its disk at a few operations a second: its fsyncs hold back every commit, and its
    /// heartbeats may come late enough for an election.
    SlowEtcdLeaderDisk,
}

/// One fault in the schedule: when it starts (from the start of traffic), what, for how long.
#[derive(Debug, Clone, Copy)]
pub struct Planned {
    pub at: Duration,
    pub fault: Fault,
    pub lasts: Duration,
    /// A fault of etcd's at the same time, and how long it lasts.
    pub with: Option<(Fault, Duration)>,
}

impl Fault {
    /// A fault of etcd's members rather than of a replica or its links.
    pub fn on_etcd(self) -> bool {
        matches!(
            self,
            Fault::KillEtcdMember(_)
                | Fault::KillEtcdLeader
                | Fault::RestartEtcdMember(_)
                | Fault::PartitionEtcdLeader
                | Fault::SlowEtcdLeaderDisk
        )
    }
}

/// The faults a seed gives: one per slot of the window, each ending within its slot.
pub fn plan(opts: &Options) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let slot = opts.fault_window / opts.faults.max(1) as u32;
    (0..opts.faults)
        .map(|n| {
            let r = rng.random_range(0..opts.replicas);
            let m = rng.random_range(0..3);
            let kinds = [
                Fault::KillReplica(r),
                Fault::PauseLeader,
                Fault::PauseReplica(r),
                Fault::PartitionReplica(r),
                Fault::SlowReplica(r),
                Fault::KillEtcdMember(m),
                Fault::KillEtcdLeader,
                Fault::RestartEtcdMember(m),
                Fault::LossyReplica(r),
                Fault::PartitionEtcdLeader,
                Fault::IsolateLeader,
                Fault::SlowEtcdLeaderDisk,
            ];
            let drawn = kinds[rng.random_range(0..kinds.len())];
            let fault = opts.fixed.get(n).copied().unwrap_or(drawn);
            let secs = |rng: &mut StdRng, lo, hi| Duration::from_secs(rng.random_range(lo..hi));
            let lasts = match fault {
                Fault::KillReplica(_) => secs(&mut rng, 2, 8),
                Fault::PauseLeader | Fault::PauseReplica(_) => PAUSE,
                Fault::PartitionReplica(_) => secs(&mut rng, 5, 20),
                Fault::SlowReplica(_) | Fault::LossyReplica(_) => secs(&mut rng, 5, 15),
                Fault::PartitionEtcdLeader | Fault::SlowEtcdLeaderDisk => secs(&mut rng, 5, 15),
                // Longer than the Lease (15 s), so leadership moves while it still runs.
                Fault::IsolateLeader => secs(&mut rng, 20, 34),
                Fault::KillEtcdMember(_) | Fault::KillEtcdLeader => secs(&mut rng, 2, 10),
                Fault::RestartEtcdMember(_) => Duration::ZERO,
            };
            let lasts = lasts.min(slot.saturating_sub(Duration::from_secs(2)));
            // Faults overlap too: a third of a replica's come with one of etcd's, within them.
            let with = (opts.overlap && !fault.on_etcd() && rng.random_range(0..3) == 0).then(|| {
                let m = rng.random_range(0..3);
                let kinds = [
                    Fault::KillEtcdMember(m),
                    Fault::KillEtcdLeader,
                    Fault::PartitionEtcdLeader,
                    Fault::SlowEtcdLeaderDisk,
                ];
                let e = kinds[rng.random_range(0..kinds.len())];
                (e, secs(&mut rng, 2, 10).min(lasts.max(Duration::from_secs(2))))
            });
            let room = (slot - lasts).as_millis().max(1) as u64;
            Planned { at: slot * n as u32 + Duration::from_millis(rng.random_range(0..room)), fault, lasts, with }
        })
        .collect()
}

/// Adds OUTPUT `rules` (each with `-I`, so the last comes first), holds them for `lasts`, and removes them.
fn dropped_for(rules: &[String], lasts: Duration) {
    for r in rules {
        sh(&format!("iptables -I OUTPUT {r}"));
    }
    std::thread::sleep(lasts);
    for r in rules {
        sh(&format!("iptables -D OUTPUT {r}"));
    }
}

pub(crate) fn sh(cmd: &str) {
    let status = Command::new("sh").args(["-c", cmd]).status().expect("sh");
    assert!(status.success(), "`{cmd}` failed: {status}");
}

/// What a fault did: its kind (a leader fault only when the leader was known), and a line for the report.
pub struct Injected {
    pub kind: &'static str,
    pub what: String,
}

/// A fault, done and undone, with the etcd fault that overlaps it if any; returns what happened, for the report.
pub(crate) fn inject(
    c: &mut Cluster,
    etcd: &mut EtcdCluster,
    rt: &tokio::runtime::Runtime,
    rec: &Recorder,
    p: Planned,
) -> Vec<Injected> {
    let Some((with, lasts)) = p.with else {
        return vec![if p.fault.on_etcd() { inject_etcd(etcd, rt, p) } else { inject_replica(c, rec, p) }];
    };
    std::thread::scope(|s| {
        let other = s.spawn(|| inject_etcd(etcd, rt, Planned { fault: with, lasts, with: None, ..p }));
        let first = inject_replica(c, rec, p);
        vec![first, other.join().expect("the overlapping fault")]
    })
}

fn done(kind: &'static str, what: String) -> Injected {
    Injected { kind, what }
}

/// A fault of a replica (or of its links).
fn inject_replica(c: &mut Cluster, rec: &Recorder, p: Planned) -> Injected {
    let port = c.podset_addr.port();
    match p.fault {
        Fault::KillReplica(i) => {
            c.kill_replica(i);
            std::thread::sleep(p.lasts);
            rec.replica_starts.lock().unwrap().push(ReplicaStart {
                route: replica_route(i),
                at: rec.now(),
                answers_from: None,
            });
            c.start_replica(i);
            done("replica-killed", format!("kill -9 replica {i}, started again after {:?}", p.lasts))
        }
        Fault::PauseLeader | Fault::PauseReplica(_) => {
            let (i, leader) = match p.fault {
                Fault::PauseReplica(i) => (i, None),
                _ => match c.controller_leader() {
                    Some(i) => (i, Some(true)),
                    None => (0, Some(false)),
                },
            };
            let pid = c.replica_pid(i).expect("replica runs").to_string();
            sh(&format!("kill -STOP {pid}"));
            std::thread::sleep(p.lasts);
            sh(&format!("kill -CONT {pid}"));
            let (kind, who) = match leader {
                Some(true) => ("leader-paused", " (the controller's leader)"),
                Some(false) => ("replica-paused", " (the controller's leader was not known)"),
                None => ("replica-paused", ""),
            };
            done(kind, format!("SIGSTOP replica {i}{who} for {:?}, then SIGCONT", p.lasts))
        }
        Fault::PartitionReplica(i) => {
            let (ip, route) = (REPLICA_IPS[i], etcd_route(i));
            dropped_for(&[format!("-d {ip} -p tcp --dport {port} -j DROP"), format!("-d {route} -j DROP")], p.lasts);
            done("replica-cut-off", format!("cut replica {i} from etcd and its clients for {:?}", p.lasts))
        }
        Fault::SlowReplica(i) => {
            let (ip, route) = (REPLICA_IPS[i], etcd_route(i));
            // A rate limit, not netem's delay: netem is not in every kernel (not in the sandboxes CI runs in).
            sh(&format!(
                "tc qdisc add dev lo root handle 1: htb default 10 && \
                 tc class add dev lo parent 1: classid 1:10 htb rate 10gbit quantum 60000 && \
                 tc class add dev lo parent 1: classid 1:20 htb rate 256kbit && \
                 tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst {ip}/32 flowid 1:20 && \
                 tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst {route}/32 flowid 1:20"
            ));
            std::thread::sleep(p.lasts);
            sh("tc qdisc del dev lo root");
            done(
                "replica-throttled",
                format!("replica {i}'s packets (from clients and etcd) throttled to 256 kbit/s for {:?}", p.lasts),
            )
        }
        Fault::LossyReplica(i) => {
            let (ip, route) = (REPLICA_IPS[i], etcd_route(i));
            let rules = [
                format!("-d {ip} -p tcp --dport {port} -m statistic --mode random --probability 0.2 -j DROP"),
                format!("-d {route} -m statistic --mode random --probability 0.2 -j DROP"),
            ];
            dropped_for(&rules, p.lasts);
            done(
                "replica-lossy",
                format!("a fifth of replica {i}'s packets (from clients and etcd) lost for {:?}", p.lasts),
            )
        }
        Fault::IsolateLeader => {
            let (i, kind, who) = match c.controller_leader() {
                Some(i) => (i, "leader-isolated", " (the controller's leader)"),
                None => (0, "replica-isolated", " (the controller's leader was not known)"),
            };
            let rules = [
                format!("-d {} -p tcp --dport {port} -j DROP", REPLICA_IPS[i]),
                format!("-d {} -j DROP", etcd_route(i)),
                format!("-d {} -j DROP", APISERVER_ROUTES[i]),
            ];
            dropped_for(&rules, p.lasts);
            done(kind, format!("cut replica {i}{who} from etcd, its clients and kube-apiserver for {:?}", p.lasts))
        }
        f => unreachable!("{f:?} is etcd's"),
    }
}

/// A fault of etcd's members.
fn inject_etcd(etcd: &mut EtcdCluster, rt: &tokio::runtime::Runtime, p: Planned) -> Injected {
    match p.fault {
        Fault::PartitionEtcdLeader => {
            let Some(m) = rt.block_on(etcd.leader()) else {
                return done("nothing", "no etcd leader to cut off: nothing done".into());
            };
            let rules = etcd.peer_partition_rules(m);
            dropped_for(&rules, p.lasts);
            done(
                "etcd-leader-cut-from-peers",
                format!("cut etcd's leader (member {m}) from its peers for {:?}", p.lasts),
            )
        }
        Fault::KillEtcdMember(_) | Fault::KillEtcdLeader => {
            let (m, kind, leader) = match p.fault {
                Fault::KillEtcdMember(m) => (m, "etcd-member-killed", ""),
                _ => match rt.block_on(etcd.leader()) {
                    Some(m) => (m, "etcd-leader-killed", " (the leader)"),
                    None => (0, "etcd-member-killed", " (the leader was not known)"),
                },
            };
            etcd.kill(m);
            std::thread::sleep(p.lasts);
            etcd.start_member(m);
            etcd.wait_healthy(m);
            done(kind, format!("kill -9 etcd member {m}{leader}, started again after {:?}", p.lasts))
        }
        Fault::SlowEtcdLeaderDisk => {
            let Some((m, pid)) = rt.block_on(etcd.leader()).and_then(|m| Some((m, etcd.pid(m)?))) else {
                return done("nothing", "no etcd leader to slow: nothing done".into());
            };
            let slow = match disk::SlowDisk::apply(pid, &etcd.data_dir(m)) {
                Ok(slow) => slow,
                Err(why) => {
                    return done("nothing", format!("cannot slow etcd member {m}'s disk ({why}): nothing done"))
                }
            };
            std::thread::sleep(p.lasts);
            let device = slow.device.clone();
            // As a failed iptables or tc command: a fault that cannot be undone ends the run.
            slow.restore().unwrap_or_else(|e| panic!("cannot undo etcd member {m}'s slow disk: {e}"));
            done(
                "etcd-leader-disk-slow",
                format!(
                    "etcd's leader (member {m}) writes to its disk ({device}) at {} operations a second for {:?}",
                    disk::WRITE_IOPS,
                    p.lasts
                ),
            )
        }
        Fault::RestartEtcdMember(m) => {
            etcd.stop(m);
            etcd.start_member(m);
            etcd.wait_healthy(m);
            done("etcd-member-restarted", format!("restart etcd member {m} (SIGTERM)"))
        }
        f => unreachable!("{f:?} is a replica's"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podset_envtest::ServerCommand;

    fn options(seed: u64) -> Options {
        Options::short(seed, ServerCommand { program: "podset-apiserver".into(), args: Vec::new() })
    }

    #[test]
    fn a_seed_gives_one_schedule_each_fault_within_its_slot() {
        for seed in 1..50 {
            let opts = options(seed);
            let plan = plan(&opts);
            assert_eq!(format!("{plan:?}"), format!("{:?}", super::plan(&opts)), "seed {seed} replays");
            assert_eq!(plan.len(), opts.faults);
            let slot = opts.fault_window / opts.faults as u32;
            for (n, p) in plan.iter().enumerate() {
                let (start, end) = (slot * n as u32, slot * (n as u32 + 1));
                assert!(p.at >= start && p.at + p.lasts <= end, "seed {seed}: {p:?} outside slot {n}");
                if let Some(fixed) = opts.fixed.get(n) {
                    assert_eq!(p.fault, *fixed, "seed {seed}: the fixed faults come first");
                }
                match p.fault {
                    Fault::KillReplica(r)
                    | Fault::PauseReplica(r)
                    | Fault::PartitionReplica(r)
                    | Fault::SlowReplica(r)
                    | Fault::LossyReplica(r) => {
                        assert!(r < opts.replicas)
                    }
                    Fault::KillEtcdMember(m) | Fault::RestartEtcdMember(m) => assert!(m < 3),
                    Fault::PauseLeader
                    | Fault::KillEtcdLeader
                    | Fault::PartitionEtcdLeader
                    | Fault::IsolateLeader
                    | Fault::SlowEtcdLeaderDisk => {}
                }
            }
        }
        assert_ne!(format!("{:?}", plan(&options(1))), format!("{:?}", plan(&options(2))), "seeds differ");
        // The long form overlaps some of a replica's faults with one of etcd's, inside them; the short form never.
        let long = |seed| Options::long(seed, ServerCommand { program: "podset-apiserver".into(), args: Vec::new() });
        let overlapping: Vec<Planned> =
            (1..50).flat_map(|seed| plan(&long(seed))).filter(|p| p.with.is_some()).collect();
        assert!(!overlapping.is_empty());
        for p in &overlapping {
            let (with, lasts) = p.with.unwrap();
            assert!(with.on_etcd() && !p.fault.on_etcd() && lasts <= p.lasts.max(Duration::from_secs(2)), "{p:?}");
        }
        assert!((1..50).flat_map(|seed| plan(&options(seed))).all(|p| p.with.is_none()));
    }
}
