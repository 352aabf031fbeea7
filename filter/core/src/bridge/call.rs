//! The calls the filter sends to Webdis: the decision script's argument layout
//! (`lua/decide.lua` reads it), the `EVALSHA` and `SCRIPT LOAD` requests, and their headers.

use std::collections::HashMap;

use crate::bounds::MAX_CALL_PATH_BYTES;
use crate::check::{BudgetCheck, LimitCheck, Mode};
use crate::config::{Algorithm, Bridge, Lease, OverBudget};
use crate::decision::{Refund, Settlement};
use crate::encode::{path_segment, path_segment_len};

/// One HTTP call to Webdis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeRequest {
    pub method: &'static str,
    pub path: String,
    pub body: Option<Vec<u8>>,
}

/// The arguments of one call of the decision script for a batch of requests, in the layout
/// `lua/decide.lua` reads. Built here and nowhere else: the filter and the Lua tests use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecideCall {
    /// The distinct keys of the batch (`KEYS`); a hot key is sent once.
    pub keys: Vec<String>,
    /// `ARGV`: clock, deadline, number of requests, number of key budgets and four values per
    /// budget (counter key index, new keys, window ms, `shared` | `deny`), then per request its
    /// number of limits and nine values per limit (key index, algorithm, limit, window ms,
    /// burst, cost, mode, budget index or 0, overflow key index or 0; in mode `lease` the
    /// last two are the lease's max units and fraction).
    pub args: Vec<String>,
}

/// The first six arguments of a limit, the same for a decision and a refund: its key's index,
/// algorithm, limit, window (ms), burst and cost.
fn push_limit(args: &mut Vec<String>, key_index: usize, c: &LimitCheck) {
    args.push(key_index.to_string());
    args.push(c.algorithm.name().to_string());
    args.push(c.per_window.to_string());
    args.push(c.window_ms.to_string());
    args.push(c.burst.to_string());
    args.push(c.cost.to_string());
}

/// The units of `check` a request asking for a lease of `requests` requests' worth asks for:
/// `requests` × its cost, its lease's `max_units` at most (and at least 1, the script's floor).
pub fn lease_units(lease: Lease, check: &LimitCheck, requests: u64) -> u64 {
    match check.cost {
        0 => lease.max_units,
        cost => lease.max_units.min(requests.saturating_mul(cost)).max(1),
    }
}

/// Decimals of a lease's fraction in a call: always this many, so the argument has one length
/// (`0.000001` to `1.000000`). The configuration refuses a fraction with more.
pub const FRACTION_DECIMALS: usize = 6;

fn fraction_text(fraction: f64) -> String {
    format!("{fraction:.FRACTION_DECIMALS$}")
}

/// The mode a limit goes with in a decision call: its [`Mode`], in a request that asks for a
/// lease of `requests` requests' worth (`Some`) or not.
enum WireMode<'a> {
    After,
    Lease {
        units: u64,
        fraction: f64,
    },
    Decide {
        shadow: bool,
        budget: Option<&'a BudgetCheck>,
    },
}

impl<'a> WireMode<'a> {
    fn of(check: &'a LimitCheck, requests: Option<u64>) -> Self {
        match (&check.mode, requests) {
            (Mode::After, _) => WireMode::After,
            (Mode::Lease(lease), Some(requests)) => WireMode::Lease {
                units: lease_units(*lease, check, requests),
                fraction: lease.fraction,
            },
            (Mode::Lease(_), None) => WireMode::Decide {
                shadow: false,
                budget: None,
            },
            (Mode::Shadow { budget }, _) => WireMode::Decide {
                shadow: true,
                budget: budget.as_deref(),
            },
            (Mode::Enforce { budget }, _) => WireMode::Decide {
                shadow: false,
                budget: budget.as_deref(),
            },
        }
    }
}

/// Numbers the distinct keys of a call from 1, as `KEYS` does.
#[derive(Default)]
struct KeyTable<'a> {
    keys: Vec<String>,
    index: HashMap<&'a str, usize>,
}

impl<'a> KeyTable<'a> {
    fn index_of(&mut self, key: &'a str) -> usize {
        let keys = &mut self.keys;
        *self.index.entry(key).or_insert_with(|| {
            keys.push(key.to_string());
            keys.len()
        })
    }
}

