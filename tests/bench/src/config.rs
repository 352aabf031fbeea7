//! Envoy configs of the scenarios, all derived from the shipped `envoy/envoy.yaml` (same
//! listener, same `direct_response` route, same `webdis` cluster):
//!
//! - the filter scenarios: the shipped config with the filter's JSON replaced by
//!   [`filter_json`]'s (the only code here that knows the filter's config schema);
//! - `baseline`: the wasm filter's entry removed from `http_filters`;
//! - `local_ratelimit`: that entry replaced by `tests/bench/local_ratelimit.yaml`.

use std::path::Path;

use serde_json::{json, Value};

use e2e::procs::{envoy_config, filter_json_block, indent_of};
use e2e::{root, wasm_path};

/// An algorithm the accuracy runs measure, with the most an exact limiter of its kind may
/// allow on one key under continuous overload between two instants.
pub struct Algorithm {
    pub name: &'static str,
    /// How the allowance is computed, for the report.
    pub formula: &'static str,
    /// (policy, first instant, last instant, in Unix seconds) -> allowance in requests.
    pub allowance: fn(&Policy, f64, f64) -> f64,
}

/// A full bucket of C, then R per second.
fn burst_plus_rate(p: &Policy, from: f64, to: f64) -> f64 {
    p.capacity as f64 + p.rate_per_sec * (to - from)
}

/// At most `limit` (= R × 1 s) in any 1 s window: ceil(span) windows cover the span.
fn per_sliding_window(p: &Policy, from: f64, to: f64) -> f64 {
    p.rate_per_sec * WINDOW_S * ((to - from) / WINDOW_S).ceil().max(1.0)
}

/// At most `limit` in each window aligned to the Unix epoch that the span touches. Also a
/// bound for the sliding window counter, which never lets a window's own count pass `limit`.
fn per_aligned_window(p: &Policy, from: f64, to: f64) -> f64 {
    let windows = (to / WINDOW_S).floor() - (from / WINDOW_S).floor() + 1.0;
    p.rate_per_sec * WINDOW_S * windows
}

/// Algorithms whose global accuracy the bench measures, each under the same load. To add one:
/// an entry here with its allowance (and, if it needs other settings, in [`filter_json`]).
pub const ALGORITHMS: &[Algorithm] = &[
    Algorithm {
        name: "token_bucket",
        formula: "C + R × window",
        allowance: burst_plus_rate,
    },
    Algorithm {
        name: "gcra",
        formula: "C + R × window",
        allowance: burst_plus_rate,
    },
    Algorithm {
        name: "sliding_window_log",
        formula: "R × 1 s × ⌈window / 1 s⌉",
        allowance: per_sliding_window,
    },
    Algorithm {
        name: "sliding_window_counter",
        formula: "R × 1 s × aligned 1 s windows touched",
        allowance: per_aligned_window,
    },
    Algorithm {
        name: "fixed_window",
        formula: "R × 1 s × aligned 1 s windows touched",
        allowance: per_aligned_window,
    },
];

/// The window the filter config expresses rates over: `limit` = R × 1 s.
pub const WINDOW_S: f64 = 1.0;

/// A path no bench request asks for: the rule of `filter-pass-through` matches only it.
pub const NEVER_MATCHED_PATH: &str = "/never-requested-by-the-bench";

/// The request header that picks a policy when one config holds several.
pub const POLICY_HEADER: &str = "x-bench-algorithm";

/// What the filter enforces in a scenario.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub algorithm: &'static str,
    /// Burst (token bucket, GCRA): what a fresh key may spend at once.
    pub capacity: u64,
    /// Sustained allowance per second; a whole number (`limit` per 1 s window).
    pub rate_per_sec: f64,
    /// Deadline of each call to Webdis.
    pub timeout_ms: u64,
    /// `"open"`, or `"local"` (each worker limits alone when the bridge fails).
    pub failure_mode: &'static str,
    /// Units a worker may take ahead on this limit and spend without a call (token bucket and
    /// GCRA only); None: no lease.
    pub lease: Option<Lease>,
    /// `bridge.clock_skew` in ms (the smallest over a config's policies); None: the filter's
    /// default (1 s). A lease ends that long before the bucket would be full again, so with
    /// the default a lease on a bucket that refills within a second never lasts.
    pub clock_skew_ms: Option<u64>,
    /// `"overrides": true`: each decision also reads the identity's override in Redis.
    pub overrides: bool,
    /// Keyed on a JWT claim in dynamic metadata ([`CLAIM_SOURCE`]) instead of the
    /// `x-api-key` header: a `set_metadata` filter before ours puts the claim there for every
    /// request, as `jwt_authn`'s `payload_in_metadata` would.
    pub claim: bool,
}

