//! The policy model end to end: rules, tiers decided in one call, every algorithm, client IPs
//! behind proxies, weighted cost, shadow mode, the headers, the clock, and the shipped
//! examples. Real Envoy, Webdis and Redis, each test with its own processes.

use std::time::Duration;

use e2e::http::request;
use e2e::procs::{filter_config_edit, validate_config, WorkDir};
use e2e::sf::{parse_list, Item};
use e2e::{
    clear_of_window_end, get, root, wait_for, wait_until, Envoy, Redis, Response, Stack, Webdis,
    DAY, HOUR, TEST_SPAN,
};

/// The filter JSON with the shipped bridge credentials (timeout and breaker left to their
/// defaults), plus `body`.
fn filter_json(body: &str) -> String {
    format!(
        r#"{{"bridge": {{"username": "ratelimit", "password": "ratelimit-demo-secret"}},
{body}}}"#
    )
}

fn stack(name: &str, body: &str) -> Stack {
    let (from, to) = filter_config_edit(&filter_json(body));
    Stack::start(name, &[(&from, &to)])
}

/// Status codes of `n` requests.
fn statuses(n: usize, mut each: impl FnMut() -> Response) -> Vec<u16> {
    (0..n).map(|_| each().status).collect()
}

#[test]
fn rules_on_different_paths_limit_independently_and_together() {
    let s = stack(
        "policy-rules",
        r#""rules": [
          {"name": "api", "match": {"path_prefix": "/api/"}, "limits": [{"name": "hour", "limit": 5, "window": "1h"}]},
          {"name": "search", "match": {"path_prefix": "/api/search"}, "limits": [{"name": "hour", "limit": 2, "window": "1h"}]},
          {"name": "other", "match": {"path_exact": "/other"}, "limits": [{"name": "hour", "limit": 3, "window": "1h"}]}
        ]"#,
    );
    let e = &s.envoy;
    e.load_script("/other");
    let before = s.redis.decision_calls();
    assert_eq!(
        statuses(4, || e.keyed_at("/other", "k")),
        [200, 200, 200, 429]
    );
    // Matches "api" and "search": limited by both; the refusal charges neither.
    assert_eq!(
        statuses(3, || e.keyed_at("/api/search?q=1", "k")),
        [200, 200, 429]
    );
    // "api" has 5 - 2 = 3 left.
    assert_eq!(
        statuses(4, || e.keyed_at("/api/users", "k")),
        [200, 200, 200, 429]
    );
    assert_eq!(e.keyed_at("/other", "k").status, 429);
    // Another key has buckets of its own; an unmatched path is never limited.
    assert_eq!(e.keyed_at("/other", "k2").status, 200);
    assert_eq!(statuses(5, || e.keyed_at("/elsewhere", "k")), [200; 5]);
    // One decision call per limited request that its worker's deny cache did not answer (the
    // second refusal of k on /other may come from there), none for the unmatched ones.
    let in_redis = s.redis.decision_calls() - before;
    e2e::wait_for(
        "every decision counted",
        std::time::Duration::from_secs(2),
        || {
            let hits = e.counter("ratelimit_deny_cache_hits");
            (in_redis + hits == 4 + 3 + 4 + 1 + 1).then_some(())
        },
    );
}

#[test]
fn tiers_are_one_call_and_a_refusal_drains_nothing() {
    clear_of_window_end(DAY, TEST_SPAN);
    let s = stack(
        "policy-tiers",
        r#""rules": [{"name": "tiered", "limits": [
            {"name": "per_second", "limit": 10, "window": "1s"},
            {"name": "per_day", "algorithm": "fixed_window", "limit": 3, "window": "1d"}]}]"#,
    );
    let e = &s.envoy;
    e.load_script("/other");
    let before = s.redis.decision_calls();
    assert_eq!(statuses(3, || e.keyed("tiered-key")), [200, 200, 200]);
    assert_eq!(
        s.redis.decision_calls() - before,
        3,
        "exactly one decision call per request"
    );

    let key = e
        .keys()
        .limit_key("tiered", "per_second", "header:x-api-key", b"tiered-key");
    let state = |s: &Stack| s.redis.admin().cmd(&["HGETALL", &key]).unwrap().text();
    let after_three = state(&s);
    let r = e.keyed("tiered-key");
    assert_eq!(r.status, 429, "the daily quota is spent");
    assert_eq!(s.redis.decision_calls() - before, 4);
    assert_eq!(
        state(&s),
        after_three,
        "the refused request left the per-second bucket untouched"
    );
    let calls = s
        .redis
        .admin()
        .cmd(&["INFO", "commandstats"])
        .unwrap()
        .text();
    assert!(!calls.contains("cmdstat_eval:"), "never EVAL");
}

