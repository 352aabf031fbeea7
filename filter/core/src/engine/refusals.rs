//! Refused keys a worker answers itself until they could fit again (the deny cache), and the
//! Redis restarts it is up to date with.
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
//! persistence, a flush, an eviction). A restart also empties Redis's script cache, and its
//! functions unless its snapshot held the library; the engine clears this cache on the
//! `NOSCRIPT` or `ERR Function not found` that follows. The other cases (a restart that loaded
//! the library from its snapshot among them) can refuse a key until its retry instant at most —
//! a false refusal, never an overshoot. Units given back to
//! a key (a lease's give-back, a split's refund) make its refusal forgotten, and a reply to a
//! call sent before the latest restart puts no refusal back.

use super::queue::{Outcome, Sent};
use crate::bounds::OVERRIDE_STALE_MS;
use crate::check::LimitCheck;
use crate::decision::{Decision, LimitResult, Override};
use crate::expiring::ExpiringMap;
use crate::request::plan::Plan;
use crate::time::UnixNs;

/// What Redis said about one refused limit, and until when it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Until this instant (the worker's clock) the limit refuses `cost` or more.
    pub until_ns: UnixNs,
    /// The limit is whole again at this instant (for the `Reset` headers).
    pub reset_at_ns: UnixNs,
    pub cost: u64,
    /// The identity's override that refused it, if one did.
    pub overridden: Option<Override>,
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
    pub fn covering(&self, key: &str, cost: u64, now_ns: UnixNs) -> Option<Refusal> {
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

/// The deny cache, and the Redis restarts it is up to date with.
#[derive(Debug, Default)]
pub struct Refusals {
    cache: DenyCache,
    /// Redis restarts (seen by any worker) this worker is up to date with: a refusal outlives
    /// a restart another worker noticed by one tick at most.
    restarts_seen: u64,
    /// Times the cache was emptied for a restart: a call records it when sent, and a refusal
    /// it brings back after a later one is not remembered.
    epoch: u64,
}

impl Refusals {
    /// At most `capacity` keys; 0 remembers nothing.
    pub fn new(capacity: usize) -> Self {
        Refusals {
            cache: DenyCache::new(capacity),
            ..Default::default()
        }
    }

    /// What a call sent now records (see [`Refusals::remember`]).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// This worker saw Redis restart (its scripts were gone); `restarts` is the count shared
    /// by the workers, if the host shares one. True if refusals were forgotten.
    pub fn restarted(&mut self, restarts: Option<u64>) -> bool {
        if let Some(n) = restarts {
            self.restarts_seen = n;
        }
        self.reset()
    }

    /// The restarts any worker saw: if another one saw one, its refusals are forgotten here
    /// too. True if refusals were forgotten.
    pub fn sync(&mut self, restarts: u64) -> bool {
        if restarts == self.restarts_seen {
            return false;
        }
        self.restarts_seen = restarts;
        self.reset()
    }

    fn reset(&mut self) -> bool {
        self.epoch = self.epoch.wrapping_add(1);
        let forgot = !self.cache.is_empty();
        self.cache.clear();
        forgot
    }

    /// Whether an enforced limit of `plan` is known to refuse it at `now`.
    pub fn refuses(&self, plan: &Plan, now: UnixNs) -> bool {
        plan.checks
            .iter()
            .any(|c| !c.mode.is_shadow() && self.cache.covering(&c.key, c.cost, now).is_some())
    }

    /// The refusal of a request of `plan` at `now`, if an enforced limit is known to refuse
    /// it: those limits, and what they say (retry and reset times).
    pub fn refusal(&self, plan: &Plan, now: UnixNs) -> Option<(Vec<LimitCheck>, Decision)> {
        if self.cache.is_empty() {
            return None;
        }
        let mut checks: Vec<LimitCheck> = Vec::new();
        let mut limits: Vec<LimitResult> = Vec::new();
        for check in plan.checks.iter().filter(|c| !c.mode.is_shadow()) {
            if let Some(r) = self.cache.covering(&check.key, check.cost, now) {
                let ms = |at: UnixNs| at.since(now) as f64 / 1e6;
                checks.push(check.clone());
                limits.push(LimitResult {
                    allowed: false,
                    remaining: 0.0,
                    reset_ms: ms(r.reset_at_ns),
                    // A block without expiry has no time to wait for, whatever the cache's.
                    retry_ms: match (r.overridden, r.reset_at_ns > now) {
                        (Some(Override::Blocked), false) => 0.0,
                        _ => ms(r.until_ns),
                    },
                    over_budget: false,
                    overridden: r.overridden,
                    bad_override: false,
                    never_fits: false,
                });
            }
        }
        if checks.is_empty() {
            return None;
        }
        let decision = Decision {
            allowed: false,
            limits,
            leased: 0,
        };
        Some((checks, decision))
    }

    /// Remembers what Redis refused of `plan` in `decision`, until the instant it would fit
    /// (from the clock the call was `sent` with). Not from a call sent before the latest
    /// restart: its reply can come after the cache was emptied and put back what the restart
    /// undid.
    pub fn remember(&mut self, plan: &Plan, outcome: &Outcome, sent: Option<Sent>) {
        let (Outcome::Decided(decision), Some(sent)) = (outcome, sent) else {
            return;
        };
        if sent.epoch != self.epoch || decision.allowed {
            return;
        }
        for (check, result) in plan.checks.iter().zip(&decision.limits) {
            // A concurrency hold may be released at any moment: its refusal is never kept. A request
            // that never fits has no instant to hold its refusal until (and an override or a
            // new config may raise the limit): each is asked again, and answered so again.
            let holds = check.mode.takes_hold();
            if !result.allowed && !check.mode.is_shadow() && !holds && !result.never_fits {
                let at = |ms: f64| sent.at_ns.plus_ns((ms * 1e6) as u128);
                let mut until_ns = at(result.retry_ms);
                if check.overrides {
                    // An operator may raise, lift or reset it at any time; a block without
                    // expiry (retry 0) is held for the bound too.
                    let stale = at(OVERRIDE_STALE_MS as f64);
                    until_ns = match result.overridden {
                        Some(Override::Blocked) if result.retry_ms == 0.0 => stale,
                        _ => until_ns.min(stale),
                    };
                }
                let refusal = Refusal {
                    until_ns,
                    reset_at_ns: at(result.reset_ms),
                    cost: check.cost,
                    overridden: result.overridden,
                };
                self.cache.insert(&check.key, refusal);
            }
        }
    }

    /// Keys refused.
    #[cfg(test)]
    pub fn refused_keys(&self) -> usize {
        self.cache.len()
    }

    /// Units are given back to these limits (a settlement below zero, a release, a refund):
    /// a request the cache would refuse until its Retry-After may fit sooner, so their keys
    /// are asked again.
    pub fn given_back<'a>(&mut self, checks: impl IntoIterator<Item = &'a LimitCheck>) {
        for check in checks {
            self.cache.forget(&check.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::plan::{plan_of, token_bucket_check};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn at(ns: u128) -> UnixNs {
        UnixNs::from_ns(ns)
    }

    fn refusal(until_ns: u128, cost: u64) -> Refusal {
        Refusal {
            until_ns: at(until_ns),
            reset_at_ns: at(until_ns + 1000),
            cost,
            overridden: None,
        }
    }

    #[test]
    fn covers_until_the_instant_and_only_costs_at_least_as_large() {
        let mut cache = DenyCache::new(10);
        cache.insert("k", refusal(1000, 3));
        assert_eq!(cache.covering("k", 3, at(999)), Some(refusal(1000, 3)));
        assert_eq!(cache.covering("k", 5, at(0)), Some(refusal(1000, 3)));
        assert_eq!(
            cache.covering("k", 2, at(500)),
            None,
            "a smaller cost may fit"
        );
        assert_eq!(
            cache.covering("k", 3, at(1000)),
            None,
            "expired exactly at until"
        );
        assert_eq!(cache.covering("other", 3, at(500)), None);
    }

    #[test]
    fn a_newer_refusal_replaces_the_older() {
        let mut cache = DenyCache::new(10);
        cache.insert("k", refusal(1000, 3));
        cache.insert("k", refusal(2000, 1));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.covering("k", 1, at(1500)), Some(refusal(2000, 1)));
    }

    #[test]
    fn when_full_the_first_to_expire_goes_first() {
        let mut cache = DenyCache::new(3);
        cache.insert("late", refusal(9000, 1));
        cache.insert("expired", refusal(100, 1));
        cache.insert("soon", refusal(3000, 1));
        cache.insert("new", refusal(5000, 1));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.covering("expired", 1, at(0)), None, "evicted first");
        cache.insert("newer", refusal(6000, 1));
        assert_eq!(
            cache.covering("soon", 1, at(0)),
            None,
            "then the soonest to expire"
        );
        for key in ["late", "new", "newer"] {
            assert!(cache.covering(key, 1, at(0)).is_some(), "{key} kept");
        }
    }

    #[test]
    fn zero_capacity_keeps_nothing() {
        let mut cache = DenyCache::new(0);
        cache.insert("k", refusal(1000, 1));
        assert!(cache.is_empty());
        assert_eq!(cache.covering("k", 1, at(0)), None);
    }

    /// A plan of one enforced limit on `key`, cost 1.
    fn plan_on(key: &str) -> Plan {
        plan_of(vec![token_bucket_check(key)])
    }

    fn refused(retry_ms: f64) -> Outcome {
        Outcome::Decided(Decision {
            allowed: false,
            limits: vec![LimitResult {
                allowed: false,
                remaining: 0.0,
                reset_ms: 2.0 * retry_ms,
                retry_ms,
                over_budget: false,
                overridden: None,
                bad_override: false,
                never_fits: false,
            }],
            leased: 0,
        })
    }

    #[test]
    fn a_request_that_never_fits_is_not_held() {
        let mut r = Refusals::new(10);
        let a = plan_on("a");
        let sent = Sent {
            at_ns: at(1_000),
            epoch: r.epoch(),
        };
        let Outcome::Decided(mut decision) = refused(0.0) else {
            unreachable!()
        };
        decision.limits[0].never_fits = true;
        r.remember(&a, &Outcome::Decided(decision), Some(sent));
        assert_eq!(r.refused_keys(), 0);
    }

    #[test]
    fn refusals_hold_until_a_restart_a_give_back_or_their_retry_time() {
        let mut r = Refusals::new(10);
        let (a, b) = (plan_on("a"), plan_on("b"));
        let sent = Sent {
            at_ns: at(1_000),
            epoch: r.epoch(),
        };
        r.remember(&a, &refused(1.0), Some(sent));
        r.remember(&b, &refused(1.0), Some(sent));
        assert!(r.refuses(&a, at(1_000_999)) && !r.refuses(&a, at(1_001_000)));
        let (checks, decision) = r.refusal(&a, at(500_000)).unwrap();
        assert_eq!(checks.len(), 1);
        assert_eq!(decision.limits[0].retry_ms, 0.501);
        // Units given back to a key: its refusal is forgotten, the other's kept.
        r.given_back(&a.checks);
        assert!(!r.refuses(&a, at(2_000)) && r.refuses(&b, at(2_000)));
        // Another worker saw a restart: everything is forgotten once, ...
        assert!(r.sync(1));
        assert!(!r.sync(1), "once per restart");
        assert!(!r.refuses(&b, at(2_000)));
        // ... and a reply to a call sent before it puts nothing back.
        r.remember(&b, &refused(1.0), Some(sent));
        assert!(!r.refuses(&b, at(2_000)));
        let now = Sent {
            at_ns: at(1_000),
            epoch: r.epoch(),
        };
        r.remember(&b, &refused(1.0), Some(now));
        assert!(r.refuses(&b, at(2_000)));
        // Seen here (NOSCRIPT): forgotten too, the shared count taken.
        assert!(r.restarted(Some(2)));
        assert!(!r.sync(2));
        assert!(!r.restarted(None), "nothing left to forget");
        // A failure is not a refusal.
        let failed = Outcome::Failed(crate::bridge::BridgeFailure::NoResponse);
        r.remember(
            &a,
            &failed,
            Some(Sent {
                at_ns: at(0),
                epoch: r.epoch(),
            }),
        );
        assert_eq!(r.refused_keys(), 0);
    }
}
