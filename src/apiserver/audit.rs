//! Audit: one `audit.k8s.io/v1` `Event` line per request, at the `Metadata` level (who, what, on which object,
//! the answer, when), as kube-apiserver's log backend writes them with a policy of `level: Metadata` for
//! everything. `--audit-log-path` names the file (`-` for standard output), which rotates as kube-apiserver's
//! (lumberjack): `--audit-log-maxsize` MB per file, `--audit-log-maxbackup` old files, `--audit-log-maxage` days.
//!
//! Lines are written by one thread of their own, so a slow disk never stalls a request; if it falls 100 000 events
//! behind, further events are dropped and counted in `apiserver_audit_error_total{plugin="log"}`.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::time::{Duration, SystemTime};

use chrono::{DateTime, SecondsFormat, Utc};
use http::{HeaderMap, Uri};
use serde::Serialize;

use super::request::RequestInfo;
use crate::metrics::{global, NameLabel};

/// Events waiting for the writer before new ones are dropped.
const QUEUE: usize = 100_000;

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub level: &'static str,
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub stage: &'static str,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub verb: String,
    pub user: UserInfo,
    #[serde(rename = "sourceIPs")]
    pub source_ips: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user_agent: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<ObjectReference>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<ResponseStatus>,
    pub request_received_timestamp: String,
    pub stage_timestamp: String,
    /// What admission webhooks asked to record (`<webhook>/<key>`), and how each mutating webhook changed the
    /// object.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Audit annotations a response carries to the audit event of its request.
#[derive(Debug, Clone, Default)]
pub struct Annotations(pub BTreeMap<String, String>);

/// `authentication.k8s.io/v1` UserInfo; empty for a request that failed authentication.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct UserInfo {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub username: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    pub resource: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub api_group: String,
    pub api_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

/// The answer, as a `metav1.Status`: the code, and for a failure its status, reason and message.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ResponseStatus {
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub code: u16,
}

fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// kube's `utilnet.SourceIPs`: `X-Forwarded-For`, then `X-Real-Ip`, then the peer (kube-apiserver's own proxy
/// sets the first; only the last is sure).
fn source_ips(headers: &HeaderMap, remote: Option<std::net::IpAddr>) -> Vec<String> {
    let mut ips: Vec<String> = Vec::new();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    for ip in header("x-forwarded-for").split(',').chain([header("x-real-ip")]) {
        if let Ok(ip) = ip.trim().parse::<std::net::IpAddr>() {
            if !ips.contains(&ip.to_string()) {
                ips.push(ip.to_string());
            }
        }
    }
    if let Some(ip) = remote.map(|r| r.to_string()) {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    ips
}

impl Event {
    /// The event of a request as received, before its answer (`stage` and status are set by the caller).
    pub fn received(
        info: &RequestInfo,
        uri: &Uri,
        headers: &HeaderMap,
        remote: Option<std::net::IpAddr>,
        at: DateTime<Utc>,
    ) -> Self {
        let info = &info.attributes;
        Self {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level: "Metadata",
            audit_id: uuid::Uuid::new_v4().to_string(),
            stage: "ResponseComplete",
            request_uri: uri.path_and_query().map(|p| p.as_str()).unwrap_or(uri.path()).to_owned(),
            verb: info.verb.clone(),
            user: UserInfo::default(),
            source_ips: source_ips(headers, remote),
            user_agent: headers.get(http::header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned(),
            object_ref: info.resource.as_ref().map(|r| ObjectReference {
                resource: r.resource.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                api_group: r.group.clone(),
                api_version: r.version.clone(),
                subresource: r.subresource.clone(),
            }),
            response_status: None,
            request_received_timestamp: timestamp(at),
            stage_timestamp: timestamp(at),
            annotations: BTreeMap::new(),
        }
    }

    pub fn set_user(&mut self, user: &crate::api::UserInfo) {
        self.user = UserInfo {
            username: user.name.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
        };
    }

    /// The answer: `failure` is the Status' (reason, message) when the request failed.
    pub fn set_response(&mut self, code: u16, failure: Option<(String, String)>) {
        self.response_status = Some(ResponseStatus {
            status: failure.as_ref().map(|_| "Failure".to_owned()),
            reason: failure.as_ref().map(|f| f.0.clone()).filter(|r| !r.is_empty()),
            message: failure.map(|f| f.1),
            code,
            ..Default::default()
        });
    }

    /// This event at a later stage, stamped now.
    pub fn at_stage(&self, stage: &'static str) -> Self {
        Self { stage, stage_timestamp: timestamp(Utc::now()), ..self.clone() }
    }
}

/// Where events go; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    tx: SyncSender<Event>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditLog")
    }
}

