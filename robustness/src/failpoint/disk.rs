//! A slow disk for one process: its writes to the block device under a directory limited to a few operations a
//! second with blkio's throttle (cgroup v1), the process moved into a cgroup of its own while it lasts. Only that
//! process is slowed: the rule is the cgroup's, and every other process stays in the root cgroup.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Writes a second the slowed process may send its disk: a few fsyncs a second, far below any disk's.
pub const WRITE_IOPS: u32 = 20;

/// A process whose writes are throttled until [`SlowDisk::restore`] (or drop).
pub struct SlowDisk {
    root: PathBuf,
    group: PathBuf,
    pid: u32,
    /// The throttled device, as `major:minor`.
    pub device: String,
}

impl SlowDisk {
    /// Throttles `pid`'s writes to the disk `dir` lives on.
    pub fn apply(pid: u32, dir: &Path) -> Result<Self, String> {
        let root = blkio_root().ok_or("no blkio cgroup hierarchy is mounted")?;
        let device = whole_disk(dir)?;
        // Runs at once may each have a process of that pid, in namespaces of their own.
        let group = root.join(format!("podset-robustness-{pid}-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&group).map_err(|e| format!("{}: {e}", group.display()))?;
        let slow = Self { root, group, pid, device };
        slow.write("blkio.throttle.write_iops_device", &format!("{} {WRITE_IOPS}", slow.device))?;
        slow.write("cgroup.procs", &pid.to_string())?;
        Ok(slow)
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        let path = self.group.join(file);
        std::fs::write(&path, value).map_err(|e| format!("{value} > {}: {e}", path.display()))
    }

    /// Moves the process back to the root cgroup (unless it is gone) and removes the cgroup.
    pub fn restore(self) {
        drop(self)
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        // A process that died meanwhile has left the cgroup already.
        let _ = std::fs::write(self.root.join("cgroup.procs"), self.pid.to_string());
        let _ = std::fs::remove_dir(&self.group);
    }
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
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
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

    fn cgroup_of(pid: u32) -> String {
        let all = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        all.lines().find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "blkio"))).unwrap().into()
    }

    /// Tests run as root, where the harness does: the fault must take hold there, not be skipped.
    #[test]
    fn a_slow_disk_throttles_that_process_alone_and_is_undone() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let other = std::process::id();
        let before = cgroup_of(child.id());
        let slow = SlowDisk::apply(child.id(), dir.path()).expect("a slow disk can be made here");
        let group = slow.group.clone();
        assert!(cgroup_of(child.id()).ends_with(&format!("/{}", group.file_name().unwrap().to_str().unwrap())));
        assert_eq!(cgroup_of(other), before, "only that process moves");
        let rule = std::fs::read_to_string(group.join("blkio.throttle.write_iops_device")).unwrap();
        assert_eq!(rule.trim(), format!("{} {WRITE_IOPS}", slow.device));
        slow.restore();
        assert_eq!(cgroup_of(child.id()), before);
        assert!(!group.exists());
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
