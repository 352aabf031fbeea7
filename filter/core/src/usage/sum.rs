//! What a body's usage is made of: one or more fields added up (Anthropic reports input and
//! output apart), each read at the first of its paths that is present (one format's JSON and
//! stream put it at different paths). Every path has its own [`Scanner`] fed the same bytes:
//! the scanner keeps no key or value, so each path costs a constant.

use super::json::{Doc, Scanner};
use super::path::Path;
use super::{Unreadable, UsageRead, MAX_USAGE};

/// The most paths a configured list reads (`"from": ["body:…", …]`).
pub const MAX_PATHS: usize = 8;
/// The most paths one usage is read at (OpenAI's weighted input, output and cached input at
/// three paths each).
pub const MAX_READ_PATHS: usize = 9;
/// The most fields one usage adds up.
pub const MAX_FIELDS: usize = 4;
/// A weight of 1, in the thousandths weights are counted in.
pub const WHOLE: i64 = 1000;

/// One number of the usage: the first of its paths present in a document, times its weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub paths: Vec<Vec<String>>,
    /// A document without it has no usage; an optional field absent counts 0.
    pub required: bool,
    /// In thousandths ([`WHOLE`] is 1); negative to take a part of another field out (OpenAI
    /// counts cached input inside the input).
    pub weight: i64,
}

/// What each kind of token costs in the limit's units, in thousandths (1.5 is 1,500): input
/// not read from a cache, output, input read from a cache, and Anthropic's cache writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Weights {
    pub input: i64,
    pub output: i64,
    pub cached_input: i64,
    pub cache_write: i64,
}

/// A body's usage: the sum of its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyUsage {
    pub fields: Vec<Field>,
}

fn segments(path: &str) -> Vec<String> {
    path.split('.').map(str::to_string).collect()
}

impl BodyUsage {
    /// One number, at the first of `paths` present.
    pub fn first_of(paths: Vec<Vec<String>>) -> Self {
        BodyUsage {
            fields: vec![Field {
                paths,
                required: true,
                weight: WHOLE,
            }],
        }
    }

    /// OpenAI's counts weighted: `prompt_tokens` (chat completions, completions) or
    /// `input_tokens` (the Responses API, also in its stream's `response.completed`) hold the
    /// cached input too, so the cached count is weighted `cached_input - input`; output is
    /// `completion_tokens` or `output_tokens`.
    pub fn openai_weighted(w: &Weights) -> Self {
        let field = |names: [&str; 3], required: bool, weight: i64| Field {
            paths: names.iter().map(|n| segments(n)).collect(),
            required,
            weight,
        };
        BodyUsage {
            fields: vec![
                field(
                    [
                        "usage.prompt_tokens",
                        "usage.input_tokens",
                        "response.usage.input_tokens",
                    ],
                    true,
                    w.input,
                ),
                field(
                    [
                        "usage.completion_tokens",
                        "usage.output_tokens",
                        "response.usage.output_tokens",
                    ],
                    true,
                    w.output,
                ),
                field(
                    [
                        "usage.prompt_tokens_details.cached_tokens",
                        "usage.input_tokens_details.cached_tokens",
                        "response.usage.input_tokens_details.cached_tokens",
                    ],
                    false,
                    w.cached_input - w.input,
                ),
            ],
        }
    }

    /// OpenAI: chat completions, completions and embeddings (JSON, and a stream's last chunk
    /// with `stream_options.include_usage`) at `usage.total_tokens`; the Responses API's
    /// stream in its `response.completed` event at `response.usage.total_tokens`.
    pub fn openai() -> Self {
        Self::first_of(vec![
            segments("usage.total_tokens"),
            segments("response.usage.total_tokens"),
        ])
    }

    /// Anthropic's Messages API: input plus output tokens plus both cache counts when present
    /// (Anthropic bills cache writes and reads as input tokens kept apart from
    /// `input_tokens`). JSON and `message_delta` carry them at `usage`, `message_start` at
    /// `message.usage`; the last event carrying each field wins (the counts are cumulative).
    pub fn anthropic() -> Self {
        Self::anthropic_weighted(&Weights {
            input: WHOLE,
            output: WHOLE,
            cached_input: WHOLE,
            cache_write: WHOLE,
        })
    }

    /// [`Self::anthropic`] with each count weighted: `input_tokens` (input not in a cache),
    /// `output_tokens`, `cache_read_input_tokens` (cached input) and
    /// `cache_creation_input_tokens` (cache writes).
    pub fn anthropic_weighted(w: &Weights) -> Self {
        let field = |name: &str, required: bool, weight: i64| Field {
            paths: vec![
                segments(&format!("usage.{name}")),
                segments(&format!("message.usage.{name}")),
            ],
            required,
            weight,
        };
        BodyUsage {
            fields: vec![
                field("input_tokens", true, w.input),
                field("output_tokens", true, w.output),
                field("cache_creation_input_tokens", false, w.cache_write),
                field("cache_read_input_tokens", false, w.cached_input),
            ],
        }
    }

