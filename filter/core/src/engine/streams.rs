//! A stream's life after its decision, as the adapter sees it: the rate-limit headers it was
//! allowed with, the meter of its usage limits and what their usage came to, and its end.

use super::host::Host;
use super::Engine;
use crate::bridge::BridgeFailure;
use crate::config::Config;
use crate::decision::Settlement;
use crate::metering::{UsageCharge, UsageMeter};
use crate::response::Headers;

impl Engine {
    /// Response headers of `ctx` are on their way: the rate-limit headers it was allowed with.
    pub fn take_headers(&mut self, ctx: u32) -> Option<Headers> {
        self.delivery.take_headers(ctx)
    }

    /// The usage limits stream `ctx` was let through on, to read its response for (taken;
    /// None: it has none, or was not let through).
    pub fn take_meter(&mut self, ctx: u32) -> Option<UsageMeter> {
        self.settlements.take_meter(ctx)
    }

    /// A response's usage limits came to `outcomes` (see [`UsageMeter::finish`]): counted,
    /// and their settlements sent from the root with its next decision call, or at its next
    /// tick; a give-back at once, from a wake-up of the root, when no settlement call is out
    /// (`Settlements::gives_back_now`). Callable from any context: nothing is sent from it.
    pub fn settle_usage(&mut self, host: &mut impl Host, outcomes: Vec<UsageCharge>) {
        self.settlements.finished(&mut self.tally, outcomes);
        self.hurry_give_backs(host);
        self.count_lost_settlements(host);
        self.tally.flush(host);
        self.keep_ticking(host);
    }

    /// Queues the releases of concurrency holds, sent from the root like settlements (a
    /// release is a give-back). Callable from any context.
    pub(super) fn release(&mut self, host: &mut impl Host, releases: Vec<Settlement>) {
        if releases.is_empty() {
            return;
        }
        for release in releases {
            self.settlements.push(release);
        }
        self.hurry_give_backs(host);
        self.count_lost_settlements(host);
    }

    /// Wakes the root to send a give-back now when no settlement call is out
    /// (`Settlements::gives_back_now`).
    fn hurry_give_backs(&mut self, host: &mut impl Host) {
        if self.settlements.gives_back_now() && !self.wake_pending && host.wake() {
            self.wake_pending = true;
        }
    }

    /// The stream of `ctx` ended: it no longer waits, and its headers are dropped. A call it
    /// is part of still decides the others (its own verdict goes nowhere) — unless the call
    /// was made from its context: that reply is lost with the stream, so the call's room is
    /// freed at once and any other request on it fails by policy.
    pub fn forget(&mut self, config: &Config, host: &mut impl Host, ctx: u32) {
        self.delivery.forget(ctx);
        self.splits.forget(ctx);
        self.settlements.forget(ctx);
        if !self.holds.is_empty() {
            let releases = self.holds.ended(ctx);
            self.release(host, releases);
            self.keep_ticking(host); // the releases go at the next tick at the latest
        }
        if self.queue.load() == (0, 0) {
            return; // nothing waits nor is in flight (most streams end so)
        }
        let (orphans, riders) = self.queue.forget(ctx, &mut self.leases);
        self.settlements
            .ridden(riders, Err(&BridgeFailure::Orphaned));
        if !orphans.is_empty() {
            let now = self.clock_or_last(host);
            self.fail(config, host, orphans, BridgeFailure::Orphaned, now, false);
        }
        self.wake(config, host, None);
    }
}