#[test]
fn each_algorithm_enforces_its_limit() {
    clear_of_window_end(HOUR, TEST_SPAN);
    let s = stack(
        "policy-algorithms",
        r#""rules": [
          {"name": "tb", "match": {"path_exact": "/tb"}, "limits": [{"name": "l", "algorithm": "token_bucket", "limit": 3, "window": "1h"}]},
          {"name": "gcra", "match": {"path_exact": "/gcra"}, "limits": [{"name": "l", "algorithm": "gcra", "limit": 3, "window": "1h"}]},
          {"name": "swc", "match": {"path_exact": "/swc"}, "limits": [{"name": "l", "algorithm": "sliding_window_counter", "limit": 3, "window": "1h"}]},
          {"name": "swl", "match": {"path_exact": "/swl"}, "limits": [{"name": "l", "algorithm": "sliding_window_log", "limit": 3, "window": "1h"}]},
          {"name": "fixed", "match": {"path_exact": "/fixed"}, "limits": [{"name": "l", "algorithm": "fixed_window", "limit": 3, "window": "1h"}]}
        ]"#,
    );
    for path in ["/tb", "/gcra", "/swc", "/swl", "/fixed"] {
        let got: Vec<(u16, Option<String>)> = (0..4)
            .map(|_| {
                let r = s.envoy.keyed_at(path, "k");
                (
                    r.status,
                    r.header("x-ratelimit-remaining").map(str::to_string),
                )
            })
            .collect();
        let want: Vec<(u16, Option<String>)> = vec![
            (200, Some("2".into())),
            (200, Some("1".into())),
            (200, Some("0".into())),
            (429, Some("0".into())),
        ];
        assert_eq!(got, want, "{path}");
    }
    assert_eq!(s.envoy.counter("ratelimit_bridge_errors"), 0);
}

#[test]
fn x_forwarded_for_counts_only_with_trusted_hops() {
    let dir = WorkDir::new("policy-xff");
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let rule = |name: &str| {
        format!(
            r#""rules": [{{"name": "{name}", "key": {{"from": ["client_ip"]}}, "limits": [{{"name": "hour", "limit": 2, "window": "1h"}}]}}]"#
        )
    };
    let (from, to) = filter_config_edit(&filter_json(&rule("by_peer")));
    let direct = Envoy::start(&dir, webdis.port, &[(&from, &to)]);
    let xff = |v: &str| -> Vec<u8> { v.as_bytes().to_vec() };
    let forged = |e: &Envoy, v: &str| e.send("/", &[("x-forwarded-for", &xff(v))]).status;
    // xff_trusted_hops 0: whatever the client writes, its bucket is its connection's.
    assert_eq!(
        [
            forged(&direct, "1.1.1.1"),
            forged(&direct, "2.2.2.2"),
            forged(&direct, "3.3.3.3, 4.4.4.4")
        ],
        [200, 200, 429]
    );

    let body = format!(r#""xff_trusted_hops": 1, {}"#, rule("by_xff"));
    let (from, to) = filter_config_edit(&filter_json(&body));
    let behind_proxy = Envoy::start(&dir, webdis.port, &[(&from, &to)]);
    // One trusted hop: the rightmost entry is the client the proxy saw.
    assert_eq!(
        [
            forged(&behind_proxy, "6.6.6.6, 1.1.1.1"),
            forged(&behind_proxy, "7.7.7.7, 1.1.1.1"),
            forged(&behind_proxy, "1.1.1.1")
        ],
        [200, 200, 429]
    );
    assert_eq!(
        forged(&behind_proxy, "1.1.1.1, 2.2.2.2"),
        200,
        "another client"
    );
    // IPv6 clients count per /64: two addresses of one subscriber share a bucket.
    assert_eq!(
        [
            forged(&behind_proxy, "2001:db8:1:2::1"),
            forged(&behind_proxy, "2001:db8:1:2:ffff::9"),
            forged(&behind_proxy, "2001:db8:1:2::7"),
            forged(&behind_proxy, "2001:db8:1:3::1")
        ],
        [200, 200, 429, 200]
    );
    let key = behind_proxy
        .keys()
        .limit_key("by_xff", "hour", "client_ip", b"1.1.1.1");
    assert_eq!(redis.admin().cmd(&["EXISTS", &key]).unwrap().int(), 1);
}

#[test]
fn an_invalid_x_forwarded_for_entry_is_no_identity() {
    let s = stack(
        "policy-xff-invalid",
        r#""xff_trusted_hops": 1, "hash_identities": false,
           "rules": [{"name": "by_ip", "key": {"from": ["client_ip", "header:x-fallback"], "when_missing": "skip"},
             "limits": [{"name": "hour", "limit": 2, "window": "1h"}]}]"#,
    );
    let e = &s.envoy;
    let via = |xff: &[u8], fallback: Option<&[u8]>| {
        let mut headers: Vec<(&str, &[u8])> = vec![("x-forwarded-for", xff)];
        headers.extend(fallback.map(|f| ("x-fallback", f)));
        e.send("/", &headers)
    };
    // None of these is a client address: counted as an identity, each would get a bucket of
    // its own (garbage rotated for fresh buckets), and this rule has nothing else to go on.
    let invalid: [&[u8]; 6] = [
        b"[]",
        b":80",
        b"\xff\xfe",
        b"\xfe\xff",
        b"1.2.3.4:abc",
        b"unknown",
    ];
    for xff in invalid {
        let r = via(xff, None);
        assert_eq!(
            (r.status, r.header("x-ratelimit-limit")),
            (200, None),
            "skipped, not limited: {xff:?}"
        );
    }
    // With the next alternative present, it decides: one bucket whatever the garbage.
    assert_eq!(
        [
            via(b"\xff\xfe", Some(b"f1")).status,
            via(b"\xfe\xff", Some(b"f1")).status,
            via(b"[]", Some(b"f1")).status
        ],
        [200, 200, 429]
    );
    // A valid entry with or without a port is one client.
    assert_eq!(
        [
            via(b"1.2.3.4:80", Some(b"f2")).status,
            via(b"1.2.3.4", None).status,
            via(b"6.6.6.6, 1.2.3.4:8080", None).status
        ],
        [200, 200, 429]
    );
    // Envoy joins repeated X-Forwarded-For copies with ',': the last copy's entry counts.
    let two_copies = e.send(
        "/",
        &[
            ("x-forwarded-for", b"9.9.9.9"),
            ("x-forwarded-for", b"1.2.3.4"),
        ],
    );
    assert_eq!(two_copies.status, 429);
    // Fewer entries than trusted hops: the connection's peer.
    assert_eq!(e.send("/", &[]).header("x-ratelimit-remaining"), Some("1"));
    let mut keys: Vec<String> = s
        .redis
        .admin()
        .cmd(&["KEYS", "*"])
        .unwrap()
        .items()
        .iter()
        .map(|k| k.text())
        .collect();
    keys.sort();
    let named = e.keys();
    let mut want = [
        named.limit_key("by_ip", "hour", "client_ip", b"1.2.3.4"),
        named.limit_key("by_ip", "hour", "client_ip", b"127.0.0.1"),
        named.limit_key("by_ip", "hour", "header:x-fallback", b"f1"),
    ];
    want.sort();
    assert_eq!(keys, want);
    // Readable identities (`hash_identities` off): the addresses themselves, port stripped.
    assert!(keys.iter().all(|k| k.contains('=')), "{keys:?}");
}

#[test]
fn cost_is_weighted_by_a_header_and_bad_values_get_400() {
    let s = stack(
        "policy-cost",
        r#""rules": [{"name": "weighted", "cost": {"header": "x-cost", "min": 1, "max": 5},
            "limits": [{"name": "hour", "limit": 10, "window": "1h"}]}]"#,
    );
    let e = &s.envoy;
    let with_cost = |cost: &str| e.send("/", &[("x-api-key", b"w"), ("x-cost", cost.as_bytes())]);
    let remaining = |r: &Response| r.header("x-ratelimit-remaining").map(str::to_string);
    let r = with_cost("4");
    assert_eq!((r.status, remaining(&r)), (200, Some("6".into())));
    let r = with_cost("5");
    assert_eq!((r.status, remaining(&r)), (200, Some("1".into())));
    assert_eq!(with_cost("2").status, 429);
    // No header: the default cost (min) of 1.
    let r = e.keyed("w");
    assert_eq!((r.status, remaining(&r)), (200, Some("0".into())));

    let before = s.redis.decision_calls();
    for bad in ["abc", "0", "6", "1.5", "-1", "", "99999999999999999999999"] {
        let r = with_cost(bad);
        assert_eq!(r.status, 400, "cost {bad:?}");
        assert_eq!(r.text(), "x-cost must be a whole number from 1 to 5\n");
    }
    assert_eq!(
        s.redis.decision_calls(),
        before,
        "a bad request asks Redis nothing"
    );
    assert_eq!(s.envoy.counter("ratelimit_bad_requests"), 7);
}

