//! Checks shared by the top level and the rules: names, header names, named lists, leases.

use std::collections::HashSet;

use serde_json::Value;

use super::raw::RawLease;
use super::{invalid, ConfigError, Lease};
use crate::bounds::FRACTION_DECIMALS;
use crate::bounds::MAX_LEASE_MS;

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

pub(super) const LEASE_NEEDS_PROXY_CLOCK: &str =
    "needs clock \"proxy\": a lease expires on the proxy's clock, which the script must decide with";

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
    // Every leased call writes it with FRACTION_DECIMALS decimals (a fixed length); more would
    // be rounded, and a tiny one to 0, which the script refuses.
    let scale = 10f64.powi(FRACTION_DECIMALS as i32);
    if (fraction * scale).round() / scale != fraction {
        return Err(invalid(
            &format!("{field}.fraction"),
            format!(
                "must have at most {FRACTION_DECIMALS} decimals ({} at least)",
                1.0 / scale
            ),
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

/// RFC 9110 `tchar`.
pub(super) fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
