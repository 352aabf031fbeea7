//! lua/token_bucket.lua against a real Redis, run as the restricted user Webdis logs in as
//! (so these tests also prove the shipped ACL lets the script do its work), with the clock
//! injected: exhaust, advance, check the exact refill. No sleeps.

use e2e::{Redis, RedisConn, Resp, WorkDir};

const T0: u128 = 1_764_489_600_000_000_000; // 2025-11-30T08:00:00Z in ns
const MS: u128 = 1_000_000;
const S: u128 = 1_000_000_000;

struct Bucket {
    conn: RedisConn,
    sha: String,
    key: String,
    rate: String,
    capacity: String,
}

impl Bucket {
    fn new(redis: &Redis, key: &str, rate: &str, capacity: u64) -> Bucket {
        let mut conn = redis.webdis_user();
        let sha = conn
            .cmd(&["SCRIPT", "LOAD", ratelimit_core::TOKEN_BUCKET_LUA])
            .unwrap()
            .text();
        assert_eq!(
            sha,
            e2e::script_sha(),
            "Redis and the filter name the script alike"
        );
        Bucket {
            conn,
            sha,
            key: key.to_string(),
            rate: rate.to_string(),
            capacity: capacity.to_string(),
        }
    }

    fn take(&mut self, now: u128, requested: u64) -> (i64, String, String) {
        let reply = self.call(now, requested);
        let items = reply.items();
        (items[0].int(), items[1].text(), items[2].text())
    }

    fn call(&mut self, now: u128, requested: u64) -> Resp {
        self.conn
            .cmd(&[
                "EVALSHA",
                &self.sha,
                "1",
                &self.key,
                &self.rate,
                &self.capacity,
                &now.to_string(),
                &requested.to_string(),
            ])
            .unwrap()
    }
}

/// One Redis for this file's tests; each test uses its own key.
fn redis(name: &str) -> (WorkDir, Redis) {
    let dir = WorkDir::new(name);
    let redis = Redis::start(&dir);
    (dir, redis)
}

/// `(now, cost, allowed, remaining, retry_after_ms)`, in order, on one bucket.
type Case = (u128, u64, i64, &'static str, &'static str);

fn run_cases(bucket: &mut Bucket, cases: &[Case]) {
    for (i, &(now, cost, allowed, remaining, retry)) in cases.iter().enumerate() {
        let got = bucket.take(now, cost);
        assert_eq!(
            got,
            (allowed, remaining.to_string(), retry.to_string()),
            "case {i}: now=T0+{}ms cost={cost}",
            (now - T0) / MS
        );
    }
}

#[test]
fn exhaust_advance_and_refill_exactly() {
    let (_dir, redis) = redis("lua-exhaust");
    // capacity 5, 2 tokens/s: one token every 500 ms.
    let mut b = Bucket::new(&redis, "rl:test:exhaust", "2", 5);
    run_cases(
        &mut b,
        &[
            (T0, 1, 1, "4", "0"),
            (T0, 1, 1, "3", "0"),
            (T0, 1, 1, "2", "0"),
            (T0, 1, 1, "1", "0"),
            (T0, 1, 1, "0", "0"),
            (T0, 1, 0, "0", "500"),
            (T0 + 250 * MS, 1, 0, "0.5", "250"),
            (T0 + 375 * MS, 1, 0, "0.75", "125"),
            (T0 + 500 * MS, 1, 1, "0", "0"),
            (T0 + 1500 * MS, 3, 0, "2", "500"),
            (T0 + 2000 * MS, 3, 1, "0", "0"),
        ],
    );
}

#[test]
fn refill_is_capped_at_capacity() {
    let (_dir, redis) = redis("lua-cap");
    let mut b = Bucket::new(&redis, "rl:test:cap", "2", 3);
    run_cases(
        &mut b,
        &[
            (T0, 3, 1, "0", "0"),
            // A day idle refills to capacity, not beyond.
            (T0 + 86_400 * S, 1, 1, "2", "0"),
            (T0 + 86_400 * S, 2, 1, "0", "0"),
            (T0 + 86_400 * S, 1, 0, "0", "500"),
        ],
    );
}

#[test]
fn fractional_tokens_and_rates() {
    let (_dir, redis) = redis("lua-fraction");
    // 10 tokens per minute, as in the demo policy.
    let mut b = Bucket::new(&redis, "rl:test:fraction", &(10.0f64 / 60.0).to_string(), 2);
    run_cases(
        &mut b,
        &[
            (T0, 2, 1, "0", "0"),
            (T0 + 3 * S, 1, 0, "0.5", "3000"),
            (T0 + 6 * S, 1, 1, "0", "0"),
            (T0 + 7500 * MS, 1, 0, "0.25", "4500"),
        ],
    );
    // A cost above capacity can never pass; the wait says how long that would take.
    let mut big = Bucket::new(&redis, "rl:test:fraction-big", "0.5", 2);
    run_cases(&mut big, &[(T0, 3, 0, "2", "2000")]);
}

