//! The values a key, a condition or a plan reads in the request body's JSON (`body:model`).
//! Each path is scanned as the body passes, by the usage reader's scanner (whole valid JSON,
//! nesting bounded, the body not parsed into memory); once the body has ended each value is
//! read back from where the scanner found it, in the body Envoy holds (at most
//! `MAX_VALUE_READ` bytes).

use super::view::BadRequest;
use crate::bounds::MAX_SOURCE_VALUE_BYTES;
use crate::config::BodyPath;
use crate::usage::json::{Doc, Scanner};
use crate::usage::path::Path;
use crate::usage::{Unreadable, UsageRead};

/// The most bytes read for one value: the longest value a source may give, every byte
/// written as a `\uXXXX` escape, and its quotes.
const MAX_VALUE_READ: usize = MAX_SOURCE_VALUE_BYTES * 6 + 2;

/// The scanners of the config's `body:` paths over one request body.
#[derive(Debug)]
pub struct BodyFields {
    fields: Vec<(BodyPath, Scanner, Path)>,
}

impl BodyFields {
    pub fn new(paths: &[BodyPath]) -> Self {
        BodyFields {
            fields: paths
                .iter()
                .map(|p| (p.clone(), Scanner::new(), Path::new(&p.keys)))
                .collect(),
        }
    }

    /// Scans the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        for (_, scanner, path) in &mut self.fields {
            scanner.feed(chunk, path);
        }
    }

    /// The values once the body (`size` bytes) has ended, each read through `read(offset,
    /// len)` from the body as it was scanned (read them before the body is edited).
    pub fn values(&mut self, size: u64, read: &mut dyn FnMut(u64, usize) -> Vec<u8>) -> BodyValues {
        let mut values = Vec::with_capacity(self.fields.len());
        for (path, scanner, _) in &mut self.fields {
            let doc = scanner.end();
            let field = if doc == Doc::Empty {
                Field::Absent
            } else if doc == Doc::Read(UsageRead::Invalid(Unreadable::DuplicateKey)) {
                Field::Repeated
            } else if scanner.doc_at().is_none() {
                // Not whole valid JSON (malformed, cut, nested too deep).
                Field::Unreadable
            } else {
                match scanner.target_at() {
                    Some((at, _)) if at < size => {
                        let len = usize::try_from(size - at)
                            .map_or(MAX_VALUE_READ, |n| n.min(MAX_VALUE_READ));
                        decode(&read(at, len)).map_or(Field::Absent, Field::Value)
                    }
                    _ => Field::Absent,
                }
            };
            values.push((path.clone(), field));
        }
        BodyValues(values)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    Value(Vec<u8>),
    Absent,
    /// A key on the path appears twice in one object.
    Repeated,
    /// The body is not whole valid JSON.
    Unreadable,
}

/// The `body:` values of one request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BodyValues(Vec<(BodyPath, Field)>);

impl BodyValues {
    /// The value at `path`; None if absent (no such member, `null`, `""`, an object or a list,
    /// a value longer than [`MAX_SOURCE_VALUE_BYTES`], an empty body). Refuses the request if
    /// a key of the path appears twice in one object (the limiter and the upstream could read
    /// different copies, the first or the last, as with a repeated header), or if the body is
    /// not whole valid JSON: a lenient upstream may still read a member the limiter cannot
    /// (after a byte-order mark, beside a `NaN`), so such a body cannot dodge the rule.
    pub fn get(&self, path: &BodyPath) -> Result<Option<&[u8]>, BadRequest> {
        match self.0.iter().find(|(p, _)| p == path).map(|(_, f)| f) {
            Some(Field::Value(v)) => Ok(Some(v)),
            Some(Field::Repeated) => Err(BadRequest(format!(
                "the body's {} must be sent once",
                path.keys.join(".")
            ))),
            Some(Field::Unreadable) => Err(BadRequest(format!(
                "the body must be JSON: it is read for body:{}",
                path.keys.join(":")
            ))),
            Some(Field::Absent) | None => Ok(None),
        }
    }
}

