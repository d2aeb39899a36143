//! The layout the code keeps (docs/design.md): the server framework (`src/apiserver`, `src/registry`,
//! `src/storage`, `src/admission`) names no resource, and no source file outgrows a read. Each allowlist below is
//! what is left to move; it may only shrink, and a file that no longer needs its entry fails until it is taken off.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 800;

/// Files still over [`MAX_LINES`].
const LONG: &[&str] = &[];

/// Framework files that still name PodSet, its group or its versions.
const NAMING_PODSET: &[&str] = &[];

const FRAMEWORK: &[&str] = &["src/apiserver", "src/registry", "src/storage", "src/admission"];

/// Substrings that name PodSet, and identifiers (matched as whole words) of `crate::api` that stand for it.
const NAMES: &[&str] = &["PodSet", "podsets", "PODSET", "podset::", "demo.k8s.io"];
const WORDS: &[&str] =
    &["KIND", "LIST_KIND", "PLURAL", "SINGULAR", "GROUP", "GROUP_RESOURCE", "API_VERSION", "SHORT_NAMES"];
const VERSION_PATHS: &[&str] = &["api::Version", "Version::ALL", "Version::STORAGE", "Version::PREFERRED"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root()).unwrap().to_string_lossy().replace('\\', "/")
}

/// The file's code before its unit tests: a `#[cfg(test)]` module with a body ends it (one declared `mod x;` does
/// not, its file is checked on its own).
fn code(text: &str) -> &str {
    let mut from = 0;
    while let Some(i) = text[from..].find("\n#[cfg(test)]\n").map(|i| from + i) {
        let next = text[i + "\n#[cfg(test)]\n".len()..].lines().next().unwrap_or("");
        if next.contains("mod ") && next.contains('{') {
            return &text[..i];
        }
        from = i + 1;
    }
    text
}

fn has_word(line: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    line.match_indices(word).any(|(i, _)| {
        let before = line[..i].chars().next_back();
        let after = line[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

fn names_podset(code: &str) -> Option<String> {
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .find(|l| {
            NAMES.iter().any(|n| l.contains(n))
                || WORDS.iter().any(|w| has_word(l, w))
                || VERSION_PATHS.iter().any(|p| l.contains(p))
                || (l.contains("crate::api::") && has_word(l, "Version"))
        })
        .map(str::to_owned)
}

fn check(found: BTreeSet<String>, allowed: &[&str], what: &str) {
    let allowed: BTreeSet<String> = allowed.iter().map(|s| s.to_string()).collect();
    let new: Vec<_> = found.difference(&allowed).collect();
    let gone: Vec<_> = allowed.difference(&found).collect();
    assert!(new.is_empty(), "{what}, not on the allowlist: {new:?}");
    assert!(gone.is_empty(), "{what} no more: take them off the allowlist: {gone:?}");
}

#[test]
fn no_source_file_is_over_800_lines() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let long = files
        .iter()
        .filter(|f| std::fs::read_to_string(f).unwrap().lines().count() > MAX_LINES)
        .map(|f| relative(f))
        .collect();
    check(long, LONG, "files over 800 lines");
}

#[test]
fn the_framework_names_no_resource() {
    let mut files = Vec::new();
    for dir in FRAMEWORK {
        rust_files(&root().join(dir), &mut files);
    }
    let mut found = BTreeSet::new();
    for f in files.iter().filter(|f| !f.ends_with("tests.rs")) {
        let text = std::fs::read_to_string(f).unwrap();
        if let Some(line) = names_podset(code(&text)) {
            eprintln!("{}: {}", relative(f), line.trim());
            found.insert(relative(f));
        }
    }
    check(found, NAMING_PODSET, "framework files naming PodSet");
}

#[test]
fn the_checks_see_what_they_look_for() {
    assert!(names_podset("use crate::api::{GROUP, KIND};").is_some());
    assert!(names_podset("let k = PodSetKey::new(ns, name);").is_some());
    assert!(names_podset("target: \"podset_apiserver::http\"").is_none());
    assert!(names_podset("use crate::api::{UserInfo, Version};").is_some());
    assert!(names_podset("use http::Version;").is_none());
    assert!(names_podset("// a PodSet in a comment\nlet kind = KINDS;").is_none());
    assert_eq!(code("fn a() {}\n#[cfg(test)]\nmod tests { PodSet }"), "fn a() {}");
    assert_eq!(code("a\n#[cfg(test)]\nmod kind;\nfn b() {}"), "a\n#[cfg(test)]\nmod kind;\nfn b() {}");
    assert_eq!(code("a\n#[cfg(test)]\npub(crate) mod testing {\n}"), "a");
}
