//! Storage: where PodSets are kept, and how much history watches can resume from. One store per API group
//! ([`StorageFactory`]), each resource's values encrypted by the providers the encryption configuration gives it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};

use super::duration;
use crate::api::resource::ResourceInfo;
use crate::cmd::encryption::config::EncryptionConfig;
use crate::resources::podset;
use crate::storage::value::kmsv2::Timing;
use crate::storage::value::Transformer;
use crate::storage::{Backend, Cacher, EtcdBackend, EtcdOptions, HistoryLimits, SledBackend, SledOptions, Store};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StorageBackend {
    /// Embedded, on local disk (--data-dir): one replica.
    Sled,
    /// etcd (--etcd-servers): several replicas share it.
    Etcd,
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Storage")]
pub struct StorageOptions {
    /// Where PodSets are kept: `sled` on local disk (one replica), or `etcd` (several replicas).
    #[arg(long, value_enum, default_value = "sled")]
    pub storage_backend: StorageBackend,

    /// etcd client URLs, comma separated (--storage-backend=etcd).
    #[arg(long, value_delimiter = ',')]
    pub etcd_servers: Vec<String>,

    /// Prefix of every etcd key; PodSets are under <prefix>/demo.k8s.io/podsets/.
    #[arg(long, default_value = "/registry")]
    pub etcd_prefix: String,

    /// CA bundle that verifies etcd's serving certificate.
    #[arg(long)]
    pub etcd_cafile: Option<PathBuf>,

    /// Client certificate for etcd (with --etcd-keyfile).
    #[arg(long)]
    pub etcd_certfile: Option<PathBuf>,

    /// Client key for etcd.
    #[arg(long)]
    pub etcd_keyfile: Option<PathBuf>,

    /// How often etcd's old revisions are compacted (one server of all sharing the etcd does it per interval);
    /// 0 leaves compaction to others.
    #[arg(long, default_value = "5m", value_parser = duration)]
    pub etcd_compaction_interval: Duration,

    /// The version PodSets are written in (demo.k8s.io/v1alpha1 or v1beta1). Objects stored in the other stay
    /// readable and are rewritten in this one by a migration pass at start. v1alpha1, the default, is what builds
    /// that serve only v1alpha1 read: keep it while any replica, or a build you may roll back to, is one of them.
    /// Every replica on one store must have the same value.
    #[arg(long, default_value_t = crate::api::Version::STORAGE, value_parser = clap::value_parser!(crate::api::Version))]
    pub storage_version: crate::api::Version,

    /// Directory of the embedded database (sled) and self-signed certificates.
    #[arg(long, default_value = "podset-data", env = "PODSET_DATA_DIR")]
    pub data_dir: PathBuf,

    /// sled's page cache, in bytes. Objects are served from the server's own cache; sled reads only to check
    /// writes and at start.
    #[arg(long, default_value_t = SledOptions::default().cache_capacity)]
    pub storage_sled_cache_bytes: u64,

    /// Keep at least this many of the newest changes for watches to resume from (but for the history a storage
    /// migration drops once it has moved every PodSet off another encryption provider).
    #[arg(long, default_value_t = 10_000)]
    pub watch_history_events: usize,

    /// Also keep every change younger than this many seconds (up to --watch-history-max-events).
    #[arg(long, default_value_t = 300)]
    pub watch_history_seconds: u64,

    /// Hard cap on kept changes.
    #[arg(long, default_value_t = 200_000)]
    pub watch_history_max_events: usize,

    /// Hard cap on the serialized size of kept changes, in bytes (the newest change is always kept).
    #[arg(long, default_value_t = HistoryLimits::default().max_bytes)]
    pub watch_history_max_bytes: usize,

    /// Start even when the store is empty while Pods in the main API server are still owned by PodSets (which
    /// looks like a lost or unmounted data dir, and would let the garbage collector delete those Pods).
    #[arg(long)]
    pub allow_empty_store: bool,

    /// File with an apiserver.config.k8s.io/v1 EncryptionConfiguration: how PodSets (podsets.demo.k8s.io,
    /// *.demo.k8s.io or *.*) are encrypted at rest, in sled or etcd, as kube-apiserver reads it.
    #[arg(long)]
    pub encryption_provider_config: Option<PathBuf>,

    /// Apply a changed --encryption-provider-config without a restart (the file is checked every minute); a file
    /// that does not load leaves the running configuration in place.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub encryption_provider_config_automatic_reload: bool,

    /// How often the file is checked for --encryption-provider-config-automatic-reload.
    #[arg(long, default_value = "1m", value_parser = duration, hide = true)]
    pub encryption_provider_config_reload_interval: Duration,

    /// How often a KMS v2 plugin's Status is polled while healthy (10 s at most while failing).
    #[arg(long, default_value = "1m", value_parser = duration, hide = true)]
    pub encryption_provider_kms_poll_interval: Duration,

    /// How long writes go on after a KMS v2 plugin's last healthy Status.
    #[arg(long, default_value = "3m", value_parser = duration, hide = true)]
    pub encryption_provider_kms_write_ttl: Duration,
}

impl StorageOptions {
    pub fn history_limits(&self) -> HistoryLimits {
        HistoryLimits {
            min_events: self.watch_history_events,
            min_age: Duration::from_secs(self.watch_history_seconds),
            max_events: self.watch_history_max_events.max(self.watch_history_events),
            max_bytes: self.watch_history_max_bytes,
        }
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        let tls_files = [
            ("--etcd-cafile", &self.etcd_cafile),
            ("--etcd-certfile", &self.etcd_certfile),
            ("--etcd-keyfile", &self.etcd_keyfile),
        ];
        match self.storage_backend {
            StorageBackend::Etcd if self.etcd_servers.iter().all(|s| s.is_empty()) => {
                anyhow::bail!("--storage-backend=etcd needs --etcd-servers")
            }
            StorageBackend::Sled => {
                // A flag that would change nothing is a mistake in the command line: say so rather than serve
                // from a local disk the operator did not mean.
                let given = tls_files.iter().filter(|(_, f)| f.is_some()).map(|(flag, _)| *flag);
                if let Some(flag) =
                    (!self.etcd_servers.is_empty()).then_some("--etcd-servers").into_iter().chain(given).next()
                {
                    anyhow::bail!("{flag} is given, but --storage-backend is sled: add --storage-backend=etcd")
                }
            }
            StorageBackend::Etcd => {}
        }
        for server in &self.etcd_servers {
            match server.split_once("://") {
                _ if server.is_empty() => {
                    anyhow::bail!("--etcd-servers has an empty entry: {:?}", self.etcd_servers.join(","))
                }
                Some(("http", _)) if self.etcd_cafile.is_some() || self.etcd_certfile.is_some() => anyhow::bail!(
                    "--etcd-servers {server} is plain http, but --etcd-cafile or --etcd-certfile is given: use https://"
                ),
                Some(("http" | "https", rest)) if !rest.is_empty() => {}
                None => {}
                _ => anyhow::bail!("--etcd-servers {server:?} is not an http:// or https:// URL"),
            }
        }
        if self.etcd_certfile.is_some() != self.etcd_keyfile.is_some() {
            anyhow::bail!("--etcd-certfile and --etcd-keyfile go together");
        }
        if !self.etcd_prefix.starts_with('/') {
            anyhow::bail!("--etcd-prefix must start with '/', got {:?}", self.etcd_prefix);
        }
        if self.encryption_provider_config_automatic_reload && self.encryption_provider_config.is_none() {
            anyhow::bail!(
                "--encryption-provider-config-automatic-reload must be set with --encryption-provider-config"
            );
        }
        Ok(())
    }

    pub fn kms_timing(&self) -> Timing {
        let poll = self.encryption_provider_kms_poll_interval;
        Timing {
            poll,
            poll_failing: poll.min(Duration::from_secs(10)),
            write_ttl: self.encryption_provider_kms_write_ttl,
        }
    }

    /// How the values of `resources` are stored: through the providers --encryption-provider-config gives each, or
    /// plainly; and the configuration read, if any.
    pub fn transformer(
        &self,
        resources: &[&'static ResourceInfo],
    ) -> anyhow::Result<(Transformer, Option<EncryptionConfig>)> {
        let Some(path) = &self.encryption_provider_config else { return Ok((Transformer::plain(), None)) };
        one_root_each(resources)?;
        let config = EncryptionConfig::load(path)?;
        let table = crate::cmd::encryption::providers(&config, resources, self.kms_timing())?;
        let values = if self.encryption_provider_config_automatic_reload {
            // A reload may cover the ones it leaves out later: their values go through providers (identity for
            // now) that it can replace.
            Transformer::new(crate::cmd::encryption::or_identity(table, resources))
        } else if table.is_empty() {
            for r in resources {
                tracing::warn!(
                    file = %path.display(),
                    "--encryption-provider-config names neither {r}, *.{} nor *.*: {}s are stored unencrypted",
                    r.group,
                    r.kind
                );
            }
            Transformer::plain()
        } else {
            Transformer::new(table)
        };
        Ok((values, Some(config)))
    }

    /// The readiness check that says whether writes can succeed, named as kube-apiserver names it.
    pub fn check_name(&self) -> &'static str {
        match self.storage_backend {
            StorageBackend::Sled => "storage",
            StorageBackend::Etcd => "etcd",
        }
    }

    /// The stores of the chosen backend, their values read and written through `values`.
    pub fn factory(&self, values: Transformer) -> StorageFactory<'_> {
        StorageFactory { options: self, values }
    }

    /// Where `group`'s objects are, for messages.
    pub fn location(&self, group: &str) -> String {
        match self.storage_backend {
            StorageBackend::Sled => format!("the store of {group} in {}", self.sled_dir(group).display()),
            StorageBackend::Etcd => {
                format!("etcd at {} under {}", self.etcd_servers.join(","), self.etcd_options(group).root())
            }
        }
    }

    /// `group`'s sled database: `<data-dir>/db` for demo.k8s.io (where it always was), `<data-dir>/db-<group>` for
    /// another group.
    pub fn sled_dir(&self, group: &str) -> PathBuf {
        match group {
            podset::GROUP => self.data_dir.join("db"),
            _ => self.data_dir.join(format!("db-{group}")),
        }
    }

    /// How to reach etcd, for `group`'s keys.
    pub fn etcd_options(&self, group: &str) -> EtcdOptions {
        EtcdOptions {
            servers: self.etcd_servers.clone(),
            prefix: self.etcd_prefix.clone(),
            group: group.to_owned(),
            ca_file: self.etcd_cafile.clone(),
            cert_file: self.etcd_certfile.clone(),
            key_file: self.etcd_keyfile.clone(),
            compaction_interval: self.etcd_compaction_interval,
            ..Default::default()
        }
    }

    /// A store that has never held anything: a new sled database, or no PodSet in etcd under the prefix.
    pub fn looks_new(&self, store: &dyn Store) -> bool {
        match self.storage_backend {
            StorageBackend::Sled => store.current_revision() == 0,
            StorageBackend::Etcd => store.stats().objects == 0,
        }
    }
}

