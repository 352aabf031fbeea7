//! A limit metered by usage read from the response (`usage` on a limit): where the usage is
//! read, how a request is admitted, and what is charged before the usage is known.

use serde_json::Value;

use super::fields::check_header_name;
use super::raw::{
    RawEstimateHeader, RawHeaderUsage, RawIncludeUsage, RawRequestEstimate, RawUsage,
};
use super::sources::parse_source;
use super::{invalid, Admit, Algorithm, ConfigError, KeySource, MetadataPath};
use crate::usage::{parse_usage_path, BodyUsage, OutputKeys, Weights, MAX_PATHS, WHOLE};

pub use crate::bounds::{DEFAULT_MAX_BODY, MAX_MAX_BODY, MAX_USAGE};

/// How a limit is metered by usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    pub from: UsageSource,
    /// The named format `from` gave, if any.
    pub format: Option<Format>,
    pub admit: Admit,
    pub estimate: Estimate,
    /// Which streamed OpenAI chat completions and completions lacking
    /// `stream_options.include_usage` are sent upstream with it.
    pub include_usage: AddIncludeUsage,
    /// A named format's token counts weighted (`from` reads them apart); the request
    /// estimate weighted the same way.
    pub weights: Option<Weights>,
}

/// Which requests `stream_options.include_usage` may be added to (`usage.include_usage`). The
/// request headers leave before the body is read (see the adapter), so whether a request is
/// edited, and loses its `content-length`, is decided from what is known at the headers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AddIncludeUsage {
    #[default]
    Off,
    /// `true`: any `POST` to a completions path may be edited, so each is sent without its
    /// `content-length` (chunked to HTTP/1.1), edited or not.
    Always,
    /// Only a request a filter before this one marked as streamed in its metadata (Envoy's
    /// `json_to_metadata` reading `stream`), and not already asking for usage (`asked`, e.g.
    /// `stream_options.include_usage`): the others keep their `content-length`.
    Marked {
        streamed: MetadataPath,
        asked: Option<MetadataPath>,
    },
}

impl AddIncludeUsage {
    pub fn is_on(&self) -> bool {
        *self != AddIncludeUsage::Off
    }
}

/// The largest weight of one token.
pub const MAX_WEIGHT: i64 = 1000;

/// A provider's usage format, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenAi,
    Anthropic,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::OpenAi => "openai",
            Format::Anthropic => "anthropic",
        }
    }
}

/// Where a response's usage is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageSource {
    /// Dotted JSON paths in the response body (`application/json`, or the `data:` events of
    /// `text/event-stream`): one or more fields added up, each at the first of its paths
    /// present.
    Body(BodyUsage),
    /// A response header holding a whole number, charged within the operator's bounds.
    Header(HeaderUsage),
    /// The response's status: 1 unit for one of these codes, 0 for any other (failed logins
    /// counted, successful ones given back).
    Status(Vec<u16>),
}

/// A usage response header: its lower-case name, and the least and the most a response is
/// charged whatever the upstream says (`{"header": NAME, "min": N, "max": N}`; `header:NAME`
/// is 0 to [`MAX_USAGE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderUsage {
    pub name: String,
    pub min: u64,
    pub max: u64,
}

impl HeaderUsage {
    pub fn unbounded(name: &str) -> Self {
        HeaderUsage {
            name: name.to_string(),
            min: 0,
            max: MAX_USAGE,
        }
    }
}

/// Status codes one `status:` source lists at most.
pub const MAX_STATUS_CODES: usize = 16;

/// What a request is charged before its usage is known (`reserve`), or when its usage
/// cannot be read (both modes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Estimate {
    Fixed(u64),
    /// A request header holding a whole number in `min..=max`; absent: `default`.
    Header {
        name: String,
        min: u64,
        max: u64,
        default: u64,
    },
    /// The request body's bytes plus the first of its output bounds present (`output`, by
    /// format), else `completion_default`; a body over `max_body` bytes is refused (413).
    Request {
        completion_default: u64,
        max_body: u64,
        output: OutputKeys,
    },
}

impl Estimate {
    /// The largest estimate a request can have.
    pub fn max(&self) -> u64 {
        match self {
            Estimate::Fixed(n) => *n,
            Estimate::Header { max, .. } => *max,
            // The client's max_tokens is bounded only by the largest usage.
            Estimate::Request { .. } => MAX_USAGE,
        }
    }
}

