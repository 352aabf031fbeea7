//! The sources a key, a match condition or a plan reads (`header:NAME`, `client_ip`, `route`,
//! `method`, `path`, `query:NAME`, `metadata:NAMESPACE:KEY…`, `body:KEY…`), and match
//! conditions.

use super::fields::check_header_name;
use super::raw::RawCondition;
use super::{invalid, BodyPath, Condition, ConfigError, KeySource, MetadataPath, Test};
use serde_json::Value;

use crate::bounds::{
    MAX_CONDITION_VALUES, MAX_CONDITION_VALUE_BYTES, MAX_METADATA_KEYS, MAX_SEGMENTS,
    MAX_SEGMENT_LEN,
};

pub(super) const SOURCES: &str =
    "header:NAME, query:NAME, metadata:NAMESPACE:KEY[:KEY…], body:KEY[:KEY…], client_ip, route, method or path";

/// One source as written (no `+`): `field` names the config entry in errors.
pub(super) fn parse_source(part: &str, field: &str) -> Result<KeySource, ConfigError> {
    Ok(match part {
        "client_ip" => KeySource::ClientIp,
        "route" => KeySource::Route,
        "method" => KeySource::Method,
        "path" => KeySource::Path,
        _ => {
            if let Some(name) = part.strip_prefix("header:") {
                KeySource::Header(check_header_name(name, field)?)
            } else if let Some(name) = part.strip_prefix("query:") {
                KeySource::Query(segment(name, field, "a query parameter's name")?)
            } else if let Some(path) = part.strip_prefix("metadata:") {
                KeySource::Metadata(metadata_path(path, field)?)
            } else if let Some(path) = part.strip_prefix("body:") {
                KeySource::Body(body_path(path, field)?)
            } else {
                return Err(invalid(
                    field,
                    format!("unknown source \"{part}\": expected {SOURCES}"),
                ));
            }
        }
    })
}

/// `NAMESPACE:KEY[:KEY…]`.
fn metadata_path(text: &str, field: &str) -> Result<MetadataPath, ConfigError> {
    let mut parts = text.split(':');
    let namespace = parts.next().unwrap_or_default();
    let namespace = segment(namespace, field, "metadata's namespace")?;
    let keys = parts
        .map(|k| segment(k, field, "a metadata key"))
        .collect::<Result<Vec<_>, _>>()?;
    if keys.is_empty() {
        return Err(invalid(
            field,
            "metadata needs a namespace and at least one key: metadata:NAMESPACE:KEY[:KEY…], e.g. metadata:envoy.filters.http.jwt_authn:jwt_payload:sub",
        ));
    }
    if keys.len() > MAX_METADATA_KEYS {
        return Err(invalid(
            field,
            format!("metadata reads at most {MAX_METADATA_KEYS} keys deep"),
        ));
    }
    Ok(MetadataPath { namespace, keys })
}

/// `KEY[:KEY…]`: a member of the request body's top-level JSON object, or of an object
/// inside it, as deep as a usage path may go.
fn body_path(text: &str, field: &str) -> Result<BodyPath, ConfigError> {
    if text.contains('.') {
        // Usage paths are dotted; a body source's keys are not, and a dotted one would name
        // one key that no request has.
        return Err(invalid(
            field,
            format!("body keys are separated by ':', not '.': body:{} (a '.' inside a key is written %2E)", text.replace('.', ":")),
        ));
    }
    let keys = text
        .split(':')
        .map(|k| segment(k, field, "a body key"))
        .collect::<Result<Vec<_>, _>>()?;
    if keys.len() > MAX_SEGMENTS {
        return Err(invalid(
            field,
            format!("body reads at most {MAX_SEGMENTS} keys deep"),
        ));
    }
    if let Some(long) = keys.iter().find(|k| k.len() > MAX_SEGMENT_LEN) {
        return Err(invalid(
            field,
            format!("a body key is at most {MAX_SEGMENT_LEN} bytes, \"{long}\" is longer"),
        ));
    }
    Ok(BodyPath { keys })
}

