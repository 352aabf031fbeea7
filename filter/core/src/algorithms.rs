//! The Rust twin of each Lua algorithm (`lua/*.lua`): same inputs, same arithmetic, same
//! answers, on state held in memory. The `local` failure mode runs them while the bridge is
//! unavailable; each function mirrors its Lua file line for line, so read them side by side.
//! Times are Unix milliseconds as `f64` (sub-millisecond precision is all local mode needs).

use crate::config::{Algorithm, Calendar, Window};

/// The retry of a request whose cost is more than the limit ever holds (a bucket's burst, a
/// window's limit): no wait makes it fit. The script's `NEVER`, replied as `-1`.
pub const NEVER: f64 = -1.0;

/// One limit's parameters, as the script gets them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub limit: f64,
    /// Milliseconds (a calendar window's longest, unused by the fixed window that has one).
    pub window: f64,
    pub burst: f64,
    pub cost: f64,
    /// A fixed window's calendar (day, week, month): its windows instead of `window`'s.
    pub calendar: Option<Calendar>,
}

impl Params {
    /// The parameters of a limit of `limit` per `window`, `burst` at once, for `cost`.
    pub fn new(limit: u64, window: Window, burst: u64, cost: u64) -> Params {
        Params {
            limit: limit as f64,
            window: window.longest_ms() as f64,
            burst: burst as f64,
            cost: cost as f64,
            calendar: window.calendar(),
        }
    }

    /// The fixed window holding Unix ms `now` (the script's `window_index`).
    fn window_index(&self, now: f64) -> f64 {
        match self.calendar {
            None => (now / self.window).floor(),
            Some(c) => c.index(now),
        }
    }

    /// The Unix ms at which fixed window `index` ends (the script's `window_end`).
    fn window_end(&self, index: f64) -> f64 {
        match self.calendar {
            None => (index + 1.0) * self.window,
            Some(c) => c.end(index),
        }
    }
}

/// A limit's state for one key.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    TokenBucket {
        tokens: f64,
        ts: f64,
    },
    Gcra {
        tat: f64,
    },
    FixedWindow {
        w: f64,
        n: f64,
    },
    SlidingWindowCounter {
        w: f64,
        cur: f64,
        prev: f64,
    },
    /// Times of the counted units, oldest first.
    SlidingWindowLog {
        entries: Vec<f64>,
    },
    /// The deadlines of the requests' holds.
    Concurrency {
        deadlines: Vec<f64>,
    },
}

/// What deciding one limit says, before anything is charged.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub allowed: bool,
    /// Remaining and ms until whole if nothing is taken, and if the request is charged.
    pub kept_remaining: f64,
    pub kept_reset: f64,
    pub taken_remaining: f64,
    pub taken_reset: f64,
    /// When refused: ms until the request would be allowed, or [`NEVER`].
    pub retry: f64,
    /// The state once charged (only used if allowed), and how long it matters (ms).
    pub charged: State,
    /// The state to keep when not charged, if deciding changed it (the log trims old entries
    /// whatever the verdict, as the script does).
    pub kept: Option<State>,
    pub lifetime: f64,
}

impl Evaluation {
    /// (remaining, reset ms, retry ms) as the script replies them: charged or kept; a
    /// remaining below zero (debt) is replied as 0.
    pub fn reply(&self, charged: bool) -> (f64, f64, f64) {
        if charged {
            (
                self.taken_remaining.max(0.0),
                self.taken_reset.ceil(),
                self.retry,
            )
        } else {
            (
                self.kept_remaining.max(0.0),
                self.kept_reset.ceil(),
                self.retry,
            )
        }
    }
}

/// Decides one limit at `now` on `state` (None: a fresh key).
pub fn evaluate(algorithm: Algorithm, state: Option<&State>, p: Params, now: f64) -> Evaluation {
    match algorithm {
        Algorithm::TokenBucket => token_bucket(state, p, now),
        Algorithm::Gcra => gcra(state, p, now),
        Algorithm::FixedWindow => fixed_window(state, p, now),
        Algorithm::SlidingWindowCounter => sliding_window_counter(state, p, now),
        Algorithm::SlidingWindowLog => sliding_window_log(state, p, now),
        Algorithm::Concurrency => concurrency(state, p, now),
    }
}