/// A byte size: a whole number with an optional unit `B`, `KiB` or `MiB`.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// The limit's `usage`, checked against its algorithm and its other settings.
pub(super) fn validate_usage(
    raw: RawUsage,
    field: &str,
    algorithm: Algorithm,
    leased: bool,
    shards: u64,
) -> Result<Usage, ConfigError> {
    if algorithm == Algorithm::SlidingWindowLog {
        return Err(invalid(
            field,
            "only token_bucket, gcra, fixed_window and sliding_window_counter limits take usage: a log keeps one entry per unit",
        ));
    }
    if leased {
        return Err(invalid(
            &format!("{field}.lease"),
            "a usage limit takes no lease: its cost is known per request only",
        ));
    }
    if shards > 1 {
        return Err(invalid(
            field,
            "a usage limit takes no shards: its settlement must reach the shard its request was charged on",
        ));
    }
    let (from, format) = validate_from(&raw.from, &format!("{field}.from"))?;
    let estimate_field = format!("{field}.estimate");
    if matches!(from, UsageSource::Status(_)) {
        // A response is charged 1 or 0: the 1 is reserved, so concurrent requests never
        // pass the limit between them.
        if raw.estimate.as_ref().is_some_and(|e| e.as_u64() != Some(1)) {
            return Err(invalid(
                &estimate_field,
                "must be 1 or left out with a status source: a response of a listed status is charged 1, any other 0",
            ));
        }
    }
    let estimate = match (raw.estimate, &from) {
        (Some(estimate), _) => estimate,
        (None, UsageSource::Status(_)) => Value::from(1u64),
        (None, _) => return Err(invalid(&estimate_field, "is required")),
    };
    let output = match format {
        Some(Format::OpenAi) => OutputKeys::OpenAi,
        Some(Format::Anthropic) => OutputKeys::Anthropic,
        None => OutputKeys::Completion,
    };
    let estimate = validate_estimate(estimate, &estimate_field, output)?;
    let include_usage =
        validate_include_usage(raw.include_usage, &format!("{field}.include_usage"))?;
    if include_usage.is_on() {
        if format != Some(Format::OpenAi) {
            return Err(invalid(
                &format!("{field}.include_usage"),
                r#"needs "from": "openai": the option is OpenAI's"#,
            ));
        }
        if !matches!(estimate, Estimate::Request { .. }) {
            return Err(invalid(
                &format!("{field}.include_usage"),
                r#"needs an estimate from the request ({"request": {...}}): the option is added to the request body read for it"#,
            ));
        }
    }
    let weights = match raw.weights {
        None => None,
        Some(value) => Some(validate_weights(
            &value,
            &format!("{field}.weights"),
            format,
        )?),
    };
    let from = match (weights, format) {
        (Some(w), Some(Format::OpenAi)) => UsageSource::Body(BodyUsage::openai_weighted(&w)),
        (Some(w), Some(Format::Anthropic)) => UsageSource::Body(BodyUsage::anthropic_weighted(&w)),
        _ => from,
    };
    Ok(Usage {
        from,
        format,
        admit: raw.admit,
        estimate,
        include_usage,
        weights,
    })
}

/// `include_usage`: `true`, `false`, or `{"streamed": "metadata:…", "asked": "metadata:…"}`
/// (`asked` optional): sources known when the headers are, so metadata only.
fn validate_include_usage(raw: Option<Value>, field: &str) -> Result<AddIncludeUsage, ConfigError> {
    let object = match raw {
        None | Some(Value::Bool(false)) => return Ok(AddIncludeUsage::Off),
        Some(Value::Bool(true)) => return Ok(AddIncludeUsage::Always),
        Some(object @ Value::Object(_)) => object,
        Some(_) => {
            return Err(invalid(
                field,
                r#"must be true, false or {"streamed": "metadata:NAMESPACE:KEY", "asked": "metadata:NAMESPACE:KEY"}"#,
            ))
        }
    };
    let raw: RawIncludeUsage =
        serde_json::from_value(object).map_err(|e| invalid(field, e.to_string()))?;
    let metadata = |text: &str, key: &str| -> Result<MetadataPath, ConfigError> {
        let entry = format!("{field}.{key}");
        match parse_source(text, &entry)? {
            KeySource::Metadata(path) => Ok(path),
            _ => Err(invalid(
                &entry,
                "must be a metadata: source: it is read with the request headers, before the body, so a filter before this one (json_to_metadata) must have read the body",
            )),
        }
    };
    Ok(AddIncludeUsage::Marked {
        streamed: metadata(&raw.streamed, "streamed")?,
        asked: raw.asked.map(|a| metadata(&a, "asked")).transpose()?,
    })
}

