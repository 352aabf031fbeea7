//! Concurrency limits: the holds the streams of this worker have in Redis, until their end.
//!
//! A request with a concurrency limit is sent with an id of its own (this worker's random id
//! and its stream's context id), which names its hold in the limit's sorted set.
//! Once Redis admitted it, its hold is released when its stream ends, whatever the end (the
//! response done, the client gone, a reset): a release is a settlement of the limit, sent
//! from the root like the usage settlements. A stream that ends before its decision comes
//! back is remembered as gone, and released when the decision says it was admitted. What is
//! never released (the proxy died, a call whose answer was lost) ends by itself in Redis at the
//! admission's own deadline, `max_duration`.

use std::collections::HashMap;
use std::rc::Rc;

pub use crate::bounds::MAX_MEMBER_BYTES;
use crate::bounds::MAX_METERED_STREAMS;
use crate::check::LimitCheck;
use crate::decision::Settlement;
use crate::request::plan::Plan;

/// Where a stream's hold is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Sent; its decision has not come back.
    Pending,
    /// Admitted: Redis has its holds.
    Held,
    /// Its stream ended before its decision came back.
    Gone,
}

#[derive(Debug)]
struct Hold {
    checks: Vec<LimitCheck>,
    state: State,
    turn: u64,
}

#[derive(Debug)]
pub struct Holds {
    /// This worker's id in every hold it has: random, so that no other worker, replica or
    /// restart of this one names the same hold.
    worker: u64,
    streams: HashMap<u32, Hold>,
    turn: u64,
}

impl Default for Holds {
    fn default() -> Self {
        Holds {
            worker: random_id(),
            streams: HashMap::new(),
            turn: 0,
        }
    }
}

/// A random 64-bit number from the standard library's hasher seed (the host's random source).
fn random_id() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0u8)
}

impl Holds {
    /// Stream `ctx` is about to be sent on `plan`: its concurrency limits get its id, and the
    /// stream is remembered until its decision and its end.
    pub fn admit(&mut self, ctx: u32, plan: &mut Plan) {
        if !plan.takes_holds() {
            return;
        }
        let member: Rc<str> = format!("{:016x}-{ctx}", self.worker).into();
        let mut held = Vec::new();
        for check in plan.checks.iter_mut().filter(|c| c.mode.takes_hold()) {
            check.mode.admitted(&member);
            held.push(check.clone());
        }
        if self.streams.len() >= MAX_METERED_STREAMS {
            // Forgotten, not released: its hold ends by itself at its deadline, never early.
            let oldest = self
                .streams
                .iter()
                .min_by_key(|(_, h)| h.turn)
                .map(|(c, _)| *c);
            if let Some(ctx) = oldest {
                self.streams.remove(&ctx);
            }
        }
        self.turn += 1;
        let hold = Hold {
            checks: held,
            state: State::Pending,
            turn: self.turn,
        };
        self.streams.insert(ctx, hold);
    }

    /// The decision of stream `ctx` came: `admitted` (Redis has its holds), or not;
    /// `maybe_held` when it was not decided but its call went out (it may have been carried
    /// out unseen). Returns the releases to send now.
    pub fn decided(&mut self, ctx: u32, admitted: bool, maybe_held: bool) -> Vec<Settlement> {
        let Some(hold) = self.streams.get_mut(&ctx) else {
            return Vec::new();
        };
        if admitted && hold.state == State::Pending {
            hold.state = State::Held;
            return Vec::new();
        }
        match self.streams.remove(&ctx) {
            Some(hold) if admitted || maybe_held => releases(hold.checks),
            _ => Vec::new(),
        }
    }

    /// Stream `ctx` ended: the releases to send now (none while its decision is out).
    pub fn ended(&mut self, ctx: u32) -> Vec<Settlement> {
        match self.streams.get_mut(&ctx) {
            None => Vec::new(),
            Some(hold) if hold.state == State::Pending => {
                hold.state = State::Gone;
                Vec::new()
            }
            Some(_) => self
                .streams
                .remove(&ctx)
                .map_or_else(Vec::new, |hold| releases(hold.checks)),
        }
    }

    /// Streams remembered (held, or waiting for their decision).
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }
}

/// A release of each hold: a settlement of the concurrency limit by the request's id.
fn releases(checks: Vec<LimitCheck>) -> Vec<Settlement> {
    checks
        .into_iter()
        .map(|check| Settlement { check, delta: -1 })
        .collect()
}
