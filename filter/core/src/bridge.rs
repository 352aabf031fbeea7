//! Talking to Webdis: the requests the filter sends and what their replies mean.

use std::fmt;

use serde_json::Value;

use crate::config::{Bridge, Config};
use crate::encode::path_segment;

/// One HTTP call to Webdis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeRequest {
    pub method: &'static str,
    pub path: String,
    pub body: Option<Vec<u8>>,
}

impl BridgeRequest {
    /// `EVALSHA` of the token bucket for `key`, costing `cost` tokens at `now_ns`.
    /// Every segment is percent-encoded: no value can add, move or change an argument.
    pub fn evalsha(config: &Config, key: &str, now_ns: u128, cost: u64) -> BridgeRequest {
        let args = [
            config.script_sha.clone(),
            "1".to_string(),
            key.to_string(),
            config.limit.rate_per_second.to_string(),
            config.limit.capacity.to_string(),
            now_ns.to_string(),
            cost.to_string(),
        ];
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
            body: Some(crate::TOKEN_BUCKET_LUA.as_bytes().to_vec()),
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

/// What Redis decided for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub allowed: bool,
    /// Tokens left after this decision (may be fractional).
    pub remaining: f64,
    /// When refused: milliseconds until the request would be allowed.
    pub retry_after_ms: f64,
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

/// Reads the reply to an `EVALSHA`: `{"EVALSHA":[1,"4","0"]}` or an error in a 200 body.
pub fn parse_eval_reply(reply: BridgeReply<'_>) -> Result<EvalOutcome, BridgeFailure> {
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
    let [allowed, remaining, retry] = items.as_slice() else {
        return Err(BridgeFailure::BadReply(
            "EVALSHA result does not have 3 items",
        ));
    };
    let allowed = match allowed.as_u64() {
        Some(1) => true,
        Some(0) => false,
        _ => return Err(BridgeFailure::BadReply("allowed flag is not 0 or 1")),
    };
    Ok(EvalOutcome::Decided(Decision {
        allowed,
        remaining: non_negative_number(remaining).ok_or(BridgeFailure::BadReply(
            "remaining tokens is not a number >= 0",
        ))?,
        retry_after_ms: non_negative_number(retry)
            .ok_or(BridgeFailure::BadReply("retry-after is not a number >= 0"))?,
    }))
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
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn ok(body: &str) -> BridgeReply<'_> {
        BridgeReply {
            status: Some(200),
            body: body.as_bytes(),
        }
    }

    fn config() -> Config {
        Config::parse(
            br#"{"bridge": {"authority": "webdis.local", "username": "u", "password": "p"},
                 "limit": {"capacity": 10, "rate": 10, "per": "1m"}}"#,
        )
        .unwrap()
    }

    #[test]
    fn evalsha_path_has_exactly_the_arguments_in_order() {
        let c = config();
        let req = BridgeRequest::evalsha(&c, "rl:key:abc", 1_764_489_269_123_456_789, 1);
        let segments: Vec<&str> = req.path.split('/').collect();
        assert_eq!(
            segments,
            [
                "",
                "EVALSHA",
                c.script_sha.as_str(),
                "1",
                "rl%3Akey%3Aabc",
                "0%2E16666666666666666",
                "10",
                "1764489269123456789",
                "1"
            ]
        );
        assert_eq!(req.method, "GET");
        assert_eq!(req.body, None);
    }

    #[test]
    fn hostile_key_cannot_add_arguments() {
        let c = config();
        let req = BridgeRequest::evalsha(&c, "rl:key:a/1000000/1000000.json", 1, 1);
        assert_eq!(req.path.split('/').count(), 9);
        assert!(!req.path.contains(".json"));
    }

    #[test]
    fn headers_carry_authority_auth_and_length() {
        let c = config();
        let headers = BridgeRequest::script_load().headers(&c.bridge);
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
            Some(crate::TOKEN_BUCKET_LUA.len().to_string())
        );
    }

    #[test]
    fn decisions_are_read() {
        assert_eq!(
            parse_eval_reply(ok(r#"{"EVALSHA":[1,"4","0"]}"#)),
            Ok(EvalOutcome::Decided(Decision {
                allowed: true,
                remaining: 4.0,
                retry_after_ms: 0.0
            }))
        );
        assert_eq!(
            parse_eval_reply(ok(r#"{"EVALSHA":[0,"0.25","4500"]}"#)),
            Ok(EvalOutcome::Decided(Decision {
                allowed: false,
                remaining: 0.25,
                retry_after_ms: 4500.0
            }))
        );
    }

    #[test]
    fn noscript_asks_for_a_load() {
        assert_eq!(
            parse_eval_reply(ok(
                r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#
            )),
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
                ok(r#"{"EVALSHA":[1,"4"]}"#),
                BridgeFailure::BadReply("EVALSHA result does not have 3 items"),
            ),
            (
                ok(r#"{"EVALSHA":[2,"4","0"]}"#),
                BridgeFailure::BadReply("allowed flag is not 0 or 1"),
            ),
            (
                ok(r#"{"EVALSHA":[true,"4","0"]}"#),
                BridgeFailure::BadReply("allowed flag is not 0 or 1"),
            ),
            (
                ok(r#"{"EVALSHA":[1,"four","0"]}"#),
                BridgeFailure::BadReply("remaining tokens is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,"-1","0"]}"#),
                BridgeFailure::BadReply("remaining tokens is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[1,"inf","0"]}"#),
                BridgeFailure::BadReply("remaining tokens is not a number >= 0"),
            ),
            (
                ok(r#"{"EVALSHA":[0,"0",null]}"#),
                BridgeFailure::BadReply("retry-after is not a number >= 0"),
            ),
        ];
        for (reply, want) in cases {
            assert_eq!(
                parse_eval_reply(reply),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(reply.body)
            );
        }
        match parse_eval_reply(ok(&long_error)) {
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
