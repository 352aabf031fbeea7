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
fn a_stalled_call_opens_the_breaker_and_releases_every_waiting_request() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    e.on_request(&c, &mut h, 3, &req("/", "c"));
    h.now = Some(T0 + 24 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.breaker_open, 0, "24 ms is no stall yet");
    h.now = Some(T0 + 25 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.breaker_open, 1);
    assert_eq!(
        h.resumed,
        vec![2, 3, 1],
        "all released at once, by the open policy"
    );
    assert_eq!(e.load(), (0, 0));
    assert_eq!(
        h.breaker_log[0],
        (true, "a call has been in flight for 25 ms".into())
    );
    // The abandoned call's reply, if it still comes, changes nothing.
    e.on_reply(&c, &mut h, Some(1), 1, ok(&reply_of(R::Allow(1))));
    assert_eq!(h.count_of(Counter::Allowed), 0);
    // A stall is also seen by the next request, without a tick.
    let mut e = Engine::new(&c);
    let mut h = FakeHost::new();
    e.on_request(&c, &mut h, 1, &req("/", "a"));
    h.now = Some(T0 + 30 * MS);
    assert_eq!(
        e.on_request(&c, &mut h, 2, &req("/", "b")),
        Verdict::Continue
    );
    assert_eq!(h.resumed, vec![1]);
    assert_eq!(h.breaker_open, 1);
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
        call.path.ends_with("/0"),
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
    let (c, mut e, mut h) = setup(r#""bridge": {"timeout": "200ms", "clock_skew": "1s"},"#);
    e.on_request(&c, &mut h, 1, &req("/", "k"));
    // T0 + 200 ms + 1 s, in ms.
    assert!(h.dispatched[0].1.path.contains("/1000000000000/1001200/1/"));
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
