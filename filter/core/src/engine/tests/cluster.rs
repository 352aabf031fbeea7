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
