//! The size model of a call: how many bytes a call's path takes at most, as [`DecideCall`]
//! writes it and [`crate::program::Program::decide`] encodes it, counted by the protocol's own
//! encoder ([`super::wire`] over [`Count`]). The batcher, the packer of give-backs and
//! settlements, and the configuration's bound on one request all count with it.

use super::args::{decision_mode, refund_mode, settle_mode};
use super::wire::{
    digits, encode_command, encode_count, encode_head, encode_key, encode_limit, Budget, Count,
    Definition, KeyIndex, Sink, WireMode, LONGEST_COMMAND, LONGEST_HANDLE,
};
#[cfg(doc)]
use super::{BridgeRequest, DecideCall};
use crate::bounds::MAX_CALL_PATH_BYTES;
use crate::check::{LimitCheck, Mode};
use crate::config::{Algorithm, OverBudget, Window};
use crate::decision::{Refund, Settlement};
use crate::request::keys::OVERRIDE_SUFFIX;

/// One limit as the size model counts it: what [`DecideCall`] writes for it. Made from a
/// plan's check ([`LimitShape::of`]), or from a configuration at its worst (the bound on one
/// request's call).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitShape<'a> {
    /// Its state key.
    pub key: &'a str,
    pub algorithm: Algorithm,
    pub per_window: u64,
    pub window: Window,
    pub burst: u64,
    pub cost: u64,
    pub mode: WireMode<'a>,
    /// Its key budget: only a limit in mode `enforce` or `shadow` sends one (else ignored).
    pub budget: Option<BudgetShape<'a>>,
    /// It reads its identity's override: one more key, and `:j` after its key's index.
    pub overrides: bool,
}

/// A limit's key budget as the size model counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetShape<'a> {
    /// The counter's and the overflow state's keys.
    pub counter_key: &'a str,
    pub overflow_key: &'a str,
    pub new_keys: u64,
    pub window_ms: u64,
    pub over_budget: OverBudget,
}

impl<'a> LimitShape<'a> {
    /// `check` as a request asking for a lease of `lease_asked` requests' worth (None: no
    /// lease asked) sends it.
    pub fn of(check: &'a LimitCheck, lease_asked: Option<u64>) -> Self {
        let (mode, budget) = decision_mode(check, lease_asked);
        LimitShape {
            budget: budget.map(|b| BudgetShape {
                counter_key: &b.counter_key,
                overflow_key: &b.overflow_key,
                new_keys: b.new_keys,
                window_ms: b.window_ms,
                over_budget: b.over_budget,
            }),
            ..Self::with_mode(check, mode)
        }
    }

    /// `refund` as [`DecideCall::refund`] sends it.
    pub fn refund(refund: &'a Refund) -> Self {
        Self::with_mode(&refund.check, refund_mode(refund))
    }

    /// `settlement` as [`DecideCall::settle`] sends it.
    pub fn settle(settlement: &'a Settlement) -> Self {
        LimitShape {
            cost: 0,
            ..Self::with_mode(&settlement.check, settle_mode(settlement))
        }
    }

    /// Its key budget, when its mode sends one.
    fn sent_budget(&self) -> Option<BudgetShape<'a>> {
        self.budget
            .filter(|_| matches!(self.mode, WireMode::Enforce | WireMode::Shadow))
    }

    /// Its definition (two limits of a call with the same share one); for a decision with a
    /// key budget, None (such definitions are never counted as shared).
    pub fn definition(&self) -> Option<Definition> {
        match self.sent_budget() {
            Some(_) => None,
            None => Some(self.definition_with(None)),
        }
    }

    fn definition_with(&self, budget: Option<(usize, usize)>) -> Definition {
        Definition {
            algorithm: self.algorithm,
            per_window: self.per_window,
            window: self.window,
            burst: self.burst,
            mode: self.mode.name(),
            budget,
        }
    }

    /// The bytes of its definition in a call, for a definition without a key budget (what
    /// [`CallSize::limit_bytes`] counts again for each limit that shares it).
    pub fn definition_bytes(&self) -> usize {
        let mut count = Count::new(0);
        self.definition_with(None).encode(&mut count);
        count.bytes
    }

    /// Writes what the call holds for it alone, as if no key, definition or budget were
    /// shared: its key (and override key), its key budget's keys and values, its definition,
    /// the limit and its mode's values. The indexes are the first ones: the size model counts
    /// every index at the call's widest.
    pub fn encode<S: Sink>(&self, out: &mut S) {
        encode_key(out, self.key);
        if self.overrides {
            encode_key(out, self.key);
            out.text(OVERRIDE_SUFFIX);
        }
        let budget = self.sent_budget().map(|b| {
            encode_key(out, b.counter_key);
            encode_key(out, b.overflow_key);
            Budget {
                counter: 1,
                new_keys: b.new_keys,
                window_ms: b.window_ms,
                over_budget: b.over_budget,
            }
            .encode(out);
            (1, 1)
        });
        self.definition_with(budget).encode(out);
        let key = KeyIndex {
            state: 1,
            overrides: self.overrides.then_some(1),
        };
        encode_limit(out, key, 1, self.cost, &self.mode);
    }

    fn with_mode(check: &'a LimitCheck, mode: WireMode<'a>) -> Self {
        LimitShape {
            key: &check.key,
            algorithm: check.algorithm,
            per_window: check.per_window,
            window: check.window,
            burst: check.burst,
            cost: check.cost,
            mode,
            budget: None,
            overrides: check.overrides,
        }
    }
}

