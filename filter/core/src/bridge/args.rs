//! The decision script's arguments: the layout `lua/decide.lua` reads, built here and nowhere
//! else (the filter and the Lua tests use it), for a batch of decisions and lease asks, a
//! refund, or a settlement.

use std::collections::HashMap;

pub use crate::bounds::FRACTION_DECIMALS;
use crate::check::{BudgetCheck, LimitCheck, Mode};
use crate::config::{Lease, Window};
use crate::decision::{Refund, Settlement};
use crate::request::keys::override_key;

/// The arguments of one call of the decision script for a batch of requests, in the layout
/// `lua/decide.lua` reads. Built here and nowhere else: the filter and the Lua tests use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecideCall {
    /// The distinct keys of the batch (`KEYS`); a hot key is sent once.
    pub keys: Vec<String>,
    /// `ARGV`: clock, deadline, number of requests, number of key budgets and four values per
    /// budget (counter key index, new keys, window ms, `shared` | `deny`), number of limit
    /// definitions and one argument per definition of seven fields joined by
    /// [`FIELD_SEPARATOR`] (algorithm, limit, window ([`window_arg`]), burst, mode, budget
    /// index or 0, overflow key index or 0), then per request its number of limits and per
    /// limit one argument of three fields (key index, definition index, cost), then what its
    /// mode adds (`lease`: units and fraction; `hold`: the request's id; `settle`: the delta and
    /// the slot's id or `0`; `refund`: the charge's clock and what it left). A batch's
    /// requests on one rule's limit share its definition.
    pub args: Vec<String>,
}

/// Joins the fields of a definition, and of a limit, into one argument: the script finds a
/// definition or a limit it has read before by that one text (a function library keeps what it
/// read from call to call), and Redis and Webdis handle one argument instead of several. Not
/// percent-encoded in a path (as `/` between arguments would be), and in no field.
pub const FIELD_SEPARATOR: char = '~';

/// What a limit's definition holds: everything but its key, cost and per-request mode values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Definition {
    algorithm: &'static str,
    per_window: u64,
    window: String,
    burst: u64,
    mode: &'static str,
    budget: usize,
    overflow: usize,
}

/// Numbers a call's limit definitions from 1 in order of first use, and writes their values.
#[derive(Default)]
struct Definitions {
    args: Vec<String>,
    index: HashMap<Definition, usize>,
}

impl Definitions {
    fn count(&self) -> usize {
        self.index.len()
    }

    fn index_of(&mut self, definition: Definition) -> usize {
        let next = self.index.len() + 1;
        let args = &mut self.args;
        *self.index.entry(definition).or_insert_with_key(|d| {
            let Definition {
                algorithm,
                per_window,
                window,
                burst,
                mode,
                budget,
                overflow,
            } = d;
            args.push(format!(
                "{algorithm}~{per_window}~{window}~{burst}~{mode}~{budget}~{overflow}"
            ));
            next
        })
    }
}

/// Writes one limit of a request: one argument of its key index (with its override's, `i:j`,
/// for a limit that reads one), its definition's index and its cost, joined by
/// [`FIELD_SEPARATOR`]; then its mode's values, one argument each.
fn push_limit(
    body: &mut Vec<String>,
    definitions: &mut Definitions,
    key_index: String,
    c: &LimitCheck,
    mode: &'static str,
    (budget, overflow): (usize, usize),
    extras: impl IntoIterator<Item = String>,
) {
    let definition = Definition {
        algorithm: c.algorithm.name(),
        per_window: c.per_window,
        window: window_arg(c.window),
        burst: c.burst,
        mode,
        budget,
        overflow,
    };
    let definition = definitions.index_of(definition);
    body.push(format!("{key_index}~{definition}~{}", c.cost));
    body.extend(extras);
}

/// The units of `check` a request asking for a lease of `requests` requests' worth asks for:
/// `requests` × its cost, its lease's `max_units` at most (and at least 1, the script's floor).
pub fn lease_units(lease: Lease, check: &LimitCheck, requests: u64) -> u64 {
    match check.cost {
        0 => lease.max_units,
        cost => lease.max_units.min(requests.saturating_mul(cost)).max(1),
    }
}

