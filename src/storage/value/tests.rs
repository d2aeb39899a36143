use super::aes::{Cbc, Gcm};
use super::*;

fn cbc(name: &str, byte: u8) -> Provider {
    Provider::new("k8s:enc:aescbc:v1:".into(), Some(format!("{name}:")), Box::new(Cbc::new(&[byte; 32]).unwrap()))
}

fn gcm(name: &str, byte: u8) -> Provider {
    Provider::new("k8s:enc:aesgcm:v1:".into(), Some(format!("{name}:")), Box::new(Gcm::new(&[byte; 16]).unwrap()))
}

fn widgets(list: Vec<Provider>) -> Providers {
    Providers::new("widgets.example.com", list)
}

/// A store of one resource, `/widgets/`, with `list` its providers.
fn transformer(list: Vec<Provider>) -> Transformer {
    Transformer::new(ProviderTable::new().with("/widgets/", widgets(list)))
}

const JSON: &[u8] = br#"{"kind":"Widget","spec":{"secret":"hunter2"}}"#;

#[test]
fn the_first_provider_writes_with_its_prefix_and_every_provider_reads() {
    let t = transformer(vec![cbc("new", 1), cbc("old", 2), Provider::identity()]);
    let (stored, by) = t.to_storage("/widgets/a/b", JSON, b"/widgets/a/b").unwrap();
    assert!(stored.starts_with(b"k8s:enc:aescbc:v1:new:"));
    assert!(!stored.windows(7).any(|w| w == b"hunter2"));
    assert_eq!(by.as_deref(), Some("k8s:enc:aescbc:v1:new:"));
    let read = t.from_storage("/widgets/a/b", &stored, b"/widgets/a/b").unwrap();
    assert_eq!(read.bytes, JSON);
    assert!(!t.is_stale("/widgets/a/b", read.provider.as_ref()));

    // Written by the old key, or before encryption: readable, and stale until written again.
    let old = transformer(vec![cbc("old", 2)]).to_storage("/widgets/a/b", JSON, b"/widgets/a/b").unwrap().0;
    let read = t.from_storage("/widgets/a/b", &old, b"/widgets/a/b").unwrap();
    assert_eq!((read.bytes.as_slice(), read.provider.as_deref()), (JSON, Some("k8s:enc:aescbc:v1:old:")));
    assert!(t.is_stale("/widgets/a/b", read.provider.as_ref()));
    let plain = t.from_storage("/widgets/a/b", JSON, b"/widgets/a/b").unwrap();
    assert_eq!(plain.provider.as_deref(), Some("identity"));
    assert!(t.is_stale("/widgets/a/b", plain.provider.as_ref()));
}

