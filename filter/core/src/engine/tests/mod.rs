//! The engine as a whole, through its public calls, with the fake host.

use super::*;
use crate::bridge::{call_bytes, BridgeReply, BridgeRequest};
use crate::metrics::Histogram;
use crate::response::LocalResponse;
use crate::slot::key_slot;
use crate::testing::call::sent_in_mode;
use crate::testing::host::{FakeHost, T0};
use crate::testing::request::FakeRequest;
use std::collections::HashSet;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

mod batches;
mod breaker;
mod cluster;
mod grpc;
mod holds;
mod idle;
mod leases;
mod misconfigured;
mod overrides;
mod refusals;
mod usage;

use crate::engine::leases::EARN;

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

/// The worker's timer firing every 25 ms from `from_ms` to `to_ms` (both included): a worker
/// running on time (without ticks, it looks late from the first one on).
fn ticks(e: &mut Engine, c: &Config, h: &mut FakeHost, from_ms: u128, to_ms: u128) {
    let mut at = from_ms;
    while at <= to_ms {
        h.now = Some(T0 + at * MS);
        e.on_tick(c, h);
        at += 25;
    }
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
    assert!(call
        .path
        .starts_with(&format!("/FCALL/{}/", c.program.handle)));
    assert!(
        call.path
            .contains("/1000000000000/1002150/1~0~1/token_bucket~"),
        "{}",
        call.path
    );
    // Envoy's timeout: the 150 ms timeout plus the 1 s lag allowance (the engine stops
    // waiting at 150 ms of the worker's own time).
    assert_eq!(timeout, Duration::from_millis(1150));
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
        "no room for a call: it waits"
    );
    // The reply comes to request 1's context: 2 is not sent from there, the root is woken.
    e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Allow(9)])));
    assert_eq!((h.dispatched.len(), h.wakes), (1, 1));
    e.on_wakeup(&c, &mut h);
    assert_eq!(h.dispatched.len(), 2);
    assert_eq!(h.resumed, vec![1]);
}

#[test]
fn a_request_made_call_whose_stream_ends_frees_its_room_at_once() {
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

/// Deny-cache hits, counted in the stats or not yet.
fn hits(e: &Engine, h: &FakeHost) -> usize {
    h.count_of(Counter::DenyCacheHits) + e.tally.uncounted_deny_hits() as usize
}

fn sha1_key(identity: &str) -> String {
    crate::sha1::sha1_hex(identity.as_bytes())
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
        count("all.bridge_error"),
        count("all.minute.failed_closed"),
        count("watch.minute.shadow_denied"),
    ];
    want.sort();
    assert_eq!(h.rule_counts(&c), want);
    // The batch's counts came with its reply; the deny-cache hit's wait for the tick.
    let mut then = want.clone();
    for (name, n) in &mut then {
        if name == "ratelimit_rule.all.minute.denied" {
            *n = 1;
        }
    }
    assert_eq!(before, then, "the deny-cache hit waits for the tick");
    e.on_tick(&c, &mut h);
    assert_eq!(h.rule_counts(&c), want, "handed over once");
}

