//! Validation of rules: matches, keys, limits and costs.

use std::time::Duration;

use serde_json::Value;

use super::fields::{
    check_header_name, check_name, validate_lease, NamedList, LEASE_NEEDS_PROXY_CLOCK,
};
use super::raw::*;
use super::sources::parse_source;
use super::*;
pub use crate::bounds::{MAX_COST, MAX_SHARDS};
use crate::bounds::{
    MAX_KEY_SOURCE_BYTES, MAX_LIMIT, MAX_LIMITS_PER_RULE, MAX_LOG_LIMIT, MAX_STATE_LIFETIME,
    MAX_WINDOW, OVERRIDE_STALE_MS,
};
use crate::calendar::parse_offset;

/// What a rule takes from the top level when it does not set it.
pub(super) struct RuleDefaults {
    pub(super) failure_mode: FailureMode,
    pub(super) timeout: Duration,
    pub(super) shadow: bool,
    /// The top-level `lease`, for the limits that can take one and set none.
    pub(super) lease: Option<Lease>,
    pub(super) clock: Clock,
}

impl RawRule {
    /// The rule, or with `plans` one rule per plan (see [`Rule::plan`]).
    pub(super) fn validate(
        self,
        field: &str,
        defaults: &RuleDefaults,
    ) -> Result<Vec<Rule>, ConfigError> {
        check_name(&self.name, &format!("{field}.name"))?;
        let matcher = self.matcher.validate(&format!("{field}.match"))?;
        let key = self.key.validate(&format!("{field}.key"))?;
        let shadow = self.shadow || defaults.shadow;
        let leasing = LeaseContext {
            inherited: defaults.lease,
            shadow,
            key_budget: self.key_budget.is_some(),
            clock: defaults.clock,
        };
        let cost = validate_cost(self.cost, &format!("{field}.cost"))?;
        let timeout = timeout_field(
            self.timeout.as_deref(),
            &format!("{field}.timeout"),
            defaults.timeout,
        )?;
        let key_budget = match self.key_budget {
            None => None,
            Some(raw) => Some(raw.validate(&format!("{field}.key_budget"))?),
        };
        let rule = Rule {
            name: self.name,
            matcher,
            key,
            limits: Vec::new(),
            cost,
            failure_mode: self.failure_mode.unwrap_or(defaults.failure_mode),
            timeout,
            shadow,
            key_budget,
            plan: None,
        };
        let limits_of = |raw: Vec<RawLimit>, field: &str| {
            let list = NamedList {
                field,
                noun: ("limit", "limits"),
                max: MAX_LIMITS_PER_RULE,
                duplicate_suffix: " in this rule",
            };
            list.validate(raw, |l| &l.name, |raw, field| raw.validate(field, &leasing))
        };
        match (self.limits, self.plan_from, self.plans) {
            (Some(limits), None, None) => Ok(vec![Rule {
                limits: limits_of(limits, &format!("{field}.limits"))?,
                ..rule
            }]),
            (None, Some(from), Some(plans)) => {
                super::plans::expand(rule, &from, plans, field, limits_of)
            }
            (Some(_), _, Some(_)) => Err(invalid(
                &format!("{field}.limits"),
                "a rule with plans has no limits of its own: each plan holds its limits",
            )),
            (None, None, None) => Err(invalid(&format!("{field}.limits"), "is required")),
            (_, Some(_), None) => Err(invalid(
                &format!("{field}.plans"),
                "is required with plan_from: the plans the source's values name, one of them the default",
            )),
            (_, None, Some(_)) => Err(invalid(
                &format!("{field}.plan_from"),
                "is required with plans: the source naming a request's plan, e.g. metadata:envoy.filters.http.jwt_authn:jwt_payload:plan",
            )),
        }
    }
}

