//! The coordinator's calls to the bridge: batches of waiting requests (sent while there is room
//! for a call, their deadlines watched while they are out), what a failure or an open breaker
//! does to them, and the calls no request waits for: usage settlements, lease give-backs and
//! the refunds of a refused split.

use std::time::Duration;

use super::host::Host;
use super::lag::Moment;
use super::leases::Ticket;
use super::nodes::{NodeTag, FRONT_SCAN};
use super::queue::{Call, OnNode, Origin, Outcome, Sent, Waiting};
use super::settlements::{Settled, Settlements};
use super::splits::Split;
use super::{serve_locally, Engine, MAX_CALL_BYTES};
use crate::bridge::{
    BridgeFailure, BridgeReply, CallSize, DecideCall, LimitShape, NODE_CALL_EXTRA_BYTES,
};
use crate::config::Config;
use crate::decision::{Refund, Settlement};
use crate::metrics::{Counter, Gauge, Histogram};
use crate::slot::key_slot;
use crate::time::UnixNs;

impl Engine {
    /// Sends batches while there is room for a call and requests wait, from context `from` or root.
    pub(super) fn dispatch_ready(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        from: Option<u32>,
    ) {
        while self.queue.ready(config.batch.max_in_flight) {
            let Some(now) = self.clock(host) else {
                let members = self.queue.take_waiting();
                let last = self.last_now;
                return self.fail(config, host, members, BridgeFailure::Clock, last, false);
            };
            if from.is_some() && self.queue.calls() > 0 {
                break; // one call from a request context at most: the root sends the rest
            }
            let at = self.lag.moment(now);
            // Every waiting request's master has its calls in flight: they wait for a reply.
            let Some((members, on_node, node)) = self.next_batch(config, host, at) else {
                break;
            };
            if !members.is_empty() {
                let epoch = self.refusals.epoch();
                host.count(Counter::BridgeCalls);
                host.record(Histogram::BatchSize, members.len() as u64);
                // Settlements go with a call from the root (their outcome comes back to it),
                // in the room the batch left, on its slot; not with a call for several slots,
                // whose keys Redis checks one by one (a settlement of several limits could be
                // refused after its first).
                let riders = match (from, on_node) {
                    (None, None) => self.riders(config, host, &members),
                    _ => Vec::new(),
                };
                let sent = Sent { at_ns: now, epoch };
                let mut call = Call::decide(config, members, sent, from, riders, on_node);
                call.node = node;
                self.send(config, host, call, now);
            }
        }
    }

    /// The settlements that fit in the call deciding `members`: on its slot (a call holds one
    /// slot's keys), within [`MAX_CALL_BYTES`] with the batch.
    fn riders(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        members: &[Waiting],
    ) -> Vec<Settlement> {
        if self.settlements.waiting() == 0 {
            return Vec::new();
        }
        let size = members.iter().fold(CallSize::batch(), |size, m| {
            let lease = m.lease.as_ref().map(Ticket::requests);
            size.with_checks(&m.plan.checks, lease)
        });
        let slot = members
            .first()
            .and_then(|m| m.plan.checks.first())
            .map(|c| key_slot(c.key.as_bytes()))
            .filter(|_| config.redis_cluster);
        let mut bytes = 0;
        let mut count = 0;
        let riders = self.settlements.riders(|s| {
            if slot.is_some_and(|slot| key_slot(s.check.key.as_bytes()) != slot) {
                return false;
            }
            let more = size.limit_bytes(&LimitShape::settle(s));
            let fits = size.with_request(count + 1, bytes + more).bytes() <= MAX_CALL_BYTES;
            if fits {
                bytes += more;
                count += 1;
            }
            fits
        });
        let given_back = riders.iter().filter(|s| s.delta < 0);
        self.refusals.given_back(given_back.map(|s| &s.check));
        if !riders.is_empty() {
            host.count_n(Counter::UsageSettlementsRiding, riders.len() as u64);
        }
        riders
    }

