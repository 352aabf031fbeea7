//! Usage limits: what a request reserves, what its response's usage settles, and what each
//! failure of the bridge does to a settlement.

use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// 1,000 tokens a minute read from `usage.total_tokens`, 100 reserved per request (or, on
/// `/after`, admitted in mode `after`), beside 10 requests a minute.
fn metered(extra: &str) -> (Config, Engine, FakeHost) {
    let json = format!(
        r#"{{{extra} "rules": [
            {{"name": "llm", "match": {{"path_prefix": "/v1/"}}, "limits": [
              {{"name": "requests", "limit": 10, "window": "1m"}},
              {{"name": "tokens", "limit": 1000, "window": "1m",
                "usage": {{"from": "body:usage.total_tokens", "estimate": 100}}}}]}},
            {{"name": "late", "match": {{"path_prefix": "/after/"}}, "limits": [
              {{"name": "tokens", "limit": 1000, "window": "1m",
                "usage": {{"from": "header:x-usage", "admit": "after", "estimate": 50}}}}]}}
        ]}}"#
    );
    let c = Config::parse(json.as_bytes()).unwrap();
    let e = Engine::new(&c);
    (c, e, FakeHost::new())
}

/// A reply allowing a request of `limits` limits.
fn allow(limits: usize) -> String {
    let per = vec![r#"1,"5","6000","0""#; limits].join(",");
    format!(r#"{{"EVALSHA":[1,1,{limits},{per}]}}"#)
}

const SETTLED: &str = r#"{"EVALSHA":[1,1,1,1,"0","0","0"]}"#;

/// Request `ctx` on `path` let through by Redis; its response said `body` (JSON).
fn served(e: &mut Engine, c: &Config, h: &mut FakeHost, ctx: u32, path: &str, body: &str) {
    e.on_request(c, h, ctx, &req(path, "k"));
    let token = h.last_token();
    let limits = if path.starts_with("/v1/") { 2 } else { 1 };
    e.on_reply(c, h, Some(ctx), token, ok(&allow(limits)));
    respond(e, h, ctx, body);
}

fn respond(e: &mut Engine, h: &mut FakeHost, ctx: u32, body: &str) {
    let mut meter = e.take_meter(ctx).expect("a usage limit to settle");
    meter.on_headers(&|name| (name == "content-type").then(|| b"application/json".to_vec()));
    meter.feed(body.as_bytes());
    e.settle_usage(h, meter.finish(true));
}

/// The settlement calls sent so far: (token, their deltas).
fn settle_calls(h: &FakeHost) -> Vec<(u32, Vec<i64>)> {
    h.dispatched
        .iter()
        .map(|(token, r, _)| (*token, settled(&r.path)))
        .filter(|(_, deltas)| !deltas.is_empty())
        .collect()
}

/// The deltas the call at `path` settles.
fn settled(path: &str) -> Vec<i64> {
    sent_in_mode(path, "settle")
        .iter()
        .map(|l| l.values[0].parse().unwrap())
        .collect()
}

fn stat(h: &FakeHost, c: &Config, name: &str) -> u64 {
    h.rule_counts(c)
        .into_iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, v)| v)
}

