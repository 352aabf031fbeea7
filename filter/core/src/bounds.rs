//! Every bound, in one place: those a configuration must keep, each derived from what Redis,
//! the Lua scripts and Webdis represent exactly (checked where each field is validated,
//! `config/`; the bounds about one request, how many limits and how large a call, by
//! `load/call_bound.rs`), then what a request may bring, and what a worker holds in memory.
//!
//! Why bounds at all: a value that parses is not a value the chain can carry. Redis 7.0
//! formats a Lua number passed to `redis.call` with `%.17g`, so from 1e17 on `PEXPIRE` gets
//! `1e+17` and fails with `ERR value is not an integer` on every decision; above 2^53 ≈ 9e15
//! integers are no longer exact in a double; Lua's `tostring` (the script's replies) switches to
//! exponent form from 1e14. And Webdis refuses requests larger than its `http_max_request_size`.

use std::time::Duration;

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
/// Keys below a metadata namespace that a `metadata:` source reads through.
pub const MAX_METADATA_KEYS: usize = 8;
/// Values one match condition (`in`, `not_in`) or one plan (`values`) lists.
pub const MAX_CONDITION_VALUES: usize = 256;
/// Length of one such value.
pub const MAX_CONDITION_VALUE_BYTES: usize = 1024;
/// Plans of one rule.
pub const MAX_PLANS: usize = 32;
/// Length of a value a request's query parameter or its metadata gives a key or a condition:
/// a longer one is absent (the key's next alternative applies). Headers are bounded by Envoy.
pub const MAX_SOURCE_VALUE_BYTES: usize = 4096;
/// Distinct `body:` paths the rules of a config read: each is one more scanner walking every
/// held request body.
pub const MAX_BODY_FIELDS: usize = 8;
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
/// How long an override past its `until` stays for operators to see it (`ratelimit-admin
/// inspect`) before Redis removes it: the decision code gives it this TTL when it meets it.
pub const EXPIRED_OVERRIDE_KEPT: Duration = Duration::from_secs(60);

/// Limits one request can carry (all its matching rules together): one script call decides
/// them, and the response headers list them.
pub const MAX_LIMITS_PER_REQUEST: usize = 64;
/// Bytes of a bridge call's path (`/EVALSHA/…`, every argument percent-encoded), counted with
/// the bridge's size model (`bridge::CallSize`): a batch stops growing before it, and a
/// configuration whose single request could pass it is refused.
/// Webdis refuses a request larger than `http_max_request_size` (65,536 in envoy/webdis.json;
/// requests of up to that size were always accepted there); this leaves 16 KiB for the request
/// line, `Host`, `Authorization` and the headers Envoy adds (142 bytes measured with the
/// shipped config, about 1.1 KiB with the fields above at their bounds).
pub const MAX_CALL_PATH_BYTES: usize = 48 * 1024;

/// Largest usage read from a response, and largest estimate, in the limit's units (10^12, as
/// `limit`): anything above is a broken upstream, not a bill, and is taken as unreadable.
pub const MAX_USAGE: u64 = 1_000_000_000_000;
/// Default and largest `estimate.request.max_body`: the request body Envoy holds until it
/// ends, counted (not copied) by the filter.
pub const DEFAULT_MAX_BODY: u64 = 1 << 20;
pub const MAX_MAX_BODY: u64 = 64 << 20;

// --- Bounds of other configuration values: what the engine can do with them. ---

/// Length of `key_prefix`: it is written into every key.
pub const MAX_KEY_PREFIX_BYTES: usize = 64;
/// Longest timeout, clock skew, lag allowance, stall and probe interval: a minute is past any
/// wait a request should make.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// Most trusted proxies in front (`xff_trusted_hops`).
pub const MAX_XFF_HOPS: u8 = 10;
/// Longest run of failed calls before the breaker opens.
pub const MAX_BREAKER_FAILURES: u64 = 1000;
/// Most requests one call decides (`batch.max_requests`).
pub const MAX_BATCH_REQUESTS: u64 = 256;
/// Most calls one worker has in flight (`batch.max_in_flight`): each is a connection to
/// Webdis, and Envoy's circuit breaker on the cluster bounds them all.
pub const MAX_IN_FLIGHT: u64 = 8;
/// Most refusals one worker's deny cache holds (`deny_cache.max_entries`).
pub const MAX_DENY_CACHE_ENTRIES: u64 = 1_000_000;
/// Longest `lease.max_ms`: a lease's units sit idle in one worker at most this long.
pub const MAX_LEASE_MS: u64 = 60_000;
/// The longest id a request taking a concurrency hold is sent with: its worker's 16 hex
/// digits, `-`, its stream's `u32` in decimal.
pub const MAX_MEMBER_BYTES: usize = 16 + 1 + 10;
/// How long a worker acts on what Redis said of a limit with overrides without asking again:
/// a refusal in its deny cache, and a lease, live at most this long. An override set, changed
/// or removed, or a reset, reaches every worker within it.
pub const OVERRIDE_STALE_MS: u64 = 1_000;
/// Most shards of one limit: enough to spread a hot identity over a large cluster.
pub const MAX_SHARDS: u64 = 64;
/// Largest cost of one request (fixed, or a cost header's `max`).
pub const MAX_COST: u64 = 1_000_000;
/// Decimals of a lease's fraction in a call: always this many, so the argument has one length
/// (`0.000001` to `1.000000`). The configuration refuses a fraction with more.
pub const FRACTION_DECIMALS: usize = 6;

