//! Leases: served without a call, asked for ahead, given back.

use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn a_lease_serves_requests_without_a_call_and_the_next_is_asked_for_before_it_runs_out() {
    let (c, mut e, mut h) = earned(LEASING);
    assert_eq!(ask_k(&mut e, &c, &mut h, 1), Verdict::Pause);
    let (token, call, _) = h.dispatched[0].clone();
    // A key it has not leased before: 4 requests' worth at most (of max_units 10).
    assert_eq!(
        lease_asked(&call.path),
        ["4", "0%2E500000"],
        "{}",
        call.path
    );
    // Redis charged 4 requests' worth: this one and 3 held here; 6 left in the bucket.
    e.on_reply(&c, &mut h, Some(1), token, ok(&leased(4, 6, 30_000)));
    assert_eq!(h.resumed, vec![1]);
    assert_eq!(
        remaining(&mut e, 1),
        "9",
        "what Redis left plus what is held here"
    );
    assert_eq!(h.count_of(Counter::LeaseGrants), 1);
    // The next ones go through at once, with no call.
    for ctx in [2, 3] {
        assert_eq!(ask_k(&mut e, &c, &mut h, ctx), Verdict::Continue);
    }
    assert_eq!(remaining(&mut e, 3), "7");
    // Half of the lease or less is left: the next is asked for (a prefetch from the root)
    // while requests go on from the unit still held.
    assert_eq!(h.count_of(Counter::LeasePrefetches), 1);
    let (prefetch, call, _) = h.dispatched[1].clone();
    assert_eq!(
        lease_asked(&call.path),
        ["4", "0%2E500000"],
        "{}",
        call.path
    );
    assert_eq!(ask_k(&mut e, &c, &mut h, 4), Verdict::Continue);
    // Spent: the next one waits (the room for a call is the prefetch's) ...
    assert_eq!(ask_k(&mut e, &c, &mut h, 5), Verdict::Pause);
    assert_eq!(h.dispatched.len(), 2, "one ask in flight at most");
    // ... and is served by the lease the prefetch brings (its own request's worth is
    // units too), without a call of its own.
    e.on_reply(&c, &mut h, None, prefetch, ok(&leased(4, 2, 30_000)));
    assert_eq!(h.resumed, vec![1, 5]);
    assert!(h.answered.is_empty());
    assert_eq!(remaining(&mut e, 5), "5");
    for ctx in [6, 7] {
        assert_eq!(ask_k(&mut e, &c, &mut h, ctx), Verdict::Continue);
    }
    // The first lease was spent before it ended: the next asks for twice as much.
    assert_eq!(h.count_of(Counter::LeasePrefetches), 2);
    let (_, call, _) = h.dispatched[2].clone();
    assert_eq!(
        lease_asked(&call.path),
        ["8", "0%2E500000"],
        "{}",
        call.path
    );
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::Allowed), 7);
    assert_eq!(h.count_of(Counter::LeaseHits), 6);
    assert_eq!(
        h.rule_counts(&c),
        vec![("ratelimit_rule.all.minute.allowed".to_string(), 7)]
    );
}

#[test]
fn a_lease_spent_slowly_is_not_refilled_ahead() {
    let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
    // 2 of 3 spent in 700 ms of a lease of 1 s: at that pace the last unit outlasts it.
    h.now = Some(T0 + 600 * MS);
    assert_eq!(ask_k(&mut e, &c, &mut h, 2), Verdict::Continue);
    h.now = Some(T0 + 700 * MS);
    assert_eq!(ask_k(&mut e, &c, &mut h, 3), Verdict::Continue);
    assert_eq!(h.count_of(Counter::LeasePrefetches), 0);
    assert_eq!(h.dispatched.len(), 1);
    // Spent as fast (2 in 200 ms), the next lease is asked for ahead.
    let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
    h.now = Some(T0 + 200 * MS);
    for ctx in [2, 3] {
        assert_eq!(ask_k(&mut e, &c, &mut h, ctx), Verdict::Continue);
    }
    assert_eq!(h.count_of(Counter::LeasePrefetches), 1);
}

