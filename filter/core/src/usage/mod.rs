//! Reading what a response really cost (e.g. an LLM's `usage.total_tokens`) and bounding it
//! up front from the request. Pure and streaming: bytes are scanned as they pass, nothing is
//! buffered, and a reader's memory is a constant ([`READER_BYTES`]) whatever the body's size.
//!
//! - [`UsageReader`]: the number at a dotted path of an `application/json` body, or of the
//!   `data:` events of a `text/event-stream` (the last event carrying it wins); or, for a
//!   [`BodyUsage`], the first of several paths present, and the sum of several such fields.
//! - [`Inflater`]: a gzip or deflate body inflated as it passes, for the reader.
//! - [`usage_from_header`]: the number in a response header.
//! - [`RequestEstimate`]: the request body's bytes plus its `max_completion_tokens` /
//!   `max_tokens`, an upper bound of the usage for byte-level tokenizers.

pub use crate::bounds::{MAX_DEPTH, MAX_SEGMENTS, MAX_SEGMENT_LEN};

mod estimate;
mod event_stream;
#[cfg(test)]
mod formats_tests;
mod header;
mod inflate;
pub(crate) mod json;
pub(crate) mod path;
mod sum;
#[cfg(test)]
mod tests;

pub use estimate::{EstimateError, IncludeUsage, OutputKeys, RequestEstimate};
pub use header::usage_from_header;
pub use inflate::{encoding, Encoding, InflateError, Inflater, INFLATER_BYTES};
pub use sum::{BodyUsage, Field, Weights, MAX_PATHS, MAX_READ_PATHS, WHOLE};

use event_stream::Events;
use json::Doc;
use sum::Docs;

pub use crate::bounds::MAX_USAGE;
/// The most a [`UsageReader`] holds per path it reads: a scanner and the path (at most 8
/// segments of 64 bytes, stored joined). Measured by the unit tests; no body, string or
/// event is buffered.
pub const PATH_BYTES: usize = 160 + MAX_SEGMENTS * MAX_SEGMENT_LEN;
/// The most a [`UsageReader`] holds besides its paths.
pub const READER_BASE_BYTES: usize = 192;
/// The most a [`UsageReader`] of one path holds.
pub const READER_BYTES: usize = READER_BASE_BYTES + PATH_BYTES;

/// How a response body is read, from its `content-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    Json,
    EventStream,
}

/// The media type of a `content-type` value, parameters ignored, compared case-insensitively:
/// `application/json` and any `application/*+json` (a JSON body whatever its vocabulary) are
/// [`BodyKind::Json`], `text/event-stream` is [`BodyKind::EventStream`], anything else `None`.
pub fn body_kind(content_type: &[u8]) -> Option<BodyKind> {
    let media = content_type
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    let (kind, subtype) = split_once(media, b'/')?;
    if kind.eq_ignore_ascii_case(b"application")
        && (subtype.eq_ignore_ascii_case(b"json") || ends_with_ignore_case(subtype, b"+json"))
        && !subtype.eq_ignore_ascii_case(b"+json")
    {
        return Some(BodyKind::Json);
    }
    if kind.eq_ignore_ascii_case(b"text") && subtype.eq_ignore_ascii_case(b"event-stream") {
        return Some(BodyKind::EventStream);
    }
    None
}

fn split_once(bytes: &[u8], at: u8) -> Option<(&[u8], &[u8])> {
    let i = bytes.iter().position(|&b| b == at)?;
    Some((bytes.get(..i)?, bytes.get(i + 1..)?))
}

fn ends_with_ignore_case(bytes: &[u8], suffix: &[u8]) -> bool {
    bytes.len() >= suffix.len()
        && bytes
            .get(bytes.len() - suffix.len()..)
            .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
}

/// What a response said it cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageRead {
    /// A whole number from 0 to [`MAX_USAGE`].
    Found(u64),
    /// Nothing (or `null`) at the path; the body itself was readable.
    Missing,
    /// The usage cannot be trusted; the engine keeps the estimate.
    Invalid(Unreadable),
}

/// Why a usage could not be read. [`Unreadable::name`] is the label in logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// Malformed JSON anywhere in the body (or in an event's data), invalid UTF-8 in a string,
    /// an empty JSON body.
    NotJson,
    /// The body (or the stream, with no usage before the cut) ended early.
    Truncated,
    /// The body is longer than the reader's bound.
    BodyTooLarge,
    /// JSON nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// A key of the path appears twice in one object.
    DuplicateKey,
    /// The value is a string, an object, an array or a boolean.
    NotANumber,
    Negative,
    /// A fraction or an exponent (`1.5`, `12.0`, `1e3`): usage is written as an integer.
    NotAnInteger,
    /// Above [`MAX_USAGE`].
    OutOfRange,
}

