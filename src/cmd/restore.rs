//! `podset-apiserver restore`: PodSets from a backup into an empty store of either backend, then exit. The backup
//! is read as a stream (one item in memory at a time, a few hundred being written), so its size is not bounded by
//! memory.

use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use tokio::sync::mpsc;

use super::options::{StorageBackend, StorageOptions};
use crate::resources::podset;
use crate::resources::podset::PodSets as Registry;

/// Writes in flight: enough to fill sled's group commits and etcd's pipeline.
const IN_FLIGHT: usize = 256;

#[derive(Debug, Clone, Args)]
pub struct RestoreOptions {
    /// The backup: PodSets as `kubectl get podsets -A -o json --show-managed-fields` writes them (a List), or
    /// one PodSet per line; `-` reads standard input.
    #[arg(long)]
    pub from: PathBuf,

    #[command(flatten)]
    pub storage: StorageOptions,
}

pub async fn run(opts: RestoreOptions) -> anyhow::Result<()> {
    opts.storage.validate()?;
    if opts.storage.storage_backend == StorageBackend::Sled {
        std::fs::create_dir_all(&opts.storage.data_dir)
            .with_context(|| format!("creating --data-dir {}", opts.storage.data_dir.display()))?;
    }
    let input: Box<dyn Read + Send> = if opts.from.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(&opts.from).with_context(|| format!("opening {}", opts.from.display()))?)
    };
    // Written through the configured providers, as the server writes.
    let values = opts.storage.transformer(&super::start::SERVED)?.0;
    super::encryption::wait_for_providers(&values).await;
    let store = opts.storage.factory(values).open_group(podset::GROUP).await?;
    let registry: Registry = Registry::new(store.clone());
    anyhow::ensure!(
        registry.is_empty().await?,
        "the target store already holds PodSets: a restore goes into an empty store only"
    );
    let started = Instant::now();
    let (tx, rx) = mpsc::channel::<Value>(IN_FLIGHT);
    let reader = tokio::task::spawn_blocking(move || read_items(std::io::BufReader::new(input), tx));
    let writer = registry.clone();
    let mut writes = tokio_stream::wrappers::ReceiverStream::new(rx)
        .map(move |item| {
            let registry = writer.clone();
            async move {
                let name = format!(
                    "{}/{}",
                    item["metadata"]["namespace"].as_str().unwrap_or(""),
                    item["metadata"]["name"].as_str().unwrap_or("")
                );
                registry.restore(item).await.with_context(|| format!("restoring PodSet {name}"))
            }
        })
        .buffer_unordered(IN_FLIGHT);
    let mut restored = 0usize;
    let mut failed = None;
    while let Some(written) = writes.next().await {
        match written {
            Ok(_) => restored += 1,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    // Stop the reader (the channel closes) and take its error if it failed first.
    drop(writes);
    let read = reader.await.context("reading the backup").and_then(|r| r);
    if let Some(e) = failed.or(read.err()) {
        // Items are written as they are read, so an error may leave some stored.
        return Err(if registry.is_empty().await.unwrap_or(false) {
            e
        } else {
            e.context(format!(
                "PodSets read before this were written to {}: empty it before restoring again",
                opts.storage.location(podset::GROUP)
            ))
        });
    }
    registry.seal_restore().await?;
    tracing::info!(restored, seconds = started.elapsed().as_secs_f64(), "restore done");
    println!("restored {restored} PodSets in {:.1}s", started.elapsed().as_secs_f64());
    // Dropping the store commits what is pending (sled closes its database).
    drop(registry);
    tokio::task::spawn_blocking(move || drop(store)).await?;
    Ok(())
}

/// Sends each PodSet of the backup: the items of a List, or one object per line.
fn read_items(input: impl Read, tx: mpsc::Sender<Value>) -> anyhow::Result<()> {
    let mut de = serde_json::Deserializer::from_reader(input);
    let mut documents = 0;
    loop {
        match (Document { tx: &tx }).deserialize(&mut de) {
            Ok(()) => documents += 1,
            Err(e) => return Err(anyhow::anyhow!("reading the backup (after {documents} documents): {e}")),
        }
        // Another document follows only after whitespace (one object per line); the end is fine too.
        if de.end().is_ok() {
            return Ok(());
        }
    }
}

/// One JSON document: a List (its `items` are sent one by one, never held together) or a single object.
struct Document<'a> {
    tx: &'a mpsc::Sender<Value>,
}

impl<'de> DeserializeSeed<'de> for Document<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Document<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a List of PodSets or a PodSet")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        use serde::de::Error;
        let mut object = serde_json::Map::new();
        let mut listed = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "items" {
                map.next_value_seed(Items { tx: self.tx })?;
                listed = true;
            } else if listed {
                map.next_value::<IgnoredAny>()?;
            } else {
                object.insert(key, map.next_value()?);
            }
        }
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
        if listed || kind.ends_with("List") {
            return Ok(());
        }
        self.tx.blocking_send(Value::Object(object)).map_err(|_| A::Error::custom("the restore stopped"))
    }
}

struct Items<'a> {
    tx: &'a mpsc::Sender<Value>,
}

impl<'de> DeserializeSeed<'de> for Items<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Items<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of PodSets")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        use serde::de::Error;
        while let Some(item) = seq.next_element::<Value>()? {
            self.tx.blocking_send(item).map_err(|_| A::Error::custom("the restore stopped"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> anyhow::Result<Vec<Value>> {
        let (tx, mut rx) = mpsc::channel(100);
        read_items(text.as_bytes(), tx)?;
        let mut out = Vec::new();
        while let Ok(v) = rx.try_recv() {
            out.push(v);
        }
        Ok(out)
    }

    #[test]
    fn lists_and_lines_of_objects_are_read() {
        let list = r#"{"apiVersion":"v1","items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}],"kind":"List","metadata":{"resourceVersion":""}}"#;
        let names =
            |v: Vec<Value>| v.iter().map(|o| o["metadata"]["name"].as_str().unwrap().to_owned()).collect::<Vec<_>>();
        assert_eq!(names(read(list).unwrap()), ["a", "b"]);
        assert_eq!(
            names(
                read("{\"kind\":\"PodSet\",\"metadata\":{\"name\":\"a\"}}\n{\"metadata\":{\"name\":\"b\"}}\n").unwrap()
            ),
            ["a", "b"]
        );
        assert_eq!(read(r#"{"kind":"List","items":[]}"#).unwrap().len(), 0);
        assert!(read("").is_err(), "an empty file is not a backup");
        assert!(read(r#"{"kind":"List","items":[{"metadata":"#).is_err(), "a truncated backup fails");
        assert!(read("{\"metadata\":{\"name\":\"a\"}}\n{\"metadata\":").is_err(), "so does a truncated last line");
        assert!(read("[1,2]").is_err());
    }
}
