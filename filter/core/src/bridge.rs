//! Talking to Webdis: the requests the filter sends and what their replies mean.

use std::collections::HashMap;
use std::fmt;

use serde_json::Value;

use crate::config::{Bridge, Lease};
use crate::encode::{path_segment, path_segment_len};
use crate::plan::LimitCheck;

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

/// A charge to give back: the limit, the clock the charge was decided with, and the
/// `remaining` it replied.
#[derive(Debug, Clone, PartialEq)]
pub struct Refund {
    pub check: LimitCheck,
    pub charged_at_ns: u128,
    pub left: f64,
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
                if let (Some(requests), Some(lease), None, false) =
                    (ask_lease, c.lease, &c.budget, c.shadow)
                {
                    body.push("lease".to_string());
                    body.push(lease_units(lease, c, requests).to_string());
                    body.push(lease.fraction.to_string());
                    continue;
                }
                body.push(if c.shadow { "shadow" } else { "enforce" }.to_string());
                match &c.budget {
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
        let mut keys = KeyTable::default();
        let mut args = vec![
            clock.to_string(),
            deadline_ms.to_string(),
            "1".to_string(),
            "0".to_string(),
            refunds.len().to_string(),
        ];
        for r in refunds {
            push_limit(&mut args, keys.index_of(&r.check.key), &r.check);
            args.push("refund".to_string());
            args.push(r.charged_at_ns.to_string());
            args.push(format!("{}", r.left));
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

/// An upper bound of the bytes a request's checks add to a call's path (keys counted as if
/// none were shared), so a batch can stop before it outgrows what Webdis accepts.
pub fn call_bytes(checks: &[LimitCheck]) -> usize {
    // Per limit: the key index, algorithm, four numbers, the mode, the budget and overflow
    // key indexes, with their separators.
    const ARGUMENTS_PER_LIMIT: usize = 9 * 21 + 10;
    // Per budget: the counter key's index, two numbers and the mode.
    const ARGUMENTS_PER_BUDGET: usize = 4 * 21 + 4;
    4 + checks
        .iter()
        .map(|c| {
            let budget = c.budget.as_ref().map_or(0, |b| {
                2 + path_segment_len(b.overflow_key.as_bytes())
                    + path_segment_len(b.counter_key.as_bytes())
                    + ARGUMENTS_PER_BUDGET
            });
            1 + path_segment_len(c.key.as_bytes()) + ARGUMENTS_PER_LIMIT + budget
        })
        .sum::<usize>()
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

/// A reply from Webdis as the host delivered it: no status means the call timed out or the
/// connection failed.
#[derive(Debug, Clone, Copy)]
pub struct BridgeReply<'a> {
    pub status: Option<u16>,
    pub body: &'a [u8],
}

/// What Redis decided for one limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitResult {
    pub allowed: bool,
    /// Units left after this request (charged only if the request was allowed).
    pub remaining: f64,
    /// Milliseconds until the limit is whole again.
    pub reset_ms: f64,
    /// When refused: milliseconds until this request would be allowed.
    pub retry_ms: f64,
    /// A new identity over its rule's key budget: refused for it (mode `deny`) or decided on
    /// the rule's shared overflow state (mode `shared`).
    pub over_budget: bool,
}

/// What Redis decided for one request: all limits, in the order they were sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Every enforced limit allowed, and the request was charged.
    pub allowed: bool,
    pub limits: Vec<LimitResult>,
    /// Further requests of the same costs charged with this one as a lease (0: none); each
    /// limit's `remaining` and `reset_ms` then describe the state after the whole lease.
    pub leased: u64,
}

/// Why the bridge gave no decision. Every one of these goes to the failure policy.
#[derive(Debug, Clone, PartialEq)]
pub enum BridgeFailure {
    /// No response: timeout or connection failure.
    NoResponse,
    /// An HTTP status other than 200 (403: credentials or ACL; 503: Redis down).
    Status(u16),
    /// Redis answered with an error (shown truncated).
    Redis(String),
    /// The script is still missing after loading it.
    NoScript,
    /// A reply the filter cannot read.
    BadReply(&'static str),
    /// The host refused to start the call (for example an unknown cluster).
    Dispatch(String),
    /// The host could not tell the time.
    Clock,
    /// The call reached Redis after its deadline; Redis charged nothing.
    Stale,
    /// The worker's circuit breaker is open: no call was made.
    BreakerOpen,
    /// The request's timeout passed while it waited for a call.
    Expired,
    /// The stream that made the call ended, and its reply with it.
    Orphaned,
}

impl fmt::Display for BridgeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BridgeFailure::NoResponse => write!(
                f,
                "no response from the bridge (timeout or connection failure)"
            ),
            BridgeFailure::Status(code) => write!(f, "bridge answered HTTP {code}"),
            BridgeFailure::Redis(message) => write!(f, "redis error: {message}"),
            BridgeFailure::NoScript => write!(f, "script still missing after SCRIPT LOAD"),
            BridgeFailure::BadReply(why) => write!(f, "unreadable bridge reply: {why}"),
            BridgeFailure::Dispatch(why) => write!(f, "could not call the bridge: {why}"),
            BridgeFailure::Clock => write!(f, "host clock unavailable"),
            BridgeFailure::Stale => write!(f, "the call reached Redis after its deadline"),
            BridgeFailure::BreakerOpen => write!(f, "the circuit breaker is open"),
            BridgeFailure::Expired => write!(f, "timed out waiting for a bridge call"),
            BridgeFailure::Orphaned => write!(f, "the stream that made the call ended"),
        }
    }
}

