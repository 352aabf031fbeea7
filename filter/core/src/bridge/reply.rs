//! Reading Webdis's replies: what a decision call (`FCALL` or `EVALSHA`) of a batch answered.

use super::wire::{
    OUTCOME_ALLOWED, OUTCOME_BAD_OVERRIDE, OUTCOME_OVERRIDE, OUTCOME_OVER_BUDGET,
    OUTCOME_QUOTA_UNIT,
};
use serde_json::Value;

use super::failure::{shown_error, BridgeCall, BridgeFailure};
use crate::bounds::MAX_LIMIT;
use crate::decision::{Decision, LimitResult, Override};

/// A reply from Webdis as the host delivered it: no status means the call timed out or the
/// connection failed.
#[derive(Debug, Clone, Copy)]
pub struct BridgeReply<'a> {
    pub status: Option<u16>,
    pub body: &'a [u8],
}

/// What an `EVALSHA` reply says.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalOutcome {
    /// One entry per request of the batch, in order: its decision, or why Redis could not
    /// decide that request alone.
    Decided(Vec<Result<Decision, BridgeFailure>>),
    /// Redis does not have the script (it restarted): load it and retry.
    NoScript,
}

/// Reads the reply to an `EVALSHA` of a batch whose requests carry `shape[i]` limits each:
/// `{"EVALSHA":[R, then per request committed, n, (allowed, "remaining", "reset", "retry") × n,
/// or -1, "error"]}`, or an error for the whole call in a 200 body.
pub fn parse_eval_reply(
    reply: BridgeReply<'_>,
    shape: &[usize],
) -> Result<EvalOutcome, BridgeFailure> {
    let shape: Vec<RequestShape> = shape
        .iter()
        .map(|&limits| RequestShape {
            limits,
            most_leased: 0,
        })
        .collect();
    parse_batch_reply(reply, &shape)
}

/// What the reply for one request of a batch may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestShape {
    /// Its limits.
    pub limits: usize,
    /// The most further requests a lease it asked for may hold (0: it asked for none). A
    /// reply granting more is unreadable: a broken bridge must not hand out units.
    pub most_leased: u64,
}

/// [`parse_eval_reply`] for a batch whose requests may have asked for leases: a committed
/// request replies 1 + the further requests leased instead of 1.
pub fn parse_batch_reply(
    reply: BridgeReply<'_>,
    shape: &[RequestShape],
) -> Result<EvalOutcome, BridgeFailure> {
    parse_node_reply(reply, shape, false).map(|(outcome, _)| outcome)
}

/// A Redis Cluster node's slot map, as the script replies it: (first slot, last slot, master)
/// per range, masters numbered from 1 within one map.
pub type SlotMap = Vec<(u16, u16, u16)>;

/// [`parse_batch_reply`] for a call that may have asked for the node's slot map (`map`): the
/// map follows the requests (`"slots"`, the number of ranges, three numbers per range); None
/// if none does.
pub fn parse_node_reply(
    reply: BridgeReply<'_>,
    shape: &[RequestShape],
    map: bool,
) -> Result<(EvalOutcome, Option<SlotMap>), BridgeFailure> {
    // The command is the one the call sent: `FCALL`, or `EVALSHA` (see `Program`).
    let items = match command_result(reply, "FCALL", BridgeCall::Decision) {
        Err(BridgeFailure::BadReply(_)) => command_result(reply, "EVALSHA", BridgeCall::Decision)?,
        other => other?,
    };
    let items = items
        .as_array()
        .ok_or(BridgeFailure::BadReply("decision result is not an array"))?;
    if let [Value::Bool(false), Value::String(message)] = items.as_slice() {
        // Redis lacks the code: the script's and the function's words for it.
        if message.starts_with("NOSCRIPT") || message.starts_with("ERR Function not found") {
            return Ok((EvalOutcome::NoScript, None));
        }
        if message.starts_with("EXPIRED") {
            return Err(BridgeFailure::Stale);
        }
        // Redis Cluster's answers before it runs a command: nothing of the call ran.
        if ["TRYAGAIN ", "MOVED ", "ASK ", "CLUSTERDOWN "]
            .iter()
            .any(|p| message.starts_with(p))
        {
            return Err(BridgeFailure::Moving(shown_error(message)));
        }
        return Err(BridgeFailure::of_redis_error(BridgeCall::Decision, message));
    }
    let Some((count, mut rest)) = items.split_first() else {
        return Err(BridgeFailure::BadReply("decision result is too short"));
    };
    if count.as_u64() != Some(shape.len() as u64) {
        return Err(BridgeFailure::BadReply(
            "decision result has the wrong number of requests",
        ));
    }
    let mut decisions = Vec::with_capacity(shape.len());
    for &expected in shape {
        let (decision, after) = parse_request(rest, expected)?;
        decisions.push(decision);
        rest = after;
    }
    let slots = match map {
        _ if rest.is_empty() => None,
        true => Some(slot_map(rest)?),
        false => return Err(BridgeFailure::BadReply("decision result is too long")),
    };
    Ok((EvalOutcome::Decided(decisions), slots))
}

