//! A slow disk for one process: its writes to the block device under a directory limited to a few operations a
//! second with blkio's throttle (cgroup v1), the process moved into a cgroup of its own, under the one it was in,
//! while it lasts. Only that process is slowed: the rule is that cgroup's alone.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Writes a second the slowed process may send its disk: a few fsyncs a second, far below any disk's.
pub const WRITE_IOPS: u32 = 20;

/// A process whose writes are throttled until [`SlowDisk::restore`] (or drop).
pub struct SlowDisk {
    /// The blkio cgroup the process was in, and goes back to.
    home: PathBuf,
    group: PathBuf,
    pid: u32,
    moved: bool,
    /// The throttled device, as `major:minor`.
    pub device: String,
}

impl SlowDisk {
    /// Throttles `pid`'s writes to the disk `dir` lives on.
    pub fn apply(pid: u32, dir: &Path) -> Result<Self, String> {
        let root = blkio_root().ok_or("no blkio cgroup hierarchy is mounted (cgroup v2 only?)")?;
        let device = whole_disk(dir)?;
        let home = root.join(blkio_cgroup(pid)?.trim_start_matches('/'));
        // Runs at once may each have a process of that pid, in namespaces of their own.
        let group = home.join(format!("podset-robustness-{pid}-{:08x}", rand::random::<u32>()));
        std::fs::create_dir(&group).map_err(|e| format!("{}: {e}", group.display()))?;
        let mut slow = Self { home, group, pid, moved: false, device };
        write(&slow.group.join("blkio.throttle.write_iops_device"), &format!("{} {WRITE_IOPS}", slow.device))?;
        write(&slow.group.join("cgroup.procs"), &pid.to_string())?;
        slow.moved = true;
        Ok(slow)
    }

    /// Moves the process back where it was (unless it is gone) and removes the cgroup.
    pub fn restore(mut self) -> Result<(), String> {
        self.undo()
    }

    fn undo(&mut self) -> Result<(), String> {
        // A process that died meanwhile has left the cgroup already.
        let alive = Path::new(&format!("/proc/{}", self.pid)).exists();
        if std::mem::take(&mut self.moved) && alive {
            write(&self.home.join("cgroup.procs"), &self.pid.to_string())?;
        }
        match std::fs::remove_dir(&self.group) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("{}: {e}", self.group.display())),
            _ => Ok(()),
        }
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        if let Err(e) = self.undo() {
            eprintln!("cannot undo a slow disk: {e}");
        }
    }
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("{value} > {}: {e}", path.display()))
}

/// The blkio cgroup `pid` is in, from the hierarchy's root.
fn blkio_cgroup(pid: u32) -> Result<String, String> {
    let file = format!("/proc/{pid}/cgroup");
    let all = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
    all.lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            controllers.split(',').any(|c| c == "blkio").then(|| path.to_owned())
        })
        .ok_or_else(|| format!("{file} names no blkio cgroup"))
}

/// Where the blkio controller's hierarchy is mounted.
fn blkio_root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "blkio")).then(|| PathBuf::from(f[1]))
    })
}

/// The whole disk (`major:minor`) under `dir`: throttle rules name disks, not partitions.
fn whole_disk(dir: &Path) -> Result<String, String> {
    let dev = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?.dev();
    // glibc's gnu_dev_major and gnu_dev_minor.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & 0xffff_ff00);
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if !sys.exists() {
        return Err(format!("{} is on {major}:{minor}, not a block device", dir.display()));
    }
    if sys.join("partition").exists() {
        let disk = std::fs::read_to_string(sys.join("../dev")).map_err(|e| format!("{}: {e}", sys.display()))?;
        return Ok(disk.trim().to_owned());
    }
    Ok(format!("{major}:{minor}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

    /// Tests run as root, where the harness does: the fault must take hold there, not be skipped.
    #[test]
    fn a_slow_disk_throttles_that_process_alone_on_the_disk_it_writes_and_is_undone() {
        let dir = tempfile::tempdir().unwrap();
        // Writes ten blocks, each synced, once told to: after it has been moved.
        let script =
            format!("read go && dd if=/dev/zero of={}/f bs=4k count=10 oflag=dsync 2>/dev/null", dir.path().display());
        let mut child = Command::new("sh").args(["-c", &script]).stdin(Stdio::piped()).spawn().unwrap();
        let before = blkio_cgroup(child.id()).unwrap();
        let mine = blkio_cgroup(std::process::id()).unwrap();
        let slow = SlowDisk::apply(child.id(), dir.path()).expect("a slow disk can be made here");
        let group = slow.group.clone();
        let name = group.file_name().unwrap().to_str().unwrap().to_owned();
        assert_eq!(blkio_cgroup(child.id()).unwrap(), format!("{}/{name}", before.trim_end_matches('/')));
        assert_eq!(blkio_cgroup(std::process::id()).unwrap(), mine, "only that process moves");
        let rule = std::fs::read_to_string(group.join("blkio.throttle.write_iops_device")).unwrap();
        assert_eq!(rule.trim(), format!("{} {WRITE_IOPS}", slow.device));
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        assert!(child.wait().unwrap().success());
        // The synced writes went through the throttle, to the device the rule names.
        let served = std::fs::read_to_string(group.join("blkio.throttle.io_serviced")).unwrap();
        let writes = served
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{} Write ", slow.device)))
            .and_then(|n| n.trim().parse::<u64>().ok());
        assert!(writes.is_some_and(|n| n >= 10), "writes to {} through the throttle: {served}", slow.device);
        slow.restore().unwrap();
        assert!(!group.exists());
    }

    #[test]
    fn a_process_is_moved_back_where_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        // Somewhere other than the hierarchy's root, as under a systemd slice.
        let root = blkio_root().unwrap();
        let home = root.join(format!("podset-robustness-test-{:08x}", rand::random::<u32>()));
        std::fs::create_dir(&home).unwrap();
        write(&home.join("cgroup.procs"), &child.id().to_string()).unwrap();
        let before = blkio_cgroup(child.id()).unwrap();
        assert_ne!(before, "/");
        SlowDisk::apply(child.id(), dir.path()).unwrap().restore().unwrap();
        assert_eq!(blkio_cgroup(child.id()).unwrap(), before);
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::remove_dir(&home).unwrap();
    }
}
