use super::*;

const KEY16: &str = "MTIzNDU2Nzg5MDEyMzQ1Ng=="; // 16 bytes
const KEY32: &str = "MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTI="; // 32 bytes

fn parse(text: &str) -> Result<EncryptionConfig, String> {
    EncryptionConfig::parse("/etc/enc.yaml", text.as_bytes().to_vec())
}

fn no_kms(_: &KmsConfiguration) -> Result<Provider, String> {
    Err("no KMS here".into())
}

fn labels(config: &EncryptionConfig) -> Option<Vec<String>> {
    let providers = config.providers_for("podsets", "demo.k8s.io", &no_kms).unwrap()?;
    Some(providers.iter().map(|p| p.label().to_string()).collect())
}

fn doc(resources: &str, providers: &str) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: {resources}\n  \
         providers:\n{providers}"
    )
}

#[test]
fn every_key_of_every_provider_reads_and_the_first_writes() {
    let providers = format!(
        "  - aesgcm:\n      keys:\n      - name: new\n        secret: {KEY16}\n      - name: old\n        secret: {KEY32}\n  \
         - secretbox:\n      keys:\n      - name: box\n        secret: {KEY32}\n  - identity: {{}}\n"
    );
    let config = parse(&doc("[podsets.demo.k8s.io]", &providers)).unwrap();
    assert_eq!(
        labels(&config).unwrap(),
        ["k8s:enc:aesgcm:v1:new:", "k8s:enc:aesgcm:v1:old:", "k8s:enc:secretbox:v1:box:", "identity"]
    );
}

#[test]
fn the_exact_name_wins_over_the_group_wildcard_and_that_over_every_resource() {
    let cbc = |name: &str| format!("  - aescbc:\n      keys:\n      - name: {name}\n        secret: {KEY32}\n");
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
         - resources: [podsets.demo.k8s.io]\n  providers:\n{}\
         - resources: ['*.demo.k8s.io']\n  providers:\n{}\
         - resources: ['*.*']\n  providers:\n{}",
        cbc("exact"),
        cbc("group"),
        cbc("all")
    );
    let config = parse(&text).unwrap();
    assert_eq!(labels(&config).unwrap(), ["k8s:enc:aescbc:v1:exact:"]);
    let other = config.providers_for("widgets", "demo.k8s.io", &no_kms).unwrap().unwrap();
    assert_eq!(&**other.writer().label(), "k8s:enc:aescbc:v1:group:");
    let none = parse(&doc("[secrets, configmaps]", "  - identity: {}\n")).unwrap();
    assert!(labels(&none).is_none(), "a resource the file leaves out is stored plainly");
}

#[test]
fn the_same_resource_in_two_entries_adds_their_providers_up() {
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
         - resources: [podsets.demo.k8s.io]\n  providers:\n  - aescbc:\n      keys:\n      - name: a\n        secret: {KEY32}\n\
         - resources: [podsets.demo.k8s.io]\n  providers:\n  - identity: {{}}\n"
    );
    assert_eq!(labels(&parse(&text).unwrap()).unwrap(), ["k8s:enc:aescbc:v1:a:", "identity"]);
}

#[test]
fn a_wildcard_before_a_resource_it_covers_is_refused() {
    let text = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
                - resources: ['*.*']\n  providers:\n  - identity: {}\n\
                - resources: [podsets.demo.k8s.io]\n  providers:\n  - identity: {}\n";
    assert_eq!(
        parse(text).unwrap_err(),
        "error while building transformers: resource \"podsets.demo.k8s.io\" is masked by earlier rule \"*.*\""
    );
}

#[test]
fn keys_are_checked_with_their_field_paths() {
    let bad = |providers: &str| parse(&doc("[podsets.demo.k8s.io]", providers)).unwrap_err();
    assert_eq!(
        bad("  - aescbc:\n      keys:\n      - name: k\n        secret: MTIzNDU2Nzg=\n"),
        "error while parsing file: resources[0].providers[0].aescbc.keys[0].secret: Invalid value: \"REDACTED\": \
         secret is not of the expected length, got 8, expected one of [16 24 32]"
    );
    assert_eq!(
        bad(&format!("  - secretbox:\n      keys:\n      - name: k\n        secret: {KEY16}\n")),
        "error while parsing file: resources[0].providers[0].secretbox.keys[0].secret: Invalid value: \"REDACTED\": \
         secret is not of the expected length, got 16, expected one of [32]"
    );
    assert_eq!(
        bad("  - aesgcm:\n      keys:\n      - secret: '%%%'\n"),
        "error while parsing file: [resources[0].providers[0].aesgcm.keys[0].name: Required value: name is a \
         mandatory field for a key, resources[0].providers[0].aesgcm.keys[0].secret: Invalid value: \"REDACTED\": \
         secrets must be base64 encoded]"
    );
    assert_eq!(
        bad("  - aescbc:\n      keys: []\n"),
        "error while parsing file: resources[0].providers[0].aescbc.keys: Required value: at least one keys is required"
    );
}

