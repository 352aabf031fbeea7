//! The bounds about one request: how many limits it can carry and how large its bridge call
//! can be at its worst, counted with the bridge's own size model ([`CallSize`]).

use crate::bounds::{MAX_CALL_PATH_BYTES, MAX_LIMITS_PER_REQUEST};
use crate::bridge::wire::LONGEST_MEMBER;
use crate::bridge::{BudgetShape, CallSize, LimitShape, WireMode};
use crate::config::{
    cluster_budget, may_overlap, Admit, Algorithm, Config, ConfigError, Cost, Limit, Rule,
    WhenMissing, MAX_USAGE,
};
use crate::encode::path_segment_len;
use crate::request::keys::{
    budget_counter_key, overflow_key, redis_key, shard_key, MAX_READABLE_IDENTITY,
};

/// The call of one request at its worst: the most limits, each with its key and a key
/// budget's counter and overflow keys, each with a budget of its own.
fn one_request_call() -> CallSize {
    CallSize::new(3 * MAX_LIMITS_PER_REQUEST, 1, MAX_LIMITS_PER_REQUEST)
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The most bytes one limit of `rule` adds to `call`, sent either way it can go (decided, or
/// asking for a lease): its key made by the filter's own key function from the longest label
/// and the longest identity (a readable one whose every byte is percent-encoded, or a digest),
/// on its last shard; its largest numbers; and its key budget's keys on the slot with the
/// longest tag.
fn limit_bytes(call: CallSize, config: &Config, rule: &Rule, limit: &Limit) -> usize {
    let anonymous = (rule.key.when_missing == WhenMissing::Anonymous).then_some("anonymous");
    let label = rule
        .key
        .alternatives
        .iter()
        .map(|a| a.label.as_str())
        .chain(anonymous)
        .max_by_key(|l| path_segment_len(l.as_bytes()))
        .unwrap_or_default();
    // Printable and not a brace: readable when identities are, 3 bytes each once encoded.
    let identity = [b'!'; MAX_READABLE_IDENTITY];
    let mut key = redis_key(config, rule, limit, label, &identity);
    if limit.shards > 1 {
        key = shard_key(&key, limit.shards - 1);
    }
    let slot_tag = config.budget_slot_tags.0.iter().copied().max();
    let budget_keys = rule.key_budget.as_ref().map(|_| {
        (
            budget_counter_key(config, rule, slot_tag),
            overflow_key(config, rule, limit, slot_tag),
        )
    });
    let budget = rule.key_budget.as_ref().zip(budget_keys.as_ref()).map(
        |(b, (counter_key, overflow_key))| {
            let (new_keys, window) = match slot_tag {
                Some(_) => cluster_budget(b),
                None => (b.new_keys, b.window),
            };
            BudgetShape {
                counter_key,
                overflow_key,
                new_keys,
                window_ms: millis(window),
                over_budget: b.over_budget,
            }
        },
    );
    let decided = LimitShape {
        key: &key,
        algorithm: limit.algorithm,
        per_window: limit.limit,
        window: limit.window,
        burst: limit.burst,
        cost: match (&limit.usage, &rule.cost) {
            (Some(usage), _) => usage.estimate.max(),
            (None, Cost::Fixed(n)) => *n,
            (None, Cost::Header { max, .. }) => *max,
        },
        mode: match &limit.usage {
            _ if limit.algorithm == Algorithm::Concurrency => WireMode::Hold {
                member: LONGEST_MEMBER,
            },
            Some(u) if u.admit == Admit::After => WireMode::After,
            _ if rule.shadow => WireMode::Shadow,
            _ => WireMode::Enforce,
        },
        budget,
        overrides: limit.overrides,
    };
    // A settlement of the limit: its delta at its largest, either sign, its cost sent as 0.
    let settled = limit.usage.as_ref().map_or(0, |_| {
        call.limit_bytes(&LimitShape {
            cost: 0,
            mode: WireMode::Settle {
                delta: -i64::try_from(MAX_USAGE.saturating_add(decided.cost)).unwrap_or(i64::MAX),
            },
            ..decided
        })
    });
    let leased = limit.lease.map_or(0, |lease| {
        call.limit_bytes(&LimitShape {
            mode: WireMode::Lease {
                units: lease.max_units,
                fraction: lease.fraction,
            },
            ..decided
        })
    });
    call.limit_bytes(&decided).max(leased).max(settled)
}

/// Checks the bounds about one request. For each rule R, the limits of R and of every rule
/// that may overlap it bound what a request matching R can carry (every rule such a request
/// matches overlaps R); the largest over all rules must fit. Summing all rules instead would
/// refuse many rules on disjoint routes.
pub fn check_request_bounds(config: &Config) -> Result<(), ConfigError> {
    let call = one_request_call();
    let per_rule: Vec<(usize, usize)> = config
        .rules
        .iter()
        .map(|rule| {
            let bytes = rule
                .limits
                .iter()
                .map(|l| limit_bytes(call, config, rule, l))
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
        let path = call.with_request(limits, bytes).bytes();
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
    use crate::bounds::{MAX_KEY_SOURCE_BYTES, MAX_LIMIT};
    use crate::bridge::{BridgeRequest, DecideCall, MAX_CLOCK_DIGITS};
    use crate::check::LimitCheck;
    use crate::config::fixtures::*;
    use crate::config::MAX_COST;
    use crate::request::plan::plan;
    use crate::testing::call::sent_in_mode;
    use crate::testing::request::FakeRequest;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The bound on one request of `limits` limits of `bytes` bytes in all.
    fn request_bytes(limits: usize, bytes: usize) -> usize {
        one_request_call().with_request(limits, bytes).bytes()
    }

    /// The call `checks` make with the longest clock and deadline, asking for a lease of
    /// `lease_asked` requests' worth (None: decided per request), through the script: its
    /// head (`/EVALSHA/` and a 40-digit hash) is the longer of the two ways to call.
    fn longest_call(_: &Config, checks: &[LimitCheck], lease_asked: Option<u64>) -> BridgeRequest {
        let clock = "9".repeat(MAX_CLOCK_DIGITS);
        let call = DecideCall::leasing(&clock, u128::from(u64::MAX), [(checks, lease_asked)]);
        crate::program::Program::new(crate::program::CallKind::Script).decide(&call)
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

    /// The bound on the call's size is the size of the real call at its worst: the most limits
    /// a request can carry, the longest names and label, a readable identity whose every byte
    /// is percent-encoded, the longest numbers, and a 20-digit clock.
    #[test]
    fn the_call_size_bound_is_exact_for_the_worst_request() {
        let label = format!("header:x-{}", "k".repeat(MAX_KEY_SOURCE_BYTES - 9));
        let rules: Vec<String> = (0..4)
            .map(|i| {
                // Each limit's number its own (one definition per limit in the call, as in
                // the worst case), all with as many digits.
                let limits = widest_limits(|j| {
let algorithm = ["token_bucket", "gcra", "fixed_window", "sliding_window_counter"][j % 4];
let limit = MAX_LIMIT - 1 - (16 * i + j) as u64;
format!(r#""algorithm": "{algorithm}", "limit": {limit}, "window": "366d""#)
});
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
        let call = longest_call(&c, &p.checks, None);
        let per_rule: usize = c.rules[0]
            .limits
            .iter()
            .map(|l| limit_bytes(one_request_call(), &c, &c.rules[0], l))
            .sum();
        // Exact but for the key and definition indexes (1 to 64 here) and the key and
        // definition counts, counted with three digits (with key budgets a request can have
        // three keys per limit), and the budget count (0 here), counted with as many digits
        // as the limits.
        assert_eq!(call.path.len() + 149, request_bytes(64, 4 * per_rule));
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
                    let limits = widest_limits(|j| {
                        let limit = MAX_LIMIT - 1 - (16 * i + j) as u64;
                        format!(r#""limit": {limit}, "window": "366d""#)
                    });
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
        let call = longest_call(&c, &p.checks, None);
        let bound: usize = c
            .rules
            .iter()
            .flat_map(|r| {
                r.limits
                    .iter()
                    .map(|l| limit_bytes(one_request_call(), &c, r, l))
                    .collect::<Vec<_>>()
            })
            .sum();
        assert!(call.path.len() <= request_bytes(32, bound));
        // The bound counts the budget's counter key and values with every limit that uses
        // it; the call sends them once.
        assert!(
            call.path.len() > request_bytes(32, bound) * 7 / 10,
            "not far off: {} of {}",
            call.path.len(),
            request_bytes(32, bound)
        );
        let refused = parse(&budgeted(4)).unwrap_err();
        assert!(
            refused.starts_with("rules[0]: a request it matches can need a bridge call of"),
            "{refused}"
        );
    }

    /// On a Redis Cluster the budget's keys carry a slot's tag (`{b<n>}`): the bound counts the
    /// longest, so it still covers the real call.
    #[test]
    fn the_call_size_bound_covers_key_budgets_per_slot() {
        let limits = widest_limits(|_| r#""limit": 1000, "window": "1s""#.to_string());
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
            .map(|l| limit_bytes(one_request_call(), &c, &c.rules[0], l))
            .sum();
        for id in ["a", "client-7", "some-longer-api-key"] {
            let request = FakeRequest::new("GET", "/").with("x-k", id.as_bytes());
            let p = plan(&c, &request).unwrap();
            assert!(p.checks[0]
                .mode
                .budget()
                .unwrap()
                .counter_key
                .contains("}:key_budget:"));
            let call = longest_call(&c, &p.checks, None);
            assert!(call.path.len() <= request_bytes(16, bound), "{id}");
        }
    }

    /// Every accepted config's worst leased call fits what Webdis accepts: a lease ask
    /// carries its units and fraction instead of the mode and budget indexes, and the fraction
    /// once went out as Rust writes it (never with an exponent: `5e-324` took ~330 bytes per
    /// limit) while neither size model counted lease mode.
    #[test]
    fn the_worst_leased_call_of_an_accepted_config_fits() {
        let label = format!("header:x-{}", "k".repeat(MAX_KEY_SOURCE_BYTES - 9));
        let leased = |prefix: usize, fraction: &str| {
            let rules: Vec<String> = (0..4)
                .map(|i| {
                    let limits = widest_limits(|j| {
                        let limit = MAX_LIMIT - 1 - (16 * i + j) as u64;
                        format!(r#""limit": {limit}, "window": "366d""#)
                    });
                    format!(
                        r#"{{"name": "{i}{}", "key": {{"from": ["{label}"], "when_missing": "skip"}}, "cost": {MAX_COST}, "limits": [{}]}}"#,
                        "r".repeat(63),
                        limits.join(", ")
                    )
                })
                .collect();
            config_json(
                &format!(
                    r#""hash_identities": false, "key_prefix": "{}", "lease": {{"max_units": {MAX_LIMIT}, "fraction": {fraction}}},"#,
                    "!".repeat(prefix)
                ),
                &rules,
            )
        };
        // The longest prefix (each byte is 3 in every key) whose config is accepted.
        let prefix = (0..=64)
            .rev()
            .find(|&p| parse(&leased(p, "0.000001")).is_ok())
            .expect("a config of 64 leased limits is accepted");
        let identity = "!".repeat(MAX_READABLE_IDENTITY);
        let request = FakeRequest::new("GET", "/").with(&label[7..], identity.as_bytes());
        let mut accepted = Vec::new();
        for fraction in ["1", "0.1", "0.000001", "0.123456", "1e-300", "5e-324"] {
            let Ok(c) = parse(&leased(prefix, fraction)) else {
                continue;
            };
            let p = plan(&c, &request).unwrap();
            assert_eq!(p.checks.len(), MAX_LIMITS_PER_REQUEST);
            let call = longest_call(&c, &p.checks, Some(u64::MAX));
            assert_eq!(
                sent_in_mode(&call.path, "lease").len(),
                MAX_LIMITS_PER_REQUEST
            );
            assert!(
                call.path.len() <= MAX_CALL_PATH_BYTES,
                "fraction {fraction}: a leased call of {} bytes",
                call.path.len()
            );
            accepted.push(fraction);
        }
        assert!(accepted.len() >= 4, "{accepted:?}");
    }

    /// A settlement carries a signed delta up to the largest usage where a decision carried
    /// its cost: the worst settlement call of an accepted usage config fits too.
    #[test]
    fn the_worst_settlement_call_of_an_accepted_usage_config_fits() {
        use crate::decision::Settlement;
        let label = format!("header:x-{}", "k".repeat(MAX_KEY_SOURCE_BYTES - 9));
        let metered = |prefix: usize| {
            let rules: Vec<String> = (0..4)
                .map(|i| {
                    let limits = widest_limits(|_| format!(
                        r#""limit": {MAX_LIMIT}, "window": "366d", "usage": {{"from": "body:usage.total_tokens", "estimate": {{"header": "x-est", "min": 1, "max": {MAX_USAGE}}}}}"#
                    ));
                    format!(
                        r#"{{"name": "{i}{}", "key": {{"from": ["{label}"], "when_missing": "skip"}}, "limits": [{}]}}"#,
                        "r".repeat(63),
                        limits.join(", ")
                    )
                })
                .collect();
            config_json(
                &format!(
                    r#""hash_identities": false, "key_prefix": "{}","#,
                    "!".repeat(prefix)
                ),
                &rules,
            )
        };
        let prefix = (0..=64)
            .rev()
            .find(|&p| parse(&metered(p)).is_ok())
            .expect("a config of 64 usage limits is accepted");
        let c = parse(&metered(prefix)).unwrap();
        let identity = "!".repeat(MAX_READABLE_IDENTITY);
        let request = FakeRequest::new("GET", "/")
            .with(&label[7..], identity.as_bytes())
            .with("x-est", MAX_USAGE.to_string().as_bytes());
        let p = plan(&c, &request).unwrap();
        assert_eq!(p.checks.len(), MAX_LIMITS_PER_REQUEST);
        for delta in [-(MAX_USAGE as i64), MAX_USAGE as i64] {
            let settlements: Vec<Settlement> = p
                .checks
                .iter()
                .map(|check| Settlement {
                    check: check.clone(),
                    delta,
                })
                .collect();
            let clock = 10u128.pow(MAX_CLOCK_DIGITS as u32) - 1;
            let call = DecideCall::settle(clock, clock, &settlements);
            let path = c.program.decide(&call).path;
            assert!(path.len() <= MAX_CALL_PATH_BYTES, "{} bytes", path.len());
            let size = CallSize::new(call.keys.len(), 1, 0).with_settlements(&settlements);
            assert!(
                path.len() <= size.bytes(),
                "{} > {}",
                path.len(),
                size.bytes()
            );
        }
    }
}
