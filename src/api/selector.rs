//! Label and field selectors, in the string syntax of `k8s.io/apimachinery/pkg/labels` and `fields`.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::validation::{label_value_errors, qualified_name_errors};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

/// A label selector: every requirement must hold. Empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Requirement {
    fn new(key: &str, operator: Operator, mut values: Vec<String>) -> Result<Self, String> {
        if let Some(e) = qualified_name_errors(key).into_iter().next() {
            return Err(format!("invalid label key {key:?}: {e}"));
        }
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => {
                return Err(format!("for 'in', 'notin' operators, values set can't be empty (key {key:?})"))
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                return Err(format!("values set must be empty for exists and does not exist (key {key:?})"))
            }
            Operator::GreaterThan | Operator::LessThan if values.len() != 1 || values[0].parse::<i64>().is_err() => {
                return Err(format!("for 'Gt', 'Lt' operators, exactly one integer value is required (key {key:?})"));
            }
            _ => {}
        }
        if !matches!(operator, Operator::GreaterThan | Operator::LessThan) {
            for v in &values {
                if let Some(e) = label_value_errors(v).into_iter().next() {
                    return Err(format!("invalid label value {v:?}: {e}"));
                }
            }
        }
        values.sort();
        values.dedup();
        Ok(Self { key: key.to_owned(), operator, values })
    }

    fn matches<'a>(&self, labels: &dyn Fn(&str) -> Option<&'a str>) -> bool {
        let value = labels(&self.key);
        let has = |v: &Option<&str>| v.is_some_and(|v| self.values.iter().any(|w| w == v));
        match self.operator {
            Operator::Equals | Operator::In => has(&value),
            Operator::NotEquals | Operator::NotIn => !has(&value),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(v), Ok(bound)) = (value.and_then(|v| v.parse::<i64>().ok()), self.values[0].parse::<i64>())
                else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    v > bound
                } else {
                    v < bound
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = &self.key;
        match self.operator {
            Operator::Equals => write!(f, "{k}={}", self.values[0]),
            Operator::NotEquals => write!(f, "{k}!={}", self.values[0]),
            Operator::In => write!(f, "{k} in ({})", self.values.join(",")),
            Operator::NotIn => write!(f, "{k} notin ({})", self.values.join(",")),
            Operator::Exists => write!(f, "{k}"),
            Operator::DoesNotExist => write!(f, "!{k}"),
            Operator::GreaterThan => write!(f, "{k}>{}", self.values[0]),
            Operator::LessThan => write!(f, "{k}<{}", self.values[0]),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl Selector {
    /// Parses the string form: `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(input: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(input)? {
            let part = part.trim();
            if part.is_empty() {
                if input.trim().is_empty() {
                    continue;
                }
                return Err(format!("unable to parse requirement in {input:?}: empty requirement"));
            }
            requirements.push(parse_requirement(part)?);
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    /// The selector a `metav1.LabelSelector` means (an empty one selects everything).
    pub fn from_label_selector(ls: &LabelSelector) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for (k, v) in ls.match_labels.iter().flatten() {
            requirements.push(Requirement::new(k, Operator::Equals, vec![v.clone()])?);
        }
        for e in ls.match_expressions.iter().flatten() {
            let op = match e.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            };
            requirements.push(Requirement::new(&e.key, op, e.values.clone().unwrap_or_default())?);
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_with(&|k| labels.get(k).map(String::as_str))
    }

    /// Matches labels read by `label`, whatever holds them.
    pub fn matches_with<'a>(&self, label: &dyn Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.matches(label))
    }
}