impl RawMatch {
    pub(super) fn validate(self, field: &str) -> Result<Match, ConfigError> {
        let path = match (self.path_exact, self.path_prefix) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    field,
                    "path_exact and path_prefix exclude each other",
                ))
            }
            (Some(p), None) => Some((PathMatch::Exact(p.clone()), p, "path_exact")),
            (None, Some(p)) => Some((PathMatch::Prefix(p.clone()), p, "path_prefix")),
            (None, None) => None,
        };
        if let Some((_, text, name)) = &path {
            if !text.starts_with('/') {
                return Err(invalid(&format!("{field}.{name}"), "must start with '/'"));
            }
        }
        let methods = match self.methods {
            None => Vec::new(),
            Some(methods) if methods.is_empty() => {
                return Err(invalid(
                    &format!("{field}.methods"),
                    "must not be empty (leave it out to match any method)",
                ))
            }
            Some(methods) => {
                let mut upper = Vec::with_capacity(methods.len());
                for (k, m) in methods.iter().enumerate() {
                    if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic()) {
                        return Err(invalid(
                            &format!("{field}.methods[{k}]"),
                            "must be an HTTP method such as GET",
                        ));
                    }
                    upper.push(m.to_ascii_uppercase());
                }
                upper
            }
        };
        let mut conditions = Vec::new();
        if let Some(h) = self.header {
            let name = check_header_name(&h.name, &format!("{field}.header.name"))?;
            let test = match h.value {
                None => Test::Present,
                Some(v) if v.is_empty() => {
                    return Err(invalid(
                        &format!("{field}.header.value"),
                        "must not be empty: an empty header is an absent one",
                    ))
                }
                Some(v) => Test::In(vec![v.into_bytes()]),
            };
            conditions.push(Condition {
                source: KeySource::Header(name),
                test,
            });
        }
        for (i, raw) in self.sources.into_iter().flatten().enumerate() {
            conditions.push(raw.validate(&format!("{field}.sources[{i}]"))?);
        }
        Ok(Match {
            path: path.map(|(p, _, _)| p),
            methods,
            conditions,
        })
    }
}

impl RawKey {
    pub(super) fn validate(self, field: &str) -> Result<KeySpec, ConfigError> {
        if self.from.is_empty() {
            return Err(invalid(
                &format!("{field}.from"),
                "must name at least one key source",
            ));
        }
        let mut alternatives = Vec::with_capacity(self.from.len());
        for (k, text) in self.from.iter().enumerate() {
            let entry_field = format!("{field}.from[{k}]");
            // The entry is the label in every key of the rule.
            if text.len() > MAX_KEY_SOURCE_BYTES {
                return Err(invalid(
                    &entry_field,
                    format!("must be at most {MAX_KEY_SOURCE_BYTES} characters"),
                ));
            }
            let mut sources = Vec::new();
            for part in text.split('+') {
                sources.push(parse_source(part, &entry_field).map_err(|mut e| {
                    if e.message.starts_with("unknown source") {
                        e.message.push_str(", joined with '+'");
                    }
                    e
                })?);
            }
            alternatives.push(KeyAlternative {
                label: text.to_ascii_lowercase(),
                sources,
            });
        }
        Ok(KeySpec {
            alternatives,
            when_missing: self.when_missing,
        })
    }
}

impl RawKeyBudget {
    fn validate(self, field: &str) -> Result<KeyBudget, ConfigError> {
        let new_keys_field = format!("{field}.new_keys");
        if self.new_keys < 1 {
            return Err(invalid(&new_keys_field, "must be >= 1"));
        }
        if self.new_keys > MAX_LIMIT {
            return Err(invalid(
                &new_keys_field,
                format!("must be at most {MAX_LIMIT}"),
            ));
        }
        let window_field = format!("{field}.window");
        let window = duration_field(Some(&self.window), &window_field, Duration::ZERO)?;
        if window < Duration::from_millis(1) {
            return Err(invalid(&window_field, "must be at least 1ms"));
        }
        if window > MAX_WINDOW {
            return Err(invalid(
                &window_field,
                format!("must be at most {}", show_duration(MAX_WINDOW)),
            ));
        }
        Ok(KeyBudget {
            new_keys: self.new_keys,
            window,
            over_budget: self.over_budget,
        })
    }
}

/// What decides whether a rule's limits take a lease.
pub(super) struct LeaseContext {
    /// The top-level `lease`.
    inherited: Option<Lease>,
    shadow: bool,
    key_budget: bool,
    clock: Clock,
}

impl LeaseContext {
    /// The lease of a limit: its own setting (an error where a lease cannot work), else the
    /// top-level one where it can.
    fn resolve(
        &self,
        own: Option<Value>,
        algorithm: Algorithm,
        field: &str,
    ) -> Result<Option<Lease>, ConfigError> {
        let field = format!("{field}.lease");
        let why_not = if !algorithm.leasable() {
            Some("only token_bucket, gcra and fixed_window limits take a lease: a sliding window's units would leave the window counted from their charge, not from their use")
        } else if self.shadow {
            Some("a shadow rule's limits are decided per request: they only report what they would refuse")
        } else if self.key_budget {
            Some("a rule with a key_budget is decided per request: its new identities are counted in Redis")
        } else if self.clock == Clock::Redis {
            Some(LEASE_NEEDS_PROXY_CLOCK)
        } else {
            None
        };
        match own {
            None => Ok(self.inherited.filter(|_| why_not.is_none())),
            Some(value) => match (validate_lease(Some(value), &field)?, why_not) {
                (Some(_), Some(why)) => Err(invalid(&field, why)),
                (lease, _) => Ok(lease),
            },
        }
    }
}

