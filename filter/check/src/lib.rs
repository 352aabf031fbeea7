//! Finds every rate-limit filter config in a file and checks it with the filter's own
//! validation ([`ratelimit_core::Config::parse`]), so a config that passes here is one the filter
//! accepts in Envoy, and a config that fails gets the message Envoy would log.
//!
//! A file is the filter's JSON, an Envoy config (YAML or JSON), or Kubernetes manifests
//! (multi-document YAML). Configs are found in Envoy `Wasm` / `PluginConfig` / `WasmService`
//! objects that load this module, Istio `WasmPlugin`s, Envoy Gateway `EnvoyExtensionPolicy`
//! wasm entries, and in any string that itself holds one of those or a bare filter config
//! (a ConfigMap's data, a compose file's inline config).
//!
//! YAML is read with `yaml-rust2`: pure Rust, YAML 1.2, actively maintained (the successor of
//! the unmaintained `yaml-rust`), multi-document, keeps key order, and its errors carry a line
//! and column. `serde_yaml` is archived and its forks are younger or less active.

mod coverage;
mod find;
pub mod probe;
mod summary;
mod tree;

pub use coverage::findings;
pub use find::{find, Found};
pub use summary::summary;