/// What an `EVALSHA` reply says.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalOutcome {
    /// One entry per request of the batch, in order: its decision, or why Redis could not
    /// decide that request alone.
    Decided(Vec<Result<Decision, BridgeFailure>>),
    /// Redis does not have the script (it restarted): load it and retry.
    NoScript,
}

const MAX_ERROR_TEXT: usize = 200;

fn shown_error(message: &str) -> String {
    let mut shown: String = message.chars().take(MAX_ERROR_TEXT).collect();
    if shown.len() < message.len() {
        shown.push('…');
    }
    shown
}

/// Reads the reply to an `EVALSHA` of a batch whose requests carry `shape[i]` limits each:
/// `{"EVALSHA":[R, then per request committed, n, (allowed, "remaining", "reset", "retry") × n,
/// or -1, "error"]}`, or an error for the whole call in a 200 body.
pub fn parse_eval_reply(
    reply: BridgeReply<'_>,
    shape: &[usize],
) -> Result<EvalOutcome, BridgeFailure> {
    let shape: Vec<RequestShape> = shape
        .iter()
        .map(|&limits| RequestShape {
            limits,
            most_leased: 0,
        })
        .collect();
    parse_batch_reply(reply, &shape)
}

/// What the reply for one request of a batch may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestShape {
    /// Its limits.
    pub limits: usize,
    /// The most further requests a lease it asked for may hold (0: it asked for none). A
    /// reply granting more is unreadable: a broken bridge must not hand out units.
    pub most_leased: u64,
}

/// [`parse_eval_reply`] for a batch whose requests may have asked for leases: a committed
/// request replies 1 + the further requests leased instead of 1.
pub fn parse_batch_reply(
    reply: BridgeReply<'_>,
    shape: &[RequestShape],
) -> Result<EvalOutcome, BridgeFailure> {
    let items = command_result(reply, "EVALSHA")?;
    let items = items
        .as_array()
        .ok_or(BridgeFailure::BadReply("EVALSHA result is not an array"))?;
    if let [Value::Bool(false), Value::String(message)] = items.as_slice() {
        if message.starts_with("NOSCRIPT") {
            return Ok(EvalOutcome::NoScript);
        }
        if message.starts_with("EXPIRED") {
            return Err(BridgeFailure::Stale);
        }
        return Err(BridgeFailure::Redis(shown_error(message)));
    }
    let Some((count, mut rest)) = items.split_first() else {
        return Err(BridgeFailure::BadReply("EVALSHA result is too short"));
    };
    if count.as_u64() != Some(shape.len() as u64) {
        return Err(BridgeFailure::BadReply(
            "EVALSHA result has the wrong number of requests",
        ));
    }
    let mut decisions = Vec::with_capacity(shape.len());
    for &expected in shape {
        let (decision, after) = parse_request(rest, expected)?;
        decisions.push(decision);
        rest = after;
    }
    if !rest.is_empty() {
        return Err(BridgeFailure::BadReply("EVALSHA result is too long"));
    }
    Ok(EvalOutcome::Decided(decisions))
}

