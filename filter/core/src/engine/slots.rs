//! Redis Cluster hash slots as the engine uses them: a script may only touch keys of one slot,
//! so every call carries one slot's keys. Without `bridge.redis_cluster` there are no slots
//! (None, or no groups), and everything may share a call.

use crate::check::LimitCheck;
use crate::config::Config;
use crate::request::plan::Plan;
use crate::slot::key_slot;

/// The slot of `key` on a Redis Cluster; None without one.
pub fn of_key(config: &Config, key: &str) -> Option<u16> {
    config.redis_cluster.then(|| key_slot(key.as_bytes()))
}

/// The slot of a plan's keys (its first key's: the caller knows they share it); None without
/// a Redis Cluster.
pub fn of_plan(config: &Config, plan: &Plan) -> Option<u16> {
    plan.checks
        .first()
        .and_then(|check| of_key(config, &check.key))
}

/// Whether a plan's keys live on more than one slot (it cannot go as one call).
pub fn spans_slots(config: &Config, plan: &Plan) -> bool {
    let mut slots = plan.checks.iter().map(|c| of_key(config, &c.key));
    let first = slots.next();
    slots.any(|s| Some(s) != first)
}

/// A plan's checks grouped by slot, in order of first appearance: (slot, indexes into
/// `plan.checks`); none without a Redis Cluster.
pub fn groups(config: &Config, plan: &Plan) -> Vec<(u16, Vec<usize>)> {
    match config.redis_cluster {
        true => by_slot(&plan.checks),
        false => Vec::new(),
    }
}

/// Checks grouped by slot, in order of first appearance: (slot, indexes).
pub fn by_slot(checks: &[LimitCheck]) -> Vec<(u16, Vec<usize>)> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, check) in checks.iter().enumerate() {
        let slot = key_slot(check.key.as_bytes());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, indexes)) => indexes.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::plan::{plan_of, token_bucket_check};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn config(cluster: bool) -> Config {
        let json = format!(
            r#"{{"bridge": {{"redis_cluster": {cluster}}}, "rules": [{{"name": "r", "limits": [{{"name": "l", "limit": 1, "window": "1s"}}]}}]}}"#
        );
        Config::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn checks_are_grouped_by_slot_in_order() {
        let keys = ["rl:{ip:a}:r:s", "rl:{key:b}:k:s", "rl:{ip:a}:r:m"];
        let p = plan_of(keys.iter().map(|k| token_bucket_check(k)).collect());
        let grouped = by_slot(&p.checks);
        assert_eq!(grouped.len(), 2);
        assert_eq!(grouped[0].1, vec![0, 2]);
        assert_eq!(grouped[1].1, vec![1]);
        assert_eq!(grouped[0].0, key_slot(b"ip:a"));
        let (cluster, single) = (config(true), config(false));
        assert!(spans_slots(&cluster, &p));
        assert_eq!(of_plan(&cluster, &p), Some(key_slot(b"ip:a")));
        assert!(!spans_slots(&single, &p), "one Redis: no slots");
        assert_eq!(of_plan(&single, &p), None);
        assert!(groups(&single, &p).is_empty());
        assert_eq!(groups(&cluster, &p).len(), 2);
    }
}