/// `weights`: `input`, `output`, `cached_input` (and, for Anthropic, `cache_write`), each a
/// number from 0 to [`MAX_WEIGHT`] with at most 3 decimals; `input` and `output` default to 1,
/// the cached kinds to `input`'s.
fn validate_weights(
    value: &Value,
    field: &str,
    format: Option<Format>,
) -> Result<Weights, ConfigError> {
    let Some(format) = format else {
        return Err(invalid(
            field,
            r#"needs "from": "openai" or "anthropic": a named format reads the kinds of tokens apart"#,
        ));
    };
    let Some(object) = value.as_object() else {
        return Err(invalid(
            field,
            r#"must be an object such as {"input": 1, "output": 4, "cached_input": 0.5}"#,
        ));
    };
    let mut keys = vec!["input", "output", "cached_input"];
    if format == Format::Anthropic {
        keys.push("cache_write");
    }
    for key in object.keys() {
        if !keys.contains(&key.as_str()) {
            return Err(invalid(
                &format!("{field}.{key}"),
                format!("is not a weight of {}: {}", format.name(), keys.join(", ")),
            ));
        }
    }
    let weight = |key: &str, default: i64| -> Result<i64, ConfigError> {
        let Some(v) = object.get(key) else {
            return Ok(default);
        };
        let bad = || {
            invalid(
                &format!("{field}.{key}"),
                format!("must be a number from 0 to {MAX_WEIGHT} with at most 3 decimals"),
            )
        };
        let x = v.as_f64().ok_or_else(bad)?;
        let milli = (x * WHOLE as f64).round();
        let exact = (x * WHOLE as f64 - milli).abs() < 1e-6;
        if !exact || !(0.0..=(MAX_WEIGHT * WHOLE) as f64).contains(&milli) {
            return Err(bad());
        }
        Ok(milli as i64)
    };
    let input = weight("input", WHOLE)?;
    Ok(Weights {
        input,
        output: weight("output", WHOLE)?,
        cached_input: weight("cached_input", input)?,
        cache_write: weight("cache_write", input)?,
    })
}

/// `from`: `"body:PATH"`, `"header:NAME"`, `"status:CODE,CODE"`, a format's name, or a list
/// of `"body:PATH"`.
fn validate_from(from: &Value, field: &str) -> Result<(UsageSource, Option<Format>), ConfigError> {
    let shape = r#"must be "openai", "anthropic", "body:PATH" (such as "body:usage.total_tokens"), "header:NAME", {"header": NAME, "min": N, "max": N}, "status:CODES" (such as "status:401,403") or a list of "body:PATH""#;
    if let Some(list) = from.as_array() {
        if list.is_empty() || list.len() > MAX_PATHS {
            return Err(invalid(
                field,
                format!("a list holds 1 to {MAX_PATHS} body paths"),
            ));
        }
        let mut paths = Vec::with_capacity(list.len());
        for (i, entry) in list.iter().enumerate() {
            let entry_field = format!("{field}[{i}]");
            let path = entry.as_str().and_then(|text| text.strip_prefix("body:"));
            let Some(path) = path else {
                return Err(invalid(
                    &entry_field,
                    r#"must be "body:PATH": a list holds body paths (a header or a format stands alone)"#,
                ));
            };
            paths.push(parse_usage_path(path).map_err(|e| invalid(&entry_field, e))?);
        }
        return Ok((UsageSource::Body(BodyUsage::first_of(paths)), None));
    }
    if from.is_object() {
        return Ok((UsageSource::Header(header_usage(from, field)?), None));
    }
    let Some(text) = from.as_str() else {
        return Err(invalid(field, shape));
    };
    Ok(match text {
        "openai" => (UsageSource::Body(BodyUsage::openai()), Some(Format::OpenAi)),
        "anthropic" => (
            UsageSource::Body(BodyUsage::anthropic()),
            Some(Format::Anthropic),
        ),
        _ => {
            if let Some(path) = text.strip_prefix("body:") {
                let path = parse_usage_path(path).map_err(|e| invalid(field, e))?;
                (UsageSource::Body(BodyUsage::first_of(vec![path])), None)
            } else if let Some(name) = text.strip_prefix("header:") {
                let name = check_header_name(name, field)?;
                (UsageSource::Header(HeaderUsage::unbounded(&name)), None)
            } else if let Some(codes) = text.strip_prefix("status:") {
                (UsageSource::Status(status_codes(codes, field)?), None)
            } else {
                return Err(invalid(field, shape));
            }
        }
    })
}

