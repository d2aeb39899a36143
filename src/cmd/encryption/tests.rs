use super::*;
use crate::api::resource::WIDGETS;
use crate::resources::podset::INFO as PODSETS;

const KEY32: &str = "MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTI="; // 32 bytes
const JSON: &[u8] = br#"{"kind":"Widget"}"#;
const PODSET: &str = "/podsets/ns/web";
const WIDGET: &str = "/widgets/gear";

/// A configuration whose entries give `resources` an aescbc key `key` each.
fn text(entries: &[(&str, &str)]) -> String {
    let mut text = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n".to_owned();
    for (resources, key) in entries {
        text += &format!(
            "- resources: {resources}\n  providers:\n  - aescbc:\n      keys:\n      - name: {key}\n        secret: {KEY32}\n"
        );
    }
    text
}

fn table(entries: &[(&str, &str)]) -> ProviderTable {
    let config = EncryptionConfig::parse("enc.yaml", text(entries).into_bytes()).unwrap();
    providers(&config, &[&PODSETS, &WIDGETS], Timing::default()).unwrap()
}

/// Who writes `key`'s values: a provider's label, or `None` when they are stored plainly.
fn writer(values: &Transformer, key: &str) -> Option<String> {
    values.to_storage(key, JSON, key.as_bytes()).unwrap().1.map(|l| l.to_string())
}

#[test]
fn the_table_serves_each_resource_by_the_root_of_its_keys() {
    let values = Transformer::new(table(&[("[podsets.demo.k8s.io]", "p"), ("['*.test.podset.example']", "w")]));
    assert_eq!(writer(&values, PODSET).as_deref(), Some("k8s:enc:aescbc:v1:p:"));
    assert_eq!(writer(&values, WIDGET).as_deref(), Some("k8s:enc:aescbc:v1:w:"));

    let widgets_plain = table(&[("[podsets.demo.k8s.io]", "p")]);
    assert_eq!(widgets_plain.iter().map(|(root, _)| root).collect::<Vec<_>>(), ["/podsets/"]);
    assert_eq!(writer(&Transformer::new(widgets_plain), WIDGET), None);
    let podsets_plain = Transformer::new(table(&[("[widgets.test.podset.example]", "w")]));
    assert_eq!((writer(&podsets_plain, PODSET), writer(&podsets_plain, WIDGET).is_some()), (None, true));
    assert!(table(&[("[secrets]", "s")]).is_empty(), "names none of the served resources");
}

#[test]
fn a_reload_covers_what_the_file_leaves_out_with_identity() {
    let filled = or_identity(table(&[("[widgets.test.podset.example]", "w")]), &[&PODSETS, &WIDGETS]);
    let labels: Vec<_> = filled.iter().map(|(root, p)| (root, p.resource(), p.writer().label().to_string())).collect();
    assert_eq!(
        labels,
        [
            ("/widgets/", "widgets.test.podset.example", "k8s:enc:aescbc:v1:w:".to_owned()),
            ("/podsets/", "podsets.demo.k8s.io", "identity".to_owned()),
        ]
    );
}

#[test]
fn loading_a_changed_file_replaces_every_resources_providers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("enc.yaml");
    std::fs::write(&path, text(&[("[podsets.demo.k8s.io, widgets.test.podset.example]", "a")])).unwrap();
    let served = Served { resources: vec![&PODSETS, &WIDGETS], timing: Timing::default() };
    let values = Transformer::new(ProviderTable::new());
    load(&path, &values, &served).unwrap();
    assert_eq!(writer(&values, PODSET).as_deref(), Some("k8s:enc:aescbc:v1:a:"));
    assert_eq!(writer(&values, WIDGET).as_deref(), Some("k8s:enc:aescbc:v1:a:"));

    std::fs::write(&path, text(&[("['*.test.podset.example']", "b")])).unwrap();
    load(&path, &values, &served).unwrap();
    assert_eq!(writer(&values, WIDGET).as_deref(), Some("k8s:enc:aescbc:v1:b:"));
    assert_eq!(writer(&values, PODSET).as_deref(), Some("identity"), "left out now: plain, by identity");
    let a: std::sync::Arc<str> = "k8s:enc:aescbc:v1:a:".into();
    assert!(values.is_stale(PODSET, Some(&a)) && values.is_stale(WIDGET, Some(&a)), "both move off a");

    // A file that does not load changes nothing.
    std::fs::write(&path, "kind: Nope\n").unwrap();
    assert!(load(&path, &values, &served).is_err());
    assert_eq!(writer(&values, WIDGET).as_deref(), Some("k8s:enc:aescbc:v1:b:"));
}
