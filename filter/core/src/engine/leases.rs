//! Leases: units of token-bucket, GCRA and fixed-window limits that one worker took from Redis
//! ahead of use and spends locally, so allowed requests of a busy identity need no call and no
//! wait.
//!
//! Why no limit is exceeded: the script charges a lease's units in Redis before any request
//! uses them, all or nothing over the request's limits, so Redis never hands out more than
//! the limit holds. A unit charged early and spent later is the same as one spent at its
//! charge as long as the bucket in Redis has not been full since (then no refill was lost to
//! the cap because of it), or for a fixed window, as long as its window lasts: the reply's
//! `reset_ms` is the earliest the bucket can be full again (the window end),
//! so a grant is spent only until then (less the clock skew allowed between replicas, whose
//! clocks also refill the bucket) and never longer than `lease.max_ms`. What is left after that
//! is given back by the script's refund, which gives back only what the charge still holds
//! back (see `lua/lib.lua`).
//!
//! A key earns a lease: a request asks for one only once its identity came [`EARN`] times
//! within one lease's `max_ms` (so a lease is likely to be spent); until then, and while the
//! key's last lease came back unspent, its requests go as plain decisions, with no lease
//! mode on the wire and no ask held. An identity that comes back now and then so costs no
//! more with leases on than with them off.
//!
//! The table owns the whole ask cycle: a waiting request that asks for a lease holds a
//! [`Ticket`] (no second ask for its keys meanwhile) that its call's outcome settles, a lease
//! that runs low asks for the next ahead (a prefetch), and what grants held past their end is
//! grouped into give-back calls.

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use crate::check::LimitCheck;
use crate::config::Config;
use crate::decision::{Decision, LimitResult, Refund};
use crate::request::plan::Plan;
use crate::time::UnixNs;

use super::packing::pack;
use super::sightings::{Sightings, SEEN};
use super::slots;
use crate::bounds::MAX_GIVE_BACK_CALLS;
pub use crate::bounds::MAX_LEASED_KEYS;

/// Requests of a key, within one lease's `max_ms`, that earn it a lease (the last of them
/// asks): an identity seen this often spends a lease's units before it ends. One seen less
/// often (say a client back about once a `max_ms`, at random gaps) would be granted units
/// it mostly gives back: each grant costs a lease-mode decision and a give-back, and saves a
/// batched decision at most.
pub const EARN: usize = SEEN + 1;

/// What a worker asks for the first time it leases a key, in requests' worth: what the
/// identity just showed it spends within a lease's time.
const FIRST_ASK: u64 = EARN as u64;

/// The smallest ask after a lease that was not spent: the request and one more.
const LEAST_ASK: u64 = 2;

/// The largest ask (the call asks for `max_units` at most anyway): doubling stops here.
const MOST_ASK: u64 = 1 << 30;

/// A key without a lease is remembered this long after its last lease ended (its ask, so a
/// client that comes back at its own pace gets a lease of its size, not the first one). A key
/// never leased is remembered only as long as its requests may still earn it one.
const KEEP_IDLE_NS: u128 = 10_000_000_000;

/// A lease asked for by a waiting request: no other ask for its keys goes while it is held,
/// and it is given back with its call's outcome ([`Leases::redeem`]) or without a call
/// ([`Leases::cancel`]).
#[derive(Debug)]
#[must_use]
pub struct Ticket {
    requests: u64,
    /// Asked for no request: units for the next requests of a lease that runs low.
    prefetch: bool,
}

impl Ticket {
    /// The requests' worth asked for (the worker's estimate of what the identity will spend).
    pub fn requests(&self) -> u64 {
        self.requests
    }
}

