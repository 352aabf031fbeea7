//! The filter's JSON configuration: parsed with serde, then validated, every error naming the
//! field it is about (`limit.rate: must be > 0`), so Envoy refuses a bad config at start-up
//! with a message an operator can act on.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

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
}

/// A validated configuration, ready for the request path.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub bridge: Bridge,
    pub failure_mode: FailureMode,
    /// Lower-case name of the header carrying the API key.
    pub api_key_header: String,
    pub key_prefix: String,
    pub hash_identities: bool,
    pub limit: Limit,
    /// SHA-1 of the embedded token bucket script, as `EVALSHA` wants it.
    pub script_sha: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Bridge {
    /// Envoy cluster that reaches Webdis.
    pub cluster: String,
    /// `:authority` of the calls to Webdis.
    pub authority: String,
    /// Ready-made `Authorization` header value, when Webdis requires basic auth.
    pub authorization: Option<String>,
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// Most tokens a bucket holds: the burst a fresh client gets.
    pub capacity: u64,
    /// Tokens added per second.
    pub rate_per_second: f64,
}

/// A configuration error: the field (`limit.rate`) and what is wrong with it.
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
    #[serde(default = "default_api_key_header")]
    api_key_header: String,
    #[serde(default = "default_key_prefix")]
    key_prefix: String,
    #[serde(default = "default_true")]
    hash_identities: bool,
    limit: RawLimit,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBridge {
    #[serde(default = "default_cluster")]
    cluster: String,
    authority: Option<String>,
    username: Option<String>,
    password: Option<String>,
    timeout: Option<String>,
}

impl Default for RawBridge {
    fn default() -> Self {
        RawBridge {
            cluster: default_cluster(),
            authority: None,
            username: None,
            password: None,
            timeout: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    capacity: u64,
    rate: f64,
    per: Option<String>,
}

fn default_failure_mode() -> FailureMode {
    FailureMode::Open
}
fn default_api_key_header() -> String {
    "x-api-key".to_string()
}
fn default_key_prefix() -> String {
    "rl:".to_string()
}
fn default_true() -> bool {
    true
}
fn default_cluster() -> String {
    "webdis".to_string()
}

const DEFAULT_TIMEOUT: Duration = Duration::from_millis(150);
const DEFAULT_PER: Duration = Duration::from_secs(1);

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

/// A duration written as a whole number and a unit: `150ms`, `2s`, `1m`, `1h`, `1d`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    {
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
}

// ---- validation layer ----

const MAX_TIMEOUT: Duration = Duration::from_secs(60);

impl Config {
    /// Parses and validates the filter's JSON configuration.
    pub fn parse(json: &[u8]) -> Result<Config, ConfigError> {
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
        let bridge = self.bridge.validate()?;
        let limit = self.limit.validate()?;

        let header = self.api_key_header.to_ascii_lowercase();
        if header.is_empty() || !header.bytes().all(is_token_byte) {
            return Err(invalid(
                "api_key_header",
                "must be a header name (letters, digits and !#$%&'*+-.^_`|~)",
            ));
        }
        if self.key_prefix.is_empty()
            || self.key_prefix.len() > 64
            || !self.key_prefix.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(invalid(
                "key_prefix",
                "must be 1 to 64 printable ASCII characters without spaces",
            ));
        }

        Ok(Config {
            bridge,
            failure_mode: self.failure_mode,
            api_key_header: header,
            key_prefix: self.key_prefix,
            hash_identities: self.hash_identities,
            limit,
            script_sha: sha1_hex(crate::TOKEN_BUCKET_LUA.as_bytes()),
        })
    }
}

impl RawBridge {
    fn validate(self) -> Result<Bridge, ConfigError> {
        if self.cluster.is_empty() {
            return Err(invalid("bridge.cluster", "must not be empty"));
        }
        let authority = self.authority.unwrap_or_else(|| self.cluster.clone());
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
        let timeout = duration_field(self.timeout.as_deref(), "bridge.timeout", DEFAULT_TIMEOUT)?;
        if timeout.is_zero() || timeout > MAX_TIMEOUT {
            return Err(invalid("bridge.timeout", "must be between 1ms and 60s"));
        }
        Ok(Bridge {
            cluster: self.cluster,
            authority,
            authorization,
            timeout,
        })
    }
}

