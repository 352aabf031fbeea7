//! A bridge that refuses the filter (a setting is wrong): each refused call counted under its
//! cause and reported once, its requests decided by their policy as in an outage, the breaker
//! probing until the setting is fixed.

use super::*;
use crate::bridge::{MisconfigCause, Misconfiguration, Refused};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn status(code: u16) -> BridgeReply<'static> {
    BridgeReply {
        status: Some(code),
        body: b"",
    }
}

/// Redis 7.0's error for a command the script calls that the user may not run.
const SCRIPT_REFUSED: &str =
    "ERR The user executing the script can't run this command or subcommand";

fn refusals(h: &FakeHost) -> Vec<MisconfigCause> {
    h.misconfigured.iter().map(|m| m.cause).collect()
}

#[test]
fn a_refused_call_is_counted_and_reported_by_cause_and_its_request_follows_its_policy() {
    for (mode, verdict) in [("open", None), ("closed", Some(503))] {
        let (c, mut e, mut h) = setup(&format!(r#""failure_mode": "{mode}","#));
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        e.on_reply(&c, &mut h, Some(1), 1, status(403));
        assert_eq!(
            h.misconfigured,
            vec![Misconfiguration {
                cause: MisconfigCause::BridgeAuth,
                refused: Refused::Status(403)
            }],
            "{mode}"
        );
        assert_eq!(h.count_of(Counter::MisconfiguredBridgeAuth), 1);
        assert!(
            h.failures.is_empty(),
            "reported as a refusal, not as an outage"
        );
        // The policy as for any bridge failure: counted as one.
        assert_eq!(h.count_of(Counter::BridgeErrors), 1);
        match verdict {
            None => {
                assert_eq!(h.resumed, vec![1]);
                assert_eq!(h.count_of(Counter::FailureModeOpen), 1);
            }
            Some(code) => {
                assert_eq!(h.statuses(), vec![(1, code)]);
                assert_eq!(h.count_of(Counter::FailureModeClosed), 1);
            }
        }
    }
}

/// Refused calls open the breaker like failed ones; while open, each refused probe is
/// counted and reported too (the alert stays on while nothing else calls), and the first
/// probe answered once the setting is fixed closes it: decisions come back by themselves.
#[test]
fn the_breaker_opens_on_refusals_probes_and_closes_once_the_setting_is_fixed() {
    let (c, mut e, mut h) = setup(r#""breaker": {"failures": 3, "probe_interval": "500ms"},"#);
    for ctx in 1..=3 {
        e.on_request(&c, &mut h, ctx, &req("/", "a"));
        let token = h.last_token();
        e.on_reply(&c, &mut h, Some(ctx), token, status(403));
    }
    assert_eq!(h.breaker_open, 1);
    assert_eq!(
        h.breaker_log,
        vec![(
            true,
            format!("3 calls in a row failed, the last: {}", h.misconfigured[2])
        )]
    );
    assert_eq!(h.count_of(Counter::MisconfiguredBridgeAuth), 3);
    // Open: decided without a call, nothing more refused.
    assert_eq!(
        e.on_request(&c, &mut h, 4, &req("/", "a")),
        Verdict::Continue
    );
    assert_eq!(h.count_of(Counter::MisconfiguredBridgeAuth), 3);
    // The probe is refused: counted and reported, the breaker stays open.
    h.now = Some(T0 + 500 * MS);
    e.on_tick(&c, &mut h);
    let probe = h.last_token();
    assert!(h.dispatched[3].1.path.ends_with("/0~0~0"), "the probe");
    e.on_reply(&c, &mut h, None, probe, status(403));
    assert_eq!(h.count_of(Counter::MisconfiguredBridgeAuth), 4);
    assert_eq!(refusals(&h), vec![MisconfigCause::BridgeAuth; 4]);
    assert_eq!(h.breaker_open, 1);
    // Fixed: the next probe is answered, the breaker closes, the next request is decided.
    h.now = Some(T0 + 1000 * MS);
    e.on_tick(&c, &mut h);
    let token = h.last_token();
    e.on_reply(&c, &mut h, None, token, ok(r#"{"EVALSHA":[0]}"#));
    assert_eq!(h.breaker_open, 0);
    e.on_request(&c, &mut h, 5, &req("/", "a"));
    let token = h.last_token();
    e.on_reply(&c, &mut h, Some(5), token, ok(&reply(&[R::Allow(9)])));
    // 4 went on at once (its own callback's verdict).
    assert_eq!(h.resumed, vec![1, 2, 3, 5]);
    assert_eq!(h.count_of(Counter::Allowed), 1);
    assert_eq!(h.count_of(Counter::MisconfiguredBridgeAuth), 4);
}

/// Redis's ACL refusing the script a command fails each request it reaches, in a reply that
/// is an answer: counted and reported once for the call, each request by its policy, and the
/// breaker's run is not fed (the bridge answers; the next call tries again).
#[test]
fn a_redis_acl_refusal_is_counted_once_per_call_and_each_request_follows_its_policy() {
    let (c, mut e, mut h) = setup(r#""breaker": {"failures": 1},"#);
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    e.on_request(&c, &mut h, 2, &req("/", "b"));
    e.on_request(&c, &mut h, 3, &req("/", "c"));
    e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Allow(9)])));
    assert_eq!(h.batch_size(1), 2);
    let body = format!(r#"{{"EVALSHA":[2,-1,"{SCRIPT_REFUSED}",-1,"{SCRIPT_REFUSED}"]}}"#);
    e.on_reply(&c, &mut h, None, 2, ok(&body));
    assert_eq!(h.resumed, vec![1, 2, 3]);
    assert_eq!(refusals(&h), vec![MisconfigCause::RedisAcl]);
    assert_eq!(h.count_of(Counter::MisconfiguredRedisAcl), 1);
    assert_eq!(h.count_of(Counter::BridgeErrors), 2);
    assert_eq!(h.count_of(Counter::FailureModeOpen), 2);
    assert!(h.failures.is_empty());
    assert_eq!(h.breaker_open, 0, "Redis answered");
    // Fixed: the next call decides.
    e.on_request(&c, &mut h, 4, &req("/", "d"));
    let token = h.last_token();
    e.on_reply(&c, &mut h, Some(4), token, ok(&reply(&[R::Allow(9)])));
    assert_eq!(h.count_of(Counter::Allowed), 2);
}

#[test]
fn a_refused_script_load_is_its_own_cause() {
    let noscript = r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#;
    let refusals_of_load = [
        (status(403), Refused::Status(403)),
        (
            ok(
                r#"{"FUNCTION":[false,"NOPERM this user has no permissions to run the 'function|load' command"]}"#,
            ),
            Refused::Redis(
                "NOPERM this user has no permissions to run the 'function|load' command".into(),
            ),
        ),
    ];
    for (answer, refused) in refusals_of_load {
        let (c, mut e, mut h) = setup("");
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        e.on_reply(&c, &mut h, None, 1, ok(noscript));
        assert_eq!(h.dispatched[1].1, c.program.load());
        e.on_reply(&c, &mut h, None, 2, answer);
        assert_eq!(
            h.misconfigured,
            vec![Misconfiguration {
                cause: MisconfigCause::ScriptLoadRefused,
                refused
            }]
        );
        assert_eq!(h.count_of(Counter::MisconfiguredScriptLoadRefused), 1);
        assert_eq!(h.count_of(Counter::ScriptLoads), 0);
        assert_eq!(h.resumed, vec![1]);
    }
}

/// An outage is reported as one (a warning), never as a misconfiguration.
#[test]
fn an_outage_is_not_a_refusal() {
    let (c, mut e, mut h) = setup("");
    arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
    e.on_reply(&c, &mut h, None, 1, status(503));
    assert_eq!(h.failures, vec![BridgeFailure::Status(503)]);
    assert!(h.misconfigured.is_empty());
    assert!(MisconfigCause::ALL
        .iter()
        .all(|cause| h.count_of(cause.counter()) == 0));
}
