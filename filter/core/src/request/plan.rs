//! Which rules apply to a request, and the limit checks it asks Redis for.

use std::rc::Rc;
use std::time::Duration;

use super::identity::resolve_into;
use super::keys::{budget_check, shard_key};
use super::memo::PlanMemo;
use super::source::read_source;
use super::view::{decisive_header, path_only, BadRequest, RequestView};
use crate::bounds::DEFAULT_MAX_BODY;
use crate::check::{LimitCheck, Mode};
use crate::config::{
    AddIncludeUsage, Admit, Algorithm, ClientIpPolicy, Config, Cost, Estimate, FailureMode,
    KeySource, Match, MetadataPath, PathMatch, MAX_USAGE,
};

/// Everything decided about a request before asking Redis.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub checks: Vec<LimitCheck>,
    /// The shortest timeout among the matching rules.
    pub timeout: Duration,
    /// Closed if any matching enforcing rule fails closed, else local if any fails locally.
    pub failure_mode: FailureMode,
}

impl Plan {
    /// Every limit of the plan takes a lease: its requests may be served from leased units.
    pub fn leasable(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.mode.lease().is_some())
    }

    /// Some limit of the plan is a concurrency limit: the request takes a hold while it runs.
    pub fn takes_holds(&self) -> bool {
        self.checks.iter().any(|c| c.mode.takes_hold())
    }
}

/// The plan for a request: every matching rule's limits, keyed and costed.
pub fn plan(config: &Config, view: &dyn RequestView) -> Result<Plan, BadRequest> {
    plan_turn(config, view, 0)
}

/// [`plan`], spending sharded limits from shard `turn % shards` (the worker counts turns).
pub fn plan_turn(config: &Config, view: &dyn RequestView, turn: u64) -> Result<Plan, BadRequest> {
    plan_memo(config, view, turn, &mut PlanMemo::with_capacity(0))
}

/// [`plan_turn`] with the worker's memo of recent identities' keys: the same plan, without
/// the SHA-1 and the key formatting for an identity seen lately.
pub fn plan_memo(
    config: &Config,
    view: &dyn RequestView,
    turn: u64,
    memo: &mut PlanMemo,
) -> Result<Plan, BadRequest> {
    // The buffer is lent out so the memo can be searched while it holds the identity.
    let mut identity = std::mem::take(&mut memo.identity);
    let plan = plan_into(config, view, turn, memo, &mut identity);
    memo.identity = identity;
    plan
}

fn plan_into(
    config: &Config,
    view: &dyn RequestView,
    turn: u64,
    memo: &mut PlanMemo,
    identity: &mut Vec<u8>,
) -> Result<Plan, BadRequest> {
    let method = view.header(":method").unwrap_or_default();
    let path = path_only(view.header(":path").unwrap_or_default());
    let mut plan = Plan {
        checks: Vec::new(),
        timeout: Duration::MAX,
        failure_mode: FailureMode::Open,
    };
    for (r, rule) in config.rules.iter().enumerate() {
        if !matches(&rule.matcher, view, method, path, &config.client_ip, true)? {
            continue;
        }
        let Some(alternative) = resolve_into(view, &rule.key, &config.client_ip, identity)? else {
            continue;
        };
        let cost = request_cost(&rule.cost, view)?;
        plan.timeout = plan.timeout.min(rule.timeout);
        // Closed wins over local, local over open (a shadow rule never closes).
        if !rule.shadow {
            plan.failure_mode = match (plan.failure_mode, rule.failure_mode) {
                (FailureMode::Closed, _) | (_, FailureMode::Closed) => FailureMode::Closed,
                (FailureMode::Local, _) | (_, FailureMode::Local) => FailureMode::Local,
                _ => FailureMode::Open,
            };
        }
        let keys = memo.keys(config, r, alternative, identity);
        for ((l, limit), memoized) in rule.limits.iter().enumerate().zip(keys) {
            let (key, budget) = if limit.shards > 1 {
                // Each turn another shard: its key and budget are made from the memoized one.
                let key: Rc<str> = shard_key(&memoized.key, turn % limit.shards).into();
                let budget = rule
                    .key_budget
                    .as_ref()
                    .map(|b| Rc::new(budget_check(config, rule, limit, b, &key)));
                (key, budget)
            } else {
                (memoized.key.clone(), memoized.budget.clone())
            };
            plan.checks.push(LimitCheck {
                rule: r,
                limit: l,
                key,
                algorithm: limit.algorithm,
                per_window: limit.shard_limit(),
                quota: limit.quota(),
                window: limit.window,
                burst: limit.shard_burst(),
                cost: match (&limit.usage, limit.algorithm) {
                    // A request takes one hold, whatever its cost.
                    (_, Algorithm::Concurrency) => 1,
                    (None, _) => cost,
                    (Some(usage), _) => estimate(usage, view)?,
                },
                mode: if limit.algorithm == Algorithm::Concurrency {
                    Mode::ToHold
                } else {
                    Mode::of(
                        limit
                            .usage
                            .as_ref()
                            .is_some_and(|u| u.admit == Admit::After),
                        limit.lease,
                        rule.shadow,
                        budget,
                    )
                },
                overrides: limit.overrides,
            });
        }
    }
    Ok(plan)
}

