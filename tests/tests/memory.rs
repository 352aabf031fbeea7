//! Redis at its memory bound, end to end (real Envoy with 2 workers, Webdis, and Redis started
//! with the shipped envoy/redis.conf: `maxmemory 256mb`, `maxmemory-policy volatile-lru`).
//!
//! - At a bound that eviction can keep (the bound lowered at run time to a few MB above what
//!   Redis needs, then filled with other identities' buckets until Redis evicts), idle buckets
//!   are evicted and decisions go on: a known client gets exactly its limit, new identities are
//!   decided, and no override and no audit entry an operator made is evicted (they have no
//!   TTL, and only keys with one are evicted).
//! - At a bound that eviction cannot reach (below what Redis needs with no keys at all), or with
//!   `noeviction` once Redis is full, every decision call is refused by Redis (OOM: a function
//!   without the `allow-oom` flag is refused whole, before it runs, so nothing is half-written)
//!   and each rule's failure policy answers: fail open lets the request through, fail closed
//!   answers 503. Nothing hangs, Envoy stays up, and decisions resume once memory allows.
//!
//! The filler is written with the decision library itself (FCALL, one function for all calls):
//! filling with EVAL of a different script text per key would grow Redis's script cache,
//! which Redis 7.0 never evicts, until no eviction can get under the bound.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use e2e::procs::filter_config_edit;
use e2e::{wait_for, Envoy, Keys, Redis, RedisConn, Resp, Response, Stack};
use ratelimit_core::bridge::DecideCall;
use ratelimit_core::check::LimitCheck;
use ratelimit_core::testing::plan::token_bucket_check;

const MB: u64 = 1 << 20;
/// The shipped bound, which the tests check and put back.
const SHIPPED_MAXMEMORY: u64 = 256 * MB;
/// How long the tests wait for Redis to fill, evict or recover.
const PATIENCE: Duration = Duration::from_secs(60);

/// One admin connection for the whole test: each new connection costs Redis memory (its
/// buffers), which at a bound only a few MB above use is itself a reason to evict.
struct Admin(RedisConn);

impl Admin {
    fn new(redis: &Redis) -> Admin {
        Admin(redis.admin())
    }

    fn cmd(&mut self, args: &[&str]) -> Resp {
        self.0.cmd(args).expect("redis admin command")
    }

    fn info(&mut self, section: &str) -> HashMap<String, String> {
        self.cmd(&["INFO", section])
            .text()
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect()
    }

    /// A numeric field of `INFO section`.
    fn field(&mut self, section: &str, name: &str) -> u64 {
        let info = self.info(section);
        info.get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("INFO {section} has no number {name}"))
    }

    fn used_memory(&mut self) -> u64 {
        self.field("memory", "used_memory")
    }

    fn evicted_keys(&mut self) -> u64 {
        self.field("stats", "evicted_keys")
    }

    fn dbsize(&mut self) -> u64 {
        self.cmd(&["DBSIZE"]).int() as u64
    }

    fn config_get(&mut self, name: &str) -> String {
        let items = self.cmd(&["CONFIG", "GET", name]).items();
        items.get(1).map(Resp::text).unwrap_or_default()
    }

    fn config_set(&mut self, name: &str, value: &str) {
        let reply = self.cmd(&["CONFIG", "SET", name, value]);
        assert_eq!(
            reply,
            Resp::Simple("OK".into()),
            "CONFIG SET {name} {value}"
        );
    }

    /// One line on the memory state, for the test's output.
    fn memory_line(&mut self) -> String {
        let memory = self.info("memory");
        let get = |name: &str| memory.get(name).cloned().unwrap_or_default();
        format!(
            "used_memory={} maxmemory={} used_memory_dataset={} used_memory_scripts={} \
             mem_not_counted_for_evict={} keys={} evicted_keys={}",
            get("used_memory"),
            get("maxmemory"),
            get("used_memory_dataset"),
            get("used_memory_scripts"),
            get("mem_not_counted_for_evict"),
            self.dbsize(),
            self.evicted_keys()
        )
    }
}

/// The keys of the filter with [`DEMO_RULES`].
fn demo_keys() -> Keys {
    Keys::from_json(&filter_json(DEMO_RULES))
}

fn filler_identity(i: usize) -> String {
    format!("filler-{i}")
}

