//! What the benches share: the server binary started on a data dir over HTTPS on loopback, a client for it, and
//! readings of the process from /proc; the workload (`workload`) and the CRD baseline (`crd`).
#![allow(dead_code)]

pub mod crd;
pub mod workload;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http::Request;
use http_body_util::BodyExt;

pub const BIN: &str = env!("CARGO_BIN_EXE_podset-apiserver");
pub const PATH: &str = "/apis/demo.k8s.io/v1alpha1/namespaces/bench/podsets";

pub struct Server {
    pub child: Child,
    pub url: String,
    pub ca: Vec<u8>,
    pub data_dir: PathBuf,
    /// From spawn to serving (the store loaded, the port bound).
    pub started_in: Duration,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts the server (`PODSET_APISERVER_BIN` names another build to measure; `PODSET_APISERVER_ARGS` adds
    /// flags, e.g. `--storage-backend=etcd --etcd-servers=http://127.0.0.1:2379`) on `data_dir`.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Server {
        let bin = std::env::var("PODSET_APISERVER_BIN").unwrap_or_else(|_| BIN.to_owned());
        let more = std::env::var("PODSET_APISERVER_ARGS").unwrap_or_default();
        let started = Instant::now();
        let mut child = Command::new(bin)
            .args(["--insecure-allow-all", "--bind-address", "127.0.0.1", "--secure-port", "0", "--log-format", "json"])
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .args(more.split_whitespace())
            .env("RUST_LOG", "warn,podset_apiserver::cmd=info")
            .env_remove("KUBECONFIG")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if let Some(a) = v.pointer("/fields/address").and_then(|a| a.as_str()) {
                        let _ = tx.send(a.to_owned());
                    }
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(120)).expect("server start");
        let started_in = started.elapsed();
        let ca_pem = std::fs::read(data_dir.join("certs/ca.crt")).unwrap();
        use rustls::pki_types::pem::PemObject;
        let ca = rustls::pki_types::CertificateDer::pem_slice_iter(&ca_pem).next().unwrap().unwrap().to_vec();
        Server { child, url: format!("https://{addr}"), ca, data_dir: data_dir.to_owned(), started_in }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How to reach the server (no credentials: it allows all).
    pub fn config(&self) -> kube::Config {
        podset_apiserver::apiserver::tls::provider();
        let mut cfg = kube::Config::new(self.url.parse().unwrap());
        cfg.root_cert = Some(vec![self.ca.clone()]);
        cfg
    }

    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).unwrap()
    }
}

pub async fn send(client: &kube::Client, req: Request<Vec<u8>>) -> (u16, bytes::Bytes) {
    let resp = client.send(req.map(kube::client::Body::from)).await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

/// CPU time the process has used so far, in microseconds (from /proc; steadier than rates on a shared machine).
pub fn cpu_us(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<f64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    let ticks = f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0);
    ticks * 1e6 / 100.0
}

/// (current, peak) resident memory of a process, in MB.
pub fn rss_mb(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (kb("VmRSS:") / 1000.0, kb("VmHWM:") / 1000.0)
}

/// Bytes of every file under `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}