#[test]
fn a_value_no_provider_reads_is_an_error_naming_its_prefix() {
    let t = transformer(vec![cbc("new", 1), Provider::identity()]);
    let foreign = transformer(vec![gcm("gone", 3)]).to_storage("/widgets/k", JSON, b"/k").unwrap().0;
    let err = t.from_storage("/widgets/k", &foreign, b"/k").unwrap_err();
    assert_eq!(err.to_string(), r#"no matching prefix found (the value starts "k8s:enc:aesgcm:v1:gone:")"#);
    // Same key name, other secret: the one provider with that prefix says why.
    let wrong = transformer(vec![gcm("new", 4)]);
    let stored = transformer(vec![gcm("new", 5)]).to_storage("/widgets/k", JSON, b"/k").unwrap().0;
    assert_eq!(
        wrong.from_storage("/widgets/k", &stored, b"/k").unwrap_err().to_string(),
        "cipher: message authentication failed"
    );
    // Without identity, plain JSON does not read either.
    assert!(transformer(vec![cbc("new", 1)]).from_storage("/widgets/k", JSON, b"/k").is_err());
}

#[test]
fn identity_first_writes_plainly_and_still_reads_encrypted_values() {
    let t = transformer(vec![Provider::identity(), cbc("k", 1)]);
    let (stored, by) = t.to_storage("/widgets/k", JSON, b"/k").unwrap();
    assert_eq!((stored.as_slice(), by.as_deref()), (JSON, Some("identity")));
    let sealed = transformer(vec![cbc("k", 1)]).to_storage("/widgets/k", JSON, b"/k").unwrap().0;
    let read = t.from_storage("/widgets/k", &sealed, b"/k").unwrap();
    assert_eq!(read.bytes, JSON);
    assert!(t.is_stale("/widgets/k", read.provider.as_ref()), "decrypting means rewriting in the clear");
}

#[test]
fn a_plain_store_refuses_encrypted_values_rather_than_serving_ciphertext() {
    assert!(matches!(Transformer::plain().read("/widgets/k", JSON, b"/k"), Ok(Read::AsStored(b)) if b == JSON));
    let sealed = transformer(vec![cbc("k", 1)]).to_storage("/widgets/k", JSON, b"/k").unwrap().0;
    let err = Transformer::plain().from_storage("/widgets/k", &sealed, b"/k").unwrap_err().to_string();
    assert!(
        err.starts_with(
            r#"identity transformer tried to read encrypted data (the value starts "k8s:enc:aescbc:v1:k:""#
        ),
        "{err}"
    );
}

#[test]
fn replacing_the_providers_changes_the_writer_and_what_is_stale() {
    let t = transformer(vec![cbc("a", 1)]);
    let a = t.to_storage("/widgets/k", JSON, b"/k").unwrap();
    t.replace(ProviderTable::new().with("/widgets/", widgets(vec![cbc("b", 2), cbc("a", 1)])));
    let b = t.to_storage("/widgets/k", JSON, b"/k").unwrap();
    assert!(b.0.starts_with(b"k8s:enc:aescbc:v1:b:"));
    assert!(t.is_stale("/widgets/k", a.1.as_ref()) && !t.is_stale("/widgets/k", b.1.as_ref()));
    assert_eq!(t.from_storage("/widgets/k", &a.0, b"/k").unwrap().bytes, JSON);
}

#[test]
fn transformations_are_counted_as_kube_apiserver_counts_them() {
    let t = transformer(vec![cbc("metered", 7)]);
    let stored = t.to_storage("/widgets/k", JSON, b"/k").unwrap().0;
    t.from_storage("/widgets/k", &stored, b"/k").unwrap();
    t.from_storage("/widgets/k", b"k8s:enc:secretbox:v1:x:abc", b"/k").unwrap_err();
    let text = crate::metrics::encode();
    for line in [
        r#"apiserver_storage_transformation_operations_total{resource="widgets.example.com",transformation_type="to_storage",transformer_prefix="metered:",status="OK"}"#,
        r#"apiserver_storage_transformation_operations_total{resource="widgets.example.com",transformation_type="from_storage",transformer_prefix="k8s:enc:aescbc:v1:",status="OK"}"#,
        r#"apiserver_storage_transformation_operations_total{resource="widgets.example.com",transformation_type="from_storage",transformer_prefix="unknown",status="unknown-non-grpc"}"#,
        r#"apiserver_storage_transformation_duration_seconds_count{transformation_type="from_storage",transformer_prefix="metered:"}"#,
    ] {
        assert!(text.contains(line), "{line} missing");
    }
}

use crate::api::resource::WIDGETS;
use crate::resources::podset::INFO as PODSETS;

const PODSET: &str = "/podsets/ns/web";
const WIDGET: &str = "/widgets/gear";

/// `resource`'s providers, labelled with its name.
fn of(resource: &crate::api::resource::ResourceInfo, list: Vec<Provider>) -> Providers {
    Providers::new(&resource.to_string(), list)
}

/// What `t` stores for `key`, and whether a plain store reads that back unchanged.
fn stored_plainly(t: &Transformer, key: &str) -> bool {
    let (stored, by) = t.to_storage(key, JSON, key.as_bytes()).unwrap();
    let read = t.from_storage(key, &stored, key.as_bytes()).unwrap();
    assert_eq!(read.bytes, JSON, "{key} reads back");
    let plain = stored == JSON;
    assert_eq!(plain, by.is_none() && read.provider.is_none(), "{key}: a plain value has no provider");
    plain
}

#[test]
fn each_resource_of_a_store_is_encrypted_by_its_own_providers() {
    let podsets_only = Transformer::new(ProviderTable::new().with(PODSETS.key_root, of(&PODSETS, vec![cbc("p", 1)])));
    assert!(!stored_plainly(&podsets_only, PODSET));
    assert!(stored_plainly(&podsets_only, WIDGET), "a resource the table leaves out is stored as it is");
    let sealed = podsets_only.to_storage(PODSET, JSON, PODSET.as_bytes()).unwrap().0;
    assert!(sealed.starts_with(b"k8s:enc:aescbc:v1:p:"));
    // An encrypted value under a plain resource is refused, not served as JSON: as a plain store refuses it.
    let err = podsets_only.from_storage(WIDGET, &sealed, WIDGET.as_bytes()).unwrap_err().to_string();
    assert!(err.starts_with("identity transformer tried to read encrypted data"), "{err}");
    assert!(matches!(podsets_only.read(WIDGET, JSON, b"/w"), Ok(Read::AsStored(b)) if b == JSON), "not copied");

    // The reverse: widgets encrypted, podsets plain.
    let widgets_only = Transformer::new(ProviderTable::new().with(WIDGETS.key_root, of(&WIDGETS, vec![gcm("w", 2)])));
    assert!(stored_plainly(&widgets_only, PODSET));
    let (sealed, by) = widgets_only.to_storage(WIDGET, JSON, WIDGET.as_bytes()).unwrap();
    assert_eq!(by.as_deref(), Some("k8s:enc:aesgcm:v1:w:"));
    assert!(widgets_only.from_storage(PODSET, &sealed, WIDGET.as_bytes()).is_err(), "not podsets' providers");

    // Both, each with its own key: neither reads the other's value.
    let both = Transformer::new(
        ProviderTable::new()
            .with(PODSETS.key_root, of(&PODSETS, vec![cbc("p", 1)]))
            .with(WIDGETS.key_root, of(&WIDGETS, vec![cbc("w", 2)])),
    );
    let podset = both.to_storage(PODSET, JSON, b"/x").unwrap();
    let widget = both.to_storage(WIDGET, JSON, b"/x").unwrap();
    assert_eq!(
        (podset.1.as_deref(), widget.1.as_deref()),
        (Some("k8s:enc:aescbc:v1:p:"), Some("k8s:enc:aescbc:v1:w:"))
    );
    assert!(both.from_storage(WIDGET, &podset.0, b"/x").is_err());
    assert_eq!(both.from_storage(PODSET, &podset.0, b"/x").unwrap().bytes, JSON);
}

#[test]
fn a_value_is_stale_when_its_own_resources_writer_did_not_write_it() {
    let t = Transformer::new(
        ProviderTable::new()
            .with(PODSETS.key_root, of(&PODSETS, vec![cbc("p", 1), cbc("old", 3)]))
            .with(WIDGETS.key_root, of(&WIDGETS, vec![cbc("w", 2), cbc("p", 1)])),
    );
    let p: Arc<str> = "k8s:enc:aescbc:v1:p:".into();
    let w: Arc<str> = "k8s:enc:aescbc:v1:w:".into();
    assert!(!t.is_stale(PODSET, Some(&p)) && t.is_stale(PODSET, Some(&w)));
    assert!(!t.is_stale(WIDGET, Some(&w)) && t.is_stale(WIDGET, Some(&p)), "p reads widgets, but w writes them");
    assert!(!t.is_stale("/gadgets/x", None), "a plain resource's plain value");
    assert!(!Transformer::plain().is_stale(PODSET, Some(&p)));

    // A reload that leaves widgets out stores them plainly: what a provider wrote moves out of it.
    t.replace(ProviderTable::new().with(PODSETS.key_root, of(&PODSETS, vec![cbc("p", 1)])));
    assert!(t.is_stale(WIDGET, Some(&w)));
    assert!(!t.is_stale(WIDGET, Some(&"identity".into())) && !t.is_stale(WIDGET, None));
}

#[test]
fn a_reload_replaces_every_resources_providers_at_once() {
    let t = Transformer::new(
        ProviderTable::new()
            .with(PODSETS.key_root, of(&PODSETS, vec![cbc("a", 1)]))
            .with(WIDGETS.key_root, of(&WIDGETS, vec![cbc("a", 1)])),
    );
    let before = t.to_storage(WIDGET, JSON, b"/x").unwrap().0;
    let seen = t.clone();
    t.replace(ProviderTable::new().with(PODSETS.key_root, of(&PODSETS, vec![cbc("b", 2), cbc("a", 1)])));
    // Every clone (each backend holds one) sees the new table: podsets written by b, widgets now plain.
    assert!(seen.to_storage(PODSET, JSON, b"/x").unwrap().0.starts_with(b"k8s:enc:aescbc:v1:b:"));
    assert!(stored_plainly(&seen, WIDGET));
    assert!(seen.from_storage(WIDGET, &before, b"/x").is_err(), "the old table is gone whole, a's key with it");
    assert!(format!("{seen:?}").contains("/podsets/ with k8s:enc:aescbc:v1:b:"), "{seen:?}");
}

/// A transformation that stands for a KMS plugin: probed, and ready or not.
struct Plugin(bool);

impl Transform for Plugin {
    fn transform_from_storage(&self, data: &[u8], _: &[u8]) -> Result<Vec<u8>, ValueError> {
        Ok(data.to_vec())
    }
    fn transform_to_storage(&self, data: &[u8], _: &[u8]) -> Result<Vec<u8>, ValueError> {
        Ok(data.to_vec())
    }
    fn healthz(&self) -> Option<futures::future::BoxFuture<'static, Result<(), String>>> {
        Some(Box::pin(std::future::ready(Ok(()))))
    }
    fn ready(&self) -> bool {
        self.0
    }
}

fn kms(name: &str, ready: bool) -> Provider {
    Provider::new(format!("k8s:enc:kms:v2:{name}:"), None, Box::new(Plugin(ready)))
}

#[test]
fn every_resources_kms_plugins_are_probed_once_and_waited_for() {
    // One plugin shared by both resources (one configuration entry names both), and one of widgets' own.
    let shared = kms("shared", true);
    let t = Transformer::new(
        ProviderTable::new()
            .with(PODSETS.key_root, of(&PODSETS, vec![shared.clone(), cbc("p", 1)]))
            .with(WIDGETS.key_root, of(&WIDGETS, vec![shared, kms("own", false)])),
    );
    let names: Vec<String> = t.kms_probes().into_iter().map(|(name, _)| name).collect();
    assert_eq!(names, ["kms-provider-0", "kms-provider-1"]);
    assert!(!t.ready(), "widgets' own plugin has not answered");
    t.replace(ProviderTable::new().with(WIDGETS.key_root, of(&WIDGETS, vec![kms("own", true)])));
    assert!(t.ready());
    assert_eq!(t.kms_probes().len(), 1);
    assert!(Transformer::plain().ready() && Transformer::plain().kms_probes().is_empty());
}
