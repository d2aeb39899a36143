//! Bounded, expiring caches for delegated decisions (TokenReview, SubjectAccessReview): a positive and a negative
//! answer are kept apart, each with its own lifetime, so a revoked permission or a fixed typo is seen soon.

use std::hash::Hash;
use std::time::Duration;

use moka::future::Cache;

#[derive(Debug, Clone, Copy)]
pub struct CacheLimits {
    pub allowed_ttl: Duration,
    pub denied_ttl: Duration,
    /// Entries per side.
    pub capacity: u64,
}

/// A decision and what it carries (a user for TokenReview, a reason for SubjectAccessReview).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<T> {
    Allowed(T),
    Denied(String),
}

pub struct DecisionCache<K, T> {
    allowed: Option<Cache<K, T>>,
    denied: Option<Cache<K, String>>,
}

fn side<K, V>(ttl: Duration, capacity: u64) -> Option<Cache<K, V>>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    (!ttl.is_zero() && capacity > 0).then(|| Cache::builder().max_capacity(capacity).time_to_live(ttl).build())
}

impl<K, T> DecisionCache<K, T>
where
    K: Hash + Eq + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
{
    /// A zero TTL turns that side off.
    pub fn new(limits: CacheLimits) -> Self {
        Self { allowed: side(limits.allowed_ttl, limits.capacity), denied: side(limits.denied_ttl, limits.capacity) }
    }

    pub async fn get(&self, key: &K) -> Option<Decision<T>> {
        if let Some(c) = &self.allowed {
            if let Some(v) = c.get(key).await {
                return Some(Decision::Allowed(v));
            }
        }
        self.denied.as_ref()?.get(key).await.map(Decision::Denied)
    }

    pub async fn insert(&self, key: K, decision: Decision<T>) {
        match decision {
            Decision::Allowed(v) => {
                if let Some(c) = &self.allowed {
                    c.insert(key, v).await;
                }
            }
            Decision::Denied(reason) => {
                if let Some(c) = &self.denied {
                    c.insert(key, reason).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(allowed_ms: u64, denied_ms: u64, capacity: u64) -> CacheLimits {
        CacheLimits {
            allowed_ttl: Duration::from_millis(allowed_ms),
            denied_ttl: Duration::from_millis(denied_ms),
            capacity,
        }
    }

    #[tokio::test]
    async fn allowed_and_denied_expire_on_their_own_clocks() {
        let c: DecisionCache<&str, u8> = DecisionCache::new(limits(600, 150, 100));
        c.insert("a", Decision::Allowed(1)).await;
        c.insert("d", Decision::Denied("no".into())).await;
        assert_eq!(c.get(&"a").await, Some(Decision::Allowed(1)));
        assert_eq!(c.get(&"d").await, Some(Decision::Denied("no".into())));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(c.get(&"d").await, None, "the denial outlived its TTL");
        assert_eq!(c.get(&"a").await, Some(Decision::Allowed(1)), "the allowance expired too early");
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert_eq!(c.get(&"a").await, None, "the allowance outlived its TTL");
    }

    /// Entries held now (after pending evictions), allowed and denied.
    async fn len<K, T>(c: &DecisionCache<K, T>) -> (u64, u64)
    where
        K: Hash + Eq + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        let (a, d) = (c.allowed.as_ref().unwrap(), c.denied.as_ref().unwrap());
        a.run_pending_tasks().await;
        d.run_pending_tasks().await;
        (a.entry_count(), d.entry_count())
    }

    #[tokio::test]
    async fn each_side_is_bounded() {
        let c: DecisionCache<u32, u32> = DecisionCache::new(limits(60_000, 60_000, 50));
        for i in 0..5_000 {
            c.insert(i, Decision::Allowed(i)).await;
            c.insert(i + 1_000_000, Decision::Denied(String::new())).await;
        }
        let (allowed, denied) = len(&c).await;
        assert!(allowed <= 50, "{allowed} allowed entries kept");
        assert!(denied <= 50, "{denied} denied entries kept");
        assert!(allowed > 0 && denied > 0);
    }

    #[tokio::test]
    async fn zero_ttl_disables_a_side() {
        let c: DecisionCache<u8, u8> = DecisionCache::new(limits(1000, 0, 10));
        c.insert(1, Decision::Denied("x".into())).await;
        c.insert(2, Decision::Allowed(2)).await;
        assert_eq!(c.get(&1).await, None);
        assert_eq!(c.get(&2).await, Some(Decision::Allowed(2)));
        let c: DecisionCache<u8, u8> = DecisionCache::new(limits(0, 1000, 10));
        c.insert(1, Decision::Denied("x".into())).await;
        c.insert(2, Decision::Allowed(2)).await;
        assert_eq!(c.get(&1).await, Some(Decision::Denied("x".into())), "denials kept with allowances off");
        assert_eq!(c.get(&2).await, None);
    }
}
