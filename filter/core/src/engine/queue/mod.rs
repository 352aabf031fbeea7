//! The requests a worker has for Redis: those waiting for a call, in arrival order, and the
//! calls in flight. A batch takes waiting requests from the front, of one hash slot (Redis
//! Cluster), at most `batch.max_requests` of them and within the call's bytes; the others keep
//! their place.
//!
//! What waits is a [`Waiting`] request (`waiting`); what goes is a decision [`Call`] (`call`).
//! This file is the queue that holds them and takes batches from it.

mod call;
mod waiting;

use std::collections::VecDeque;
use std::time::Duration;

use super::lag::Moment;
use super::leases::Leases;
use super::nodes::{NodeTag, CALLS_PER_NODE};
use crate::bounds::MAX_ABANDONED_CALLS;
use crate::bridge::call_bytes;
use crate::decision::Settlement;

pub use call::{Call, OnNode, Reply, Sent};
pub use waiting::{Origin, Outcome, Waiting};

/// A call in flight.
#[derive(Debug)]
pub struct InFlight {
    token: u32,
    /// When its current stage was dispatched, for the hang check.
    pub dispatched: Moment,
    pub call: Call,
}

/// A call in flight, as the hang check sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unanswered {
    pub token: u32,
    /// How long, in the worker's own time.
    pub age: Duration,
    /// The call's timeout.
    pub timeout: Duration,
}

/// A batch being taken from the queue.
#[derive(Debug)]
pub struct Batch {
    slot: Option<u16>,
    /// Redis Cluster: the master of its slot, as the worker's slot map has it: requests of
    /// that master's other slots join (None: only requests of its slot).
    node: Option<u16>,
    /// Where the next candidate is looked for.
    at: usize,
    bytes: usize,
    members: Vec<Waiting>,
}

impl Batch {
    /// `waiting` joins the call, with its `size` in bytes.
    pub fn join(&mut self, waiting: Waiting, size: usize) {
        self.bytes += size;
        self.members.push(waiting);
    }

    pub fn into_members(self) -> Vec<Waiting> {
        self.members
    }

    /// The slot of its first request.
    pub fn slot(&self) -> Option<u16> {
        self.slot
    }
}

#[derive(Debug, Default)]
pub struct Queue {
    waiting: VecDeque<Waiting>,
    /// Requests to try again at the next tick (Redis Cluster: their slot was moving), before
    /// those waiting.
    parked: Vec<Waiting>,
    in_flight: Vec<InFlight>,
    /// Calls abandoned while in flight (the breaker opened, or one was given up), newest
    /// last: an answer to one still shows that the bridge answers.
    abandoned: VecDeque<u32>,
}

impl Queue {
    /// Requests waiting, and calls in flight.
    pub fn load(&self) -> (usize, usize) {
        (self.waiting.len() + self.parked.len(), self.in_flight.len())
    }

    pub fn push(&mut self, waiting: Waiting) {
        self.waiting.push_back(waiting);
    }

    /// `requests` go first, in their order (sent again: they waited longest).
    pub fn requeue(&mut self, requests: Vec<Waiting>) {
        for w in requests.into_iter().rev() {
            self.waiting.push_front(w);
        }
    }

    /// `requests` wait for the next tick ([`Queue::unpark`]) before they are sent again.
    pub fn park(&mut self, requests: Vec<Waiting>) {
        self.parked.extend(requests);
    }

    /// The parked requests go first again.
    pub fn unpark(&mut self) {
        let parked = std::mem::take(&mut self.parked);
        self.requeue(parked);
    }

    /// Whether no call is in flight and `waiting` is the only one waiting.
    pub fn only(&self) -> bool {
        self.in_flight.is_empty() && self.waiting.len() == 1
    }

    /// A batch starting at the `at`-th waiting request (of its slot, and with `node` of the
    /// slots of that master; those before it stay), `fixed_bytes` in use.
    pub fn batch_at(&self, at: usize, fixed_bytes: usize, node: Option<u16>) -> Batch {
        Batch {
            slot: self.waiting.get(at).and_then(|w| w.slot),
            node,
            at,
            bytes: fixed_bytes,
            members: Vec::new(),
        }
    }

