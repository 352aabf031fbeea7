//! Each input form the checker reads, and where it says a config is.

use super::*;

const FILTER_JSON: &str = r#"{"bridge": {"cluster": "webdis", "timeout": "150ms"},
 "rules": [{"name": "per_client", "key": {"from": ["header:x-api-key", "client_ip"]},
            "limits": [{"name": "per_minute", "limit": 10, "window": "1m"}]}]}"#;

/// The filter JSON with its one limit at 0: the filter refuses it.
fn broken_json() -> String {
    FILTER_JSON.replace(r#""limit": 10"#, r#""limit": 0"#)
}

const BROKEN_MESSAGE: &str = "rules[0].limits[0].limit: must be >= 1";

/// `json` indented by `spaces`, for a YAML block scalar.
fn indent(json: &str, spaces: usize) -> String {
    json.lines()
        .map(|l| format!("{}{l}\n", " ".repeat(spaces)))
        .collect()
}

fn envoy_yaml(filename: &str, config_json: &str) -> String {
    format!(
        r#"static_resources:
  listeners:
  - name: ingress
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          http_filters:
          - name: ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                vm_config:
                  runtime: envoy.wasm.runtime.v8
                  code: {{ local: {{ filename: {filename} }} }}
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: |
{}"#,
        indent(config_json, 20)
    )
}

const HTTP_FILTER_PATH: &str = "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config.configuration.value";

fn only(found: Vec<Found>) -> Found {
    assert_eq!(found.len(), 1, "{found:?}");
    found.into_iter().next().unwrap()
}

fn error_of(found: &Found) -> String {
    match &found.result {
        Ok(_) => panic!("{} was accepted", found.path),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bare_filter_json_is_the_config() {
    let f = only(find(FILTER_JSON).unwrap());
    assert_eq!(
        (f.document, f.object.as_deref(), f.path.as_str()),
        (1, None, "")
    );
    let config = f.result.unwrap();
    assert_eq!(config.rules[0].limits[0].limit, 10);
}

#[test]
fn envoy_string_value_config_is_found_with_its_path() {
    let f = only(find(&envoy_yaml("target/ratelimit_filter.wasm", FILTER_JSON)).unwrap());
    assert_eq!(f.path, HTTP_FILTER_PATH);
    assert_eq!(f.result.unwrap().rules[0].name, "per_client");
}

#[test]
fn envoy_config_as_json_is_read_too() {
    let yaml = envoy_yaml("/m/ratelimit_filter.wasm", FILTER_JSON);
    let docs = crate::tree::documents(&yaml).unwrap();
    let json = serde_json::to_string(&docs[0].value).unwrap();
    let f = only(find(&json).unwrap());
    assert_eq!(f.path, HTTP_FILTER_PATH);
    assert!(f.result.is_ok());
}

#[test]
fn another_wasm_module_is_not_this_filter() {
    let found = find(&envoy_yaml("/m/other_filter.wasm", FILTER_JSON)).unwrap();
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_module_known_by_root_id_or_remote_uri_is_this_filter() {
    for plugin in [
        r#"{"root_id": "ratelimit", "vm_config": {"code": {"local": {"filename": "/x.wasm"}}}}"#,
        r#"{"vm_config": {"code": {"remote": {"http_uri": {"uri": "https://h/v1/ratelimit_filter.wasm"}}}}}"#,
    ] {
        let mut plugin: Value = serde_json::from_str(plugin).unwrap();
        plugin["configuration"] = serde_json::json!({
            "@type": "type.googleapis.com/google.protobuf.StringValue", "value": FILTER_JSON});
        let wasm = serde_json::json!({"@type": WASM, "config": plugin});
        let f = only(find(&wasm.to_string()).unwrap());
        assert_eq!(f.path, "config.configuration.value");
        assert!(f.result.is_ok());
    }
}

#[test]
fn envoy_struct_config_is_refused_as_the_filter_refuses_it() {
    // Envoy hands the filter a Struct's protobuf bytes: even a valid policy is refused.
    let yaml = r#"
"@type": type.googleapis.com/envoy.extensions.wasm.v3.WasmService
config:
  root_id: ratelimit
  configuration:
    "@type": type.googleapis.com/google.protobuf.Struct
    value:
      bridge: { cluster: webdis }
      rules:
      - name: r
        limits: [{ name: m, limit: 10, window: 1m }]
"#;
    let f = only(find(yaml).unwrap());
    assert_eq!(f.path, "config.configuration");
    assert_eq!(error_of(&f), "the configuration must be a JSON object");
    assert_eq!(f.note, Some(STRUCT_NOTE));
}

#[test]
fn a_missing_configuration_is_what_the_filter_gets_empty() {
    let yaml = "\"@type\": type.googleapis.com/envoy.extensions.wasm.v3.PluginConfig\nroot_id: ratelimit\n";
    let f = only(find(yaml).unwrap());
    assert_eq!(f.path, "configuration");
    assert_eq!(
        error_of(&f),
        Config::parse(b"").unwrap_err().to_string(),
        "the filter's own message for an empty configuration"
    );
}

#[test]
fn istio_wasm_plugin_config_is_found() {
    let yaml = r#"
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: ratelimit, namespace: shop }
spec:
  url: oci://registry.example/ratelimit-filter:0.1.0
  phase: AUTHN
  pluginConfig:
    bridge: { cluster: "outbound|7379||webdis.shop.svc.cluster.local" }
    rules:
    - name: per_client
      limits: [{ name: per_minute, limit: 10, window: 1m }]
"#;
    let f = only(find(yaml).unwrap());
    assert_eq!(f.object.as_deref(), Some("WasmPlugin ratelimit"));
    assert_eq!(f.path, "spec.pluginConfig");
    assert_eq!(
        f.result.unwrap().bridge.cluster,
        "outbound|7379||webdis.shop.svc.cluster.local"
    );
}

#[test]
fn envoy_gateway_policy_entries_of_this_module_are_found() {
    let yaml = r#"
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyExtensionPolicy
metadata: { name: limits }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: api }]
  wasm:
  - name: other
    code: { type: HTTP, http: { url: "https://h/other.wasm" } }
    config: { anything: 1 }
  - name: limiter
    code: { type: Image, image: { url: "registry.example/ratelimit-filter:0.1.0" } }
    config:
      bridge: { cluster: webdis }
      rules: [{ name: r, limits: [{ name: m, limit: 0, window: 1m }] }]
"#;
    let f = only(find(yaml).unwrap());
    assert_eq!(f.object.as_deref(), Some("EnvoyExtensionPolicy limits"));
    assert_eq!(f.path, "spec.wasm[1].config");
    assert_eq!(error_of(&f), BROKEN_MESSAGE);
}

#[test]
fn config_map_strings_are_searched_and_documents_numbered() {
    let yaml = format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{ name: redis-users }}
stringData: {{ users.acl: "user default off" }}
---
apiVersion: v1
kind: ConfigMap
metadata: {{ name: ratelimit-filter }}
data:
  filter.json: |
{}
  envoy.yaml: |
{}"#,
        indent(FILTER_JSON, 4),
        indent(
            &envoy_yaml("/wasm/ratelimit_filter.wasm", &broken_json()),
            4
        )
    );
    let mut found = find(&yaml).unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    found.sort_by(|a, b| b.path.cmp(&a.path));
    assert_eq!(found[0].document, 2);
    assert_eq!(
        found[0].object.as_deref(),
        Some("ConfigMap ratelimit-filter")
    );
    assert_eq!(found[0].path, r#"data["filter.json"]"#);
    assert!(found[0].result.is_ok());
    assert_eq!(
        found[1].path,
        format!(r#"data["envoy.yaml"] > {HTTP_FILTER_PATH}"#)
    );
    assert_eq!(error_of(&found[1]), BROKEN_MESSAGE);
}

#[test]
fn compose_inline_config_is_found() {
    let yaml = format!(
        "services:\n  envoy:\n    image: envoyproxy/envoy:v1.36.2\nconfigs:\n  filter:\n    content: |\n{}",
        indent(FILTER_JSON, 6)
    );
    let f = only(find(&yaml).unwrap());
    assert_eq!(f.object, None);
    assert_eq!(f.path, "configs.filter.content");
    assert!(f.result.is_ok());
}

#[test]
fn a_broken_bare_config_names_its_field() {
    let f = only(find(&broken_json()).unwrap());
    assert_eq!(error_of(&f), BROKEN_MESSAGE);
}

#[test]
fn a_file_without_a_filter_config_finds_none() {
    let yaml = "apiVersion: v1\nkind: Service\nmetadata: { name: redis }\nspec:\n  ports: [{ port: 6379 }]\n";
    assert!(find(yaml).unwrap().is_empty());
    assert!(find(r#"{"redis_host": "127.0.0.1"}"#).unwrap().is_empty());
}

#[test]
fn a_yaml_error_names_its_line() {
    let error = find("a: 1\nb: [1, 2\nc: 3\n").unwrap_err();
    assert!(error.contains("line 3"), "{error}");
}
