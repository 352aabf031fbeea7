//! A source's value on one request: what a key, a match condition or a plan reads. A value is
//! present when it is not empty; query parameters and headers a decision reads must be sent
//! once; a metadata value must be a scalar.

use super::address::client_ip;
use super::view::{decisive_header, path_only, BadRequest, RequestView};
use crate::bounds::MAX_SOURCE_VALUE_BYTES;
use crate::config::sources::percent_decode_into;
use crate::config::{ClientIpPolicy, KeySource};

/// Appends the source's value to `out`; false (nothing appended) if it is absent or empty.
pub fn read_source(
    view: &dyn RequestView,
    source: &KeySource,
    policy: &ClientIpPolicy,
    out: &mut Vec<u8>,
) -> Result<bool, BadRequest> {
    let owned;
    let value: Option<&[u8]> = match source {
        KeySource::Header(name) => decisive_header(view, name)?,
        KeySource::ClientIp => {
            owned = client_ip(view, policy);
            owned.as_deref().map(str::as_bytes)
        }
        KeySource::Route => {
            owned = view.route_name();
            owned.as_deref().map(str::as_bytes)
        }
        KeySource::Method => view.header(":method"),
        KeySource::Body(path) => view.body_field(path)?,
        KeySource::Path => view.header(":path").map(path_only),
        KeySource::Query(name) => {
            return query_parameter(view.header(":path").unwrap_or_default(), name, out)
        }
        KeySource::Metadata(path) => {
            let value = view.metadata(path);
            let value = value.filter(|v| v.len() <= MAX_SOURCE_VALUE_BYTES && !is_structure(v));
            return Ok(match value {
                Some(v) if !v.is_empty() => {
                    out.extend_from_slice(&v);
                    true
                }
                _ => false,
            });
        }
    };
    match value {
        Some(v) if !v.is_empty() => {
            out.extend_from_slice(v);
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// The value of query parameter `name` (compared decoded) in `path`, decoded once (`%XX`, `+`
/// as a space) and appended to `out`. Sent more than once it refuses the request, as a repeated
/// header does: the limiter and the backend could read different copies. A value longer than
/// [`MAX_SOURCE_VALUE_BYTES`] decoded is absent.
pub fn query_parameter(path: &[u8], name: &str, out: &mut Vec<u8>) -> Result<bool, BadRequest> {
    let Some(start) = path.iter().position(|&b| b == b'?') else {
        return Ok(false);
    };
    let query = &path[start + 1..];
    let query = &query[..query.iter().position(|&b| b == b'#').unwrap_or(query.len())];
    let mut found: Option<&[u8]> = None;
    let mut decoded_name = Vec::new();
    for pair in query.split(|&b| b == b'&') {
        let (raw_name, value) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &b""[..]),
        };
        decoded_name.clear();
        percent_decode_into(raw_name, true, &mut decoded_name);
        if decoded_name != name.as_bytes() {
            continue;
        }
        if found.is_some() {
            return Err(BadRequest(format!(
                "query parameter {name} must be sent once"
            )));
        }
        found = Some(value);
    }
    let Some(value) = found else {
        return Ok(false);
    };
    let before = out.len();
    percent_decode_into(value, true, out);
    if out.len() == before || out.len() - before > MAX_SOURCE_VALUE_BYTES {
        out.truncate(before);
        return Ok(false);
    }
    Ok(true)
}

/// Whether `value` is a list or a map as Envoy hands one over: `get_property` of a metadata
/// value that is a list or a struct answers it serialized as pairs (a 32-bit count, a 32-bit
/// length for each key and value, then each key and value followed by a NUL), checked
/// against Envoy 1.40. A string, a number (8 bytes, a double) and a bool (1 byte) come as
/// their bytes. A structure is not an identity: the source is absent.
pub fn is_structure(value: &[u8]) -> bool {
    let word = |i: usize| -> Option<usize> {
        let bytes: [u8; 4] = value.get(i..i + 4)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(bytes)).ok()
    };
    let Some(count) = word(0) else {
        return false;
    };
    let Some(sizes_end) = count.checked_mul(8).and_then(|n| n.checked_add(4)) else {
        return false;
    };
    if sizes_end > value.len() {
        return false;
    }
    let mut at = sizes_end;
    for pair in 0..count {
        for part in 0..2 {
            let Some(len) = word(4 + pair * 8 + part * 4) else {
                return false;
            };
            let Some(end) = at.checked_add(len) else {
                return false;
            };
            if value.get(end) != Some(&0) {
                return false;
            }
            at = end + 1;
        }
    }
    at == value.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::request::FakeRequest;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn query(path: &str, name: &str) -> Result<Option<Vec<u8>>, BadRequest> {
        let mut out = Vec::new();
        Ok(query_parameter(path.as_bytes(), name, &mut out)?.then_some(out))
    }

    #[test]
    fn query_parameters_are_decoded_once() {
        assert_eq!(query("/a?api_key=k1", "api_key"), Ok(Some(b"k1".to_vec())));
        assert_eq!(
            query("/a?x=1&api_key=a%2Bb+c", "api_key"),
            Ok(Some(b"a+b c".to_vec()))
        );
        assert_eq!(query("/a?api%5Fkey=k", "api_key"), Ok(Some(b"k".to_vec())));
        assert_eq!(query("/a?k=%2541", "k"), Ok(Some(b"%41".to_vec())));
        assert_eq!(query("/a?k=v#frag", "k"), Ok(Some(b"v".to_vec())));
        assert_eq!(query("/a?k=a=b", "k"), Ok(Some(b"a=b".to_vec())));
        for absent in ["/a", "/a?", "/a?k=", "/a?k", "/a?kk=1", "/a?x=k"] {
            assert_eq!(query(absent, "k"), Ok(None), "{absent}");
        }
        let long = format!("/a?k={}", "v".repeat(MAX_SOURCE_VALUE_BYTES + 1));
        assert_eq!(query(&long, "k"), Ok(None));
    }

    #[test]
    fn a_repeated_query_parameter_is_a_bad_request() {
        for path in [
            "/a?k=1&k=2",
            "/a?k=1&k=1",
            "/a?k=&k=2",
            "/a?k=1&%6B=2",
            "/a?k&k",
        ] {
            assert_eq!(
                query(path, "k"),
                Err(BadRequest("query parameter k must be sent once".into())),
                "{path}"
            );
        }
    }

    /// The bytes Envoy 1.40 answered for metadata `l: ["a", "bc"]` and `m: {k: v, k2: w}`.
    const LIST: &[u8] = b"\x02\0\0\0\x01\0\0\0\0\0\0\0\x02\0\0\0\0\0\0\0a\0\0bc\0\0";
    const MAP: &[u8] = b"\x02\0\0\0\x02\0\0\0\x01\0\0\0\x01\0\0\0\x01\0\0\0k2\0w\0k\0v\0";

    #[test]
    fn structures_are_told_from_scalars() {
        assert!(is_structure(LIST));
        assert!(is_structure(MAP));
        assert!(is_structure(b"\0\0\0\0"), "an empty list");
        // A number (7.0 as a double), a bool, strings.
        for scalar in [
            &b"\0\0\0\0\0\0\x1c\x40"[..],
            b"\x01",
            b"alice",
            b"",
            &LIST[..LIST.len() - 1],
            b"\x01\0\0\0\xff\xff\xff\xff\0\0\0\0",
        ] {
            assert!(!is_structure(scalar), "{scalar:?}");
        }
    }

    #[test]
    fn metadata_values_are_scalars_within_the_bound() {
        let policy = ClientIpPolicy {
            xff_trusted_hops: 0,
            ipv4_prefix: 32,
            ipv6_prefix: 64,
        };
        let source = KeySource::Metadata(crate::config::MetadataPath {
            namespace: "ns".into(),
            keys: vec!["sub".into()],
        });
        let read = |value: &[u8]| {
            let r = FakeRequest::new("GET", "/").with_metadata("ns:sub", value);
            let mut out = Vec::new();
            read_source(&r, &source, &policy, &mut out).map(|p| p.then_some(out))
        };
        assert_eq!(read(b"alice"), Ok(Some(b"alice".to_vec())));
        assert_eq!(read(LIST), Ok(None));
        assert_eq!(read(b""), Ok(None));
        assert_eq!(read(&vec![b'x'; MAX_SOURCE_VALUE_BYTES + 1]), Ok(None));
        assert_eq!(
            read(&vec![b'x'; MAX_SOURCE_VALUE_BYTES]).map(|v| v.map(|v| v.len())),
            Ok(Some(MAX_SOURCE_VALUE_BYTES))
        );
    }
}
