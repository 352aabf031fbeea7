//! The decision logic of the rate-limit filter, free of proxy-wasm so it can be tested natively,
//! under wasm-bindgen-test and with a fake host. The adapter in `ratelimit-filter` only routes
//! Envoy's callbacks to the worker's [`engine::Engine`] and carries out what it asks of its
//! [`engine::Host`].

pub mod algorithms;
pub mod bounds;
pub mod bridge;
pub mod calendar;
pub mod check;
pub mod config;
pub mod decision;
pub mod encode;
pub mod engine;
pub mod expiring;
pub mod grpc;
pub mod load;
pub mod metering;
pub mod metrics;
pub mod program;
pub mod request;
pub mod response;
pub mod sha1;
pub mod slot;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod throttle;
pub mod time;
pub mod usage;

/// The decision code, as both forms share it, each defining `LIBRARY` before it (true in the
/// function library): the shared part (`lua/lib.lua`), one part per algorithm, then the call
/// protocol's constants (`lua/wire.lua`, rendered from [`bridge::wire`]) and the driver that
/// decides all of a request's limits at once, ending in the function `decide(keys, args)`. Run
/// as a Redis Function where it can ([`bridge::Program`]), else as the script
/// [`decision_script`].
///
/// The algorithms' part and the driver are each defined inside a function (`define_*`), run
/// once where they appear. A script makes every function of the code on every call, and Lua
/// finds each outer local a function uses by walking the list of the locals already in use
/// (`luaF_findupval`): inside one function the driver's functions take the shared part's
/// locals from it as they are, and their own walk only that function's list.
pub const DECISION_CODE: &str = concat!(
    include_str!("../../../lua/lib.lua"),
    "local function define_algorithms()\n",
    include_str!("../../../lua/token_bucket.lua"),
    include_str!("../../../lua/gcra.lua"),
    include_str!("../../../lua/fixed_window.lua"),
    include_str!("../../../lua/sliding_window_counter.lua"),
    include_str!("../../../lua/sliding_window_log.lua"),
    include_str!("../../../lua/concurrency.lua"),
    "end\ndefine_algorithms()\nlocal function define_decide()\n",
    include_str!("../../../lua/wire.lua"),
    include_str!("../../../lua/decide.lua"),
    "return decide\nend\nlocal decide = define_decide()\n",
);

/// The decision script: [`DECISION_CODE`] run on every call through `EVALSHA`, loaded on
/// `NOSCRIPT`. `decide.lua` names its own `KEYS` and `ARGV`, so Redis's are taken first, and
/// `LIBRARY` is false: the code keeps nothing from call to call (`lua/lib.lua`'s caches). It has
/// no flags line: Redis 7 runs such a script in its compatible mode, which lets it touch
/// undeclared keys of several slots of one Redis Cluster node (a call for several slots, see
/// `lua/decide.lua`) and refuses only its writes, one by one, over `maxmemory`. Made when
/// needed (its hash at configuration, its text at a load) rather than kept beside
/// [`DECISION_CODE`]: the module would hold the code twice.
pub fn decision_script() -> String {
    format!(
        "local LIBRARY, CALL_KEYS, CALL_ARGV = false, KEYS, ARGV\n{}return decide(CALL_KEYS, CALL_ARGV)\n",
        decision_code_as_sent()
    )
}

/// [`DECISION_CODE`] as Redis receives it: every line that is only a comment left empty. Its
/// comments are close to half of it, and with them its load (`FUNCTION LOAD`, `SCRIPT LOAD`)
/// would pass the 64 KiB Webdis accepts in one request (`http_max_request_size` in
/// envoy/webdis.json); the empty lines keep each line where it is, so Redis's errors name the
/// line of the code read here. The code has no long strings (`[[ ]]`), so a line that starts
/// with `--` is a comment.
pub fn decision_code_as_sent() -> String {
    let mut sent = String::with_capacity(DECISION_CODE.len());
    for line in DECISION_CODE.split_inclusive('\n') {
        if line.trim_start().starts_with("--") {
            sent.push('\n');
        } else {
            sent.push_str(line);
        }
    }
    sent
}

pub use bridge::{BridgeFailure, BridgeReply, BridgeRequest};
pub use config::{Config, ConfigError, FailureMode};
/// The `local` failure mode's algorithms' clock (`ratelimit_core::local::unix_ms`, used by the
/// property tests).
pub use engine::local;
pub use engine::{Engine, Host, Verdict};
pub use metrics::{Counter, Gauge, Histogram, RuleStats};
pub use request::view::RequestView;
pub use throttle::LogThrottle;
