//! The override of one limit for one identity, as the decision script reads it: a hash at
//! `override_key(state_key)` with `mode` (`limit`, `unlimited`, `blocked`), with mode `limit`
//! a whole `limit` and, for token_bucket and gcra, an optional `burst` (default: the
//! override's limit), and an optional expiry `until` (Unix ms on Redis's clock). The expiry is
//! a field, not a TTL: an override has none, so eviction (`volatile-lru`) never reaches it; the
//! script ignores one past its `until` (and gives it a short TTL). One written with a TTL as
//! its expiry (by an earlier version of the tool) is read with that TTL. The script ignores
//! the other fields; the tool writes `by`, `at` (Unix ms) and `note` there for people.

use ratelimit_core::bounds::{MAX_LIMIT, MAX_LOG_LIMIT, MAX_STATE_LIFETIME};
use ratelimit_core::config::{state_lifetime_ms, Algorithm, Limit, Rule};
use serde_json::{json, Value};

use crate::cli::Setting;
use crate::error::{Error, Result};
use crate::when::{show_instant, show_span};

/// The numbers an override sets, checked as the config checks a limit's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Limit { limit: u64, burst: Option<u64> },
    Unlimited,
    Blocked,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Limit { .. } => "limit",
            Mode::Unlimited => "unlimited",
            Mode::Blocked => "blocked",
        }
    }
}

/// Whether `limit` of `rule` reads overrides at all: only a limit whose config says
/// `"overrides": true` does, so an override anywhere else would change nothing.
pub fn require_overrides(rule: &Rule, limit: &Limit) -> Result<()> {
    if limit.overrides {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "rule {}, limit {}: this limit does not read overrides (its config has no \"overrides\": true), so the filter would never see one",
            rule.name, limit.name
        )))
    }
}

/// The setting of the command line for `limit`, within the bounds the config's own limits
/// keep (ratelimit_core::bounds): a whole limit of 1 to MAX_LIMIT (MAX_LOG_LIMIT for a
/// sliding_window_log, whose memory grows with it), a burst only where the algorithm has one,
/// and a state that lives no longer than MAX_STATE_LIFETIME with the limit's window.
pub fn check(rule: &Rule, limit: &Limit, setting: &Setting) -> Result<Mode> {
    let place = format!("rule {}, limit {}", rule.name, limit.name);
    let (n, burst) = match *setting {
        Setting::Unlimited => return Ok(Mode::Unlimited),
        Setting::Blocked => return Ok(Mode::Blocked),
        Setting::Limit { limit, burst } => (limit, burst),
    };
    let most = match limit.algorithm {
        Algorithm::SlidingWindowLog => MAX_LOG_LIMIT,
        _ => MAX_LIMIT,
    };
    if !(1..=most).contains(&n) {
        return Err(Error::usage(format!(
            "{place}: --limit {n}: must be from 1 to {most} for {}",
            limit.algorithm.name()
        )));
    }
    let has_burst = limit.algorithm.has_burst();
    if let Some(b) = burst {
        if !has_burst {
            return Err(Error::usage(format!(
                "{place}: --burst: {} has no burst (only token_bucket and gcra do)",
                limit.algorithm.name()
            )));
        }
        if !(1..=MAX_LIMIT).contains(&b) {
            return Err(Error::usage(format!(
                "{place}: --burst {b}: must be from 1 to {MAX_LIMIT}"
            )));
        }
    }
    let lifetime = state_lifetime_ms(limit.algorithm, n, limit.window, burst.unwrap_or(n));
    if lifetime > MAX_STATE_LIFETIME.as_millis() {
        return Err(Error::usage(format!(
            "{place}: --limit {n}{}: the state would take {} to refill, more than the {} a state may live",
            burst.map(|b| format!(" --burst {b}")).unwrap_or_default(),
            show_span(lifetime as f64),
            show_span(MAX_STATE_LIFETIME.as_millis() as f64)
        )));
    }
    Ok(Mode::Limit { limit: n, burst })
}

/// An override as stored, read back.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub key: String,
    pub mode: Mode,
    pub by: Option<String>,
    pub at_ms: Option<u64>,
    pub note: Option<String>,
    /// Unix ms of its expiry (its key's TTL); None: until removed.
    pub expires_at_ms: Option<u64>,
}