/// `{"header": NAME, "min": N, "max": N}`: `min` (default 0) ≤ `max` (default 10^12).
fn header_usage(value: &Value, field: &str) -> Result<HeaderUsage, ConfigError> {
    let raw: RawHeaderUsage =
        serde_json::from_value(value.clone()).map_err(|e| invalid(field, e.to_string()))?;
    let name = check_header_name(&raw.header, &format!("{field}.header"))?;
    let (min, max) = (raw.min.unwrap_or(0), raw.max.unwrap_or(MAX_USAGE));
    if min > max || max > MAX_USAGE {
        return Err(invalid(field, format!("needs min <= max <= {MAX_USAGE}")));
    }
    Ok(HeaderUsage { name, min, max })
}

/// `401,403`: 1 to [`MAX_STATUS_CODES`] distinct HTTP status codes (100 to 599).
fn status_codes(text: &str, field: &str) -> Result<Vec<u16>, ConfigError> {
    let mut codes = Vec::new();
    for part in text.split(',') {
        let code = part
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|c| (100..=599).contains(c));
        let Some(code) = code else {
            return Err(invalid(
                field,
                format!("status codes are whole numbers from 100 to 599, separated by commas: {part:?} is not one"),
            ));
        };
        if codes.contains(&code) {
            return Err(invalid(field, format!("lists status {code} twice")));
        }
        codes.push(code);
    }
    if codes.len() > MAX_STATUS_CODES {
        return Err(invalid(
            field,
            format!("lists at most {MAX_STATUS_CODES} status codes"),
        ));
    }
    Ok(codes)
}

fn validate_estimate(
    value: Value,
    field: &str,
    output: OutputKeys,
) -> Result<Estimate, ConfigError> {
    let range = format!("must be between 1 and {MAX_USAGE}");
    if let Some(n) = value.as_u64() {
        if !(1..=MAX_USAGE).contains(&n) {
            return Err(invalid(field, range));
        }
        return Ok(Estimate::Fixed(n));
    }
    let shape = r#"must be a whole number, {"header": NAME, "min": N, "max": N} or {"request": {"completion_default": N, "max_body": SIZE}}"#;
    let Some(object) = value.as_object() else {
        return Err(invalid(field, shape));
    };
    if object.contains_key("request") {
        let raw: RawRequestEstimate =
            serde_json::from_value(value).map_err(|e| invalid(field, e.to_string()))?;
        let completion_default = raw.request.completion_default.unwrap_or(1024);
        if completion_default > MAX_USAGE {
            return Err(invalid(
                &format!("{field}.request.completion_default"),
                format!("must be at most {MAX_USAGE}"),
            ));
        }
        let max_body = match raw.request.max_body {
            None => DEFAULT_MAX_BODY,
            Some(text) => match parse_bytes(&text) {
                Some(n) if (1..=MAX_MAX_BODY).contains(&n) => n,
                _ => {
                    return Err(invalid(
                        &format!("{field}.request.max_body"),
                        "must be a size from 1B to 64MiB (such as \"1MiB\", \"512KiB\")",
                    ))
                }
            },
        };
        return Ok(Estimate::Request {
            completion_default,
            max_body,
            output,
        });
    }
    if !object.contains_key("header") {
        return Err(invalid(field, shape));
    }
    let raw: RawEstimateHeader =
        serde_json::from_value(value).map_err(|e| invalid(field, e.to_string()))?;
    let name = check_header_name(&raw.header, &format!("{field}.header"))?;
    let (Some(min), Some(max)) = (raw.min, raw.max) else {
        return Err(invalid(
            field,
            "an estimate taken from a header needs both min and max",
        ));
    };
    if min > max || max > MAX_USAGE {
        return Err(invalid(field, format!("needs min <= max <= {MAX_USAGE}")));
    }
    let default = raw.default.unwrap_or(min);
    if !(min..=max).contains(&default) {
        return Err(invalid(
            &format!("{field}.default"),
            "must be between min and max",
        ));
    }
    Ok(Estimate::Header {
        name,
        min,
        max,
        default,
    })
}
