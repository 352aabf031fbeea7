//! Limits packed into calls of one request each: lease give-backs (mode `refund`) and usage
//! settlements (mode `settle`) both go as one request of many limits. On a Redis Cluster a
//! call carries one slot's limits; every call stays within the call-size bound (counted by the
//! size model, [`CallSize`]); at most `max_calls` are made, and what does not fit is handed
//! back for the next time. Each call's timeout is as long as a decision on its keys may take:
//! the longest timeout of their rules (the clock skew for a rule that is gone).

use std::time::Duration;

use super::slots;
use crate::bounds::MAX_CALL_PATH_BYTES;
use crate::bridge::{CallSize, LimitShape};
use crate::check::LimitCheck;
use crate::config::Config;
use crate::decision::{Refund, Settlement};

/// A limit that goes as one limit of a packed request.
pub trait Packable {
    fn check(&self) -> &LimitCheck;
    /// Its arguments in the call, for the size model.
    fn shape(&self) -> LimitShape<'_>;
}

impl Packable for Refund {
    fn check(&self) -> &LimitCheck {
        &self.check
    }
    fn shape(&self) -> LimitShape<'_> {
        LimitShape::refund(self)
    }
}

impl Packable for Settlement {
    fn check(&self) -> &LimitCheck {
        &self.check
    }
    fn shape(&self) -> LimitShape<'_> {
        LimitShape::settle(self)
    }
}

/// What [`pack`] made: the calls, each with its timeout, and what is left for later.
#[derive(Debug)]
pub struct Packed<T> {
    pub calls: Vec<(Vec<T>, Duration)>,
    pub left: Vec<T>,
}

/// `items` in at most `max_calls` calls (see the module's documentation), in order within a
/// slot.
pub fn pack<T: Packable>(config: &Config, items: Vec<T>, max_calls: usize) -> Packed<T> {
    let mut items: Vec<(Option<u16>, T)> = items
        .into_iter()
        .map(|item| (slots::of_key(config, &item.check().key), item))
        .collect();
    items.sort_by_key(|(slot, _)| *slot);
    // The call's fixed part and its one request's count of limits, at its largest: every
    // limit takes 2 bytes at least, so no call holds more than half its bytes of them.
    let call = CallSize::batch();
    let fixed = call.with_request(MAX_CALL_PATH_BYTES / 2, 0).bytes();
    let mut calls: Vec<(usize, Vec<T>)> = Vec::new();
    let mut left = Vec::new();
    let mut last_slot = None;
    // The definitions the last call already holds: a limit that shares one adds only its own
    // values (items of one rule's limit nearly always do).
    let mut defined = Vec::new();
    for (slot, item) in items {
        let shape = item.shape();
        let size = call.limit_bytes(&shape);
        let definition = shape.definition();
        let shared = definition
            .filter(|d| defined.contains(d))
            .map_or(0, |_| shape.definition_bytes());
        let room = calls.len() < max_calls;
        match calls.last_mut() {
            Some((bytes, group))
                if last_slot == slot && *bytes + size - shared <= MAX_CALL_PATH_BYTES =>
            {
                *bytes += size - shared;
                group.push(item);
            }
            _ if room => {
                calls.push((fixed + size, vec![item]));
                last_slot = slot;
                defined.clear();
            }
            _ => {
                left.push(item);
                continue;
            }
        }
        defined.extend(definition);
    }
    let calls = calls
        .into_iter()
        .map(|(_, group)| {
            let timeout = group
                .iter()
                .filter_map(|item| config.rules.get(item.check().rule).map(|r| r.timeout))
                .max()
                .unwrap_or(config.clock_skew)
                .max(Duration::from_millis(1));
            (group, timeout)
        })
        .collect();
    Packed { calls, left }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::DecideCall;
    use crate::slot::key_slot;
    use crate::testing::plan::token_bucket_check;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn config(cluster: bool) -> Config {
        let json = format!(
            r#"{{"bridge": {{"redis_cluster": {cluster}, "timeout": "80ms"}}, "rules": [{{"name": "r", "limits": [{{"name": "l", "limit": 1, "window": "1s"}}]}}]}}"#
        );
        Config::parse(json.as_bytes()).unwrap()
    }

    fn settlement(key: &str) -> Settlement {
        Settlement {
            check: token_bucket_check(key),
            delta: -3,
        }
    }

    /// Every call fits the bound, as the real request writes it; a slot per call on a
    /// cluster; nothing lost: what is not in a call is left.
    #[test]
    fn calls_fit_the_bound_carry_one_slot_and_lose_nothing() {
        let long = "k".repeat(2000);
        for cluster in [false, true] {
            let c = config(cluster);
            let items: Vec<Settlement> = (0..200)
                .map(|i| settlement(&format!("rl:{{id{}}}:{long}:{i}", i % 7)))
                .collect();
            let packed = pack(&c, items, 3);
            assert_eq!(packed.calls.len(), 3);
            let count: usize = packed.calls.iter().map(|(g, _)| g.len()).sum();
            assert_eq!(count + packed.left.len(), 200);
            for (group, timeout) in &packed.calls {
                assert_eq!(*timeout, Duration::from_millis(80));
                let call = DecideCall::settle(1, 1, group);
                let path = c.program.decide(&call).path;
                assert!(path.len() <= MAX_CALL_PATH_BYTES, "{} bytes", path.len());
                let slots: Vec<u16> = group
                    .iter()
                    .map(|s| key_slot(s.check.key.as_bytes()))
                    .collect();
                if cluster {
                    assert!(slots.windows(2).all(|w| w[0] == w[1]), "one slot per call");
                }
            }
        }
    }
}