/// The hash's fields as the tool writes them (`mode` first, as the script reads them).
pub fn fields(
    mode: Mode,
    until_ms: Option<u64>,
    by: &str,
    at_ms: u64,
    note: Option<&str>,
) -> Vec<(&'static str, String)> {
    let mut fields = vec![("mode", mode.name().to_string())];
    if let Mode::Limit { limit, burst } = mode {
        fields.push(("limit", limit.to_string()));
        if let Some(b) = burst {
            fields.push(("burst", b.to_string()));
        }
    }
    if let Some(until) = until_ms {
        fields.push(("until", until.to_string()));
    }
    fields.push(("by", by.to_string()));
    fields.push(("at", at_ms.to_string()));
    if let Some(note) = note {
        fields.push(("note", note.to_string()));
    }
    fields
}

/// An override from its hash (HGETALL) and its TTL (PTTL, ms: -1 none, -2 no key) at `now`:
/// its expiry is its `until` field, else (written with a TTL) its TTL. Err: what in the hash
/// the script could not read.
pub fn parse(
    key: &str,
    hash: &[(String, String)],
    pttl: i64,
    now_ms: u64,
) -> std::result::Result<Override, String> {
    let get = |name: &str| {
        hash.iter()
            .find(|(f, _)| f == name)
            .map(|(_, v)| v.as_str())
    };
    let whole = |name: &str| -> std::result::Result<Option<u64>, String> {
        match get(name) {
            None => Ok(None),
            Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("{key}: its {name} {v:?} is too large")),
            Some(v) => Err(format!("{key}: its {name} {v:?} is not a whole number")),
        }
    };
    let mode = match get("mode") {
        Some("limit") => Mode::Limit {
            limit: whole("limit")?
                .ok_or_else(|| format!("{key}: mode limit without a limit field"))?,
            burst: whole("burst")?,
        },
        Some("unlimited") => Mode::Unlimited,
        Some("blocked") => Mode::Blocked,
        Some(other) => return Err(format!("{key}: unknown mode {other:?}")),
        None => return Err(format!("{key}: no mode field")),
    };
    Ok(Override {
        key: key.to_string(),
        mode,
        by: get("by").map(str::to_string),
        at_ms: get("at").and_then(|v| v.parse().ok()),
        note: get("note").map(str::to_string),
        expires_at_ms: match whole("until")? {
            Some(0) => return Err(format!("{key}: its until \"0\" is not a Unix time in ms")),
            Some(until) => Some(until),
            None => u64::try_from(pttl).ok().map(|ttl| now_ms + ttl),
        },
    })
}