/// One request's part of a batch reply, and what follows it.
fn parse_request(
    items: &[Value],
    shape: RequestShape,
) -> Result<(Result<Decision, BridgeFailure>, &[Value]), BridgeFailure> {
    let expected = shape.limits;
    let too_short = BridgeFailure::BadReply("EVALSHA result is too short");
    let [status, second, rest @ ..] = items else {
        return Err(too_short);
    };
    if status.as_i64() == Some(-1) {
        let message = second
            .as_str()
            .ok_or(BridgeFailure::BadReply("request error is not a text"))?;
        return Ok((Err(BridgeFailure::Redis(shown_error(message))), rest));
    }
    // 0: refused; k >= 1: committed, with k - 1 further requests leased.
    let committed = status
        .as_u64()
        .filter(|&k| k <= 1 + shape.most_leased)
        .ok_or(BridgeFailure::BadReply(
            "decision flag is not 0, 1 or 1 + a lease asked for",
        ))?;
    if second.as_u64() != Some(expected as u64) {
        return Err(BridgeFailure::BadReply(
            "EVALSHA result has the wrong number of limits",
        ));
    }
    if rest.len() < 4 * expected {
        return Err(too_short);
    }
    let (values, rest) = rest.split_at(4 * expected);
    let mut limits = Vec::with_capacity(expected);
    for chunk in values.chunks_exact(4) {
        // 0 or 1: refused or allowed; plus 2 when the identity was over the key budget.
        let outcome = chunk[0]
            .as_u64()
            .filter(|v| *v <= 3)
            .ok_or(BridgeFailure::BadReply("limit outcome is not 0 to 3"))?;
        limits.push(LimitResult {
            allowed: outcome & 1 == 1,
            remaining: non_negative_number(&chunk[1])
                .ok_or(BridgeFailure::BadReply("remaining is not a number >= 0"))?,
            reset_ms: non_negative_number(&chunk[2])
                .ok_or(BridgeFailure::BadReply("reset is not a number >= 0"))?,
            retry_ms: non_negative_number(&chunk[3])
                .ok_or(BridgeFailure::BadReply("retry-after is not a number >= 0"))?,
            over_budget: outcome & 2 == 2,
        });
    }
    let decision = Decision {
        allowed: committed >= 1,
        limits,
        leased: committed.saturating_sub(1),
    };
    Ok((Ok(decision), rest))
}

/// Reads the reply to `SCRIPT LOAD`: `{"SCRIPT":"<sha>"}`, which must name our script.
pub fn parse_script_load_reply(
    reply: BridgeReply<'_>,
    expected_sha: &str,
) -> Result<(), BridgeFailure> {
    match command_result(reply, "SCRIPT")? {
        Value::String(sha) if sha == expected_sha => Ok(()),
        Value::String(_) => Err(BridgeFailure::BadReply(
            "SCRIPT LOAD returned another script's hash",
        )),
        Value::Array(items) => match items.as_slice() {
            [Value::Bool(false), Value::String(message)] => {
                Err(BridgeFailure::Redis(shown_error(message)))
            }
            _ => Err(BridgeFailure::BadReply("SCRIPT LOAD result is not a hash")),
        },
        _ => Err(BridgeFailure::BadReply("SCRIPT LOAD result is not a hash")),
    }
}

