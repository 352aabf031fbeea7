//! The worker's timer runs only while there is work: the first work starts it, [`IDLE_TICKS`]
//! ticks in a row with none stop it, and what needs it (deadlines, probes, give-backs,
//! settlements, releases, stats) is done across a stop and a start.

use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// Ticks on time every 25 ms from `from_ms` until the timer stops (at most `max` ticks); the
/// instant of the last tick (ms after T0).
fn tick_until_stopped(
    e: &mut Engine,
    c: &Config,
    h: &mut FakeHost,
    from_ms: u128,
    max: u32,
) -> u128 {
    let mut at = from_ms;
    for _ in 0..max {
        h.now = Some(T0 + at * MS);
        e.on_tick(c, h);
        if !e.ticking() {
            return at;
        }
        at += 25;
    }
    panic!("the timer still runs after {max} ticks from {from_ms} ms");
}

/// `n` ticks on time every 25 ms from `from_ms`; asserts the timer still runs after each.
fn ticks_running(e: &mut Engine, c: &Config, h: &mut FakeHost, from_ms: u128, n: u32) {
    for i in 0..u128::from(n) {
        h.now = Some(T0 + (from_ms + 25 * i) * MS);
        e.on_tick(c, h);
        assert!(e.ticking(), "tick {i} from {from_ms} ms stopped the timer");
    }
}

fn status(status: u16) -> BridgeReply<'static> {
    BridgeReply {
        status: Some(status),
        body: b"",
    }
}

#[test]
fn a_new_engine_and_a_request_answered_at_once_ask_for_no_timer() {
    let (c, mut e, mut h) = setup("");
    assert!(!e.needs_tick() && !e.ticking());
    // A cost out of bounds: 400 at once, nothing left to do.
    let bad = req("/costly", "k").with("x-cost", b"9");
    e.on_request(&c, &mut h, 1, &bad);
    assert_eq!(h.statuses(), vec![(1, 400)]);
    assert!(!e.needs_tick());
    assert!(h.tick_changes.is_empty(), "{:?}", h.tick_changes);
}

#[test]
fn work_starts_the_timer_once_and_idle_ticks_in_a_row_stop_it() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    assert!(e.needs_tick(), "a call out");
    assert_eq!(h.tick_changes, vec![TICK]);
    assert_eq!(h.timers, 1, "the gauge of running timers");
    // Another request waits behind it: the timer already runs, no host call.
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    assert_eq!(e.load(), (1, 1));
    assert_eq!(h.tick_changes, vec![TICK]);
    e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Allow(9)])));
    e.on_wakeup(&c, &mut h);
    e.on_reply(&c, &mut h, None, 2, ok(&reply(&[R::Allow(8)])));
    assert_eq!(h.resumed, vec![1, 2]);
    assert!(!e.needs_tick(), "all decided, the stats handed over");
    assert!(e.ticking(), "stopped only by idle ticks");
    // Idle ticks, then work again: the count starts over.
    ticks_running(&mut e, &c, &mut h, 25, IDLE_TICKS - 1);
    h.now = Some(T0 + 110 * MS);
    arrive(&mut e, &c, &mut h, 3, &req("/", "c"));
    e.on_reply(&c, &mut h, Some(3), 3, ok(&reply(&[R::Allow(7)])));
    ticks_running(&mut e, &c, &mut h, 125, IDLE_TICKS - 1);
    assert_eq!(h.tick_changes, vec![TICK]);
    let stopped = tick_until_stopped(&mut e, &c, &mut h, 200, 1);
    assert_eq!(stopped, 200);
    assert_eq!(h.tick_changes, vec![TICK, Duration::ZERO]);
    assert_eq!(h.timers, 0);
    // A minute later, a request: sent at once, and the timer starts again.
    h.now = Some(T0 + 60_000 * MS);
    arrive(&mut e, &c, &mut h, 4, &req("/", "d"));
    assert_eq!(h.dispatched.len(), 4);
    assert_eq!(h.tick_changes, vec![TICK, Duration::ZERO, TICK]);
    assert_eq!(h.timers, 1);
    e.on_reply(&c, &mut h, Some(4), 4, ok(&reply(&[R::Allow(6)])));
    assert_eq!(h.resumed, vec![1, 2, 3, 4]);
}

