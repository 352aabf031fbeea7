//! The circuit breaker of a worker, as a state machine on its own: it is told of calls that
//! failed, answered or hung and of probe replies, and says when it opens or closes (the engine
//! then decides the waiting requests, counts and logs). It opens on evidence that the bridge
//! does not answer, never on slowness: a run of `failures` calls in a row that failed (refused,
//! reset, a 5xx, a bad reply, no answer within their timeout), or one call without an answer
//! for its whole timeout while other requests wait (a hang). Ages are counted in the worker's
//! own time (`lag.rs`), so a late-running proxy does not blame the bridge. Open, no call goes
//! out but one probe per `probe_interval`; the first answer (a probe's, or a late one to a
//! call given up on) closes it.

use std::fmt::Display;
use std::time::Duration;

use super::queue::Unanswered;
use crate::bridge::{BridgeRequest, DecideCall};
use crate::config::{Breaker as Settings, Config};
use crate::time::UnixNs;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Calls go out; `failures` in a row failed.
    Closed { failures: u32 },
    /// No call but one probe per interval (`probe`: the one in flight).
    Open {
        since_ns: UnixNs,
        next_probe_ns: UnixNs,
        probe: Option<u32>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    state: State,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            state: State::Closed { failures: 0 },
        }
    }
}

