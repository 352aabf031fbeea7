//! gRPC requests are answered in gRPC, however their answer comes: at once, from a bridge
//! reply, from the deny cache, by the failure policy.

use super::*;
use crate::grpc::{INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn grpc(path: &str, key: &str) -> FakeRequest {
    req(path, key).with("content-type", b"application/grpc")
}

fn header<'a>(r: &'a LocalResponse, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_str())
}

/// The answer to `ctx`: its gRPC status and message.
fn grpc_answer(h: &FakeHost, ctx: u32) -> (Option<u32>, &str) {
    let (_, r) = h
        .answered
        .iter()
        .find(|(c, _)| *c == ctx)
        .unwrap_or_else(|| panic!("{ctx} was not answered"));
    (r.grpc_status, r.body.as_str())
}

#[test]
fn a_refusal_from_a_bridge_reply_and_from_the_deny_cache_is_answered_in_grpc() {
    let (c, mut e, mut h) = setup(r#""breaker": false,"#);
    assert_eq!(
        arrive(&mut e, &c, &mut h, 1, &grpc("/", "k")),
        Verdict::Pause
    );
    // An HTTP request of the same key waits for the next call.
    assert_eq!(
        arrive(&mut e, &c, &mut h, 2, &req("/", "k")),
        Verdict::Pause
    );
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(2500)])));
    let (_, refused) = &h.answered[0];
    assert_eq!(
        (refused.status, refused.grpc_status),
        (429, Some(RESOURCE_EXHAUSTED))
    );
    assert_eq!(refused.body, "rate limit exceeded");
    assert_eq!(header(refused, "grpc-retry-pushback-ms"), Some("2500"));
    assert!(header(refused, "grpc-status-details-bin").is_some());
    assert_eq!(header(refused, "x-ratelimit-remaining"), Some("0"));
    // The waiting HTTP request: answered from the deny cache, in HTTP.
    assert_eq!(h.answered[1].0, 2);
    assert_eq!(h.answered[1].1.grpc_status, None);
    assert_eq!(header(&h.answered[1].1, "retry-after"), Some("3"));
    // A gRPC request of that key now: from the deny cache, in its own callback.
    h.now = Some(T0 + 1000 * MS);
    assert_eq!(e.on_request(&c, &mut h, 3, &grpc("/", "k")), Verdict::Pause);
    assert_eq!(
        grpc_answer(&h, 3),
        (Some(RESOURCE_EXHAUSTED), "rate limit exceeded")
    );
    assert_eq!(
        header(&h.answered[2].1, "grpc-retry-pushback-ms"),
        Some("1500"),
        "the wait left"
    );
    assert_eq!(h.dispatched.len(), 1, "no call");
}

/// A context id seen again (the host's counter wrapped) is a new stream, answered in its own
/// protocol, whether the end of the first was seen or not.
#[test]
fn a_stream_that_ended_is_forgotten() {
    for forgotten in [true, false] {
        let (c, mut e, mut h) = setup(r#""breaker": false,"#);
        arrive(&mut e, &c, &mut h, 1, &grpc("/", "k"));
        let token = h.last_token();
        e.on_reply(&c, &mut h, None, token, ok(&reply(&[R::Allow(1)])));
        if forgotten {
            e.forget(&c, &mut h, 1);
        }
        arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
        let token = h.last_token();
        e.on_reply(&c, &mut h, None, token, ok(&reply(&[R::Refuse(2500)])));
        assert_eq!(h.statuses(), vec![(1, 429)], "forgotten: {forgotten}");
        assert_eq!(h.answered[0].1.grpc_status, None, "forgotten: {forgotten}");
    }
}

#[test]
fn the_over_limit_status_is_configurable() {
    let (c, mut e, mut h) = setup(r#""grpc_over_limit": "unavailable","#);
    arrive(&mut e, &c, &mut h, 1, &grpc("/", "k"));
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(800)])));
    assert_eq!(
        grpc_answer(&h, 1),
        (Some(UNAVAILABLE), "rate limit exceeded")
    );
    assert_eq!(
        header(&h.answered[0].1, "grpc-retry-pushback-ms"),
        Some("800")
    );
}

#[test]
fn a_bad_request_is_an_invalid_argument() {
    let (c, mut e, mut h) = setup("");
    let bad = grpc("/costly", "k").with("x-cost", b"lots");
    assert_eq!(e.on_request(&c, &mut h, 1, &bad), Verdict::Pause);
    let (status, message) = grpc_answer(&h, 1);
    assert_eq!(status, Some(INVALID_ARGUMENT));
    assert!(message.starts_with("x-cost must be"), "{message}");
    assert!(!message.ends_with('\n'));
}

#[test]
fn failing_closed_is_unavailable_from_a_failed_call_and_from_an_open_breaker() {
    let (c, mut e, mut h) = setup(r#""failure_mode": "closed", "breaker": {"failures": 1},"#);
    e.on_request(&c, &mut h, 1, &grpc("/", "k"));
    e.on_reply(&c, &mut h, Some(1), 1, none());
    assert_eq!(e.on_request(&c, &mut h, 2, &grpc("/", "k")), Verdict::Pause);
    assert_eq!(e.on_request(&c, &mut h, 3, &req("/", "k")), Verdict::Pause);
    for ctx in [1, 2] {
        assert_eq!(
            grpc_answer(&h, ctx),
            (Some(UNAVAILABLE), "rate limiter unavailable")
        );
    }
    assert!(h.answered[0].1.headers.is_empty(), "no pushback");
    assert_eq!(h.statuses(), vec![(1, 503), (2, 503), (3, 503)]);
    assert_eq!(h.answered[2].1.grpc_status, None);
}

#[test]
fn the_local_failure_mode_refuses_in_grpc() {
    let (c, mut e, mut h) =
        setup(r#""failure_mode": "local", "local_share": 0.1, "breaker": {"failures": 1},"#);
    e.on_request(&c, &mut h, 1, &grpc("/", "k"));
    e.on_reply(&c, &mut h, Some(1), 1, none());
    assert_eq!(h.resumed, vec![1], "1 of the worker's share of 1");
    assert_eq!(e.on_request(&c, &mut h, 2, &grpc("/", "k")), Verdict::Pause);
    assert_eq!(
        grpc_answer(&h, 2),
        (Some(RESOURCE_EXHAUSTED), "rate limit exceeded")
    );
}
