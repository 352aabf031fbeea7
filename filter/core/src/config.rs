//! The filter's JSON configuration: parsed with serde, then validated, every error naming the
//! field it is about (`rules[0].limits[1].limit: must be >= 1`), so Envoy refuses a bad config
//! at start-up with a message an operator can act on.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::bounds::{
    check_request_bounds, show_duration, state_lifetime_ms, MAX_BRIDGE_FIELD_BYTES,
    MAX_CONFIG_BYTES, MAX_KEY_SOURCE_BYTES, MAX_LIMIT, MAX_LIMITS_PER_RULE, MAX_LOG_LIMIT,
    MAX_RULES, MAX_STATE_LIFETIME, MAX_WINDOW,
};
use crate::encode::base64;
use crate::sha1::sha1_hex;

/// What a bridge failure (timeout, refused connection, bad reply) does to the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureMode {
    /// Let the request through: the limiter never turns into an outage.
    Open,
    /// Answer 503: for endpoints where an unmetered request costs more than a refused one.
    Closed,
    /// Each worker enforces the rule's limits itself, in memory, at `local_share` of each.
    Local,
}

/// Whose clock the decision uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// Envoy's time, passed to the script: deterministic, but replicas' clocks must agree.
    #[default]
    Proxy,
    /// Redis `TIME`: one clock for the whole fleet.
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    #[default]
    TokenBucket,
    Gcra,
    SlidingWindowCounter,
    SlidingWindowLog,
    FixedWindow,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::FixedWindow => "fixed_window",
        }
    }

    fn has_burst(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::Gcra)
    }
}

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum HeaderMode {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    #[default]
    #[serde(rename = "x-ratelimit")]
    XRateLimit,
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
    #[serde(rename = "ietf")]
    Ietf,
    #[serde(rename = "both")]
    Both,
    /// None of them (a 429 still carries `Retry-After`).
    #[serde(rename = "none")]
    None,
}

impl HeaderMode {
    pub fn x_ratelimit(self) -> bool {
        matches!(self, HeaderMode::XRateLimit | HeaderMode::Both)
    }
    pub fn ietf(self) -> bool {
        matches!(self, HeaderMode::Ietf | HeaderMode::Both)
    }
}

/// The body of a 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum DenyBody {
    #[default]
    #[serde(rename = "text")]
    Text,
    /// RFC 9457 `application/problem+json`, type `quota-exceeded`.
    #[serde(rename = "problem+json")]
    ProblemJson,
}

/// What to do with a rule when none of its key sources is present on a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WhenMissing {
    /// Limit all such requests together under one `anonymous` key.
    #[default]
    Anonymous,
    /// The rule does not apply to the request.
    Skip,
}

/// A validated configuration, ready for the request path.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub bridge: Bridge,
    pub clock: Clock,
    pub key_prefix: String,
    pub hash_identities: bool,
    pub client_ip: ClientIpPolicy,
    pub headers: HeaderMode,
    pub deny_body: DenyBody,
    pub rules: Vec<Rule>,
    pub batch: Batch,
    /// The circuit breaker of each worker; None: never opens.
    pub breaker: Option<Breaker>,
    /// How far Envoy's and Redis's clocks may differ: a call that reaches Redis later than its
    /// timeout plus this charges nothing.
    pub clock_skew: Duration,
    /// Refused keys a worker remembers until they could fit; 0 turns the deny cache off.
    pub deny_cache_entries: usize,
    /// The part of each limit one worker enforces on its own in the `local` failure mode.
    pub local_share: f64,
    /// SHA-1 of the embedded decision script, as `EVALSHA` wants it.
    pub script_sha: String,
}

/// How a worker groups decisions into bridge calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Requests one call decides at most.
    pub max_requests: usize,
    /// Calls one worker has in flight at most; requests wait for a free one.
    pub max_in_flight: usize,
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            max_requests: 64,
            max_in_flight: 1,
        }
    }
}

/// When a worker stops calling a failing bridge, and how it finds out that it is back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    /// Consecutive failed calls that open the breaker.
    pub failures: u32,
    /// A call in flight this long opens it (a hang is seen without waiting for the timeout).
    pub stall: Duration,
    /// While open, one probe call per interval; an answer closes it.
    pub probe_interval: Duration,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            failures: 5,
            stall: Duration::from_millis(25),
            probe_interval: Duration::from_millis(500),
        }
    }
}

pub const DEFAULT_DENY_CACHE_ENTRIES: usize = 10_000;
const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(1);
const MAX_BREAKER_FAILURES: u64 = 1000;
const MAX_BATCH_REQUESTS: u64 = 256;
const MAX_IN_FLIGHT: u64 = 8;
const MAX_DENY_CACHE_ENTRIES: u64 = 1_000_000;

