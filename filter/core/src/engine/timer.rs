//! The worker's timer: asked for while the engine has work and stopped once it is idle, and
//! what each tick does (lateness measured, hung calls seen, probes, give-backs and
//! settlements sent, stats handed over). Apart from the requests and replies that drive
//! everything else: it is the one path time alone starts.

use std::time::Duration;

use super::host::Host;
use super::{Engine, IDLE_TICKS, TICK};
use crate::config::Config;
use crate::metrics::{Counter, Gauge};
use crate::time::UnixNs;

impl Engine {
    /// Whether the worker needs its timer: requests wait or calls are out (their deadlines,
    /// a hang to see), the breaker is open (its probes), leases hold units (given back when
    /// they end) or give-backs wait, settlements or releases wait for a call, or stats wait
    /// to be handed over. Nothing else the engine holds changes with time alone: the deny
    /// cache and the local states expire as they are read.
    pub fn needs_tick(&self) -> bool {
        self.queue.load() != (0, 0)
            || self.breaker.is_open()
            || self.leases.pending()
            || self.settlements.waiting() > 0
            || !self.tally.is_empty()
    }

    /// Whether the host's timer runs (as the engine asked for it).
    pub fn ticking(&self) -> bool {
        self.ticking
    }

    /// At the end of each callback: the timer is asked for if work is left and it is off.
    /// One host call when it starts, none while it runs.
    pub(super) fn keep_ticking(&mut self, host: &mut impl Host) {
        if !self.needs_tick() {
            return;
        }
        self.idle_ticks = 0;
        if self.ticking {
            return;
        }
        let now = self.clock_or_last(host);
        if host.tick_every(TICK) {
            self.ticking = true;
            self.lag.start(now);
            host.gauge_add(Gauge::WorkerTimers, 1);
        }
    }

    /// At the end of each tick: the timer stops after [`IDLE_TICKS`] in a row found nothing
    /// to do (the next work starts it again).
    fn stop_ticking_if_idle(&mut self, host: &mut impl Host) {
        if self.needs_tick() {
            self.idle_ticks = 0;
            return;
        }
        self.idle_ticks = self.idle_ticks.saturating_add(1);
        if self.idle_ticks >= IDLE_TICKS && host.tick_every(Duration::ZERO) {
            self.ticking = false;
            self.idle_ticks = 0;
            self.lag.stop();
            host.gauge_add(Gauge::WorkerTimers, -1);
        }
    }

    /// A request comes while the timer is off: what its ticks would have done meanwhile
    /// that a decision can depend on, done first. The Redis restarts other workers saw
    /// (the deny cache must not answer for a Redis that lost its state) and the leases that
    /// ended (their units go back at the next tick; idle keys make room for new ones).
    pub(super) fn catch_up(&mut self, host: &mut impl Host, now: UnixNs) {
        if host
            .redis_restarts(false)
            .is_some_and(|n| self.refusals.sync(n))
        {
            host.count(Counter::DenyCacheResets);
        }
        if !self.leases.is_empty() {
            self.leases.expire(now);
        }
    }

    /// The worker's timer (every [`TICK`] while there is work, see [`Engine::needs_tick`]), in
    /// the root context: measures how late the worker runs, sees calls past their timeout,
    /// sends the breaker's probe, the give-backs and the settlements, learns of Redis
    /// restarts other workers saw, hands the stats over; and stops itself once idle.
    pub fn on_tick(&mut self, config: &Config, host: &mut impl Host) {
        if !self.ticking {
            // A tick means the timer runs, whatever the engine last asked.
            self.ticking = true;
            host.gauge_add(Gauge::WorkerTimers, 1);
        }
        if let Some(now) = self.clock(host) {
            let late_ms = self.lag.tick(now) / 1_000_000;
            if late_ms > 0 {
                host.count_n(
                    Counter::WorkerLagMs,
                    u64::try_from(late_ms).unwrap_or(u64::MAX),
                );
            }
            self.watch_calls(config, host, self.lag.moment(now));
            // What a moving slot held back goes again; a call given up with the breaker off
            // makes room for what waits.
            self.queue.unpark();
            self.dispatch_ready(config, host, None);
            if let Some((request, timeout)) = self.breaker.probe(config, now) {
                let probe = host.dispatch(&config.bridge, &request, timeout).ok();
                self.breaker.probe_sent(config.breaker, probe, now);
            }
            self.leases.expire(now);
            // Not while the breaker is open: the units wait for the first tick after it closes.
            if !self.breaker.is_open() {
                self.give_back(config, host, now);
            }
            self.send_settlements(config, host);
        }
        if host
            .redis_restarts(false)
            .is_some_and(|n| self.refusals.sync(n))
        {
            host.count(Counter::DenyCacheResets);
        }
        self.tally.flush(host);
        self.stop_ticking_if_idle(host);
    }
}