impl RawLimit {
    pub(super) fn validate(
        self,
        field: &str,
        leasing: &LeaseContext,
    ) -> Result<Limit, ConfigError> {
        if self.algorithm == Algorithm::Concurrency {
            check_concurrency(&self, field, leasing)?;
        }
        let mut lease = leasing.resolve(self.lease, self.algorithm, field)?;
        if self.overrides {
            // An override must reach every worker within the bound: no lease outlives it.
            lease = lease.map(|l| Lease {
                max_ms: l.max_ms.min(OVERRIDE_STALE_MS),
                ..l
            });
        }
        check_name(&self.name, &format!("{field}.name"))?;
        let limit_field = format!("{field}.limit");
        if self.limit < 1 {
            return Err(invalid(&limit_field, "must be >= 1"));
        }
        if self.limit > MAX_LIMIT {
            return Err(invalid(
                &limit_field,
                format!("must be at most {MAX_LIMIT}"),
            ));
        }
        if self.algorithm == Algorithm::SlidingWindowLog && self.limit > MAX_LOG_LIMIT {
            return Err(invalid(
                &limit_field,
                format!(
                    "sliding_window_log keeps one entry per unit: must be at most {MAX_LOG_LIMIT}"
                ),
            ));
        }
        if self.algorithm == Algorithm::Concurrency && self.limit > MAX_LOG_LIMIT {
            return Err(invalid(
                &limit_field,
                format!(
                    "a concurrency limit keeps one entry per request in flight: must be at most {MAX_LOG_LIMIT}"
                ),
            ));
        }
        let concurrency = self.algorithm == Algorithm::Concurrency;
        // A concurrency limit's state lives by its admissions' deadlines: the script takes
        // max_duration where the others take their window.
        let (window_key, window_text) = match (concurrency, &self.window, &self.max_duration) {
            (false, Some(w), None) => ("window", w),
            (false, None, _) => return Err(invalid(&format!("{field}.window"), "is required")),
            (false, Some(_), Some(_)) => {
                return Err(invalid(
                    &format!("{field}.max_duration"),
                    "only a concurrency limit has a max_duration",
                ))
            }
            (true, None, Some(d)) => ("max_duration", d),
            (true, Some(_), _) => {
                return Err(invalid(
                    &format!("{field}.window"),
                    "a concurrency limit has no window: it counts requests in flight, each held at most max_duration",
                ))
            }
            (true, None, None) => {
                return Err(invalid(
                    &format!("{field}.max_duration"),
                    "is required for a concurrency limit: the longest a request keeps its hold when its end is never seen",
                ))
            }
        };
        let window = limit_window(
            window_text,
            self.utc_offset.as_deref(),
            self.algorithm,
            &format!("{field}.{window_key}"),
            field,
        )?;
        let burst = match self.burst {
            None => self.limit,
            Some(_) if !self.algorithm.has_burst() => {
                return Err(invalid(
                    &format!("{field}.burst"),
                    format!(
                        "{} has no burst: only token_bucket and gcra do",
                        self.algorithm.name()
                    ),
                ))
            }
            Some(0) => return Err(invalid(&format!("{field}.burst"), "must be >= 1")),
            Some(burst) if burst > MAX_LIMIT => {
                return Err(invalid(
                    &format!("{field}.burst"),
                    format!("must be at most {MAX_LIMIT}"),
                ))
            }
            Some(burst) => burst,
        };
        // Only a burst above the limit can make a bucket outlive the longest window.
        if state_lifetime_ms(self.algorithm, self.limit, window, burst)
            > MAX_STATE_LIFETIME.as_millis()
        {
            return Err(invalid(
                &format!("{field}.burst"),
                format!(
                    "the state would live burst / limit × window, longer than {}: lower burst or window",
                    show_duration(MAX_STATE_LIFETIME)
                ),
            ));
        }
        let shards = self.shards.unwrap_or(1);
        if !(1..=MAX_SHARDS).contains(&shards) {
            return Err(invalid(
                &format!("{field}.shards"),
                format!("must be between 1 and {MAX_SHARDS}"),
            ));
        }
        if self.limit < shards || burst < shards {
            return Err(invalid(
                &format!("{field}.shards"),
                "every shard holds limit / shards and burst / shards: both must be at least shards",
            ));
        }
        if self.overrides && shards > 1 {
            return Err(invalid(
                &format!("{field}.overrides"),
                "a sharded limit spreads one identity over several slots: an override would have to be read on each; use shards 1",
            ));
        }
        let usage = match self.usage {
            None => None,
            Some(raw) => Some(super::usage::validate_usage(
                raw,
                &format!("{field}.usage"),
                self.algorithm,
                lease.is_some(),
                shards,
            )?),
        };
        Ok(Limit {
            name: self.name,
            algorithm: self.algorithm,
            limit: self.limit,
            window,
            burst,
            shards,
            lease,
            usage,
            overrides: self.overrides,
        })
    }
}

