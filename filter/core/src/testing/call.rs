//! A decision call's path read back into its limits, for tests that check what was sent:
//! the layout `lua/decide.lua` reads (see `bridge::DecideCall`).

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
    /// settlement's delta and slot id, a refund's clock and what its charge left.
    pub values: Vec<String>,
}

fn extras(mode: &str) -> usize {
    match mode {
        "lease" | "settle" | "refund" => 2,
        "hold" => 1,
        _ => 0,
    }
}

/// The limits of the call at `path` (`/EVALSHA/sha/numkeys/keys.../args...`, or a Redis
/// Cluster call for several slots of one node, `/EVALSHA/sha/0/first/K/map/others.../args...`),
/// in order; None when the path is not laid out as a decision call.
pub fn sent_limits(path: &str) -> Option<Vec<SentLimit>> {
    let parts: Vec<&str> = path.split('/').collect();
    let number = |i: usize| parts.get(i)?.parse::<usize>().ok();
    // A decision declares at least one key: none declared is a call for one node.
    let args = match number(3)? {
        0 => 6 + number(5)?,
        keys => 4 + keys,
    };
    let requests = number(args + 2)?;
    let budgets = number(args + 3)?;
    let definitions_at = args + 4 + 4 * budgets;
    let definitions = number(definitions_at)?;
    let definition = |d: usize| -> Option<&[&str]> {
        let at = definitions_at + 1 + (d.checked_sub(1)?) * 7;
        parts.get(at..at + 7)
    };
    let mut at = definitions_at + 1 + 7 * definitions;
    let mut limits = Vec::new();
    for request in 0..requests {
        let n = number(at)?;
        at += 1;
        for _ in 0..n {
            let own = parts.get(at..at + 3)?;
            let def = definition(own[1].parse().ok()?)?;
            let count = extras(def[4]);
            let values = parts.get(at + 3..at + 3 + count)?;
            limits.push(SentLimit {
                request,
                key_index: own[0].to_string(),
                algorithm: def[0].to_string(),
                limit: def[1].to_string(),
                window: def[2].to_string(),
                burst: def[3].to_string(),
                mode: def[4].to_string(),
                cost: own[2].to_string(),
                values: values.iter().map(|v| v.to_string()).collect(),
            });
            at += 3 + count;
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