#[test]
fn a_reservation_is_the_estimate_and_the_unused_part_is_given_back_at_once() {
    let (c, mut e, mut h) = metered("");
    e.on_request(&c, &mut h, 1, &req("/v1/chat", "k"));
    let decision = h.dispatched[0].1.path.clone();
    // The requests limit, then the tokens limit with its estimate as cost.
    let reserved = &sent_in_mode(&decision, "enforce")[1];
    assert_eq!(
        (&*reserved.algorithm, &*reserved.limit, &*reserved.cost),
        ("token_bucket", "1000", "100"),
        "{decision}"
    );
    e.on_reply(&c, &mut h, Some(1), 1, ok(&allow(2)));
    assert_eq!(
        stat(&h, &c, "ratelimit_rule.llm.tokens.usage_reserved"),
        100
    );
    let wakes = h.wakes;
    respond(&mut e, &mut h, 1, r#"{"usage": {"total_tokens": 30}}"#);
    assert_eq!(h.wakes, wakes + 1, "the root is woken for the give-back");
    assert!(settle_calls(&h).is_empty(), "not from the stream's context");
    e.on_wakeup(&c, &mut h);
    let calls = settle_calls(&h);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].1, vec![-70]);
    e.on_reply(&c, &mut h, None, calls[0].0, ok(SETTLED));
    e.on_tick(&c, &mut h);
    assert_eq!(settle_calls(&h).len(), 1, "settled once");
    assert_eq!(stat(&h, &c, "ratelimit_rule.llm.tokens.usage_charged"), 30);
    assert_eq!(
        stat(&h, &c, "ratelimit_rule.llm.tokens.usage_given_back"),
        70
    );
    assert_eq!(stat(&h, &c, "ratelimit_rule.llm.requests.usage_charged"), 0);
}

