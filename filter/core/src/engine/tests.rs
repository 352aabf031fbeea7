//! The engine as a whole, through its public calls, with the fake host.

use super::*;
use crate::bridge::call_bytes;
use crate::identity::tests::FakeRequest;
use crate::response::LocalResponse;
use crate::slot::key_slot;
use crate::testing::host::{FakeHost, T0};
use std::collections::HashSet;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const MS: u128 = 1_000_000;

fn config(extra: &str) -> Config {
    let json = format!(
        r#"{{{extra} "rules": [
            {{"name": "all", "limits": [{{"name": "minute", "limit": 10, "window": "1m"}}]}},
            {{"name": "costly", "match": {{"path_prefix": "/costly"}}, "cost": {{"header": "x-cost", "min": 1, "max": 5}},
              "limits": [{{"name": "minute", "limit": 10, "window": "1m"}}]}},
            {{"name": "watch", "match": {{"path_prefix": "/watch"}}, "shadow": true,
              "limits": [{{"name": "minute", "limit": 10, "window": "1m"}}]}}
        ]}}"#
    );
    Config::parse(json.as_bytes()).unwrap()
}

/// A config with `extra` top-level keys, a fresh engine for it, and a fake host.
fn setup(extra: &str) -> (Config, Engine, FakeHost) {
    let c = config(extra);
    let e = Engine::new(&c);
    (c, e, FakeHost::new())
}

fn req(path: &str, key: &str) -> FakeRequest {
    FakeRequest::new("GET", path).with("x-api-key", key.as_bytes())
}

fn ok(body: &str) -> BridgeReply<'_> {
    BridgeReply {
        status: Some(200),
        body: body.as_bytes(),
    }
}

/// One request's part of a reply.
#[derive(Clone, Copy)]
enum R {
    /// Allowed, one limit, with this many left.
    Allow(u32),
    /// Refused, one limit, retry in this many ms.
    Refuse(u32),
    /// Allowed, then the shadow limit refused.
    AllowShadowRefused,
    Error,
}

fn reply(requests: &[R]) -> String {
    let mut items = vec![requests.len().to_string()];
    for r in requests {
        items.push(match r {
            R::Allow(left) => format!(r#"1,1,1,"{left}","6000","0""#),
            R::Refuse(retry) => format!(r#"0,1,0,"0.5","3000","{retry}""#),
            R::AllowShadowRefused => r#"1,2,1,"5","6000","0",0,"0","6000","3000""#.into(),
            R::Error => {
                r#"-1,"WRONGTYPE Operation against a key holding the wrong kind of value""#.into()
            }
        });
    }
    format!(r#"{{"EVALSHA":[{}]}}"#, items.join(","))
}

/// A request arrives, and the worker is woken (as Envoy would, right after) if this
/// arrival asked for a wake-up.
fn arrive(e: &mut Engine, c: &Config, h: &mut FakeHost, ctx: u32, r: &FakeRequest) -> Verdict {
    let wakes = h.wakes;
    let verdict = e.on_request(c, h, ctx, r);
    if h.wakes > wakes && !h.cannot_wake {
        e.on_wakeup(c, h);
    }
    verdict
}

#[test]
fn a_lone_request_on_an_idle_worker_is_sent_at_once_from_its_own_context() {
    let (c, mut e, mut h) = setup("");
    assert_eq!(e.on_request(&c, &mut h, 7, &req("/", "k")), Verdict::Pause);
    assert_eq!(h.wakes, 0, "no hop through the root");
    assert_eq!(h.dispatched.len(), 1);
    let (token, call, timeout) = h.dispatched[0].clone();
    assert!(call.path.starts_with("/EVALSHA/"));
    assert!(
        call.path
            .contains("/1000000000000/1001150/1/0/1/1/token_bucket/"),
        "{}",
        call.path
    );
    assert_eq!(timeout, Duration::from_millis(150));
    h.now = Some(T0 + 2 * MS + 1);
    e.on_reply(&c, &mut h, Some(7), token, ok(&reply(&[R::Allow(9)])));
    assert_eq!(h.resumed, vec![7]);
    assert!(h.answered.is_empty());
    assert_eq!(
        e.take_headers(7),
        Some(vec![
            ("x-ratelimit-limit", "10".to_string()),
            ("x-ratelimit-remaining", "9".to_string()),
            ("x-ratelimit-reset", "6".to_string())
        ])
    );
    assert_eq!(e.take_headers(7), None, "headers go on once");
    assert_eq!(h.counters, vec![Counter::BridgeCalls, Counter::Allowed]);
    assert_eq!(
        h.histograms,
        vec![(Histogram::BatchSize, 1), (Histogram::DecisionMs, 3)]
    );
    assert_eq!(e.load(), (0, 0));
}

#[test]
fn requests_waiting_behind_a_request_made_call_are_sent_by_the_root() {
    let (c, mut e, mut h) = setup("");
    e.on_request(&c, &mut h, 1, &req("/", "a"));
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    assert_eq!(
        (h.dispatched.len(), h.wakes),
        (1, 0),
        "no slot free: it waits"
    );
    // The reply comes to request 1's context: 2 is not sent from there, the root is woken.
    e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Allow(9)])));
    assert_eq!((h.dispatched.len(), h.wakes), (1, 1));
    e.on_wakeup(&c, &mut h);
    assert_eq!(h.dispatched.len(), 2);
    assert_eq!(h.resumed, vec![1]);
}

