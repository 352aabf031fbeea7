//! `inspect`: what an identity has left under each limit of a rule, read from its state keys
//! and overrides, and how that is shown. Apart because it is the one command that reads the
//! limiters' state and reports on it at length.

use ratelimit_core::config::{Algorithm, Limit};
use serde_json::{json, Value};

use super::override_commands::read_override;
use super::{identity_json, identity_line, Context, Report};
use crate::error::Result;
use crate::overrides::{Mode, Override};
use crate::state::{self, Standing};
use crate::target;
use crate::when::show_span;

impl Context<'_> {
    pub(super) fn inspect(&mut self, rule_name: &str, identity: &str) -> Result<Report> {
        let rule = target::rule(self.config, rule_name)?;
        let id = target::identity(self.config, rule, self.cli.from.as_deref(), identity)?;
        let now = self.now_ms(self.slot_key(rule, &id).as_deref())?;
        let mut human = format!("rule {}, identity {}\n", rule.name, identity_line(&id));
        let mut limits = Vec::new();
        for limit in &rule.limits {
            let found = if limit.overrides {
                let key = target::override_key_of(self.config, rule, limit, &id);
                read_override(self.store()?, &key, now)?
            } else {
                None
            };
            let (per_window, burst) = in_effect(limit, found.as_ref().map(|o| o.mode));
            let window = limit.window.longest_ms() as f64;
            let mut shards = Vec::new();
            let mut total = Standing {
                left: 0.0,
                whole_in_ms: 0.0,
                debt: 0.0,
            };
            for key in target::state_keys(self.config, rule, limit, &id) {
                let store = self.store()?;
                let stored = state::read(store, limit.algorithm, &key)?;
                let pttl: i64 = store.run(redis::cmd("PTTL").arg(&key), &format!("PTTL {key}"))?;
                let s = state::standing(
                    limit.algorithm,
                    stored.as_ref(),
                    per_window as f64,
                    window,
                    burst as f64,
                    limit.window.calendar(),
                    now,
                );
                total.left += s.left;
                total.whole_in_ms = total.whole_in_ms.max(s.whole_in_ms);
                total.debt += s.debt;
                shards.push(json!({
                    "key": key,
                    "exists": stored.is_some(),
                    "left": s.left,
                    "whole_in_ms": s.whole_in_ms,
                    "debt": s.debt,
                    "expires_in_ms": u64::try_from(pttl).ok(),
                }));
            }
            let mode = found.as_ref().map(|o| o.mode);
            let left = match mode {
                Some(Mode::Unlimited) => None,
                Some(Mode::Blocked) => Some(0.0),
                _ => Some(total.left),
            };
            let in_flight = match (limit.algorithm, left) {
                (Algorithm::Concurrency, Some(free)) => json!((per_window as f64 - free).max(0.0)),
                _ => Value::Null,
            };
            human.push_str(&limit_report(
                limit,
                found.as_ref(),
                left,
                &total,
                per_window,
                &shards,
                now,
            ));
            limits.push(json!({
                "limit": limit.name,
                "algorithm": limit.algorithm.name(),
                "config": {
                    "limit": limit.limit,
                    "window": limit.window.show(),
                    "burst": limit.burst,
                    "shards": limit.shards,
                    "overrides": limit.overrides,
                },
                "override": found.as_ref().map(Override::json),
                "in_effect": {
                    "mode": mode.map_or("config", Mode::name),
                    "limit": per_window,
                    "burst": burst,
                },
                "left": left,
                "whole_in_ms": total.whole_in_ms,
                "debt": total.debt,
                "shards": shards,
                // A concurrency limit's holds now (its `left`: the holds it still allows).
                "in_flight": in_flight,
            }));
        }
        Ok(Report {
            json: json!({
                "rule": rule.name,
                "identity": identity_json(&id),
                "now_ms": now as u64,
                "limits": limits,
            }),
            human,
        })
    }
}

/// The limit and burst a decision uses: the override's with mode `limit` (its burst defaults
/// to its limit), else the config's of one shard.
fn in_effect(limit: &Limit, mode: Option<Mode>) -> (u64, u64) {
    match mode {
        Some(Mode::Limit { limit: n, burst }) => {
            let has_burst = limit.algorithm.has_burst();
            (n, if has_burst { burst.unwrap_or(n) } else { n })
        }
        _ => (limit.shard_limit(), limit.shard_burst()),
    }
}

fn limit_report(
    limit: &Limit,
    found: Option<&Override>,
    left: Option<f64>,
    total: &Standing,
    per_window: u64,
    shards: &[Value],
    now: f64,
) -> String {
    let mut out = match limit.algorithm {
        Algorithm::Concurrency => format!(
            "  limit {}: concurrency, {} in flight, each held at most {}",
            limit.name,
            limit.limit,
            limit.window.show()
        ),
        _ => format!(
            "  limit {}: {} {} per {}",
            limit.name,
            limit.algorithm.name(),
            limit.limit,
            limit.window.show()
        ),
    };
    if limit.algorithm.has_burst() {
        out.push_str(&format!(", burst {}", limit.burst));
    }
    if limit.shards > 1 {
        out.push_str(&format!(", {} shards", limit.shards));
    }
    out.push('\n');
    match found {
        Some(o) => out.push_str(&format!("    override: {}\n", o.line(now as u64))),
        None if limit.overrides => out.push_str("    override: none\n"),
        None => {}
    }
    match left {
        None => out.push_str("    left now: unlimited (override)\n"),
        Some(left) => {
            let blocked = matches!(found.map(|o| o.mode), Some(Mode::Blocked));
            out.push_str(&format!(
                "    left now: {}{}",
                units(left),
                if blocked {
                    " (blocked by override)".to_string()
                } else {
                    format!(" of {}", per_window * limit.shards.max(1))
                }
            ));
            if total.whole_in_ms > 0.0 {
                out.push_str(&format!(
                    "; whole again in {}",
                    show_span(total.whole_in_ms)
                ));
            } else {
                out.push_str("; whole");
            }
            if total.debt > 0.0 {
                out.push_str(&format!("; debt {}", units(total.debt)));
            }
            out.push('\n');
        }
    }
    for shard in shards {
        let key = shard["key"].as_str().unwrap_or("");
        let state = match shard["expires_in_ms"].as_u64() {
            _ if shard["exists"] == json!(false) => "no state".to_string(),
            Some(ms) => format!("expires in {}", show_span(ms as f64)),
            None => "no expiry".to_string(),
        };
        if limit.shards > 1 {
            out.push_str(&format!(
                "    shard {key}: left {}, {state}\n",
                units(shard["left"].as_f64().unwrap_or(0.0))
            ));
        } else {
            out.push_str(&format!("    state {key}: {state}\n"));
        }
    }
    out
}

/// Units as people read them: whole when whole, else to 3 decimals.
fn units(n: f64) -> String {
    let rounded = (n * 1000.0).floor() / 1000.0;
    if rounded.fract() == 0.0 {
        format!("{rounded:.0}")
    } else {
        format!("{rounded}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_whole_or_three_decimals() {
        assert_eq!(units(7.0), "7");
        assert_eq!(units(7.00049), "7");
        assert_eq!(units(6.5), "6.5");
    }
}
