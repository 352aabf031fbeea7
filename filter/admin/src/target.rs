//! The filter's config as the filter reads it, and the Redis keys of one identity's limits
//! named by the filter's own functions (`ratelimit_core::request::keys`), so the tool and the
//! filter can never disagree on a key.

use ratelimit_core::config::{Config, KeySource, Limit, Rule, WhenMissing};
use ratelimit_core::request::address::client_ip;
use ratelimit_core::request::identity::label;
use ratelimit_core::request::keys::{override_key, redis_key, shard_key};
use ratelimit_core::RequestView;

use crate::error::{Error, Result};

/// The filter config in `path` (a filter JSON, an Envoy config, Kubernetes manifests), found
/// by the config checker's finder and parsed by the filter's own `Config::parse`. A file with
/// several filter configs needs `select` (1-based, in the order the checker lists them).
pub fn load(path: &str, select: Option<usize>) -> Result<Config> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::failure(format!("{path}: cannot read: {e}")))?;
    let mut found = ratelimit_check::find(&text)
        .map_err(|e| Error::failure(format!("{path}: not valid YAML or JSON: {e}")))?;
    let place = |f: &ratelimit_check::Found| {
        let mut place = format!("document {}", f.document);
        if let Some(object) = &f.object {
            place.push_str(&format!(" ({object})"));
        }
        if !f.path.is_empty() {
            place.push_str(&format!(": {}", f.path));
        }
        place
    };
    let chosen = match (found.len(), select) {
        (0, _) => {
            return Err(Error::failure(format!(
                "{path}: no rate-limit filter config found"
            )))
        }
        (1, None | Some(1)) => found.remove(0),
        (n, Some(i)) if i <= n => found.remove(i - 1),
        (n, Some(i)) => {
            return Err(Error::usage(format!(
                "--select {i}: {path} holds {n} filter config{}",
                if n == 1 { "" } else { "s" }
            )))
        }
        (n, None) => {
            let list: Vec<String> = found
                .iter()
                .enumerate()
                .map(|(i, f)| format!("  --select {}: {}", i + 1, place(f)))
                .collect();
            return Err(Error::usage(format!(
                "{path} holds {n} filter configs: choose one with --select N:\n{}",
                list.join("\n")
            )));
        }
    };
    let where_ = place(&chosen);
    chosen.result.map_err(|e| {
        Error::failure(format!(
            "{path}: {where_}: invalid filter configuration: {e}"
        ))
    })
}

/// The rules as the tool names them: a rule with plans becomes one rule holding every plan's
/// limits, since a limit's state and override keys are the same in every plan (the rule's and
/// the limit's names). Each limit has the numbers of `plan` where that plan holds it, else of
/// the first plan that does.
pub fn by_name(mut config: Config, plan: Option<&str>) -> Result<Config> {
    if let Some(plan) = plan {
        let plans: Vec<&str> = config
            .rules
            .iter()
            .filter_map(|r| r.plan.as_deref())
            .collect();
        if !plans.contains(&plan) {
            return Err(Error::usage(if plans.is_empty() {
                format!("--plan {plan}: the config's rules have no plans")
            } else {
                format!(
                    "unknown plan {plan:?}: the config's plans are {}",
                    plans.join(", ")
                )
            }));
        }
    }
    let mut merged: Vec<Rule> = Vec::with_capacity(config.rules.len());
    for rule in std::mem::take(&mut config.rules) {
        let chosen = plan.is_some() && rule.plan.as_deref() == plan;
        match merged.iter_mut().find(|r| r.name == rule.name) {
            None => merged.push(rule),
            Some(seen) => {
                for limit in rule.limits {
                    match seen.limits.iter_mut().find(|l| l.name == limit.name) {
                        Some(held) if chosen => *held = limit,
                        Some(_) => {}
                        None => seen.limits.push(limit),
                    }
                }
            }
        }
    }
    config.rules = merged;
    Ok(config)
}

pub fn rule<'c>(config: &'c Config, name: &str) -> Result<&'c Rule> {
    config.rules.iter().find(|r| r.name == name).ok_or_else(|| {
        let names: Vec<&str> = config.rules.iter().map(|r| r.name.as_str()).collect();
        Error::usage(format!(
            "unknown rule {name:?}: the config's rules are {}",
            names.join(", ")
        ))
    })
}

pub fn limit<'r>(rule: &'r Rule, name: &str) -> Result<&'r Limit> {
    rule.limits.iter().find(|l| l.name == name).ok_or_else(|| {
        let names: Vec<&str> = rule.limits.iter().map(|l| l.name.as_str()).collect();
        Error::usage(format!(
            "rule {}: unknown limit {name:?}: its limits are {}",
            rule.name,
            names.join(", ")
        ))
    })
}

