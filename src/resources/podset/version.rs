//! The versions of `demo.k8s.io` this server serves. One storage holds them all: each object is kept in one
//! version (the storage version) and converted through the hub, [`super::PodSet`], which has every field of every
//! version.

use std::fmt;
use std::str::FromStr;

use super::GROUP;
use crate::api::resource::{ServedVersion, VersionIndex, VersionInfo};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Version {
    V1alpha1,
    V1beta1,
}

impl Version {
    /// Every served version, oldest first.
    pub const ALL: [Version; 2] = [Version::V1alpha1, Version::V1beta1];
    /// Every served version's name, as [`Version::ALL`] orders them.
    pub const NAMES: [&'static str; Version::ALL.len()] = {
        let mut names = [""; Version::ALL.len()];
        let mut i = 0;
        while i < names.len() {
            names[i] = Version::ALL[i].as_str();
            i += 1;
        }
        names
    };
    /// What discovery offers first, and what clients that name no version (`kubectl get podsets`) use.
    pub const PREFERRED: Version = Version::V1beta1;
    /// What objects are stored in unless `--storage-version` says otherwise. Kube's rule for a new version: the
    /// build that adds it serves it but keeps storing the older one, so that every build it runs beside during a
    /// rolling upgrade, or rolls back to, reads what it writes; the next build may move the default.
    pub const STORAGE: Version = Version::V1alpha1;

    pub const fn as_str(self) -> &'static str {
        match self {
            Version::V1alpha1 => "v1alpha1",
            Version::V1beta1 => "v1beta1",
        }
    }

    /// `demo.k8s.io/<version>`.
    pub const fn api_version(self) -> &'static str {
        match self {
            Version::V1alpha1 => "demo.k8s.io/v1alpha1",
            Version::V1beta1 => "demo.k8s.io/v1beta1",
        }
    }

    /// How JSON this server writes in this version begins: `{"apiVersion":"demo.k8s.io/<version>"`.
    pub const fn json_head(self) -> &'static str {
        match self {
            Version::V1alpha1 => r#"{"apiVersion":"demo.k8s.io/v1alpha1""#,
            Version::V1beta1 => r#"{"apiVersion":"demo.k8s.io/v1beta1""#,
        }
    }

    /// The version an `apiVersion` of this group names.
    pub fn of_api_version(api_version: &str) -> Option<Self> {
        api_version.strip_prefix(GROUP)?.strip_prefix('/')?.parse().ok()
    }

    /// A small index, for tables kept per version.
    pub const fn index(self) -> usize {
        self as usize
    }

    const fn info(self) -> VersionInfo {
        VersionInfo { name: self.as_str(), api_version: self.api_version(), json_head: self.json_head() }
    }

    /// [`Version::ALL`]'s names, as the layers that serve any resource read them.
    pub const INFOS: [VersionInfo; Version::ALL.len()] = [Version::V1alpha1.info(), Version::V1beta1.info()];
}

impl ServedVersion for Version {
    fn to_index(self) -> VersionIndex {
        VersionIndex(self as u8)
    }

    fn from_index(index: VersionIndex) -> Self {
        Version::ALL[index.get()]
    }
}

impl From<Version> for VersionIndex {
    fn from(v: Version) -> Self {
        v.to_index()
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Version {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Version::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not a version of {GROUP} (served: {})", Version::NAMES.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_api_versions() {
        for v in Version::ALL {
            assert_eq!(v.as_str().parse::<Version>().unwrap(), v);
            assert_eq!(Version::of_api_version(v.api_version()), Some(v));
            assert_eq!(Version::ALL[v.index()], v);
            assert_eq!(v.json_head(), format!("{{\"apiVersion\":\"{}\"", v.api_version()));
            assert_eq!(Version::from_index(v.to_index()), v);
            assert_eq!(Version::INFOS[v.index()].name, v.as_str());
        }
        assert_eq!(Version::of_api_version("apps/v1beta1"), None);
        assert_eq!(Version::of_api_version("demo.k8s.io/v1"), None);
        assert!("v2".parse::<Version>().unwrap_err().contains("served: v1alpha1, v1beta1"));
    }
}
