//! How late the worker runs, and the worker's own time that request deadlines are counted in.
//!
//! A proxy under CPU contention (busy neighbours, a CFS quota) runs its callbacks late: a reply
//! that Redis sent in 2 ms can sit in the socket for 50 ms before the worker reads it. That
//! lateness is the proxy's, not the bridge's, and must not make a call look timed out. The
//! worker's timer is the measure: it is asked for every [`TICK`], so each time it fires later
//! than that (beyond a small tolerance for ordinary jitter), the excess is time the worker
//! could not run. The worker's own time is wall time less all of that lateness; while a tick
//! is overdue it stands still, since the worker has not been running on time since.
//!
//! Deadlines counted in it stretch by exactly the worker's lateness; Envoy's own timeout of a
//! call (wall time: the timeout plus `bridge.lag_allowance`) bounds how far.
//!
//! The timer runs only while the worker has work ([`super::Engine::needs_tick`]): while it is
//! off nothing waits, so there is nothing to measure and the worker's time follows wall time;
//! it is measured again from the instant the timer is asked for again ([`Lag::start`]).

use std::time::Duration;

use super::TICK;
use crate::time::UnixNs;

/// Lateness of a tick below this is ordinary timer jitter, not counted.
const TOLERANCE_NS: u128 = 5_000_000;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Lag {
    /// When the timer last fired; None before the first tick.
    last_tick_ns: Option<UnixNs>,
    /// Lateness counted so far (ns).
    total_ns: u128,
}

impl Lag {
    /// The timer fired at `now`: returns how late it came (ns, beyond the tolerance).
    pub fn tick(&mut self, now: UnixNs) -> u128 {
        let late = self.overdue(now);
        self.total_ns = self.total_ns.saturating_add(late);
        self.last_tick_ns = Some(now);
        late
    }

    /// The timer was asked for at `now` (it was off): its first tick is due one [`TICK`] later,
    /// and lateness counts from here.
    pub fn start(&mut self, now: UnixNs) {
        self.last_tick_ns = Some(now);
    }

    /// The timer is off (right after a tick that found nothing to do): no tick is due, so
    /// none can be overdue until it starts again.
    pub fn stop(&mut self) {
        self.last_tick_ns = None;
    }

    /// How long the next tick is overdue at `now` (0 if it is not).
    fn overdue(&self, now: UnixNs) -> u128 {
        let Some(last) = self.last_tick_ns else {
            return 0;
        };
        now.since(last)
            .saturating_sub(TICK.as_nanos() + TOLERANCE_NS)
    }

    /// The worker's own time at wall time `now`: it never goes backwards while `now` does not.
    pub fn work_ns(&self, now: UnixNs) -> u128 {
        now.minus_ns(self.total_ns.saturating_add(self.overdue(now)))
            .as_ns()
    }

    /// The instant `now` (wall time) as the engine reads it.
    pub fn moment(&self, now: UnixNs) -> Moment {
        Moment {
            wall_ns: now,
            work_ns: self.work_ns(now),
        }
    }
}

/// An instant: wall time and the worker's own time then (ns on the Unix clock's scale, less
/// the worker's lateness).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moment {
    pub wall_ns: UnixNs,
    pub work_ns: u128,
}

impl Moment {
    /// How long since `earlier`, in the worker's own time.
    pub fn work_since(&self, earlier: Moment) -> Duration {
        let ns = self.work_ns.saturating_sub(earlier.work_ns);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

/// When a request stops waiting for its call: once its timeout has passed in the worker's
/// own time, or its timeout plus the lag allowance in wall time, whichever comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    pub work_ns: u128,
    pub wall_ns: UnixNs,
}

impl Deadline {
    /// The deadline of a request that arrived at `at` with `timeout`.
    pub fn new(at: Moment, timeout: Duration, lag_allowance: Duration) -> Self {
        Deadline {
            work_ns: at.work_ns.saturating_add(timeout.as_nanos()),
            wall_ns: at.wall_ns.plus(timeout.saturating_add(lag_allowance)),
        }
    }

