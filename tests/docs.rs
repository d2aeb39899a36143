//! The documentation that is made from the program: `docs/flags.md` is `podset-apiserver --help` (and each
//! subcommand's) as tables, so it cannot go stale. A flag added without a description, or a change of a flag that
//! `docs/flags.md` does not have yet, fails here; `hack/update-docs.sh` writes the file again.

mod common;

use std::process::Command;

/// One flag as `--help` describes it.
#[derive(Default)]
struct Flag {
    name: String,
    value: String,
    description: Vec<String>,
    env: String,
    default: String,
    possible: Vec<String>,
}

/// `--help`'s sections (heading, flags), in order.
fn parse(help: &str) -> Vec<(String, Vec<Flag>)> {
    let mut sections: Vec<(String, Vec<Flag>)> = Vec::new();
    let mut in_possible = false;
    for line in help.lines() {
        let trimmed = line.trim();
        if !line.starts_with(' ') && line.ends_with(':') && !line.starts_with("Usage") {
            sections.push((line.trim_end_matches(':').to_owned(), Vec::new()));
            continue;
        }
        let Some((_, flags)) = sections.last_mut() else { continue };
        if line.starts_with("  ") && !line.starts_with("          ") && trimmed.starts_with('-') {
            let spec = trimmed.split_once(", ").map(|(_, long)| long).unwrap_or(trimmed);
            let (name, value) = spec.split_once(' ').unwrap_or((spec, ""));
            flags.push(Flag { name: name.to_owned(), value: value.to_owned(), ..Default::default() });
            in_possible = false;
            continue;
        }
        let Some(flag) = flags.last_mut() else { continue };
        if trimmed.is_empty() {
            continue;
        } else if let Some(env) = trimmed.strip_prefix("[env: ").and_then(|e| e.strip_suffix("=]")) {
            flag.env = env.to_owned();
        } else if let Some(d) = trimmed.strip_prefix("[default: ").and_then(|d| d.strip_suffix(']')) {
            flag.default = d.to_owned();
        } else if let Some(p) = trimmed.strip_prefix("[possible values: ").and_then(|p| p.strip_suffix(']')) {
            flag.possible.push(p.to_owned());
        } else if trimmed == "Possible values:" {
            in_possible = true;
        } else if in_possible && trimmed.starts_with("- ") {
            flag.possible.push(trimmed[2..].to_owned());
        } else {
            // Short help puts `[default: …]` and `[env: …=]` at the end of the description's line.
            let mut text = trimmed;
            loop {
                if let Some((rest, d)) = text.rsplit_once(" [default: ").filter(|(_, d)| d.ends_with(']')) {
                    flag.default = d.trim_end_matches(']').to_owned();
                    text = rest;
                } else if let Some((rest, e)) = text.rsplit_once(" [env: ").filter(|(_, e)| e.ends_with("=]")) {
                    flag.env = e.trim_end_matches("=]").to_owned();
                    text = rest;
                } else {
                    break;
                }
            }
            flag.description.push(text.to_owned());
        }
    }
    sections
}

fn help(args: &[&str]) -> String {
    let out = Command::new(common::BIN).args(args).arg("--help").env("COLUMNS", "10000").output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// Text for a table cell: `|` escaped, and outside code spans `<` and `>` (which markdown takes for HTML).
fn cell(s: &str) -> String {
    let mut out = String::new();
    for (i, part) in s.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        let part = part.replace('|', "\\|");
        out.push_str(&if i % 2 == 1 { part } else { part.replace('<', "&lt;").replace('>', "&gt;") });
    }
    out
}