#[test]
fn calls_in_flight_keep_the_timer_until_their_timeout_is_seen() {
    let (c, mut e, mut h) = setup(r#""breaker": false,"#);
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    // Unanswered: the ticks watch its deadline, however many find nothing new.
    ticks_running(&mut e, &c, &mut h, 25, 5);
    assert!(h.resumed.is_empty());
    // 150 ms: its timeout, seen by the tick (no request came to see it).
    h.now = Some(T0 + 150 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.resumed, vec![1], "let through by the open policy");
    assert_eq!(h.failures, vec![BridgeFailure::Timeout]);
    tick_until_stopped(&mut e, &c, &mut h, 175, IDLE_TICKS + 1);
}

#[test]
fn an_open_breaker_keeps_the_timer_for_its_probes_and_it_stops_once_closed() {
    let (c, mut e, mut h) = setup(r#""breaker": {"failures": 1, "probe_interval": "500ms"},"#);
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    e.on_reply(&c, &mut h, Some(1), 1, status(503));
    assert_eq!(h.breaker_open, 1);
    assert_eq!(e.load(), (0, 0));
    assert!(e.needs_tick(), "nothing waits, but the probes do");
    ticks_running(&mut e, &c, &mut h, 25, 20);
    assert_eq!(h.dispatched.len(), 2, "the probe, 500 ms after the trip");
    h.now = Some(T0 + 510 * MS);
    e.on_reply(&c, &mut h, None, 2, ok(r#"{"EVALSHA":[0]}"#));
    assert_eq!(h.breaker_open, 0);
    assert!(!e.needs_tick());
    tick_until_stopped(&mut e, &c, &mut h, 525, IDLE_TICKS);
}

#[test]
fn held_lease_units_keep_the_timer_until_they_are_given_back() {
    let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
    assert!(e.needs_tick(), "3 units held until the lease ends");
    // The lease lasts 1 s (`max_ms`): ticks until then give nothing back.
    ticks_running(&mut e, &c, &mut h, 25, 39);
    assert_eq!(h.count_of(Counter::LeaseUnitsReturned), 0);
    h.now = Some(T0 + 1000 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::LeaseUnitsReturned), 3);
    assert!(h.dispatched.last().unwrap().1.path.contains("~refund~"));
    assert!(!e.needs_tick(), "the give-back's reply is not waited for");
    tick_until_stopped(&mut e, &c, &mut h, 1025, IDLE_TICKS);
}

/// At most 2 requests of a key in flight, and 1,000 tokens a minute settled from the usage.
fn settled() -> (Config, Engine, FakeHost) {
    let json = r#"{"rules": [{"name": "llm", "limits": [
        {"name": "streams", "algorithm": "concurrency", "limit": 2, "max_duration": "10m"},
        {"name": "tokens", "limit": 1000, "window": "1m",
         "usage": {"from": "body:usage.total_tokens", "estimate": 100}}]}]}"#;
    let c = Config::parse(json.as_bytes()).unwrap();
    let e = Engine::new(&c);
    (c, e, FakeHost::new())
}

const ALLOWED_TWO: &str = r#"{"EVALSHA":[1,1,2,1,"1","0","0",1,"900","6000","0"]}"#;

/// Calls sent so far that settle `delta` (None: any settlement).
fn calls_settling(h: &FakeHost, delta: Option<&str>) -> usize {
    h.dispatched
        .iter()
        .filter(|(_, r, _)| {
            sent_in_mode(&r.path, "settle")
                .iter()
                .any(|l| delta.is_none_or(|d| l.values[0] == d))
        })
        .count()
}

