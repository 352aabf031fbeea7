//! A limit's state as the scripts store it (lua/*.lua, each file's header), read back into the
//! Rust twins' `State`, and what the twins say of it now: units left, when whole, debt.

use ratelimit_core::algorithms::{evaluate, Params, State};
use ratelimit_core::config::{Algorithm, Calendar};

use crate::error::{Error, Result};
use crate::store::Store;

/// Reads the state at `key` (None: no state, the limit is whole for this key).
pub fn read(store: &mut Store, algorithm: Algorithm, key: &str) -> Result<Option<State>> {
    let fields: &[&str] = match algorithm {
        Algorithm::TokenBucket => &["tokens", "ts"],
        Algorithm::Gcra => &["tat"],
        Algorithm::FixedWindow => &["w", "n"],
        Algorithm::SlidingWindowCounter => &["w", "cur", "prev"],
        Algorithm::Concurrency => {
            let deadlines = scores(store, key)?;
            return Ok((!deadlines.is_empty()).then_some(State::Concurrency { deadlines }));
        }
        Algorithm::SlidingWindowLog => {
            let entries = scores(store, key)?;
            return Ok((!entries.is_empty()).then_some(State::SlidingWindowLog { entries }));
        }
    };
    let values: Vec<Option<String>> = store.run(
        redis::cmd("HMGET").arg(key).arg(fields),
        &format!("HMGET {key}"),
    )?;
    from_fields(algorithm, &values).map_err(|field| {
        Error::failure(format!(
            "{key}: its {field} field is not a number as the {} script writes it",
            algorithm.name()
        ))
    })
}

/// The scores of the sorted set at `key`, lowest first (a log's instants, a concurrency
/// limit's deadlines).
fn scores(store: &mut Store, key: &str) -> Result<Vec<f64>> {
    let entries: Vec<(String, f64)> = store.run(
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES"),
        &format!("ZRANGE {key}"),
    )?;
    Ok(entries.into_iter().map(|(_, score)| score).collect())
}

/// The state from a hash's fields, in the order `read` asks for them, read as the script
/// reads them (`tonumber`, a missing count is 0); Err: the field that is not a number.
fn from_fields(
    algorithm: Algorithm,
    values: &[Option<String>],
) -> std::result::Result<Option<State>, &'static str> {
    let number = |i: usize, name: &'static str| -> std::result::Result<Option<f64>, &'static str> {
        match values.get(i).and_then(Option::as_deref) {
            None => Ok(None),
            Some(text) => text.trim().parse::<f64>().map(Some).map_err(|_| name),
        }
    };
    Ok(match algorithm {
        Algorithm::TokenBucket => {
            let tokens = number(0, "tokens")?;
            let ts = values.get(1).and_then(Option::as_deref);
            match (tokens, ts) {
                (Some(tokens), Some(ts)) => Some(State::TokenBucket {
                    tokens,
                    ts: ns_to_ms(ts).ok_or("ts")?,
                }),
                _ => None,
            }
        }
        Algorithm::Gcra => number(0, "tat")?.map(|tat| State::Gcra { tat }),
        Algorithm::FixedWindow => match number(0, "w")? {
            Some(w) => Some(State::FixedWindow {
                w,
                n: number(1, "n")?.unwrap_or(0.0),
            }),
            None => None,
        },
        Algorithm::SlidingWindowCounter => match number(0, "w")? {
            Some(w) => Some(State::SlidingWindowCounter {
                w,
                cur: number(1, "cur")?.unwrap_or(0.0),
                prev: number(2, "prev")?.unwrap_or(0.0),
            }),
            None => None,
        },
        Algorithm::SlidingWindowLog | Algorithm::Concurrency => None,
    })
}

/// A Unix-ns decimal string (the token bucket's `ts`) as Unix ms: seconds and nanoseconds
/// apart, as the script's `elapsed_ms` does, since ns do not fit a double exactly.
fn ns_to_ms(ns: &str) -> Option<f64> {
    if ns.is_empty() || !ns.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let split = ns.len().saturating_sub(9);
    let seconds: f64 = if split == 0 {
        0.0
    } else {
        ns[..split].parse().ok()?
    };
    let nanos: f64 = ns[split..].parse().ok()?;
    Some(seconds * 1000.0 + nanos / 1_000_000.0)
}

/// What a limit's state comes to at `now` (Unix ms, Redis's clock), with the limit's numbers
/// `limit`, `window` (ms) and `burst`.
#[derive(Debug, Clone, PartialEq)]
pub struct Standing {
    /// Units a request could spend now: what the script would reply as `remaining` if
    /// nothing were taken (a request of cost c then gets `left - c`).
    pub left: f64,
    /// Ms until the state is whole again (bucket full, window empty), debt repaid.
    pub whole_in_ms: f64,
    /// Units charged beyond the limit by usage settlements, still to be repaid: a balance
    /// below zero, a count above the limit.
    pub debt: f64,
}

