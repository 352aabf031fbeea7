//! Who is calling: the identity a rule limits, from its key sources.

use super::source::read_source;
use super::view::{BadRequest, RequestView};
use crate::config::{ClientIpPolicy, KeySpec, WhenMissing};

/// Joins the parts of a combined key. No header value can contain it; a query parameter, a
/// metadata value (a number's 8 bytes) or a body string can, so in a combined key each part
/// is escaped ([`escape_separator`]) and parts cannot run into each other.
pub const PART_SEPARATOR: u8 = 0x1f;
/// Starts the escape of [`PART_SEPARATOR`] and of itself inside a part.
const ESCAPE: u8 = 0x1e;

/// Rewrites `identity[start..]` with `ESCAPE` as `ESCAPE 2` and the separator as `ESCAPE 1`:
/// one-to-one, and a part with neither byte (every header) is left as it is, so keys made
/// before stay the same.
fn escape_separator(identity: &mut Vec<u8>, start: usize) {
    let Some(part) = identity.get(start..) else {
        return;
    };
    if !part.iter().any(|&b| b == PART_SEPARATOR || b == ESCAPE) {
        return;
    }
    let part = identity.split_off(start);
    for b in part {
        match b {
            ESCAPE => identity.extend_from_slice(&[ESCAPE, 2]),
            PART_SEPARATOR => identity.extend_from_slice(&[ESCAPE, 1]),
            _ => identity.push(b),
        }
    }
}

/// The identity a rule limits for this request: the first key alternative whose sources are
/// all present, as (label, bytes). `None` when the rule should be skipped; an error when a
/// header it reads was sent more than once (only the sources actually read count: an
/// alternative is abandoned at its first missing source).
pub fn resolve(
    view: &dyn RequestView,
    spec: &KeySpec,
    policy: &ClientIpPolicy,
) -> Result<Option<(String, Vec<u8>)>, BadRequest> {
    let mut identity = Vec::new();
    Ok(resolve_into(view, spec, policy, &mut identity)?
        .map(|alternative| (label(spec, alternative).to_string(), identity)))
}

/// [`resolve`] into a buffer the caller keeps (no allocation once it is large enough):
/// `identity` holds the bytes, the result is the index of the alternative in `spec` (equal to
/// the number of alternatives for the anonymous identity, see [`label`]).
pub fn resolve_into(
    view: &dyn RequestView,
    spec: &KeySpec,
    policy: &ClientIpPolicy,
    identity: &mut Vec<u8>,
) -> Result<Option<usize>, BadRequest> {
    'alternatives: for (a, alternative) in spec.alternatives.iter().enumerate() {
        identity.clear();
        for (i, source) in alternative.sources.iter().enumerate() {
            if i > 0 {
                identity.push(PART_SEPARATOR);
            }
            let start = identity.len();
            if !read_source(view, source, policy, identity)? {
                continue 'alternatives;
            }
            if alternative.sources.len() > 1 {
                escape_separator(identity, start);
            }
        }
        return Ok(Some(a));
    }
    identity.clear();
    Ok(match spec.when_missing {
        WhenMissing::Anonymous => Some(spec.alternatives.len()),
        WhenMissing::Skip => None,
    })
}