#[test]
fn a_provider_element_names_exactly_one_provider() {
    let bad = |providers: &str| parse(&doc("[podsets.demo.k8s.io]", providers)).unwrap_err();
    let two =
        bad(&format!("  - identity: {{}}\n    secretbox:\n      keys:\n      - name: k\n        secret: {KEY32}\n"));
    assert!(
        two.contains("resources[0].providers[0]: Invalid value: {secretbox,identity}: more than one provider"),
        "{two}"
    );
    let none = bad("  - {}\n");
    assert!(none.contains("provider does not contain any of the expected providers"), "{none}");
}

#[test]
fn resource_names_follow_kubes_rules() {
    let bad = |resources: &str| parse(&doc(resources, "  - identity: {}\n")).unwrap_err();
    assert!(bad("[PodSets.demo.k8s.io]").contains("resources[0].resources[0]: Invalid value: \"PodSets.demo.k8s.io\": resource name should not contain capital letters"));
    assert!(bad("['*']").contains("use '*.' to encrypt all the resources"));
    assert!(bad("['podsets.*']").contains("encrypting the same resource across groups is not supported"));
    assert!(bad("[podsets.demo.k8s.io, podsets.demo.k8s.io]").contains(
        "resources[0].resources: Invalid value: [\"podsets.demo.k8s.io\",\"podsets.demo.k8s.io\"]: the same resource cannot be specified multiple times"
    ));
    assert!(bad("['*.demo.k8s.io', podsets.demo.k8s.io]").contains("using overlapping resources"));
    assert!(
        bad("[]").contains("resources[0].resources: Required value: at least one resources[0].resources is required")
    );
}

#[test]
fn kms_providers_are_checked() {
    let bad = |kms: &str| parse(&doc("[podsets.demo.k8s.io]", &format!("  - kms:\n{kms}"))).unwrap_err();
    assert!(bad("      apiVersion: v2\n      name: a:b\n      endpoint: unix:///k.sock\n")
        .contains("resources[0].providers[0].kms.name: Invalid value: \"a:b\": invalid KMS provider name a:b, must not contain ':'"));
    assert!(bad("      apiVersion: v2\n      name: k\n      endpoint: tcp://k:1\n")
        .contains("unsupported scheme \"tcp\" for KMS provider, only unix is supported"));
    assert!(bad("      apiVersion: v3\n      name: k\n      endpoint: unix:///k.sock\n").contains(
        "resources[0].providers[0].kms.apiVersion: Invalid value: \"v3\": unsupported apiVersion apiVersion"
    ));
    assert!(bad("      apiVersion: v2\n      name: k\n      cachesize: 10\n      endpoint: unix:///k.sock\n")
        .contains("kms.cachesize: Invalid value: 10: cachesize is not supported in v2"));
    assert!(bad("      apiVersion: v2\n      name: k\n")
        .contains("kms.endpoint: Invalid value: \"\": endpoint is a mandatory field for a kms"));
    let v1 = parse(&doc("[podsets.demo.k8s.io]", "  - kms:\n      name: k\n      endpoint: unix:///k.sock\n")).unwrap();
    let refused = v1.providers_for("podsets", "demo.k8s.io", &no_kms).err().unwrap();
    assert!(refused.0.starts_with("error while building transformers: KMSv1 is deprecated"), "{refused}");
}

#[test]
fn the_file_itself_is_checked_as_kube_apiserver_checks_it() {
    assert!(parse("apiVersion: v1\nkind: Secret\n")
        .unwrap_err()
        .contains("no kind \"Secret\" is registered for version \"v1\""));
    assert!(parse("resources: []\n").unwrap_err().contains("Object 'Kind' is missing"));
    let typo = parse(&doc("[podsets.demo.k8s.io]", "  - identity: {}\n    aescbcc: {}\n")).unwrap_err();
    assert_eq!(
        typo,
        "error while parsing file: error decoding encryption provider configuration file \"/etc/enc.yaml\": strict \
         decoding error: unknown field \"resources[0].providers[0].aescbcc\""
    );
    let legacy = "kind: EncryptionConfig\napiVersion: v1\nresources:\n- resources: [podsets.demo.k8s.io]\n  providers:\n  - identity: {}\n";
    assert!(parse(legacy).is_ok(), "the legacy kind still reads");
    assert!(parse("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\n")
        .unwrap_err()
        .ends_with("resources: Required value: at least one resources is required"));
}