/// The key source of a policy with `claim`.
pub const CLAIM_SOURCE: &str = "metadata:envoy.filters.http.jwt_authn:jwt_payload:sub";

/// The `http_filters` entry putting the claim of [`CLAIM_SOURCE`] into every request's dynamic
/// metadata, inserted before the rate-limit filter (at the shipped envoy.yaml's indentation).
const CLAIM_FILTER: &str = "          - name: envoy.filters.http.set_metadata\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config\n              metadata:\n              - metadata_namespace: envoy.filters.http.jwt_authn\n                value: { jwt_payload: { sub: bench-client } }\n";

/// A lease on a limit, as the filter's `lease` object writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lease {
    /// Units one lease holds at most.
    pub max_units: u64,
    /// The most of what is left of the limit one lease takes.
    pub fraction: f64,
    /// Unused units go back after this long (sooner when the bucket would be full again).
    pub max_ms: u64,
}

impl Lease {
    /// The filter's defaults (`"lease": true`).
    pub const DEFAULT: Lease = Lease {
        max_units: 100,
        fraction: 0.1,
        max_ms: 1000,
    };

    /// The limit's `lease` object.
    pub fn json(&self) -> Value {
        json!({
            "max_units": self.max_units,
            "fraction": self.fraction,
            "max_ms": self.max_ms,
        })
    }
}

impl Policy {
    /// The name of the policy's rule: leased and unleased policies of one algorithm (and
    /// those with overrides on) keep their state under different Redis keys.
    pub fn rule_name(&self) -> String {
        let mut name = format!("bench-{}", self.algorithm);
        if self.lease.is_some() {
            name += "-leased";
        }
        if self.overrides {
            name += "-overrides";
        }
        if self.claim {
            name += "-claim";
        }
        name
    }
}

/// The name of the one limit of every rule [`filter_json`] writes.
pub const LIMIT_NAME: &str = "bench";

/// An identity's override of a limit with a burst, as an operator writes it: the hash at
/// `<state key>:override` with `mode` `limit`, and the limit (per 1 s window) and burst that
/// replace the config's for that identity. No TTL: it holds for the whole run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Override {
    pub limit: u64,
    pub burst: u64,
}

impl Override {
    /// The fields and values of the override's hash, for `HSET`.
    pub fn fields(&self) -> Vec<String> {
        vec![
            "mode".into(),
            "limit".into(),
            "limit".into(),
            self.limit.to_string(),
            "burst".into(),
            self.burst.to_string(),
        ]
    }

    /// `policy` with the override's numbers: what the identity's decisions enforce.
    pub fn applied_to(&self, policy: &Policy) -> Policy {
        Policy {
            capacity: self.burst,
            rate_per_sec: self.limit as f64 / WINDOW_S,
            ..*policy
        }
    }
}

/// The filter's JSON config enforcing `policies` on the `x-api-key` header (fail open), from
/// the shipped one, so the bridge settings and credentials stay the shipped ones. With several
/// policies, each is a rule that applies to requests whose `x-bench-algorithm` header names
/// its algorithm (one Envoy then serves the accuracy runs of every algorithm). THE one place
/// that knows the filter's config schema: adapt this function, and only it, when it changes.
pub fn filter_json(shipped: &Value, policies: &[Policy], never_match: bool) -> Value {
    let mut config = shipped.clone();
    let timeout = policies.iter().map(|p| p.timeout_ms).min().unwrap_or(150);
    config["bridge"]["timeout"] = json!(format!("{timeout}ms"));
    if let Some(skew) = policies.iter().filter_map(|p| p.clock_skew_ms).min() {
        config["bridge"]["clock_skew"] = json!(format!("{skew}ms"));
    }
    let local = policies.iter().any(|p| p.failure_mode == "local");
    config["failure_mode"] = json!(if local { "local" } else { "open" });
    let rules: Vec<Value> = policies
        .iter()
        .map(|p| {
            assert!(
                p.rate_per_sec >= 1.0 && p.rate_per_sec.fract() == 0.0,
                "rates are whole numbers per {WINDOW_S} s: {}",
                p.rate_per_sec
            );
            let mut limit = json!({
                "name": LIMIT_NAME,
                "algorithm": p.algorithm,
                "limit": p.rate_per_sec as u64,
                "window": "1s",
            });
            if matches!(p.algorithm, "token_bucket" | "gcra") {
                limit["burst"] = json!(p.capacity);
            }
            if let Some(lease) = p.lease {
                limit["lease"] = lease.json();
            }
            if p.overrides {
                limit["overrides"] = json!(true);
            }
            let key = if p.claim {
                CLAIM_SOURCE
            } else {
                "header:x-api-key"
            };
            let mut rule = json!({
                "name": p.rule_name(),
                "key": { "from": [key] },
                "limits": [limit],
            });
            if policies.len() > 1 {
                rule["match"] =
                    json!({ "header": { "name": POLICY_HEADER, "value": p.algorithm } });
            }
            if never_match {
                rule["match"] = json!({ "path_exact": NEVER_MATCHED_PATH });
            }
            rule
        })
        .collect();
    config["rules"] = json!(rules);
    config
}

