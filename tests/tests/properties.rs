//! The algorithms proven against each other over random traffic: every Lua script in a real
//! Redis (called through the filter's own `DecideCall`) and its Rust twin in the core
//! (`ratelimit_core::algorithms`, what the `local` failure mode runs) must agree decision by
//! decision; and the twin keeps each algorithm's promises: never more than its bound in any
//! window, a refused request retried after its `retry` is allowed, a clock going backwards never
//! refills. Fixed windows run over calendar windows too (days, ISO weeks, months at random UTC
//! offsets, from instants just before a boundary in 1970 to 2170). proptest shrinks a failing sequence to a minimal one. Seeded and bounded here;
//! `PROPTEST_CASES=N` runs more (`make fuzz`).

use proptest::prelude::*;
use proptest::test_runner::TestRunner;

mod common;

use e2e::{Redis, RedisConn, WorkDir};
use ratelimit_core::algorithms::{evaluate, Params, State, NEVER};
use ratelimit_core::bridge::DecideCall;
use ratelimit_core::check::{LimitCheck, Mode};
use ratelimit_core::config::{Algorithm, Calendar, CalendarUnit, Window};
use ratelimit_core::local::unix_ms;

const T0: u128 = 1_764_489_600_000_000_000;
const MS: u128 = 1_000_000;

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
];

/// A limit and the traffic on one key: (ms since the previous request, possibly back, cost).
#[derive(Debug, Clone)]
struct Scenario {
    algorithm: Algorithm,
    limit: u64,
    window_ms: u64,
    burst: u64,
    steps: Vec<(i64, u64)>,
    /// A fixed window's calendar: its windows instead of `window_ms`'s.
    calendar: Option<Calendar>,
    /// The clock before the first step (Unix ns).
    start: u128,
}

impl Scenario {
    fn window(&self) -> Window {
        match self.calendar {
            Some(c) => Window::Calendar(c),
            None => Window::ms(self.window_ms),
        }
    }

    /// The index of the window holding Unix ms `t` (aligned windows).
    fn window_index(&self, t: f64) -> f64 {
        match self.calendar {
            Some(c) => c.index(t),
            None => (t / self.window_ms as f64).floor(),
        }
    }
}

fn scenario(algorithm: Algorithm, max_steps: usize) -> impl Strategy<Value = Scenario> {
    let buckets = matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra);
    (1u64..=20, 50u64..=3000, 1u64..=30).prop_flat_map(move |(limit, window_ms, burst)| {
        let step = prop_oneof![
            8 => 0i64..(2 * window_ms as i64),
            1 => -(window_ms as i64)..0,
        ];
        prop::collection::vec((step, 1u64..=4), 1..max_steps).prop_map(move |steps| Scenario {
            algorithm,
            limit,
            window_ms,
            burst: if buckets { burst } else { limit },
            steps,
            calendar: None,
            start: T0,
        })
    })
}

/// A fixed window over calendar windows: a unit, an offset, a start just before one of its
/// boundaries (1970 to 2170), and steps of up to a second (piling up in one window) or up to
/// half the unit's longest window (crossing boundaries), now and then back.
fn calendar_scenario(max_steps: usize) -> impl Strategy<Value = Scenario> {
    let unit = prop_oneof![
        Just(CalendarUnit::Day),
        Just(CalendarUnit::Week),
        Just(CalendarUnit::Month)
    ];
    let years_ms = 200 * 365 * 86_400_000u64;
    (1u64..=20, unit, -840i16..=840, 0..years_ms, 0u64..7_200_000).prop_flat_map(
        move |(limit, unit, offset_minutes, at, before)| {
            let calendar = Calendar {
                unit,
                offset_minutes,
            };
            let longest = calendar.longest_ms() as i64;
            let boundary = calendar.end(calendar.index(at as f64)) as u128;
            let start = (boundary - u128::from(before).min(boundary)) * MS;
            let step = prop_oneof![
                4 => 0i64..1000,
                4 => 0i64..(longest / 2),
                1 => -(longest / 4)..0,
            ];
            prop::collection::vec((step, 1u64..=4), 1..max_steps).prop_map(move |steps| Scenario {
                algorithm: Algorithm::FixedWindow,
                limit,
                window_ms: longest as u64,
                burst: limit,
                steps,
                calendar: Some(calendar),
                start,
            })
        },
    )
}