    pub fn passed(&self, at: Moment) -> bool {
        at.work_ns >= self.work_ns || at.wall_ns >= self.wall_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::random::Rng;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const MS: u128 = 1_000_000;
    const T0: u128 = 1_000_000 * MS;

    fn at(ns: u128) -> UnixNs {
        UnixNs::from_ns(ns)
    }

    #[test]
    fn a_deadline_passes_in_the_workers_time_or_at_the_allowance() {
        let (timeout, allowance) = (Duration::from_millis(150), Duration::from_secs(1));
        let mut lag = Lag::default();
        let d = Deadline::new(lag.moment(at(T0)), timeout, allowance);
        for i in 1..=5 {
            lag.tick(at(T0 + i * 25 * MS));
        }
        assert!(!d.passed(lag.moment(at(T0 + 149 * MS))));
        assert!(
            d.passed(lag.moment(at(T0 + 150 * MS))),
            "on time: at its timeout"
        );
        // A worker whose timer stood still from 25 ms to 400 ms is 345 ms behind.
        let mut late = Lag::default();
        late.tick(at(T0));
        late.tick(at(T0 + 25 * MS));
        late.tick(at(T0 + 400 * MS));
        for i in 1..=4 {
            late.tick(at(T0 + (400 + i * 25) * MS));
        }
        assert!(!d.passed(late.moment(at(T0 + 494 * MS))));
        assert!(d.passed(late.moment(at(T0 + 495 * MS))));
        // However late the worker runs, the wall-clock bound holds.
        let mut stuck = Lag::default();
        stuck.tick(at(T0));
        assert_eq!(stuck.work_ns(at(T0 + 1149 * MS)), T0 + 30 * MS);
        assert!(!d.passed(stuck.moment(at(T0 + 1149 * MS))));
        assert!(d.passed(stuck.moment(at(T0 + 1150 * MS))));
    }

    #[test]
    fn on_time_ticks_leave_wall_time_and_late_ones_are_taken_out() {
        let mut lag = Lag::default();
        assert_eq!(lag.work_ns(at(T0)), T0, "no tick yet: wall time");
        assert_eq!(lag.tick(at(T0)), 0);
        // Ticks on time, or within the tolerance, count nothing.
        assert_eq!(lag.tick(at(T0 + 25 * MS)), 0);
        assert_eq!(lag.tick(at(T0 + 54 * MS)), 0);
        assert_eq!(lag.work_ns(at(T0 + 60 * MS)), T0 + 60 * MS);
        // The worker stops for 100 ms: the time stands still once the tick is overdue...
        assert_eq!(lag.work_ns(at(T0 + 84 * MS)), T0 + 84 * MS);
        assert_eq!(lag.work_ns(at(T0 + 154 * MS)), T0 + 84 * MS);
        // ...and the late tick counts what it missed.
        assert_eq!(lag.tick(at(T0 + 154 * MS)), 70 * MS);
        assert_eq!(lag.work_ns(at(T0 + 154 * MS)), T0 + 84 * MS);
        assert_eq!(lag.work_ns(at(T0 + 164 * MS)), T0 + 94 * MS);
    }

    #[test]
    fn a_stopped_timer_is_never_late_and_a_started_one_counts_from_its_start() {
        let mut lag = Lag::default();
        lag.tick(at(T0));
        lag.stop();
        // Off for a minute: nothing was due, nothing is late, the time follows wall time.
        assert_eq!(lag.work_ns(at(T0 + 60_000 * MS)), T0 + 60_000 * MS);
        lag.start(at(T0 + 60_000 * MS));
        assert_eq!(lag.work_ns(at(T0 + 60_030 * MS)), T0 + 60_030 * MS);
        // The first tick after the start comes 100 ms late: the worker's time stood still.
        assert_eq!(lag.work_ns(at(T0 + 60_125 * MS)), T0 + 60_030 * MS);
        assert_eq!(lag.tick(at(T0 + 60_125 * MS)), 95 * MS);
        assert_eq!(lag.work_ns(at(T0 + 60_150 * MS)), T0 + 60_055 * MS);
    }

    /// Over random tick sequences: the worker's time never goes backwards, never runs ahead of
    /// wall time, and falls behind by exactly the lateness the ticks reported.
    #[test]
    fn the_workers_time_is_monotonic_and_behind_by_the_lateness() {
        for seed in 0..200 {
            let mut rng = Rng::new(seed);
            let mut lag = Lag::default();
            let (mut now, mut last_work, mut reported) = (T0, 0u128, 0u128);
            for _ in 0..300 {
                now += u128::from(rng.below(80)) * MS;
                if rng.one_in(3) {
                    reported += lag.tick(at(now));
                }
                let work = lag.work_ns(at(now));
                assert!(work >= last_work && work <= now, "seed {seed}");
                last_work = work;
            }
            reported += lag.tick(at(now));
            assert_eq!(lag.work_ns(at(now)), now - reported, "seed {seed}");
        }
    }
}