    /// The next batch from the queue ([`Queue::next`]), how its call goes, and the master it
    /// goes to if the slot map knows it: on a Redis Cluster, for the slots of one node when
    /// the slot map knows the front's master (the call then carries every slot of that master)
    /// or when the call asks for the map; else for one slot. It starts with [`Engine::front`]
    /// (None: no request can go now).
    /// Requests past their deadline fail by policy. One that waited while a reply came is
    /// asked again about leases and refusals (that reply may have brought either), a prefetch
    /// about refusals; a part always goes.
    fn next_batch(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        at: Moment,
    ) -> Option<(Vec<Waiting>, Option<OnNode>, Option<NodeTag>)> {
        let now = at.wall_ns;
        let (start, front, tag) = self.front(config, now)?;
        let node = tag.map(|(_, node)| node);
        let mut batch = self.queue.batch_at(start, CallSize::batch().bytes(), node);
        let max = config.batch.max_requests;
        // A call for one node is a few bytes longer than the same call for one slot.
        let max_bytes = MAX_CALL_BYTES - NODE_CALL_EXTRA_BYTES;
        // Held apart while the loop answers requests (nothing it calls reads the map).
        let nodes = std::mem::take(&mut self.nodes);
        let node_of = |slot: u16| nodes.node_of(slot, now);
        while let Some((mut w, size)) = self.queue.next(&mut batch, max, max_bytes, node_of) {
            if w.deadline.passed(at) {
                let outcome = Outcome::Failed(BridgeFailure::Expired);
                self.resolve(config, host, w, outcome, None, now);
                continue;
            }
            if w.checked != Some(self.replies) {
                w.checked = Some(self.replies);
                let parts = (&mut self.leases, &self.refusals, &mut self.tally);
                match w.origin {
                    Origin::Stream(ctx) => {
                        let asked = (&w.plan, self.delivery.protocol(ctx));
                        if let Some(conclusion) = serve_locally(config, parts, asked, now) {
                            let waited = Some((w.arrived_ns, now));
                            w.leave(&mut self.leases);
                            self.delivery.deliver(host, ctx, conclusion, waited);
                            continue;
                        }
                    }
                    Origin::Prefetch if self.refusals.refuses(&w.plan, now) => {
                        w.leave(&mut self.leases);
                        continue;
                    }
                    Origin::Prefetch | Origin::Part { .. } => {}
                }
            }
            batch.join(w, size);
        }
        self.nodes = nodes;
        let slot = batch.slot();
        let members = batch.into_members();
        if !config.redis_cluster || front.is_none() || members.is_empty() {
            return Some((members, None, tag));
        }
        let several = members.iter().any(|m| m.slot != slot);
        let asks = self.nodes.ask(now);
        let on_node = (several || asks.is_some()).then_some(OnNode { asks });
        Some((members, on_node, tag))
    }

    /// The request the next call starts with: its place in the queue, its slot if calls
    /// may group it with others (Redis Cluster), and its master if the slot map knows it.
    /// The first whose master has fewer than [`super::nodes::CALLS_PER_NODE`] calls in
    /// flight, among the first [`FRONT_SCAN`]; None when there is none.
    pub(super) fn front(
        &self,
        config: &Config,
        now: UnixNs,
    ) -> Option<(usize, Option<u16>, Option<NodeTag>)> {
        // Sent back to a call of its own slot, or of a slot a node refused lately: one slot,
        // and no master known (it goes whatever is in flight).
        let grouped = |w: &Waiting| {
            w.slot.filter(|&slot| {
                config.redis_cluster && !w.declared && !self.nodes.doubted(slot, now)
            })
        };
        self.queue
            .waiting()
            .take(FRONT_SCAN)
            .enumerate()
            .map(|(i, w)| {
                let front = grouped(w);
                let tag = front.and_then(|slot| self.nodes.tag_of(slot, now));
                (i, front, tag)
            })
            .find(|&(_, _, tag)| !tag.is_some_and(|t| self.queue.node_busy(t)))
    }

    /// Sends `call` in its stage (its requests whose deadline passed meanwhile follow their
    /// policy; with none left it is not sent), with Envoy's timeout of it.
    pub(super) fn send(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        mut call: Call,
        now: UnixNs,
    ) {
        let at = self.lag.moment(now);
        let expired = call.take_expired(at);
        if !expired.is_empty() {
            self.fail(config, host, expired, BridgeFailure::Expired, now, false);
        }
        if call.members().next().is_none() {
            return;
        }
        match host.dispatch(
            &config.bridge,
            &call.request(config),
            call.envoy_timeout(config),
        ) {
            Ok(token) => {
                // A reply to a call sent again after a restart decides on the new state.
                call.sent.epoch = self.refusals.epoch();
                self.queue.in_flight(token, at, call);
            }
            Err(why) => {
                let failure = BridgeFailure::Dispatch(why);
                let (members, riders) = call.into_parts();
                self.settlements.ridden(riders, Err(&failure));
                self.fail(config, host, members, failure, now, true)
            }
        }
    }