/// The label of alternative `alternative` of `spec` as [`resolve_into`] numbers them.
pub fn label(spec: &KeySpec, alternative: usize) -> &str {
    spec.alternatives
        .get(alternative)
        .map_or("anonymous", |a| a.label.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::testing::request::FakeRequest;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn config(extra: &str, key: &str) -> Config {
        let json = format!(
            r#"{{{extra} "rules": [{{"name": "r", "key": {key}, "limits": [{{"name": "l", "limit": 1, "window": "1s"}}]}}]}}"#
        );
        Config::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn first_present_alternative_wins() {
        let c = config("", r#"{"from": ["header:x-api-key", "client_ip"]}"#);
        let spec = &c.rules[0].key;
        let with_key = FakeRequest::new("GET", "/").with("x-api-key", b"k1");
        assert_eq!(
            resolve(&with_key, spec, &c.client_ip),
            Ok(Some(("header:x-api-key".into(), b"k1".to_vec())))
        );
        let empty_key = FakeRequest::new("GET", "/").with("x-api-key", b"");
        assert_eq!(
            resolve(&empty_key, spec, &c.client_ip),
            Ok(Some(("client_ip".into(), b"10.1.2.3".to_vec())))
        );
    }

    #[test]
    fn combined_sources_need_every_part() {
        let c = config(
            "",
            r#"{"from": ["header:x-user+method+path+route"], "when_missing": "skip"}"#,
        );
        let spec = &c.rules[0].key;
        let mut r = FakeRequest::new("POST", "/orders?id=7").with("x-user", b"u1");
        assert_eq!(resolve(&r, spec, &c.client_ip), Ok(None), "no route name");
        r.route = Some("orders".into());
        assert_eq!(
            resolve(&r, spec, &c.client_ip),
            Ok(Some((
                "header:x-user+method+path+route".into(),
                b"u1\x1fPOST\x1f/orders\x1forders".to_vec()
            )))
        );
    }

    #[test]
    fn parts_holding_the_separator_never_run_into_each_other() {
        let c = config(
            "",
            r#"{"from": ["query:a+query:b", "body:m", "metadata:ns:id"]}"#,
        );
        let spec = &c.rules[0].key;
        let id = |r: &FakeRequest| resolve(r, spec, &c.client_ip).unwrap().unwrap();
        // a=x␟y&b=z and a=x&b=y␟z: two callers.
        let first = id(&FakeRequest::new("GET", "/?a=x%1Fy&b=z"));
        let second = id(&FakeRequest::new("GET", "/?a=x&b=y%1Fz"));
        assert_ne!(first, second);
        assert_eq!(first.1, b"x\x1e\x01y\x1fz");
        assert_eq!(
            id(&FakeRequest::new("GET", "/?a=x%1E&b=z")).1,
            b"x\x1e\x02\x1fz"
        );
        // One source alone is used as it is: a body string, a metadata number (4127.0 as a
        // double holds 0x1F).
        let body = FakeRequest::new("POST", "/").with_body(&c.body_fields, br#"{"m": "y\u001fz"}"#);
        assert_eq!(id(&body), ("body:m".into(), b"y\x1fz".to_vec()));
        let number = 4127f64.to_le_bytes();
        assert!(number.contains(&PART_SEPARATOR));
        let claim = FakeRequest::new("GET", "/").with_metadata("ns:id", &number);
        assert_eq!(id(&claim), ("metadata:ns:id".into(), number.to_vec()));
    }

    #[test]
    fn missing_sources_skip_or_share_the_anonymous_key() {
        let mut r = FakeRequest::new("GET", "/");
        r.source = None;
        let skip = config(
            "",
            r#"{"from": ["header:x-api-key"], "when_missing": "skip"}"#,
        );
        assert_eq!(resolve(&r, &skip.rules[0].key, &skip.client_ip), Ok(None));
        let anon = config("", r#"{"from": ["header:x-api-key"]}"#);
        assert_eq!(
            resolve(&r, &anon.rules[0].key, &anon.client_ip),
            Ok(Some(("anonymous".into(), Vec::new())))
        );
    }

    #[test]
    fn a_key_header_sent_twice_is_a_bad_request() {
        let c = config("", r#"{"from": ["header:x-api-key", "client_ip"]}"#);
        let spec = &c.rules[0].key;
        let twice = FakeRequest::new("GET", "/")
            .with("x-api-key", b"fresh-4")
            .also("x-api-key", b"real-key");
        assert_eq!(
            resolve(&twice, spec, &c.client_ip),
            Err(BadRequest("x-api-key must be sent once".into()))
        );
        // Two copies are two copies even when they agree, or one is empty.
        for (a, b) in [(&b"k"[..], &b"k"[..]), (b"", b"k")] {
            let r = FakeRequest::new("GET", "/")
                .with("x-api-key", a)
                .also("x-api-key", b);
            assert!(resolve(&r, spec, &c.client_ip).is_err());
        }
    }

    #[test]
    fn only_headers_actually_read_must_be_single() {
        // The first alternative stops at its missing x-user: x-team is never read.
        let c = config(
            "",
            r#"{"from": ["header:x-user+header:x-team", "client_ip"]}"#,
        );
        let spec = &c.rules[0].key;
        let r = FakeRequest::new("GET", "/")
            .with("x-team", b"a")
            .also("x-team", b"b");
        assert_eq!(
            resolve(&r, spec, &c.client_ip),
            Ok(Some(("client_ip".into(), b"10.1.2.3".to_vec())))
        );
        // An earlier alternative that is complete wins before a later one is read.
        let c = config("", r#"{"from": ["client_ip", "header:x-api-key"]}"#);
        let r = FakeRequest::new("GET", "/")
            .with("x-api-key", b"a")
            .also("x-api-key", b"b");
        assert!(resolve(&r, &c.rules[0].key, &c.client_ip).is_ok());
        // A header no source names may repeat freely.
        let c = config("", r#"{"from": ["header:x-api-key"]}"#);
        let r = FakeRequest::new("GET", "/")
            .with("x-api-key", b"k")
            .with("accept", b"a")
            .also("accept", b"b");
        assert!(resolve(&r, &c.rules[0].key, &c.client_ip).is_ok());
    }
}