/// `--audit-log-*`: where and how the file rotates (0 = unlimited, as in kube-apiserver).
#[derive(Debug, Clone)]
pub struct LogConfig {
    pub path: PathBuf,
    pub max_size_bytes: u64,
    pub max_backups: usize,
    pub max_age: Duration,
}

impl AuditLog {
    /// Opens the file (so a bad path fails at start) and starts the writer thread.
    pub fn start(cfg: LogConfig) -> std::io::Result<Self> {
        let mut sink = Sink::open(cfg)?;
        let (tx, rx) = sync_channel::<Event>(QUEUE);
        std::thread::Builder::new().name("audit-log".into()).spawn(move || sink.run(rx))?;
        Ok(Self { tx })
    }

    pub fn log(&self, event: Event) {
        match self.tx.try_send(event) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                global().audit_errors.get_or_create(&NameLabel { name: "log".into() }).inc();
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

    fn run(&mut self, rx: Receiver<Event>) {
        while let Ok(event) = rx.recv() {
            let mut line = match serde_json::to_vec(&event) {
                Ok(l) => l,
                Err(_) => continue,
            };
            line.push(b'\n');
            match self.write(&line) {
                Ok(()) => {
                    global().audit_events.inc();
                }
                Err(e) => {
                    global().audit_errors.get_or_create(&NameLabel { name: "log".into() }).inc();
                    tracing::error!(error = %e, path = %self.cfg.path.display(), "writing the audit log failed");
                }
            }
        }
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
                let stamp = name.strip_prefix(&prefix)?.strip_suffix(ext)?;
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

/// `audit.log` → (`audit`, `.log`); `audit` → (`audit`, ``).
fn split_name(path: &Path) -> (String, String) {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let ext = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    (stem, ext)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn event(uri: &str, method: Method) -> Event {
        let mut headers = HeaderMap::new();
        headers.insert("user-agent", "kubectl/v1.37.1".parse().unwrap());
        headers.insert("x-forwarded-for", "10.0.0.7, 10.0.0.8".parse().unwrap());
        let uri: Uri = uri.parse().unwrap();
        let info = RequestInfo::new(&method, uri.path(), uri.query());
        Event::received(&info, &uri, &headers, "127.0.0.1".parse().ok(), Utc::now())
    }

    #[test]
    fn a_metadata_event_names_who_did_what_to_which_object() {
        let mut ev = event("/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets/web/scale?dryRun=All", Method::PUT);
        ev.set_user(&crate::api::UserInfo {
            name: "bob".into(),
            uid: "42".into(),
            groups: vec!["system:authenticated".into()],
            extra: Default::default(),
        });
        ev.set_response(409, Some(("Conflict".into(), "the object has been modified".into())));
        let v = serde_json::to_value(&ev).unwrap();
        assert_eq!(v["apiVersion"], "audit.k8s.io/v1");
        assert_eq!(
            (v["kind"].as_str(), v["level"].as_str(), v["stage"].as_str()),
            (Some("Event"), Some("Metadata"), Some("ResponseComplete"))
        );
        assert_eq!(v["verb"], "update");
        assert_eq!(v["requestURI"], "/apis/demo.k8s.io/v1alpha1/namespaces/ns/podsets/web/scale?dryRun=All");
        assert_eq!(
            v["objectRef"],
            serde_json::json!({"resource": "podsets", "namespace": "ns", "name": "web", "apiGroup": "demo.k8s.io", "apiVersion": "v1alpha1", "subresource": "scale"})
        );
        assert_eq!(v["user"], serde_json::json!({"username": "bob", "uid": "42", "groups": ["system:authenticated"]}));
        assert_eq!(v["sourceIPs"], serde_json::json!(["10.0.0.7", "10.0.0.8", "127.0.0.1"]));
        assert_eq!(v["userAgent"], "kubectl/v1.37.1");
        assert_eq!(
            v["responseStatus"],
            serde_json::json!({"metadata": {}, "status": "Failure", "reason": "Conflict", "message": "the object has been modified", "code": 409})
        );
        assert!(v["requestReceivedTimestamp"].as_str().unwrap().ends_with('Z'));
        let list = serde_json::to_value(event("/apis/demo.k8s.io/v1alpha1/podsets?watch=true", Method::GET)).unwrap();
        assert_eq!((list["verb"].as_str(), list["objectRef"]["namespace"].as_str()), (Some("watch"), None));
        let health = serde_json::to_value(event("/readyz", Method::GET)).unwrap();
        assert_eq!((health["verb"].as_str(), health.get("objectRef")), (Some("get"), None));
    }

    #[test]
    fn the_file_rotates_and_keeps_max_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let cfg = LogConfig { path: path.clone(), max_size_bytes: 1000, max_backups: 2, max_age: Duration::ZERO };
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
}