#[test]
fn a_request_made_call_whose_stream_ends_frees_its_slot_at_once() {
    let (c, mut e, mut h) = setup("");
    e.on_request(&c, &mut h, 1, &req("/", "a"));
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    // Client 1 disconnects: its call's reply will never come (the SDK drops it).
    h.gone.insert(1);
    e.forget(&c, &mut h, 1);
    assert_eq!(e.load(), (1, 0));
    assert_eq!(h.wakes, 1, "the root sends what waits");
    e.on_wakeup(&c, &mut h);
    e.on_reply(&c, &mut h, None, 2, ok(&reply(&[R::Allow(9)])));
    assert_eq!(h.resumed, vec![2]);
    assert!(h.failures.is_empty());
}

#[test]
fn requests_that_arrive_during_a_call_share_the_next_one_in_arrival_order() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    for (ctx, key) in [(2, "b"), (3, "c"), (4, "b")] {
        assert_eq!(
            e.on_request(&c, &mut h, ctx, &req("/", key)),
            Verdict::Pause
        );
    }
    assert_eq!(h.wakes, 0, "a call is in flight: nothing to wake");
    assert_eq!(h.dispatched.len(), 1);
    assert_eq!(e.load(), (3, 1));
    e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Allow(9)])));
    assert_eq!(h.wakes, 1);
    e.on_wakeup(&c, &mut h);
    assert_eq!(h.dispatched.len(), 2, "the three waiting go in one call");
    assert_eq!(h.batch_size(1), 3);
    let path = &h.dispatched[1].1.path;
    let b = sha1_key("b");
    let c_key = sha1_key("c");
    assert!(
        path.find(&b).unwrap() < path.find(&c_key).unwrap(),
        "keys in arrival order, b once: {path}"
    );
    assert_eq!(path.matches(&b).count(), 1);
    e.on_reply(
        &c,
        &mut h,
        None,
        2,
        ok(&reply(&[R::Allow(9), R::Refuse(6000), R::Allow(8)])),
    );
    assert_eq!(h.resumed, vec![1, 2, 4]);
    assert_eq!(h.statuses(), vec![(3, 429)]);
    assert_eq!(
        h.histograms
            .iter()
            .filter(|(k, _)| *k == Histogram::BatchSize)
            .map(|(_, v)| *v)
            .collect::<Vec<_>>(),
        vec![1, 3]
    );
}

/// Deny-cache hits, counted in the stats or not yet.
fn hits(e: &Engine, h: &FakeHost) -> usize {
    h.count_of(Counter::DenyCacheHits) + e.tally.uncounted_deny_hits() as usize
}

fn sha1_key(identity: &str) -> String {
    crate::sha1::sha1_hex(identity.as_bytes())
}

#[test]
fn batches_respect_max_requests_and_max_in_flight() {
    let (c, mut e, mut h) = setup(r#""batch": {"max_requests": 2, "max_in_flight": 2},"#);
    for ctx in 1..=8 {
        e.on_request(&c, &mut h, ctx, &req("/", &format!("k{ctx}")));
    }
    assert_eq!(h.dispatched.len(), 1, "the first went alone, at once");
    assert_eq!(h.wakes, 1, "a second slot is free: the root is woken once");
    e.on_wakeup(&c, &mut h);
    assert_eq!(h.dispatched.len(), 2, "two calls in flight at most");
    assert_eq!((h.batch_size(0), h.batch_size(1)), (1, 2));
    assert_eq!(e.load(), (5, 2));
    e.on_reply(&c, &mut h, None, 2, ok(&reply(&[R::Allow(1), R::Allow(1)])));
    assert_eq!(h.resumed, vec![2, 3]);
    assert_eq!(h.dispatched.len(), 3);
    assert_eq!(h.batch_size(2), 2);
    e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Allow(1)])));
    assert_eq!(h.dispatched.len(), 3, "not from a request's context");
    e.on_wakeup(&c, &mut h);
    assert_eq!(h.batch_size(3), 2);
    assert_eq!(e.load(), (1, 2));
}

