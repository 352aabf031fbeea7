//! Validation of the top level, the bridge, batches, the breaker and the deny cache: the raw
//! configuration becomes the model, or an error naming the field.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::Value;

use super::locate::serde_error;
use super::raw::*;
use super::rules::is_token_byte;
use super::*;
use crate::bounds::{check_request_bounds, MAX_BRIDGE_FIELD_BYTES, MAX_CONFIG_BYTES, MAX_RULES};
use crate::encode::base64;
use crate::sha1::sha1_hex;

impl Config {
    /// Parses and validates the filter's JSON configuration.
    pub fn parse(json: &[u8]) -> Result<Config, ConfigError> {
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
}

impl RawConfig {
    pub(super) fn validate(self) -> Result<Config, ConfigError> {
        let redis_cluster = self.bridge.redis_cluster;
        let in_flight_given = self.batch.max_in_flight.is_some();
        let (bridge, default_timeout, clock_skew) = self.bridge.validate()?;
        if redis_cluster && self.clock == Clock::Redis {
            return Err(invalid(
                "clock",
                "must be \"proxy\" with bridge.redis_cluster: each node of a Redis Cluster has its own clock",
            ));
        }
        if self.key_prefix.is_empty()
            || self.key_prefix.len() > 64
            || !self
                .key_prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
        {
            return Err(invalid(
                "key_prefix",
                "must be 1 to 64 printable ASCII characters without spaces or braces",
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
        let rules = list.validate(
            self.rules,
            |r| &r.name,
            |raw, field| raw.validate(field, &defaults),
        )?;
        let config = Config {
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
            deny_cache_entries: validate_deny_cache(self.deny_cache)?,
            redis_cluster: false,
            budget_slot_tags: crate::slot::SlotTags::default(),
            script_sha: sha1_hex(crate::DECISION_LUA.as_bytes()),
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
            // A call holds one slot's requests: several in flight keep every node busy.
            batch.max_in_flight = MAX_IN_FLIGHT as usize;
        }
        let config = Config {
            redis_cluster,
            batch,
            budget_slot_tags,
            ..config
        };
        // Last: the call-size bound counts the keys as cluster mode names them.
        check_request_bounds(&config)?;
        Ok(config)
    }
}

impl RawBridge {
    pub(super) fn validate(self) -> Result<(Bridge, Duration, Duration), ConfigError> {
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
        Ok((
            Bridge {
                cluster,
                authority,
                authorization,
            },
            timeout,
            skew,
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
        stall: timeout_field(raw.stall.as_deref(), "breaker.stall", default.stall)?,
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

/// A list of named items in the config (rules, a rule's limits): not empty, at most `max`,
/// names unique, each validated under its own field (`rules[3]`).
pub(super) struct NamedList<'a> {
    pub(super) field: &'a str,
    /// Singular and plural, for the messages.
    pub(super) noun: (&'a str, &'a str),
    pub(super) max: usize,
    /// After `duplicate rule name "x"`, e.g. ` in this rule`.
    pub(super) duplicate_suffix: &'a str,
}

impl NamedList<'_> {
    pub(super) fn validate<R, T>(
        &self,
        items: Vec<R>,
        name_of: impl Fn(&R) -> &String,
        mut validate: impl FnMut(R, &str) -> Result<T, ConfigError>,
    ) -> Result<Vec<T>, ConfigError> {
        let (one, many) = self.noun;
        if items.is_empty() {
            return Err(invalid(self.field, format!("must hold at least one {one}")));
        }
        if items.len() > self.max {
            return Err(invalid(
                self.field,
                format!("must hold at most {} {many}", self.max),
            ));
        }
        let mut names = HashSet::new();
        let mut out = Vec::with_capacity(items.len());
        for (i, raw) in items.into_iter().enumerate() {
            let field = format!("{}[{i}]", self.field);
            let name = name_of(&raw).clone();
            if !names.insert(name.clone()) {
                return Err(invalid(
                    &format!("{field}.name"),
                    format!("duplicate {one} name \"{name}\"{}", self.duplicate_suffix),
                ));
            }
            out.push(validate(raw, &field)?);
        }
        Ok(out)
    }
}

pub(super) struct RuleDefaults {
    pub(super) failure_mode: FailureMode,
    pub(super) timeout: Duration,
    pub(super) shadow: bool,
    /// The top-level `lease`, for the limits that can take one and set none.
    pub(super) lease: Option<Lease>,
    pub(super) clock: Clock,
}

pub(super) const LEASE_NEEDS_PROXY_CLOCK: &str =
    "needs clock \"proxy\": a lease expires on the proxy's clock, which the script must decide with";

/// Longest `lease.max_ms`: a lease's units sit idle in one worker at most this long.
const MAX_LEASE_MS: u64 = 60_000;

/// `lease` (top level or on a limit): None when absent or `false`, defaults for `true`.
pub(super) fn validate_lease(
    value: Option<Value>,
    field: &str,
) -> Result<Option<Lease>, ConfigError> {
    let raw = match value {
        None | Some(Value::Bool(false)) => return Ok(None),
        Some(Value::Bool(true)) => return Ok(Some(Lease::default())),
        Some(value @ Value::Object(_)) => {
            serde_json::from_value::<RawLease>(value).map_err(|e| invalid(field, e.to_string()))?
        }
        Some(_) => {
            return Err(invalid(
                field,
                "must be true, false or {\"max_units\": N, \"fraction\": F, \"max_ms\": N}",
            ))
        }
    };
    let default = Lease::default();
    let max_units = raw.max_units.unwrap_or(default.max_units);
    if !(1..=crate::bounds::MAX_LIMIT).contains(&max_units) {
        return Err(invalid(
            &format!("{field}.max_units"),
            format!("must be between 1 and {}", crate::bounds::MAX_LIMIT),
        ));
    }
    let fraction = raw.fraction.unwrap_or(default.fraction);
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(invalid(
            &format!("{field}.fraction"),
            "must be a number above 0, at most 1",
        ));
    }
    let max_ms = raw.max_ms.unwrap_or(default.max_ms);
    if !(1..=MAX_LEASE_MS).contains(&max_ms) {
        return Err(invalid(
            &format!("{field}.max_ms"),
            format!("must be between 1 and {MAX_LEASE_MS}"),
        ));
    }
    Ok(Some(Lease {
        max_units,
        fraction,
        max_ms,
    }))
}

/// Rule and limit names end up in Redis keys and header values: keep them plain.
pub(super) fn check_name(name: &str, field: &str) -> Result<(), ConfigError> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    if name.is_empty() || name.len() > 64 || !name.bytes().all(plain) {
        return Err(invalid(
            field,
            "must be 1 to 64 letters, digits, '-' or '_'",
        ));
    }
    Ok(())
}

pub(super) fn check_header_name(name: &str, field: &str) -> Result<String, ConfigError> {
    if name.is_empty() || !name.bytes().all(is_token_byte) {
        return Err(invalid(
            field,
            "must be a header name (letters, digits and !#$%&'*+-.^_`|~)",
        ));
    }
    Ok(name.to_ascii_lowercase())
}
