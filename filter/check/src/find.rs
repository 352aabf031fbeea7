//! Walking a file's documents for the filter configs in them.

use ratelimit_core::config::{Config, ConfigError};
use serde_json::{Map, Value};

use crate::tree::{documents, Document};

const WASM: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const PLUGIN_CONFIG: &str = "type.googleapis.com/envoy.extensions.wasm.v3.PluginConfig";
const WASM_SERVICE: &str = "type.googleapis.com/envoy.extensions.wasm.v3.WasmService";
const STRING_VALUE: &str = "type.googleapis.com/google.protobuf.StringValue";
const STRUCT: &str = "type.googleapis.com/google.protobuf.Struct";
const STRUCT_NOTE: &str = "Envoy passes a google.protobuf.Struct configuration to the filter as protobuf bytes, not JSON: give the JSON as a google.protobuf.StringValue";
/// The module's file name, in a local path or a remote URL.
const MODULE_FILE: &str = "ratelimit_filter.wasm";
/// Istio and Envoy Gateway name the module by an image URL or a plugin name.
const MODULE_WORD: &str = "ratelimit";
/// Strings inside strings are searched this deep (a ConfigMap holding an Envoy config is 1).
const MAX_NESTING: usize = 4;

/// One filter config found in a file.
#[derive(Debug)]
pub struct Found {
    /// 1-based document of the file.
    pub document: usize,
    /// `Kind name` of the document, when it is a Kubernetes object.
    pub object: Option<String>,
    /// Where the config is in the document (`spec.pluginConfig`, `data["filter.json"]`);
    /// ` > ` enters a string's content. Empty: the document is the config.
    pub path: String,
    pub result: Result<Config, ConfigError>,
    /// Why a config the filter would refuse looks valid.
    pub note: Option<&'static str>,
}

/// Every filter config in `text`, in document order; Err: the text is neither JSON nor YAML
/// (the YAML error, with its line).
pub fn find(text: &str) -> Result<Vec<Found>, String> {
    let mut found = Vec::new();
    for (i, doc) in documents(text)?.iter().enumerate() {
        let mut walker = Walker {
            configs: Vec::new(),
        };
        walker.document(doc, String::new(), 0);
        let object = object_name(&doc.value);
        found.extend(
            walker
                .configs
                .into_iter()
                .map(|(path, result, note)| Found {
                    document: i + 1,
                    object: object.clone(),
                    path,
                    result,
                    note,
                }),
        );
    }
    Ok(found)
}

struct Walker {
    configs: Vec<(String, Result<Config, ConfigError>, Option<&'static str>)>,
}

impl Walker {
    fn config(&mut self, path: String, json: &[u8]) {
        self.configs.push((path, Config::parse(json), None));
    }

    /// A config given as an object (a `Struct`, a `pluginConfig`): the filter gets its JSON.
    fn config_value(&mut self, path: String, value: Option<&Value>) {
        let json = match value {
            Some(value) => serde_json::to_vec_pretty(value).unwrap_or_default(),
            // Nothing configured: the filter gets an empty configuration.
            None => Vec::new(),
        };
        self.config(path, &json);
    }

    fn document(&mut self, doc: &Document, path: String, nesting: usize) {
        if is_bare_config(&doc.value) {
            // A string that is the config itself is named by where the string is.
            let path = path.strip_suffix(" >").map_or(path.clone(), str::to_string);
            match &doc.json_text {
                Some(text) => self.config(path, text.as_bytes()),
                None => self.config_value(path, Some(&doc.value)),
            }
        } else {
            self.value(&doc.value, path, nesting);
        }
    }