/// Units of one limit granted by one call.
#[derive(Debug, Clone)]
struct Grant {
    units: u64,
    /// The units and requests' worth it was granted with.
    granted: u64,
    requests: u64,
    /// After this the units are not spent but given back.
    expires_ns: UnixNs,
    /// The clock the grant was decided with, and the `remaining` it replied: what a refund of
    /// its units needs.
    charged_at_ns: UnixNs,
    left: f64,
    /// When the limit is whole again, as the grant's reply said (for headers).
    reset_at_ns: UnixNs,
}

/// The leases of one key (one limit of one identity).
#[derive(Debug)]
struct KeyLease {
    /// The limit as the grants charged it (for refunds).
    check: LimitCheck,
    /// Oldest first; spent in that order.
    grants: VecDeque<Grant>,
    /// A call asking for a lease of this key is in flight: no second one.
    asking: bool,
    /// Units of the last grant: the next is asked for when half of it is spent.
    last_units: u64,
    /// Requests' worth to ask for next: doubled when a lease is spent in less than half its
    /// time, twice what was spent of one that ended with units left (none after one that
    /// served no request, until the identity comes back within a lease's time). So a lease
    /// follows the identity's pace within `max_units`: a busy client gets large ones, one that
    /// comes back now and then gets small ones, and few units sit idle or go back.
    ask: u64,
    /// When this entry may be forgotten once it holds no grant.
    keep_until_ns: UnixNs,
    /// When the key's last requests came (served from a lease or not), newest first; the
    /// epoch: none.
    seen: [UnixNs; SEEN],
}

impl KeyLease {
    fn new(check: &LimitCheck) -> Self {
        KeyLease {
            check: check.clone(),
            grants: VecDeque::new(),
            asking: false,
            last_units: 0,
            ask: FIRST_ASK,
            keep_until_ns: UnixNs::default(),
            seen: [UnixNs::default(); SEEN],
        }
    }

    /// A request of this key came at `now`: whether it is the [`EARN`]th within `max_ns`.
    fn sighted(&mut self, now: UnixNs, max_ns: u128) -> bool {
        let oldest = self.seen[SEEN - 1];
        self.seen.rotate_right(1);
        self.seen[0] = now;
        oldest.as_ns() > 0 && now.since(oldest) <= max_ns
    }

    /// Units of unexpired grants.
    fn units(&self, now: UnixNs) -> u64 {
        self.grants
            .iter()
            .filter(|g| g.expires_ns > now)
            .map(|g| g.units)
            .sum()
    }
}

/// The leases of one worker, by key.
#[derive(Debug, Default)]
pub struct Leases {
    /// Keys that earned a lease (until forgotten, see `expire`).
    keys: HashMap<Rc<str>, KeyLease>,
    /// The last requests of the keys not in `keys`: which of them earn a lease.
    sightings: Sightings,
    /// Given-back units waiting for the next give-back call.
    returns: Vec<Refund>,
    /// Grants held (spent or not) over every key: each ends at its instant, when its unspent
    /// units go back.
    grants: usize,
}

impl Leases {
    /// A request of `plan` (not served from leases) asks for a lease, if every limit takes
    /// one, its keys earned one and would take more than the request alone, and no ask for
    /// them is in flight. None: it goes as a plain decision.
    pub fn ticket(&mut self, plan: &Plan, now: UnixNs) -> Option<Ticket> {
        if !plan.leasable() {
            return None;
        }
        let requests = self.ask(plan, now);
        if requests <= 1 || !self.may_ask(plan) {
            return None;
        }
        self.asking(plan, true);
        Some(Ticket {
            requests,
            prefetch: false,
        })
    }

    /// After a request of `plan` was served from leases: the ask for the next lease before
    /// these run out, so the requests after it do not wait at the boundary, if they run low.
    /// Redis Cluster: only for a plan on one slot (a call carries one slot's keys); the keys of a
    /// plan on several slots are refilled by their own single-slot requests.
    pub fn prefetch(&mut self, config: &Config, plan: &Plan, now: UnixNs) -> Option<Ticket> {
        if !self.runs_low(plan, now) || slots::spans_slots(config, plan) {
            return None;
        }
        self.asking(plan, true);
        // The request served just now was counted (`spend`): the size its keys learnt.
        let requests = plan
            .checks
            .iter()
            .filter_map(|c| self.keys.get(&c.key).map(|l| l.ask))
            .min()
            .unwrap_or(1);
        Some(Ticket {
            requests: requests.clamp(1, MOST_ASK),
            prefetch: true,
        })
    }