/// The markdown of `docs/flags.md`.
fn render() -> (String, Vec<String>) {
    let mut out = String::from(
        "# Flags\n\nGenerated from `podset-apiserver --help` by `hack/update-docs.sh`; `tests/docs.rs` fails when \
         this file and the program disagree. Flags named as kube-apiserver's and k8s.io/apiserver's mean what \
         theirs mean. Every flag with an `env` can also be set by that environment variable.\n",
    );
    let mut undocumented = Vec::new();
    // The server, then each subcommand the program has (a new one is documented without being listed here).
    let subcommands: Vec<String> = <podset_apiserver::cmd::Options as clap::CommandFactory>::command()
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .filter(|name| name != "help")
        .collect();
    let commands = std::iter::once(None).chain(subcommands.iter().map(Some));
    for sub in commands {
        let command = sub.map_or("podset-apiserver".to_owned(), |s| format!("podset-apiserver {s}"));
        let args: Vec<&str> = sub.iter().map(|s| s.as_str()).collect();
        let text = help(&args);
        let about = text.lines().next().unwrap_or_default();
        out.push_str(&format!("\n## `{command}`\n\n{}\n", cell(about)));
        for (heading, flags) in parse(&text) {
            let flags: Vec<&Flag> = flags.iter().filter(|f| f.name != "--help" && f.name != "--version").collect();
            if flags.is_empty() {
                continue;
            }
            out.push_str(&format!(
                "\n### {heading}\n\n| Flag | Default | Environment | Description |\n|---|---|---|---|\n"
            ));
            for f in flags {
                if f.description.is_empty() {
                    undocumented.push(format!("{command} {}", f.name));
                }
                let mut description = f.description.join(" ");
                if !f.possible.is_empty() {
                    description.push_str(&format!(" Possible values: {}.", f.possible.join("; ")));
                }
                let flag =
                    if f.value.is_empty() { format!("`{}`", f.name) } else { format!("`{} {}`", f.name, f.value) };
                let code = |s: &str| if s.is_empty() { String::new() } else { format!("`{s}`") };
                out.push_str(&format!(
                    "| {} | {} | {} | {} |\n",
                    cell(&flag),
                    cell(&code(&f.default)),
                    cell(&code(&f.env)),
                    cell(&description)
                ));
            }
        }
    }
    (out, undocumented)
}

#[test]
fn the_flags_reference_is_the_programs_own_help() {
    let (rendered, undocumented) = render();
    assert!(undocumented.is_empty(), "flags without a description (add a doc comment): {undocumented:?}");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/flags.md");
    if std::env::var_os("PODSET_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &rendered).unwrap();
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    if written != rendered {
        let first = written.lines().zip(rendered.lines()).position(|(a, b)| a != b);
        panic!(
            "docs/flags.md is not what `podset-apiserver --help` says (first difference at line {}); run \
             hack/update-docs.sh and commit the result",
            first.map(|l| l + 1).unwrap_or(written.lines().count().min(rendered.lines().count()) + 1)
        );
    }
    // And the parse saw what it should: a flag of each section, with its default and environment variable.
    assert!(rendered.contains("| `--secure-port <SECURE_PORT>` | `8443` | `PODSET_SECURE_PORT` |"), "{rendered}");
    assert!(rendered.contains("### Storage"));
    assert!(rendered.contains("`--from <FROM>`"));
}

/// GitHub's anchor for a heading: lowercase, punctuation dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The documents an admin reads, by path from the repository's root, and the repository's other files the checks
/// look up (so a check is a function of this alone, and a planted mismatch is a changed copy).
#[derive(Clone)]
struct Docs {
    files: std::collections::BTreeMap<String, String>,
    /// Paths that exist in the repository (files and directories).
    paths: std::collections::BTreeSet<String>,
    /// Commits (full hashes) of the repository, and whether any tag is a release (`v*`).
    commits: Vec<String>,
    released: bool,
}

const READ: [&str; 4] = ["README.md", "CHANGELOG.md", "SECURITY.md", "CONTRIBUTING.md"];

fn load() -> Docs {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).current_dir(root).output().expect("git (the docs name commits)");
        assert!(out.status.success(), "git {args:?}: the docs check needs the repository's history");
        String::from_utf8(out.stdout).unwrap()
    };
    let mut files = std::collections::BTreeMap::new();
    let mut names: Vec<String> = READ.iter().map(|s| s.to_string()).collect();
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        names.push(format!("docs/{}", entry.unwrap().file_name().to_string_lossy()));
    }
    names.extend(
        [
            "deploy/monitoring/alerts.yaml",
            "deploy/base/statefulset.yaml",
            ".ci/run",
            "tests/fixtures/v1alpha1-release/README.md",
        ]
        .map(String::from),
    );
    for name in names {
        files.insert(name.clone(), std::fs::read_to_string(root.join(&name)).unwrap());
    }
    let listed = git(&["ls-files", "--cached", "--others", "--exclude-standard"]);
    let mut paths = std::collections::BTreeSet::new();
    for file in listed.lines() {
        let mut p = std::path::Path::new(file);
        paths.insert(file.to_owned());
        while let Some(parent) = p.parent().filter(|p| !p.as_os_str().is_empty()) {
            paths.insert(parent.to_string_lossy().into_owned());
            p = parent;
        }
    }
    let commits = git(&["rev-list", "--all"]).lines().map(String::from).collect();
    let released = git(&["tag", "--list", "v*"]).lines().any(|l| !l.is_empty());
    Docs { files, paths, commits, released }
}

