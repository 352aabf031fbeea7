//! The audit stream: every change the tool makes appends one entry per limit it changed to a
//! bounded stream `<key_prefix>{admin}:audit`, in the same MULTI as the change on a single
//! Redis, right after the change on a cluster (the stream's slot is not the identity's). Its
//! tag has neither `=` nor `:`, which every identity's tag has, so no client reaches it.

use redis::Cmd;
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::store::Store;
use crate::when::show_instant;

/// Entries kept, about (`MAXLEN ~`: Redis trims whole nodes, so a few more may stay).
pub const MAX_ENTRIES: u64 = 10_000;

pub fn key(key_prefix: &str) -> String {
    format!("{key_prefix}{{admin}}:audit")
}

/// One change, as written.
pub struct Entry<'a> {
    pub who: &'a str,
    pub what: &'a str,
    pub rule: &'a str,
    pub limit: &'a str,
    /// The keys changed, space-separated (a sharded limit has several).
    pub key: &'a str,
    pub when_ms: u64,
    /// What was set (`mode=limit limit=100 expires=…`), or what the change found.
    pub detail: &'a str,
}

/// The `XADD` that appends `e`.
pub fn append(stream: &str, e: &Entry) -> Cmd {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream)
        .arg("MAXLEN")
        .arg("~")
        .arg(MAX_ENTRIES)
        .arg("*")
        .arg(&[
            ("who", e.who),
            ("what", e.what),
            ("rule", e.rule),
            ("limit", e.limit),
            ("key", e.key),
            ("when", &e.when_ms.to_string()),
            ("detail", e.detail),
        ]);
    cmd
}

/// The latest `count` entries, newest first, each as an object of its fields and its `id`.
pub fn latest(store: &mut Store, stream: &str, count: usize) -> Result<Vec<Map<String, Value>>> {
    let entries: Vec<(String, Vec<String>)> = store.run(
        redis::cmd("XREVRANGE")
            .arg(stream)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(count),
        &format!("XREVRANGE {stream}"),
    )?;
    entries
        .into_iter()
        .map(|(id, flat)| {
            if flat.len() % 2 != 0 {
                return Err(Error::failure(format!(
                    "{stream}: entry {id} has an odd number of values"
                )));
            }
            let mut entry = Map::new();
            entry.insert("id".into(), json!(id));
            for pair in flat.chunks(2) {
                entry.insert(pair[0].clone(), json!(pair[1]));
            }
            Ok(entry)
        })
        .collect()
}

/// One entry on one line: `2026-01-31T18:00:00Z ana override set api/per_minute rl:{…}: mode=limit limit=100`.
pub fn line(entry: &Map<String, Value>) -> String {
    let field = |name: &str| entry.get(name).and_then(Value::as_str).unwrap_or("");
    let when = field("when")
        .parse::<u64>()
        .map(show_instant)
        .unwrap_or_else(|_| field("id").to_string());
    let mut line = format!(
        "{when} {} {} {}/{} {}",
        field("who"),
        field("what"),
        field("rule"),
        field("limit"),
        field("key")
    );
    if !field("detail").is_empty() {
        line.push_str(": ");
        line.push_str(field("detail"));
    }
    line
}
