//! Each algorithm of the decision script (lua/*.lua, as the filter embeds it) against a real
//! Redis, run as the restricted user Webdis logs in as, with the clock injected: the case table
//! the Rust twin is held to too, fractions and nanoseconds, clocks that go backwards, the boundary
//! burst, Redis `TIME`, expiry, and the largest values the configuration accepts. No sleeps.

use e2e::script::*;

#[test]
fn token_bucket_exhausts_refills_exactly_and_caps() {
    let (_dir, redis) = start("lua-token-bucket");
    run_table(&mut Script::new(&redis), "rl:t:tb", &cases::TOKEN_BUCKET);
}

#[test]
fn token_bucket_fractions_and_nanoseconds() {
    let (_dir, _redis, mut s) = script("lua-token-bucket-fraction");
    // The demo policy: 10 per minute, one token every 6 s.
    let demo = limit("rl:t:frac", Algorithm::TokenBucket, 10, 60_000).with_burst(2);
    run_cases(
        &mut s,
        &demo,
        &[
            (T0, 2, 1, "0", "12000", "0"),
            (T0 + 3 * S, 1, 0, "0.5", "9000", "3000"),
            (T0 + 6 * S, 1, 1, "0", "12000", "0"),
            (T0 + 7500 * MS, 1, 0, "0.25", "10500", "4500"),
        ],
    );
    // One token per nanosecond: a double holding ~1.8e18 could not tell these instants apart.
    let ns = limit("rl:t:ns", Algorithm::TokenBucket, 1_000_000_000, 1000).with_burst(10);
    run_cases(
        &mut s,
        &ns,
        &[
            (T0 + 1, 10, 1, "0", "1", "0"),
            (T0 + 4, 3, 1, "0", "1", "0"),
            (T0 + 5, 2, 0, "1", "1", "1"),
        ],
    );
}

#[test]
fn token_bucket_ignores_a_clock_that_goes_backwards() {
    let (_dir, redis, mut s) = script("lua-token-bucket-back");
    let tb = limit("rl:t:back", Algorithm::TokenBucket, 1, 1000).with_burst(2);
    run_cases(
        &mut s,
        &tb,
        &[
            (T0 + 10 * S, 2, 1, "0", "2000", "0"),
            // 5 s in the past: no tokens appear, none go negative, and the waits count from
            // the stored time, 5 s ahead of this clock.
            (T0 + 5 * S, 1, 0, "0", "7000", "6000"),
        ],
    );
    let ts = redis.hash_field("rl:t:back", "ts");
    assert_eq!(
        ts,
        (T0 + 10 * S).to_string(),
        "the stored time did not move back"
    );
    // Back on time: only the half second since the latest decision counts.
    run_cases(
        &mut s,
        &tb,
        &[(T0 + 10 * S + 500 * MS, 1, 0, "0.5", "1500", "500")],
    );
}

#[test]
fn gcra_spaces_requests_and_allows_the_burst() {
    let (_dir, redis) = start("lua-gcra");
    run_table(&mut Script::new(&redis), "rl:t:gcra", &cases::GCRA);
}

#[test]
fn fixed_window_allows_a_burst_at_the_boundary_that_sliding_windows_prevent() {
    let (_dir, _redis, mut s) = script("lua-boundary");
    // 5 per second. 5 requests at the last millisecond of a window, 5 at the first of the next.
    let mut allowed = Vec::new();
    for (algorithm, key) in [
        (Algorithm::FixedWindow, "rl:t:b-fixed"),
        (Algorithm::SlidingWindowCounter, "rl:t:b-counter"),
        (Algorithm::SlidingWindowLog, "rl:t:b-log"),
    ] {
        let l = limit(key, algorithm, 5, 1000);
        let mut n = 0;
        for now in [T0 + 999 * MS, T0 + 1000 * MS] {
            for _ in 0..5 {
                n += s.one(now, &l).0;
            }
        }
        allowed.push((algorithm, n));
    }
    assert_eq!(
        allowed,
        vec![
            (Algorithm::FixedWindow, 10),
            (Algorithm::SlidingWindowCounter, 5),
            (Algorithm::SlidingWindowLog, 5)
        ],
        "requests allowed within 2 ms under a limit of 5 per second"
    );
}

#[test]
fn fixed_window_counts_per_aligned_window() {
    let (_dir, redis) = start("lua-fixed");
    run_table(&mut Script::new(&redis), "rl:t:fixed", &cases::FIXED_WINDOW);
}

#[test]
fn fixed_window_counts_per_calendar_month() {
    let (_dir, redis) = start("lua-fixed-month");
    run_table(
        &mut Script::new(&redis),
        "rl:t:fixed-month",
        &cases::FIXED_WINDOW_MONTH,
    );
}

#[test]
fn sliding_window_counter_weights_the_previous_window() {
    let (_dir, redis) = start("lua-sliding-counter");
    let table = &cases::SLIDING_WINDOW_COUNTER;
    run_table(&mut Script::new(&redis), "rl:t:swc", table);
}

#[test]
fn sliding_window_log_is_exact() {
    let (_dir, redis) = start("lua-sliding-log");
    run_table(
        &mut Script::new(&redis),
        "rl:t:swl",
        &cases::SLIDING_WINDOW_LOG,
    );
    let entries = redis.admin().cmd(&["ZCARD", "rl:t:swl"]).unwrap().int();
    assert_eq!(entries, 3, "old entries are trimmed");
}