/// The window argument: its length in ms, digits only; or a calendar window (fixed_window
/// only) as its unit's letter and its UTC offset in signed minutes: `D+330` (a day at
/// +05:30), `W+0` (an ISO week in UTC), `M-300` (a month at -05:00). The script reads it as a
/// calendar only when it is not plain digits.
pub fn window_arg(window: Window) -> String {
    match window {
        Window::Fixed(d) => d.as_millis().to_string(),
        Window::Calendar(c) => c.wire(),
    }
}

fn fraction_text(fraction: f64) -> String {
    format!("{fraction:.FRACTION_DECIMALS$}")
}

/// The mode a limit goes with in a decision call: its [`Mode`], in a request that asks for a
/// lease of `requests` requests' worth (`Some`) or not.
pub(super) enum WireMode<'a> {
    After,
    /// A concurrency limit: `hold`, the request's id, `0`.
    Hold(&'a str),
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
    pub(super) fn of(check: &'a LimitCheck, requests: Option<u64>) -> Self {
        match (&check.mode, requests) {
            (Mode::After, _) => WireMode::After,
            (Mode::Hold(member), _) => WireMode::Hold(member),
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

/// A limit as it goes in a call that adjusts what earlier calls charged: its key, the check
/// sent, its mode and the mode's two values.
type Adjustment<'a> = (&'a str, LimitCheck, &'static str, [String; 2]);

/// A settlement as its limit goes in a call: its check sent with cost 0, mode `settle`, the
/// delta and `0`, or for a concurrency slot its release.
fn settle_limit(s: &Settlement) -> Adjustment<'_> {
    let check = LimitCheck {
        cost: 0,
        ..s.check.clone()
    };
    let values = release_of(&s.check).unwrap_or_else(|| [s.delta.to_string(), "0".to_string()]);
    (&s.check.key, check, "settle", values)
}

/// The values after `settle` releasing the slot a concurrency limit's request holds: `-1`
/// and its id (None: `check` holds no slot).
fn release_of(check: &LimitCheck) -> Option<[String; 2]> {
    match &check.mode {
        Mode::Hold(member) => Some(["-1".to_string(), member.to_string()]),
        _ => None,
    }
}

/// Numbers the distinct keys of a call from 1, as `KEYS` does.
#[derive(Default)]
struct KeyTable<'a> {
    keys: Vec<String>,
    index: HashMap<&'a str, usize>,
    /// A state key's override key's index.
    overrides: HashMap<&'a str, usize>,
}

impl<'a> KeyTable<'a> {
    fn index_of(&mut self, key: &'a str) -> usize {
        let keys = &mut self.keys;
        *self.index.entry(key).or_insert_with(|| {
            keys.push(key.to_string());
            keys.len()
        })
    }

    /// The key index argument of a limit whose state is at `key`: `i`, or `i:j` when it reads
    /// its override (at [`override_key`]).
    fn limit_index(&mut self, key: &'a str, overrides: bool) -> String {
        let i = self.index_of(key);
        if !overrides {
            return i.to_string();
        }
        let keys = &mut self.keys;
        let j = *self.overrides.entry(key).or_insert_with(|| {
            keys.push(override_key(key));
            keys.len()
        });
        format!("{i}:{j}")
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
        Self::leasing_with(clock, deadline_ms, requests, &[])
    }

    /// [`DecideCall::leasing`], then one more request settling `settlements` as
    /// [`DecideCall::settle`] would (none when empty): settlements riding on a decision call,
    /// on its clock and deadline. Its reply is the last entry.
    pub fn leasing_with<'a>(
        clock: &str,
        deadline_ms: u128,
        requests: impl IntoIterator<Item = (&'a [LimitCheck], Option<u64>)>,
        settlements: &'a [Settlement],
    ) -> Self {
        let mut keys = KeyTable::default();
        let mut definitions = Definitions::default();
        let mut budgets: Vec<String> = Vec::new();
        let mut budget_index: HashMap<&str, usize> = HashMap::new();
        let mut body: Vec<String> = Vec::new();
        let mut count = 0usize;
        for (checks, ask_lease) in requests {
            count += 1;
            body.push(checks.len().to_string());
            for c in checks {
                let key_index = keys.limit_index(&c.key, c.overrides);
                let (mode, budget, extras) = match WireMode::of(c, ask_lease) {
                    WireMode::After => ("after", (0, 0), vec![]),
                    WireMode::Hold(member) => ("hold", (0, 0), vec![member.to_string()]),
                    WireMode::Lease { units, fraction } => (
                        "lease",
                        (0, 0),
                        vec![units.to_string(), fraction_text(fraction)],
                    ),
                    WireMode::Decide { shadow, budget } => {
                        let budget = budget.map_or((0, 0), |b| {
                            let next = budget_index.len() + 1;
                            let i = *budget_index.entry(&b.counter_key).or_insert(next);
                            if i == next {
                                budgets.push(keys.index_of(&b.counter_key).to_string());
                                budgets.push(b.new_keys.to_string());
                                budgets.push(b.window_ms.to_string());
                                budgets.push(b.over_budget.name().to_string());
                            }
                            (i, keys.index_of(&b.overflow_key))
                        });
                        let mode = if shadow { "shadow" } else { "enforce" };
                        (mode, budget, vec![])
                    }
                };
                push_limit(
                    &mut body,
                    &mut definitions,
                    key_index,
                    c,
                    mode,
                    budget,
                    extras,
                );
            }
        }
        if !settlements.is_empty() {
            count += 1;
            body.push(settlements.len().to_string());
            for s in settlements {
                let (key, check, mode, values) = settle_limit(s);
                let key_index = keys.limit_index(key, check.overrides);
                push_limit(
                    &mut body,
                    &mut definitions,
                    key_index,
                    &check,
                    mode,
                    (0, 0),
                    values,
                );
            }
        }
        let mut args = Vec::with_capacity(5 + budgets.len() + definitions.args.len() + body.len());
        args.push(clock.to_string());
        args.push(deadline_ms.to_string());
        args.push(count.to_string());
        args.push(budget_index.len().to_string());
        args.extend(budgets);
        args.push(definitions.count().to_string());
        args.extend(definitions.args);
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
            // A concurrency slot is given back by its id: a release.
            let (mode, values) = match release_of(&r.check) {
                Some(release) => ("settle", release),
                None => (
                    "refund",
                    [r.charged_at_ns.to_string(), format!("{}", r.left)],
                ),
            };
            (&*r.check.key, r.check.clone(), mode, values)
        })
    }

    /// One request settling usage limits (see `lua/decide.lua`, mode `settle`): each limit is
    /// charged its signed delta at `clock` (Unix ns), without refusing.
    pub fn settle(clock: u128, deadline_ms: u128, settlements: &[Settlement]) -> Self {
        Self::adjustment(clock, deadline_ms, settlements, settle_limit)
    }

    /// One request of `items`, each a limit (its key, as the check to send) with its mode and
    /// the mode's two values: a request that only adjusts what earlier calls charged
    /// (refunds, settlements).
    fn adjustment<'a, T>(
        clock: u128,
        deadline_ms: u128,
        items: &'a [T],
        limit: impl Fn(&'a T) -> Adjustment<'a>,
    ) -> Self {
        let mut keys = KeyTable::default();
        let mut definitions = Definitions::default();
        let mut body = vec![items.len().to_string()];
        for item in items {
            let (key, check, mode, values) = limit(item);
            let key_index = keys.limit_index(key, check.overrides);
            push_limit(
                &mut body,
                &mut definitions,
                key_index,
                &check,
                mode,
                (0, 0),
                values,
            );
        }
        let mut args = vec![
            clock.to_string(),
            deadline_ms.to_string(),
            "1".to_string(),
            "0".to_string(),
            definitions.count().to_string(),
        ];
        args.extend(definitions.args);
        args.extend(body);
        DecideCall {
            keys: keys.keys,
            args,
        }
    }

    /// The Redis command: `FCALL name` or `EVALSHA sha` (`command`, `handle`), then
    /// `numkeys KEYS... ARGV...`.
    pub fn command(&self, command_name: &str, handle: &str) -> Vec<String> {
        let mut command = Vec::with_capacity(3 + self.keys.len() + self.args.len());
        command.push(command_name.to_string());
        command.push(handle.to_string());
        command.push(self.keys.len().to_string());
        command.extend(self.keys.iter().cloned());
        command.extend(self.args.iter().cloned());
        command
    }

    /// The Redis command for a Redis Cluster call for keys of several slots of one node:
    /// `EVALSHA sha 0` (`command`, `handle`), no key declared (Redis refuses declared keys of several slots), then
    /// the keys at the head of `ARGV`: the first (the proxy routes the call by it), their
    /// number, `1` to ask for the node's slot map (else `0`), the others; then `ARGV` as in
    /// [`DecideCall::command`]. `lua/decide.lua` reads them back into `KEYS` and `ARGV`.
    pub fn command_on_node(&self, command_name: &str, handle: &str, ask_map: bool) -> Vec<String> {
        let (first, others) = self
            .keys
            .split_first()
            .map_or((String::new(), &[][..]), |(f, o)| (f.clone(), o));
        let mut command = Vec::with_capacity(6 + self.keys.len() + self.args.len());
        command.extend([
            command_name.to_string(),
            handle.to_string(),
            "0".to_string(),
            first,
            self.keys.len().to_string(),
            if ask_map { "1" } else { "0" }.to_string(),
        ]);
        command.extend(others.iter().cloned());
        command.extend(self.args.iter().cloned());
        command
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::call_bytes;
    use crate::check::BudgetCheck;
    use crate::config::{Algorithm, OverBudget};
    use crate::testing::plan::minute_check as check;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

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
        let req = crate::program::Program::script_named("abc123").decide(&call);
        let segments: Vec<&str> = req.path.split('/').collect();
        #[rustfmt::skip]
        let want = [
            "", "EVALSHA", "abc123", "2",
            "rl%3A%7Bk%3A1%7D%3Aapi%3Asecond", "rl%3A%7Bk%3A1%7D%3Aapi%3Aday",
            "1764489269123456789", "1764489269273", "2", "0",
            // Two definitions; the second request's limit shares the first's.
            "2",
            "token_bucket~10~60000~20~enforce~0~0",
            "fixed_window~10~60000~20~shadow~0~0",
            "2",
            "1~1~1",
            "2~2~1",
            "1",
            "1~1~1",
        ];
        assert_eq!(segments, want);
        assert_eq!(req.method, "GET");
        assert!(req.body.is_none());
        assert_eq!(
            call.command("EVALSHA", "abc123")[..4],
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
            // One definition per overflow state (the budget is shared), one for gcra.
            "3",
            "token_bucket~10~60000~20~enforce~1~3",
            "token_bucket~10~60000~20~enforce~1~5",
            "gcra~10~60000~20~shadow~0~0",
            "2",
            "1~1~1",
            "4~2~1",
            "2",
            "6~3~1",
            "7~1~1",
        ];
        assert_eq!(call.args, want);
        let path = crate::program::Program::script_named("").decide(&call).path;
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
    fn a_calendar_window_goes_as_its_unit_and_offset() {
        use crate::config::CalendarUnit::{Day, Month, Week};
        let calendar = |unit, offset_minutes| {
            let mut c = check("rl:{k:1}:plan:month", Algorithm::FixedWindow, false);
            c.window = Window::Calendar(crate::config::Calendar {
                unit,
                offset_minutes,
            });
            c
        };
        let checks = [calendar(Month, 330), calendar(Day, -300), calendar(Week, 0)];
        let call = DecideCall::new("1", 0, [&checks[..]]);
        // clock, deadline, 1 request, 0 budgets, 3 definitions of seven fields.
        assert_eq!(call.args[4], "3");
        let windows: Vec<&str> = call.args[5..8]
            .iter()
            .filter_map(|d| d.split(FIELD_SEPARATOR).nth(2))
            .collect();
        assert_eq!(windows, ["M+330", "D-300", "W+0"]);
        let path = crate::program::Program::script_named("sha")
            .decide(&call)
            .path;
        assert!(
            path.contains("~M%2B330~") && path.contains("~D-300~"),
            "{path}"
        );
    }

    #[test]
    fn hostile_key_cannot_add_arguments() {
        let checks = [check(
            "rl:{k:a/1000000/1000000.json}:r:l",
            Algorithm::Gcra,
            false,
        )];
        let req = crate::program::Program::script_named("sha").decide(&DecideCall::new(
            "redis",
            0,
            [&checks[..]],
        ));
        // "", EVALSHA, sha, 1, the key, clock, deadline, 1, 0, 1, the definition, then 1 and
        // the limit.
        assert_eq!(req.path.split('/').count(), 13);
        assert!(!req.path.contains(".json"));
    }
}