/// Decides a usage limit in mode `after` (the script's `decide_after`): allowed while at least
/// 1 unit is left, charging nothing: the caller keeps the state as it was (`charged` is not
/// to be written), and the taken figures are the kept ones.
pub fn evaluate_after(
    algorithm: Algorithm,
    state: Option<&State>,
    p: Params,
    now: f64,
) -> Evaluation {
    let e = evaluate(algorithm, state, Params { cost: 1.0, ..p }, now);
    Evaluation {
        taken_remaining: e.kept_remaining,
        taken_reset: e.kept_reset,
        ..e
    }
}

/// Settles `delta` units on a usage limit (the script's `SETTLES`): the state afterwards, or
/// None when nothing is written (a give-back on a fresh state, which is full; or a sliding
/// window log, which takes no usage). Positive: charged without refusing (debt); negative:
/// given back, never past the full allowance.
pub fn settle(
    algorithm: Algorithm,
    state: Option<&State>,
    p: Params,
    delta: f64,
    now: f64,
) -> Option<State> {
    match (algorithm, state) {
        // A concurrency limit's settlement is a release of one named hold, not a number.
        (Algorithm::SlidingWindowLog | Algorithm::Concurrency, _) => None,
        (Algorithm::TokenBucket, state) => {
            let rate = p.limit / p.window;
            let (tokens, stamp) = match state {
                Some(State::TokenBucket { tokens, ts }) if now > *ts => {
                    (p.burst.min(tokens + (now - ts) * rate), now)
                }
                Some(State::TokenBucket { tokens, ts }) => (p.burst.min(*tokens), *ts),
                _ if delta <= 0.0 => return None,
                _ => (p.burst, now),
            };
            let tokens = p.burst.min(tokens - delta);
            Some(State::TokenBucket { tokens, ts: stamp })
        }
        (Algorithm::Gcra, state) => {
            let stored = match state {
                Some(State::Gcra { tat }) => *tat,
                _ if delta <= 0.0 => return None,
                _ => now,
            };
            let interval = p.window / p.limit;
            let tat = stored.max(now);
            Some(State::Gcra {
                tat: now.max(tat + delta * interval),
            })
        }
        (Algorithm::FixedWindow, state) => {
            let index = p.window_index(now);
            let (index, n) = match state {
                Some(State::FixedWindow { w, n }) => fixed_window_now(index, Some(*w), *n, p.limit),
                _ if delta <= 0.0 => return None,
                _ => (index, 0.0),
            };
            Some(State::FixedWindow {
                w: index,
                n: (n + delta).max(0.0),
            })
        }
        (Algorithm::SlidingWindowCounter, state) => {
            let big_w = p.window;
            let mut index = (now / big_w).floor();
            let (mut cur, mut prev) = match state {
                Some(State::SlidingWindowCounter { w, cur, prev }) if index <= w + 1.0 => {
                    if index == w + 1.0 {
                        (0.0, *cur)
                    } else {
                        index = index.max(*w);
                        (*cur, *prev)
                    }
                }
                _ if delta <= 0.0 => return None,
                _ => (0.0, 0.0),
            };
            if delta >= 0.0 {
                cur += delta;
            } else {
                let from_cur = cur.min(-delta);
                (cur, prev) = (cur - from_cur, (prev - (-delta - from_cur)).max(0.0));
            }
            Some(State::SlidingWindowCounter {
                w: index,
                cur,
                prev,
            })
        }
    }
}

/// The window a fixed-window decision at `index` counts in and its count: the newest window
/// seen (a clock that went backwards stays in it); a later window starts from what debt left.
fn fixed_window_now(index: f64, w: Option<f64>, n: f64, limit: f64) -> (f64, f64) {
    match w {
        None => (index, 0.0),
        Some(w) if index > w => (index, (n - limit * (index - w)).max(0.0)),
        Some(w) => (w, n),
    }
}

/// The scripts keep state 60 s past the moment it stops mattering.
const MARGIN_MS: f64 = 60_000.0;

fn token_bucket(state: Option<&State>, p: Params, now: f64) -> Evaluation {
    let rate = p.limit / p.window;
    let capacity = p.burst;
    let (tokens, stamp) = match state {
        Some(State::TokenBucket { tokens, ts }) if now > *ts => {
            (capacity.min(tokens + (now - ts) * rate), now)
        }
        // A clock that went backwards refills nothing, and the stored time stays.
        Some(State::TokenBucket { tokens, ts }) => (capacity.min(*tokens), *ts),
        _ => (capacity, now),
    };
    // Refill starts at the stored time: waits count from there when this clock is behind it.
    let ahead = stamp - now;
    let allowed = tokens >= p.cost;
    let left = tokens - p.cost;
    Evaluation {
        allowed,
        kept_remaining: tokens,
        kept_reset: ahead + (capacity - tokens) / rate,
        taken_remaining: left,
        taken_reset: ahead + (capacity - left) / rate,
        retry: if allowed {
            0.0
        } else if p.cost > capacity {
            NEVER
        } else {
            (ahead + (p.cost - tokens) / rate).ceil()
        },
        charged: State::TokenBucket {
            tokens: left,
            ts: stamp,
        },
        kept: None,
        lifetime: (ahead + capacity / rate).ceil() + MARGIN_MS,
    }
}

