//! The engine's view of Envoy: what a worker holds on the host side (its metric ids, log
//! throttles and wake-up queue), and every host call the engine asks for, made through
//! [`crate::wasm_host`].

use std::cell::RefCell;
use std::time::Duration;

use proxy_wasm::types::MetricType;
use ratelimit_core::bridge::{MisconfigCause, Misconfiguration};
use ratelimit_core::config::Bridge;
use ratelimit_core::response::LocalResponse;
use ratelimit_core::time::UnixNs;
use ratelimit_core::{
    BridgeFailure, BridgeRequest, Config, Counter, Gauge, Histogram, Host, LogThrottle, RuleStats,
};

use crate::wasm_host;

/// At most one failure log line per worker in this interval; the rest are counted.
const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Shared data (process-wide) that hands each worker a number, for a wake-up queue of its own.
const WORKER_SEQUENCE_KEY: &str = "ratelimit.worker_sequence";
/// Shared data: how many times a worker saw Redis lose its scripts (a restart).
const REDIS_RESTARTS_KEY: &str = "ratelimit.redis_restarts";

/// A worker's host side.
pub(crate) struct WorkerHost {
    /// Metric ids, by the position of the stat in `Counter::ALL` / `Histogram::ALL` /
    /// `Gauge::ALL`; per-rule counter ids numbered by `RuleStats`.
    counters: Vec<Option<u32>>,
    rule_counters: Vec<Option<u32>>,
    histograms: Vec<Option<u32>>,
    gauges: Vec<Option<u32>>,
    failure_log: RefCell<LogThrottle>,
    /// Lines about a busy engine, throttled apart from failures.
    busy_log: RefCell<LogThrottle>,
    /// Lines about a bridge that refuses the filter, one throttle per cause (by its place in
    /// `MisconfigCause::ALL`): an outage's lines never hold back a misconfiguration's.
    misconfigured_log: RefCell<[LogThrottle; MisconfigCause::ALL.len()]>,
    /// The queue whose `on_queue_ready` runs the engine from the root context.
    pub(crate) wake_queue: Option<u32>,
}

impl WorkerHost {
    /// Defines the stats of `config` and registers the wake-up queue. The timer is started
    /// by the engine when it has work ([`Host::tick_every`]).
    pub(crate) fn new(config: &Config) -> Self {
        let define = |kind: MetricType, names: &mut dyn Iterator<Item = String>| {
            names
                .map(|name| wasm_host::define_metric(kind, &name))
                .collect()
        };
        WorkerHost {
            counters: define(
                MetricType::Counter,
                &mut Counter::ALL.iter().map(|c| c.name().to_string()),
            ),
            rule_counters: define(
                MetricType::Counter,
                &mut RuleStats::names(config).into_iter(),
            ),
            histograms: define(
                MetricType::Histogram,
                &mut Histogram::ALL.iter().map(|h| h.name().to_string()),
            ),
            gauges: define(
                MetricType::Gauge,
                &mut Gauge::ALL.iter().map(|g| g.name().to_string()),
            ),
            failure_log: RefCell::new(LogThrottle::new(FAILURE_LOG_INTERVAL)),
            busy_log: RefCell::new(LogThrottle::new(FAILURE_LOG_INTERVAL)),
            misconfigured_log: RefCell::new(
                MisconfigCause::ALL.map(|_| LogThrottle::new(FAILURE_LOG_INTERVAL)),
            ),
            wake_queue: register_wake_queue(),
        }
    }

    /// The engine's view of Envoy during one callback of context `home`.
    pub(crate) fn during(&self, home: u32) -> EnvoyHost<'_> {
        EnvoyHost {
            worker: self,
            home,
            effective: home,
        }
    }
}

/// A queue this worker alone consumes: a name no other worker registers, numbered through
/// shared data, since a second registration of a name takes it over.
fn register_wake_queue() -> Option<u32> {
    let n = wasm_host::shared_counter(WORKER_SEQUENCE_KEY, 1)?;
    wasm_host::register_queue(&format!("ratelimit.wake.{n}"))
}

/// The engine's view of Envoy during one callback of context `home`.
pub(crate) struct EnvoyHost<'a> {
    worker: &'a WorkerHost,
    home: u32,
    /// The context host calls act on now (`set_effective_context`).
    effective: u32,
}