#[test]
fn settlements_of_several_responses_go_in_one_call_and_debt_is_charged() {
    let (c, mut e, mut h) = metered("");
    served(
        &mut e,
        &c,
        &mut h,
        1,
        "/v1/a",
        r#"{"usage": {"total_tokens": 250}}"#,
    );
    served(
        &mut e,
        &c,
        &mut h,
        2,
        "/v1/b",
        r#"{"usage": {"total_tokens": 100}}"#,
    );
    served(&mut e, &c, &mut h, 3, "/v1/c", r#"{"nothing": 1}"#);
    e.on_tick(&c, &mut h);
    // 250 used: 150 of debt; exactly the estimate, and an unreadable usage: nothing to send.
    assert_eq!(
        settle_calls(&h)
            .iter()
            .map(|c| c.1.clone())
            .collect::<Vec<_>>(),
        vec![vec![150]]
    );
    assert_eq!(stat(&h, &c, "ratelimit_rule.llm.tokens.usage_debt"), 150);
    assert_eq!(stat(&h, &c, "ratelimit_rule.llm.tokens.usage_unread"), 1);
    assert_eq!(stat(&h, &c, "ratelimit_rule.llm.tokens.usage_charged"), 450);
}

#[test]
fn after_mode_reserves_nothing_and_charges_the_usage() {
    let (c, mut e, mut h) = metered("");
    e.on_request(&c, &mut h, 1, &req("/after/x", "k"));
    assert!(
        sent_in_mode(&h.dispatched[0].1.path, "after").len() == 1,
        "{}",
        h.dispatched[0].1.path
    );
    e.on_reply(&c, &mut h, Some(1), 1, ok(&allow(1)));
    let mut meter = e.take_meter(1).unwrap();
    meter.on_headers(&|name| (name == "x-usage").then(|| b"42".to_vec()));
    e.settle_usage(&mut h, meter.finish(true));
    e.on_tick(&c, &mut h);
    assert_eq!(settle_calls(&h)[0].1, vec![42]);
    assert_eq!(stat(&h, &c, "ratelimit_rule.late.tokens.usage_reserved"), 0);
}

#[test]
fn a_request_let_through_by_the_failure_policy_is_charged_its_whole_usage() {
    let (c, mut e, mut h) = metered("");
    e.on_request(&c, &mut h, 1, &req("/v1/a", "k"));
    e.on_reply(&c, &mut h, Some(1), 1, none());
    assert_eq!(h.resumed, vec![1], "failed open");
    respond(&mut e, &mut h, 1, r#"{"usage": {"total_tokens": 30}}"#);
    e.on_tick(&c, &mut h);
    assert_eq!(settle_calls(&h)[0].1, vec![30], "nothing was reserved");
}

#[test]
fn a_refused_request_settles_nothing() {
    let (c, mut e, mut h) = metered("");
    e.on_request(&c, &mut h, 1, &req("/v1/a", "k"));
    let refused = r#"{"EVALSHA":[1,0,2,0,"0","6000","500",1,"5","6000","0"]}"#;
    e.on_reply(&c, &mut h, Some(1), 1, ok(refused));
    assert_eq!(h.statuses(), vec![(1, 429)]);
    assert!(e.take_meter(1).is_none());
}

#[test]
fn while_the_breaker_is_open_settlements_are_kept_and_sent_once_it_closes() {
    let (c, mut e, mut h) = metered(r#""breaker": {"failures": 1},"#);
    served(
        &mut e,
        &c,
        &mut h,
        1,
        "/v1/a",
        r#"{"usage": {"total_tokens": 130}}"#,
    );
    // A decision call fails: the breaker opens before the settlement goes.
    e.on_request(&c, &mut h, 2, &req("/v1/b", "k"));
    let token = h.last_token();
    e.on_reply(&c, &mut h, Some(2), token, none());
    assert_eq!(h.breaker_open, 1);
    e.on_tick(&c, &mut h);
    e.on_tick(&c, &mut h);
    assert!(settle_calls(&h).is_empty(), "nothing sent while open");
    // The probe is answered: the breaker closes, the next tick sends the kept settlement.
    h.now = Some(T0 + 10_000 * MS);
    e.on_tick(&c, &mut h);
    let probe = h.last_token();
    e.on_reply(&c, &mut h, None, probe, ok(r#"{"EVALSHA":[0]}"#));
    assert_eq!(h.breaker_open, 0);
    e.on_tick(&c, &mut h);
    assert_eq!(settle_calls(&h)[0].1, vec![30]);
}

#[test]
fn a_settlement_refused_by_the_bridge_or_past_its_deadline_is_sent_again() {
    let (c, mut e, mut h) = metered("");
    served(
        &mut e,
        &c,
        &mut h,
        1,
        "/v1/a",
        r#"{"usage": {"total_tokens": 10}}"#,
    );
    e.on_tick(&c, &mut h);
    // Webdis refuses a call it does not carry out (its ACL: 403).
    let down = BridgeReply {
        status: Some(403),
        body: b"",
    };
    let token = settle_calls(&h)[0].0;
    e.on_reply(&c, &mut h, None, token, down);
    e.on_tick(&c, &mut h);
    let expired =
        r#"{"EVALSHA":[false,"EXPIRED decide: the call reached Redis after its deadline"]}"#;
    let token = settle_calls(&h)[1].0;
    e.on_reply(&c, &mut h, None, token, ok(expired));
    e.on_tick(&c, &mut h);
    let calls = settle_calls(&h);
    assert_eq!(
        calls.iter().map(|c| c.1.clone()).collect::<Vec<_>>(),
        vec![vec![-90]; 3]
    );
    e.on_reply(&c, &mut h, None, calls[2].0, ok(SETTLED));
    e.on_tick(&c, &mut h);
    assert_eq!(settle_calls(&h).len(), 3);
    assert_eq!(h.count_of(Counter::UsageSettlementsLost), 0);
}

#[test]
fn a_settlement_not_dispatched_is_kept() {
    let (c, mut e, mut h) = metered("");
    served(
        &mut e,
        &c,
        &mut h,
        1,
        "/v1/a",
        r#"{"usage": {"total_tokens": 300}}"#,
    );
    h.refuse_dispatch = true;
    e.on_tick(&c, &mut h);
    h.refuse_dispatch = false;
    e.on_tick(&c, &mut h);
    assert_eq!(settle_calls(&h)[0].1, vec![200]);
}

/// A call that timed out may have been carried out: a debt goes again (at worst charged
/// twice), a give-back does not (at worst the units stay spent: never units for free).
#[test]
fn after_a_timeout_debts_are_sent_again_and_give_backs_are_lost_and_counted() {
    let (c, mut e, mut h) = metered("");
    served(
        &mut e,
        &c,
        &mut h,
        1,
        "/v1/a",
        r#"{"usage": {"total_tokens": 160}}"#,
    );
    served(
        &mut e,
        &c,
        &mut h,
        2,
        "/v1/b",
        r#"{"usage": {"total_tokens": 20}}"#,
    );
    e.on_tick(&c, &mut h);
    let calls = settle_calls(&h);
    assert_eq!(calls[0].1, vec![60, -80]);
    e.on_reply(&c, &mut h, None, calls[0].0, none());
    assert_eq!(h.count_of(Counter::UsageSettlementsLost), 1);
    e.on_tick(&c, &mut h);
    assert_eq!(settle_calls(&h)[1].1, vec![60]);
}

/// Envoy answers a call whose timeout passed with its own 504: the call was sent and may
/// still be carried out (a Webdis that hung reads it once it runs again), as after no answer.
#[test]
fn a_504_from_envoy_is_a_timeout_give_backs_are_lost_and_debts_sent_again() {
    let (c, mut e, mut h) = metered("");
    served(
        &mut e,
        &c,
        &mut h,
        1,
        "/v1/a",
        r#"{"usage": {"total_tokens": 160}}"#,
    );
    served(
        &mut e,
        &c,
        &mut h,
        2,
        "/v1/b",
        r#"{"usage": {"total_tokens": 20}}"#,
    );
    e.on_tick(&c, &mut h);
    let calls = settle_calls(&h);
    assert_eq!(calls[0].1, vec![60, -80]);
    let timed_out = BridgeReply {
        status: Some(504),
        body: b"upstream request timeout",
    };
    e.on_reply(&c, &mut h, None, calls[0].0, timed_out);
    assert_eq!(h.count_of(Counter::UsageSettlementsLost), 1);
    e.on_tick(&c, &mut h);
    assert_eq!(settle_calls(&h)[1].1, vec![60]);
}

#[test]
fn redis_without_the_script_gets_it_loaded_and_the_settlement_again() {
    let (c, mut e, mut h) = metered("");
    served(
        &mut e,
        &c,
        &mut h,
        1,
        "/v1/a",
        r#"{"usage": {"total_tokens": 120}}"#,
    );
    e.on_tick(&c, &mut h);
    let missing = r#"{"FCALL":[false,"ERR Function not found"]}"#;
    let token = settle_calls(&h)[0].0;
    e.on_reply(&c, &mut h, None, token, ok(missing));
    let (token, load, _) = h.dispatched.last().unwrap().clone();
    assert_eq!(load.path, "/FUNCTION/LOAD/REPLACE");
    let loaded = format!(r#"{{"FUNCTION":"{}"}}"#, c.program.library_name());
    e.on_reply(&c, &mut h, None, token, ok(&loaded));
    assert_eq!(settle_calls(&h).len(), 2);
    assert_eq!(settle_calls(&h)[1].1, vec![20]);
    // Missing again after its load: a failure, not a loop of loads; the settlement is kept.
    let (sent, token) = (h.dispatched.len(), settle_calls(&h)[1].0);
    e.on_reply(&c, &mut h, None, token, ok(missing));
    assert_eq!(h.dispatched.len(), sent, "no second load");
    assert_eq!(h.failures, vec![BridgeFailure::NoScript]);
    e.on_tick(&c, &mut h);
    assert_eq!(settle_calls(&h).len(), 3);
    assert_eq!(settle_calls(&h)[2].1, vec![20], "kept, and sent again");
}

#[test]
fn beyond_the_bound_the_oldest_kept_settlements_are_dropped_and_counted() {
    let (c, mut e, mut h) = metered("");
    h.refuse_dispatch = true;
    let extra = 3;
    for ctx in 0..(settlements::MAX_KEPT_SETTLEMENTS + extra) as u32 {
        e.on_request(&c, &mut h, ctx + 1, &req("/v1/a", "k"));
        let meter_ctx = ctx + 1;
        // The decision failed to dispatch: let through by policy, its usage charged whole.
        respond(
            &mut e,
            &mut h,
            meter_ctx,
            r#"{"usage": {"total_tokens": 5}}"#,
        );
    }
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::UsageSettlementsLost), extra);
}

#[test]
fn on_a_redis_cluster_settlements_go_in_one_call_per_slot() {
    let (c, mut e, mut h) = metered(r#""bridge": {"redis_cluster": true},"#);
    let keys = ["alice", "bob", "carol", "dave"];
    for (i, key) in keys.iter().enumerate() {
        let ctx = i as u32 + 1;
        e.on_request(&c, &mut h, ctx, &req("/v1/a", key));
        let token = h.last_token();
        e.on_reply(&c, &mut h, Some(ctx), token, ok(&allow(2)));
        respond(&mut e, &mut h, ctx, r#"{"usage": {"total_tokens": 7}}"#);
    }
    e.on_tick(&c, &mut h);
    let slots: HashSet<u16> = h
        .dispatched
        .iter()
        .filter(|(_, r, _)| !settled(&r.path).is_empty())
        .map(|(_, r, _)| {
            let key = r.path.split('/').nth(4).unwrap();
            key_slot(&percent_decoded(key))
        })
        .collect();
    let calls = settle_calls(&h);
    assert_eq!(slots.len(), calls.len(), "one slot per call");
    assert_eq!(calls.iter().map(|c| c.1.len()).sum::<usize>(), keys.len());
    assert!(calls.len() > 1);
}

fn percent_decoded(segment: &str) -> Vec<u8> {
    let bytes = segment.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

#[test]
fn beyond_the_bound_give_backs_are_dropped_before_debts() {
    use crate::decision::Settlement;
    use crate::testing::plan::token_bucket_check;
    let mut kept = settlements::Settlements::default();
    let settlement = |delta| Settlement {
        check: token_bucket_check("k"),
        delta,
    };
    kept.push(settlement(-99));
    for _ in 0..settlements::MAX_KEPT_SETTLEMENTS {
        kept.push(settlement(7));
    }
    assert_eq!(kept.take_lost(), 1);
    assert_eq!(kept.waiting(), settlements::MAX_KEPT_SETTLEMENTS);
    kept.push(settlement(8));
    assert_eq!(kept.take_lost(), 1, "then the oldest debt");
    let (c, ..) = metered("");
    let deltas: Vec<i64> = kept
        .calls(&c)
        .into_iter()
        .flat_map(|(group, _)| group.into_iter().map(|s| s.delta))
        .collect();
    assert!(!deltas.contains(&-99));
    assert_eq!(deltas.last(), Some(&8));
}

#[test]
fn beyond_the_bound_of_streams_waiting_for_a_response_the_oldest_is_charged_its_estimate() {
    use crate::engine::settlements::MAX_METERED_STREAMS;
    let (c, mut e, mut h) = metered("");
    let streams = u32::try_from(MAX_METERED_STREAMS).unwrap() + 1;
    for ctx in 1..=streams {
        let sent = h.dispatched.len();
        e.on_request(&c, &mut h, ctx, &req("/after/x", "k"));
        if h.dispatched.len() > sent {
            let token = h.last_token();
            e.on_reply(&c, &mut h, Some(ctx), token, none());
        }
    }
    // Stream 1 never saw its response: in mode `after` nothing was charged up front, so it
    // is settled as a response whose usage cannot be read, at its estimate.
    assert!(e.take_meter(1).is_none(), "the oldest was settled");
    assert!(e.take_meter(2).is_some(), "the others still wait");
    assert_eq!(stat(&h, &c, "ratelimit_rule.late.tokens.usage_unread"), 1);
    assert_eq!(stat(&h, &c, "ratelimit_rule.late.tokens.usage_charged"), 50);
}

#[test]
fn a_5xx_or_unreadable_reply_may_have_been_carried_out_give_backs_are_lost_debts_sent_again() {
    for reply in [
        BridgeReply {
            status: Some(503),
            body: b"upstream connect error or disconnect/reset before headers",
        },
        BridgeReply {
            status: Some(200),
            body: b"{\"EVALSHA\": garbage",
        },
    ] {
        let (c, mut e, mut h) = metered("");
        served(
            &mut e,
            &c,
            &mut h,
            1,
            "/v1/a",
            r#"{"usage": {"total_tokens": 10}}"#,
        );
        served(
            &mut e,
            &c,
            &mut h,
            2,
            "/v1/b",
            r#"{"usage": {"total_tokens": 300}}"#,
        );
        e.on_tick(&c, &mut h);
        let (token, deltas) = settle_calls(&h)[0].clone();
        assert_eq!(deltas, vec![-90, 200]);
        e.on_reply(&c, &mut h, None, token, reply);
        e.on_tick(&c, &mut h);
        let calls = settle_calls(&h);
        assert_eq!(calls.len(), 2, "{:?}", calls);
        assert_eq!(calls[1].1, vec![200], "the debt again, not the give-back");
        assert_eq!(h.count_of(Counter::UsageSettlementsLost), 1);
    }
}

#[test]
fn units_given_back_clear_the_refusals_cached_for_their_key() {
    let (c, mut e, mut h) = metered("");
    e.on_request(&c, &mut h, 1, &req("/v1/a", "k"));
    let token = h.last_token();
    e.on_reply(&c, &mut h, Some(1), token, ok(&allow(2)));
    let mut meter = e.take_meter(1).expect("a usage limit to settle");
    // While request 1 holds its reservation, request 2 of the same key is refused: the
    // refusal is cached for 6 s.
    e.on_request(&c, &mut h, 2, &req("/v1/b", "k"));
    let refused = r#"{"EVALSHA":[1,0,2,1,"5","6000","0",0,"50","6000","6000"]}"#;
    let token = h.last_token();
    e.on_reply(&c, &mut h, Some(2), token, ok(refused));
    assert_eq!(h.statuses(), vec![(2, 429)]);
    // Request 1 used 10 of its 100: 90 go back, which may pay for the next request.
    meter.on_headers(&|name| (name == "content-type").then(|| b"application/json".to_vec()));
    meter.feed(br#"{"usage": {"total_tokens": 10}}"#);
    e.settle_usage(&mut h, meter.finish(true));
    e.on_tick(&c, &mut h);
    assert_eq!(settle_calls(&h)[0].1, vec![-90]);
    let sent = h.dispatched.len();
    e.on_request(&c, &mut h, 3, &req("/v1/c", "k"));
    assert_eq!(
        h.dispatched.len(),
        sent + 1,
        "asked Redis, not the deny cache"
    );
    assert_eq!(h.statuses(), vec![(2, 429)]);
}

/// Streams 2 and 3 of `/v1/` while stream 1's settlement waits: 2 goes at once from its own
/// context, 3 waits for the root, which sends it with the settlement riding on its call.
/// Returns the token and path of that call.
fn ride(e: &mut Engine, c: &Config, h: &mut FakeHost, usage: u64) -> (u32, String) {
    served(
        e,
        c,
        h,
        1,
        "/v1/a",
        &format!(r#"{{"usage": {{"total_tokens": {usage}}}}}"#),
    );
    e.on_request(c, h, 2, &req("/v1/b", "k"));
    let token = h.last_token();
    e.on_request(c, h, 3, &req("/v1/c", "k"));
    e.on_reply(c, h, Some(2), token, ok(&allow(2)));
    e.on_wakeup(c, h);
    let (token, call, _) = h.dispatched.last().unwrap().clone();
    (token, call.path)
}

#[test]
fn a_settlement_rides_on_the_next_decision_call_from_the_root() {
    let (c, mut e, mut h) = metered("");
    let (token, path) = ride(&mut e, &c, &mut h, 30);
    assert!(path.contains("~enforce~"), "a decision call: {path}");
    assert_eq!(settled(&path), [-70], "with the give-back: {path}");
    let calls = h.dispatched.len();
    // Its reply: stream 3's decision, then the settlement's entry.
    let reply = r#"{"EVALSHA":[2,1,2,1,"5","6000","0",1,"5","6000","0",1,1,1,"0","0","0"]}"#;
    e.on_reply(&c, &mut h, None, token, ok(reply));
    assert!(h.resumed.contains(&3));
    e.on_tick(&c, &mut h);
    assert_eq!(h.dispatched.len(), calls, "no call of its own");
    assert_eq!(h.count_of(Counter::UsageSettlementsRiding), 1);
    assert_eq!(h.count_of(Counter::UsageSettlementCalls), 0);
}

#[test]
fn a_riding_debt_whose_call_went_unanswered_is_sent_again_on_its_own() {
    let (c, mut e, mut h) = metered("");
    let (token, path) = ride(&mut e, &c, &mut h, 250);
    assert_eq!(settled(&path), [150], "{path}");
    e.on_reply(
        &c,
        &mut h,
        None,
        token,
        BridgeReply {
            status: None,
            body: b"",
        },
    );
    assert!(h.resumed.contains(&3), "stream 3 let through by its policy");
    assert_eq!(h.count_of(Counter::FailureModeOpen), 1);
    e.on_tick(&c, &mut h);
    let own = settle_calls(&h)
        .into_iter()
        .filter(|(t, _)| *t > token)
        .collect::<Vec<_>>();
    assert_eq!(own.len(), 1, "sent again, alone");
    assert_eq!(own[0].1, vec![150]);
}

/// One give-back call out at a time: what comes meanwhile goes when its reply is in, a debt
/// waits for the tick, and after a failed call nothing is hurried (no loop of refusals).
#[test]
fn give_backs_go_one_call_at_a_time_and_debts_wait_for_the_tick() {
    let (c, mut e, mut h) = metered("");
    served(
        &mut e,
        &c,
        &mut h,
        1,
        "/v1/a",
        r#"{"usage": {"total_tokens": 30}}"#,
    );
    e.on_wakeup(&c, &mut h);
    let first = settle_calls(&h);
    assert_eq!(first.iter().map(|c| &c.1).collect::<Vec<_>>(), [&vec![-70]]);
    // While it is out: another give-back and a debt.
    let wakes = h.wakes;
    served(
        &mut e,
        &c,
        &mut h,
        2,
        "/v1/b",
        r#"{"usage": {"total_tokens": 90}}"#,
    );
    served(
        &mut e,
        &c,
        &mut h,
        3,
        "/v1/c",
        r#"{"usage": {"total_tokens": 150}}"#,
    );
    e.on_wakeup(&c, &mut h);
    assert_eq!(settle_calls(&h).len(), 1, "one call at a time");
    assert!(h.wakes >= wakes);
    e.on_reply(&c, &mut h, None, first[0].0, ok(SETTLED));
    let calls = settle_calls(&h);
    assert_eq!(calls.len(), 2, "the reply sends what waits");
    assert_eq!(
        calls[1].1,
        vec![-10, 50],
        "the give-back, with the debt beside it"
    );
    // A refused call: kept, and left for the tick.
    served(
        &mut e,
        &c,
        &mut h,
        4,
        "/v1/d",
        r#"{"usage": {"total_tokens": 20}}"#,
    );
    let refused = BridgeReply {
        status: Some(403),
        body: b"",
    };
    e.on_reply(&c, &mut h, None, calls[1].0, refused);
    assert_eq!(settle_calls(&h).len(), 2, "nothing sent after a refusal");
    e.on_tick(&c, &mut h);
    assert_eq!(settle_calls(&h).len(), 3, "the tick sends them again");
}