    /// The call of `ticket` (asked for `plan`) is over: `decided` is its decision and the
    /// clock it was made with, if it was decided. What an allowed decision granted is
    /// recorded (true), the units held for later requests counted in its `remaining`.
    pub fn redeem(
        &mut self,
        ticket: Ticket,
        plan: &Plan,
        decided: Option<(&mut Decision, UnixNs)>,
        skew: Duration,
    ) -> bool {
        self.asking(plan, false);
        let Some((decision, charged_at_ns)) = decided else {
            return false;
        };
        // A prefetch's own request's worth is units too.
        let requests = decision.leased + u64::from(ticket.prefetch);
        if !decision.allowed || requests == 0 {
            return false;
        }
        self.grant(plan, decision, requests, charged_at_ns, skew.as_nanos());
        true
    }

    /// The request holding `ticket` leaves without a call: its keys may ask again.
    pub fn cancel(&mut self, ticket: Ticket, plan: &Plan) {
        let Ticket { .. } = ticket;
        self.asking(plan, false);
    }

    /// The give-backs to send now, as calls ([`pack`]): at most [`MAX_GIVE_BACK_CALLS`], the
    /// rest waits for the next time.
    pub fn give_backs(&mut self, config: &Config) -> Vec<(Vec<Refund>, Duration)> {
        if self.returns.is_empty() {
            return Vec::new();
        }
        let packed = pack(config, self.take_returns(), MAX_GIVE_BACK_CALLS);
        self.keep_returns(packed.left);
        packed.calls
    }

    /// Serves a request from leased units if every limit of `plan` holds enough unexpired
    /// units for its cost: spends them and returns what the headers say (the lease's view of
    /// Redis: what its grant left, plus the units still held here).
    pub fn spend(&mut self, plan: &Plan, now: UnixNs) -> Option<Decision> {
        for check in &plan.checks {
            let lease = self.keys.get(&check.key)?;
            if lease.units(now) < check.cost {
                return None;
            }
        }
        let mut limits = Vec::with_capacity(plan.checks.len());
        for check in &plan.checks {
            let lease = self.keys.get_mut(&check.key)?;
            let max_ns = check
                .mode
                .lease()
                .map_or(0, |l| u128::from(l.max_ms) * 1_000_000);
            lease.sighted(now, max_ns);
            let mut owed = check.cost;
            for grant in lease.grants.iter_mut().filter(|g| g.expires_ns > now) {
                let take = owed.min(grant.units);
                grant.units -= take;
                owed -= take;
                let life = grant.expires_ns.since(grant.charged_at_ns);
                let used_for = now.since(grant.charged_at_ns);
                if take > 0 && grant.units == 0 && used_for.saturating_mul(2) < life {
                    // Spent in less than half its time: the identity can use larger leases.
                    // (Spent later, it was about the right size.)
                    lease.ask = lease
                        .ask
                        .max(grant.requests)
                        .saturating_mul(2)
                        .min(MOST_ASK);
                }
                if owed == 0 {
                    break;
                }
            }
            let held = lease.units(now);
            let newest = lease.grants.back();
            limits.push(LimitResult {
                allowed: true,
                remaining: newest.map_or(0.0, |g| g.left) + held as f64,
                reset_ms: newest.map_or(0.0, |g| g.reset_at_ns.since(now) as f64 / 1e6),
                retry_ms: 0.0,
                over_budget: false,
                overridden: None,
                bad_override: false,
                never_fits: false,
            });
        }
        Some(Decision {
            allowed: true,
            limits,
            leased: 0,
        })
    }

