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

/// An upper bound of a request's usage from its body as it passes: its byte count (each token
/// of a byte-level BPE tokenizer is at least one byte of the prompt, and the JSON around the
/// text only adds bytes) plus the completion it may ask for: the top-level
/// `max_completion_tokens`, else `max_tokens`, else the configured default.
#[derive(Debug)]
pub struct RequestEstimate {
    max_body: u64,
    bytes: u64,
    completion: Scanner,
    completion_path: Path,
    tokens: Scanner,
    tokens_path: Path,
}

impl RequestEstimate {
    pub fn new(max_body: u64) -> Self {
        RequestEstimate {
            max_body,
            bytes: 0,
            completion: Scanner::new(),
            completion_path: Path::of(&["max_completion_tokens"]),
            tokens: Scanner::new(),
            tokens_path: Path::of(&["max_tokens"]),
        }
    }

    /// Counts and scans a chunk; never fails, never allocates.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.bytes = self.bytes.saturating_add(chunk.len() as u64);
        if self.bytes > self.max_body {
            return;
        }
        self.completion.feed(chunk, &self.completion_path);
        self.tokens.feed(chunk, &self.tokens_path);
    }

    /// True once the body went over `max_body`: the request can be answered 413 without
    /// waiting for its end.
    pub fn too_large(&self) -> bool {
        self.bytes > self.max_body
    }

    /// The bytes plus the first usable of `max_completion_tokens` and `max_tokens` (a whole
    /// number from 0 to 10^12 in a body that is whole valid JSON), else `completion_default`.
    /// A value that is not usable (a string, negative, a duplicate, a body that is not JSON)
    /// falls back like an absent one: the estimate only bounds, and usage above it is charged
    /// as debt when the response tells it.
    pub fn finish(&mut self, completion_default: u64) -> Result<u64, EstimateError> {
        if self.bytes > self.max_body {
            return Err(EstimateError::TooLarge);
        }
        let completion = [self.completion.end(), self.tokens.end()]
            .into_iter()
            .find_map(|doc| match doc {
                Doc::Read(UsageRead::Found(n)) => Some(n),
                _ => None,
            })
            .unwrap_or(completion_default);
        Ok(self.bytes.saturating_add(completion))
    }
}