    /// The calls in flight at `at`. A request whose deadline passed leaves its call and
    /// follows its policy (timed out); the call stays in flight, taking its room. A call
    /// without an answer for its whole timeout (in the worker's own time, so the worker's own
    /// lateness does not count) is the bridge's failure: while other requests wait it opens
    /// the breaker (they stop waiting at once); otherwise it is given up, one failure in the
    /// breaker's run. A call answered within its timeout, however slowly, is no failure.
    pub(super) fn watch_calls(&mut self, config: &Config, host: &mut impl Host, at: Moment) {
        let now = at.wall_ns;
        let expired = self.queue.take_expired(at);
        if !expired.is_empty() {
            self.fail(config, host, expired, BridgeFailure::Timeout, now, false);
        }
        if self.queue.requests_wait() {
            let breaker = &mut self.breaker;
            let hung = self
                .queue
                .unanswered(at)
                .find_map(|call| breaker.hung(config.breaker, call, now));
            if hung.is_some() {
                return self.opened(config, host, now, hung);
            }
        }
        let given_up: Vec<u32> = self
            .queue
            .unanswered(at)
            .filter(|call| call.age >= call.timeout)
            .map(|call| call.token)
            .collect();
        for token in given_up {
            if let Some(flight) = self.queue.take_call(token) {
                self.queue.abandon(token);
                let (members, riders) = flight.call.into_parts();
                self.settlements
                    .ridden(riders, Err(&BridgeFailure::Timeout));
                self.fail(config, host, members, BridgeFailure::Timeout, now, true);
            }
        }
    }

    /// A call given up on was answered after all: the bridge answers (slowly). The run of
    /// failures ends, and an open breaker closes: the next requests are decided again.
    pub(super) fn late_answer(&mut self, host: &mut impl Host) {
        let now = self.clock_or_last(host);
        if let Some(why) = self.breaker.late_answer(now) {
            host.gauge_add(Gauge::BreakerOpen, -1);
            host.report_breaker(false, &why);
        }
    }

    /// `members` failed: they follow their policy; a failed `call` counts for the breaker.
    pub(super) fn fail(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        members: Vec<Waiting>,
        failure: BridgeFailure,
        now: UnixNs,
        call: bool,
    ) {
        let opens = call.then(|| self.breaker.failed(config.breaker, &failure, now));
        for member in members {
            let outcome = Outcome::Failed(failure.clone());
            self.resolve(config, host, member, outcome, None, now);
        }
        self.opened(config, host, now, opens.flatten());
    }

    /// The breaker opened (for `why`; None: it did not): every request waiting or in flight is
    /// decided now by its policy; none waits for a call until a probe is answered.
    pub(super) fn opened(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        now: UnixNs,
        why: Option<String>,
    ) {
        let Some(why) = why else {
            return;
        };
        host.count(Counter::BreakerTrips);
        host.gauge_add(Gauge::BreakerOpen, 1);
        host.report_breaker(true, &why);
        let ((members, riders), open) = (self.queue.take_all(), BridgeFailure::BreakerOpen);
        self.settlements.ridden(riders, Err(&open));
        self.fail(config, host, members, open, now, false);
    }

    /// Sends the settlements that wait (from the root: their replies must come to it),
    /// unless the breaker is open.
    pub(super) fn send_settlements(&mut self, config: &Config, host: &mut impl Host) {
        let Some(now) = self.clock(host).filter(|_| !self.breaker.is_open()) else {
            return;
        };
        for (group, timeout) in self.settlements.calls(config) {
            let given_back = group.iter().filter(|s| s.delta < 0);
            self.refusals.given_back(given_back.map(|s| &s.check));
            let request = Settlements::request(config, &group, timeout, now);
            match host.dispatch(&config.bridge, &request, timeout) {
                Ok(token) => {
                    host.count(Counter::UsageSettlementCalls);
                    self.settlements.sent(token, group, timeout);
                }
                Err(why) => {
                    host.report_failure(&BridgeFailure::Dispatch(why));
                    self.settlements.unsent(group);
                }
            }
        }
        self.count_lost_settlements(host);
    }

