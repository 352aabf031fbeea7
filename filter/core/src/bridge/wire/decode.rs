//! A decision call's path read back into its limits: the layout [`super`] writes, read as
//! `lua/decide.lua` reads it (tests check with it what was sent).

use super::{WireMode, DEFINITION_FIELDS, FIELD_SEPARATOR, LIMIT_FIELDS};

/// One limit of a call as sent: its definition's values, its own and its mode's, as the
/// path's segments (percent-encoded: `0%2E5` is `0.5`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentLimit {
    /// The request it belongs to, from 0 in the call.
    pub request: usize,
    pub key_index: String,
    pub algorithm: String,
    pub limit: String,
    pub window: String,
    pub burst: String,
    pub mode: String,
    pub cost: String,
    /// What the mode adds after the cost: a lease's units and fraction, a hold's id, a
    /// settlement's delta and hold id, a refund's clock and what its charge left.
    pub values: Vec<String>,
}

/// The limits of the call at `path` (`/FCALL/name/numkeys/keys.../args...` or the same with
/// `EVALSHA/sha`, or a Redis Cluster call for several slots of one node,
/// `/EVALSHA/sha/0/first/K/map/others.../args...`), in order; None when the path is not laid
/// out as a decision call.
pub fn sent_limits(path: &str) -> Option<Vec<SentLimit>> {
    let parts: Vec<&str> = path.split('/').collect();
    let number = |i: usize| parts.get(i)?.parse::<usize>().ok();
    let fields =
        |i: usize| -> Option<Vec<&str>> { Some(parts.get(i)?.split(FIELD_SEPARATOR).collect()) };
    // A decision declares at least one key: none declared is a call for one node.
    let args = match number(3)? {
        0 => 6 + number(5)?,
        keys => 4 + keys,
    };
    // The head's counts: requests, key budgets, definitions.
    let head: Vec<usize> = fields(args + 2)?
        .iter()
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let [requests, budgets, definitions] = head[..] else {
        return None;
    };
    // The definitions follow the four arguments of each budget.
    let definitions_at = args + 3 + 4 * budgets;
    let definition = |d: usize| -> Option<Vec<&str>> {
        let def = fields(definitions_at + d.checked_sub(1)?)?;
        (def.len() == DEFINITION_FIELDS).then_some(def)
    };
    let mut at = definitions_at + definitions;
    let mut limits = Vec::new();
    for request in 0..requests {
        let n = number(at)?;
        at += 1;
        for _ in 0..n {
            let own = fields(at)?;
            if own.len() != LIMIT_FIELDS {
                return None;
            }
            let [key_index, def_index, cost] = own.as_slice() else {
                return None;
            };
            let def = definition(def_index.parse().ok()?)?;
            let [algorithm, limit, window, burst, mode, ..] = def.as_slice() else {
                return None;
            };
            let count = WireMode::values_of(mode)?;
            let values = parts.get(at + 1..at + 1 + count)?;
            limits.push(SentLimit {
                request,
                key_index: key_index.to_string(),
                algorithm: algorithm.to_string(),
                limit: limit.to_string(),
                window: window.to_string(),
                burst: burst.to_string(),
                mode: mode.to_string(),
                cost: cost.to_string(),
                values: values.iter().map(|v| v.to_string()).collect(),
            });
            at += 1 + count;
        }
    }
    (at == parts.len()).then_some(limits)
}

/// The limits of `path` sent in `mode`.
pub fn sent_in_mode(path: &str, mode: &str) -> Vec<SentLimit> {
    sent_limits(path)
        .unwrap_or_default()
        .into_iter()
        .filter(|l| l.mode == mode)
        .collect()
}
