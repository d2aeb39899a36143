//! What a request is about, in the words every layer shares: who asks (`user.Info`), which part of a PodSet it
//! addresses, and which operation a write is (admission's `CREATE`/`UPDATE`/`DELETE`).

use std::collections::BTreeMap;

pub const ANONYMOUS: &str = "system:anonymous";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
pub const AUTHENTICATED: &str = "system:authenticated";

/// The caller, as Kubernetes' `user.Info`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    pub fn named(name: impl Into<String>, groups: Vec<String>) -> Self {
        Self { name: name.into(), uid: String::new(), groups, extra: BTreeMap::new() }
    }

    pub fn anonymous() -> Self {
        Self::named(ANONYMOUS, vec![UNAUTHENTICATED.into()])
    }

    /// Every authenticated user is in `system:authenticated` (k8s.io/apiserver's `AuthenticatedGroupAdder`).
    pub fn authenticated(mut self) -> Self {
        if self.name != ANONYMOUS && !self.groups.iter().any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED) {
            self.groups.push(AUTHENTICATED.into());
        }
        self
    }
}

/// The part of a PodSet a request addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Subresource {
    #[default]
    Main,
    Status,
    Scale,
}

impl Subresource {
    /// As Kubernetes spells it: empty for the object itself.
    pub fn as_str(self) -> &'static str {
        match self {
            Subresource::Main => "",
            Subresource::Status => "status",
            Subresource::Scale => "scale",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "" => Some(Subresource::Main),
            "status" => Some(Subresource::Status),
            "scale" => Some(Subresource::Scale),
            _ => None,
        }
    }
}

/// What a write does to the stored object, as admission names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    /// `CREATE`, `UPDATE`, `DELETE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}