/// Every algorithm's scenarios, and the fixed window's over calendar windows, by name.
fn every_scenario(max_steps: usize) -> Vec<(String, BoxedStrategy<Scenario>)> {
    let mut all: Vec<(String, BoxedStrategy<Scenario>)> = ALGORITHMS
        .iter()
        .map(|a| (a.name().to_string(), scenario(*a, max_steps).boxed()))
        .collect();
    all.push((
        "fixed_window (calendar)".to_string(),
        calendar_scenario(max_steps).boxed(),
    ));
    all
}

fn runner(cases: u32) -> TestRunner {
    common::seeded_runner(cases, 7)
}

/// One decision as (allowed, remaining, reset ms, retry ms).
type Answer = (bool, f64, f64, f64);

fn lua(conn: &mut RedisConn, sha: &str, key: &str, s: &Scenario, cost: u64, now: u128) -> Answer {
    let check = LimitCheck {
        rule: 0,
        limit: 0,
        key: key.into(),
        algorithm: s.algorithm,
        per_window: s.limit,
        quota: s.burst,
        window: s.window(),
        burst: s.burst,
        cost,
        mode: Mode::of(false, None, false, None),
        overrides: false,
    };
    let command = DecideCall::new(&now.to_string(), 0, [std::slice::from_ref(&check)])
        .command("EVALSHA", sha);
    let items = conn.cmd(&command).expect("EVALSHA").items();
    let number = |i: usize| items[i].text().parse::<f64>().unwrap_or(f64::NAN);
    (items[3].int() == 1, number(4), number(5), number(6))
}

