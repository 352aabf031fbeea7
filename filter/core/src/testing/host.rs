//! A fake [`Host`] for the engine's tests and examples: it records what the engine asks, with
//! a clock the caller moves.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::bridge::{BridgeFailure, BridgeRequest, Misconfiguration};
use crate::config::{Bridge, Config};
use crate::engine::Host;
use crate::metrics::{Counter, Gauge, Histogram, RuleStats};
use crate::response::LocalResponse;

/// The fake clock's start (Unix ns).
pub const T0: u128 = 1_000_000_000_000;

/// A record of what the engine asks of its host, with a clock the test moves.
#[derive(Default)]
pub struct FakeHost {
    pub now: Option<u128>,
    pub refuse_dispatch: bool,
    pub cannot_wake: bool,
    pub gone: HashSet<u32>,
    pub next_token: u32,
    pub dispatched: Vec<(u32, BridgeRequest, Duration)>,
    pub wakes: usize,
    /// The tick period asked for last (`Duration::ZERO`: none), and every change asked.
    pub tick: Duration,
    pub tick_changes: Vec<Duration>,
    pub resumed: Vec<u32>,
    pub answered: Vec<(u32, LocalResponse)>,
    pub counters: Vec<Counter>,
    pub rule_counts: HashMap<usize, u64>,
    pub histograms: Vec<(Histogram, u64)>,
    pub failures: Vec<BridgeFailure>,
    pub misconfigured: Vec<Misconfiguration>,
    pub restarts: u64,
    pub breaker_open: i64,
    /// The `ratelimit_worker_timers` gauge.
    pub timers: i64,
    pub breaker_log: Vec<(bool, String)>,
}

impl Host for FakeHost {
    fn now_unix_ns(&self) -> Option<u128> {
        self.now
    }
    fn dispatch(
        &mut self,
        _bridge: &Bridge,
        request: &BridgeRequest,
        timeout: Duration,
    ) -> Result<u32, String> {
        if self.refuse_dispatch {
            return Err("cluster not found".into());
        }
        self.next_token += 1;
        self.dispatched
            .push((self.next_token, request.clone(), timeout));
        Ok(self.next_token)
    }
    fn wake(&mut self) -> bool {
        self.wakes += 1;
        !self.cannot_wake
    }
    fn tick_every(&mut self, period: Duration) -> bool {
        self.tick = period;
        self.tick_changes.push(period);
        true
    }
    fn resume(&mut self, ctx: u32) -> bool {
        if self.gone.contains(&ctx) {
            return false;
        }
        self.resumed.push(ctx);
        true
    }
    fn answer(&mut self, ctx: u32, response: LocalResponse) -> bool {
        if self.gone.contains(&ctx) {
            return false;
        }
        self.answered.push((ctx, response));
        true
    }
    fn count_n(&mut self, counter: Counter, n: u64) {
        for _ in 0..n {
            self.counters.push(counter);
        }
    }
    fn count_rule(&mut self, stat: usize, n: u64) {
        *self.rule_counts.entry(stat).or_default() += n;
    }
    fn record(&mut self, histogram: Histogram, value: u64) {
        self.histograms.push((histogram, value));
    }
    fn report_failure(&mut self, failure: &BridgeFailure) {
        self.failures.push(failure.clone());
    }
    fn report_misconfigured(&mut self, refusal: &Misconfiguration) {
        self.misconfigured.push(refusal.clone());
    }
    fn redis_restarts(&mut self, bump: bool) -> Option<u64> {
        self.restarts += u64::from(bump);
        Some(self.restarts)
    }
    fn gauge_add(&mut self, gauge: Gauge, delta: i64) {
        match gauge {
            Gauge::BreakerOpen => self.breaker_open += delta,
            Gauge::WorkerTimers => self.timers += delta,
        }
    }
    fn report_breaker(&mut self, open: bool, why: &str) {
        self.breaker_log.push((open, why.to_string()));
    }
}

impl FakeHost {
    pub fn new() -> Self {
        FakeHost {
            now: Some(T0),
            ..Default::default()
        }
    }
    pub fn count_of(&self, counter: Counter) -> usize {
        self.counters.iter().filter(|c| **c == counter).count()
    }
    /// The per-rule stats the host was given, by name (`ratelimit_rule.all.minute.denied`).
    pub fn rule_counts(&self, c: &Config) -> Vec<(String, u64)> {
        let names = RuleStats::names(c);
        let mut counts: Vec<(String, u64)> = self
            .rule_counts
            .iter()
            .map(|(i, n)| (names[*i].clone(), *n))
            .collect();
        counts.sort();
        counts
    }
    pub fn last_token(&self) -> u32 {
        self.dispatched.last().map(|d| d.0).unwrap_or(0)
    }
    /// The number of requests in the decision call `i` (its ARGV[3]).
    pub fn batch_size(&self, i: usize) -> usize {
        let Some((_, call, _)) = self.dispatched.get(i) else {
            return 0;
        };
        let segments: Vec<&str> = call.path.split('/').collect();
        let number = |at: usize| segments.get(at).and_then(|s| s.parse().ok()).unwrap_or(0);
        // The head's first field: the number of requests.
        let requests = |at: usize| {
            segments
                .get(at)
                .and_then(|s| s.split(crate::bridge::FIELD_SEPARATOR).next())
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        };
        match number(3) {
            // A call for the slots of one node: the first key, their number K, the map flag,
            // the other K - 1 keys, the clock, the deadline, the head.
            0 => requests(8 + number(5)),
            declared => requests(4 + declared + 2),
        }
    }
    pub fn statuses(&self) -> Vec<(u32, u16)> {
        self.answered.iter().map(|(c, r)| (*c, r.status)).collect()
    }

    /// Drops what was recorded (a long run keeps the host's memory flat).
    pub fn clear_log(&mut self) {
        self.dispatched.clear();
        self.resumed.clear();
        self.answered.clear();
        self.counters.clear();
        self.histograms.clear();
        self.failures.clear();
        self.misconfigured.clear();
        self.breaker_log.clear();
        self.tick_changes.clear();
    }
}
