//! Overrides in the engine: what a worker does with the override Redis said applies, in its
//! deny cache and in the `local` failure mode once the bridge fails.

use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn overridden(extra: &str) -> (Config, Engine, FakeHost) {
    let json = format!(
        r#"{{{extra} "rules": [{{"name": "api", "key": {{"from": ["header:x-api-key"]}},
            "limits": [{{"name": "m", "limit": 10, "window": "1m", "overrides": true}}]}}]}}"#
    );
    let c = Config::parse(json.as_bytes()).unwrap();
    let e = Engine::new(&c);
    (c, e, FakeHost::new())
}

/// Request `ctx` of `key`, answered `reply` (None: no answer at all) if a call went out.
/// Returns its status.
fn ask(
    e: &mut Engine,
    c: &Config,
    h: &mut FakeHost,
    ctx: u32,
    key: &str,
    reply: Option<&str>,
) -> u16 {
    let sent = h.dispatched.len();
    e.on_request(c, h, ctx, &req("/", key));
    if h.dispatched.len() > sent {
        let token = h.last_token();
        let answer = match reply {
            Some(body) => ok(body),
            None => BridgeReply {
                status: None,
                body: b"",
            },
        };
        e.on_reply(c, h, Some(ctx), token, answer);
    }
    if h.resumed.contains(&ctx) {
        return 200;
    }
    h.answered
        .iter()
        .find(|(id, _)| *id == ctx)
        .map_or(0, |(_, r)| r.status)
}

const BLOCKED: &str = r#"{"EVALSHA":[1,0,1,4,"0","0","0"]}"#;
/// Allowed under an override of 2 (outcome 1 + 4 + 16 × 2).
const OF_TWO: &str = r#"{"EVALSHA":[1,1,1,37,"1","30000","0"]}"#;

#[test]
fn a_block_without_expiry_sends_no_retry_after_and_is_held_at_most_the_bound() {
    let (c, mut e, mut h) = overridden("");
    assert_eq!(ask(&mut e, &c, &mut h, 1, "abuser", Some(BLOCKED)), 429);
    let answer = &h.answered[0].1;
    assert!(
        answer.headers.iter().all(|(n, _)| *n != "retry-after"),
        "{answer:?}"
    );
    // From the deny cache within the bound, with no Retry-After either.
    let sent = h.dispatched.len();
    h.now = Some(T0 + 999 * MS);
    assert_eq!(ask(&mut e, &c, &mut h, 2, "abuser", None), 429);
    assert_eq!(h.dispatched.len(), sent, "answered by the deny cache");
    assert!(h.answered[1]
        .1
        .headers
        .iter()
        .all(|(n, _)| *n != "retry-after"));
    // Past it, Redis is asked again.
    h.now = Some(T0 + 1001 * MS);
    assert_eq!(ask(&mut e, &c, &mut h, 3, "abuser", Some(OF_TWO)), 200);
    assert_eq!(h.dispatched.len(), sent + 1);
}

#[test]
fn the_local_failure_mode_decides_as_the_override_last_seen() {
    let (c, mut e, mut h) =
        overridden(r#""failure_mode": "local", "local_share": 1.0, "breaker": false,"#);
    assert_eq!(ask(&mut e, &c, &mut h, 1, "abuser", Some(BLOCKED)), 429);
    assert_eq!(ask(&mut e, &c, &mut h, 2, "small", Some(OF_TWO)), 200);
    // The bridge stops answering: each worker decides alone, as the overrides last said.
    h.now = Some(T0 + 2_000 * MS);
    assert_eq!(ask(&mut e, &c, &mut h, 3, "abuser", None), 429);
    let small: Vec<u16> = (4..7)
        .map(|ctx| ask(&mut e, &c, &mut h, ctx, "small", None))
        .collect();
    assert_eq!(
        small,
        [200, 200, 429],
        "the override's 2, not the config's 10"
    );
    let other: Vec<u16> = (7..18)
        .map(|ctx| ask(&mut e, &c, &mut h, ctx, "other", None))
        .collect();
    assert_eq!(
        other.iter().filter(|&&s| s == 200).count(),
        10,
        "the config's 10"
    );
    assert!(h.count_of(Counter::FailureModeLocal) >= 14);
}
