//! Redis Cluster: which slots share a master, so that one call decides the requests of all of
//! them. The map is learnt from the cluster itself: a call may ask the node that runs it for
//! its slot map (`CLUSTER SLOTS`, run by the script), and the worker keeps the last one.
//!
//! The map is only ever a guess: a call for several slots declares no key, and Redis checks
//! each key as the script touches it, refusing a request whose keys the node does not serve
//! before that request wrote anything. Such a request is sent again in a call of its own
//! slot, whose keys are declared (the proxy follows `MOVED` and `ASK` for it). A refusal
//! shows the map is out of date (a slot was resharded, or is being migrated): the worker drops
//! it, asks for a fresh one with its next call, and keeps the refused slot out of calls for
//! several slots for [`DOUBT`] (a slot being migrated is still listed by its old master).

use std::time::Duration;

use crate::bridge::SlotMap;
use crate::time::UnixNs;

/// How long a slot whose keys a node refused goes only in calls of its own slot.
pub const DOUBT: Duration = Duration::from_secs(1);

/// How often a worker asks for the slot map again without a refusal (a slot moved to a
/// master it knew, say), at most.
pub const REFRESH: Duration = Duration::from_secs(10);

/// Calls in flight to one master from one worker, at most (Redis Cluster, with the slot map
/// known). The requests for a busy master wait for its call's reply and go together in the
/// next, rather than in calls of a request or two each: a call's cost in Webdis, the proxy
/// and Redis is mostly per call.
pub const CALLS_PER_NODE: usize = 1;

/// How many waiting requests, from the front, are looked at for one whose master has no call
/// out: a bound on the work per arrival when many wait. One further back waits for the next
/// reply (the requests ahead of it leave with it).
pub const FRONT_SCAN: usize = 64;

/// A master as one slot map numbers it: the map's generation and the master's number in it
/// (numbers from an older map name nobody).
pub type NodeTag = (u64, u16);

/// Most slots doubted at once; past it the one doubted first goes (a worker that sees this
/// many refusals at once is in a resharding, and asks for a map at each).
const MAX_DOUBTS: usize = 64;

#[derive(Debug, Default)]
pub struct Nodes {
    /// (first slot, last slot, master) by first slot, as a node last reported them; empty:
    /// none known (every call carries one slot's keys).
    ranges: SlotMap,
    /// Slots refused lately, with when their doubt ends.
    doubts: Vec<(u16, UnixNs)>,
    /// Counts the maps dropped: a map asked for before the last drop is not taken.
    epoch: u64,
    /// When the ask in flight (for the current epoch) was sent: one whose answer is
    /// lost (its call failed or was given up) stops counting after [`REFRESH`].
    asking: Option<UnixNs>,
    /// When the last map (or an empty answer) came.
    learnt_ns: Option<UnixNs>,
    /// Counts the maps taken and dropped: the masters' numbers are those of one generation.
    generation: u64,
}

impl Nodes {
    /// The master of `slot` in the map (a number within it); None when unknown or doubted.
    pub fn node_of(&self, slot: u16, now: UnixNs) -> Option<u16> {
        if self.doubted(slot, now) {
            return None;
        }
        let i = self.ranges.partition_point(|&(first, _, _)| first <= slot);
        let &(first, last, node) = self.ranges.get(i.checked_sub(1)?)?;
        (first..=last).contains(&slot).then_some(node)
    }

    /// The master of `slot` as [`Nodes::node_of`] has it, tagged with the map's generation.
    pub fn tag_of(&self, slot: u16, now: UnixNs) -> Option<NodeTag> {
        self.node_of(slot, now).map(|node| (self.generation, node))
    }

    /// Whether a node refused the keys of `slot` less than [`DOUBT`] ago.
    pub fn doubted(&self, slot: u16, now: UnixNs) -> bool {
        self.doubts
            .iter()
            .any(|&(s, until)| s == slot && until > now)
    }

    /// Whether the next call should ask for the map (none, or an old one, and no ask out):
    /// then its epoch, marked as asked.
    pub fn ask(&mut self, now: UnixNs) -> Option<u64> {
        let due = match self.learnt_ns {
            None => true,
            Some(at) => now.since(at) >= REFRESH.as_nanos(),
        };
        let out = self
            .asking
            .is_some_and(|at| now.since(at) < REFRESH.as_nanos());
        if out || !due {
            return None;
        }
        self.asking = Some(now);
        Some(self.epoch)
    }

    /// The answer to an ask of `epoch`: a map (None: the call failed, ask again). A map from
    /// before the last drop is old news: not taken.
    pub fn answered(&mut self, epoch: u64, map: Option<SlotMap>, now: UnixNs) {
        if epoch != self.epoch {
            return;
        }
        self.asking = None;
        let Some(mut map) = map else {
            return;
        };
        map.sort_unstable_by_key(|&(first, _, _)| first);
        // Overlapping ranges are not a map: nothing is grouped on it.
        let overlaps = map.windows(2).any(|w| w[1].0 <= w[0].1);
        self.ranges = if overlaps { Vec::new() } else { map };
        self.learnt_ns = Some(now);
        self.generation = self.generation.wrapping_add(1);
    }