impl RawLimit {
    fn validate(self) -> Result<Limit, ConfigError> {
        if self.capacity < 1 {
            return Err(invalid("limit.capacity", "must be >= 1"));
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return Err(invalid("limit.rate", "must be > 0"));
        }
        let per = duration_field(self.per.as_deref(), "limit.per", DEFAULT_PER)?;
        if per.is_zero() {
            return Err(invalid("limit.per", "must be > 0"));
        }
        Ok(Limit {
            capacity: self.capacity,
            rate_per_second: self.rate / per.as_secs_f64(),
        })
    }
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

    const MINIMAL: &str = r#"{"limit": {"capacity": 10, "rate": 10, "per": "1m"}}"#;

    #[test]
    fn minimal_config_takes_documented_defaults() {
        let c = Config::parse(MINIMAL.as_bytes()).unwrap();
        assert_eq!(c.bridge.cluster, "webdis");
        assert_eq!(c.bridge.authority, "webdis");
        assert_eq!(c.bridge.authorization, None);
        assert_eq!(c.bridge.timeout, Duration::from_millis(150));
        assert_eq!(c.failure_mode, FailureMode::Open);
        assert_eq!(c.api_key_header, "x-api-key");
        assert_eq!(c.key_prefix, "rl:");
        assert!(c.hash_identities);
        assert_eq!(c.limit.capacity, 10);
        assert!((c.limit.rate_per_second - 10.0 / 60.0).abs() < 1e-12);
        assert_eq!(c.script_sha.len(), 40);
    }

    #[test]
    fn full_config_is_read() {
        let c = Config::parse(
            br#"{
              "bridge": {"cluster": "bridge", "authority": "webdis.local", "username": "ratelimit",
                         "password": "secret", "timeout": "2s"},
              "failure_mode": "closed",
              "api_key_header": "X-Client-Key",
              "key_prefix": "limits:",
              "hash_identities": false,
              "limit": {"capacity": 5, "rate": 1}
            }"#,
        )
        .unwrap();
        assert_eq!(c.bridge.cluster, "bridge");
        assert_eq!(c.bridge.authority, "webdis.local");
        assert_eq!(
            c.bridge.authorization.as_deref(),
            Some("Basic cmF0ZWxpbWl0OnNlY3JldA==")
        );
        assert_eq!(c.bridge.timeout, Duration::from_secs(2));
        assert_eq!(c.failure_mode, FailureMode::Closed);
        assert_eq!(c.api_key_header, "x-client-key");
        assert_eq!(c.key_prefix, "limits:");
        assert!(!c.hash_identities);
        assert_eq!(c.limit.rate_per_second, 1.0);
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

