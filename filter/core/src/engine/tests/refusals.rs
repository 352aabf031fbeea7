//! The deny cache: refusals answered locally until they could fit, forgotten on a restart or
//! when units are given back.

use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn a_redis_restart_empties_the_deny_cache() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(6000)])));
    arrive(&mut e, &c, &mut h, 2, &req("/", "other"));
    let noscript = r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#;
    e.on_reply(&c, &mut h, None, 2, ok(noscript));
    e.on_request(&c, &mut h, 3, &req("/", "k"));
    assert_eq!(hits(&e, &h), 0, "asked Redis again");
    assert_eq!(h.restarts, 1, "told the other workers");
    assert_eq!(h.count_of(Counter::DenyCacheResets), 1);
    e.on_tick(&c, &mut h);
    h.restarts += 1;
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::DenyCacheResets), 1, "nothing to forget");
}

#[test]
fn a_restart_another_worker_saw_empties_this_deny_cache() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(60_000)])));
    e.on_request(&c, &mut h, 2, &req("/", "k"));
    assert_eq!(hits(&e, &h), 1);
    h.restarts += 1;
    e.on_request(&c, &mut h, 3, &req("/", "k"));
    assert_eq!(hits(&e, &h), 2, "not yet known here");
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::DenyCacheResets), 1);
    e.on_request(&c, &mut h, 4, &req("/", "k"));
    assert_eq!(hits(&e, &h), 2, "forgotten: asked again");
    assert_eq!(e.load(), (0, 1), "sent to Redis");
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::DenyCacheResets), 1, "once per restart");
}

#[test]
fn refused_keys_are_answered_locally_until_they_could_fit() {
    let (c, mut e, mut h) = setup(r#""breaker": false,"#);
    arrive(&mut e, &c, &mut h, 1, &req("/", "abuser"));
    h.now = Some(T0 + MS);
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(6000)])));
    let first = h.answered[0].1.clone();
    assert_eq!(first.status, 429);
    // 1 s later: answered without a call, Retry-After counting down from 6 s.
    h.now = Some(T0 + 1000 * MS);
    assert_eq!(
        e.on_request(&c, &mut h, 2, &req("/", "abuser")),
        Verdict::Pause
    );
    assert_eq!(h.dispatched.len(), 1, "no call");
    let cached = &h.answered[1].1;
    assert_eq!(cached.status, 429);
    let header = |r: &LocalResponse, n: &str| {
        r.headers
            .iter()
            .find(|(name, _)| *name == n)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header(&first, "retry-after").as_deref(), Some("6"));
    assert_eq!(header(cached, "retry-after").as_deref(), Some("5"));
    assert_eq!(
        header(cached, "x-ratelimit-remaining").as_deref(),
        Some("0")
    );
    assert_eq!(header(cached, "x-ratelimit-limit").as_deref(), Some("10"));
    assert_eq!(cached.body, first.body);
    assert_eq!(hits(&e, &h), 1);
    assert_eq!(
        h.count_of(Counter::Denied),
        1,
        "the cached one is counted later"
    );
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::Denied), 2);
    assert_eq!(h.count_of(Counter::DenyCacheHits), 1);
    // Another key is not affected; the same key is asked again exactly at the instant.
    e.on_request(&c, &mut h, 3, &req("/", "someone-else"));
    assert_eq!(h.dispatched.len(), 2);
    h.now = Some(T0 + 6000 * MS - 1);
    e.on_request(&c, &mut h, 4, &req("/", "abuser"));
    assert_eq!(hits(&e, &h), 2);
    h.now = Some(T0 + 6000 * MS);
    e.on_request(&c, &mut h, 5, &req("/", "abuser"));
    assert_eq!(hits(&e, &h), 2, "expired: asked again");
    assert_eq!(e.load(), (1, 1));
}

#[test]
fn a_smaller_cost_is_asked_and_a_larger_one_is_not() {
    let (c, mut e, mut h) = setup("");
    let costly = |cost: &str| req("/costly", "k").with("x-cost", cost.as_bytes());
    arrive(&mut e, &c, &mut h, 1, &costly("3"));
    let two_limits = r#"{"EVALSHA":[1,0,2,1,"10","0","0",0,"2","3000","1000"]}"#;
    e.on_reply(&c, &mut h, None, 1, ok(two_limits));
    assert_eq!(h.statuses(), vec![(1, 429)]);
    e.on_request(&c, &mut h, 2, &costly("4"));
    assert_eq!(hits(&e, &h), 1, "cost 4 >= 3: refused");
    e.on_request(&c, &mut h, 3, &costly("2"));
    assert_eq!(hits(&e, &h), 1, "cost 2 may fit: asked");
    assert_eq!(e.load(), (0, 1));
    // The rule "all" (not refused) alone is not covered by the entry of "costly".
    e.on_request(&c, &mut h, 4, &req("/", "k"));
    assert_eq!(hits(&e, &h), 1);
}

