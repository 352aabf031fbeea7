//! The one reload path of every call that runs the decision code (a decision call, a
//! settlement call): Redis answered that it lacks the code (`NOSCRIPT`, `ERR Function not
//! found`: it restarted or was flushed), so the code is loaded and the same call goes again.
//! A call that finds the code missing once more after its load fails, rather than loading it
//! in a loop.

use std::borrow::Cow;

use crate::bridge::{BridgeFailure, BridgeReply, BridgeRequest};
use crate::config::Config;

/// Where a call is in its life against the decision code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Waiting for the call's reply; `reloaded` once the code was loaded for this call.
    Calling { reloaded: bool },
    /// Redis lacked the code; waiting for its load, then the same call goes again.
    Loading,
}

/// What a reply says for a call's stage.
#[derive(Debug)]
pub enum Read<T> {
    /// The code ran: the call's own reply.
    Ran(T),
    /// Redis lacks the code: load it ([`Stage::after`]).
    Missing,
    /// The code is loaded: send the call again ([`Stage::after`]).
    Loaded,
    Failed(BridgeFailure),
}

impl Default for Stage {
    fn default() -> Self {
        Stage::Calling { reloaded: false }
    }
}

impl Stage {
    /// The request to send for the stage: the call (`call`, made only when needed), or the
    /// code's load before it.
    pub fn request<'a>(
        self,
        config: &Config,
        call: impl FnOnce() -> Cow<'a, BridgeRequest>,
    ) -> Cow<'a, BridgeRequest> {
        match self {
            Stage::Calling { .. } => call(),
            Stage::Loading => Cow::Owned(config.program.load()),
        }
    }

    /// What `reply` says for the stage; `read` reads the call's own reply (None: Redis lacks
    /// the code).
    pub fn read<T>(
        self,
        config: &Config,
        reply: BridgeReply<'_>,
        read: impl FnOnce(BridgeReply<'_>) -> Result<Option<T>, BridgeFailure>,
    ) -> Read<T> {
        match self {
            Stage::Calling { reloaded } => match read(reply) {
                Ok(Some(ran)) => Read::Ran(ran),
                Ok(None) if !reloaded => Read::Missing,
                Ok(None) => Read::Failed(BridgeFailure::NoScript),
                Err(failure) => Read::Failed(failure),
            },
            Stage::Loading => match config.program.parse_load_reply(reply) {
                Ok(()) => Read::Loaded,
                Err(failure) => Read::Failed(failure),
            },
        }
    }

    /// The stage after `read`: the load after `Missing`, the call again after `Loaded`; else
    /// the same (the call's life ends with its reply).
    pub fn after<T>(self, read: &Read<T>) -> Stage {
        match read {
            Read::Missing => Stage::Loading,
            Read::Loaded => Stage::Calling { reloaded: true },
            Read::Ran(_) | Read::Failed(_) => self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn reply(body: &str) -> BridgeReply<'_> {
        BridgeReply {
            status: Some(200),
            body: body.as_bytes(),
        }
    }

    /// A call's own reply: "ran" or the code missing.
    fn own(r: BridgeReply<'_>) -> Result<Option<()>, BridgeFailure> {
        Ok((r.body == b"ran").then_some(()))
    }

    #[test]
    fn a_missing_code_is_loaded_once_then_the_call_goes_again() {
        let c = Config::parse(
            br#"{"rules": [{"name": "r", "limits": [{"name": "l", "limit": 1, "window": "1s"}]}]}"#,
        )
        .unwrap();
        let eval = c.program.load();
        let first = Stage::default();
        assert!(matches!(first.read(&c, reply("gone"), own), Read::Missing));
        let loading = first.after(&Read::<()>::Missing);
        assert_eq!(loading, Stage::Loading);
        assert_eq!(*loading.request(&c, || unreachable!()), c.program.load());
        let loaded = loading.read(&c, reply(&loaded_body(&c)), own);
        assert!(matches!(loaded, Read::Loaded), "{loaded:?}");
        let again = loading.after(&loaded);
        assert_eq!(again, Stage::Calling { reloaded: true });
        assert_eq!(*again.request(&c, || Cow::Borrowed(&eval)), eval);
        // Missing again after its load: a failure, not another load.
        let twice = again.read(&c, reply("gone"), own);
        assert!(matches!(twice, Read::Failed(BridgeFailure::NoScript)));
        assert_eq!(again.after(&twice), again, "its life ends");
        assert!(matches!(again.read(&c, reply("ran"), own), Read::Ran(())));
    }

    /// What Redis answers to the code's load.
    fn loaded_body(c: &Config) -> String {
        use crate::program::CallKind;
        match c.program.kind {
            CallKind::Function => format!(r#"{{"FUNCTION":"{}"}}"#, c.program.library_name()),
            CallKind::Script => format!(r#"{{"SCRIPT":"{}"}}"#, c.program.handle),
        }
    }
}
