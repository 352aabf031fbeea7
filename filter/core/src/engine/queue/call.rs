//! A decision call: the batch of requests it decides (and the settlements riding on it), how
//! it is built into one `EVALSHA`, its stage (the script's load, then the same call again), and
//! how its reply is read. Apart from the queue as what leaves it: one call from one batch.

use std::time::Duration;

use super::waiting::Waiting;
use crate::bridge::{
    parse_node_reply, BridgeFailure, BridgeReply, BridgeRequest, DecideCall, EvalOutcome,
    RequestShape, SlotMap,
};
use crate::config::{Clock, Config};
use crate::decision::{Decision, Settlement};
use crate::engine::lag::Moment;
use crate::engine::leases::Ticket;
use crate::engine::nodes::NodeTag;
use crate::engine::script::{Read, Stage};
#[cfg(doc)]
use crate::engine::{nodes::CALLS_PER_NODE, queue::Queue};
use crate::time::UnixNs;

/// When a call was sent: the clock its decisions were made with, and the deny cache's epoch
/// then (the restarts it was reset for, see `Refusals::remember`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub at_ns: UnixNs,
    pub epoch: u64,
}

/// The settlements that rode on a call, with their part of its reply.
pub type Riding<T> = Option<(Vec<Settlement>, T)>;

/// A decision call: made, then in flight once dispatched (with its token).
#[derive(Debug)]
pub struct Call {
    pub stage: Stage,
    /// The decision call, kept to send again after a script load.
    pub eval: BridgeRequest,
    /// Its requests, in the order of the call; None: it stopped waiting (its deadline passed)
    /// and follows its policy, its part of the reply is not read.
    members: Vec<Option<Waiting>>,
    /// What each request's part of the reply may hold.
    shapes: Vec<RequestShape>,
    /// The shortest timeout of its requests: how long it may go without an answer (in the
    /// worker's own time) before the bridge is taken as hung.
    pub timeout: Duration,
    /// The clock the script decides with: the instant the call was first sent; and the
    /// deny cache's epoch when it was last sent.
    pub sent: Sent,
    /// The request context that made the call, if not the root: its reply comes there, and
    /// is lost if that stream ends first.
    pub owner: Option<u32>,
    /// Settlements riding on the call: its last request, which no stream waits for.
    riders: Vec<Settlement>,
    /// Redis Cluster: a call for the slots of one node (no key declared, see
    /// [`BridgeRequest::evalsha_on_node`]), with the epoch of the slot map it asks for.
    pub on_node: Option<OnNode>,
    /// Redis Cluster: the master it goes to, as the slot map had it when it was sent (None:
    /// not known); see [`CALLS_PER_NODE`].
    pub node: Option<NodeTag>,
}

/// How a call for the slots of one node goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnNode {
    /// The slot map's epoch when the call asked for it (None: it did not).
    pub asks: Option<u64>,
}

impl Call {
    /// The call deciding `members` (a batch), sent at `now` from `owner`, with `riders`
    /// settled in it (see [`DecideCall::leasing_with`]).
    pub fn decide(
        config: &Config,
        members: Vec<Waiting>,
        sent: Sent,
        owner: Option<u32>,
        riders: Vec<Settlement>,
        on_node: Option<OnNode>,
    ) -> Call {
        let now = sent.at_ns;
        let clock = match config.clock {
            Clock::Proxy => now.as_ns().to_string(),
            Clock::Redis => "redis".to_string(),
        };
        // Redis charges nothing once the soonest of these requests has given up however late
        // its worker runs (plus the clock skew allowed): its verdict is then the policy's.
        let deadline = members
            .iter()
            .map(|m| m.deadline.wall_ns)
            .min()
            .unwrap_or(now);
        let deadline_ms = deadline.plus(config.clock_skew).as_ms();
        let call = DecideCall::leasing_with(
            &clock,
            deadline_ms,
            members.iter().map(|m| {
                let lease = m.lease.as_ref().map(Ticket::requests);
                (m.plan.checks.as_slice(), lease)
            }),
            &riders,
        );
        let mut shapes: Vec<RequestShape> = members.iter().map(Waiting::shape).collect();
        if !riders.is_empty() {
            shapes.push(RequestShape {
                limits: riders.len(),
                most_leased: 0,
            });
        }
        let timeout = members
            .iter()
            .map(|m| m.plan.timeout)
            .min()
            .unwrap_or_default();
        let eval = match on_node {
            Some(node) => config.program.decide_on_node(&call, node.asks.is_some()),
            None => config.program.decide(&call),
        };
        Call {
            stage: Stage::default(),
            eval,
            shapes,
            members: members.into_iter().map(Some).collect(),
            timeout,
            sent,
            owner,
            riders,
            on_node,
            node: None,
        }
    }

    /// The requests still waiting for it.
    pub fn members(&self) -> impl Iterator<Item = &Waiting> {
        self.members.iter().flatten()
    }

    /// The requests still waiting for it, and the settlements riding on it, taken.
    pub fn into_parts(self) -> (Vec<Waiting>, Vec<Settlement>) {
        (self.members.into_iter().flatten().collect(), self.riders)
    }

    /// The requests still waiting, each with its part of a reply (`results`, in call order),
    /// and the riding settlements with theirs (the last part; None without riders).
    pub fn with_results<T>(self, mut results: Vec<T>) -> (Vec<(Waiting, T)>, Riding<T>) {
        let riding = match self.riders.is_empty() {
            true => None,
            false => results.pop().map(|result| (self.riders, result)),
        };
        let members = self
            .members
            .into_iter()
            .zip(results)
            .filter_map(|(member, result)| member.map(|m| (m, result)))
            .collect();
        (members, riding)
    }

    /// The requests whose deadline passed by `at`, taken out of the call.
    pub fn take_expired(&mut self, at: Moment) -> Vec<Waiting> {
        let mut expired = Vec::new();
        for entry in &mut self.members {
            if entry.as_ref().is_some_and(|m| m.deadline.passed(at)) {
                expired.extend(entry.take());
            }
        }
        expired
    }

    /// The request to send for its stage: the decision, or the script load before it.
    pub fn request(&self, config: &Config) -> std::borrow::Cow<'_, BridgeRequest> {
        self.stage
            .request(config, || std::borrow::Cow::Borrowed(&self.eval))
    }

    /// What `reply` says for the call's stage.
    pub fn read(&self, config: &Config, reply: BridgeReply<'_>) -> Reply {
        let asks = self.asks();
        self.stage.read(config, reply, |reply| {
            match parse_node_reply(reply, &self.shapes, asks)? {
                (EvalOutcome::Decided(results), map) => Ok(Some((results, map))),
                (EvalOutcome::NoScript, _) => Ok(None),
            }
        })
    }

    /// Whether it asks for the node's slot map.
    fn asks(&self) -> bool {
        self.on_node.is_some_and(|n| n.asks.is_some())
    }

    /// Envoy's own timeout of the call: its timeout plus the lag allowance, in wall time.
    /// The engine stops waiting for it sooner, counting the worker's own time
    /// ([`Queue::unanswered`]); this bounds the wait however late the worker runs.
    pub fn envoy_timeout(&self, config: &Config) -> Duration {
        self.timeout
            .saturating_add(config.lag_allowance)
            .max(Duration::from_millis(1))
    }
}

/// What a call's reply says, for its stage: when the script ran, each member's decision, or
/// why Redis could not decide that one alone, and the node's slot map if the call asked for it.
pub type Reply = Read<(Vec<Result<Decision, BridgeFailure>>, Option<SlotMap>)>;
