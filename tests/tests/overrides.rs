//! Overrides end to end: an operator's override of one identity's limit, written in Redis,
//! decides on two Envoys of two workers each from their next call, and what a worker holds
//! from before (a refusal in its deny cache) gives way within the bound of
//! `OVERRIDE_STALE_MS`. Real Envoys, Webdis and Redis; the shipped defaults (deny cache on).

use std::time::{Duration, Instant};

use e2e::{
    clear_of_window_end, wait_for, wait_until, Envoy, Redis, Webdis, WorkDir, HOUR, TEST_SPAN,
};
use ratelimit_core::bounds::OVERRIDE_STALE_MS;

/// 5 an hour per API key in a fixed window (nothing comes back during a test), overrides on.
const CONFIG: &str = r#"{"bridge": {"username": "ratelimit", "password": "ratelimit-demo-secret"},
"rules": [{"name": "api", "key": {"from": ["header:x-api-key"]},
  "limits": [{"name": "quota", "algorithm": "fixed_window", "limit": 5, "window": "1h", "overrides": true}]}]}"#;

struct Fleet {
    _dir: WorkDir,
    redis: Redis,
    _webdis: Webdis,
    replicas: [Envoy; 2],
}

fn fleet(name: &str) -> Fleet {
    clear_of_window_end(HOUR, TEST_SPAN);
    let dir = WorkDir::new(name);
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let replicas = [
        Envoy::start_filter(&dir, webdis.port, CONFIG, 2),
        Envoy::start_filter(&dir, webdis.port, CONFIG, 2),
    ];
    Fleet {
        _dir: dir,
        redis,
        _webdis: webdis,
        replicas,
    }
}

impl Fleet {
    fn state_key(&self, api_key: &str) -> String {
        self.replicas[0]
            .keys()
            .limit_key("api", "quota", "header:x-api-key", api_key.as_bytes())
    }

    fn override_key(&self, api_key: &str) -> String {
        format!("{}:override", self.state_key(api_key))
    }

    fn set(&self, api_key: &str, fields: &[&str]) {
        let key = self.override_key(api_key);
        let mut admin = self.redis.admin();
        admin.cmd(&["DEL", &key]).unwrap();
        let mut command = vec!["HSET", key.as_str()];
        command.extend_from_slice(fields);
        admin.cmd(&command).unwrap();
    }

    /// `n` requests of `api_key`, alternating between the replicas: how many were allowed.
    fn allowed(&self, api_key: &str, n: usize) -> usize {
        (0..n)
            .filter(|i| self.replicas[i % 2].keyed(api_key).status == 200)
            .count()
    }

    /// Sends `api_key` requests to each replica (a few per worker, so every worker is seen)
    /// until one is refused on each: then each replica holds the refusal in its deny cache.
    fn refuse_everywhere(&self, api_key: &str) {
        for e in &self.replicas {
            for _ in 0..4 {
                assert_eq!(e.keyed(api_key).status, 429);
            }
        }
    }

    /// Waits until filter counter `name`, summed over the replicas, is at least `want` (counts
    /// reach the stats at a worker's next tick).
    fn wait_count(&self, name: &str, want: u64) {
        wait_until(
            name,
            Duration::from_secs(10),
            || self.replicas.iter().map(|e| e.counter(name)).sum::<u64>(),
            |n| *n >= want,
        );
    }

    /// From now, asks each replica for `api_key` every 50 ms until one allows it. Returns
    /// when the last refused request was sent (a request sent later than the bound after a
    /// change must be decided under it, however long its answer takes), and how many were
    /// allowed.
    fn last_refusal(&self, api_key: &str) -> (Duration, usize) {
        let start = Instant::now();
        let mut last_refused = Duration::ZERO;
        let mut allowed = 0;
        for e in &self.replicas {
            wait_for("an allowed request", Duration::from_secs(10), || {
                let sent = start.elapsed();
                if e.keyed(api_key).status == 200 {
                    allowed += 1;
                    return Some(());
                }
                last_refused = last_refused.max(sent);
                std::thread::sleep(Duration::from_millis(50)); // pacing the asks
                None
            });
        }
        (last_refused, allowed)
    }
}

/// A request sent later than this after a change is decided under it: the bound, and a
/// margin between the change and the test's clock.
fn bound() -> Duration {
    Duration::from_millis(OVERRIDE_STALE_MS + 20)
}