    /// How many requests' worth a request of `plan` asks for at `now` (1: none beyond
    /// itself): the smallest ask of its keys, each counting the request. A key that has not
    /// earned a lease (see [`EARN`]) asks for none (a key not in the table is counted in the
    /// sightings; once it earns one, it takes an entry if the table has room); one whose last
    /// lease served nothing asks for [`LEAST_ASK`] once it earns one again.
    fn ask(&mut self, plan: &Plan, now: UnixNs) -> u64 {
        let mut ask = u64::MAX;
        for check in &plan.checks {
            let max_ns = check
                .mode
                .lease()
                .map_or(0, |l| u128::from(l.max_ms) * 1_000_000);
            let room = self.keys.len() < MAX_LEASED_KEYS;
            let key_ask = match self.keys.get_mut(&check.key) {
                Some(lease) => {
                    // Kept while its requests may earn it a lease again (and after a lease,
                    // see `grant`).
                    lease.keep_until_ns = lease.keep_until_ns.max(now.plus_ns(max_ns));
                    match lease.sighted(now, max_ns) {
                        true => {
                            lease.ask = lease.ask.max(LEAST_ASK);
                            lease.ask
                        }
                        false => 1,
                    }
                }
                None if room => match self.sightings.sighted(&check.key, now, max_ns) {
                    None => 1,
                    Some(seen) => {
                        let mut lease = KeyLease::new(check);
                        lease.seen = seen;
                        lease.keep_until_ns = now.plus_ns(max_ns);
                        self.keys.insert(check.key.clone(), lease);
                        FIRST_ASK
                    }
                },
                None => 1,
            };
            ask = ask.min(key_ask);
        }
        ask.clamp(1, MOST_ASK)
    }

    /// Whether a request of `plan` may ask for a lease: no ask for its keys is in flight, and
    /// the table has room for them.
    fn may_ask(&self, plan: &Plan) -> bool {
        let new = plan
            .checks
            .iter()
            .filter(|c| !self.keys.contains_key(&c.key))
            .count();
        self.keys.len() + new <= MAX_LEASED_KEYS
            && plan
                .checks
                .iter()
                .all(|c| self.keys.get(&c.key).is_none_or(|l| !l.asking))
    }

    /// Whether `plan`'s leases run low with no ask in flight: time to ask for the next before
    /// they run out. On some limit, half of the last grant or less is left, and at the pace
    /// it was spent so far the rest goes before the grant ends (a client that comes back now
    /// and then is not sent units it would not spend in time).
    fn runs_low(&self, plan: &Plan, now: UnixNs) -> bool {
        plan.checks.iter().any(|c| {
            let Some(lease) = self.keys.get(&c.key) else {
                return false;
            };
            let held = lease.units(now);
            let Some(newest) = lease.grants.back() else {
                return false;
            };
            let spent = newest.granted.saturating_sub(newest.units);
            let elapsed = now.since(newest.charged_at_ns);
            let left = newest.expires_ns.since(now);
            held.saturating_mul(2) <= lease.last_units
                && u128::from(spent) * left >= u128::from(held) * elapsed
        }) && self.may_ask(plan)
    }

    /// A call asking for a lease of `plan`'s limits is on its way (`true`) or over.
    fn asking(&mut self, plan: &Plan, asking: bool) {
        for check in &plan.checks {
            match self.keys.get_mut(&check.key) {
                Some(lease) => lease.asking = asking,
                None if asking => {
                    let mut lease = KeyLease::new(check);
                    lease.asking = true;
                    self.keys.insert(check.key.clone(), lease);
                }
                None => {}
            }
        }
    }