impl DecideCall {
    /// `clock` is the Unix time in ns, or `"redis"` for Redis's own clock; `deadline_ms` the
    /// Unix ms after which Redis must not charge (0: none).
    pub fn new<'a>(
        clock: &str,
        deadline_ms: u128,
        requests: impl IntoIterator<Item = &'a [LimitCheck]>,
    ) -> Self {
        Self::leasing(clock, deadline_ms, requests.into_iter().map(|c| (c, None)))
    }

    /// [`DecideCall::new`] where a request may also ask for a lease of up to N requests'
    /// worth (`Some(N)`): every one of its limits then goes in mode `lease` with N × its cost
    /// (its `max_units` at most) and its `fraction` (a limit without a lease setting is sent as
    /// usual, and the script grants nothing).
    pub fn leasing<'a>(
        clock: &str,
        deadline_ms: u128,
        requests: impl IntoIterator<Item = (&'a [LimitCheck], Option<u64>)>,
    ) -> Self {
        let mut keys = KeyTable::default();
        let mut budgets: Vec<String> = Vec::new();
        let mut budget_index: HashMap<&str, usize> = HashMap::new();
        let mut body: Vec<String> = Vec::new();
        let mut count = 0usize;
        for (checks, ask_lease) in requests {
            count += 1;
            body.push(checks.len().to_string());
            for c in checks {
                push_limit(&mut body, keys.index_of(&c.key), c);
                let (shadow, budget) = match WireMode::of(c, ask_lease) {
                    WireMode::After => {
                        body.push("after".to_string());
                        body.push("0".to_string());
                        body.push("0".to_string());
                        continue;
                    }
                    WireMode::Lease { units, fraction } => {
                        body.push("lease".to_string());
                        body.push(units.to_string());
                        body.push(fraction_text(fraction));
                        continue;
                    }
                    WireMode::Decide { shadow, budget } => (shadow, budget),
                };
                body.push(if shadow { "shadow" } else { "enforce" }.to_string());
                match budget {
                    None => {
                        body.push("0".to_string());
                        body.push("0".to_string());
                    }
                    Some(b) => {
                        let next = budget_index.len() + 1;
                        let i = *budget_index.entry(&b.counter_key).or_insert(next);
                        if i == next {
                            budgets.push(keys.index_of(&b.counter_key).to_string());
                            budgets.push(b.new_keys.to_string());
                            budgets.push(b.window_ms.to_string());
                            budgets.push(b.over_budget.name().to_string());
                        }
                        body.push(i.to_string());
                        body.push(keys.index_of(&b.overflow_key).to_string());
                    }
                }
            }
        }
        let mut args = Vec::with_capacity(4 + budgets.len() + body.len());
        args.push(clock.to_string());
        args.push(deadline_ms.to_string());
        args.push(count.to_string());
        args.push(budget_index.len().to_string());
        args.extend(budgets);
        args.extend(body);
        DecideCall {
            keys: keys.keys,
            args,
        }
    }

    /// One request giving back what earlier calls charged (see `lua/decide.lua`). `clock`
    /// (Unix ns) must be no earlier than any decision on these keys: the refund's own time
    /// plus the clock skew allowed between replicas; `deadline_ms` (Unix ms, 0: none) should be `clock` itself: a refund that reaches Redis
    /// later could meet decisions made after its clock, and then gives back nothing.
    pub fn refund(clock: u128, deadline_ms: u128, refunds: &[Refund]) -> Self {
        Self::adjustment(clock, deadline_ms, refunds, |r| {
            let mode = [
                "refund".to_string(),
                r.charged_at_ns.to_string(),
                format!("{}", r.left),
            ];
            (&*r.check.key, r.check.clone(), mode)
        })
    }

    /// One request settling usage limits (see `lua/decide.lua`, mode `settle`): each limit is
    /// charged its signed delta at `clock` (Unix ns), without refusing.
    pub fn settle(clock: u128, deadline_ms: u128, settlements: &[Settlement]) -> Self {
        Self::adjustment(clock, deadline_ms, settlements, |s| {
            let check = LimitCheck {
                cost: 0,
                ..s.check.clone()
            };
            let mode = ["settle".to_string(), s.delta.to_string(), "0".to_string()];
            (&*s.check.key, check, mode)
        })
    }

    /// One request of `items`, each a limit (its key, as the check to send) with its mode and
    /// the mode's two arguments: a request that only adjusts what earlier calls charged
    /// (refunds, settlements).
    fn adjustment<'a, T>(
        clock: u128,
        deadline_ms: u128,
        items: &'a [T],
        limit: impl Fn(&'a T) -> (&'a str, LimitCheck, [String; 3]),
    ) -> Self {
        let mut keys = KeyTable::default();
        let mut args = vec![
            clock.to_string(),
            deadline_ms.to_string(),
            "1".to_string(),
            "0".to_string(),
            items.len().to_string(),
        ];
        for item in items {
            let (key, check, mode) = limit(item);
            push_limit(&mut args, keys.index_of(key), &check);
            args.extend(mode);
        }
        DecideCall {
            keys: keys.keys,
            args,
        }
    }

    /// The Redis command: `EVALSHA sha numkeys KEYS... ARGV...`.
    pub fn command(&self, script_sha: &str) -> Vec<String> {
        let mut command = Vec::with_capacity(3 + self.keys.len() + self.args.len());
        command.push("EVALSHA".to_string());
        command.push(script_sha.to_string());
        command.push(self.keys.len().to_string());
        command.extend(self.keys.iter().cloned());
        command.extend(self.args.iter().cloned());
        command
    }
}

