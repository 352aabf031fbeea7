//! What a rule matches: a request's path and method, and conditions on any source's value (a
//! header, a claim Envoy verified, a query parameter), a plan's among them.

use super::KeySource;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Match {
    pub path: Option<PathMatch>,
    /// Upper-case methods; empty matches any.
    pub methods: Vec<String>,
    /// Each must hold: `match.header`, `match.sources`, and a plan's own condition.
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
}

/// A test of one source's value. A source with an empty value is absent, as for keys.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub source: KeySource,
    pub test: Test,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Test {
    Present,
    Absent,
    /// Present and equal to one of these (none empty).
    In(Vec<Vec<u8>>),
    /// Absent, or equal to none of these: a rule's default plan.
    NotIn(Vec<Vec<u8>>),
}

impl Test {
    /// Whether a source whose value is `value` (None: absent or empty) passes.
    pub fn passes(&self, value: Option<&[u8]>) -> bool {
        let value = value.filter(|v| !v.is_empty());
        match self {
            Test::Present => value.is_some(),
            Test::Absent => value.is_none(),
            Test::In(values) => value.is_some_and(|v| values.iter().any(|w| w == v)),
            Test::NotIn(values) => !value.is_some_and(|v| values.iter().any(|w| w == v)),
        }
    }
}