    fn value(&mut self, value: &Value, path: String, nesting: usize) {
        match value {
            Value::Object(map) => self.object(map, &path, nesting),
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    self.value(v, index(&path, i), nesting);
                }
            }
            Value::String(text) if nesting < MAX_NESTING && may_hold_documents(text) => {
                self.string(text, &path, nesting + 1);
            }
            _ => {}
        }
    }

    fn object(&mut self, map: &Map<String, Value>, path: &str, nesting: usize) {
        if !self.known_object(map, path) {
            for (k, v) in map {
                self.value(v, field(path, k), nesting);
            }
        }
    }

    /// A string whose content is itself a document (a ConfigMap's `envoy.yaml`).
    fn string(&mut self, text: &str, path: &str, nesting: usize) {
        let Ok(docs) = documents(text) else {
            return; // Just text.
        };
        let several = docs.len() > 1;
        for (i, doc) in docs.iter().enumerate() {
            if !doc.value.is_object() && !doc.value.is_array() {
                continue;
            }
            let mut inner = format!("{path} >");
            if several {
                inner.push_str(&format!(" document {}", i + 1));
            }
            if let Some(object) = object_name(&doc.value) {
                inner.push_str(&format!(" ({object})"));
            }
            self.document(doc, inner, nesting);
        }
    }

    /// An object that holds a filter config by its shape: its configs are taken, and true
    /// returned when nothing else in it needs searching.
    fn known_object(&mut self, map: &Map<String, Value>, path: &str) -> bool {
        match map.get("@type").and_then(Value::as_str) {
            Some(WASM | WASM_SERVICE) => {
                return match map.get("config") {
                    Some(Value::Object(plugin)) => {
                        self.plugin_config(plugin, &field(path, "config"))
                    }
                    _ => true,
                };
            }
            Some(PLUGIN_CONFIG) => return self.plugin_config(map, path),
            _ => {}
        }
        let api = map.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = map.get("kind").and_then(Value::as_str).unwrap_or("");
        let Some(Value::Object(spec)) = map.get("spec") else {
            return false;
        };
        let spec_path = field(path, "spec");
        if api.starts_with("extensions.istio.io/") && kind == "WasmPlugin" {
            let names_module = ["url", "pluginName"]
                .iter()
                .any(|k| names_module(spec.get(*k)));
            if names_module {
                self.config_value(field(&spec_path, "pluginConfig"), spec.get("pluginConfig"));
                return true;
            }
        }
        if api.starts_with("gateway.envoyproxy.io/") && kind == "EnvoyExtensionPolicy" {
            if let Some(Value::Array(entries)) = spec.get("wasm") {
                for (i, entry) in entries.iter().enumerate() {
                    let names_module = names_module(entry.get("name"))
                        || names_module(pointer(entry, &["code", "image", "url"]))
                        || names_module(pointer(entry, &["code", "http", "url"]));
                    if names_module {
                        let entry_path = index(&field(&spec_path, "wasm"), i);
                        self.config_value(field(&entry_path, "config"), entry.get("config"));
                    }
                }
                return true;
            }
        }
        false
    }

    /// An Envoy `PluginConfig`: its `configuration` when it loads this module. Nothing else in
    /// a plugin's config is searched.
    fn plugin_config(&mut self, plugin: &Map<String, Value>, path: &str) -> bool {
        let code = plugin
            .get("vm_config")
            .and_then(|vm| vm.get("code"))
            .unwrap_or(&Value::Null);
        let ours = [
            pointer(code, &["local", "filename"]),
            pointer(code, &["remote", "http_uri", "uri"]),
        ]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|name| name.contains(MODULE_FILE))
            || plugin.get("root_id").and_then(Value::as_str) == Some(MODULE_WORD);
        if !ours {
            // Another module's configuration is its own business, whatever it holds.
            return true;
        }
        let path = field(path, "configuration");
        let Some(configuration) = plugin.get("configuration") else {
            self.config(path, b"");
            return true;
        };
        let value = configuration.get("value");
        let value_path = field(&path, "value");
        match configuration.get("@type").and_then(Value::as_str) {
            Some(STRING_VALUE) => match value {
                Some(Value::String(json)) => self.config(value_path, json.as_bytes()),
                _ => self.config(value_path, b""),
            },
            // Envoy hands the filter a Struct's protobuf bytes, not JSON: the filter refuses
            // every Struct (seen with Envoy 1.40), so the checker does too, and says why.
            Some(STRUCT) => self.configs.push((
                path,
                Err(ConfigError {
                    field: String::new(),
                    message: "the configuration must be a JSON object".to_string(),
                }),
                Some(STRUCT_NOTE),
            )),
            other => self.configs.push((
                field(&path, "@type"),
                Err(ConfigError {
                    field: String::new(),
                    message: format!(
                        "the configuration's @type is {}: ratelimit-check reads a {STRING_VALUE}",
                        other.unwrap_or("missing")
                    ),
                }),
                None,
            )),
        }
        true
    }
}

/// The filter's own JSON: an object with both `bridge` and `rules`.
fn is_bare_config(value: &Value) -> bool {
    value.get("bridge").is_some() && value.get("rules").is_some()
}

/// Cheap test before parsing a string: a document worth searching has a key or a brace.
fn may_hold_documents(text: &str) -> bool {
    text.contains('{') || text.contains(": ") || text.contains(":\n")
}

fn names_module(value: Option<&Value>) -> bool {
    value
        .and_then(Value::as_str)
        .is_some_and(|s| s.contains(MODULE_WORD))
}

fn pointer<'a>(value: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().try_fold(value, |v, k| v.get(*k))
}

/// `Kind name` of a Kubernetes object.
fn object_name(value: &Value) -> Option<String> {
    let kind = value.get("kind").and_then(Value::as_str)?;
    let name = pointer(value, &["metadata", "name"])
        .and_then(Value::as_str)
        .unwrap_or("(no name)");
    Some(format!("{kind} {name}"))
}

/// `path.key`, or `path["key"]` for a key that is not a plain word.
fn field(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '@');
    if plain {
        join(path, key, ".")
    } else {
        join(path, &format!("[{}]", Value::String(key.to_string())), "")
    }
}

fn index(path: &str, i: usize) -> String {
    join(path, &format!("[{i}]"), "")
}

/// A step after a path; after a string's ` >` or a document's `(Kind name)`, a space.
fn join(path: &str, step: &str, separator: &str) -> String {
    if path.is_empty() {
        step.to_string()
    } else if path.ends_with('>') || path.ends_with(')') {
        format!("{path} {step}")
    } else {
        format!("{path}{separator}{step}")
    }
}

#[cfg(test)]
mod tests;