/// The slot map at the end of a reply: `"slots"`, n, then n × (first, last, master).
fn slot_map(items: &[Value]) -> Result<SlotMap, BridgeFailure> {
    let bad = BridgeFailure::BadReply("slot map is not slots, n, then 3 numbers per range");
    let [Value::String(tag), count, ranges @ ..] = items else {
        return Err(bad);
    };
    if tag != "slots" || count.as_u64() != Some(ranges.len() as u64 / 3) || ranges.len() % 3 != 0 {
        return Err(bad);
    }
    let number = |v: &Value| v.as_u64().and_then(|n| u16::try_from(n).ok());
    ranges
        .chunks_exact(3)
        .map(|r| match (number(&r[0]), number(&r[1]), number(&r[2])) {
            (Some(first), Some(last), Some(node)) if first <= last && last < crate::slot::SLOTS => {
                Ok((first, last, node))
            }
            _ => Err(bad.clone()),
        })
        .collect()
}

/// One request's part of a batch reply, and what follows it.
fn parse_request(
    items: &[Value],
    shape: RequestShape,
) -> Result<(Result<Decision, BridgeFailure>, &[Value]), BridgeFailure> {
    let expected = shape.limits;
    let too_short = BridgeFailure::BadReply("decision result is too short");
    let [status, second, rest @ ..] = items else {
        return Err(too_short);
    };
    if status.as_i64() == Some(-1) {
        let message = second
            .as_str()
            .ok_or(BridgeFailure::BadReply("request error is not a text"))?;
        // Redis refused a key this node does not serve, before the request wrote anything.
        let not_served = ["non local key", "while the cluster is down"]
            .iter()
            .any(|p| message.contains(p));
        let failure = match not_served {
            true => BridgeFailure::NotServed(shown_error(message)),
            false => BridgeFailure::of_redis_error(BridgeCall::Decision, message),
        };
        return Ok((Err(failure), rest));
    }
    // 0: refused; k >= 1: committed, with k - 1 further requests leased.
    let committed = status
        .as_u64()
        .filter(|&k| k <= 1 + shape.most_leased)
        .ok_or(BridgeFailure::BadReply(
            "decision flag is not 0, 1 or 1 + a lease asked for",
        ))?;
    if second.as_u64() != Some(expected as u64) {
        return Err(BridgeFailure::BadReply(
            "decision result has the wrong number of limits",
        ));
    }
    if rest.len() < 4 * expected {
        return Err(too_short);
    }
    let (values, rest) = rest.split_at(4 * expected);
    let mut limits = Vec::with_capacity(expected);
    for chunk in values.chunks_exact(4) {
        let outcome = chunk[0].as_u64().ok_or(BridgeFailure::BadReply(
            "limit outcome is not a whole number",
        ))?;
        let (overridden, bad_override) = override_of(outcome)?;
        let allowed = outcome & OUTCOME_ALLOWED != 0;
        let (retry_ms, never_fits) = retry_of(&chunk[3], allowed)?;
        limits.push(LimitResult {
            allowed,
            remaining: non_negative_number(&chunk[1])
                .ok_or(BridgeFailure::BadReply("remaining is not a number >= 0"))?,
            reset_ms: non_negative_number(&chunk[2])
                .ok_or(BridgeFailure::BadReply("reset is not a number >= 0"))?,
            retry_ms,
            over_budget: outcome & OUTCOME_OVER_BUDGET != 0,
            overridden,
            bad_override,
            never_fits,
        });
    }
    let decision = Decision {
        allowed: committed >= 1,
        limits,
        leased: committed.saturating_sub(1),
    };
    Ok((Ok(decision), rest))
}