#[test]
fn a_missing_or_empty_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = EncryptionConfig::load(&dir.path().join("nope.yaml")).unwrap_err().0;
    assert!(
        missing.contains("error reading encryption provider configuration file") && missing.contains("nope.yaml"),
        "{missing}"
    );
    let empty = dir.path().join("empty.yaml");
    std::fs::write(&empty, "").unwrap();
    assert!(EncryptionConfig::load(&empty).unwrap_err().0.ends_with("empty.yaml\" is empty"));
}

mod resources {
    use super::*;
    use crate::api::resource::WIDGETS;
    use crate::resources::podset::INFO as PODSETS;

    fn cbc(name: &str) -> String {
        format!("  - aescbc:\n      keys:\n      - name: {name}\n        secret: {KEY32}\n")
    }

    /// A configuration of `entries`: (resources, providers).
    fn file(entries: &[(&str, String)]) -> EncryptionConfig {
        let mut text = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n".to_owned();
        for (resources, providers) in entries {
            text += &format!("- resources: {resources}\n  providers:\n{providers}");
        }
        parse(&text).unwrap()
    }

    /// Each served resource's provider labels, `None` for one the file leaves out.
    fn served(config: &EncryptionConfig) -> Vec<Option<Vec<String>>> {
        let each = config.providers_for_each(&[&PODSETS, &WIDGETS], &no_kms).unwrap();
        each.into_iter().map(|p| p.map(|p| p.iter().map(|p| p.label().to_string()).collect())).collect()
    }

    fn labels(names: &[&str]) -> Option<Vec<String>> {
        Some(names.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn each_served_resource_is_matched_on_its_own() {
        let config = file(&[("[podsets.demo.k8s.io]", cbc("p")), ("['*.test.podset.example']", cbc("w"))]);
        assert_eq!(served(&config), [labels(&["k8s:enc:aescbc:v1:p:"]), labels(&["k8s:enc:aescbc:v1:w:"])]);
        let widgets_only = file(&[("['*.test.podset.example']", cbc("w"))]);
        assert_eq!(served(&widgets_only), [None, labels(&["k8s:enc:aescbc:v1:w:"])]);
        let podsets_only = file(&[("[podsets.demo.k8s.io]", cbc("p"))]);
        assert_eq!(served(&podsets_only), [labels(&["k8s:enc:aescbc:v1:p:"]), None]);
        let everything = file(&[("['*.*']", cbc("all"))]);
        assert_eq!(served(&everything), [labels(&["k8s:enc:aescbc:v1:all:"]), labels(&["k8s:enc:aescbc:v1:all:"])]);
        // Metrics name each resource's providers by the resource.
        let each = everything.providers_for_each(&[&PODSETS, &WIDGETS], &no_kms).unwrap();
        assert_eq!(
            each.iter().flatten().map(|p| p.resource().to_owned()).collect::<Vec<_>>(),
            ["podsets.demo.k8s.io", "widgets.test.podset.example"]
        );
    }

    #[test]
    fn the_first_entry_naming_a_resource_writes_it_and_wildcards_take_the_rest() {
        let config = file(&[
            ("[podsets.demo.k8s.io, widgets.test.podset.example]", cbc("both")),
            ("[widgets.test.podset.example]", cbc("widgets")),
            ("['*.*']", "  - identity: {}\n".to_owned()),
        ]);
        assert_eq!(
            served(&config),
            [labels(&["k8s:enc:aescbc:v1:both:"]), labels(&["k8s:enc:aescbc:v1:both:", "k8s:enc:aescbc:v1:widgets:"])]
        );
        let group_first = file(&[("['*.test.podset.example']", cbc("group")), ("['*.*']", cbc("all"))]);
        assert_eq!(served(&group_first), [labels(&["k8s:enc:aescbc:v1:all:"]), labels(&["k8s:enc:aescbc:v1:group:"])]);
        assert_eq!(served(&file(&[("[secrets]", cbc("s"))])), [None, None]);
    }

    #[test]
    fn an_entry_serving_several_resources_builds_its_kms_provider_once() {
        let built = std::cell::Cell::new(0);
        let kms = |_: &KmsConfiguration| -> Result<Provider, String> {
            built.set(built.get() + 1);
            let plugin = crate::storage::value::Cbc::new(&[1; 32]).map_err(|e| e.to_string())?;
            Ok(Provider::new("k8s:enc:kms:v2:k:".into(), None, Box::new(plugin)))
        };
        let plugin = "  - kms:\n      apiVersion: v2\n      name: k\n      endpoint: unix:///k.sock\n";
        let config = file(&[("['*.*']", plugin.to_owned())]);
        let each = config.providers_for_each(&[&PODSETS, &WIDGETS], &kms).unwrap();
        assert_eq!((each.iter().flatten().count(), built.get()), (2, 1));
    }
}