/// An identity as the filter's key names it: the `key.from` entry (label) and the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub label: String,
    pub bytes: Vec<u8>,
    /// How the client IP was grouped, when the tool grouped it as the filter does.
    pub grouped: Option<String>,
}

impl Identity {
    /// The identity for people: its bytes where printable, else escaped.
    pub fn shown(&self) -> String {
        self.bytes.escape_ascii().to_string()
    }
}

/// The identity `raw` of rule `rule` under the entry `from` (default: the rule's first). The
/// bytes are the value the filter extracted (an API key header's value, a route's name), with
/// one exception: for a `client_ip` entry an IP address is grouped into the config's
/// `ipv4_prefix` / `ipv6_prefix` by the filter's own function, since the filter keys the
/// group (`203.0.113.0/24`), not the address. The anonymous identity is empty.
pub fn identity(config: &Config, rule: &Rule, from: Option<&str>, raw: &str) -> Result<Identity> {
    let spec = &rule.key;
    let mut labels: Vec<&str> = spec.alternatives.iter().map(|a| a.label.as_str()).collect();
    if spec.when_missing == WhenMissing::Anonymous {
        labels.push(label(spec, spec.alternatives.len()));
    }
    let label_ = match from {
        None => labels.first().copied().unwrap_or("anonymous"),
        Some(from) => labels.iter().copied().find(|l| *l == from).ok_or_else(|| {
            Error::usage(format!(
                "rule {}: --from {from:?} is not one of its key.from entries: {}",
                rule.name,
                labels.join(", ")
            ))
        })?,
    };
    let alternative = spec.alternatives.iter().find(|a| a.label == label_);
    let Some(alternative) = alternative else {
        // The anonymous identity: every request without a key shares it.
        if !raw.is_empty() {
            return Err(Error::usage(format!(
                "rule {}: the anonymous identity is empty: give '' as IDENTITY",
                rule.name
            )));
        }
        return Ok(Identity {
            label: label_.to_string(),
            bytes: Vec::new(),
            grouped: None,
        });
    };
    if raw.is_empty() {
        return Err(Error::usage(format!(
            "rule {}: IDENTITY is empty: the filter never keys {label_} by an empty value",
            rule.name
        )));
    }
    if let [KeySource::ClientIp] = alternative.sources.as_slice() {
        if raw.parse::<std::net::IpAddr>().is_ok() {
            let policy = ratelimit_core::config::ClientIpPolicy {
                xff_trusted_hops: 0,
                ..config.client_ip
            };
            let grouped = client_ip(&Peer(raw), &policy).unwrap_or_else(|| raw.to_string());
            return Ok(Identity {
                label: label_.to_string(),
                bytes: grouped.clone().into_bytes(),
                grouped: (grouped != raw).then_some(grouped),
            });
        }
    }
    Ok(Identity {
        label: label_.to_string(),
        bytes: raw.as_bytes().to_vec(),
        grouped: None,
    })
}

/// A request that is only its peer's address: what the filter's `client_ip` reads with no
/// trusted proxies, so the tool groups an address exactly as the filter does.
struct Peer<'a>(&'a str);

impl RequestView for Peer<'_> {
    fn header(&self, _: &str) -> Option<&[u8]> {
        None
    }
    fn header_copies(&self, _: &str) -> usize {
        0
    }
    fn source_address(&self) -> Option<String> {
        Some(self.0.to_string())
    }
    fn route_name(&self) -> Option<String> {
        None
    }
}

/// The state key of `limit` for `identity`, and its shards' keys when it has shards (each
/// shard's key is what a request spends from; the unsharded key then holds nothing).
pub fn state_keys(config: &Config, rule: &Rule, limit: &Limit, identity: &Identity) -> Vec<String> {
    let key = redis_key(config, rule, limit, &identity.label, &identity.bytes);
    if limit.shards > 1 {
        (0..limit.shards).map(|n| shard_key(&key, n)).collect()
    } else {
        vec![key]
    }
}