/// What a concurrency limit cannot be combined with: each of its requests has a hold, by its
/// own id, from its admission to its end, decided per request.
fn check_concurrency(
    raw: &RawLimit,
    field: &str,
    leasing: &LeaseContext,
) -> Result<(), ConfigError> {
    let why = if raw.lease.as_ref().is_some_and(|l| l != &Value::Bool(false)) {
        Some(("lease", "a hold is taken per request: it cannot be leased"))
    } else if raw.shards.is_some_and(|s| s != 1) {
        Some(("shards", "a concurrency limit is not sharded"))
    } else if raw.usage.is_some() {
        Some((
            "usage",
            "a concurrency limit counts requests in flight, not usage",
        ))
    } else if leasing.shadow {
        Some((
            "algorithm",
            "a shadow rule cannot take holds: put the concurrency limit in an enforced rule",
        ))
    } else if leasing.key_budget {
        Some((
            "algorithm",
            "a rule with a key_budget cannot take concurrency holds",
        ))
    } else {
        None
    };
    match why {
        Some((key, why)) => Err(invalid(&format!("{field}.{key}"), why)),
        None => Ok(()),
    }
}

/// A limit's `window` and `utc_offset`: a duration, or for a fixed window a calendar day,
/// week or month, in UTC or at the offset given.
fn limit_window(
    text: &str,
    utc_offset: Option<&str>,
    algorithm: Algorithm,
    window_field: &str,
    field: &str,
) -> Result<Window, ConfigError> {
    let offset_field = format!("{field}.utc_offset");
    if let Some(unit) = CalendarUnit::from_name(text) {
        if algorithm != Algorithm::FixedWindow {
            return Err(invalid(
                window_field,
                format!(
                    "\"{text}\" is a calendar window, which only fixed_window takes; {} needs a duration such as \"1d\"",
                    algorithm.name()
                ),
            ));
        }
        let offset_minutes = match utc_offset {
            None => 0,
            Some(offset) => parse_offset(offset).ok_or_else(|| {
                invalid(
                    &offset_field,
                    format!("invalid offset \"{offset}\": expected ±HH:MM between -14:00 and +14:00, like \"+05:30\""),
                )
            })?,
        };
        return Ok(Window::Calendar(Calendar {
            unit,
            offset_minutes,
        }));
    }
    let window = duration_field(Some(text), window_field, Duration::ZERO).map_err(|e| {
        if algorithm == Algorithm::FixedWindow {
            let message = format!(
                "{}, or a calendar window: \"day\", \"week\" or \"month\"",
                e.message
            );
            invalid(window_field, message)
        } else {
            e
        }
    })?;
    if window.is_zero() {
        return Err(invalid(window_field, "must be > 0"));
    }
    if window > MAX_WINDOW {
        return Err(invalid(
            window_field,
            format!("must be at most {}", show_duration(MAX_WINDOW)),
        ));
    }
    if utc_offset.is_some() {
        return Err(invalid(
            &offset_field,
            "only a calendar window (\"day\", \"week\" or \"month\") takes an offset: a window of a fixed length is aligned to the Unix epoch",
        ));
    }
    Ok(Window::Fixed(window))
}

pub(super) fn validate_cost(value: Option<Value>, field: &str) -> Result<Cost, ConfigError> {
    let value = match value {
        None => return Ok(Cost::Fixed(1)),
        Some(value) => value,
    };
    if let Some(n) = value.as_u64() {
        if !(1..=MAX_COST).contains(&n) {
            return Err(invalid(field, "must be between 1 and 1000000"));
        }
        return Ok(Cost::Fixed(n));
    }
    if !value.is_object() {
        return Err(invalid(
            field,
            "must be a whole number or {\"header\": NAME, \"min\": N, \"max\": N}",
        ));
    }
    let raw: RawCostHeader =
        serde_json::from_value(value).map_err(|e| invalid(field, e.to_string()))?;
    let name = check_header_name(&raw.header, &format!("{field}.header"))?;
    let (Some(min), Some(max)) = (raw.min, raw.max) else {
        return Err(invalid(
            field,
            "a cost taken from a header needs both min and max",
        ));
    };
    if min > max || max > MAX_COST {
        return Err(invalid(field, "needs min <= max <= 1000000"));
    }
    let default = raw.default.unwrap_or(min);
    if !(min..=max).contains(&default) {
        return Err(invalid(
            &format!("{field}.default"),
            "must be between min and max",
        ));
    }
    Ok(Cost::Header {
        name,
        min,
        max,
        default,
    })
}