    /// The waiting requests, front first.
    pub fn waiting(&self) -> impl Iterator<Item = &Waiting> + '_ {
        self.waiting.iter()
    }

    /// Whether [`CALLS_PER_NODE`] calls to master `node` are in flight.
    pub fn node_busy(&self, node: NodeTag) -> bool {
        let calls = self.in_flight.iter().filter(|f| f.call.node == Some(node));
        calls.count() >= CALLS_PER_NODE
    }

    /// The next waiting request of `batch`'s slot (or of a slot of its master, `node_of` a
    /// slot's master: Redis Cluster), taken from the queue with its size in bytes, if the batch
    /// holds fewer than `max_requests` and it fits within `max_bytes` (the first always does).
    /// The caller has it join the batch or answers it otherwise.
    pub fn next(
        &mut self,
        batch: &mut Batch,
        max_requests: usize,
        max_bytes: usize,
        node_of: impl Fn(u16) -> Option<u16>,
    ) -> Option<(Waiting, usize)> {
        if batch.members.len() >= max_requests {
            return None;
        }
        let joins = |w: &Waiting| match batch.node {
            None => w.slot == batch.slot,
            // Not one sent back to a call of its own slot.
            Some(node) => {
                !w.declared && (w.slot == batch.slot || w.slot.and_then(&node_of) == Some(node))
            }
        };
        while !joins(self.waiting.get(batch.at)?) {
            batch.at += 1;
        }
        let size = call_bytes(&self.waiting.get(batch.at)?.plan.checks);
        if !batch.members.is_empty() && batch.bytes + size > max_bytes {
            return None;
        }
        Some((self.waiting.remove(batch.at)?, size))
    }

    /// A call was dispatched at `at` with `token`.
    pub fn in_flight(&mut self, token: u32, at: Moment, call: Call) {
        self.in_flight.push(InFlight {
            token,
            dispatched: at,
            call,
        });
    }

    pub fn calls(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether requests wait and there is room for a call (fewer than `max_in_flight` in flight).
    pub fn ready(&self, max_in_flight: usize) -> bool {
        !self.waiting.is_empty() && self.in_flight.len() < max_in_flight
    }

    /// The call in flight with `token`, taken.
    pub fn take_call(&mut self, token: u32) -> Option<InFlight> {
        let i = self.in_flight.iter().position(|c| c.token == token)?;
        Some(self.in_flight.swap_remove(i))
    }

    /// The call in flight with `token` is given up: its reply, if it comes, is not read.
    pub fn abandon(&mut self, token: u32) {
        if self.abandoned.len() >= MAX_ABANDONED_CALLS {
            self.abandoned.pop_front();
        }
        self.abandoned.push_back(token);
    }

    /// Whether `token` is a call given up on (forgotten once asked).
    pub fn was_abandoned(&mut self, token: u32) -> bool {
        let Some(i) = self.abandoned.iter().position(|&t| t == token) else {
            return false;
        };
        self.abandoned.remove(i);
        true
    }

    /// The requests of calls in flight whose deadline passed by `at`, taken out of their
    /// calls (which stay in flight).
    pub fn take_expired(&mut self, at: Moment) -> Vec<Waiting> {
        let mut expired = Vec::new();
        for flight in &mut self.in_flight {
            expired.append(&mut flight.call.take_expired(at));
        }
        expired
    }

    /// Every call in flight at `at`: how long it has gone unanswered, in the worker's own
    /// time, and its timeout.
    pub fn unanswered(&self, at: Moment) -> impl Iterator<Item = Unanswered> + '_ {
        self.in_flight.iter().map(move |f| Unanswered {
            token: f.token,
            age: at.work_since(f.dispatched),
            timeout: f.call.timeout,
        })
    }

    /// Whether any request waits on the bridge: for a call, or in one in flight.
    pub fn requests_wait(&self) -> bool {
        !self.waiting.is_empty()
            || !self.parked.is_empty()
            || self
                .in_flight
                .iter()
                .any(|f| f.call.members().next().is_some())
    }

    /// A call in flight made from the context `ctx`, taken.
    fn take_call_of(&mut self, ctx: u32) -> Option<Call> {
        let i = self
            .in_flight
            .iter()
            .position(|c| c.call.owner == Some(ctx))?;
        Some(self.in_flight.swap_remove(i).call)
    }

    /// Every waiting request (and parked one), taken.
    pub fn take_waiting(&mut self) -> Vec<Waiting> {
        self.unpark();
        self.waiting.drain(..).collect()
    }

    /// Every request, waiting or in a call in flight, taken (the calls are abandoned), and the
    /// settlements riding on those calls.
    pub fn take_all(&mut self) -> (Vec<Waiting>, Vec<Settlement>) {
        let mut all = self.take_waiting();
        let mut riders = Vec::new();
        let flights: Vec<InFlight> = self.in_flight.drain(..).collect();
        for flight in flights {
            self.abandon(flight.token);
            let (members, riding) = flight.call.into_parts();
            all.extend(members);
            riders.extend(riding);
        }
        (all, riders)
    }

    /// The stream `ctx` ended: its requests (not the prefetches it started) leave the queue
    /// and the calls it made (whose replies are lost with it, so those calls are abandoned),
    /// their lease tickets given back to `leases`. The other requests of those calls, and the
    /// settlements riding on them, taken.
    pub fn forget(&mut self, ctx: u32, leases: &mut Leases) -> (Vec<Waiting>, Vec<Settlement>) {
        let mut orphans = Vec::new();
        let mut riders = Vec::new();
        self.unpark();
        let mut i = 0;
        while i < self.waiting.len() {
            match self.waiting.get(i) {
                Some(w) if w.origin.ctx() == Some(ctx) => {
                    if let Some(gone) = self.waiting.remove(i) {
                        gone.leave(leases);
                    }
                }
                _ => i += 1,
            }
        }
        while let Some(call) = self.take_call_of(ctx) {
            let (members, riding) = call.into_parts();
            riders.extend(riding);
            for member in members {
                match member.origin.ctx() == Some(ctx) {
                    true => member.leave(leases),
                    false => orphans.push(member),
                }
            }
        }
        (orphans, riders)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::LimitCheck;
    use crate::engine::lag::Deadline;
    use crate::testing::plan::{plan_of, token_bucket_check};
    use crate::testing::random::Rng;
    use crate::time::UnixNs;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A waiting request numbered `n` (its arrival instant), with keys of `key_len` bytes.
    fn waiting(n: u128, slot: Option<u16>, limits: usize, key_len: usize) -> Waiting {
        let key = "k".repeat(key_len);
        let check = |i: usize| LimitCheck {
            limit: i,
            ..token_bucket_check(&key)
        };
        let plan = plan_of((0..limits).map(check).collect());
        Waiting {
            origin: Origin::Stream(n as u32),
            deadline: Deadline::new(
                Moment {
                    wall_ns: UnixNs::from_ns(n),
                    work_ns: n,
                },
                plan.timeout,
                Duration::ZERO,
            ),
            plan,
            arrived_ns: UnixNs::from_ns(n),
            slot,
            lease: None,
            checked: None,
            declared: false,
        }
    }

    #[test]
    fn a_batch_takes_the_front_slot_in_order_and_the_others_keep_their_place() {
        let mut q = Queue::default();
        for (n, slot) in [(1, 7), (2, 8), (3, 7), (4, 8), (5, 7)] {
            q.push(waiting(n, Some(slot), 1, 10));
        }
        let mut batch = q.batch_at(0, 0, None);
        while let Some((w, size)) = q.next(&mut batch, 2, usize::MAX, |_| None) {
            batch.join(w, size);
        }
        let taken: Vec<u128> = batch
            .into_members()
            .iter()
            .map(|w| w.arrived_ns.as_ns())
            .collect();
        assert_eq!(taken, vec![1, 3]);
        let left: Vec<u128> = q
            .take_waiting()
            .iter()
            .map(|w| w.arrived_ns.as_ns())
            .collect();
        assert_eq!(left, vec![2, 4, 5]);
    }

    /// Redis Cluster with a slot map: a batch takes the requests of every slot of the front's
    /// master, not those of another master, nor those sent back to a call of their own slot;
    /// without a node, one slot only.
    #[test]
    fn a_batch_for_a_node_takes_the_slots_of_its_master() {
        let node_of = |slot: u16| Some(if slot < 10 { 1 } else { 2 });
        let mut q = Queue::default();
        for (n, slot) in [(1, 1), (2, 11), (3, 2), (4, 1), (5, 3), (6, 12)] {
            q.push(waiting(n, Some(slot), 1, 10));
        }
        let mut refused = waiting(7, Some(3), 1, 10);
        refused.declared = true;
        q.push(refused);
        let mut batch = q.batch_at(0, 0, Some(1));
        while let Some((w, size)) = q.next(&mut batch, 10, usize::MAX, node_of) {
            batch.join(w, size);
        }
        let taken: Vec<u128> = batch
            .into_members()
            .iter()
            .map(|w| w.arrived_ns.as_ns())
            .collect();
        assert_eq!(taken, vec![1, 3, 4, 5]);
        let mut batch = q.batch_at(0, 0, None);
        while let Some((w, size)) = q.next(&mut batch, 10, usize::MAX, node_of) {
            batch.join(w, size);
        }
        let taken: Vec<u128> = batch
            .into_members()
            .iter()
            .map(|w| w.arrived_ns.as_ns())
            .collect();
        assert_eq!(taken, vec![2], "one slot");
        // A request sent back to its own slot's call goes with that slot's others, declared.
        q.requeue(vec![waiting(0, Some(3), 1, 10)]);
        let mut batch = q.batch_at(0, 0, None);
        while let Some((w, size)) = q.next(&mut batch, 10, usize::MAX, node_of) {
            batch.join(w, size);
        }
        let taken: Vec<u128> = batch
            .into_members()
            .iter()
            .map(|w| w.arrived_ns.as_ns())
            .collect();
        assert_eq!(taken, vec![0, 7]);
        let left: Vec<u128> = q
            .take_waiting()
            .iter()
            .map(|w| w.arrived_ns.as_ns())
            .collect();
        assert_eq!(left, vec![6]);
    }

    #[test]
    fn parked_requests_go_first_at_the_next_tick_and_are_never_lost() {
        let mut q = Queue::default();
        q.push(waiting(3, Some(1), 1, 10));
        q.park(vec![waiting(1, Some(2), 1, 10), waiting(2, Some(2), 1, 10)]);
        assert_eq!(q.load().0, 3);
        assert!(q.requests_wait());
        assert_eq!(
            q.waiting().next().map(|w| w.arrived_ns.as_ns()),
            Some(3),
            "not before the tick"
        );
        q.unpark();
        let order: Vec<u128> = q
            .take_waiting()
            .iter()
            .map(|w| w.arrived_ns.as_ns())
            .collect();
        assert_eq!(order, vec![1, 2, 3]);
        q.park(vec![waiting(4, Some(2), 1, 10)]);
        let (all, _) = q.take_all();
        assert_eq!(all.len(), 1, "the breaker opening takes parked ones too");
    }

    /// Random queues and batches: a batch holds requests of one slot (the front's), in
    /// arrival order, at most `max_requests`, within the bytes unless it is one request; the
    /// front always goes; every request comes out once.
    #[test]
    fn batches_keep_order_and_bounds_over_random_queues() {
        for seed in 0..300 {
            let mut rng = Rng::new(seed);
            let mut q = Queue::default();
            let mut next = 0u128;
            let mut out: Vec<u128> = Vec::new();
            let cluster = rng.one_in(2);
            for _ in 0..40 {
                for _ in 0..rng.below(6) {
                    next += 1;
                    let slot = cluster.then(|| rng.below(3) as u16);
                    let (limits, key) = (1 + rng.below(3) as usize, 1 + rng.below(60) as usize);
                    q.push(waiting(next, slot, limits, key));
                }
                let front = q.waiting.front().map(|w| (w.arrived_ns.as_ns(), w.slot));
                let (max_requests, max_bytes) =
                    (1 + rng.below(5) as usize, 200 + rng.below(800) as usize);
                let fixed = rng.below(100) as usize;
                let mut batch = q.batch_at(0, fixed, None);
                let mut seen = Vec::new();
                let mut bytes = fixed;
                while let Some((w, size)) = q.next(&mut batch, max_requests, max_bytes, |_| None) {
                    assert_eq!(size, call_bytes(&w.plan.checks));
                    seen.push((w.arrived_ns.as_ns(), w.slot));
                    out.push(w.arrived_ns.as_ns());
                    // Some are answered without the call (a lease, the deny cache, expired).
                    if rng.one_in(4) {
                        continue;
                    }
                    bytes += size;
                    batch.join(w, size);
                }
                let members = batch.into_members();
                assert!(members.len() <= max_requests, "seed {seed}");
                assert!(members.len() <= 1 || bytes <= max_bytes, "seed {seed}");
                assert_eq!(seen.first().copied(), front, "seed {seed}: the front goes");
                assert!(seen.windows(2).all(|p| p[0].0 < p[1].0), "seed {seed}");
                assert!(seen.iter().all(|s| Some(s.1) == front.map(|f| f.1)));
                // Nothing earlier of that slot was left behind.
                let slot = front.map(|f| f.1);
                if let Some(last) = seen.last() {
                    assert!(q
                        .waiting
                        .iter()
                        .all(|w| w.slot != slot.flatten() || w.arrived_ns.as_ns() > last.0));
                }
            }
            out.extend(q.take_waiting().iter().map(|w| w.arrived_ns.as_ns()));
            out.sort_unstable();
            assert_eq!(out, (1..=next).collect::<Vec<u128>>(), "seed {seed}");
        }
    }
}