fn params(s: &Scenario, cost: u64) -> Params {
    Params::new(s.limit, s.window(), s.burst, cost)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

/// The instants of the scenario (ns), the clock moving by each step.
fn instants(s: &Scenario) -> Vec<u128> {
    let mut now = s.start as i128;
    s.steps
        .iter()
        .map(|(step, _)| {
            now += *step as i128 * MS as i128;
            now as u128
        })
        .collect()
}

#[test]
fn the_lua_scripts_and_their_rust_twins_agree_decision_by_decision() {
    let dir = WorkDir::new("properties-differential");
    let redis = Redis::start(&dir);
    let conn = std::cell::RefCell::new(redis.webdis_user());
    let sha = conn
        .borrow_mut()
        .cmd(&["SCRIPT", "LOAD", &ratelimit_core::decision_script()])
        .unwrap()
        .text();
    let mut total = 0u64;
    for (name, scenarios) in every_scenario(30) {
        let mut runner = runner(60);
        let case = std::cell::Cell::new(0u64);
        let result = runner.run(&scenarios, |s| {
            case.set(case.get() + 1);
            let algorithm = s.algorithm;
            let key = format!("rl:prop:{name}:{}", case.get());
            let mut conn = conn.borrow_mut();
            let mut state: Option<State> = None;
            for ((_, cost), now) in s.steps.iter().zip(instants(&s)) {
                let from_redis = lua(&mut conn, &sha, &key, &s, *cost, now);
                let e = evaluate(algorithm, state.as_ref(), params(&s, *cost), unix_ms(now));
                let (remaining, reset, retry) = e.reply(e.allowed);
                let twin = (e.allowed, remaining, reset, retry);
                prop_assert!(
                    from_redis.0 == twin.0
                        && close(from_redis.1, twin.1)
                        && close(from_redis.2, twin.2)
                        && close(from_redis.3, twin.3),
                    "at {} ms, cost {cost}: Lua {from_redis:?}, Rust {twin:?}",
                    (now as i128 - s.start as i128) / MS as i128
                );
                if e.allowed {
                    state = Some(e.charged);
                } else if let Some(kept) = e.kept {
                    state = Some(kept);
                }
            }
            Ok(())
        });
        if let Err(failure) = result {
            panic!("{name}: {failure}");
        }
        total += case.get();
    }
    println!("differential: {total} random sequences, Lua and Rust agreed on every decision");
}

/// Runs the twin over a scenario: (instant ms, cost, evaluation) of each step.
fn replay(
    s: &Scenario,
) -> Vec<(
    f64,
    u64,
    ratelimit_core::algorithms::Evaluation,
    Option<State>,
)> {
    let mut state: Option<State> = None;
    let mut out = Vec::new();
    for ((_, cost), now) in s.steps.iter().zip(instants(s)) {
        let before = state.clone();
        let e = evaluate(s.algorithm, state.as_ref(), params(s, *cost), unix_ms(now));
        if e.allowed {
            state = Some(e.charged.clone());
        } else if let Some(kept) = &e.kept {
            state = Some(kept.clone());
        }
        out.push((unix_ms(now), *cost, e, before));
    }
    out
}

#[test]
fn every_algorithm_keeps_its_promises() {
    let total = std::cell::Cell::new(0u64);
    for (name, scenarios) in every_scenario(40) {
        let mut runner = runner(2000);
        let result = runner.run(&scenarios, |s| {
            total.set(total.get() + 1);
            let algorithm = s.algorithm;
            let steps = replay(&s);
            let w = s.window_ms as f64;
            // Never more than the bound in any window, over clocks that only move forward.
            let forward = s.steps.iter().all(|(step, _)| *step >= 0);
            for (i, (t0, ..)) in steps.iter().enumerate() {
                if !forward {
                    break;
                }
                let mut allowed = 0.0;
                for (t1, cost, e, _) in &steps[i..] {
                    if e.allowed {
                        allowed += *cost as f64;
                    }
                    let span = t1 - t0;
                    let bound = match algorithm {
                        Algorithm::TokenBucket | Algorithm::Gcra => {
                            s.burst as f64 + s.limit as f64 * span / w
                        }
                        // Any sliding window holds at most `limit`.
                        Algorithm::SlidingWindowLog if span < w => s.limit as f64,
                        // An aligned window holds at most `limit`; a span touches this many.
                        _ => s.limit as f64 * (s.window_index(*t1) - s.window_index(*t0) + 1.0),
                    };
                    prop_assert!(
                        allowed <= bound + 1e-6,
                        "{allowed} allowed in {span} ms, bound {bound}"
                    );
                }
            }
            // The first step at which the clock went back, if any.
            let back = s
                .steps
                .iter()
                .position(|(step, _)| *step < 0)
                .unwrap_or(s.steps.len());
            for (i, (now, cost, e, before)) in steps.iter().enumerate() {
                // Retried after `retry` with no other traffic, a refused request fits, if it
                // can ever fit: to the millisecond (the refill summed in doubles can land a hair
                // short of the exact instant, so 1 ms is allowed).
                let capacity = match algorithm {
                    Algorithm::TokenBucket | Algorithm::Gcra => s.burst,
                    _ => s.limit,
                };
                // A cost above what the limit ever holds is refused with no retry time, and only
                // such a cost.
                prop_assert!(
                    (e.retry == NEVER) == (!e.allowed && *cost > capacity),
                    "cost {cost}, capacity {capacity}: allowed {}, retry {}",
                    e.allowed,
                    e.retry
                );
                // (Once a clock has gone back, a window's state is ahead of it, and its retry
                // is counted from the window it stays in: a promise for clocks that move on.)
                if !e.allowed && *cost <= capacity && i < back {
                    let later = evaluate(
                        algorithm,
                        before.as_ref(),
                        params(&s, *cost),
                        now + e.retry + 1.0,
                    );
                    prop_assert!(
                        later.allowed,
                        "refused with retry {} ms, then refused again",
                        e.retry
                    );
                }
                // A clock that went back refills nothing: never more room than now.
                let earlier = evaluate(algorithm, before.as_ref(), params(&s, *cost), now - 1000.0);
                prop_assert!(
                    earlier.kept_remaining <= e.kept_remaining + 1e-9
                        || !matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra),
                    "going back 1 s left {} instead of {}",
                    earlier.kept_remaining,
                    e.kept_remaining
                );
            }
            Ok(())
        });
        if let Err(failure) = result {
            panic!("{name}: {failure}");
        }
    }
    println!(
        "invariants: {} random sequences, every promise kept",
        total.get()
    );
}

