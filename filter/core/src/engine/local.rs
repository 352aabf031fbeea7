//! The `local` failure mode: while the bridge is unavailable, each worker enforces the limits
//! of the rules that choose it on its own, in memory, with the same algorithms as the scripts
//! (`algorithms.rs`), at `local_share` of each limit and burst. With `local_share` =
//! 1 / (replicas × workers), the fleet together lets through about what one Redis would.

use crate::algorithms::{evaluate, evaluate_after, Params, State, NEVER};
pub use crate::bounds::LOCAL_MAX_ENTRIES;
use crate::check::{LimitCheck, Mode};
use crate::config::Algorithm;
use crate::decision::{Decision, LimitResult, Override};
use crate::expiring::ExpiringMap;
use crate::time::UnixNs;

#[derive(Debug)]
pub struct LocalLimits {
    states: ExpiringMap<State>,
}

impl Default for LocalLimits {
    fn default() -> Self {
        LocalLimits {
            states: ExpiringMap::new(LOCAL_MAX_ENTRIES),
        }
    }
}

/// A check with its limit, burst and quota scaled to this worker's share (at least 1 each).
pub fn scaled(check: &LimitCheck, share: f64) -> LimitCheck {
    let part = |n: u64| ((n as f64 * share).floor() as u64).max(1);
    LimitCheck {
        per_window: part(check.per_window),
        burst: part(check.burst),
        quota: part(check.quota),
        ..check.clone()
    }
}

/// The scripts' ms of a Unix ns clock (kept here too: the property tests name it so).
pub use crate::time::unix_ms;

impl LocalLimits {
    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// Decides `checks` (already scaled) at `now_ns` exactly as the script would on this
    /// worker's own state: all enforced limits allow, or nothing is charged.
    pub fn decide(&mut self, checks: &[LimitCheck], now_ns: UnixNs) -> Decision {
        let now = now_ns.unix_ms();
        let evaluations: Vec<_> = checks
            .iter()
            .map(|c| {
                let p = Params::new(c.per_window, c.window, c.burst, c.cost);
                // A usage limit in mode `after`: admitted while a unit is left, as in Redis.
                // A concurrency limit is not decided here: the worker cannot see the holds the
                // others have (see docs/configuration.md, concurrency).
                if c.mode.takes_hold() {
                    evaluate(c.algorithm, None, p, now)
                } else if c.mode == Mode::After {
                    evaluate_after(c.algorithm, self.states.get(&c.key), p, now)
                } else {
                    evaluate(c.algorithm, self.states.get(&c.key), p, now)
                }
            })
            .collect();
        let committed = evaluations
            .iter()
            .zip(checks)
            .all(|(e, c)| e.allowed || c.mode.is_shadow());
        let mut limits = Vec::with_capacity(checks.len());
        for (e, c) in evaluations.into_iter().zip(checks) {
            let charged = committed && e.allowed;
            let (remaining, reset_ms, retry_ms) = e.reply(charged);
            let never_fits = !e.allowed && retry_ms == NEVER;
            limits.push(LimitResult {
                allowed: e.allowed,
                remaining,
                reset_ms,
                retry_ms: if never_fits { 0.0 } else { retry_ms },
                over_budget: false,
                overridden: None,
                bad_override: false,
                never_fits,
            });
            let expires = now_ns.plus_ns((e.lifetime * 1e6) as u128);
            if c.mode.takes_hold() {
                continue;
            }
            if charged && c.mode != Mode::After {
                self.states.insert(&c.key, expires, e.charged);
            } else if let Some(kept) = e.kept {
                self.states.insert(&c.key, expires, kept);
            }
        }
        Decision {
            allowed: committed,
            limits,
            leased: 0,
        }
    }
}

/// How long a worker remembers an override it saw Redis apply, for the `local` failure mode.
pub const OVERRIDE_SEEN_NS: u128 = 3_600 * 1_000_000_000;

/// The overrides this worker last saw Redis apply, per limit key: while the bridge is
/// unavailable, the `local` failure mode decides an identity as its override last said (seen
/// within [`OVERRIDE_SEEN_NS`]), not by the config's numbers. An override set or changed during
/// the outage is seen when Redis answers again.
#[derive(Debug)]
pub struct SeenOverrides {
    entries: ExpiringMap<(UnixNs, Override)>,
}

impl Default for SeenOverrides {
    fn default() -> Self {
        SeenOverrides {
            entries: ExpiringMap::new(LOCAL_MAX_ENTRIES),
        }
    }
}

/// A check as the override last seen for its identity makes it.
#[derive(Debug, PartialEq)]
pub enum Seen {
    Check(LimitCheck),
    Unlimited,
    Blocked,
}

