//! Reading a text as JSON or YAML documents, all as `serde_json` values: the filter reads its
//! config as JSON, so a config found in YAML is checked as the JSON Envoy would hand it.

use serde_json::{Map, Number, Value};
use yaml_rust2::{Yaml, YamlLoader};

/// One document of a text, and the text itself when the whole text is that one JSON document
/// (then a config is checked byte for byte as written, as Envoy would pass it on).
pub(crate) struct Document {
    pub(crate) value: Value,
    pub(crate) json_text: Option<String>,
}

/// The documents of `text`: one if it is JSON, else its YAML documents (empty ones dropped).
pub(crate) fn documents(text: &str) -> Result<Vec<Document>, String> {
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return Ok(vec![Document {
            value,
            json_text: Some(text.to_string()),
        }]);
    }
    let docs = YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
    Ok(docs
        .iter()
        .map(to_json)
        .filter(|v| !v.is_null())
        .map(|value| Document {
            value,
            json_text: None,
        })
        .collect())
}

fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Integer(i) => Value::from(*i),
        Yaml::Real(text) => real(text),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Hash(hash) => Value::Object(
            hash.iter()
                .map(|(k, v)| (key(k), to_json(v)))
                .collect::<Map<String, Value>>(),
        ),
        Yaml::Alias(_) | Yaml::Null | Yaml::BadValue => Value::Null,
    }
}

/// A YAML float as a JSON number; `.inf` and `.nan`, which JSON cannot hold, stay text. A
/// whole one is written as an integer, as Istio (protobuf Struct to JSON) and Kubernetes (YAML
/// to JSON) pass `10.0` on: `10`.
fn real(text: &str) -> Value {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53: every whole f64 below is exact
    match text.parse::<f64>() {
        Ok(v) if v.fract() == 0.0 && v.abs() < EXACT => Value::from(v as i64),
        Ok(v) => Number::from_f64(v).map_or_else(|| Value::String(text.to_string()), Value::Number),
        Err(_) => Value::String(text.to_string()),
    }
}

/// JSON keys are strings: a YAML key `8080` or `true` becomes its text.
fn key(yaml: &Yaml) -> String {
    match yaml {
        Yaml::String(s) | Yaml::Real(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        other => to_json(other).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_numbers_become_the_json_the_filter_gets() {
        let docs = documents("a: 10.0\nb: 0.125\nc: .inf\nd: 1e3\n8080: x\n").unwrap();
        assert_eq!(
            docs[0].value.to_string(),
            r#"{"8080":"x","a":10,"b":0.125,"c":".inf","d":1000}"#
        );
    }
}