fn split_top_level(input: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("unable to parse requirement in {input:?}: unbalanced parentheses"));
                }
            }
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unable to parse requirement in {input:?}: unbalanced parentheses"));
    }
    parts.push(&input[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Requirement::new(key.trim(), Operator::DoesNotExist, vec![]);
    }
    // Set-based: `key in (a,b)` / `key notin (a,b)`.
    if let Some(open) = part.find('(') {
        let head = part[..open].trim();
        let close = part.rfind(')').filter(|&c| c > open && part[c + 1..].trim().is_empty());
        let Some(close) = close else {
            return Err(format!("unable to parse requirement {part:?}: expected ')'"));
        };
        let (key, op) = match head.rsplit_once(char::is_whitespace) {
            Some((k, "in")) => (k.trim(), Operator::In),
            Some((k, "notin")) => (k.trim(), Operator::NotIn),
            _ => return Err(format!("unable to parse requirement {part:?}: expected 'in' or 'notin'")),
        };
        let values = part[open + 1..close].split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect();
        return Requirement::new(key, op, values);
    }
    for (token, op) in [
        ("!=", Operator::NotEquals),
        ("==", Operator::Equals),
        ("=", Operator::Equals),
        (">", Operator::GreaterThan),
        ("<", Operator::LessThan),
    ] {
        if let Some((k, v)) = part.split_once(token) {
            return Requirement::new(k.trim(), op, vec![v.trim().to_owned()]);
        }
    }
    Requirement::new(part, Operator::Exists, vec![])
}

/// A field selector over the fields every object supports: `metadata.name` and `metadata.namespace`.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector {
    terms: Vec<(Field, bool, String)>,
}

#[derive(Debug, Clone, Copy)]
enum Field {
    Name,
    Namespace,
}

impl FieldSelector {
    pub fn parse(input: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for part in input.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!("invalid selector: {part:?}; can't understand"));
            };
            let field = match field.trim() {
                "metadata.name" => Field::Name,
                "metadata.namespace" => Field::Namespace,
                other => return Err(format!("field label not supported: {other}")),
            };
            terms.push((field, equal, value.trim().to_owned()));
        }
        Ok(Self { terms })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The one name this selector requires, if it is `metadata.name=<name>`.
    pub fn exact_name(&self) -> Option<&str> {
        self.terms.iter().find(|(f, eq, _)| matches!(f, Field::Name) && *eq).map(|(_, _, v)| v.as_str())
    }

    /// Matches an object's `metadata.name` and `metadata.namespace`, the fields it can select on.
    pub fn matches_meta(&self, name: &str, namespace: &str) -> bool {
        self.terms.iter().all(|(field, equal, want)| {
            let have = match field {
                Field::Name => name,
                Field::Namespace => namespace,
            };
            (have == want) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn parses_and_matches_every_operator() {
        let s = Selector::parse("app=web, tier in (a, b),env notin (prod),!legacy,track,gen>2").unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "a"), ("track", "x"), ("gen", "3")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "c"), ("track", "x"), ("gen", "3")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a"), ("env", "prod"), ("track", "x"), ("gen", "3")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a"), ("legacy", ""), ("track", "x"), ("gen", "3")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a"), ("gen", "3")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a"), ("track", "x"), ("gen", "1")])));
        assert_eq!(s.to_string(), "app=web,env notin (prod),gen>2,!legacy,tier in (a,b),track");
    }

    #[test]
    fn rejects_malformed_selectors() {
        for bad in ["a in (b", "a in ()", "Bad Key=1", "a=b=c/", "a notin x", "-a=b"] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
        assert!(Selector::parse("").unwrap().is_empty());
    }

    #[test]
    fn label_selector_struct_round_trips_to_string() {
        let ls: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["b", "a"]}]
        }))
        .unwrap();
        let s = Selector::from_label_selector(&ls).unwrap();
        assert_eq!(s.to_string(), "app=web,tier in (a,b)");
        assert_eq!(Selector::parse(&s.to_string()).unwrap(), s);
    }

    #[test]
    fn field_selectors() {
        assert!(FieldSelector::parse("metadata.name=a").unwrap().matches_meta("a", "ns"));
        assert!(!FieldSelector::parse("metadata.name!=a").unwrap().matches_meta("a", "ns"));
        assert!(FieldSelector::parse("metadata.namespace==ns,metadata.name=a").unwrap().matches_meta("a", "ns"));
        assert!(!FieldSelector::parse("metadata.namespace==ns,metadata.name=a").unwrap().matches_meta("a", "other"));
        assert!(FieldSelector::parse("spec.replicas=1").is_err());
        assert_eq!(FieldSelector::parse("metadata.name=a").unwrap().exact_name(), Some("a"));
    }
}
