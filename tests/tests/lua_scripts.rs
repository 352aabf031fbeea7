//! The decision script (lua/*.lua, as the filter embeds it) against a real Redis, run as the
//! restricted user Webdis logs in as (so these tests also prove the shipped ACL lets every
//! algorithm do its work), with the clock injected: exhaust, advance, check. No sleeps.

use e2e::{Redis, RedisConn, Resp, WorkDir};
use ratelimit_core::bridge::DecideCall;
use ratelimit_core::check::{BudgetCheck, LimitCheck, Mode};
use ratelimit_core::config::{Algorithm, Lease, OverBudget};
use ratelimit_core::decision::{Refund, Settlement};
use std::rc::Rc;

const T0: u128 = 1_764_489_600_000_000_000; // a whole second (and minute) in Unix ns
const MS: u128 = 1_000_000;
const S: u128 = 1_000_000_000;

/// One limit as a test writes it; sent through the filter's own argument builder.
#[derive(Clone)]
struct L {
    key: &'static str,
    algorithm: Algorithm,
    limit: u64,
    window_ms: u64,
    burst: u64,
    cost: u64,
    shadow: bool,
    /// The rule's key budget: (rule name, new keys per window, window ms, mode).
    budget: Option<(&'static str, u64, u64, OverBudget)>,
    /// Asks for a lease of the limit's units.
    lease: Option<Lease>,
    /// A usage limit in mode `after`.
    after: bool,
}

fn limit(key: &'static str, algorithm: Algorithm, limit: u64, window_ms: u64) -> L {
    L {
        key,
        algorithm,
        limit,
        window_ms,
        burst: limit,
        cost: 1,
        shadow: false,
        budget: None,
        lease: None,
        after: false,
    }
}

impl L {
    fn check(&self) -> LimitCheck {
        LimitCheck {
            rule: 0,
            limit: 0,
            key: self.key.into(),
            algorithm: self.algorithm,
            per_window: self.limit,
            quota: self.burst,
            window_ms: self.window_ms,
            burst: self.burst,
            cost: self.cost,
            mode: Mode::of(
                self.after,
                self.lease,
                self.shadow,
                self.budget.map(|(rule, new_keys, window_ms, over_budget)| {
                    Rc::new(BudgetCheck {
                        counter_key: format!("rl:{{key_budget}}:{rule}"),
                        overflow_key: format!("rl:{{overflow}}:{rule}:{}", self.algorithm.name()),
                        new_keys,
                        window_ms,
                        over_budget,
                    })
                }),
            ),
        }
    }
}

/// One limit's answer: (allowed, remaining, reset_ms, retry_ms).
type Answer = (i64, String, String, String);

/// One request's answer: (committed, its limits' answers), or the error Redis gave for it.
type RequestAnswer = Result<(i64, Vec<Answer>), String>;

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

    /// The command the filter would send for these requests, built by the filter's builder.
    fn command(&self, clock: &str, requests: &[&[L]]) -> Vec<String> {
        let checks: Vec<Vec<LimitCheck>> = requests
            .iter()
            .map(|r| r.iter().map(L::check).collect())
            .collect();
        // A request whose limits all carry a lease asks for one, as the engine does.
        let asks = checks.iter().map(|c| {
            (
                c.as_slice(),
                c.iter()
                    .all(|l| l.mode.lease().is_some())
                    .then_some(u64::MAX),
            )
        });
        DecideCall::leasing(clock, 0, asks).command(&self.sha)
    }

    fn call_batch(&mut self, clock: &str, requests: &[&[L]]) -> Resp {
        let command = self.command(clock, requests);
        self.conn.cmd(&command).unwrap()
    }

    /// As the filter sends it, with a deadline (Unix ms) after which Redis must not charge.
    fn call_with_deadline(&mut self, clock: &str, deadline_ms: u128, limits: &[L]) -> Resp {
        let checks: Vec<LimitCheck> = limits.iter().map(L::check).collect();
        let command = DecideCall::new(clock, deadline_ms, [&checks[..]]).command(&self.sha);
        self.conn.cmd(&command).unwrap()
    }

    fn call(&mut self, clock: &str, limits: &[L]) -> Resp {
        self.call_batch(clock, &[limits])
    }

    /// Every request's answer for a batch decided at `now`.
    fn decide_batch(&mut self, now: u128, requests: &[&[L]]) -> Vec<RequestAnswer> {
        let items = self.call_batch(&now.to_string(), requests).items();
        assert_eq!(items[0].int(), requests.len() as i64, "{items:?}");
        let mut rest = &items[1..];
        let mut out = Vec::new();
        for _ in requests {
            if rest[0].int() == -1 {
                out.push(Err(rest[1].text()));
                rest = &rest[2..];
                continue;
            }
            let n = rest[1].int() as usize;
            let answers = rest[2..2 + 4 * n]
                .chunks(4)
                .map(|c| (c[0].int(), c[1].text(), c[2].text(), c[3].text()))
                .collect();
            out.push(Ok((rest[0].int(), answers)));
            rest = &rest[2 + 4 * n..];
        }
        assert!(rest.is_empty(), "nothing after the last request");
        out
    }

