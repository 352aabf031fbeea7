//! Validation of the top level, the bridge, batches, the breaker and the deny cache: the raw
//! configuration becomes the model, or an error naming the field.

use std::time::Duration;

use serde_json::Value;

use super::fields::{validate_lease, NamedList, LEASE_NEEDS_PROXY_CLOCK};
use super::locate::serde_error;
use super::raw::*;
use super::rules::RuleDefaults;
use super::*;
use crate::bounds::{
    MAX_BRIDGE_FIELD_BYTES, MAX_CONFIG_BYTES, MAX_KEY_PREFIX_BYTES, MAX_RULES, MAX_TIMEOUT,
    MAX_XFF_HOPS,
};
use crate::encode::base64;
use crate::program::{CallKind, Program};

/// Parses the filter's JSON configuration and validates each field (`Config::parse` then checks
/// what one request can carry).
pub(crate) fn parse_fields(json: &[u8]) -> Result<Config, ConfigError> {
    // Before parsing: every worker VM parses the configuration.
    if json.len() > MAX_CONFIG_BYTES {
        return Err(invalid(
            "",
            format!(
                "the configuration is {} bytes: must be at most {MAX_CONFIG_BYTES}",
                json.len()
            ),
        ));
    }
    // serde would also read a struct from a JSON array, with a confusing message.
    if json
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b != b'{')
    {
        return Err(invalid("", "the configuration must be a JSON object"));
    }
    let raw: RawConfig = serde_json::from_slice(json).map_err(|e| serde_error(json, &e))?;
    raw.validate()
}

impl RawConfig {
    pub(super) fn validate(self) -> Result<Config, ConfigError> {
        let redis_cluster = self.bridge.redis_cluster;
        let program = Program::new(redis_calls(
            self.bridge.redis_calls.as_deref(),
            redis_cluster,
        )?);
        let in_flight_given = self.batch.max_in_flight.is_some();
        let (bridge, default_timeout, clock_skew, lag_allowance) = self.bridge.validate()?;
        if redis_cluster && self.clock == Clock::Redis {
            return Err(invalid(
                "clock",
                "must be \"proxy\" with bridge.redis_cluster: each node of a Redis Cluster has its own clock",
            ));
        }
        if self.key_prefix.is_empty()
            || self.key_prefix.len() > MAX_KEY_PREFIX_BYTES
            || !self
                .key_prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
        {
            return Err(invalid(
                "key_prefix",
                format!("must be 1 to {MAX_KEY_PREFIX_BYTES} printable ASCII characters without spaces or braces"),
            ));
        }
        if self.xff_trusted_hops > MAX_XFF_HOPS {
            return Err(invalid("xff_trusted_hops", "must be between 0 and 10"));
        }
        if !(1..=32).contains(&self.ipv4_prefix) {
            return Err(invalid("ipv4_prefix", "must be between 1 and 32"));
        }
        if !(1..=128).contains(&self.ipv6_prefix) {
            return Err(invalid("ipv6_prefix", "must be between 1 and 128"));
        }
        let lease = match validate_lease(self.lease, "lease")? {
            Some(_) if self.clock == Clock::Redis => {
                return Err(invalid("lease", LEASE_NEEDS_PROXY_CLOCK));
            }
            lease => lease,
        };
        let defaults = RuleDefaults {
            failure_mode: self.failure_mode,
            timeout: default_timeout,
            shadow: self.shadow,
            lease,
            clock: self.clock,
        };
        let list = NamedList {
            field: "rules",
            noun: ("rule", "rules"),
            max: MAX_RULES,
            duplicate_suffix: "",
        };
        let rules: Vec<Rule> = list
            .validate(
                self.rules,
                |r| &r.name,
                |raw, field| raw.validate(field, &defaults),
            )?
            .into_iter()
            .flatten()
            .collect();
        if rules.len() > MAX_RULES {
            return Err(invalid(
                "rules",
                format!("must hold at most {MAX_RULES} rules, each plan of a rule counted as one"),
            ));
        }
        let metered = rules
            .iter()
            .any(|r| r.limits.iter().any(|l| l.usage.is_some()));
        let body_fields = body_fields(&rules);
        if body_fields.len() > crate::bounds::MAX_BODY_FIELDS {
            return Err(invalid(
                "rules",
                format!(
                    "read {} different body: paths, at most {} (each is scanned in every held request body)",
                    body_fields.len(),
                    crate::bounds::MAX_BODY_FIELDS
                ),
            ));
        }
        let config = Config {
            metered,
            body_fields,
            bridge,
            clock: self.clock,
            key_prefix: self.key_prefix,
            hash_identities: self.hash_identities,
            client_ip: ClientIpPolicy {
                xff_trusted_hops: usize::from(self.xff_trusted_hops),
                ipv4_prefix: self.ipv4_prefix,
                ipv6_prefix: self.ipv6_prefix,
            },
            headers: self.headers,
            deny_body: self.deny_body,
            grpc_over_limit: self.grpc_over_limit,
            rules,
            batch: self.batch.validate()?,
            breaker: validate_breaker(self.breaker)?,
            local_share: if self.local_share > 0.0 && self.local_share <= 1.0 {
                self.local_share
            } else {
                return Err(invalid(
                    "local_share",
                    "must be a number above 0, at most 1",
                ));
            },
            clock_skew,
            lag_allowance,
            deny_cache_entries: validate_deny_cache(self.deny_cache)?,
            redis_cluster: false,
            budget_slot_tags: crate::slot::SlotTags::default(),
            program,
        };
        let mut budget_slot_tags = crate::slot::SlotTags::default();
        if redis_cluster {
            for (i, rule) in config.rules.iter().enumerate() {
                let Some(budget) = &rule.key_budget else {
                    continue;
                };
                if cluster_budget(budget).1 > crate::bounds::MAX_WINDOW {
                    return Err(invalid(
                        &format!("rules[{i}].key_budget.window"),
                        "with bridge.redis_cluster each of the 16384 slots counts its own share: window × 16384 / new_keys must be at most 366d (raise new_keys or shorten window)",
                    ));
                }
                if budget_slot_tags.0.is_empty() {
                    budget_slot_tags = crate::slot::SlotTags(crate::slot::slot_tags());
                }
            }
        }
        let mut batch = config.batch;
        if redis_cluster && !in_flight_given {
            // A call carries one slot's requests: several in flight keep every node busy.
            batch.max_in_flight = MAX_IN_FLIGHT as usize;
        }
        let config = Config {
            redis_cluster,
            batch,
            budget_slot_tags,
            ..config
        };
        Ok(config)
    }
}

