//! Stamps the binary with what `--version` and `/version` report, as kube's `hack/lib/version.sh` stamps its
//! binaries: the git commit, whether the tree was clean, the build date, and the compiler.
//!
//! - `PODSET_GIT_COMMIT` (and `PODSET_GIT_TREE_STATE`) override git, for builds without `.git` (an image build
//!   from a source archive). Without either, the commit is empty and the tree state `unknown`: never invented.
//! - The results are `PODSET_BUILD_*`, not the inputs' names: cargo also sets them when it runs the tests, and a
//!   build started from a test (tests/static_binary.rs) would otherwise take them for overrides.
//! - `SOURCE_DATE_EPOCH` (seconds) fixes the build date, for reproducible builds; otherwise it is the time this
//!   script last ran, which is whenever the sources, the git HEAD or the index changed.

use std::path::PathBuf;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    for var in ["PODSET_GIT_COMMIT", "PODSET_GIT_TREE_STATE", "SOURCE_DATE_EPOCH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    for path in ["build.rs", "src", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={path}");
    }

    let (commit, tree_state) = match std::env::var("PODSET_GIT_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => {
            let state = std::env::var("PODSET_GIT_TREE_STATE").unwrap_or_default();
            let state = if state.trim().is_empty() { "unknown".to_owned() } else { state.trim().to_owned() };
            (commit.trim().to_owned(), state)
        }
        _ => from_git().unwrap_or_else(|| (String::new(), "unknown".into())),
    };
    // Empty counts as unset: a Dockerfile `ARG` passes an empty value when no build argument is given.
    let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(s) if !s.trim().is_empty() => {
            s.trim().parse().unwrap_or_else(|_| panic!("SOURCE_DATE_EPOCH={s:?} is not a number of seconds"))
        }
        _ => SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    };
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = output(Command::new(rustc).arg("--version")).unwrap_or_default();

    println!("cargo:rustc-env=PODSET_BUILD_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=PODSET_BUILD_GIT_TREE_STATE={tree_state}");
    println!("cargo:rustc-env=PODSET_BUILD_DATE={}", rfc3339(epoch));
    println!("cargo:rustc-env=PODSET_BUILD_RUSTC={rustc_version}");
    println!("cargo:rustc-env=PODSET_BUILD_TARGET={}", std::env::var("TARGET").unwrap_or_default());
}

/// The commit and `clean`/`dirty`, if this is a git checkout (a worktree too) and git is installed.
fn from_git() -> Option<(String, String)> {
    let commit = output(Command::new("git").args(["rev-parse", "HEAD"]))?;
    // Rerun when HEAD moves or something is staged or committed; edits to the sources rerun through `src`.
    for name in ["HEAD", "index", "packed-refs"] {
        watch_git_path(name);
    }
    if let Some(branch) = output(Command::new("git").args(["symbolic-ref", "-q", "HEAD"])) {
        watch_git_path(&branch);
    }
    // --no-optional-locks: `git status` would otherwise refresh the index, and that write would rerun this script.
    let dirty =
        output(Command::new("git").args(["--no-optional-locks", "status", "--porcelain", "--untracked-files=no"]))
            .is_none_or(|s| !s.is_empty());
    Some((commit, if dirty { "dirty" } else { "clean" }.to_owned()))
}

fn watch_git_path(name: &str) {
    if let Some(path) = output(Command::new("git").args(["rev-parse", "--git-path", name])) {
        // A path cargo cannot find would rerun this script on every build.
        if PathBuf::from(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

/// Trimmed stdout of a command that succeeded.
fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `2006-01-02T15:04:05Z`, the form kube's `buildDate` takes (`date -u +%Y-%m-%dT%H:%M:%SZ`).
fn rfc3339(epoch: u64) -> String {
    let (days, secs) = (epoch / 86_400, epoch % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
}