impl Breaker {
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open { .. })
    }

    /// A call failed with `failure`: why the breaker opens, if this opens it.
    pub fn failed(
        &mut self,
        settings: Option<Settings>,
        failure: &impl Display,
        now: UnixNs,
    ) -> Option<String> {
        let (Some(settings), State::Closed { failures }) = (settings, self.state) else {
            return None;
        };
        let failures = failures + 1;
        self.state = State::Closed { failures };
        (failures >= settings.failures).then(|| {
            self.open(settings, now);
            format!("{failures} calls in a row failed, the last: {failure}")
        })
    }

    /// The bridge answered a call: the run of failures is over.
    pub fn answered(&mut self) {
        if let State::Closed { .. } = self.state {
            self.state = State::Closed { failures: 0 };
        }
    }

    /// Why the breaker opens at `now`, if `call`, while requests wait, has had no answer for
    /// its timeout (or `stall`, when set lower).
    pub fn hung(
        &mut self,
        settings: Option<Settings>,
        call: Unanswered,
        now: UnixNs,
    ) -> Option<String> {
        let (Some(settings), State::Closed { .. }) = (settings, self.state) else {
            return None;
        };
        let limit = settings.stall.map_or(call.timeout, |s| s.min(call.timeout));
        (call.age >= limit).then(|| {
            self.open(settings, now);
            format!(
                "a call has had no answer for {} ms of the worker's time (its timeout: {} ms) while requests waited",
                call.age.as_millis(),
                call.timeout.as_millis()
            )
        })
    }

    /// A call given up on was answered late at `now`: the bridge answers. Ends a run of
    /// failures; an open breaker closes, and says why.
    pub fn late_answer(&mut self, now: UnixNs) -> Option<String> {
        match self.state {
            State::Closed { .. } => {
                self.answered();
                None
            }
            State::Open { since_ns, .. } => {
                self.state = State::Closed { failures: 0 };
                Some(format!(
                    "a call given up on was answered after {} ms open: the bridge answers, slowly",
                    now.since(since_ns) / 1_000_000
                ))
            }
        }
    }

    fn open(&mut self, settings: Settings, now: UnixNs) {
        self.state = State::Open {
            since_ns: now,
            next_probe_ns: now.plus(settings.probe_interval),
            probe: None,
        };
    }

    /// Whether a probe is due at `now` (open, none in flight, its interval passed).
    pub fn probe_due(&self, now: UnixNs) -> bool {
        matches!(self.state, State::Open { next_probe_ns, probe: None, .. } if now >= next_probe_ns)
    }

    /// The probe to send at `now`, if one is due, and its timeout: an empty decision call,
    /// which answers only if Webdis, Redis and the script all do.
    pub fn probe(&self, config: &Config, now: UnixNs) -> Option<(BridgeRequest, Duration)> {
        let settings = config.breaker?;
        if !self.probe_due(now) {
            return None;
        }
        let interval = settings.probe_interval;
        let deadline_ms = now.plus(interval).plus(config.clock_skew).as_ms();
        let call = DecideCall::new(&now.as_ns().to_string(), deadline_ms, std::iter::empty());
        Some((config.program.decide(&call), interval))
    }

    /// A probe was sent at `now` (`token`: its call, None if it could not be sent); the next
    /// is due one interval later.
    pub fn probe_sent(&mut self, settings: Option<Settings>, token: Option<u32>, now: UnixNs) {
        let (Some(settings), State::Open { since_ns, .. }) = (settings, self.state) else {
            return;
        };
        self.state = State::Open {
            since_ns,
            next_probe_ns: now.plus(settings.probe_interval),
            probe: token,
        };
    }

    /// Whether `token` is the probe in flight.
    pub fn is_probe(&self, token: u32) -> bool {
        matches!(self.state, State::Open { probe: Some(probe), .. } if probe == token)
    }

    /// The probe's reply came at `now`: answered (`ok`) closes the breaker, and says why.
    pub fn probe_replied(&mut self, ok: bool, now: UnixNs) -> Option<String> {
        let State::Open {
            since_ns,
            next_probe_ns,
            ..
        } = self.state
        else {
            return None;
        };
        if !ok {
            self.state = State::Open {
                since_ns,
                next_probe_ns,
                probe: None,
            };
            return None;
        }
        self.state = State::Closed { failures: 0 };
        Some(format!(
            "a probe was answered after {} ms open",
            now.since(since_ns) / 1_000_000
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::random::Rng;
    use std::time::Duration;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const MS: u128 = 1_000_000;

    fn at(ns: u128) -> UnixNs {
        UnixNs::from_ns(ns)
    }

    fn settings() -> Settings {
        Settings {
            failures: 3,
            stall: None,
            probe_interval: Duration::from_millis(50),
        }
    }

    /// A call in flight: `age_ms` without an answer, of a call of `timeout_ms`.
    fn unanswered(age_ms: u64, timeout_ms: u64) -> Unanswered {
        Unanswered {
            token: 1,
            age: Duration::from_millis(age_ms),
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    #[test]
    fn a_run_of_failures_opens_it_and_a_success_resets_the_run() {
        let mut b = Breaker::default();
        let s = Some(settings());
        assert_eq!(b.failed(s, &"no", at(0)), None);
        assert_eq!(b.failed(s, &"no", at(0)), None);
        b.answered();
        assert_eq!(b.failed(s, &"no", at(0)), None);
        assert_eq!(b.failed(s, &"no", at(0)), None);
        assert_eq!(
            b.failed(s, &"timeout", at(7)),
            Some("3 calls in a row failed, the last: timeout".to_string())
        );
        assert!(b.is_open());
        assert_eq!(b.failed(s, &"no", at(8)), None, "opens once");
        // Without settings it never opens.
        let mut b = Breaker::default();
        for _ in 0..10 {
            assert_eq!(b.failed(None, &"no", at(0)), None);
        }
        assert_eq!(b.hung(None, unanswered(10_000, 100), at(0)), None);
        assert!(!b.is_open());
    }

    #[test]
    fn a_slow_answer_keeps_it_closed_and_a_call_past_its_timeout_opens_it() {
        let s = Some(settings());
        // Answered at 149 ms of a 150 ms timeout: slow, not hung, and no failure.
        let mut b = Breaker::default();
        assert_eq!(b.hung(s, unanswered(149, 150), at(149 * MS)), None);
        b.answered();
        assert!(!b.is_open());
        // A lower `stall` opens it sooner; a higher one is capped by the timeout.
        let stall = |ms| {
            Some(Settings {
                stall: Some(Duration::from_millis(ms)),
                ..settings()
            })
        };
        assert_eq!(b.hung(stall(50), unanswered(49, 150), at(0)), None);
        assert!(b.hung(stall(50), unanswered(50, 150), at(0)).is_some());
        let mut b = Breaker::default();
        assert!(b.hung(stall(500), unanswered(150, 150), at(0)).is_some());
    }

    #[test]
    fn a_hung_call_opens_it_and_a_probe_answered_closes_it() {
        let mut b = Breaker::default();
        let s = Some(settings());
        assert_eq!(b.hung(s, unanswered(99, 100), at(99 * MS)), None);
        assert_eq!(
            b.hung(s, unanswered(100, 100), at(100 * MS)),
            Some("a call has had no answer for 100 ms of the worker's time (its timeout: 100 ms) while requests waited".to_string())
        );
        assert!(!b.probe_due(at(149 * MS)));
        assert!(b.probe_due(at(150 * MS)));
        b.probe_sent(s, Some(9), at(150 * MS));
        assert!(b.is_probe(9) && !b.is_probe(8));
        assert!(!b.probe_due(at(300 * MS)), "one probe at a time");
        assert_eq!(b.probe_replied(false, at(160 * MS)), None);
        assert!(!b.probe_due(at(199 * MS)) && b.probe_due(at(200 * MS)));
        b.probe_sent(s, Some(10), at(200 * MS));
        assert_eq!(
            b.probe_replied(true, at(210 * MS)),
            Some("a probe was answered after 110 ms open".to_string())
        );
        assert!(!b.is_open());
    }

    #[test]
    fn a_late_answer_ends_the_run_and_closes_it() {
        let s = Some(settings());
        let mut b = Breaker::default();
        b.failed(s, &"timed out", at(0));
        b.failed(s, &"timed out", at(0));
        assert_eq!(b.late_answer(at(0)), None);
        assert_eq!(
            b.failed(s, &"timed out", at(0)),
            None,
            "the run started again"
        );
        assert!(b.hung(s, unanswered(100, 100), at(10 * MS)).is_some());
        assert_eq!(
            b.late_answer(at(70 * MS)),
            Some(
                "a call given up on was answered after 60 ms open: the bridge answers, slowly"
                    .to_string()
            )
        );
        assert!(!b.is_open());
    }

    /// Random sequences of events against a model: it opens exactly when `failures` calls in a
    /// row failed or a call hung, closes only on a probe answered, has one probe in flight
    /// at most, probes no more often than the interval, and says so on each change.
    #[test]
    fn the_state_machine_follows_its_model_over_random_events() {
        let s = settings();
        for seed in 0..200 {
            let mut rng = Rng::new(seed);
            let mut b = Breaker::default();
            let (mut open, mut run, mut probe): (bool, u32, Option<u32>) = (false, 0, None);
            let mut last_probe_ns: Option<u128> = None;
            let mut opened_ns = 0;
            let mut now = 0u128;
            for step in 0..300u32 {
                now += u128::from(rng.below(40)) * MS;
                match rng.below(6) {
                    0 | 1 => {
                        let opens = b.failed(Some(s), &"x", at(now)).is_some();
                        if !open {
                            run += 1;
                        }
                        assert_eq!(opens, !open && run >= s.failures, "seed {seed}");
                    }
                    2 => {
                        b.answered();
                        if !open {
                            run = 0;
                        }
                    }
                    3 => {
                        let age = rng.below(200);
                        let opens = b.hung(Some(s), unanswered(age, 100), at(now)).is_some();
                        assert_eq!(opens, !open && age >= 100, "seed {seed}");
                    }
                    4 => {
                        if b.probe_due(at(now)) {
                            assert!(open && probe.is_none(), "seed {seed}");
                            let since = last_probe_ns.unwrap_or(opened_ns);
                            assert!(now - since >= s.probe_interval.as_nanos(), "seed {seed}");
                            b.probe_sent(Some(s), Some(step), at(now));
                            probe = Some(step);
                            last_probe_ns = Some(now);
                        }
                    }
                    _ => {
                        if let Some(token) = probe.take() {
                            assert!(b.is_probe(token), "seed {seed}");
                            let ok = rng.one_in(3);
                            let closes = b.probe_replied(ok, at(now)).is_some();
                            assert_eq!(closes, ok, "seed {seed}");
                            if ok {
                                open = false;
                                run = 0;
                            }
                        }
                    }
                }
                if b.is_open() && !open {
                    open = true;
                    opened_ns = now;
                    last_probe_ns = None;
                }
                assert_eq!(b.is_open(), open, "seed {seed} step {step}");
            }
        }
    }
}