impl EnvoyHost<'_> {
    /// The clock log lines are throttled by: Envoy's, converted once here (the epoch if it
    /// cannot tell).
    fn log_clock(&self) -> UnixNs {
        UnixNs::from_ns(self.now_unix_ns().unwrap_or(0))
    }

    /// A step skipped because the engine was busy: counted, and logged at most once per
    /// interval with the number of lines held back.
    pub(crate) fn report_busy(&mut self, what: &str) {
        self.count(Counter::EngineBusy);
        let now = self.log_clock();
        let admitted = match self.worker.busy_log.try_borrow_mut() {
            Ok(mut log) => log.admit(now),
            Err(_) => None,
        };
        if let Some(suppressed) = admitted {
            log::warn!(
                "the worker's engine was busy in another callback, {what} skipped ({suppressed} similar lines suppressed)"
            );
        }
    }

    /// Makes `ctx` the context the next host calls act on; false if it is gone.
    fn act_on(&mut self, ctx: u32) -> bool {
        if self.effective == ctx {
            return true;
        }
        let acting = wasm_host::act_on(ctx);
        if acting {
            self.effective = ctx;
        }
        acting
    }

    fn add(ids: &[Option<u32>], index: usize, delta: i64) {
        if let Some(Some(id)) = ids.get(index) {
            wasm_host::increment_metric(*id, delta);
        }
    }
}

impl Host for EnvoyHost<'_> {
    fn now_unix_ns(&self) -> Option<u128> {
        wasm_host::now_unix_ns()
    }

    fn dispatch(
        &mut self,
        bridge: &Bridge,
        request: &BridgeRequest,
        timeout: Duration,
    ) -> Result<u32, String> {
        // The call belongs to the context that makes it: the callback's own, not a stream
        // resolved just before.
        let home = self.home;
        if !self.act_on(home) {
            return Err("the calling context is gone".to_string());
        }
        let headers = request.headers(bridge);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        wasm_host::dispatch(&bridge.cluster, headers, request.body.as_deref(), timeout)
    }

    fn wake(&mut self) -> bool {
        self.worker.wake_queue.is_some_and(wasm_host::enqueue)
    }

    fn tick_every(&mut self, period: Duration) -> bool {
        wasm_host::set_tick_period(period)
    }

    fn resume(&mut self, ctx: u32) -> bool {
        self.act_on(ctx) && wasm_host::resume_request()
    }

    fn answer(&mut self, ctx: u32, response: LocalResponse) -> bool {
        if !self.act_on(ctx) {
            return false;
        }
        let headers: Vec<(&str, &str)> = response
            .headers
            .iter()
            .map(|(n, v)| (*n, v.as_str()))
            .collect();
        let body = response.body.as_bytes();
        wasm_host::send_response(response.status, response.grpc_status, headers, body)
    }

    fn count_n(&mut self, counter: Counter, n: u64) {
        let delta = i64::try_from(n).unwrap_or(i64::MAX);
        Self::add(&self.worker.counters, counter as usize, delta);
    }

    fn count_rule(&mut self, stat: usize, n: u64) {
        let delta = i64::try_from(n).unwrap_or(i64::MAX);
        Self::add(&self.worker.rule_counters, stat, delta);
    }

    fn record(&mut self, histogram: Histogram, value: u64) {
        if let Some(Some(id)) = self.worker.histograms.get(histogram as usize) {
            wasm_host::record_metric(*id, value);
        }
    }

    fn gauge_add(&mut self, gauge: Gauge, delta: i64) {
        Self::add(&self.worker.gauges, gauge as usize, delta);
    }

    fn report_breaker(&mut self, open: bool, why: &str) {
        if open {
            log::warn!("bridge circuit breaker open, requests follow the failure policy without a call: {why}");
        } else {
            log::info!("bridge circuit breaker closed: {why}");
        }
    }

    fn redis_restarts(&mut self, bump: bool) -> Option<u64> {
        wasm_host::shared_counter(REDIS_RESTARTS_KEY, u64::from(bump))
    }

    fn report_failure(&mut self, failure: &BridgeFailure) {
        let now = self.log_clock();
        let admitted = match self.worker.failure_log.try_borrow_mut() {
            Ok(mut log) => log.admit(now),
            Err(_) => None,
        };
        if let Some(suppressed) = admitted {
            log::warn!(
                "bridge failure, failure policy applied: {failure} ({suppressed} similar lines suppressed)"
            );
        }
    }

    fn report_misconfigured(&mut self, refusal: &Misconfiguration) {
        let now = self.log_clock();
        let cause = MisconfigCause::ALL
            .iter()
            .position(|c| *c == refusal.cause)
            .unwrap_or(0);
        let admitted = match self.worker.misconfigured_log.try_borrow_mut() {
            Ok(mut logs) => logs.get_mut(cause).and_then(|log| log.admit(now)),
            Err(_) => None,
        };
        if let Some(suppressed) = admitted {
            log::error!(
                "bridge misconfigured, the rate limiter is not deciding: requests it refuses follow their failure policy until this is fixed: {refusal} ({suppressed} similar lines suppressed)"
            );
        }
    }
}