/// The size model of a call's path, the one every size check uses: the batcher's stop, the
/// give-backs' grouping and the configuration's bound on one request. It counts what
/// [`DecideCall`] writes and [`crate::program::Program::decide`] encodes, with the same
/// encoder: the head of the longer of the two ways to call (`EVALSHA` and the script's hash),
/// the number of keys, clock, deadline, the numbers of requests, of key budgets and of limit
/// definitions, then per request its number of limits and per limit what it writes
/// ([`LimitShape::encode`]), in any mode (decision, lease ask, give-back). An upper bound: a
/// key and a definition are counted with every limit that uses them, every index at the
/// widest the call can hold, and the clock and deadline at
/// [`super::wire::MAX_CLOCK_DIGITS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallSize {
    /// Digits of the largest key index (or count) the call can hold.
    index_digits: usize,
    bytes: usize,
}

impl CallSize {
    /// An empty call that holds at most `keys` keys (and as many limit definitions),
    /// `requests` requests and `budgets` key budgets: its fixed prefix.
    pub fn new(keys: usize, requests: usize, budgets: usize) -> Self {
        let mut count = Count::new(digits(keys as u128));
        encode_command(&mut count, LONGEST_COMMAND, LONGEST_HANDLE, keys);
        // Definitions: as many as keys at most.
        encode_head(&mut count, "", "", requests, budgets, keys);
        CallSize {
            index_digits: count.index_digits,
            bytes: count.bytes,
        }
    }

    /// An empty call as a worker builds them (a batch of decisions and lease asks, or of
    /// give-backs): it stays within [`MAX_CALL_PATH_BYTES`], where every key and request takes
    /// 2 bytes at least, so no count or index is larger than half of it.
    pub fn batch() -> Self {
        let most = MAX_CALL_PATH_BYTES / 2;
        CallSize::new(most, most, most)
    }

    /// The path's bytes at most.
    pub fn bytes(self) -> usize {
        self.bytes
    }

    /// Whether Webdis accepts a call of this size (see [`MAX_CALL_PATH_BYTES`]).
    pub fn fits(self) -> bool {
        self.bytes <= MAX_CALL_PATH_BYTES
    }

    /// The bytes one limit adds ([`LimitShape::encode`]): a definition and a budget counted
    /// with every limit that uses them.
    pub fn limit_bytes(self, limit: &LimitShape) -> usize {
        let mut count = Count::new(self.index_digits);
        limit.encode(&mut count);
        count.bytes
    }

    /// Adds one request of `limits` limits whose [`CallSize::limit_bytes`] add up to `bytes`.
    pub fn with_request(self, limits: usize, bytes: usize) -> Self {
        let mut count = Count::new(self.index_digits);
        encode_count(&mut count, limits, true);
        CallSize {
            bytes: self.bytes + count.bytes + bytes,
            ..self
        }
    }

    /// Adds one request as [`DecideCall::leasing`] sends `checks` asking for a lease of
    /// `lease_asked` requests' worth (None: decided per request).
    pub fn with_checks(self, checks: &[LimitCheck], lease_asked: Option<u64>) -> Self {
        let bytes = checks
            .iter()
            .map(|c| self.limit_bytes(&LimitShape::of(c, lease_asked)))
            .sum();
        self.with_request(checks.len(), bytes)
    }