/// Digits of the clock and deadline arguments at most: Unix time in ns has 19 digits until the
/// year 2286 (the deadline, in ms, has fewer).
pub const MAX_CLOCK_DIGITS: usize = 20;

/// Bytes of `/` and a fraction written by [`fraction_text`], percent-encoded (`.` is `%2E`):
/// one digit, the point and the decimals, for any fraction from 0 to 10.
const FRACTION_SEGMENT: usize = 1 + 1 + 3 + FRACTION_DECIMALS;

fn digits(n: u128) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Bytes of `/` and a number.
fn number(n: impl Into<u128>) -> usize {
    1 + digits(n.into())
}

/// Bytes of `/` and a text, percent-encoded.
fn text(value: &str) -> usize {
    1 + path_segment_len(value.as_bytes())
}

/// One limit as the size model counts it: what varies in the arguments [`DecideCall`] writes
/// for it. Made from a plan's check ([`LimitShape::of`]), or from a configuration at its worst
/// (the bound on one request's call).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitShape {
    /// Its key's bytes once percent-encoded.
    pub key: usize,
    pub algorithm: Algorithm,
    pub per_window: u64,
    pub window_ms: u64,
    pub burst: u64,
    pub cost: u64,
    pub mode: ModeShape,
}

/// How a limit goes into a call: its last three arguments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ModeShape {
    /// Decided per request: `enforce` or `shadow`, then its key budget's indexes (`0 0`
    /// without one).
    Decide {
        shadow: bool,
        budget: Option<BudgetShape>,
    },
    /// Asking for a lease: `lease`, the units asked for and the fraction.
    Lease { units: u64 },
    /// Giving back a charge: `refund`, the clock it was charged with and what it left.
    Refund { charged_at_ns: u128, left: f64 },
    /// A usage limit in mode `after`: `after 0 0`.
    After,
    /// Settling a usage limit: `settle`, the signed delta, `0` (its cost is sent as 0).
    Settle { delta: i64 },
}

/// A limit's key budget as the size model counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetShape {
    /// The counter's and the overflow state's keys, percent-encoded.
    pub counter_key: usize,
    pub overflow_key: usize,
    pub new_keys: u64,
    pub window_ms: u64,
    pub over_budget: OverBudget,
}

impl LimitShape {
    /// `check` as a request asking for a lease of `lease_asked` requests' worth (None: no
    /// lease asked) sends it.
    pub fn of(check: &LimitCheck, lease_asked: Option<u64>) -> Self {
        let mode = match WireMode::of(check, lease_asked) {
            WireMode::After => ModeShape::After,
            WireMode::Lease { units, .. } => ModeShape::Lease { units },
            WireMode::Decide { shadow, budget } => ModeShape::Decide {
                shadow,
                budget: budget.map(|b| BudgetShape {
                    counter_key: path_segment_len(b.counter_key.as_bytes()),
                    overflow_key: path_segment_len(b.overflow_key.as_bytes()),
                    new_keys: b.new_keys,
                    window_ms: b.window_ms,
                    over_budget: b.over_budget,
                }),
            },
        };
        Self::with_mode(check, mode)
    }

    /// `refund` as [`DecideCall::refund`] sends it.
    pub fn refund(refund: &Refund) -> Self {
        Self::with_mode(
            &refund.check,
            ModeShape::Refund {
                charged_at_ns: refund.charged_at_ns,
                left: refund.left,
            },
        )
    }

