//! The private namespaces every cluster runs in, and where its binaries come from.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{APISERVER_ROUTES, REPLICA_IPS};

pub const INSIDE: &str = "PODSET_ENVTEST_INSIDE_NAMESPACE";

/// True inside a namespace made by [`namespace_command`].
pub fn inside_namespace() -> bool {
    std::env::var_os(INSIDE).is_some()
}

/// A command that runs `program args...` in a fresh network + PID + mount namespace (as root): loopback up,
/// [`NODE_IP`] on it, and every process in it killed when `program` exits. The mount namespace has a /proc of its
/// own, so children's /proc/<pid> can be read (a benchmark measures their memory) and /proc lists only the
/// namespace's processes; mounts made in it (a node's) go with it.
pub fn namespace_command(program: &Path, args: &[String]) -> Command {
    let addrs: String =
        REPLICA_IPS.iter().chain(&APISERVER_ROUTES).map(|ip| format!(" && ip addr add {ip}/32 dev lo")).collect();
    let script = format!("ip link set lo up{addrs} && exec \"$@\"");
    let mut c = Command::new("unshare");
    c.args(["--net", "--pid", "--fork", "--kill-child", "--mount-proc"]);
    c.args(["--", "sh", "-c", &script, "sh"]).arg(program).args(args).env(INSIDE, "1");
    c
}

/// For a program that needs its own control plane (a benchmark): outside a namespace, runs this program again with
/// the same arguments inside a fresh one and exits with its status; inside, returns.
pub fn reenter_namespace() {
    if inside_namespace() {
        return;
    }
    let exe = std::env::current_exe().expect("current executable");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let status = namespace_command(&exe, &args).env("KUBEBUILDER_ASSETS", assets_dir()).status().expect("unshare");
    std::process::exit(status.code().unwrap_or(1));
}

/// Where the control-plane binaries are: `KUBEBUILDER_ASSETS` (see hack/install-test-assets.sh).
pub fn assets_dir() -> PathBuf {
    let dir = std::env::var_os("KUBEBUILDER_ASSETS").map(PathBuf::from).expect(
        "KUBEBUILDER_ASSETS is not set: hack/install-test-assets.sh installs the binaries and prints their directory",
    );
    assert!(dir.join("kubectl").exists(), "no kubectl in KUBEBUILDER_ASSETS={}", dir.display());
    dir
}

/// A port for one of the cluster's listeners, free when picked and never handed out twice by this process. It comes
/// from outside the kernel's ephemeral range: a port picked by binding port 0 is an ephemeral one, which an outgoing
/// connection can take as its local port before the server binds it (etcd exited "address already in use" while
/// the harness's etcd members reconnected to each other).
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ports = listener_ports_here();
    let span = ports.end - ports.start;
    // Processes picking in one namespace start apart.
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let port = (ports.start + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {ports:?}");
}

/// [`listener_ports`] for this network namespace's ephemeral range, read once: a process never changes namespace
/// (namespace_command starts a new one inside).
fn listener_ports_here() -> std::ops::Range<u32> {
    static PORTS: std::sync::OnceLock<std::ops::Range<u32>> = std::sync::OnceLock::new();
    PORTS
        .get_or_init(|| {
            listener_ports(&std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default())
        })
        .clone()
}

/// Where listeners' ports come from, given the kernel's ephemeral range ("32768\t60999"): the larger of the spans
/// from 10000 up to the range and from above it to 65535 (a range that leaves neither panics: every port is one an
/// outgoing connection may take).
fn listener_ports(ephemeral_range: &str) -> std::ops::Range<u32> {
    let mut bounds = ephemeral_range.split_whitespace().map(|p| p.parse::<u32>().ok());
    let (low, high) = match (bounds.next().flatten(), bounds.next().flatten()) {
        (Some(low), Some(high)) if low <= high => (low, high),
        _ => (32768, 60999),
    };
    let below = 10_000..low.max(10_000);
    let above = (high + 1).max(10_000)..65_536;
    let ports = if below.len() >= above.len() { below } else { above };
    assert!(ports.len() >= 1_000, "the ephemeral range {low}-{high} leaves too few ports for listeners");
    ports
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
        let [low, high]: [u16; 2] =
            range.split_whitespace().map(|p| p.parse().unwrap()).collect::<Vec<_>>()[..].try_into().unwrap();
        let ports: Vec<u16> = (0..500).map(|_| free_port()).collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "a port handed out twice");
        assert!(ports.iter().all(|&p| p >= 10_000 && !(low..=high).contains(&p)), "{ports:?} vs {low}-{high}");
        assert!(TcpListener::bind(("127.0.0.1", ports[0])).is_ok());
    }

    #[test]
    fn listener_ports_avoid_the_ephemeral_range_wherever_it_is() {
        assert_eq!(listener_ports("32768\t60999\n"), 10_000..32_768);
        // A range starting low leaves room only above it.
        assert_eq!(listener_ports("1024 49151"), 49_152..65_536);
        assert_eq!(listener_ports("10500 64000"), 64_001..65_536);
        // Unreadable: Linux's default.
        assert_eq!(listener_ports(""), 10_000..32_768);
    }

    #[test]
    #[should_panic(expected = "leaves too few ports")]
    fn an_ephemeral_range_over_every_port_is_refused() {
        listener_ports("1024 65535");
    }
}