/// The demo rule's limit (token bucket, 10 per minute) on `key`, as the filter sends it.
fn demo_check(key: String) -> LimitCheck {
    LimitCheck {
        window: ratelimit_core::config::Window::ms(60_000),
        ..token_bucket_check(&key)
    }
}

/// Decides one request for each of the filler identities `from..from + count`, 64 per call,
/// through the admin connection and the decision function: each leaves the bucket the filter
/// would write for that identity (with its TTL). Returns the error texts of requests Redis
/// could not decide (a call Redis refused whole: its error once per request of the call).
fn fill(admin: &mut Admin, from: usize, count: usize) -> Vec<String> {
    let function = e2e::decision_function();
    let keys = demo_keys();
    let mut errors = Vec::new();
    let ids: Vec<usize> = (from..from + count).collect();
    for chunk in ids.chunks(64) {
        let checks: Vec<Vec<LimitCheck>> = chunk
            .iter()
            .map(|&i| vec![demo_check(keys.shipped_bucket(filler_identity(i)))])
            .collect();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos()
            .to_string();
        let command = DecideCall::new(&now, 0, checks.iter().map(Vec::as_slice))
            .command("FCALL", &function.handle);
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        // Over `maxmemory` Redis refuses the function whole (it has no `allow-oom` flag), one
        // error for the call: every request of the chunk undecided, nothing written.
        let items = match admin.cmd(&args) {
            Resp::Error(error) => {
                errors.extend(chunk.iter().map(|_| error.clone()));
                continue;
            }
            reply => reply.items(),
        };
        assert_eq!(items[0].int(), chunk.len() as i64, "{items:?}");
        let mut rest = &items[1..];
        for _ in chunk {
            // Per request: -1, "error", or committed, 1, then 4 values for its one limit.
            if rest[0] == Resp::Int(-1) {
                errors.push(rest[1].text());
                rest = &rest[2..];
            } else {
                rest = &rest[6..];
            }
        }
        assert!(rest.is_empty(), "reply read to its end");
    }
    errors
}

/// The rules' deadline: long enough that a request answered by Redis's OOM reply is told
/// apart from one that waited it out, even on a loaded machine. Each worker's circuit
/// breaker is off: after five OOM replies in a row it would open, and requests would then
/// follow the policy without asking Redis, while these tests watch each request's own reply.
const TIMEOUT: Duration = Duration::from_secs(1);

/// The filter's configuration with `rules` (JSON), the shipped bridge credentials, TIMEOUT,
/// and no circuit breaker.
fn filter_json(rules: &str) -> String {
    format!(
        r#"{{"bridge": {{"username": "ratelimit", "password": "ratelimit-demo-secret", "timeout": "{}ms"}},
"breaker": false,
"rules": {rules}}}"#,
        TIMEOUT.as_millis()
    )
}

/// Redis (shipped redis.conf), Webdis and Envoy (shipped envoy.yaml) with the filter of
/// [`filter_json`].
fn stack(name: &str, rules: &str) -> Stack {
    let (from, to) = filter_config_edit(&filter_json(rules));
    Stack::start(name, &[(&from, &to)])
}

/// A rule per API key, else per client IP, 10 per minute, overrides on: one bucket per made-up
/// key, which is what fills Redis here (the shipped demo also limits each address,
/// envoy/envoy.yaml).
const DEMO_RULES: &str = r#"[{"name": "per_client", "key": {"from": ["header:x-api-key", "client_ip"]},
  "limits": [{"name": "per_minute", "algorithm": "token_bucket", "limit": 10, "window": "1m", "overrides": true}]}]"#;

fn decided(r: &Response) -> bool {
    r.header("x-ratelimit-limit").is_some()
}

