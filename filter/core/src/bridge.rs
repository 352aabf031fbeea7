//! Talking to Webdis: the requests the filter sends and what their replies mean.

use std::fmt;

use serde_json::Value;

use crate::config::Bridge;
use crate::encode::path_segment;
use crate::plan::LimitCheck;

/// One HTTP call to Webdis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeRequest {
    pub method: &'static str,
    pub path: String,
    pub body: Option<Vec<u8>>,
}

impl BridgeRequest {
    /// One `EVALSHA` of the decision script for all of a request's checks. `clock` is the
    /// Unix time in ns, or `"redis"` for Redis's own clock. Every segment is percent-encoded:
    /// no value can add, move or change an argument.
    pub fn evalsha(script_sha: &str, clock: &str, checks: &[LimitCheck]) -> BridgeRequest {
        let mut args: Vec<String> = Vec::with_capacity(4 + 7 * checks.len());
        args.push(script_sha.to_string());
        args.push(checks.len().to_string());
        args.extend(checks.iter().map(|c| c.key.clone()));
        args.push(clock.to_string());
        args.push(checks.len().to_string());
        for c in checks {
            args.push(c.algorithm.name().to_string());
            args.push(c.per_window.to_string());
            args.push(c.window_ms.to_string());
            args.push(c.burst.to_string());
            args.push(c.cost.to_string());
            args.push(if c.shadow { "shadow" } else { "enforce" }.to_string());
        }
        let mut path = String::from("/EVALSHA");
        for arg in &args {
            path.push('/');
            path.push_str(&path_segment(arg.as_bytes()));
        }
        BridgeRequest {
            method: "GET",
            path,
            body: None,
        }
    }

    /// `SCRIPT LOAD` of the embedded script, sent as the body so it needs no encoding.
    pub fn script_load() -> BridgeRequest {
        BridgeRequest {
            method: "PUT",
            path: "/SCRIPT/LOAD".to_string(),
            body: Some(crate::DECISION_LUA.as_bytes().to_vec()),
        }
    }

    /// The HTTP/2-style headers Envoy's `dispatch_http_call` wants.
    pub fn headers(&self, bridge: &Bridge) -> Vec<(&'static str, String)> {
        let mut headers = vec![
            (":method", self.method.to_string()),
            (":path", self.path.clone()),
            (":authority", bridge.authority.clone()),
        ];
        if let Some(auth) = &bridge.authorization {
            headers.push(("authorization", auth.clone()));
        }
        if let Some(body) = &self.body {
            headers.push(("content-length", body.len().to_string()));
        }
        headers
    }
}

/// A reply from Webdis as the host delivered it: no status means the call timed out or the
/// connection failed.
#[derive(Debug, Clone, Copy)]
pub struct BridgeReply<'a> {
    pub status: Option<u16>,
    pub body: &'a [u8],
}

/// What Redis decided for one limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitResult {
    pub allowed: bool,
    /// Units left after this request (charged only if the request was allowed).
    pub remaining: f64,
    /// Milliseconds until the limit is whole again.
    pub reset_ms: f64,
    /// When refused: milliseconds until this request would be allowed.
    pub retry_ms: f64,
}

/// What Redis decided for one request: all limits, in the order they were sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Every enforced limit allowed, and the request was charged.
    pub allowed: bool,
    pub limits: Vec<LimitResult>,
}

/// Why the bridge gave no decision. Every one of these goes to the failure policy.
#[derive(Debug, Clone, PartialEq)]
pub enum BridgeFailure {
    /// No response: timeout or connection failure.
    NoResponse,
    /// An HTTP status other than 200 (403: credentials or ACL; 503: Redis down).
    Status(u16),
    /// Redis answered with an error (shown truncated).
    Redis(String),
    /// The script is still missing after loading it.
    NoScript,
    /// A reply the filter cannot read.
    BadReply(&'static str),
    /// The host refused to start the call (for example an unknown cluster).
    Dispatch(String),
    /// The host could not tell the time.
    Clock,
}

impl fmt::Display for BridgeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BridgeFailure::NoResponse => write!(
                f,
                "no response from the bridge (timeout or connection failure)"
            ),
            BridgeFailure::Status(code) => write!(f, "bridge answered HTTP {code}"),
            BridgeFailure::Redis(message) => write!(f, "redis error: {message}"),
            BridgeFailure::NoScript => write!(f, "script still missing after SCRIPT LOAD"),
            BridgeFailure::BadReply(why) => write!(f, "unreadable bridge reply: {why}"),
            BridgeFailure::Dispatch(why) => write!(f, "could not call the bridge: {why}"),
            BridgeFailure::Clock => write!(f, "host clock unavailable"),
        }
    }
}

/// What an `EVALSHA` reply says.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalOutcome {
    Decided(Decision),
    /// Redis does not have the script (it restarted): load it and retry.
    NoScript,
}

const MAX_ERROR_TEXT: usize = 200;

