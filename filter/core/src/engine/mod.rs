//! One decision engine per worker (per wasm VM, owned by the root context). Request contexts
//! hand it their plans; it answers what it can at once (a bad request, a request its leases
//! or its deny cache can answer) and queues the rest. Whatever waits while a call is in flight
//! goes together in the next call (group commit, no timer: a request that finds the worker
//! idle is sent at once), and one `EVALSHA` decides the whole batch, each request all or
//! nothing over its own limits, in arrival order.
//!
//! Calls are started from the root context (through [`Host::wake`]), so their replies come to
//! the root and are never lost with the stream of whichever request happened to start them.
//!
//! The engine coordinates parts that each hold one concept: the [`queue`] (waiting requests
//! and calls in flight), the [`breaker`], the [`refusals`] (deny cache and Redis restarts),
//! the [`leases`] (their whole ask cycle), the cluster [`splits`], the [`policy`] (what an
//! outcome does, the `local` failure mode), the [`tally`] (stats), the [`delivery`] of
//! verdicts to streams, and the [`settlements`] of usage limits once their response is read
//! (with the stream-facing calls after the decision: headers, meter, end of stream). A call
//! of either kind that finds the decision code missing in Redis goes through one reload
//! ([`script`]).
//!
//! The engine's own work is split by what starts it: a request (here), the calls it sends
//! ([`calls`]), their replies ([`replies`]), the worker's timer ([`timer`]), and a stream's
//! life after its decision ([`streams`]).

use std::time::Duration;

use crate::bridge::BridgeFailure;
use crate::config::Config;
use crate::metrics::Counter;
use crate::request::memo::PlanMemo;
use crate::request::plan::{plan_memo, Plan};
use crate::request::view::RequestView;
use crate::response::{self, Headers, Protocol};
use crate::time::UnixNs;
use breaker::Breaker;
use delivery::Delivery;
use holds::Holds;
use lag::Lag;
use leases::Leases;
use nodes::Nodes;
use policy::{serve_locally, Conclusion, Policy};
use queue::{Origin, Outcome, Queue, Sent, Waiting};
use refusals::Refusals;
use settlements::Settlements;
use splits::Splits;
use tally::Tally;

pub use host::{Host, Verdict};

mod breaker;
mod calls;
mod delivery;
pub mod holds;
mod host;
pub mod lag;
pub mod leases;
pub mod local;
pub mod nodes;
mod packing;
mod policy;
mod queue;
pub mod refusals;
mod replies;
mod script;
pub mod settlements;
mod sightings;
pub mod slots;
pub mod splits;
mod streams;
mod tally;
mod timer;

/// A call's path stays within this many bytes (Webdis's shipped `http_max_request_size` is
/// 64 KiB); a batch stops growing before it would pass it. The configuration is refused if a
/// single request could need more.
pub const MAX_CALL_BYTES: usize = crate::bounds::MAX_CALL_PATH_BYTES;

/// The period of each worker's timer ([`Engine::on_tick`]) while it has work: a hung call is
/// seen at most this long after its timeout when no request comes to see it first, and how
/// late the timer fires measures how late the worker runs ([`lag`]), while a busy worker pays
/// only 40 callbacks a second.
pub const TICK: Duration = Duration::from_millis(25);

/// Ticks in a row that find nothing to do before the timer stops (100 ms): an idle worker
/// costs no callback at all, and a worker whose requests come less than 100 ms apart keeps
/// its timer rather than stopping and starting it (two host calls each) between them.
pub const IDLE_TICKS: u32 = 4;

#[derive(Debug, Default)]
pub struct Engine {
    queue: Queue,
    wake_pending: bool,
    breaker: Breaker,
    /// How late the worker runs: request deadlines count its own time.
    lag: Lag,
    /// The last time the host told, for [`Engine::clock_or_last`].
    last_now: UnixNs,
    refusals: Refusals,
    leases: Leases,
    splits: Splits,
    policy: Policy,
    tally: Tally,
    delivery: Delivery,
    /// Usage limits: the streams let through, and the settlements to send.
    settlements: Settlements,
    /// Concurrency limits: the holds of this worker's streams.
    holds: Holds,
    /// Redis Cluster: which slots share a master, as a node last said.
    nodes: Nodes,
    /// Decision replies so far: a waiting request is asked about leases and refusals again
    /// only if one came since it was last asked (`Waiting::checked`).
    replies: u64,
    /// Counts requests, so that sharded limits are spent from each shard in turn.
    turn: u64,
    /// Recent identities' Redis keys (bounded), for this engine's configuration.
    memo: PlanMemo,
    /// Whether the host's timer runs (asked for with [`Host::tick_every`]), and how many
    /// ticks in a row found nothing to do.
    ticking: bool,
    idle_ticks: u32,
}