/// A rule metering usage on the OpenAI-compatible test upstream: a request limit and a usage
/// limit (token bucket, tokens read from `usage.total_tokens` of the JSON body or the
/// stream's last usage event), one decision for both.
#[derive(Clone, Debug)]
pub struct UsagePolicy {
    /// The rule's name; with several policies in one config, also the value of
    /// [`USAGE_ROW_HEADER`] that picks it.
    pub name: &'static str,
    /// `"reserve"` or `"after"`.
    pub admit: &'static str,
    /// Requests per second of the request limit.
    pub requests_per_s: u64,
    /// The usage limit: `tokens` per `window_s`, a bucket of `tokens` (full at the start).
    pub tokens: u64,
    pub window_s: u64,
    /// Where the usage is read: `body:usage.total_tokens`, [`STATUS_USAGE`] (1 per answer
    /// of [`STATUS_COUNTED`]), or `openai` with `weights`.
    pub from: &'static str,
    /// Whole weights of OpenAI's input and output tokens (with `from: "openai"`).
    pub weights: Option<(u64, u64)>,
    /// The fixed estimate (what `reserve` charges up front; what `after` charges when the
    /// usage cannot be read).
    pub estimate: u64,
    pub timeout_ms: u64,
}

/// The status the usage rows' status-counted row has its answers given (a failed login), and
/// its usage source: 1 unit per such answer.
pub const STATUS_COUNTED: u16 = 401;
pub const STATUS_USAGE: &str = "status:401";
/// The usage source of every other usage row.
pub const BODY_USAGE: &str = "body:usage.total_tokens";

impl UsagePolicy {
    /// The status of an answer the upstream lets through: [`STATUS_COUNTED`] for the
    /// status-counted row, 200 for the others.
    pub fn answer_status(&self) -> u16 {
        if self.from == STATUS_USAGE {
            STATUS_COUNTED
        } else {
            200
        }
    }

    /// Tokens refilled per second.
    pub fn rate_per_sec(&self) -> f64 {
        self.tokens as f64 / self.window_s as f64
    }
}

/// The request header that picks a usage policy when one config holds several.
pub const USAGE_ROW_HEADER: &str = "x-bench-usage";

/// The filter's JSON config enforcing `policies` on the `x-api-key` header, as
/// [`filter_json`] does for request-counted policies (the second place that knows the config
/// schema: the usage limit's).
pub fn usage_filter_json(shipped: &Value, policies: &[UsagePolicy], never_match: bool) -> Value {
    let mut config = shipped.clone();
    let timeout = policies.iter().map(|p| p.timeout_ms).min().unwrap_or(150);
    config["bridge"]["timeout"] = json!(format!("{timeout}ms"));
    config["failure_mode"] = json!("open");
    let rules: Vec<Value> = policies
        .iter()
        .map(|p| {
            let mut rule = json!({
                "name": p.name,
                "key": { "from": ["header:x-api-key"] },
                "limits": [
                    {"name": "requests", "limit": p.requests_per_s, "window": "1s"},
                    {"name": "tokens", "algorithm": "token_bucket", "limit": p.tokens,
                     "burst": p.tokens, "window": format!("{}s", p.window_s),
                     "usage": {"from": p.from, "admit": p.admit,
                               "estimate": p.estimate}},
                ],
            });
            if let Some((input, output)) = p.weights {
                rule["limits"][1]["usage"]["weights"] = json!({"input": input, "output": output});
            }
            if policies.len() > 1 {
                rule["match"] = json!({ "header": { "name": USAGE_ROW_HEADER, "value": p.name } });
            }
            if never_match {
                rule["match"] = json!({ "path_exact": NEVER_MATCHED_PATH });
            }
            rule
        })
        .collect();
    config["rules"] = json!(rules);
    config
}