    /// `settlement` as [`DecideCall::settle`] sends it.
    pub fn settle(settlement: &Settlement) -> Self {
        let mode = ModeShape::Settle {
            delta: settlement.delta,
        };
        LimitShape {
            cost: 0,
            ..Self::with_mode(&settlement.check, mode)
        }
    }

    fn with_mode(check: &LimitCheck, mode: ModeShape) -> Self {
        LimitShape {
            key: path_segment_len(check.key.as_bytes()),
            algorithm: check.algorithm,
            per_window: check.per_window,
            window_ms: check.window_ms,
            burst: check.burst,
            cost: check.cost,
            mode,
        }
    }
}

/// The size model of a call's path, the one every size check uses: the batcher's stop, the
/// give-backs' grouping and the configuration's bound on one request. It counts what
/// [`DecideCall`] writes and [`BridgeRequest::evalsha`] encodes: the fixed prefix (`/EVALSHA/`,
/// the script's hash, the number of keys, clock, deadline, the numbers of requests and of key
/// budgets), then per request its number of limits and per limit its arguments, in any mode
/// (decision, lease ask, give-back). An upper bound: a key is counted with every limit that
/// uses it, and the clock and deadline at [`MAX_CLOCK_DIGITS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallSize {
    /// Digits of the largest key index (or count) the call can hold.
    index_digits: usize,
    bytes: usize,
}