/// Reads the reply to an `EVALSHA` of `expected` limits:
/// `{"EVALSHA":[committed, n, allowed_1, "remaining_1", "reset_1", "retry_1", ...]}`,
/// or an error in a 200 body.
pub fn parse_eval_reply(
    reply: BridgeReply<'_>,
    expected: usize,
) -> Result<EvalOutcome, BridgeFailure> {
    let items = command_result(reply, "EVALSHA")?;
    let items = items
        .as_array()
        .ok_or(BridgeFailure::BadReply("EVALSHA result is not an array"))?;
    if let [Value::Bool(false), Value::String(message)] = items.as_slice() {
        if message.starts_with("NOSCRIPT") {
            return Ok(EvalOutcome::NoScript);
        }
        let mut shown: String = message.chars().take(MAX_ERROR_TEXT).collect();
        if shown.len() < message.len() {
            shown.push('…');
        }
        return Err(BridgeFailure::Redis(shown));
    }
    let [committed, count, rest @ ..] = items.as_slice() else {
        return Err(BridgeFailure::BadReply("EVALSHA result is too short"));
    };
    let allowed = flag(committed).ok_or(BridgeFailure::BadReply("decision flag is not 0 or 1"))?;
    if count.as_u64() != Some(expected as u64) || rest.len() != 4 * expected {
        return Err(BridgeFailure::BadReply(
            "EVALSHA result has the wrong number of limits",
        ));
    }
    let mut limits = Vec::with_capacity(expected);
    for chunk in rest.chunks_exact(4) {
        limits.push(LimitResult {
            allowed: flag(&chunk[0])
                .ok_or(BridgeFailure::BadReply("allowed flag is not 0 or 1"))?,
            remaining: non_negative_number(&chunk[1])
                .ok_or(BridgeFailure::BadReply("remaining is not a number >= 0"))?,
            reset_ms: non_negative_number(&chunk[2])
                .ok_or(BridgeFailure::BadReply("reset is not a number >= 0"))?,
            retry_ms: non_negative_number(&chunk[3])
                .ok_or(BridgeFailure::BadReply("retry-after is not a number >= 0"))?,
        });
    }
    Ok(EvalOutcome::Decided(Decision { allowed, limits }))
}

fn flag(value: &Value) -> Option<bool> {
    match value.as_u64() {
        Some(1) => Some(true),
        Some(0) => Some(false),
        _ => None,
    }
}

/// Reads the reply to `SCRIPT LOAD`: `{"SCRIPT":"<sha>"}`, which must name our script.
pub fn parse_script_load_reply(
    reply: BridgeReply<'_>,
    expected_sha: &str,
) -> Result<(), BridgeFailure> {
    match command_result(reply, "SCRIPT")? {
        Value::String(sha) if sha == expected_sha => Ok(()),
        Value::String(_) => Err(BridgeFailure::BadReply(
            "SCRIPT LOAD returned another script's hash",
        )),
        Value::Array(items) => match items.as_slice() {
            [Value::Bool(false), Value::String(message)] => Err(BridgeFailure::Redis(
                message.chars().take(MAX_ERROR_TEXT).collect(),
            )),
            _ => Err(BridgeFailure::BadReply("SCRIPT LOAD result is not a hash")),
        },
        _ => Err(BridgeFailure::BadReply("SCRIPT LOAD result is not a hash")),
    }
}