#[derive(Debug, Clone, PartialEq)]
pub struct Bridge {
    /// Envoy cluster that reaches Webdis.
    pub cluster: String,
    /// `:authority` of the calls to Webdis.
    pub authority: String,
    /// Ready-made `Authorization` header value, when Webdis requires basic auth.
    pub authorization: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIpPolicy {
    /// 0: the connection's peer. N > 0: the Nth address from the right of X-Forwarded-For.
    pub xff_trusted_hops: usize,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub name: String,
    pub matcher: Match,
    pub key: KeySpec,
    pub limits: Vec<Limit>,
    pub cost: Cost,
    pub failure_mode: FailureMode,
    pub timeout: Duration,
    pub shadow: bool,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Match {
    pub path: Option<PathMatch>,
    /// Upper-case methods; empty matches any.
    pub methods: Vec<String>,
    pub header: Option<HeaderMatch>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct HeaderMatch {
    pub name: String,
    /// None: the header must be present; Some: it must equal this value.
    pub value: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct KeySpec {
    /// Tried in order; the first whose sources are all present is the key.
    pub alternatives: Vec<KeyAlternative>,
    pub when_missing: WhenMissing,
}

#[derive(Debug, Clone, PartialEq)]
pub struct KeyAlternative {
    /// As written in the config (`header:x-api-key+path`): names the key's kind.
    pub label: String,
    pub sources: Vec<KeySource>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum KeySource {
    /// A request header (lower-case name).
    Header(String),
    ClientIp,
    Route,
    Method,
    /// The path without its query string.
    Path,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub name: String,
    pub algorithm: Algorithm,
    /// Requests (cost units) per window.
    pub limit: u64,
    pub window: Duration,
    /// Token bucket and GCRA: the most that can be spent at once (default: `limit`).
    pub burst: u64,
}

impl Limit {
    /// The quota a client sees in headers: the burst for buckets, the limit for windows.
    pub fn quota(&self) -> u64 {
        if self.algorithm.has_burst() {
            self.burst
        } else {
            self.limit
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Cost {
    Fixed(u64),
    /// Taken from a request header, which must hold an integer in `min..=max`; absent: `default`.
    Header {
        name: String,
        min: u64,
        max: u64,
        default: u64,
    },
}

/// A configuration error: the field (`rules[0].name`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

fn invalid(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_string(),
        message: message.into(),
    }
}

// ---- serde layer: the JSON as written, with defaults ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    bridge: RawBridge,
    #[serde(default = "default_failure_mode")]
    failure_mode: FailureMode,
    #[serde(default)]
    shadow: bool,
    #[serde(default)]
    clock: Clock,
    #[serde(default = "default_key_prefix")]
    key_prefix: String,
    #[serde(default = "default_true")]
    hash_identities: bool,
    #[serde(default)]
    xff_trusted_hops: u8,
    #[serde(default = "default_ipv4_prefix")]
    ipv4_prefix: u8,
    #[serde(default = "default_ipv6_prefix")]
    ipv6_prefix: u8,
    #[serde(default)]
    headers: HeaderMode,
    #[serde(default)]
    deny_body: DenyBody,
    #[serde(default)]
    batch: RawBatch,
    /// `false`, `true`, or `{"max_entries": N}`.
    deny_cache: Option<Value>,
    /// `false`, `true`, or `{"failures": N, "stall": "25ms", "probe_interval": "500ms"}`.
    breaker: Option<Value>,
    #[serde(default = "default_local_share")]
    local_share: f64,
    rules: Vec<RawRule>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBatch {
    max_requests: Option<u64>,
    max_in_flight: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    failures: Option<u64>,
    stall: Option<String>,
    probe_interval: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDenyCache {
    max_entries: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBridge {
    cluster: Option<String>,
    authority: Option<String>,
    username: Option<String>,
    password: Option<String>,
    timeout: Option<String>,
    clock_skew: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: String,
    #[serde(rename = "match", default)]
    matcher: RawMatch,
    #[serde(default)]
    key: RawKey,
    limits: Vec<RawLimit>,
    cost: Option<Value>,
    failure_mode: Option<FailureMode>,
    timeout: Option<String>,
    #[serde(default)]
    shadow: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatch {
    path_exact: Option<String>,
    path_prefix: Option<String>,
    methods: Option<Vec<String>>,
    header: Option<RawHeaderMatch>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeaderMatch {
    name: String,
    value: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    #[serde(default = "default_key_from")]
    from: Vec<String>,
    #[serde(default)]
    when_missing: WhenMissing,
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
struct RawLimit {
    name: String,
    #[serde(default)]
    algorithm: Algorithm,
    limit: u64,
    window: String,
    burst: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCostHeader {
    header: String,
    min: Option<u64>,
    max: Option<u64>,
    default: Option<u64>,
}

fn default_local_share() -> f64 {
    0.125
}
fn default_failure_mode() -> FailureMode {
    FailureMode::Open
}
fn default_key_prefix() -> String {
    "rl:".to_string()
}
fn default_true() -> bool {
    true
}
fn default_ipv4_prefix() -> u8 {
    32
}
fn default_ipv6_prefix() -> u8 {
    64
}
fn default_key_from() -> Vec<String> {
    vec!["header:x-api-key".to_string(), "client_ip".to_string()]
}

const DEFAULT_CLUSTER: &str = "webdis";
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(150);
const MAX_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_XFF_HOPS: u8 = 10;

/// Reads an optional duration field, naming the field when the text is not a duration.
fn duration_field(
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

fn timeout_field(
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

// ---- validation layer ----

impl Config {
    /// Parses and validates the filter's JSON configuration.
    pub fn parse(json: &[u8]) -> Result<Config, ConfigError> {
        // Before parsing: every worker VM parses the configuration.
        if json.len() > MAX_CONFIG_BYTES {
            return Err(invalid(
                "",
                format!(
                    "the configuration is {} bytes: must be at most {MAX_CONFIG_BYTES}",
                    json.len()
                ),
            ));
        }
        // serde would also read a struct from a JSON array, with a confusing message.
        if json
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b != b'{')
        {
            return Err(invalid("", "the configuration must be a JSON object"));
        }
        let raw: RawConfig = serde_json::from_slice(json).map_err(|e| serde_error(json, &e))?;
        raw.validate()
    }
}

impl RawConfig {
    fn validate(self) -> Result<Config, ConfigError> {
        let (bridge, default_timeout, clock_skew) = self.bridge.validate()?;
        if self.key_prefix.is_empty()
            || self.key_prefix.len() > 64
            || !self
                .key_prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
        {
            return Err(invalid(
                "key_prefix",
                "must be 1 to 64 printable ASCII characters without spaces or braces",
            ));
        }
        if self.xff_trusted_hops > MAX_XFF_HOPS {
            return Err(invalid("xff_trusted_hops", "must be between 0 and 10"));
        }
        if !(1..=32).contains(&self.ipv4_prefix) {
            return Err(invalid("ipv4_prefix", "must be between 1 and 32"));
        }
        if !(1..=128).contains(&self.ipv6_prefix) {
            return Err(invalid("ipv6_prefix", "must be between 1 and 128"));
        }
        if self.rules.is_empty() {
            return Err(invalid("rules", "must hold at least one rule"));
        }
        if self.rules.len() > MAX_RULES {
            return Err(invalid(
                "rules",
                format!("must hold at most {MAX_RULES} rules"),
            ));
        }
        let mut names = HashSet::new();
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, raw) in self.rules.into_iter().enumerate() {
            let field = format!("rules[{i}]");
            if !names.insert(raw.name.clone()) {
                return Err(invalid(
                    &format!("{field}.name"),
                    format!("duplicate rule name \"{}\"", raw.name),
                ));
            }
            let defaults = RuleDefaults {
                failure_mode: self.failure_mode,
                timeout: default_timeout,
                shadow: self.shadow,
            };
            rules.push(raw.validate(&field, &defaults)?);
        }
        let config = Config {
            bridge,
            clock: self.clock,
            key_prefix: self.key_prefix,
            hash_identities: self.hash_identities,
            client_ip: ClientIpPolicy {
                xff_trusted_hops: usize::from(self.xff_trusted_hops),
                ipv4_prefix: self.ipv4_prefix,
                ipv6_prefix: self.ipv6_prefix,
            },
            headers: self.headers,
            deny_body: self.deny_body,
            rules,
            batch: self.batch.validate()?,
            breaker: validate_breaker(self.breaker)?,
            local_share: if self.local_share > 0.0 && self.local_share <= 1.0 {
                self.local_share
            } else {
                return Err(invalid(
                    "local_share",
                    "must be a number above 0, at most 1",
                ));
            },
            clock_skew,
            deny_cache_entries: validate_deny_cache(self.deny_cache)?,
            script_sha: sha1_hex(crate::DECISION_LUA.as_bytes()),
        };
        check_request_bounds(&config)?;
        Ok(config)
    }
}

impl RawBridge {
    fn validate(self) -> Result<(Bridge, Duration, Duration), ConfigError> {
        // These go into every call's headers, which share Webdis's request size with the path.
        for (name, value) in [
            ("bridge.authority", &self.authority),
            ("bridge.username", &self.username),
            ("bridge.password", &self.password),
        ] {
            if value
                .as_ref()
                .is_some_and(|v| v.len() > MAX_BRIDGE_FIELD_BYTES)
            {
                return Err(invalid(
                    name,
                    format!("must be at most {MAX_BRIDGE_FIELD_BYTES} bytes"),
                ));
            }
        }
        let cluster = self.cluster.unwrap_or_else(|| DEFAULT_CLUSTER.to_string());
        if cluster.is_empty() {
            return Err(invalid("bridge.cluster", "must not be empty"));
        }
        let authority = self.authority.unwrap_or_else(|| cluster.clone());
        if authority.is_empty() || !authority.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "bridge.authority",
                "must be a host name, printable ASCII without spaces",
            ));
        }
        let authorization = match (self.username, self.password) {
            (None, None) => None,
            (Some(user), Some(password)) => {
                if user.is_empty() || user.contains(':') {
                    return Err(invalid(
                        "bridge.username",
                        "must be non-empty and must not contain ':'",
                    ));
                }
                Some(format!(
                    "Basic {}",
                    base64(format!("{user}:{password}").as_bytes())
                ))
            }
            (Some(_), None) => {
                return Err(invalid(
                    "bridge.password",
                    "is required with bridge.username",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "bridge.username",
                    "is required with bridge.password",
                ))
            }
        };
        let timeout = timeout_field(self.timeout.as_deref(), "bridge.timeout", DEFAULT_TIMEOUT)?;
        let skew = timeout_field(
            self.clock_skew.as_deref(),
            "bridge.clock_skew",
            DEFAULT_CLOCK_SKEW,
        )?;
        Ok((
            Bridge {
                cluster,
                authority,
                authorization,
            },
            timeout,
            skew,
        ))
    }
}

impl RawBatch {
    fn validate(self) -> Result<Batch, ConfigError> {
        let default = Batch::default();
        let bounded = |value: Option<u64>, default: usize, max: u64, field: &str| match value {
            None => Ok(default),
            Some(n) if (1..=max).contains(&n) => Ok(n as usize),
            Some(_) => Err(invalid(field, format!("must be between 1 and {max}"))),
        };
        Ok(Batch {
            max_requests: bounded(
                self.max_requests,
                default.max_requests,
                MAX_BATCH_REQUESTS,
                "batch.max_requests",
            )?,
            max_in_flight: bounded(
                self.max_in_flight,
                default.max_in_flight,
                MAX_IN_FLIGHT,
                "batch.max_in_flight",
            )?,
        })
    }
}

fn validate_breaker(value: Option<Value>) -> Result<Option<Breaker>, ConfigError> {
    let raw = match value {
        None | Some(Value::Bool(true)) => return Ok(Some(Breaker::default())),
        Some(Value::Bool(false)) => return Ok(None),
        Some(value @ Value::Object(_)) => serde_json::from_value::<RawBreaker>(value)
            .map_err(|e| invalid("breaker", e.to_string()))?,
        Some(_) => {
            return Err(invalid(
                "breaker",
                "must be true, false or {\"failures\": N, \"stall\": D, \"probe_interval\": D}",
            ))
        }
    };
    let default = Breaker::default();
    let failures = match raw.failures {
        None => default.failures,
        Some(n) if (1..=MAX_BREAKER_FAILURES).contains(&n) => n as u32,
        Some(_) => return Err(invalid("breaker.failures", "must be between 1 and 1000")),
    };
    Ok(Some(Breaker {
        failures,
        stall: timeout_field(raw.stall.as_deref(), "breaker.stall", default.stall)?,
        probe_interval: timeout_field(
            raw.probe_interval.as_deref(),
            "breaker.probe_interval",
            default.probe_interval,
        )?,
    }))
}

fn validate_deny_cache(value: Option<Value>) -> Result<usize, ConfigError> {
    let raw = match value {
        None | Some(Value::Bool(true)) => return Ok(DEFAULT_DENY_CACHE_ENTRIES),
        Some(Value::Bool(false)) => return Ok(0),
        Some(value @ Value::Object(_)) => serde_json::from_value::<RawDenyCache>(value)
            .map_err(|e| invalid("deny_cache", e.to_string()))?,
        Some(_) => {
            return Err(invalid(
                "deny_cache",
                "must be true, false or {\"max_entries\": N}",
            ))
        }
    };
    match raw.max_entries {
        None => Ok(DEFAULT_DENY_CACHE_ENTRIES),
        Some(n) if n <= MAX_DENY_CACHE_ENTRIES => Ok(n as usize),
        Some(_) => Err(invalid(
            "deny_cache.max_entries",
            "must be between 0 and 1000000",
        )),
    }
}

struct RuleDefaults {
    failure_mode: FailureMode,
    timeout: Duration,
    shadow: bool,
}

/// Rule and limit names end up in Redis keys and header values: keep them plain.
fn check_name(name: &str, field: &str) -> Result<(), ConfigError> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    if name.is_empty() || name.len() > 64 || !name.bytes().all(plain) {
        return Err(invalid(
            field,
            "must be 1 to 64 letters, digits, '-' or '_'",
        ));
    }
    Ok(())
}

fn check_header_name(name: &str, field: &str) -> Result<String, ConfigError> {
    if name.is_empty() || !name.bytes().all(is_token_byte) {
        return Err(invalid(
            field,
            "must be a header name (letters, digits and !#$%&'*+-.^_`|~)",
        ));
    }
    Ok(name.to_ascii_lowercase())
}

impl RawRule {
    fn validate(self, field: &str, defaults: &RuleDefaults) -> Result<Rule, ConfigError> {
        check_name(&self.name, &format!("{field}.name"))?;
        let matcher = self.matcher.validate(&format!("{field}.match"))?;
        let key = self.key.validate(&format!("{field}.key"))?;
        if self.limits.is_empty() {
            return Err(invalid(
                &format!("{field}.limits"),
                "must hold at least one limit",
            ));
        }
        if self.limits.len() > MAX_LIMITS_PER_RULE {
            return Err(invalid(
                &format!("{field}.limits"),
                format!("must hold at most {MAX_LIMITS_PER_RULE} limits"),
            ));
        }
        let mut names = HashSet::new();
        let mut limits = Vec::with_capacity(self.limits.len());
        for (j, raw) in self.limits.into_iter().enumerate() {
            let limit_field = format!("{field}.limits[{j}]");
            if !names.insert(raw.name.clone()) {
                return Err(invalid(
                    &format!("{limit_field}.name"),
                    format!("duplicate limit name \"{}\" in this rule", raw.name),
                ));
            }
            limits.push(raw.validate(&limit_field)?);
        }
        let cost = validate_cost(self.cost, &format!("{field}.cost"))?;
        let timeout = timeout_field(
            self.timeout.as_deref(),
            &format!("{field}.timeout"),
            defaults.timeout,
        )?;
        Ok(Rule {
            name: self.name,
            matcher,
            key,
            limits,
            cost,
            failure_mode: self.failure_mode.unwrap_or(defaults.failure_mode),
            timeout,
            shadow: self.shadow || defaults.shadow,
        })
    }
}

impl RawMatch {
    fn validate(self, field: &str) -> Result<Match, ConfigError> {
        let path = match (self.path_exact, self.path_prefix) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    field,
                    "path_exact and path_prefix exclude each other",
                ))
            }
            (Some(p), None) => Some((PathMatch::Exact(p.clone()), p, "path_exact")),
            (None, Some(p)) => Some((PathMatch::Prefix(p.clone()), p, "path_prefix")),
            (None, None) => None,
        };
        if let Some((_, text, name)) = &path {
            if !text.starts_with('/') {
                return Err(invalid(&format!("{field}.{name}"), "must start with '/'"));
            }
        }
        let methods = match self.methods {
            None => Vec::new(),
            Some(methods) if methods.is_empty() => {
                return Err(invalid(
                    &format!("{field}.methods"),
                    "must not be empty (leave it out to match any method)",
                ))
            }
            Some(methods) => {
                let mut upper = Vec::with_capacity(methods.len());
                for (k, m) in methods.iter().enumerate() {
                    if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic()) {
                        return Err(invalid(
                            &format!("{field}.methods[{k}]"),
                            "must be an HTTP method such as GET",
                        ));
                    }
                    upper.push(m.to_ascii_uppercase());
                }
                upper
            }
        };
        let header = match self.header {
            None => None,
            Some(h) => Some(HeaderMatch {
                name: check_header_name(&h.name, &format!("{field}.header.name"))?,
                value: h.value,
            }),
        };
        Ok(Match {
            path: path.map(|(p, _, _)| p),
            methods,
            header,
        })
    }
}

impl RawKey {
    fn validate(self, field: &str) -> Result<KeySpec, ConfigError> {
        if self.from.is_empty() {
            return Err(invalid(
                &format!("{field}.from"),
                "must name at least one key source",
            ));
        }
        let mut alternatives = Vec::with_capacity(self.from.len());
        for (k, text) in self.from.iter().enumerate() {
            let entry_field = format!("{field}.from[{k}]");
            // The entry is the label in every key of the rule.
            if text.len() > MAX_KEY_SOURCE_BYTES {
                return Err(invalid(
                    &entry_field,
                    format!("must be at most {MAX_KEY_SOURCE_BYTES} characters"),
                ));
            }
            let mut sources = Vec::new();
            for part in text.split('+') {
                let source = match part {
                    "client_ip" => KeySource::ClientIp,
                    "route" => KeySource::Route,
                    "method" => KeySource::Method,
                    "path" => KeySource::Path,
                    _ => match part.strip_prefix("header:") {
                        Some(name) => KeySource::Header(check_header_name(name, &entry_field)?),
                        None => {
                            return Err(invalid(
                                &entry_field,
                                format!("unknown key source \"{part}\": expected header:NAME, client_ip, route, method or path, joined with '+'"),
                            ))
                        }
                    },
                };
                sources.push(source);
            }
            alternatives.push(KeyAlternative {
                label: text.to_ascii_lowercase(),
                sources,
            });
        }
        Ok(KeySpec {
            alternatives,
            when_missing: self.when_missing,
        })
    }
}

impl RawLimit {
    fn validate(self, field: &str) -> Result<Limit, ConfigError> {
        check_name(&self.name, &format!("{field}.name"))?;
        let limit_field = format!("{field}.limit");
        if self.limit < 1 {
            return Err(invalid(&limit_field, "must be >= 1"));
        }
        if self.limit > MAX_LIMIT {
            return Err(invalid(
                &limit_field,
                format!("must be at most {MAX_LIMIT}"),
            ));
        }
        if self.algorithm == Algorithm::SlidingWindowLog && self.limit > MAX_LOG_LIMIT {
            return Err(invalid(
                &limit_field,
                format!(
                    "sliding_window_log keeps one entry per unit: must be at most {MAX_LOG_LIMIT}"
                ),
            ));
        }
        let window_field = format!("{field}.window");
        let window = duration_field(Some(&self.window), &window_field, Duration::ZERO)?;
        if window.is_zero() {
            return Err(invalid(&window_field, "must be > 0"));
        }
        if window > MAX_WINDOW {
            return Err(invalid(
                &window_field,
                format!("must be at most {}", show_duration(MAX_WINDOW)),
            ));
        }
        let burst = match self.burst {
            None => self.limit,
            Some(_) if !self.algorithm.has_burst() => {
                return Err(invalid(
                    &format!("{field}.burst"),
                    format!(
                        "{} has no burst: only token_bucket and gcra do",
                        self.algorithm.name()
                    ),
                ))
            }
            Some(0) => return Err(invalid(&format!("{field}.burst"), "must be >= 1")),
            Some(burst) if burst > MAX_LIMIT => {
                return Err(invalid(
                    &format!("{field}.burst"),
                    format!("must be at most {MAX_LIMIT}"),
                ))
            }
            Some(burst) => burst,
        };
        // Only a burst above the limit can make a bucket outlive the longest window.
        if state_lifetime_ms(self.algorithm, self.limit, window, burst)
            > MAX_STATE_LIFETIME.as_millis()
        {
            return Err(invalid(
                &format!("{field}.burst"),
                format!(
                    "the state would live burst / limit × window, longer than {}: lower burst or window",
                    show_duration(MAX_STATE_LIFETIME)
                ),
            ));
        }
        Ok(Limit {
            name: self.name,
            algorithm: self.algorithm,
            limit: self.limit,
            window,
            burst,
        })
    }
}

/// Largest cost of one request (fixed, or a cost header's `max`).
pub const MAX_COST: u64 = 1_000_000;

fn validate_cost(value: Option<Value>, field: &str) -> Result<Cost, ConfigError> {
    let value = match value {
        None => return Ok(Cost::Fixed(1)),
        Some(value) => value,
    };
    if let Some(n) = value.as_u64() {
        if !(1..=MAX_COST).contains(&n) {
            return Err(invalid(field, "must be between 1 and 1000000"));
        }
        return Ok(Cost::Fixed(n));
    }
    if !value.is_object() {
        return Err(invalid(
            field,
            "must be a whole number or {\"header\": NAME, \"min\": N, \"max\": N}",
        ));
    }
    let raw: RawCostHeader =
        serde_json::from_value(value).map_err(|e| invalid(field, e.to_string()))?;
    let name = check_header_name(&raw.header, &format!("{field}.header"))?;
    let (Some(min), Some(max)) = (raw.min, raw.max) else {
        return Err(invalid(
            field,
            "a cost taken from a header needs both min and max",
        ));
    };
    if min > max || max > MAX_COST {
        return Err(invalid(field, "needs min <= max <= 1000000"));
    }
    let default = raw.default.unwrap_or(min);
    if !(min..=max).contains(&default) {
        return Err(invalid(
            &format!("{field}.default"),
            "must be between min and max",
        ));
    }
    Ok(Cost::Header {
        name,
        min,
        max,
        default,
    })
}

/// RFC 9110 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Turns a serde_json error into one that names the field, found from the error's position.
fn serde_error(json: &[u8], error: &serde_json::Error) -> ConfigError {
    let full = error.to_string();
    let message = match full.rfind(" at line ") {
        Some(i) => full[..i].to_string(),
        None => full,
    };
    let offset = byte_offset(json, error.line(), error.column());
    let path = json_path_at(&json[..offset.min(json.len())]);
    // serde reports a missing field at the end of its object: name the field itself.
    if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.trim_end_matches('`');
        let field = if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        };
        return invalid(&field, "is required");
    }
    ConfigError {
        field: path,
        message,
    }
}

/// Byte offset of serde_json's 1-based line and column (the column counts bytes).
fn byte_offset(json: &[u8], line: usize, column: usize) -> usize {
    let mut line_start = 0;
    for _ in 1..line {
        match json[line_start..].iter().position(|&b| b == b'\n') {
            Some(i) => line_start += i + 1,
            None => break,
        }
    }
    line_start + column
}

/// The JSON path (`limit.rate`, `rules[2].name`) of the innermost value open at the end of
/// `prefix`, a prefix of a JSON document.
fn json_path_at(prefix: &[u8]) -> String {
    enum Frame {
        Object { key: Option<String>, want_key: bool },
        Array { index: usize },
    }
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while i < prefix.len() {
        match prefix[i] {
            b'"' => {
                let mut text = Vec::new();
                i += 1;
                while i < prefix.len() && prefix[i] != b'"' {
                    if prefix[i] == b'\\' {
                        i += 1;
                    }
                    if let Some(&b) = prefix.get(i) {
                        text.push(b);
                    }
                    i += 1;
                }
                if let Some(Frame::Object { key, want_key }) = stack.last_mut() {
                    if *want_key {
                        *key = Some(String::from_utf8_lossy(&text).into_owned());
                        *want_key = false;
                    }
                }
            }
            b'{' => stack.push(Frame::Object {
                key: None,
                want_key: true,
            }),
            b'[' => stack.push(Frame::Array { index: 0 }),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Object { want_key, .. }) => *want_key = true,
                Some(Frame::Array { index }) => *index += 1,
                None => {}
            },
            _ => {}
        }
        i += 1;
    }
    let mut path = String::new();
    for frame in &stack {
        match frame {
            Frame::Object { key: Some(k), .. } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
            }
            Frame::Object { key: None, .. } => {}
            Frame::Array { index } => path.push_str(&format!("[{index}]")),
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const MINIMAL: &str = r#"{"rules": [{"name": "all", "limits": [{"name": "per_minute", "limit": 10, "window": "1m"}]}]}"#;

    #[test]
    fn minimal_config_takes_documented_defaults() {
        let c = Config::parse(MINIMAL.as_bytes()).unwrap();
        assert_eq!(c.bridge.cluster, "webdis");
        assert_eq!(c.bridge.authority, "webdis");
        assert_eq!(c.bridge.authorization, None);
        assert_eq!(c.clock, Clock::Proxy);
        assert_eq!(c.key_prefix, "rl:");
        assert!(c.hash_identities);
        assert_eq!(
            c.client_ip,
            ClientIpPolicy {
                xff_trusted_hops: 0,
                ipv4_prefix: 32,
                ipv6_prefix: 64
            }
        );
        assert_eq!(c.headers, HeaderMode::XRateLimit);
        assert_eq!(c.deny_body, DenyBody::Text);
        assert_eq!(
            c.batch,
            Batch {
                max_requests: 64,
                max_in_flight: 1
            }
        );
        assert_eq!(c.deny_cache_entries, 10_000);
        let rule = &c.rules[0];
        assert_eq!(rule.matcher, Match::default());
        assert_eq!(
            rule.key.alternatives,
            vec![
                KeyAlternative {
                    label: "header:x-api-key".into(),
                    sources: vec![KeySource::Header("x-api-key".into())]
                },
                KeyAlternative {
                    label: "client_ip".into(),
                    sources: vec![KeySource::ClientIp]
                },
            ]
        );
        assert_eq!(rule.key.when_missing, WhenMissing::Anonymous);
        assert_eq!(rule.cost, Cost::Fixed(1));
        assert_eq!(rule.failure_mode, FailureMode::Open);
        assert_eq!(rule.timeout, Duration::from_millis(150));
        assert!(!rule.shadow);
        assert_eq!(
            rule.limits,
            vec![Limit {
                name: "per_minute".into(),
                algorithm: Algorithm::TokenBucket,
                limit: 10,
                window: Duration::from_secs(60),
                burst: 10
            }]
        );
        assert_eq!(c.script_sha.len(), 40);
    }

    #[test]
    fn full_config_is_read() {
        let c = Config::parse(
            br#"{
              "bridge": {"cluster": "bridge", "authority": "webdis.local", "username": "ratelimit",
                         "password": "secret", "timeout": "2s"},
              "failure_mode": "closed", "shadow": true, "clock": "redis", "key_prefix": "limits:",
              "hash_identities": false, "xff_trusted_hops": 1, "ipv4_prefix": 24, "ipv6_prefix": 48,
              "headers": "both", "deny_body": "problem+json",
              "rules": [{
                "name": "login",
                "match": {"path_exact": "/login", "methods": ["post"], "header": {"name": "X-Tier", "value": "free"}},
                "key": {"from": ["header:X-User+route", "client_ip"], "when_missing": "skip"},
                "limits": [{"name": "burst", "algorithm": "gcra", "limit": 5, "window": "1s", "burst": 10},
                           {"name": "daily", "algorithm": "sliding_window_log", "limit": 100, "window": "1d"}],
                "cost": {"header": "X-Cost", "min": 1, "max": 50, "default": 2},
                "failure_mode": "open", "timeout": "80ms", "shadow": false
              }]
            }"#,
        )
        .unwrap();
        assert_eq!(c.bridge.authority, "webdis.local");
        assert_eq!(
            c.bridge.authorization.as_deref(),
            Some("Basic cmF0ZWxpbWl0OnNlY3JldA==")
        );
        assert_eq!(c.clock, Clock::Redis);
        assert_eq!(c.client_ip.xff_trusted_hops, 1);
        assert_eq!(c.headers, HeaderMode::Both);
        assert_eq!(c.deny_body, DenyBody::ProblemJson);
        let r = &c.rules[0];
        assert_eq!(r.matcher.path, Some(PathMatch::Exact("/login".into())));
        assert_eq!(r.matcher.methods, vec!["POST".to_string()]);
        assert_eq!(
            r.matcher.header,
            Some(HeaderMatch {
                name: "x-tier".into(),
                value: Some("free".into())
            })
        );
        assert_eq!(
            r.key.alternatives[0].sources,
            vec![KeySource::Header("x-user".into()), KeySource::Route]
        );
        assert_eq!(r.key.when_missing, WhenMissing::Skip);
        assert_eq!(r.limits[0].burst, 10);
        assert_eq!(r.limits[0].quota(), 10);
        assert_eq!(r.limits[1].quota(), 100);
        assert_eq!(
            r.cost,
            Cost::Header {
                name: "x-cost".into(),
                min: 1,
                max: 50,
                default: 2
            }
        );
        assert_eq!(r.failure_mode, FailureMode::Open);
        assert_eq!(r.timeout, Duration::from_millis(80));
        assert!(r.shadow, "global shadow applies to every rule");
    }

