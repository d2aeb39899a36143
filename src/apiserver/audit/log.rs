//! The log backend: one line per event, `json` (the `audit.k8s.io/v1` Event) or `legacy` (kube's one-line text),
//! to a file (`-`: standard output) that rotates as kube-apiserver's (lumberjack): `--audit-log-maxsize` MB per
//! file, `--audit-log-maxbackup` old files, `--audit-log-maxage` days, old files gzipped with
//! `--audit-log-compress`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use chrono::Utc;
use parking_lot::Mutex;

use super::backend::{plugin_error, Backend};
use super::Event;

/// `--audit-log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One audit.k8s.io/v1 Event in JSON per line.
    Json,
    /// One line of text per event, as kube's `EventString`.
    Legacy,
}

/// `--audit-log-*`: where, in which format, and how the file rotates (0 = unlimited, as in kube-apiserver).
#[derive(Debug, Clone)]
pub struct LogConfig {
    pub path: PathBuf,
    pub format: Format,
    pub max_size_bytes: u64,
    pub max_backups: usize,
    pub max_age: Duration,
    pub compress: bool,
}

/// Writes events as they come (the batching, if any, is in front of it).
pub struct LogBackend {
    sink: Mutex<Sink>,
    format: Format,
}

impl LogBackend {
    /// Opens the file now, so a bad path stops the start.
    pub fn open(cfg: LogConfig) -> std::io::Result<Self> {
        let format = cfg.format;
        Ok(Self { sink: Mutex::new(Sink::open(cfg)?), format })
    }
}

impl Backend for LogBackend {
    fn name(&self) -> &'static str {
        "log"
    }

    fn process(&self, events: &[Event]) -> bool {
        let mut text = Vec::with_capacity(1024 * events.len());
        for ev in events {
            match self.format {
                Format::Json => {
                    if serde_json::to_writer(&mut text, ev).is_err() {
                        plugin_error("log", "encoding the event failed", std::slice::from_ref(ev));
                        continue;
                    }
                }
                Format::Legacy => text.extend_from_slice(ev.legacy_line().as_bytes()),
            }
            text.push(b'\n');
        }
        match self.sink.lock().write(&text) {
            Ok(()) => true,
            Err(e) => {
                plugin_error("log", &e.to_string(), events);
                false
            }
        }
    }
}

enum Output {
    Stdout,
    File { file: File, size: u64 },
}

struct Sink {
    cfg: LogConfig,
    out: Output,
}

impl Sink {
    fn open(cfg: LogConfig) -> std::io::Result<Self> {
        let out = if cfg.path.as_os_str() == "-" { Output::Stdout } else { Self::open_file(&cfg.path)? };
        Ok(Self { cfg, out })
    }

