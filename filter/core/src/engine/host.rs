//! What the engine asks of its host (Envoy through proxy-wasm, or a fake in tests), and what
//! it answers for a request's own callback.

use std::time::Duration;

use crate::bridge::{BridgeFailure, BridgeRequest, Misconfiguration};
use crate::config::Bridge;
use crate::metrics::{Counter, Gauge, Histogram};
use crate::response::LocalResponse;

/// What the engine needs from its host (Envoy through proxy-wasm, or a fake in tests).
pub trait Host {
    /// Unix time in nanoseconds.
    fn now_unix_ns(&self) -> Option<u128>;
    /// Starts an HTTP call to the bridge; its reply comes to `Engine::on_reply` with the
    /// returned token.
    fn dispatch(
        &mut self,
        bridge: &Bridge,
        request: &BridgeRequest,
        timeout: Duration,
    ) -> Result<u32, String>;
    /// Asks for `Engine::on_wakeup` soon, from the worker's root context. False if it cannot.
    fn wake(&mut self) -> bool;
    /// Asks for `Engine::on_tick` every `period` from the worker's root context, or for no
    /// tick at all (`Duration::ZERO`). False if the host refuses.
    fn tick_every(&mut self, period: Duration) -> bool;
    /// Lets the paused request `ctx` go on upstream. False if that stream is gone.
    fn resume(&mut self, ctx: u32) -> bool;
    /// Answers request `ctx` locally. False if that stream is gone.
    fn answer(&mut self, ctx: u32, response: LocalResponse) -> bool;
    /// Adds `n` to a counter.
    fn count_n(&mut self, counter: Counter, n: u64);
    /// Adds `n` to per-rule stat `stat` (numbered by `RuleStats`).
    fn count_rule(&mut self, stat: usize, n: u64);
    fn count(&mut self, counter: Counter) {
        self.count_n(counter, 1);
    }
    fn record(&mut self, histogram: Histogram, value: u64);
    /// Adds `delta` (possibly negative) to a gauge shared by the workers.
    fn gauge_add(&mut self, gauge: Gauge, delta: i64);
    /// The circuit breaker opened (`open`) or closed, and why; the host logs it.
    fn report_breaker(&mut self, open: bool, why: &str);
    /// How many times any worker of this Envoy saw Redis lose its scripts (a restart);
    /// `bump` counts one more first. None if the host cannot share it.
    fn redis_restarts(&mut self, bump: bool) -> Option<u64>;
    /// A bridge failure the failure policy handled; the host logs it (rate-limited).
    fn report_failure(&mut self, failure: &BridgeFailure);
    /// A call the bridge refused (a setting is wrong, see [`Misconfiguration`]); the host logs
    /// it as an error naming the cause and the setting (rate-limited per cause).
    fn report_misconfigured(&mut self, refusal: &Misconfiguration);
}

/// What the host should do with the request headers it is processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    Pause,
}
