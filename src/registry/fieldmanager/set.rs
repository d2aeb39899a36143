//! A set of field paths as a tree (structured-merge-diff's `fieldpath.Set`), and its FieldsV1 JSON form.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::path::{Path, PathElement};

/// `members` are paths that end here; `children` hold longer paths. A path can be both a member and a prefix
/// (FieldsV1 writes that as `".": {}`). Children are never empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Set {
    members: BTreeSet<PathElement>,
    children: BTreeMap<PathElement, Set>,
}

impl Set {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.is_empty()
    }

    pub fn insert(&mut self, path: &[PathElement]) {
        match path {
            [] => {}
            [last] => {
                self.members.insert(last.clone());
            }
            [first, rest @ ..] => self.children.entry(first.clone()).or_default().insert(rest),
        }
    }

    pub fn has(&self, path: &[PathElement]) -> bool {
        match path {
            [] => false,
            [last] => self.members.contains(last),
            [first, rest @ ..] => self.children.get(first).is_some_and(|c| c.has(rest)),
        }
    }

    /// Whether the field `name` is a member (sets here are small: a scan, with no path element to build).
    pub fn has_field(&self, name: &str) -> bool {
        self.members.iter().any(|m| matches!(m, PathElement::Field(f) if f == name))
    }

    /// The subtree under the field `name`, if any.
    pub fn field_child(&self, name: &str) -> Option<&Set> {
        self.children.iter().find(|(pe, _)| matches!(pe, PathElement::Field(f) if f == name)).map(|(_, c)| c)
    }

    /// The subtree under `pe`, if any.
    pub fn child(&self, pe: &PathElement) -> Option<&Set> {
        self.children.get(pe)
    }

    pub fn union(&self, other: &Set) -> Set {
        let mut out = self.clone();
        out.union_in_place(other);
        out
    }

    pub fn union_in_place(&mut self, other: &Set) {
        self.members.extend(other.members.iter().cloned());
        for (pe, c) in &other.children {
            self.children.entry(pe.clone()).or_default().union_in_place(c);
        }
    }

    pub fn intersection(&self, other: &Set) -> Set {
        let members = self.members.intersection(&other.members).cloned().collect();
        let children = self
            .children
            .iter()
            .filter_map(|(pe, c)| {
                let i = c.intersection(other.children.get(pe)?);
                (!i.is_empty()).then(|| (pe.clone(), i))
            })
            .collect();
        Set { members, children }
    }

    /// Paths in `self` that are not in `other` (exact paths; a member of `other` does not remove longer paths).
    pub fn difference(&self, other: &Set) -> Set {
        let members = self.members.difference(&other.members).cloned().collect();
        let children = self
            .children
            .iter()
            .filter_map(|(pe, c)| {
                let d = match other.children.get(pe) {
                    Some(o) => c.difference(o),
                    None => c.clone(),
                };
                (!d.is_empty()).then(|| (pe.clone(), d))
            })
            .collect();
        Set { members, children }
    }

    /// [`Set::difference`] in place.
    pub fn difference_in_place(&mut self, other: &Set) {
        self.members.retain(|m| !other.members.contains(m));
        for (pe, o) in &other.children {
            if let Some(c) = self.children.get_mut(pe) {
                c.difference_in_place(o);
                if c.is_empty() {
                    self.children.remove(pe);
                }
            }
        }
    }

    /// [`Set::recursive_difference`] in place.
    pub fn recursive_difference_in_place(&mut self, other: &Set) {
        self.members.retain(|m| !other.members.contains(m));
        self.children.retain(|pe, c| {
            if other.members.contains(pe) {
                return false;
            }
            if let Some(o) = other.children.get(pe) {
                c.recursive_difference_in_place(o);
            }
            !c.is_empty()
        });
    }

    /// Paths in `self` that are neither in `other` nor under a path of `other` (`other`'s paths as prefixes).
    pub fn recursive_difference(&self, other: &Set) -> Set {
        let members = self.members.difference(&other.members).cloned().collect();
        let children = self
            .children
            .iter()
            .filter_map(|(pe, c)| {
                if other.members.contains(pe) {
                    return None;
                }
                let d = match other.children.get(pe) {
                    Some(o) => c.recursive_difference(o),
                    None => c.clone(),
                };
                (!d.is_empty()).then(|| (pe.clone(), d))
            })
            .collect();
        Set { members, children }
    }

    /// Every member path, in order.
    pub fn paths(&self) -> Vec<Path> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Path, out: &mut Vec<Path>) {
        let mut members = self.members.iter().peekable();
        let mut children = self.children.iter().peekable();
        loop {
            let take_member = match (members.peek(), children.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some(m), Some((c, _))) => *m <= *c,
            };
            if take_member {
                let m = members.next().expect("peeked");
                prefix.push(m.clone());
                out.push(prefix.clone());
                prefix.pop();
            } else {
                let (pe, c) = children.next().expect("peeked");
                prefix.push(pe.clone());
                c.collect(prefix, out);
                prefix.pop();
            }
        }
    }

    pub fn members(&self) -> impl Iterator<Item = &PathElement> {
        self.members.iter()
    }

    pub fn children(&self) -> impl Iterator<Item = (&PathElement, &Set)> {
        self.children.iter()
    }

    pub(super) fn insert_member(&mut self, pe: PathElement) {
        self.members.insert(pe);
    }

    pub(super) fn set_child(&mut self, pe: PathElement, c: Set) {
        if c.is_empty() {
            self.children.remove(&pe);
        } else {
            self.children.insert(pe, c);
        }
    }

    /// The FieldsV1 JSON of this set.
    pub fn to_fields_v1(&self) -> Value {
        Value::Object(self.emit(false))
    }

    fn emit(&self, include_self: bool) -> Map<String, Value> {
        let mut out = Map::new();
        if include_self && !self.is_empty() {
            out.insert(".".into(), Value::Object(Map::new()));
        }
        for pe in &self.members {
            if !self.children.contains_key(pe) {
                out.insert(pe.encode(), Value::Object(Map::new()));
            }
        }
        for (pe, c) in &self.children {
            out.insert(pe.encode(), Value::Object(c.emit(self.members.contains(pe))));
        }
        out
    }

    /// Parses FieldsV1 JSON.
    pub fn from_fields_v1(v: &Value) -> Result<Set, String> {
        let Value::Object(m) = v else { return Err("fieldsV1 must be an object".into()) };
        let mut set = Set::new();
        for (k, child) in m {
            if k == "." {
                continue;
            }
            let pe = PathElement::decode(k)?;
            let Value::Object(cm) = child else { return Err(format!("fieldsV1 entry {k:?} must be an object")) };
            if cm.is_empty() || cm.contains_key(".") {
                set.members.insert(pe.clone());
            }
            let c = Set::from_fields_v1(child)?;
            if !c.is_empty() {
                set.children.insert(pe, c);
            }
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn f(name: &str) -> PathElement {
        PathElement::Field(name.into())
    }

    fn set_of(paths: &[&[PathElement]]) -> Set {
        let mut s = Set::new();
        paths.iter().for_each(|p| s.insert(p));
        s
    }

    #[test]
    fn fields_v1_round_trips_with_dot_for_a_member_that_has_children() {
        let v = json!({
            "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
            "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:image": {}, "f:name": {}}}, "f:replicas": {}}
        });
        let s = Set::from_fields_v1(&v).unwrap();
        assert!(s.has(&[f("metadata"), f("labels")]));
        assert!(!s.has(&[f("metadata")]));
        assert_eq!(s.to_fields_v1(), v);
        assert!(Set::from_fields_v1(&json!({"x:y": {}})).is_err());
        assert!(Set::from_fields_v1(&json!(["f:a"])).is_err());
    }

    #[test]
    fn set_algebra() {
        let a = set_of(&[&[f("a")], &[f("b"), f("c")], &[f("b"), f("d")]]);
        let b = set_of(&[&[f("b")], &[f("b"), f("c")]]);
        assert_eq!(a.intersection(&b), set_of(&[&[f("b"), f("c")]]));
        assert_eq!(a.difference(&b), set_of(&[&[f("a")], &[f("b"), f("d")]]));
        // `b` is a member of the right side: everything under it goes.
        assert_eq!(a.recursive_difference(&b), set_of(&[&[f("a")]]));
        assert_eq!(a.union(&b).paths().len(), 4);
        assert!(a.difference(&a).is_empty());
        let mut d = a.clone();
        d.difference_in_place(&b);
        assert_eq!(d, a.difference(&b));
        let mut r = a.clone();
        r.recursive_difference_in_place(&b);
        assert_eq!(r, a.recursive_difference(&b));
    }

    #[test]
    fn paths_come_out_in_order() {
        let s = set_of(&[&[f("b")], &[f("a"), f("x")], &[f("a")]]);
        let got: Vec<String> = s.paths().iter().map(|p| super::super::path::Display(p).to_string()).collect();
        assert_eq!(got, [".a", ".a.x", ".b"]);
    }
}