#[test]
fn a_decisive_header_sent_twice_gets_400_without_asking_redis() {
    let s = stack(
        "policy-repeated-headers",
        r#""rules": [
          {"name": "api", "match": {"path_prefix": "/api/"}, "cost": {"header": "x-cost", "min": 1, "max": 5},
           "limits": [{"name": "hour", "limit": 3, "window": "1h"}]},
          {"name": "gold", "match": {"path_prefix": "/tier/", "header": {"name": "x-tier", "value": "gold"}},
           "limits": [{"name": "hour", "limit": 3, "window": "1h"}]}
        ]"#,
    );
    let e = &s.envoy;
    assert_eq!(
        statuses(4, || e.keyed_at("/api/a", "real-key")),
        [200, 200, 200, 429]
    );
    let before = s.redis.decision_calls();
    // Keyed on the first copy, a backend reading the last would see another client: a
    // repeated header the filter reads is refused instead.
    for (path, headers, name) in [
        (
            "/api/a",
            [("x-api-key", &b"fresh-4"[..]), ("x-api-key", b"real-key")],
            "x-api-key",
        ),
        (
            "/api/a",
            [("x-api-key", b"real-key"), ("x-api-key", b"fresh-5")],
            "x-api-key",
        ),
        ("/api/a", [("x-cost", b"1"), ("x-cost", b"5")], "x-cost"),
        (
            "/tier/a",
            [("x-tier", b"gold"), ("x-tier", b"free")],
            "x-tier",
        ),
    ] {
        let r = e.send(path, &headers);
        assert_eq!(r.status, 400, "{headers:?}");
        assert_eq!(r.text(), format!("{name} must be sent once\n"));
    }
    assert_eq!(s.redis.decision_calls(), before, "a 400 asks Redis nothing");
    assert_eq!(s.envoy.counter("ratelimit_bad_requests"), 4);
    // Where no rule reads it, a repeated header passes untouched.
    let r = e.send("/other", &[("x-api-key", b"a"), ("x-api-key", b"b")]);
    assert_eq!((r.status, r.header("x-ratelimit-limit")), (200, None));
    // A header the limiter does not decide on may repeat on a limited path.
    let r = e.send(
        "/api/a",
        &[
            ("x-api-key", b"other-key"),
            ("accept", b"a"),
            ("accept", b"b"),
        ],
    );
    assert_eq!(
        (r.status, r.header("x-ratelimit-remaining")),
        (200, Some("2"))
    );
}

