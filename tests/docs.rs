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

#[test]
fn every_link_between_the_documents_leads_somewhere() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<std::path::PathBuf> =
        ["README.md", "CHANGELOG.md", "SECURITY.md", "CONTRIBUTING.md"].iter().map(|f| root.join(f)).collect();
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        docs.push(entry.unwrap().path());
    }
    let mut broken = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.starts_with("http") || target.contains(' ') {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() { doc.clone() } else { doc.parent().unwrap().join(file) };
            let Ok(body) = std::fs::read_to_string(&path) else {
                broken.push(format!("{}: {target}: no such file", doc.display()));
                continue;
            };
            if !anchor.is_empty() {
                let headings: Vec<String> =
                    body.lines().filter(|l| l.starts_with('#')).map(|l| slug(l.trim_start_matches('#'))).collect();
                if !headings.iter().any(|h| h == anchor) {
                    broken.push(format!("{}: {target}: no heading #{anchor}", doc.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}