/// What a limit's outcome says of its identity's override: 1 allowed, plus 2 over the key
/// budget, plus 4 an override applied or 8 a malformed one was ignored, plus 16 × the
/// override's quota (0: `unlimited` when allowed, `blocked` when refused).
fn override_of(outcome: u64) -> Result<(Option<Override>, bool), BridgeFailure> {
    let bad = BridgeFailure::BadReply("limit outcome is not one the script sends");
    let (flags, limit) = (outcome % OUTCOME_QUOTA_UNIT, outcome / OUTCOME_QUOTA_UNIT);
    let overridden = match (flags & (OUTCOME_OVERRIDE | OUTCOME_BAD_OVERRIDE), limit) {
        (0, 0) => None,
        (OUTCOME_BAD_OVERRIDE, 0) => return Ok((None, true)),
        (OUTCOME_OVERRIDE, 0) if flags & OUTCOME_ALLOWED != 0 => Some(Override::Unlimited),
        (OUTCOME_OVERRIDE, 0) => Some(Override::Blocked),
        (OUTCOME_OVERRIDE, limit) if limit <= MAX_LIMIT => Some(Override::Limit(limit)),
        _ => return Err(bad),
    };
    Ok((overridden, false))
}

/// Whether `reply` is an answer from Redis through Webdis (a 200 with a command's result, an
/// error reply included), whatever its content: the bridge is alive.
pub fn is_answer(reply: BridgeReply<'_>) -> bool {
    [
        ("FCALL", BridgeCall::Decision),
        ("EVALSHA", BridgeCall::Decision),
        ("FUNCTION", BridgeCall::ScriptLoad),
        ("SCRIPT", BridgeCall::ScriptLoad),
    ]
    .into_iter()
    .any(|(command, call)| command_result(reply, command, call).is_ok())
}

/// The value under `command` in a 200 JSON reply to a `call`.
pub(super) fn command_result(
    reply: BridgeReply<'_>,
    command: &str,
    call: BridgeCall,
) -> Result<Value, BridgeFailure> {
    match reply.status {
        None => return Err(BridgeFailure::NoResponse),
        Some(200) => {}
        Some(code) => return Err(BridgeFailure::of_status(call, code)),
    }
    let value: Value = serde_json::from_slice(reply.body)
        .map_err(|_| BridgeFailure::BadReply("body is not JSON"))?;
    match value {
        Value::Object(mut map) => map
            .remove(command)
            .ok_or(BridgeFailure::BadReply("reply is for another command")),
        _ => Err(BridgeFailure::BadReply("body is not a JSON object")),
    }
}

/// A limit's retry: ms >= 0, or -1 on a refusal that no wait helps (the request costs more
/// than the limit ever holds), read as retry 0 and `never_fits`.
fn retry_of(value: &Value, allowed: bool) -> Result<(f64, bool), BridgeFailure> {
    let never = match value {
        Value::String(s) => s == "-1",
        Value::Number(n) => n.as_i64() == Some(-1),
        _ => false,
    };
    if never && !allowed {
        return Ok((0.0, true));
    }
    let retry = non_negative_number(value).ok_or(BridgeFailure::BadReply(
        "retry-after is not a number >= 0, or -1 on a refusal",
    ))?;
    Ok((retry, false))
}