    /// Records what `decision` (decided with the clock `charged_at_ns`) granted: `requests`
    /// requests' worth of each limit's cost. A grant that could not be spent before its
    /// bucket may be full again is given back at once. The decision's `remaining` then counts
    /// the units held here (what the client's headers say is left).
    fn grant(
        &mut self,
        plan: &Plan,
        decision: &mut Decision,
        requests: u64,
        charged_at_ns: UnixNs,
        skew_ns: u128,
    ) {
        for (check, result) in plan.checks.iter().zip(&mut decision.limits) {
            let Some(lease_config) = check.mode.lease() else {
                continue;
            };
            let units = requests.saturating_mul(check.cost);
            if units == 0 {
                continue;
            }
            let reset_ns = (result.reset_ms * 1e6) as u128;
            let usable_ns = reset_ns
                .saturating_sub(skew_ns)
                .min(u128::from(lease_config.max_ms) * 1_000_000);
            let grant = Grant {
                units,
                granted: units,
                requests,
                expires_ns: charged_at_ns.plus_ns(usable_ns),
                charged_at_ns,
                left: result.remaining,
                reset_at_ns: charged_at_ns.plus_ns(reset_ns),
            };
            let lease = self
                .keys
                .entry(check.key.clone())
                .or_insert_with(|| KeyLease::new(check));
            lease.last_units = units;
            lease.keep_until_ns = grant.expires_ns.plus_ns(KEEP_IDLE_NS);
            if usable_ns == 0 {
                self.returns.push(refund_of(&lease.check, &grant));
            } else {
                // What the headers of the request that asked count as held for later ones.
                let held = decision.leased.saturating_mul(check.cost).min(units);
                result.remaining += held as f64;
                lease.grants.push_back(grant);
                self.grants += 1;
            }
        }
    }

    /// Moves the units of grants expired by `now` to the give-backs, and forgets keys that
    /// hold nothing and have been idle a while (at once when the table is three quarters
    /// full, so there is room for new keys).
    pub fn expire(&mut self, now: UnixNs) {
        let crowded = self.crowded();
        let returns = &mut self.returns;
        let grants = &mut self.grants;
        self.keys.retain(|_, lease| {
            while let Some(grant) = lease.grants.front() {
                if grant.expires_ns > now {
                    break;
                }
                if grant.units > 0 {
                    returns.push(refund_of(&lease.check, grant));
                    let spent = grant.granted - grant.units;
                    let served = u128::from(spent) * u128::from(grant.requests)
                        / u128::from(grant.granted.max(1));
                    // Ask next for twice what this one served; after one that served no
                    // request, for none (the request alone) until the identity comes back
                    // within a lease's time (see `ask`).
                    lease.ask = match served {
                        0 => 1,
                        n => u64::try_from(n * 2)
                            .unwrap_or(MOST_ASK)
                            .clamp(LEAST_ASK, MOST_ASK),
                    };
                }
                lease.grants.pop_front();
                *grants = grants.saturating_sub(1);
            }
            lease.asking || !lease.grants.is_empty() || (!crowded && now < lease.keep_until_ns)
        });
    }

    /// Three quarters of the table are used: idle keys are forgotten at once (a new key must
    /// then earn its lease before the next expiry pass).
    fn crowded(&self) -> bool {
        self.keys.len() > MAX_LEASED_KEYS / 4 * 3
    }

    /// The units to give back, taken.
    fn take_returns(&mut self) -> Vec<Refund> {
        std::mem::take(&mut self.returns)
    }

    /// Give-backs not sent yet, for the next time; beyond [`MAX_LEASED_KEYS`] the oldest are
    /// dropped (a give-back not made leaves units spent, never extra).
    fn keep_returns(&mut self, mut unsent: Vec<Refund>) {
        unsent.append(&mut self.returns);
        let excess = unsent.len().saturating_sub(MAX_LEASED_KEYS);
        unsent.drain(..excess);
        self.returns = unsent;
    }

    /// Whether grants are held (they end with time, and their unspent units go back then) or
    /// give-backs wait: the worker's timer is needed.
    pub fn pending(&self) -> bool {
        self.grants > 0 || !self.returns.is_empty()
    }

