//! Batches: arrival order, the bounds of a call (requests, bytes, calls in flight).

use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn batches_respect_max_requests_and_max_in_flight() {
    let (c, mut e, mut h) = setup(r#""batch": {"max_requests": 2, "max_in_flight": 2},"#);
    for ctx in 1..=8 {
        e.on_request(&c, &mut h, ctx, &req("/", &format!("k{ctx}")));
    }
    assert_eq!(h.dispatched.len(), 1, "the first went alone, at once");
    assert_eq!(h.wakes, 1, "room for a second call: the root is woken once");
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
        let size = call_bytes(
            &crate::request::plan::plan(&c, &req("/", "k0"))
                .unwrap()
                .checks,
        );
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
        assert_eq!(
            call_bytes(&crate::request::plan::plan(&c, &r).unwrap().checks),
            size
        );
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
