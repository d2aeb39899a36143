//! What tests and benches on the local node share: the demo workload's Pod template, reading a Pod's status, and
//! reaching the workload in a Pod. Standalone, so a bench can include it by `#[path]`.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

/// A Pod's patience on this node: the image is there, but two cores run the whole cluster.
pub const POD_WAIT: Duration = Duration::from_secs(180);

/// The demo workload (images/src/bin/podset-demo.rs) labelled `app`: Ready `ready_after` seconds after it starts,
/// checked every second.
pub fn demo_template(image: &str, app: &str, ready_after: u32) -> Value {
    json!({
        "metadata": {"labels": {"app": app}},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "main",
                "image": image,
                "args": [format!("--ready-after={ready_after}")],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1},
            }],
        },
    })
}

pub fn phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

pub fn ready(p: &Pod) -> bool {
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn pod_ip(p: &Pod) -> String {
    p.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("a running Pod has an IP")
}

/// A plain HTTP/1.1 GET to the demo workload in a Pod (the test runs in the node's network namespace).
pub fn http_get(ip: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect((ip, 8080)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}