    /// Keys with a lease or an ask in flight.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The refund of a grant's unspent units.
fn refund_of(check: &LimitCheck, grant: &Grant) -> Refund {
    Refund {
        check: LimitCheck {
            cost: grant.units,
            ..check.clone()
        },
        charged_at_ns: grant.charged_at_ns,
        left: grant.left,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::DecideCall;
    use crate::config::Config;
    use crate::request::plan::plan;
    use crate::testing::request::FakeRequest;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn at(ns: u128) -> UnixNs {
        UnixNs::from_ns(ns)
    }

    fn plan_of(config: &Config, key: &str) -> Plan {
        let request = FakeRequest::new("GET", "/").with("x-api-key", key.as_bytes());
        plan(config, &request).unwrap()
    }

    /// `plan`'s keys earn a lease: [`EARN`] - 1 requests (at 1, 2, ... ns) that ask for none.
    fn earn(leases: &mut Leases, plan: &Plan) {
        for now in 1..EARN as u128 {
            assert!(leases.ticket(plan, at(now)).is_none(), "request {now} asks");
        }
    }

    #[test]
    fn keys_seen_once_take_no_entry_and_the_table_stays_bounded() {
        let config = Config::parse(
            br#"{"lease": true, "rules": [{"name": "r", "limits": [{"name": "l", "limit": 10, "window": "1s"}]}]}"#,
        )
        .unwrap();
        let mut leases = Leases::default();
        // A flood of keys seen once each: none asks, none takes an entry.
        for i in 0..MAX_LEASED_KEYS {
            let p = plan_of(&config, &format!("once{i}"));
            assert!(leases.ticket(&p, at(1)).is_none());
        }
        assert!(leases.is_empty());
        // Keys that earn a lease take entries, up to the table's size.
        let first = plan_of(&config, "first");
        earn(&mut leases, &first);
        assert_eq!(leases.ask(&first, at(10)), FIRST_ASK, "earned: 4 in 1 s");
        for i in 1..MAX_LEASED_KEYS {
            let p = plan_of(&config, &format!("k{i}"));
            earn(&mut leases, &p);
            assert_eq!(leases.ask(&p, at(10)), FIRST_ASK);
        }
        assert_eq!(leases.len(), MAX_LEASED_KEYS);
        let late = plan_of(&config, "late");
        earn(&mut leases, &late);
        assert_eq!(leases.ask(&late, at(10)), 1, "no room: no lease");
        assert_eq!(leases.len(), MAX_LEASED_KEYS, "full, never more");
        // The crowded table forgets its idle keys at the next expiry pass; one asking stays.
        leases.asking(&first, true);
        leases.expire(at(11));
        assert_eq!(leases.len(), 1, "only the key still asking");
    }

    /// Give-backs are grouped by what their calls really carry: a refund's clock and the
    /// remaining it replied are longer than a decision's mode arguments.
    #[test]
    fn each_give_back_call_stays_within_the_call_size_bound() {
        let config = Config::parse(
            br#"{"lease": true, "rules": [{"name": "r", "limits": [{"name": "l", "limit": 10, "window": "1s"}]}]}"#,
        )
        .unwrap();
        let mut leases = Leases::default();
        for i in 0..3000 {
            let check = plan_of(&config, &format!("k{i}")).checks[0].clone();
            leases.returns.push(Refund {
                check,
                charged_at_ns: at(u128::from(u64::MAX)),
                left: 1.0 / 3.0,
            });
        }
        let calls = leases.give_backs(&config);
        assert!(calls.len() > 1, "more than one call's worth");
        for (refunds, _) in calls {
            let call = DecideCall::refund(u128::from(u64::MAX), u128::from(u64::MAX), &refunds);
            let path = config.program.decide(&call).path;
            assert!(
                path.len() <= crate::bounds::MAX_CALL_PATH_BYTES,
                "a give-back call of {} refunds is {} bytes",
                refunds.len(),
                path.len()
            );
        }
    }

    #[test]
    fn a_ticket_holds_its_keys_until_it_is_settled_or_cancelled() {
        let config = Config::parse(
            br#"{"lease": {"max_units": 10, "fraction": 0.5, "max_ms": 1000}, "rules": [{"name": "r", "limits": [{"name": "l", "limit": 10, "window": "1s"}]}]}"#,
        )
        .unwrap();
        let mut leases = Leases::default();
        let p = plan_of(&config, "k");
        earn(&mut leases, &p);
        let ticket = leases.ticket(&p, at(1)).unwrap();
        assert_eq!(ticket.requests(), FIRST_ASK);
        assert!(
            leases.ticket(&p, at(1)).is_none(),
            "one ask in flight per key"
        );
        leases.cancel(ticket, &p);
        let ticket = leases.ticket(&p, at(2)).unwrap();
        // Settled without a decision (the call failed): nothing granted, the key free again.
        assert!(!leases.redeem(ticket, &p, None, Duration::ZERO));
        assert!(leases.spend(&p, at(3)).is_none());
        // Settled with a grant of 4 requests' worth: 3 held for later requests, counted in
        // the headers' remaining.
        let ticket = leases.ticket(&p, at(4)).unwrap();
        let mut decision = Decision {
            allowed: true,
            limits: vec![LimitResult {
                allowed: true,
                remaining: 6.0,
                reset_ms: 30_000.0,
                retry_ms: 0.0,
                over_budget: false,
                overridden: None,
                bad_override: false,
                never_fits: false,
            }],
            leased: 3,
        };
        assert!(leases.redeem(ticket, &p, Some((&mut decision, at(4))), Duration::ZERO));
        assert_eq!(decision.limits[0].remaining, 9.0);
        for now in 5..8 {
            assert!(leases.spend(&p, at(now)).is_some());
        }
        assert!(leases.spend(&p, at(8)).is_none(), "3 units, 3 requests");
    }

    #[test]
    fn a_plan_on_two_slots_is_served_from_leases_but_asks_for_no_prefetch() {
        let config = Config::parse(
            br#"{"bridge": {"redis_cluster": true}, "lease": {"max_units": 10, "fraction": 0.5, "max_ms": 1000}, "rules": [
                {"name": "a", "key": {"from": ["header:x-api-key"]}, "limits": [{"name": "l", "limit": 100, "window": "1m"}]},
                {"name": "b", "key": {"from": ["header:x-other"]}, "limits": [{"name": "l", "limit": 100, "window": "1m"}]}]}"#,
        )
        .unwrap();
        let request = FakeRequest::new("GET", "/")
            .with("x-api-key", b"k")
            .with("x-other", b"o");
        let both = plan(&config, &request).unwrap();
        assert!(slots::spans_slots(&config, &both));
        let mut leases = Leases::default();
        // Each key leased by a plan of its own slot (4 requests' worth, 3 held).
        for check in &both.checks {
            let own = Plan {
                checks: vec![check.clone()],
                ..both.clone()
            };
            earn(&mut leases, &own);
            let ticket = leases.ticket(&own, at(1)).unwrap();
            let mut decision = Decision {
                allowed: true,
                limits: vec![LimitResult {
                    allowed: true,
                    remaining: 90.0,
                    reset_ms: 30_000.0,
                    retry_ms: 0.0,
                    over_budget: false,
                    overridden: None,
                    bad_override: false,
                    never_fits: false,
                }],
                leased: 3,
            };
            assert!(leases.redeem(ticket, &own, Some((&mut decision, at(1))), Duration::ZERO));
        }
        assert!(leases.spend(&both, at(2)).is_some());
        assert!(leases.spend(&both, at(3)).is_some());
        assert!(leases.runs_low(&both, at(3)));
        assert!(
            leases.prefetch(&config, &both, at(3)).is_none(),
            "no cross-slot call"
        );
    }
}
