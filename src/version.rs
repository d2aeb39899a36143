//! What this build is, as kube's `k8s.io/component-base/version` says it: served on `/version` as a `version.Info`
//! and printed by `--version`. The values are stamped by `build.rs`.

use serde_json::{json, Value};

/// The full commit the binary was built from; empty if the build had neither git nor `PODSET_GIT_COMMIT`.
pub const GIT_COMMIT: &str = env!("PODSET_BUILD_GIT_COMMIT");
/// `clean`, `dirty` (uncommitted changes to tracked files) or `unknown`.
pub const GIT_TREE_STATE: &str = env!("PODSET_BUILD_GIT_TREE_STATE");
/// UTC, `2006-01-02T15:04:05Z`.
pub const BUILD_DATE: &str = env!("PODSET_BUILD_DATE");
/// `rustc 1.89.0 (29483883e 2025-08-04)`.
pub const RUSTC_VERSION: &str = env!("PODSET_BUILD_RUSTC");
pub const GIT_VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));

/// `podset-apiserver --version`: one line, as `kube-apiserver --version` prints it, then the details.
pub const LONG_VERSION: &str = concat!(
    "v",
    env!("CARGO_PKG_VERSION"),
    "\ngitCommit: ",
    env!("PODSET_BUILD_GIT_COMMIT"),
    "\ngitTreeState: ",
    env!("PODSET_BUILD_GIT_TREE_STATE"),
    "\nbuildDate: ",
    env!("PODSET_BUILD_DATE"),
    "\ncompiler: ",
    env!("PODSET_BUILD_RUSTC"),
    "\ntarget: ",
    env!("PODSET_BUILD_TARGET"),
);

/// The `/version` document, with every field of apimachinery's `version.Info` (clients such as k8s-openapi's
/// `Info` require all of them). `goVersion` is empty: there is no Go runtime in this binary, and naming rustc there
/// would mislead tools that parse it as Go's; `compiler` says `rustc` (Go puts `runtime.Compiler`, "gc", there).
pub fn info() -> Value {
    json!({
        "major": env!("CARGO_PKG_VERSION_MAJOR"),
        "minor": env!("CARGO_PKG_VERSION_MINOR"),
        "gitVersion": GIT_VERSION,
        "gitCommit": GIT_COMMIT,
        "gitTreeState": GIT_TREE_STATE,
        "buildDate": BUILD_DATE,
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch()),
    })
}

/// The architecture as Go's GOARCH names it, since `platform` is read as `GOOS/GOARCH`.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_info_has_every_field_and_a_stamped_date() {
        let v = info();
        for field in [
            "major",
            "minor",
            "gitVersion",
            "gitCommit",
            "gitTreeState",
            "buildDate",
            "goVersion",
            "compiler",
            "platform",
        ] {
            assert!(v[field].is_string(), "{field} missing in {v}");
        }
        assert_eq!(v["platform"], format!("linux/{}", go_arch()));
        let date = BUILD_DATE.as_bytes();
        assert_eq!(date.len(), 20, "{BUILD_DATE}");
        assert!(BUILD_DATE.starts_with("20") && date[10] == b'T' && BUILD_DATE.ends_with('Z'), "{BUILD_DATE}");
        assert!(["clean", "dirty", "unknown"].contains(&GIT_TREE_STATE), "{GIT_TREE_STATE}");
        assert!(GIT_COMMIT.is_empty() || GIT_COMMIT.len() == 40, "{GIT_COMMIT}");
    }
}