/// Failing closed: request 1 alone, refused; then a batch of three: allowed, allowed with
/// a shadow limit refusing (`/watch`), and a Redis error.
fn mixed_batch() -> (Config, Engine, FakeHost) {
    let (c, mut e, mut h) = setup(r#""failure_mode": "closed","#);
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    for (ctx, path) in [(2, "/"), (3, "/watch"), (4, "/")] {
        e.on_request(&c, &mut h, ctx, &req(path, &format!("k{ctx}")));
    }
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(500)])));
    e.on_reply(
        &c,
        &mut h,
        None,
        2,
        ok(&reply(&[R::Allow(3), R::AllowShadowRefused, R::Error])),
    );
    (c, e, h)
}

#[test]
fn per_rule_counts_say_what_each_limit_did_and_reach_the_stats_on_the_tick() {
    let (c, mut e, mut h) = mixed_batch();
    // Key "a" again: refused by the deny cache, without a call.
    arrive(&mut e, &c, &mut h, 5, &req("/", "a"));
    assert_eq!(h.statuses().last(), Some(&(5, 429)));
    let before = h.rule_counts(&c);
    e.on_tick(&c, &mut h);
    let count = |name: &str| (format!("ratelimit_rule.{name}"), 1);
    let mut want = vec![
        ("ratelimit_rule.all.minute.allowed".to_string(), 2),
        ("ratelimit_rule.all.minute.denied".to_string(), 2),
        count("all.minute.failed_closed"),
        count("watch.minute.shadow_denied"),
    ];
    want.sort();
    assert_eq!(h.rule_counts(&c), want);
    assert!(before.len() < want.len(), "the last ones wait for the tick");
    e.on_tick(&c, &mut h);
    assert_eq!(h.rule_counts(&c), want, "handed over once");
}

#[test]
fn a_new_identity_over_its_key_budget_is_counted_once_per_rule() {
    let c = Config::parse(
        br#"{"rules": [{"name": "ip", "key": {"from": ["client_ip"]},
            "key_budget": {"new_keys": 100, "window": "1m", "over_budget": "deny"},
            "limits": [{"name": "second", "limit": 5, "window": "1s"},
                       {"name": "minute", "limit": 50, "window": "1m"}]}]}"#,
    )
    .unwrap();
    let mut e = Engine::new(&c);
    let mut h = FakeHost::new();
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    assert!(
        h.dispatched[0].1.path.contains("/1/1/"),
        "one budget in the call"
    );
    let over = r#"{"EVALSHA":[1,0,2,2,"0","30000","30000",2,"0","30000","30000"]}"#;
    e.on_reply(&c, &mut h, Some(1), 1, ok(over));
    assert_eq!(h.statuses(), vec![(1, 429)]);
    assert_eq!(h.count_of(Counter::KeyBudgetExceeded), 1);
    e.on_tick(&c, &mut h);
    assert_eq!(
        h.rule_counts(&c),
        vec![
            ("ratelimit_rule.ip.key_budget_exceeded".to_string(), 1),
            ("ratelimit_rule.ip.minute.denied".to_string(), 1),
            ("ratelimit_rule.ip.second.denied".to_string(), 1),
        ]
    );
}

/// The keys of a decision call (its `KEYS`), decoded.
fn call_keys(request: &BridgeRequest) -> Vec<String> {
    let segments: Vec<&str> = request.path.split('/').collect();
    let n: usize = segments[3].parse().unwrap();
    let decode = |s: &str| {
        let bytes = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    };
    segments[4..4 + n].iter().map(|s| decode(s)).collect()
}

fn cluster_config() -> Config {
    Config::parse(
        br#"{"bridge": {"redis_cluster": true}, "rules": [
            {"name": "per_key", "key": {"from": ["header:x-api-key"], "when_missing": "skip"},
             "limits": [{"name": "minute", "limit": 10, "window": "1m"}]},
            {"name": "per_ip", "match": {"path_prefix": "/both"}, "key": {"from": ["client_ip"]},
             "limits": [{"name": "minute", "limit": 10, "window": "1m"}]}
        ]}"#,
    )
    .unwrap()
}

#[test]
fn in_cluster_mode_a_call_holds_one_slots_requests() {
    let c = cluster_config();
    assert_eq!(
        c.batch.max_in_flight, 8,
        "several slots in flight by default"
    );
    let mut e = Engine::new(&c);
    let mut h = FakeHost::new();
    // Busy worker: 20 keys wait, on many slots.
    arrive(&mut e, &c, &mut h, 1, &req("/", "first"));
    for ctx in 2..22 {
        e.on_request(&c, &mut h, ctx, &req("/", &format!("k{}", ctx % 5)));
    }
    e.on_wakeup(&c, &mut h);
    assert!(h.dispatched.len() > 2);
    let mut requests = 0;
    for (_, call, _) in &h.dispatched {
        let slots: HashSet<u16> = call_keys(call)
            .iter()
            .map(|k| key_slot(k.as_bytes()))
            .collect();
        assert_eq!(slots.len(), 1, "{:?}", call_keys(call));
    }
    for i in 0..h.dispatched.len() {
        requests += h.batch_size(i);
    }
    assert!(requests <= 21);
}

