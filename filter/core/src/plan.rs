//! Which rules apply to a request, and the limit checks it asks Redis for.

use std::time::Duration;

use crate::config::{
    cluster_budget, Algorithm, Config, Cost, FailureMode, KeyBudget, Lease, Limit, Match,
    OverBudget, PathMatch, Rule,
};
use crate::identity::{
    budget_counter_key, decisive_header, label, overflow_key, path_only, redis_key, resolve_into,
    RequestView,
};
use crate::slot::key_slot;

/// One limit to decide for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitCheck {
    /// Index of the rule in the config, and of the limit in the rule.
    pub rule: usize,
    pub limit: usize,
    pub key: String,
    pub algorithm: Algorithm,
    /// Units per window (the script's `limit`).
    pub per_window: u64,
    /// What headers call the limit: the burst for buckets, `per_window` for windows.
    pub quota: u64,
    pub window_ms: u64,
    pub burst: u64,
    pub cost: u64,
    pub shadow: bool,
    /// The rule's key budget, if it has one.
    pub budget: Option<BudgetCheck>,
    /// How this limit's units may be leased (None: decided per request).
    pub lease: Option<Lease>,
}

/// What the script needs to apply a rule's key budget to one of its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetCheck {
    /// Counts the rule's new identities (one key per rule).
    pub counter_key: String,
    /// This limit's state for every new identity over the budget (mode `shared`).
    pub overflow_key: String,
    pub new_keys: u64,
    pub window_ms: u64,
    pub over_budget: OverBudget,
}

impl LimitCheck {
    /// The hash tag of the key (`{...}`): checks with equal tags live on one Redis Cluster
    /// slot, so a later sharded bridge can group a request's checks by it.
    pub fn hash_tag(&self) -> &str {
        match (self.key.find('{'), self.key.find('}')) {
            (Some(open), Some(close)) if close > open => &self.key[open + 1..close],
            _ => &self.key,
        }
    }
}

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
        !self.checks.is_empty() && self.checks.iter().all(|c| c.lease.is_some())
    }
}

/// A request the limiter refuses before deciding anything (answered with 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub String);

/// The plan for a request: every matching rule's limits, keyed and costed.
pub fn plan(config: &Config, view: &dyn RequestView) -> Result<Plan, BadRequest> {
    plan_turn(config, view, 0)
}

/// [`plan`], spending sharded limits from shard `turn % shards` (the worker counts turns).
pub fn plan_turn(config: &Config, view: &dyn RequestView, turn: u64) -> Result<Plan, BadRequest> {
    let method = view.header(":method").unwrap_or_default();
    let path = path_only(view.header(":path").unwrap_or_default());
    let mut identity = Vec::new();
    let mut plan = Plan {
        checks: Vec::new(),
        timeout: Duration::MAX,
        failure_mode: FailureMode::Open,
    };
    for (r, rule) in config.rules.iter().enumerate() {
        if !matches(&rule.matcher, view, method, path)? {
            continue;
        }
        let Some(alternative) = resolve_into(view, &rule.key, &config.client_ip, &mut identity)?
        else {
            continue;
        };
        let label = label(&rule.key, alternative);
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
        for (l, limit) in rule.limits.iter().enumerate() {
            let mut key = redis_key(config, rule, limit, label, &identity);
            if limit.shards > 1 {
                key = shard_key(&key, turn % limit.shards);
            }
            let budget = rule
                .key_budget
                .as_ref()
                .map(|b| budget_check(config, rule, limit, b, &key));
            plan.checks.push(LimitCheck {
                rule: r,
                limit: l,
                key,
                algorithm: limit.algorithm,
                per_window: limit.shard_limit(),
                quota: limit.quota(),
                window_ms: u64::try_from(limit.window.as_millis()).unwrap_or(u64::MAX),
                burst: limit.shard_burst(),
                cost,
                shadow: rule.shadow,
                budget,
                lease: limit.lease,
            });
        }
    }
    Ok(plan)
}

/// The budget of `rule` for a limit whose state is at `key`. With a Redis Cluster the counter
/// and the overflow state are those of `key`'s slot (a script sees one slot), each slot
/// counting its share of the budget ([`cluster_budget`]).
fn budget_check(
    config: &Config,
    rule: &Rule,
    limit: &Limit,
    budget: &KeyBudget,
    key: &str,
) -> BudgetCheck {
    let slot_tag = config
        .budget_slot_tags
        .0
        .get(usize::from(key_slot(key.as_bytes())))
        .copied()
        .filter(|_| config.redis_cluster);
    let (new_keys, window) = match slot_tag {
        Some(_) => cluster_budget(budget),
        None => (budget.new_keys, budget.window),
    };
    BudgetCheck {
        counter_key: budget_counter_key(config, rule, slot_tag),
        overflow_key: overflow_key(config, rule, limit, slot_tag),
        new_keys,
        window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
        over_budget: budget.over_budget,
    }
}

/// The key of shard `shard`: `#shard` at the end of the hash tag, so each shard hashes to a
/// slot of its own (most often another node). The shard's number is the tag's last part after
/// `#`, so no two (identity, shard) pairs share a key, whatever the identity holds.
pub fn shard_key(key: &str, shard: u64) -> String {
    match key.find('}') {
        Some(close) => format!("{}#{shard}{}", &key[..close], &key[close..]),
        None => format!("{key}#{shard}"),
    }
}

/// Whether a rule's matcher fits the request. The header is read last, only when path and
/// method fit, so that a repeated header counts only on requests the rule could apply to.
fn matches(
    m: &Match,
    view: &dyn RequestView,
    method: &[u8],
    path: &[u8],
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
    Ok(match &m.header {
        None => true,
        Some(h) => match (decisive_header(view, &h.name)?, &h.value) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(got), Some(want)) => got == want.as_bytes(),
        },
    })
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
    use crate::identity::tests::FakeRequest;
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
        assert!(p.checks[2].shadow);
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
    fn limits_of_a_rule_share_a_hash_tag() {
        let c = config();
        let p = plan(
            &c,
            &FakeRequest::new("GET", "/api/a").with("x-api-key", b"k1"),
        )
        .unwrap();
        assert_eq!(p.checks[0].hash_tag(), p.checks[1].hash_tag());
        assert_ne!(p.checks[0].key, p.checks[1].key);
        assert!(p.checks[0].key.ends_with("}:api:second"));
        assert_eq!(p.checks[1].algorithm, Algorithm::FixedWindow);
        assert_eq!(p.checks[1].window_ms, 86_400_000);
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
            .map(|turn| plan_turn(&c, &r, turn).unwrap().checks[0].key.clone())
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
}
