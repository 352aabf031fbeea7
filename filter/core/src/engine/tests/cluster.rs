//! Redis Cluster: a call per slot, requests on several slots in parts, and leases.

use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// The keys of a decision call (its `KEYS`, or in a call for the slots of one node, those at
/// the head of its `ARGV`), decoded.
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
    if n == 0 {
        let k: usize = segments[5].parse().unwrap();
        let mut keys = vec![decode(segments[4])];
        keys.extend(segments[7..7 + k - 1].iter().map(|s| decode(s)));
        return keys;
    }
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
fn on_a_redis_cluster_a_call_carries_one_slots_requests() {
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
fn on_a_redis_cluster_a_request_on_two_slots_is_all_or_nothing_through_a_refund() {
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
    let refunds = sent_in_mode(&refund.path, "refund");
    assert_eq!(refunds.len(), 1, "{}", refund.path);
    assert_eq!(refunds[0].values, ["1000000000000", "9"], "{}", refund.path);
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
fn on_a_redis_cluster_a_failed_part_follows_the_policy_and_a_gone_client_leaves_nothing() {
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
fn on_a_redis_cluster_a_plan_on_two_slots_served_from_leases_sends_no_cross_slot_call() {
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
    // Each key earns a lease, and gets one of its own (3 units held) from a plan of its own
    // slot alone.
    earn(&mut e, &c, "k");
    earn_with(&mut e, &c, &FakeRequest::new("GET", "/both"));
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

/// [`cluster_config`] with one call in flight per worker: what arrives meanwhile waits.
fn one_in_flight() -> Config {
    Config::parse(
        br#"{"bridge": {"redis_cluster": true}, "batch": {"max_in_flight": 1}, "rules": [
            {"name": "per_key", "key": {"from": ["header:x-api-key"], "when_missing": "skip"},
             "limits": [{"name": "minute", "limit": 10, "window": "1m"}]}
        ]}"#,
    )
    .unwrap()
}

/// The slot of the `per_key` limit of API key `key`.
fn slot_of(c: &Config, key: &str) -> u16 {
    let plan = crate::request::plan::plan(c, &req("/", key)).unwrap();
    key_slot(plan.checks[0].key.as_bytes())
}

/// A slot map of two masters: the even slots on master 1, the odd ones on master 2.
fn parity_map() -> String {
    let ranges: Vec<String> = (0..crate::slot::SLOTS)
        .map(|s| format!("{s},{s},{}", 1 + s % 2))
        .collect();
    format!(r#","slots",{},{}"#, crate::slot::SLOTS, ranges.join(","))
}

/// `reply(requests)` with a slot map after the requests.
fn reply_with_map(requests: &[R], map: &str) -> String {
    let body = reply(requests);
    format!("{}{map}]}}", body.trim_end_matches("]}"))
}

/// Whether the call declares no key (a call for the slots of one node), and whether it asks
/// for the slot map.
fn on_node(call: &BridgeRequest) -> (bool, bool) {
    let segments: Vec<&str> = call.path.split('/').collect();
    (segments[3] == "0", segments[3] == "0" && segments[6] == "1")
}

/// API keys on the even slots (master 1 of [`parity_map`]), then on the odd ones.
fn keys_by_parity(c: &Config, n: usize) -> (Vec<String>, Vec<String>) {
    let all: Vec<String> = (0..200).map(|i| format!("user-{i}")).collect();
    let even = all
        .iter()
        .filter(|k| slot_of(c, k).is_multiple_of(2))
        .take(n);
    let odd = all.iter().filter(|k| slot_of(c, k) % 2 == 1).take(n);
    (even.cloned().collect(), odd.cloned().collect())
}

/// A worker learns the slot map from the first call (which asks for it); from then on a call
/// carries the requests of every slot of one master, declares no key, and none of another
/// master's.
#[test]
fn on_a_redis_cluster_a_call_carries_the_slots_of_one_master_once_the_map_is_known() {
    let c = one_in_flight();
    let (mut e, mut h) = (Engine::new(&c), FakeHost::new());
    arrive(&mut e, &c, &mut h, 1, &req("/", "first"));
    assert_eq!(
        on_node(&h.dispatched[0].1),
        (true, true),
        "the first call asks"
    );
    let token = h.dispatched[0].0;
    e.on_reply(
        &c,
        &mut h,
        Some(1),
        token,
        ok(&reply_with_map(&[R::Allow(9)], &parity_map())),
    );
    assert_eq!(h.resumed, vec![1]);
    assert_eq!(h.count_of(Counter::ClusterSlotMaps), 1);

    let (even, odd) = keys_by_parity(&c, 4);
    // A call in flight, so that what comes next waits and goes together.
    arrive(&mut e, &c, &mut h, 2, &req("/", "busy"));
    let busy = h.dispatched[1].0;
    for (i, key) in even.iter().chain(&odd).enumerate() {
        arrive(&mut e, &c, &mut h, 10 + i as u32, &req("/", key));
    }
    assert_eq!(h.dispatched.len(), 2, "they wait");
    e.on_reply(&c, &mut h, None, busy, ok(&reply(&[R::Allow(9)])));
    // Two calls: the even slots, then the odd ones; each for one master, no key declared.
    assert_eq!(h.dispatched.len(), 3);
    let t1 = h.dispatched[2].0;
    e.on_reply(&c, &mut h, None, t1, ok(&reply(&[R::Allow(9); 4])));
    assert_eq!(h.dispatched.len(), 4);
    for (i, keys) in [(2, &even), (3, &odd)] {
        let call = &h.dispatched[i].1;
        assert_eq!(on_node(call), (true, false));
        let sent: HashSet<String> = call_keys(call).into_iter().collect();
        let plan_keys: HashSet<String> = keys
            .iter()
            .map(|k| {
                crate::request::plan::plan(&c, &req("/", k)).unwrap().checks[0]
                    .key
                    .to_string()
            })
            .collect();
        assert_eq!(sent, plan_keys);
        let slots: HashSet<u16> = keys.iter().map(|k| slot_of(&c, k)).collect();
        assert!(slots.len() > 1, "several slots in one call");
        assert_eq!(h.batch_size(i), 4);
    }
    let t2 = h.dispatched[3].0;
    e.on_reply(&c, &mut h, None, t2, ok(&reply(&[R::Allow(9); 4])));
    assert_eq!(h.resumed.len(), 10, "every request decided once");
    assert_eq!(h.count_of(Counter::ClusterResends), 0);
}

/// A node refuses the keys of one request of a call for several slots (its slot moved): that
/// request, and it alone, is sent again in a call of its own slot with its keys declared,
/// and decided by that call only; the worker drops its map (calls of one slot each) and asks
/// for a fresh one with its next call.
#[test]
fn on_a_redis_cluster_a_request_a_node_refused_goes_again_in_a_call_of_its_own_slot() {
    let c = one_in_flight();
    let (mut e, mut h) = (Engine::new(&c), FakeHost::new());
    arrive(&mut e, &c, &mut h, 1, &req("/", "first"));
    let token = h.dispatched[0].0;
    e.on_reply(
        &c,
        &mut h,
        Some(1),
        token,
        ok(&reply_with_map(&[R::Allow(9)], &parity_map())),
    );
    let (even, _) = keys_by_parity(&c, 3);
    arrive(&mut e, &c, &mut h, 2, &req("/", "busy"));
    for (i, key) in even.iter().enumerate() {
        arrive(&mut e, &c, &mut h, 10 + i as u32, &req("/", key));
    }
    let busy = h.dispatched[1].0;
    e.on_reply(&c, &mut h, None, busy, ok(&reply(&[R::Allow(9)])));
    let (token, call) = (h.dispatched[2].0, h.dispatched[2].1.clone());
    assert_eq!(h.batch_size(2), 3);
    assert!(on_node(&call).0);
    let refused = r#"-1,"ERR Script attempted to access a non local key in a cluster node script: abc, on @user_script:80.""#;
    let body = format!(r#"{{"EVALSHA":[3,1,1,1,"9","6000","0",{refused},1,1,1,"9","6000","0"]}}"#);
    e.on_reply(&c, &mut h, None, token, ok(&body));
    assert_eq!(
        h.resumed,
        vec![1, 2, 10, 12],
        "decided once, the refused one not yet"
    );
    assert_eq!(h.count_of(Counter::ClusterResends), 1);
    // Sent again at once, alone, in a call of its own slot with its key declared.
    assert_eq!(h.dispatched.len(), 4);
    let again = &h.dispatched[3].1;
    assert_eq!(on_node(again), (false, false));
    assert_eq!(call_keys(again), vec![call_keys(&call)[1].clone()]);
    assert_eq!(h.batch_size(3), 1);
    let token = h.dispatched[3].0;
    e.on_reply(&c, &mut h, None, token, ok(&reply(&[R::Refuse(500)])));
    assert_eq!(h.statuses(), vec![(11, 429)], "decided by the second call");
    assert!(h.failures.is_empty(), "{:?}", h.failures);
    // The map is gone: the next call carries one slot's keys, and asks for a fresh map.
    arrive(&mut e, &c, &mut h, 20, &req("/", &even[0]));
    let next = &h.dispatched[4].1;
    assert_eq!(on_node(next), (true, true));
    assert_eq!(h.batch_size(4), 1);
}

/// Only a refusal that Redis makes before the request ran sends it again: a call for several
/// slots that fails otherwise (no answer: it may have been carried out) follows the policy,
/// and so does a refusal in a call of one slot (never a loop).
#[test]
fn on_a_redis_cluster_what_may_have_run_is_never_sent_again() {
    let c = one_in_flight();
    let (mut e, mut h) = (Engine::new(&c), FakeHost::new());
    arrive(&mut e, &c, &mut h, 1, &req("/", "first"));
    let token = h.dispatched[0].0;
    e.on_reply(
        &c,
        &mut h,
        Some(1),
        token,
        ok(&reply_with_map(&[R::Allow(9)], &parity_map())),
    );
    let (even, _) = keys_by_parity(&c, 2);
    arrive(&mut e, &c, &mut h, 2, &req("/", "busy"));
    for (i, key) in even.iter().enumerate() {
        arrive(&mut e, &c, &mut h, 10 + i as u32, &req("/", key));
    }
    let busy = h.dispatched[1].0;
    e.on_reply(&c, &mut h, None, busy, ok(&reply(&[R::Allow(9)])));
    let token = h.dispatched[2].0;
    let lost = BridgeReply {
        status: None,
        body: b"",
    };
    e.on_reply(&c, &mut h, None, token, lost);
    assert_eq!(h.dispatched.len(), 3, "not sent again");
    assert_eq!(h.resumed, vec![1, 2, 10, 11], "failed open");
    assert_eq!(h.count_of(Counter::FailureModeOpen), 2);
    assert_eq!(h.count_of(Counter::ClusterResends), 0);

    // A call of one slot refused for a key: the policy, not another call.
    let c = one_in_flight();
    let (mut e, mut h) = (Engine::new(&c), FakeHost::new());
    arrive(&mut e, &c, &mut h, 1, &req("/", "first"));
    let token = h.dispatched[0].0;
    e.on_reply(&c, &mut h, Some(1), token, ok(&reply(&[R::Allow(9)])));
    // No map came: the next call asks again; this one is answered as a call of one slot is
    // not (no slot map), so the refused request is sent again once, declared.
    arrive(&mut e, &c, &mut h, 2, &req("/", "k"));
    let token = h.dispatched[1].0;
    let refused =
        r#"{"EVALSHA":[1,-1,"ERR Script attempted to access a non local key in a cluster node"]}"#;
    e.on_reply(&c, &mut h, Some(2), token, ok(refused));
    e.on_wakeup(&c, &mut h);
    assert_eq!(h.dispatched.len(), 3);
    assert!(!on_node(&h.dispatched[2].1).0, "declared");
    let token = h.dispatched[2].0;
    e.on_reply(&c, &mut h, None, token, ok(refused));
    assert_eq!(h.dispatched.len(), 3, "a declared call is never sent again");
    assert_eq!(h.resumed, vec![1, 2]);
    assert_eq!(h.count_of(Counter::ClusterResends), 1);
}

/// A call of one slot answered TRYAGAIN (its slot being migrated, its keys split between the
/// nodes): nothing ran; its requests go again at the next tick, and are decided once.
#[test]
fn on_a_redis_cluster_a_slot_being_migrated_is_tried_again_at_the_next_tick() {
    let c = one_in_flight();
    let (mut e, mut h) = (Engine::new(&c), FakeHost::new());
    arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
    let token = h.dispatched[0].0;
    let again = r#"{"EVALSHA":[false,"TRYAGAIN Multiple keys request during rehashing of slot"]}"#;
    e.on_reply(&c, &mut h, Some(1), token, ok(again));
    assert!(h.resumed.is_empty() && h.answered.is_empty());
    assert_eq!(h.dispatched.len(), 1, "not before the next tick");
    assert!(h.failures.is_empty());
    assert_eq!(e.load().0, 1, "parked");
    ticks(&mut e, &c, &mut h, 0, 0);
    assert_eq!(h.dispatched.len(), 2);
    assert!(!on_node(&h.dispatched[1].1).0, "its own slot, declared");
    let token = h.dispatched[1].0;
    e.on_reply(&c, &mut h, None, token, ok(&reply(&[R::Allow(9)])));
    assert_eq!(h.resumed, vec![1]);
    assert_eq!(h.count_of(Counter::ClusterResends), 1);
    assert_eq!(h.count_of(Counter::Allowed), 1);
    // While the slot keeps answering TRYAGAIN, its request tries at each tick, until its
    // timeout: then it follows the policy.
    arrive(&mut e, &c, &mut h, 2, &req("/", "k2"));
    let mut tries = 0;
    let mut at = 0;
    while h.resumed.len() < 2 && at <= 400 {
        if let Some((token, _, _)) = h.dispatched.get(2 + tries).cloned() {
            tries += 1;
            e.on_reply(&c, &mut h, None, token, ok(again));
        }
        at += 25;
        ticks(&mut e, &c, &mut h, at, at);
    }
    assert_eq!(h.resumed, vec![1, 2]);
    assert_eq!(h.count_of(Counter::FailureModeOpen), 1);
    assert!((5..=8).contains(&tries), "{tries} tries in its 150 ms");
}

/// With the slot map known, a worker keeps one call in flight per master: requests for a
/// master whose call is out wait for its reply and go together in the next call, while a
/// request for another master goes at once; every request is decided once.
#[test]
fn on_a_redis_cluster_a_master_has_one_call_in_flight_and_its_requests_wait_for_it() {
    let c = cluster_config();
    assert!(
        c.batch.max_in_flight > 2,
        "the worker's cap is not what holds them"
    );
    let (mut e, mut h) = (Engine::new(&c), FakeHost::new());
    arrive(&mut e, &c, &mut h, 1, &req("/", "first"));
    let token = h.dispatched[0].0;
    let map = reply_with_map(&[R::Allow(9)], &parity_map());
    e.on_reply(&c, &mut h, Some(1), token, ok(&map));
    let (even, odd) = keys_by_parity(&c, 4);
    arrive(&mut e, &c, &mut h, 10, &req("/", &even[0]));
    assert_eq!(h.dispatched.len(), 2, "master 1 was idle");
    let wakes = h.wakes;
    for (i, key) in even[1..].iter().enumerate() {
        arrive(&mut e, &c, &mut h, 11 + i as u32, &req("/", key));
    }
    assert_eq!(
        h.dispatched.len(),
        2,
        "master 1 has its call out: they wait"
    );
    assert_eq!(h.wakes, wakes, "nothing to send: the root is not woken");
    arrive(&mut e, &c, &mut h, 20, &req("/", &odd[0]));
    assert_eq!(h.dispatched.len(), 3, "master 2 was idle");
    arrive(&mut e, &c, &mut h, 21, &req("/", &odd[1]));
    assert_eq!(h.dispatched.len(), 3);
    ticks(&mut e, &c, &mut h, 0, 50);
    assert_eq!(h.dispatched.len(), 3, "a tick does not send them either");

    let (first_even, first_odd) = (h.dispatched[1].0, h.dispatched[2].0);
    e.on_reply(&c, &mut h, None, first_even, ok(&reply(&[R::Allow(9)])));
    assert_eq!(
        h.dispatched.len(),
        4,
        "the three waiting for master 1, in one call"
    );
    assert_eq!(h.batch_size(3), 3);
    assert!(on_node(&h.dispatched[3].1).0, "several slots of master 1");
    let sent: HashSet<u16> = call_keys(&h.dispatched[3].1)
        .iter()
        .map(|k| key_slot(k.as_bytes()))
        .collect();
    assert!(sent.iter().all(|s| s % 2 == 0), "{sent:?}");
    e.on_reply(&c, &mut h, None, first_odd, ok(&reply(&[R::Allow(9)])));
    assert_eq!(h.dispatched.len(), 5);
    assert_eq!(h.batch_size(4), 1);
    let (t3, t4) = (h.dispatched[3].0, h.dispatched[4].0);
    e.on_reply(&c, &mut h, None, t3, ok(&reply(&[R::Allow(9); 3])));
    e.on_reply(&c, &mut h, None, t4, ok(&reply(&[R::Allow(9)])));
    let mut resumed = h.resumed.clone();
    resumed.sort_unstable();
    assert_eq!(
        resumed,
        vec![1, 10, 11, 12, 13, 20, 21],
        "each decided once"
    );
    assert_eq!(h.dispatched.len(), 5);
}

/// The search for a request whose master has no call out looks at the first FRONT_SCAN
/// waiting: one further back waits for the next reply, and goes with it; none is lost.
#[test]
fn on_a_redis_cluster_a_request_behind_many_for_a_busy_master_goes_at_the_next_reply() {
    use crate::engine::nodes::FRONT_SCAN;
    let c = cluster_config();
    let (mut e, mut h) = (Engine::new(&c), FakeHost::new());
    arrive(&mut e, &c, &mut h, 1, &req("/", "first"));
    let token = h.dispatched[0].0;
    let map = reply_with_map(&[R::Allow(9)], &parity_map());
    e.on_reply(&c, &mut h, Some(1), token, ok(&map));
    let (even, odd) = keys_by_parity(&c, 1);
    // The same even key again and again: master 1's call out, FRONT_SCAN waiting for it.
    for i in 0..=FRONT_SCAN as u32 {
        arrive(&mut e, &c, &mut h, 100 + i, &req("/", &even[0]));
    }
    assert_eq!(h.dispatched.len(), 2);
    arrive(&mut e, &c, &mut h, 2, &req("/", &odd[0]));
    assert_eq!(h.dispatched.len(), 2, "beyond the scan: it waits");
    let busy = h.dispatched[1].0;
    e.on_reply(&c, &mut h, None, busy, ok(&reply(&[R::Allow(9)])));
    assert_eq!(
        h.dispatched.len(),
        4,
        "master 1's waiting ones, and the odd one"
    );
    assert_eq!(h.batch_size(2), FRONT_SCAN);
    assert_eq!(h.batch_size(3), 1);
    for i in [2, 3] {
        let (token, n) = (h.dispatched[i].0, h.batch_size(i));
        e.on_reply(&c, &mut h, None, token, ok(&reply(&vec![R::Allow(9); n])));
    }
    assert_eq!(
        h.resumed.len(),
        FRONT_SCAN + 3,
        "every request decided once"
    );
}
