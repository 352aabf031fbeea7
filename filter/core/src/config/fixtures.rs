//! Configurations for tests, written as JSON the way an operator writes them.

use super::Config;

/// The configuration, or its error as the operator sees it.
pub(crate) fn parse(json: &str) -> Result<Config, String> {
    Config::parse(json.as_bytes()).map_err(|e| e.to_string())
}

pub(crate) fn limit_json(name: &str, fields: &str) -> String {
    format!(r#"{{"name": "{name}", {fields}}}"#)
}

pub(crate) fn rule_json(name: &str, matcher: &str, limits: &[String]) -> String {
    format!(
        r#"{{"name": "{name}", "match": {{{matcher}}}, "limits": [{}]}}"#,
        limits.join(", ")
    )
}

pub(crate) fn config_json(extra: &str, rules: &[String]) -> String {
    format!(r#"{{{extra} "rules": [{}]}}"#, rules.join(", "))
}

/// `n` plain limits named l0, l1, …
pub(crate) fn limits(n: usize) -> Vec<String> {
    (0..n)
        .map(|j| limit_json(&format!("l{j}"), r#""limit": 1, "window": "1s""#))
        .collect()
}

pub(crate) fn one_limit(fields: &str) -> String {
    config_json("", &[rule_json("r", "", &[limit_json("l", fields)])])
}

/// The most limits a rule may hold, each with the longest name, and `fields(j)` for limit `j`.
pub(crate) fn widest_limits(fields: impl Fn(usize) -> String) -> Vec<String> {
    (0..crate::bounds::MAX_LIMITS_PER_RULE)
        .map(|j| limit_json(&format!("{j:02}{}", "l".repeat(62)), &fields(j)))
        .collect()
}
