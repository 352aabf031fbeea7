//! The decision script (lua/*.lua, as the filter embeds it) against a real Redis, run as the
//! restricted user Webdis logs in as (so these tests also prove the shipped ACL lets every
//! algorithm do its work), with the clock injected: exhaust, advance, check. No sleeps.

use e2e::{Redis, RedisConn, Resp, WorkDir};

const T0: u128 = 1_764_489_600_000_000_000; // a whole second (and minute) in Unix ns
const MS: u128 = 1_000_000;
const S: u128 = 1_000_000_000;

/// One limit as the filter sends it.
#[derive(Clone)]
struct L {
    key: &'static str,
    algorithm: &'static str,
    limit: u64,
    window_ms: u64,
    burst: u64,
    cost: u64,
    shadow: bool,
}

fn limit(key: &'static str, algorithm: &'static str, limit: u64, window_ms: u64) -> L {
    L {
        key,
        algorithm,
        limit,
        window_ms,
        burst: limit,
        cost: 1,
        shadow: false,
    }
}

/// One limit's answer: (allowed, remaining, reset_ms, retry_ms).
type Answer = (i64, String, String, String);

struct Script {
    conn: RedisConn,
    sha: String,
}

impl Script {
    fn new(redis: &Redis) -> Script {
        let mut conn = redis.webdis_user();
        let sha = conn
            .cmd(&["SCRIPT", "LOAD", ratelimit_core::DECISION_LUA])
            .unwrap()
            .text();
        assert_eq!(
            sha,
            e2e::script_sha(),
            "Redis and the filter name the script alike"
        );
        Script { conn, sha }
    }

    fn call(&mut self, clock: &str, limits: &[L]) -> Resp {
        let n = limits.len().to_string();
        let mut args: Vec<String> = vec!["EVALSHA".into(), self.sha.clone(), n.clone()];
        args.extend(limits.iter().map(|l| l.key.to_string()));
        args.push(clock.into());
        args.push(n);
        for l in limits {
            args.extend([
                l.algorithm.to_string(),
                l.limit.to_string(),
                l.window_ms.to_string(),
                l.burst.to_string(),
                l.cost.to_string(),
                if l.shadow { "shadow" } else { "enforce" }.to_string(),
            ]);
        }
        self.conn.cmd(&args).unwrap()
    }

    /// (committed, answers) at `now`.
    fn decide(&mut self, now: u128, limits: &[L]) -> (i64, Vec<Answer>) {
        let items = self.call(&now.to_string(), limits).items();
        assert_eq!(items[1].int(), limits.len() as i64);
        let answers = items[2..]
            .chunks(4)
            .map(|c| (c[0].int(), c[1].text(), c[2].text(), c[3].text()))
            .collect();
        (items[0].int(), answers)
    }

    fn one(&mut self, now: u128, l: &L) -> Answer {
        self.decide(now, std::slice::from_ref(l)).1.remove(0)
    }
}

fn start(name: &str) -> (WorkDir, Redis) {
    let dir = WorkDir::new(name);
    let redis = Redis::start(&dir);
    (dir, redis)
}