/// Whether a rule's matcher fits the request. Its conditions are read last, only when path
/// and method fit, so that a repeated header counts only on requests the rule could apply to.
/// Before the body is read (`body_read` false) a condition on it may hold.
fn matches(
    m: &Match,
    view: &dyn RequestView,
    method: &[u8],
    path: &[u8],
    policy: &ClientIpPolicy,
    body_read: bool,
) -> Result<bool, BadRequest> {
    let path_ok = match &m.path {
        None => true,
        Some(PathMatch::Exact(p)) => path == p.as_bytes(),
        Some(PathMatch::Prefix(p)) => path.starts_with(p.as_bytes()),
    };
    let method_ok = m.methods.is_empty() || m.methods.iter().any(|x| x.as_bytes() == method);
    if !(path_ok && method_ok) {
        return Ok(false);
    }
    let mut value = Vec::new();
    for condition in &m.conditions {
        if !body_read && matches!(condition.source, KeySource::Body(_)) {
            continue;
        }
        value.clear();
        let present = read_source(view, &condition.source, policy, &mut value)?;
        if !condition.test.passes(present.then_some(value.as_slice())) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether the decision for this request waits for its body: some rule it may match has a
/// usage limit estimated from the request (`estimate.request`) or reads a `body:` source.
/// Returns the smallest of their `max_body` (a rule reading the body without such a limit
/// holds up to [`DEFAULT_MAX_BODY`]); None when no body is needed (or a header it matches on
/// is bad: the decision then answers 400 at once).
pub fn request_body_bound(config: &Config, view: &dyn RequestView) -> Option<u64> {
    request_body_plan(config, view).map(|p| p.max_body)
}

/// What the filter does with a request body it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyPlan {
    /// The smallest `max_body` of the usage limits estimated from it and of the rules reading
    /// it ([`request_body_bound`]).
    pub max_body: u64,
    /// A usage limit with `include_usage` applies and the request is a `POST` to a chat
    /// completions or completions path: the option may be added to its body.
    pub include_usage: bool,
}

/// [`request_body_bound`], and whether `include_usage` may be added to the body.
pub fn request_body_plan(config: &Config, view: &dyn RequestView) -> Option<BodyPlan> {
    if !config.metered && config.body_fields.is_empty() {
        return None;
    }
    let method = view.header(":method").unwrap_or_default();
    let path = path_only(view.header(":path").unwrap_or_default());
    let mut plan: Option<BodyPlan> = None;
    for rule in &config.rules {
        let mut max_body: Option<u64> = None;
        let mut include_usage = false;
        for usage in rule.limits.iter().filter_map(|l| l.usage.as_ref()) {
            if let Estimate::Request { max_body: m, .. } = usage.estimate {
                max_body = Some(max_body.map_or(m, |b| b.min(m)));
                include_usage |= adds_include_usage(&usage.include_usage, view);
            }
        }
        if rule.body_paths().next().is_some() {
            max_body = max_body.or(Some(DEFAULT_MAX_BODY));
        }
        let Some(max_body) = max_body else {
            continue;
        };
        if matches(&rule.matcher, view, method, path, &config.client_ip, false).ok()? {
            let include_usage = include_usage && method == b"POST" && streams_usage(path);
            plan = Some(match plan {
                None => BodyPlan {
                    max_body,
                    include_usage,
                },
                Some(p) => BodyPlan {
                    max_body: p.max_body.min(max_body),
                    include_usage: p.include_usage || include_usage,
                },
            });
        }
    }
    plan
}

/// Whether `include_usage` may be added to this request's body: the option is on, and where
/// it says so, the request is marked as streamed (a bool `true` as Envoy hands it over, or the
/// text `true`) and not marked as asking for usage already.
fn adds_include_usage(add: &AddIncludeUsage, view: &dyn RequestView) -> bool {
    let marked =
        |path: &MetadataPath| matches!(view.metadata(path).as_deref(), Some([1]) | Some(b"true"));
    match add {
        AddIncludeUsage::Off => false,
        AddIncludeUsage::Always => true,
        AddIncludeUsage::Marked { streamed, asked } => {
            marked(streamed) && !asked.as_ref().is_some_and(marked)
        }
    }
}

/// OpenAI's endpoints whose streams report usage only with `stream_options.include_usage`:
/// chat completions and (legacy) completions. The Responses API refuses the option.
fn streams_usage(path: &[u8]) -> bool {
    // `/chat/completions` ends so too.
    path.ends_with(b"/completions")
}

/// A usage limit's cost for a request: its estimate.
/// A usage limit's estimate for this request. From the request body and with weights: the
/// input bound at the dearest input weight (a token could be any kind of input), the output
/// bound at the output weight, rounded up.
fn estimate(usage: &crate::config::Usage, view: &dyn RequestView) -> Result<u64, BadRequest> {
    match &usage.estimate {
        Estimate::Fixed(n) => Ok(*n),
        Estimate::Header {
            name,
            min,
            max,
            default,
        } => {
            let cost = Cost::Header {
                name: name.clone(),
                min: *min,
                max: *max,
                default: *default,
            };
            request_cost(&cost, view)
        }
        Estimate::Request {
            completion_default,
            output,
            ..
        } => {
            let (input, output) = view
                .usage_estimate(*completion_default, *output)
                .unwrap_or((0, *completion_default));
            let units = match usage.weights {
                None => u128::from(input) + u128::from(output),
                Some(w) => {
                    let dearest = w.input.max(w.cached_input).max(w.cache_write);
                    let milli = u128::from(input) * dearest.unsigned_abs() as u128
                        + u128::from(output) * w.output.unsigned_abs() as u128;
                    milli.div_ceil(crate::usage::WHOLE as u128)
                }
            };
            Ok(u64::try_from(units).unwrap_or(MAX_USAGE).min(MAX_USAGE))
        }
    }
}

fn request_cost(cost: &Cost, view: &dyn RequestView) -> Result<u64, BadRequest> {
    match cost {
        Cost::Fixed(n) => Ok(*n),
        Cost::Header {
            name,
            min,
            max,
            default,
        } => {
            let Some(raw) = decisive_header(view, name)? else {
                return Ok(*default);
            };
            let bad = || BadRequest(format!("{name} must be a whole number from {min} to {max}"));
            let text = std::str::from_utf8(raw).map_err(|_| bad())?.trim();
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let n: u64 = text.parse().map_err(|_| bad())?;
            if (*min..=*max).contains(&n) {
                Ok(n)
            } else {
                Err(bad())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Algorithm, Window};
    use crate::request::memo::MAX_MEMO_IDENTITY;
    use crate::slot::key_slot;
    use crate::testing::request::FakeRequest;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn config() -> Config {
        Config::parse(
            br#"{"rules": [
              {"name": "api", "match": {"path_prefix": "/api/"},
               "limits": [{"name": "second", "limit": 5, "window": "1s"},
                          {"name": "day", "algorithm": "fixed_window", "limit": 1000, "window": "1d"}],
               "cost": {"header": "x-cost", "min": 1, "max": 10}, "timeout": "300ms"},
              {"name": "login", "match": {"path_exact": "/login", "methods": ["POST"]},
               "key": {"from": ["client_ip"]}, "failure_mode": "closed",
               "limits": [{"name": "minute", "algorithm": "sliding_window_log", "limit": 5, "window": "1m"}]},
              {"name": "gold", "match": {"header": {"name": "x-tier", "value": "gold"}}, "shadow": true,
               "failure_mode": "closed", "timeout": "50ms",
               "limits": [{"name": "second", "algorithm": "gcra", "limit": 100, "window": "1s", "burst": 20}]},
              {"name": "keyed-only", "key": {"from": ["header:x-api-key"], "when_missing": "skip"},
               "limits": [{"name": "hour", "limit": 10, "window": "1h"}]}
            ]}"#,
        )
        .unwrap()
    }

    fn rules_of(p: &Plan) -> Vec<(usize, usize)> {
        p.checks.iter().map(|c| (c.rule, c.limit)).collect()
    }

    #[test]
    fn a_concurrency_limit_is_planned_as_a_hold_to_take_without_an_id() {
        let c = Config::parse(
            br#"{"rules": [{"name": "streams", "limits": [
              {"name": "open", "algorithm": "concurrency", "limit": 2, "max_duration": "10m"},
              {"name": "second", "limit": 5, "window": "1s"}]}]}"#,
        )
        .unwrap();
        let p = plan(&c, &FakeRequest::new("GET", "/")).unwrap();
        assert!(p.takes_holds());
        assert_eq!(p.checks[0].mode, Mode::ToHold);
        assert_eq!(p.checks[0].cost, 1);
        assert!(!p.checks[1].mode.takes_hold());
    }

    #[test]
    fn rules_match_on_path_method_and_header() {
        let c = config();
        let p = plan(&c, &FakeRequest::new("GET", "/api/users?x=1")).unwrap();
        assert_eq!(rules_of(&p), vec![(0, 0), (0, 1)]);
        assert_eq!(p.timeout, Duration::from_millis(300));
        assert_eq!(p.failure_mode, FailureMode::Open);

        let p = plan(&c, &FakeRequest::new("POST", "/login")).unwrap();
        assert_eq!(rules_of(&p), vec![(1, 0)]);
        assert_eq!(p.failure_mode, FailureMode::Closed);
        assert!(plan(&c, &FakeRequest::new("GET", "/login"))
            .unwrap()
            .checks
            .is_empty());
        assert!(plan(&c, &FakeRequest::new("POST", "/login/x"))
            .unwrap()
            .checks
            .is_empty());

        let gold = FakeRequest::new("GET", "/api/x")
            .with("x-tier", b"gold")
            .with("x-api-key", b"k");
        let p = plan(&c, &gold).unwrap();
        assert_eq!(rules_of(&p), vec![(0, 0), (0, 1), (2, 0), (3, 0)]);
        assert!(p.checks[2].mode.is_shadow());
        assert_eq!(p.timeout, Duration::from_millis(50));
        assert_eq!(
            p.failure_mode,
            FailureMode::Open,
            "a shadow rule never closes"
        );
        let silver = FakeRequest::new("GET", "/x").with("x-tier", b"silver");
        assert!(plan(&c, &silver).unwrap().checks.is_empty());
    }

    #[test]
    fn closed_wins_over_local_and_local_over_open() {
        let json = |modes: &[&str]| {
            let rules: Vec<String> = modes
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    format!(r#"{{"name": "r{i}", "failure_mode": "{m}", "limits": [{{"name": "l", "limit": 1, "window": "1s"}}]}}"#)
                })
                .collect();
            Config::parse(format!(r#"{{"rules": [{}]}}"#, rules.join(",")).as_bytes()).unwrap()
        };
        for (modes, want) in [
            (&["open", "local"][..], FailureMode::Local),
            (&["local", "closed", "open"][..], FailureMode::Closed),
            (&["open", "open"][..], FailureMode::Open),
            (&["local"][..], FailureMode::Local),
        ] {
            let p = plan(&json(modes), &FakeRequest::new("GET", "/")).unwrap();
            assert_eq!(p.failure_mode, want, "{modes:?}");
        }
    }

    #[test]
    fn limits_of_a_rule_share_a_slot() {
        let c = config();
        let p = plan(
            &c,
            &FakeRequest::new("GET", "/api/a").with("x-api-key", b"k1"),
        )
        .unwrap();
        let slot = |c: &LimitCheck| key_slot(c.key.as_bytes());
        assert_eq!(slot(&p.checks[0]), slot(&p.checks[1]));
        assert_ne!(p.checks[0].key, p.checks[1].key);
        assert!(p.checks[0].key.ends_with("}:api:second"));
        assert_eq!(p.checks[1].algorithm, Algorithm::FixedWindow);
        assert_eq!(p.checks[1].window, Window::ms(86_400_000));
        assert_eq!((p.checks[2].quota, p.checks[2].burst), (10, 10));
    }

    #[test]
    fn cost_comes_from_the_header_within_bounds() {
        let c = config();
        let cost = |value: Option<&[u8]>| {
            let mut r = FakeRequest::new("GET", "/api/a");
            if let Some(v) = value {
                r = r.with("x-cost", v);
            }
            plan(&c, &r).map(|p| p.checks[0].cost)
        };
        assert_eq!(cost(None), Ok(1));
        assert_eq!(cost(Some(b"7")), Ok(7));
        assert_eq!(cost(Some(b" 10 ")), Ok(10));
        let bad = Err(BadRequest(
            "x-cost must be a whole number from 1 to 10".into(),
        ));
        for value in [
            &b"0"[..],
            b"11",
            b"-1",
            b"1.5",
            b"abc",
            b"",
            b"99999999999999999999999",
            b"\xff",
        ] {
            assert_eq!(cost(Some(value)), bad, "{value:?}");
        }
    }

    #[test]
    fn a_decisive_header_sent_twice_is_a_bad_request() {
        let c = config();
        let bad = |name: &str| Err(BadRequest(format!("{name} must be sent once")));
        // The key header of a matching rule: the first copy would be limited, a backend
        // reading the last would serve the other.
        let key_twice = FakeRequest::new("GET", "/api/a")
            .with("x-api-key", b"fresh-4")
            .also("x-api-key", b"real-key");
        assert_eq!(plan(&c, &key_twice), bad("x-api-key"));
        // The cost header.
        let cost_twice = FakeRequest::new("GET", "/api/a")
            .with("x-cost", b"1")
            .also("x-cost", b"10");
        assert_eq!(plan(&c, &cost_twice), bad("x-cost"));
        // A match.header.
        let tier_twice = FakeRequest::new("GET", "/x")
            .with("x-tier", b"gold")
            .also("x-tier", b"free");
        assert_eq!(plan(&c, &tier_twice), bad("x-tier"));
    }

    /// Plans from a verified claim, keys from a verified subject, then the client's IP.
    fn plans_config() -> Config {
        Config::parse(
            br#"{"rules": [{"name": "api",
              "key": {"from": ["metadata:envoy.filters.http.jwt_authn:jwt_payload:sub", "client_ip"]},
              "plan_from": "metadata:envoy.filters.http.jwt_authn:jwt_payload:plan",
              "plans": [
                {"name": "pro", "values": ["pro", "enterprise"], "limits": [
                  {"name": "per_minute", "limit": 20, "window": "1m", "overrides": true},
                  {"name": "per_day", "algorithm": "fixed_window", "limit": 1000, "window": "1d"}]},
                {"name": "free", "values": ["free"], "limits": [{"name": "per_minute", "limit": 5, "window": "1m"}]},
                {"name": "other", "default": true, "limits": [{"name": "per_minute", "limit": 2, "window": "1m"}]}]}]}"#,
        )
        .unwrap()
    }

    const JWT: &str = "envoy.filters.http.jwt_authn:jwt_payload";

    fn claims(sub: Option<&[u8]>, plan: Option<&[u8]>) -> FakeRequest {
        let mut r = FakeRequest::new("GET", "/api/x");
        if let Some(sub) = sub {
            r = r.with_metadata(&format!("{JWT}:sub"), sub);
        }
        if let Some(plan) = plan {
            r = r.with_metadata(&format!("{JWT}:plan"), plan);
        }
        r
    }

    #[test]
    fn every_request_lands_in_exactly_one_plan() {
        let c = plans_config();
        assert_eq!(c.rules.len(), 3, "one rule per plan");
        let landed = |r: &FakeRequest| {
            let p = plan(&c, r).unwrap();
            let plans: Vec<&str> = p
                .checks
                .iter()
                .map(|k| c.rules[k.rule].plan.as_deref().unwrap_or("-"))
                .collect();
            let per_window: Vec<u64> = p.checks.iter().map(|k| k.per_window).collect();
            (plans, per_window)
        };
        let pro = (vec!["pro", "pro"], vec![20, 1000]);
        assert_eq!(landed(&claims(Some(b"alice"), Some(b"pro"))), pro);
        assert_eq!(landed(&claims(Some(b"alice"), Some(b"enterprise"))), pro);
        assert_eq!(
            landed(&claims(Some(b"bob"), Some(b"free"))),
            (vec!["free"], vec![5])
        );
        let other = (vec!["other"], vec![2]);
        for (sub, plan) in [
            (Some(&b"carol"[..]), Some(&b"FREE"[..])),
            (Some(b"carol"), Some(b"gold")),
            (Some(b"carol"), Some(b"")),
            (Some(b"carol"), None),
            (None, None),
            // A structure is no plan: a list of plans lands in the default.
            (Some(b"carol"), Some(b"\x01\0\0\0\x03\0\0\0\0\0\0\0pro\0\0")),
        ] {
            assert_eq!(landed(&claims(sub, plan)), other, "{sub:?} {plan:?}");
        }
    }

    #[test]
    fn numbers_and_bools_name_a_plan_as_a_claim_or_as_text() {
        let c = Config::parse(
            br#"{"rules": [{"name": "api", "plan_from": "metadata:ns:tier",
              "plans": [
                {"name": "two", "values": [2], "limits": [{"name": "l", "limit": 20, "window": "1m"}]},
                {"name": "yes", "values": [true], "limits": [{"name": "l", "limit": 10, "window": "1m"}]},
                {"name": "other", "default": true, "limits": [{"name": "l", "limit": 1, "window": "1m"}]}]}]}"#,
        )
        .unwrap();
        let limit = |tier: &[u8]| {
            let r = FakeRequest::new("GET", "/").with_metadata("ns:tier", tier);
            plan_of(&c, &r).checks[0].per_window
        };
        // As Envoy hands over a JWT's number (a double) and bool, and as text.
        assert_eq!(limit(&2.0f64.to_le_bytes()), 20);
        assert_eq!(limit(b"2"), 20);
        assert_eq!(limit(&[1]), 10);
        assert_eq!(limit(b"true"), 10);
        assert_eq!(limit(&2.5f64.to_le_bytes()), 1);
        assert_eq!(limit(&[0]), 1);
    }

    #[test]
    fn a_limit_keeps_its_key_across_plans_and_its_override() {
        let c = plans_config();
        let key = |plan: &[u8]| {
            let p = plan_of(&c, &claims(Some(b"alice"), Some(plan)));
            (p.checks[0].key.to_string(), p.checks[0].overrides)
        };
        let (pro, pro_overrides) = key(b"pro");
        assert_eq!(pro, key(b"free").0, "free -> pro keeps what was spent");
        assert_eq!(pro, key(b"none").0);
        assert!(pro_overrides);
        assert!(pro.contains(":api:per_minute"), "{pro}");
        assert!(
            pro.starts_with("rl:{metadata:envoy.filters.http.jwt_authn:jwt_payload:sub:"),
            "{pro}"
        );
    }

    fn plan_of(c: &Config, r: &FakeRequest) -> Plan {
        plan(c, r).unwrap()
    }

    #[test]
    fn keys_from_metadata_fall_back_and_a_client_cannot_reach_them() {
        let c = plans_config();
        let key = |r: &FakeRequest| plan_of(&c, r).checks[0].key.to_string();
        let alice = key(&claims(Some(b"alice"), None));
        // No verified subject: the client's IP, whatever headers or parameters it sends.
        let anonymous = FakeRequest::new("GET", "/api/x?sub=alice&jwt_payload=alice")
            .with("sub", b"alice")
            .with("x-jwt-payload-sub", b"alice");
        let by_ip = key(&anonymous);
        assert!(by_ip.starts_with("rl:{client_ip:"), "{by_ip}");
        assert_ne!(by_ip, alice);
        assert_eq!(
            key(&claims(Some(b"\0\0\0\0"), None)),
            by_ip,
            "an empty list is absent"
        );
    }

    #[test]
    fn match_conditions_read_any_source() {
        let c = Config::parse(
            br#"{"rules": [
              {"name": "webhooks", "match": {"path_prefix": "/hooks/", "sources": [{"source": "query:token", "present": true}]},
               "key": {"from": ["query:token"]}, "limits": [{"name": "l", "limit": 5, "window": "1s"}]},
              {"name": "verified", "match": {"sources": [
                 {"source": "metadata:envoy.filters.http.ext_authz:x-caller-verdict", "in": ["ok", "trusted"]},
                 {"source": "header:x-debug", "present": false}]},
               "key": {"from": ["metadata:envoy.filters.http.ext_authz:x-caller-id"]},
               "limits": [{"name": "l", "limit": 5, "window": "1s"}]},
              {"name": "others", "match": {"sources": [
                 {"source": "metadata:envoy.filters.http.ext_authz:x-caller-verdict", "not_in": ["ok", "trusted"]}]},
               "key": {"from": ["client_ip"]}, "limits": [{"name": "l", "limit": 1, "window": "1s"}]}]}"#,
        )
        .unwrap();
        let rules = |r: &FakeRequest| -> Result<Vec<usize>, BadRequest> {
            Ok(plan(&c, r)?.checks.iter().map(|k| k.rule).collect())
        };
        let authz = "envoy.filters.http.ext_authz";
        let hook = FakeRequest::new("POST", "/hooks/a?token=t%201");
        assert_eq!(rules(&hook), Ok(vec![0, 2]));
        assert!(plan_of(&c, &hook).checks[0]
            .key
            .starts_with("rl:{query:token:"));
        assert_eq!(
            rules(&FakeRequest::new("POST", "/hooks/a?token=")),
            Ok(vec![2])
        );
        assert_eq!(
            rules(&FakeRequest::new("POST", "/hooks/a?token=1&token=2")),
            Err(BadRequest("query parameter token must be sent once".into()))
        );
        let caller = FakeRequest::new("GET", "/x")
            .with_metadata(&format!("{authz}:x-caller-verdict"), b"trusted")
            .with_metadata(&format!("{authz}:x-caller-id"), b"c-1");
        assert_eq!(rules(&caller), Ok(vec![1]));
        assert_eq!(rules(&caller.clone().with("x-debug", b"1")), Ok(vec![]));
        assert_eq!(rules(&caller.clone().with("x-debug", b"")), Ok(vec![1]));
        let refused = caller.with_metadata(&format!("{authz}:x-caller-verdict"), b"Trusted");
        assert_eq!(rules(&refused), Ok(vec![2]));
    }

    #[test]
    fn a_repeated_header_no_rule_reads_passes() {
        let c = Config::parse(
            br#"{"rules": [{"name": "api", "match": {"path_prefix": "/api/", "header": {"name": "x-tier"}},
                "cost": {"header": "x-cost", "min": 1, "max": 10},
                "limits": [{"name": "l", "limit": 5, "window": "1s"}]}]}"#,
        )
        .unwrap();
        let twice = |path: &str, name: &str| {
            plan(
                &c,
                &FakeRequest::new("GET", path)
                    .with("x-tier", b"t")
                    .with(name, b"a")
                    .also(name, b"b"),
            )
        };
        // Off the rule's path nothing is read, not even its match.header.
        for name in ["x-api-key", "x-cost", "x-tier"] {
            assert_eq!(
                twice("/other", name).map(|p| p.checks.len()),
                Ok(0),
                "{name}"
            );
        }
        // On it, headers that decide nothing may repeat.
        assert_eq!(twice("/api/a", "accept").map(|p| p.checks.len()), Ok(1));
        assert!(twice("/api/a", "x-tier").is_err());
        assert!(twice("/api/a", "x-cost").is_err());
    }

    #[test]
    fn a_sharded_limit_is_spent_from_each_shard_in_turn() {
        let c = Config::parse(
            br#"{"rules": [{"name": "hot", "limits": [
                {"name": "s", "limit": 100, "burst": 50, "window": "1s", "shards": 3},
                {"name": "day", "limit": 1000, "window": "1d"}]}]}"#,
        )
        .unwrap();
        let r = FakeRequest::new("GET", "/").with("x-api-key", b"k");
        let keys: Vec<String> = (0..4)
            .map(|turn| plan_turn(&c, &r, turn).unwrap().checks[0].key.to_string())
            .collect();
        let base = plan(&c, &r).unwrap().checks[1].key.replace(":day", ":s");
        for (turn, key) in keys.iter().enumerate() {
            assert_eq!(key, &shard_key(&base, turn as u64 % 3));
        }
        assert!(keys[1].contains("#1}:hot:s"), "{}", keys[1]);
        let slots: std::collections::HashSet<u16> = keys[..3]
            .iter()
            .map(|k| crate::slot::key_slot(k.as_bytes()))
            .collect();
        assert_eq!(slots.len(), 3, "three slots");
        let p = plan_turn(&c, &r, 1).unwrap();
        assert_eq!(
            (p.checks[0].per_window, p.checks[0].burst, p.checks[0].quota),
            (33, 16, 16)
        );
        assert_eq!(p.checks[1].per_window, 1000, "not sharded");
    }

    /// Many identities through a small memo (so entries are evicted and made again), each
    /// seen several times over sharded turns: every plan equals the plan made without memo.
    #[test]
    fn the_memo_changes_no_plan() {
        let rules = r#"[
          {"name": "api", "match": {"path_prefix": "/api/"},
           "key": {"from": ["header:x-api-key", "client_ip"]},
           "key_budget": {"new_keys": 100, "window": "1m"},
           "limits": [{"name": "s", "limit": 100, "burst": 50, "window": "1s", "shards": 3},
                      {"name": "day", "algorithm": "fixed_window", "limit": 1000, "window": "1d"}]},
          {"name": "user", "key": {"from": ["header:x-user+method+path"], "when_missing": "anonymous"},
           "limits": [{"name": "m", "limit": 5, "window": "1m"}]},
          {"name": "keyed", "key": {"from": ["header:x-api-key"], "when_missing": "skip"},
           "limits": [{"name": "h", "limit": 10, "window": "1h", "shards": 2}]}
        ]"#;
        let long_key = "k".repeat(MAX_MEMO_IDENTITY + 1);
        for top in [
            "",
            r#""hash_identities": false,"#,
            r#""key_prefix": "x:", "bridge": {"redis_cluster": true},"#,
        ] {
            let c = Config::parse(format!(r#"{{{top} "rules": {rules}}}"#).as_bytes()).unwrap();
            let requests: Vec<FakeRequest> = (0..300)
                .map(|i| {
                    let r = FakeRequest::new("GET", &format!("/api/{}", i % 7));
                    let r = match i % 5 {
                        0 => r,
                        1 => r.with("x-user", format!("u{i}").as_bytes()),
                        2 => r.with("x-api-key", long_key.as_bytes()),
                        _ => r.with("x-api-key", format!("key {}", i % 40).as_bytes()),
                    };
                    FakeRequest {
                        source: Some(format!("10.0.{}.{}:1234", i % 3, i % 11)),
                        ..r
                    }
                })
                .collect();
            let mut memo = PlanMemo::with_capacity(16);
            let mut turn = 0;
            for round in 0..4 {
                for r in &requests {
                    turn += 1;
                    let want = plan_turn(&c, r, turn).unwrap();
                    assert!(!want.checks.is_empty());
                    assert_eq!(
                        plan_memo(&c, r, turn, &mut memo).unwrap(),
                        want,
                        "{top} {round}"
                    );
                    assert!(memo.len() <= 16);
                }
            }
            assert_eq!(memo.len(), 16, "every set full");
        }
    }

    #[test]
    fn a_returning_identity_shares_its_memoized_keys() {
        let c = config();
        let mut memo = PlanMemo::default();
        let r = FakeRequest::new("GET", "/api/a").with("x-api-key", b"k1");
        let first = plan_memo(&c, &r, 0, &mut memo).unwrap();
        let again = plan_memo(&c, &r, 1, &mut memo).unwrap();
        assert_eq!(first, again);
        assert!(Rc::ptr_eq(&first.checks[0].key, &again.checks[0].key));
        // Rules 0 (for the header) and 3 (the same header, its own rule): two entries.
        assert_eq!(memo.len(), 2);
        // Without memo every plan makes its keys anew.
        let mut none = PlanMemo::with_capacity(0);
        let a = plan_memo(&c, &r, 0, &mut none).unwrap();
        let b = plan_memo(&c, &r, 0, &mut none).unwrap();
        assert!(!Rc::ptr_eq(&a.checks[0].key, &b.checks[0].key));
        assert!(none.is_empty());
    }

    #[test]
    fn shard_keys_never_meet_other_identities() {
        assert_eq!(shard_key("rl:{h:ab}:r:l", 2), "rl:{h:ab#2}:r:l");
        // The shard is the part after the last '#': identities holding '#' cannot reach it.
        assert_ne!(shard_key("rl:{h=a#1}:r:l", 2), shard_key("rl:{h=a}:r:l", 1));
        assert_ne!(
            shard_key("rl:{h=a#1}:r:l", 2),
            shard_key("rl:{h=a#1#2}:r:l", 0)
        );
    }

    /// A request's body, as the adapter counted it: `bytes` plus a `max_tokens`, if any.
    struct WithBody(FakeRequest, u64, Option<u64>);

    impl RequestView for WithBody {
        fn header(&self, name: &str) -> Option<&[u8]> {
            self.0.header(name)
        }
        fn header_copies(&self, name: &str) -> usize {
            self.0.header_copies(name)
        }
        fn source_address(&self) -> Option<String> {
            self.0.source_address()
        }
        fn route_name(&self) -> Option<String> {
            self.0.route_name()
        }
        fn usage_estimate(
            &self,
            completion_default: u64,
            _keys: crate::usage::OutputKeys,
        ) -> Option<(u64, u64)> {
            Some((self.1, self.2.unwrap_or(completion_default)))
        }
    }

    #[test]
    fn a_usage_limit_costs_its_estimate_and_only_its_rules_hold_the_body() {
        let c = Config::parse(
            br#"{"rules": [
              {"name": "llm", "match": {"path_prefix": "/v1/"}, "limits": [
                {"name": "requests", "limit": 60, "window": "1m"},
                {"name": "tokens", "limit": 100000, "window": "1m",
                 "usage": {"from": "body:usage.total_tokens",
                           "estimate": {"request": {"completion_default": 1024, "max_body": "2KiB"}}}},
                {"name": "by_header", "limit": 1000, "window": "1m",
                 "usage": {"from": "header:x-used", "admit": "after",
                           "estimate": {"header": "x-est", "min": 1, "max": 50, "default": 5}}}]},
              {"name": "other", "match": {"path_prefix": "/api/"},
               "limits": [{"name": "l", "limit": 5, "window": "1s"}]}]}"#,
        )
        .unwrap();
        let costs = |view: &dyn RequestView| {
            let p = plan(&c, view).unwrap();
            p.checks
                .iter()
                .map(|k| (k.cost, k.mode == Mode::After))
                .collect::<Vec<_>>()
        };
        let chat = FakeRequest::new("POST", "/v1/chat").with("x-est", b"7");
        assert_eq!(costs(&chat), [(1, false), (1024, false), (7, true)]);
        let counted = WithBody(chat.clone(), 300, Some(50));
        assert_eq!(costs(&counted), [(1, false), (350, false), (7, true)]);
        let defaulted = WithBody(chat, 300, None);
        assert_eq!(costs(&defaulted)[1], (1324, false));
        assert_eq!(
            request_body_bound(&c, &FakeRequest::new("POST", "/v1/x")),
            Some(2048)
        );
        assert_eq!(
            request_body_bound(&c, &FakeRequest::new("POST", "/api/x")),
            None
        );
    }

    #[test]
    fn a_weighted_estimate_takes_the_input_at_its_dearest_weight_and_the_output_at_its_own() {
        let c = Config::parse(
            br#"{"rules": [{"name": "llm", "limits": [
                {"name": "tokens", "limit": 100000, "window": "1m",
                 "usage": {"from": "openai", "estimate": {"request": {"completion_default": 100}},
                           "weights": {"input": 0.5, "output": 3, "cached_input": 0.25}}}]}]}"#,
        )
        .unwrap();
        let chat = FakeRequest::new("POST", "/v1/chat");
        let cost = |view: &dyn RequestView| plan(&c, view).unwrap().checks[0].cost;
        // 301 bytes × 0.5, rounded up, + 50 × 3.
        assert_eq!(cost(&WithBody(chat.clone(), 301, Some(50))), 151 + 150);
        // No body read: the completion default alone, at the output weight.
        assert_eq!(cost(&chat), 300);
    }

    #[test]
    fn per_model_plans_read_the_body_and_hold_it_until_it_ends() {
        let c = Config::parse(
            br#"{"rules": [
              {"name": "llm", "match": {"path_prefix": "/v1/", "methods": ["POST"]},
               "key": {"from": ["header:authorization+body:model", "client_ip+body:model"]},
               "plan_from": "body:model",
               "plans": [
                 {"name": "big", "values": ["gpt-4o"], "limits": [{"name": "tokens", "limit": 30000, "window": "1m"}]},
                 {"name": "small", "default": true, "limits": [{"name": "tokens", "limit": 200000, "window": "1m"}]}]},
              {"name": "only-mini", "match": {"sources": [{"source": "body:model", "in": ["gpt-4o-mini"]}]},
               "limits": [{"name": "rpm", "limit": 10, "window": "1m"}]},
              {"name": "headers", "limits": [{"name": "rps", "limit": 5, "window": "1s"}]}]}"#,
        )
        .unwrap();
        let model = crate::config::BodyPath {
            keys: vec!["model".into()],
        };
        assert_eq!(c.body_fields, [model]);
        let post =
            FakeRequest::new("POST", "/v1/chat/completions").with("authorization", b"Bearer k");
        // At the headers: held, even by the rule whose only condition is on the body.
        assert_eq!(request_body_bound(&c, &post), Some(DEFAULT_MAX_BODY));
        let only_headers = FakeRequest::new("GET", "/health");
        assert_eq!(
            request_body_bound(&c, &only_headers),
            Some(DEFAULT_MAX_BODY),
            "only-mini may match any path"
        );
        let limits = |view: &FakeRequest| {
            plan(&c, view)
                .unwrap()
                .checks
                .iter()
                .map(|k| {
                    (
                        c.rules[k.rule].name.clone(),
                        k.per_window,
                        k.key.to_string(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let big = limits(
            &post
                .clone()
                .with_body(&c.body_fields, br#"{"model": "gpt-4o", "messages": []}"#),
        );
        let mini = limits(&post.clone().with_body(
            &c.body_fields,
            br#"{"messages": [], "model": "gpt-4o-mini"}"#,
        ));
        assert_eq!(
            (big[0].1, mini[0].1),
            (30000, 200000),
            "each model its plan"
        );
        assert_ne!(big[0].2, mini[0].2, "and its own key");
        assert_eq!(big.len(), 2, "llm and headers: {big:?}");
        assert_eq!(mini[1].0, "only-mini");
        // No model: the key's alternatives all need it, so the shared anonymous key.
        let none = limits(
            &post
                .clone()
                .with_body(&c.body_fields, br#"{"messages": []}"#),
        );
        assert_eq!(none[0].1, 200000, "the default plan");
        assert!(none[0].2.contains("anonymous"), "{none:?}");
        let twice = post.with_body(
            &c.body_fields,
            br#"{"model": "gpt-4o-mini", "model": "gpt-4o"}"#,
        );
        assert!(plan(&c, &twice)
            .unwrap_err()
            .0
            .contains("model must be sent once"));
    }

    #[test]
    fn include_usage_marked_in_metadata_edits_only_the_streams_marked() {
        let c = |add: &str| {
            Config::parse(
                format!(
                    r#"{{"rules": [{{"name": "llm", "limits": [{{"name": "t", "limit": 1000, "window": "1m",
                     "usage": {{"from": "openai", "estimate": {{"request": {{}}}}, "include_usage": {add}}}}}]}}]}}"#
                )
                .as_bytes(),
            )
            .unwrap()
        };
        let marked = c(r#"{"streamed": "metadata:llm:stream", "asked": "metadata:llm:asked"}"#);
        let always = c("true");
        let chat = FakeRequest::new("POST", "/v1/chat/completions");
        let edits = |c: &Config, r: &FakeRequest| request_body_plan(c, r).unwrap().include_usage;
        let stream = chat.clone().with_metadata("llm:stream", &[1]);
        assert!(edits(&marked, &stream), "a stream marked true (a bool)");
        assert!(edits(
            &marked,
            &chat.clone().with_metadata("llm:stream", b"true")
        ));
        assert!(
            !edits(&marked, &chat),
            "unmarked: a plain request keeps its length"
        );
        assert!(!edits(
            &marked,
            &chat.clone().with_metadata("llm:stream", &[0])
        ));
        assert!(
            !edits(&marked, &stream.clone().with_metadata("llm:asked", &[1])),
            "asked already"
        );
        assert!(edits(
            &marked,
            &stream.clone().with_metadata("llm:asked", &[0])
        ));
        assert!(
            edits(&always, &chat),
            "true: every POST to a completions path"
        );
        let responses = FakeRequest::new("POST", "/v1/responses").with_metadata("llm:stream", &[1]);
        assert!(
            !edits(&marked, &responses),
            "the Responses API takes no include_usage"
        );
    }
}