    fn open_file(path: &Path) -> std::io::Result<Output> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let size = file.metadata()?.len();
        Ok(Output::File { file, size })
    }

    fn write(&mut self, line: &[u8]) -> std::io::Result<()> {
        let max = self.cfg.max_size_bytes;
        if let Output::File { size, .. } = &self.out {
            if max > 0 && *size > 0 && *size + line.len() as u64 > max {
                self.rotate()?;
            }
        }
        match &mut self.out {
            Output::Stdout => std::io::stdout().lock().write_all(line),
            Output::File { file, size } => {
                file.write_all(line)?;
                *size += line.len() as u64;
                Ok(())
            }
        }
    }

    /// lumberjack's rotation: the full file becomes `<name>-<UTC time>.<ext>` beside it, a new one is started,
    /// and backups beyond `max_backups` or older than `max_age` are removed.
    fn rotate(&mut self) -> std::io::Result<()> {
        let path = &self.cfg.path;
        let (stem, ext) = split_name(path);
        let stamp = Utc::now().format("%Y-%m-%dT%H-%M-%S%.3f");
        let backup = path.with_file_name(format!("{stem}-{stamp}{ext}"));
        std::fs::rename(path, &backup)?;
        self.out = Self::open_file(path)?;
        if self.cfg.compress {
            if let Err(e) = gzip(&backup) {
                tracing::warn!(error = %e, path = %backup.display(), "compressing a rotated audit log failed");
            }
        }
        self.prune(&stem, &ext);
        Ok(())
    }

    fn prune(&self, stem: &str, ext: &str) {
        let dir = self.cfg.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let prefix = format!("{stem}-");
        // Backup names sort by time: the stamp is fixed-width UTC.
        let mut backups: Vec<(String, PathBuf, Option<SystemTime>)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let name_ = name.strip_suffix(".gz").unwrap_or(&name);
                let stamp = name_.strip_prefix(&prefix)?.strip_suffix(ext)?;
                (stamp.len() == "2006-01-02T15-04-05.000".len())
                    .then(|| (name.clone(), e.path(), e.metadata().ok().and_then(|m| m.modified().ok())))
            })
            .collect();
        backups.sort_by(|a, b| b.0.cmp(&a.0));
        let now = SystemTime::now();
        for (i, (_, path, modified)) in backups.iter().enumerate() {
            let too_many = self.cfg.max_backups > 0 && i >= self.cfg.max_backups;
            let too_old = !self.cfg.max_age.is_zero()
                && modified.and_then(|m| now.duration_since(m).ok()).is_some_and(|age| age > self.cfg.max_age);
            if too_many || too_old {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// lumberjack's compression: `<backup>.gz` beside it, the backup then removed.
fn gzip(path: &Path) -> std::io::Result<()> {
    let gz = PathBuf::from(format!("{}.gz", path.display()));
    let mut encoder = flate2::write::GzEncoder::new(File::create(&gz)?, flate2::Compression::default());
    std::io::copy(&mut File::open(path)?, &mut encoder)?;
    encoder.finish()?.sync_all()?;
    std::fs::remove_file(path)
}

/// `audit.log` → (`audit`, `.log`); `audit` → (`audit`, ``).
fn split_name(path: &Path) -> (String, String) {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let ext = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    (stem, ext)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: PathBuf, max_size_bytes: u64, max_backups: usize, compress: bool) -> LogConfig {
        LogConfig { path, format: Format::Json, max_size_bytes, max_backups, max_age: Duration::ZERO, compress }
    }

    #[test]
    fn the_file_rotates_and_keeps_max_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let cfg = config(path.clone(), 1000, 2, false);
        let mut sink = Sink::open(cfg).unwrap();
        let line = [b'x'; 299];
        for i in 0..20 {
            let mut l = line.to_vec();
            l.push(b'\n');
            sink.write(&l).unwrap();
            if i % 3 == 2 {
                // Backup names carry milliseconds: let each rotation get its own.
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "the live file and two backups: {names:?}");
        assert!(names.iter().filter(|n| n.starts_with("audit-") && n.ends_with(".log")).count() == 2, "{names:?}");
        for n in &names {
            let len = std::fs::metadata(dir.path().join(n)).unwrap().len();
            assert!(len <= 1000 && len.is_multiple_of(300), "{n}: {len} bytes, whole lines only");
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * 300, "20 lines, 3 per file: 2 in the live one");
    }

    #[test]
    fn rotated_files_are_gzipped_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let mut sink = Sink::open(config(path.clone(), 100, 0, true)).unwrap();
        for _ in 0..3 {
            sink.write(&[b'y'; 60]).unwrap();
            // Backup names carry milliseconds: let each rotation get its own.
            std::thread::sleep(Duration::from_millis(2));
        }
        let gz: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "gz"))
            .collect();
        assert_eq!(gz.len(), 2, "{gz:?}");
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(File::open(&gz[0]).unwrap()), &mut text).unwrap();
        assert_eq!(text, [b'y'; 60]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3, "no uncompressed backup left");
    }
}
