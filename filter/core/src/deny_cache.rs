//! Refused keys a worker answers itself until they could fit again.
//!
//! Why this changes no decision: when Redis refuses a request of cost `c` on a limit at time
//! `t` with a retry time `r`, that limit cannot allow `c` units before `t + r` — tokens (or
//! window room) only come back with time, and every other request, from any replica, can only
//! spend them. A request of cost `c' >= c` needs at least as long. So until `t + r`, Redis
//! would refuse such a request on that limit too, and since a request is all or nothing, the
//! whole request: answering it locally gives the same answer without asking. The instant is
//! taken from the moment the call was SENT (never later than Redis's own decision), so the
//! entry never outlives the refusal it copies.
//!
//! The one way tokens come back early is Redis losing its state (a restart without
//! persistence, a flush, an eviction). A restart also empties Redis's script cache, and the
//! engine clears this cache on the `NOSCRIPT` that follows; the other cases can refuse a key
//! until its retry instant at most — a false refusal, never an overshoot.

use crate::expiring::ExpiringMap;

/// What Redis said about one refused limit, and until when it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Until this instant (Unix ns, the worker's clock) the limit refuses `cost` or more.
    pub until_ns: u128,
    /// The limit is whole again at this instant (for the `Reset` headers).
    pub reset_at_ns: u128,
    pub cost: u64,
}

/// A bounded map from a limit's Redis key to its latest refusal; when full, the refusal that
/// expires first (an expired one, if any) makes room.
#[derive(Debug, Default)]
pub struct DenyCache {
    entries: ExpiringMap<Refusal>,
}

impl DenyCache {
    /// A cache of at most `capacity` keys; 0 keeps nothing.
    pub fn new(capacity: usize) -> Self {
        DenyCache {
            entries: ExpiringMap::new(capacity),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets every refusal: Redis lost its state (it restarted), so a refusal it made
    /// before may no longer hold.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// The refusal that still covers a request of `cost` on `key` at `now_ns`.
    pub fn covering(&self, key: &str, cost: u64, now_ns: u128) -> Option<Refusal> {
        self.entries
            .get(key)
            .filter(|r| now_ns < r.until_ns && cost >= r.cost)
            .copied()
    }

    /// Forgets the refusal of `key`: units were given back to it, so it may fit sooner.
    pub fn forget(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Remembers a refusal (replacing the key's older one).
    pub fn insert(&mut self, key: &str, refusal: Refusal) {
        self.entries.insert(key, refusal.until_ns, refusal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn refusal(until_ns: u128, cost: u64) -> Refusal {
        Refusal {
            until_ns,
            reset_at_ns: until_ns + 1000,
            cost,
        }
    }

    #[test]
    fn covers_until_the_instant_and_only_costs_at_least_as_large() {
        let mut cache = DenyCache::new(10);
        cache.insert("k", refusal(1000, 3));
        assert_eq!(cache.covering("k", 3, 999), Some(refusal(1000, 3)));
        assert_eq!(cache.covering("k", 5, 0), Some(refusal(1000, 3)));
        assert_eq!(cache.covering("k", 2, 500), None, "a smaller cost may fit");
        assert_eq!(
            cache.covering("k", 3, 1000),
            None,
            "expired exactly at until"
        );
        assert_eq!(cache.covering("other", 3, 500), None);
    }

    #[test]
    fn a_newer_refusal_replaces_the_older() {
        let mut cache = DenyCache::new(10);
        cache.insert("k", refusal(1000, 3));
        cache.insert("k", refusal(2000, 1));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.covering("k", 1, 1500), Some(refusal(2000, 1)));
    }

    #[test]
    fn when_full_the_first_to_expire_goes_first() {
        let mut cache = DenyCache::new(3);
        cache.insert("late", refusal(9000, 1));
        cache.insert("expired", refusal(100, 1));
        cache.insert("soon", refusal(3000, 1));
        cache.insert("new", refusal(5000, 1));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.covering("expired", 1, 0), None, "evicted first");
        cache.insert("newer", refusal(6000, 1));
        assert_eq!(
            cache.covering("soon", 1, 0),
            None,
            "then the soonest to expire"
        );
        for key in ["late", "new", "newer"] {
            assert!(cache.covering(key, 1, 0).is_some(), "{key} kept");
        }
    }

    #[test]
    fn zero_capacity_keeps_nothing() {
        let mut cache = DenyCache::new(0);
        cache.insert("k", refusal(1000, 1));
        assert!(cache.is_empty());
        assert_eq!(cache.covering("k", 1, 0), None);
    }
}
