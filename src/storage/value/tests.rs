use super::aes::{Cbc, Gcm};
use super::*;

fn cbc(name: &str, byte: u8) -> Provider {
    Provider::new("k8s:enc:aescbc:v1:".into(), Some(format!("{name}:")), Box::new(Cbc::new(&[byte; 32]).unwrap()))
}

fn gcm(name: &str, byte: u8) -> Provider {
    Provider::new("k8s:enc:aesgcm:v1:".into(), Some(format!("{name}:")), Box::new(Gcm::new(&[byte; 16]).unwrap()))
}

fn transformer(list: Vec<Provider>) -> Transformer {
    Transformer::new(Providers::new("widgets.example.com", list))
}

const JSON: &[u8] = br#"{"kind":"Widget","spec":{"secret":"hunter2"}}"#;

#[test]
fn the_first_provider_writes_with_its_prefix_and_every_provider_reads() {
    let t = transformer(vec![cbc("new", 1), cbc("old", 2), Provider::identity()]);
    let (stored, by) = t.to_storage(JSON, b"/widgets/a/b").unwrap();
    assert!(stored.starts_with(b"k8s:enc:aescbc:v1:new:"));
    assert!(!stored.windows(7).any(|w| w == b"hunter2"));
    assert_eq!(by.as_deref(), Some("k8s:enc:aescbc:v1:new:"));
    let read = t.from_storage(&stored, b"/widgets/a/b").unwrap();
    assert_eq!(read.bytes, JSON);
    assert!(!t.is_stale(read.provider.as_ref()));

    // Written by the old key, or before encryption: readable, and stale until written again.
    let old = transformer(vec![cbc("old", 2)]).to_storage(JSON, b"/widgets/a/b").unwrap().0;
    let read = t.from_storage(&old, b"/widgets/a/b").unwrap();
    assert_eq!((read.bytes.as_slice(), read.provider.as_deref()), (JSON, Some("k8s:enc:aescbc:v1:old:")));
    assert!(t.is_stale(read.provider.as_ref()));
    let plain = t.from_storage(JSON, b"/widgets/a/b").unwrap();
    assert_eq!(plain.provider.as_deref(), Some("identity"));
    assert!(t.is_stale(plain.provider.as_ref()));
}

#[test]
fn a_value_no_provider_reads_is_an_error_naming_its_prefix() {
    let t = transformer(vec![cbc("new", 1), Provider::identity()]);
    let foreign = transformer(vec![gcm("gone", 3)]).to_storage(JSON, b"/k").unwrap().0;
    let err = t.from_storage(&foreign, b"/k").unwrap_err();
    assert_eq!(err.to_string(), r#"no matching prefix found (the value starts "k8s:enc:aesgcm:v1:gone:")"#);
    // Same key name, other secret: the one provider with that prefix says why.
    let wrong = transformer(vec![gcm("new", 4)]);
    let stored = transformer(vec![gcm("new", 5)]).to_storage(JSON, b"/k").unwrap().0;
    assert_eq!(wrong.from_storage(&stored, b"/k").unwrap_err().to_string(), "cipher: message authentication failed");
    // Without identity, plain JSON does not read either.
    assert!(transformer(vec![cbc("new", 1)]).from_storage(JSON, b"/k").is_err());
}

#[test]
fn identity_first_writes_plainly_and_still_reads_encrypted_values() {
    let t = transformer(vec![Provider::identity(), cbc("k", 1)]);
    let (stored, by) = t.to_storage(JSON, b"/k").unwrap();
    assert_eq!((stored.as_slice(), by.as_deref()), (JSON, Some("identity")));
    let sealed = transformer(vec![cbc("k", 1)]).to_storage(JSON, b"/k").unwrap().0;
    let read = t.from_storage(&sealed, b"/k").unwrap();
    assert_eq!(read.bytes, JSON);
    assert!(t.is_stale(read.provider.as_ref()), "decrypting means rewriting in the clear");
}

#[test]
fn a_plain_store_refuses_encrypted_values_rather_than_serving_ciphertext() {
    assert!(matches!(Transformer::plain().read(JSON, b"/k"), Ok(Read::AsStored(b)) if b == JSON));
    let sealed = transformer(vec![cbc("k", 1)]).to_storage(JSON, b"/k").unwrap().0;
    let err = Transformer::plain().from_storage(&sealed, b"/k").unwrap_err().to_string();
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
    let a = t.to_storage(JSON, b"/k").unwrap();
    t.replace(Providers::new("widgets.example.com", vec![cbc("b", 2), cbc("a", 1)]));
    let b = t.to_storage(JSON, b"/k").unwrap();
    assert!(b.0.starts_with(b"k8s:enc:aescbc:v1:b:"));
    assert!(t.is_stale(a.1.as_ref()) && !t.is_stale(b.1.as_ref()));
    assert_eq!(t.from_storage(&a.0, b"/k").unwrap().bytes, JSON);
}

#[test]
fn transformations_are_counted_as_kube_apiserver_counts_them() {
    let t = transformer(vec![cbc("metered", 7)]);
    let stored = t.to_storage(JSON, b"/k").unwrap().0;
    t.from_storage(&stored, b"/k").unwrap();
    t.from_storage(b"k8s:enc:secretbox:v1:x:abc", b"/k").unwrap_err();
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