/// `(now, cost, allowed, remaining, reset_ms, retry_ms)`, in order, on one limit.
type Case = (u128, u64, i64, &'static str, &'static str, &'static str);

fn run_cases(script: &mut Script, base: &L, cases: &[Case]) {
    for (i, &(now, cost, allowed, remaining, reset, retry)) in cases.iter().enumerate() {
        let l = L {
            cost,
            ..base.clone()
        };
        let got = script.one(now, &l);
        let want = (
            allowed,
            remaining.to_string(),
            reset.to_string(),
            retry.to_string(),
        );
        assert_eq!(
            got,
            want,
            "{} case {i}: now=T0+{}ms cost={cost}",
            base.algorithm,
            (now - T0) / MS
        );
    }
}

#[test]
fn token_bucket_exhausts_refills_exactly_and_caps() {
    let (_dir, redis) = start("lua-token-bucket");
    let mut s = Script::new(&redis);
    // 2 tokens per second (one every 500 ms), bucket of 5.
    let tb = L {
        burst: 5,
        ..limit("rl:t:tb", "token_bucket", 2, 1000)
    };
    run_cases(
        &mut s,
        &tb,
        &[
            (T0, 1, 1, "4", "500", "0"),
            (T0, 1, 1, "3", "1000", "0"),
            (T0, 3, 1, "0", "2500", "0"),
            (T0, 1, 0, "0", "2500", "500"),
            (T0 + 250 * MS, 1, 0, "0.5", "2250", "250"),
            (T0 + 500 * MS, 1, 1, "0", "2500", "0"),
            (T0 + 1500 * MS, 3, 0, "2", "1500", "500"),
            (T0 + 2000 * MS, 3, 1, "0", "2500", "0"),
            // A day idle refills to capacity, not beyond.
            (T0 + 86_400 * S, 5, 1, "0", "2500", "0"),
            (T0 + 86_400 * S, 1, 0, "0", "2500", "500"),
        ],
    );
}

#[test]
fn token_bucket_fractions_and_nanoseconds() {
    let (_dir, redis) = start("lua-token-bucket-fraction");
    let mut s = Script::new(&redis);
    // The demo policy: 10 per minute, one token every 6 s.
    let demo = L {
        burst: 2,
        ..limit("rl:t:frac", "token_bucket", 10, 60_000)
    };
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
    let ns = L {
        burst: 10,
        ..limit("rl:t:ns", "token_bucket", 1_000_000_000, 1000)
    };
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
    let (_dir, redis) = start("lua-token-bucket-back");
    let mut s = Script::new(&redis);
    let tb = L {
        burst: 2,
        ..limit("rl:t:back", "token_bucket", 1, 1000)
    };
    run_cases(
        &mut s,
        &tb,
        &[
            (T0 + 10 * S, 2, 1, "0", "2000", "0"),
            // 5 s in the past: no tokens appear, none go negative.
            (T0 + 5 * S, 1, 0, "0", "2000", "1000"),
        ],
    );
    let ts = redis
        .admin()
        .cmd(&["HGET", "rl:t:back", "ts"])
        .unwrap()
        .text();
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
    let mut s = Script::new(&redis);
    // 10 per second (one every 100 ms), 3 at once.
    let g = L {
        burst: 3,
        ..limit("rl:t:gcra", "gcra", 10, 1000)
    };
    run_cases(
        &mut s,
        &g,
        &[
            (T0, 1, 1, "2", "100", "0"),
            (T0, 1, 1, "1", "200", "0"),
            (T0, 1, 1, "0", "300", "0"),
            (T0, 1, 0, "0", "300", "100"),
            (T0 + 50 * MS, 1, 0, "0.5", "250", "50"),
            (T0 + 100 * MS, 1, 1, "0", "300", "0"),
            (T0 + 1000 * MS, 2, 1, "1", "200", "0"),
        ],
    );
    // Backwards: TAT does not move back, so nothing is refilled.
    run_cases(&mut s, &g, &[(T0 + 500 * MS, 2, 0, "0", "700", "600")]);
}

#[test]
fn fixed_window_allows_a_burst_at_the_boundary_that_sliding_windows_prevent() {
    let (_dir, redis) = start("lua-boundary");
    let mut s = Script::new(&redis);
    // 5 per second. 5 requests at the last millisecond of a window, 5 at the first of the next.
    let mut allowed = Vec::new();
    for (algorithm, key) in [
        ("fixed_window", "rl:t:b-fixed"),
        ("sliding_window_counter", "rl:t:b-counter"),
        ("sliding_window_log", "rl:t:b-log"),
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
            ("fixed_window", 10),
            ("sliding_window_counter", 5),
            ("sliding_window_log", 5)
        ],
        "requests allowed within 2 ms under a limit of 5 per second"
    );
}

#[test]
fn fixed_window_counts_per_aligned_window() {
    let (_dir, redis) = start("lua-fixed");
    let mut s = Script::new(&redis);
    let f = limit("rl:t:fixed", "fixed_window", 3, 1000);
    run_cases(
        &mut s,
        &f,
        &[
            (T0 + 200 * MS, 2, 1, "1", "800", "0"),
            (T0 + 300 * MS, 1, 1, "0", "700", "0"),
            (T0 + 400 * MS, 1, 0, "0", "600", "600"),
            (T0 + 1000 * MS, 1, 1, "2", "1000", "0"),
            // A cost above the limit never fits.
            (T0 + 1100 * MS, 4, 0, "2", "900", "900"),
        ],
    );
}

#[test]
fn sliding_window_counter_weights_the_previous_window() {
    let (_dir, redis) = start("lua-sliding-counter");
    let mut s = Script::new(&redis);
    let c = limit("rl:t:swc", "sliding_window_counter", 10, 1000);
    run_cases(
        &mut s,
        &c,
        &[
            (T0 + 500 * MS, 10, 1, "0", "1500", "0"),
            (T0 + 900 * MS, 1, 0, "0", "1100", "200"),
            // (At 1.2 s the previous window weighs 0.8: 8 used, so one more fits.)
            // Half-way into the next window the previous one counts half: 5 used, 5 left.
            (T0 + 1500 * MS, 5, 1, "0", "1500", "0"),
            // Now 10 - (10 * 0.4 + 5) = 1 left at 1.6 s; a cost of 2 fits at 1.7 s.
            (T0 + 1600 * MS, 2, 0, "1", "1400", "100"),
            (T0 + 1700 * MS, 2, 1, "0", "1300", "0"),
        ],
    );
}