#[test]
fn after_a_lease_that_served_nothing_a_key_asks_again_only_when_it_earns_one_again() {
    let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
    // Nothing spent in its second: all 3 go back, and the next requests ask for no lease.
    h.now = Some(T0 + 1000 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::LeaseUnitsReturned), 3);
    // Back about once a second: plain decisions (the request alone, no lease mode).
    for (ctx, at) in [(2, 1500), (3, 2100), (4, 2300)] {
        h.now = Some(T0 + at * MS);
        ask_k(&mut e, &c, &mut h, ctx);
        let (token, call, _) = h.dispatched.last().cloned().unwrap();
        assert!(!call.path.contains("~lease~"), "{ctx}: {}", call.path);
        e.on_reply(&c, &mut h, Some(ctx), token, ok(&reply(&[R::Allow(5)])));
    }
    // The fourth request within a lease's time (1,500 to 2,400 ms): a lease of 2 again.
    h.now = Some(T0 + 2400 * MS);
    ask_k(&mut e, &c, &mut h, 5);
    let (_, call, _) = h.dispatched.last().cloned().unwrap();
    assert_eq!(
        lease_asked(&call.path),
        ["2", "0%2E500000"],
        "{}",
        call.path
    );
}

#[test]
fn a_key_back_about_once_a_lease_time_sends_plain_decisions_and_a_busy_key_gets_leases() {
    let (c, mut e, mut h) = setup(LEASING);
    // "slow" comes back every 300 to 700 ms (at most 3 requests in any 1 s), "busy" every
    // 100 ms; each call is answered before the next request.
    let mut slow_at = 0;
    for (i, gap) in [300, 700, 400, 600, 300, 700, 500, 500]
        .into_iter()
        .enumerate()
    {
        slow_at += gap;
        h.now = Some(T0 + slow_at * MS);
        let ctx = 100 + i as u32;
        assert_eq!(
            arrive(&mut e, &c, &mut h, ctx, &req("/", "slow")),
            Verdict::Pause
        );
        let (token, call, _) = h.dispatched.last().cloned().unwrap();
        assert!(
            !call.path.contains("~lease~"),
            "request {i} of the slow key asks for a lease: {}",
            call.path
        );
        e.on_reply(&c, &mut h, Some(ctx), token, ok(&reply(&[R::Allow(9)])));
    }
    assert_eq!(h.count_of(Counter::LeaseGrants), 0);
    assert!(
        e.load() == (0, 0) && h.resumed.len() == 8,
        "nothing held for the slow key"
    );
    // The busy key: its first 3 requests are plain decisions, the 4th (300 ms after the
    // first) asks for a lease of 4, and the next 3 are served from it.
    let mut leases = Vec::new();
    for ctx in 1..=7u32 {
        h.now = Some(T0 + 5000 * MS + u128::from(ctx) * 100 * MS);
        let calls = h.dispatched.len();
        if arrive(&mut e, &c, &mut h, ctx, &req("/", "busy")) == Verdict::Pause {
            assert_eq!(h.dispatched.len(), calls + 1);
            let (token, call, _) = h.dispatched.last().cloned().unwrap();
            let leasing = lease_asked(&call.path).first().map(String::as_str) == Some("4");
            leases.push(leasing);
            let body = if leasing {
                leased(4, 6, 30_000)
            } else {
                reply(&[R::Allow(9)])
            };
            e.on_reply(&c, &mut h, Some(ctx), token, ok(&body));
        }
    }
    assert_eq!(
        leases,
        vec![false, false, false, true],
        "plain, plain, plain, lease"
    );
    assert_eq!(h.count_of(Counter::LeaseGrants), 1);
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::LeaseHits), 3);
}

