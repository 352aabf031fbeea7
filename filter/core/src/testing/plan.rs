//! Limit checks and plans written by hand, for tests of the engine's parts and of the scripts.

use std::time::Duration;

use crate::check::{LimitCheck, Mode};
use crate::config::{Algorithm, FailureMode, Window};
use crate::request::plan::Plan;

/// An enforced token bucket of 10 a second (burst 10) on `key`, cost 1, no lease or budget.
pub fn token_bucket_check(key: &str) -> LimitCheck {
    LimitCheck {
        rule: 0,
        limit: 0,
        key: key.into(),
        algorithm: Algorithm::TokenBucket,
        per_window: 10,
        quota: 10,
        window: Window::ms(1000),
        burst: 10,
        cost: 1,
        mode: Mode::of(false, None, false, None),
        overrides: false,
    }
}

/// A limit of 10 a minute (burst 20) on `key` with `algorithm`, cost 1, shadow or enforced,
/// no lease or budget.
pub fn minute_check(key: &str, algorithm: Algorithm, shadow: bool) -> LimitCheck {
    LimitCheck {
        rule: 0,
        limit: 0,
        key: key.into(),
        algorithm,
        per_window: 10,
        quota: 20,
        window: Window::ms(60_000),
        burst: 20,
        cost: 1,
        mode: Mode::of(false, None, shadow, None),
        overrides: false,
    }
}

/// A plan of `checks` that fails open, with a 150 ms timeout.
pub fn plan_of(checks: Vec<LimitCheck>) -> Plan {
    Plan {
        checks,
        timeout: Duration::from_millis(150),
        failure_mode: FailureMode::Open,
    }
}