/// The twin's answer for a request of cost 0: nothing is charged, and the state it would
/// write is the stored one brought to `now` (refilled, windows moved on), which is where the
/// debt is read.
pub fn standing(
    algorithm: Algorithm,
    state: Option<&State>,
    limit: f64,
    window: f64,
    burst: f64,
    calendar: Option<Calendar>,
    now: f64,
) -> Standing {
    let p = Params {
        limit,
        window,
        burst,
        cost: 0.0,
        calendar,
    };
    let e = evaluate(algorithm, state, p, now);
    let debt = match (&e.charged, state) {
        (_, None) => 0.0,
        (State::TokenBucket { tokens, .. }, _) => -tokens,
        (State::Gcra { tat }, _) => (tat - now) / (window / limit) - burst,
        (State::FixedWindow { n, .. }, _) => n - limit,
        (State::SlidingWindowCounter { w, cur, prev }, _) => {
            let into = (now - w * window).clamp(0.0, window);
            prev * (window - into) / window + cur - limit
        }
        (State::SlidingWindowLog { .. } | State::Concurrency { .. }, _) => 0.0,
    };
    Standing {
        left: e.kept_remaining.max(0.0),
        whole_in_ms: e.kept_reset.max(0.0).ceil(),
        debt: debt.max(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: f64 = 1_764_489_600_000.0;

    fn some(values: &[&str]) -> Vec<Option<String>> {
        values
            .iter()
            .map(|v| (!v.is_empty()).then(|| v.to_string()))
            .collect()
    }

    #[test]
    fn states_are_read_as_the_scripts_write_them() {
        assert_eq!(
            from_fields(
                Algorithm::TokenBucket,
                &some(&["7.5", "1764489600000000001"])
            ),
            Ok(Some(State::TokenBucket {
                tokens: 7.5,
                ts: NOW + 0.000001
            }))
        );
        assert_eq!(
            from_fields(Algorithm::TokenBucket, &some(&["7", ""])),
            Ok(None)
        );
        assert_eq!(
            from_fields(Algorithm::FixedWindow, &some(&["29408160", ""])),
            Ok(Some(State::FixedWindow {
                w: 29408160.0,
                n: 0.0
            }))
        );
        assert_eq!(from_fields(Algorithm::Gcra, &some(&["x"])), Err("tat"));
        assert_eq!(
            from_fields(Algorithm::TokenBucket, &some(&["1", "-5"])),
            Err("ts")
        );
    }

    #[test]
    fn a_bucket_in_debt_has_nothing_left_until_refill_repays_it() {
        // 10 per 10 s: one token per second; 3 tokens owed at NOW.
        let state = State::TokenBucket {
            tokens: -3.0,
            ts: NOW,
        };
        let s = standing(
            Algorithm::TokenBucket,
            Some(&state),
            10.0,
            10_000.0,
            10.0,
            None,
            NOW + 1000.0,
        );
        assert_eq!(
            s,
            Standing {
                left: 0.0,
                whole_in_ms: 12_000.0,
                debt: 2.0
            }
        );
    }

    #[test]
    fn windows_count_debt_above_the_limit() {
        let index = (NOW / 60_000.0).floor();
        let state = State::FixedWindow { w: index, n: 13.0 };
        let s = standing(
            Algorithm::FixedWindow,
            Some(&state),
            10.0,
            60_000.0,
            10.0,
            None,
            NOW,
        );
        assert_eq!((s.left, s.debt), (0.0, 3.0));
        let fresh = standing(
            Algorithm::SlidingWindowCounter,
            None,
            10.0,
            60_000.0,
            10.0,
            None,
            NOW,
        );
        assert_eq!(
            fresh,
            Standing {
                left: 10.0,
                whole_in_ms: 0.0,
                debt: 0.0
            }
        );
    }

    #[test]
    fn gcra_debt_is_its_tat_beyond_the_burst() {
        // 10 per 10 s, burst 5: TAT 8 intervals ahead is 3 beyond the burst.
        let state = State::Gcra { tat: NOW + 8000.0 };
        let s = standing(
            Algorithm::Gcra,
            Some(&state),
            10.0,
            10_000.0,
            5.0,
            None,
            NOW,
        );
        assert_eq!((s.left, s.whole_in_ms, s.debt), (0.0, 8000.0, 3.0));
    }
}
