//! The circuit breaker of a worker, as a state machine on its own: it is told of calls that
//! failed, answered or stalled and of probe replies, and says when it opens or closes (the
//! engine then decides the waiting requests, counts and logs). Closed, calls go out and a run
//! of `failures` failed calls in a row (or one call in flight for `stall`) opens it; open, no
//! call goes out but one probe per `probe_interval`, and the first probe answered closes it.

use std::fmt::Display;
use std::time::Duration;

use crate::bridge::{parse_eval_reply, BridgeReply, BridgeRequest, DecideCall};
use crate::config::{Breaker as Settings, Config};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Calls go out; `failures` in a row failed.
    Closed { failures: u32 },
    /// No call but one probe per interval (`probe`: the one in flight).
    Open {
        since_ns: u128,
        next_probe_ns: u128,
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
        now: u128,
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

    /// Why the breaker opens, if the oldest call in flight (sent at `oldest_ns`) has been in
    /// flight for `stall` by `now`.
    pub fn stalled(
        &mut self,
        settings: Option<Settings>,
        oldest_ns: Option<u128>,
        now: u128,
    ) -> Option<String> {
        let (Some(settings), State::Closed { .. }, Some(oldest)) =
            (settings, self.state, oldest_ns)
        else {
            return None;
        };
        let age = now.saturating_sub(oldest);
        (age >= settings.stall.as_nanos()).then(|| {
            self.open(settings, now);
            format!("a call has been in flight for {} ms", age / 1_000_000)
        })
    }

    fn open(&mut self, settings: Settings, now: u128) {
        self.state = State::Open {
            since_ns: now,
            next_probe_ns: now.saturating_add(settings.probe_interval.as_nanos()),
            probe: None,
        };
    }

    /// Whether a probe is due at `now` (open, none in flight, its interval passed).
    pub fn probe_due(&self, now: u128) -> bool {
        matches!(self.state, State::Open { next_probe_ns, probe: None, .. } if now >= next_probe_ns)
    }

    /// The probe to send at `now`, if one is due, and its timeout: an empty decision call,
    /// which answers only if Webdis, Redis and the script all do.
    pub fn probe(&self, config: &Config, now: u128) -> Option<(BridgeRequest, Duration)> {
        let settings = config.breaker?;
        if !self.probe_due(now) {
            return None;
        }
        let interval = settings.probe_interval;
        let deadline_ms = (now + interval.as_nanos() + config.clock_skew.as_nanos()) / 1_000_000;
        let call = DecideCall::new(&now.to_string(), deadline_ms, std::iter::empty());
        Some((BridgeRequest::evalsha(&config.script_sha, &call), interval))
    }

    /// The probe's reply came at `now`: answered (a missing script is the next call's to
    /// load), the bridge is back and the breaker closes, and says why.
    pub fn probe_reply(&mut self, reply: BridgeReply<'_>, now: u128) -> Option<String> {
        self.probe_replied(parse_eval_reply(reply, &[]).is_ok(), now)
    }

    /// A probe was sent at `now` (`token`: its call, None if it could not be sent); the next
    /// is due one interval later.
    pub fn probe_sent(&mut self, settings: Option<Settings>, token: Option<u32>, now: u128) {
        let (Some(settings), State::Open { since_ns, .. }) = (settings, self.state) else {
            return;
        };
        self.state = State::Open {
            since_ns,
            next_probe_ns: now.saturating_add(settings.probe_interval.as_nanos()),
            probe: token,
        };
    }

    /// Whether `token` is the probe in flight.
    pub fn is_probe(&self, token: u32) -> bool {
        matches!(self.state, State::Open { probe: Some(probe), .. } if probe == token)
    }

    /// The probe's reply came at `now`: answered (`ok`) closes the breaker, and says why.
    pub fn probe_replied(&mut self, ok: bool, now: u128) -> Option<String> {
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
            now.saturating_sub(since_ns) / 1_000_000
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

    fn settings() -> Settings {
        Settings {
            failures: 3,
            stall: Duration::from_millis(100),
            probe_interval: Duration::from_millis(50),
        }
    }

    #[test]
    fn a_run_of_failures_opens_it_and_a_success_resets_the_run() {
        let mut b = Breaker::default();
        let s = Some(settings());
        assert_eq!(b.failed(s, &"no", 0), None);
        assert_eq!(b.failed(s, &"no", 0), None);
        b.answered();
        assert_eq!(b.failed(s, &"no", 0), None);
        assert_eq!(b.failed(s, &"no", 0), None);
        assert_eq!(
            b.failed(s, &"timeout", 7),
            Some("3 calls in a row failed, the last: timeout".to_string())
        );
        assert!(b.is_open());
        assert_eq!(b.failed(s, &"no", 8), None, "opens once");
        // Without settings it never opens.
        let mut b = Breaker::default();
        for _ in 0..10 {
            assert_eq!(b.failed(None, &"no", 0), None);
        }
        assert_eq!(b.stalled(None, Some(0), 10_000 * MS), None);
        assert!(!b.is_open());
    }

    #[test]
    fn a_stalled_call_opens_it_and_a_probe_answered_closes_it() {
        let mut b = Breaker::default();
        let s = Some(settings());
        assert_eq!(b.stalled(s, Some(0), 99 * MS), None);
        assert_eq!(b.stalled(s, None, 500 * MS), None, "nothing in flight");
        assert_eq!(
            b.stalled(s, Some(0), 100 * MS),
            Some("a call has been in flight for 100 ms".to_string())
        );
        assert!(!b.probe_due(149 * MS));
        assert!(b.probe_due(150 * MS));
        b.probe_sent(s, Some(9), 150 * MS);
        assert!(b.is_probe(9) && !b.is_probe(8));
        assert!(!b.probe_due(300 * MS), "one probe at a time");
        assert_eq!(b.probe_replied(false, 160 * MS), None);
        assert!(!b.probe_due(199 * MS) && b.probe_due(200 * MS));
        b.probe_sent(s, Some(10), 200 * MS);
        assert_eq!(
            b.probe_replied(true, 210 * MS),
            Some("a probe was answered after 110 ms open".to_string())
        );
        assert!(!b.is_open());
    }

    /// Random sequences of events against a model: it opens exactly when `failures` calls in a
    /// row failed or a call stalled, closes only on a probe answered, has one probe in flight
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
                        let opens = b.failed(Some(s), &"x", now).is_some();
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
                        let oldest = now.checked_sub(u128::from(rng.below(200)) * MS);
                        let opens = b.stalled(Some(s), oldest, now).is_some();
                        let stalled = oldest.is_some_and(|o| now - o >= s.stall.as_nanos());
                        assert_eq!(opens, !open && stalled, "seed {seed}");
                    }
                    4 => {
                        if b.probe_due(now) {
                            assert!(open && probe.is_none(), "seed {seed}");
                            let since = last_probe_ns.unwrap_or(opened_ns);
                            assert!(now - since >= s.probe_interval.as_nanos(), "seed {seed}");
                            b.probe_sent(Some(s), Some(step), now);
                            probe = Some(step);
                            last_probe_ns = Some(now);
                        }
                    }
                    _ => {
                        if let Some(token) = probe.take() {
                            assert!(b.is_probe(token), "seed {seed}");
                            let ok = rng.one_in(3);
                            let closes = b.probe_replied(ok, now).is_some();
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