fn gcra(state: Option<&State>, p: Params, now: f64) -> Evaluation {
    let interval = p.window / p.limit;
    let stored = match state {
        Some(State::Gcra { tat }) => *tat,
        _ => now,
    };
    // A clock that went backwards cannot move TAT back.
    let tat = stored.max(now);
    let new_tat = tat + p.cost * interval;
    let allow_at = new_tat - p.burst * interval;
    let allowed = now >= allow_at;
    Evaluation {
        allowed,
        kept_remaining: ((now - (tat - p.burst * interval)) / interval).max(0.0),
        kept_reset: tat - now,
        taken_remaining: ((now - allow_at) / interval).max(0.0),
        taken_reset: new_tat - now,
        retry: if allowed {
            0.0
        } else if p.cost > p.burst {
            // Even at TAT = now, more than burst intervals early.
            NEVER
        } else {
            (allow_at - now).ceil()
        },
        charged: State::Gcra { tat: new_tat },
        kept: None,
        lifetime: (new_tat - now).ceil() + MARGIN_MS,
    }
}

fn fixed_window(state: Option<&State>, p: Params, now: f64) -> Evaluation {
    let (index, n) = match state {
        Some(State::FixedWindow { w, n }) => {
            fixed_window_now(p.window_index(now), Some(*w), *n, p.limit)
        }
        _ => (p.window_index(now), 0.0),
    };
    let ends_at = p.window_end(index);
    let ends_in = (ends_at - now).max(0.0);
    // The ms from this window's end to the end of the k-th window after it.
    let beyond = |k: f64| p.window_end(index + k) - ends_at;
    // Windows after this one that debt still fills.
    let owed = ((n / p.limit).ceil() - 1.0).max(0.0);
    let allowed = n + p.cost <= p.limit;
    // Debt: each window that starts repays `limit`, until n + cost fits.
    let windows = ((n + p.cost - p.limit) / p.limit).ceil().max(1.0);
    Evaluation {
        allowed,
        kept_remaining: (p.limit - n).max(0.0),
        kept_reset: if n > 0.0 { ends_in + beyond(owed) } else { 0.0 },
        taken_remaining: p.limit - n - p.cost,
        taken_reset: ends_in,
        retry: if allowed {
            0.0
        } else if p.cost > p.limit {
            NEVER
        } else {
            (ends_in + beyond(windows - 1.0)).ceil()
        },
        charged: State::FixedWindow {
            w: index,
            n: n + p.cost,
        },
        kept: None,
        lifetime: ends_in.ceil() + MARGIN_MS,
    }
}

fn sliding_window_counter(state: Option<&State>, p: Params, now: f64) -> Evaluation {
    let big_w = p.window;
    let mut index = (now / big_w).floor();
    let (mut cur, mut prev) = (0.0, 0.0);
    let mut into = now - index * big_w;
    if let Some(State::SlidingWindowCounter {
        w,
        cur: c,
        prev: pr,
    }) = state
    {
        if index == w + 1.0 {
            prev = *c;
        } else if index <= *w {
            (cur, prev) = (*c, *pr);
            if index < *w {
                // A clock that went backwards: the newest window, fully weighted.
                index = *w;
                into = 0.0;
            }
        }
    }
    let weight = (big_w - into) / big_w;
    let estimate = prev * weight + cur;
    // Time until the estimate drops to `target` or less, or None if it never does alone.
    let wait_for = |target: f64| -> Option<f64> {
        if estimate <= target {
            return Some(0.0);
        }
        if cur <= target && prev > 0.0 {
            return Some((big_w - (target - cur) * big_w / prev - into).max(0.0));
        }
        if target < 0.0 {
            return None;
        }
        Some((big_w - into) + (big_w - target * big_w / cur).max(0.0))
    };
    let allowed = estimate + p.cost <= p.limit;
    Evaluation {
        allowed,
        kept_remaining: (p.limit - estimate).max(0.0),
        kept_reset: wait_for(0.0).unwrap_or(0.0),
        taken_remaining: (p.limit - estimate - p.cost).max(0.0),
        taken_reset: (big_w - into) + big_w,
        retry: if allowed {
            0.0
        } else if p.cost > p.limit {
            NEVER
        } else {
            wait_for(p.limit - p.cost)
                .unwrap_or(2.0 * big_w - into)
                .ceil()
        },
        charged: State::SlidingWindowCounter {
            w: index,
            cur: cur + p.cost,
            prev,
        },
        kept: None,
        lifetime: (2.0 * big_w - into).ceil() + MARGIN_MS,
    }
}