/// A stat counted for the whole filter and its per-rule twin agree once the callback that
/// counted them returns: a scrape between callbacks never sees one without the other.
#[test]
fn global_and_per_rule_counts_agree_when_a_callback_returns() {
    let c = Config::parse(
        br#"{"rules": [{"name": "ip", "key": {"from": ["client_ip"]},
            "key_budget": {"new_keys": 100, "window": "1m", "over_budget": "deny"},
            "limits": [{"name": "second", "limit": 5, "window": "1s"}]}]}"#,
    )
    .unwrap();
    let mut e = Engine::new(&c);
    let mut h = FakeHost::new();
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    let over = r#"{"EVALSHA":[1,0,1,2,"0","30000","30000"]}"#;
    e.on_reply(&c, &mut h, Some(1), 1, ok(over));
    assert_eq!(h.count_of(Counter::KeyBudgetExceeded), 1);
    assert_eq!(
        h.rule_counts(&c),
        vec![
            ("ratelimit_rule.ip.key_budget_exceeded".to_string(), 1),
            ("ratelimit_rule.ip.second.denied".to_string(), 1),
        ],
        "counted with the global ones, not at the next tick"
    );
    // A request decided by policy at once (no clock): its per-rule count comes with it too.
    h.now = None;
    arrive(&mut e, &c, &mut h, 2, &req("/", "b"));
    assert_eq!(h.count_of(Counter::FailureModeOpen), 1);
    assert!(h
        .rule_counts(&c)
        .contains(&("ratelimit_rule.ip.second.failed_open".to_string(), 1)));
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
        h.dispatched[0].1.path.contains("/1~1~"),
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
fn a_missing_program_is_loaded_and_the_same_call_sent_once_more() {
    // What Redis answers when it lacks the code, and what names it once loaded, per way of
    // calling it (`bridge.redis_calls`).
    let kinds = [
        (
            r#""bridge": {"redis_calls": "function"},"#,
            r#"{"FCALL":[false,"ERR Function not found"]}"#,
            "FUNCTION",
        ),
        (
            r#""bridge": {"redis_calls": "script"},"#,
            r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#,
            "SCRIPT",
        ),
    ];
    for (bridge, missing, load_reply) in kinds {
        let (c, mut e, mut h) = setup(bridge);
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        e.on_request(&c, &mut h, 2, &req("/", "b"));
        e.on_reply(&c, &mut h, None, 1, ok(missing));
        assert_eq!(h.dispatched.len(), 2, "the load takes the only room");
        assert_eq!(h.dispatched[1].1, c.program.load());
        let name = match c.program.kind {
            crate::program::CallKind::Function => c.program.library_name(),
            crate::program::CallKind::Script => c.program.handle.clone(),
        };
        let loaded = format!(r#"{{"{load_reply}":"{name}"}}"#);
        e.on_reply(&c, &mut h, None, 2, ok(&loaded));
        assert_eq!(h.dispatched[2].1, h.dispatched[0].1, "the same call again");
        e.on_reply(&c, &mut h, None, 3, ok(missing));
        assert_eq!(h.failures, vec![BridgeFailure::NoScript], "no loop");
        assert_eq!(h.resumed, vec![1]);
        assert_eq!(h.batch_size(3), 1, "then the next batch goes");
        assert_eq!(h.count_of(Counter::ScriptLoads), 1);
    }
}

#[test]
fn requests_leave_a_late_call_at_their_deadline_and_the_call_keeps_its_room_until_its_timeout() {
    let (c, mut e, mut h) = setup(r#""breaker": false,"#);
    ticks(&mut e, &c, &mut h, 0, 0);
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    ticks(&mut e, &c, &mut h, 25, 100);
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    // 150 ms: request 1 follows its policy; its call has had no answer for its whole
    // timeout and is given up (no breaker here), so request 2 goes.
    ticks(&mut e, &c, &mut h, 125, 150);
    assert_eq!(h.resumed, vec![1]);
    assert_eq!(h.failures, vec![BridgeFailure::Timeout]);
    assert_eq!(h.dispatched.len(), 2);
    assert_eq!(h.dispatched[1].2, Duration::from_millis(1150));
    ticks(&mut e, &c, &mut h, 175, 200);
    e.on_request(&c, &mut h, 3, &req("/", "c"));
    // 250 ms: request 2's deadline; its call, 100 ms out, keeps its room: 3 waits.
    ticks(&mut e, &c, &mut h, 225, 250);
    assert_eq!(h.resumed, vec![1, 2]);
    assert_eq!(e.load(), (1, 1));
    // Its answer decides nobody (2 has gone on) and makes room for 3.
    h.now = Some(T0 + 280 * MS);
    e.on_reply(&c, &mut h, None, 2, ok(&reply(&[R::Allow(1)])));
    assert_eq!(h.count_of(Counter::Allowed), 0);
    assert_eq!(h.batch_size(2), 1);
    e.on_reply(&c, &mut h, None, 3, ok(&reply(&[R::Allow(5)])));
    assert_eq!(h.resumed, vec![1, 2, 3]);
    assert_eq!(h.count_of(Counter::Allowed), 1);
    assert_eq!(h.count_of(Counter::BridgeTimeouts), 2);
    assert_eq!(
        h.rule_counts(&c),
        vec![
            ("ratelimit_rule.all.minute.allowed".to_string(), 1),
            ("ratelimit_rule.all.minute.failed_open".to_string(), 2),
            ("ratelimit_rule.all.timed_out".to_string(), 2),
        ]
    );
    // A request that expires in the queue: the call in flight outlives it.
    let c2 =
        config(r#""breaker": false, "batch": {"max_in_flight": 1}, "bridge": {"timeout": "1s"},"#);
    let mut e = Engine::new(&c2);
    let mut h = FakeHost::new();
    arrive(&mut e, &c2, &mut h, 1, &req("/", "a"));
    h.now = Some(T0 + 10 * MS);
    e.on_request(&c2, &mut h, 2, &req("/", "b"));
    // The worker's timer runs (the last tick at 990 ms, before request 1's deadline).
    ticks(&mut e, &c2, &mut h, 15, 990);
    h.now = Some(T0 + 1015 * MS);
    // The answer came before anything saw request 1's deadline pass: it decides it.
    e.on_reply(&c2, &mut h, None, 1, ok(&reply(&[R::Allow(1)])));
    assert_eq!(h.failures, vec![BridgeFailure::Expired]);
    assert_eq!(h.resumed, vec![1, 2], "open: let through");
    assert_eq!(h.count_of(Counter::Allowed), 1);
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
            "decision result has the wrong number of requests"
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

/// Key `key` earns a lease (see [`earn_with`]).
fn earn(e: &mut Engine, c: &Config, key: &str) {
    earn_with(e, c, &req("/", key));
}

/// The identity of `request` earns a lease: [`EARN`] - 1 requests like it are decided (plain,
/// each alone) in the 30 ms before T0, on a host of their own, so the next one asks for a
/// lease.
fn earn_with(e: &mut Engine, c: &Config, request: &FakeRequest) {
    let mut h = FakeHost::new();
    for i in 1..EARN {
        h.now = Some(T0 - 10 * MS * (EARN - i) as u128);
        arrive(e, c, &mut h, 1000 + i as u32, request);
        let (token, call, _) = h.dispatched.last().cloned().unwrap();
        assert!(!call.path.contains("~lease~"), "{}", call.path);
        e.on_reply(c, &mut h, None, token, ok(&reply(&[R::Allow(9)])));
    }
    e.on_tick(c, &mut h);
    assert_eq!(e.load(), (0, 0));
}

/// A config with `extra`, an engine where key "k" earned a lease, and a fake host at T0.
fn earned(extra: &str) -> (Config, Engine, FakeHost) {
    let (c, mut e, h) = setup(extra);
    earn(&mut e, &c, "k");
    (c, e, h)
}

/// With [`LEASING`], request 1 of key "k" (which earned a lease) was decided and took `k`
/// requests' worth, `left` left in Redis, whole again in `reset_ms`.
fn leasing_k(k: u64, left: u32, reset_ms: u32) -> (Config, Engine, FakeHost) {
    let (c, mut e, mut h) = earned(LEASING);
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

/// What the first limit asking for a lease in the call at `path` asks: its units and
/// fraction (empty: none asks).
fn lease_asked(path: &str) -> Vec<String> {
    sent_in_mode(path, "lease")
        .first()
        .map(|l| l.values.clone())
        .unwrap_or_default()
}
