//! The bounds a configuration must keep, each derived from what Redis, the Lua scripts and
//! Webdis represent exactly, and the analysis behind the bounds that are about one request.
//!
//! Why bounds at all: a value that parses is not a value the chain can carry. Redis 7.0
//! formats a Lua number passed to `redis.call` with `%.17g`, so from 1e17 on `PEXPIRE` gets
//! `1e+17` and fails with `ERR value is not an integer` on every decision; above 2^53 ≈ 9e15
//! integers are no longer exact in a double; Lua's `tostring` (the script's replies) switches to
//! exponent form from 1e14. And Webdis refuses requests larger than its `http_max_request_size`.

use std::time::Duration;

use crate::config::WhenMissing;
use crate::config::{Algorithm, Config, ConfigError, Cost, Limit, Match, PathMatch, Rule};
use crate::encode::path_segment;
use crate::identity::MAX_READABLE_IDENTITY;

const DAY: u64 = 86_400;

/// Size of the filter's JSON configuration, checked before parsing: every worker VM parses
/// and validates it. A thousand rules of a few limits each take a few hundred KiB.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;
/// Rules in a configuration: each request walks them all, and validation compares every pair.
pub const MAX_RULES: usize = 1_000;
/// Limits in one rule (per second, minute, hour, day, month … fit many times over).
pub const MAX_LIMITS_PER_RULE: usize = 16;
/// Length of one `key.from` entry: it is the label written into every key of the rule.
pub const MAX_KEY_SOURCE_BYTES: usize = 128;
/// Length of `bridge.authority`, `bridge.username` and `bridge.password`: they go into every
/// call's headers, which share Webdis's request size with the path.
pub const MAX_BRIDGE_FIELD_BYTES: usize = 255;

/// Longest `window`: a year, leap years included. 31,622,400,000 ms, far inside the range
/// where doubles hold integers exactly.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * DAY);
/// Longest time a limit's state may live (the `PEXPIRE` the scripts set, less its 60 s
/// margin): burst / limit × window for token_bucket and gcra, 2 × window for
/// sliding_window_counter, window for the others. Twice `MAX_WINDOW`, what
/// sliding_window_counter needs at the longest window. The largest `PEXPIRE` argument is then
/// about 63,244,860,000 (the script's division in doubles may round it up by 1 ms): an exact
/// integer (< 2^53) that Redis writes without exponent (< 1e17) and Lua's `tostring` too
/// (< 1e14), so replies carry it exactly as well.
pub const MAX_STATE_LIFETIME: Duration = Duration::from_secs(2 * 366 * DAY);
/// Largest `limit` and `burst`. The scripts count in doubles: token counts, their sums with a
/// cost (≤ 1,000,000) and refills stay exact integers (< 2^53) with about 1/8000 of a unit to
/// spare for fractions, and `tostring` writes them without exponent (< 1e14).
pub const MAX_LIMIT: u64 = 1_000_000_000_000;
/// Largest `limit` of a `sliding_window_log`: its memory is one sorted-set entry per unit of
/// cost in the window. Measured on Redis 7.0: a full key of 10,000 entries takes about 1.5 MB,
/// and a request of cost 10,000 runs 10,000 `ZADD`s in one script, about 25 ms of Redis.
pub const MAX_LOG_LIMIT: u64 = 10_000;

/// Limits one request can carry (all its matching rules together): one script call decides
/// them, six arguments each, and the response headers list them.
pub const MAX_LIMITS_PER_REQUEST: usize = 64;
/// Bytes of one request's bridge call path (`/EVALSHA/…`, every argument percent-encoded).
/// Webdis refuses a request larger than `http_max_request_size` (65,536 in envoy/webdis.json;
/// requests of up to that size were always accepted there); this leaves 16 KiB for the request
/// line, `Host`, `Authorization` and the headers Envoy adds (142 bytes measured with the
/// shipped config, about 1.1 KiB with the fields above at their bounds).
pub const MAX_CALL_PATH_BYTES: usize = 48 * 1024;
/// Digits of the clock argument: Unix time in ns has 19 digits until the year 2286.
const MAX_CLOCK_DIGITS: usize = 20;