/// A name inside a source: printable ASCII without the separators of the config's syntax
/// (`:` `+`) and of Redis keys (`=` `{` `}`); any other byte written as `%XX` (a claim named
/// `https://example.com/plan` is `https%3A%2F%2Fexample.com%2Fplan`). Decoded once.
fn segment(text: &str, field: &str, what: &str) -> Result<String, ConfigError> {
    let allowed = |b: u8| b.is_ascii_graphic() && !b":+={}".contains(&b);
    if text.is_empty() || !text.bytes().all(allowed) {
        return Err(invalid(
            field,
            format!("{what} must be printable ASCII without ':', '+', '=', '{{', '}}' or spaces (write another byte as %XX), got \"{text}\""),
        ));
    }
    let decoded = percent_decode(text.as_bytes());
    String::from_utf8(decoded).map_err(|_| {
        invalid(
            field,
            format!("{what} \"{text}\" is not UTF-8 once decoded"),
        )
    })
}

/// `%XX` sequences to their byte; a `%` not followed by two hex digits stays as it is.
pub fn percent_decode(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    percent_decode_into(text, false, &mut out);
    out
}

/// Appends `text` decoded to `out`; with `plus_is_space` a `+` is a space, as in a query
/// string (`application/x-www-form-urlencoded`).
pub fn percent_decode_into(text: &[u8], plus_is_space: bool, out: &mut Vec<u8>) {
    let hex = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    };
    let mut i = 0;
    while i < text.len() {
        let b = text[i];
        match b {
            b'%' => {
                let pair = text
                    .get(i + 1)
                    .copied()
                    .and_then(hex)
                    .zip(text.get(i + 2).copied().and_then(hex));
                if let Some((high, low)) = pair {
                    out.push(high << 4 | low);
                    i += 3;
                    continue;
                }
                out.push(b);
            }
            b'+' if plus_is_space => out.push(b' '),
            _ => out.push(b),
        }
        i += 1;
    }
}

impl RawCondition {
    pub(super) fn validate(self, field: &str) -> Result<Condition, ConfigError> {
        let source_field = format!("{field}.source");
        if self.source.contains('+') {
            return Err(invalid(
                &source_field,
                "a condition tests one source: write one condition per source",
            ));
        }
        let source = parse_source(&self.source, &source_field)?;
        let test = match (self.in_, self.not_in, self.present) {
            (Some(values), None, None) => Test::In(condition_values(values, &format!("{field}.in"))?),
            (None, Some(values), None) => {
                Test::NotIn(condition_values(values, &format!("{field}.not_in"))?)
            }
            (None, None, Some(true)) => Test::Present,
            (None, None, Some(false)) => Test::Absent,
            _ => {
                return Err(invalid(
                    field,
                    "needs exactly one of \"in\": [values], \"not_in\": [values] or \"present\": true|false",
                ))
            }
        };
        Ok(Condition { source, test })
    }
}