/// The value under `command` in a 200 JSON reply.
fn command_result(reply: BridgeReply<'_>, command: &str) -> Result<Value, BridgeFailure> {
    match reply.status {
        None => return Err(BridgeFailure::NoResponse),
        Some(200) => {}
        Some(code) => return Err(BridgeFailure::Status(code)),
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

/// Numbers come back as strings (Redis truncates Lua numbers); accept plain integers too.
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
    use crate::config::Algorithm;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn ok(body: &str) -> BridgeReply<'_> {
        BridgeReply {
            status: Some(200),
            body: body.as_bytes(),
        }
    }

    fn check(key: &str, algorithm: Algorithm, shadow: bool) -> LimitCheck {
        LimitCheck {
            rule: 0,
            limit: 0,
            key: key.into(),
            algorithm,
            per_window: 10,
            quota: 20,
            window_ms: 60_000,
            burst: 20,
            cost: 1,
            shadow,
        }
    }

    #[test]
    fn evalsha_path_has_exactly_the_arguments_in_order() {
        let checks = [
            check("rl:{k:1}:api:second", Algorithm::TokenBucket, false),
            check("rl:{k:1}:api:day", Algorithm::FixedWindow, true),
        ];
        let req = BridgeRequest::evalsha("abc123", "1764489269123456789", &checks);
        let segments: Vec<&str> = req.path.split('/').collect();
        assert_eq!(
            segments,
            [
                "",
                "EVALSHA",
                "abc123",
                "2",
                "rl%3A%7Bk%3A1%7D%3Aapi%3Asecond",
                "rl%3A%7Bk%3A1%7D%3Aapi%3Aday",
                "1764489269123456789",
                "2",
                "token_bucket",
                "10",
                "60000",
                "20",
                "1",
                "enforce",
                "fixed_window",
                "10",
                "60000",
                "20",
                "1",
                "shadow",
            ]
        );
        assert_eq!(req.method, "GET");
        assert_eq!(req.body, None);
    }

    #[test]
    fn hostile_key_cannot_add_arguments() {
        let checks = [check(
            "rl:{k:a/1000000/1000000.json}:r:l",
            Algorithm::Gcra,
            false,
        )];
        let req = BridgeRequest::evalsha("sha", "redis", &checks);
        assert_eq!(req.path.split('/').count(), 13);
        assert!(!req.path.contains(".json"));
    }

    #[test]
    fn headers_carry_authority_auth_and_length() {
        let bridge = Bridge {
            cluster: "webdis".into(),
            authority: "webdis.local".into(),
            authorization: Some("Basic dTpw".into()),
        };
        let headers = BridgeRequest::script_load().headers(&bridge);
        let get = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get(":method").as_deref(), Some("PUT"));
        assert_eq!(get(":path").as_deref(), Some("/SCRIPT/LOAD"));
        assert_eq!(get(":authority").as_deref(), Some("webdis.local"));
        assert_eq!(get("authorization").as_deref(), Some("Basic dTpw"));
        assert_eq!(
            get("content-length"),
            Some(crate::DECISION_LUA.len().to_string())
        );
    }

    #[test]
    fn decisions_are_read() {
        assert_eq!(
            parse_eval_reply(
                ok(r#"{"EVALSHA":[1,2,1,"4","6000","0",0,"0.25","59000","4500"]}"#),
                2
            ),
            Ok(EvalOutcome::Decided(Decision {
                allowed: true,
                limits: vec![
                    LimitResult {
                        allowed: true,
                        remaining: 4.0,
                        reset_ms: 6000.0,
                        retry_ms: 0.0
                    },
                    LimitResult {
                        allowed: false,
                        remaining: 0.25,
                        reset_ms: 59000.0,
                        retry_ms: 4500.0
                    },
                ]
            }))
        );
    }

    #[test]
    fn noscript_asks_for_a_load() {
        assert_eq!(
            parse_eval_reply(
                ok(r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#),
                1
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
                BridgeFailure::Status(403),
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
                ok(r#"{"EVALSHA":[1,"4""#),
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
                BridgeFailure::BadReply("EVALSHA result is not an array"),
            ),
            (
                ok(r#"{"EVALSHA":[1]}"#),
                BridgeFailure::BadReply("EVALSHA result is too short"),
            ),
            (
                ok(r#"{"EVALSHA":[2,1,1,"4","0","0"]}"#),
                BridgeFailure::BadReply("decision flag is not 0 or 1"),
            ),
            (
                ok(r#"{"EVALSHA":[1,2,1,"4","0","0"]}"#),
                BridgeFailure::BadReply("EVALSHA result has the wrong number of limits"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,"4","0"]}"#),
                BridgeFailure::BadReply("EVALSHA result has the wrong number of limits"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,true,"4","0","0"]}"#),
                BridgeFailure::BadReply("allowed flag is not 0 or 1"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,"four","0","0"]}"#),
                BridgeFailure::BadReply("remaining is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,"-1","0","0"]}"#),
                BridgeFailure::BadReply("remaining is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,"inf","0","0"]}"#),
                BridgeFailure::BadReply("remaining is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,1,1,"1",null,"0"]}"#),
                BridgeFailure::BadReply("reset is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[0,1,0,"0","0",{}]}"#),
                BridgeFailure::BadReply("retry-after is not a number >= 0"),
            ),
        ];
        for (reply, want) in cases {
            assert_eq!(
                parse_eval_reply(reply, 1),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(reply.body)
            );
        }
        match parse_eval_reply(ok(&long_error), 1) {
            Err(BridgeFailure::Redis(shown)) => {
                assert_eq!(shown.chars().count(), MAX_ERROR_TEXT + 1)
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn script_load_reply_must_name_our_script() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let good = format!(r#"{{"SCRIPT":"{sha}"}}"#);
        assert_eq!(parse_script_load_reply(ok(&good), sha), Ok(()));
        assert_eq!(
            parse_script_load_reply(ok(r#"{"SCRIPT":"ffff"}"#), sha),
            Err(BridgeFailure::BadReply(
                "SCRIPT LOAD returned another script's hash"
            ))
        );
        assert_eq!(
            parse_script_load_reply(ok(r#"{"SCRIPT":[false,"NOPERM no"]}"#), sha),
            Err(BridgeFailure::Redis("NOPERM no".into()))
        );
        assert_eq!(
            parse_script_load_reply(
                BridgeReply {
                    status: Some(403),
                    body: b""
                },
                sha
            ),
            Err(BridgeFailure::Status(403))
        );
        assert_eq!(
            parse_script_load_reply(ok("{}"), sha),
            Err(BridgeFailure::BadReply("reply is for another command"))
        );
    }
}