#[test]
fn at_the_bound_idle_buckets_are_evicted_and_a_known_client_still_gets_exactly_its_limit() {
    let s = stack("memory-lru-at-bound", DEMO_RULES);
    let mut admin = Admin::new(&s.redis);
    assert_eq!(admin.config_get("maxmemory-policy"), "volatile-lru");
    assert_eq!(admin.config_get("maxmemory"), SHIPPED_MAXMEMORY.to_string());
    // An operator's overrides, set before the flood: a raise, a block without expiry, a block
    // with one; each an audit entry.
    let config = s.dir.file("filter.json");
    std::fs::write(&config, filter_json(DEMO_RULES)).unwrap();
    let tool = e2e::admin::Admin::new(&s.redis, &config);
    for args in [
        &[
            "override",
            "set",
            "per_client",
            "rich",
            "per_minute",
            "--limit",
            "40",
        ][..],
        &[
            "override",
            "set",
            "per_client",
            "abuser",
            "per_minute",
            "--blocked",
        ],
        &[
            "override",
            "set",
            "per_client",
            "temp",
            "per_minute",
            "--blocked",
            "--expires",
            "1h",
        ],
    ] {
        tool.json(args);
    }
    let keys = demo_keys();
    let overrides: Vec<String> = ["rich", "abuser", "temp"]
        .iter()
        .map(|id| format!("{}:override", keys.shipped_bucket(id)))
        .collect();
    // The library loaded and Webdis connected: what Redis needs besides the buckets.
    assert!(decided(&s.envoy.keyed("warm-up")));
    let bound = admin.used_memory() + 4 * MB;
    admin.config_set("maxmemory", &bound.to_string());

    // Other identities' buckets until Redis evicts: it is at its bound.
    let mut written = 0;
    wait_for("redis to reach its bound and evict", PATIENCE, || {
        let errors = fill(&mut admin, written, 256);
        assert!(errors.is_empty(), "filling at the bound: {errors:?}");
        written += 256;
        (admin.evicted_keys() > 0).then_some(())
    });
    println!("filled: {written} buckets written; {}", admin.memory_line());
    let used = admin.used_memory();
    assert!(
        used >= bound - bound / 20,
        "used_memory {used} reached the bound {bound}"
    );
    // The filler stands for clients that were active before. Redis's LRU clock counts whole
    // seconds: a key written in the same second as the known client's bucket looks just as
    // recent. Wait until it sees the newest filler bucket idle.
    let newest = demo_keys().shipped_bucket(filler_identity(written - 1));
    wait_for("the filler to be idle to Redis", PATIENCE, || {
        let idle = admin.cmd(&["OBJECT", "IDLETIME", &newest]);
        matches!(idle, Resp::Int(seconds) if seconds >= 1).then_some(())
    });

    // A known client: exactly its 10, then 429, while new identities are decided between its
    // requests, other identities' buckets keep coming (256 more per request of the known
    // client: Redis's own buffers shrink and grow by more than the newcomers' buckets, which
    // alone might fit), and Redis evicts to make room for them. All within a few seconds: the
    // bucket gets a token back every 6 s.
    let evicted_before = admin.evicted_keys();
    let started = Instant::now();
    for i in 0..=10 {
        let errors = fill(&mut admin, written + 256 * i, 256);
        assert!(errors.is_empty(), "filling at the bound: {errors:?}");
        let r = s.envoy.keyed("known");
        if i < 10 {
            assert_eq!(r.status, 200, "known client, request {i}");
            let remaining = (9 - i).to_string();
            assert_eq!(
                r.header("x-ratelimit-remaining"),
                Some(remaining.as_str()),
                "known client, request {i}: its bucket was kept"
            );
        } else {
            assert_eq!(r.status, 429, "known client, request {i}: over its limit");
        }
        for j in 0..20 {
            let r = s.envoy.keyed(format!("newcomer-{i}-{j}"));
            assert_eq!(r.status, 200, "newcomer {i}-{j}");
            assert_eq!(
                r.header("x-ratelimit-remaining"),
                Some("9"),
                "newcomer {i}-{j} decided"
            );
        }
    }
    let evicted = admin.evicted_keys() - evicted_before;
    println!(
        "after the known client, 220 newcomers and 2,816 more buckets, in {:?}: {}",
        started.elapsed(),
        admin.memory_line()
    );
    assert!(
        evicted > 0,
        "Redis evicted while the known client was decided"
    );
    let pttl = admin
        .cmd(&["PTTL", &s.envoy.keys().shipped_bucket("known")])
        .int();
    assert!(pttl > 0, "the known client's bucket is there: PTTL {pttl}");
    // Half of what the buckets take is taken away: Redis evicts most of them, idle ones
    // first, and the operator's keys, idle since before the flood, would be among the first
    // if eviction could reach them.
    let keys_before = admin.dbsize();
    let halved = bound - (admin.used_memory().saturating_sub(bound / 2)) / 2;
    admin.config_set("maxmemory", &halved.to_string());
    wait_for("redis to evict down to the lower bound", PATIENCE, || {
        // Each write makes Redis evict until it is under its bound.
        let errors = fill(&mut admin, written + 10_000, 1);
        assert!(errors.is_empty(), "writing at the lower bound: {errors:?}");
        (admin.dbsize() < keys_before * 3 / 4).then_some(())
    });
    println!(
        "at the lower bound: {} of {keys_before} keys left; {}",
        admin.dbsize(),
        admin.memory_line()
    );
    for key in &overrides {
        assert_eq!(admin.cmd(&["EXISTS", key]).int(), 1, "{key} was evicted");
    }
    let audit = admin.cmd(&["XLEN", "rl:{admin}:audit"]).int();
    assert_eq!(audit, 3, "every audit entry kept");
    assert_eq!(
        s.envoy.keyed("abuser").status,
        429,
        "the block still decides"
    );
    let rich = s.envoy.keyed("rich");
    assert_eq!(
        rich.header("x-ratelimit-limit"),
        Some("40"),
        "the raise still decides"
    );
    assert_eq!(s.envoy.counter("ratelimit_bridge_errors"), 0);
    assert_eq!(s.envoy.counter("ratelimit_failure_mode_open"), 0);
}