/// The value under `command` in a 200 JSON reply.
fn command_result(reply: BridgeReply<'_>, command: &str) -> Result<Value, BridgeFailure> {
    match reply.status {
        None => return Err(BridgeFailure::NoResponse),
        Some(200) => {}
        Some(code) => return Err(BridgeFailure::Status(code)),
    }
    let value: Value = serde_json::from_slice(reply.body)
        .map_err(|_| BridgeFailure::BadReply("body is not JSON"))?;
    match value {
        Value::Object(mut map) => map
            .remove(command)
            .ok_or(BridgeFailure::BadReply("reply is for another command")),
        _ => Err(BridgeFailure::BadReply("body is not a JSON object")),
    }
}

/// Numbers come back as strings (Redis truncates Lua numbers); accept plain integers too.
fn non_negative_number(value: &Value) -> Option<f64> {
    let n = match value {
        Value::String(s) => s.parse::<f64>().ok()?,
        Value::Number(n) => n.as_f64()?,
        _ => return None,
    };
    (n.is_finite() && n >= 0.0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Algorithm, OverBudget};
    use crate::plan::BudgetCheck;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn ok(body: &str) -> BridgeReply<'_> {
        BridgeReply {
            status: Some(200),
            body: body.as_bytes(),
        }
    }

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
            shadow,
            budget: None,
            lease: None,
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
            c.budget = Some(std::rc::Rc::new(BudgetCheck {
                counter_key: "rl:{key_budget}:ip".into(),
                overflow_key: format!("rl:{{overflow}}:ip:{limit}"),
                new_keys: 1000,
                window_ms: 60_000,
                over_budget: OverBudget::Deny,
            }));
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

    #[test]
    fn over_budget_outcomes_are_read() {
        let Ok(EvalOutcome::Decided(d)) = parse_eval_reply(
            ok(r#"{"EVALSHA":[2,0,1,2,"0","900","900",1,1,3,"4","6000","0"]}"#),
            &[1, 1],
        ) else {
            panic!("not decided");
        };
        let first = d[0].as_ref().unwrap();
        assert!(!first.allowed && !first.limits[0].allowed && first.limits[0].over_budget);
        let second = d[1].as_ref().unwrap();
        assert!(second.allowed && second.limits[0].allowed && second.limits[0].over_budget);
    }

    #[test]
    fn decisions_are_read() {
        assert_eq!(
            parse_eval_reply(
                ok(
                    r#"{"EVALSHA":[2,1,2,1,"4","6000","0",0,"0.25","59000","4500",-1,"ERR decide: bad"]}"#
                ),
                &[2, 1]
            ),
            Ok(EvalOutcome::Decided(vec![
                Ok(Decision {
                    allowed: true,
                    limits: vec![
                        LimitResult {
                            allowed: true,
                            remaining: 4.0,
                            reset_ms: 6000.0,
                            retry_ms: 0.0,
                            over_budget: false,
                        },
                        LimitResult {
                            allowed: false,
                            remaining: 0.25,
                            reset_ms: 59000.0,
                            retry_ms: 4500.0,
                            over_budget: false,
                        },
                    ],
                    leased: 0
                }),
                Err(BridgeFailure::Redis("ERR decide: bad".into()))
            ]))
        );
    }

    #[test]
    fn noscript_asks_for_a_load() {
        assert_eq!(
            parse_eval_reply(
                ok(r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#),
                &[1]
            ),
            Ok(EvalOutcome::NoScript)
        );
    }

    /// Every failure shape from FACTS.md, plus garbage: each is a bridge failure, none panics.
    #[test]
    fn failures_are_classified() {
        let long_error = format!(r#"{{"EVALSHA":[false,"ERR {}"]}}"#, "x".repeat(1000));
        let cases: Vec<(BridgeReply<'_>, BridgeFailure)> = vec![
            (
                BridgeReply {
                    status: None,
                    body: b"",
                },
                BridgeFailure::NoResponse,
            ),
            (
                BridgeReply {
                    status: Some(403),
                    body: b"",
                },
                BridgeFailure::Status(403),
            ),
            (
                BridgeReply {
                    status: Some(503),
                    body: b"",
                },
                BridgeFailure::Status(503),
            ),
            (
                BridgeReply {
                    status: Some(405),
                    body: b"",
                },
                BridgeFailure::Status(405),
            ),
            (
                ok(r#"{"EVALSHA":[false,"ERR user_script:14: attempt to compare nil"]}"#),
                BridgeFailure::Redis("ERR user_script:14: attempt to compare nil".into()),
            ),
            (ok(""), BridgeFailure::BadReply("body is not JSON")),
            (ok("<html>"), BridgeFailure::BadReply("body is not JSON")),
            (
                ok(r#"{"EVALSHA":[1,1,"4""#),
                BridgeFailure::BadReply("body is not JSON"),
            ),
            (
                ok("[1,2,3]"),
                BridgeFailure::BadReply("body is not a JSON object"),
            ),
            (
                ok(r#"{"GET":"x"}"#),
                BridgeFailure::BadReply("reply is for another command"),
            ),
            (
                ok(r#"{"EVALSHA":"OK"}"#),
                BridgeFailure::BadReply("EVALSHA result is not an array"),
            ),
            (
                ok(r#"{"EVALSHA":[]}"#),
                BridgeFailure::BadReply("EVALSHA result is too short"),
            ),
            (
                ok(r#"{"EVALSHA":[1]}"#),
                BridgeFailure::BadReply("EVALSHA result is too short"),
            ),
            (
                ok(r#"{"EVALSHA":[2,1,1,1,"4","0","0"]}"#),
                BridgeFailure::BadReply("EVALSHA result has the wrong number of requests"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,1,"4","0","0",1]}"#),
                BridgeFailure::BadReply("EVALSHA result is too long"),
            ),
            (
                ok(r#"{"EVALSHA":[1,-1,7]}"#),
                BridgeFailure::BadReply("request error is not a text"),
            ),
            (
                ok(r#"{"EVALSHA":[1,2,1,1,"4","0","0"]}"#),
                BridgeFailure::BadReply("decision flag is not 0, 1 or 1 + a lease asked for"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,2,1,"4","0","0"]}"#),
                BridgeFailure::BadReply("EVALSHA result has the wrong number of limits"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,1,"4","0"]}"#),
                BridgeFailure::BadReply("EVALSHA result is too short"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,true,"4","0","0"]}"#),
                BridgeFailure::BadReply("limit outcome is not 0 to 3"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,4,"4","0","0"]}"#),
                BridgeFailure::BadReply("limit outcome is not 0 to 3"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,1,"four","0","0"]}"#),
                BridgeFailure::BadReply("remaining is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,1,"-1","0","0"]}"#),
                BridgeFailure::BadReply("remaining is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,1,"inf","0","0"]}"#),
                BridgeFailure::BadReply("remaining is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,1,"1",null,"0"]}"#),
                BridgeFailure::BadReply("reset is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,0,1,0,"0","0",{}]}"#),
                BridgeFailure::BadReply("retry-after is not a number >= 0"),
            ),
        ];
        for (reply, want) in cases {
            assert_eq!(
                parse_eval_reply(reply, &[1]),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(reply.body)
            );
        }
        match parse_eval_reply(ok(&long_error), &[1]) {
            Err(BridgeFailure::Redis(shown)) => {
                assert_eq!(shown.chars().count(), MAX_ERROR_TEXT + 1)
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn script_load_reply_must_name_our_script() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let good = format!(r#"{{"SCRIPT":"{sha}"}}"#);
        assert_eq!(parse_script_load_reply(ok(&good), sha), Ok(()));
        assert_eq!(
            parse_script_load_reply(ok(r#"{"SCRIPT":"ffff"}"#), sha),
            Err(BridgeFailure::BadReply(
                "SCRIPT LOAD returned another script's hash"
            ))
        );
        assert_eq!(
            parse_script_load_reply(ok(r#"{"SCRIPT":[false,"NOPERM no"]}"#), sha),
            Err(BridgeFailure::Redis("NOPERM no".into()))
        );
        assert_eq!(
            parse_script_load_reply(
                BridgeReply {
                    status: Some(403),
                    body: b""
                },
                sha
            ),
            Err(BridgeFailure::Status(403))
        );
        assert_eq!(
            parse_script_load_reply(ok("{}"), sha),
            Err(BridgeFailure::BadReply("reply is for another command"))
        );
    }
}