/// The headings of a Markdown text as GitHub anchors them: outside code blocks, a repeated one with `-1`, `-2`.
fn anchors(text: &str) -> Vec<String> {
    let (mut out, mut fenced) = (Vec::<String>::new(), false);
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let base = slug(line.trim_start_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 { base } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// Every relative link leads to a file of the repository, and its `#anchor` to a heading there.
fn check_links(docs: &Docs) -> Vec<String> {
    let mut broken = Vec::new();
    for (name, text) in docs.files.iter().filter(|(n, _)| n.ends_with(".md")) {
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.starts_with("http") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let dir = std::path::Path::new(name).parent().unwrap();
            let path = if file.is_empty() { name.clone() } else { normalize(&dir.join(file)) };
            if !docs.paths.contains(path.trim_end_matches('/')) {
                broken.push(format!("{name}: {target}: no such file"));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            let body = match docs.files.get(&path) {
                Some(b) => b.clone(),
                None => std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(&path))
                    .unwrap_or_default(),
            };
            if !anchors(&body).iter().any(|a| a == anchor) {
                broken.push(format!("{name}: {target}: no heading #{anchor}"));
            }
        }
    }
    broken
}

/// `a/b/../c` as `a/c`.
fn normalize(path: &std::path::Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => drop(parts.pop()),
            std::path::Component::CurDir => {}
            c => parts.push(c.as_os_str().to_string_lossy().into_owned()),
        }
    }
    parts.join("/")
}

/// Words that look like abbreviated commits: 7 to 40 hex digits, with a digit and a letter.
fn hashes(text: &str) -> Vec<&str> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| (7..=40).contains(&w.len()) && w.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()))
        .filter(|w| w.chars().any(|c| c.is_ascii_digit()) && w.chars().any(|c| c.is_ascii_alphabetic()))
        .collect()
}

/// Every commit the documents name exists, and every one the README names is one the docs name too (the README
/// sums up; it introduces nothing).
fn check_commits(docs: &Docs) -> Vec<String> {
    let mut wrong = Vec::new();
    for (name, text) in &docs.files {
        for h in hashes(text) {
            if !docs.commits.iter().any(|c| c.starts_with(h)) {
                wrong.push(format!("{name}: {h} is not a commit of this repository"));
            }
        }
    }
    let in_docs: Vec<&str> =
        docs.files.iter().filter(|(n, _)| n.starts_with("docs/")).flat_map(|(_, t)| hashes(t)).collect();
    for h in hashes(&docs.files["README.md"]) {
        if docs.commits.iter().any(|c| c.starts_with(h)) && !in_docs.contains(&h) {
            wrong.push(format!("README.md: {h} is named in no document under docs/"));
        }
    }
    wrong
}

/// Kubernetes version ranges (`1.30–1.37`) are one and the same wherever they are stated.
fn check_version_ranges(docs: &Docs) -> Vec<String> {
    let mut seen: Vec<(String, String)> = Vec::new();
    for (name, text) in &docs.files {
        for (i, _) in text.match_indices("1.").filter(|(i, _)| text[i + 2..].starts_with(|c: char| c.is_ascii_digit()))
        {
            let rest = &text[i..];
            // An en dash as written, or a hyphen.
            let range: String =
                rest.chars().take_while(|c| c.is_ascii_digit() || matches!(c, '.' | '–' | '-')).collect();
            let range = range.trim_end_matches(['.', '-']).replace('-', "–");
            // Kubernetes minors: `1.30–1.37`, not a ratio like `1.4–1.6`.
            let minors = range.split('–').all(|v| v.strip_prefix("1.").is_some_and(|m| m.len() == 2));
            if range.contains('–') && minors {
                seen.push((name.clone(), range));
            }
        }
    }
    let Some((first_name, first)) = seen.first().cloned() else { return Vec::new() };
    seen.into_iter()
        .filter(|(_, r)| *r != first)
        .map(|(n, r)| format!("{n}: the range {r} differs from {first_name}'s {first}"))
        .collect()
}

/// Without a release tag, nothing speaks of a release as if there were one; the README, CHANGELOG and SECURITY say
/// there is none.
fn check_releases(docs: &Docs) -> Vec<String> {
    if docs.released {
        return Vec::new();
    }
    let mut wrong = Vec::new();
    for (name, text) in &docs.files {
        let lower = text.to_lowercase().replace('\n', " ");
        for phrase in ["previous release", "last release", "-only release", "old release", "this release"] {
            if lower.contains(phrase) {
                wrong.push(format!("{name}: speaks of \"{phrase}\", but nothing is tagged v*"));
            }
        }
    }
    for name in ["README.md", "CHANGELOG.md", "SECURITY.md"] {
        let lower = docs.files[name].to_lowercase().replace('\n', " ");
        if !lower.contains("no release yet") && !lower.contains("not made a release") {
            wrong.push(format!("{name}: does not say there is no release yet"));
        }
    }
    wrong
}