/// A rule with one concurrency limit on the OpenAI-compatible test upstream: at most `limit`
/// requests of a key in flight at once, across every replica.
#[derive(Clone, Copy, Debug)]
pub struct ConcurrencyPolicy {
    /// The rule's name (the row's).
    pub name: &'static str,
    /// Requests of a key in flight at once.
    pub limit: u64,
    /// How long a slot whose release never comes stays held.
    pub max_duration_s: u64,
    pub timeout_ms: u64,
}

/// The name of the concurrency rule's one limit.
pub const CONCURRENCY_LIMIT_NAME: &str = "in_flight";

/// The filter's JSON config enforcing `policy` on the `x-api-key` header, fail open (the third
/// place that knows the config schema: the concurrency limit's).
pub fn concurrency_filter_json(shipped: &Value, policy: &ConcurrencyPolicy) -> Value {
    let mut config = shipped.clone();
    config["bridge"]["timeout"] = json!(format!("{}ms", policy.timeout_ms));
    config["failure_mode"] = json!("open");
    config["rules"] = json!([{
        "name": policy.name,
        "key": { "from": ["header:x-api-key"] },
        "limits": [{"name": CONCURRENCY_LIMIT_NAME, "algorithm": "concurrency",
                    "limit": policy.limit, "max_duration": format!("{}s", policy.max_duration_s)}],
    }]);
    config
}

/// The rules of the busy-machine rows, on the shipped filter JSON (its bridge, timeout and
/// breaker as shipped): a fail-open token bucket of `hot_rate` units per second (burst as
/// much) on `/hot`, costs 1 to 5 from `x-cost`; and a fail-closed rule on `/accounts`, one
/// key per account, far below its limit (10,000 a day). Both keyed by `x-api-key`.
pub fn busy_filter_json(shipped: &Value, hot_rate: u64) -> Value {
    let mut config = shipped.clone();
    config["rules"] = json!([
        {"name": "hot", "match": {"path_prefix": "/hot"}, "key": {"from": ["header:x-api-key"]},
         "failure_mode": "open",
         "cost": {"header": "x-cost", "min": 1, "max": 5},
         "limits": [{"name": "per_second", "limit": hot_rate, "burst": hot_rate, "window": "1s"}]},
        {"name": "accounts", "match": {"path_prefix": "/accounts"}, "key": {"from": ["header:x-api-key"]},
         "failure_mode": "closed",
         "limits": [{"name": "per_day", "limit": 10_000, "window": "1d"}]}
    ]);
    config
}

/// Edits for [`envoy_config`]: the shipped filter JSON block replaced by
/// [`busy_filter_json`]'s.
pub fn busy_filter_edits(hot_rate: u64) -> Vec<(String, String)> {
    json_block_edits(|shipped| busy_filter_json(shipped, hot_rate))
}

