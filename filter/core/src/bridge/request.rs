//! The HTTP calls the filter sends to Webdis: the `EVALSHA` of a decision call and the
//! `SCRIPT LOAD` of the script, with their headers.

use super::args::DecideCall;
use crate::config::Bridge;
use crate::encode::{path_segment_len, push_path_segment};

/// One HTTP call to Webdis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeRequest {
    pub method: &'static str,
    pub path: String,
    pub body: Option<Vec<u8>>,
}

impl BridgeRequest {
    /// One `EVALSHA` of the decision script. Every segment is percent-encoded: no value can
    /// add, move or change an argument.
    pub fn evalsha(script_sha: &str, call: &DecideCall) -> BridgeRequest {
        // [`DecideCall::command`], written in place into one string of the exact length: every
        // batch builds one, about ten arguments per request.
        let count = call.keys.len().to_string();
        let args = || {
            ["EVALSHA", script_sha, count.as_str()]
                .into_iter()
                .chain(call.keys.iter().map(String::as_str))
                .chain(call.args.iter().map(String::as_str))
        };
        let len = args().map(|a| 1 + path_segment_len(a.as_bytes())).sum();
        let mut path = String::with_capacity(len);
        for arg in args() {
            path.push('/');
            push_path_segment(&mut path, arg.as_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn an_evalsha_path_is_each_argument_of_the_command_encoded() {
        use crate::config::Algorithm;
        use crate::encode::path_segment;
        use crate::testing::plan::minute_check as check;
        let first = [
            check("rl:{k:1}:api:second", Algorithm::TokenBucket, false),
            check("rl:{a/b%c.d é}:api:day", Algorithm::FixedWindow, true),
        ];
        let second = [check("rl:{k:1}:api:second", Algorithm::Gcra, false)];
        let call = DecideCall::new(
            "1764489269123456789",
            1764489269273,
            [&first[..], &second[..]],
        );
        let want: String = call
            .command("abc123")
            .iter()
            .map(|arg| format!("/{}", path_segment(arg.as_bytes())))
            .collect();
        let path = BridgeRequest::evalsha("abc123", &call).path;
        assert_eq!(path, want);
        assert_eq!(
            path.len(),
            path.capacity(),
            "one string of the exact length"
        );
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
}