/// Two rules on two paths, one failing open, one failing closed, the demo's limit.
const OPEN_AND_CLOSED_RULES: &str = r#"[
  {"name": "open_api", "match": {"path_prefix": "/open"}, "failure_mode": "open",
   "limits": [{"name": "per_minute", "limit": 10, "window": "1m"}]},
  {"name": "closed_api", "match": {"path_prefix": "/closed"}, "failure_mode": "closed",
   "limits": [{"name": "per_minute", "limit": 10, "window": "1m"}]}]"#;

/// Sends `n` requests on `path` for one API key; each must be answered with `status`, without
/// rate-limit headers, within the rules' TIMEOUT: by Redis's OOM reply, not by waiting it out
/// (the log check that goes with it shows no call timed out).
fn assert_failed_by_policy(envoy: &Envoy, path: &str, key: &str, n: usize, status: u16) {
    for i in 0..n {
        let started = Instant::now();
        let r = envoy.keyed_at(path, key);
        let took = started.elapsed();
        assert_eq!(r.status, status, "{path} request {i}: {}", r.text());
        assert!(!decided(&r), "{path} request {i} was not decided");
        assert!(took < TIMEOUT, "{path} request {i} took {took:?}");
        if status == 503 {
            assert_eq!(r.text(), "rate limiter unavailable\n");
        }
    }
}

/// The filter logged Redis's OOM refusal as the failure its policy handled.
fn assert_logged_oom(envoy: &Envoy) {
    wait_for("the filter to log the OOM refusal", PATIENCE, || {
        envoy
            .process
            .log_text()
            .lines()
            .any(|l| {
                l.contains("failure policy applied")
                    && l.contains("OOM command not allowed when used memory > 'maxmemory'")
            })
            .then_some(())
    });
    assert!(
        !envoy
            .process
            .log_text()
            .contains("no response from the bridge"),
        "no request waited for its timeout"
    );
}

