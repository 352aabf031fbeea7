//! The request as the limiter reads it: the host's view of one request, the header lookups
//! every part of a plan shares, and the answer to a request it refuses to read.

use crate::config::{BodyPath, MetadataPath};
use crate::usage::OutputKeys;

/// What the limiter may read of a request.
pub trait RequestView {
    /// A request header's raw value (`:path` and `:method` included); the first copy if the
    /// header was sent more than once. Borrowed: the host reads the headers once per request,
    /// and a plan looks several of them up.
    fn header(&self, name: &str) -> Option<&[u8]>;
    /// How many copies of the header the request carries (0: absent). Envoy's single-value
    /// lookup returns only the first copy, so the host must count them over the whole map.
    fn header_copies(&self, name: &str) -> usize;
    /// The downstream peer, `ip:port`.
    fn source_address(&self) -> Option<String>;
    /// The name of the route Envoy picked, if it has one.
    fn route_name(&self) -> Option<String>;
    /// The stream's dynamic metadata at `path` as the host hands it over (a string's bytes; a
    /// number, a bool, a list or a struct serialized), None when absent or unreadable.
    fn metadata(&self, path: &MetadataPath) -> Option<Vec<u8>> {
        let _ = path;
        None
    }
    /// The value at a `body:` path of the request's JSON body (see `request::body`): None
    /// while the body has not been read (a decision made at the headers) or when absent;
    /// refused when a key of the path appears twice.
    fn body_field(&self, path: &BodyPath) -> Result<Option<&[u8]>, BadRequest> {
        let _ = path;
        Ok(None)
    }
    /// The estimate of a usage limit with `estimate.request` whose completion default is
    /// `completion_default` and whose output bound is read at `keys`, read from the request
    /// body: its input bound (the body's bytes) and its output bound (None: no body was read;
    /// the estimate is then the completion default alone).
    fn usage_estimate(&self, completion_default: u64, keys: OutputKeys) -> Option<(u64, u64)> {
        let _ = (completion_default, keys);
        None
    }
}

/// The first copy of header `name` in a request's whole header map as the host reads it
/// (names compare case-insensitively): what [`RequestView::header`] returns.
pub fn first_header<'h>(headers: &'h [(String, Vec<u8>)], name: &str) -> Option<&'h [u8]> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_slice())
}

/// How many copies of header `name` that map holds: what [`RequestView::header_copies`]
/// returns.
pub fn header_count(headers: &[(String, Vec<u8>)], name: &str) -> usize {
    headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .count()
}

/// The path without its query string, so `?x=1` cannot make a new bucket or dodge a match.
pub(crate) fn path_only(path: &[u8]) -> &[u8] {
    let end = path.iter().position(|&b| b == b'?').unwrap_or(path.len());
    &path[..end]
}

/// A header the limiter decides on (a key source, the cost, a rule's `match.header`). Sent
/// more than once it refuses the request: the limiter and the backend could read different
/// copies (the first, the last, or all joined), so a client would be limited as one caller and
/// served as another.
pub(crate) fn decisive_header<'v>(
    view: &'v dyn RequestView,
    name: &str,
) -> Result<Option<&'v [u8]>, BadRequest> {
    if view.header_copies(name) > 1 {
        return Err(BadRequest(format!("{name} must be sent once")));
    }
    Ok(view.header(name))
}

/// A request the limiter refuses before deciding anything (answered with 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub String);
