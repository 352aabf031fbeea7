//! One case table per algorithm, which both the Rust twin (`algorithms.rs`) and the Lua
//! script (`tests/tests/lua_scripts.rs`, against a real Redis) are held to: a limit on one
//! key, then its requests in order, each with what the script replies.

use crate::algorithms::NEVER;
use crate::calendar::{Calendar, Unit};
use crate::config::{Algorithm, Window};

/// `(ms after a whole second, cost, allowed, remaining, reset ms, retry ms)`; a cost above
/// what the limit ever holds has the retry [`NEVER`].
pub type Case = (u64, u64, bool, f64, f64, f64);

/// A limit (`limit` units per `window`, `burst` at once) and its cases on one fresh key.
pub struct CaseTable {
    pub algorithm: Algorithm,
    pub limit: u64,
    pub window: Window,
    pub burst: u64,
    pub cases: &'static [Case],
}

/// 2 tokens per second (one every 500 ms), a bucket of 5: exhausted, refilled exactly, a cost
/// that does not fit yet, a day idle that refills to the burst, not beyond, and a cost above
/// the burst, which never fits.
pub const TOKEN_BUCKET: CaseTable = CaseTable {
    algorithm: Algorithm::TokenBucket,
    limit: 2,
    window: Window::ms(1000),
    burst: 5,
    cases: &[
        (0, 1, true, 4.0, 500.0, 0.0),
        (0, 1, true, 3.0, 1000.0, 0.0),
        (0, 3, true, 0.0, 2500.0, 0.0),
        (0, 1, false, 0.0, 2500.0, 500.0),
        (250, 1, false, 0.5, 2250.0, 250.0),
        (500, 1, true, 0.0, 2500.0, 0.0),
        (1500, 3, false, 2.0, 1500.0, 500.0),
        (2000, 3, true, 0.0, 2500.0, 0.0),
        (86_400_000, 5, true, 0.0, 2500.0, 0.0),
        (86_400_000, 1, false, 0.0, 2500.0, 500.0),
        (86_400_000, 6, false, 0.0, 2500.0, NEVER),
    ],
};

/// 10 per second (one every 100 ms), 3 at once; last, a clock 500 ms back, which refills
/// nothing (the theoretical arrival time does not move back), and a cost above the burst.
pub const GCRA: CaseTable = CaseTable {
    algorithm: Algorithm::Gcra,
    limit: 10,
    window: Window::ms(1000),
    burst: 3,
    cases: &[
        (0, 1, true, 2.0, 100.0, 0.0),
        (0, 1, true, 1.0, 200.0, 0.0),
        (0, 1, true, 0.0, 300.0, 0.0),
        (0, 1, false, 0.0, 300.0, 100.0),
        (50, 1, false, 0.5, 250.0, 50.0),
        (100, 1, true, 0.0, 300.0, 0.0),
        (1000, 2, true, 1.0, 200.0, 0.0),
        (500, 2, false, 0.0, 700.0, 600.0),
        (500, 4, false, 0.0, 700.0, NEVER),
    ],
};

/// 3 per aligned second; last, a cost above the limit, which never fits.
pub const FIXED_WINDOW: CaseTable = CaseTable {
    algorithm: Algorithm::FixedWindow,
    limit: 3,
    window: Window::ms(1000),
    burst: 3,
    cases: &[
        (200, 2, true, 1.0, 800.0, 0.0),
        (300, 1, true, 0.0, 700.0, 0.0),
        (400, 1, false, 0.0, 600.0, 600.0),
        (1000, 1, true, 2.0, 1000.0, 0.0),
        (1100, 4, false, 2.0, 900.0, NEVER),
    ],
};

/// 3 per calendar month at UTC−05:00. The tables' instants count from 2025-11-30 08:00 UTC
/// (the tests' T0), 03:00 on November 30 at that offset: November ends 21 hours later
/// (December 1, 05:00 UTC), and December lasts 31 days. Spent at November's last
/// millisecond, whole again at December's first, not before; 4 never fit.
pub const FIXED_WINDOW_MONTH: CaseTable = CaseTable {
    algorithm: Algorithm::FixedWindow,
    limit: 3,
    window: Window::Calendar(Calendar {
        unit: Unit::Month,
        offset_minutes: -300,
    }),
    burst: 3,
    cases: &[
        (0, 2, true, 1.0, 75_600_000.0, 0.0),
        (75_599_999, 1, true, 0.0, 1.0, 0.0),
        (75_599_999, 1, false, 0.0, 1.0, 1.0),
        (75_600_000, 1, true, 2.0, 2_678_400_000.0, 0.0),
        (75_600_001, 4, false, 2.0, 2_678_399_999.0, NEVER),
    ],
};

/// 10 per sliding second, the previous window weighted by how much of it the sliding window
/// still covers: half-way into the next window it counts half (5 used, 5 left); at 1.6 s
/// 10 - (10 × 0.4 + 5) = 1 is left, and a cost of 2 fits at 1.7 s; one of 11 never does.
pub const SLIDING_WINDOW_COUNTER: CaseTable = CaseTable {
    algorithm: Algorithm::SlidingWindowCounter,
    limit: 10,
    window: Window::ms(1000),
    burst: 10,
    cases: &[
        (500, 10, true, 0.0, 1500.0, 0.0),
        (900, 1, false, 0.0, 1100.0, 200.0),
        (1500, 5, true, 0.0, 1500.0, 0.0),
        (1600, 2, false, 1.0, 1400.0, 100.0),
        (1700, 2, true, 0.0, 1300.0, 0.0),
        (1700, 11, false, 0.0, 1300.0, NEVER),
    ],
};

/// 3 per sliding second, exact: full until the first entry is a whole window old; two units
/// need the two oldest entries (100 ms, 200 ms) gone; four never fit.
pub const SLIDING_WINDOW_LOG: CaseTable = CaseTable {
    algorithm: Algorithm::SlidingWindowLog,
    limit: 3,
    window: Window::ms(1000),
    burst: 3,
    cases: &[
        (0, 1, true, 2.0, 1000.0, 0.0),
        (100, 1, true, 1.0, 1000.0, 0.0),
        (200, 1, true, 0.0, 1000.0, 0.0),
        (300, 1, false, 0.0, 900.0, 700.0),
        (999, 1, false, 0.0, 201.0, 1.0),
        (1000, 1, true, 0.0, 1000.0, 0.0),
        (1050, 2, false, 0.0, 950.0, 150.0),
        (1050, 4, false, 0.0, 950.0, NEVER),
    ],
};

/// Every table: one per algorithm, and a calendar window.
pub const TABLES: &[&CaseTable] = &[
    &TOKEN_BUCKET,
    &GCRA,
    &FIXED_WINDOW,
    &FIXED_WINDOW_MONTH,
    &SLIDING_WINDOW_COUNTER,
    &SLIDING_WINDOW_LOG,
];