/// Where the override of `limit` for `identity` lives: beside its (only) state key.
pub fn override_key_of(config: &Config, rule: &Rule, limit: &Limit, identity: &Identity) -> String {
    override_key(&redis_key(
        config,
        rule,
        limit,
        &identity.label,
        &identity.bytes,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> Config {
        match Config::parse(json.as_bytes()) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    const CONFIG: &str = r#"{"ipv4_prefix": 24, "rules": [
        {"name": "api", "key": {"from": ["header:x-api-key", "client_ip"]},
         "limits": [{"name": "m", "limit": 10, "window": "1m", "overrides": true},
                    {"name": "s", "limit": 100, "window": "1s", "shards": 4}]}]}"#;

    #[test]
    fn keys_are_the_filters() {
        let c = config(CONFIG);
        let rule = &c.rules[0];
        let id = identity(&c, rule, None, "abc").unwrap();
        assert_eq!(id.label, "header:x-api-key");
        let digest = ratelimit_core::sha1::sha1_hex(b"abc");
        assert_eq!(
            state_keys(&c, rule, &rule.limits[0], &id),
            [format!("rl:{{header:x-api-key:{digest}}}:api:m")]
        );
        assert_eq!(
            override_key_of(&c, rule, &rule.limits[0], &id),
            format!("rl:{{header:x-api-key:{digest}}}:api:m:override")
        );
        let shards = state_keys(&c, rule, &rule.limits[1], &id);
        assert_eq!(shards.len(), 4);
        assert_eq!(
            shards[3],
            format!("rl:{{header:x-api-key:{digest}#3}}:api:s")
        );
    }

    #[test]
    fn a_client_ip_is_grouped_as_the_filter_groups_it() {
        let c = config(CONFIG);
        let rule = &c.rules[0];
        let id = identity(&c, rule, Some("client_ip"), "203.0.113.7").unwrap();
        assert_eq!(id.bytes, b"203.0.113.0/24");
        assert_eq!(id.grouped.as_deref(), Some("203.0.113.0/24"));
        let v6 = identity(&c, rule, Some("client_ip"), "2001:db8:1:2:3::9").unwrap();
        assert_eq!(v6.bytes, b"2001:db8:1:2::/64");
        // Already a group: taken as written.
        let group = identity(&c, rule, Some("client_ip"), "203.0.113.0/24").unwrap();
        assert_eq!(
            (group.bytes.as_slice(), group.grouped),
            (&b"203.0.113.0/24"[..], None)
        );
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let c = config(CONFIG);
        let rule = &c.rules[0];
        assert_eq!(
            super::rule(&c, "web").unwrap_err().message,
            "unknown rule \"web\": the config's rules are api"
        );
        assert_eq!(
            limit(rule, "h").unwrap_err().message,
            "rule api: unknown limit \"h\": its limits are m, s"
        );
        assert_eq!(
            identity(&c, rule, Some("route"), "x").unwrap_err().message,
            "rule api: --from \"route\" is not one of its key.from entries: header:x-api-key, client_ip, anonymous"
        );
        assert!(identity(&c, rule, Some("anonymous"), "x").is_err());
        assert_eq!(
            identity(&c, rule, Some("anonymous"), "").unwrap().bytes,
            b""
        );
    }

    #[test]
    fn a_rule_with_plans_is_one_rule_with_every_plans_limits() {
        let json = r#"{"rules": [{"name": "api", "key": {"from": ["metadata:ns:sub"]},
          "plan_from": "metadata:ns:plan", "plans": [
            {"name": "pro", "values": ["pro"], "limits": [
              {"name": "m", "limit": 20, "window": "1m", "overrides": true},
              {"name": "d", "algorithm": "fixed_window", "limit": 1000, "window": "1d"}]},
            {"name": "free", "default": true, "limits": [{"name": "m", "limit": 5, "window": "1m", "overrides": true}]}]}]}"#;
        let numbers = |plan: Option<&str>| {
            let c = by_name(config(json), plan).unwrap();
            assert_eq!(c.rules.len(), 1);
            c.rules[0]
                .limits
                .iter()
                .map(|l| (l.name.clone(), l.limit))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            numbers(None),
            [("m".to_string(), 20), ("d".to_string(), 1000)]
        );
        assert_eq!(
            numbers(Some("free")),
            [("m".to_string(), 5), ("d".to_string(), 1000)]
        );
        assert_eq!(
            by_name(config(json), Some("gold")).unwrap_err().message,
            "unknown plan \"gold\": the config's plans are pro, free"
        );
        let c = by_name(config(json), None).unwrap();
        let rule = &c.rules[0];
        let id = identity(&c, rule, None, "alice").unwrap();
        assert_eq!(id.label, "metadata:ns:sub");
        let digest = ratelimit_core::sha1::sha1_hex(b"alice");
        assert_eq!(
            override_key_of(&c, rule, &rule.limits[0], &id),
            format!("rl:{{metadata:ns:sub:{digest}}}:api:m:override")
        );
    }
}