impl Engine {
    /// A new engine for `config` (a new configuration starts with an empty deny cache).
    pub fn new(config: &Config) -> Self {
        Engine {
            refusals: Refusals::new(config.deny_cache_entries),
            tally: Tally::new(config),
            ..Default::default()
        }
    }

    /// The host's time, remembered: its Unix ns become a [`UnixNs`] here, for the whole engine.
    /// The one rule for a host that cannot tell it: what needs the time to decide (an
    /// admission, a batch, settlements) fails by policy or waits, and bookkeeping that only
    /// dates an event (a reply, the breaker, a stream's end) takes the last time it could
    /// ([`Engine::clock_or_last`]).
    fn clock(&mut self, host: &impl Host) -> Option<UnixNs> {
        let now = UnixNs::from_ns(host.now_unix_ns()?);
        self.last_now = now;
        Some(now)
    }

    /// The host's time, or the last it told.
    fn clock_or_last(&mut self, host: &impl Host) -> UnixNs {
        self.clock(host).unwrap_or(self.last_now)
    }

    /// Requests waiting for a call, and calls in flight (for tests and logs).
    pub fn load(&self) -> (usize, usize) {
        self.queue.load()
    }

    /// Request headers of `ctx` arrived (its own callback is running).
    pub fn on_request(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        ctx: u32,
        view: &dyn RequestView,
    ) -> Verdict {
        self.delivery.begin(ctx);
        if let Some(conclusion) = self.admit(config, host, ctx, view) {
            self.delivery.deliver(host, ctx, conclusion, None);
        }
        self.keep_ticking(host);
        self.delivery.end()
    }

    /// What is decided for a request at once (None: it waits for a call).
    fn admit(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        ctx: u32,
        view: &dyn RequestView,
    ) -> Option<Conclusion> {
        self.turn = self.turn.wrapping_add(1);
        let mut plan = match plan_memo(config, view, self.turn, &mut self.memo) {
            Ok(plan) => plan,
            Err(bad) => {
                host.count(Counter::BadRequests);
                let answer = response::bad_request(Protocol::of(view), &bad.0);
                return Some(Conclusion::Answer(answer));
            }
        };
        // Measurement only (feature `phase-plan-only`, built by `make bench`, never shipped):
        // the plan's cost alone (made in full, not optimised away), then continue.
        if cfg!(feature = "phase-plan-only") || plan.checks.is_empty() {
            std::hint::black_box(&plan);
            return Some(Conclusion::Resume(Headers::new()));
        }
        // Read now: a refusal may come later, from a bridge reply.
        let protocol = Protocol::of(view);
        self.delivery.answer_in(ctx, protocol);
        let Some(now) = self.clock(host) else {
            let outcome = Outcome::Failed(BridgeFailure::Clock);
            let conclusion = self.conclude(config, host, ctx, &plan, outcome, None);
            self.tally.flush(host); // the per-rule counts with the global ones
            return Some(conclusion);
        };
        if !self.ticking {
            self.catch_up(host, now);
        }
        let at = self.lag.moment(now);
        let parts = (&mut self.leases, &self.refusals, &mut self.tally);
        if let Some(conclusion) = serve_locally(config, parts, (&plan, protocol), now) {
            // Served from leases: the next lease is asked for before these run out, so the
            // requests after it do not wait at the boundary (sent like a request, from the
            // root; not while the breaker is open).
            let leased = matches!(conclusion, Conclusion::Resume(_)) && !self.breaker.is_open();
            let ticket = leased.then(|| self.leases.prefetch(config, &plan, now));
            if let Some(ticket) = ticket.flatten() {
                host.count(Counter::LeasePrefetches);
                let origin = Origin::Prefetch;
                self.queue
                    .push(Waiting::new(config, origin, plan, at, Some(ticket), None));
                self.wake(config, host, Some(ctx));
            }
            return Some(conclusion);
        }
        self.watch_calls(config, host, at);
        if self.breaker.is_open() {
            let outcome = Outcome::Failed(BridgeFailure::BreakerOpen);
            let conclusion = self.conclude(config, host, ctx, &plan, outcome, None);
            self.tally.flush(host);
            return Some(conclusion);
        }
        if plan.takes_holds() {
            self.holds.admit(ctx, &mut plan);
        }
        let groups = slots::groups(config, &plan);
        if groups.len() > 1 {
            // Redis Cluster: keys on several slots: one part per slot, each waits for a call.
            for part in self
                .splits
                .start(config, ctx, plan, at, groups, self.replies)
            {
                self.queue.push(part);
            }
            self.wake(config, host, Some(ctx));
            return None;
        }
        let lease = self.leases.ticket(&plan, now);
        let (origin, checked) = (Origin::Stream(ctx), Some(self.replies));
        self.queue
            .push(Waiting::new(config, origin, plan, at, lease, checked));
        if self.queue.only() {
            // An idle worker: this request alone goes at once, from its own context (no hop
            // through the root). Only its own verdict rides on the call.
            self.dispatch_ready(config, host, Some(ctx));
        } else {
            self.wake(config, host, Some(ctx));
        }
        None
    }