/// What happens at one step of a usage limit's traffic.
#[derive(Debug, Clone, Copy)]
enum Usage {
    /// A request reserving `cost` (mode `reserve`).
    Reserve(u64),
    /// A request in mode `after` (charges nothing).
    After,
    /// A settlement of `delta` units (positive: debt; negative: a give-back).
    Settle(i64),
}

const METERED: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
];

/// A usage limit and its traffic: (ms since the previous step, forward only, what happens).
fn usage_scenario(algorithm: Algorithm) -> impl Strategy<Value = (Scenario, Vec<Usage>)> {
    let buckets = matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra);
    (1u64..=20, 50u64..=3000, 1u64..=30).prop_flat_map(move |(limit, window_ms, burst)| {
        let step = (0i64..(window_ms as i64), usage_op());
        prop::collection::vec(step, 1..30).prop_map(move |ops| {
            let scenario = Scenario {
                algorithm,
                limit,
                window_ms,
                burst: if buckets { burst } else { limit },
                steps: ops.iter().map(|(dt, _)| (*dt, 1)).collect(),
                calendar: None,
                start: T0,
            };
            (scenario, ops.into_iter().map(|(_, op)| op).collect())
        })
    })
}

fn usage_op() -> impl Strategy<Value = Usage> {
    prop_oneof![
        3 => (1u64..=6).prop_map(Usage::Reserve),
        1 => Just(Usage::After),
        3 => (-8i64..=12).prop_map(Usage::Settle),
    ]
}

/// A usage limit's scenario and what happens at each of its steps.
type UsageScenario = (Scenario, Vec<Usage>);

/// Every metered algorithm's usage scenarios, and the fixed window's over calendar windows
/// (its clock moving forward only), by name.
fn usage_scenarios() -> Vec<(String, BoxedStrategy<UsageScenario>)> {
    let mut all: Vec<_> = METERED
        .iter()
        .map(|a| (a.name().to_string(), usage_scenario(*a).boxed()))
        .collect();
    let calendar = calendar_scenario(30).prop_flat_map(|mut s| {
        for step in &mut s.steps {
            step.0 = step.0.abs();
        }
        let n = s.steps.len();
        prop::collection::vec(usage_op(), n).prop_map(move |ops| (s.clone(), ops))
    });
    all.push(("fixed_window (calendar)".to_string(), calendar.boxed()));
    all
}

fn check(s: &Scenario, key: &str, cost: u64, after: bool) -> LimitCheck {
    LimitCheck {
        rule: 0,
        limit: 0,
        key: key.into(),
        algorithm: s.algorithm,
        per_window: s.limit,
        quota: s.burst,
        window: s.window(),
        burst: s.burst,
        cost,
        mode: Mode::of(after, None, false, None),
        overrides: false,
    }
}

