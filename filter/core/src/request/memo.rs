//! The finished Redis keys of the identities a worker saw last ([`PlanMemo`]), so that the
//! planner makes a returning caller's keys without SHA-1 and formatting.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::rc::Rc;

use super::identity::label;
use super::keys::{budget_check, redis_key};
pub use crate::bounds::{MAX_MEMO_IDENTITY, PLAN_MEMO_ENTRIES};
use crate::check::BudgetCheck;
use crate::config::{Config, Rule};

/// A rule's Redis keys for one identity (rule, key alternative, identity bytes), per limit:
/// the limit's key (the unsharded key for a sharded limit) and, unsharded, its budget check.
struct MemoEntry {
    rule: usize,
    alternative: usize,
    identity: Box<[u8]>,
    limits: Box<[Memoized]>,
}

pub(super) struct Memoized {
    pub(super) key: Rc<str>,
    /// None for a sharded limit: its budget follows the shard's key, made per request.
    pub(super) budget: Option<Rc<BudgetCheck>>,
}

/// The finished keys of the identities a worker saw last, so a returning caller costs no SHA-1
/// and no key formatting. One per worker, owned by its engine, which is made anew with each
/// configuration: entries hold rule indexes and keys of the configuration they were made with.
///
/// Bounded: at most `capacity` entries (rounded up to even) in sets of two, picked by a keyed
/// hash of the entry's (rule, alternative, identity); a new entry evicts the less recently used
/// of its set. An entry holds an identity of at most [`MAX_MEMO_IDENTITY`] bytes and one key
/// per limit of its rule (at most 16, plus the budget keys of a rule with a key budget): with
/// [`PLAN_MEMO_ENTRIES`], rules of one or two limits and keys of ~100 bytes, under 1 MB per
/// worker. A caller flooding fresh identities only evicts others' entries: they are made again
/// (the cost of a plan without the memo, ~10% more for the copy into the entry), never wrong.
pub struct PlanMemo {
    /// `2 * sets` entries, allocated on the first insert; set `i` is entries `2i` (the most
    /// recently used) and `2i + 1`.
    entries: Vec<Option<MemoEntry>>,
    sets: usize,
    hasher: RandomState,
    /// The identity being resolved, kept between requests to reuse its allocation (the
    /// planner borrows it).
    pub(super) identity: Vec<u8>,
    /// The keys of an identity that is not memoized (too long, or capacity 0).
    spare: Vec<Memoized>,
}

impl Default for PlanMemo {
    fn default() -> Self {
        PlanMemo::with_capacity(PLAN_MEMO_ENTRIES)
    }
}

impl std::fmt::Debug for PlanMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanMemo")
            .field("entries", &self.len())
            .field("capacity", &(2 * self.sets))
            .finish()
    }
}

impl PlanMemo {
    /// A memo of at most `capacity` entries (rounded up to even); 0 memoizes nothing.
    pub fn with_capacity(capacity: usize) -> Self {
        PlanMemo {
            entries: Vec::new(),
            sets: capacity.div_ceil(2),
            hasher: RandomState::new(),
            identity: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.entries.iter().filter(|s| s.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys of rule `r`'s limits for this identity, made on a miss.
    pub(super) fn keys(
        &mut self,
        config: &Config,
        r: usize,
        alternative: usize,
        identity: &[u8],
    ) -> &[Memoized] {
        let Some(rule) = config.rules.get(r) else {
            return &[];
        };
        if self.sets == 0 || identity.len() > MAX_MEMO_IDENTITY {
            self.spare = memoized(config, rule, alternative, identity);
            return &self.spare;
        }
        if self.entries.is_empty() {
            self.entries.resize_with(2 * self.sets, || None);
        }
        // Modulo, not a mask: any capacity works, and one division is nothing next to SHA-1.
        let set = (self.hasher.hash_one((r, alternative, identity)) % self.sets as u64) as usize;
        let (first, second) = (2 * set, 2 * set + 1);
        let holds = |entry: &Option<MemoEntry>| {
            entry.as_ref().is_some_and(|e| {
                e.rule == r && e.alternative == alternative && *e.identity == *identity
            })
        };
        if holds(&self.entries[second]) {
            self.entries.swap(first, second);
        } else if !holds(&self.entries[first]) {
            // A miss: the older entry of the set goes, the newer becomes the older.
            self.entries.swap(first, second);
            self.entries[first] = Some(MemoEntry {
                rule: r,
                alternative,
                identity: identity.into(),
                limits: memoized(config, rule, alternative, identity).into(),
            });
        }
        self.entries[first].as_ref().map_or(&[], |e| &e.limits[..])
    }
}

/// What the memo keeps for one identity of `rule`: made the way a plan without memo makes it.
fn memoized(config: &Config, rule: &Rule, alternative: usize, identity: &[u8]) -> Vec<Memoized> {
    let label = label(&rule.key, alternative);
    rule.limits
        .iter()
        .map(|limit| {
            let key: Rc<str> = redis_key(config, rule, limit, label, identity).into();
            let budget = match &rule.key_budget {
                Some(b) if limit.shards <= 1 => {
                    Some(Rc::new(budget_check(config, rule, limit, b, &key)))
                }
                _ => None,
            };
            Memoized { key, budget }
        })
        .collect()
}