#[test]
fn in_cluster_mode_a_request_on_two_slots_is_all_or_nothing_through_a_refund() {
    let c = cluster_config();
    let mut e = Engine::new(&c);
    let mut h = FakeHost::new();
    // The API key and the client IP live on different slots: two parts, two calls.
    arrive(&mut e, &c, &mut h, 1, &req("/both", "k"));
    assert_eq!(h.dispatched.len(), 2);
    let (first, second) = (h.dispatched[0].0, h.dispatched[1].0);
    e.on_reply(&c, &mut h, None, first, ok(&reply(&[R::Allow(9)])));
    assert!(
        h.resumed.is_empty() && h.answered.is_empty(),
        "waits for both"
    );
    e.on_reply(&c, &mut h, None, second, ok(&reply(&[R::Refuse(500)])));
    assert_eq!(h.statuses(), vec![(1, 429)]);
    // The part that charged is given back, in a call of its own slot.
    assert_eq!(h.dispatched.len(), 3);
    let refund = &h.dispatched[2].1;
    assert!(
        refund.path.contains("/refund/1000000000000/9"),
        "{}",
        refund.path
    );
    assert_eq!(call_keys(refund), call_keys(&h.dispatched[0].1));
    assert_eq!(h.count_of(Counter::Refunds), 1);

    // Both parts allow: allowed, with the headers of both limits, nothing given back. (From
    // another address: the deny cache now refuses the first one without a call.)
    let mut other = req("/both", "k");
    other.source = Some("10.9.9.9:1234".into());
    arrive(&mut e, &c, &mut h, 2, &other);
    let tokens: Vec<u32> = h.dispatched[3..].iter().map(|d| d.0).collect();
    assert_eq!(tokens.len(), 2);
    e.on_reply(&c, &mut h, None, tokens[1], ok(&reply(&[R::Allow(8)])));
    e.on_reply(&c, &mut h, None, tokens[0], ok(&reply(&[R::Allow(8)])));
    assert_eq!(h.resumed, vec![2]);
    assert_eq!(e.take_headers(2).map(|h| h.len()), Some(3));
    assert_eq!(h.dispatched.len(), 5);
    assert_eq!(h.count_of(Counter::Refunds), 1);
    assert!(e.splits.is_empty());
}

#[test]
fn in_cluster_mode_a_failed_part_follows_the_policy_and_a_gone_client_leaves_nothing() {
    let c = cluster_config();
    let mut e = Engine::new(&c);
    let mut h = FakeHost::new();
    arrive(&mut e, &c, &mut h, 1, &req("/both", "k"));
    let (first, second) = (h.dispatched[0].0, h.dispatched[1].0);
    e.on_reply(&c, &mut h, None, first, ok(&reply(&[R::Allow(9)])));
    e.on_reply(&c, &mut h, None, second, none());
    assert_eq!(
        h.resumed,
        vec![1],
        "fails open: what was charged stays charged"
    );
    assert_eq!(h.count_of(Counter::Refunds), 0);

    arrive(&mut e, &c, &mut h, 2, &req("/both", "k"));
    e.forget(&c, &mut h, 2);
    assert!(e.splits.is_empty());
    let token = h.dispatched[2].0;
    e.on_reply(&c, &mut h, None, token, ok(&reply(&[R::Allow(9)])));
    assert_eq!(h.resumed, vec![1]);
}

#[test]
fn each_request_of_a_batch_gets_its_own_verdict_and_errors_stay_its_own() {
    let (_c, _e, h) = mixed_batch();
    assert_eq!(h.resumed, vec![2, 3]);
    assert_eq!(h.statuses(), vec![(1, 429), (4, 503)]);
    assert_eq!(h.count_of(Counter::ShadowDenied), 1);
    assert_eq!(h.count_of(Counter::FailureModeClosed), 1);
    assert_eq!(
        h.failures,
        vec![BridgeFailure::Redis(
            "WRONGTYPE Operation against a key holding the wrong kind of value".into()
        )]
    );
}

#[test]
fn a_whole_call_failing_follows_each_request_policy() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    e.on_reply(&c, &mut h, None, 1, none());
    assert_eq!(h.resumed, vec![1]);
    assert_eq!(h.failures, vec![BridgeFailure::NoResponse]);
    assert_eq!(
        h.counters,
        vec![
            Counter::BridgeCalls,
            Counter::BridgeErrors,
            Counter::FailureModeOpen
        ]
    );
    assert_eq!(e.take_headers(1), None);
}