#[test]
fn a_bound_eviction_cannot_reach_fails_every_decision_by_its_rules_failure_policy() {
    let mut s = stack("memory-oom-unreachable", OPEN_AND_CLOSED_RULES);
    let mut admin = Admin::new(&s.redis);
    assert!(decided(&s.envoy.keyed_at("/open", "warm-up")));
    assert!(decided(&s.envoy.keyed_at("/closed", "warm-up")));
    let errors = fill(&mut admin, 0, 1_000);
    assert!(errors.is_empty(), "{errors:?}");
    let keys = admin.dbsize();

    // Half of what Redis needed at start-up, before any client or key: evicting every key
    // cannot get under it.
    let bound = admin.field("memory", "used_memory_startup") / 2;
    admin.config_set("maxmemory", &bound.to_string());
    wait_for("redis to evict every key", PATIENCE, || {
        (admin.dbsize() == 0).then_some(())
    });
    println!(
        "bound {bound} below the keyless footprint: {}",
        admin.memory_line()
    );
    assert!(admin.evicted_keys() >= keys, "every key was evicted");
    assert!(
        admin.used_memory() > bound,
        "and Redis is still above its bound"
    );

    // More requests than the limit: none is decided, the rule's policy answers each.
    let open_before = s.envoy.counter("ratelimit_failure_mode_open");
    assert_failed_by_policy(&s.envoy, "/open", "client", 12, 200);
    assert_eq!(
        s.envoy.counter("ratelimit_failure_mode_open"),
        open_before + 12
    );
    let closed_before = s.envoy.counter("ratelimit_failure_mode_closed");
    assert_failed_by_policy(&s.envoy, "/closed", "client", 12, 503);
    assert_eq!(
        s.envoy.counter("ratelimit_failure_mode_closed"),
        closed_before + 12
    );
    assert_logged_oom(&s.envoy);
    assert_eq!(admin.dbsize(), 0, "no bucket was written");
    s.envoy.process.assert_running();

    // Memory back: decisions resume by themselves, from full buckets (nothing was charged).
    admin.config_set("maxmemory", &SHIPPED_MAXMEMORY.to_string());
    let r = wait_for("decisions to resume", PATIENCE, || {
        Some(s.envoy.keyed_at("/open", "client")).filter(decided)
    });
    assert_eq!(r.header("x-ratelimit-remaining"), Some("9"));
    let r = s.envoy.keyed_at("/closed", "client");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("9"));
}

#[test]
fn with_noeviction_a_full_redis_refuses_every_write_and_the_limit_holds_for_no_one() {
    let mut s = stack("memory-noeviction", DEMO_RULES);
    let mut admin = Admin::new(&s.redis);
    // A known client spends 3 of its 10.
    for remaining in ["9", "8", "7"] {
        let r = s.envoy.keyed("known");
        assert_eq!(r.header("x-ratelimit-remaining"), Some(remaining));
    }
    // Redis full of keys it may not evict: about 1 MB of other identities' buckets, then the
    // bound half a MB below what is used, as when the data outgrows a noeviction bound.
    admin.config_set("maxmemory-policy", "noeviction");
    let errors = fill(&mut admin, 0, 4_000);
    assert!(errors.is_empty(), "{errors:?}");
    let bound = admin.used_memory() - MB / 2;
    admin.config_set("maxmemory", &bound.to_string());
    let errors = fill(&mut admin, 4_000, 64);
    assert_eq!(errors.len(), 64, "every decision refused: {errors:?}");
    assert!(
        errors
            .iter()
            .all(|e| e.starts_with("OOM command not allowed")),
        "{errors:?}"
    );
    println!("full with noeviction: {}", admin.memory_line());
    assert_eq!(admin.evicted_keys(), 0);

    // Every decision call is refused whole (OOM): the known client and a new one pass
    // by the failure policy (open), far beyond the limit, and nothing is charged.
    let open_before = s.envoy.counter("ratelimit_failure_mode_open");
    assert_failed_by_policy(&s.envoy, "/", "known", 15, 200);
    assert_failed_by_policy(&s.envoy, "/", "newcomer", 15, 200);
    assert_eq!(
        s.envoy.counter("ratelimit_failure_mode_open"),
        open_before + 30
    );
    assert_logged_oom(&s.envoy);
    let tokens = admin
        .cmd(&["HGET", &s.envoy.keys().shipped_bucket("known"), "tokens"])
        .text();
    let tokens: f64 = tokens.parse().expect("the known client's bucket is kept");
    assert!((7.0..8.0).contains(&tokens), "nothing charged: {tokens}");
    assert_eq!(
        admin
            .cmd(&["EXISTS", &s.envoy.keys().shipped_bucket("newcomer")])
            .int(),
        0,
        "no bucket for the newcomer"
    );
    s.envoy.process.assert_running();

    // The shipped policy instead: Redis evicts, and decisions resume at once.
    admin.config_set("maxmemory-policy", "volatile-lru");
    let r = wait_for("decisions to resume", PATIENCE, || {
        Some(s.envoy.keyed("newcomer")).filter(decided)
    });
    assert_eq!(r.header("x-ratelimit-remaining"), Some("9"));
    assert!(admin.evicted_keys() > 0);
}
