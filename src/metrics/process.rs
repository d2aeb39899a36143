//! `process_*` metrics as the Prometheus Go client's process collector exports them (kube-apiserver has them
//! too), read from `/proc/self` at each scrape. prometheus-client has no such collector of its own.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Clock ticks per second in `/proc/<pid>/stat`: Linux's USER_HZ, fixed at 100 for user space (the Go procfs
/// library assumes the same).
const USER_HZ: f64 = 100.0;

#[derive(Debug, Default)]
pub struct ProcessCollector;

/// What `/proc/self` says now; `None` where a file could not be read (not Linux, say).
#[derive(Debug, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub virtual_memory_bytes: Option<u64>,
    pub resident_memory_bytes: Option<u64>,
}

/// (utime + stime in seconds, start time in ticks since boot) from `/proc/self/stat`.
fn parse_stat(stat: &str) -> Option<(f64, u64)> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15, starttime 22.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(((field(14)? + field(15)?) as f64 / USER_HZ, field(22)?))
}

/// A `Key:   123 kB` line of `/proc/self/status`, in bytes.
fn status_kb(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// The soft "Max open files" limit from `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

fn boot_time(stat: &str) -> Option<u64> {
    stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

impl ProcessStats {
    pub fn read() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let mut out = Self::default();
        if let Some((cpu, start_ticks)) = read("/proc/self/stat").as_deref().and_then(parse_stat) {
            out.cpu_seconds = Some(cpu);
            out.start_time_seconds =
                read("/proc/stat").as_deref().and_then(boot_time).map(|b| b as f64 + start_ticks as f64 / USER_HZ);
        }
        if let Some(status) = read("/proc/self/status") {
            out.virtual_memory_bytes = status_kb(&status, "VmSize:");
            out.resident_memory_bytes = status_kb(&status, "VmRSS:");
        }
        out.open_fds = std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64);
        out.max_fds = read("/proc/self/limits").as_deref().and_then(max_open_files);
        out
    }
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: Option<f64>) -> Result<(), std::fmt::Error> {
    let Some(v) = value else { return Ok(()) };
    let g = ConstGauge::new(v);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = ProcessStats::read();
        if let Some(cpu) = s.cpu_seconds {
            let c = ConstCounter::new(cpu);
            let help = "Total user and system CPU time spent in seconds.";
            c.encode(encoder.encode_descriptor("process_cpu_seconds", help, None, c.metric_type())?)?;
        }
        let f = |v: Option<u64>| v.map(|v| v as f64);
        gauge(&mut encoder, "process_open_fds", "Number of open file descriptors.", f(s.open_fds))?;
        gauge(&mut encoder, "process_max_fds", "Maximum number of open file descriptors.", f(s.max_fds))?;
        gauge(
            &mut encoder,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            f(s.virtual_memory_bytes),
        )?;
        gauge(
            &mut encoder,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            f(s.resident_memory_bytes),
        )?;
        gauge(
            &mut encoder,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            s.start_time_seconds,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let stat = "4242 (podset (api) server) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 9 0 12345 \
                    1000000 2000 18446744073709551615";
        assert_eq!(parse_stat(stat), Some((3.0, 12345)), "utime 250 + stime 50 ticks, start at tick 12345");
        assert_eq!(status_kb("Name:\tx\nVmSize:\t  2048 kB\nVmRSS:\t    12 kB\n", "VmRSS:"), Some(12 * 1024));
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            20000                40000                files\n";
        assert_eq!(max_open_files(limits), Some(20000));
        assert_eq!(boot_time("cpu  1 2 3\nbtime 1700000000\n"), Some(1_700_000_000));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_process() {
        let s = ProcessStats::read();
        assert!(s.open_fds.unwrap() > 0 && s.max_fds.unwrap() >= s.open_fds.unwrap());
        assert!(s.resident_memory_bytes.unwrap() > 0 && s.virtual_memory_bytes >= s.resident_memory_bytes);
        assert!(s.start_time_seconds.unwrap() > 1_600_000_000.0 && s.cpu_seconds.is_some());
    }
}