#[test]
fn sliding_window_log_is_exact() {
    let (_dir, redis) = start("lua-sliding-log");
    let mut s = Script::new(&redis);
    let l = limit("rl:t:swl", "sliding_window_log", 3, 1000);
    run_cases(
        &mut s,
        &l,
        &[
            (T0, 1, 1, "2", "1000", "0"),
            (T0 + 100 * MS, 1, 1, "1", "1000", "0"),
            (T0 + 200 * MS, 1, 1, "0", "1000", "0"),
            // Full until the first entry is a whole window old.
            (T0 + 300 * MS, 1, 0, "0", "900", "700"),
            (T0 + 999 * MS, 1, 0, "0", "201", "1"),
            (T0 + 1000 * MS, 1, 1, "0", "1000", "0"),
            // Two units need the two oldest entries (100 ms, 200 ms) gone.
            (T0 + 1050 * MS, 2, 0, "0", "950", "150"),
        ],
    );
    let entries = redis.admin().cmd(&["ZCARD", "rl:t:swl"]).unwrap().int();
    assert_eq!(entries, 3, "old entries are trimmed");
}

#[test]
fn all_limits_or_none_are_charged() {
    let (_dir, redis) = start("lua-all-or-nothing");
    let mut s = Script::new(&redis);
    let second = limit("rl:{k}:r:second", "token_bucket", 5, 1000);
    let day = limit("rl:{k}:r:day", "fixed_window", 2, 86_400_000);
    let both = [second.clone(), day.clone()];
    assert_eq!(s.decide(T0, &both).0, 1);
    assert_eq!(s.decide(T0, &both).0, 1);
    let (committed, answers) = s.decide(T0, &both);
    assert_eq!(committed, 0, "the daily quota refuses");
    assert_eq!(
        (answers[0].0, answers[0].1.as_str()),
        (1, "3"),
        "per-second would allow, uncharged"
    );
    assert_eq!(answers[1].0, 0);
    let tokens = redis
        .admin()
        .cmd(&["HGET", "rl:{k}:r:second", "tokens"])
        .unwrap()
        .text();
    assert_eq!(
        tokens, "3",
        "the refused request did not drain the per-second bucket"
    );
}

#[test]
fn a_refusing_shadow_limit_neither_blocks_nor_is_charged() {
    let (_dir, redis) = start("lua-shadow");
    let mut s = Script::new(&redis);
    let enforced = limit("rl:t:enforced", "token_bucket", 10, 1000);
    let shadow = L {
        shadow: true,
        ..limit("rl:t:shadow", "fixed_window", 1, 1000)
    };
    let both = [enforced, shadow];
    assert_eq!(s.decide(T0, &both).0, 1);
    let (committed, answers) = s.decide(T0, &both);
    assert_eq!(committed, 1, "a shadow limit never refuses the request");
    assert_eq!(answers[0].1, "8", "the enforced limit is charged");
    assert_eq!((answers[1].0, answers[1].1.as_str()), (0, "0"));
    let n = redis
        .admin()
        .cmd(&["HGET", "rl:t:shadow", "n"])
        .unwrap()
        .text();
    assert_eq!(n, "1", "the refusing shadow limit was not charged");
}

#[test]
fn redis_clock_decides_with_redis_time() {
    let (_dir, redis) = start("lua-redis-clock");
    let mut s = Script::new(&redis);
    let l = L {
        burst: 2,
        ..limit("rl:t:clock", "token_bucket", 1, 86_400_000)
    };
    for expected in [1, 1, 0] {
        let items = s.call("redis", std::slice::from_ref(&l)).items();
        assert_eq!(items[0].int(), expected);
    }
    let ts: u128 = redis
        .admin()
        .cmd(&["HGET", "rl:t:clock", "ts"])
        .unwrap()
        .text()
        .parse()
        .unwrap();
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
    let (_dir, redis) = start("lua-ttl");
    let mut s = Script::new(&redis);
    let limits = [
        // 5 at 2/s refill in 2.5 s; + 60 s.
        (
            L {
                burst: 5,
                ..limit("rl:t:ttl-tb", "token_bucket", 2, 1000)
            },
            62_500,
        ),
        // TAT 100 ms ahead; + 60 s.
        (limit("rl:t:ttl-gcra", "gcra", 10, 1000), 60_100),
        // The window ends in 1 s; + 60 s.
        (limit("rl:t:ttl-fixed", "fixed_window", 10, 1000), 61_000),
        // Both windows are out of reach in 2 s; + 60 s.
        (
            limit("rl:t:ttl-swc", "sliding_window_counter", 10, 1000),
            62_000,
        ),
        // The entry leaves the window in 1 s; + 60 s.
        (
            limit("rl:t:ttl-swl", "sliding_window_log", 10, 1000),
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
            l.algorithm
        );
    }
}

