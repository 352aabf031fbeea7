use super::json::{Doc, Scanner};
use super::path::Path;
use super::UsageRead;

/// Why a request's estimate could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EstimateError {
    /// The request body is longer than `max_body` (the request is answered 413).
    TooLarge,
}

impl EstimateError {
    pub fn name(self) -> &'static str {
        match self {
            EstimateError::TooLarge => "too_large",
        }
    }
}

/// Which top-level keys of a request body bound its output, first present first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKeys {
    /// `max_completion_tokens`, then `max_tokens` (OpenAI chat completions and completions).
    Completion,
    /// Those, then `max_output_tokens` (OpenAI's Responses API).
    OpenAi,
    /// `max_tokens` (Anthropic's Messages API, where it is required).
    Anthropic,
}

/// The keys scanned, in [`OutputKeys`]' order of preference.
const MAX_COMPLETION_TOKENS: usize = 0;
const MAX_TOKENS: usize = 1;
const MAX_OUTPUT_TOKENS: usize = 2;
const OUTPUT_KEYS: [&str; 3] = ["max_completion_tokens", "max_tokens", "max_output_tokens"];

impl OutputKeys {
    fn order(self) -> &'static [usize] {
        match self {
            OutputKeys::Completion => &[MAX_COMPLETION_TOKENS, MAX_TOKENS],
            OutputKeys::OpenAi => &[MAX_COMPLETION_TOKENS, MAX_TOKENS, MAX_OUTPUT_TOKENS],
            OutputKeys::Anthropic => &[MAX_TOKENS],
        }
    }
}

/// Where a streamed request lacking `stream_options.include_usage` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncludeUsage {
    /// The offset of the `{` the text goes right after.
    at: u64,
    /// Into the request's own `stream_options` object (else a new member of the top level).
    inside: bool,
}

impl IncludeUsage {
    /// The body with the option added; None if `body` is not the body scanned.
    pub fn apply(&self, body: &[u8]) -> Option<Vec<u8>> {
        let at = usize::try_from(self.at).ok()?.checked_add(1)?;
        let (head, tail) = (body.get(..at)?, body.get(at..)?);
        if head.last() != Some(&b'{') {
            return None;
        }
        let insert: &[u8] = if !self.inside {
            // The top level holds `stream` at least: a member follows.
            br#""stream_options":{"include_usage":true},"#
        } else if tail.trim_ascii_start().first() == Some(&b'}') {
            br#""include_usage":true"#
        } else {
            br#""include_usage":true,"#
        };
        let mut edited = Vec::with_capacity(body.len() + insert.len());
        edited.extend_from_slice(head);
        edited.extend_from_slice(insert);
        edited.extend_from_slice(tail);
        Some(edited)
    }
}

/// The `stream` flag and `stream_options` of a request, scanned only when the filter may add
/// `include_usage`.
#[derive(Debug)]
struct StreamKeys {
    stream: (Scanner, Path),
    options: (Scanner, Path),
    include_usage: (Scanner, Path),
}

/// An upper bound of a request's usage from its body as it passes: its byte count (each token
/// of a byte-level BPE tokenizer is at least one byte of the prompt, and the JSON around the
/// text only adds bytes) plus the completion it may ask for: the first of its top-level
/// output bounds present ([`OutputKeys`]), else the configured default.
#[derive(Debug)]
pub struct RequestEstimate {
    max_body: u64,
    bytes: u64,
    outputs: [(Scanner, Path); 3],
    stream: Option<Box<StreamKeys>>,
}

impl RequestEstimate {
    pub fn new(max_body: u64) -> Self {
        RequestEstimate {
            max_body,
            bytes: 0,
            outputs: OUTPUT_KEYS.map(|key| (Scanner::new(), Path::of(&[key]))),
            stream: None,
        }
    }

    /// Also scans `stream` and `stream_options.include_usage` ([`Self::include_usage`]).
    pub fn with_stream_keys(mut self) -> Self {
        self.stream = Some(Box::new(StreamKeys {
            stream: (Scanner::new(), Path::of(&["stream"])),
            options: (Scanner::new(), Path::of(&["stream_options"])),
            include_usage: (
                Scanner::new(),
                Path::of(&["stream_options", "include_usage"]),
            ),
        }));
        self
    }

    /// Counts and scans a chunk; never fails, never allocates.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.bytes = self.bytes.saturating_add(chunk.len() as u64);
        if self.bytes > self.max_body {
            return;
        }
        for (scanner, path) in &mut self.outputs {
            scanner.feed(chunk, path);
        }
        if let Some(keys) = self.stream.as_mut() {
            for (scanner, path) in [&mut keys.stream, &mut keys.options, &mut keys.include_usage] {
                scanner.feed(chunk, path);
            }
        }
    }

    /// True once the body went over `max_body`: the request can be answered 413 without
    /// waiting for its end.
    pub fn too_large(&self) -> bool {
        self.bytes > self.max_body
    }

    /// [`Self::finish_with`] the keys of chat completions.
    pub fn finish(&mut self, completion_default: u64) -> Result<u64, EstimateError> {
        self.finish_with(completion_default, OutputKeys::Completion)
    }

    /// The bytes plus the first usable of `keys` (a whole number from 0 to 10^12 in a body
    /// that is whole valid JSON), else `completion_default`. A value that is not usable (a
    /// string, negative, a duplicate, a body that is not JSON) falls back like an absent one:
    /// the estimate only bounds, and usage above it is charged as debt when the response
    /// tells it.
    pub fn finish_with(
        &mut self,
        completion_default: u64,
        keys: OutputKeys,
    ) -> Result<u64, EstimateError> {
        let (input, output) = self.finish_parts(completion_default, keys)?;
        Ok(input.saturating_add(output))
    }

    /// [`Self::finish_with`]'s two parts: the input bound (the body's bytes) and the output
    /// bound (the first usable of `keys`, else `completion_default`).
    pub fn finish_parts(
        &mut self,
        completion_default: u64,
        keys: OutputKeys,
    ) -> Result<(u64, u64), EstimateError> {
        if self.bytes > self.max_body {
            return Err(EstimateError::TooLarge);
        }
        let mut completion = completion_default;
        for &i in keys.order() {
            if let Some((scanner, _)) = self.outputs.get_mut(i) {
                if let Doc::Read(UsageRead::Found(n)) = scanner.end() {
                    completion = n;
                    break;
                }
            }
        }
        Ok((self.bytes, completion))
    }

    /// Where to add `"include_usage": true`: a whole JSON object with `"stream": true`, no
    /// `stream_options.include_usage` (a client's own `false` is kept) and a `stream_options`
    /// that is absent or an object. None otherwise, or without [`Self::with_stream_keys`].
    pub fn include_usage(&mut self) -> Option<IncludeUsage> {
        if self.bytes > self.max_body {
            return None;
        }
        let keys = self.stream.as_mut()?;
        for (scanner, _) in [&mut keys.stream, &mut keys.options, &mut keys.include_usage] {
            scanner.end();
        }
        if keys.stream.0.flag() != Some(true) || keys.include_usage.0.target_at().is_some() {
            return None;
        }
        match keys.options.0.target_at() {
            None => Some(IncludeUsage {
                at: keys.stream.0.doc_at()?,
                inside: false,
            }),
            Some((at, b'{')) => Some(IncludeUsage { at, inside: true }),
            Some(_) => None,
        }
    }
}