/// The largest limit of each algorithm, cycled to fill a rule.
fn largest_limit(k: usize) -> String {
    use ratelimit_core::bounds::{MAX_LIMIT, MAX_LOG_LIMIT};
    match k % 5 {
        0 => format!(r#""limit": {MAX_LIMIT}, "window": "366d", "burst": {MAX_LIMIT}"#),
        1 => format!(
            r#""algorithm": "gcra", "limit": {MAX_LIMIT}, "window": "366d", "burst": {MAX_LIMIT}"#
        ),
        2 => format!(
            r#""algorithm": "sliding_window_counter", "limit": {MAX_LIMIT}, "window": "366d""#
        ),
        3 => format!(r#""algorithm": "fixed_window", "limit": {MAX_LIMIT}, "window": "366d""#),
        _ => format!(
            r#""algorithm": "sliding_window_log", "limit": {MAX_LOG_LIMIT}, "window": "366d""#
        ),
    }
}

#[test]
fn the_largest_accepted_values_are_decided_exactly() {
    use ratelimit_core::bounds::{
        MAX_KEY_SOURCE_BYTES, MAX_LIMITS_PER_REQUEST, MAX_LIMITS_PER_RULE, MAX_STATE_LIFETIME,
        MAX_WINDOW,
    };
    use ratelimit_core::request::keys::MAX_READABLE_IDENTITY;
    // A 128-byte key source, 64-character rule and limit names, 4 rules of 16 limits that all
    // apply to every request: 64 limits in one call, each with the largest values.
    let header = format!("x-{}", "k".repeat(MAX_KEY_SOURCE_BYTES - "header:x-".len()));
    let rule_name = |i: usize| format!("{i}{}", "r".repeat(63));
    let limit_name = |j: usize| format!("{j:02}{}", "l".repeat(62));
    // Rule 0 starts with the two limits whose state lives longest (burst 2 × window 366d):
    // one token per 366 days, so exactly 2 requests pass.
    let limit_fields = |i: usize, j: usize| match (i, j) {
        (0, 0) => r#""limit": 1, "window": "366d", "burst": 2"#.to_string(),
        (0, 1) => r#""algorithm": "gcra", "limit": 1, "window": "366d", "burst": 2"#.to_string(),
        _ => largest_limit(i * MAX_LIMITS_PER_RULE + j),
    };
    let rules: Vec<String> = (0..4)
        .map(|i| {
            let limits: Vec<String> = (0..MAX_LIMITS_PER_RULE)
                .map(|j| format!(r#"{{"name": "{}", {}}}"#, limit_name(j), limit_fields(i, j)))
                .collect();
            format!(
                r#"{{"name": "{}", "key": {{"from": ["header:{header}"], "when_missing": "skip"}}, "limits": [{}]}}"#,
                rule_name(i),
                limits.join(", ")
            )
        })
        .collect();
    let s = stack(
        "policy-largest-values",
        &format!(
            r#""hash_identities": false, "headers": "ietf", "rules": [{}]"#,
            rules.join(",\n")
        ),
    );
    // The longest readable identity, every byte of it percent-encoded in the call.
    let identity: String = "!$&'()*.:;=@^|"
        .chars()
        .cycle()
        .take(MAX_READABLE_IDENTITY)
        .collect();
    let hit = || s.envoy.send("/", &[(&header, identity.as_bytes())]);
    let first = hit();
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(sf(&first, "ratelimit").len(), MAX_LIMITS_PER_REQUEST);
    assert_eq!(hit().status, 200);
    let denied = hit();
    assert_eq!(denied.status, 429);
    // The token comes back 366 days after the first request, less the few ms since.
    let retry_after: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    let year_s = MAX_WINDOW.as_secs();
    assert!(
        (year_s - 10..=year_s).contains(&retry_after),
        "{retry_after}"
    );
    // The refused request charged nothing: the large limits show exactly 2 units spent.
    let state = sf(&denied, "ratelimit");
    assert_eq!(state.len(), MAX_LIMITS_PER_REQUEST);
    let remaining = |i: usize, j: usize| {
        let name = format!("{}.{}", rule_name(i), limit_name(j));
        state
            .iter()
            .find(|item| item.name() == Some(name.as_str()))
            .and_then(|item| item.int("r"))
            .unwrap_or_else(|| panic!("no {name} in RateLimit"))
    };
    // (0, 2..): sliding_window_counter, fixed_window, sliding_window_log, in cycle order.
    assert_eq!(remaining(0, 2), 999_999_999_998, "sliding_window_counter");
    assert_eq!(remaining(0, 3), 999_999_999_998, "fixed_window");
    assert_eq!(remaining(0, 4), 9_998, "sliding_window_log");
    assert_eq!(s.envoy.counter("ratelimit_bridge_errors"), 0);

    // Every key exists, named with the readable identity, and expires: PEXPIRE got an exact
    // integer, for the longest-lived state too (732 days + the scripts' 60 s).
    let mut admin = s.redis.admin();
    let keys = admin.cmd(&["KEYS", "*"]).unwrap().items();
    assert_eq!(keys.len(), MAX_LIMITS_PER_REQUEST);
    let named = s.envoy.keys();
    let label = format!("header:{header}");
    let key = |i: usize, j: usize| {
        let key = named.limit_key(&rule_name(i), &limit_name(j), &label, identity.as_bytes());
        assert!(key.contains(&format!("={identity}}}")), "readable: {key}");
        key
    };
    for k in &keys {
        let ttl = admin.cmd(&["PTTL", &k.text()]).unwrap().int();
        assert!(ttl > 0, "{} has PTTL {ttl}", k.text());
    }
    // (+ 1 ms: the script's division in doubles may round the lifetime up.)
    let longest = MAX_STATE_LIFETIME.as_millis() as i64 + 60_000;
    for j in [0, 1] {
        let ttl = admin.cmd(&["PTTL", &key(0, j)]).unwrap().int();
        assert!(
            (longest - 30_000..=longest + 1).contains(&ttl),
            "{j}: {ttl}"
        );
    }
    let log_ttl = admin.cmd(&["PTTL", &key(0, 4)]).unwrap().int();
    let window = MAX_WINDOW.as_millis() as i64 + 60_000;
    assert!((window - 30_000..=window).contains(&log_ttl), "{log_ttl}");
}

#[test]
fn shadow_mode_never_blocks_and_still_counts() {
    let s = stack(
        "policy-shadow",
        r#""rules": [{"name": "watch", "shadow": true, "limits": [{"name": "hour", "limit": 2, "window": "1h"}]}]"#,
    );
    let got: Vec<(u16, String)> = (0..5)
        .map(|_| {
            let r = s.envoy.keyed("s");
            (
                r.status,
                r.header("x-ratelimit-remaining").unwrap_or("-").to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [(200, "1"), (200, "0"), (200, "0"), (200, "0"), (200, "0")]
            .map(|(s, r)| (s, r.to_string()))
    );
    assert_eq!(s.envoy.counter("ratelimit_allowed"), 5);
    assert_eq!(s.envoy.counter("ratelimit_shadow_denied"), 3);
    assert_eq!(s.envoy.counter("ratelimit_denied"), 0);
}

fn sf(r: &Response, name: &str) -> Vec<Item> {
    let value = r.header(name).unwrap_or_else(|| panic!("no {name} header"));
    parse_list(value)
        .unwrap_or_else(|e| panic!("{name}: {value:?} is not a structured field list: {e}"))
}

#[test]
fn headers_on_allowed_and_denied_responses_parse_and_carry_the_numbers() {
    clear_of_window_end(DAY, TEST_SPAN);
    let s = stack(
        "policy-headers",
        r#""headers": "both", "deny_body": "problem+json",
           "rules": [{"name": "api", "limits": [
             {"name": "burst", "limit": 2, "window": "1m"},
             {"name": "daily", "algorithm": "fixed_window", "limit": 100, "window": "1d"}]}]"#,
    );
    let e = &s.envoy;
    let first = e.keyed("h");
    assert_eq!(first.status, 200);
    // X-RateLimit-*: the most restrictive limit, the 2-token bucket refilled every 30 s.
    assert_eq!(first.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(first.header("x-ratelimit-reset"), Some("30"));
    let policy = sf(&first, "ratelimit-policy");
    let names: Vec<&str> = policy.iter().filter_map(Item::name).collect();
    assert_eq!(names, ["api.burst", "api.daily"]);
    assert_eq!(
        (policy[0].int("q"), policy[0].int("w")),
        (Some(2), Some(60))
    );
    assert_eq!(
        (policy[1].int("q"), policy[1].int("w")),
        (Some(100), Some(86400))
    );
    let state = sf(&first, "ratelimit");
    assert_eq!(state[0].name(), Some("api.burst"));
    assert_eq!((state[0].int("r"), state[0].int("t")), (Some(1), Some(30)));
    assert_eq!(state[1].int("r"), Some(99));
    let t_daily = state[1].int("t").unwrap();
    assert!((1..=86400).contains(&t_daily), "daily reset {t_daily}");

    assert_eq!(e.keyed("h").status, 200);
    let denied = e.keyed("h");
    assert_eq!(denied.status, 429);
    let state = sf(&denied, "ratelimit");
    assert_eq!((state[0].int("r"), state[0].int("t")), (Some(0), Some(30)));
    let retry_after: i64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(retry_after, 30, "one token back in 30 s");
    assert!(
        retry_after >= state[0].int("t").unwrap(),
        "Retry-After never earlier than t"
    );
    assert_eq!(sf(&denied, "ratelimit-policy").len(), 2);
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    let body: serde_json::Value = serde_json::from_slice(&denied.body).unwrap();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["api.burst"]));
}

#[test]
fn headers_can_be_hidden() {
    let s = stack(
        "policy-no-headers",
        r#""headers": "none", "rules": [{"name": "r", "limits": [{"name": "l", "limit": 1, "window": "1h"}]}]"#,
    );
    let allowed = s.envoy.keyed("n");
    assert_eq!(allowed.status, 200);
    let denied = s.envoy.keyed("n");
    assert_eq!(denied.status, 429);
    for r in [&allowed, &denied] {
        for name in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "ratelimit",
            "ratelimit-policy",
        ] {
            assert_eq!(r.header(name), None, "{name} on a {}", r.status);
        }
    }
    assert_eq!(
        denied.header("retry-after"),
        Some("3600"),
        "a 429 always says when to come back"
    );
}

#[test]
fn redis_clock_limits_like_the_proxy_clock() {
    let s = stack(
        "policy-redis-clock",
        r#""clock": "redis", "rules": [{"name": "r", "limits": [
            {"name": "tb", "limit": 3, "window": "1h"},
            {"name": "swl", "algorithm": "sliding_window_log", "limit": 3, "window": "1h"}]}]"#,
    );
    assert_eq!(statuses(4, || s.envoy.keyed("c")), [200, 200, 200, 429]);
    assert_eq!(s.envoy.counter("ratelimit_bridge_errors"), 0);
}

/// An example config from envoy/examples, validated as shipped, started on test ports.
fn example(name: &str) -> (WorkDir, Redis, Webdis, Envoy) {
    let file = root().join("envoy/examples").join(name);
    let (ok, output) = validate_config(&root(), &file);
    assert!(ok, "{name} does not validate:\n{output}");
    // The examples' daily and monthly (UTC) budgets.
    clear_of_window_end(DAY, TEST_SPAN);
    let dir = WorkDir::new(&format!("example-{name}"));
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let envoy = Envoy::start_file_with(&dir, &file, webdis.port, &[]);
    (dir, redis, webdis, envoy)
}

#[test]
fn example_public_api_tiers() {
    let (_dir, _redis, _webdis, envoy) = example("public_api_tiers.yaml");
    // /api/search: GCRA 2 per second with a burst of 5, on top of the per-key tiers. Six
    // requests within its 500 ms emission interval: a loaded machine can stretch them past
    // it (a unit back, the sixth allowed), and they are sent again for another client.
    let mut client = 0;
    let (got, _) = wait_until(
        "six searches within 500 ms",
        Duration::from_secs(60),
        || {
            client += 1;
            let key = format!("searcher-{client}");
            let started = std::time::Instant::now();
            let got = statuses(6, || envoy.keyed_at("/api/search", &key));
            (got, started.elapsed())
        },
        |(_, took)| *took < Duration::from_millis(500),
    );
    assert_eq!(got, [200, 200, 200, 200, 200, 429]);
    let r = envoy.keyed_at("/api/orders", "customer-1");
    assert_eq!(r.status, 200);
    let names: Vec<String> = sf(&r, "ratelimit-policy")
        .iter()
        .filter_map(|i| i.name().map(str::to_string))
        .collect();
    assert_eq!(
        names,
        [
            "api.per_second",
            "api.per_day",
            "per_ip.per_second",
            "per_ip.per_day"
        ]
    );
    // Leases are on (and the clock skew allowed is 50 ms): a busy key is served partly from
    // units its worker took ahead, within the same limits.
    let got = statuses(12, || envoy.keyed_at("/api/orders", "customer-2"));
    assert_eq!(got, [200; 12]);
    let hits = wait_for("lease hits counted", Duration::from_secs(5), || {
        Some(envoy.counter("ratelimit_lease_hits")).filter(|n| *n > 0)
    });
    println!("12 requests of customer-2: {hits} from leases");
    // Outside /api/ nothing is limited.
    assert_eq!(
        envoy.keyed_at("/health", "customer-1").header("ratelimit"),
        None
    );
}

#[test]
fn example_plans() {
    let (_dir, redis, _webdis, envoy) = example("plans.yaml");
    let keys = envoy.keys();
    // The default plan, as every key gets it.
    let r = envoy.keyed("default-customer");
    assert_eq!(r.status, 200);
    let policy = r.header("ratelimit-policy").unwrap_or_default().to_string();
    for item in [
        "\"plans.per_second\";q=40;w=1",
        "\"plans.monthly\";q=100000",
        "\"plans.in_flight\";q=4",
    ] {
        assert!(policy.contains(item), "{item} in {policy}");
    }
    // Another plan for one customer, set at runtime beside its state: a burst of 3, 1 a
    // second (5 requests sent at once see at most 4 allowed, whatever the machine's pace
    // within a second).
    let state = keys.limit_key("plans", "per_second", "header:x-api-key", b"small-customer");
    redis
        .admin()
        .cmd(&[
            "HSET",
            &format!("{state}:override"),
            "mode",
            "limit",
            "limit",
            "1",
            "burst",
            "3",
        ])
        .unwrap();
    let got = statuses(5, || envoy.keyed("small-customer"));
    assert_eq!(got[..3], [200, 200, 200], "{got:?}");
    assert!(got.contains(&429), "{got:?}");
    let refused = envoy.keyed("small-customer");
    let policy = refused.header("ratelimit-policy").unwrap_or_default();
    assert!(policy.contains("\"plans.per_second\";q=3;w=1"), "{policy}");
    // The monthly quota counts in the calendar month; each hold in flight is released when
    // its response ends.
    let monthly = keys.limit_key("plans", "monthly", "header:x-api-key", b"default-customer");
    assert_eq!(redis.hash_field(&monthly, "n"), "1");
    let holds = keys.limit_key("plans", "in_flight", "header:x-api-key", b"small-customer");
    wait_for("every hold released", Duration::from_secs(10), || {
        (redis.admin().cmd(&["ZCARD", &holds]).unwrap().int() == 0).then_some(())
    });
}

#[test]
fn example_login_per_ip() {
    let (_dir, _redis, _webdis, envoy) = example("login_per_ip.yaml");
    let login = |client: &str| {
        request(
            envoy.port,
            "POST",
            "/login",
            &[("x-forwarded-for", client.as_bytes())],
            b"user=a",
        )
        .unwrap()
        .status
    };
    assert_eq!(
        (0..6).map(|_| login("203.0.113.7")).collect::<Vec<_>>(),
        [200, 200, 200, 200, 200, 429]
    );
    assert_eq!(login("203.0.113.8"), 200, "another client address");
    // Only POST /login is limited.
    assert_eq!(
        statuses(8, || envoy
            .send("/login", &[("x-forwarded-for", b"203.0.113.7")])),
        [200; 8]
    );
}

#[test]
fn example_internal_shadow() {
    let (_dir, _redis, _webdis, envoy) = example("internal_shadow.yaml");
    let started = std::time::Instant::now();
    let got = statuses(700, || envoy.send("/", &[("x-service-name", b"billing")]));
    let seconds = started.elapsed().as_secs_f64();
    assert!(got.iter().all(|&s| s == 200), "shadow mode never blocks");
    // 600 per sliding minute: 100 over. If the requests straddle a minute boundary, the
    // previous minute's count decays by up to 600 per minute of elapsed time.
    let shadow_denied = envoy.counter("ratelimit_shadow_denied");
    let decay = (seconds * 10.0).ceil() as u64;
    assert!(
        (100 - decay.min(100)..=100).contains(&shadow_denied),
        "{shadow_denied} shadow denials in {seconds:.1} s"
    );
    assert_eq!(envoy.counter("ratelimit_allowed"), 700);
    // Every request also counts against its address's 1,800 (none refused here); one
    // without the header is measured by that rule alone.
    assert_eq!(
        envoy.send("/", &[]).header("x-ratelimit-limit"),
        Some("1800")
    );
}

#[test]
fn keys_can_combine_route_method_and_path() {
    let (from, to) = filter_config_edit(&filter_json(
        r#""rules": [{"name": "per_route", "key": {"from": ["route+method+path"], "when_missing": "skip"},
            "limits": [{"name": "hour", "limit": 2, "window": "1h"}]}]"#,
    ));
    let s = Stack::start(
        "policy-route-key",
        &[
            (&from, &to),
            (
                "- match: { prefix: \"/\" }",
                "- name: demo_route\n                match: { prefix: \"/\" }",
            ),
        ],
    );
    let port = s.envoy.port;
    let call = |method: &str, path: &str| request(port, method, path, &[], b"").unwrap().status;
    assert_eq!(
        [call("GET", "/a"), call("GET", "/a?x=1"), call("GET", "/a")],
        [200, 200, 429]
    );
    assert_eq!(
        [call("POST", "/a"), call("GET", "/b")],
        [200, 200],
        "method and path are part of the key"
    );
    // The identity: the route, the method and the path, joined by the filter's separator.
    let key = s.envoy.keys().limit_key(
        "per_route",
        "hour",
        "route+method+path",
        b"demo_route\x1fGET\x1f/a",
    );
    assert_eq!(s.redis.admin().cmd(&["EXISTS", &key]).unwrap().int(), 1);
}

