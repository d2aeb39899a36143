//! Faults, as etcd's failpoints: what a seed schedules (replicas killed, paused, cut off or slowed; etcd members
//! killed or restarted) and how each is done and undone on the running cluster.

use std::process::Command;
use std::time::Duration;

use podset_envtest::{Cluster, REPLICA_IPS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::harness::Options;
use crate::model::history::ReplicaStart;
use crate::traffic::{replica_route, Recorder};

pub mod etcd_cluster;

pub use etcd_cluster::EtcdCluster;

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
    KillEtcdMember(usize),
    KillEtcdLeader,
    /// SIGTERM a member and start it again at once.
    RestartEtcdMember(usize),
}

/// One fault in the schedule: when it starts (from the start of traffic), what, for how long.
#[derive(Debug, Clone, Copy)]
pub struct Planned {
    pub at: Duration,
    pub fault: Fault,
    pub lasts: Duration,
}

/// The faults a seed gives: one per slot of the window, each ending within its slot.
pub fn plan(opts: &Options) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let slot = opts.fault_window / opts.faults.max(1) as u32;
    (0..opts.faults)
        .map(|n| {
            let r = rng.random_range(0..opts.replicas);
            let m = rng.random_range(0..3);
            let drawn = [
                Fault::KillReplica(r),
                Fault::PauseLeader,
                Fault::PauseReplica(r),
                Fault::PartitionReplica(r),
                Fault::SlowReplica(r),
                Fault::KillEtcdMember(m),
                Fault::KillEtcdLeader,
                Fault::RestartEtcdMember(m),
            ][rng.random_range(0..8)];
            let fault = opts.fixed.get(n).copied().unwrap_or(drawn);
            let secs = |rng: &mut StdRng, lo, hi| Duration::from_secs(rng.random_range(lo..hi));
            let lasts = match fault {
                Fault::KillReplica(_) => secs(&mut rng, 2, 8),
                Fault::PauseLeader | Fault::PauseReplica(_) => PAUSE,
                Fault::PartitionReplica(_) => secs(&mut rng, 5, 20),
                Fault::SlowReplica(_) => secs(&mut rng, 5, 15),
                Fault::KillEtcdMember(_) | Fault::KillEtcdLeader => secs(&mut rng, 2, 10),
                Fault::RestartEtcdMember(_) => Duration::ZERO,
            };
            let lasts = lasts.min(slot.saturating_sub(Duration::from_secs(2)));
            let room = (slot - lasts).as_millis().max(1) as u64;
            Planned { at: slot * n as u32 + Duration::from_millis(rng.random_range(0..room)), fault, lasts }
        })
        .collect()
}

pub(crate) fn sh(cmd: &str) {
    let status = Command::new("sh").args(["-c", cmd]).status().expect("sh");
    assert!(status.success(), "`{cmd}` failed: {status}");
}

/// A fault, done and undone; returns what happened, for the report.
pub(crate) fn inject(
    c: &mut Cluster,
    etcd: &mut EtcdCluster,
    rt: &tokio::runtime::Runtime,
    rec: &Recorder,
    p: Planned,
) -> String {
    let port = c.podset_addr.port();
    let what = match p.fault {
        Fault::KillReplica(i) => {
            c.kill_replica(i);
            std::thread::sleep(p.lasts);
            rec.replica_starts.lock().unwrap().push(ReplicaStart {
                route: replica_route(i),
                at: rec.now(),
                answers_from: None,
            });
            c.start_replica(i);
            format!("kill -9 replica {i}, started again after {:?}", p.lasts)
        }
        Fault::PauseLeader | Fault::PauseReplica(_) => {
            let i = match p.fault {
                Fault::PauseReplica(i) => i,
                _ => c.controller_leader().unwrap_or(0),
            };
            let pid = c.replica_pid(i).expect("replica runs").to_string();
            sh(&format!("kill -STOP {pid}"));
            std::thread::sleep(p.lasts);
            sh(&format!("kill -CONT {pid}"));
            let leader = if p.fault == Fault::PauseLeader { " (the controller's leader)" } else { "" };
            format!("SIGSTOP replica {i}{leader} for {:?}, then SIGCONT", p.lasts)
        }
        Fault::PartitionReplica(i) => {
            let (ip, route) = (REPLICA_IPS[i], etcd_route(i));
            sh(&format!(
                "iptables -I OUTPUT -d {ip} -p tcp --dport {port} -j DROP && iptables -I OUTPUT -d {route} -j DROP"
            ));
            std::thread::sleep(p.lasts);
            sh(&format!(
                "iptables -D OUTPUT -d {ip} -p tcp --dport {port} -j DROP && iptables -D OUTPUT -d {route} -j DROP"
            ));
            format!("cut replica {i} from etcd and its clients for {:?}", p.lasts)
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
            format!("replica {i}'s packets (from clients and etcd) throttled to 256 kbit/s for {:?}", p.lasts)
        }
        Fault::KillEtcdMember(_) | Fault::KillEtcdLeader => {
            let (m, leader) = match p.fault {
                Fault::KillEtcdMember(m) => (m, ""),
                _ => (rt.block_on(etcd.leader()).unwrap_or(0), " (the leader)"),
            };
            etcd.kill(m);
            std::thread::sleep(p.lasts);
            etcd.start_member(m);
            etcd.wait_healthy(m);
            format!("kill -9 etcd member {m}{leader}, started again after {:?}", p.lasts)
        }
        Fault::RestartEtcdMember(m) => {
            etcd.stop(m);
            etcd.start_member(m);
            etcd.wait_healthy(m);
            format!("restart etcd member {m} (SIGTERM)")
        }
    };
    what
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
                    | Fault::SlowReplica(r) => {
                        assert!(r < opts.replicas)
                    }
                    Fault::KillEtcdMember(m) | Fault::RestartEtcdMember(m) => assert!(m < 3),
                    Fault::PauseLeader | Fault::KillEtcdLeader => {}
                }
            }
        }
        assert_ne!(format!("{:?}", plan(&options(1))), format!("{:?}", plan(&options(2))), "seeds differ");
    }
}
