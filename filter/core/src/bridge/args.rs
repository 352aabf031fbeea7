//! The decision script's arguments: the layout `lua/decide.lua` reads, written by the
//! protocol's encoder ([`super::wire`]) for a batch of decisions and lease asks, a refund, or
//! a settlement (the filter and the Lua tests use it).

use std::collections::HashMap;

use super::wire::{
    encode_count, encode_head, encode_limit, Args, Budget, Definition, KeyIndex, WireMode,
};
pub use crate::bounds::FRACTION_DECIMALS;
use crate::check::{BudgetCheck, LimitCheck, Mode};
use crate::config::Lease;
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
    /// [`super::wire::FIELD_SEPARATOR`] (algorithm, limit, window ([`super::wire::window_arg`]), burst, mode, budget
    /// index or 0, overflow key index or 0), then per request its number of limits and per
    /// limit one argument of three fields (key index, definition index, cost), then what its
    /// mode adds ([`WireMode`]). A batch's requests on one rule's limit share its definition.
    pub args: Vec<String>,
}

/// Numbers a call's limit definitions from 1 in order of first use, and writes them.
#[derive(Default)]
struct Definitions {
    args: Vec<String>,
    index: HashMap<String, usize>,
}

impl Definitions {
    fn count(&self) -> usize {
        self.index.len()
    }

    fn index_of(&mut self, definition: &Definition) -> usize {
        let mut text = Args::default();
        definition.encode(&mut text);
        let text = text.one();
        let next = self.index.len() + 1;
        if let Some(&i) = self.index.get(&text) {
            return i;
        }
        self.args.push(text.clone());
        self.index.insert(text, next);
        next
    }
}

/// The units of `check` a request asking for a lease of `requests` requests' worth asks for:
/// `requests` × its cost, its lease's `max_units` at most (and at least 1, the script's floor).
pub fn lease_units(lease: Lease, check: &LimitCheck, requests: u64) -> u64 {
    match check.cost {
        0 => lease.max_units,
        cost => lease.max_units.min(requests.saturating_mul(cost)).max(1),
    }
}

/// The mode `check` goes with in a decision call, in a request that asks for a lease of
/// `requests` requests' worth (`Some`) or not, and its key budget (only when decided).
pub(super) fn decision_mode(
    check: &LimitCheck,
    requests: Option<u64>,
) -> (WireMode<'_>, Option<&BudgetCheck>) {
    match (&check.mode, requests) {
        (Mode::After, _) => (WireMode::After, None),
        (Mode::Hold(member), _) => (WireMode::Hold { member }, None),
        // Not sent by the engine, which admits a request before it queues it. A plan sent
        // unadmitted names no request: the decision code refuses that limit as malformed (a
        // hold under no id could never be released), and says so in the request's error.
        (Mode::ToHold, _) => (WireMode::Hold { member: "" }, None),
        (Mode::Lease(lease), Some(requests)) => (
            WireMode::Lease {
                units: lease_units(*lease, check, requests),
                fraction: lease.fraction,
            },
            None,
        ),
        (Mode::Lease(_), None) => (WireMode::Enforce, None),
        (Mode::Shadow { budget }, _) => (WireMode::Shadow, budget.as_deref()),
        (Mode::Enforce { budget }, _) => (WireMode::Enforce, budget.as_deref()),
    }
}

/// The mode a settlement's limit goes with (its cost sent as 0): its delta, or for a
/// concurrency hold its release.
pub(super) fn settle_mode(s: &Settlement) -> WireMode<'_> {
    match &s.check.mode {
        Mode::Hold(member) => WireMode::Release { member },
        _ => WireMode::Settle { delta: s.delta },
    }
}

/// The mode a give-back's limit goes with: the charge's clock and what it left, or for a
/// concurrency hold its release.
pub(super) fn refund_mode(r: &Refund) -> WireMode<'_> {
    match &r.check.mode {
        Mode::Hold(member) => WireMode::Release { member },
        _ => WireMode::Refund {
            charged_at: r.charged_at_ns.as_ns(),
            left: r.left,
        },
    }
}

/// A limit's definition in `mode`, with its key budget's and overflow key's indexes.
pub(super) fn definition_of(
    check: &LimitCheck,
    mode: &WireMode,
    budget: Option<(usize, usize)>,
) -> Definition {
    Definition {
        algorithm: check.algorithm,
        per_window: check.per_window,
        window: check.window,
        burst: check.burst,
        mode: mode.name(),
        budget,
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

    /// The key index of a limit whose state is at `key`, with its override's (at
    /// [`override_key`]) when it reads one.
    fn limit_index(&mut self, key: &'a str, overrides: bool) -> KeyIndex {
        let state = self.index_of(key);
        if !overrides {
            return KeyIndex {
                state,
                overrides: None,
            };
        }
        let keys = &mut self.keys;
        let j = *self.overrides.entry(key).or_insert_with(|| {
            keys.push(override_key(key));
            keys.len()
        });
        KeyIndex {
            state,
            overrides: Some(j),
        }
    }
}

/// A call being written: its keys, key budgets, definitions and requests.
#[derive(Default)]
struct CallWriter<'a> {
    keys: KeyTable<'a>,
    definitions: Definitions,
    budgets: Args,
    budget_index: HashMap<&'a str, usize>,
    body: Args,
    requests: usize,
}