#[test]
fn a_release_and_a_settlement_queued_while_idle_start_the_timer_and_go_at_its_tick() {
    let (c, mut e, mut h) = settled();
    arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
    e.on_reply(&c, &mut h, Some(1), 1, ok(ALLOWED_TWO));
    assert_eq!(h.resumed, vec![1]);
    let mut meter = e.take_meter(1).expect("a usage limit");
    tick_until_stopped(&mut e, &c, &mut h, 25, IDLE_TICKS);
    assert_eq!(h.tick_changes, vec![TICK, Duration::ZERO]);
    // The response ends long after, on an idle worker: 40 of the 100 tokens reserved were
    // used, and the stream's hold is released. Both give back: the root is woken for them.
    h.now = Some(T0 + 30_000 * MS);
    meter.on_headers(&|name| (name == "content-type").then(|| b"application/json".to_vec()));
    meter.feed(br#"{"usage": {"total_tokens": 40}}"#);
    e.settle_usage(&mut h, meter.finish(true));
    e.forget(&c, &mut h, 1);
    assert!(e.needs_tick());
    assert_eq!(h.tick_changes, vec![TICK, Duration::ZERO, TICK]);
    assert_eq!(calls_settling(&h, None), 0, "nothing sent from a stream");
    assert_eq!(h.wakes, 1, "one wake-up for both");
    e.on_wakeup(&c, &mut h);
    let (token, call, _) = h.dispatched.last().cloned().unwrap();
    let settled: Vec<String> = sent_in_mode(&call.path, "settle")
        .into_iter()
        .map(|l| l.values[0].clone())
        .collect();
    assert_eq!(
        settled,
        ["-60", "-1"],
        "the give-back, then the release: {}",
        call.path
    );
    // Its call is out, nothing waits: the timer may stop. Webdis refuses it (403): the
    // settlements are kept, and the timer starts again to send them.
    tick_until_stopped(&mut e, &c, &mut h, 30_050, IDLE_TICKS);
    h.now = Some(T0 + 31_000 * MS);
    e.on_reply(&c, &mut h, None, token, status(403));
    assert!(e.needs_tick());
    assert!(e.ticking());
    h.now = Some(T0 + 31_025 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(calls_settling(&h, Some("-60")), 2, "sent again");
    let (token, _, _) = h.dispatched.last().cloned().unwrap();
    e.on_reply(
        &c,
        &mut h,
        None,
        token,
        ok(r#"{"EVALSHA":[1,1,2,1,"0","0","0",1,"0","0","0"]}"#),
    );
    tick_until_stopped(&mut e, &c, &mut h, 31_050, IDLE_TICKS);
}

#[test]
fn a_refusal_answered_from_the_deny_cache_while_idle_is_counted_at_the_next_tick() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Refuse(30_000)])));
    tick_until_stopped(&mut e, &c, &mut h, 25, IDLE_TICKS);
    h.now = Some(T0 + 5_000 * MS);
    e.on_request(&c, &mut h, 2, &req("/", "a"));
    assert_eq!(h.statuses(), vec![(1, 429), (2, 429)]);
    assert_eq!(h.dispatched.len(), 1, "no call");
    assert_eq!(h.count_of(Counter::DenyCacheHits), 0, "not counted yet");
    assert!(e.needs_tick());
    assert!(e.ticking());
    h.now = Some(T0 + 5_025 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::DenyCacheHits), 1);
    tick_until_stopped(&mut e, &c, &mut h, 5_050, IDLE_TICKS);
}

#[test]
fn a_redis_restart_another_worker_saw_while_idle_is_learnt_before_the_next_request() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Refuse(30_000)])));
    tick_until_stopped(&mut e, &c, &mut h, 25, IDLE_TICKS);
    // Another worker got NOSCRIPT: Redis lost its state, the refusal may no longer hold.
    h.restarts += 1;
    h.now = Some(T0 + 5_000 * MS);
    assert_eq!(e.on_request(&c, &mut h, 2, &req("/", "a")), Verdict::Pause);
    assert_eq!(h.dispatched.len(), 2, "asked again");
    assert_eq!(h.count_of(Counter::DenyCacheResets), 1);
}

#[test]
fn a_worker_late_right_after_its_timer_starts_is_not_taken_for_a_slow_bridge() {
    let (c, mut e, mut h) = setup("");
    h.now = Some(T0 + 60_000 * MS);
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    // The worker does not run for 300 ms: its first tick comes late; the reply Redis sent
    // at once is read after it. The lateness is the worker's, not the bridge's.
    h.now = Some(T0 + 60_325 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::WorkerLagMs), 295);
    assert_eq!(h.breaker_open, 0);
    e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Allow(9)])));
    e.on_wakeup(&c, &mut h);
    e.on_reply(&c, &mut h, None, 2, ok(&reply(&[R::Allow(8)])));
    assert_eq!(h.resumed, vec![1, 2]);
    assert!(h.failures.is_empty(), "{:?}", h.failures);
    assert_eq!(h.count_of(Counter::Allowed), 2);
}