/// The value starting at `text[0]` as a source gives it: a string decoded, a number as
/// written, `true` / `false` as their text. None for anything else, and for an empty string.
fn decode(text: &[u8]) -> Option<Vec<u8>> {
    let value = match text.first()? {
        b'"' => {
            use serde::Deserialize;
            let mut de = serde_json::Deserializer::from_slice(text);
            // A cut string (longer than the read) fails here: too long is absent.
            String::deserialize(&mut de).ok()?.into_bytes()
        }
        b'-' | b'0'..=b'9' => {
            let end = text
                .iter()
                .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                .unwrap_or(text.len());
            text.get(..end)?.to_vec()
        }
        b't' => b"true".to_vec(),
        b'f' => b"false".to_vec(),
        _ => return None,
    };
    (!value.is_empty() && value.len() <= MAX_SOURCE_VALUE_BYTES).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn path(keys: &[&str]) -> BodyPath {
        BodyPath {
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    /// The values of `paths` in `body`, fed in chunks of `chunk` bytes.
    fn read(body: &[u8], paths: &[BodyPath], chunk: usize) -> BodyValues {
        let mut fields = BodyFields::new(paths);
        for part in body.chunks(chunk.max(1)) {
            fields.feed(part);
        }
        fields.values(body.len() as u64, &mut |at, len| {
            let at = at as usize;
            body[at..(at + len).min(body.len())].to_vec()
        })
    }

    #[test]
    fn values_are_read_where_the_scanner_found_them_in_any_chunking() {
        let body = br#"{"messages": [{"role": "user", "content": "hi \"model\""}],
            "model" : "gpt-4o\u002dmini", "n": -2.5e3, "stream": true,
            "metadata": {"user": {"id": 42}}, "tools": null}"#;
        let paths = [
            path(&["model"]),
            path(&["n"]),
            path(&["stream"]),
            path(&["metadata", "user", "id"]),
            path(&["tools"]),
            path(&["metadata", "user"]),
            path(&["absent"]),
        ];
        for chunk in [1, 3, 7, body.len()] {
            let v = read(body, &paths, chunk);
            let get = |i: usize| v.get(&paths[i]).map(|o| o.map(<[u8]>::to_vec));
            assert_eq!(get(0), Ok(Some(b"gpt-4o-mini".to_vec())), "chunk {chunk}");
            assert_eq!(get(1), Ok(Some(b"-2.5e3".to_vec())));
            assert_eq!(get(2), Ok(Some(b"true".to_vec())));
            assert_eq!(get(3), Ok(Some(b"42".to_vec())));
            assert_eq!(get(4), Ok(None), "null is absent");
            assert_eq!(get(5), Ok(None), "an object is not a value");
            assert_eq!(get(6), Ok(None));
        }
    }

    #[test]
    fn a_repeated_key_or_a_body_that_is_not_json_refuses_the_request() {
        let model = [path(&["model"])];
        let twice = read(br#"{"model": "cheap", "model": "dear"}"#, &model, 4);
        assert!(twice
            .get(&model[0])
            .unwrap_err()
            .0
            .contains("model must be sent once"));
        // A member of the same name elsewhere is another key.
        let nested = read(br#"{"a": {"model": "x"}, "model": "y"}"#, &model, 4);
        assert_eq!(nested.get(&model[0]), Ok(Some(&b"y"[..])));
        for absent in [
            &br#"["model", "x"]"#[..],
            b"",
            b" \n",
            br#"{"model": ""}"#,
            b"7",
        ] {
            assert_eq!(
                read(absent, &model, 2).get(&model[0]),
                Ok(None),
                "{absent:?}"
            );
        }
        let deep = format!("{}\"model\": 1{}", "{\"a\":".repeat(70), "}".repeat(70));
        for unreadable in [
            &br#"{"model": "x""#[..],
            br#"{"model": "x"} trailing"#,
            b"model=x",
            b"\xef\xbb\xbf{\"model\": \"x\"}",
            br#"{"model": "x", "t": NaN}"#,
            br#"{"model": "\ud800"}"#,
            deep.as_bytes(),
        ] {
            let refused = read(unreadable, &model, 3).get(&model[0]).unwrap_err();
            assert_eq!(
                refused.0,
                "the body must be JSON: it is read for body:model"
            );
        }
    }

    #[test]
    fn a_value_longer_than_a_source_may_be_is_absent() {
        let model = [path(&["model"])];
        let fits = format!(r#"{{"model": "{}"}}"#, "m".repeat(MAX_SOURCE_VALUE_BYTES));
        let long = format!(
            r#"{{"model": "{}"}}"#,
            "m".repeat(MAX_SOURCE_VALUE_BYTES + 1)
        );
        let escaped = format!(
            r#"{{"model": "{}"}}"#,
            "\\u006d".repeat(MAX_SOURCE_VALUE_BYTES)
        );
        assert_eq!(
            read(fits.as_bytes(), &model, 100)
                .get(&model[0])
                .map(|v| v.map(<[u8]>::len)),
            Ok(Some(MAX_SOURCE_VALUE_BYTES))
        );
        assert_eq!(read(long.as_bytes(), &model, 100).get(&model[0]), Ok(None));
        assert_eq!(
            read(escaped.as_bytes(), &model, 100)
                .get(&model[0])
                .map(|v| v.map(<[u8]>::len)),
            Ok(Some(MAX_SOURCE_VALUE_BYTES))
        );
    }
}
