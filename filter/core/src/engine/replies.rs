//! A call's reply, read in the context it arrives in: the breaker's probe, a settlement call,
//! or a decision call, and what each answer (decided, moving slots, a missing script, a
//! failure) does to the requests that rode on it. Apart from admission as the other half of
//! a call's round trip.

use super::host::Host;
use super::queue::{InFlight, Outcome, Reply, Waiting};
use super::Engine;
use crate::bridge::{is_answer, parse_eval_reply, BridgeFailure, BridgeReply};
use crate::config::Config;
use crate::metrics::{Counter, Gauge};

impl Engine {
    /// A call's reply (or its timeout) arrived, in the root context (`at` None) or in the
    /// request context that made the call.
    pub fn on_reply(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        at: Option<u32>,
        token: u32,
        reply: BridgeReply<'_>,
    ) {
        self.read_reply(config, host, at, token, reply);
        // A failed settlement call keeps its settlements for the next tick.
        self.keep_ticking(host);
    }

    fn read_reply(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        at: Option<u32>,
        token: u32,
        reply: BridgeReply<'_>,
    ) {
        if self.breaker.is_probe(token) {
            let now = self.clock_or_last(host);
            // A missing script is the next call's to load; a refusal is counted and reported
            // as each refused call is, so that it stays loud while the breaker is open.
            let answered = match parse_eval_reply(reply, &[]) {
                Ok(_) => true,
                Err(failure) => {
                    self.refused(host, &failure);
                    false
                }
            };
            if let Some(why) = self.breaker.probe_replied(answered, now) {
                host.gauge_add(Gauge::BreakerOpen, -1);
                host.report_breaker(false, &why);
            }
            return;
        }
        if self.settlements.owns(token) {
            return self.settlement_reply(config, host, token, reply);
        }
        let Some(InFlight {
            call, dispatched, ..
        }) = self.queue.take_call(token)
        else {
            if self.queue.was_abandoned(token) && is_answer(reply) {
                self.late_answer(host);
            }
            return;
        };
        let now = self.clock_or_last(host);
        let reply = call.read(config, reply);
        if let Some(epoch) = call.on_node.and_then(|n| n.asks) {
            let map = match &reply {
                Reply::Ran((_, map)) => map.clone(),
                _ => None,
            };
            if map.is_some() {
                host.count(Counter::ClusterSlotMaps);
            }
            self.nodes.answered(epoch, map, now);
        }
        match reply {
            Reply::Ran((results, _)) => {
                self.breaker.answered();
                // Redis's ACL refusing the script a command refuses it for each request it
                // reaches: reported once for the call.
                if let Some(Err(failure)) = results
                    .iter()
                    .find(|r| matches!(r, Err(f) if f.misconfiguration().is_some()))
                {
                    self.refused(host, failure);
                }
                self.replies = self.replies.wrapping_add(1);
                let (sent, on_node) = (call.sent, call.on_node.is_some());
                let (members, riding) = call.with_results(results);
                if let Some((riders, result)) = riding {
                    self.settlements.ridden(riders, result.as_ref().map(|_| ()));
                }
                let mut again = Vec::new();
                for (mut member, result) in members {
                    // A node that ran a call for several slots refused this one's keys before
                    // it wrote anything: sent again, in a call of its own slot.
                    if let (true, Err(BridgeFailure::NotServed(_)), Some(slot)) =
                        (on_node, &result, member.slot)
                    {
                        self.nodes.refused(slot, now);
                        member.declared = true;
                        again.push(member);
                        continue;
                    }
                    let outcome = result.map_or_else(Outcome::Failed, Outcome::Decided);
                    self.resolve(config, host, member, outcome, Some(sent), now);
                }
                if !again.is_empty() {
                    host.count_n(Counter::ClusterResends, again.len() as u64);
                    self.queue.requeue(again);
                }
            }
            Reply::Failed(BridgeFailure::Moving(why)) => {
                // Redis Cluster answered for the whole call before running it (a slot being
                // migrated, or moved): nothing ran, its requests try again at the next tick,
                // each in a call of its own slot.
                self.breaker.answered();
                let (members, riders) = call.into_parts();
                self.settlements
                    .ridden(riders, Err(&BridgeFailure::Moving(why)));
                let parked: Vec<Waiting> = members
                    .into_iter()
                    .map(|mut m| {
                        m.declared = true;
                        m
                    })
                    .collect();
                host.count_n(Counter::ClusterResends, parked.len() as u64);
                self.queue.park(parked);
            }
            Reply::Missing | Reply::Loaded => {
                self.breaker.answered();
                if matches!(reply, Reply::Missing) {
                    // Redis restarted: what it refused may fit again, here and (at their next
                    // tick) in the other workers. Leases stay: they were charged (a fresh Redis
                    // too).
                    if self.refusals.restarted(host.redis_restarts(true)) {
                        host.count(Counter::DenyCacheResets);
                    }
                } else {
                    host.count(Counter::ScriptLoads);
                }
                let mut call = call;
                call.stage = call.stage.after(&reply);
                self.send(config, host, call, now);
            }
            Reply::Failed(failure) => {
                // No answer at all once Envoy's own timeout passed: the call timed out (rather
                // than its connection failing).
                let envoy_timeout = call.envoy_timeout(config).as_nanos();
                let waited = now.since(dispatched.wall_ns);
                let failure = match failure {
                    BridgeFailure::NoResponse if waited + 1_000_000 >= envoy_timeout => {
                        BridgeFailure::Timeout
                    }
                    failure => failure,
                };
                self.refused(host, &failure);
                let (members, riders) = call.into_parts();
                self.settlements.ridden(riders, Err(&failure));
                self.fail(config, host, members, failure, now, true)
            }
        }
        match at {
            None => self.dispatch_ready(config, host, None),
            Some(ctx) => self.wake(config, host, Some(ctx)),
        }
        // The per-rule counts of what this reply decided go with the global ones (counted at
        // once): a scrape between callbacks sees both or neither.
        self.tally.flush(host);
    }
}