impl<'a> CallWriter<'a> {
    fn request(&mut self, limits: usize) {
        self.requests += 1;
        encode_count(&mut self.body, limits, true);
    }

    /// Writes one limit of the current request: `check` (its key and numbers) in `mode`.
    fn limit(
        &mut self,
        check: &'a LimitCheck,
        cost: u64,
        mode: WireMode,
        budget: Option<&'a BudgetCheck>,
    ) {
        let key = self.keys.limit_index(&check.key, check.overrides);
        let budget = budget.map(|b| {
            let next = self.budget_index.len() + 1;
            let i = *self.budget_index.entry(&b.counter_key).or_insert(next);
            if i == next {
                Budget {
                    counter: self.keys.index_of(&b.counter_key),
                    new_keys: b.new_keys,
                    window_ms: b.window_ms,
                    over_budget: b.over_budget,
                }
                .encode(&mut self.budgets);
            }
            (i, self.keys.index_of(&b.overflow_key))
        });
        let definition = self
            .definitions
            .index_of(&definition_of(check, &mode, budget));
        encode_limit(&mut self.body, key, definition, cost, &mode);
    }

    fn finish(self, clock: &str, deadline_ms: u128) -> DecideCall {
        let mut head = Args::default();
        encode_head(
            &mut head,
            clock,
            &deadline_ms.to_string(),
            self.requests,
            self.budget_index.len(),
            self.definitions.count(),
        );
        let mut args = head.finish();
        args.extend(self.budgets.finish());
        args.extend(self.definitions.args);
        args.extend(self.body.finish());
        DecideCall {
            keys: self.keys.keys,
            args,
        }
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
        let mut call = CallWriter::default();
        for (checks, ask_lease) in requests {
            call.request(checks.len());
            for c in checks {
                let (mode, budget) = decision_mode(c, ask_lease);
                call.limit(c, c.cost, mode, budget);
            }
        }
        if !settlements.is_empty() {
            call.settlements(settlements);
        }
        call.finish(clock, deadline_ms)
    }

    /// One request giving back what earlier calls charged (see `lua/decide.lua`). `clock`
    /// (Unix ns) must be no earlier than any decision on these keys: the refund's own time
    /// plus the clock skew allowed between replicas; `deadline_ms` (Unix ms, 0: none) should be `clock` itself: a refund that reaches Redis
    /// later could meet decisions made after its clock, and then gives back nothing.
    pub fn refund(clock: u128, deadline_ms: u128, refunds: &[Refund]) -> Self {
        let mut call = CallWriter::default();
        call.request(refunds.len());
        for r in refunds {
            call.limit(&r.check, r.check.cost, refund_mode(r), None);
        }
        call.finish(&clock.to_string(), deadline_ms)
    }

    /// One request settling usage limits (see `lua/decide.lua`, mode `settle`): each limit is
    /// charged its signed delta at `clock` (Unix ns), without refusing.
    pub fn settle(clock: u128, deadline_ms: u128, settlements: &[Settlement]) -> Self {
        let mut call = CallWriter::default();
        call.settlements(settlements);
        call.finish(&clock.to_string(), deadline_ms)
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

impl<'a> CallWriter<'a> {
    /// One request settling `settlements`, each limit's cost sent as 0.
    fn settlements(&mut self, settlements: &'a [Settlement]) {
        self.request(settlements.len());
        for s in settlements {
            self.limit(&s.check, 0, settle_mode(s), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::call_bytes;
    use crate::bridge::wire::FIELD_SEPARATOR;
    use crate::check::BudgetCheck;
    use crate::config::Window;
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
            // 2 requests, 0 budgets, two definitions; the second request's limit shares the
            // first's.
            "1764489269123456789", "1764489269273", "2~0~2",
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
            // One definition per overflow state (the budget is shared), one for gcra.
            "redis", "0", "2~1~3",
            "2", "1000", "60000", "deny",
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
        // clock, deadline, the head (1 request, 0 budgets, 3 definitions of seven fields).
        assert_eq!(call.args[2], "1~0~3");
        let windows: Vec<&str> = call.args[3..6]
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
        // "", EVALSHA, sha, 1, the key, clock, deadline, the head, the definition, then 1 and
        // the limit.
        assert_eq!(req.path.split('/').count(), 11);
        assert!(!req.path.contains(".json"));
    }
}