/// Usage limits: settlements (debt and give-backs) and `after` admissions agree between each
/// script and its twin, decision by decision; and the twin keeps the usage promises: a
/// give-back never leaves more than the full allowance, and a request refused for debt fits
/// once its retry has passed.
#[test]
fn settlements_and_after_admissions_agree_with_their_twins_and_keep_their_promises() {
    use ratelimit_core::algorithms::{evaluate_after, settle};
    use ratelimit_core::decision::Settlement;
    let dir = WorkDir::new("properties-usage");
    let redis = Redis::start(&dir);
    let conn = std::cell::RefCell::new(redis.webdis_user());
    let sha = conn
        .borrow_mut()
        .cmd(&["SCRIPT", "LOAD", &ratelimit_core::decision_script()])
        .unwrap()
        .text();
    for (name, scenarios) in usage_scenarios() {
        let mut runner = runner(60);
        let case = std::cell::Cell::new(0u64);
        let result = runner.run(&scenarios, |(s, ops)| {
            case.set(case.get() + 1);
            let algorithm = s.algorithm;
            let key = format!("rl:prop-usage:{name}:{}", case.get());
            let mut conn = conn.borrow_mut();
            let mut state: Option<State> = None;
            let capacity = s.burst as f64;
            for (op, now) in ops.iter().zip(instants(&s)) {
                let ms = unix_ms(now);
                let at = (now - s.start) / MS;
                match *op {
                    Usage::Settle(delta) => {
                        let settlement = Settlement {
                            check: check(&s, &key, 0, false),
                            delta,
                        };
                        let command =
                            DecideCall::settle(now, 0, &[settlement]).command("EVALSHA", &sha);
                        let items = conn.cmd(&command).expect("EVALSHA").items();
                        prop_assert_eq!(items[3].int(), 1);
                        if let Some(next) =
                            settle(algorithm, state.as_ref(), params(&s, 0), delta as f64, ms)
                        {
                            state = Some(next);
                        }
                        // Never more than the full allowance, in Redis as in the twin.
                        let whole = evaluate(algorithm, state.as_ref(), params(&s, 1), ms);
                        prop_assert!(
                            whole.kept_remaining <= capacity + 1e-6 * capacity.max(1.0),
                            "at {at} ms: {whole:?}"
                        );
                    }
                    Usage::Reserve(_) | Usage::After => {
                        let after = matches!(op, Usage::After);
                        let cost = if let Usage::Reserve(c) = op { *c } else { 50 };
                        let c = check(&s, &key, cost, after);
                        let command =
                            DecideCall::new(&now.to_string(), 0, [std::slice::from_ref(&c)])
                                .command("EVALSHA", &sha);
                        let items = conn.cmd(&command).expect("EVALSHA").items();
                        let number = |i: usize| items[i].text().parse::<f64>().unwrap_or(f64::NAN);
                        let from_redis = (items[3].int() == 1, number(4), number(5), number(6));
                        let e = if after {
                            evaluate_after(algorithm, state.as_ref(), params(&s, cost), ms)
                        } else {
                            evaluate(algorithm, state.as_ref(), params(&s, cost), ms)
                        };
                        let (remaining, reset, retry) = e.reply(e.allowed);
                        let twin = (e.allowed, remaining, reset, retry);
                        prop_assert!(
                            from_redis.0 == twin.0
                                && close(from_redis.1, twin.1)
                                && close(from_redis.2, twin.2)
                                && close(from_redis.3, twin.3),
                            "at {at} ms, {op:?}: Lua {from_redis:?}, Rust {twin:?}"
                        );
                        if !e.allowed {
                            // Retried after `retry` with no other traffic, it fits (if it can).
                            let fits = if after { true } else { cost <= s.burst };
                            let later_ms = ms + e.retry + 1.0;
                            let later = if after {
                                evaluate_after(
                                    algorithm,
                                    state.as_ref(),
                                    params(&s, cost),
                                    later_ms,
                                )
                            } else {
                                evaluate(algorithm, state.as_ref(), params(&s, cost), later_ms)
                            };
                            prop_assert!(
                                !fits || later.allowed,
                                "at {at} ms, {op:?}: refused with retry {} ms, then refused again",
                                e.retry
                            );
                        } else if !after {
                            state = Some(e.charged);
                        }
                    }
                }
            }
            Ok(())
        });
        if let Err(failure) = result {
            panic!("{name}: {failure}");
        }
    }
}
