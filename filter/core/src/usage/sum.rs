//! What a body's usage is made of: one or more fields added up (Anthropic reports input and
//! output apart), each read at the first of its paths that is present (one format's JSON and
//! stream put it at different paths). Every path has its own [`Scanner`] fed the same bytes:
//! the scanner keeps no key or value, so each path costs a constant.

use super::json::{Doc, Scanner};
use super::path::Path;
use super::{Unreadable, UsageRead, MAX_USAGE};

/// The most paths one usage is read at (Anthropic's four fields at two paths each).
pub const MAX_PATHS: usize = 8;

/// One number of the usage: the first of its paths present in a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub paths: Vec<Vec<String>>,
    /// A document without it has no usage; an optional field absent counts 0.
    pub required: bool,
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
            }],
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
        let field = |name: &str, required: bool| Field {
            paths: vec![
                segments(&format!("usage.{name}")),
                segments(&format!("message.usage.{name}")),
            ],
            required,
        };
        BodyUsage {
            fields: vec![
                field("input_tokens", true),
                field("output_tokens", true),
                field("cache_creation_input_tokens", false),
                field("cache_read_input_tokens", false),
            ],
        }
    }

    /// Every path read, in order.
    pub fn paths(&self) -> impl Iterator<Item = &Vec<String>> {
        self.fields.iter().flat_map(|f| f.paths.iter())
    }
}

/// The usage once each field's read is known (None: in no document); bit `i` of
/// `required` set: field `i` is required.
pub(crate) fn combine(required: u8, reads: impl Iterator<Item = Option<UsageRead>>) -> UsageRead {
    let mut total: u64 = 0;
    let mut missing = false;
    for (i, read) in reads.enumerate() {
        match read.unwrap_or(UsageRead::Missing) {
            UsageRead::Found(n) => total = total.saturating_add(n),
            UsageRead::Missing => missing |= required & (1 << i) != 0,
            invalid @ UsageRead::Invalid(_) => return invalid,
        }
    }
    if missing {
        UsageRead::Missing
    } else if total > MAX_USAGE {
        UsageRead::Invalid(Unreadable::OutOfRange)
    } else {
        UsageRead::Found(total)
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
}

impl Docs {
    pub(crate) fn new(usage: &BodyUsage) -> Self {
        let count = usage.paths().count().min(MAX_PATHS);
        let mut scans = Vec::with_capacity(count);
        let mut required = 0;
        let fields = usage.fields.len().min(MAX_PATHS);
        for (index, field) in usage.fields.iter().take(MAX_PATHS).enumerate() {
            if field.required {
                required |= 1 << index;
            }
            for path in &field.paths {
                if scans.len() < MAX_PATHS {
                    scans.push((Scanner::new(), Path::new(path), index as u8));
                }
            }
        }
        Docs {
            scans,
            fields: fields as u8,
            required,
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
        let mut reads = [None; MAX_PATHS];
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
        Doc::Read(combine(self.required, reads.into_iter()))
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