    /// The reply to settlement call `token`: its follow-up sent if it needs one (the script
    /// loaded, then the call again); a failure counts for the breaker.
    pub(super) fn settlement_reply(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        token: u32,
        reply: BridgeReply<'_>,
    ) {
        let now = self.clock_or_last(host);
        let (settled, next) = self.settlements.reply(config, token, reply, now);
        if let Some((request, call)) = next {
            match host.dispatch(&config.bridge, &request, call.timeout()) {
                Ok(token) => self.settlements.resent(token, call),
                Err(_) => self.settlements.not_resent(call),
            }
        }
        self.count_lost_settlements(host);
        // Give-backs that came meanwhile go now; after a failure they wait for the tick.
        let hurry = matches!(settled, Settled::Done);
        match settled {
            Settled::Done | Settled::Reloading => self.breaker.answered(),
            Settled::Failed(failure) => {
                if !self.refused(host, &failure) {
                    host.report_failure(&failure);
                }
                let opens = self.breaker.failed(config.breaker, &failure, now);
                self.opened(config, host, now, opens);
            }
        }
        if hurry && self.settlements.gives_back_now() {
            self.send_settlements(config, host);
        }
    }

    /// A call's reply was `failure`: if the bridge refused the filter (a setting is wrong),
    /// counted under its cause and reported (an error naming the setting), once per call.
    /// Returns whether it was a refusal.
    pub(super) fn refused(&mut self, host: &mut impl Host, failure: &BridgeFailure) -> bool {
        let Some(refusal) = failure.misconfiguration() else {
            return false;
        };
        host.count(refusal.cause.counter());
        host.report_misconfigured(refusal);
        true
    }

    /// Counts the settlements dropped since the last time.
    pub(super) fn count_lost_settlements(&mut self, host: &mut impl Host) {
        let lost = self.settlements.take_lost();
        if lost > 0 {
            host.count_n(Counter::UsageSettlementsLost, lost);
        }
    }

    /// Gives back what leases held past their end (see [`Leases::give_backs`]), without waiting
    /// for the replies: a lost give-back leaves units spent, never extra.
    pub(super) fn give_back(&mut self, config: &Config, host: &mut impl Host, now: UnixNs) {
        for (refunds, timeout) in self.leases.give_backs(config) {
            let units = refunds.iter().map(|r| r.check.cost).sum();
            host.count_n(Counter::LeaseUnitsReturned, units);
            // As long to reach Redis as a decision on these keys (with a small clock skew alone,
            // most came too late to give anything back).
            let window = timeout.max(config.clock_skew);
            self.refund(config, host, &refunds, (window, window), now);
        }
    }

    /// Gives back what the parts of a refused `split` charged: a call per slot, whose reply is
    /// not waited for (a lost refund leaves units spent, never extra).
    pub(super) fn refund_split(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        split: &Split,
        now: UnixNs,
    ) {
        for refunds in split.refunds() {
            host.count(Counter::Refunds);
            let times = (config.clock_skew, split.plan.timeout);
            self.refund(config, host, &refunds, times, now);
        }
    }

    /// Sends a call giving `refunds` back (a split's refund or a lease's give-back) at `now`,
    /// without waiting for its reply (within `timeout`); the deny cache forgets their keys'
    /// refusals. Its clock must be no earlier than any decision on these keys made before it
    /// reaches Redis, and Redis must drop it past that clock: the clock (and deadline) is `now`
    /// plus `window`, at least the clock skew allowed between replicas. A later clock only gives
    /// back less (the refill up to it is counted as the bucket's), never more.
    fn refund(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        refunds: &[Refund],
        (window, timeout): (Duration, Duration),
        now: UnixNs,
    ) {
        self.refusals.given_back(refunds.iter().map(|r| &r.check));
        let clock = now.plus(window.max(config.clock_skew));
        let call = DecideCall::refund(clock.as_ns(), clock.as_ms(), refunds);
        let request = config.program.decide(&call);
        if let Err(why) = host.dispatch(&config.bridge, &request, timeout) {
            host.report_failure(&BridgeFailure::Dispatch(why));
        }
    }
}