/// A number as the docs write it, thin spaces between thousands: `2 725 031`.
fn number(words: &[&str]) -> Option<(u64, usize)> {
    let mut digits = String::new();
    let mut used = 0;
    for (i, w) in words.iter().enumerate() {
        let ok = w.chars().all(|c| c.is_ascii_digit()) && !w.is_empty() && (i == 0 || w.len() == 3);
        if !ok {
            break;
        }
        digits.push_str(w);
        used += 1;
    }
    digits.parse().ok().map(|n| (n, used))
}

/// Every count broken down in parentheses adds up: `22 faults (3 split brains ..., 1 killed, ...)`.
fn check_breakdowns(docs: &Docs) -> Vec<String> {
    const KINDS: [&str; 8] = ["paused", "killed", "cut", "throttled", "lossy", "restarted", "slowed", "split brain"];
    let mut wrong = Vec::new();
    for (name, text) in &docs.files {
        let flat = text.replace('\n', " ");
        for (i, _) in flat.match_indices(" faults (") {
            let before: Vec<&str> = flat[..i].split(' ').collect();
            let start = before
                .iter()
                .rposition(|w| !w.chars().all(|c| c.is_ascii_digit()) || w.is_empty())
                .map_or(0, |p| p + 1);
            let Some((total, _)) = number(&before[start..]) else { continue };
            let inner = &flat[i + " faults (".len()..];
            let Some(end) = inner.find(')') else { continue };
            let mut sum = 0;
            for part in inner[..end].split([',', ';']) {
                let words: Vec<&str> = part.split_whitespace().collect();
                if let Some((n, used)) = number(&words) {
                    let rest = words[used..].join(" ");
                    if KINDS.iter().any(|k| rest.contains(k)) {
                        sum += n;
                    }
                }
            }
            if sum != total {
                wrong.push(format!("{name}: {total} faults broken down into {sum}: ({})", &inner[..end]));
            }
        }
    }
    wrong
}

/// Bytes of a Kubernetes quantity (`512Mi`, `1Gi`) or a plain number (`4.3e8`).
fn bytes(q: &str) -> Option<f64> {
    let q = q.trim();
    for (suffix, unit) in [("Ki", 1024f64), ("Mi", 1048576.), ("Gi", 1073741824.)] {
        if let Some(n) = q.strip_prefix("").and_then(|q| q.strip_suffix(suffix)) {
            return n.parse::<f64>().ok().map(|n| n * unit);
        }
    }
    q.parse().ok()
}

/// The memory alert fires below the memory limit (else it never fires: the container is killed first).
fn check_memory_alert(docs: &Docs) -> Vec<String> {
    let alerts = &docs.files["deploy/monitoring/alerts.yaml"];
    let statefulset = &docs.files["deploy/base/statefulset.yaml"];
    let threshold = alerts
        .lines()
        .find(|l| l.contains("process_resident_memory_bytes"))
        .and_then(|l| l.rsplit('>').next())
        .and_then(bytes);
    let limit = statefulset
        .lines()
        .find(|l| l.contains("limits:") && l.contains("memory"))
        .and_then(|l| l.split("memory:").nth(1))
        .map(|m| m.trim().trim_end_matches('}').trim())
        .and_then(bytes);
    match (threshold, limit) {
        (Some(t), Some(l)) if t < l => Vec::new(),
        (t, l) => vec![format!("the memory alert's threshold {t:?} is not under the memory limit {l:?}")],
    }
}

/// CONTRIBUTING asks for the clippy command CI runs.
fn check_contributing(docs: &Docs) -> Vec<String> {
    let ci = &docs.files[".ci/run"];
    let Some(clippy) = ci.lines().map(str::trim).find(|l| l.starts_with("cargo clippy")) else {
        return vec![".ci/run runs no cargo clippy".into()];
    };
    match docs.files["CONTRIBUTING.md"].replace('\n', " ").replace("   ", " ").contains(clippy) {
        true => Vec::new(),
        false => vec![format!("CONTRIBUTING.md does not ask for .ci/run's `{clippy}`")],
    }
}