/// A key from a query parameter (`?api_key=…`, as public APIs and webhooks take one): decoded
/// once, so `k%31` is `k1`'s bucket; sent twice it is a bad request; beside it the address's
/// ceiling holds a client making up keys.
#[test]
fn a_query_parameter_keys_a_bucket_and_the_address_holds_made_up_ones() {
    let s = stack(
        "policy-query-key",
        r#""rules": [
          {"name": "hooks", "match": {"path_prefix": "/hooks/"},
           "key": {"from": ["query:api_key"], "when_missing": "skip"},
           "limits": [{"name": "hour", "limit": 3, "window": "1h"}]},
          {"name": "per_ip", "match": {"path_prefix": "/hooks/"}, "key": {"from": ["client_ip"]},
           "limits": [{"name": "hour", "limit": 8, "window": "1h"}]}]"#,
    );
    let port = s.envoy.port;
    let call = |path: &str| get(port, path, &[]).unwrap();
    let got: Vec<u16> = [
        "/hooks/a?api_key=k1",
        "/hooks/b?x=1&api_key=k1",
        "/hooks/a?api_key=k%31",
    ]
    .iter()
    .map(|p| call(p).status)
    .collect();
    assert_eq!(got, [200, 200, 200]);
    assert_eq!(call("/hooks/a?api_key=k1").status, 429, "k1's 3 are spent");
    let twice = call("/hooks/a?api_key=k2&api_key=k1");
    assert_eq!(twice.status, 400, "{}", twice.text());
    assert!(twice
        .text()
        .contains("query parameter api_key must be sent once"));
    assert_eq!(statuses(3, || call("/hooks/a?api_key=k2")), [200; 3]);
    // 6 of the address's 8 are spent: made-up keys get the 2 left, then nothing.
    let made_up: Vec<u16> = (0..6)
        .map(|i| call(&format!("/hooks/a?api_key=made-up-{i}")).status)
        .collect();
    assert_eq!(made_up, [200, 200, 429, 429, 429, 429]);
    let key = s
        .envoy
        .keys()
        .limit_key("hooks", "hour", "query:api_key", b"k1");
    assert_eq!(s.redis.admin().cmd(&["EXISTS", &key]).unwrap().int(), 1);
}

