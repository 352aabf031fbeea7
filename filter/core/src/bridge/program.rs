//! The calls that run the decision code ([`Program`]) and load it into Redis.

use super::args::DecideCall;
use super::failure::{BridgeCall, BridgeFailure};
use super::reply::{command_result, BridgeReply};
use super::request::BridgeRequest;
use crate::decision_script;
pub use crate::program::{CallKind, Program};

/// The bridge's half of [`Program`]: the calls that run and load it.
impl Program {
    /// One decision call of `call`. Every segment is percent-encoded: no value can add, move
    /// or change an argument.
    pub fn decide(&self, call: &DecideCall) -> BridgeRequest {
        // [`DecideCall::command`], written in place into one string of the exact length: every
        // batch builds one.
        let count = call.keys.len().to_string();
        BridgeRequest::get(|| {
            [self.command(), self.handle.as_str(), count.as_str()]
                .into_iter()
                .chain(call.keys.iter().map(String::as_str))
                .chain(call.args.iter().map(String::as_str))
        })
    }

    /// The decision call of `call` on a Redis Cluster for keys of several slots of one node
    /// ([`DecideCall::command_on_node`]).
    pub fn decide_on_node(&self, call: &DecideCall, ask_map: bool) -> BridgeRequest {
        let command = call.command_on_node(self.command(), &self.handle, ask_map);
        BridgeRequest::get(|| command.iter().map(String::as_str))
    }

    /// The call that loads the code after Redis answered that it lacks it (a restart, a
    /// flush): `FUNCTION LOAD REPLACE` (two workers loading at once both succeed) or `SCRIPT
    /// LOAD`, the code sent as the body so it needs no encoding.
    pub fn load(&self) -> BridgeRequest {
        let (path, body) = match self.kind {
            CallKind::Function => ("/FUNCTION/LOAD/REPLACE", self.library().into_bytes()),
            CallKind::Script => ("/SCRIPT/LOAD", decision_script().into_bytes()),
        };
        BridgeRequest {
            method: "PUT",
            path: path.to_string(),
            body: Some(body),
        }
    }

    /// Reads the reply to [`Program::load`]: `{"FUNCTION":"<library>"}` or
    /// `{"SCRIPT":"<sha>"}`, which must name this code.
    pub fn parse_load_reply(&self, reply: BridgeReply<'_>) -> Result<(), BridgeFailure> {
        let (command, expected, what) = match self.kind {
            CallKind::Function => ("FUNCTION", self.library_name(), "FUNCTION LOAD"),
            CallKind::Script => ("SCRIPT", self.handle.clone(), "SCRIPT LOAD"),
        };
        match command_result(reply, command, BridgeCall::ScriptLoad)? {
            serde_json::Value::String(name) if name == expected => Ok(()),
            serde_json::Value::String(_) => Err(BridgeFailure::BadReply(match self.kind {
                CallKind::Function => "FUNCTION LOAD returned another library's name",
                CallKind::Script => "SCRIPT LOAD returned another script's hash",
            })),
            serde_json::Value::Array(items) => match items.as_slice() {
                [serde_json::Value::Bool(false), serde_json::Value::String(message)] => Err(
                    BridgeFailure::of_redis_error(BridgeCall::ScriptLoad, message),
                ),
                _ => Err(BridgeFailure::BadReply(load_reply_unread(what))),
            },
            _ => Err(BridgeFailure::BadReply(load_reply_unread(what))),
        }
    }
}

fn load_reply_unread(what: &'static str) -> &'static str {
    match what {
        "FUNCTION LOAD" => "FUNCTION LOAD result is not a library name",
        _ => "SCRIPT LOAD result is not a hash",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::{MisconfigCause, Misconfiguration, Refused};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn ok(body: &str) -> BridgeReply<'_> {
        BridgeReply {
            status: Some(200),
            body: body.as_bytes(),
        }
    }

    #[test]
    fn each_kind_names_its_code_and_loads_it() {
        let function = Program::new(CallKind::Function);
        assert_eq!(function.command(), "FCALL");
        assert!(function.handle.starts_with("ratelimit_decide_"));
        let load = function.load();
        assert_eq!(load.path, "/FUNCTION/LOAD/REPLACE");
        let body = String::from_utf8(load.body.unwrap_or_default()).unwrap_or_default();
        assert!(body.starts_with(&format!("#!lua name={}\n", function.library_name())));
        assert!(body.ends_with(&format!(
            "redis.register_function('{}', decide)\n",
            function.handle
        )));
        let script = Program::new(CallKind::Script);
        assert_eq!((script.command(), script.handle.len()), ("EVALSHA", 40));
        assert_eq!(script.load().path, "/SCRIPT/LOAD");
        // The size model counts the script's head: the function's must be no longer.
        let call = DecideCall::new("1", 0, std::iter::empty());
        assert!(function.decide(&call).path.len() < script.decide(&call).path.len());
        assert!(script
            .decide(&call)
            .path
            .starts_with(&format!("/EVALSHA/{}/0/", script.handle)));
    }

    #[test]
    fn each_load_fits_in_one_webdis_request_as_the_calls_do() {
        // Webdis refuses a request over its http_max_request_size (64 KiB shipped): a load
        // longer than a call's path may be leaves too little for the request's headers.
        for kind in [CallKind::Function, CallKind::Script] {
            let body = Program::new(kind).load().body.unwrap_or_default();
            assert!(
                body.len() <= crate::bounds::MAX_CALL_PATH_BYTES,
                "{kind:?}: {} bytes",
                body.len()
            );
        }
        // The comments are left out by their lines' start, which a long string would defeat.
        assert!(!crate::DECISION_CODE.contains("[["));
        assert!(!crate::decision_code_as_sent().contains("\n--"));
        assert_eq!(
            crate::decision_code_as_sent().lines().count(),
            crate::DECISION_CODE.lines().count()
        );
    }

    #[test]
    fn a_load_reply_must_name_this_code() {
        let function = Program::new(CallKind::Function);
        let mine = format!(r#"{{"FUNCTION":"{}"}}"#, function.library_name());
        assert_eq!(function.parse_load_reply(ok(&mine)), Ok(()));
        assert!(matches!(
            function.parse_load_reply(ok(r#"{"FUNCTION":"other"}"#)),
            Err(BridgeFailure::BadReply(_))
        ));
        assert!(function
            .parse_load_reply(ok(r#"{"FUNCTION":[false,"ERR Error compiling function"]}"#))
            .is_err());
        let script = Program::new(CallKind::Script);
        let mine = format!(r#"{{"SCRIPT":"{}"}}"#, script.handle);
        assert_eq!(script.parse_load_reply(ok(&mine)), Ok(()));
        assert_eq!(
            script.parse_load_reply(ok(&mine.replace("SCRIPT", "FUNCTION"))),
            Err(BridgeFailure::BadReply("reply is for another command"))
        );
        let refused = |refused| {
            Err(BridgeFailure::Misconfigured(Misconfiguration {
                cause: MisconfigCause::ScriptLoadRefused,
                refused,
            }))
        };
        for program in [&function, &script] {
            let forbidden = BridgeReply {
                status: Some(403),
                body: b"",
            };
            assert_eq!(
                program.parse_load_reply(forbidden),
                refused(Refused::Status(403))
            );
            let denied = format!(
                r#"{{"{}":[false,"NOPERM no"]}}"#,
                &program.load().path[1..]
                    .split('/')
                    .next()
                    .unwrap_or_default()
            );
            assert_eq!(
                program.parse_load_reply(ok(&denied)),
                refused(Refused::Redis("NOPERM no".into()))
            );
        }
    }
}