/// The README stays a front page: at most 150 lines, and it links the known limitations.
fn check_readme(docs: &Docs) -> Vec<String> {
    let readme = &docs.files["README.md"];
    let mut wrong = Vec::new();
    if readme.lines().count() > 150 {
        wrong.push(format!("README.md has {} lines, more than 150", readme.lines().count()));
    }
    if !readme.contains("](docs/known-limitations.md)") {
        wrong.push("README.md does not link docs/known-limitations.md".into());
    }
    wrong
}

/// Paths of the repository the documents name in backquotes (`tests/encryption.rs`, `deploy/base/rbac.yaml`) exist.
fn check_paths(docs: &Docs) -> Vec<String> {
    const ROOTS: [&str; 9] =
        ["src/", "tests/", "deploy/", "hack/", "benches/", "envtest/", "robustness/", "images/", "docs/"];
    let mut wrong = Vec::new();
    for (name, text) in docs.files.iter().filter(|(n, _)| n.ends_with(".md")) {
        for quoted in text.split('`').skip(1).step_by(2) {
            let path = quoted.split_whitespace().next().unwrap_or("").trim_end_matches([':', ',', '.']);
            // `deploy/local` the docs have the reader make; `tests/robustness` is etcd's.
            let skip = path.contains(['<', '*', '$', '{']) || path.contains("...") || path.starts_with("deploy/local");
            let skip = skip || (path == "tests/robustness" && name == "docs/design.md");
            if skip || !ROOTS.iter().any(|r| path.starts_with(r)) || path.contains("#") {
                continue;
            }
            if !docs.paths.contains(path.trim_end_matches('/')) {
                wrong.push(format!("{name}: `{path}` does not exist"));
            }
        }
    }
    wrong
}

type Check = fn(&Docs) -> Vec<String>;
const CHECKS: [(&str, Check); 9] = [
    ("links", check_links),
    ("commits", check_commits),
    ("version ranges", check_version_ranges),
    ("releases", check_releases),
    ("breakdowns", check_breakdowns),
    ("memory alert", check_memory_alert),
    ("contributing", check_contributing),
    ("readme", check_readme),
    ("paths", check_paths),
];

#[test]
fn every_statement_the_checks_can_read_holds() {
    let docs = load();
    let mut wrong = Vec::new();
    for (what, check) in CHECKS {
        wrong.extend(check(&docs).into_iter().map(|w| format!("{what}: {w}")));
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Each check catches what it is for: one mismatch planted in a copy of the real documents.
#[test]
fn each_check_fails_on_a_planted_mismatch() {
    let docs = load();
    let planted = |file: &str, edit: &dyn Fn(&str) -> String| {
        let mut d = docs.clone();
        let text = edit(&d.files[file]);
        d.files.insert(file.into(), text);
        d
    };
    let append = |extra: &'static str| move |t: &str| format!("{t}\n{extra}\n");
    let cases: Vec<(&str, Docs)> = vec![
        ("links", planted("docs/api.md", &append("See [install](install.md#no-such-heading)."))),
        ("links", planted("docs/api.md", &append("```sh\n# Fenced\n```\nSee [x](api.md#fenced)."))),
        ("commits", planted("README.md", &append("Measured at deadbee1."))),
        ("version ranges", planted("docs/compatibility.md", &append("Read from 1.30–1.35."))),
        ("releases", planted("docs/api.md", &append("As the previous release did."))),
        ("breakdowns", planted("docs/robustness.md", &append("611 faults (600 killed, 12 paused)."))),
        ("memory alert", planted("deploy/monitoring/alerts.yaml", &|t| t.replace("> 4.3e8", "> 1.5e9"))),
        ("contributing", planted("CONTRIBUTING.md", &|t| t.replace(" --all-features", ""))),
        ("readme", planted("README.md", &|t| format!("{t}{}", "\n".repeat(40)))),
        ("paths", planted("docs/api.md", &append("See `tests/nope.rs`."))),
    ];
    for (what, d) in cases {
        let check = CHECKS.iter().find(|(w, _)| *w == what).unwrap().1;
        assert_eq!(check(&d).len(), 1, "{what}: the planted mismatch, and only it: {:#?}", check(&d));
    }
}

#[test]
fn headings_in_code_blocks_are_not_anchors_and_repeats_are_numbered() {
    assert_eq!(anchors("# A b\n```\n# not\n```\n## A b\n### `c` d"), ["a-b", "a-b-1", "c-d"]);
    assert_eq!(anchors("# Steps and more\n# Steps"), ["steps-and-more", "steps"]);
    assert_eq!(number(&["2", "725", "031", "calls"]), Some((2_725_031, 3)));
    assert_eq!(hashes("at 6a24cb6, e48d28b and 1.30–1.37"), ["6a24cb6", "e48d28b"]);
}
