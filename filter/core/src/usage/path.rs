//! The key path a usage is read at, held in one allocation made when a reader is created.

use super::{MAX_SEGMENTS, MAX_SEGMENT_LEN};

/// A usage path, its segments joined in one allocation made when the reader is created.
#[derive(Debug)]
pub(crate) struct Path {
    joined: Box<[u8]>,
    ends: [u16; MAX_SEGMENTS],
    count: u8,
}

impl Path {
    /// A path outside [`super::parse_usage_path`]'s bounds keeps no segment: never found.
    pub(crate) fn new(segments: &[String]) -> Self {
        let mut path = Path {
            joined: Box::default(),
            ends: [0; MAX_SEGMENTS],
            count: 0,
        };
        let usable = !segments.is_empty()
            && segments.len() <= MAX_SEGMENTS
            && segments
                .iter()
                .all(|s| !s.is_empty() && s.len() <= MAX_SEGMENT_LEN);
        if !usable {
            return path;
        }
        let mut joined = Vec::with_capacity(segments.iter().map(String::len).sum());
        for (end, segment) in path.ends.iter_mut().zip(segments) {
            joined.extend_from_slice(segment.as_bytes());
            *end = joined.len() as u16;
        }
        path.joined = joined.into_boxed_slice();
        path.count = segments.len() as u8;
        path
    }

    /// A path of static segments (the request estimate's keys).
    pub(crate) fn of(segments: &[&str]) -> Self {
        let owned: Vec<String> = segments.iter().map(|s| s.to_string()).collect();
        Path::new(&owned)
    }

    pub(crate) fn len(&self) -> usize {
        self.count as usize
    }

    pub(crate) fn segment(&self, i: usize) -> &[u8] {
        if i >= self.len() {
            return &[];
        }
        let start = match i.checked_sub(1).and_then(|p| self.ends.get(p)) {
            Some(&end) => end as usize,
            None => 0,
        };
        let end = self.ends.get(i).map_or(0, |&e| e as usize);
        self.joined.get(start..end).unwrap_or_default()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.joined.len()
    }
}