#[test]
fn shadow_refusals_are_not_cached_and_the_cache_can_be_off() {
    for extra in ["", r#""deny_cache": false,"#] {
        let c = config(extra);
        let mut e = Engine::new(&c);
        let mut h = FakeHost::new();
        arrive(&mut e, &c, &mut h, 1, &req("/watch", "k"));
        e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::AllowShadowRefused])));
        e.on_request(&c, &mut h, 2, &req("/watch", "k"));
        assert_eq!(hits(&e, &h), 0);
    }
    let (c, mut e, mut h) = setup(r#""deny_cache": false,"#);
    arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(6000)])));
    e.on_request(&c, &mut h, 2, &req("/", "k"));
    assert_eq!(hits(&e, &h), 0, "off: asked again");
}

#[test]
fn the_cache_is_bounded_and_keeps_the_latest_refusals() {
    let (c, mut e, mut h) = setup(r#""deny_cache": {"max_entries": 2},"#);
    for (ctx, key) in [(1, "a"), (2, "b"), (3, "c")] {
        arrive(&mut e, &c, &mut h, ctx, &req("/", key));
        let token = h.last_token();
        e.on_reply(
            &c,
            &mut h,
            None,
            token,
            ok(&reply(&[R::Refuse(1000 * ctx)])),
        );
    }
    assert_eq!(e.refusals.refused_keys(), 2);
    e.on_request(&c, &mut h, 10, &req("/", "a"));
    assert_eq!(hits(&e, &h), 0, "a expired first: evicted");
    for (ctx, key) in [(11, "b"), (12, "c")] {
        e.on_request(&c, &mut h, ctx, &req("/", key));
    }
    assert_eq!(hits(&e, &h), 2);
}

#[test]
fn waiting_requests_the_last_reply_refused_are_answered_without_a_call() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "hot"));
    for ctx in 2..=5 {
        e.on_request(&c, &mut h, ctx, &req("/", "hot"));
    }
    e.on_request(&c, &mut h, 6, &req("/", "other"));
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(6000)])));
    assert_eq!(
        h.statuses(),
        vec![(1, 429), (2, 429), (3, 429), (4, 429), (5, 429)]
    );
    assert_eq!(h.dispatched.len(), 2);
    assert_eq!(h.batch_size(1), 1, "only the other key is asked");
    assert_eq!(hits(&e, &h), 4);
}

#[test]
fn a_give_back_forgets_the_refusals_of_its_keys() {
    let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
    h.now = Some(T0 + 200 * MS);
    for ctx in [2, 3] {
        assert_eq!(ask_k(&mut e, &c, &mut h, ctx), Verdict::Continue);
    }
    // The prefetch is refused: the key is remembered as refused for 6 s.
    let prefetch = h.last_token();
    e.on_reply(&c, &mut h, None, prefetch, ok(&reply(&[R::Refuse(6000)])));
    // The lease ends with a unit unspent: it goes back to Redis, which may now fit one.
    h.now = Some(T0 + 1000 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::LeaseUnitsReturned), 1);
    h.now = Some(T0 + 1100 * MS);
    assert_eq!(
        ask_k(&mut e, &c, &mut h, 4),
        Verdict::Pause,
        "asked Redis again, not refused from the deny cache"
    );
    assert!(h.answered.is_empty(), "{:?}", h.statuses());
}

#[test]
fn a_refusal_from_a_call_sent_before_a_restart_is_not_cached() {
    let (c, mut e, mut h) = setup(r#""batch": {"max_in_flight": 2},"#);
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    arrive(&mut e, &c, &mut h, 2, &req("/", "b"));
    assert_eq!(h.dispatched.len(), 2, "two calls in flight");
    // The second call finds Redis restarted: the deny cache is reset ...
    let noscript = r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#;
    e.on_reply(&c, &mut h, None, 2, ok(noscript));
    assert_eq!(h.restarts, 1);
    // ... and the first one's refusal, decided before the restart, comes after it.
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(6000)])));
    assert_eq!(h.statuses(), vec![(1, 429)]);
    arrive(&mut e, &c, &mut h, 3, &req("/", "a"));
    assert_eq!(hits(&e, &h), 0, "the old refusal was not cached");
}
