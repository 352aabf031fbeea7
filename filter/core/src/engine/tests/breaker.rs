//! The circuit breaker, deadlines, and the `local` failure mode.

use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn the_breaker_opens_after_failures_in_a_row_and_then_decides_without_calls() {
    let (c, mut e, mut h) = setup(r#""breaker": {"failures": 3},"#);
    // Two failures, a success, then three failures: only a run of three opens it.
    for (ctx, reply) in [
        (1, None),
        (2, None),
        (3, Some(R::Allow(1))),
        (4, None),
        (5, None),
    ] {
        e.on_request(&c, &mut h, ctx, &req("/", "k"));
        let token = h.last_token();
        match reply {
            Some(r) => e.on_reply(&c, &mut h, Some(ctx), token, ok(&reply_of(r))),
            None => e.on_reply(&c, &mut h, Some(ctx), token, none()),
        }
    }
    assert_eq!(h.breaker_open, 0);
    e.on_request(&c, &mut h, 6, &req("/", "k"));
    let token = h.last_token();
    e.on_reply(
        &c,
        &mut h,
        Some(6),
        token,
        BridgeReply {
            status: Some(503),
            body: b"",
        },
    );
    assert_eq!(h.breaker_open, 1);
    assert_eq!(h.count_of(Counter::BreakerTrips), 1);
    assert_eq!(
        h.breaker_log,
        vec![(
            true,
            "3 calls in a row failed, the last: bridge answered HTTP 503".into()
        )]
    );
    // Open: decided by the policy at once, no call, not a bridge error, not logged again.
    let (calls, errors, logged) = (
        h.dispatched.len(),
        h.count_of(Counter::BridgeErrors),
        h.failures.len(),
    );
    assert_eq!(
        e.on_request(&c, &mut h, 7, &req("/", "k")),
        Verdict::Continue
    );
    assert_eq!(h.dispatched.len(), calls);
    assert_eq!(h.count_of(Counter::BridgeErrors), errors);
    assert_eq!(h.failures.len(), logged);
    assert_eq!(h.count_of(Counter::FailureModeOpen), 6);
    let closed = config(r#""failure_mode": "closed", "breaker": {"failures": 1},"#);
    let mut e = Engine::new(&closed);
    let mut h = FakeHost::new();
    e.on_request(&closed, &mut h, 1, &req("/", "k"));
    e.on_reply(&closed, &mut h, Some(1), 1, none());
    assert_eq!(
        e.on_request(&closed, &mut h, 2, &req("/", "k")),
        Verdict::Pause
    );
    assert_eq!(h.statuses(), vec![(1, 503), (2, 503)]);
}

fn reply_of(r: R) -> String {
    reply(&[r])
}

#[test]
fn a_hung_call_opens_the_breaker_within_its_timeout_and_releases_every_waiting_request() {
    let (c, mut e, mut h) = setup("");
    h.now = Some(T0);
    e.on_tick(&c, &mut h);
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    e.on_request(&c, &mut h, 3, &req("/", "c"));
    ticks(&mut e, &c, &mut h, 25, 125);
    h.now = Some(T0 + 149 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(
        h.breaker_open, 0,
        "149 ms of a 150 ms timeout: not hung yet"
    );
    h.now = Some(T0 + 150 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.breaker_open, 1);
    assert_eq!(
        h.resumed,
        vec![1, 2, 3],
        "all released at once, by the open policy"
    );
    assert_eq!(e.load(), (0, 0));
    assert_eq!(
        h.breaker_log[0],
        (
            true,
            "a call has had no answer for 150 ms of the worker's time (its timeout: 150 ms) while requests waited".into()
        )
    );
    assert_eq!(h.count_of(Counter::BridgeCalls), 1);
    // The abandoned call's answer, if it still comes, decides nothing but shows the bridge
    // answers: the breaker closes and the next request is decided again.
    h.now = Some(T0 + 170 * MS);
    e.on_reply(&c, &mut h, Some(1), 1, ok(&reply_of(R::Allow(1))));
    assert_eq!(h.count_of(Counter::Allowed), 0);
    assert_eq!(h.breaker_open, 0);
    assert_eq!(
        h.breaker_log[1],
        (
            false,
            "a call given up on was answered after 20 ms open: the bridge answers, slowly".into()
        )
    );
    e.on_request(&c, &mut h, 4, &req("/", "d"));
    assert_eq!(h.dispatched.len(), 2);
    // A hang is also seen by the next request, without a tick.
    let mut e = Engine::new(&c);
    let mut h = FakeHost::new();
    e.on_request(&c, &mut h, 1, &req("/", "a"));
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    ticks(&mut e, &c, &mut h, 25, 125);
    h.now = Some(T0 + 150 * MS);
    assert_eq!(
        e.on_request(&c, &mut h, 3, &req("/", "c")),
        Verdict::Continue
    );
    assert_eq!(h.resumed, vec![1, 2]);
    assert_eq!(h.breaker_open, 1);
}

#[test]
fn a_slow_answer_within_the_timeout_is_no_failure() {
    let (c, mut e, mut h) = setup(r#""breaker": {"failures": 1},"#);
    h.now = Some(T0);
    e.on_tick(&c, &mut h);
    for round in 0..3u128 {
        let start = round * 150;
        h.now = Some(T0 + start * MS);
        arrive(&mut e, &c, &mut h, 10 * round as u32 + 1, &req("/", "a"));
        e.on_request(&c, &mut h, 10 * round as u32 + 2, &req("/", "b"));
        ticks(&mut e, &c, &mut h, start, start + 125);
        // Each call answers at 149 ms, while a request waits.
        h.now = Some(T0 + (start + 149) * MS);
        let token = h.last_token();
        e.on_reply(&c, &mut h, None, token, ok(&reply_of(R::Allow(5))));
        let token = h.last_token();
        e.on_reply(&c, &mut h, None, token, ok(&reply_of(R::Allow(4))));
    }
    assert_eq!(h.breaker_open, 0);
    assert_eq!(h.count_of(Counter::BreakerTrips), 0);
    assert_eq!(h.count_of(Counter::Allowed), 6);
    assert!(h.failures.is_empty(), "{:?}", h.failures);
}

#[test]
fn a_late_worker_with_a_reply_waiting_decides_and_does_not_open() {
    for tick_first in [false, true] {
        let (c, mut e, mut h) = setup("");
        ticks(&mut e, &c, &mut h, 0, 50);
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        e.on_request(&c, &mut h, 2, &req("/", "b"));
        // The worker does not run from 50 ms to 400 ms (a CPU quota, busy neighbours): its
        // timer and the reply Redis sent at once both come late. A new request may come
        // first, then the timer and the reply in either order.
        h.now = Some(T0 + 400 * MS);
        e.on_request(&c, &mut h, 3, &req("/", "c"));
        if tick_first {
            e.on_tick(&c, &mut h);
        }
        e.on_reply(&c, &mut h, Some(1), 1, ok(&reply_of(R::Allow(9))));
        if !tick_first {
            e.on_tick(&c, &mut h);
        }
        e.on_wakeup(&c, &mut h);
        assert_eq!(h.breaker_open, 0, "tick first: {tick_first}");
        assert!(h.failures.is_empty(), "{:?}", h.failures);
        assert_eq!(h.resumed, vec![1]);
        e.on_reply(&c, &mut h, None, 2, ok(&reply(&[R::Allow(8), R::Allow(7)])));
        assert_eq!(h.resumed, vec![1, 2, 3]);
        assert_eq!(h.count_of(Counter::Allowed), 3);
        // The lateness was counted (400 - 50 - 25 - 5 ms of jitter).
        assert_eq!(h.count_of(Counter::WorkerLagMs), 320);
    }
    // However late the worker runs, a request waits at most its timeout plus the lag
    // allowance: Envoy's timeout of the call, then the call is given up.
    let (c, mut e, mut h) = setup(r#""bridge": {"lag_allowance": "200ms"},"#);
    ticks(&mut e, &c, &mut h, 0, 0);
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    assert_eq!(h.dispatched[0].2, Duration::from_millis(350));
    h.now = Some(T0 + 349 * MS);
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    assert!(h.resumed.is_empty());
    h.now = Some(T0 + 350 * MS);
    e.on_request(&c, &mut h, 3, &req("/", "c"));
    // Request 1 goes on by policy; 2 and 3 came while the worker stood still: they wait.
    assert_eq!(h.resumed, vec![1]);
    assert_eq!(h.failures, vec![BridgeFailure::Timeout]);
    // Envoy's timeout of the call: one failure in the breaker's run, not a hang.
    e.on_reply(&c, &mut h, Some(1), 1, none());
    assert_eq!(h.breaker_open, 0);
    e.on_wakeup(&c, &mut h);
    assert_eq!(h.batch_size(1), 2, "the next call decides 2 and 3");
}

#[test]
fn one_probe_per_interval_and_an_answer_closes_the_breaker() {
    let (c, mut e, mut h) = setup(r#""breaker": {"failures": 1, "probe_interval": "500ms"},"#);
    e.on_request(&c, &mut h, 1, &req("/", "a"));
    e.on_reply(&c, &mut h, Some(1), 1, none());
    assert_eq!(h.breaker_open, 1);
    h.now = Some(T0 + 499 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.dispatched.len(), 1, "no probe before the interval");
    h.now = Some(T0 + 500 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.dispatched.len(), 2);
    let (probe, call, timeout) = h.dispatched[1].clone();
    assert!(
        call.path.ends_with("/0~0~0"),
        "an empty decision call: {}",
        call.path
    );
    assert_eq!(timeout, Duration::from_millis(500));
    e.on_tick(&c, &mut h);
    assert_eq!(h.dispatched.len(), 2, "one probe at a time");
    // The probe fails: the next goes one interval later.
    h.now = Some(T0 + 600 * MS);
    e.on_reply(
        &c,
        &mut h,
        None,
        probe,
        BridgeReply {
            status: Some(503),
            body: b"",
        },
    );
    assert_eq!(h.breaker_open, 1);
    h.now = Some(T0 + 999 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.dispatched.len(), 2);
    h.now = Some(T0 + 1000 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.dispatched.len(), 3);
    h.now = Some(T0 + 1002 * MS);
    e.on_reply(&c, &mut h, None, 3, ok(r#"{"EVALSHA":[0]}"#));
    assert_eq!(h.breaker_open, 0);
    assert_eq!(
        h.breaker_log.last(),
        Some(&(false, "a probe was answered after 1002 ms open".to_string()))
    );
    // Closed: requests are sent again.
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    assert_eq!(h.dispatched.len(), 4);
}

#[test]
fn without_a_breaker_nothing_opens() {
    let (c, mut e, mut h) = setup(r#""breaker": false,"#);
    for ctx in 1..=10 {
        e.on_request(&c, &mut h, ctx, &req("/", "k"));
        let token = h.last_token();
        e.on_reply(&c, &mut h, Some(ctx), token, none());
    }
    e.on_request(&c, &mut h, 11, &req("/", "k"));
    h.now = Some(T0 + 10_000 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.breaker_open, 0);
    assert_eq!(h.dispatched.len(), 11);
}

#[test]
fn a_call_carries_the_deadline_after_which_redis_must_not_charge() {
    let (c, mut e, mut h) =
        setup(r#""bridge": {"timeout": "200ms", "clock_skew": "1s", "lag_allowance": "300ms"},"#);
    e.on_request(&c, &mut h, 1, &req("/", "k"));
    // T0 + 200 ms + 300 ms + 1 s, in ms: the latest the worker can still be waiting for it.
    assert!(h.dispatched[0].1.path.contains("/1000000000000/1001500/1~"));
    e.on_reply(
        &c,
        &mut h,
        Some(1),
        1,
        ok(r#"{"EVALSHA":[false,"EXPIRED decide: the call reached Redis after its deadline"]}"#),
    );
    assert_eq!(h.failures, vec![BridgeFailure::Stale]);
    assert_eq!(h.resumed, vec![1]);
}

#[test]
fn local_mode_limits_each_worker_to_its_share_while_the_bridge_fails() {
    let c = config(r#""failure_mode": "local", "local_share": 0.5, "breaker": {"failures": 1},"#);
    let mut e = Engine::new(&c);
    let mut h = FakeHost::new();
    // The call fails: the request is decided here, on 5 of the 10 per minute.
    e.on_request(&c, &mut h, 1, &req("/", "k"));
    e.on_reply(&c, &mut h, Some(1), 1, none());
    assert_eq!(h.resumed, vec![1]);
    assert_eq!(
        e.take_headers(1),
        Some(vec![
            ("x-ratelimit-limit", "5".to_string()),
            ("x-ratelimit-remaining", "4".to_string()),
            ("x-ratelimit-reset", "12".to_string())
        ])
    );
    // The breaker is open: the rest are decided here at once, without a call.
    let verdicts: Vec<Verdict> = (2..=6)
        .map(|ctx| e.on_request(&c, &mut h, ctx, &req("/", "k")))
        .collect();
    use Verdict::{Continue, Pause};
    assert_eq!(verdicts, [Continue, Continue, Continue, Continue, Pause]);
    assert_eq!(h.statuses(), vec![(6, 429)]);
    assert_eq!(h.dispatched.len(), 1);
    assert_eq!(h.count_of(Counter::FailureModeLocal), 6);
    assert_eq!(h.count_of(Counter::Allowed), 5);
    assert_eq!(h.count_of(Counter::Denied), 1);
    // Another key has a share of its own.
    assert_eq!(e.on_request(&c, &mut h, 7, &req("/", "other")), Continue);
}

/// A reply that comes when the host cannot tell the time is dated by the last time it could:
/// the breaker it opens waits its probe interval from then, not from the epoch.
#[test]
fn without_a_clock_bookkeeping_takes_the_last_time_the_host_told() {
    let (c, mut e, mut h) = setup(r#""breaker": {"failures": 1, "probe_interval": "500ms"},"#);
    e.on_request(&c, &mut h, 1, &req("/", "a"));
    h.now = None;
    e.on_reply(&c, &mut h, Some(1), 1, none());
    assert_eq!(h.breaker_open, 1);
    h.now = Some(T0 + 100 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(
        h.dispatched.len(),
        1,
        "no probe before the interval from T0"
    );
    h.now = Some(T0 + 500 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.dispatched.len(), 2, "the probe, 500 ms after T0");
    // An admission without a clock cannot be decided: it follows its policy.
    h.now = None;
    assert_eq!(
        e.on_request(&c, &mut h, 2, &req("/", "b")),
        Verdict::Continue
    );
    assert_eq!(h.failures.last(), Some(&BridgeFailure::Clock));
}

/// Every call in flight is watched, not only the oldest: with two out, the younger one of a
/// rule with a shorter timeout hangs first and opens the breaker while requests wait.
#[test]
fn a_younger_call_with_a_shorter_timeout_is_seen_hung_first() {
    let c = Config::parse(
        br#"{"bridge": {"timeout": "1s"}, "batch": {"max_in_flight": 2}, "rules": [
            {"name": "slow", "match": {"path_prefix": "/slow"}, "limits": [{"name": "m", "limit": 10, "window": "1m"}]},
            {"name": "fast", "match": {"path_prefix": "/fast"}, "timeout": "100ms", "limits": [{"name": "m", "limit": 10, "window": "1m"}]}]}"#,
    )
    .unwrap();
    let mut e = Engine::new(&c);
    let mut h = FakeHost::new();
    ticks(&mut e, &c, &mut h, 0, 0);
    arrive(&mut e, &c, &mut h, 1, &req("/slow", "a"));
    ticks(&mut e, &c, &mut h, 25, 50);
    arrive(&mut e, &c, &mut h, 2, &req("/fast", "b"));
    e.on_request(&c, &mut h, 3, &req("/slow", "c"));
    assert_eq!(e.load(), (1, 2));
    ticks(&mut e, &c, &mut h, 75, 125);
    assert_eq!(h.breaker_open, 0, "the /fast call is 75 ms out of its 100");
    ticks(&mut e, &c, &mut h, 150, 150);
    assert_eq!(
        h.breaker_open, 1,
        "100 ms without an answer while a request waits"
    );
    assert_eq!(h.resumed, vec![2, 3, 1]);
}
