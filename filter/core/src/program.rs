//! What Redis runs for a decision call: the decision code as a Redis Function (`FCALL`, loaded
//! once with `FUNCTION LOAD`), or the same code as a script (`EVALSHA`, loaded with `SCRIPT
//! LOAD`). The calls themselves are the bridge's (`bridge::Program`'s methods).
//!
//! A function library's top level (every function and table the decision code defines) runs
//! once, when it is loaded; a script's runs on every call, which is most of what a small call
//! costs Redis. Scripts stay where `FCALL` cannot go: Envoy's `redis_proxy` routes `EVALSHA` by
//! its first key, and knows no `FCALL` (its first argument is the function's name, not a key),
//! so a Redis Cluster behind it is called with the script. Redis before 7 has no Functions.
//!
//! Both names come from the code's hash: replicas of two releases side by side (a rolling
//! upgrade) each load and call their own, on the same state.

use crate::sha1::sha1_hex;
use crate::{decision_code_as_sent, decision_script};

/// How the filter calls Redis (`bridge.redis_calls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// `FCALL` of the decision library's function (Redis 7, Valkey).
    Function,
    /// `EVALSHA` of the decision script (Redis Cluster through Envoy, Redis 6).
    Script,
}

/// The decision code as this filter calls it: the command, what it names, and how to load it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    pub kind: CallKind,
    /// The function's name (`FCALL`) or the script's SHA-1 (`EVALSHA`).
    pub handle: String,
}

/// Hex digits of the code's hash in the library's and the function's names: enough that two
/// releases never share one.
const NAME_HASH_DIGITS: usize = 16;

impl Program {
    pub fn new(kind: CallKind) -> Program {
        let handle = match kind {
            CallKind::Script => sha1_hex(decision_script().as_bytes()),
            CallKind::Function => {
                let hash = sha1_hex(decision_code_as_sent().as_bytes());
                format!("ratelimit_decide_{}", &hash[..NAME_HASH_DIGITS])
            }
        };
        Program { kind, handle }
    }

    /// A script of any name, for tests that read a call's path.
    #[cfg(any(test, feature = "testing"))]
    pub fn script_named(handle: &str) -> Program {
        Program {
            kind: CallKind::Script,
            handle: handle.to_string(),
        }
    }

    /// The Redis command of a decision call: `FCALL` or `EVALSHA`.
    pub fn command(&self) -> &'static str {
        match self.kind {
            CallKind::Function => "FCALL",
            CallKind::Script => "EVALSHA",
        }
    }

    /// The function library's name: the function's, with `_lib` after it.
    pub fn library_name(&self) -> String {
        format!("{}_lib", self.handle)
    }

    /// The library's text: its name line, `LIBRARY` true (the code keeps its caches from call
    /// to call), the decision code, the function registered. Flags
    /// none: a function Redis refuses whole over `maxmemory` (never half-written) and runs on
    /// a primary only.
    pub fn library(&self) -> String {
        format!(
            "#!lua name={}\nlocal LIBRARY = true\n{}redis.register_function('{}', decide)\n",
            self.library_name(),
            decision_code_as_sent(),
            self.handle
        )
    }
}