impl RawBridge {
    /// The bridge, the default timeout, the clock skew and the lag allowance.
    pub(super) fn validate(self) -> Result<(Bridge, Duration, Duration, Duration), ConfigError> {
        // These go into every call's headers, which share Webdis's request size with the path.
        for (name, value) in [
            ("bridge.authority", &self.authority),
            ("bridge.username", &self.username),
            ("bridge.password", &self.password),
        ] {
            if value
                .as_ref()
                .is_some_and(|v| v.len() > MAX_BRIDGE_FIELD_BYTES)
            {
                return Err(invalid(
                    name,
                    format!("must be at most {MAX_BRIDGE_FIELD_BYTES} bytes"),
                ));
            }
        }
        let cluster = self.cluster.unwrap_or_else(|| DEFAULT_CLUSTER.to_string());
        if cluster.is_empty() {
            return Err(invalid("bridge.cluster", "must not be empty"));
        }
        let authority = self.authority.unwrap_or_else(|| cluster.clone());
        if authority.is_empty() || !authority.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "bridge.authority",
                "must be a host name, printable ASCII without spaces",
            ));
        }
        let authorization = match (self.username, self.password) {
            (None, None) => None,
            (Some(user), Some(password)) => {
                if user.is_empty() || user.contains(':') {
                    return Err(invalid(
                        "bridge.username",
                        "must be non-empty and must not contain ':'",
                    ));
                }
                Some(format!(
                    "Basic {}",
                    base64(format!("{user}:{password}").as_bytes())
                ))
            }
            (Some(_), None) => {
                return Err(invalid(
                    "bridge.password",
                    "is required with bridge.username",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "bridge.username",
                    "is required with bridge.password",
                ))
            }
        };
        let timeout = timeout_field(self.timeout.as_deref(), "bridge.timeout", DEFAULT_TIMEOUT)?;
        let skew = timeout_field(
            self.clock_skew.as_deref(),
            "bridge.clock_skew",
            DEFAULT_CLOCK_SKEW,
        )?;
        let lag_allowance = duration_field(
            self.lag_allowance.as_deref(),
            "bridge.lag_allowance",
            DEFAULT_LAG_ALLOWANCE,
        )?;
        if lag_allowance > MAX_TIMEOUT {
            return Err(invalid(
                "bridge.lag_allowance",
                "must be between 0ms and 60s",
            ));
        }
        Ok((
            Bridge {
                cluster,
                authority,
                authorization,
            },
            timeout,
            skew,
            lag_allowance,
        ))
    }
}