#[test]
fn redis_clock_decides_with_redis_time() {
    let (_dir, redis, mut s) = script("lua-redis-clock");
    let l = limit("rl:t:clock", Algorithm::TokenBucket, 1, 86_400_000).with_burst(2);
    for expected in [1, 1, 0] {
        let items = s.call("redis", std::slice::from_ref(&l)).items();
        assert_eq!(items[1].int(), expected);
    }
    let ts: u128 = redis.hash_field("rl:t:clock", "ts").parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    assert!(
        now.abs_diff(ts) < 60 * S,
        "stored time {ts} is Redis's own clock"
    );
}

#[test]
fn state_expires_once_it_no_longer_matters() {
    let (_dir, redis, mut s) = script("lua-ttl");
    let limits = [
        // 5 at 2/s refill in 2.5 s; + 60 s.
        (
            limit("rl:t:ttl-tb", Algorithm::TokenBucket, 2, 1000).with_burst(5),
            62_500,
        ),
        // TAT 100 ms ahead; + 60 s.
        (limit("rl:t:ttl-gcra", Algorithm::Gcra, 10, 1000), 60_100),
        // The window ends in 1 s; + 60 s.
        (
            limit("rl:t:ttl-fixed", Algorithm::FixedWindow, 10, 1000),
            61_000,
        ),
        // Both windows are out of reach in 2 s; + 60 s.
        (
            limit("rl:t:ttl-swc", Algorithm::SlidingWindowCounter, 10, 1000),
            62_000,
        ),
        // The entry leaves the window in 1 s; + 60 s.
        (
            limit("rl:t:ttl-swl", Algorithm::SlidingWindowLog, 10, 1000),
            61_000,
        ),
    ];
    let mut admin = redis.admin();
    for (l, ttl) in limits {
        assert_eq!(s.one(T0, &l).0, 1);
        let pttl = admin.cmd(&["PTTL", l.key]).unwrap().int();
        assert!(
            (ttl - 1000..=ttl).contains(&pttl),
            "{}: PTTL {pttl}, want about {ttl}",
            l.algorithm.name()
        );
    }
}

#[test]
fn the_largest_values_the_config_accepts_keep_every_number_exact() {
    use ratelimit_core::bounds::{MAX_LIMIT, MAX_LOG_LIMIT, MAX_STATE_LIFETIME, MAX_WINDOW};
    let (_dir, redis, mut s) = script("lua-bounds");
    let w = MAX_WINDOW.as_millis() as u64;
    let lifetime = MAX_STATE_LIFETIME.as_millis() as i64;
    let big = |key, algorithm| L {
        burst: MAX_LIMIT,
        ..limit(key, algorithm, MAX_LIMIT, w)
    };
    // T0 lies 25,257,600,000 ms into its 366-day window (aligned to the Unix epoch).
    let into = 25_257_600_000;
    let cases: [(L, &str, i64); 7] = [
        // burst 2 at 1 per 366 days: full again in 732 days, the longest state.
        (
            limit("rl:t:max-tb2", Algorithm::TokenBucket, 1, w).with_burst(2),
            "1",
            lifetime,
        ),
        (
            limit("rl:t:max-gcra2", Algorithm::Gcra, 1, w).with_burst(2),
            "1",
            w as i64,
        ),
        // A bucket expires once it would be full again; GCRA once its TAT (here one
        // 1/31,622,400,000 ms interval ahead, rounded up) has passed.
        (
            big("rl:t:max-tb", Algorithm::TokenBucket),
            "999999999999",
            w as i64,
        ),
        (big("rl:t:max-gcra", Algorithm::Gcra), "999999999999", 1),
        (
            limit("rl:t:max-fixed", Algorithm::FixedWindow, MAX_LIMIT, w),
            "999999999999",
            w as i64 - into,
        ),
        (
            limit(
                "rl:t:max-swc",
                Algorithm::SlidingWindowCounter,
                MAX_LIMIT,
                w,
            ),
            "999999999999",
            2 * w as i64 - into,
        ),
        (
            limit(
                "rl:t:max-swl",
                Algorithm::SlidingWindowLog,
                MAX_LOG_LIMIT,
                w,
            ),
            "9999",
            w as i64,
        ),
    ];
    let mut admin = redis.admin();
    for (l, remaining, ttl) in cases {
        let (allowed, got_remaining, _, _) = s.one(T0, &l);
        assert_eq!(
            (allowed, got_remaining.as_str()),
            (1, remaining),
            "{}",
            l.key
        );
        // PEXPIRE got a whole number: the state's lifetime + the scripts' 60 s (+ 1 ms where
        // the script's division in doubles lands a hair above and rounds up).
        let ttl = ttl + 60_000;
        let pttl = admin.cmd(&["PTTL", l.key]).unwrap().int();
        assert!(
            (ttl - 1000..=ttl + 1).contains(&pttl),
            "{}: PTTL {pttl}, want {ttl}",
            l.key
        );
    }
    // What the bounds prevent: with a window of 99999999999 days PEXPIRE's argument is a
    // number Redis writes in exponent form, and every decision fails.
    let huge = limit(
        "rl:t:huge",
        Algorithm::FixedWindow,
        1,
        99_999_999_999 * 86_400_000,
    );
    match s.decide_batch(T0, &[&[huge]]).remove(0) {
        Err(message) => assert!(message.contains("not an integer"), "{message}"),
        other => panic!("expected PEXPIRE to fail, got {other:?}"),
    }
}