impl SeenOverrides {
    /// Redis decided `checks` as `decision` at `now`: what it said of each one's override.
    pub fn saw(&mut self, checks: &[LimitCheck], decision: &Decision, now: UnixNs) {
        for (check, result) in checks.iter().zip(&decision.limits) {
            if !check.overrides {
                continue;
            }
            match result.overridden {
                Some(o) => {
                    let until = now.plus_ns(OVERRIDE_SEEN_NS);
                    self.entries.insert(&check.key, until, (until, o));
                }
                None => self.entries.remove(&check.key),
            }
        }
    }

    /// `check` under the override last seen for its key at `now`.
    pub fn apply(&self, check: &LimitCheck, now: UnixNs) -> Seen {
        let seen = check
            .overrides
            .then(|| self.entries.get(&check.key))
            .flatten()
            .filter(|(until, _)| *until > now);
        match seen.map(|(_, o)| *o) {
            None => Seen::Check(check.clone()),
            Some(Override::Unlimited) => Seen::Unlimited,
            Some(Override::Blocked) => Seen::Blocked,
            // The reply gives the quota (a bucket's burst, a window's limit); a bucket keeps
            // the config's ratio of limit to burst.
            Some(Override::Limit(quota)) => {
                let per_window = match check.algorithm {
                    Algorithm::TokenBucket | Algorithm::Gcra => {
                        let ratio = check.per_window as f64 / check.burst.max(1) as f64;
                        ((quota as f64 * ratio).round() as u64).max(1)
                    }
                    _ => quota,
                };
                Seen::Check(LimitCheck {
                    per_window,
                    burst: quota,
                    quota,
                    ..check.clone()
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Algorithm, Window};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn check(key: &str, algorithm: Algorithm, limit: u64, shadow: bool) -> LimitCheck {
        LimitCheck {
            rule: 0,
            limit: 0,
            key: key.into(),
            algorithm,
            per_window: limit,
            quota: limit,
            window: Window::ms(60_000),
            burst: limit,
            cost: 1,
            mode: Mode::of(false, None, shadow, None),
            overrides: false,
        }
    }

    const T0: UnixNs = UnixNs::from_ns(1_764_489_600_000_000_000);

    #[test]
    fn a_share_of_each_limit_at_least_one() {
        let c = check("k", Algorithm::TokenBucket, 100, false);
        let s = scaled(&c, 0.125);
        assert_eq!((s.per_window, s.burst, s.quota), (12, 12, 12));
        let s = scaled(&check("k", Algorithm::FixedWindow, 3, false), 0.125);
        assert_eq!((s.per_window, s.burst), (1, 1));
    }

    #[test]
    fn a_calendar_month_ends_on_the_first_in_its_offset() {
        let mut local = LocalLimits::default();
        let mut month = check("m", Algorithm::FixedWindow, 1, false);
        month.window = Window::Calendar(crate::config::Calendar {
            unit: crate::config::CalendarUnit::Month,
            offset_minutes: 60,
        });
        // 2028-02-01 00:00 at +01:00 is 2028-01-31 23:00 UTC.
        let february = UnixNs::from_ns(1_832_976_000_000_000_000 - 3_600_000_000_000);
        let ms = 1_000_000;
        let first = local.decide(std::slice::from_ref(&month), february.minus_ns(2 * ms));
        assert!(first.allowed);
        assert_eq!(first.limits[0].reset_ms, 2.0);
        let refused = local.decide(std::slice::from_ref(&month), february.minus_ns(ms));
        assert_eq!((refused.allowed, refused.limits[0].retry_ms), (false, 1.0));
        let next = local.decide(std::slice::from_ref(&month), february);
        assert!(next.allowed);
        assert_eq!(
            next.limits[0].reset_ms,
            29.0 * 86_400_000.0,
            "February 2028"
        );
    }

    #[test]
    fn all_or_nothing_over_the_request_and_shadow_limits_never_refuse() {
        let mut local = LocalLimits::default();
        let minute = check("m", Algorithm::TokenBucket, 5, false);
        let day = check("d", Algorithm::FixedWindow, 2, false);
        let watch = check("w", Algorithm::FixedWindow, 1, true);
        let both = [minute.clone(), day, watch];
        let allowed: Vec<bool> = (0..4).map(|_| local.decide(&both, T0).allowed).collect();
        assert_eq!(allowed, [true, true, false, false], "the day limit of 2");
        // The refusals charged nothing: 3 of the 5 per minute are left.
        let alone = local.decide(std::slice::from_ref(&minute), T0);
        assert_eq!(alone.limits[0].remaining, 2.0);
        assert_eq!(local.len(), 3);
    }
}