#[test]
fn an_override_raising_or_lowering_a_limit_decides_exactly_on_both_replicas() {
    let f = fleet("overrides-limit");
    // Raised before the first request: exactly the override's 20, on both replicas.
    f.set("raised", &["mode", "limit", "limit", "20"]);
    assert_eq!(f.allowed("raised", 40), 20);
    let refused = f.replicas[1].keyed("raised");
    assert_eq!(refused.header("x-ratelimit-limit"), Some("20"));
    // Lowered after 2 of 5 were spent: 1 more, the new allowance of 3 in all.
    assert_eq!(f.allowed("lowered", 2), 2);
    f.set("lowered", &["mode", "limit", "limit", "3"]);
    assert_eq!(f.allowed("lowered", 20), 1);
    // Raised after the 5 were spent and refused everywhere: each replica's deny cache gives
    // way within the bound, then exactly 10 - 5 more.
    assert_eq!(f.allowed("late", 5), 5);
    f.refuse_everywhere("late");
    f.set("late", &["mode", "limit", "limit", "10"]);
    let (waited, allowed) = f.last_refusal("late");
    println!("raised after refusals: the last refusal was sent after {waited:?}");
    assert!(waited <= bound(), "{waited:?} > {:?}", bound());
    assert_eq!(allowed + f.allowed("late", 20), 5);
    // Every decision under an override is counted per limit.
    // (Refusals served from a deny cache are not decisions.)
    f.wait_count("ratelimit_rule.api.quota.overridden", 20 + 1 + 5);
}

#[test]
fn unlimited_blocked_expiry_and_reset_take_effect_within_the_bound() {
    let f = fleet("overrides-modes");
    f.set("vip", &["mode", "unlimited"]);
    assert_eq!(f.allowed("vip", 30), 30);
    let r = f.replicas[0].keyed("vip");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-ratelimit-limit"),
        None,
        "an unlimited limit shows nothing"
    );

    // Blocked without expiry: refused with a limit of 0, and no Retry-After or reset (there
    // is no time to wait for, and the limit is never whole again).
    f.set("abuser", &["mode", "blocked"]);
    let r = f.replicas[0].keyed("abuser");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(r.header("x-ratelimit-limit"), Some("0"));
    assert_eq!(r.header("x-ratelimit-reset"), None);
    // Blocked until a time: once the bound has passed, Retry-After is the block's TTL.
    let key = f.override_key("abuser");
    f.redis.admin().cmd(&["PEXPIRE", &key, "60000"]).unwrap();
    let retry = wait_for(
        "a Retry-After from the block's TTL",
        Duration::from_secs(10),
        || {
            let r = f.replicas[1].keyed("abuser");
            assert_eq!(r.status, 429);
            r.header("retry-after").map(str::to_string)
        },
    );
    let retry: u64 = retry.parse().unwrap();
    assert!((55..=60).contains(&retry), "Retry-After {retry}");
    let r = f.replicas[1].keyed("abuser");
    let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!((55..=60).contains(&reset), "X-RateLimit-Reset {reset}");
    // The block ends (here: expired now): allowed on both replicas within the bound.
    f.redis.admin().cmd(&["PEXPIREAT", &key, "1"]).unwrap();
    let (waited, _) = f.last_refusal("abuser");
    assert!(waited <= bound(), "unblocked after {waited:?}");

    // A reset (the state deleted, as `ratelimit-admin reset` does) unblocks a refusal cached
    // on both replicas within the bound, and the identity starts afresh: exactly 5.
    assert_eq!(f.allowed("stuck", 5), 5);
    f.refuse_everywhere("stuck");
    f.redis
        .admin()
        .cmd(&["DEL", &f.state_key("stuck")])
        .unwrap();
    let (waited, allowed) = f.last_refusal("stuck");
    assert!(waited <= bound(), "reset seen after {waited:?}");
    assert_eq!(allowed + f.allowed("stuck", 20), 5);
}

#[test]
fn a_malformed_override_is_counted_and_the_config_decides() {
    let f = fleet("overrides-malformed");
    f.set("typo", &["mode", "limit", "limit", "ten"]);
    assert_eq!(f.allowed("typo", 10), 5);
    f.wait_count("ratelimit_rule.api.quota.bad_override", 5);
    for e in &f.replicas {
        assert_eq!(e.counter("ratelimit_bridge_errors"), 0);
        assert_eq!(e.counter("ratelimit_failure_mode_open"), 0);
    }
}