/// The values of `in` / `not_in`, or a plan's: at least one, none empty (an empty value is
/// an absent one), bounded; each as the bytes it is compared with. A string is its bytes. A
/// number or a bool is also its text (`1`, `true`: a header or an `ext_authz` answer) and the
/// bytes Envoy hands over for such a metadata value (a JWT claim): a number as the 8 bytes of a
/// double, a bool as one byte.
pub(super) fn condition_values(
    values: Vec<Value>,
    field: &str,
) -> Result<Vec<Vec<u8>>, ConfigError> {
    if values.is_empty() {
        return Err(invalid(field, "must hold at least one value"));
    }
    if values.len() > MAX_CONDITION_VALUES {
        return Err(invalid(
            field,
            format!("must hold at most {MAX_CONDITION_VALUES} values"),
        ));
    }
    let mut out = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        let item = format!("{field}[{i}]");
        match v {
            Value::String(text) if text.is_empty() => {
                return Err(invalid(
                    &item,
                    "must not be empty: an empty value is an absent one (test it with \"present\": false)",
                ))
            }
            Value::String(text) if text.len() > MAX_CONDITION_VALUE_BYTES => {
                return Err(invalid(
                    &item,
                    format!("must be at most {MAX_CONDITION_VALUE_BYTES} bytes"),
                ))
            }
            Value::String(text) => out.push(text.clone().into_bytes()),
            Value::Number(n) => {
                out.push(n.to_string().into_bytes());
                if let Some(double) = n.as_f64() {
                    out.push(double.to_le_bytes().to_vec());
                }
            }
            Value::Bool(b) => {
                out.push(b.to_string().into_bytes());
                out.push(vec![u8::from(*b)]);
            }
            _ => return Err(invalid(&item, "must be a string, a number or true/false")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn sources_parse() {
        let p = |t: &str| parse_source(t, "f");
        assert_eq!(p("query:api_key"), Ok(KeySource::Query("api_key".into())));
        assert_eq!(
            p("metadata:envoy.filters.http.jwt_authn:jwt_payload:sub"),
            Ok(KeySource::Metadata(MetadataPath {
                namespace: "envoy.filters.http.jwt_authn".into(),
                keys: vec!["jwt_payload".into(), "sub".into()],
            }))
        );
        assert_eq!(
            p("metadata:ns:https%3A%2F%2Fexample.com%2Fplan"),
            Ok(KeySource::Metadata(MetadataPath {
                namespace: "ns".into(),
                keys: vec!["https://example.com/plan".into()],
            }))
        );
        assert_eq!(p("header:X-Key"), Ok(KeySource::Header("x-key".into())));
        for bad in [
            "metadata:ns",
            "metadata:",
            "metadata::sub",
            "metadata:ns:",
            "metadata:ns:a=b",
            "metadata:ns:{x}",
            "query:",
            "query:a b",
            "query:%ff",
            "cookie:x",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
        let deep = format!("metadata:ns{}", ":k".repeat(MAX_METADATA_KEYS + 1));
        assert!(p(&deep).is_err());
        assert_eq!(
            p("body:model"),
            Ok(KeySource::Body(BodyPath {
                keys: vec!["model".into()]
            }))
        );
        assert_eq!(
            p("body:metadata:user%3Aid"),
            Ok(KeySource::Body(BodyPath {
                keys: vec!["metadata".into(), "user:id".into()]
            }))
        );
        assert_eq!(
            p("body:a%2Eb"),
            Ok(KeySource::Body(BodyPath {
                keys: vec!["a.b".into()]
            }))
        );
        assert_eq!(
            p("body:metadata.user_id").unwrap_err().message,
            "body keys are separated by ':', not '.': body:metadata:user_id (a '.' inside a key is written %2E)"
        );
        for bad in ["body:", "body:a:", "body::a", "body:a b"] {
            assert!(p(bad).is_err(), "{bad}");
        }
        let deep = format!("body:k{}", ":k".repeat(MAX_SEGMENTS));
        assert!(p(&deep).unwrap_err().message.contains("8 keys deep"));
        let long = format!("body:{}", "k".repeat(MAX_SEGMENT_LEN + 1));
        assert!(p(&long).unwrap_err().message.contains("at most 64 bytes"));
    }

    #[test]
    fn percent_decoding_is_done_once() {
        let mut out = Vec::new();
        percent_decode_into(b"a%2541+b%zz%4", true, &mut out);
        assert_eq!(out, b"a%41 b%zz%4");
        assert_eq!(percent_decode(b"a+b%2B"), b"a+b+");
    }

    #[test]
    fn tests_treat_empty_as_absent() {
        let values = vec![b"pro".to_vec()];
        assert!(Test::In(values.clone()).passes(Some(b"pro")));
        assert!(!Test::In(values.clone()).passes(Some(b"PRO")));
        assert!(!Test::In(values.clone()).passes(None));
        assert!(Test::NotIn(values.clone()).passes(None));
        assert!(Test::NotIn(values.clone()).passes(Some(b"")));
        assert!(!Test::NotIn(values).passes(Some(b"pro")));
        assert!(Test::Absent.passes(Some(b"")));
        assert!(!Test::Present.passes(Some(b"")));
        assert!(Test::Present.passes(Some(b"x")));
    }
}