#[test]
fn elapsed_time_is_exact_to_the_nanosecond() {
    let (_dir, redis) = redis("lua-ns");
    // One token per nanosecond: a double holding ~1.8e18 could not tell these instants apart.
    let mut b = Bucket::new(&redis, "rl:test:ns", "1000000000", 10);
    run_cases(
        &mut b,
        &[
            (T0 + 1, 10, 1, "0", "0"),
            (T0 + 4, 3, 1, "0", "0"),
            (T0 + 5, 2, 0, "1", "1"),
        ],
    );
}

#[test]
fn a_clock_that_goes_backwards_refills_nothing_and_is_not_stored() {
    let (_dir, redis) = redis("lua-backwards");
    let mut b = Bucket::new(&redis, "rl:test:back", "1", 2);
    run_cases(
        &mut b,
        &[
            (T0 + 10 * S, 2, 1, "0", "0"),
            // 5 s in the past: no tokens appear, none go negative.
            (T0 + 5 * S, 1, 0, "0", "1000"),
        ],
    );
    let mut admin = redis.admin();
    let ts = admin.cmd(&["HGET", "rl:test:back", "ts"]).unwrap().text();
    assert_eq!(
        ts,
        (T0 + 10 * S).to_string(),
        "the stored time did not move back"
    );
    // Back on time: only the half second since the latest decision counts.
    run_cases(&mut b, &[(T0 + 10 * S + 500 * MS, 1, 0, "0.5", "500")]);
}

#[test]
fn state_expires_once_it_could_have_refilled() {
    let (_dir, redis) = redis("lua-ttl");
    // capacity 5 at 2/s refills in 2.5 s: TTL = ceil(2.5) + 60 = 63 s.
    let mut b = Bucket::new(&redis, "rl:test:ttl", "2", 5);
    b.take(T0, 1);
    let mut admin = redis.admin();
    let pttl = admin.cmd(&["PTTL", "rl:test:ttl"]).unwrap().int();
    assert!((62_000..=63_000).contains(&pttl), "PTTL {pttl}");
    let fields = admin.cmd(&["HGETALL", "rl:test:ttl"]).unwrap().text();
    assert_eq!(fields, format!("[tokens, 4, ts, {T0}]"));
}

#[test]
fn bad_arguments_are_an_error_not_a_decision() {
    let (_dir, redis) = redis("lua-badargs");
    for (rate, capacity, now) in [
        ("0", "5", "1"),
        ("1", "0", "1"),
        ("x", "5", "1"),
        ("1", "5", "-1"),
        ("1", "5", "1.5"),
    ] {
        let mut conn = redis.webdis_user();
        let sha = e2e::script_sha();
        conn.cmd(&["SCRIPT", "LOAD", ratelimit_core::TOKEN_BUCKET_LUA])
            .unwrap();
        let reply = conn
            .cmd(&[
                "EVALSHA",
                &sha,
                "1",
                "rl:test:bad",
                rate,
                capacity,
                now,
                "1",
            ])
            .unwrap();
        match reply {
            Resp::Error(message) => assert!(message.contains("bad arguments"), "{message}"),
            other => panic!(
                "rate={rate} capacity={capacity} now={now}: expected an error, got {other:?}"
            ),
        }
    }
}

#[test]
fn the_restricted_user_can_touch_only_limiter_keys() {
    let (_dir, redis) = redis("lua-acl");
    let mut b = Bucket::new(&redis, "not-a-limiter-key", "1", 1);
    match b.call(T0, 1) {
        Resp::Error(message) => assert!(message.starts_with("NOPERM"), "{message}"),
        other => panic!("expected NOPERM, got {other:?}"),
    }
    let mut conn = redis.webdis_user();
    for command in [
        &["FLUSHALL"][..],
        &["KEYS", "*"],
        &["CONFIG", "GET", "*"],
        &["EVAL", "return 1", "0"],
        &["SCRIPT", "FLUSH"],
    ] {
        match conn.cmd(command).unwrap() {
            Resp::Error(message) => {
                assert!(message.starts_with("NOPERM"), "{command:?}: {message}")
            }
            other => panic!("{command:?} should be refused, got {other:?}"),
        }
    }
}
