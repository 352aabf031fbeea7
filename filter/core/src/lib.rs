//! The decision logic of the rate-limit filter, free of proxy-wasm so it can be tested natively,
//! under wasm-bindgen-test and with a fake host. The adapter in `ratelimit-filter` only carries
//! out what [`flow::RequestFlow`] asks of its [`flow::Host`].

pub mod bridge;
pub mod config;
pub mod encode;
pub mod flow;
pub mod identity;
pub mod response;
pub mod sha1;
pub mod throttle;

/// The token bucket script, sent to Redis by hash (`EVALSHA`) and loaded on `NOSCRIPT`.
pub const TOKEN_BUCKET_LUA: &str = include_str!("../../../lua/token_bucket.lua");

pub use bridge::{BridgeFailure, BridgeReply, BridgeRequest};
pub use config::{Config, ConfigError, FailureMode};
pub use flow::{Counter, Host, RequestFlow, Verdict};
pub use throttle::LogThrottle;