#[test]
fn a_lease_ends_before_its_bucket_could_be_full_again_and_what_is_left_goes_back() {
    // Whole again in 50 ms: usable for 40 (the clock skew of 10 ms off), not 1 s.
    let (c, mut e, mut h) = leasing_k(4, 1, 50);
    h.now = Some(T0 + 39 * MS);
    assert_eq!(ask_k(&mut e, &c, &mut h, 2), Verdict::Continue);
    h.now = Some(T0 + 40 * MS);
    assert_eq!(ask_k(&mut e, &c, &mut h, 3), Verdict::Pause);
    let calls = h.dispatched.len();
    // The next tick gives the 2 unspent units back, charged at T0 with 1 left, by a refund
    // whose clock and deadline are the tick's time plus the rule's timeout (more than the skew).
    h.now = Some(T0 + 45 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.dispatched.len(), calls + 1);
    let (_, call, timeout) = h.dispatched[calls].clone();
    let clock = T0 + 195 * MS;
    assert!(
        call.path
            .contains(&format!("/{clock}/{}/1~0~1/", clock / MS)),
        "{}",
        call.path
    );
    let refund = &sent_in_mode(&call.path, "refund")[0];
    assert_eq!(
        (&*refund.algorithm, &*refund.cost, &refund.values[..]),
        ("token_bucket", "2", &[T0.to_string(), "1".to_string()][..]),
        "{}",
        call.path
    );
    assert_eq!(timeout, Duration::from_millis(150));
    assert_eq!(h.count_of(Counter::LeaseUnitsReturned), 2);
    // Nothing is given back twice.
    e.on_tick(&c, &mut h);
    assert_eq!(h.dispatched.len(), calls + 1);
    // It served 1 of its 3: the next lease of this key is asked for 2 requests' worth.
    let (token, _, _) = h.dispatched[calls - 1].clone();
    e.on_reply(&c, &mut h, Some(3), token, ok(&reply(&[R::Allow(1)])));
    ask_k(&mut e, &c, &mut h, 4);
    let (_, call, _) = h.dispatched.last().cloned().unwrap();
    assert_eq!(
        lease_asked(&call.path),
        ["2", "0%2E500000"],
        "{}",
        call.path
    );
}

#[test]
fn near_the_limit_a_decision_is_the_request_alone_and_a_refusal_leases_nothing() {
    let (c, mut e, mut h) = earned(LEASING);
    earn(&mut e, &c, "other");
    ask_k(&mut e, &c, &mut h, 1);
    e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Allow(1)])));
    // No lease: the next request is decided in Redis, and asks again.
    assert_eq!(ask_k(&mut e, &c, &mut h, 2), Verdict::Pause);
    assert!(h.dispatched[1].1.path.contains("~lease~"));
    e.on_reply(&c, &mut h, Some(2), 2, ok(&reply(&[R::Refuse(6000)])));
    assert_eq!(h.statuses(), vec![(2, 429)]);
    assert_eq!(h.count_of(Counter::LeaseGrants), 0);
    // The refusal is cached as usual; the next key still asks for a lease.
    assert_eq!(ask_k(&mut e, &c, &mut h, 3), Verdict::Pause);
    assert_eq!(h.dispatched.len(), 2);
    arrive(&mut e, &c, &mut h, 4, &req("/", "other"));
    assert!(h.dispatched[2].1.path.contains("~lease~"));
}

#[test]
fn a_reply_granting_more_than_was_asked_is_a_bridge_failure_and_leases_nothing() {
    // 10 units at most: k = 10 is the most a reply may say.
    let (c, mut e, mut h) = leasing_k(11, 0, 30_000);
    assert!(
        matches!(h.failures[0], BridgeFailure::BadReply(_)),
        "{:?}",
        h.failures
    );
    assert_eq!(h.count_of(Counter::FailureModeOpen), 1);
    assert_eq!(ask_k(&mut e, &c, &mut h, 2), Verdict::Pause);
    // A request that asked for none may not be granted one either.
    let (c, mut e, mut h) = setup("");
    ask_k(&mut e, &c, &mut h, 1);
    e.on_reply(&c, &mut h, Some(1), 1, ok(&leased(2, 0, 30_000)));
    assert!(
        matches!(h.failures[0], BridgeFailure::BadReply(_)),
        "{:?}",
        h.failures
    );
}

