//! What a valid config makes the filter do, in a few lines a reviewer can read.

use ratelimit_core::config::{
    show_duration, Admit, Clock, Config, Cost, Estimate, FailureMode, KeySource, KeySpec, Limit,
    Match, PathMatch, Rule, Test, Usage, UsageSource, WhenMissing,
};

/// The policy, one line for the bridge, then per rule a line and a line per limit; each line
/// starts with two spaces.
pub fn summary(config: &Config) -> String {
    let mut out = String::new();
    let bridge = &config.bridge;
    let mut line = format!(
        "  bridge: cluster {}, authority {}, {}",
        bridge.cluster,
        bridge.authority,
        if bridge.authorization.is_some() {
            "basic auth"
        } else {
            "no auth"
        }
    );
    let timeouts: Vec<_> = config.rules.iter().map(|r| r.timeout).collect();
    let same_timeout = timeouts.windows(2).all(|w| w[0] == w[1]);
    if let (true, Some(timeout)) = (same_timeout, timeouts.first()) {
        line.push_str(&format!(", timeout {}", show_duration(*timeout)));
    }
    if config.redis_cluster {
        line.push_str(", Redis Cluster");
    }
    if config.clock == Clock::Redis {
        line.push_str(", Redis clock");
    }
    out.push_str(&line);
    out.push('\n');
    for rule in &config.rules {
        out.push_str(&rule_line(rule, !same_timeout));
        for limit in &rule.limits {
            out.push_str(&limit_line(limit, &rule.cost));
        }
    }
    for finding in crate::coverage::findings(config) {
        out.push_str(&format!("  {finding}\n"));
    }
    out
}

fn rule_line(rule: &Rule, with_timeout: bool) -> String {
    let name = match &rule.plan {
        Some(plan) => format!("{}, plan {plan}", rule.name),
        None => rule.name.clone(),
    };
    let mut line = format!(
        "  rule {}: {}; key {}; failure mode {}",
        name,
        matcher(&rule.matcher),
        key(&rule.key),
        failure_mode(rule.failure_mode)
    );
    if with_timeout {
        line.push_str(&format!(", timeout {}", show_duration(rule.timeout)));
    }
    if rule.shadow {
        line.push_str("; shadow (counts, never denies)");
    }
    if let Some(budget) = &rule.key_budget {
        line.push_str(&format!(
            "; key budget {} new keys per {} (over budget: {})",
            budget.new_keys,
            show_duration(budget.window),
            budget.over_budget.name()
        ));
    }
    line.push('\n');
    line
}

fn limit_line(limit: &Limit, cost: &Cost) -> String {
    let mut line = format!(
        "    limit {}: {} {} per {}",
        limit.name,
        limit.algorithm.name(),
        limit.limit,
        limit.window.show()
    );
    if limit.algorithm.has_burst() {
        line.push_str(&format!(", burst {}", limit.burst));
    }
    if limit.shards > 1 {
        line.push_str(&format!(", {} shards", limit.shards));
    }
    if let Some(usage) = &limit.usage {
        line.push_str(&usage_part(usage));
    } else {
        line.push_str(&cost_part(cost));
    }
    match &limit.lease {
        Some(lease) => line.push_str(&format!(
            ", lease up to {} units ({} of what is left, returned after {} ms)",
            lease.max_units, lease.fraction, lease.max_ms
        )),
        None => line.push_str(", no lease"),
    }
    line.push('\n');
    line
}

fn cost_part(cost: &Cost) -> String {
    match cost {
        Cost::Fixed(units) => format!(", cost {units}"),
        Cost::Header {
            name,
            min,
            max,
            default,
        } => format!(", cost from header {name} ({min}..={max}, default {default})"),
    }
}

