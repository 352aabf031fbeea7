//! The engine's view of Envoy: every host call the engine asks for, through
//! `proxy_wasm::hostcalls` (whose `Result`s are handled).

use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use ratelimit_core::config::Bridge;
use ratelimit_core::response::LocalResponse;
use ratelimit_core::{BridgeFailure, BridgeRequest, Counter, Gauge, Histogram, Host};

use crate::{shared_counter, Worker, REDIS_RESTARTS_KEY};

/// The engine's view of Envoy during one callback of context `home`.
pub(crate) struct EnvoyHost<'a> {
    pub(crate) worker: &'a Worker,
    pub(crate) home: u32,
    /// The context host calls act on now (`set_effective_context`).
    pub(crate) effective: u32,
}

impl EnvoyHost<'_> {
    /// A step skipped because the engine was busy: counted, and logged at most once per
    /// interval with the number of lines held back.
    pub(crate) fn report_busy(&mut self, what: &str) {
        self.count(Counter::EngineBusy);
        let now = self.now_unix_ns().unwrap_or(0);
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
        match hostcalls::set_effective_context(ctx) {
            Ok(()) => {
                self.effective = ctx;
                true
            }
            Err(_) => false,
        }
    }
}

impl Host for EnvoyHost<'_> {
    fn now_unix_ns(&self) -> Option<u128> {
        let now = hostcalls::get_current_time().ok()?;
        Some(now.duration_since(UNIX_EPOCH).ok()?.as_nanos())
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
        hostcalls::dispatch_http_call(
            &bridge.cluster,
            headers,
            request.body.as_deref(),
            vec![],
            timeout,
        )
        .map_err(|status| {
            format!(
                "dispatch_http_call to cluster {}: {status:?}",
                bridge.cluster
            )
        })
    }

    fn wake(&mut self) -> bool {
        match self.worker.wake_queue {
            Some(queue) => hostcalls::enqueue_shared_queue(queue, Some(b"w")).is_ok(),
            None => false,
        }
    }

    fn resume(&mut self, ctx: u32) -> bool {
        self.act_on(ctx) && hostcalls::resume_http_request().is_ok()
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
        match hostcalls::send_http_response(
            u32::from(response.status),
            headers,
            Some(response.body.as_bytes()),
        ) {
            Ok(()) => true,
            Err(status) => {
                log::warn!(
                    "cannot send the local {} reply: {status:?}",
                    response.status
                );
                false
            }
        }
    }

    fn count_n(&mut self, counter: Counter, n: u64) {
        if let Some(Some(id)) = self.worker.counters.get(counter as usize) {
            // A failed increment loses counts; nothing to do about it on the request path.
            let _ = hostcalls::increment_metric(*id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    fn count_rule(&mut self, stat: usize, n: u64) {
        if let Some(Some(id)) = self.worker.rule_counters.get(stat) {
            let _ = hostcalls::increment_metric(*id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    fn record(&mut self, histogram: Histogram, value: u64) {
        if let Some(Some(id)) = self.worker.histograms.get(histogram as usize) {
            let _ = hostcalls::record_metric(*id, value);
        }
    }

    fn gauge_add(&mut self, gauge: Gauge, delta: i64) {
        if let Some(Some(id)) = self.worker.gauges.get(gauge as usize) {
            let _ = hostcalls::increment_metric(*id, delta);
        }
    }

    fn report_breaker(&mut self, open: bool, why: &str) {
        if open {
            log::warn!("bridge circuit breaker open, requests follow the failure policy without a call: {why}");
        } else {
            log::info!("bridge circuit breaker closed: {why}");
        }
    }

    fn redis_restarts(&mut self, bump: bool) -> Option<u64> {
        shared_counter(REDIS_RESTARTS_KEY, u64::from(bump))
    }

    fn report_failure(&mut self, failure: &BridgeFailure) {
        let now = self.now_unix_ns().unwrap_or(0);
        if let Some(suppressed) = self.worker.failure_log.borrow_mut().admit(now) {
            log::warn!(
                "bridge failure, failure policy applied: {failure} ({suppressed} similar lines suppressed)"
            );
        }
    }
}
