//! Redis keys as the filter names them: the core's own key functions over the filter
//! configuration an Envoy of the test runs, so that no test spells a key by hand and a change
//! to key naming reaches every test at once.

use std::path::Path;

use ratelimit_core::config::{Limit, Rule};
use ratelimit_core::request::identity::label;
use ratelimit_core::request::keys::{budget_counter_key, overflow_key, redis_key};
use ratelimit_core::Config;

use crate::procs::filter_json_block;

/// The filter configuration of one Envoy, for naming its keys.
pub struct Keys {
    pub config: Config,
}

impl Keys {
    /// The filter configuration inside the Envoy config file `yaml` (the JSON under the wasm
    /// filter's `value: |`), parsed as the filter parses it.
    pub fn from_envoy_yaml(yaml: &str) -> Keys {
        let (block, indent) = filter_json_block(yaml);
        let json: String = block
            .lines()
            .map(|l| format!("{}\n", l.strip_prefix(indent.as_str()).unwrap_or(l)))
            .collect();
        Keys::from_json(&json)
    }

    /// [`Keys::from_envoy_yaml`] of a file.
    pub fn from_envoy_file(path: &Path) -> Keys {
        let yaml = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        Keys::from_envoy_yaml(&yaml)
    }

    /// A filter configuration (JSON) as the filter parses it.
    pub fn from_json(json: &str) -> Keys {
        let config = Config::parse(json.as_bytes())
            .unwrap_or_else(|e| panic!("the filter refuses its configuration: {e}\n{json}"));
        Keys { config }
    }

    fn rule(&self, rule: &str) -> &Rule {
        self.config
            .rules
            .iter()
            .find(|r| r.name == rule)
            .unwrap_or_else(|| panic!("no rule {rule:?} in the filter configuration"))
    }

    fn limit<'a>(&self, rule: &'a Rule, limit: &str) -> &'a Limit {
        rule.limits
            .iter()
            .find(|l| l.name == limit)
            .unwrap_or_else(|| panic!("rule {:?} has no limit {limit:?}", rule.name))
    }

    /// The state key of limit `limit` of rule `rule` for `identity`, found through the key
    /// alternative `label` of the rule (`header:x-api-key`, `client_ip`, `anonymous`, …): the
    /// label must be one the rule can give, so a test cannot name a key the filter never
    /// writes. Hashed or readable as the configuration says.
    pub fn limit_key(&self, rule: &str, limit: &str, label_: &str, identity: &[u8]) -> String {
        let r = self.rule(rule);
        let labels: Vec<&str> = (0..=r.key.alternatives.len())
            .map(|a| label(&r.key, a))
            .collect();
        assert!(
            labels.contains(&label_),
            "rule {rule:?} keys by {labels:?}, not {label_:?}"
        );
        redis_key(&self.config, r, self.limit(r, limit), label_, identity)
    }

    /// The bucket of API key `api_key` under the shipped rule (`per_client`, limit
    /// `per_minute`, keyed by `x-api-key`, in envoy/envoy.yaml and envoy/cluster/envoy.yaml).
    pub fn shipped_bucket(&self, api_key: impl AsRef<[u8]>) -> String {
        self.limit_key(
            "per_client",
            "per_minute",
            "header:x-api-key",
            api_key.as_ref(),
        )
    }

    /// The key counting the new identities of rule `rule` (its key budget); `slot_tag` with a
    /// Redis Cluster (see `ratelimit_core::slot::slot_tags`).
    pub fn budget_counter(&self, rule: &str, slot_tag: Option<u32>) -> String {
        budget_counter_key(&self.config, self.rule(rule), slot_tag)
    }

    /// The state key of the shared identity of rule `rule`'s new identities over its budget.
    pub fn overflow(&self, rule: &str, limit: &str, slot_tag: Option<u32>) -> String {
        let r = self.rule(rule);
        overflow_key(&self.config, r, self.limit(r, limit), slot_tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> Keys {
        Keys::from_envoy_file(&crate::root().join("envoy/envoy.yaml"))
    }

    #[test]
    fn the_shipped_rule_hashes_identities_under_its_prefix() {
        let keys = shipped();
        let digest = ratelimit_core::sha1::sha1_hex(b"alice");
        assert_eq!(
            keys.limit_key("per_client", "per_minute", "header:x-api-key", b"alice"),
            format!("rl:{{header:x-api-key:{digest}}}:per_client:per_minute")
        );
        assert_eq!(
            keys.shipped_bucket("alice"),
            keys.limit_key("per_client", "per_minute", "header:x-api-key", b"alice")
        );
        assert_eq!(
            keys.budget_counter("per_client", None),
            "rl:{key_budget}:per_client"
        );
        assert_eq!(
            keys.overflow("per_client", "per_minute", Some(7)),
            "rl:{b7}:overflow:per_client:per_minute"
        );
    }

    #[test]
    fn readable_identities_follow_the_configuration() {
        let json = r#"{"hash_identities": false, "key_prefix": "t:", "rules": [{"name": "r",
            "key": {"from": ["client_ip"]}, "limits": [{"name": "l", "limit": 1, "window": "1s"}]}]}"#;
        let keys = Keys::from_json(json);
        assert_eq!(
            keys.limit_key("r", "l", "client_ip", b"10.0.0.1"),
            "t:{client_ip=10.0.0.1}:r:l"
        );
    }

    #[test]
    #[should_panic(expected = "not \"header:x-api-key\"")]
    fn a_label_the_rule_cannot_give_is_refused() {
        let json = r#"{"rules": [{"name": "r", "key": {"from": ["client_ip"]},
            "limits": [{"name": "l", "limit": 1, "window": "1s"}]}]}"#;
        Keys::from_json(json).limit_key("r", "l", "header:x-api-key", b"k");
    }
}