    /// Where a waiting request's outcome goes: its lease ticket, then its stream, or (one
    /// part of a split request) the split. `sent`: when its call was sent, if it was.
    fn resolve(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        mut member: Waiting,
        mut outcome: Outcome,
        sent: Option<Sent>,
        now: UnixNs,
    ) {
        if let Some(ticket) = member.lease.take() {
            let decided = outcome.decision_mut().zip(sent.map(|s| s.at_ns));
            if self
                .leases
                .redeem(ticket, &member.plan, decided, config.clock_skew)
            {
                host.count(Counter::LeaseGrants);
            }
        }
        let (ctx, arrived_ns, conclusion) = match member.origin {
            Origin::Stream(ctx) => {
                let conclusion = self.conclude(config, host, ctx, &member.plan, outcome, sent);
                (ctx, member.arrived_ns, conclusion)
            }
            // No stream to answer; a refusal still tells the next prefetch not to go.
            Origin::Prefetch => return self.refusals.remember(&member.plan, &outcome, sent),
            Origin::Part { split, part, .. } => {
                let epoch = self.refusals.epoch();
                let Some(done) = self.splits.part_decided(split, part, outcome, sent, epoch) else {
                    return; // parts still out, or its stream is gone
                };
                let ctx = done.split.ctx;
                let conclusion =
                    self.conclude(config, host, ctx, &done.plan, done.outcome, done.sent);
                if matches!(conclusion, Conclusion::Answer(_)) {
                    self.refund_split(config, host, &done.split, now);
                }
                (done.split.ctx, done.split.arrived_ns, conclusion)
            }
        };
        self.delivery
            .deliver(host, ctx, conclusion, Some((arrived_ns, now)));
    }

    /// What the policy makes of `outcome` for stream `ctx`, a refusal (from a call sent at
    /// `sent`) remembered; a request let through waits for its usage limits' response.
    fn conclude(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        ctx: u32,
        plan: &Plan,
        outcome: Outcome,
        sent: Option<Sent>,
    ) -> Conclusion {
        self.refusals.remember(plan, &outcome, sent);
        let charged = matches!(&outcome, Outcome::Decided(d) if d.allowed);
        if !self.holds.is_empty() {
            let maybe_held = matches!(&outcome, Outcome::Failed(f) if f.may_have_run());
            let releases = self.holds.decided(ctx, charged, maybe_held);
            self.release(host, releases);
        }
        let protocol = self.delivery.protocol(ctx);
        let conclusion = self.policy.conclude(
            config,
            host,
            &mut self.tally,
            (plan, self.last_now, protocol),
            outcome,
        );
        if config.metered && matches!(conclusion, Conclusion::Resume(_)) {
            self.settlements
                .admitted(config, ctx, plan, charged, &mut self.tally);
        }
        conclusion
    }

    /// Asks the root to send what waits (once), when there is room for a call; if the root cannot
    /// be reached, sends from the request context `from` (if any) rather than not at all.
    fn wake(&mut self, config: &Config, host: &mut impl Host, from: Option<u32>) {
        if !self.queue.ready(config.batch.max_in_flight) || self.wake_pending {
            return;
        }
        // Redis Cluster: every waiting request's master has its call out; its reply sends
        // them (a wake-up would find nothing to send).
        if config.redis_cluster && self.front(config, self.last_now).is_none() {
            return;
        }
        if host.wake() {
            self.wake_pending = true;
        } else if from.is_some() {
            self.dispatch_ready(config, host, from);
        }
    }

    /// The wake-up asked for with [`Host::wake`] (the root context is running).
    pub fn on_wakeup(&mut self, config: &Config, host: &mut impl Host) {
        self.wake_pending = false;
        self.dispatch_ready(config, host, None);
        if self.settlements.gives_back_now() {
            self.send_settlements(config, host);
        }
        self.tally.flush(host);
        self.keep_ticking(host);
    }
}

#[cfg(test)]
mod tests;