    /// One bad config per case, with the exact message the operator sees.
    #[test]
    fn bad_configs_name_the_field() {
        let cases: &[(&str, &str)] = &[
            ("", "EOF while parsing a value"),
            ("[]", "the configuration must be a JSON object"),
            ("\"limit\"", "the configuration must be a JSON object"),
            ("{}", "limit: is required"),
            (r#"{"limit": {"rate": 1}}"#, "limit.capacity: is required"),
            (r#"{"limit": {"capacity": 1}}"#, "limit.rate: is required"),
            (
                r#"{"limit": {"capacity": 1, "rate": 1}, "colour": "red"}"#,
                "colour: unknown field `colour`, expected one of `bridge`, `failure_mode`, `api_key_header`, `key_prefix`, `hash_identities`, `limit`",
            ),
            (
                r#"{"limit": {"capacity": 1, "rate": 1, "burst": 3}}"#,
                "limit.burst: unknown field `burst`, expected one of `capacity`, `rate`, `per`",
            ),
            (
                r#"{"bridge": {"clustr": "x"}, "limit": {"capacity": 1, "rate": 1}}"#,
                "bridge.clustr: unknown field `clustr`, expected one of `cluster`, `authority`, `username`, `password`, `timeout`",
            ),
            (
                r#"{"limit": {"capacity": 1, "rate": "fast"}}"#,
                "limit.rate: invalid type: string \"fast\", expected f64",
            ),
            (
                r#"{"limit": {"capacity": 1.5, "rate": 1}}"#,
                "limit.capacity: invalid type: floating point `1.5`, expected u64",
            ),
            (
                r#"{"limit": {"capacity": -1, "rate": 1}}"#,
                "limit.capacity: invalid value: integer `-1`, expected u64",
            ),
            (r#"{"limit": {"capacity": 0, "rate": 1}}"#, "limit.capacity: must be >= 1"),
            (r#"{"limit": {"capacity": 1, "rate": 0}}"#, "limit.rate: must be > 0"),
            (r#"{"limit": {"capacity": 1, "rate": -2.5}}"#, "limit.rate: must be > 0"),
            (
                r#"{"limit": {"capacity": 1, "rate": 1, "per": "0s"}}"#,
                "limit.per: must be > 0",
            ),
            (
                r#"{"limit": {"capacity": 1, "rate": 1, "per": "soon"}}"#,
                "limit.per: invalid duration \"soon\": expected a whole number and a unit (ms, s, m, h, d), like \"150ms\"",
            ),
            (
                r#"{"bridge": {"timeout": "0ms"}, "limit": {"capacity": 1, "rate": 1}}"#,
                "bridge.timeout: must be between 1ms and 60s",
            ),
            (
                r#"{"bridge": {"timeout": "2m"}, "limit": {"capacity": 1, "rate": 1}}"#,
                "bridge.timeout: must be between 1ms and 60s",
            ),
            (
                r#"{"bridge": {"timeout": 150}, "limit": {"capacity": 1, "rate": 1}}"#,
                "bridge.timeout: invalid type: integer `150`, expected a string",
            ),
            (
                r#"{"failure_mode": "sometimes", "limit": {"capacity": 1, "rate": 1}}"#,
                "failure_mode: unknown variant `sometimes`, expected `open` or `closed`",
            ),
            (
                r#"{"bridge": {"cluster": ""}, "limit": {"capacity": 1, "rate": 1}}"#,
                "bridge.cluster: must not be empty",
            ),
            (
                r#"{"bridge": {"username": "u"}, "limit": {"capacity": 1, "rate": 1}}"#,
                "bridge.password: is required with bridge.username",
            ),
            (
                r#"{"bridge": {"password": "p"}, "limit": {"capacity": 1, "rate": 1}}"#,
                "bridge.username: is required with bridge.password",
            ),
            (
                r#"{"bridge": {"username": "a:b", "password": "p"}, "limit": {"capacity": 1, "rate": 1}}"#,
                "bridge.username: must be non-empty and must not contain ':'",
            ),
            (
                r#"{"bridge": {"authority": "a b"}, "limit": {"capacity": 1, "rate": 1}}"#,
                "bridge.authority: must be a host name, printable ASCII without spaces",
            ),
            (
                r#"{"api_key_header": "x api key", "limit": {"capacity": 1, "rate": 1}}"#,
                "api_key_header: must be a header name (letters, digits and !#$%&'*+-.^_`|~)",
            ),
            (
                r#"{"key_prefix": "", "limit": {"capacity": 1, "rate": 1}}"#,
                "key_prefix: must be 1 to 64 printable ASCII characters without spaces",
            ),
            (
                r#"{"hash_identities": "yes", "limit": {"capacity": 1, "rate": 1}}"#,
                "hash_identities: invalid type: string \"yes\", expected a boolean",
            ),
        ];
        for (json, want) in cases {
            let got = Config::parse(json.as_bytes()).unwrap_err().to_string();
            assert_eq!(&got, want, "config {json}");
        }
    }

    #[test]
    fn json_path_tracks_objects_and_arrays() {
        assert_eq!(json_path_at(br#"{"a": {"b": [1, {"c": "#), "a.b[1].c");
        assert_eq!(json_path_at(br#"{"a": {"b": 1}, "d": "x\"y"#), "d");
        assert_eq!(json_path_at(br#"{"a\"b": 1"#), "a\"b");
    }
}