#[test]
fn the_largest_values_the_config_accepts_keep_every_number_exact() {
    use ratelimit_core::bounds::{MAX_LIMIT, MAX_LOG_LIMIT, MAX_STATE_LIFETIME, MAX_WINDOW};
    let (_dir, redis) = start("lua-bounds");
    let mut s = Script::new(&redis);
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
            L {
                burst: 2,
                ..limit("rl:t:max-tb2", "token_bucket", 1, w)
            },
            "1",
            lifetime,
        ),
        (
            L {
                burst: 2,
                ..limit("rl:t:max-gcra2", "gcra", 1, w)
            },
            "1",
            w as i64,
        ),
        // A bucket expires once it would be full again; GCRA once its TAT (here one
        // 1/31,622,400,000 ms interval ahead, rounded up) has passed.
        (big("rl:t:max-tb", "token_bucket"), "999999999999", w as i64),
        (big("rl:t:max-gcra", "gcra"), "999999999999", 1),
        (
            limit("rl:t:max-fixed", "fixed_window", MAX_LIMIT, w),
            "999999999999",
            w as i64 - into,
        ),
        (
            limit("rl:t:max-swc", "sliding_window_counter", MAX_LIMIT, w),
            "999999999999",
            2 * w as i64 - into,
        ),
        (
            limit("rl:t:max-swl", "sliding_window_log", MAX_LOG_LIMIT, w),
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
    let huge = limit("rl:t:huge", "fixed_window", 1, 99_999_999_999 * 86_400_000);
    match s.call(&T0.to_string(), &[huge]) {
        Resp::Error(message) => assert!(message.contains("not an integer"), "{message}"),
        other => panic!("expected PEXPIRE to fail, got {other:?}"),
    }
}

#[test]
fn bad_arguments_are_an_error_not_a_decision() {
    let (_dir, redis) = start("lua-badargs");
    let mut s = Script::new(&redis);
    let good = limit("rl:t:bad", "token_bucket", 1, 1000);
    let cases = [
        ("1.5", good.clone()),
        ("-1", good.clone()),
        ("soon", good.clone()),
        (
            "1",
            L {
                algorithm: "leaky_bucket",
                ..good.clone()
            },
        ),
        (
            "1",
            L {
                limit: 0,
                ..good.clone()
            },
        ),
        (
            "1",
            L {
                window_ms: 0,
                ..good.clone()
            },
        ),
        (
            "1",
            L {
                burst: 0,
                ..good.clone()
            },
        ),
    ];
    for (clock, l) in cases {
        match s.call(clock, std::slice::from_ref(&l)) {
            Resp::Error(message) => assert!(message.contains("ERR decide"), "{message}"),
            other => panic!(
                "clock={clock} {}: expected an error, got {other:?}",
                l.algorithm
            ),
        }
    }
}

#[test]
fn the_restricted_user_can_touch_only_limiter_keys() {
    let (_dir, redis) = start("lua-acl");
    let mut s = Script::new(&redis);
    match s.call("1", &[limit("not-a-limiter-key", "token_bucket", 1, 1000)]) {
        Resp::Error(message) => assert!(message.starts_with("NOPERM"), "{message}"),
        other => panic!("expected NOPERM, got {other:?}"),
    }
    let mut conn = redis.webdis_user();
    let refused: [&[&str]; 6] = [
        &["FLUSHALL"],
        &["KEYS", "*"],
        &["CONFIG", "GET", "*"],
        &["EVAL", "return 1", "0"],
        &["SCRIPT", "FLUSH"],
        &["DEL", "rl:x"],
    ];
    for command in refused {
        match conn.cmd(command).unwrap() {
            Resp::Error(message) => {
                assert!(message.starts_with("NOPERM"), "{command:?}: {message}")
            }
            other => panic!("{command:?} should be refused, got {other:?}"),
        }
    }
}
