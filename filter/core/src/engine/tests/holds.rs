//! Concurrency limits: a request is sent taking a hold by its own id, and the hold is
//! released once its stream ends, whenever that is, and only if Redis admitted it.

use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// At most 2 requests of a key in flight, beside 10 a minute.
fn held() -> (Config, Engine, FakeHost) {
    let json = r#"{"rules": [{"name": "llm", "limits": [
        {"name": "streams", "algorithm": "concurrency", "limit": 2, "max_duration": "10m"},
        {"name": "minute", "limit": 10, "window": "1m"}]}]}"#;
    let c = Config::parse(json.as_bytes()).unwrap();
    let e = Engine::new(&c);
    (c, e, FakeHost::new())
}

fn allow() -> &'static str {
    r#"{"EVALSHA":[1,1,2,1,"1","0","0",1,"9","6000","0"]}"#
}

fn refuse() -> &'static str {
    r#"{"EVALSHA":[1,0,2,0,"0","1000","1000",1,"9","6000","0"]}"#
}

/// The id the request went with: its `hold`'s value (the call's last hold).
fn member_of(path: &str) -> String {
    let holds = sent_in_mode(path, "hold");
    holds.last().expect("a hold").values[0].clone()
}

/// The releases sent so far: the ids of the settlements of `-1`.
fn releases(h: &FakeHost) -> Vec<String> {
    h.dispatched
        .iter()
        .flat_map(|(_, r, _)| sent_in_mode(&r.path, "settle"))
        .filter(|l| l.values[0] == "-1")
        .map(|l| l.values[1].clone())
        .collect()
}

#[test]
fn an_admitted_request_is_released_when_its_stream_ends_and_not_before() {
    let (c, mut e, mut h) = held();
    e.on_request(&c, &mut h, 7, &req("/", "k"));
    let decision = h.dispatched[0].1.path.clone();
    let member = member_of(&decision);
    assert!(
        member.ends_with("-7"),
        "{member}: the worker's id and the stream's"
    );
    let hold = &sent_in_mode(&decision, "hold")[0];
    assert_eq!(
        (
            &*hold.algorithm,
            &*hold.limit,
            &*hold.window,
            &*hold.burst,
            &*hold.cost
        ),
        ("concurrency", "2", "600000", "2", "1"),
        "cost 1, max_duration as the window: {decision}"
    );
    e.on_reply(&c, &mut h, Some(7), 1, ok(allow()));
    assert_eq!(h.resumed, [7]);
    e.on_tick(&c, &mut h);
    assert!(releases(&h).is_empty(), "held while the stream runs");
    e.forget(&c, &mut h, 7);
    e.on_tick(&c, &mut h);
    assert_eq!(releases(&h), std::slice::from_ref(&member));
    // Another stream gets another id.
    e.on_request(&c, &mut h, 8, &req("/", "k"));
    let next = member_of(&h.dispatched.last().unwrap().1.path);
    assert_ne!(next, member);
}

#[test]
fn a_stream_gone_before_its_decision_is_released_once_redis_admitted_it() {
    let (c, mut e, mut h) = held();
    // Two streams in one call (the second waits, then goes with the first's reply).
    e.on_request(&c, &mut h, 1, &req("/", "k"));
    e.on_request(&c, &mut h, 2, &req("/", "k"));
    e.on_reply(&c, &mut h, Some(1), 1, ok(allow()));
    e.on_wakeup(&c, &mut h);
    let (token, call, _) = h.dispatched.last().unwrap().clone();
    let member = member_of(&call.path);
    assert!(member.ends_with("-2"));
    e.forget(&c, &mut h, 2);
    assert!(releases(&h).is_empty(), "its decision is still out");
    e.on_reply(&c, &mut h, None, token, ok(allow()));
    e.on_tick(&c, &mut h);
    assert_eq!(releases(&h), [member]);
}

#[test]
fn a_refused_request_holds_nothing_and_sends_no_release() {
    let (c, mut e, mut h) = held();
    e.on_request(&c, &mut h, 3, &req("/", "k"));
    e.on_reply(&c, &mut h, Some(3), 1, ok(refuse()));
    assert_eq!(h.answered.len(), 1);
    assert_eq!(h.answered[0].1.status, 429);
    e.forget(&c, &mut h, 3);
    e.on_tick(&c, &mut h);
    e.on_tick(&c, &mut h);
    assert!(releases(&h).is_empty());
    // Never from a deny cache: the next request of the key is sent again.
    let sent = h.dispatched.len();
    e.on_request(&c, &mut h, 4, &req("/", "k"));
    assert_eq!(h.dispatched.len(), sent + 1);
}

#[test]
fn a_call_in_flight_when_the_breaker_opens_may_have_taken_its_hold_and_is_released() {
    // Two calls out at once; one failure opens the breaker.
    let json = r#"{"batch": {"max_in_flight": 2}, "breaker": {"failures": 1},
        "rules": [{"name": "llm", "limits": [
        {"name": "streams", "algorithm": "concurrency", "limit": 2, "max_duration": "10m"}]}]}"#;
    let c = Config::parse(json.as_bytes()).unwrap();
    let (mut e, mut h) = (Engine::new(&c), FakeHost::new());
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    let member = member_of(&h.dispatched[0].1.path);
    arrive(&mut e, &c, &mut h, 2, &req("/", "b"));
    assert_eq!(
        h.dispatched.len(),
        2,
        "the second call goes beside the first"
    );
    let (first, second) = (h.dispatched[0].0, h.dispatched[1].0);
    // The second call fails: the breaker opens and takes the first, still in flight.
    e.on_reply(&c, &mut h, None, second, none());
    assert_eq!(h.breaker_open, 1);
    assert!(h.resumed.contains(&1), "let through by the open policy");
    // The first call is answered after all: Redis took its hold. The breaker closes, and the
    // hold is released rather than kept until max_duration (10 minutes).
    e.on_reply(&c, &mut h, Some(1), first, ok(allow()));
    assert_eq!(h.breaker_open, 0);
    e.on_tick(&c, &mut h);
    assert!(releases(&h).contains(&member), "{:?}", releases(&h));
}