    /// Every path read, in order.
    pub fn paths(&self) -> impl Iterator<Item = &Vec<String>> {
        self.fields.iter().flat_map(|f| f.paths.iter())
    }
}

/// The usage once each field's read is known (None: in no document); bit `i` of
/// `required` set: field `i` is required; `weights[i]` its weight in thousandths. The
/// weighted sum is rounded up to a whole unit (a weighted usage is never charged short), and
/// one below 0 (a cached count above its input) is 0.
pub(crate) fn combine(
    required: u8,
    weights: &[i64; MAX_FIELDS],
    reads: impl Iterator<Item = Option<UsageRead>>,
) -> UsageRead {
    let mut total: i128 = 0;
    let mut missing = false;
    for (i, read) in reads.enumerate().take(MAX_FIELDS) {
        match read.unwrap_or(UsageRead::Missing) {
            UsageRead::Found(n) => {
                total += i128::from(n) * i128::from(weights.get(i).copied().unwrap_or(WHOLE))
            }
            UsageRead::Missing => missing |= required & (1 << i) != 0,
            invalid @ UsageRead::Invalid(_) => return invalid,
        }
    }
    let whole = i128::from(WHOLE);
    let units = (total.max(0) + whole - 1) / whole;
    if missing {
        UsageRead::Missing
    } else if units > i128::from(MAX_USAGE) {
        UsageRead::Invalid(Unreadable::OutOfRange)
    } else {
        UsageRead::Found(units as u64)
    }
}

/// One JSON document read at every path of a [`BodyUsage`].
#[derive(Debug)]
pub(crate) struct Docs {
    /// Each path's scanner and the index of its field, in the usage's order.
    scans: Vec<(Scanner, Path, u8)>,
    pub(crate) fields: u8,
    /// Bit `i` set: field `i` is required.
    pub(crate) required: u8,
    /// Field `i`'s weight, in thousandths.
    pub(crate) weights: [i64; MAX_FIELDS],
}

impl Docs {
    pub(crate) fn new(usage: &BodyUsage) -> Self {
        let count = usage.paths().count().min(MAX_READ_PATHS);
        let mut scans = Vec::with_capacity(count);
        let mut required = 0;
        let mut weights = [WHOLE; MAX_FIELDS];
        let fields = usage.fields.len().min(MAX_FIELDS);
        for (index, field) in usage.fields.iter().take(MAX_FIELDS).enumerate() {
            if field.required {
                required |= 1 << index;
            }
            if let Some(w) = weights.get_mut(index) {
                *w = field.weight;
            }
            for path in &field.paths {
                if scans.len() < MAX_READ_PATHS {
                    scans.push((Scanner::new(), Path::new(path), index as u8));
                }
            }
        }
        Docs {
            scans,
            fields: fields as u8,
            required,
            weights,
        }
    }

    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for (scanner, path, _) in &mut self.scans {
            scanner.feed(bytes, path);
        }
    }

    /// Every scanner failed: more bytes change nothing.
    pub(crate) fn failed(&self) -> bool {
        self.scans.iter().all(|(scanner, _, _)| scanner.failed())
    }

    /// Field `field` of the whole document: its first path present (or its last verdict).
    pub(crate) fn field(&mut self, field: usize) -> Doc {
        let mut doc = Doc::Empty;
        for (scanner, _, _) in self.scans.iter_mut().filter(|s| usize::from(s.2) == field) {
            doc = scanner.end();
            if !matches!(doc, Doc::Empty | Doc::Read(UsageRead::Missing)) {
                return doc;
            }
        }
        doc
    }

    /// The usage of a whole document.
    pub(crate) fn usage(&mut self) -> Doc {
        let mut empty = true;
        let mut reads = [None; MAX_FIELDS];
        for (i, read) in reads.iter_mut().enumerate().take(usize::from(self.fields)) {
            *read = match self.field(i) {
                Doc::Empty => None,
                Doc::Read(r) => {
                    empty = false;
                    Some(r)
                }
            };
        }
        if empty {
            return Doc::Empty;
        }
        Doc::Read(combine(self.required, &self.weights, reads.into_iter()))
    }

    /// Ready for the next document, without allocating.
    pub(crate) fn reset(&mut self) {
        for (scanner, _, _) in &mut self.scans {
            *scanner = Scanner::new();
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.scans.capacity() * std::mem::size_of::<(Scanner, Path, u8)>()
            + self
                .scans
                .iter()
                .map(|(_, path, _)| path.heap_bytes())
                .sum::<usize>()
    }
}