impl RawBatch {
    pub(super) fn validate(self) -> Result<Batch, ConfigError> {
        let default = Batch::default();
        let bounded = |value: Option<u64>, default: usize, max: u64, field: &str| match value {
            None => Ok(default),
            Some(n) if (1..=max).contains(&n) => Ok(n as usize),
            Some(_) => Err(invalid(field, format!("must be between 1 and {max}"))),
        };
        Ok(Batch {
            max_requests: bounded(
                self.max_requests,
                default.max_requests,
                MAX_BATCH_REQUESTS,
                "batch.max_requests",
            )?,
            max_in_flight: bounded(
                self.max_in_flight,
                default.max_in_flight,
                MAX_IN_FLIGHT,
                "batch.max_in_flight",
            )?,
        })
    }
}

pub(super) fn validate_breaker(value: Option<Value>) -> Result<Option<Breaker>, ConfigError> {
    let raw = match value {
        None | Some(Value::Bool(true)) => return Ok(Some(Breaker::default())),
        Some(Value::Bool(false)) => return Ok(None),
        Some(value @ Value::Object(_)) => serde_json::from_value::<RawBreaker>(value)
            .map_err(|e| invalid("breaker", e.to_string()))?,
        Some(_) => {
            return Err(invalid(
                "breaker",
                "must be true, false or {\"failures\": N, \"stall\": D, \"probe_interval\": D}",
            ))
        }
    };
    let default = Breaker::default();
    let failures = match raw.failures {
        None => default.failures,
        Some(n) if (1..=MAX_BREAKER_FAILURES).contains(&n) => n as u32,
        Some(_) => return Err(invalid("breaker.failures", "must be between 1 and 1000")),
    };
    Ok(Some(Breaker {
        failures,
        stall: match raw.stall.as_deref() {
            None => default.stall,
            Some(text) => Some(timeout_field(Some(text), "breaker.stall", MAX_TIMEOUT)?),
        },
        probe_interval: timeout_field(
            raw.probe_interval.as_deref(),
            "breaker.probe_interval",
            default.probe_interval,
        )?,
    }))
}

pub(super) fn validate_deny_cache(value: Option<Value>) -> Result<usize, ConfigError> {
    let raw = match value {
        None | Some(Value::Bool(true)) => return Ok(DEFAULT_DENY_CACHE_ENTRIES),
        Some(Value::Bool(false)) => return Ok(0),
        Some(value @ Value::Object(_)) => serde_json::from_value::<RawDenyCache>(value)
            .map_err(|e| invalid("deny_cache", e.to_string()))?,
        Some(_) => {
            return Err(invalid(
                "deny_cache",
                "must be true, false or {\"max_entries\": N}",
            ))
        }
    };
    match raw.max_entries {
        None => Ok(DEFAULT_DENY_CACHE_ENTRIES),
        Some(n) if n <= MAX_DENY_CACHE_ENTRIES => Ok(n as usize),
        Some(_) => Err(invalid(
            "deny_cache.max_entries",
            "must be between 0 and 1000000",
        )),
    }
}

/// `bridge.redis_calls`: how decision calls run in Redis. A Function by default; a script on a
/// Redis Cluster, where Envoy's `redis_proxy` routes `EVALSHA` by its key and knows no `FCALL`.
fn redis_calls(given: Option<&str>, redis_cluster: bool) -> Result<CallKind, ConfigError> {
    match (given, redis_cluster) {
        (None, false) | (Some("function"), false) => Ok(CallKind::Function),
        (None, true) | (Some("script"), _) => Ok(CallKind::Script),
        (Some("function"), true) => Err(invalid(
            "bridge.redis_calls",
            "must be \"script\" with bridge.redis_cluster: Envoy's redis_proxy routes EVALSHA by its key, and FCALL not at all",
        )),
        (Some(_), _) => Err(invalid(
            "bridge.redis_calls",
            "must be \"function\" (FCALL, Redis 7 and later) or \"script\" (EVALSHA)",
        )),
    }
}

/// Every distinct `body:` path the rules read (keys, conditions, plans), in order of first use.
fn body_fields(rules: &[Rule]) -> Vec<super::BodyPath> {
    let mut paths: Vec<super::BodyPath> = Vec::new();
    for rule in rules {
        for path in rule.body_paths() {
            if !paths.contains(path) {
                paths.push(path.clone());
            }
        }
    }
    paths
}
