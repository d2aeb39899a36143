//! What encryption at rest costs a request: creates (32 in flight, `ENCRYPTION_CREATES`, 3000) and then gets (32 in
//! flight, for `ENCRYPTION_GET_SECONDS`, 20) on the embedded store, with
//! - no `--encryption-provider-config`;
//! - `aescbc`, `aesgcm`, `secretbox` (one 32-byte key);
//! - `kms` v2 through envtest's plugin on a unix socket.
//!
//! The servers take turns, `ENCRYPTION_ROUNDS` (2) times, so a busy moment on a shared machine falls on all alike.
//! `cargo bench --bench encryption` prints each target's median rates and server CPU per request, and the ratios to
//! the plain server's. Gets are served from the cache, which holds decrypted objects: they should not pay per
//! request; a create pays one encryption.

mod common;

use std::time::Duration;

use common::workload::{creates_and_gets_in_turn, env};
use common::Server;

const KEY: &str = "YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE=";

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let (n, get_for, rounds) = (
        env("ENCRYPTION_CREATES", 3000) as usize,
        Duration::from_secs(env("ENCRYPTION_GET_SECONDS", 20)),
        env("ENCRYPTION_ROUNDS", 2) as usize,
    );
    let dir = tempfile::tempdir().unwrap();
    let plugin = podset_envtest::kms::KmsPlugin::start(&dir.path().join("kms.sock"));
    let keyed = |p: &str| format!("  - {p}:\n      keys:\n      - name: k1\n        secret: {KEY}\n");
    let kms = format!(
        "  - kms:\n      apiVersion: v2\n      name: bench\n      endpoint: unix://{}\n",
        plugin.socket().display()
    );
    let targets: Vec<(&str, Option<String>)> = vec![
        ("plain", None),
        ("aescbc", Some(keyed("aescbc"))),
        ("aesgcm", Some(keyed("aesgcm"))),
        ("secretbox", Some(keyed("secretbox"))),
        ("kms v2", Some(kms)),
    ];
    let mut servers = Vec::new();
    for (name, providers) in &targets {
        let mut args = Vec::new();
        if let Some(p) = providers {
            let file = dir.path().join(format!("{}.yaml", name.replace(' ', "-")));
            let text = format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
                 - resources: [podsets.demo.k8s.io]\n  providers:\n{p}"
            );
            std::fs::write(&file, text).unwrap();
            args.push(format!("--encryption-provider-config={}", file.display()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        servers.push(Server::start(&dir.path().join(name.replace(' ', "-")), &args));
    }
    let servers: Vec<(&str, Server)> = targets.iter().map(|(name, _)| *name).zip(servers).collect();
    creates_and_gets_in_turn(&servers, n, get_for, rounds).await;
    let (encrypts, decrypts, status) = plugin.calls();
    println!("kms plugin calls: {encrypts} Encrypt, {decrypts} Decrypt, {status} Status");
}
