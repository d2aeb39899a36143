//! `--audit-policy-file`: an `audit.k8s.io/v1` `Policy`, read and checked as k8s.io/apiserver's `policy` package
//! reads it, and matched against each request as its `policyRuleEvaluator` matches: the first rule that matches
//! decides the level, the stages left out and whether `managedFields` are; no rule matching means `None`. Fields
//! the Policy type has not are warned about and ignored, as kube-apiserver 1.26+ does.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::api::UserInfo;
use crate::apiserver::request::Attributes;

/// How much of a request is recorded, least first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Level {
    None,
    Metadata,
    Request,
    RequestResponse,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::Metadata => "Metadata",
            Self::Request => "Request",
            Self::RequestResponse => "RequestResponse",
        }
    }
}

/// When in a request's life an event is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stage {
    RequestReceived,
    ResponseStarted,
    ResponseComplete,
    Panic,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequestReceived => "RequestReceived",
            Self::ResponseStarted => "ResponseStarted",
            Self::ResponseComplete => "ResponseComplete",
            Self::Panic => "Panic",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of stages (those a rule leaves out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stages(u8);

impl Stages {
    pub fn contains(self, stage: Stage) -> bool {
        self.0 & stage.bit() != 0
    }

    fn union(self, other: Stages) -> Stages {
        Stages(self.0 | other.0)
    }
}

impl FromIterator<Stage> for Stages {
    fn from_iter<I: IntoIterator<Item = Stage>>(stages: I) -> Self {
        Stages(stages.into_iter().fold(0, |bits, s| bits | s.bit()))
    }
}

/// What the policy asks of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestAudit {
    pub level: Level,
    pub omit_stages: Stages,
    pub omit_managed_fields: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GroupResources {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rule {
    level: Level,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    user_groups: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resources: Vec<GroupResources>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
    #[serde(default)]
    omit_stages: Vec<Stage>,
    #[serde(default)]
    omit_managed_fields: Option<bool>,
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PolicyFile {
    api_version: String,
    kind: String,
    /// Accepted (an object's metadata), not used.
    #[serde(default, rename = "metadata")]
    _metadata: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(default)]
    omit_stages: Vec<Stage>,
    #[serde(default)]
    omit_managed_fields: bool,
}

/// A policy, checked.
#[derive(Debug, Clone)]
pub struct Policy {
    rules: Vec<(Rule, Stages)>,
    omit_stages: Stages,
    omit_managed_fields: bool,
}

/// Why a policy file was refused: where, and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{path}{}: {reason}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct PolicyError {
    pub path: String,
    pub line: Option<usize>,
    pub reason: String,
}

impl Policy {
    /// Reads and checks `path` (YAML or JSON).
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError {
            path: path.display().to_string(),
            line: None,
            reason: format!("failed to read the audit policy: {e}"),
        })?;
        Self::parse(&text).map_err(|(line, reason)| PolicyError { path: path.display().to_string(), line, reason })
    }

    /// A policy from its text, or the line (if known) and the reason it is refused.
    pub fn parse(text: &str) -> Result<Self, (Option<usize>, String)> {
        let file: PolicyFile =
            serde_yaml::from_str(text).map_err(|e| (e.location().map(|l| l.line()), e.to_string()))?;
        if file.kind != "Policy" || file.api_version != "audit.k8s.io/v1" {
            return Err((
                None,
                format!(
                    "expected apiVersion audit.k8s.io/v1 and kind Policy, found apiVersion {:?} and kind {:?}",
                    file.api_version, file.kind
                ),
            ));
        }
        if file.rules.is_empty() {
            return Err((None, "loaded illegal policy with 0 rules".into()));
        }
        for (i, rule) in file.rules.iter().enumerate() {
            if let Some(reason) = invalid(rule) {
                return Err((rule_line(text, i), format!("rules[{i}].{reason}")));
            }
        }
        let omit_stages: Stages = file.omit_stages.iter().copied().collect();
        Ok(Self {
            rules: file
                .rules
                .into_iter()
                .map(|r| {
                    let stages = r.omit_stages.iter().copied().collect::<Stages>().union(omit_stages);
                    (r, stages)
                })
                .collect(),
            omit_stages,
            omit_managed_fields: file.omit_managed_fields,
        })
    }

    /// What the first matching rule asks of a request (`user` is `None` when authentication failed).
    pub fn evaluate(&self, user: Option<&UserInfo>, attrs: &Attributes) -> RequestAudit {
        for (rule, omit_stages) in &self.rules {
            if matches(rule, user, attrs) {
                return RequestAudit {
                    level: rule.level,
                    omit_stages: *omit_stages,
                    omit_managed_fields: rule.omit_managed_fields.unwrap_or(self.omit_managed_fields),
                };
            }
        }
        RequestAudit {
            level: Level::None,
            omit_stages: self.omit_stages,
            omit_managed_fields: self.omit_managed_fields,
        }
    }
}

