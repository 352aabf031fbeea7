//! A bounded map whose entries each matter until an instant: when full, the entry that stops
//! mattering first makes room (those that already have, before any other). The deny cache
//! and the `local` failure mode's state both live in one.

use std::collections::{BTreeSet, HashMap};

use crate::time::UnixNs;

#[derive(Debug)]
pub struct ExpiringMap<V> {
    capacity: usize,
    entries: HashMap<String, (UnixNs, V)>,
    /// (expiry, key): the first to expire comes first.
    by_expiry: BTreeSet<(UnixNs, String)>,
}

impl<V> Default for ExpiringMap<V> {
    fn default() -> Self {
        ExpiringMap::new(0)
    }
}

impl<V> ExpiringMap<V> {
    /// A map of at most `capacity` keys; 0 keeps nothing.
    pub fn new(capacity: usize) -> Self {
        ExpiringMap {
            capacity,
            entries: HashMap::new(),
            by_expiry: BTreeSet::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        self.entries.get(key).map(|(_, v)| v)
    }

    /// Puts `value` under `key` until `expires` (replacing what was there).
    pub fn insert(&mut self, key: &str, expires: UnixNs, value: V) {
        if self.capacity == 0 {
            return;
        }
        if let Some((old, _)) = self.entries.remove(key) {
            self.by_expiry.remove(&(old, key.to_string()));
        }
        while self.entries.len() >= self.capacity {
            let Some((_, first)) = self.by_expiry.pop_first() else {
                break;
            };
            self.entries.remove(&first);
        }
        self.by_expiry.insert((expires, key.to_string()));
        self.entries.insert(key.to_string(), (expires, value));
    }

    pub fn remove(&mut self, key: &str) {
        if let Some((expires, _)) = self.entries.remove(key) {
            self.by_expiry.remove(&(expires, key.to_string()));
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.by_expiry.clear();
    }
}