/// A duration as the config writes it (`366d`, `90m`, `150ms`).
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, per) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= per && ms.is_multiple_of(per) {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

/// How long a limit's state lives at most, in ms (the scripts' `PEXPIRE` less its margin).
pub fn state_lifetime_ms(algorithm: Algorithm, limit: u64, window: Duration, burst: u64) -> u128 {
    let window = window.as_millis();
    match algorithm {
        // Full again once burst tokens came back at limit per window; GCRA's TAT is at most
        // burst intervals of window / limit ahead.
        Algorithm::TokenBucket | Algorithm::Gcra => {
            (u128::from(burst) * window).div_ceil(u128::from(limit.max(1)))
        }
        Algorithm::SlidingWindowCounter => 2 * window,
        Algorithm::FixedWindow | Algorithm::SlidingWindowLog => window,
    }
}

/// Whether one request can match both rules: false only when their matches provably exclude
/// each other. Sound because a request has one path, one method, and (repeats being refused)
/// at most one value of a header a rule matches on.
pub fn may_overlap(a: &Match, b: &Match) -> bool {
    let paths_meet = match (&a.path, &b.path) {
        (Some(PathMatch::Exact(x)), Some(PathMatch::Exact(y))) => x == y,
        (Some(PathMatch::Exact(x)), Some(PathMatch::Prefix(p)))
        | (Some(PathMatch::Prefix(p)), Some(PathMatch::Exact(x))) => x.starts_with(p.as_str()),
        (Some(PathMatch::Prefix(p)), Some(PathMatch::Prefix(q))) => {
            p.starts_with(q.as_str()) || q.starts_with(p.as_str())
        }
        _ => true,
    };
    let methods_meet = a.methods.is_empty()
        || b.methods.is_empty()
        || a.methods.iter().any(|m| b.methods.contains(m));
    let headers_meet = match (&a.header, &b.header) {
        (Some(x), Some(y)) if x.name == y.name => match (&x.value, &y.value) {
            (Some(v), Some(w)) => v == w,
            _ => true,
        },
        _ => true,
    };
    paths_meet && methods_meet && headers_meet
}

fn digits(n: u64) -> usize {
    n.to_string().len()
}

/// The most bytes one limit of `rule` adds to the call path: `/` and its percent-encoded key
/// (`prefix{label:digest}:rule:limit` or `prefix{label=identity}:rule:limit`, see
/// `identity::redis_key`), then `/` and each of its seven arguments (`bridge::DecideCall`:
/// the key's index, then six).
fn limit_call_bytes(config: &Config, rule: &Rule, limit: &Limit) -> usize {
    let encoded = |text: &str| path_segment(text.as_bytes()).len();
    let mut label = rule
        .key
        .alternatives
        .iter()
        .map(|a| encoded(&a.label))
        .max()
        .unwrap_or(0);
    if rule.key.when_missing == WhenMissing::Anonymous {
        label = label.max(encoded("anonymous"));
    }
    // A hex digest passes unencoded; a readable identity's bytes may each become `%XX`.
    let identity = if config.hash_identities {
        40
    } else {
        (3 * MAX_READABLE_IDENTITY).max(40)
    };
    // `{`, `:` or `=`, `}`, and the two `:` before the names are 3 bytes each once encoded.
    // A sharded limit's key has `#<shard>` in its tag (`#` encoded).
    let shard = if limit.shards > 1 {
        3 + digits(limit.shards - 1)
    } else {
        0
    };
    let key = encoded(&config.key_prefix)
        + 5 * 3
        + label
        + identity
        + shard
        + encoded(&rule.name)
        + encoded(&limit.name);
    let max_cost = match &rule.cost {
        Cost::Fixed(n) => *n,
        Cost::Header { max, .. } => *max,
    };
    let window_ms = u64::try_from(limit.window.as_millis()).unwrap_or(u64::MAX);
    let mode = if rule.shadow { "shadow" } else { "enforce" };
    // The budget and overflow key indexes ("0" without a budget). With a budget: the overflow
    // key (`prefix{overflow}:rule:limit`) and, counted with every limit as if each brought its
    // own, the budget's counter key (`prefix{key_budget}:rule`) and its four arguments.
    let key_index = digits(3 * MAX_LIMITS_PER_REQUEST as u64);
    let budget = match &rule.key_budget {
        None => 2 * 2,
        Some(b) => {
            // With a Redis Cluster the keys carry a slot's tag: count the longest.
            let slot_tag = config.budget_slot_tags.0.iter().copied().max();
            let overflow = encoded(&crate::identity::overflow_key(
                config, rule, limit, slot_tag,
            ));
            let counter = encoded(&crate::identity::budget_counter_key(config, rule, slot_tag));
            let window = match slot_tag {
                Some(_) => crate::config::cluster_budget(b).1,
                None => b.window,
            };
            let budget_window = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
            2 * (1 + key_index)
                + 1
                + overflow
                + 1
                + counter
                + 1
                + key_index
                + 1
                + digits(b.new_keys)
                + 1
                + digits(budget_window)
                + 1
                + "shared".len()
        }
    };
    budget
        + 1
        + key
        + 1
        + key_index
        + 1
        + limit.algorithm.name().len()
        + 1
        + digits(limit.limit)
        + 1
        + digits(window_ms)
        + 1
        + digits(limit.burst)
        + 1
        + digits(max_cost)
        + 1
        + mode.len()
}

/// The most bytes of the call path of one request carrying `limits` limits of `limit_bytes`
/// bytes in all: `/EVALSHA/<sha>/<keys>` + keys + `/<clock>/<deadline>/1/<budgets>/<n>` +
/// arguments (a request has at most one budget per limit, and three keys per limit).
fn call_path_bytes(limits: usize, limit_bytes: usize) -> usize {
    let n = digits(limits as u64);
    let keys = digits(3 * limits as u64);
    "/EVALSHA/".len()
        + 40
        + 1
        + keys
        + limit_bytes
        + 1
        + 2 * MAX_CLOCK_DIGITS
        + 1
        + 2
        + 1
        + n
        + 1
        + n
}

/// Checks the bounds about one request. For each rule R, the limits of R and of every rule
/// that may overlap it bound what a request matching R can carry (every rule such a request
/// matches overlaps R); the largest over all rules must fit. Summing all rules instead would
/// refuse many rules on disjoint routes.
pub fn check_request_bounds(config: &Config) -> Result<(), ConfigError> {
    let per_rule: Vec<(usize, usize)> = config
        .rules
        .iter()
        .map(|rule| {
            let bytes = rule
                .limits
                .iter()
                .map(|l| limit_call_bytes(config, rule, l))
                .sum();
            (rule.limits.len(), bytes)
        })
        .collect();
    for (i, rule) in config.rules.iter().enumerate() {
        let (mut limits, mut bytes) = (0, 0);
        for (other, &(l, b)) in config.rules.iter().zip(&per_rule) {
            if may_overlap(&rule.matcher, &other.matcher) {
                limits += l;
                bytes += b;
            }
        }
        let field = format!("rules[{i}]");
        if limits > MAX_LIMITS_PER_REQUEST {
            return Err(ConfigError {
                field,
                message: format!(
                    "a request it matches can carry {limits} limits (its own and those of every rule whose match does not exclude it): must be at most {MAX_LIMITS_PER_REQUEST}"
                ),
            });
        }
        let path = call_path_bytes(limits, bytes);
        if path > MAX_CALL_PATH_BYTES {
            return Err(ConfigError {
                field,
                message: format!(
                    "a request it matches can need a bridge call of {path} bytes (its limits and those of every rule whose match does not exclude it, with the longest identity): must be at most {MAX_CALL_PATH_BYTES}"
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::{BridgeRequest, DecideCall};
    use crate::config::MAX_COST;
    use crate::identity::tests::FakeRequest;
    use crate::plan::plan;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn parse(json: &str) -> Result<Config, String> {
        Config::parse(json.as_bytes()).map_err(|e| e.to_string())
    }

    fn limit_json(name: &str, fields: &str) -> String {
        format!(r#"{{"name": "{name}", {fields}}}"#)
    }

    fn rule_json(name: &str, matcher: &str, limits: &[String]) -> String {
        format!(
            r#"{{"name": "{name}", "match": {{{matcher}}}, "limits": [{}]}}"#,
            limits.join(", ")
        )
    }

    fn config_json(extra: &str, rules: &[String]) -> String {
        format!(r#"{{{extra} "rules": [{}]}}"#, rules.join(", "))
    }

    /// `n` plain limits named l0, l1, …
    fn limits(n: usize) -> Vec<String> {
        (0..n)
            .map(|j| limit_json(&format!("l{j}"), r#""limit": 1, "window": "1s""#))
            .collect()
    }

    fn one_limit(fields: &str) -> String {
        config_json("", &[rule_json("r", "", &[limit_json("l", fields)])])
    }

    #[test]
    fn the_largest_values_are_accepted() {
        let max = MAX_LIMIT;
        for fields in [
            format!(r#""limit": {max}, "window": "366d", "burst": {max}"#),
            r#""limit": 1, "window": "366d", "burst": 2"#.to_string(),
            r#""limit": 1, "window": "183d", "burst": 4"#.to_string(),
            format!(r#""algorithm": "gcra", "limit": {max}, "window": "366d", "burst": {max}"#),
            r#""algorithm": "gcra", "limit": 1, "window": "366d", "burst": 2"#.to_string(),
            format!(r#""algorithm": "sliding_window_counter", "limit": {max}, "window": "366d""#),
            format!(r#""algorithm": "fixed_window", "limit": {max}, "window": "366d""#),
            format!(
                r#""algorithm": "sliding_window_log", "limit": {MAX_LOG_LIMIT}, "window": "366d""#
            ),
        ] {
            assert!(parse(&one_limit(&fields)).is_ok(), "{fields}");
        }
    }

    /// One fixture per bound, with the exact message the operator sees.
    #[test]
    fn each_bound_names_the_field() {
        let max = MAX_LIMIT;
        let over = max + 1;
        // 24 bytes of JSON around the padding: one byte too many in all.
        let big = "x".repeat(MAX_CONFIG_BYTES + 1 - 24);
        let max_source = format!("header:{}", "k".repeat(MAX_KEY_SOURCE_BYTES - 7));
        let long_source = format!("{max_source}k");
        let long_field = "a".repeat(MAX_BRIDGE_FIELD_BYTES + 1);
        let rules = |n: usize| -> Vec<String> {
            (0..n)
                .map(|i| rule_json(&format!("r{i}"), "", &limits(1)))
                .collect()
        };
        let cases: Vec<(String, &str)> = vec![
            (
                format!(r#"{{"rules": [], "pad": "{big}"}}"#),
                "the configuration is 1048577 bytes: must be at most 1048576",
            ),
            (
                config_json("", &rules(MAX_RULES + 1)),
                "rules: must hold at most 1000 rules",
            ),
            (
                config_json("", &[rule_json("r", "", &limits(MAX_LIMITS_PER_RULE + 1))]),
                "rules[0].limits: must hold at most 16 limits",
            ),
            (
                one_limit(&format!(r#""limit": {over}, "window": "1s""#)),
                "rules[0].limits[0].limit: must be at most 1000000000000",
            ),
            (
                one_limit(&format!(r#""limit": 1, "window": "1s", "burst": {over}"#)),
                "rules[0].limits[0].burst: must be at most 1000000000000",
            ),
            (
                one_limit(r#""algorithm": "sliding_window_log", "limit": 10001, "window": "1s""#),
                "rules[0].limits[0].limit: sliding_window_log keeps one entry per unit: must be at most 10000",
            ),
            (
                one_limit(r#""limit": 1, "window": "99999999999d""#),
                "rules[0].limits[0].window: must be at most 366d",
            ),
            (
                one_limit(r#""limit": 1, "window": "8785h""#),
                "rules[0].limits[0].window: must be at most 366d",
            ),
            (
                one_limit(r#""limit": 1, "window": "366d", "burst": 3"#),
                "rules[0].limits[0].burst: the state would live burst / limit × window, longer than 732d: lower burst or window",
            ),
            (
                one_limit(&format!(
                    r#""algorithm": "gcra", "limit": 1000, "window": "1d", "burst": {max}"#
                )),
                "rules[0].limits[0].burst: the state would live burst / limit × window, longer than 732d: lower burst or window",
            ),
            (
                format!(
                    r#"{{"rules": [{{"name": "r", "key": {{"from": ["client_ip", "{long_source}"]}}, "limits": [{}]}}]}}"#,
                    limits(1)[0]
                ),
                "rules[0].key.from[1]: must be at most 128 characters",
            ),
            (
                config_json(
                    &format!(r#""bridge": {{"authority": "{long_field}"}},"#),
                    &rules(1),
                ),
                "bridge.authority: must be at most 255 bytes",
            ),
            (
                config_json(
                    &format!(r#""bridge": {{"username": "{long_field}", "password": "p"}},"#),
                    &rules(1),
                ),
                "bridge.username: must be at most 255 bytes",
            ),
            (
                config_json(
                    &format!(r#""bridge": {{"username": "u", "password": "{long_field}"}},"#),
                    &rules(1),
                ),
                "bridge.password: must be at most 255 bytes",
            ),
            (
                config_json(
                    "",
                    &(0..5)
                        .map(|i| rule_json(&format!("r{i}"), "", &limits(13)))
                        .collect::<Vec<_>>(),
                ),
                "rules[0]: a request it matches can carry 65 limits (its own and those of every rule whose match does not exclude it): must be at most 64",
            ),
            (
                // Every byte of a 64-byte prefix percent-encoded, on top of the longest names.
                config_json(
                    &format!(r#""hash_identities": false, "key_prefix": "{}","#, "!".repeat(64)),
                    &(0..4)
                        .map(|i| {
                            let name = format!("{i}{}", "r".repeat(63));
                            let limits: Vec<String> = (0..16)
                                .map(|j| {
                                    limit_json(
                                        &format!("{j:02}{}", "l".repeat(62)),
                                        r#""limit": 1, "window": "1s""#,
                                    )
                                })
                                .collect();
                            format!(
                                r#"{{"name": "{name}", "key": {{"from": ["{max_source}"]}}, "limits": [{}]}}"#,
                                limits.join(", ")
                            )
                        })
                        .collect::<Vec<_>>(),
                ),
                "rules[0]: a request it matches can need a bridge call of 57063 bytes (its limits and those of every rule whose match does not exclude it, with the longest identity): must be at most 49152",
            ),
        ];
        for (json, want) in cases {
            assert_eq!(
                parse(&json).unwrap_err(),
                want,
                "{}",
                &json[..json.len().min(300)]
            );
        }
    }

    #[test]
    fn only_rules_whose_matches_may_meet_add_up() {
        // 200 disjoint routes with 2 limits each: any request carries at most 2.
        let routes: Vec<String> = (0..200)
            .map(|i| {
                rule_json(
                    &format!("r{i}"),
                    &format!(r#""path_exact": "/r{i}""#),
                    &limits(2),
                )
            })
            .collect();
        assert!(parse(&config_json("", &routes)).is_ok());
        // Excluded by path, method or header value: 5 × 16 limits, never more than 16 at once.
        for matchers in [
            [
                r#""path_exact": "/a""#,
                r#""path_exact": "/b""#,
                r#""path_prefix": "/c/""#,
                r#""path_prefix": "/d/""#,
                r#""path_exact": "/e/x""#,
            ],
            [
                r#""methods": ["GET"]"#,
                r#""methods": ["POST", "PUT"]"#,
                r#""methods": ["DELETE"]"#,
                r#""methods": ["PATCH"]"#,
                r#""methods": ["HEAD"]"#,
            ],
            [
                r#""header": {"name": "x-tier", "value": "a"}"#,
                r#""header": {"name": "x-tier", "value": "b"}"#,
                r#""header": {"name": "x-tier", "value": "c"}"#,
                r#""header": {"name": "x-tier", "value": "d"}"#,
                r#""header": {"name": "x-tier", "value": "e"}"#,
            ],
        ] {
            let rules: Vec<String> = matchers
                .iter()
                .enumerate()
                .map(|(i, m)| rule_json(&format!("r{i}"), m, &limits(16)))
                .collect();
            assert!(parse(&config_json("", &rules)).is_ok(), "{matchers:?}");
        }
        // Whatever may meet counts: a prefix and a path under it, nested prefixes, a method
        // list sharing one method, a header present vs a value, different headers.
        for (a, b) in [
            (r#""path_prefix": "/api/""#, r#""path_exact": "/api/x""#),
            (r#""path_prefix": "/api/""#, r#""path_prefix": "/api/v1/""#),
            (r#""methods": ["GET", "POST"]"#, r#""methods": ["POST"]"#),
            (
                r#""header": {"name": "x-tier"}"#,
                r#""header": {"name": "x-tier", "value": "a"}"#,
            ),
            (
                r#""header": {"name": "x-a", "value": "1"}"#,
                r#""header": {"name": "x-b", "value": "2"}"#,
            ),
            (r#""path_exact": "/a""#, r#""methods": ["GET"]"#),
        ] {
            let rules = [
                rule_json("a", a, &limits(16)),
                rule_json("b", b, &limits(16)),
                rule_json("c", "", &limits(16)),
                rule_json("d", "", &limits(16)),
                rule_json("e", "", &limits(1)),
            ];
            assert_eq!(
                parse(&config_json("", &rules)).unwrap_err(),
                "rules[0]: a request it matches can carry 65 limits (its own and those of every rule whose match does not exclude it): must be at most 64",
                "{a} / {b}"
            );
        }
    }

    #[test]
    fn overlap_is_symmetric_and_reflexive() {
        let c = parse(&config_json(
            "",
            &[
                rule_json("a", r#""path_prefix": "/api/""#, &limits(1)),
                rule_json(
                    "b",
                    r#""path_exact": "/api/x", "methods": ["GET"]"#,
                    &limits(1),
                ),
                rule_json("c", r#""path_exact": "/other""#, &limits(1)),
                rule_json(
                    "d",
                    r#""header": {"name": "x-t", "value": "1"}"#,
                    &limits(1),
                ),
                rule_json("e", "", &limits(1)),
            ],
        ))
        .unwrap();
        for a in &c.rules {
            assert!(may_overlap(&a.matcher, &a.matcher), "{}", a.name);
            for b in &c.rules {
                assert_eq!(
                    may_overlap(&a.matcher, &b.matcher),
                    may_overlap(&b.matcher, &a.matcher),
                    "{} / {}",
                    a.name,
                    b.name
                );
            }
        }
        assert!(!may_overlap(&c.rules[0].matcher, &c.rules[2].matcher));
        assert!(may_overlap(&c.rules[0].matcher, &c.rules[1].matcher));
    }

    /// The bound on the call's size is the size of the real call at its worst: the most limits
    /// a request can carry, the longest names and label, a readable identity whose every byte
    /// is percent-encoded, the longest numbers, and a 20-digit clock.
    #[test]
    fn the_call_size_bound_is_exact_for_the_worst_request() {
        let label = format!("header:x-{}", "k".repeat(MAX_KEY_SOURCE_BYTES - 9));
        let rules: Vec<String> = (0..4)
            .map(|i| {
                let limits: Vec<String> = (0..16)
                    .map(|j| {
                        let algorithm = ["token_bucket", "gcra", "fixed_window", "sliding_window_counter"][j % 4];
                        limit_json(
                            &format!("{j:02}{}", "l".repeat(62)),
                            &format!(r#""algorithm": "{algorithm}", "limit": {MAX_LIMIT}, "window": "366d""#),
                        )
                    })
                    .collect();
                format!(
                    r#"{{"name": "{i}{}", "key": {{"from": ["{label}"], "when_missing": "skip"}}, "cost": {MAX_COST}, "limits": [{}]}}"#,
                    "r".repeat(63),
                    limits.join(", ")
                )
            })
            .collect();
        let c = parse(&config_json(r#""hash_identities": false,"#, &rules)).unwrap();
        let identity = "!".repeat(MAX_READABLE_IDENTITY);
        let request = FakeRequest::new("GET", "/").with(&label[7..], identity.as_bytes());
        let p = plan(&c, &request).unwrap();
        assert_eq!(p.checks.len(), MAX_LIMITS_PER_REQUEST);
        assert!(p.checks[0].key.contains(&format!("={identity}}}")));
        let call = BridgeRequest::evalsha(
            &c.script_sha,
            &DecideCall::new(
                &"9".repeat(MAX_CLOCK_DIGITS),
                u128::from(u64::MAX),
                [&p.checks[..]],
            ),
        );
        let per_rule: usize = c.rules[0]
            .limits
            .iter()
            .map(|l| limit_call_bytes(&c, &c.rules[0], l))
            .sum();
        // Exact but for the key indexes (1 to 64 here) and the key count, counted with three
        // digits (with key budgets a request can have three keys per limit), and the budget
        // count (0 here), counted with as many digits as the limits.
        assert_eq!(call.path.len() + 75, call_path_bytes(64, 4 * per_rule));
        assert!(
            call.path.len() <= MAX_CALL_PATH_BYTES,
            "{}",
            call.path.len()
        );
    }

    /// With key budgets each limit also carries an overflow key and a counter: the bound still
    /// covers the real call, and a config whose worst request would not fit is refused.
    #[test]
    fn the_call_size_bound_covers_key_budgets() {
        let budgeted = |rules: usize| {
            let rules: Vec<String> = (0..rules)
                .map(|i| {
                    let limits: Vec<String> = (0..16)
                        .map(|j| {
                            limit_json(
                                &format!("{j:02}{}", "l".repeat(62)),
                                &format!(r#""limit": {MAX_LIMIT}, "window": "366d""#),
                            )
                        })
                        .collect();
                    format!(
                        r#"{{"name": "{i}{}", "key": {{"from": ["header:x-k"]}}, "key_budget": {{"new_keys": {MAX_LIMIT}, "window": "366d", "over_budget": "shared"}}, "limits": [{}]}}"#,
                        "r".repeat(63),
                        limits.join(", ")
                    )
                })
                .collect();
            config_json(
                r#""key_prefix": "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!","#,
                &rules,
            )
        };
        let c = parse(&budgeted(2)).unwrap();
        let request = FakeRequest::new("GET", "/").with("x-k", b"client");
        let p = plan(&c, &request).unwrap();
        assert_eq!(p.checks.len(), 32);
        let call = BridgeRequest::evalsha(
            &c.script_sha,
            &DecideCall::new(
                &"9".repeat(MAX_CLOCK_DIGITS),
                u128::from(u64::MAX),
                [&p.checks[..]],
            ),
        );
        let bound: usize = c
            .rules
            .iter()
            .flat_map(|r| {
                r.limits
                    .iter()
                    .map(|l| limit_call_bytes(&c, r, l))
                    .collect::<Vec<_>>()
            })
            .sum();
        assert!(call.path.len() <= call_path_bytes(32, bound));
        assert!(
            call.path.len() > call_path_bytes(32, bound) * 3 / 4,
            "not far off"
        );
        let refused = parse(&budgeted(4)).unwrap_err();
        assert!(
            refused.starts_with("rules[0]: a request it matches can need a bridge call of"),
            "{refused}"
        );
    }

    /// In cluster mode the budget's keys carry a slot's tag (`{b<n>}`): the bound counts the
    /// longest, so it still covers the real call.
    #[test]
    fn the_call_size_bound_covers_key_budgets_per_slot() {
        let limits: Vec<String> = (0..16)
            .map(|j| {
                limit_json(
                    &format!("{j:02}{}", "l".repeat(62)),
                    r#""limit": 1000, "window": "1s""#,
                )
            })
            .collect();
        let rule = format!(
            r#"{{"name": "{}", "key": {{"from": ["header:x-k"]}}, "key_budget": {{"new_keys": 1000000, "window": "1h"}}, "limits": [{}]}}"#,
            "r".repeat(64),
            limits.join(", ")
        );
        let c = parse(&config_json(
            r#""bridge": {"redis_cluster": true},"#,
            &[rule],
        ))
        .unwrap();
        let bound: usize = c.rules[0]
            .limits
            .iter()
            .map(|l| limit_call_bytes(&c, &c.rules[0], l))
            .sum();
        for id in ["a", "client-7", "some-longer-api-key"] {
            let request = FakeRequest::new("GET", "/").with("x-k", id.as_bytes());
            let p = plan(&c, &request).unwrap();
            assert!(p.checks[0]
                .budget
                .as_ref()
                .unwrap()
                .counter_key
                .contains("}:key_budget:"));
            let call = BridgeRequest::evalsha(
                &c.script_sha,
                &DecideCall::new(
                    &"9".repeat(MAX_CLOCK_DIGITS),
                    u128::from(u64::MAX),
                    [&p.checks[..]],
                ),
            );
            assert!(call.path.len() <= call_path_bytes(16, bound), "{id}");
        }
    }

    #[test]
    fn lifetimes_and_durations() {
        let year = MAX_WINDOW;
        assert_eq!(
            state_lifetime_ms(Algorithm::TokenBucket, 1, year, 2),
            2 * year.as_millis()
        );
        assert_eq!(
            state_lifetime_ms(Algorithm::Gcra, 3, Duration::from_millis(10), 1),
            4
        );
        assert_eq!(
            state_lifetime_ms(Algorithm::SlidingWindowCounter, 5, year, 5),
            2 * year.as_millis()
        );
        assert_eq!(
            state_lifetime_ms(Algorithm::FixedWindow, 5, year, 5),
            year.as_millis()
        );
        // The largest PEXPIRE argument (lifetime + 60 s) stays an exact integer Redis and Lua
        // write without exponent.
        let pexpire = MAX_STATE_LIFETIME.as_millis() + 60_000;
        assert_eq!(pexpire, 63_244_860_000);
        assert!(pexpire < 100_000_000_000_000);
        assert_eq!(show_duration(MAX_WINDOW), "366d");
        assert_eq!(show_duration(MAX_STATE_LIFETIME), "732d");
        assert_eq!(show_duration(Duration::from_millis(90_000)), "90s");
        assert_eq!(show_duration(Duration::from_millis(1_500)), "1500ms");
    }
}
