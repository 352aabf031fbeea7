//! The configuration's fixtures: every default, every field's error message.

use super::*;

use crate::grpc::GrpcOverLimit;
use crate::usage::{BodyUsage, OutputKeys, Weights};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const MINIMAL: &str = r#"{"rules": [{"name": "all", "limits": [{"name": "per_minute", "limit": 10, "window": "1m"}]}]}"#;

#[test]
fn minimal_config_takes_documented_defaults() {
    let c = Config::parse(MINIMAL.as_bytes()).unwrap();
    assert_eq!(c.bridge.cluster, "webdis");
    assert_eq!(c.bridge.authority, "webdis");
    assert_eq!(c.bridge.authorization, None);
    assert_eq!(c.clock, Clock::Proxy);
    assert_eq!(c.key_prefix, "rl:");
    assert!(c.hash_identities);
    assert_eq!(
        c.client_ip,
        ClientIpPolicy {
            xff_trusted_hops: 0,
            ipv4_prefix: 32,
            ipv6_prefix: 64
        }
    );
    assert_eq!(c.headers, RateLimitHeaders::XRateLimit);
    assert_eq!(c.deny_body, DenyBody::Text);
    assert_eq!(c.grpc_over_limit, GrpcOverLimit::ResourceExhausted);
    assert_eq!(
        c.batch,
        Batch {
            max_requests: 64,
            max_in_flight: 1
        }
    );
    assert_eq!(c.deny_cache_entries, 10_000);
    assert_eq!(c.clock_skew, Duration::from_secs(1));
    assert_eq!(c.lag_allowance, Duration::from_secs(1));
    assert_eq!(
        c.breaker,
        Some(Breaker {
            failures: 5,
            stall: None,
            probe_interval: Duration::from_millis(500)
        })
    );
    let rule = &c.rules[0];
    assert_eq!(rule.matcher, Match::default());
    assert_eq!(
        rule.key.alternatives,
        vec![
            KeyAlternative {
                label: "header:x-api-key".into(),
                sources: vec![KeySource::Header("x-api-key".into())]
            },
            KeyAlternative {
                label: "client_ip".into(),
                sources: vec![KeySource::ClientIp]
            },
        ]
    );
    assert_eq!(rule.key.when_missing, WhenMissing::Anonymous);
    assert_eq!(rule.cost, Cost::Fixed(1));
    assert_eq!(rule.failure_mode, FailureMode::Open);
    assert_eq!(rule.timeout, Duration::from_millis(150));
    assert!(!rule.shadow);
    assert_eq!(
        rule.limits,
        vec![Limit {
            name: "per_minute".into(),
            algorithm: Algorithm::TokenBucket,
            limit: 10,
            window: Window::Fixed(Duration::from_secs(60)),
            burst: 10,
            shards: 1,
            lease: None,
            usage: None,
            overrides: false,
        }]
    );
    assert_eq!(c.program.handle.len(), 33);
}

#[test]
fn full_config_is_read() {
    let c = Config::parse(
        br#"{
          "bridge": {"cluster": "bridge", "authority": "webdis.local", "username": "ratelimit",
                     "password": "secret", "timeout": "2s", "lag_allowance": "0ms"},
          "breaker": {"failures": 2, "stall": "40ms", "probe_interval": "1s"},
          "failure_mode": "closed", "shadow": true, "clock": "redis", "key_prefix": "limits:",
          "hash_identities": false, "xff_trusted_hops": 1, "ipv4_prefix": 24, "ipv6_prefix": 48,
          "headers": "both", "deny_body": "problem+json", "grpc_over_limit": "unavailable",
          "rules": [{
            "name": "login",
            "match": {"path_exact": "/login", "methods": ["post"], "header": {"name": "X-Tier", "value": "free"}},
            "key": {"from": ["header:X-User+route", "client_ip"], "when_missing": "skip"},
            "limits": [{"name": "burst", "algorithm": "gcra", "limit": 5, "window": "1s", "burst": 10},
                       {"name": "daily", "algorithm": "sliding_window_log", "limit": 100, "window": "1d"}],
            "cost": {"header": "X-Cost", "min": 1, "max": 50, "default": 2},
            "failure_mode": "open", "timeout": "80ms", "shadow": false
          }]
        }"#,
    )
    .unwrap();
    assert_eq!(c.bridge.authority, "webdis.local");
    assert_eq!(c.lag_allowance, Duration::ZERO);
    assert_eq!(
        c.breaker,
        Some(Breaker {
            failures: 2,
            stall: Some(Duration::from_millis(40)),
            probe_interval: Duration::from_secs(1)
        })
    );
    assert_eq!(
        c.bridge.authorization.as_deref(),
        Some("Basic cmF0ZWxpbWl0OnNlY3JldA==")
    );
    assert_eq!(c.clock, Clock::Redis);
    assert_eq!(c.client_ip.xff_trusted_hops, 1);
    assert_eq!(c.headers, RateLimitHeaders::Both);
    assert_eq!(c.deny_body, DenyBody::ProblemJson);
    assert_eq!(c.grpc_over_limit, GrpcOverLimit::Unavailable);
    let r = &c.rules[0];
    assert_eq!(r.matcher.path, Some(PathMatch::Exact("/login".into())));
    assert_eq!(r.matcher.methods, vec!["POST".to_string()]);
    assert_eq!(
        r.matcher.conditions,
        vec![Condition {
            source: KeySource::Header("x-tier".into()),
            test: Test::In(vec![b"free".to_vec()])
        }]
    );
    assert_eq!(
        r.key.alternatives[0].sources,
        vec![KeySource::Header("x-user".into()), KeySource::Route]
    );
    assert_eq!(r.key.when_missing, WhenMissing::Skip);
    assert_eq!(r.limits[0].burst, 10);
    assert_eq!(r.limits[0].quota(), 10);
    assert_eq!(r.limits[1].quota(), 100);
    assert_eq!(
        r.cost,
        Cost::Header {
            name: "x-cost".into(),
            min: 1,
            max: 50,
            default: 2
        }
    );
    assert_eq!(r.failure_mode, FailureMode::Open);
    assert_eq!(r.timeout, Duration::from_millis(80));
    assert!(r.shadow, "global shadow applies to every rule");
}

#[test]
fn durations() {
    let cases = [
        ("150ms", Some(Duration::from_millis(150))),
        ("30s", Some(Duration::from_secs(30))),
        ("5m", Some(Duration::from_secs(300))),
        ("1h", Some(Duration::from_secs(3600))),
        ("1d", Some(Duration::from_secs(86400))),
        ("0s", Some(Duration::ZERO)),
        ("150", None),
        ("ms", None),
        ("1.5s", None),
        ("-1s", None),
        ("1 s", None),
        ("1w", None),
        ("99999999999999999999d", None),
    ];
    for (text, want) in cases {
        assert_eq!(parse_duration(text), want, "{text}");
    }
}