    /// A node refused the keys of `slot`: the map is dropped (every call carries one slot's keys until
    /// a fresh one comes, asked for at once) and `slot` doubted for [`DOUBT`].
    pub fn refused(&mut self, slot: u16, now: UnixNs) {
        self.ranges.clear();
        self.epoch = self.epoch.wrapping_add(1);
        self.generation = self.generation.wrapping_add(1);
        self.asking = None;
        self.learnt_ns = None;
        let until = now.plus(DOUBT);
        self.doubts.retain(|&(s, end)| s != slot && end > now);
        if self.doubts.len() >= MAX_DOUBTS {
            self.doubts.remove(0);
        }
        self.doubts.push((slot, until));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const S: u128 = 1_000_000_000;

    fn at(ns: u128) -> UnixNs {
        UnixNs::from_ns(ns)
    }

    fn learnt(map: SlotMap) -> Nodes {
        let mut nodes = Nodes::default();
        let epoch = nodes.ask(at(0)).unwrap();
        nodes.answered(epoch, Some(map), at(0));
        nodes
    }

    #[test]
    fn slots_are_found_in_their_ranges() {
        let nodes = learnt(vec![(10923, 16383, 3), (0, 5460, 1), (5461, 10922, 2)]);
        assert_eq!(nodes.node_of(0, at(0)), Some(1));
        assert_eq!(nodes.node_of(5460, at(0)), Some(1));
        assert_eq!(nodes.node_of(5461, at(0)), Some(2));
        assert_eq!(nodes.node_of(16383, at(0)), Some(3));
        let holes = learnt(vec![(0, 10, 1), (20, 30, 2)]);
        assert_eq!(holes.node_of(15, at(0)), None, "a slot no range holds");
        assert_eq!(holes.node_of(31, at(0)), None);
        let overlapping = learnt(vec![(0, 10, 1), (5, 30, 2)]);
        assert_eq!(overlapping.node_of(3, at(0)), None, "not a map");
    }

    #[test]
    fn one_ask_at_a_time_and_again_after_the_refresh_period() {
        let mut nodes = Nodes::default();
        let epoch = nodes.ask(at(0)).expect("no map yet: ask");
        assert_eq!(nodes.ask(at(0)), None, "one ask in flight");
        nodes.answered(epoch, None, at(0));
        let epoch = nodes.ask(at(0)).expect("the ask failed: again");
        nodes.answered(epoch, Some(vec![(0, 16383, 1)]), at(S));
        assert_eq!(nodes.ask(at(S + 1)), None, "fresh");
        assert!(nodes.ask(at(S + REFRESH.as_nanos())).is_some(), "old");
        let t = S + REFRESH.as_nanos();
        assert_eq!(nodes.ask(at(t + 1)), None, "its answer may still come");
        assert!(
            nodes.ask(at(t + REFRESH.as_nanos())).is_some(),
            "an answer lost"
        );
    }

    /// A refusal drops the map at once (calls of one slot each from then on), doubts the
    /// slot for DOUBT, and a map asked before it is not taken; one asked after is.
    #[test]
    fn a_refusal_falls_back_to_calls_per_slot_until_a_fresh_map() {
        let mut nodes = learnt(vec![(0, 8191, 1), (8192, 16383, 2)]);
        let old_ask = nodes.ask(at(REFRESH.as_nanos())).unwrap();
        nodes.refused(100, at(S));
        assert_eq!(nodes.node_of(200, at(S)), None, "no map");
        nodes.answered(old_ask, Some(vec![(0, 16383, 1)]), at(S));
        assert_eq!(nodes.node_of(200, at(S)), None, "asked before the refusal");
        let ask = nodes.ask(at(S)).expect("asked again at once");
        nodes.answered(ask, Some(vec![(0, 8191, 1), (8192, 16383, 2)]), at(S));
        assert_eq!(nodes.node_of(200, at(S)), Some(1));
        assert_eq!(nodes.node_of(100, at(S)), None, "doubted");
        let after = S + DOUBT.as_nanos();
        assert_eq!(nodes.node_of(100, at(after)), Some(1), "doubt over");
    }

    #[test]
    fn doubts_are_bounded() {
        let mut nodes = Nodes::default();
        for slot in 0..(MAX_DOUBTS as u16 + 10) {
            nodes.refused(slot, at(0));
        }
        assert_eq!(nodes.doubts.len(), MAX_DOUBTS);
        assert!(nodes.doubted(MAX_DOUBTS as u16 + 9, at(0)));
        assert!(!nodes.doubted(0, at(0)), "the oldest went");
    }
}
