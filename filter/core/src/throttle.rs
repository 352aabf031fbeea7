//! Keeps an outage from flooding the log: one line per interval, with a count of the rest.

use std::time::Duration;

use crate::time::UnixNs;

#[derive(Debug, Clone)]
pub struct LogThrottle {
    interval: Duration,
    next_at: UnixNs,
    suppressed: u64,
}

impl LogThrottle {
    pub fn new(interval: Duration) -> Self {
        LogThrottle {
            interval,
            next_at: UnixNs::default(),
            suppressed: 0,
        }
    }

    /// `Some(n)` when a line may be written at `now`, `n` being how many were held back
    /// since the last one; `None` when this one should be held back.
    pub fn admit(&mut self, now: UnixNs) -> Option<u64> {
        if now < self.next_at {
            self.suppressed += 1;
            return None;
        }
        self.next_at = now.plus(self.interval);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn one_line_per_interval_then_the_count() {
        let s = 1_000_000_000u128;
        let mut t = LogThrottle::new(Duration::from_secs(10));
        assert_eq!(t.admit(UnixNs::from_ns(100 * s)), Some(0));
        assert_eq!(t.admit(UnixNs::from_ns(100 * s + 1)), None);
        assert_eq!(t.admit(UnixNs::from_ns(109 * s)), None);
        assert_eq!(t.admit(UnixNs::from_ns(110 * s)), Some(2));
        assert_eq!(t.admit(UnixNs::from_ns(111 * s)), None);
        assert_eq!(t.admit(UnixNs::from_ns(200 * s)), Some(1));
    }
}