/// Wraps one rule's JSON in a config.
fn with_rule(rule: &str) -> String {
    format!(r#"{{"rules": [{rule}]}}"#)
}

const LIMIT: &str = r#"{"name": "l", "limit": 1, "window": "1s"}"#;

#[test]
fn a_top_level_lease_covers_the_limits_that_can_take_one_and_a_limit_can_set_its_own() {
    let c = Config::parse(
        br#"{"lease": {"max_units": 50, "fraction": 0.2, "max_ms": 500}, "rules": [
          {"name": "a", "limits": [
            {"name": "tb", "limit": 10, "window": "1s"},
            {"name": "gcra", "algorithm": "gcra", "limit": 10, "window": "1s", "lease": {"max_units": 5}},
            {"name": "off", "limit": 10, "window": "1s", "lease": false},
            {"name": "fw", "algorithm": "fixed_window", "limit": 10, "window": "1s"},
            {"name": "log", "algorithm": "sliding_window_log", "limit": 10, "window": "1s"}]},
          {"name": "s", "shadow": true, "limits": [{"name": "tb", "limit": 10, "window": "1s"}]},
          {"name": "b", "key_budget": {"new_keys": 5, "window": "1m"},
           "limits": [{"name": "tb", "limit": 10, "window": "1s"}]}]}"#,
    )
    .unwrap();
    let global = Some(Lease {
        max_units: 50,
        fraction: 0.2,
        max_ms: 500,
    });
    let own = Some(Lease {
        max_units: 5,
        ..Lease::default()
    });
    let leases: Vec<_> = c
        .rules
        .iter()
        .flat_map(|r| r.limits.iter().map(|l| l.lease))
        .collect();
    assert_eq!(leases, [global, own, None, global, None, None, None]);
    let off = Config::parse(
        with_rule(r#"{"name": "r", "limits": [{"name": "l", "limit": 1, "window": "1s"}]}"#)
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(off.rules[0].limits[0].lease, None, "off by default");
}

/// One bad config per case, with the exact message the operator sees.
#[test]
fn batch_and_deny_cache_settings() {
    let with = |extra: &str| {
        let json = format!(r#"{{"rules": [{{"name": "r", "limits": [{LIMIT}]}}], {extra}}}"#);
        Config::parse(json.as_bytes()).unwrap()
    };
    let c = with(r#""batch": {"max_requests": 256, "max_in_flight": 8}, "deny_cache": false"#);
    assert_eq!((c.batch.max_requests, c.batch.max_in_flight), (256, 8));
    assert_eq!(c.deny_cache_entries, 0);
    assert_eq!(with(r#""deny_cache": true"#).deny_cache_entries, 10_000);
    assert_eq!(with(r#""deny_cache": {}"#).deny_cache_entries, 10_000);
    let c = with(r#""deny_cache": {"max_entries": 0}, "batch": {"max_requests": 1}"#);
    assert_eq!((c.deny_cache_entries, c.batch.max_requests), (0, 1));
    assert_eq!(
        with(r#""deny_cache": {"max_entries": 1000000}"#).deny_cache_entries,
        1_000_000
    );
}

#[test]
fn bad_configs_name_the_field() {
    let rule = |extra: &str| with_rule(&format!(r#"{{"name": "r", "limits": [{LIMIT}]{extra}}}"#));
    let limit = |fields: &str| {
        with_rule(&format!(
            r#"{{"name": "r", "limits": [{{"name": "l", {fields}}}]}}"#
        ))
    };
    let top =
        |extra: &str| format!(r#"{{"rules": [{{"name": "r", "limits": [{LIMIT}]}}]{extra}}}"#);
    let cases: Vec<(String, &str)> = vec![
        ("".into(), "EOF while parsing a value"),
        ("[]".into(), "the configuration must be a JSON object"),
        ("{}".into(), "rules: is required"),
        (r#"{"rules": []}"#.into(), "rules: must hold at least one rule"),
        (top(r#", "colour": "red""#), "colour: unknown field `colour`, expected one of `bridge`, `failure_mode`, `shadow`, `clock`, `key_prefix`, `hash_identities`, `xff_trusted_hops`, `ipv4_prefix`, `ipv6_prefix`, `headers`, `deny_body`, `grpc_over_limit`, `batch`, `deny_cache`, `breaker`, `local_share`, `lease`, `rules`"),
        (top(r#", "local_share": 0"#), "local_share: must be a number above 0, at most 1"),
        (top(r#", "lease": 5"#), r#"lease: must be true, false or {"max_units": N, "fraction": F, "max_ms": N}"#),
        (top(r#", "lease": {"max_units": 0}"#), "lease.max_units: must be between 1 and 1000000000000"),
        (top(r#", "lease": {"fraction": 0}"#), "lease.fraction: must be a number above 0, at most 1"),
        (top(r#", "lease": {"fraction": 1.5}"#), "lease.fraction: must be a number above 0, at most 1"),
        (top(r#", "lease": {"max_ms": 0}"#), "lease.max_ms: must be between 1 and 60000"),
        (top(r#", "lease": {"max_ms": 60001}"#), "lease.max_ms: must be between 1 and 60000"),
        (top(r#", "lease": {"units": 5}"#), "lease: unknown field `units`, expected one of `max_units`, `fraction`, `max_ms`"),
        (top(r#", "lease": true, "clock": "redis""#), r#"lease: needs clock "proxy": a lease expires on the proxy's clock, which the script must decide with"#),
        (limit(r#""limit": 5, "window": "1s", "lease": true, "algorithm": "sliding_window_log""#), "rules[0].limits[0].lease: only token_bucket, gcra and fixed_window limits take a lease: a sliding window's units would leave the window counted from their charge, not from their use"),
        (limit(r#""limit": 5, "window": "1s", "lease": true, "algorithm": "sliding_window_counter""#), "rules[0].limits[0].lease: only token_bucket, gcra and fixed_window limits take a lease: a sliding window's units would leave the window counted from their charge, not from their use"),
        (limit(r#""limit": 5, "window": "1s", "lease": {"max_ms": 0}"#), "rules[0].limits[0].lease.max_ms: must be between 1 and 60000"),
        (with_rule(r#"{"name": "r", "shadow": true, "limits": [{"name": "l", "limit": 5, "window": "1s", "lease": true}]}"#), "rules[0].limits[0].lease: a shadow rule's limits are decided per request: they only report what they would refuse"),
        (with_rule(r#"{"name": "r", "key_budget": {"new_keys": 5, "window": "1m"}, "limits": [{"name": "l", "limit": 5, "window": "1s", "lease": true}]}"#), "rules[0].limits[0].lease: a rule with a key_budget is decided per request: its new identities are counted in Redis"),
        (r#"{"clock": "redis", "rules": [{"name": "r", "limits": [{"name": "l", "limit": 5, "window": "1s", "lease": true}]}]}"#.into(), r#"rules[0].limits[0].lease: needs clock "proxy": a lease expires on the proxy's clock, which the script must decide with"#),
        (rule(r#", "key_budget": {"new_keys": 0, "window": "1m"}"#), "rules[0].key_budget.new_keys: must be >= 1"),
        (limit(r#""limit": 100, "window": "1s", "shards": 65"#), "rules[0].limits[0].shards: must be between 1 and 64"),
        (limit(r#""limit": 100, "window": "1s", "shards": 0"#), "rules[0].limits[0].shards: must be between 1 and 64"),
        (limit(r#""limit": 3, "window": "1s", "shards": 4"#), "rules[0].limits[0].shards: every shard holds limit / shards and burst / shards: both must be at least shards"),
        (limit(r#""limit": 30, "burst": 3, "window": "1s", "shards": 4"#), "rules[0].limits[0].shards: every shard holds limit / shards and burst / shards: both must be at least shards"),
        (rule(r#", "key_budget": {"new_keys": 1000000000001, "window": "1m"}"#), "rules[0].key_budget.new_keys: must be at most 1000000000000"),
        (rule(r#", "key_budget": {"new_keys": -5, "window": "1m"}"#), "rules[0].key_budget.new_keys: invalid value: integer `-5`, expected u64"),
        (rule(r#", "key_budget": {"new_keys": 10, "window": "0s"}"#), "rules[0].key_budget.window: must be at least 1ms"),
        (rule(r#", "key_budget": {"new_keys": 10, "window": "367d"}"#), "rules[0].key_budget.window: must be at most 366d"),
        (rule(r#", "key_budget": {"new_keys": 10}"#), "rules[0].key_budget.window: is required"),
        (rule(r#", "key_budget": {"new_keys": 10, "window": "1m", "over_budget": "drop"}"#), "rules[0].key_budget.over_budget: unknown variant `drop`, expected `shared` or `deny`"),
        (rule(r#", "key_budget": {"new_keys": 10, "window": "1m", "overflow": "x"}"#), "rules[0].key_budget.overflow: unknown field `overflow`, expected one of `new_keys`, `window`, `over_budget`"),
        (top(r#", "local_share": 1.5"#), "local_share: must be a number above 0, at most 1"),
        (top(r#", "local_share": "1/8""#), "local_share: invalid type: string \"1/8\", expected f64"),
        (top(r#", "breaker": {"failures": 0}"#), "breaker.failures: must be between 1 and 1000"),
        (top(r#", "breaker": {"stall": "0ms"}"#), "breaker.stall: must be between 1ms and 60s"),
        (top(r#", "breaker": {"probe_interval": "soon"}"#), "breaker.probe_interval: invalid duration \"soon\": expected a whole number and a unit (ms, s, m, h, d), like \"150ms\""),
        (top(r#", "breaker": {"trips": 1}"#), "breaker: unknown field `trips`, expected one of `failures`, `stall`, `probe_interval`"),
        (top(r#", "bridge": {"clock_skew": "2m"}"#), "bridge.clock_skew: must be between 1ms and 60s"),
        (top(r#", "bridge": {"lag_allowance": "61s"}"#), "bridge.lag_allowance: must be between 0ms and 60s"),
        (top(r#", "bridge": {"lag_allowance": "-1s"}"#), "bridge.lag_allowance: invalid duration \"-1s\": expected a whole number and a unit (ms, s, m, h, d), like \"150ms\""),
        (top(r#", "batch": {"max_requests": 0}"#), "batch.max_requests: must be between 1 and 256"),
        (top(r#", "batch": {"max_requests": 257}"#), "batch.max_requests: must be between 1 and 256"),
        (top(r#", "batch": {"max_in_flight": 9}"#), "batch.max_in_flight: must be between 1 and 8"),
        (top(r#", "batch": {"max_in_flight": -1}"#), "batch.max_in_flight: invalid value: integer `-1`, expected u64"),
        (top(r#", "batch": {"size": 3}"#), "batch.size: unknown field `size`, expected `max_requests` or `max_in_flight`"),
        (top(r#", "deny_cache": {"max_entries": 1000001}"#), "deny_cache.max_entries: must be between 0 and 1000000"),
        (top(r#", "deny_cache": {"entries": 5}"#), "deny_cache: unknown field `entries`, expected `max_entries`"),
        (top(r#", "deny_cache": "on""#), "deny_cache: must be true, false or {\"max_entries\": N}"),
        (top(r#", "failure_mode": "sometimes""#), "failure_mode: unknown variant `sometimes`, expected one of `open`, `closed`, `local`"),
        (top(r#", "clock": "ntp""#), "clock: unknown variant `ntp`, expected `proxy` or `redis`"),
        (top(r#", "headers": "all""#), "headers: unknown variant `all`, expected one of `x-ratelimit`, `ietf`, `both`, `openai`, `none`"),
        (top(r#", "deny_body": "html""#), "deny_body: unknown variant `html`, expected `text` or `problem+json`"),
        (top(r#", "grpc_over_limit": "RESOURCE_EXHAUSTED""#), "grpc_over_limit: unknown variant `RESOURCE_EXHAUSTED`, expected `resource_exhausted` or `unavailable`"),
        (top(r#", "hash_identities": "yes""#), "hash_identities: invalid type: string \"yes\", expected a boolean"),
        (top(r#", "key_prefix": """#), "key_prefix: must be 1 to 64 printable ASCII characters without spaces or braces"),
        (top(r#", "key_prefix": "rl{""#), "key_prefix: must be 1 to 64 printable ASCII characters without spaces or braces"),
        (top(r#", "xff_trusted_hops": 11"#), "xff_trusted_hops: must be between 0 and 10"),
        (top(r#", "xff_trusted_hops": -1"#), "xff_trusted_hops: invalid value: integer `-1`, expected u8"),
        (top(r#", "ipv6_prefix": 0"#), "ipv6_prefix: must be between 1 and 128"),
        (top(r#", "ipv4_prefix": 33"#), "ipv4_prefix: must be between 1 and 32"),
        (top(r#", "bridge": {"clustr": "x"}"#), "bridge.clustr: unknown field `clustr`, expected one of `cluster`, `authority`, `username`, `password`, `timeout`, `clock_skew`, `lag_allowance`, `redis_cluster`, `redis_calls`"),
        (top(r#", "bridge": {"redis_calls": "eval"}"#), "bridge.redis_calls: must be \"function\" (FCALL, Redis 7 and later) or \"script\" (EVALSHA)"),
        (top(r#", "bridge": {"redis_cluster": true, "redis_calls": "function"}"#), "bridge.redis_calls: must be \"script\" with bridge.redis_cluster: Envoy's redis_proxy routes EVALSHA by its key, and FCALL not at all"),
        (top(r#", "bridge": {"redis_cluster": true}, "clock": "redis""#), "clock: must be \"proxy\" with bridge.redis_cluster: each node of a Redis Cluster has its own clock"),
        (top(r#", "bridge": {"redis_cluster": "yes"}"#), "bridge.redis_cluster: invalid type: string \"yes\", expected a boolean"),
        (top(r#", "bridge": {"cluster": ""}"#), "bridge.cluster: must not be empty"),
        (top(r#", "bridge": {"timeout": "0ms"}"#), "bridge.timeout: must be between 1ms and 60s"),
        (top(r#", "bridge": {"timeout": "2m"}"#), "bridge.timeout: must be between 1ms and 60s"),
        (top(r#", "bridge": {"timeout": 150}"#), "bridge.timeout: invalid type: integer `150`, expected a string"),
        (top(r#", "bridge": {"timeout": "soon"}"#), "bridge.timeout: invalid duration \"soon\": expected a whole number and a unit (ms, s, m, h, d), like \"150ms\""),
        (top(r#", "bridge": {"username": "u"}"#), "bridge.password: is required with bridge.username"),
        (top(r#", "bridge": {"password": "p"}"#), "bridge.username: is required with bridge.password"),
        (top(r#", "bridge": {"username": "a:b", "password": "p"}"#), "bridge.username: must be non-empty and must not contain ':'"),
        (top(r#", "bridge": {"authority": "a b"}"#), "bridge.authority: must be a host name, printable ASCII without spaces"),
        (with_rule(&format!(r#"{{"limits": [{LIMIT}]}}"#)), "rules[0].name: is required"),
        (with_rule(&format!(r#"{{"name": "a b", "limits": [{LIMIT}]}}"#)), "rules[0].name: must be 1 to 64 letters, digits, '-' or '_'"),
        (format!(r#"{{"rules": [{{"name": "r", "limits": [{LIMIT}]}}, {{"name": "r", "limits": [{LIMIT}]}}]}}"#), "rules[1].name: duplicate rule name \"r\""),
        (with_rule(r#"{"name": "r", "limits": []}"#), "rules[0].limits: must hold at least one limit"),
        (with_rule(r#"{"name": "r"}"#), "rules[0].limits: is required"),
        (rule(r#", "match": {"sources": [{"source": "metadata:ns:tier", "in": [1, null]}]}"#), "rules[0].match.sources[0].in[1]: must be a string, a number or true/false"),
        (with_rule(&format!(r#"{{"name": "r", "plan_from": "metadata:ns:plan", "plans": [{{"name": "one", "values": [1], "limits": [{LIMIT}]}}, {{"name": "d", "values": ["x", "1"], "default": true, "limits": [{LIMIT}]}}]}}"#)), "rules[0].plans[1].values[1]: \"1\" is a value of plans[0] already: a request is in one plan"),
        (rule(r#", "limit": 5"#), "rules[0].limit: unknown field `limit`, expected one of `name`, `match`, `key`, `limits`, `plan_from`, `plans`, `cost`, `failure_mode`, `timeout`, `shadow`, `key_budget`"),
        (rule(r#", "timeout": "0s""#), "rules[0].timeout: must be between 1ms and 60s"),
        (rule(r#", "failure_mode": "half""#), "rules[0].failure_mode: unknown variant `half`, expected one of `open`, `closed`, `local`"),
        (limit(r#""window": "1s""#), "rules[0].limits[0].limit: is required"),
        (limit(r#""limit": 0, "window": "1s""#), "rules[0].limits[0].limit: must be >= 1"),
        (limit(r#""limit": -3, "window": "1s""#), "rules[0].limits[0].limit: invalid value: integer `-3`, expected u64"),
        (limit(r#""limit": 1.5, "window": "1s""#), "rules[0].limits[0].limit: invalid type: floating point `1.5`, expected u64"),
        (limit(r#""limit": 1"#), "rules[0].limits[0].window: is required"),
        (limit(r#""limit": 1, "window": "0s""#), "rules[0].limits[0].window: must be > 0"),
        (limit(r#""limit": 1, "window": "1y""#), "rules[0].limits[0].window: invalid duration \"1y\": expected a whole number and a unit (ms, s, m, h, d), like \"150ms\""),
        (limit(r#""limit": 1, "algorithm": "gcra""#), "rules[0].limits[0].window: is required"),
        (limit(r#""limit": 1, "window": "1s", "max_duration": "1s""#), "rules[0].limits[0].max_duration: only a concurrency limit has a max_duration"),
        (limit(r#""limit": 1, "algorithm": "concurrency""#), "rules[0].limits[0].max_duration: is required for a concurrency limit: the longest a request keeps its hold when its end is never seen"),
        (limit(r#""limit": 1, "algorithm": "concurrency", "window": "1s""#), "rules[0].limits[0].window: a concurrency limit has no window: it counts requests in flight, each held at most max_duration"),
        (limit(r#""limit": 10001, "algorithm": "concurrency", "max_duration": "1m""#), "rules[0].limits[0].limit: a concurrency limit keeps one entry per request in flight: must be at most 10000"),
        (limit(r#""limit": 2, "algorithm": "concurrency", "max_duration": "1m", "lease": true"#), "rules[0].limits[0].lease: a hold is taken per request: it cannot be leased"),
        (limit(r#""limit": 2, "algorithm": "concurrency", "max_duration": "1m", "shards": 2"#), "rules[0].limits[0].shards: a concurrency limit is not sharded"),
        (limit(r#""limit": 2, "algorithm": "concurrency", "max_duration": "1m", "burst": 3"#), "rules[0].limits[0].burst: concurrency has no burst: only token_bucket and gcra do"),
        (limit(r#""limit": 2, "algorithm": "concurrency", "max_duration": "0s""#), "rules[0].limits[0].max_duration: must be > 0"),
        (with_rule(r#"{"name": "r", "shadow": true, "limits": [{"name": "l", "limit": 2, "algorithm": "concurrency", "max_duration": "1m"}]}"#), "rules[0].limits[0].algorithm: a shadow rule cannot take holds: put the concurrency limit in an enforced rule"),
        (limit(r#""limit": 2, "window": "1m", "shards": 2, "overrides": true"#), "rules[0].limits[0].overrides: a sharded limit spreads one identity over several slots: an override would have to be read on each; use shards 1"),
        (limit(r#""limit": 1, "window": "1s", "algorithm": "leaky""#), "rules[0].limits[0].algorithm: unknown variant `leaky`, expected one of `token_bucket`, `gcra`, `sliding_window_counter`, `sliding_window_log`, `fixed_window`, `concurrency`"),
        (limit(r#""limit": 1, "window": "1s", "algorithm": "fixed_window", "burst": 5"#), "rules[0].limits[0].burst: fixed_window has no burst: only token_bucket and gcra do"),
        (limit(r#""limit": 1, "window": "1s", "burst": 0"#), "rules[0].limits[0].burst: must be >= 1"),
        (limit(r#""limit": 1, "window": "1s", "rate": 5"#), "rules[0].limits[0].rate: unknown field `rate`, expected one of `name`, `algorithm`, `limit`, `window`, `max_duration`, `utc_offset`, `burst`, `shards`, `lease`, `usage`, `overrides`"),
        (limit(r#""limit": 1, "window": "month""#), "rules[0].limits[0].window: \"month\" is a calendar window, which only fixed_window takes; token_bucket needs a duration such as \"1d\""),
        (limit(r#""limit": 1, "window": "week", "algorithm": "sliding_window_log""#), "rules[0].limits[0].window: \"week\" is a calendar window, which only fixed_window takes; sliding_window_log needs a duration such as \"1d\""),
        (limit(r#""limit": 1, "window": "monthly", "algorithm": "fixed_window""#), "rules[0].limits[0].window: invalid duration \"monthly\": expected a whole number and a unit (ms, s, m, h, d), like \"150ms\", or a calendar window: \"day\", \"week\" or \"month\""),
        (limit(r#""limit": 1, "window": "Month", "algorithm": "fixed_window""#), "rules[0].limits[0].window: invalid duration \"Month\": expected a whole number and a unit (ms, s, m, h, d), like \"150ms\", or a calendar window: \"day\", \"week\" or \"month\""),
        (limit(r#""limit": 1, "window": "1d", "algorithm": "fixed_window", "utc_offset": "+05:30""#), "rules[0].limits[0].utc_offset: only a calendar window (\"day\", \"week\" or \"month\") takes an offset: a window of a fixed length is aligned to the Unix epoch"),
        (limit(r#""limit": 1, "window": "1h", "utc_offset": "+01:00""#), "rules[0].limits[0].utc_offset: only a calendar window (\"day\", \"week\" or \"month\") takes an offset: a window of a fixed length is aligned to the Unix epoch"),
        (limit(r#""limit": 1, "window": "day", "algorithm": "fixed_window", "utc_offset": "+14:30""#), "rules[0].limits[0].utc_offset: invalid offset \"+14:30\": expected ±HH:MM between -14:00 and +14:00, like \"+05:30\""),
        (limit(r#""limit": 1, "window": "day", "algorithm": "fixed_window", "utc_offset": "05:30""#), "rules[0].limits[0].utc_offset: invalid offset \"05:30\": expected ±HH:MM between -14:00 and +14:00, like \"+05:30\""),
        (limit(r#""limit": 1, "window": "day", "algorithm": "fixed_window", "utc_offset": "+5:30""#), "rules[0].limits[0].utc_offset: invalid offset \"+5:30\": expected ±HH:MM between -14:00 and +14:00, like \"+05:30\""),
        (limit(r#""limit": 1, "window": "day", "algorithm": "fixed_window", "utc_offset": "-03:75""#), "rules[0].limits[0].utc_offset: invalid offset \"-03:75\": expected ±HH:MM between -14:00 and +14:00, like \"+05:30\""),
        (limit(r#""limit": 1, "window": "day", "algorithm": "fixed_window", "utc_offset": 330"#), "rules[0].limits[0].utc_offset: invalid type: integer `330`, expected a string"),
        (with_rule(&format!(r#"{{"name": "r", "limits": [{LIMIT}, {LIMIT}]}}"#)), "rules[0].limits[1].name: duplicate limit name \"l\" in this rule"),
        (rule(r#", "key": {"from": []}"#), "rules[0].key.from: must name at least one key source"),
        (rule(r#", "key": {"from": ["cookie"]}"#), "rules[0].key.from[0]: unknown source \"cookie\": expected header:NAME, query:NAME, metadata:NAMESPACE:KEY[:KEY…], body:KEY[:KEY…], client_ip, route, method or path, joined with '+'"),
        (rule(r#", "key": {"from": ["body:"]}"#), "rules[0].key.from[0]: a body key must be printable ASCII without ':', '+', '=', '{', '}' or spaces (write another byte as %XX), got \"\""),
        (rule(r#", "key": {"from": ["body:a:b:c:d:e:f:g:h:i"]}"#), "rules[0].key.from[0]: body reads at most 8 keys deep"),
        (rule(&format!(r#", "match": {{"sources": [{}]}}"#, (0..9).map(|i| format!(r#"{{"source": "body:k{i}", "present": true}}"#)).collect::<Vec<_>>().join(", "))), "rules: read 9 different body: paths, at most 8 (each is scanned in every held request body)"),
        (rule(r#", "key": {"from": ["client_ip", "header:"]}"#), "rules[0].key.from[1]: must be a header name (letters, digits and !#$%&'*+-.^_`|~)"),
        (rule(r#", "key": {"from": ["path+"]}"#), "rules[0].key.from[0]: unknown source \"\": expected header:NAME, query:NAME, metadata:NAMESPACE:KEY[:KEY…], body:KEY[:KEY…], client_ip, route, method or path, joined with '+'"),
        (rule(r#", "key": {"when_missing": "deny"}"#), "rules[0].key.when_missing: unknown variant `deny`, expected `anonymous` or `skip`"),
        (rule(r#", "match": {"path_exact": "/a", "path_prefix": "/b"}"#), "rules[0].match: path_exact and path_prefix exclude each other"),
        (rule(r#", "match": {"path_prefix": "api"}"#), "rules[0].match.path_prefix: must start with '/'"),
        (rule(r#", "match": {"methods": []}"#), "rules[0].match.methods: must not be empty (leave it out to match any method)"),
        (rule(r#", "match": {"methods": ["GET", "GE T"]}"#), "rules[0].match.methods[1]: must be an HTTP method such as GET"),
        (rule(r#", "match": {"header": {"name": "bad name"}}"#), "rules[0].match.header.name: must be a header name (letters, digits and !#$%&'*+-.^_`|~)"),
        (rule(r#", "match": {"host": "x"}"#), "rules[0].match.host: unknown field `host`, expected one of `path_exact`, `path_prefix`, `methods`, `header`, `sources`"),
        (rule(r#", "key": {"from": ["metadata:envoy.filters.http.jwt_authn"]}"#), "rules[0].key.from[0]: metadata needs a namespace and at least one key: metadata:NAMESPACE:KEY[:KEY…], e.g. metadata:envoy.filters.http.jwt_authn:jwt_payload:sub"),
        (rule(r#", "key": {"from": ["metadata:ns::sub"]}"#), "rules[0].key.from[0]: a metadata key must be printable ASCII without ':', '+', '=', '{', '}' or spaces (write another byte as %XX), got \"\""),
        (rule(r#", "key": {"from": ["metadata:ns:a=b"]}"#), "rules[0].key.from[0]: a metadata key must be printable ASCII without ':', '+', '=', '{', '}' or spaces (write another byte as %XX), got \"a=b\""),
        (rule(r#", "key": {"from": ["query:"]}"#), "rules[0].key.from[0]: a query parameter's name must be printable ASCII without ':', '+', '=', '{', '}' or spaces (write another byte as %XX), got \"\""),
        (rule(r#", "match": {"sources": [{"source": "query:debug"}]}"#), "rules[0].match.sources[0]: needs exactly one of \"in\": [values], \"not_in\": [values] or \"present\": true|false"),
        (rule(r#", "match": {"sources": [{"source": "query:debug", "in": ["1"], "present": true}]}"#), "rules[0].match.sources[0]: needs exactly one of \"in\": [values], \"not_in\": [values] or \"present\": true|false"),
        (rule(r#", "match": {"sources": [{"source": "metadata:ns:plan", "in": []}]}"#), "rules[0].match.sources[0].in: must hold at least one value"),
        (rule(r#", "match": {"sources": [{"source": "metadata:ns:plan", "not_in": ["a", ""]}]}"#), "rules[0].match.sources[0].not_in[1]: must not be empty: an empty value is an absent one (test it with \"present\": false)"),
        (rule(r#", "match": {"sources": [{"source": "jwt:sub", "present": true}]}"#), "rules[0].match.sources[0].source: unknown source \"jwt:sub\": expected header:NAME, query:NAME, metadata:NAMESPACE:KEY[:KEY…], body:KEY[:KEY…], client_ip, route, method or path"),
        (rule(r#", "match": {"sources": [{"source": "client_ip+route", "present": true}]}"#), "rules[0].match.sources[0].source: a condition tests one source: write one condition per source"),
        (rule(r#", "match": {"sources": [{"source": "route", "equals": "x"}]}"#), "rules[0].match.sources[0].equals: unknown field `equals`, expected one of `source`, `in`, `not_in`, `present`"),
        (rule(r#", "match": {"header": {"name": "x-t", "value": ""}}"#), "rules[0].match.header.value: must not be empty: an empty header is an absent one"),
        (with_rule(r#"{"name": "r"}"#), "rules[0].limits: is required"),
        (rule(r#", "match": {"sources": [{"source": "metadata:ns:tier", "in": [1, null]}]}"#), "rules[0].match.sources[0].in[1]: must be a string, a number or true/false"),
        (with_rule(&format!(r#"{{"name": "r", "plan_from": "metadata:ns:plan", "plans": [{{"name": "one", "values": [1], "limits": [{LIMIT}]}}, {{"name": "d", "values": ["x", "1"], "default": true, "limits": [{LIMIT}]}}]}}"#)), "rules[0].plans[1].values[1]: \"1\" is a value of plans[0] already: a request is in one plan"),
        (with_rule(&format!(r#"{{"name": "r", "limits": [{LIMIT}], "plan_from": "metadata:ns:plan", "plans": []}}"#)), "rules[0].limits: a rule with plans has no limits of its own: each plan holds its limits"),
        (with_rule(&format!(r#"{{"name": "r", "plans": [{{"name": "p", "default": true, "limits": [{LIMIT}]}}]}}"#)), "rules[0].plan_from: is required with plans: the source naming a request's plan, e.g. metadata:envoy.filters.http.jwt_authn:jwt_payload:plan"),
        (with_rule(r#"{"name": "r", "plan_from": "metadata:ns:plan"}"#), "rules[0].plans: is required with plan_from: the plans the source's values name, one of them the default"),
        (with_rule(r#"{"name": "r", "plan_from": "metadata:ns:plan", "plans": []}"#), "rules[0].plans: must hold at least one plan"),
        (with_rule(&format!(r#"{{"name": "r", "plan_from": "plan", "plans": [{{"name": "p", "default": true, "limits": [{LIMIT}]}}]}}"#)), "rules[0].plan_from: unknown source \"plan\": expected header:NAME, query:NAME, metadata:NAMESPACE:KEY[:KEY…], body:KEY[:KEY…], client_ip, route, method or path"),
        (with_rule(&format!(r#"{{"name": "r", "plan_from": "metadata:ns:plan", "plans": [{{"name": "pro", "values": ["pro"], "limits": [{LIMIT}]}}, {{"name": "free", "values": ["free"], "limits": [{LIMIT}]}}]}}"#)), "rules[0].plans: no plan is the default: mark one \"default\": true; it takes every request whose plan_from is absent or names no plan (anonymous requests, unknown plans)"),
        (with_rule(&format!(r#"{{"name": "r", "plan_from": "metadata:ns:plan", "plans": [{{"name": "a", "default": true, "limits": [{LIMIT}]}}, {{"name": "b", "default": true, "limits": [{LIMIT}]}}]}}"#)), "rules[0].plans[1].default: plans[0] is the default already: one plan takes every request the others do not"),
        (with_rule(&format!(r#"{{"name": "r", "plan_from": "metadata:ns:plan", "plans": [{{"name": "pro", "limits": [{LIMIT}]}}, {{"name": "d", "default": true, "limits": [{LIMIT}]}}]}}"#)), "rules[0].plans[0].values: must name the values of plan_from this plan takes (only the default plan may name none)"),
        (with_rule(&format!(r#"{{"name": "r", "plan_from": "metadata:ns:plan", "plans": [{{"name": "pro", "values": ["pro"], "limits": [{LIMIT}]}}, {{"name": "pro", "default": true, "limits": [{LIMIT}]}}]}}"#)), "rules[0].plans[1].name: duplicate plan name \"pro\" (plans[0])"),
        (with_rule(&format!(r#"{{"name": "r", "plan_from": "metadata:ns:plan", "plans": [{{"name": "pro", "values": ["pro", "gold"], "limits": [{LIMIT}]}}, {{"name": "gold", "values": ["gold"], "default": true, "limits": [{LIMIT}]}}]}}"#)), "rules[0].plans[1].values[0]: \"gold\" is a value of plans[0] already: a request is in one plan"),
        (with_rule(&format!(r#"{{"name": "r", "plan_from": "metadata:ns:plan", "plans": [{{"name": "pro", "values": ["pro"], "limits": [{LIMIT}]}}, {{"name": "d", "default": true, "limits": [{{"name": "l", "limit": 1, "window": "1m"}}]}}]}}"#)), "rules[0].plans[1].limits[0]: \"l\" is a token_bucket of window 1s and 1 shard(s) in an earlier plan: a limit keeps its state across plans, so one name keeps its algorithm, window and shards (give this one another name)"),
        (with_rule(&format!(r#"{{"name": "r", "plan_from": "metadata:ns:plan", "plans": [{{"name": "pro", "values": ["pro"], "limits": []}}, {{"name": "d", "default": true, "limits": [{LIMIT}]}}]}}"#)), "rules[0].plans[0].limits: must hold at least one limit"),
        (with_rule(&format!(r#"{{"name": "r", "plan_from": "metadata:ns:plan", "plans": [{{"name": "p q", "default": true, "limits": [{LIMIT}]}}]}}"#)), "rules[0].plans[0].name: must be 1 to 64 letters, digits, '-' or '_'"),
        (with_rule(&format!(r#"{{"name": "r", "plan_from": "metadata:ns:plan", "plans": [{{"name": "p", "default": true, "limit": [{LIMIT}]}}]}}"#)), "rules[0].plans[0].limit: unknown field `limit`, expected one of `name`, `values`, `default`, `limits`"),
        (rule(r#", "cost": 0"#), "rules[0].cost: must be between 1 and 1000000"),
        (rule(r#", "cost": "2""#), "rules[0].cost: must be a whole number or {\"header\": NAME, \"min\": N, \"max\": N}"),
        (rule(r#", "cost": {"header": "x-cost"}"#), "rules[0].cost: a cost taken from a header needs both min and max"),
        (rule(r#", "cost": {"header": "x-cost", "min": 5, "max": 2}"#), "rules[0].cost: needs min <= max <= 1000000"),
        (rule(r#", "cost": {"header": "x-cost", "min": 1, "max": 5, "default": 9}"#), "rules[0].cost.default: must be between min and max"),
        (rule(r#", "cost": {"header": "x cost", "min": 1, "max": 5}"#), "rules[0].cost.header: must be a header name (letters, digits and !#$%&'*+-.^_`|~)"),
        (rule(r#", "cost": {"header": "x-cost", "min": 1, "max": 5, "step": 1}"#), "rules[0].cost: unknown field `step`, expected one of `header`, `min`, `max`, `default`"),
    ];
    for (json, want) in cases {
        let got = Config::parse(json.as_bytes()).unwrap_err().to_string();
        assert_eq!(got, want, "config {json}");
    }
}

#[test]
fn calendar_windows_are_read_with_their_offsets() {
    let c = Config::parse(
        br#"{"rules": [{"name": "plan", "limits": [
            {"name": "monthly", "algorithm": "fixed_window", "limit": 100000, "window": "month", "utc_offset": "+05:30"},
            {"name": "weekly", "algorithm": "fixed_window", "limit": 5000, "window": "week"},
            {"name": "daily", "algorithm": "fixed_window", "limit": 1000, "window": "day", "utc_offset": "-14:00"},
            {"name": "plain", "algorithm": "fixed_window", "limit": 1000, "window": "1d"}]}]}"#,
    )
    .unwrap();
    let windows: Vec<Window> = c.rules[0].limits.iter().map(|l| l.window).collect();
    let calendar = |unit, offset_minutes| {
        Window::Calendar(Calendar {
            unit,
            offset_minutes,
        })
    };
    assert_eq!(
        windows,
        [
            calendar(CalendarUnit::Month, 330),
            calendar(CalendarUnit::Week, 0),
            calendar(CalendarUnit::Day, -840),
            Window::ms(86_400_000),
        ]
    );
    assert_eq!(windows[0].show(), "month at UTC+05:30");
    assert_eq!(windows[1].show(), "week");
    assert_eq!(windows[2].show(), "day at UTC-14:00");
    assert_eq!(windows[3].show(), "1d");
}

#[test]
fn a_key_budget_is_read_with_its_default_over_budget() {
    let c = Config::parse(
        br#"{"rules": [{"name": "ip", "key_budget": {"new_keys": 10000, "window": "1m"},
            "limits": [{"name": "s", "limit": 5, "window": "1s"}]},
          {"name": "strict", "key_budget": {"new_keys": 5, "window": "10s", "over_budget": "deny"},
            "limits": [{"name": "s", "limit": 5, "window": "1s"}]},
          {"name": "none", "limits": [{"name": "s", "limit": 5, "window": "1s"}]}]}"#,
    )
    .unwrap();
    assert_eq!(
        c.rules[0].key_budget,
        Some(KeyBudget {
            new_keys: 10_000,
            window: Duration::from_secs(60),
            over_budget: OverBudget::Shared,
        })
    );
    assert_eq!(
        c.rules[1].key_budget.as_ref().map(|b| b.over_budget),
        Some(OverBudget::Deny)
    );
    assert_eq!(c.rules[2].key_budget, None);
}

#[test]
fn a_redis_cluster_batches_more_calls_at_once_and_counts_key_budgets_per_slot() {
    let c = Config::parse(
        br#"{"bridge": {"redis_cluster": true}, "batch": {"max_in_flight": 2},
            "rules": [{"name": "ip", "limits": [{"name": "s", "limit": 5, "window": "1s"}]}]}"#,
    )
    .unwrap();
    assert!(c.redis_cluster);
    assert_eq!(c.batch.max_in_flight, 2, "as configured");
    assert!(c.budget_slot_tags.0.is_empty(), "no budget, no table");
    let budget = |new_keys: u64, window: &str| {
        Config::parse(
            format!(
                r#"{{"bridge": {{"redis_cluster": true}}, "rules": [{{"name": "ip",
                "key_budget": {{"new_keys": {new_keys}, "window": "{window}"}},
                "limits": [{{"name": "s", "limit": 5, "window": "1s"}}]}}]}}"#
            )
            .as_bytes(),
        )
    };
    let c = budget(10_000, "1m").unwrap();
    assert_eq!(c.budget_slot_tags.0.len(), 16_384);
    let b = c.rules[0].key_budget.as_ref().unwrap();
    // One per slot per 1m × 16384 / 10000: 10,000 per minute over all slots.
    assert_eq!(cluster_budget(b), (1, Duration::from_millis(98_304)));
    let b = budget(100_000, "1s").unwrap().rules[0]
        .key_budget
        .clone()
        .unwrap();
    assert_eq!(cluster_budget(&b), (7, Duration::from_millis(1_146)));
    assert_eq!(
        budget(1, "1d").unwrap_err().to_string(),
        "rules[0].key_budget.window: with bridge.redis_cluster each of the 16384 slots counts its own share: window × 16384 / new_keys must be at most 366d (raise new_keys or shorten window)"
    );
}

/// `lease.fraction` goes into every leased call: a value the script would get with more
/// decimals than the call's fixed 6 (`5e-324` alone took ~330 bytes per limit) is refused.
#[test]
fn a_lease_fraction_has_at_most_six_decimals() {
    let top = |fraction: &str| {
        format!(
            r#"{{"lease": {{"fraction": {fraction}}}, "rules": [{{"name": "r", "limits": [{LIMIT}]}}]}}"#
        )
    };
    let own = |fraction: &str| {
        with_rule(&format!(
            r#"{{"name": "r", "limits": [{{"name": "l", "limit": 1, "window": "1s", "lease": {{"fraction": {fraction}}}}}]}}"#
        ))
    };
    for fraction in ["5e-324", "1e-7", "0.0000005", "0.1234567"] {
        assert_eq!(
            Config::parse(top(fraction).as_bytes())
                .unwrap_err()
                .to_string(),
            "lease.fraction: must have at most 6 decimals (0.000001 at least)",
            "{fraction}"
        );
        assert_eq!(
            Config::parse(own(fraction).as_bytes())
                .unwrap_err()
                .to_string(),
            "rules[0].limits[0].lease.fraction: must have at most 6 decimals (0.000001 at least)",
            "{fraction}"
        );
    }
    for (fraction, want) in [
        ("0.000001", 0.000001),
        ("0.123456", 0.123456),
        ("1e-6", 0.000001),
        ("1", 1.0),
    ] {
        let c = Config::parse(top(fraction).as_bytes()).unwrap();
        assert_eq!(c.rules[0].limits[0].lease.map(|l| l.fraction), Some(want));
    }
}

/// Usage metering on a limit: the example rule of the docs, and every bad `usage`.
#[test]
fn usage_on_a_limit_is_read_with_its_defaults() {
    let c = Config::parse(
        br#"{"rules": [{"name": "llm", "match": {"path_prefix": "/v1/"}, "key": {"from": ["header:x-api-key"]},
          "limits": [
            {"name": "requests", "limit": 60, "window": "1m"},
            {"name": "tokens_minute", "limit": 100000, "window": "1m",
             "usage": {"from": "body:usage.total_tokens", "admit": "reserve",
                       "estimate": {"request": {"completion_default": 1024}}}},
            {"name": "tokens_day", "limit": 1000000, "window": "1d", "algorithm": "fixed_window",
             "usage": {"from": "header:X-Usage-Tokens", "admit": "after", "estimate": 500}},
            {"name": "by_header", "limit": 1000, "window": "1m",
             "usage": {"from": "body:usage.completion_tokens",
                       "estimate": {"header": "x-max", "min": 10, "max": 100}}}]}]}"#,
    )
    .unwrap();
    let limits = &c.rules[0].limits;
    assert_eq!(limits[0].usage, None);
    assert_eq!(
        limits[1].usage,
        Some(Usage {
            from: UsageSource::Body(BodyUsage::first_of(vec![vec![
                "usage".into(),
                "total_tokens".into()
            ]])),
            format: None,
            admit: Admit::Reserve,
            estimate: Estimate::Request {
                completion_default: 1024,
                max_body: 1 << 20,
                output: OutputKeys::Completion,
            },
            include_usage: AddIncludeUsage::Off,
            weights: None,
        })
    );
    assert_eq!(
        limits[2].usage,
        Some(Usage {
            from: UsageSource::Header(HeaderUsage::unbounded("x-usage-tokens")),
            format: None,
            admit: Admit::After,
            estimate: Estimate::Fixed(500),
            include_usage: AddIncludeUsage::Off,
            weights: None,
        })
    );
    assert_eq!(
        limits[3].usage.as_ref().map(|u| &u.estimate),
        Some(&Estimate::Header {
            name: "x-max".into(),
            min: 10,
            max: 100,
            default: 10
        })
    );
    assert_eq!(parse_bytes("512KiB"), Some(512 << 10));
    assert_usage_formats_parse();
    assert_eq!(parse_bytes("3MiB"), Some(3 << 20));
    assert_eq!(parse_bytes("100"), Some(100));
    assert_eq!(parse_bytes("1GiB"), None);
    assert_eq!(parse_bytes("MiB"), None);
}

/// Named formats and lists of paths, with the output bounds each estimate reads.
fn assert_usage_formats_parse() {
    let c = fixtures::parse(&with_rule(
        r#"{"name": "r", "limits": [
            {"name": "a", "limit": 100, "window": "1m",
             "usage": {"from": "openai", "estimate": {"request": {}}, "include_usage": true}},
            {"name": "b", "limit": 100, "window": "1m",
             "usage": {"from": "anthropic", "estimate": {"request": {}}}},
            {"name": "c", "limit": 100, "window": "1m",
             "usage": {"from": ["body:usage.total_tokens", "body:response.usage.total_tokens"], "estimate": 5}}]}"#,
    ))
    .unwrap();
    let usage = |i: usize| c.rules[0].limits[i].usage.clone().unwrap();
    assert_eq!(usage(0).from, UsageSource::Body(BodyUsage::openai()));
    assert_eq!(usage(0).format, Some(Format::OpenAi));
    assert_eq!(usage(0).include_usage, AddIncludeUsage::Always);
    let bounded = fixtures::parse(&with_rule(
        r#"{"name": "r", "limits": [{"name": "a", "limit": 100, "window": "1m",
             "usage": {"from": {"header": "X-Cost", "min": 1, "max": 20}, "estimate": 20}}]}"#,
    ))
    .unwrap();
    assert_eq!(
        bounded.rules[0].limits[0].usage.as_ref().unwrap().from,
        UsageSource::Header(HeaderUsage {
            name: "x-cost".into(),
            min: 1,
            max: 20
        })
    );
    let marked = fixtures::parse(&with_rule(
        r#"{"name": "r", "limits": [{"name": "a", "limit": 100, "window": "1m",
             "usage": {"from": "openai", "estimate": {"request": {}},
                       "include_usage": {"streamed": "metadata:llm:stream", "asked": "metadata:llm:include_usage"}}}]}"#,
    ))
    .unwrap();
    let path = |key: &str| MetadataPath {
        namespace: "llm".into(),
        keys: vec![key.into()],
    };
    assert_eq!(
        marked.rules[0].limits[0]
            .usage
            .as_ref()
            .unwrap()
            .include_usage,
        AddIncludeUsage::Marked {
            streamed: path("stream"),
            asked: Some(path("include_usage"))
        }
    );
    assert!(matches!(
        usage(0).estimate,
        Estimate::Request {
            output: OutputKeys::OpenAi,
            ..
        }
    ));
    assert_eq!(usage(1).from, UsageSource::Body(BodyUsage::anthropic()));
    assert!(matches!(
        usage(1).estimate,
        Estimate::Request {
            output: OutputKeys::Anthropic,
            ..
        }
    ));
    assert_eq!(usage(2).from, UsageSource::Body(BodyUsage::openai()));
    assert_eq!(usage(2).format, None);
}

/// The `usage` of a rule's one limit (a token bucket of 1000 a minute) written `json`.
fn usage_of(json: &str) -> Result<Option<Usage>, String> {
    fixtures::parse(&with_rule(&format!(
        r#"{{"name": "r", "limits": [{{"name": "l", "limit": 1000, "window": "1m", "usage": {json}}}]}}"#
    )))
    .map(|c| c.rules[0].limits[0].usage.clone())
}

#[test]
fn a_status_source_counts_listed_statuses_and_reserves_one() {
    let limits = usage_of;
    let want = Some(Usage {
        from: UsageSource::Status(vec![401, 403]),
        format: None,
        admit: Admit::Reserve,
        estimate: Estimate::Fixed(1),
        include_usage: AddIncludeUsage::Off,
        weights: None,
    });
    assert_eq!(limits(r#"{"from": "status:401, 403"}"#), Ok(want.clone()));
    assert_eq!(
        limits(r#"{"from": "status:401,403", "estimate": 1}"#),
        Ok(want)
    );
}

#[test]
fn weights_read_a_formats_kinds_of_tokens_apart() {
    let usage = |json: &str| usage_of(json).ok().flatten();
    let Some(u) = usage(
        r#"{"from": "openai", "estimate": 10, "weights": {"input": 1, "output": 4, "cached_input": 0.125}}"#,
    ) else {
        panic!("a valid config")
    };
    let w = Weights {
        input: 1000,
        output: 4000,
        cached_input: 125,
        cache_write: 1000,
    };
    assert_eq!(u.weights, Some(w));
    assert_eq!(u.from, UsageSource::Body(BodyUsage::openai_weighted(&w)));
    // Left out: input and output 1, the cached kinds as input.
    let u = usage(r#"{"from": "anthropic", "estimate": 10, "weights": {"input": 2.5}}"#);
    let w = Weights {
        input: 2500,
        output: 1000,
        cached_input: 2500,
        cache_write: 2500,
    };
    assert_eq!(u.and_then(|u| u.weights), Some(w));
}

#[test]
fn bad_usage_configs_name_the_field() {
    let usage = |algorithm: &str, extra: &str, usage: &str| {
        with_rule(&format!(
            r#"{{"name": "r", "limits": [{{"name": "l", "algorithm": "{algorithm}", "limit": 100, "window": "1m"{extra}, "usage": {usage}}}]}}"#
        ))
    };
    let body = |usage_fields: &str| {
        usage(
            "token_bucket",
            "",
            &format!(r#"{{"from": "body:usage.total_tokens", {usage_fields}}}"#),
        )
    };
    let f = "rules[0].limits[0].usage";
    let cases: Vec<(String, String)> = vec![
        (usage("sliding_window_log", "", r#"{"from": "body:u", "estimate": 5}"#), format!("{f}: only token_bucket, gcra, fixed_window and sliding_window_counter limits take usage: a log keeps one entry per unit")),
        (usage("token_bucket", r#", "lease": true"#, r#"{"from": "body:u", "estimate": 5}"#), format!("{f}.lease: a usage limit takes no lease: its cost is known per request only")),
        (usage("token_bucket", r#", "shards": 2"#, r#"{"from": "body:u", "estimate": 5}"#), format!("{f}: a usage limit takes no shards: its settlement must reach the shard its request was charged on")),
        (usage("gcra", "", r#"{"from": "usage.total_tokens", "estimate": 5}"#), format!(r#"{f}.from: must be "openai", "anthropic", "body:PATH" (such as "body:usage.total_tokens"), "header:NAME", {{"header": NAME, "min": N, "max": N}}, "status:CODES" (such as "status:401,403") or a list of "body:PATH""#)),
        (usage("gcra", "", r#"{"from": 7, "estimate": 5}"#), format!(r#"{f}.from: must be "openai", "anthropic", "body:PATH" (such as "body:usage.total_tokens"), "header:NAME", {{"header": NAME, "min": N, "max": N}}, "status:CODES" (such as "status:401,403") or a list of "body:PATH""#)),
        (usage("gcra", "", r#"{"from": [], "estimate": 5}"#), format!("{f}.from: a list holds 1 to 8 body paths")),
        (usage("gcra", "", r#"{"from": ["body:a", "body:b", "body:c", "body:d", "body:e", "body:f", "body:g", "body:h", "body:i"], "estimate": 5}"#), format!("{f}.from: a list holds 1 to 8 body paths")),
        (usage("gcra", "", r#"{"from": ["body:a", "body:b", "header:x-used"], "estimate": 5}"#), format!(r#"{f}.from[2]: must be "body:PATH": a list holds body paths (a header or a format stands alone)"#)),
        (usage("gcra", "", r#"{"from": ["openai"], "estimate": 5}"#), format!(r#"{f}.from[0]: must be "body:PATH": a list holds body paths (a header or a format stands alone)"#)),
        (usage("gcra", "", r#"{"from": ["body:a", "body:a..b"], "estimate": 5}"#), format!("{f}.from[1]: each segment of a usage path (dot-separated) has 1 to 64 characters")),
        (usage("gcra", "", r#"{"from": "OpenAI", "estimate": 5}"#), format!(r#"{f}.from: must be "openai", "anthropic", "body:PATH" (such as "body:usage.total_tokens"), "header:NAME", {{"header": NAME, "min": N, "max": N}}, "status:CODES" (such as "status:401,403") or a list of "body:PATH""#)),
        (usage("gcra", "", r#"{"from": {"header": "x-cost", "min": 5, "max": 2}, "estimate": 5}"#), format!("{f}.from: needs min <= max <= 1000000000000")),
        (usage("gcra", "", r#"{"from": {"header": "x cost"}, "estimate": 5}"#), format!("{f}.from.header: must be a header name (letters, digits and !#$%&'*+-.^_`|~)")),
        (usage("gcra", "", r#"{"from": {"min": 1}, "estimate": 5}"#), format!("{f}.from: missing field `header`")),
        (usage("gcra", "", r#"{"from": {"header": 5}, "estimate": 5}"#), format!("{f}.from: invalid type: integer `5`, expected a string")),
        (usage("gcra", "", r#"{"from": {"header": "x-cost", "max": -1}, "estimate": 5}"#), format!("{f}.from: invalid value: integer `-1`, expected u64")),
        (usage("gcra", "", r#"{"from": {"header": "x-cost", "step": 1}, "estimate": 5}"#), format!("{f}.from: unknown field `step`, expected one of `header`, `min`, `max`")),
        (usage("gcra", "", r#"{"from": "anthropic", "estimate": 5, "include_usage": true}"#), format!(r#"{f}.include_usage: needs "from": "openai": the option is OpenAI's"#)),
        (usage("gcra", "", r#"{"from": "openai", "estimate": 5, "include_usage": true}"#), format!(r#"{f}.include_usage: needs an estimate from the request ({{"request": {{...}}}}): the option is added to the request body read for it"#)),
        (usage("gcra", "", r#"{"from": "openai", "estimate": {"request": {}}, "include_usage": 1}"#), format!(r#"{f}.include_usage: must be true, false or {{"streamed": "metadata:NAMESPACE:KEY", "asked": "metadata:NAMESPACE:KEY"}}"#)),
        (usage("gcra", "", r#"{"from": "openai", "estimate": {"request": {}}, "include_usage": {"asked": "metadata:ns:a"}}"#), format!("{f}.include_usage: missing field `streamed`")),
        (usage("gcra", "", r#"{"from": "openai", "estimate": {"request": {}}, "include_usage": {"streamed": "body:stream"}}"#), format!("{f}.include_usage.streamed: must be a metadata: source: it is read with the request headers, before the body, so a filter before this one (json_to_metadata) must have read the body")),
        (usage("gcra", "", r#"{"from": "openai", "estimate": {"request": {}}, "include_usage": {"streamed": "metadata:ns"}}"#), format!("{f}.include_usage.streamed: metadata needs a namespace and at least one key: metadata:NAMESPACE:KEY[:KEY…], e.g. metadata:envoy.filters.http.jwt_authn:jwt_payload:sub")),
        (usage("gcra", "", r#"{"from": "openai", "estimate": {"request": {}}, "include_usage": {"streamed": "metadata:ns:s", "when": 1}}"#), format!("{f}.include_usage: unknown field `when`, expected `streamed` or `asked`")),
        (usage("gcra", "", r#"{"from": "body:usage..total", "estimate": 5}"#), format!("{f}.from: each segment of a usage path (dot-separated) has 1 to 64 characters")),
        (usage("gcra", "", r#"{"from": "header:x usage", "estimate": 5}"#), format!("{f}.from: must be a header name (letters, digits and !#$%&'*+-.^_`|~)")),
        (usage("fixed_window", "", r#"{"from": "body:u"}"#), format!("{f}.estimate: is required")),
        (usage("token_bucket", "", r#"{"from": "status:401,4o3"}"#), format!(r#"{f}.from: status codes are whole numbers from 100 to 599, separated by commas: "4o3" is not one"#)),
        (usage("token_bucket", "", r#"{"from": "status:"}"#), format!(r#"{f}.from: status codes are whole numbers from 100 to 599, separated by commas: "" is not one"#)),
        (usage("token_bucket", "", r#"{"from": "status:99"}"#), format!(r#"{f}.from: status codes are whole numbers from 100 to 599, separated by commas: "99" is not one"#)),
        (usage("token_bucket", "", r#"{"from": "status:401,401"}"#), format!("{f}.from: lists status 401 twice")),
        (usage("token_bucket", "", r#"{"from": "status:400,401,402,403,404,405,406,407,408,409,410,411,412,413,414,415,416"}"#), format!("{f}.from: lists at most 16 status codes")),
        (usage("token_bucket", "", r#"{"from": "status:401", "estimate": 2}"#), format!("{f}.estimate: must be 1 or left out with a status source: a response of a listed status is charged 1, any other 0")),
        (body(r#""estimate": 0"#), format!("{f}.estimate: must be between 1 and 1000000000000")),
        (body(r#""estimate": "lots""#), format!(r#"{f}.estimate: must be a whole number, {{"header": NAME, "min": N, "max": N}} or {{"request": {{"completion_default": N, "max_body": SIZE}}}}"#)),
        (body(r#""estimate": {"header": "x-est", "min": 1}"#), format!("{f}.estimate: an estimate taken from a header needs both min and max")),
        (body(r#""estimate": {"header": "x-est", "min": 5, "max": 1, "default": 1}"#), format!("{f}.estimate: needs min <= max <= 1000000000000")),
        (body(r#""estimate": {"header": "x-est", "min": 1, "max": 5, "default": 9}"#), format!("{f}.estimate.default: must be between min and max")),
        (body(r#""estimate": {"request": {"max_body": "2GiB"}}"#), format!(r#"{f}.estimate.request.max_body: must be a size from 1B to 64MiB (such as "1MiB", "512KiB")"#)),
        (body(r#""estimate": {"request": {"completion_default": 1000000000001}}"#), format!("{f}.estimate.request.completion_default: must be at most 1000000000000")),
        (body(r#""estimate": {"request": {"prompt": 5}}"#), format!("{f}.estimate: unknown field `prompt`, expected `completion_default` or `max_body`")),
        (body(r#""admit": "later", "estimate": 5"#), format!("{f}.admit: unknown variant `later`, expected `reserve` or `after`")),
        (body(r#""estimate": 5, "read": 1"#), format!("{f}.read: unknown field `read`, expected one of `from`, `admit`, `estimate`, `include_usage`, `weights`")),
        (usage("gcra", "", r#"{"from": "body:u", "estimate": 5, "weights": {"input": 1}}"#), format!(r#"{f}.weights: needs "from": "openai" or "anthropic": a named format reads the kinds of tokens apart"#)),
        (usage("gcra", "", r#"{"from": "openai", "estimate": 5, "weights": [1, 4]}"#), format!(r#"{f}.weights: must be an object such as {{"input": 1, "output": 4, "cached_input": 0.5}}"#)),
        (usage("gcra", "", r#"{"from": "openai", "estimate": 5, "weights": {"cache_write": 1}}"#), format!("{f}.weights.cache_write: is not a weight of openai: input, output, cached_input")),
        (usage("gcra", "", r#"{"from": "openai", "estimate": 5, "weights": {"output": 0.0001}}"#), format!("{f}.weights.output: must be a number from 0 to 1000 with at most 3 decimals")),
        (usage("gcra", "", r#"{"from": "anthropic", "estimate": 5, "weights": {"input": -1}}"#), format!("{f}.weights.input: must be a number from 0 to 1000 with at most 3 decimals")),
        (usage("gcra", "", r#"{"from": "anthropic", "estimate": 5, "weights": {"input": 1001}}"#), format!("{f}.weights.input: must be a number from 0 to 1000 with at most 3 decimals")),
        (usage("gcra", "", r#"{"from": "anthropic", "estimate": 5, "weights": {"input": "2"}}"#), format!("{f}.weights.input: must be a number from 0 to 1000 with at most 3 decimals")),
    ];
    for (json, want) in cases {
        assert_eq!(
            fixtures::parse(&json).map(|_| ()),
            Err(want.clone()),
            "{json}"
        );
    }
}