#[test]
fn replies_for_streams_that_are_gone_still_decide_the_others() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    for ctx in 2..=4 {
        e.on_request(&c, &mut h, ctx, &req("/", &format!("k{ctx}")));
    }
    // 3 disconnects while waiting: it is not sent. 1 disconnects while its call is out.
    e.forget(&c, &mut h, 3);
    h.gone.insert(1);
    h.gone.insert(3);
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Allow(9)])));
    assert_eq!(h.resumed, Vec::<u32>::new());
    assert_eq!(e.take_headers(1), None, "nothing kept for a gone stream");
    assert_eq!(h.batch_size(1), 2, "3 left the queue");
    h.gone.insert(2);
    e.on_reply(&c, &mut h, None, 2, ok(&reply(&[R::Allow(9), R::Allow(8)])));
    assert_eq!(h.resumed, vec![4]);
    assert_eq!(h.count_of(Counter::Allowed), 3, "decided all the same");
    assert_eq!(e.load(), (0, 0));
}

#[test]
fn noscript_loads_the_script_and_sends_the_same_call_once_more() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    let noscript = r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#;
    e.on_reply(&c, &mut h, None, 1, ok(noscript));
    assert_eq!(h.dispatched.len(), 2, "the load takes the only slot");
    assert_eq!(h.dispatched[1].1, BridgeRequest::script_load());
    let loaded = format!(r#"{{"SCRIPT":"{}"}}"#, c.script_sha);
    e.on_reply(&c, &mut h, None, 2, ok(&loaded));
    assert_eq!(h.dispatched[2].1, h.dispatched[0].1, "the same call again");
    e.on_reply(&c, &mut h, None, 3, ok(noscript));
    assert_eq!(h.failures, vec![BridgeFailure::NoScript], "no loop");
    assert_eq!(h.resumed, vec![1]);
    assert_eq!(h.batch_size(3), 1, "then the next batch goes");
    assert_eq!(h.count_of(Counter::ScriptLoads), 1);
}

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
fn a_request_past_its_timeout_in_the_queue_fails_by_policy_and_calls_get_what_is_left() {
    // Calls stay out for 150 ms here: no breaker, or it would see them stall.
    let (c, mut e, mut h) = setup(r#""breaker": false,"#);
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    h.now = Some(T0 + 100 * MS);
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    h.now = Some(T0 + 120 * MS);
    e.on_request(&c, &mut h, 3, &req("/", "c"));
    // The first call times out at 150 ms; request 2 (150 ms from 100) is still in time.
    h.now = Some(T0 + 150 * MS);
    e.on_reply(&c, &mut h, None, 1, none());
    assert_eq!(h.dispatched[1].2, Duration::from_millis(100));
    assert_eq!(h.batch_size(1), 2);
    h.now = Some(T0 + 260 * MS);
    e.on_request(&c, &mut h, 4, &req("/", "d"));
    h.now = Some(T0 + 280 * MS);
    e.on_reply(&c, &mut h, None, 2, ok(&reply(&[R::Allow(1), R::Allow(1)])));
    assert_eq!(h.dispatched.len(), 3);
    h.now = Some(T0 + 500 * MS);
    e.on_request(&c, &mut h, 5, &req("/", "e"));
    e.on_reply(&c, &mut h, None, 3, none());
    // 5 arrived at 500 and waited for nothing: sent. None waited past its timeout.
    assert_eq!(h.resumed, vec![1, 2, 3, 4]);
    assert!(h.failures.iter().all(|f| *f == BridgeFailure::NoResponse));
    // Now one that does expire in the queue: the call in flight outlives it.
    let c2 =
        config(r#""breaker": false, "batch": {"max_in_flight": 1}, "bridge": {"timeout": "1s"},"#);
    let mut e = Engine::new(&c2);
    let mut h = FakeHost::new();
    arrive(&mut e, &c2, &mut h, 1, &req("/", "a"));
    h.now = Some(T0 + 10 * MS);
    e.on_request(&c2, &mut h, 2, &req("/", "b"));
    h.now = Some(T0 + 1010 * MS);
    e.on_reply(&c2, &mut h, None, 1, ok(&reply(&[R::Allow(1)])));
    assert_eq!(h.failures, vec![BridgeFailure::Expired]);
    assert_eq!(h.resumed, vec![1, 2], "open: let through");
    assert_eq!(h.dispatched.len(), 1, "nothing left to send");
}

#[test]
fn bad_requests_unmatched_requests_and_clock_failures_are_decided_at_once() {
    let (c, mut e, mut h) = setup("");
    let bad = req("/costly", "k").with("x-cost", b"lots");
    assert_eq!(e.on_request(&c, &mut h, 1, &bad), Verdict::Pause);
    assert_eq!(h.answered[0].1.status, 400);
    assert_eq!(
        h.answered[0].1.body,
        "x-cost must be a whole number from 1 to 5\n"
    );
    assert_eq!(h.counters, vec![Counter::BadRequests]);
    let only = Config::parse(
        br#"{"rules": [{"name": "r", "match": {"path_exact": "/only"}, "limits": [{"name": "l", "limit": 1, "window": "1s"}]}]}"#,
    )
    .unwrap();
    assert_eq!(
        e.on_request(&only, &mut h, 2, &req("/other", "k")),
        Verdict::Continue
    );
    h.now = None;
    assert_eq!(
        e.on_request(&c, &mut h, 3, &req("/", "k")),
        Verdict::Continue
    );
    assert_eq!(h.failures, vec![BridgeFailure::Clock]);
    assert_eq!(h.wakes, 0);
    assert!(h.dispatched.is_empty() && h.resumed.is_empty());
}

#[test]
fn without_a_wake_up_the_request_sends_itself_and_a_refused_dispatch_decides_it_at_once() {
    for (extra, verdict) in [
        ("", Verdict::Continue),
        (r#""failure_mode": "closed","#, Verdict::Pause),
    ] {
        let c = config(extra);
        let mut e = Engine::new(&c);
        let mut h = FakeHost {
            cannot_wake: true,
            refuse_dispatch: true,
            ..FakeHost::new()
        };
        assert_eq!(e.on_request(&c, &mut h, 1, &req("/", "k")), verdict);
        assert!(
            h.resumed.is_empty(),
            "its own verdict is returned, not resumed"
        );
        assert_eq!(
            h.failures,
            vec![BridgeFailure::Dispatch("cluster not found".into())]
        );
    }
    let c = config("");
    let mut e = Engine::new(&c);
    let mut h = FakeHost {
        cannot_wake: true,
        ..FakeHost::new()
    };
    assert_eq!(e.on_request(&c, &mut h, 1, &req("/", "k")), Verdict::Pause);
    assert_eq!(h.dispatched.len(), 1, "sent from the request itself");
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Allow(1)])));
    assert_eq!(h.resumed, vec![1]);
}

