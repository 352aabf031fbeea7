//! The configuration as written: serde structs with their defaults, and the duration fields.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::{
    invalid, Admit, Algorithm, Clock, ConfigError, DenyBody, FailureMode, OverBudget,
    RateLimitHeaders, WhenMissing,
};
use crate::bounds::MAX_TIMEOUT;
use crate::grpc::GrpcOverLimit;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) bridge: RawBridge,
    #[serde(default = "default_failure_mode")]
    pub(super) failure_mode: FailureMode,
    #[serde(default)]
    pub(super) shadow: bool,
    #[serde(default)]
    pub(super) clock: Clock,
    #[serde(default = "default_key_prefix")]
    pub(super) key_prefix: String,
    #[serde(default = "default_true")]
    pub(super) hash_identities: bool,
    #[serde(default)]
    pub(super) xff_trusted_hops: u8,
    #[serde(default = "default_ipv4_prefix")]
    pub(super) ipv4_prefix: u8,
    #[serde(default = "default_ipv6_prefix")]
    pub(super) ipv6_prefix: u8,
    #[serde(default)]
    pub(super) headers: RateLimitHeaders,
    #[serde(default)]
    pub(super) deny_body: DenyBody,
    #[serde(default)]
    pub(super) grpc_over_limit: GrpcOverLimit,
    #[serde(default)]
    pub(super) batch: RawBatch,
    /// `false`, `true`, or `{"max_entries": N}`.
    pub(super) deny_cache: Option<Value>,
    /// `false`, `true`, or `{"failures": N, "stall": "100ms", "probe_interval": "500ms"}`.
    pub(super) breaker: Option<Value>,
    #[serde(default = "default_local_share")]
    pub(super) local_share: f64,
    /// `false`, `true`, or `{"max_units": N, "fraction": F, "max_ms": N}`: the lease of every
    /// token_bucket and GCRA limit that sets none itself. Off by default.
    pub(super) lease: Option<Value>,
    pub(super) rules: Vec<RawRule>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBatch {
    pub(super) max_requests: Option<u64>,
    pub(super) max_in_flight: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBreaker {
    pub(super) failures: Option<u64>,
    pub(super) stall: Option<String>,
    pub(super) probe_interval: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDenyCache {
    pub(super) max_entries: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBridge {
    pub(super) cluster: Option<String>,
    pub(super) authority: Option<String>,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) clock_skew: Option<String>,
    pub(super) lag_allowance: Option<String>,
    #[serde(default)]
    pub(super) redis_cluster: bool,
    /// `"function"` or `"script"`; the default follows `redis_cluster`.
    pub(super) redis_calls: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) name: String,
    #[serde(rename = "match", default)]
    pub(super) matcher: RawMatch,
    #[serde(default)]
    pub(super) key: RawKey,
    /// Required, but for a rule with `plans`, whose plans hold the limits.
    pub(super) limits: Option<Vec<RawLimit>>,
    /// The source naming a request's plan (`metadata:…`), with `plans`.
    pub(super) plan_from: Option<String>,
    pub(super) plans: Option<Vec<RawPlan>>,
    pub(super) cost: Option<Value>,
    pub(super) failure_mode: Option<FailureMode>,
    pub(super) timeout: Option<String>,
    #[serde(default)]
    pub(super) shadow: bool,
    pub(super) key_budget: Option<RawKeyBudget>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKeyBudget {
    pub(super) new_keys: u64,
    pub(super) window: String,
    #[serde(default)]
    pub(super) over_budget: OverBudget,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMatch {
    pub(super) path_exact: Option<String>,
    pub(super) path_prefix: Option<String>,
    pub(super) methods: Option<Vec<String>>,
    pub(super) header: Option<RawHeaderMatch>,
    pub(super) sources: Option<Vec<RawCondition>>,
}

/// `{"source": S, "in": [...]}`, `{"source": S, "not_in": [...]}` or
/// `{"source": S, "present": true|false}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCondition {
    pub(super) source: String,
    #[serde(rename = "in")]
    pub(super) in_: Option<Vec<Value>>,
    pub(super) not_in: Option<Vec<Value>>,
    pub(super) present: Option<bool>,
}

/// One of a rule's plans: the values of `plan_from` it takes, or the default (every other
/// value, none included), and its limits.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlan {
    pub(super) name: String,
    #[serde(default)]
    pub(super) values: Vec<Value>,
    #[serde(default)]
    pub(super) default: bool,
    pub(super) limits: Vec<RawLimit>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeaderMatch {
    pub(super) name: String,
    pub(super) value: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKey {
    #[serde(default = "default_key_from")]
    pub(super) from: Vec<String>,
    #[serde(default)]
    pub(super) when_missing: WhenMissing,
}

impl Default for RawKey {
    fn default() -> Self {
        RawKey {
            from: default_key_from(),
            when_missing: WhenMissing::default(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimit {
    pub(super) name: String,
    #[serde(default)]
    pub(super) algorithm: Algorithm,
    pub(super) limit: u64,
    /// Required, but for a concurrency limit, which takes `max_duration` instead. A duration,
    /// or (fixed_window) a calendar window: `day`, `week`, `month`.
    pub(super) window: Option<String>,
    pub(super) max_duration: Option<String>,
    /// A calendar window's UTC offset, `±HH:MM` (default UTC).
    pub(super) utc_offset: Option<String>,
    pub(super) burst: Option<u64>,
    pub(super) shards: Option<u64>,
    /// As the top-level `lease`, for this limit only (`false`: none for it).
    pub(super) lease: Option<Value>,
    pub(super) usage: Option<RawUsage>,
    /// Operators may set another limit for one identity at runtime (see docs/operations.md).
    #[serde(default)]
    pub(super) overrides: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLease {
    pub(super) max_units: Option<u64>,
    pub(super) fraction: Option<f64>,
    pub(super) max_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCostHeader {
    pub(super) header: String,
    pub(super) min: Option<u64>,
    pub(super) max: Option<u64>,
    pub(super) default: Option<u64>,
}

pub(super) fn default_local_share() -> f64 {
    0.125
}
pub(super) fn default_failure_mode() -> FailureMode {
    FailureMode::Open
}
pub(super) fn default_key_prefix() -> String {
    "rl:".to_string()
}
pub(super) fn default_true() -> bool {
    true
}
pub(super) fn default_ipv4_prefix() -> u8 {
    32
}
pub(super) fn default_ipv6_prefix() -> u8 {
    64
}
pub(super) fn default_key_from() -> Vec<String> {
    vec!["header:x-api-key".to_string(), "client_ip".to_string()]
}

pub(super) const DEFAULT_CLUSTER: &str = "webdis";
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_millis(150);

/// Reads an optional duration field, naming the field when the text is not a duration.
pub(super) fn duration_field(
    text: Option<&str>,
    field: &str,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match text {
        None => Ok(default),
        Some(text) => parse_duration(text).ok_or_else(|| {
            invalid(
                field,
                format!("invalid duration \"{text}\": expected a whole number and a unit (ms, s, m, h, d), like \"150ms\""),
            )
        }),
    }
}

pub(super) fn timeout_field(
    text: Option<&str>,
    field: &str,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let timeout = duration_field(text, field, default)?;
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        return Err(invalid(field, "must be between 1ms and 60s"));
    }
    Ok(timeout)
}

/// A duration written as a whole number and a unit: `150ms`, `2s`, `1m`, `1h`, `1d`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    Some(Duration::from_millis(n.checked_mul(millis_per_unit)?))
}

/// A duration as the config writes it (`366d`, `90m`, `150ms`): [`parse_duration`] reads it.
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, per) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= per && ms.is_multiple_of(per) {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUsage {
    /// A source, a named format, or a list of body paths.
    pub(super) from: Value,
    #[serde(default)]
    pub(super) admit: Admit,
    pub(super) estimate: Option<Value>,
    /// `true`, `false`, or `{"streamed": SOURCE, "asked": SOURCE}`.
    pub(super) include_usage: Option<Value>,
    /// What each kind of token of a named format costs.
    pub(super) weights: Option<Value>,
}

/// `usage.from` as `{"header": NAME, "min": N, "max": N}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeaderUsage {
    pub(super) header: String,
    pub(super) min: Option<u64>,
    pub(super) max: Option<u64>,
}

/// `usage.include_usage` as `{"streamed": SOURCE, "asked": SOURCE}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIncludeUsage {
    pub(super) streamed: String,
    pub(super) asked: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEstimateHeader {
    pub(super) header: String,
    pub(super) min: Option<u64>,
    pub(super) max: Option<u64>,
    pub(super) default: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRequestEstimate {
    pub(super) request: RawRequestFields,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRequestFields {
    pub(super) completion_default: Option<u64>,
    pub(super) max_body: Option<String>,
}
