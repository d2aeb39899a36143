//! The parts of a value an expression can read, so only they are made into interpreter values.
//!
//! cel-rust copies a map's whole subtree each time a field of it is selected, and converts every bound value into
//! its own representation: an expression reading `object.spec.replicas` would pay for the object's
//! `managedFields`. Every read of a name goes through a chain of field selections from it (`object.spec.replicas`,
//! `has(object.metadata.labels)`, `object.?spec.?paused`); whatever the expression then does with the value at the
//! chain's end (iterate it, compare it, pass it to a function) sees that value whole. So a value cut down to the
//! subtrees at the ends of those chains gives every expression the same result as the value itself.

use std::collections::BTreeMap;

use super::value::from_json;
use super::Value;

/// A set of field paths into a value: the value whole, some fields of it (each with its own projection), or
/// nothing (the name is not read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Projection(Option<Node>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Whole,
    Fields(BTreeMap<String, Node>),
}

impl Node {
    fn add(&mut self, path: &[String]) {
        let Some((first, rest)) = path.split_first() else {
            *self = Node::Whole;
            return;
        };
        if let Node::Fields(fields) = self {
            fields.entry(first.clone()).or_insert_with(|| Node::Fields(BTreeMap::new())).add(rest);
        }
    }

    fn merge(&mut self, other: &Node) {
        match (&mut *self, other) {
            (Node::Whole, _) => {}
            (_, Node::Whole) => *self = Node::Whole,
            (Node::Fields(mine), Node::Fields(theirs)) => {
                for (k, n) in theirs {
                    match mine.get_mut(k) {
                        Some(m) => m.merge(n),
                        None => {
                            mine.insert(k.clone(), n.clone());
                        }
                    }
                }
            }
        }
    }

    fn project(&self, v: &serde_json::Value) -> Value {
        match (self, v) {
            (Node::Fields(fields), serde_json::Value::Object(o)) => super::value::map_owned(
                fields.iter().filter_map(|(k, node)| o.get(k).map(|child| (k.clone(), node.project(child)))),
            ),
            // Selecting a field of anything else is the interpreter's business: it gets the value as it is.
            _ => from_json(v),
        }
    }
}

impl Projection {
    /// Reads nothing.
    pub fn nothing() -> Self {
        Self(None)
    }

    /// Reads the value whole.
    pub fn whole() -> Self {
        Self(Some(Node::Whole))
    }

    /// Whether anything of the value is read.
    pub fn reads(&self) -> bool {
        self.0.is_some()
    }

    /// Adds the subtree at `path` (empty: the value whole).
    pub fn add(&mut self, path: &[String]) {
        self.0.get_or_insert_with(|| Node::Fields(BTreeMap::new())).add(path);
    }

    /// Adds what `other` reads.
    pub fn merge(&mut self, other: &Projection) {
        match (&mut self.0, &other.0) {
            (_, None) => {}
            (None, Some(n)) => self.0 = Some(n.clone()),
            (Some(mine), Some(theirs)) => mine.merge(theirs),
        }
    }

    /// The read parts of `v` as an interpreter value (null when nothing is read, or there is no `v`).
    pub fn project(&self, v: Option<&serde_json::Value>) -> Value {
        match (&self.0, v) {
            (Some(n), Some(v)) => n.project(v),
            _ => Value::Null,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cel::value::to_json;

    fn path(p: &str) -> Vec<String> {
        p.split('.').filter(|s| !s.is_empty()).map(str::to_owned).collect()
    }

    #[test]
    fn keeps_only_the_subtrees_read() {
        let v = json!({"metadata": {"name": "web", "labels": {"a": "1"}, "managedFields": [{"manager": "x"}]},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c"}]}}}});
        let mut p = Projection::nothing();
        assert_eq!(p.project(Some(&v)), Value::Null);
        p.add(&path("spec.replicas"));
        p.add(&path("metadata.labels"));
        p.add(&path("metadata.missing.deeper"));
        p.add(&path("spec.replicas.below_a_number"));
        assert_eq!(
            to_json(&p.project(Some(&v))).unwrap(),
            json!({"metadata": {"labels": {"a": "1"}}, "spec": {"replicas": 3}})
        );
        // A path ending in a node makes it whole, whatever was read below it before or after.
        p.add(&path("spec"));
        p.add(&path("spec.template.spec"));
        assert_eq!(to_json(&p.project(Some(&v))).unwrap()["spec"], v["spec"]);
        let mut q = Projection::nothing();
        q.add(&[]);
        assert_eq!(q, Projection::whole());
        assert_eq!(to_json(&q.project(Some(&v))).unwrap(), v);
    }

    #[test]
    fn merging_is_the_union() {
        let v = json!({"a": {"b": 1, "c": 2, "d": 3}, "e": 4});
        let (mut p, mut q) = (Projection::nothing(), Projection::nothing());
        p.add(&path("a.b"));
        q.add(&path("a.c"));
        q.add(&path("e"));
        p.merge(&q);
        assert_eq!(to_json(&p.project(Some(&v))).unwrap(), json!({"a": {"b": 1, "c": 2}, "e": 4}));
        p.merge(&Projection::whole());
        assert_eq!(to_json(&p.project(Some(&v))).unwrap(), v);
        let mut n = Projection::nothing();
        n.merge(&Projection::nothing());
        assert!(!n.reads());
    }
}
