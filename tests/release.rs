//! `hack/release.sh` as a release manager runs it: everything in one directory, checksums that verify, manifests
//! that name the archive's image by its digest, an archive that unpacks (umoci, as a runtime would) into a root
//! whose binary runs and names its commit, an SBOM, and the same bytes for the binary, the archive and the
//! manifests when run twice from the same commit.
//!
//! Built with the `static-test` profile, as tests/static_binary.rs and tests/image.rs (the release profile differs
//! only in optimisation). Needs umoci and kubectl (hack/install-test-assets.sh installs them).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Cargo.toml's version: the only one hack/release.sh builds.
const VERSION: &str = podset_apiserver::version::GIT_VERSION;

/// The architecture this machine builds for, as OCI names it.
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no release for {other}"),
    }
}

/// The commit a release is built from. hack/release.sh builds only a commit; in a checkout with changes (a
/// developer's, before committing), the changes are committed to a repository of the test's own, which git is
/// pointed at (`GIT_DIR`), so the checkout's own history and index stay as they are.
struct Source {
    commit: String,
    git_dir: Option<tempfile::TempDir>,
}

fn source() -> Source {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let git = |git_dir: Option<&Path>, args: &[&str]| {
        let mut cmd = Command::new("git");
        if let Some(dir) = git_dir {
            cmd.env("GIT_DIR", dir).env("GIT_WORK_TREE", manifest_dir);
        }
        let out = cmd.args(args).current_dir(manifest_dir).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    if git(None, &["status", "--porcelain"]).is_empty() {
        return Source { commit: podset_apiserver::version::GIT_COMMIT.to_owned(), git_dir: None };
    }
    let dir = tempfile::tempdir().unwrap();
    git(None, &["init", "-q", "--bare", dir.path().to_str().unwrap()]);
    git(Some(dir.path()), &["add", "-A"]);
    let who = ["-c", "user.name=tests/release.rs", "-c", "user.email=tests@localhost", "-c", "core.bare=false"];
    git(Some(dir.path()), &[&who[..], &["commit", "-qm", "the checkout as it is"]].concat());
    Source { commit: git(Some(dir.path()), &["rev-parse", "HEAD"]), git_dir: Some(dir) }
}

fn release(out: &Path, source: &Source) -> PathBuf {
    let target_dir = Path::new(common::BIN).parent().and_then(Path::parent).expect("target directory");
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(manifest_dir.join("hack/release.sh"));
    if let Some(dir) = &source.git_dir {
        cmd.env("GIT_DIR", dir.path()).env("GIT_WORK_TREE", manifest_dir);
    }
    let output = cmd
        .args([VERSION, out.to_str().unwrap()])
        .current_dir(manifest_dir)
        .env("PROFILE", "static-test")
        .env("CARGO_TARGET_DIR", target_dir)
        .env("KUBECTL", common::assets_dir().join("kubectl"))
        .stderr(Stdio::inherit())
        .output()
        .expect("running hack/release.sh");
    assert!(output.status.success(), "hack/release.sh failed ({:?}); its output is above", output.status);
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// SHA256SUMS as file → checksum.
fn sums(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(dir.join("SHA256SUMS"))
        .unwrap()
        .lines()
        .map(|l| {
            let (sum, file) = l.split_once("  ").unwrap();
            (file.to_owned(), sum.to_owned())
        })
        .collect()
}

#[test]
fn a_release_is_complete_verifiable_and_reproducible() {
    let tmp = tempfile::tempdir().unwrap();
    let source = source();
    let dir = release(&tmp.path().join("first"), &source);
    let name = format!("podset-apiserver-{VERSION}");
    assert_eq!(dir.file_name().unwrap().to_str(), Some(name.as_str()));

    let files = sums(&dir);
    let mut expected = vec![
        format!("{name}-linux-{}", arch()),
        format!("{name}.oci.tar"),
        "image.digest".into(),
        "image.ref".into(),
        "manifests/backup/backup.yaml".into(),
        "manifests/cert-manager/podset-apiserver.yaml".into(),
        "manifests/ha-etcd/podset-apiserver.yaml".into(),
        "manifests/self-signed/podset-apiserver.yaml".into(),
        "restore/restore.yaml".into(),
        "sbom.cdx.json".into(),
    ];
    expected.sort();
    assert_eq!(files.keys().cloned().collect::<Vec<_>>(), expected, "what the release holds");
    let check =
        Command::new("sha256sum").args(["--check", "--strict", "SHA256SUMS"]).current_dir(&dir).output().unwrap();
    assert!(check.status.success(), "the checksums verify: {}", String::from_utf8_lossy(&check.stdout));

    // The manifests run the archive's image, by digest.
    let tar =
        Command::new("tar").arg("-xOf").arg(dir.join(format!("{name}.oci.tar"))).arg("index.json").output().unwrap();
    let index: serde_json::Value = serde_json::from_slice(&tar.stdout).unwrap();
    let digest = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
    assert_eq!(index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"], VERSION);
    assert_eq!(index["manifests"][0]["platform"]["architecture"], arch(), "labelled with what it was built for");
    let written = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    assert_eq!(written("image.digest").trim(), digest, "the digest, in a file");
    assert_eq!(written("image.ref").trim(), format!("docker.io/library/podset-apiserver:{VERSION}@{digest}"));
    // No directory mixes installs: `kubectl apply -f manifests/` finds nothing to apply.
    let loose = std::fs::read_dir(dir.join("manifests")).unwrap().flatten().filter(|e| e.path().is_file()).count();
    assert_eq!(loose, 0);
    for overlay in ["cert-manager", "ha-etcd", "self-signed"] {
        let yaml = std::fs::read_to_string(dir.join(format!("manifests/{overlay}/podset-apiserver.yaml"))).unwrap();
        let images: Vec<&str> = yaml.lines().filter_map(|l| l.trim().strip_prefix("image: ")).collect();
        assert!(!images.is_empty(), "{overlay}");
        for image in images {
            assert_eq!(image, format!("docker.io/library/podset-apiserver@{digest}"), "{overlay}");
        }
        assert!(yaml.contains("kind: APIService"), "{overlay}");
    }
    for (file, kind) in [("manifests/backup/backup.yaml", "kind: CronJob"), ("restore/restore.yaml", "kind: Job")] {
        let yaml = std::fs::read_to_string(dir.join(file)).unwrap();
        let images: Vec<&str> = yaml.lines().filter_map(|l| l.trim().strip_prefix("image: ")).collect();
        assert_eq!(images, [format!("docker.io/library/podset-apiserver@{digest}")], "{file}");
        assert!(yaml.contains(kind), "{file}");
    }

    // The archive unpacks as a runtime unpacks it, and its binary runs and names the commit it was built from.
    let layout = tmp.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    let untar = Command::new("tar").arg("-xf").arg(dir.join(format!("{name}.oci.tar"))).arg("-C").arg(&layout).status();
    assert!(untar.unwrap().success());
    let bundle = tmp.path().join("bundle");
    let unpack = Command::new("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:{VERSION}", layout.display()))
        .arg(&bundle)
        .output()
        .expect("umoci (Debian umoci) is needed: hack/install-test-assets.sh installs it");
    assert!(unpack.status.success(), "umoci unpack: {unpack:?}");
    let version = Command::new(bundle.join("rootfs/podset-apiserver")).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    assert!(version.contains(&source.commit), "{version}");
    assert!(version.contains("gitTreeState: clean"), "{version}");
    // The bugs planted for the fault harness's own test (feature planted-bugs) are not in a release.
    let planted =
        Command::new(bundle.join("rootfs/podset-apiserver")).arg("--planted-bug=stale-list").output().unwrap();
    assert!(
        !planted.status.success() && String::from_utf8_lossy(&planted.stderr).contains("unexpected argument"),
        "{planted:?}"
    );
    let same = Command::new("cmp")
        .arg(bundle.join("rootfs/podset-apiserver"))
        .arg(dir.join(format!("{name}-linux-{}", arch())))
        .status();
    assert!(same.unwrap().success(), "the image holds the released binary");

    let sbom: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("sbom.cdx.json")).unwrap()).unwrap();
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    let components: Vec<&str> =
        sbom["components"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
    for dependency in ["tokio", "rustls", "sled", "kube-client"] {
        assert!(components.contains(&dependency), "the SBOM lists {dependency}");
    }

    // Again, from the same commit: the same binary, archive and manifests (the SBOM has its own time and serial).
    let again = sums(&release(&tmp.path().join("second"), &source));
    for (file, sum) in &files {
        if file != "sbom.cdx.json" {
            assert_eq!(again.get(file), Some(sum), "{file} is not reproducible");
        }
    }
}

/// hack/release.sh run with `args` from a copy of the repository's script and Cargo.toml in `root`.
fn release_in(root: &Path, args: &[&str]) -> std::process::Output {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(root.join("hack")).unwrap();
    std::fs::copy(manifest_dir.join("hack/release.sh"), root.join("hack/release.sh")).unwrap();
    std::fs::copy(manifest_dir.join("Cargo.toml"), root.join("Cargo.toml")).unwrap();
    Command::new(root.join("hack/release.sh")).args(args).output().unwrap()
}

/// Before building anything, a VERSION that is not Cargo.toml's and a tree that is not a commit are refused.
#[test]
fn a_release_of_another_version_or_of_uncommitted_changes_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let ok = Command::new("git").args(args).current_dir(tmp.path()).output().unwrap().status.success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q"]);
    let out = release_in(tmp.path(), &["v9.9.9", "out"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is not Cargo.toml's version"), "{err}");

    git(&["-c", "user.name=t", "-c", "user.email=t@t", "add", "-A"]);
    git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a commit"]);
    std::fs::write(tmp.path().join("stray.txt"), "not committed").unwrap();
    let out = release_in(tmp.path(), &[VERSION, "out"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("the tree has changes or untracked files"), "{err}");
    assert!(!tmp.path().join("out").exists(), "refused before writing anything");
}
