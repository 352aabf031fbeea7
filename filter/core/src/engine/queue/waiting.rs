//! A request in the queue: whom its outcome goes to, what it waits with (its deadline, its
//! slot, the lease it asks for), and what became of its call. Apart from the queue and the
//! calls because it is what both carry, and what the rest of the engine is handed back.

use crate::bridge::{lease_units, BridgeFailure, RequestShape};
use crate::config::Config;
use crate::decision::Decision;
use crate::engine::lag::{Deadline, Moment};
use crate::engine::leases::{Leases, Ticket};
use crate::engine::slots;
use crate::request::plan::Plan;
use crate::time::UnixNs;

/// Whom a waiting request's outcome goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The stream (request context) `ctx`.
    Stream(u32),
    /// Redis Cluster: part `part` of the request `split` of stream `ctx`, decided on a slot of
    /// its own; its outcome goes to the split, which concludes once every part is in.
    Part { ctx: u32, split: u64, part: usize },
    /// No stream: units for the next requests of a lease that runs low.
    Prefetch,
}

impl Origin {
    /// The stream it came from, if any.
    pub fn ctx(self) -> Option<u32> {
        match self {
            Origin::Stream(ctx) | Origin::Part { ctx, .. } => Some(ctx),
            Origin::Prefetch => None,
        }
    }
}

/// A request waiting for a call, or in one.
#[derive(Debug)]
pub struct Waiting {
    pub origin: Origin,
    pub plan: Plan,
    pub arrived_ns: UnixNs,
    /// When it stops waiting and follows its failure policy.
    pub deadline: Deadline,
    /// Redis Cluster: the hash slot of every key of `plan`; a call takes one slot's requests.
    pub slot: Option<u16>,
    /// The lease it asks for, if any.
    pub lease: Option<Ticket>,
    /// What the worker had learnt from replies (their number) when the leases and the deny
    /// cache were last asked about it; None: never asked. They are asked again only when
    /// replies came since.
    pub checked: Option<u64>,
    /// Redis Cluster: a node refused its keys in a call for several slots (or its slot was
    /// moving): it goes only in calls of its own slot, whose keys Redis routes and checks.
    pub declared: bool,
}

impl Waiting {
    /// A request of `origin` arrived at `at`, waiting (`checked`: see the field).
    pub fn new(
        config: &Config,
        origin: Origin,
        plan: Plan,
        at: Moment,
        lease: Option<Ticket>,
        checked: Option<u64>,
    ) -> Self {
        Waiting {
            origin,
            slot: slots::of_plan(config, &plan),
            deadline: Deadline::new(at, plan.timeout, config.lag_allowance),
            plan,
            arrived_ns: at.wall_ns,
            lease,
            checked,
            declared: false,
        }
    }

    /// It leaves without an outcome: its lease ticket (if any) is given back.
    pub fn leave(self, leases: &mut Leases) {
        if let Some(ticket) = self.lease {
            leases.cancel(ticket, &self.plan);
        }
    }

    /// What its part of a reply may hold: a lease asked for is k requests' worth of each
    /// limit's cost, k × cost within the limit's `max_units` (see `lua/decide.lua`).
    pub fn shape(&self) -> RequestShape {
        let most_leased = match self.lease.as_ref().map(Ticket::requests) {
            None => 0,
            Some(requests) => self
                .plan
                .checks
                .iter()
                .filter(|c| c.cost > 0)
                .filter_map(|c| c.mode.lease().map(|l| lease_units(l, c, requests) / c.cost))
                .min()
                .unwrap_or(1)
                .saturating_sub(1),
        };
        RequestShape {
            limits: self.plan.checks.len(),
            most_leased,
        }
    }
}

/// What became of a request's call.
pub enum Outcome {
    Decided(Decision),
    Failed(BridgeFailure),
}

impl Outcome {
    pub fn decision_mut(&mut self) -> Option<&mut Decision> {
        match self {
            Outcome::Decided(decision) => Some(decision),
            Outcome::Failed(_) => None,
        }
    }
}
