//! `podset-apiserver backup`: every PodSet, as a chunked list through the main API server (one consistent snapshot:
//! every page at the first page's revision), written in the form `kubectl get podsets -A -o json
//! --show-managed-fields` writes and `restore` reads. The image holds no shell or kubectl, so this is what an
//! in-cluster CronJob runs (deploy/backup). A backup file appears only once complete.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use kube::api::{DynamicObject, ListParams, TypeMeta};
use kube::Api;

#[derive(Debug, Clone, Args)]
pub struct BackupOptions {
    /// Write the backup to this file (`-`: standard output).
    #[arg(long, required_unless_present = "to_dir", conflicts_with = "to_dir")]
    pub to: Option<PathBuf>,

    /// Write the backup into this directory as `podsets-<UTC time>.json` (for a CronJob), then delete all but the
    /// newest --keep of them.
    #[arg(long)]
    pub to_dir: Option<PathBuf>,

    /// With --to-dir: how many backups to keep (0: all).
    #[arg(long, default_value_t = 7)]
    pub keep: usize,

    /// PodSets per page of the list.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub chunk_size: u32,

    /// The version PodSets are written in. The default, v1alpha1, is the one every build reads, so a build rolled
    /// back to restores it; every version holds every field (v1alpha1 keeps spec.minReadySeconds in an annotation).
    #[arg(long, default_value_t = crate::api::Version::STORAGE, value_parser = clap::value_parser!(crate::api::Version))]
    pub output_version: crate::api::Version,

    /// Kubeconfig of the main API server; in a cluster, the in-cluster config is used.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

pub async fn run(opts: BackupOptions) -> anyhow::Result<()> {
    let client = super::options::client_from(opts.kubeconfig.as_deref(), true)
        .await?
        .context("no --kubeconfig and not in a cluster: nothing to back up from")?;
    // As `kubectl get podsets.<version>.demo.k8s.io -A -o json` writes them; restore reads either.
    let version = opts.output_version;
    let resource = super::podsets_in(version);
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let types = TypeMeta { api_version: resource.api_version.clone(), kind: resource.kind.clone() };

    let target = match (&opts.to, &opts.to_dir) {
        (Some(to), _) => to.clone(),
        (None, Some(dir)) => dir.join(format!("podsets-{}.json", jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ"))),
        (None, None) => unreachable!("clap requires --to or --to-dir"),
    };
    let (mut out, partial): (Box<dyn Write>, Option<PathBuf>) = if target.as_os_str() == "-" {
        (Box::new(std::io::stdout().lock()), None)
    } else {
        let partial = partial_name(&target);
        let file = std::fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
        (Box::new(std::io::BufWriter::new(file)), Some(partial))
    };

    let written = write_list(&api, &types, opts.chunk_size, &mut out).await;
    let count = match written {
        Ok(count) => count,
        Err(e) => {
            drop(out);
            if let Some(partial) = &partial {
                let _ = std::fs::remove_file(partial);
            }
            return Err(e);
        }
    };
    out.flush()?;
    drop(out);
    if let Some(partial) = partial {
        seal(&partial, &target)?;
        println!("backed up {count} PodSets to {}", target.display());
        if let Some(dir) = &opts.to_dir {
            point_latest(dir, &target)?;
            if opts.keep > 0 {
                prune(dir, opts.keep)?;
            }
        }
    } else {
        eprintln!("backed up {count} PodSets");
    }
    Ok(())
}

/// The List, item by item as the pages arrive: one page in memory at a time.
async fn write_list(
    api: &Api<DynamicObject>,
    types: &TypeMeta,
    chunk_size: u32,
    out: &mut dyn Write,
) -> anyhow::Result<usize> {
    out.write_all(b"{\"apiVersion\":\"v1\",\"kind\":\"List\",\"metadata\":{\"resourceVersion\":\"\"},\"items\":[")?;
    let mut count = 0usize;
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(chunk_size);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let page = api.list(&params).await.map_err(|e| match &e {
            kube::Error::Api(s) if s.code == 410 => anyhow::anyhow!(
                "the list's snapshot expired before the last page ({e}): run the backup again; \
                 a larger --chunk-size needs fewer pages"
            ),
            _ => anyhow::Error::new(e).context("listing PodSets"),
        })?;
        for mut item in page.items {
            item.types = Some(types.clone());
            out.write_all(if count == 0 { b"\n" } else { b",\n" })?;
            serde_json::to_writer(&mut *out, &item)?;
            count += 1;
        }
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    out.write_all(b"\n]}\n")?;
    Ok(count)
}

fn partial_name(target: &Path) -> PathBuf {
    let mut name = target.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    target.with_file_name(name)
}

/// Durable before it has its name: a crash leaves a `.partial` file, never a short backup under the final name.
fn seal(partial: &Path, target: &Path) -> anyhow::Result<()> {
    std::fs::File::open(partial)?.sync_all()?;
    std::fs::rename(partial, target)
        .with_context(|| format!("renaming {} to {}", partial.display(), target.display()))?;
    let dir = target.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// `latest.json` in --to-dir names the newest backup (what deploy/backup/restore.yaml restores), replaced in one
/// rename so that it always names a whole backup.
fn point_latest(dir: &Path, newest: &Path) -> anyhow::Result<()> {
    let name = newest.file_name().context("a backup file name")?;
    let tmp = dir.join("latest.json.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(name, &tmp)?;
    std::fs::rename(&tmp, dir.join(LATEST)).context("pointing latest.json at the new backup")?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

const LATEST: &str = "latest.json";

/// Deletes all but the newest `keep` of --to-dir's backups (their names sort by time), and any `.partial` left by
/// an earlier run that failed.
fn prune(dir: &Path, keep: usize) -> anyhow::Result<()> {
    let mut backups = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with("podsets-") && name.ends_with(".json") {
            backups.push(name);
        } else if name.starts_with("podsets-") && name.ends_with(".json.partial") {
            std::fs::remove_file(dir.join(&name))?;
        }
    }
    backups.sort();
    let old = backups.len().saturating_sub(keep);
    for name in &backups[..old] {
        std::fs::remove_file(dir.join(name)).with_context(|| format!("deleting old backup {name}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_the_newest_drops_partials_and_leaves_latest() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "podsets-20261101T000000Z.json",
            "podsets-20261103T000000Z.json",
            "podsets-20261102T000000Z.json",
            "podsets-20261104T000000Z.json.partial",
            "other.json",
        ];
        for n in names {
            std::fs::write(dir.path().join(n), "{}").unwrap();
        }
        point_latest(dir.path(), &dir.path().join("podsets-20261103T000000Z.json")).unwrap();
        prune(dir.path(), 2).unwrap();
        let latest = std::fs::read_link(dir.path().join(LATEST)).unwrap();
        assert_eq!(latest, Path::new("podsets-20261103T000000Z.json"));
        let mut left: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        left.sort();
        assert_eq!(
            left,
            ["latest.json", "other.json", "podsets-20261102T000000Z.json", "podsets-20261103T000000Z.json"]
        );
    }

    #[test]
    fn a_partial_file_sits_beside_the_target() {
        assert_eq!(partial_name(Path::new("/b/podsets.json")), Path::new("/b/podsets.json.partial"));
        assert_eq!(partial_name(Path::new("x.json")), Path::new("x.json.partial"));
    }
}
