//! One create checked against a namespace's quotas, as k8s.io/apiserver's `CheckRequest` checks it for an
//! object-count resource: the quotas whose `status.hard` names the resource (a quota with scopes never matches
//! one), each needing `status.used` for it, each charged one more unless that goes over its limit.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Why a create is refused; the plugin words it as `admission.NewForbidden` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A matching quota whose status has no usage for the resource yet.
    StatusUnknown {
        quota: String,
        resources: String,
    },
    Exceeded {
        quota: String,
        requested: String,
        used: String,
        limited: String,
    },
    /// `limitedResources` says the resource needs a quota, and none covers it.
    Uncovered {
        resources: String,
    },
    /// A quantity in a quota's status that does not read as a count.
    Unreadable {
        quota: String,
        field: String,
        value: String,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::StatusUnknown { quota, resources } => {
                write!(f, "status unknown for quota: {quota}, resources: {resources}")
            }
            Refusal::Exceeded { quota, requested, used, limited } => {
                write!(f, "exceeded quota: {quota}, requested: {requested}, used: {used}, limited: {limited}")
            }
            Refusal::Uncovered { resources } => write!(f, "insufficient quota to consume: {resources}"),
            Refusal::Unreadable { quota, field, value } => {
                write!(f, "quota {quota}: {field} {value:?} is not a quantity this server can read")
            }
        }
    }
}

/// Whether a quota counts `resource`: its status names it, and it has no scopes (an object-count evaluator
/// matches no scope).
pub(crate) fn matches(quota: &ResourceQuota, resource: &str) -> bool {
    let hard = quota.status.as_ref().and_then(|s| s.hard.as_ref());
    let scoped = quota.spec.as_ref().is_some_and(|s| {
        s.scopes.as_ref().is_some_and(|v| !v.is_empty())
            || s.scope_selector
                .as_ref()
                .is_some_and(|sel| sel.match_expressions.as_ref().is_some_and(|e| !e.is_empty()))
    });
    !scoped && hard.is_some_and(|h| h.contains_key(resource))
}

/// `quotas` with one more `resource` charged to each that matches, or why the create is refused. `limited`: the
/// resource needs a covering quota (`limitedResources`).
pub(crate) fn charge(quotas: &[ResourceQuota], resource: &str, limited: bool) -> Result<Vec<ResourceQuota>, Refusal> {
    let matching: Vec<usize> = (0..quotas.len()).filter(|&i| matches(&quotas[i], resource)).collect();
    if limited && matching.is_empty() {
        return Err(Refusal::Uncovered { resources: resource.to_owned() });
    }
    for &i in &matching {
        let used = quotas[i].status.as_ref().and_then(|s| s.used.as_ref());
        if !used.is_some_and(|u| u.contains_key(resource)) {
            return Err(Refusal::StatusUnknown { quota: name(&quotas[i]), resources: resource.to_owned() });
        }
    }
    let mut out = quotas.to_vec();
    for &i in &matching {
        let q = &quotas[i];
        let status = q.status.as_ref().expect("a matching quota has a status");
        let hard = &status.hard.as_ref().expect("a matching quota has status.hard")[resource];
        let used = &status.used.as_ref().expect("checked above")[resource];
        // A fractional limit admits only whole objects below it; a fractional usage counts as the next whole one.
        let limit = count(hard, Round::Down).ok_or_else(|| unreadable(q, "status.hard", resource, hard))?;
        let now = count(used, Round::Up).ok_or_else(|| unreadable(q, "status.used", resource, used))?;
        if now + 1 > limit {
            return Err(Refusal::Exceeded {
                quota: name(q),
                requested: format!("{resource}=1"),
                used: format!("{resource}={}", used.0),
                limited: format!("{resource}={}", hard.0),
            });
        }
        let used = out[i].status.as_mut().and_then(|s| s.used.as_mut()).expect("checked above");
        used.insert(resource.to_owned(), Quantity((now + 1).to_string()));
    }
    Ok(out)
}

fn name(q: &ResourceQuota) -> String {
    q.metadata.name.clone().unwrap_or_default()
}

fn unreadable(q: &ResourceQuota, field: &str, resource: &str, value: &Quantity) -> Refusal {
    Refusal::Unreadable { quota: name(q), field: format!("{field}[{resource:?}]"), value: value.0.clone() }
}

/// The `status.used` of each quota, for telling which a charge changed.
pub(crate) fn used(quota: &ResourceQuota) -> Option<&BTreeMap<String, Quantity>> {
    quota.status.as_ref().and_then(|s| s.used.as_ref())
}