impl Override {
    /// Past its expiry at `now_ms`: the script no longer applies it (it is removed soon).
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_some_and(|at| at <= now_ms)
    }

    pub fn json(&self) -> Value {
        let (limit, burst) = match self.mode {
            Mode::Limit { limit, burst } => (Some(limit), burst),
            _ => (None, None),
        };
        json!({
            "key": self.key,
            "mode": self.mode.name(),
            "limit": limit,
            "burst": burst,
            "by": self.by,
            "at_ms": self.at_ms,
            "note": self.note,
            "expires_at_ms": self.expires_at_ms,
        })
    }

    /// One line: `limit 100, burst 200, until 2026-01-31T18:00:00Z (in 2h 5m); by ana at …: "note"`.
    pub fn line(&self, now_ms: u64) -> String {
        let mut line = match self.mode {
            Mode::Limit {
                limit,
                burst: Some(b),
            } => format!("limit {limit}, burst {b}"),
            Mode::Limit { limit, burst: None } => format!("limit {limit}"),
            Mode::Unlimited => "unlimited".to_string(),
            Mode::Blocked => "blocked".to_string(),
        };
        match self.expires_at_ms {
            Some(at) => line.push_str(&format!(
                ", until {} (in {})",
                show_instant(at),
                show_span(at.saturating_sub(now_ms) as f64)
            )),
            None => line.push_str(", until removed"),
        }
        if let Some(by) = &self.by {
            line.push_str(&format!("; by {by}"));
        }
        if let Some(at) = self.at_ms {
            line.push_str(&format!(" at {}", show_instant(at)));
        }
        if let Some(note) = &self.note {
            line.push_str(&format!(": {note:?}"));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::Config;

    fn rule(json: &str) -> Rule {
        let text = format!(r#"{{"rules": [{{"name": "r", "limits": [{json}]}}]}}"#);
        Config::parse(text.as_bytes()).unwrap().rules.remove(0)
    }

    fn set(limit: u64, burst: Option<u64>) -> Setting {
        Setting::Limit { limit, burst }
    }

    #[test]
    fn numbers_keep_the_configs_bounds() {
        let r = rule(r#"{"name": "m", "limit": 10, "window": "1m", "overrides": true}"#);
        let l = &r.limits[0];
        assert_eq!(
            check(&r, l, &set(100, Some(200))),
            Ok(Mode::Limit {
                limit: 100,
                burst: Some(200)
            })
        );
        assert_eq!(
            check(&r, l, &set(0, None)).unwrap_err().message,
            "rule r, limit m: --limit 0: must be from 1 to 1000000000000 for token_bucket"
        );
        assert_eq!(
            check(&r, l, &set(1, Some(MAX_LIMIT + 1)))
                .unwrap_err()
                .message,
            "rule r, limit m: --burst 1000000000001: must be from 1 to 1000000000000"
        );
        let log = rule(
            r#"{"name": "l", "algorithm": "sliding_window_log", "limit": 10, "window": "1m", "overrides": true}"#,
        );
        assert!(check(&log, &log.limits[0], &set(MAX_LOG_LIMIT + 1, None))
            .unwrap_err()
            .message
            .contains("must be from 1 to 10000"));
        assert_eq!(
            check(&log, &log.limits[0], &set(5, Some(5))).unwrap_err().message,
            "rule r, limit l: --burst: sliding_window_log has no burst (only token_bucket and gcra do)"
        );
        let year = rule(r#"{"name": "y", "limit": 1, "window": "366d", "overrides": true}"#);
        assert!(check(&year, &year.limits[0], &set(1, Some(3)))
            .unwrap_err()
            .message
            .contains("more than the"));
    }

    #[test]
    fn only_a_limit_with_overrides_takes_one() {
        let r = rule(r#"{"name": "m", "limit": 10, "window": "1m"}"#);
        assert!(require_overrides(&r, &r.limits[0])
            .unwrap_err()
            .message
            .starts_with("rule r, limit m: this limit does not read overrides"));
    }

    #[test]
    fn the_hash_holds_exactly_the_format() {
        let f = fields(
            Mode::Limit {
                limit: 5,
                burst: None,
            },
            Some(9000),
            "ana",
            42,
            Some("incident 7"),
        );
        assert_eq!(
            f,
            [
                ("mode", "limit".into()),
                ("limit", "5".into()),
                ("until", "9000".into()),
                ("by", "ana".into()),
                ("at", "42".into()),
                ("note", "incident 7".into())
            ]
        );
        let hash: Vec<(String, String)> = f.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let o = parse("k", &hash, 1000, 5000).unwrap();
        assert_eq!(
            o.mode,
            Mode::Limit {
                limit: 5,
                burst: None
            }
        );
        // The expiry is its `until`, whatever the key's TTL.
        assert_eq!(o.expires_at_ms, Some(9000));
        assert!(!o.expired(8999) && o.expired(9000));
        // Without one, a TTL (written so by an earlier version of the tool) is the expiry.
        let untimed: Vec<(String, String)> =
            hash.iter().filter(|(k, _)| k != "until").cloned().collect();
        assert_eq!(
            parse("k", &untimed, 1000, 5000).unwrap().expires_at_ms,
            Some(6000)
        );
        assert_eq!(parse("k", &untimed, -1, 5000).unwrap().expires_at_ms, None);
        let bad = vec![
            ("mode".to_string(), "limit".to_string()),
            ("limit".to_string(), "1.5".to_string()),
        ];
        assert_eq!(
            parse("k", &bad, -1, 0),
            Err("k: its limit \"1.5\" is not a whole number".into())
        );
        assert_eq!(
            fields(Mode::Blocked, None, "b", 1, None)[0],
            ("mode", "blocked".to_string())
        );
    }
}