#[test]
fn while_the_breaker_is_open_or_after_a_restart_leased_units_are_still_spent() {
    let (c, mut e, mut h) = earned(&format!(r#"{LEASING} "breaker": {{"failures": 1}},"#));
    ask_k(&mut e, &c, &mut h, 1);
    e.on_reply(&c, &mut h, Some(1), 1, ok(&leased(4, 5, 30_000)));
    // Another key's call fails: the breaker opens.
    arrive(&mut e, &c, &mut h, 2, &req("/", "other"));
    e.on_reply(&c, &mut h, Some(2), 2, none());
    assert_eq!(h.breaker_open, 1);
    // Units already charged in Redis are still this worker's to spend.
    assert_eq!(ask_k(&mut e, &c, &mut h, 3), Verdict::Continue);
    assert_eq!(
        h.count_of(Counter::LeasePrefetches),
        0,
        "no call while open"
    );
    // A restart another worker saw (or a fresh Redis's first NOSCRIPT) leaves the lease.
    h.restarts += 1;
    e.on_tick(&c, &mut h);
    for ctx in [4, 5] {
        assert_eq!(ask_k(&mut e, &c, &mut h, ctx), Verdict::Continue);
    }
    assert_eq!(
        h.count_of(Counter::FailureModeOpen),
        1,
        "only the other key's failure"
    );
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::LeaseHits), 3);
}

#[test]
fn give_backs_due_while_the_breaker_is_open_are_sent_once_it_closes() {
    let breaker = r#""breaker": {"failures": 1, "probe_interval": "500ms"},"#;
    let (c, mut e, mut h) = earned(&format!("{LEASING} {breaker}"));
    ask_k(&mut e, &c, &mut h, 1);
    // 3 units held here, for 1 s.
    e.on_reply(&c, &mut h, Some(1), 1, ok(&leased(4, 6, 30_000)));
    arrive(&mut e, &c, &mut h, 2, &req("/", "other"));
    e.on_reply(&c, &mut h, Some(2), 2, none());
    assert_eq!(h.breaker_open, 1);
    // The lease ends while the breaker is open: no give-back call now (only the probe).
    h.now = Some(T0 + 1000 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.dispatched.len(), 3);
    let probe = h.dispatched[2].0;
    assert_eq!(h.count_of(Counter::LeaseUnitsReturned), 0);
    // The probe is answered: the next tick gives the 3 units back.
    e.on_reply(&c, &mut h, None, probe, ok(r#"{"EVALSHA":[0]}"#));
    assert_eq!(h.breaker_open, 0);
    h.now = Some(T0 + 1025 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(
        h.count_of(Counter::LeaseUnitsReturned),
        3,
        "the units kept while the breaker was open are given back"
    );
    assert!(h.dispatched[3].1.path.contains("~refund~"));
}

#[test]
fn a_give_back_has_the_time_of_a_decision_to_reach_redis() {
    // Replicas' clocks within 10 ms; the rule's timeout is the default 150 ms.
    let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
    h.now = Some(T0 + 1000 * MS);
    e.on_tick(&c, &mut h);
    let (_, call, timeout) = h.dispatched.last().cloned().unwrap();
    assert!(call.path.contains("~refund~"), "{}", call.path);
    assert_eq!(timeout, Duration::from_millis(150));
    let segments: Vec<&str> = call.path.split('/').collect();
    let keys: usize = segments[3].parse().unwrap();
    let deadline_ms: u128 = segments[4 + keys + 1].parse().unwrap();
    assert!(
        deadline_ms >= (T0 + 1000 * MS + 150 * MS) / MS,
        "a deadline {} ms after the give-back is sent, less than its timeout",
        deadline_ms - (T0 + 1000 * MS) / MS
    );
}

#[test]
fn a_grant_given_back_at_once_is_not_counted_in_the_headers() {
    // Whole again in 5 ms, less than the 10 ms of clock skew: the 3 units held go back.
    let (_c, mut e, h) = leasing_k(4, 6, 5);
    assert_eq!(h.resumed, vec![1]);
    assert_eq!(
        remaining(&mut e, 1),
        "6",
        "what Redis left, nothing held here"
    );
}

#[test]
fn a_call_lost_with_its_stream_leaves_its_keys_free_to_ask_for_a_lease() {
    let (c, mut e, mut h) = earned(LEASING);
    // Sent from its own context, asking for a lease; the stream ends before the reply.
    assert_eq!(ask_k(&mut e, &c, &mut h, 1), Verdict::Pause);
    assert!(h.dispatched[0].1.path.contains("~lease~"));
    e.forget(&c, &mut h, 1);
    assert_eq!(e.load(), (0, 0));
    // The next request of the key asks for a lease again.
    ask_k(&mut e, &c, &mut h, 2);
    let (_, call, _) = h.dispatched.last().cloned().unwrap();
    assert!(call.path.contains("~lease~"), "{}", call.path);
}
