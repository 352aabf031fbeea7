//! The Redis keys of a limit's state, its key budget's counter and overflow state: their
//! names, and why no identity can reach another's key.

pub use crate::bounds::MAX_READABLE_IDENTITY;
use crate::check::BudgetCheck;
use crate::config::{cluster_budget, Config, KeyBudget, Limit, Rule};
use crate::sha1::sha1_hex;
use crate::slot::key_slot;

/// The Redis key of one limit: `prefix{label:sha1hex(identity)}:rule:limit`, or with
/// `hash_identities` off and a short printable identity `prefix{label=identity}:rule:limit`.
/// The braces are a Redis Cluster hash tag: all limits of one identity live on one slot, so
/// one script call can decide them together.
///
/// The two forms can never name the same key: a label (`key.from` entry: `header:NAME` with a
/// token name, `client_ip`, `route`, `method`, `path`, joined by `+`, or `anonymous`) never
/// contains `=`, nor does a hex digest, so a readable key has a `=` inside its braces and a
/// hashed one has none. Otherwise a readable identity that is itself 40 hex digits would share
/// the bucket of the identity it is the SHA-1 of.
pub fn redis_key(
    config: &Config,
    rule: &Rule,
    limit: &Limit,
    label: &str,
    identity: &[u8],
) -> String {
    format!(
        "{}{}:{}:{}",
        config.key_prefix,
        identity_tag(config, label, identity),
        rule.name,
        limit.name
    )
}

/// The hash tag of an identity, braces included: `{label:sha1hex(identity)}`, or
/// `{label=identity}` for a short printable identity with `hash_identities` off.
pub fn identity_tag(config: &Config, label: &str, identity: &[u8]) -> String {
    let readable = !config.hash_identities
        && identity.len() <= MAX_READABLE_IDENTITY
        && identity
            .iter()
            .all(|&b| b.is_ascii_graphic() && b != b'{' && b != b'}');
    if readable {
        format!("{{{label}={}}}", String::from_utf8_lossy(identity))
    } else {
        format!("{{{label}:{}}}", sha1_hex(identity))
    }
}

/// Where an operator's override of a limit for one identity lives, given the limit's state
/// key: the state key and `:override`. On the identity's slot, so the script reads it with
/// the state; rule and limit names hold no `:`, so no state key has this form.
pub fn override_key(state_key: &str) -> String {
    let mut key = String::with_capacity(state_key.len() + OVERRIDE_SUFFIX.len());
    key.push_str(state_key);
    key.push_str(OVERRIDE_SUFFIX);
    key
}

/// What [`override_key`] adds to a state key.
pub const OVERRIDE_SUFFIX: &str = ":override";

/// The key counting a rule's new identities (its key budget): `prefix{key_budget}:rule`, or
/// with a Redis Cluster one per slot, `prefix{b<n>}:key_budget:rule` where `{b<n>}` is a tag
/// on that slot (`slot_tag` = n, see `slot::slot_tags`). Neither tag has `=` or `:`, and every
/// identity's tag has one of them: no identity can reach these keys.
pub fn budget_counter_key(config: &Config, rule: &Rule, slot_tag: Option<u32>) -> String {
    match slot_tag {
        None => format!("{}{{key_budget}}:{}", config.key_prefix, rule.name),
        Some(n) => format!("{}{{b{n}}}:key_budget:{}", config.key_prefix, rule.name),
    }
}

/// The state key of a limit's shared `overflow` identity (a new identity over the key budget,
/// with over_budget `shared`), per slot like [`budget_counter_key`], and out of every
/// identity's reach.
pub fn overflow_key(config: &Config, rule: &Rule, limit: &Limit, slot_tag: Option<u32>) -> String {
    match slot_tag {
        None => format!(
            "{}{{overflow}}:{}:{}",
            config.key_prefix, rule.name, limit.name
        ),
        Some(n) => format!(
            "{}{{b{n}}}:overflow:{}:{}",
            config.key_prefix, rule.name, limit.name
        ),
    }
}

/// The key of shard `shard`: `#shard` at the end of the hash tag, so each shard hashes to a
/// slot of its own (most often another node). The shard's number is the tag's last part after
/// `#`, so no two (identity, shard) pairs share a key, whatever the identity holds.
pub fn shard_key(key: &str, shard: u64) -> String {
    use std::fmt::Write;
    // One allocation of about the right size rather than `format!` over the whole key.
    let close = key.find('}').unwrap_or(key.len());
    let mut out = String::with_capacity(key.len() + 4);
    out.push_str(&key[..close]);
    // Writing into a String cannot fail.
    let _ = write!(out, "#{shard}");
    out.push_str(&key[close..]);
    out
}

