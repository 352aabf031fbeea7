//! Sightings: when the last requests of each recent identity came, in a fixed table with no
//! allocation per key, so that a worker learns which identities come often enough to earn a
//! lease (`EARN` sightings within a lease's time, defined with the lease table) without
//! keeping a lease entry for every key it sees.
//!
//! A key's entry is chosen by a hash of the key; another key that takes the entry forgets the
//! first one's sightings (it must then earn its lease again: fewer leases, never a wrong
//! decision, since a lease is charged in Redis before it is spent).

use crate::bounds::SIGHTING_ENTRIES;
use crate::time::UnixNs;

/// Earlier requests remembered per key: the request that makes `SEEN + 1` within a lease's
/// time earns the key a lease.
pub const SEEN: usize = 3;

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// The key's hash, high half (the low half chose the entry).
    tag: u32,
    /// When its last requests came, newest first, in ms of the worker's clock plus one (0:
    /// none); wrapping.
    seen: [u32; SEEN],
}

#[derive(Debug, Default)]
pub struct Sightings {
    entries: Vec<Entry>,
}

impl Sightings {
    /// A request of `key` came at `now`: if `SEEN` earlier ones came within
    /// `max_ns` before it, when its last `SEEN` requests came (this one first, in ns to the
    /// ms).
    pub fn sighted(&mut self, key: &str, now: UnixNs, max_ns: u128) -> Option<[UnixNs; SEEN]> {
        if self.entries.is_empty() {
            self.entries = vec![Entry::default(); SIGHTING_ENTRIES];
        }
        let hash = hash(key.as_bytes());
        let entry = &mut self.entries[(hash as usize) & (SIGHTING_ENTRIES - 1)];
        let tag = (hash >> 32) as u32;
        let now_ms = (now.as_ms() as u32).wrapping_add(1);
        if entry.tag != tag {
            *entry = Entry {
                tag,
                seen: [0; SEEN],
            };
        }
        let oldest = entry.seen[SEEN - 1];
        entry.seen.rotate_right(1);
        entry.seen[0] = now_ms;
        let max_ms = u32::try_from(max_ns / 1_000_000).unwrap_or(u32::MAX);
        if oldest == 0 || now_ms.wrapping_sub(oldest) > max_ms {
            return None;
        }
        Some(entry.seen.map(|at| {
            let ago = u128::from(now_ms.wrapping_sub(at)) * 1_000_000;
            now.minus_ns(ago).max(UnixNs::from_ns(1))
        }))
    }
}

/// A fast 64-bit hash of a key (8 bytes a step; keys are the filter's own Redis key names).
fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h: u64 = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    let mut last = [0u8; 8];
    let rest = chunks.remainder();
    last[..rest.len()].copy_from_slice(rest);
    h = (h.rotate_left(5) ^ u64::from_le_bytes(last)).wrapping_mul(K);
    // Every bit mixed into the low ones, which choose the entry (MurmurHash3's finalizer).
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const MS: u128 = 1_000_000;
    const T0: u128 = 1_000_000_000_000 * MS;

    #[test]
    fn the_fourth_request_within_max_ms_is_sighted_the_fourth_within_more_is_not() {
        let mut s = Sightings::default();
        let max = 1000 * MS;
        for at in [0, 300, 600] {
            assert_eq!(s.sighted("k", UnixNs::from_ns(T0 + at * MS), max), None);
        }
        assert_eq!(
            s.sighted("k", UnixNs::from_ns(T0 + 1000 * MS), max),
            Some([T0 + 1000 * MS, T0 + 600 * MS, T0 + 300 * MS].map(UnixNs::from_ns)),
            "4 in 1,000 ms"
        );
        assert!(
            s.sighted("k", UnixNs::from_ns(T0 + 1100 * MS), max)
                .is_some(),
            "300 ... 1100"
        );
        assert_eq!(
            s.sighted("k", UnixNs::from_ns(T0 + 1700 * MS), max),
            None,
            "600 ... 1700"
        );
        // Another key's requests count for it alone.
        assert_eq!(
            s.sighted("other", UnixNs::from_ns(T0 + 2701 * MS), max),
            None
        );
    }

    #[test]
    fn keys_spread_over_the_entries() {
        let used: std::collections::HashSet<usize> = (0..SIGHTING_ENTRIES)
            .map(|i| {
                hash(format!("rl:{{header:x-api-key:client-{i}}}:all:minute").as_bytes()) as usize
                    & (SIGHTING_ENTRIES - 1)
            })
            .collect();
        assert!(
            used.len() > SIGHTING_ENTRIES / 2,
            "{} of {SIGHTING_ENTRIES} entries",
            used.len()
        );
    }
}