    #[test]
    fn durations() {
        let cases = [
            ("150ms", Some(Duration::from_millis(150))),
            ("30s", Some(Duration::from_secs(30))),
            ("5m", Some(Duration::from_secs(300))),
            ("1h", Some(Duration::from_secs(3600))),
            ("1d", Some(Duration::from_secs(86400))),
            ("0s", Some(Duration::ZERO)),
            ("150", None),
            ("ms", None),
            ("1.5s", None),
            ("-1s", None),
            ("1 s", None),
            ("1w", None),
            ("99999999999999999999d", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), want, "{text}");
        }
    }

    /// Wraps one rule's JSON in a config.
    fn with_rule(rule: &str) -> String {
        format!(r#"{{"rules": [{rule}]}}"#)
    }

    const LIMIT: &str = r#"{"name": "l", "limit": 1, "window": "1s"}"#;

    /// One bad config per case, with the exact message the operator sees.
    #[test]
    fn batch_and_deny_cache_settings() {
        let with = |extra: &str| {
            let json = format!(r#"{{"rules": [{{"name": "r", "limits": [{LIMIT}]}}], {extra}}}"#);
            Config::parse(json.as_bytes()).unwrap()
        };
        let c = with(r#""batch": {"max_requests": 256, "max_in_flight": 8}, "deny_cache": false"#);
        assert_eq!((c.batch.max_requests, c.batch.max_in_flight), (256, 8));
        assert_eq!(c.deny_cache_entries, 0);
        assert_eq!(with(r#""deny_cache": true"#).deny_cache_entries, 10_000);
        assert_eq!(with(r#""deny_cache": {}"#).deny_cache_entries, 10_000);
        let c = with(r#""deny_cache": {"max_entries": 0}, "batch": {"max_requests": 1}"#);
        assert_eq!((c.deny_cache_entries, c.batch.max_requests), (0, 1));
        assert_eq!(
            with(r#""deny_cache": {"max_entries": 1000000}"#).deny_cache_entries,
            1_000_000
        );
    }

    #[test]
    fn bad_configs_name_the_field() {
        let rule =
            |extra: &str| with_rule(&format!(r#"{{"name": "r", "limits": [{LIMIT}]{extra}}}"#));
        let limit = |fields: &str| {
            with_rule(&format!(
                r#"{{"name": "r", "limits": [{{"name": "l", {fields}}}]}}"#
            ))
        };
        let top =
            |extra: &str| format!(r#"{{"rules": [{{"name": "r", "limits": [{LIMIT}]}}]{extra}}}"#);
        let cases: Vec<(String, &str)> = vec![
            ("".into(), "EOF while parsing a value"),
            ("[]".into(), "the configuration must be a JSON object"),
            ("{}".into(), "rules: is required"),
            (r#"{"rules": []}"#.into(), "rules: must hold at least one rule"),
            (top(r#", "colour": "red""#), "colour: unknown field `colour`, expected one of `bridge`, `failure_mode`, `shadow`, `clock`, `key_prefix`, `hash_identities`, `xff_trusted_hops`, `ipv4_prefix`, `ipv6_prefix`, `headers`, `deny_body`, `batch`, `deny_cache`, `breaker`, `local_share`, `rules`"),
            (top(r#", "local_share": 0"#), "local_share: must be a number above 0, at most 1"),
            (top(r#", "local_share": 1.5"#), "local_share: must be a number above 0, at most 1"),
            (top(r#", "local_share": "1/8""#), "local_share: invalid type: string \"1/8\", expected f64"),
            (top(r#", "breaker": {"failures": 0}"#), "breaker.failures: must be between 1 and 1000"),
            (top(r#", "breaker": {"stall": "0ms"}"#), "breaker.stall: must be between 1ms and 60s"),
            (top(r#", "breaker": {"probe_interval": "soon"}"#), "breaker.probe_interval: invalid duration \"soon\": expected a whole number and a unit (ms, s, m, h, d), like \"150ms\""),
            (top(r#", "breaker": {"trips": 1}"#), "breaker: unknown field `trips`, expected one of `failures`, `stall`, `probe_interval`"),
            (top(r#", "bridge": {"clock_skew": "2m"}"#), "bridge.clock_skew: must be between 1ms and 60s"),
            (top(r#", "batch": {"max_requests": 0}"#), "batch.max_requests: must be between 1 and 256"),
            (top(r#", "batch": {"max_requests": 257}"#), "batch.max_requests: must be between 1 and 256"),
            (top(r#", "batch": {"max_in_flight": 9}"#), "batch.max_in_flight: must be between 1 and 8"),
            (top(r#", "batch": {"max_in_flight": -1}"#), "batch.max_in_flight: invalid value: integer `-1`, expected u64"),
            (top(r#", "batch": {"size": 3}"#), "batch.size: unknown field `size`, expected `max_requests` or `max_in_flight`"),
            (top(r#", "deny_cache": {"max_entries": 1000001}"#), "deny_cache.max_entries: must be between 0 and 1000000"),
            (top(r#", "deny_cache": {"entries": 5}"#), "deny_cache: unknown field `entries`, expected `max_entries`"),
            (top(r#", "deny_cache": "on""#), "deny_cache: must be true, false or {\"max_entries\": N}"),
            (top(r#", "failure_mode": "sometimes""#), "failure_mode: unknown variant `sometimes`, expected one of `open`, `closed`, `local`"),
            (top(r#", "clock": "ntp""#), "clock: unknown variant `ntp`, expected `proxy` or `redis`"),
            (top(r#", "headers": "all""#), "headers: unknown variant `all`, expected one of `x-ratelimit`, `ietf`, `both`, `none`"),
            (top(r#", "deny_body": "html""#), "deny_body: unknown variant `html`, expected `text` or `problem+json`"),
            (top(r#", "hash_identities": "yes""#), "hash_identities: invalid type: string \"yes\", expected a boolean"),
            (top(r#", "key_prefix": """#), "key_prefix: must be 1 to 64 printable ASCII characters without spaces or braces"),
            (top(r#", "key_prefix": "rl{""#), "key_prefix: must be 1 to 64 printable ASCII characters without spaces or braces"),
            (top(r#", "xff_trusted_hops": 11"#), "xff_trusted_hops: must be between 0 and 10"),
            (top(r#", "xff_trusted_hops": -1"#), "xff_trusted_hops: invalid value: integer `-1`, expected u8"),
            (top(r#", "ipv6_prefix": 0"#), "ipv6_prefix: must be between 1 and 128"),
            (top(r#", "ipv4_prefix": 33"#), "ipv4_prefix: must be between 1 and 32"),
            (top(r#", "bridge": {"clustr": "x"}"#), "bridge.clustr: unknown field `clustr`, expected one of `cluster`, `authority`, `username`, `password`, `timeout`, `clock_skew`"),
            (top(r#", "bridge": {"cluster": ""}"#), "bridge.cluster: must not be empty"),
            (top(r#", "bridge": {"timeout": "0ms"}"#), "bridge.timeout: must be between 1ms and 60s"),
            (top(r#", "bridge": {"timeout": "2m"}"#), "bridge.timeout: must be between 1ms and 60s"),
            (top(r#", "bridge": {"timeout": 150}"#), "bridge.timeout: invalid type: integer `150`, expected a string"),
            (top(r#", "bridge": {"timeout": "soon"}"#), "bridge.timeout: invalid duration \"soon\": expected a whole number and a unit (ms, s, m, h, d), like \"150ms\""),
            (top(r#", "bridge": {"username": "u"}"#), "bridge.password: is required with bridge.username"),
            (top(r#", "bridge": {"password": "p"}"#), "bridge.username: is required with bridge.password"),
            (top(r#", "bridge": {"username": "a:b", "password": "p"}"#), "bridge.username: must be non-empty and must not contain ':'"),
            (top(r#", "bridge": {"authority": "a b"}"#), "bridge.authority: must be a host name, printable ASCII without spaces"),
            (with_rule(&format!(r#"{{"limits": [{LIMIT}]}}"#)), "rules[0].name: is required"),
            (with_rule(&format!(r#"{{"name": "a b", "limits": [{LIMIT}]}}"#)), "rules[0].name: must be 1 to 64 letters, digits, '-' or '_'"),
            (format!(r#"{{"rules": [{{"name": "r", "limits": [{LIMIT}]}}, {{"name": "r", "limits": [{LIMIT}]}}]}}"#), "rules[1].name: duplicate rule name \"r\""),
            (with_rule(r#"{"name": "r", "limits": []}"#), "rules[0].limits: must hold at least one limit"),
            (with_rule(r#"{"name": "r"}"#), "rules[0].limits: is required"),
            (rule(r#", "limit": 5"#), "rules[0].limit: unknown field `limit`, expected one of `name`, `match`, `key`, `limits`, `cost`, `failure_mode`, `timeout`, `shadow`"),
            (rule(r#", "timeout": "0s""#), "rules[0].timeout: must be between 1ms and 60s"),
            (rule(r#", "failure_mode": "half""#), "rules[0].failure_mode: unknown variant `half`, expected one of `open`, `closed`, `local`"),
            (limit(r#""window": "1s""#), "rules[0].limits[0].limit: is required"),
            (limit(r#""limit": 0, "window": "1s""#), "rules[0].limits[0].limit: must be >= 1"),
            (limit(r#""limit": -3, "window": "1s""#), "rules[0].limits[0].limit: invalid value: integer `-3`, expected u64"),
            (limit(r#""limit": 1.5, "window": "1s""#), "rules[0].limits[0].limit: invalid type: floating point `1.5`, expected u64"),
            (limit(r#""limit": 1"#), "rules[0].limits[0].window: is required"),
            (limit(r#""limit": 1, "window": "0s""#), "rules[0].limits[0].window: must be > 0"),
            (limit(r#""limit": 1, "window": "1y""#), "rules[0].limits[0].window: invalid duration \"1y\": expected a whole number and a unit (ms, s, m, h, d), like \"150ms\""),
            (limit(r#""limit": 1, "window": "1s", "algorithm": "leaky""#), "rules[0].limits[0].algorithm: unknown variant `leaky`, expected one of `token_bucket`, `gcra`, `sliding_window_counter`, `sliding_window_log`, `fixed_window`"),
            (limit(r#""limit": 1, "window": "1s", "algorithm": "fixed_window", "burst": 5"#), "rules[0].limits[0].burst: fixed_window has no burst: only token_bucket and gcra do"),
            (limit(r#""limit": 1, "window": "1s", "burst": 0"#), "rules[0].limits[0].burst: must be >= 1"),
            (limit(r#""limit": 1, "window": "1s", "rate": 5"#), "rules[0].limits[0].rate: unknown field `rate`, expected one of `name`, `algorithm`, `limit`, `window`, `burst`"),
            (with_rule(&format!(r#"{{"name": "r", "limits": [{LIMIT}, {LIMIT}]}}"#)), "rules[0].limits[1].name: duplicate limit name \"l\" in this rule"),
            (rule(r#", "key": {"from": []}"#), "rules[0].key.from: must name at least one key source"),
            (rule(r#", "key": {"from": ["cookie"]}"#), "rules[0].key.from[0]: unknown key source \"cookie\": expected header:NAME, client_ip, route, method or path, joined with '+'"),
            (rule(r#", "key": {"from": ["client_ip", "header:"]}"#), "rules[0].key.from[1]: must be a header name (letters, digits and !#$%&'*+-.^_`|~)"),
            (rule(r#", "key": {"from": ["path+"]}"#), "rules[0].key.from[0]: unknown key source \"\": expected header:NAME, client_ip, route, method or path, joined with '+'"),
            (rule(r#", "key": {"when_missing": "deny"}"#), "rules[0].key.when_missing: unknown variant `deny`, expected `anonymous` or `skip`"),
            (rule(r#", "match": {"path_exact": "/a", "path_prefix": "/b"}"#), "rules[0].match: path_exact and path_prefix exclude each other"),
            (rule(r#", "match": {"path_prefix": "api"}"#), "rules[0].match.path_prefix: must start with '/'"),
            (rule(r#", "match": {"methods": []}"#), "rules[0].match.methods: must not be empty (leave it out to match any method)"),
            (rule(r#", "match": {"methods": ["GET", "GE T"]}"#), "rules[0].match.methods[1]: must be an HTTP method such as GET"),
            (rule(r#", "match": {"header": {"name": "bad name"}}"#), "rules[0].match.header.name: must be a header name (letters, digits and !#$%&'*+-.^_`|~)"),
            (rule(r#", "match": {"host": "x"}"#), "rules[0].match.host: unknown field `host`, expected one of `path_exact`, `path_prefix`, `methods`, `header`"),
            (rule(r#", "cost": 0"#), "rules[0].cost: must be between 1 and 1000000"),
            (rule(r#", "cost": "2""#), "rules[0].cost: must be a whole number or {\"header\": NAME, \"min\": N, \"max\": N}"),
            (rule(r#", "cost": {"header": "x-cost"}"#), "rules[0].cost: a cost taken from a header needs both min and max"),
            (rule(r#", "cost": {"header": "x-cost", "min": 5, "max": 2}"#), "rules[0].cost: needs min <= max <= 1000000"),
            (rule(r#", "cost": {"header": "x-cost", "min": 1, "max": 5, "default": 9}"#), "rules[0].cost.default: must be between min and max"),
            (rule(r#", "cost": {"header": "x cost", "min": 1, "max": 5}"#), "rules[0].cost.header: must be a header name (letters, digits and !#$%&'*+-.^_`|~)"),
            (rule(r#", "cost": {"header": "x-cost", "min": 1, "max": 5, "step": 1}"#), "rules[0].cost: unknown field `step`, expected one of `header`, `min`, `max`, `default`"),
        ];
        for (json, want) in cases {
            let got = Config::parse(json.as_bytes()).unwrap_err().to_string();
            assert_eq!(got, want, "config {json}");
        }
    }

    #[test]
    fn json_path_tracks_objects_and_arrays() {
        assert_eq!(json_path_at(br#"{"a": {"b": [1, {"c": "#), "a.b[1].c");
        assert_eq!(json_path_at(br#"{"a": {"b": 1}, "d": "x\"y"#), "d");
        assert_eq!(json_path_at(br#"{"a\"b": 1"#), "a\"b");
    }
}