/// The budget of `rule` for a limit whose state is at `key`. With a Redis Cluster the counter
/// and the overflow state are those of `key`'s slot (a script sees one slot), each slot
/// counting its share of the budget ([`cluster_budget`]).
pub fn budget_check(
    config: &Config,
    rule: &Rule,
    limit: &Limit,
    budget: &KeyBudget,
    key: &str,
) -> BudgetCheck {
    let slot_tag = config
        .budget_slot_tags
        .0
        .get(usize::from(key_slot(key.as_bytes())))
        .copied()
        .filter(|_| config.redis_cluster);
    let (new_keys, window) = match slot_tag {
        Some(_) => cluster_budget(budget),
        None => (budget.new_keys, budget.window),
    };
    BudgetCheck {
        counter_key: budget_counter_key(config, rule, slot_tag),
        overflow_key: overflow_key(config, rule, limit, slot_tag),
        new_keys,
        window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
        over_budget: budget.over_budget,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn config(extra: &str, key: &str) -> Config {
        let json = format!(
            r#"{{{extra} "rules": [{{"name": "r", "key": {key}, "limits": [{{"name": "l", "limit": 1, "window": "1s"}}]}}]}}"#
        );
        Config::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn keys_are_hashed_and_tagged() {
        let c = config("", "{}");
        let (rule, limit) = (&c.rules[0], &c.rules[0].limits[0]);
        assert_eq!(
            redis_key(&c, rule, limit, "header:x-api-key", b"abc"),
            "rl:{header:x-api-key:a9993e364706816aba3e25717850c26c9cd0d89d}:r:l"
        );
    }

    #[test]
    fn readable_keys_only_for_short_printable_identities() {
        let c = config(r#""hash_identities": false,"#, "{}");
        let (rule, limit) = (&c.rules[0], &c.rules[0].limits[0]);
        assert_eq!(
            redis_key(&c, rule, limit, "client_ip", b"1.2.3.4"),
            "rl:{client_ip=1.2.3.4}:r:l"
        );
        for identity in [
            &b"a b"[..],
            b"a}b",
            &[b'x'; MAX_READABLE_IDENTITY + 1],
            b"u\x1fGET",
        ] {
            assert_eq!(
                redis_key(&c, rule, limit, "k", identity),
                format!("rl:{{k:{}}}:r:l", sha1_hex(identity))
            );
        }
    }

    #[test]
    fn readable_and_hashed_keys_never_collide() {
        let readable = config(r#""hash_identities": false,"#, "{}");
        let (rule, limit) = (&readable.rules[0], &readable.rules[0].limits[0]);
        // An identity too long to stay readable is hashed; its digest, sent as an identity,
        // is 40 printable bytes and stays readable: the two must not share a bucket.
        let long = [b'a'; MAX_READABLE_IDENTITY + 1];
        let digest = sha1_hex(&long);
        assert_ne!(
            redis_key(&readable, rule, limit, "header:x-api-key", &long),
            redis_key(
                &readable,
                rule,
                limit,
                "header:x-api-key",
                digest.as_bytes()
            )
        );
        assert_eq!(
            redis_key(
                &readable,
                rule,
                limit,
                "header:x-api-key",
                digest.as_bytes()
            ),
            format!("rl:{{header:x-api-key={digest}}}:r:l")
        );
        // Across deployments too: a readable digest is not the hashed key of its preimage.
        let hashed = config("", "{}");
        assert_ne!(
            redis_key(&hashed, rule, limit, "header:x-api-key", b"abc"),
            redis_key(
                &readable,
                rule,
                limit,
                "header:x-api-key",
                sha1_hex(b"abc").as_bytes()
            )
        );
        // What makes it hold: no label can contain '=' (key sources are token characters).
        let labels = config(
            "",
            r#"{"from": ["header:!#$%&'*-.^_`|~+client_ip+route+method+path", "path"]}"#,
        );
        assert!(labels.rules[0]
            .key
            .alternatives
            .iter()
            .all(|a| !a.label.contains('=')));
    }
}