    /// Adds the one request of a settlement call ([`DecideCall::settle`]).
    pub fn with_settlements(self, settlements: &[Settlement]) -> Self {
        let bytes = settlements
            .iter()
            .map(|s| self.limit_bytes(&LimitShape::settle(s)))
            .sum();
        self.with_request(settlements.len(), bytes)
    }

    /// Adds the one request of a give-back call ([`DecideCall::refund`]).
    pub fn with_refunds(self, refunds: &[Refund]) -> Self {
        let bytes = refunds
            .iter()
            .map(|r| self.limit_bytes(&LimitShape::refund(r)))
            .sum();
        self.with_request(refunds.len(), bytes)
    }
}

/// The size of the whole call [`DecideCall::leasing`] makes of `requests`, fixed prefix
/// included, counted as a worker's batch ([`CallSize::batch`]); `.fits()` says whether Webdis
/// takes it.
pub fn batch_size<'a>(
    requests: impl IntoIterator<Item = (&'a [LimitCheck], Option<u64>)>,
) -> CallSize {
    requests
        .into_iter()
        .fold(CallSize::batch(), |size, (checks, lease_asked)| {
            size.with_checks(checks, lease_asked)
        })
}

/// What a request's checks add to a batch's path at most, sent either way (decided, or asking
/// for a lease of any size): [`CallSize::batch`] grown by the request, less its fixed prefix.
pub fn call_bytes(checks: &[LimitCheck]) -> usize {
    let call = CallSize::batch();
    let bytes = checks
        .iter()
        .map(|c| {
            let decided = call.limit_bytes(&LimitShape::of(c, None));
            // Only a lease's ask differs from its decision on the wire (sized for every
            // waiting request as its batch is made).
            if !matches!(c.mode, Mode::Lease(_)) {
                return decided;
            }
            let leased = call.limit_bytes(&LimitShape::of(c, Some(u64::MAX)));
            decided.max(leased)
        })
        .sum();
    call.with_request(checks.len(), bytes).bytes() - call.bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::wire::MAX_CLOCK_DIGITS;
    use crate::bridge::DecideCall;
    use crate::check::{BudgetCheck, Mode};
    use crate::config::Lease;
    use crate::testing::plan::minute_check as check;
    use crate::time::UnixNs;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn call_bytes_bound_the_path() {
        let checks: Vec<LimitCheck> = (0..5)
            .map(|i| {
                let mut c = check("rl:{k:1}:api:x", Algorithm::Gcra, i % 2 == 0);
                c.key = format!("rl:{{k:{i}/é}}:api:limit-{i}").into();
                c.per_window = u64::MAX;
                c.burst = u64::MAX;
                c.window = Window::ms(u64::MAX);
                c.cost = u64::MAX;
                c
            })
            .collect();
        let call = DecideCall::new("redis", 0, [&checks[..]]);
        let path = crate::program::Program::script_named("").decide(&call).path;
        let fixed = "/EVALSHA//5/redis/0/1/0".len();
        assert!(
            path.len() <= fixed + call_bytes(&checks),
            "{} > {}",
            path.len(),
            fixed + call_bytes(&checks)
        );
    }

    /// Checks at their longest: hostile keys, every number at its largest (each limit's a
    /// little less than the one before, so that no two share a definition), a lease on the
    /// enforcing ones, a key budget of its own on every third.
    fn longest_checks(n: usize) -> Vec<LimitCheck> {
        (0..n)
            .map(|i| {
                let mut c = check("", Algorithm::Gcra, false);
                c.key = format!("rl:{{k:{i}/é}}:api:limit-{i}").into();
                c.per_window = u64::MAX - i as u64;
                c.burst = u64::MAX;
                c.window = Window::ms(u64::MAX);
                c.cost = u64::MAX;
                let lease = Some(Lease {
                    max_units: u64::MAX,
                    fraction: 0.000001,
                    max_ms: 1000,
                });
                let budget = (i % 3 == 2).then(|| {
                    std::rc::Rc::new(BudgetCheck {
                        counter_key: format!("rl:{{key_budget}}:r{i}"),
                        overflow_key: format!("rl:{{overflow}}:r{i}:l"),
                        new_keys: u64::MAX,
                        window_ms: u64::MAX,
                        over_budget: OverBudget::Shared,
                    })
                });
                c.mode = Mode::of(false, lease, i % 2 == 1, budget);
                c
            })
            .collect()
    }

    /// The size model is the size of the real call, its fixed prefix included, in each mode
    /// (decisions, lease asks, give-backs), when no key is shared and every index has as
    /// many digits as the largest: with a 20-digit clock and deadline it is exact.
    #[test]
    fn the_size_model_is_exact_in_every_mode() {
        let clock = "9".repeat(MAX_CLOCK_DIGITS);
        let deadline = u128::from(u64::MAX);
        // Every third window a calendar one, at the longest offsets either way.
        let calendar = |offset_minutes| {
            Window::Calendar(crate::config::Calendar {
                unit: crate::config::CalendarUnit::Month,
                offset_minutes,
            })
        };
        let plain: Vec<LimitCheck> = longest_checks(9)
            .into_iter()
            .enumerate()
            .map(|(i, mut c)| {
                match i % 6 {
                    0 => c.window = calendar(840),
                    3 => c.window = calendar(-840),
                    _ => {}
                }
                c.mode = match c.mode {
                    Mode::Enforce { .. } => Mode::Enforce { budget: None },
                    Mode::Shadow { .. } => Mode::Shadow { budget: None },
                    mode => mode,
                };
                c
            })
            .collect();
        for lease in [None, Some(u64::MAX)] {
            let call = DecideCall::leasing(&clock, deadline, [(&plain[..], lease)]);
            let path = crate::program::Program::script_named(&"f".repeat(40))
                .decide(&call)
                .path;
            assert_eq!(call.keys.len(), 9);
            assert_eq!(
                path.len(),
                CallSize::new(9, 1, 0).with_checks(&plain, lease).bytes(),
                "lease {lease:?}"
            );
        }
        let leasing = crate::program::Program::script_named("")
            .decide(&DecideCall::leasing(&clock, 0, [(&plain[..], Some(1))]))
            .path;
        // The definition says `lease`; the limit adds its units and fraction after its cost.
        assert!(leasing.contains("~lease~0~0/"), "{leasing}");
        assert!(
            leasing.contains("~18446744073709551615/18446744073709551615/0%2E000001/"),
            "{leasing}"
        );
        let refunds: Vec<Refund> = plain
            .iter()
            .zip([0.25, 1e300, 5e-324, 0.0, 7.0, 1.5, 1e-7, 123456.789, 3.0])
            .map(|(c, left)| Refund {
                check: c.clone(),
                charged_at_ns: UnixNs::from_ns(u128::MAX),
                left,
            })
            .collect();
        let call = DecideCall::refund(u128::MAX, u128::MAX, &refunds);
        let path = crate::program::Program::script_named(&"f".repeat(40))
            .decide(&call)
            .path;
        // The refund's clock and deadline are written in full (39 digits, not 20).
        let longer = 2 * (u128::MAX.to_string().len() - MAX_CLOCK_DIGITS);
        assert_eq!(
            path.len(),
            CallSize::new(9, 1, 0).with_refunds(&refunds).bytes() + longer
        );
    }

    /// A batch as the worker builds it, prefix included: whatever its requests ask (leases or
    /// not, budgets shared or not), the model of the batch is at least the call's size, and
    /// so are [`call_bytes`] over its requests with the batch's prefix.
    #[test]
    fn the_batch_size_covers_the_call_with_its_prefix() {
        let requests: Vec<Vec<LimitCheck>> = (1..12).map(longest_checks).collect();
        let clock = "9".repeat(MAX_CLOCK_DIGITS);
        for lease in [None, Some(1), Some(u64::MAX)] {
            let call = DecideCall::leasing(
                &clock,
                u128::from(u64::MAX),
                requests.iter().map(|r| (&r[..], lease)),
            );
            let path = crate::program::Program::script_named(&"f".repeat(40))
                .decide(&call)
                .path;
            let model = batch_size(requests.iter().map(|r| (&r[..], lease)));
            assert!(
                path.len() <= model.bytes(),
                "{} > {}",
                path.len(),
                model.bytes()
            );
            let summed: usize = requests.iter().map(|r| call_bytes(r)).sum();
            assert!(path.len() <= CallSize::batch().bytes() + summed);
            assert!(model.bytes() <= CallSize::batch().bytes() + summed);
        }
        assert!(CallSize::batch().fits());
        assert!(!CallSize::batch()
            .with_request(1, MAX_CALL_PATH_BYTES)
            .fits());
    }
}