/// A usage limit: where its usage is read, how it admits, and its estimate.
fn usage_part(usage: &Usage) -> String {
    let from = match (&usage.from, usage.format) {
        (_, Some(format)) => match usage.weights {
            None => format!("format {}", format.name()),
            Some(w) => {
                let x = |milli: i64| format!("{}", milli as f64 / 1000.0);
                let mut text = format!(
                    "format {} weighted (input ×{}, output ×{}, cached input ×{}",
                    format.name(),
                    x(w.input),
                    x(w.output),
                    x(w.cached_input)
                );
                if format == ratelimit_core::config::Format::Anthropic {
                    text += &format!(", cache writes ×{}", x(w.cache_write));
                }
                text + ")"
            }
        },
        (UsageSource::Body(body), None) => {
            let paths: Vec<String> = body.paths().map(|p| p.join(".")).collect();
            format!("body {}", paths.join(" or "))
        }
        (UsageSource::Header(h), None)
            if h.min == 0 && h.max == ratelimit_core::config::MAX_USAGE =>
        {
            format!("header {}", h.name)
        }
        (UsageSource::Header(h), None) => {
            format!("header {} (charged {} to {})", h.name, h.min, h.max)
        }
        (UsageSource::Status(codes), None) => {
            let codes: Vec<String> = codes.iter().map(u16::to_string).collect();
            format!("status (1 for {}, else 0)", codes.join(", "))
        }
    };
    let estimate = match &usage.estimate {
        Estimate::Fixed(units) => format!("{units}"),
        Estimate::Header {
            name,
            min,
            max,
            default,
        } => format!("header {name} ({min}..={max}, default {default})"),
        Estimate::Request {
            completion_default,
            max_body,
            ..
        } => format!(
            "request body bytes + max tokens (default {completion_default}), body at most {max_body} bytes"
        ),
    };
    match usage.admit {
        Admit::Reserve => format!(
            ", metered by the usage in the response's {from}: estimate {estimate} reserved up front, settled to the usage"
        ),
        Admit::After => format!(
            ", metered by the usage in the response's {from}: admitted while the balance is positive, charged after (estimate {estimate} when unreadable)"
        ),
    }
}

fn matcher(matcher: &Match) -> String {
    let mut parts = Vec::new();
    match &matcher.path {
        Some(PathMatch::Exact(path)) => parts.push(format!("path = {path}")),
        Some(PathMatch::Prefix(path)) => parts.push(format!("path prefix {path}")),
        None => {}
    }
    if !matcher.methods.is_empty() {
        parts.push(format!("method {}", matcher.methods.join("|")));
    }
    for condition in &matcher.conditions {
        let source = source_name(&condition.source);
        let list = |values: &[Vec<u8>]| {
            values
                .iter()
                .map(|v| format!("{:?}", String::from_utf8_lossy(v)))
                .collect::<Vec<_>>()
                .join(" or ")
        };
        parts.push(match &condition.test {
            Test::Present => format!("{source} present"),
            Test::Absent => format!("{source} absent"),
            Test::In(values) => format!("{source} = {}", list(values)),
            Test::NotIn(values) if values.is_empty() => format!("any {source}"),
            Test::NotIn(values) => format!("{source} absent or not {}", list(values)),
        });
    }
    if parts.is_empty() {
        "every request".to_string()
    } else {
        parts.join(" and ")
    }
}

/// A source as the config writes it.
fn source_name(source: &KeySource) -> String {
    match source {
        KeySource::Header(name) => format!("header:{name}"),
        KeySource::Query(name) => format!("query:{name}"),
        KeySource::Metadata(path) => format!("metadata:{}:{}", path.namespace, path.keys.join(":")),
        KeySource::Body(path) => format!("body:{}", path.keys.join(":")),
        KeySource::ClientIp => "client_ip".into(),
        KeySource::Route => "route".into(),
        KeySource::Method => "method".into(),
        KeySource::Path => "path".into(),
    }
}

fn key(key: &KeySpec) -> String {
    let mut parts: Vec<String> = key.alternatives.iter().map(|a| a.label.clone()).collect();
    parts.push(
        match key.when_missing {
            WhenMissing::Anonymous => "one shared anonymous key",
            WhenMissing::Skip => "rule skipped",
        }
        .to_string(),
    );
    parts.join(", else ")
}

fn failure_mode(mode: FailureMode) -> &'static str {
    match mode {
        FailureMode::Open => "open",
        FailureMode::Closed => "closed",
        FailureMode::Local => "local",
    }
}
