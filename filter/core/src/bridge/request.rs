//! The HTTP calls the filter sends to Webdis: a decision call (`FCALL` or `EVALSHA`, see
//! `Program`) and the load of the code, with their headers.

use crate::config::Bridge;
use crate::encode::{path_segment_len, push_path_segment};

/// How many bytes longer [`Program::decide_on_node`]'s path is than [`Program::decide`]'s for the same call, at most: two segments (the number of keys,
/// up to 5 digits, and the map flag), the declared count becoming `0`.
pub const NODE_CALL_EXTRA_BYTES: usize = 9;

/// One HTTP call to Webdis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeRequest {
    pub method: &'static str,
    pub path: String,
    pub body: Option<Vec<u8>>,
}

impl BridgeRequest {
    /// A `GET` of the command `args` yields, each argument one percent-encoded path segment.
    pub(super) fn get<'a, I: Iterator<Item = &'a str>>(args: impl Fn() -> I) -> BridgeRequest {
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
    use crate::bridge::DecideCall;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A call for the slots of one node declares no key, starts `ARGV` with the first key
    /// (which the proxy routes by), the number of keys and the map flag, then the other keys
    /// and the same arguments; it is at most NODE_CALL_EXTRA_BYTES longer.
    #[test]
    fn a_call_for_a_node_puts_its_keys_at_the_head_of_argv() {
        let call = DecideCall {
            keys: vec!["rl:{a}:x".into(), "rl:{b}:x".into()],
            args: vec!["1".into(), "0".into()],
        };
        let node = crate::program::Program::script_named("sha").decide_on_node(&call, true);
        assert_eq!(
            node.path,
            "/EVALSHA/sha/0/rl%3A%7Ba%7D%3Ax/2/1/rl%3A%7Bb%7D%3Ax/1/0"
        );
        let declared = crate::program::Program::script_named("sha").decide(&call);
        assert_eq!(
            declared.path,
            "/EVALSHA/sha/2/rl%3A%7Ba%7D%3Ax/rl%3A%7Bb%7D%3Ax/1/0"
        );
        let many = DecideCall {
            keys: (0..12_000).map(|i| format!("k{i}")).collect(),
            args: vec![],
        };
        let (node, declared) = (
            crate::program::Program::script_named("sha").decide_on_node(&many, false),
            crate::program::Program::script_named("sha").decide(&many),
        );
        assert!(node.path.len() <= declared.path.len() + NODE_CALL_EXTRA_BYTES);
    }

    /// A real batch of two slots in the definitions layout reads back the same limits from
    /// either call, the key indexes unchanged (the script rebuilds `KEYS` in order).
    #[test]
    fn a_call_for_a_node_carries_the_same_limits() {
        use crate::config::Algorithm;
        use crate::testing::call::sent_limits;
        use crate::testing::plan::minute_check as check;
        let a = [
            check("rl:{a}:r:s", Algorithm::TokenBucket, false),
            check("rl:{a}:r:d", Algorithm::FixedWindow, true),
        ];
        let b = [check("rl:{b}:r:s", Algorithm::TokenBucket, false)];
        let call = DecideCall::new("1", 0, [&a[..], &b[..]]);
        let node = crate::program::Program::script_named("sha").decide_on_node(&call, false);
        let declared = crate::program::Program::script_named("sha").decide(&call);
        let sent = sent_limits(&node.path).expect("laid out as a decision call");
        assert_eq!(Some(sent.clone()), sent_limits(&declared.path));
        let keys: Vec<&str> = sent.iter().map(|l| l.key_index.as_str()).collect();
        assert_eq!(keys, ["1", "2", "3"]);
        assert_eq!(sent[2].request, 1);
    }

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
            .command("EVALSHA", "abc123")
            .iter()
            .map(|arg| format!("/{}", path_segment(arg.as_bytes())))
            .collect();
        let path = crate::program::Program::script_named("abc123")
            .decide(&call)
            .path;
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
        let headers = crate::bridge::Program::new(crate::bridge::CallKind::Script)
            .load()
            .headers(&bridge);
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
            Some(crate::decision_script().len().to_string())
        );
    }
}