impl CallSize {
    /// An empty call that holds at most `keys` keys, `requests` requests and `budgets` key
    /// budgets: its fixed prefix.
    pub fn new(keys: usize, requests: usize, budgets: usize) -> Self {
        let index_digits = digits(keys as u128);
        CallSize {
            index_digits,
            bytes: "/EVALSHA/".len()
                + 40
                + 1
                + index_digits
                + 2 * (1 + MAX_CLOCK_DIGITS)
                + number(requests as u64)
                + number(budgets as u64),
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

    /// The bytes one limit adds: `/` and its key, its nine arguments, and with a key budget
    /// `/` and the budget's two keys and its four arguments (counted with every limit that
    /// carries it).
    pub fn limit_bytes(self, limit: &LimitShape) -> usize {
        let index = 1 + self.index_digits;
        let mode = match limit.mode {
            ModeShape::Decide { shadow, budget } => {
                let name = text(if shadow { "shadow" } else { "enforce" });
                match budget {
                    None => name + 2 * number(0u8),
                    Some(b) => {
                        name + 2 * index
                            + 1
                            + b.overflow_key
                            + 1
                            + b.counter_key
                            + index
                            + number(b.new_keys)
                            + number(b.window_ms)
                            + text(b.over_budget.name())
                    }
                }
            }
            ModeShape::Lease { units } => text("lease") + number(units) + FRACTION_SEGMENT,
            ModeShape::Refund {
                charged_at_ns,
                left,
            } => text("refund") + number(charged_at_ns) + text(&format!("{left}")),
            ModeShape::After => text("after") + 2 * number(0u8),
            ModeShape::Settle { delta } => {
                text("settle") + usize::from(delta < 0) + number(delta.unsigned_abs()) + number(0u8)
            }
        };
        1 + limit.key
            + index
            + text(limit.algorithm.name())
            + number(limit.per_window)
            + number(limit.window_ms)
            + number(limit.burst)
            + number(limit.cost)
            + mode
    }

    /// Adds one request of `limits` limits whose [`CallSize::limit_bytes`] add up to `bytes`.
    pub fn with_request(self, limits: usize, bytes: usize) -> Self {
        CallSize {
            bytes: self.bytes + number(limits as u64) + bytes,
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
            let leased = call.limit_bytes(&LimitShape::of(c, Some(u64::MAX)));
            decided.max(leased)
        })
        .sum();
    call.with_request(checks.len(), bytes).bytes() - call.bytes()
}

impl BridgeRequest {
    /// One `EVALSHA` of the decision script. Every segment is percent-encoded: no value can
    /// add, move or change an argument.
    pub fn evalsha(script_sha: &str, call: &DecideCall) -> BridgeRequest {
        let mut path = String::new();
        for arg in call.command(script_sha) {
            path.push('/');
            path.push_str(&path_segment(arg.as_bytes()));
        }
        BridgeRequest {
            method: "GET",
            path,
            body: None,
        }
    }

    /// `SCRIPT LOAD` of the embedded script, sent as the body so it needs no encoding.
    pub fn script_load() -> BridgeRequest {
        BridgeRequest {
            method: "PUT",
            path: "/SCRIPT/LOAD".to_string(),
            body: Some(crate::DECISION_LUA.as_bytes().to_vec()),
        }
    }

    /// The HTTP/2-style headers Envoy's `dispatch_http_call` wants.
    pub fn headers(&self, bridge: &Bridge) -> Vec<(&'static str, String)> {
        let mut headers = vec![
            (":method", self.method.to_string()),
            (":path", self.path.clone()),
            (":authority", bridge.authority.clone()),
        ];
        if let Some(auth) = &bridge.authorization {
            headers.push(("authorization", auth.clone()));
        }
        if let Some(body) = &self.body {
            headers.push(("content-length", body.len().to_string()));
        }
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::BudgetCheck;
    use crate::config::{Algorithm, OverBudget};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn check(key: &str, algorithm: Algorithm, shadow: bool) -> LimitCheck {
        LimitCheck {
            rule: 0,
            limit: 0,
            key: key.into(),
            algorithm,
            per_window: 10,
            quota: 20,
            window_ms: 60_000,
            burst: 20,
            cost: 1,
            mode: Mode::of(false, None, shadow, None),
        }
    }

    #[test]
    fn evalsha_path_has_exactly_the_arguments_in_order() {
        let first = [
            check("rl:{k:1}:api:second", Algorithm::TokenBucket, false),
            check("rl:{k:1}:api:day", Algorithm::FixedWindow, true),
        ];
        // A second request on the same per-second key: the key is sent once.
        let second = [check("rl:{k:1}:api:second", Algorithm::TokenBucket, false)];
        let call = DecideCall::new(
            "1764489269123456789",
            1764489269273,
            [&first[..], &second[..]],
        );
        let req = BridgeRequest::evalsha("abc123", &call);
        let segments: Vec<&str> = req.path.split('/').collect();
        #[rustfmt::skip]
        let want = [
            "", "EVALSHA", "abc123", "2",
            "rl%3A%7Bk%3A1%7D%3Aapi%3Asecond", "rl%3A%7Bk%3A1%7D%3Aapi%3Aday",
            "1764489269123456789", "1764489269273", "2", "0",
            "2",
            "1", "token_bucket", "10", "60000", "20", "1", "enforce", "0", "0",
            "2", "fixed_window", "10", "60000", "20", "1", "shadow", "0", "0",
            "1",
            "1", "token_bucket", "10", "60000", "20", "1", "enforce", "0", "0",
        ];
        assert_eq!(segments, want);
        assert_eq!(req.method, "GET");
        assert!(req.body.is_none());
        assert_eq!(
            call.command("abc123")[..4],
            ["EVALSHA", "abc123", "2", "rl:{k:1}:api:second"]
        );
    }

    #[test]
    fn key_budgets_are_sent_once_per_call_with_their_overflow_keys() {
        let budgeted = |key: &str, limit: &str| {
            let mut c = check(key, Algorithm::TokenBucket, false);
            let budget = Some(std::rc::Rc::new(BudgetCheck {
                counter_key: "rl:{key_budget}:ip".into(),
                overflow_key: format!("rl:{{overflow}}:ip:{limit}"),
                new_keys: 1000,
                window_ms: 60_000,
                over_budget: OverBudget::Deny,
            }));
            c.mode = Mode::Enforce { budget };
            c
        };
        let first = [
            budgeted("rl:{a:1}:ip:s", "s"),
            budgeted("rl:{a:1}:ip:m", "m"),
        ];
        let second = [
            check("rl:{k:1}:api:s", Algorithm::Gcra, true),
            budgeted("rl:{a:2}:ip:s", "s"),
        ];
        let call = DecideCall::new("redis", 0, [&first[..], &second[..]]);
        assert_eq!(
            call.keys,
            [
                "rl:{a:1}:ip:s",
                "rl:{key_budget}:ip",
                "rl:{overflow}:ip:s",
                "rl:{a:1}:ip:m",
                "rl:{overflow}:ip:m",
                "rl:{k:1}:api:s",
                "rl:{a:2}:ip:s",
            ]
        );
        #[rustfmt::skip]
        let want = [
            "redis", "0", "2",
            "1", "2", "1000", "60000", "deny",
            "2",
            "1", "token_bucket", "10", "60000", "20", "1", "enforce", "1", "3",
            "4", "token_bucket", "10", "60000", "20", "1", "enforce", "1", "5",
            "2",
            "6", "gcra", "10", "60000", "20", "1", "shadow", "0", "0",
            "7", "token_bucket", "10", "60000", "20", "1", "enforce", "1", "3",
        ];
        assert_eq!(call.args, want);
        let path = BridgeRequest::evalsha("", &call).path;
        let fixed = "/EVALSHA//7/redis/0/2".len();
        let bytes = call_bytes(&first) + call_bytes(&second);
        assert!(
            path.len() <= fixed + bytes,
            "{} > {}",
            path.len(),
            fixed + bytes
        );
    }

    #[test]
    fn call_bytes_bound_the_path() {
        let checks: Vec<LimitCheck> = (0..5)
            .map(|i| {
                let mut c = check("rl:{k:1}:api:x", Algorithm::Gcra, i % 2 == 0);
                c.key = format!("rl:{{k:{i}/é}}:api:limit-{i}").into();
                c.per_window = u64::MAX;
                c.burst = u64::MAX;
                c.window_ms = u64::MAX;
                c.cost = u64::MAX;
                c
            })
            .collect();
        let call = DecideCall::new("redis", 0, [&checks[..]]);
        let path = BridgeRequest::evalsha("", &call).path;
        let fixed = "/EVALSHA//5/redis/0/1/0".len();
        assert!(
            path.len() <= fixed + call_bytes(&checks),
            "{} > {}",
            path.len(),
            fixed + call_bytes(&checks)
        );
    }

    /// Checks at their longest: hostile keys, every number at its largest, a lease on the
    /// enforcing ones, a key budget of its own on every third.
    fn longest_checks(n: usize) -> Vec<LimitCheck> {
        (0..n)
            .map(|i| {
                let mut c = check("", Algorithm::Gcra, false);
                c.key = format!("rl:{{k:{i}/é}}:api:limit-{i}").into();
                c.per_window = u64::MAX;
                c.burst = u64::MAX;
                c.window_ms = u64::MAX;
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
        let plain: Vec<LimitCheck> = longest_checks(9)
            .into_iter()
            .map(|mut c| {
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
            let path = BridgeRequest::evalsha(&"f".repeat(40), &call).path;
            assert_eq!(call.keys.len(), 9);
            assert_eq!(
                path.len(),
                CallSize::new(9, 1, 0).with_checks(&plain, lease).bytes(),
                "lease {lease:?}"
            );
        }
        assert!(BridgeRequest::evalsha(
            "",
            &DecideCall::leasing(&clock, 0, [(&plain[..], Some(1))])
        )
        .path
        .contains("/lease/18446744073709551615/0%2E000001/"));
        let refunds: Vec<Refund> = plain
            .iter()
            .zip([0.25, 1e300, 5e-324, 0.0, 7.0, 1.5, 1e-7, 123456.789, 3.0])
            .map(|(c, left)| Refund {
                check: c.clone(),
                charged_at_ns: u128::MAX,
                left,
            })
            .collect();
        let call = DecideCall::refund(u128::MAX, u128::MAX, &refunds);
        let path = BridgeRequest::evalsha(&"f".repeat(40), &call).path;
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
            let path = BridgeRequest::evalsha(&"f".repeat(40), &call).path;
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

    #[test]
    fn hostile_key_cannot_add_arguments() {
        let checks = [check(
            "rl:{k:a/1000000/1000000.json}:r:l",
            Algorithm::Gcra,
            false,
        )];
        let req = BridgeRequest::evalsha("sha", &DecideCall::new("redis", 0, [&checks[..]]));
        assert_eq!(req.path.split('/').count(), 19);
        assert!(!req.path.contains(".json"));
    }

    #[test]
    fn headers_carry_authority_auth_and_length() {
        let bridge = Bridge {
            cluster: "webdis".into(),
            authority: "webdis.local".into(),
            authorization: Some("Basic dTpw".into()),
        };
        let headers = BridgeRequest::script_load().headers(&bridge);
        let get = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get(":method").as_deref(), Some("PUT"));
        assert_eq!(get(":path").as_deref(), Some("/SCRIPT/LOAD"));
        assert_eq!(get(":authority").as_deref(), Some("webdis.local"));
        assert_eq!(get("authorization").as_deref(), Some("Basic dTpw"));
        assert_eq!(
            get("content-length"),
            Some(crate::DECISION_LUA.len().to_string())
        );
    }
}