#[test]
fn a_stray_reply_changes_nothing() {
    let (c, mut e, mut h) = setup("");
    e.on_reply(&c, &mut h, None, 42, ok(&reply(&[R::Allow(1)])));
    assert!(h.resumed.is_empty() && h.counters.is_empty());
    arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
    e.on_reply(&c, &mut h, None, 42, ok(&reply(&[R::Allow(1)])));
    assert_eq!(e.load(), (0, 1));
}

#[test]
fn a_reply_for_another_shape_fails_the_batch() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Allow(1), R::Allow(1)])));
    assert_eq!(
        h.failures,
        vec![BridgeFailure::BadReply(
            "EVALSHA result has the wrong number of requests"
        )]
    );
    assert_eq!(h.resumed, vec![1]);
}

/// A call that timed out or could not connect: no status at all.
fn none() -> BridgeReply<'static> {
    BridgeReply {
        status: None,
        body: b"",
    }
}

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

/// Leases of at most 10 units, half of what is left, for 1 s; replicas' clocks within 10 ms.
const LEASING: &str = r#""lease": {"max_units": 10, "fraction": 0.5, "max_ms": 1000}, "bridge": {"clock_skew": "10ms"},"#;

/// A committed request that took `k` requests' worth, `left` left, whole in `reset_ms`.
fn leased(k: u64, left: u32, reset_ms: u32) -> String {
    format!(r#"{{"EVALSHA":[1,{k},1,1,"{left}","{reset_ms}","0"]}}"#)
}

/// A request of key "k" arrives (see `arrive`).
fn ask_k(e: &mut Engine, c: &Config, h: &mut FakeHost, ctx: u32) -> Verdict {
    arrive(e, c, h, ctx, &req("/", "k"))
}

/// With [`LEASING`], request 1 of key "k" was decided and took `k` requests' worth,
/// `left` left in Redis, whole again in `reset_ms`.
fn leasing_k(k: u64, left: u32, reset_ms: u32) -> (Config, Engine, FakeHost) {
    let (c, mut e, mut h) = setup(LEASING);
    ask_k(&mut e, &c, &mut h, 1);
    e.on_reply(&c, &mut h, Some(1), 1, ok(&leased(k, left, reset_ms)));
    (c, e, h)
}

fn remaining(e: &mut Engine, ctx: u32) -> String {
    let headers = e.take_headers(ctx).unwrap_or_default();
    headers
        .iter()
        .find(|(name, _)| *name == "x-ratelimit-remaining")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

#[test]
fn a_lease_serves_requests_without_a_call_and_the_next_is_asked_for_before_it_runs_out() {
    let (c, mut e, mut h) = setup(LEASING);
    assert_eq!(ask_k(&mut e, &c, &mut h, 1), Verdict::Pause);
    let (token, call, _) = h.dispatched[0].clone();
    // A key it has not leased before: 4 requests' worth at most (of max_units 10).
    assert!(call.path.contains("/1/lease/4/0%2E5"), "{}", call.path);
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
    assert!(call.path.contains("/1/lease/4/0%2E5"), "{}", call.path);
    assert_eq!(ask_k(&mut e, &c, &mut h, 4), Verdict::Continue);
    // Spent: the next one waits (the call slot is the prefetch's) ...
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
    assert!(call.path.contains("/1/lease/8/0%2E5"), "{}", call.path);
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
fn after_a_lease_that_served_nothing_a_key_asks_again_only_when_it_comes_back_soon() {
    let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
    // Nothing spent in its second: all 3 go back, and the next request asks for no lease.
    h.now = Some(T0 + 1000 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.count_of(Counter::LeaseUnitsReturned), 3);
    h.now = Some(T0 + 1500 * MS);
    ask_k(&mut e, &c, &mut h, 2);
    let (token, call, _) = h.dispatched.last().cloned().unwrap();
    assert!(call.path.contains("/1/lease/1/0%2E5"), "{}", call.path);
    e.on_reply(&c, &mut h, Some(2), token, ok(&reply(&[R::Allow(5)])));
    // Not back within half a lease's time (500 ms): still none.
    h.now = Some(T0 + 2100 * MS);
    ask_k(&mut e, &c, &mut h, 3);
    let (token, call, _) = h.dispatched.last().cloned().unwrap();
    assert!(call.path.contains("/1/lease/1/0%2E5"), "{}", call.path);
    e.on_reply(&c, &mut h, Some(3), token, ok(&reply(&[R::Allow(4)])));
    // Back within it: a lease of 2 again.
    h.now = Some(T0 + 2500 * MS);
    ask_k(&mut e, &c, &mut h, 4);
    let (_, call, _) = h.dispatched.last().cloned().unwrap();
    assert!(call.path.contains("/1/lease/2/0%2E5"), "{}", call.path);
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
    // whose clock and deadline are the tick's time plus the rule's timeout and the skew.
    h.now = Some(T0 + 45 * MS);
    e.on_tick(&c, &mut h);
    assert_eq!(h.dispatched.len(), calls + 1);
    let (_, call, timeout) = h.dispatched[calls].clone();
    let clock = T0 + 205 * MS;
    assert!(
        call.path
            .contains(&format!("/{clock}/{}/1/0/1/", clock / MS)),
        "{}",
        call.path
    );
    assert!(
        call.path
            .ends_with(&format!("/token_bucket/10/60000/10/2/refund/{T0}/1")),
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
    assert!(call.path.contains("/1/lease/2/0%2E5"), "{}", call.path);
}

#[test]
fn near_the_limit_a_decision_is_the_request_alone_and_a_refusal_leases_nothing() {
    let (c, mut e, mut h) = setup(LEASING);
    ask_k(&mut e, &c, &mut h, 1);
    e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Allow(1)])));
    // No lease: the next request is decided in Redis, and asks again.
    assert_eq!(ask_k(&mut e, &c, &mut h, 2), Verdict::Pause);
    assert!(h.dispatched[1].1.path.contains("/lease/"));
    e.on_reply(&c, &mut h, Some(2), 2, ok(&reply(&[R::Refuse(6000)])));
    assert_eq!(h.statuses(), vec![(2, 429)]);
    assert_eq!(h.count_of(Counter::LeaseGrants), 0);
    // The refusal is cached as usual; the next key still asks for a lease.
    assert_eq!(ask_k(&mut e, &c, &mut h, 3), Verdict::Pause);
    assert_eq!(h.dispatched.len(), 2);
    arrive(&mut e, &c, &mut h, 4, &req("/", "other"));
    assert!(h.dispatched[2].1.path.contains("/lease/"));
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
    let (c, mut e, mut h) = setup(&format!(r#"{LEASING} "breaker": {{"failures": 1}},"#));
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
    let (c, mut e, mut h) = setup(&format!("{LEASING} {breaker}"));
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
    assert!(h.dispatched[3].1.path.contains("/refund/"));
}

#[test]
fn in_cluster_mode_a_plan_on_two_slots_served_from_leases_sends_no_cross_slot_call() {
    let c = Config::parse(
        br#"{"bridge": {"redis_cluster": true}, "lease": {"max_units": 10, "fraction": 0.5, "max_ms": 1000},
            "rules": [
            {"name": "per_key", "key": {"from": ["header:x-api-key"], "when_missing": "skip"},
             "limits": [{"name": "minute", "limit": 100, "window": "1m"}]},
            {"name": "per_ip", "match": {"path_prefix": "/both"}, "key": {"from": ["client_ip"]},
             "limits": [{"name": "minute", "limit": 100, "window": "1m"}]}
        ]}"#,
    )
    .unwrap();
    let mut e = Engine::new(&c);
    let mut h = FakeHost::new();
    // Each key gets a lease of its own (3 units held) from a plan of its own slot alone.
    arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
    e.on_reply(&c, &mut h, Some(1), 1, ok(&leased(4, 60, 30_000)));
    arrive(&mut e, &c, &mut h, 2, &FakeRequest::new("GET", "/both"));
    e.on_reply(&c, &mut h, Some(2), 2, ok(&leased(4, 60, 30_000)));
    assert_eq!(h.count_of(Counter::LeaseGrants), 2);
    // Requests carrying both keys are served from the two leases, which run low.
    for ctx in [3, 4] {
        assert_eq!(
            arrive(&mut e, &c, &mut h, ctx, &req("/both", "k")),
            Verdict::Continue
        );
    }
    for (_, call, _) in &h.dispatched {
        let slots: HashSet<u16> = call_keys(call)
            .iter()
            .map(|k| key_slot(k.as_bytes()))
            .collect();
        assert_eq!(slots.len(), 1, "a call on one slot: {:?}", call_keys(call));
    }
}

#[test]
fn a_batch_leaves_room_for_the_fixed_part_of_the_call() {
    // Requests of 40 limits each; the names are padded until whole requests fill the
    // call's bytes to within 60 of the bound (less than any call's fixed part: EVALSHA,
    // the script's hash, the clock and the deadline).
    let rules = |pad: usize| -> String {
        (0..4)
            .map(|r| {
                let limits = (0..10)
                    .map(|i| {
                        let extra = pad.saturating_sub(60 * (r * 10 + i)).min(60);
                        let name = format!("l{i}{}", "x".repeat(extra));
                        format!(r#"{{"name": "{name}", "limit": 10, "window": "1m"}}"#)
                    })
                    .collect::<Vec<_>>()
                    .join(",");
                format!(r#"{{"name": "r{r}", "limits": [{limits}]}}"#)
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let parse = |pad: usize| {
        let json = format!(
            r#"{{"batch": {{"max_requests": 256}}, "rules": [{}]}}"#,
            rules(pad)
        );
        let c = Config::parse(json.as_bytes()).unwrap();
        let size = call_bytes(&crate::plan::plan(&c, &req("/", "k0")).unwrap().checks);
        (c, size)
    };
    // Each byte of padding adds one to a request's size.
    let (_, unpadded) = parse(0);
    let pad = (0..2000)
        .find(|pad| MAX_CALL_BYTES % (unpadded + pad) < 60)
        .expect("a padding that fills the call");
    let (c, size) = parse(pad);
    assert_eq!(size, unpadded + pad);
    let fit = MAX_CALL_BYTES / size;
    let mut e = Engine::new(&c);
    let mut h = FakeHost::new();
    arrive(&mut e, &c, &mut h, 1, &req("/", "first"));
    for ctx in 2..(fit as u32 + 3) {
        let r = req("/", &format!("k{ctx}"));
        assert_eq!(call_bytes(&crate::plan::plan(&c, &r).unwrap().checks), size);
        arrive(&mut e, &c, &mut h, ctx, &r);
    }
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Allow(9)])));
    assert_eq!(h.dispatched.len(), 2);
    let batch = h.batch_size(1);
    assert!(
        batch * size + 60 <= MAX_CALL_BYTES,
        "{batch} requests of {size} bytes leave no room for the call's fixed part"
    );
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

#[test]
fn a_give_back_has_the_time_of_a_decision_to_reach_redis() {
    // Replicas' clocks within 10 ms; the rule's timeout is the default 150 ms.
    let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
    h.now = Some(T0 + 1000 * MS);
    e.on_tick(&c, &mut h);
    let (_, call, timeout) = h.dispatched.last().cloned().unwrap();
    assert!(call.path.contains("/refund/"), "{}", call.path);
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
    let (c, mut e, mut h) = setup(LEASING);
    // Sent from its own context, asking for a lease; the stream ends before the reply.
    assert_eq!(ask_k(&mut e, &c, &mut h, 1), Verdict::Pause);
    assert!(h.dispatched[0].1.path.contains("/lease/"));
    e.forget(&c, &mut h, 1);
    assert_eq!(e.load(), (0, 0));
    // The next request of the key asks for a lease again.
    ask_k(&mut e, &c, &mut h, 2);
    let (_, call, _) = h.dispatched.last().cloned().unwrap();
    assert!(call.path.contains("/lease/"), "{}", call.path);
}