/// Which way a fractional count goes.
#[derive(Clone, Copy)]
pub(crate) enum Round {
    Down,
    Up,
}

/// A count as a quantity writes it: a whole number, with an optional decimal (k, M, G, T, P, E) or binary (Ki …
/// Ei) suffix, or in exponent form (`1e3`); a fraction goes the way `round` says.
pub(crate) fn count(q: &Quantity, round: Round) -> Option<i64> {
    let s = q.0.trim();
    let (number, multiplier): (&str, f64) = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
        ("m", 1e-3),
    ]
    .iter()
    .find_map(|(suffix, m)| s.strip_suffix(suffix).map(|n| (n, *m)))
    .unwrap_or((s, 1.0));
    if number.is_empty() || !number.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-' || c == '.') {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let value = match round {
        Round::Down => (value * multiplier).floor(),
        Round::Up => (value * multiplier).ceil(),
    };
    (value.is_finite() && value.abs() < 9.0e18).then_some(value as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ResourceQuotaSpec, ResourceQuotaStatus};
    use kube::api::ObjectMeta;

    const R: &str = "count/podsets.demo.k8s.io";

    fn quota(name: &str, hard: Option<&str>, used: Option<&str>) -> ResourceQuota {
        let map = |v: Option<&str>| v.map(|v| BTreeMap::from([(R.to_owned(), Quantity(v.into()))]));
        ResourceQuota {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(ResourceQuotaSpec { hard: map(hard), ..Default::default() }),
            status: Some(ResourceQuotaStatus { hard: map(hard), used: map(used) }),
        }
    }

    #[test]
    fn counts_read_as_quantities() {
        for (text, n) in [("5", 5), ("0", 0), ("1k", 1000), ("2Ki", 2048), ("1e3", 1000), ("1500m", 2), ("+3", 3)] {
            assert_eq!(count(&Quantity(text.into()), Round::Up), Some(n), "{text}");
        }
        assert_eq!(count(&Quantity("2500m".into()), Round::Down), Some(2));
        assert_eq!(count(&Quantity("0.5".into()), Round::Down), Some(0));
        for bad in ["", "many", "k", "1x", "--1"] {
            assert_eq!(count(&Quantity(bad.into()), Round::Up), None, "{bad}");
        }
    }

    #[test]
    fn a_create_is_charged_to_every_matching_quota_until_one_is_full() {
        let quotas = [quota("a", Some("2"), Some("1")), quota("b", Some("5"), Some("0"))];
        let charged = charge(&quotas, R, false).unwrap();
        assert_eq!(used(&charged[0]).unwrap()[R].0, "2");
        assert_eq!(used(&charged[1]).unwrap()[R].0, "1");
        let e = charge(&charged, R, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "exceeded quota: a, requested: count/podsets.demo.k8s.io=1, used: count/podsets.demo.k8s.io=2, limited: count/podsets.demo.k8s.io=2"
        );
    }

    #[test]
    fn quotas_that_do_not_count_the_resource_or_have_no_status_yet() {
        // Only status.hard counts: a quota the controller has not filled in matches nothing yet.
        let mut fresh = quota("fresh", Some("1"), None);
        fresh.status = None;
        assert_eq!(charge(&[fresh], R, false).unwrap().len(), 1);
        let other = quota("other", Some("1"), Some("1"));
        assert!(charge(&[other], "count/configmaps", false).is_ok());
        let mut scoped = quota("scoped", Some("1"), Some("1"));
        scoped.spec.as_mut().unwrap().scopes = Some(vec!["BestEffort".into()]);
        assert!(charge(&[scoped], R, false).is_ok(), "a quota with scopes never matches an object count");
        let e = charge(&[quota("new", Some("1"), None)], R, false).unwrap_err();
        assert_eq!(e.to_string(), "status unknown for quota: new, resources: count/podsets.demo.k8s.io");
        assert_eq!(
            charge(&[], R, true).unwrap_err().to_string(),
            "insufficient quota to consume: count/podsets.demo.k8s.io"
        );
        // A fractional limit admits only whole PodSets below it, as kube compares used + 1 <= hard exactly.
        let e = charge(&[quota("half", Some("2500m"), Some("2"))], R, false).unwrap_err();
        assert!(e.to_string().starts_with("exceeded quota: half"), "{e}");
        assert!(charge(&[quota("half", Some("0.5"), Some("0"))], R, false).is_err());
        let e = charge(&[quota("odd", Some("lots"), Some("0"))], R, false).unwrap_err();
        assert!(matches!(e, Refusal::Unreadable { .. }), "{e}");
    }
}