/// kube's `ValidatePolicy` for one rule: the field and what is wrong with it.
fn invalid(rule: &Rule) -> Option<String> {
    if !rule.non_resource_urls.is_empty() && (!rule.resources.is_empty() || !rule.namespaces.is_empty()) {
        return Some(format!(
            "nonResourceURLs: Invalid value: {:?}: rules cannot apply to both regular resources and non-resource URLs",
            rule.non_resource_urls
        ));
    }
    for (i, url) in rule.non_resource_urls.iter().enumerate() {
        if url == "*" {
            continue;
        }
        if !url.starts_with('/') {
            return Some(format!(
                "nonResourceURLs[{i}]: Invalid value: {url:?}: non-resource URL rules must begin with a '/' character"
            ));
        }
        let mut before_last = url.chars();
        before_last.next_back();
        if before_last.as_str().contains('*') {
            return Some(format!(
                "nonResourceURLs[{i}]: Invalid value: {url:?}: non-resource URL wildcards '*' must be the final character of the rule"
            ));
        }
    }
    for (i, gr) in rule.resources.iter().enumerate() {
        if !gr.group.is_empty() && !is_dns_subdomain(&gr.group) {
            return Some(format!(
                "resources[{i}].group: Invalid value: {:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                gr.group
            ));
        }
        if !gr.resource_names.is_empty() && gr.resources.is_empty() {
            return Some(format!(
                "resources[{i}].resourceNames: Invalid value: {:?}: using resourceNames requires at least one resource",
                gr.resource_names
            ));
        }
    }
    None
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// The line the `i`th rule starts on, for an error that is about it as a whole.
fn rule_line(text: &str, i: usize) -> Option<usize> {
    use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
    use yaml_rust2::scanner::Marker;

    /// Walks the document to the top-level `rules` sequence and notes where each item starts.
    #[derive(Default)]
    struct Finder {
        /// Open containers, outermost first.
        depth: usize,
        /// At the top level: whether the next scalar is a key (keys and values alternate).
        key_next: bool,
        last_key: String,
        in_rules: bool,
        starts: Vec<usize>,
    }

    impl MarkedEventReceiver for Finder {
        fn on_event(&mut self, ev: Event, mark: Marker) {
            let starts_node = matches!(ev, Event::MappingStart(..) | Event::SequenceStart(..) | Event::Scalar(..));
            if self.in_rules && self.depth == 2 && starts_node {
                self.starts.push(mark.line());
            }
            match ev {
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    if self.depth == 1 {
                        self.in_rules = self.last_key == "rules" && matches!(ev, Event::SequenceStart(..));
                        self.key_next = true;
                    }
                    self.depth += 1;
                    if self.depth == 1 {
                        self.key_next = true;
                    }
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth < 2 {
                        self.in_rules = false;
                    }
                }
                Event::Scalar(value, ..) if self.depth == 1 => {
                    if self.key_next {
                        self.last_key = value;
                    }
                    self.key_next = !self.key_next;
                }
                _ => {}
            }
        }
    }

    let mut finder = Finder::default();
    Parser::new_from_str(text).load(&mut finder, false).ok()?;
    finder.starts.get(i).copied()
}

fn matches(rule: &Rule, user: Option<&UserInfo>, attrs: &Attributes) -> bool {
    if !rule.users.is_empty() && !user.is_some_and(|u| rule.users.contains(&u.name)) {
        return false;
    }
    if !rule.user_groups.is_empty() && !user.is_some_and(|u| u.groups.iter().any(|g| rule.user_groups.contains(g))) {
        return false;
    }
    if !rule.verbs.is_empty() && !rule.verbs.contains(&attrs.verb) {
        return false;
    }
    if !rule.namespaces.is_empty() || !rule.resources.is_empty() {
        return matches_resource(rule, attrs);
    }
    if !rule.non_resource_urls.is_empty() {
        return attrs.resource.is_none() && rule.non_resource_urls.iter().any(|spec| path_matches(&attrs.path, spec));
    }
    true
}

/// kube's `pathMatches`: `*`, the path itself, or a prefix ending in `*`.
fn path_matches(path: &str, spec: &str) -> bool {
    spec == "*" || spec == path || spec.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix))
}

fn matches_resource(rule: &Rule, attrs: &Attributes) -> bool {
    let Some(r) = &attrs.resource else { return false };
    // A cluster-scoped request's namespace is "".
    if !rule.namespaces.is_empty() && !rule.namespaces.contains(&r.namespace) {
        return false;
    }
    if rule.resources.is_empty() {
        return true;
    }
    let combined =
        if r.subresource.is_empty() { r.resource.clone() } else { format!("{}/{}", r.resource, r.subresource) };
    rule.resources.iter().filter(|gr| gr.group == r.group).any(|gr| {
        if gr.resources.is_empty() {
            return true;
        }
        if !gr.resource_names.is_empty() && !gr.resource_names.contains(&r.name) {
            return false;
        }
        gr.resources.iter().any(|res| {
            res == &combined
                || res == "*"
                || (!r.subresource.is_empty() && res.strip_prefix("*/") == Some(r.subresource.as_str()))
                || res.strip_suffix("/*") == Some(r.resource.as_str())
        })
    })
}

#[cfg(test)]
mod tests;