    /// (committed, answers) of one request alone at `now`.
    fn decide(&mut self, now: u128, limits: &[L]) -> (i64, Vec<Answer>) {
        match self.decide_batch(now, &[limits]).remove(0) {
            Ok(answer) => answer,
            Err(message) => panic!("request failed in Redis: {message}"),
        }
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
            base.algorithm.name(),
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
        ..limit("rl:t:tb", Algorithm::TokenBucket, 2, 1000)
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
        ..limit("rl:t:frac", Algorithm::TokenBucket, 10, 60_000)
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
        ..limit("rl:t:ns", Algorithm::TokenBucket, 1_000_000_000, 1000)
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
        ..limit("rl:t:back", Algorithm::TokenBucket, 1, 1000)
    };
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
        ..limit("rl:t:gcra", Algorithm::Gcra, 10, 1000)
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
    let mut s = Script::new(&redis);
    let f = limit("rl:t:fixed", Algorithm::FixedWindow, 3, 1000);
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
    let c = limit("rl:t:swc", Algorithm::SlidingWindowCounter, 10, 1000);
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
    let l = limit("rl:t:swl", Algorithm::SlidingWindowLog, 3, 1000);
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
    let second = limit("rl:{k}:r:second", Algorithm::TokenBucket, 5, 1000);
    let day = limit("rl:{k}:r:day", Algorithm::FixedWindow, 2, 86_400_000);
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
    let enforced = limit("rl:t:enforced", Algorithm::TokenBucket, 10, 1000);
    let shadow = L {
        shadow: true,
        ..limit("rl:t:shadow", Algorithm::FixedWindow, 1, 1000)
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
        ..limit("rl:t:clock", Algorithm::TokenBucket, 1, 86_400_000)
    };
    for expected in [1, 1, 0] {
        let items = s.call("redis", std::slice::from_ref(&l)).items();
        assert_eq!(items[1].int(), expected);
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
                ..limit("rl:t:ttl-tb", Algorithm::TokenBucket, 2, 1000)
            },
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
                ..limit("rl:t:max-tb2", Algorithm::TokenBucket, 1, w)
            },
            "1",
            lifetime,
        ),
        (
            L {
                burst: 2,
                ..limit("rl:t:max-gcra2", Algorithm::Gcra, 1, w)
            },
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

#[test]

fn a_bad_clock_or_layout_fails_the_call_and_bad_limits_fail_only_their_request() {
    let (_dir, redis) = start("lua-badargs");
    let mut s = Script::new(&redis);
    let good = limit("rl:t:bad", Algorithm::TokenBucket, 1, 1000);
    for clock in ["1.5", "-1", "soon"] {
        match s.call(clock, std::slice::from_ref(&good)) {
            Resp::Error(message) => assert!(message.contains("ERR decide"), "{message}"),
            other => panic!("clock={clock}: expected an error, got {other:?}"),
        }
    }
    // A layout that does not add up (one argument short) fails the whole call.
    let mut command = s.command("1", &[std::slice::from_ref(&good)]);
    command.pop();
    match s.conn.cmd(&command).unwrap() {
        Resp::Error(message) => assert!(message.contains("ERR decide"), "{message}"),
        other => panic!("expected an error, got {other:?}"),
    }
    // Bad numbers for one request's limit: that request fails, the next is decided.
    let other = limit("rl:t:bad-other", Algorithm::Gcra, 5, 1000);
    for bad in [
        L {
            limit: 0,
            ..good.clone()
        },
        L {
            window_ms: 0,
            ..good.clone()
        },
        L {
            burst: 0,
            ..good.clone()
        },
    ] {
        let answers = s.decide_batch(
            T0,
            &[std::slice::from_ref(&bad), std::slice::from_ref(&other)],
        );
        assert_eq!(
            answers[0],
            Err("ERR decide: bad arguments for limit 1".into())
        );
        assert_eq!(answers[1].as_ref().map(|a| a.0), Ok(1));
    }
    // An algorithm the script does not know.
    let mut command = s.command("1", &[std::slice::from_ref(&good)]);
    let at = command.iter().position(|a| a == "token_bucket").unwrap();
    command[at] = "leaky_bucket".into();
    let items = s.conn.cmd(&command).unwrap().items();
    assert_eq!((items[0].int(), items[1].int()), (1, -1));
    assert_eq!(items[2].text(), "ERR decide: bad arguments for limit 1");
}

#[test]
fn a_call_past_its_deadline_charges_nothing() {
    let (_dir, redis) = start("lua-deadline");
    let mut s = Script::new(&redis);
    let l = limit("rl:t:deadline", Algorithm::TokenBucket, 5, 1000);
    let redis_ms = || {
        let t = redis.admin().cmd(&["TIME"]).unwrap().items();
        t[0].text().parse::<u128>().unwrap() * 1000 + t[1].text().parse::<u128>().unwrap() / 1000
    };
    // A deadline already passed on Redis's clock (the filter gave up long ago): refused whole.
    match s.call_with_deadline("redis", redis_ms() - 1, std::slice::from_ref(&l)) {
        Resp::Error(message) => assert!(message.starts_with("EXPIRED"), "{message}"),
        other => panic!("expected EXPIRED, got {other:?}"),
    }
    assert_eq!(
        redis
            .admin()
            .cmd(&["EXISTS", "rl:t:deadline"])
            .unwrap()
            .int(),
        0,
        "nothing charged"
    );
    // A deadline still ahead: decided and charged as usual.
    let items = s
        .call_with_deadline("redis", redis_ms() + 60_000, std::slice::from_ref(&l))
        .items();
    assert_eq!((items[0].int(), items[1].int()), (1, 1));
    assert_eq!(redis.bucket_tokens("rl:t:deadline"), 4.0);
}

#[test]
fn a_batch_decides_in_order_exactly_as_one_call_per_request() {
    let (_dir, redis) = start("lua-batch-order");
    let mut s = Script::new(&redis);
    // The same 14 requests on two fresh keys: one batch, and one call each.
    let batched = L {
        burst: 10,
        ..limit("rl:t:batched", Algorithm::TokenBucket, 10, 60_000)
    };
    let single = L {
        key: "rl:t:single",
        ..batched.clone()
    };
    let costs = [1, 3, 1, 1, 4, 1, 2, 1, 1, 5, 1, 1, 1, 1];
    let requests: Vec<Vec<L>> = costs
        .iter()
        .map(|&cost| {
            vec![L {
                cost,
                ..batched.clone()
            }]
        })
        .collect();
    let refs: Vec<&[L]> = requests.iter().map(Vec::as_slice).collect();
    let in_batch: Vec<(i64, Vec<Answer>)> = s
        .decide_batch(T0, &refs)
        .into_iter()
        .map(|a| a.unwrap())
        .collect();
    let one_by_one: Vec<(i64, Vec<Answer>)> = costs
        .iter()
        .map(|&cost| {
            s.decide(
                T0,
                &[L {
                    cost,
                    ..single.clone()
                }],
            )
        })
        .collect();
    assert_eq!(in_batch, one_by_one);
    let allowed: Vec<i64> = in_batch.iter().map(|a| a.0).collect();
    assert_eq!(
        allowed,
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        "10 tokens, in arrival order"
    );
    let mut admin = redis.admin();
    let state =
        |admin: &mut e2e::RedisConn, key: &str| admin.cmd(&["HGET", key, "tokens"]).unwrap().text();
    assert_eq!(
        state(&mut admin, "rl:t:batched"),
        state(&mut admin, "rl:t:single")
    );
}

#[test]
fn in_a_batch_each_request_is_all_or_nothing_over_its_own_limits() {
    let (_dir, redis) = start("lua-batch-atomic");
    let mut s = Script::new(&redis);
    let second = limit("rl:{k}:r:second", Algorithm::TokenBucket, 5, 1000);
    let day = limit("rl:{k}:r:day", Algorithm::FixedWindow, 1, 86_400_000);
    let both = [second.clone(), day.clone()];
    let answers = s.decide_batch(T0, &[&both, &both, std::slice::from_ref(&second)]);
    let committed: Vec<i64> = answers.iter().map(|a| a.as_ref().unwrap().0).collect();
    assert_eq!(committed, [1, 0, 1]);
    // The second request was refused by the day limit and did not charge the second's bucket:
    // the third sees 5 - 1 - 1 = 3 left.
    assert_eq!(
        answers[1].as_ref().unwrap().1[0].1,
        "4",
        "uncharged: 4 left as before"
    );
    assert_eq!(answers[2].as_ref().unwrap().1[0].1, "3");
}

#[test]
fn a_redis_error_in_one_request_leaves_the_others_decided() {
    let (_dir, redis) = start("lua-batch-error");
    let mut s = Script::new(&redis);
    // A key holding another type (a limit whose algorithm changed): WRONGTYPE for that one.
    let mut admin = redis.admin();
    admin.cmd(&["ZADD", "rl:t:wrong", "1", "x"]).unwrap();
    let wrong = limit("rl:t:wrong", Algorithm::TokenBucket, 5, 1000);
    let fine = limit("rl:t:fine", Algorithm::TokenBucket, 5, 1000);
    let answers = s.decide_batch(
        T0,
        &[
            std::slice::from_ref(&fine),
            &[fine.clone(), wrong],
            std::slice::from_ref(&fine),
        ],
    );
    assert_eq!(answers[0].as_ref().unwrap().1[0].1, "4");
    let error = answers[1].as_ref().unwrap_err();
    assert!(error.starts_with("WRONGTYPE"), "{error}");
    assert_eq!(
        answers[2].as_ref().unwrap().1[0].1,
        "3",
        "the failed one charged nothing"
    );
}

#[test]
fn the_restricted_user_can_touch_only_limiter_keys() {
    let (_dir, redis) = start("lua-acl");
    let mut s = Script::new(&redis);
    match s.call(
        "1",
        &[limit("not-a-limiter-key", Algorithm::TokenBucket, 1, 1000)],
    ) {
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

/// A per-identity limit of 5 per second under a budget of 3 new identities per minute.
fn budgeted(key: &'static str, mode: OverBudget) -> L {
    L {
        budget: Some(("ip", 3, 60_000, mode)),
        ..limit(key, Algorithm::TokenBucket, 5, 1000)
    }
}

#[test]
fn a_key_budget_admits_new_identities_up_to_its_count_then_shares_one_overflow_bucket() {
    let (_dir, redis) = start("lua-budget-shared");
    let mut s = Script::new(&redis);
    let ids = ["rl:{ip=1}:ip:s", "rl:{ip=2}:ip:s", "rl:{ip=3}:ip:s"];
    for id in ids {
        assert_eq!(s.one(T0, &budgeted(id, OverBudget::Shared)).0, 1, "{id}");
    }
    let budget = |field: &str| {
        redis
            .admin()
            .cmd(&["HGET", "rl:{key_budget}:ip", field])
            .unwrap()
            .text()
    };
    assert_eq!(budget("n"), "3");
    // Budget used up: new identities share the overflow bucket (outcome 1 + 2), and no state
    // is created for them.
    for (i, id) in ["rl:{ip=4}:ip:s", "rl:{ip=5}:ip:s"].iter().enumerate() {
        let (outcome, remaining, _, _) = s.one(T0, &budgeted(id, OverBudget::Shared));
        assert_eq!(outcome, 3, "{id}");
        assert_eq!(
            remaining,
            (4 - i).to_string(),
            "one overflow bucket for all"
        );
        assert_eq!(redis.admin().cmd(&["EXISTS", id]).unwrap().int(), 0);
    }
    assert_eq!(redis.bucket_tokens("rl:{overflow}:ip:token_bucket"), 3.0);
    assert_eq!(budget("n"), "3", "the overflow identity uses no budget");
    // An existing identity is never affected: its own bucket, exactly its own limit.
    for i in 0..4 {
        assert_eq!(s.one(T0, &budgeted(ids[0], OverBudget::Shared)).0, 1, "{i}");
    }
    assert_eq!(s.one(T0, &budgeted(ids[0], OverBudget::Shared)).0, 0);
    // The overflow bucket refuses like any other once spent: 3 left, then refused.
    for _ in 0..3 {
        assert_eq!(
            s.one(T0, &budgeted("rl:{ip=6}:ip:s", OverBudget::Shared)).0,
            3
        );
    }
    assert_eq!(
        s.one(T0, &budgeted("rl:{ip=7}:ip:s", OverBudget::Shared)).0,
        2
    );
    // The next budget window admits new identities again.
    let next = T0 + 60 * S;
    assert_eq!(
        s.one(next, &budgeted("rl:{ip=8}:ip:s", OverBudget::Shared))
            .0,
        1
    );
    assert_eq!(budget("n"), "1");
    assert!(
        redis
            .admin()
            .cmd(&["PTTL", "rl:{key_budget}:ip"])
            .unwrap()
            .int()
            > 0
    );
}

/// Calls reach Redis out of their clocks' order (several workers and proxies, calls queued on
/// a busy machine): one stamped just before a budget window ends can run after others
/// stamped in the next window. It counts against the newest window; restarting the count of
/// its own older window let the next window count its new identities from 0 a second time
/// (a flood under load admitted 4,029 new identities where 4 windows of 1,000 allow 4,000).
#[test]
fn a_late_call_stamped_in_the_previous_budget_window_does_not_restart_the_count() {
    let (_dir, redis) = start("lua-budget-late");
    let mut s = Script::new(&redis);
    let next = T0 + 60 * S;
    let budget = || {
        redis
            .admin()
            .cmd(&["HMGET", "rl:{key_budget}:ip", "w", "n"])
            .unwrap()
            .items()
            .iter()
            .map(Resp::text)
            .collect::<Vec<String>>()
    };
    // Two of the next window's three new identities.
    for id in ["rl:{ip=1}:ip:s", "rl:{ip=2}:ip:s"] {
        assert_eq!(s.one(next, &budgeted(id, OverBudget::Shared)).0, 1, "{id}");
    }
    let window = (next / MS / 60_000).to_string();
    assert_eq!(budget(), [window.clone(), "2".into()]);
    // A call stamped 1 ms before that window began, run now: its new identity is the
    // window's third.
    let late = s.one(next - MS, &budgeted("rl:{ip=3}:ip:s", OverBudget::Shared));
    assert_eq!(late.0, 1);
    assert_eq!(
        budget(),
        [window, "3".into()],
        "counted in the newest window"
    );
    // The window is full: a fourth new identity shares the overflow bucket.
    let fourth = s.one(next, &budgeted("rl:{ip=4}:ip:s", OverBudget::Shared));
    assert_eq!(fourth.0, 3, "over the budget: {fourth:?}");
    assert_eq!(
        redis.admin().cmd(&["DBSIZE"]).unwrap().int(),
        5,
        "3 + counter + overflow"
    );
}

#[test]
fn a_key_budget_in_deny_mode_refuses_new_identities_until_its_window_ends() {
    let (_dir, redis) = start("lua-budget-deny");
    let mut s = Script::new(&redis);
    let at = T0 + 15 * S;
    for id in ["rl:{ip=1}:ip:s", "rl:{ip=2}:ip:s", "rl:{ip=3}:ip:s"] {
        assert_eq!(s.one(at, &budgeted(id, OverBudget::Deny)).0, 1);
    }
    // The window is [T0, T0 + 60 s): a refusal 15 s in waits the 45 s left.
    let got = s.one(at, &budgeted("rl:{ip=4}:ip:s", OverBudget::Deny));
    assert_eq!(got, (2, "0".into(), "45000".into(), "45000".into()));
    assert_eq!(
        redis.admin().cmd(&["DBSIZE"]).unwrap().int(),
        4,
        "3 buckets + the counter"
    );
    // Existing identities go on.
    assert_eq!(
        s.one(at, &budgeted("rl:{ip=2}:ip:s", OverBudget::Deny)).0,
        1
    );
}

#[test]
fn only_a_new_identity_that_is_charged_uses_the_budget() {
    let (_dir, redis) = start("lua-budget-charged");
    let mut s = Script::new(&redis);
    // Refused on another limit of the request (all or nothing): no state, no budget used.
    let blocker = limit("rl:t:blocker", Algorithm::FixedWindow, 1, 60_000);
    assert_eq!(s.one(T0, &blocker).0, 1);
    let (committed, _) = s.decide(
        T0,
        &[
            budgeted("rl:{ip=1}:ip:s", OverBudget::Deny),
            blocker.clone(),
        ],
    );
    assert_eq!(committed, 0);
    assert_eq!(
        redis
            .admin()
            .cmd(&["EXISTS", "rl:{key_budget}:ip", "rl:{ip=1}:ip:s"])
            .unwrap()
            .int(),
        0
    );
    // Two limits of one rule in one request and a second request of the same new identity in
    // the same batch: one identity, one unit of budget.
    let second = L {
        key: "rl:{ip=2}:ip:m",
        ..budgeted("rl:{ip=2}:ip:m", OverBudget::Deny)
    };
    let request = [budgeted("rl:{ip=2}:ip:s", OverBudget::Deny), second];
    let answers = s.decide_batch(T0, &[&request, &request]);
    assert!(
        answers.iter().all(|a| a.as_ref().unwrap().0 == 1),
        "{answers:?}"
    );
    assert_eq!(
        redis
            .admin()
            .cmd(&["HGET", "rl:{key_budget}:ip", "n"])
            .unwrap()
            .text(),
        "1"
    );
}

impl Script {
    /// Gives back a charge made at `charged_at` that replied `left`, with the refund's clock.
    fn refund(&mut self, clock: u128, l: &L, charged_at: u128, left: f64) {
        let refund = Refund {
            check: l.check(),
            charged_at_ns: charged_at,
            left,
        };
        let command = DecideCall::refund(clock, 0, &[refund]).command(&self.sha);
        let items = self.conn.cmd(&command).unwrap().items();
        assert_eq!(
            (items[0].int(), items[1].int(), items[2].int()),
            (1, 1, 1),
            "{items:?}"
        );
    }
}

const ALL: [Algorithm; 5] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
];

#[test]
fn a_refund_gives_back_what_an_untouched_charge_took() {
    let (_dir, redis) = start("lua-refund");
    let mut s = Script::new(&redis);
    let keys = [
        "rl:t:r-tb",
        "rl:t:r-gcra",
        "rl:t:r-fw",
        "rl:t:r-swc",
        "rl:t:r-swl",
    ];
    for (algorithm, key) in ALL.into_iter().zip(keys) {
        let l = limit(key, algorithm, 10, 1000);
        let charge = L {
            cost: 3,
            ..l.clone()
        };
        let (allowed, left, _, _) = s.one(T0, &charge);
        assert_eq!((allowed, left.as_str()), (1, "7"), "{algorithm:?}");
        s.refund(T0 + MS, &charge, T0, left.parse().unwrap());
        // The whole limit is there again: as if the charge had never been made.
        let whole = L {
            cost: 10,
            ..l.clone()
        };
        assert_eq!(s.one(T0 + MS, &whole).0, 1, "{algorithm:?}: all 10 back");
        assert_eq!(s.one(T0 + MS, &l).0, 0, "{algorithm:?}: not one more");
    }
}

#[test]
fn a_refund_never_gives_back_what_the_limit_has_since_refilled() {
    let (_dir, redis) = start("lua-refund-absorbed");
    let mut s = Script::new(&redis);
    // 10 per second, bucket of 10. A charge of 5, then 2 s: the bucket is full again anyway,
    // so the charge holds nothing back any more. A refund must not add to the full bucket.
    for (algorithm, key) in [
        (Algorithm::TokenBucket, "rl:t:a-tb"),
        (Algorithm::Gcra, "rl:t:a-gcra"),
    ] {
        let l = limit(key, algorithm, 10, 1000);
        let charge = L {
            cost: 5,
            ..l.clone()
        };
        let (_, left, _, _) = s.one(T0, &charge);
        let later = T0 + 2 * S;
        assert_eq!(s.one(later, &l).1, "9", "{algorithm:?}");
        s.refund(later + MS, &charge, T0, left.parse().unwrap());
        let whole = L {
            cost: 10,
            ..l.clone()
        };
        assert_eq!(
            s.one(later + MS, &whole).0,
            0,
            "{algorithm:?}: still 9, not 10"
        );
        let nine = L {
            cost: 9,
            ..l.clone()
        };
        assert_eq!(s.one(later + MS, &nine).0, 1, "{algorithm:?}");
    }
    // A window that has moved on no longer counts the charge: nothing to give back.
    let fw = limit("rl:t:a-fw", Algorithm::FixedWindow, 10, 1000);
    let charge = L {
        cost: 5,
        ..fw.clone()
    };
    s.one(T0, &charge);
    let next = T0 + S + MS;
    assert_eq!(
        s.one(
            next,
            &L {
                cost: 8,
                ..fw.clone()
            }
        )
        .0,
        1
    );
    s.refund(next + MS, &charge, T0, 5.0);
    assert_eq!(
        s.one(
            next + MS,
            &L {
                cost: 3,
                ..fw.clone()
            }
        )
        .0,
        0,
        "2 left, not 7"
    );
    // Partly refilled: a bucket of 10 at 10/s charged 8 at T0 (2 left) holds 5 at T0 + 300 ms,
    // and would have been full without the charge: it holds back 5, not 8.
    let tb = limit("rl:t:a-tb2", Algorithm::TokenBucket, 10, 1000);
    let charge = L {
        cost: 8,
        ..tb.clone()
    };
    s.one(T0, &charge);
    s.refund(T0 + 300 * MS, &charge, T0, 2.0);
    // Without the charge: 10. With it, at T0 + 300 ms: 5. Back: min(8, 10 - 5) = 5.
    assert_eq!(
        s.one(
            T0 + 300 * MS,
            &L {
                cost: 10,
                ..tb.clone()
            }
        )
        .0,
        1
    );
}

#[test]
fn a_refund_request_holds_only_refunds_and_bad_refunds_fail_alone() {
    let (_dir, redis) = start("lua-refund-bad");
    let mut s = Script::new(&redis);
    let l = limit("rl:t:rb", Algorithm::TokenBucket, 10, 1000);
    let refund = Refund {
        check: l.check(),
        charged_at_ns: T0,
        left: 1.0,
    };
    let mut command = DecideCall::refund(T0, 0, &[refund]).command(&s.sha);
    let at = command.iter().position(|a| a == "refund").unwrap();
    command[at + 1] = "soon".into();
    let items = s.conn.cmd(&command).unwrap().items();
    assert_eq!((items[0].int(), items[1].int()), (1, -1));
    assert_eq!(items[2].text(), "ERR decide: bad arguments for limit 1");
}

/// A limit that asks for leases of at most `max_units`, `fraction` of what is left.
fn leasing(l: L, max_units: u64, fraction: f64) -> L {
    L {
        lease: Some(Lease {
            max_units,
            fraction,
            max_ms: 1000,
        }),
        ..l
    }
}

#[test]
fn a_lease_takes_a_fraction_of_what_is_left_and_near_the_limit_only_the_request() {
    let (_dir, redis) = start("lua-lease-sizes");
    let mut s = Script::new(&redis);
    // Buckets of 100 that refill 1 per 1000 s: nothing comes back during the test.
    // A fixed window of 100 per 1000 s: the same units, which come back when the window ends.
    for (algorithm, key) in [
        (Algorithm::TokenBucket, "rl:t:lease-tb"),
        (Algorithm::Gcra, "rl:t:lease-gcra"),
        (Algorithm::FixedWindow, "rl:t:lease-fw"),
    ] {
        let base = match algorithm {
            Algorithm::FixedWindow => limit(key, algorithm, 100, 1_000_000),
            _ => L {
                burst: 100,
                ..limit(key, algorithm, 1, 1_000_000)
            },
        };
        let l = leasing(base, 10, 0.25);
        // k = min(10, floor(0.25 × left before)): 10 while 40 or more are left, then smaller,
        // then the request alone (k = 1) for the last few, then refused.
        let mut sizes = Vec::new();
        let mut lefts = Vec::new();
        loop {
            let (k, answers) = s.decide(T0, std::slice::from_ref(&l));
            if k == 0 {
                assert_eq!(answers[0].0, 0, "{algorithm:?}: refused");
                break;
            }
            sizes.push(k);
            let left: f64 = answers[0].1.parse().unwrap();
            lefts.push(left.round() as i64);
        }
        assert_eq!(
            sizes,
            [10, 10, 10, 10, 10, 10, 10, 7, 5, 4, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1],
            "{algorithm:?}"
        );
        assert_eq!(
            sizes.iter().sum::<i64>(),
            100,
            "{algorithm:?}: every unit, once"
        );
        assert_eq!(
            lefts[..8],
            [90, 80, 70, 60, 50, 40, 30, 23],
            "{algorithm:?}"
        );
        assert_eq!(*lefts.last().unwrap(), 0, "{algorithm:?}");
    }
}

#[test]
fn a_lease_is_sized_by_its_tightest_limit_and_the_cost_and_taken_on_all_or_none() {
    let (_dir, redis) = start("lua-lease-limits");
    let mut s = Script::new(&redis);
    let wide = leasing(
        L {
            burst: 1000,
            cost: 2,
            ..limit("rl:t:lease-wide", Algorithm::TokenBucket, 1, 1_000_000)
        },
        100,
        0.5,
    );
    let narrow = leasing(
        L {
            burst: 40,
            cost: 2,
            ..limit("rl:t:lease-narrow", Algorithm::Gcra, 1, 1_000_000)
        },
        100,
        0.5,
    );
    // Narrow: floor(0.5 × 40 / 2) = 10 requests of cost 2, on both limits.
    let (k, answers) = s.decide(T0, &[wide.clone(), narrow.clone()]);
    assert_eq!(k, 10);
    assert_eq!(answers[0].1, "980");
    assert_eq!(answers[1].1, "20");
    // A limit without a lease in the request: the request alone.
    let plain = L {
        lease: None,
        ..narrow.clone()
    };
    let (k, answers) = s.decide(T0, &[wide.clone(), plain]);
    assert_eq!(
        (k, answers[0].1.as_str(), answers[1].1.as_str()),
        (1, "978", "18")
    );
    // max_units counts units, not requests: 3 units hold one request of cost 2.
    let capped = leasing(
        L {
            burst: 1000,
            cost: 2,
            ..limit("rl:t:lease-capped", Algorithm::TokenBucket, 1, 1_000_000)
        },
        3,
        1.0,
    );
    assert_eq!(s.decide(T0, std::slice::from_ref(&capped)).0, 1);
    // Refused requests take no lease and charge nothing.
    let empty = leasing(
        L {
            burst: 1,
            cost: 2,
            ..limit("rl:t:lease-empty", Algorithm::TokenBucket, 1, 1_000_000)
        },
        100,
        1.0,
    );
    let (k, answers) = s.decide(T0, &[wide, empty]);
    assert_eq!((k, answers[0].1.as_str()), (0, "978"));
}

#[test]
fn a_lease_on_a_window_or_with_bad_numbers_fails_only_its_request() {
    let (_dir, redis) = start("lua-lease-bad");
    let mut s = Script::new(&redis);
    let good = limit("rl:t:lease-good", Algorithm::TokenBucket, 10, 1000);
    let window = leasing(
        limit("rl:t:lease-window", Algorithm::SlidingWindowLog, 10, 1000),
        5,
        0.5,
    );
    let answers = s.decide_batch(T0, &[&[window], std::slice::from_ref(&good)]);
    assert!(
        matches!(&answers[0], Err(e) if e.contains("bad arguments for limit 1")),
        "{answers:?}"
    );
    assert!(matches!(&answers[1], Ok((1, _))), "{answers:?}");
    for (max_units, fraction) in [(5, 0.0), (5, 1.5)] {
        let bad = leasing(
            limit("rl:t:lease-bad", Algorithm::TokenBucket, 10, 1000),
            max_units,
            fraction,
        );
        let answers = s.decide_batch(T0, &[&[bad]]);
        assert!(answers[0].is_err(), "{max_units} {fraction}: {answers:?}");
    }
    // The builder never asks for 0 units; the script refuses them anyway.
    let l = leasing(
        limit("rl:t:lease-bad", Algorithm::TokenBucket, 10, 1000),
        5,
        0.5,
    );
    let mut command = s.command(&T0.to_string(), &[&[l]]);
    let at = command.iter().position(|a| a == "lease").unwrap();
    command[at + 1] = "0".to_string();
    let reply = s.conn.cmd(&command).unwrap().items();
    assert_eq!(reply[1].int(), -1, "{reply:?}");
}

impl Script {
    /// Settles `delta` units on `l` at `clock` (positive: debt; negative: a give-back).
    fn settle(&mut self, clock: u128, l: &L, delta: i64) {
        let settlement = Settlement {
            check: l.check(),
            delta,
        };
        let command = DecideCall::settle(clock, 0, &[settlement]).command(&self.sha);
        let items = self.conn.cmd(&command).unwrap().items();
        assert_eq!(
            (items[0].int(), items[1].int(), items[2].int()),
            (1, 1, 1),
            "{items:?}"
        );
    }
}

const METERED: [(Algorithm, &str); 4] = [
    (Algorithm::TokenBucket, "rl:t:u-tb"),
    (Algorithm::Gcra, "rl:t:u-gcra"),
    (Algorithm::FixedWindow, "rl:t:u-fw"),
    (Algorithm::SlidingWindowCounter, "rl:t:u-swc"),
];

#[test]
fn token_bucket_debt_refuses_until_repaid_with_the_exact_retry() {
    let (_dir, redis) = start("lua-settle-debt-tb");
    let mut s = Script::new(&redis);
    // 100 tokens per second (1 per 10 ms); a reservation of 40, then the usage was 130.
    let l = limit("rl:t:debt-tb", Algorithm::TokenBucket, 100, 1000);
    let reserve = L {
        cost: 40,
        ..l.clone()
    };
    assert_eq!(
        s.one(T0, &reserve),
        (1, "60".into(), "400".into(), "0".into())
    );
    s.settle(T0, &l, 90);
    // Balance -30: never shown below 0; a request of 40 fits once 70 tokens came back (700 ms).
    assert_eq!(
        s.one(T0, &reserve),
        (0, "0".into(), "1300".into(), "700".into())
    );
    assert_eq!(s.one(T0 + 699 * MS, &reserve).0, 0);
    assert_eq!(
        s.one(T0 + 700 * MS, &reserve),
        (1, "0".into(), "1000".into(), "0".into())
    );
}

#[test]
fn fixed_window_debt_is_repaid_by_the_next_windows() {
    let (_dir, redis) = start("lua-settle-debt-fw");
    let mut s = Script::new(&redis);
    let l = limit("rl:t:debt-fw", Algorithm::FixedWindow, 10, 1000);
    assert_eq!(s.one(T0, &l).0, 1);
    // The response used 25: 24 more, 25 counted in a window of 10: the next window starts at
    // 15, the one after at 5, and a request fits again only then (2 s from now).
    s.settle(T0, &l, 24);
    assert_eq!(s.one(T0, &l), (0, "0".into(), "3000".into(), "2000".into()));
    assert_eq!(
        s.one(T0 + 1500 * MS, &l),
        (0, "0".into(), "1500".into(), "500".into())
    );
    assert_eq!(
        s.one(T0 + 2000 * MS, &l),
        (1, "4".into(), "1000".into(), "0".into())
    );
}

#[test]
fn a_debt_refuses_on_every_metered_algorithm_and_a_give_back_restores_it() {
    let (_dir, redis) = start("lua-settle-all");
    let mut s = Script::new(&redis);
    for (algorithm, key) in METERED {
        let l = limit(key, algorithm, 10, 1000);
        let reserve = L {
            cost: 4,
            ..l.clone()
        };
        assert_eq!(s.one(T0, &reserve).0, 1, "{algorithm:?}");
        // The usage was 12: 8 more, the balance is 10 - 12 < 0.
        s.settle(T0, &l, 8);
        let (allowed, remaining, _, retry) = s.one(T0, &l);
        assert_eq!((allowed, remaining.as_str()), (0, "0"), "{algorithm:?}");
        assert!(
            retry.parse::<u64>().unwrap() > 100,
            "{algorithm:?}: {retry}"
        );
        // Giving back 12 (the whole usage) makes the limit whole, and no more than whole.
        s.settle(T0, &l, -12);
        let whole = L {
            cost: 10,
            ..l.clone()
        };
        assert_eq!(s.one(T0, &whole).0, 1, "{algorithm:?}: all 10 back");
        assert_eq!(s.one(T0, &l).0, 0, "{algorithm:?}: not one more");
    }
}

#[test]
fn a_give_back_never_raises_a_limit_past_its_allowance() {
    let (_dir, redis) = start("lua-settle-bound");
    let mut s = Script::new(&redis);
    for (algorithm, key) in METERED {
        let l = limit(key, algorithm, 10, 1000);
        let reserve = L {
            cost: 5,
            ..l.clone()
        };
        assert_eq!(s.one(T0, &reserve).0, 1, "{algorithm:?}");
        s.settle(T0, &l, -1000);
        let whole = L {
            cost: 10,
            ..l.clone()
        };
        assert_eq!(s.one(T0, &whole).0, 1, "{algorithm:?}: whole again");
        assert_eq!(s.one(T0, &l).0, 0, "{algorithm:?}: never more than whole");
        // A give-back on a state that expired (or never was) adds nothing to a fresh one.
        let fresh = L {
            key: match algorithm {
                Algorithm::TokenBucket => "rl:t:u-fresh-tb",
                Algorithm::Gcra => "rl:t:u-fresh-gcra",
                Algorithm::FixedWindow => "rl:t:u-fresh-fw",
                _ => "rl:t:u-fresh-swc",
            },
            ..l.clone()
        };
        s.settle(T0, &fresh, -5);
        assert_eq!(redis.admin().cmd(&["EXISTS", fresh.key]).unwrap().int(), 0);
        // A debt on it is charged on a fresh state: 10 - 13 leaves nothing.
        s.settle(T0, &fresh, 13);
        assert_eq!(
            s.one(T0, &fresh).0,
            0,
            "{algorithm:?}: a debt on a fresh state"
        );
    }
}

#[test]
fn after_mode_admits_while_a_unit_is_left_and_charges_nothing() {
    let (_dir, redis) = start("lua-after");
    let mut s = Script::new(&redis);
    for (algorithm, key) in METERED {
        let after = L {
            cost: 500,
            after: true,
            ..limit(key, algorithm, 10, 1000)
        };
        // The estimate (500) is far above the limit; the request is let in charging nothing.
        let (allowed, remaining, _, _) = s.one(T0, &after);
        assert_eq!((allowed, remaining.as_str()), (1, "10"), "{algorithm:?}");
        assert_eq!((s.one(T0, &after).0, s.one(T0, &after).0), (1, 1));
        // Its usage (9) leaves 1 unit: still admitted; 1 more: refused until a unit is back.
        s.settle(T0, &after, 9);
        assert_eq!(s.one(T0, &after).0, 1, "{algorithm:?}");
        s.settle(T0, &after, 1);
        let (allowed, remaining, _, retry) = s.one(T0, &after);
        assert_eq!((allowed, remaining.as_str()), (0, "0"), "{algorithm:?}");
        assert!(retry.parse::<u64>().unwrap() > 0, "{algorithm:?}");
    }
    // Token bucket: 10 per second, 3 units of debt: a unit is left again after 400 ms.
    let after = L {
        after: true,
        ..limit("rl:t:u-after-tb", Algorithm::TokenBucket, 10, 1000)
    };
    s.settle(T0, &after, 13);
    assert_eq!(
        s.one(T0, &after),
        (0, "0".into(), "1300".into(), "400".into())
    );
    assert_eq!(s.one(T0 + 400 * MS, &after).0, 1);
}

#[test]
fn a_settlement_request_holds_only_settlements() {
    let (_dir, redis) = start("lua-settle-bad");
    let mut s = Script::new(&redis);
    let l = limit("rl:t:u-bad", Algorithm::SlidingWindowLog, 10, 1000);
    let command = DecideCall::settle(
        T0,
        0,
        &[Settlement {
            check: l.check(),
            delta: 3,
        }],
    )
    .command(&s.sha);
    let items = s.conn.cmd(&command).unwrap().items();
    assert_eq!(items[1].int(), -1, "{items:?}: no settlement for a log");
}