/// Which Envoy a scenario runs against.
#[derive(Clone, Copy, Debug)]
pub enum Front<'a> {
    /// No rate limiting at all.
    Baseline,
    /// Envoy's `envoy.filters.http.local_ratelimit`, with a limit nothing reaches.
    LocalRateLimit,
    /// Our filter with these policies (see [`filter_json`]).
    Filter(&'a [Policy]),
    /// Our filter loaded with these policies, its rules matching no request: the floor any
    /// wasm filter pays in this Envoy.
    PassThrough(&'a [Policy]),
    /// A measurement-only build of our filter (the wasm module at this path, see
    /// `variant.rs`) with these policies.
    Variant(&'a [Policy], &'a Path),
    /// The busy-machine rows' rules ([`busy_filter_json`]) with this hot rate.
    Busy(u64),
    /// Every request routed to the OpenAI-compatible test upstream on port `upstream`; the
    /// filter with these usage policies (`never_match`: its rules match no request), or no
    /// filter at all (None).
    Llm {
        policies: Option<&'a [UsagePolicy]>,
        never_match: bool,
        upstream: u16,
    },
    /// Every request routed to the test upstream on port `upstream`, under the concurrency
    /// rule of [`concurrency_filter_json`].
    LlmConcurrency {
        policy: &'a ConcurrencyPolicy,
        upstream: u16,
    },
}

/// The shipped route's answer, replaced by a route to the test upstream.
const DIRECT_RESPONSE: &str = "                direct_response:\n                  status: 200\n                  body: { inline_string: \"hello from behind the rate limiter\\n\" }\n";

/// Edits for [`envoy_config`] routing every request to the upstream on `port`.
fn llm_route_edits(port: u16) -> Vec<(String, String)> {
    let cluster = format!(
        "  clusters:\n  - name: llm\n    type: STATIC\n    connect_timeout: 1s\n    load_assignment:\n      cluster_name: llm\n      endpoints:\n      - lb_endpoints:\n        - endpoint:\n            address:\n              socket_address: {{ address: 127.0.0.1, port_value: {port} }}\n"
    );
    vec![
        (
            DIRECT_RESPONSE.to_string(),
            "                route: { cluster: llm }\n".to_string(),
        ),
        ("  clusters:\n".to_string(), cluster),
    ]
}

/// The Envoy config of `front` on the given ports.
pub fn envoy_yaml(front: &Front, port: u16, admin_port: u16, webdis_port: u16) -> String {
    match front {
        Front::Filter(policies) | Front::PassThrough(policies) | Front::Variant(policies, _) => {
            let mut edits = filter_edits(policies, matches!(front, Front::PassThrough(_)));
            if policies.iter().any(|p| p.claim) {
                let wasm = "          - name: ratelimit\n";
                edits.push((wasm.to_string(), format!("{CLAIM_FILTER}{wasm}")));
            }
            if let Front::Variant(_, wasm) = front {
                // envoy_config has made the module's path absolute; this edit comes after.
                edits.push((
                    format!("filename: {}", wasm_path().display()),
                    format!("filename: {}", wasm.display()),
                ));
            }
            let edits: Vec<(&str, &str)> = edits
                .iter()
                .map(|(a, b)| (a.as_str(), b.as_str()))
                .collect();
            envoy_config(port, admin_port, webdis_port, &edits)
        }
        Front::Llm {
            policies,
            never_match,
            upstream,
        } => {
            let mut edits = llm_route_edits(*upstream);
            if let Some(policies) = policies {
                edits.extend(usage_filter_edits(policies, *never_match));
            }
            let edits: Vec<(&str, &str)> = edits
                .iter()
                .map(|(a, b)| (a.as_str(), b.as_str()))
                .collect();
            let yaml = envoy_config(port, admin_port, webdis_port, &edits);
            match policies {
                Some(_) => yaml,
                None => replace_wasm_filter(&yaml, ""),
            }
        }
        Front::LlmConcurrency { policy, upstream } => {
            let mut edits = llm_route_edits(*upstream);
            edits.extend(json_block_edits(|shipped| {
                concurrency_filter_json(shipped, policy)
            }));
            let edits: Vec<(&str, &str)> = edits
                .iter()
                .map(|(a, b)| (a.as_str(), b.as_str()))
                .collect();
            envoy_config(port, admin_port, webdis_port, &edits)
        }
        Front::Busy(hot_rate) => {
            let edits = busy_filter_edits(*hot_rate);
            let edits: Vec<(&str, &str)> = edits
                .iter()
                .map(|(a, b)| (a.as_str(), b.as_str()))
                .collect();
            envoy_config(port, admin_port, webdis_port, &edits)
        }
        Front::Baseline => {
            replace_wasm_filter(&envoy_config(port, admin_port, webdis_port, &[]), "")
        }
        Front::LocalRateLimit => {
            let path = root().join("tests/bench/local_ratelimit.yaml");
            let block = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            replace_wasm_filter(&envoy_config(port, admin_port, webdis_port, &[]), &block)
        }
    }
}

/// Edits for [`envoy_config`]: the shipped filter JSON block replaced by [`filter_json`]'s.
pub fn filter_edits(policies: &[Policy], never_match: bool) -> Vec<(String, String)> {
    json_block_edits(|shipped| filter_json(shipped, policies, never_match))
}

/// Edits for [`envoy_config`]: the shipped filter JSON block replaced by
/// [`usage_filter_json`]'s.
pub fn usage_filter_edits(policies: &[UsagePolicy], never_match: bool) -> Vec<(String, String)> {
    json_block_edits(|shipped| usage_filter_json(shipped, policies, never_match))
}

/// The shipped filter JSON block replaced by what `make` makes of it.
fn json_block_edits(make: impl Fn(&Value) -> Value) -> Vec<(String, String)> {
    let shipped = std::fs::read_to_string(root().join("envoy/envoy.yaml")).expect("envoy.yaml");
    let (block, indent) = filter_json_block(&shipped);
    let value: Value = serde_json::from_str(&block)
        .unwrap_or_else(|e| panic!("the filter configuration in envoy.yaml is not JSON: {e}"));
    let pretty = serde_json::to_string_pretty(&make(&value)).expect("JSON");
    let new_block: String = pretty.lines().map(|l| format!("{indent}{l}\n")).collect();
    vec![(block, new_block)]
}

/// Replaces the `http_filters` entry of the wasm filter with `block` (YAML for zero or more
/// list entries, written at indentation 0; it is indented to the entry's level).
pub fn replace_wasm_filter(yaml: &str, block: &str) -> String {
    let lines: Vec<&str> = yaml.lines().collect();
    let wasm = lines
        .iter()
        .position(|l| l.contains("envoy.extensions.filters.http.wasm.v3.Wasm"))
        .expect("the config has a wasm filter");
    let start = (0..wasm)
        .rev()
        .find(|&i| lines[i].trim_start().starts_with("- name:"))
        .expect("the wasm filter is an http_filters entry");
    let level = indent_of(lines[start]);
    let end = (start + 1..lines.len())
        .find(|&i| !lines[i].trim().is_empty() && indent_of(lines[i]) <= level)
        .unwrap_or(lines.len());
    let pad = " ".repeat(level);
    let mut out: Vec<String> = lines[..start].iter().map(|l| l.to_string()).collect();
    out.extend(
        block
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .map(|l| format!("{pad}{l}")),
    );
    out.extend(lines[end..].iter().map(|l| l.to_string()));
    let mut text = out.join("\n");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "a:\n  http_filters:\n  - name: ratelimit\n    typed_config:\n      \"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm\n      config:\n        configuration:\n          value: |\n            {\n              \"x\": 1\n            }\n\n  - name: envoy.filters.http.router\n    typed_config: {}\n";

    #[test]
    fn the_wasm_entry_is_replaced_or_removed() {
        let removed = replace_wasm_filter(YAML, "");
        assert_eq!(
            removed,
            "a:\n  http_filters:\n  - name: envoy.filters.http.router\n    typed_config: {}\n"
        );
        let replaced = replace_wasm_filter(YAML, "# note\n- name: other\n  typed_config: {}\n");
        assert!(replaced.contains("  - name: other\n    typed_config: {}\n  - name: envoy"));
    }

    fn policy(algorithm: &'static str) -> Policy {
        Policy {
            failure_mode: "open",
            algorithm,
            capacity: 100,
            rate_per_sec: 100.0,
            timeout_ms: 150,
            lease: None,
            clock_skew_ms: None,
            overrides: false,
            claim: false,
        }
    }

    #[test]
    fn allowances_follow_each_algorithm() {
        let p = policy("token_bucket");
        assert_eq!(burst_plus_rate(&p, 10.0, 12.5), 350.0);
        assert_eq!(per_sliding_window(&p, 10.0, 12.5), 300.0);
        // Windows 10, 11 and 12 of the epoch.
        assert_eq!(per_aligned_window(&p, 10.2, 12.5), 300.0);
        assert_eq!(per_aligned_window(&p, 10.0, 10.5), 100.0);
    }

    #[test]
    fn several_policies_become_rules_picked_by_a_header() {
        let shipped = json!({"bridge": {"cluster": "webdis", "timeout": "150ms"}, "rules": []});
        let one = filter_json(&shipped, &[policy("token_bucket")], false);
        assert!(one["rules"][0].get("match").is_none());
        assert_eq!(one["bridge"]["timeout"], "150ms");
        assert!(one.get("breaker").is_none(), "the shipped breaker");
        assert_eq!(one["bridge"]["cluster"], "webdis");
        let two = filter_json(
            &shipped,
            &[policy("token_bucket"), policy("fixed_window")],
            false,
        );
        assert_eq!(two["rules"][1]["match"]["header"]["value"], "fixed_window");
        assert_eq!(two["rules"][0]["limits"][0]["burst"], 100);
        assert!(two["rules"][1]["limits"][0].get("burst").is_none());
        assert_eq!(two["rules"][1]["limits"][0]["limit"], 100);
        let never = filter_json(&shipped, &[policy("token_bucket")], true);
        assert_eq!(never["rules"][0]["match"]["path_exact"], NEVER_MATCHED_PATH);
    }

    #[test]
    fn a_lease_and_the_clock_skew_are_written_where_the_filter_reads_them() {
        let shipped = json!({"bridge": {"cluster": "webdis", "timeout": "150ms"}, "rules": []});
        let leased = Policy {
            lease: Some(Lease::DEFAULT),
            clock_skew_ms: Some(10),
            ..policy("token_bucket")
        };
        let config = filter_json(&shipped, &[leased, policy("fixed_window")], false);
        assert_eq!(config["bridge"]["clock_skew"], "10ms");
        assert_eq!(config["rules"][0]["name"], "bench-token_bucket-leased");
        assert_eq!(
            config["rules"][0]["limits"][0]["lease"],
            json!({"max_units": 100, "fraction": 0.1, "max_ms": 1000})
        );
        assert!(config["rules"][1]["limits"][0].get("lease").is_none());
        let plain = filter_json(&shipped, &[policy("token_bucket")], false);
        assert!(plain["bridge"].get("clock_skew").is_none());
        assert_eq!(plain["rules"][0]["name"], "bench-token_bucket");
        assert!(plain["rules"][0]["limits"][0].get("lease").is_none());
    }

    /// The configs the bench writes are ones the filter accepts, a lease where it was asked
    /// for: checked with the filter's own parser, on the shipped config.
    #[test]
    fn the_filter_accepts_the_configs_with_and_without_a_lease() {
        let shipped = std::fs::read_to_string(root().join("envoy/envoy.yaml")).expect("envoy.yaml");
        let (block, _) = filter_json_block(&shipped);
        let shipped: Value = serde_json::from_str(&block).expect("JSON");
        let leased = |algorithm| Policy {
            lease: Some(Lease {
                max_units: 50,
                fraction: 0.2,
                max_ms: 500,
            }),
            clock_skew_ms: Some(10),
            ..policy(algorithm)
        };
        let policies = [
            leased("token_bucket"),
            leased("gcra"),
            policy("sliding_window_log"),
        ];
        let json = filter_json(&shipped, &policies, false).to_string();
        let config = ratelimit_core::Config::parse(json.as_bytes()).expect("a valid config");
        assert_eq!(config.clock_skew, std::time::Duration::from_millis(10));
        let leases: Vec<_> = config.rules.iter().map(|r| r.limits[0].lease).collect();
        let want = ratelimit_core::config::Lease {
            max_units: 50,
            fraction: 0.2,
            max_ms: 500,
        };
        assert_eq!(leases, vec![Some(want), Some(want), None]);
        let plain = filter_json(&shipped, &[policy("token_bucket")], false).to_string();
        let config = ratelimit_core::Config::parse(plain.as_bytes()).expect("a valid config");
        assert_eq!(config.rules[0].limits[0].lease, None);
    }

    /// A policy with overrides on is a limit the filter reads overrides for, under a rule of
    /// its own; an override's numbers are what the allowance is computed from.
    #[test]
    fn overrides_are_written_where_the_filter_reads_them() {
        let shipped = std::fs::read_to_string(root().join("envoy/envoy.yaml")).expect("envoy.yaml");
        let (block, _) = filter_json_block(&shipped);
        let shipped: Value = serde_json::from_str(&block).expect("JSON");
        let with = Policy {
            overrides: true,
            ..policy("token_bucket")
        };
        let json = filter_json(&shipped, &[with, policy("token_bucket")], false);
        assert_eq!(json["rules"][0]["name"], "bench-token_bucket-overrides");
        assert_eq!(json["rules"][0]["limits"][0]["overrides"], true);
        assert!(json["rules"][1]["limits"][0].get("overrides").is_none());
        let config = ratelimit_core::Config::parse(json.to_string().as_bytes()).expect("valid");
        let overrides: Vec<bool> = config.rules.iter().map(|r| r.limits[0].overrides).collect();
        assert_eq!(overrides, [true, false]);
        assert_eq!(config.rules[0].limits[0].name, LIMIT_NAME);

        let raised = Override {
            limit: 200,
            burst: 300,
        };
        assert_eq!(
            raised.fields(),
            ["mode", "limit", "limit", "200", "burst", "300"]
        );
        let under = raised.applied_to(&with);
        assert_eq!((under.capacity, under.rate_per_sec), (300, 200.0));
        assert!(under.overrides);
        assert_eq!(burst_plus_rate(&under, 10.0, 12.5), 800.0);
    }

    #[test]
    fn the_json_block_is_found_with_its_indentation() {
        let (block, indent) = filter_json_block(YAML);
        assert_eq!(
            block,
            "            {\n              \"x\": 1\n            }\n"
        );
        assert_eq!(indent.len(), 12);
    }

    fn usage_policy(name: &'static str, admit: &'static str) -> UsagePolicy {
        UsagePolicy {
            name,
            admit,
            requests_per_s: 1_000_000,
            tokens: 40_000,
            window_s: 3600,
            from: BODY_USAGE,
            weights: None,
            estimate: 2000,
            timeout_ms: 150,
        }
    }

    /// The busy rows' config is one the filter accepts, with the shipped bridge timeout and
    /// breaker (no override).
    #[test]
    fn the_filter_accepts_the_busy_config_with_the_shipped_defaults() {
        let shipped = std::fs::read_to_string(root().join("envoy/envoy.yaml")).expect("envoy.yaml");
        let (block, _) = filter_json_block(&shipped);
        let shipped: Value = serde_json::from_str(&block).expect("JSON");
        let json = busy_filter_json(&shipped, 50);
        assert!(json.get("breaker").is_none());
        assert_eq!(json["bridge"], shipped["bridge"]);
        let config = ratelimit_core::Config::parse(json.to_string().as_bytes()).expect("valid");
        assert_eq!(
            config.breaker,
            Some(ratelimit_core::config::Breaker::default())
        );
        assert_eq!(config.rules.len(), 2);
    }

    /// The usage configs are ones the filter accepts: a request limit and a usage limit on one
    /// rule, each rule picked by its header when there are several.
    #[test]
    fn the_filter_accepts_the_usage_configs() {
        let shipped = std::fs::read_to_string(root().join("envoy/envoy.yaml")).expect("envoy.yaml");
        let (block, _) = filter_json_block(&shipped);
        let shipped: Value = serde_json::from_str(&block).expect("JSON");
        let policies = [
            usage_policy("usage-reserve", "reserve"),
            usage_policy("usage-after", "after"),
        ];
        for never_match in [false, true] {
            let json = usage_filter_json(&shipped, &policies, never_match);
            let text = json.to_string();
            let config = ratelimit_core::Config::parse(text.as_bytes());
            assert!(config.is_ok(), "{:?}: {text}", config.err());
            let tokens = &json["rules"][1]["limits"][1];
            assert_eq!(tokens["usage"]["admit"], "after");
            assert_eq!(tokens["usage"]["estimate"], 2000);
            assert_eq!(tokens["window"], "3600s");
        }
        let two = usage_filter_json(&shipped, &policies, false);
        assert_eq!(two["rules"][0]["match"]["header"]["name"], USAGE_ROW_HEADER);
        assert_eq!(two["rules"][0]["match"]["header"]["value"], "usage-reserve");
        let never = usage_filter_json(&shipped, &policies[..1], true);
        assert_eq!(never["rules"][0]["match"]["path_exact"], NEVER_MATCHED_PATH);
    }

    /// The concurrency config is one the filter accepts: one rule, one concurrency limit with
    /// its slots and `max_duration`, routed to the upstream.
    #[test]
    fn the_filter_accepts_the_concurrency_config() {
        let shipped = std::fs::read_to_string(root().join("envoy/envoy.yaml")).expect("envoy.yaml");
        let (block, _) = filter_json_block(&shipped);
        let shipped: Value = serde_json::from_str(&block).expect("JSON");
        let policy = ConcurrencyPolicy {
            name: "concurrency",
            limit: 8,
            max_duration_s: 600,
            timeout_ms: 150,
        };
        let json = concurrency_filter_json(&shipped, &policy);
        let limit = &json["rules"][0]["limits"][0];
        assert_eq!(limit["algorithm"], "concurrency");
        assert_eq!(limit["limit"], 8);
        assert_eq!(limit["max_duration"], "600s");
        let config = ratelimit_core::Config::parse(json.to_string().as_bytes());
        assert!(config.is_ok(), "{:?}: {json}", config.err());
        let yaml = envoy_yaml(
            &Front::LlmConcurrency {
                policy: &policy,
                upstream: 4321,
            },
            10000,
            10001,
            10002,
        );
        assert!(yaml.contains("route: { cluster: llm }"));
        assert!(yaml.contains("port_value: 4321"));
        assert!(yaml.contains(CONCURRENCY_LIMIT_NAME));
    }

    /// Every request goes to the upstream: the route's direct answer is replaced by a route
    /// to a cluster on the upstream's port; without policies, the filter is gone.
    #[test]
    fn the_llm_front_routes_to_the_upstream() {
        let policies = [usage_policy("bench-llm", "reserve")];
        let with = envoy_yaml(
            &Front::Llm {
                policies: Some(&policies),
                never_match: false,
                upstream: 4321,
            },
            10000,
            10001,
            10002,
        );
        assert!(!with.contains("direct_response"));
        assert!(with.contains("route: { cluster: llm }"));
        assert!(with.contains("port_value: 4321"));
        assert!(with.contains("bench-llm"));
        let without = envoy_yaml(
            &Front::Llm {
                policies: None,
                never_match: false,
                upstream: 4321,
            },
            10000,
            10001,
            10002,
        );
        assert!(without.contains("route: { cluster: llm }"));
        assert!(!without.contains("envoy.extensions.filters.http.wasm.v3.Wasm"));
    }
}