impl Unreadable {
    pub fn name(self) -> &'static str {
        match self {
            Unreadable::NotJson => "not_json",
            Unreadable::Truncated => "truncated",
            Unreadable::BodyTooLarge => "body_too_large",
            Unreadable::TooDeep => "too_deep",
            Unreadable::DuplicateKey => "duplicate_key",
            Unreadable::NotANumber => "not_a_number",
            Unreadable::Negative => "negative",
            Unreadable::NotAnInteger => "not_an_integer",
            Unreadable::OutOfRange => "out_of_range",
        }
    }
}

/// Reads the usage of a response body as its chunks pass.
#[derive(Debug)]
pub struct UsageReader {
    body: Body,
    max_body: u64,
    bytes: u64,
}

#[derive(Debug)]
enum Body {
    Json(Docs),
    Events(Events),
}

impl UsageReader {
    /// `path` as [`parse_usage_path`] gives it; a path it would refuse is never found
    /// ([`UsageRead::Missing`]). A body longer than `max_body` bytes is
    /// [`Unreadable::BodyTooLarge`].
    pub fn new(kind: BodyKind, path: &[String], max_body: u64) -> Self {
        Self::of(kind, &BodyUsage::first_of(vec![path.to_vec()]), max_body)
    }

    /// Reads `usage`: each field at the first of its paths present, weighted and added up.
    /// Paths past [`MAX_READ_PATHS`] are not read.
    pub fn of(kind: BodyKind, usage: &BodyUsage, max_body: u64) -> Self {
        let body = match kind {
            BodyKind::Json => Body::Json(Docs::new(usage)),
            BodyKind::EventStream => Body::Events(Events::new(usage)),
        };
        UsageReader {
            body,
            max_body,
            bytes: 0,
        }
    }

    /// Scans a chunk. Never fails, never allocates; once [`Self::done`], chunks are ignored.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.done() {
            return;
        }
        self.bytes = self.bytes.saturating_add(chunk.len() as u64);
        if self.bytes > self.max_body {
            return;
        }
        match &mut self.body {
            Body::Json(docs) => docs.feed(chunk),
            Body::Events(events) => events.feed(chunk),
        }
    }

    /// The verdict once the body ended; `complete = false` when it ended early (reset, client
    /// gone). A JSON body counts only if its whole document was read (then `complete` does not
    /// matter); an event stream gives what its dispatched events gave, a cut stream that gave
    /// no usage being [`Unreadable::Truncated`].
    pub fn finish(&mut self, complete: bool) -> UsageRead {
        if self.bytes > self.max_body {
            return UsageRead::Invalid(Unreadable::BodyTooLarge);
        }
        match &mut self.body {
            Body::Json(docs) => match docs.usage() {
                Doc::Empty => UsageRead::Invalid(Unreadable::NotJson),
                Doc::Read(read) => read,
            },
            Body::Events(events) => events.finish(complete),
        }
    }

    /// What this reader holds: its own size, its scanners and its paths' bytes. Constant
    /// while reading (at most [`READER_BASE_BYTES`] plus [`PATH_BYTES`] per path).
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + match &self.body {
                Body::Json(docs) => docs.heap_bytes(),
                Body::Events(events) => events.heap_bytes(),
            }
    }

    /// True once more bytes cannot change the verdict: the body went over its bound, or (JSON)
    /// it is already unreadable. An event stream is read to its end: a later event may carry
    /// the usage.
    pub fn done(&self) -> bool {
        self.bytes > self.max_body
            || match &self.body {
                Body::Json(docs) => docs.failed(),
                Body::Events(_) => false,
            }
    }
}

/// Parses a `body:` usage path (`usage.total_tokens`): 1 to 8 dot-separated segments, each 1
/// to 64 bytes of `[A-Za-z0-9_-]`.
pub fn parse_usage_path(text: &str) -> Result<Vec<String>, String> {
    let segments: Vec<String> = text.split('.').map(str::to_string).collect();
    if segments.len() > MAX_SEGMENTS {
        return Err(format!(
            "a usage path has at most {MAX_SEGMENTS} dot-separated segments"
        ));
    }
    for segment in &segments {
        if segment.is_empty() || segment.len() > MAX_SEGMENT_LEN {
            return Err(format!(
                "each segment of a usage path (dot-separated) has 1 to {MAX_SEGMENT_LEN} characters"
            ));
        }
        if !segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(format!(
                "a usage path segment holds only A-Z, a-z, 0-9, '_' and '-' (got {segment:?})"
            ));
        }
    }
    Ok(segments)
}
