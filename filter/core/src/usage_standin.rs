//! STAND-IN for `crate::usage` (the response and request body parsers), with the same API, so
//! that the configuration, the engine and the adapter can be written against it. It reads by
//! buffering up to the read bound and parsing with serde_json: NOT the bounded-memory
//! streaming reader the product ships. Replaced at merge by `crate::usage`.

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    Json,
    EventStream,
}

/// The body kind of a `content-type` value: its media type, parameters ignored, any case.
pub fn body_kind(content_type: &[u8]) -> Option<BodyKind> {
    let text = std::str::from_utf8(content_type).ok()?;
    let media = text.split(';').next()?.trim().to_ascii_lowercase();
    match media.as_str() {
        "application/json" => Some(BodyKind::Json),
        "text/event-stream" => Some(BodyKind::EventStream),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    NotANumber,
    Negative,
    Fractional,
    TooLarge,
    Duplicated,
    NotJson,
    Cut,
    BodyTooLarge,
}

impl Unreadable {
    pub fn name(self) -> &'static str {
        match self {
            Unreadable::NotANumber => "not_a_number",
            Unreadable::Negative => "negative",
            Unreadable::Fractional => "fractional",
            Unreadable::TooLarge => "too_large",
            Unreadable::Duplicated => "duplicated",
            Unreadable::NotJson => "not_json",
            Unreadable::Cut => "cut",
            Unreadable::BodyTooLarge => "body_too_large",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageRead {
    Found(u64),
    Missing,
    Invalid(Unreadable),
}

const MAX_USAGE: u64 = 1_000_000_000_000;

fn whole(text: &str) -> UsageRead {
    let text = text.trim();
    if text.starts_with('-') {
        return UsageRead::Invalid(Unreadable::Negative);
    }
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return UsageRead::Invalid(if text.contains('.') {
            Unreadable::Fractional
        } else {
            Unreadable::NotANumber
        });
    }
    match text.parse::<u64>() {
        Ok(n) if n <= MAX_USAGE => UsageRead::Found(n),
        _ => UsageRead::Invalid(Unreadable::TooLarge),
    }
}

pub fn usage_from_header(value: &[u8]) -> UsageRead {
    match std::str::from_utf8(value) {
        Ok(text) => whole(text),
        Err(_) => UsageRead::Invalid(Unreadable::NotANumber),
    }
}

pub fn parse_usage_path(text: &str) -> Result<Vec<String>, String> {
    let parts: Vec<String> = text.split('.').map(str::to_string).collect();
    if text.is_empty() || parts.iter().any(String::is_empty) {
        return Err("must be a dotted path of keys, such as usage.total_tokens".into());
    }
    if parts.len() > 16 {
        return Err("must hold at most 16 keys".into());
    }
    Ok(parts)
}

fn at_path(value: &Value, path: &[String]) -> UsageRead {
    let mut v = value;
    for key in path {
        match v.get(key) {
            Some(next) => v = next,
            None => return UsageRead::Missing,
        }
    }
    match v {
        Value::Null => UsageRead::Missing,
        Value::Number(n) => whole(&n.to_string()),
        _ => UsageRead::Invalid(Unreadable::NotANumber),
    }
}

#[derive(Debug)]
pub struct UsageReader {
    kind: BodyKind,
    path: Vec<String>,
    max_body: u64,
    seen: u64,
    body: Vec<u8>,
}

impl UsageReader {
    pub fn new(kind: BodyKind, path: &[String], max_body: u64) -> Self {
        UsageReader {
            kind,
            path: path.to_vec(),
            max_body,
            seen: 0,
            body: Vec::new(),
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        self.seen = self.seen.saturating_add(chunk.len() as u64);
        if self.seen <= self.max_body {
            self.body.extend_from_slice(chunk);
        }
    }

    pub fn finish(&mut self, complete: bool) -> UsageRead {
        if self.seen > self.max_body {
            return UsageRead::Invalid(Unreadable::BodyTooLarge);
        }
        match self.kind {
            BodyKind::Json => {
                if !complete {
                    return UsageRead::Invalid(Unreadable::Cut);
                }
                match serde_json::from_slice::<Value>(&self.body) {
                    Ok(v) => at_path(&v, &self.path),
                    Err(_) => UsageRead::Invalid(Unreadable::NotJson),
                }
            }
            BodyKind::EventStream => {
                let text = String::from_utf8_lossy(&self.body).replace("\r\n", "\n");
                let mut found = UsageRead::Missing;
                let events: Vec<&str> = text.split("\n\n").collect();
                // The last piece has no blank line after it: a cut event, ignored.
                for event in &events[..events.len().saturating_sub(1)] {
                    let data: Vec<&str> = event
                        .lines()
                        .filter_map(|l| l.strip_prefix("data:"))
                        .map(|d| d.strip_prefix(' ').unwrap_or(d))
                        .collect();
                    let data = data.join("\n");
                    if data.is_empty() || data.trim() == "[DONE]" {
                        continue;
                    }
                    match serde_json::from_str::<Value>(&data) {
                        Ok(v) => match at_path(&v, &self.path) {
                            UsageRead::Missing => {}
                            other => found = other,
                        },
                        Err(_) => found = UsageRead::Invalid(Unreadable::NotJson),
                    }
                }
                found
            }
        }
    }

    pub fn done(&self) -> bool {
        self.seen > self.max_body
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EstimateError {
    TooLarge,
}

#[derive(Debug)]
pub struct RequestEstimate {
    max_body: u64,
    seen: u64,
    body: Vec<u8>,
}

impl RequestEstimate {
    pub fn new(max_body: u64) -> Self {
        RequestEstimate {
            max_body,
            seen: 0,
            body: Vec::new(),
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        self.seen = self.seen.saturating_add(chunk.len() as u64);
        if self.seen <= self.max_body {
            self.body.extend_from_slice(chunk);
        }
    }

    pub fn finish(&mut self, completion_default: u64) -> Result<u64, EstimateError> {
        if self.seen > self.max_body {
            return Err(EstimateError::TooLarge);
        }
        let value: Value = serde_json::from_slice(&self.body).unwrap_or(Value::Null);
        let completion = ["max_completion_tokens", "max_tokens"]
            .iter()
            .find_map(|k| value.get(k).and_then(Value::as_u64))
            .unwrap_or(completion_default);
        Ok(self.seen.saturating_add(completion))
    }
}