// --- Bounds on what a request brings and its response holds. ---

/// Identities up to this length stay readable when `hash_identities` is off; longer or
/// non-printable ones are hashed anyway, so a debugging option cannot make keys huge.
pub const MAX_READABLE_IDENTITY: usize = 128;
/// Bytes of a response body read for its usage at most: past them the usage is unreadable
/// (the estimate stands) and the rest of the body is not looked at.
pub const MAX_USAGE_BODY: u64 = 16 << 20;

/// JSON of a response nested deeper than this is unreadable (`too_deep`): the usage scanner
/// keeps one bit per level.
pub const MAX_DEPTH: u8 = 64;
/// A usage path has 1 to 8 segments of 1 to 64 bytes of `[A-Za-z0-9_-]`.
pub const MAX_SEGMENTS: usize = 8;
pub const MAX_SEGMENT_LEN: usize = 64;
/// Characters of a Redis error kept in a log line (the rest shown as `…`).
pub const MAX_ERROR_TEXT: usize = 200;

// --- Bounds on what a worker holds in memory. ---

/// Entries of a worker's plan memo (`request::memo::PlanMemo`): a few thousand callers active
/// at once are each keyed once, in under a megabyte for usual rules.
pub const PLAN_MEMO_ENTRIES: usize = 4096;
/// Identities longer than this are keyed on every request, never memoized: it bounds what an
/// entry holds. API keys and client addresses are far shorter.
pub const MAX_MEMO_IDENTITY: usize = 256;
/// Keys one worker holds leases for at most: a lease table cannot grow with a key flood
/// (beyond it, requests are decided one by one).
pub const MAX_LEASED_KEYS: usize = 10_000;
/// Settlements kept for a later call at most (about 200 bytes each); beyond, the oldest are
/// dropped and counted in `ratelimit_usage_settlements_lost`.
pub const MAX_KEPT_SETTLEMENTS: usize = 4096;
/// Streams let through whose usage limits wait for their response headers: bounded, the
/// oldest settled beyond it as a response whose usage cannot be read (the estimate stands).
pub const MAX_METERED_STREAMS: usize = 16_384;
/// Keys one worker keeps state for; when full, the state that stops mattering first goes.
pub const LOCAL_MAX_ENTRIES: usize = 10_000;
/// Entries in a worker's table of recent identities' requests (which earn leases; a power of
/// two): 16 bytes each, 128 KiB per worker once a leasable request came.
pub const SIGHTING_ENTRIES: usize = 8192;
/// Calls given up on that a worker remembers, for a late answer to close its breaker (each
/// worker has at most 8 in flight).
pub const MAX_ABANDONED_CALLS: usize = 16;
/// Give-back calls one worker sends per tick at most: the rest waits for the next tick (a
/// Redis Cluster spreads keys over many slots).
pub const MAX_GIVE_BACK_CALLS: usize = 4;
/// Settlement calls in flight at most per worker: more settlements wait for their replies.
pub const MAX_SETTLEMENT_CALLS: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::fixtures::*;
    use crate::config::{
        show_duration, state_lifetime_ms, Algorithm, Calendar, CalendarUnit, Window,
    };
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

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
                            let limits = widest_limits(|_| r#""limit": 1, "window": "1s""#.to_string());
                            format!(
                                r#"{{"name": "{name}", "key": {{"from": ["{max_source}"]}}, "limits": [{}]}}"#,
                                limits.join(", ")
                            )
                        })
                        .collect::<Vec<_>>(),
                ),
                "rules[0]: a request it matches can need a bridge call of 57323 bytes (its limits and those of every rule whose match does not exclude it, with the longest identity): must be at most 49152",
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
    fn lifetimes_and_durations() {
        let year = Window::Fixed(MAX_WINDOW);
        let ms = MAX_WINDOW.as_millis();
        assert_eq!(
            state_lifetime_ms(Algorithm::TokenBucket, 1, year, 2),
            2 * ms
        );
        assert_eq!(state_lifetime_ms(Algorithm::Gcra, 3, Window::ms(10), 1), 4);
        assert_eq!(
            state_lifetime_ms(Algorithm::SlidingWindowCounter, 5, year, 5),
            2 * ms
        );
        assert_eq!(state_lifetime_ms(Algorithm::FixedWindow, 5, year, 5), ms);
        // A calendar month lives as long as the longest month.
        let month = Window::Calendar(Calendar {
            unit: CalendarUnit::Month,
            offset_minutes: -840,
        });
        assert_eq!(
            state_lifetime_ms(Algorithm::FixedWindow, 5, month, 5),
            31 * 86_400_000
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