/// Each resource's objects live in one store per API group, as kube-apiserver's `StorageFactory` gives each group
/// its etcd prefix: one root per group in etcd (`<prefix>/<group>`, its marker `<prefix>/<group>#last-write`), one
/// sled database per group under --data-dir. Every store reads and writes through the same transformer, whose
/// table tells each resource's values by their keys.
pub struct StorageFactory<'a> {
    options: &'a StorageOptions,
    values: Transformer,
}

/// The open stores, one per API group, in the order their groups came.
pub struct Stores(Vec<(&'static str, Arc<dyn Store>)>);

impl Stores {
    /// `group`'s store.
    pub fn get(&self, group: &str) -> Option<&Arc<dyn Store>> {
        self.0.iter().find(|(g, _)| *g == group).map(|(_, s)| s)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &Arc<dyn Store>)> {
        self.0.iter().map(|(g, s)| (*g, s))
    }
}

impl StorageFactory<'_> {
    /// Opens one store for each group `resources` belong to: the cache over the chosen backend, loaded.
    pub async fn open(&self, resources: &[&'static ResourceInfo]) -> anyhow::Result<Stores> {
        one_root_each(resources)?;
        let mut stores: Vec<(&'static str, Arc<dyn Store>)> = Vec::new();
        for r in resources {
            if stores.iter().all(|(g, _)| *g != r.group) {
                stores.push((r.group, self.open_group(r.group).await?));
            }
        }
        Ok(Stores(stores))
    }

    /// Opens `group`'s store.
    pub async fn open_group(&self, group: &str) -> anyhow::Result<Arc<dyn Store>> {
        let (options, values) = (self.options, self.values.clone());
        let backend: Arc<dyn Backend> = match options.storage_backend {
            StorageBackend::Sled => {
                let db_dir = options.sled_dir(group);
                let sled =
                    SledOptions { cache_capacity: options.storage_sled_cache_bytes, values, ..Default::default() };
                Arc::new(tokio::task::spawn_blocking(move || SledBackend::open(&db_dir, sled)).await??)
            }
            StorageBackend::Etcd => {
                Arc::new(EtcdBackend::connect(EtcdOptions { values, ..options.etcd_options(group) }).await?)
            }
        };
        let cacher = Cacher::open(backend, options.history_limits())
            .await
            .with_context(|| format!("loading {}", options.location(group)))?;
        Ok(Arc::new(cacher))
    }
}

/// The transformer tells resources' values apart by their storage keys alone, whatever their group.
fn one_root_each(resources: &[&'static ResourceInfo]) -> anyhow::Result<()> {
    for (i, r) in resources.iter().enumerate() {
        if let Some(other) = resources[..i].iter().find(|o| o.key_root == r.key_root) {
            anyhow::bail!("{other} and {r} are both kept under {}: their values cannot be told apart", r.key_root);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        storage: StorageOptions,
    }

    fn parse(args: &[&str]) -> StorageOptions {
        Flags::try_parse_from(std::iter::once("podset-apiserver").chain(args.iter().copied())).unwrap().storage
    }

    fn refusal(args: &[&str]) -> String {
        parse(args).validate().expect_err("refused").to_string()
    }

    #[test]
    fn etcd_flags_parse_as_kube_apiservers() {
        let o = parse(&[
            "--storage-backend=etcd",
            "--etcd-servers=https://a:2379,https://b:2379",
            "--etcd-prefix=/kube",
            "--etcd-cafile=/ca.crt",
            "--etcd-certfile=/c.crt",
            "--etcd-keyfile=/c.key",
            "--etcd-compaction-interval=1m",
        ]);
        o.validate().unwrap();
        let e = o.etcd_options(podset::GROUP);
        assert_eq!(e.servers, ["https://a:2379", "https://b:2379"]);
        assert_eq!((e.prefix.as_str(), e.compaction_interval), ("/kube", Duration::from_secs(60)));
        assert_eq!(e.ca_file.as_deref(), Some(std::path::Path::new("/ca.crt")));
        assert_eq!(o.location(podset::GROUP), "etcd at https://a:2379,https://b:2379 under /kube/demo.k8s.io");
        parse(&["--storage-backend=etcd", "--etcd-servers=127.0.0.1:2379"]).validate().unwrap();
        parse(&[]).validate().unwrap();
    }

    #[test]
    fn storage_flags_that_do_not_go_together_are_refused() {
        for (args, says) in [
            (&["--storage-backend=etcd"][..], "--storage-backend=etcd needs --etcd-servers"),
            (&["--storage-backend=etcd", "--etcd-servers="], "--storage-backend=etcd needs --etcd-servers"),
            (&["--storage-backend=etcd", "--etcd-servers=http://a:2379,"], "--etcd-servers has an empty entry"),
            (&["--etcd-servers=http://a:2379"], "--etcd-servers is given, but --storage-backend is sled"),
            (&["--etcd-cafile=/ca.crt"], "--etcd-cafile is given, but --storage-backend is sled"),
            (&["--etcd-keyfile=/k"], "--etcd-keyfile is given, but --storage-backend is sled"),
            (
                &["--storage-backend=etcd", "--etcd-servers=http://a:2379", "--etcd-cafile=/ca.crt"],
                "is plain http, but --etcd-cafile or --etcd-certfile is given",
            ),
            (&["--storage-backend=etcd", "--etcd-servers=unix://x"], "is not an http:// or https:// URL"),
            (&["--storage-backend=etcd", "--etcd-servers=https://"], "is not an http:// or https:// URL"),
            (
                &["--storage-backend=etcd", "--etcd-servers=https://a:2379", "--etcd-certfile=/c"],
                "--etcd-certfile and --etcd-keyfile go together",
            ),
            (
                &["--storage-backend=etcd", "--etcd-servers=a:2379", "--etcd-prefix=kube"],
                "--etcd-prefix must start with '/'",
            ),
        ] {
            let e = refusal(args);
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }

    /// PodSets' etcd keys and marker are where every earlier build put them: a rolling upgrade, or a downgrade,
    /// reads the same etcd.
    #[test]
    fn podsets_stay_where_they_were_in_etcd() {
        let o = parse(&["--storage-backend=etcd", "--etcd-servers=https://a:2379"]);
        let e = o.etcd_options(podset::INFO.group);
        let key = crate::registry::ObjectKey::new("ns", "name").storage_key(&podset::INFO);
        assert_eq!(e.key(&key), "/registry/demo.k8s.io/podsets/ns/name");
        assert_eq!(e.marker(), "/registry/demo.k8s.io#last-write");
        let o = parse(&["--storage-backend=etcd", "--etcd-servers=https://a:2379", "--etcd-prefix=/kube/"]);
        assert_eq!(o.etcd_options(podset::INFO.group).key(&key), "/kube/demo.k8s.io/podsets/ns/name");
        assert_eq!(o.location(podset::GROUP), "etcd at https://a:2379 under /kube/demo.k8s.io");
    }

    #[test]
    fn each_group_has_its_own_etcd_root_and_sled_database() {
        use crate::api::resource::WIDGETS;
        let o = parse(&["--storage-backend=etcd", "--etcd-servers=https://a:2379"]);
        let e = o.etcd_options(WIDGETS.group);
        let key = crate::registry::ObjectKey::new("", "gear").storage_key(&WIDGETS);
        assert_eq!(e.key(&key), "/registry/test.podset.example/widgets/gear");
        assert_eq!(e.marker(), "/registry/test.podset.example#last-write");
        assert_eq!(o.location(WIDGETS.group), "etcd at https://a:2379 under /registry/test.podset.example");

        let o = parse(&["--data-dir=/var/lib/podset"]);
        assert_eq!(o.sled_dir(podset::GROUP), std::path::Path::new("/var/lib/podset/db"), "as before groups");
        assert_eq!(o.sled_dir(WIDGETS.group), std::path::Path::new("/var/lib/podset/db-test.podset.example"));
        assert_eq!(
            o.location(WIDGETS.group),
            "the store of test.podset.example in /var/lib/podset/db-test.podset.example"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_factory_opens_one_sled_store_per_group() {
        use crate::api::resource::WIDGETS;
        use crate::storage::Draft;
        let dir = tempfile::tempdir().unwrap();
        let o = parse(&[&format!("--data-dir={}", dir.path().display())]);
        let stores = o.factory(Transformer::plain()).open(&[&podset::INFO, &WIDGETS]).await.unwrap();
        assert_eq!(stores.iter().map(|(g, _)| g).collect::<Vec<_>>(), [podset::GROUP, WIDGETS.group]);
        let draft = |name: &str| Draft::new(&serde_json::json!({"metadata": {"name": name}}), &[]).unwrap();
        stores.get(WIDGETS.group).unwrap().create("/widgets/gear", draft("gear")).await.unwrap();
        let podsets = stores.get(podset::GROUP).unwrap();
        assert!(podsets.get("/widgets/gear").await.unwrap().is_none(), "another group's store");
        assert_eq!(podsets.current_revision(), 0);
        drop(stores);
        let mut dirs: Vec<_> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        dirs.sort();
        assert_eq!(dirs, ["db", "db-test.podset.example"]);

        let twice = o.factory(Transformer::plain()).open(&[&podset::INFO, &podset::INFO]).await.err().unwrap();
        assert!(twice.to_string().contains("are both kept under /podsets/"), "{twice}");
    }
}