/// Whole numbers come back as integers, others as text (Redis would truncate a Lua number with
/// a fraction).
fn non_negative_number(value: &Value) -> Option<f64> {
    let n = match value {
        Value::String(s) => s.parse::<f64>().ok()?,
        Value::Number(n) => n.as_f64()?,
        _ => return None,
    };
    (n.is_finite() && n >= 0.0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounds::MAX_ERROR_TEXT;
    use crate::bridge::failure::{MisconfigCause, Misconfiguration, Refused};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn refused(cause: MisconfigCause, refused: Refused) -> BridgeFailure {
        BridgeFailure::Misconfigured(Misconfiguration { cause, refused })
    }

    fn ok(body: &str) -> BridgeReply<'_> {
        BridgeReply {
            status: Some(200),
            body: body.as_bytes(),
        }
    }

    #[test]
    fn over_budget_outcomes_are_read() {
        let Ok(EvalOutcome::Decided(d)) = parse_eval_reply(
            ok(r#"{"EVALSHA":[2,0,1,2,"0","900","900",1,1,3,"4","6000","0"]}"#),
            &[1, 1],
        ) else {
            panic!("not decided");
        };
        let first = d[0].as_ref().unwrap();
        assert!(!first.allowed && !first.limits[0].allowed && first.limits[0].over_budget);
        let second = d[1].as_ref().unwrap();
        assert!(second.allowed && second.limits[0].allowed && second.limits[0].over_budget);
    }

    #[test]
    fn a_refusal_that_never_fits_is_read() {
        let Ok(EvalOutcome::Decided(d)) =
            parse_eval_reply(ok(r#"{"EVALSHA":[1,0,1,0,"3","900","-1"]}"#), &[1])
        else {
            panic!("not decided");
        };
        let limit = d[0].as_ref().unwrap().limits[0];
        assert!(limit.never_fits && !limit.allowed && limit.retry_ms == 0.0);
        // Only a refusal can say it.
        assert!(parse_eval_reply(ok(r#"{"EVALSHA":[1,1,1,1,"3","900","-1"]}"#), &[1]).is_err());
        assert!(parse_eval_reply(ok(r#"{"EVALSHA":[1,0,1,0,"3","900","-2"]}"#), &[1]).is_err());
    }

    #[test]
    fn decisions_are_read() {
        assert_eq!(
            parse_eval_reply(
                ok(
                    r#"{"EVALSHA":[2,1,2,1,"4","6000","0",0,"0.25","59000","4500",-1,"ERR decide: bad"]}"#
                ),
                &[2, 1]
            ),
            Ok(EvalOutcome::Decided(vec![
                Ok(Decision {
                    allowed: true,
                    limits: vec![
                        LimitResult {
                            allowed: true,
                            remaining: 4.0,
                            reset_ms: 6000.0,
                            retry_ms: 0.0,
                            over_budget: false,
                            overridden: None,
                            bad_override: false,
                            never_fits: false,
                        },
                        LimitResult {
                            allowed: false,
                            remaining: 0.25,
                            reset_ms: 59000.0,
                            retry_ms: 4500.0,
                            over_budget: false,
                            overridden: None,
                            bad_override: false,
                            never_fits: false,
                        },
                    ],
                    leased: 0
                }),
                Err(BridgeFailure::Redis("ERR decide: bad".into()))
            ]))
        );
    }

    #[test]
    fn overrides_are_read_from_the_outcome() {
        let reply = ok(
            r#"{"EVALSHA":[1,1,5,1,"4","6000","0",5,"0","0","0",4,"0","7200","7200",1605,"99","60000","0",9,"3","1000","0"]}"#,
        );
        let Ok(EvalOutcome::Decided(d)) = parse_eval_reply(reply, &[5]) else {
            panic!("not decided");
        };
        let limits = &d[0].as_ref().unwrap().limits;
        let seen: Vec<(Option<Override>, bool)> = limits
            .iter()
            .map(|l| (l.overridden, l.bad_override))
            .collect();
        assert_eq!(
            seen,
            [
                (None, false),
                (Some(Override::Unlimited), false),
                (Some(Override::Blocked), false),
                (Some(Override::Limit(100)), false),
                (None, true),
            ]
        );
        for outcome in ["12", "28", "17", "-4", "1.5"] {
            let body = format!(r#"{{"EVALSHA":[1,1,1,{outcome},"4","6000","0"]}}"#);
            assert!(
                parse_eval_reply(ok(&body), &[1]).is_err(),
                "outcome {outcome}"
            );
        }
    }

    #[test]
    fn noscript_asks_for_a_load() {
        assert_eq!(
            parse_eval_reply(
                ok(r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#),
                &[1]
            ),
            Ok(EvalOutcome::NoScript)
        );
    }

    /// Every failure shape from FACTS.md, plus garbage: each is a bridge failure, none panics.
    #[test]
    fn failures_are_classified() {
        let long_error = format!(r#"{{"EVALSHA":[false,"ERR {}"]}}"#, "x".repeat(1000));
        let cases: Vec<(BridgeReply<'_>, BridgeFailure)> = vec![
            (
                BridgeReply {
                    status: None,
                    body: b"",
                },
                BridgeFailure::NoResponse,
            ),
            (
                BridgeReply {
                    status: Some(403),
                    body: b"",
                },
                refused(MisconfigCause::BridgeAuth, Refused::Status(403)),
            ),
            (
                BridgeReply {
                    status: Some(503),
                    body: b"",
                },
                BridgeFailure::Status(503),
            ),
            (
                BridgeReply {
                    status: Some(405),
                    body: b"",
                },
                BridgeFailure::Status(405),
            ),
            (
                ok(r#"{"EVALSHA":[false,"ERR user_script:14: attempt to compare nil"]}"#),
                BridgeFailure::Redis("ERR user_script:14: attempt to compare nil".into()),
            ),
            (ok(""), BridgeFailure::BadReply("body is not JSON")),
            (ok("<html>"), BridgeFailure::BadReply("body is not JSON")),
            (
                ok(r#"{"EVALSHA":[1,1,"4""#),
                BridgeFailure::BadReply("body is not JSON"),
            ),
            (
                ok("[1,2,3]"),
                BridgeFailure::BadReply("body is not a JSON object"),
            ),
            (
                ok(r#"{"GET":"x"}"#),
                BridgeFailure::BadReply("reply is for another command"),
            ),
            (
                ok(r#"{"EVALSHA":"OK"}"#),
                BridgeFailure::BadReply("decision result is not an array"),
            ),
            (
                ok(r#"{"EVALSHA":[]}"#),
                BridgeFailure::BadReply("decision result is too short"),
            ),
            (
                ok(r#"{"EVALSHA":[1]}"#),
                BridgeFailure::BadReply("decision result is too short"),
            ),
            (
                ok(r#"{"EVALSHA":[2,1,1,1,"4","0","0"]}"#),
                BridgeFailure::BadReply("decision result has the wrong number of requests"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,1,"4","0","0",1]}"#),
                BridgeFailure::BadReply("decision result is too long"),
            ),
            (
                ok(r#"{"EVALSHA":[1,-1,7]}"#),
                BridgeFailure::BadReply("request error is not a text"),
            ),
            (
                ok(r#"{"EVALSHA":[1,2,1,1,"4","0","0"]}"#),
                BridgeFailure::BadReply("decision flag is not 0, 1 or 1 + a lease asked for"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,2,1,"4","0","0"]}"#),
                BridgeFailure::BadReply("decision result has the wrong number of limits"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,1,"4","0"]}"#),
                BridgeFailure::BadReply("decision result is too short"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,true,"4","0","0"]}"#),
                BridgeFailure::BadReply("limit outcome is not a whole number"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,12,"4","0","0"]}"#),
                BridgeFailure::BadReply("limit outcome is not one the script sends"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,1,"four","0","0"]}"#),
                BridgeFailure::BadReply("remaining is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,1,"-1","0","0"]}"#),
                BridgeFailure::BadReply("remaining is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,1,"inf","0","0"]}"#),
                BridgeFailure::BadReply("remaining is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,1,"1",null,"0"]}"#),
                BridgeFailure::BadReply("reset is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,0,1,0,"0","0",{}]}"#),
                BridgeFailure::BadReply("retry-after is not a number >= 0, or -1 on a refusal"),
            ),
        ];
        for (reply, want) in cases {
            assert_eq!(
                parse_eval_reply(reply, &[1]),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(reply.body)
            );
        }
        match parse_eval_reply(ok(&long_error), &[1]) {
            Err(BridgeFailure::Redis(shown)) => {
                assert_eq!(shown.chars().count(), MAX_ERROR_TEXT + 1)
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    /// A call for the slots of one node: a request whose keys the node does not serve is
    /// told apart (sent again), the slot map after the requests is read, a whole call refused
    /// before it ran (TRYAGAIN, MOVED, ASK, CLUSTERDOWN) is moving.
    #[test]
    fn node_replies_are_read() {
        let shape = [RequestShape {
            limits: 1,
            most_leased: 0,
        }; 2];
        let body = r#"{"EVALSHA":[2,1,1,1,"9","6000","0",-1,"ERR Script attempted to access a non local key in a cluster node script: x","slots",2,0,8191,1,8192,16383,2]}"#;
        let (outcome, map) = parse_node_reply(ok(body), &shape, true).unwrap();
        let EvalOutcome::Decided(results) = outcome else {
            panic!("decided")
        };
        assert!(results[0].is_ok());
        assert!(matches!(results[1], Err(BridgeFailure::NotServed(_))));
        assert_eq!(map, Some(vec![(0, 8191, 1), (8192, 16383, 2)]));
        // Not asked for, a map is a reply too long; asked for, a bad one is unreadable.
        assert!(parse_node_reply(ok(body), &shape, false).is_err());
        let bad =
            r#"{"EVALSHA":[2,1,1,1,"9","6000","0",1,1,1,"9","6000","0","slots",1,0,16384,1]}"#;
        assert!(parse_node_reply(ok(bad), &shape, true).is_err());
        let none = r#"{"EVALSHA":[2,1,1,1,"9","6000","0",1,1,1,"9","6000","0"]}"#;
        assert_eq!(parse_node_reply(ok(none), &shape, true).unwrap().1, None);
        for moving in [
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "MOVED 3300 127.0.0.1:7001",
            "ASK 3300 127.0.0.1:7001",
            "CLUSTERDOWN The cluster is down",
        ] {
            let body = format!(r#"{{"EVALSHA":[false,"{moving}"]}}"#);
            assert_eq!(
                parse_batch_reply(ok(&body), &shape),
                Err(BridgeFailure::Moving(moving.to_string()))
            );
        }
        let other = r#"{"EVALSHA":[false,"ERR upstream failure"]}"#;
        assert!(matches!(
            parse_batch_reply(ok(other), &shape),
            Err(BridgeFailure::Redis(_))
        ));
    }
}