fn sliding_window_log(state: Option<&State>, p: Params, now: f64) -> Evaluation {
    // Entries at or before now - window no longer count.
    let mut entries: Vec<f64> = match state {
        Some(State::SlidingWindowLog { entries }) => entries
            .iter()
            .copied()
            .filter(|&t| t > now - p.window)
            .collect(),
        _ => Vec::new(),
    };
    let count = entries.len() as f64;
    let kept_reset = entries
        .last()
        .map(|newest| (newest + p.window - now).max(0.0))
        .unwrap_or(0.0);
    let allowed = count + p.cost <= p.limit;
    let retry = if allowed {
        0.0
    } else if p.cost > p.limit {
        NEVER
    } else {
        // The request fits once the (count + cost - limit) oldest entries have left.
        let k = (count + p.cost - p.limit) as usize;
        let oldest = entries.get(k.saturating_sub(1)).copied().unwrap_or(now);
        (oldest + p.window - now).ceil().max(1.0)
    };
    let result = Evaluation {
        allowed,
        kept_remaining: (p.limit - count).max(0.0),
        kept_reset,
        taken_remaining: p.limit - count - p.cost,
        taken_reset: p.window,
        retry,
        charged: State::SlidingWindowLog {
            entries: Vec::new(),
        },
        kept: Some(State::SlidingWindowLog {
            entries: entries.clone(),
        }),
        lifetime: p.window.ceil() + MARGIN_MS,
    };
    if allowed {
        let at = entries.partition_point(|&t| t <= now);
        entries.splice(at..at, std::iter::repeat_n(now, p.cost as usize));
    }
    Evaluation {
        charged: State::SlidingWindowLog { entries },
        ..result
    }
}

/// The script's `ALGORITHMS.concurrency`: holds whose deadline passed are gone; a request is
/// admitted while fewer than `limit` are held, taking one until `now + window`
/// (max_duration), whatever its cost.
fn concurrency(state: Option<&State>, p: Params, now: f64) -> Evaluation {
    let mut deadlines: Vec<f64> = match state {
        Some(State::Concurrency { deadlines }) => {
            deadlines.iter().copied().filter(|&d| d > now).collect()
        }
        _ => Vec::new(),
    };
    deadlines.sort_by(f64::total_cmp);
    let held = deadlines.len() as f64;
    let allowed = held < p.limit;
    let latest = deadlines
        .first()
        .map_or(1.0, |oldest| (oldest - now).ceil().max(1.0));
    let kept = State::Concurrency {
        deadlines: deadlines.clone(),
    };
    if allowed {
        deadlines.push(now + p.window);
    }
    Evaluation {
        allowed,
        kept_remaining: (p.limit - held).max(0.0),
        kept_reset: if allowed { 0.0 } else { latest },
        taken_remaining: p.limit - held - 1.0,
        taken_reset: 0.0,
        retry: if allowed { 0.0 } else { latest.min(1000.0) },
        charged: State::Concurrency { deadlines },
        kept: Some(kept),
        lifetime: p.window.ceil() + MARGIN_MS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::cases::{CaseTable, TABLES};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const T0: f64 = 1_764_489_600_000.0;

    /// The twin against the table the Lua script is held to too
    /// (`crate::testing::cases`), case by case on one key.
    fn run(table: &CaseTable) {
        let mut state: Option<State> = None;
        for (i, &(at, cost, allowed, remaining, reset, retry)) in table.cases.iter().enumerate() {
            let p = Params::new(table.limit, table.window, table.burst, cost);
            let e = evaluate(table.algorithm, state.as_ref(), p, T0 + at as f64);
            let got = (e.allowed, e.reply(e.allowed));
            assert_eq!(
                got,
                (allowed, (remaining, reset, retry)),
                "{:?} case {i}",
                table.algorithm
            );
            if e.allowed {
                state = Some(e.charged);
            } else if let Some(kept) = e.kept {
                state = Some(kept);
            }
        }
    }

    #[test]
    fn every_algorithm_as_the_script() {
        for table in TABLES {
            run(table);
        }
    }
}