/// envoy/examples/llm_tokens.yaml in front of the tests' OpenAI-compatible upstream
/// (e2e::llm), validated as shipped and started patient: answers and streams pass through
/// (a stream is not held back: its first event reaches the client before its last is sent),
/// the key is the `Authorization` header, 60 requests a minute per key, and a key whose
/// answers used its minute's tokens is refused while another key is not.
#[test]
fn example_llm_tokens() {
    use e2e::http::{post_streamed, sse_data, Streamed};
    use e2e::llm::{chat_request, Served, EVENTS, EVENT_DELAY, USAGE};
    use e2e::LlmUpstream;

    let name = "llm_tokens.yaml";
    let file = root().join("envoy/examples").join(name);
    let (ok, output) = validate_config(&root(), &file);
    assert!(ok, "{name} does not validate:\n{output}");
    clear_of_window_end(DAY, TEST_SPAN);
    let upstream = LlmUpstream::start();
    let dir = WorkDir::new(&format!("example-{name}"));
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let to_upstream = format!("port_value: {} }}", upstream.port);
    let edits = [("port_value: 8000 }", to_upstream.as_str())];
    let envoy = Envoy::start_file_with(&dir, &file, webdis.port, &edits);
    let chat = |key: &str, extra: &[(&str, &[u8])], stream: bool| -> Streamed {
        let auth = format!("Bearer {key}");
        let mut headers: Vec<(&str, &[u8])> = vec![("authorization", auth.as_bytes())];
        headers.extend_from_slice(extra);
        let body = chat_request("Say hello.", stream, Some(100));
        post_streamed(envoy.port, "/v1/chat/completions", &headers, &body)
            .expect("an answer through envoy")
    };

    // A JSON answer, as the upstream sent it.
    let r = chat("sk-json", &[(USAGE, b"50")], false);
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body()).expect("JSON");
    assert_eq!(v["usage"]["total_tokens"], 50);
    assert_eq!(
        upstream.served_for("sk-json"),
        Served {
            sum: 50,
            count: 1,
            unreported: 0
        }
    );
    // A stream of 4 content events, the usage and [DONE], 300 ms apart.
    let r = chat(
        "sk-stream",
        &[(USAGE, b"70"), (EVENTS, b"4"), (EVENT_DELAY, b"300")],
        true,
    );
    assert!(r.complete, "the stream ended early");
    let data = sse_data(&r.body());
    assert_eq!(data.len(), 6, "{data:?}");
    assert!(data[4].contains(r#""total_tokens":70"#), "{}", data[4]);
    assert_eq!(data[5], "[DONE]");
    let arrived = |needle: &str| {
        r.chunks
            .iter()
            .find(|c| String::from_utf8_lossy(&c.data).contains(needle))
            .map(|c| c.at)
            .unwrap_or_else(|| panic!("no chunk holds {needle}"))
    };
    let spread = arrived("[DONE]") - arrived("data: {");
    assert!(
        spread >= Duration::from_millis(1000),
        "the first event came only {spread:?} before the last: the stream was held back"
    );

    // 60 requests a minute per key (a token bucket refilling one a second while they go).
    let started = std::time::Instant::now();
    let mut admitted = 0u64;
    while chat("sk-requests", &[(USAGE, b"1")], false).status == 200 {
        admitted += 1;
        assert!(admitted < 200, "the request limit never refused");
    }
    let refilled = started.elapsed().as_secs() + 1;
    assert!(
        (60..=60 + refilled).contains(&admitted),
        "{admitted} requests admitted in {:?}",
        started.elapsed()
    );

    // Tokens: two answers of 60,000 use the key's 100,000 a minute. The second one's usage is
    // settled after its answer, so cheap requests may still pass until it lands; then the
    // key is refused (long before its 60 requests) and nothing more reaches the upstream.
    for _ in 0..2 {
        assert_eq!(chat("sk-tokens", &[(USAGE, b"60000")], false).status, 200);
    }
    let mut cheap = 0u64;
    let refusal = loop {
        let r = chat("sk-tokens", &[(USAGE, b"1")], false);
        if r.status != 200 {
            break r;
        }
        cheap += 1;
        assert!(cheap < 50, "the key's tokens were never refused");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(refusal.status, 429);
    let retry: u64 = refusal
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After in seconds");
    assert!((1..=60).contains(&retry), "Retry-After: {retry}");
    let served = upstream.served_for("sk-tokens");
    assert_eq!(served.count, 2 + cheap);
    assert_eq!(served.sum, 120_000 + cheap);
    // Another key is not affected.
    assert_eq!(chat("sk-other", &[(USAGE, b"1")], false).status, 200);
    // Only POST /v1/ is metered and routed; anything else is 404 here.
    assert_eq!(envoy.send("/", &[]).status, 404);
}
