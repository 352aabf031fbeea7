//! The protocol's constants for the Lua side: `lua/wire.lua`, rendered from the Rust
//! definitions ([`lua_prelude`]) and committed; a test fails when the two differ. It goes just
//! before `lua/decide.lua` (its one reader) in the decision code, and holds only `local`
//! constants and tables: a function library's top
//! level runs where Redis's globals (`math`, `tonumber`) are absent, and a local is an upvalue
//! to the code after it, as cheap to read as a literal.

use super::{
    WireMode, DEFINITION_FIELDS, FIELD_SEPARATOR, HEAD_FIELDS, LIMIT_FIELDS, OUTCOME_ALLOWED,
    OUTCOME_BAD_OVERRIDE, OUTCOME_OVERRIDE, OUTCOME_OVER_BUDGET, OUTCOME_QUOTA_UNIT,
    OVERRIDE_INDEX_SEPARATOR, RELEASE_DELTA,
};
use crate::bounds::{EXPIRED_OVERRIDE_KEPT, MAX_LIMIT, MAX_LOG_LIMIT, MAX_STATE_LIFETIME};
use crate::config::Algorithm;

/// Every algorithm (`every_algorithm_is_listed` stops compiling when one is added).
const ALGORITHMS: [Algorithm; 6] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
    Algorithm::FixedWindow,
    Algorithm::Concurrency,
];

/// How to write `lua/wire.lua` again from the Rust definitions.
pub const REGENERATE: &str = "cargo run -p ratelimit-core --example wire_prelude > lua/wire.lua";

/// A Lua pattern matching `c` itself: escaped when Lua's patterns give it a meaning.
fn pattern_char(c: char) -> String {
    if "^$()%.[]*+-?".contains(c) {
        format!("%{c}")
    } else {
        c.to_string()
    }
}

/// A Lua pattern capturing the `n` fields of an argument joined by [`FIELD_SEPARATOR`].
fn fields_pattern(n: usize) -> String {
    let separator = pattern_char(FIELD_SEPARATOR);
    let field = format!("([^{separator}]*)");
    let fields: Vec<&str> = (0..n).map(|_| field.as_str()).collect();
    format!("^{}$", fields.join(&separator))
}

/// The text of `lua/wire.lua`.
pub fn lua_prelude() -> String {
    let mut lua = format!(
        "-- The decision call's protocol for the decision code, generated from its one definition in\n\
         -- filter/core/src/bridge/wire.rs: do not edit; write it again with\n\
         --   {REGENERATE}\n\
         -- Only locals: a function library's top level runs before Redis's globals are there.\n\n\
         -- Each mode's name in a definition (see decide.lua's header).\n"
    );
    let mut seen: Vec<&str> = Vec::new();
    let mut values = Vec::new();
    for mode in WireMode::EVERY {
        let name = mode.name();
        if seen.contains(&name) {
            continue;
        }
        seen.push(name);
        lua += &format!("local MODE_{} = '{name}'\n", name.to_ascii_uppercase());
        values.push(format!("{name} = {}", mode.value_count()));
    }
    lua += &format!(
        "-- The values a limit adds after its cost, one argument each, by its definition's mode.\n\
         local MODE_VALUES = {{{}}}\n",
        values.join(", ")
    );
    lua += &format!(
        "-- The delta of a settle that releases a concurrency hold (the request's id after it).\n\
         local RELEASE_DELTA = {RELEASE_DELTA}\n"
    );
    let bursts: Vec<String> = ALGORITHMS
        .iter()
        .filter(|a| a.has_burst())
        .map(|a| format!("{} = true", a.name()))
        .collect();
    lua += &format!(
        "-- The algorithms with a burst apart from their limit.\n\
         local HAS_BURST = {{{}}}\n",
        bursts.join(", ")
    );
    lua += &format!(
        "-- The bounds an override is checked against, as the config's (bounds.rs).\n\
         local MAX_LIMIT = {MAX_LIMIT}\n\
         local MAX_LOG_LIMIT = {MAX_LOG_LIMIT}\n\
         local MAX_STATE_LIFETIME_MS = {}\n\
         -- An expired override stays this long (ms) for operators to see it, then Redis removes it.\n\
         local EXPIRED_KEPT_MS = {}\n",
        MAX_STATE_LIFETIME.as_millis(),
        EXPIRED_OVERRIDE_KEPT.as_millis()
    );
    lua += &format!(
        "-- A limit's outcome in the reply: these bits, plus OUTCOME_QUOTA_UNIT x the override's quota.\n\
         local OUTCOME_ALLOWED = {OUTCOME_ALLOWED}\n\
         local OUTCOME_OVER_BUDGET = {OUTCOME_OVER_BUDGET}\n\
         local OUTCOME_OVERRIDE = {OUTCOME_OVERRIDE}\n\
         local OUTCOME_BAD_OVERRIDE = {OUTCOME_BAD_OVERRIDE}\n\
         local OUTCOME_QUOTA_UNIT = {OUTCOME_QUOTA_UNIT}\n"
    );
    lua += &format!(
        "-- The fields of a call's head, of a definition's argument and of a limit's, and a key\n\
         -- index with its override's (\"i{OVERRIDE_INDEX_SEPARATOR}j\").\n\
         local HEAD_FIELDS = '{}'\n\
         local DEFINITION_FIELDS = '{}'\n\
         local LIMIT_FIELDS = '{}'\n\
         local KEY_AND_OVERRIDE = '^(%d+){}(%d+)$'\n",
        fields_pattern(HEAD_FIELDS),
        fields_pattern(DEFINITION_FIELDS),
        fields_pattern(LIMIT_FIELDS),
        OVERRIDE_INDEX_SEPARATOR
            .chars()
            .map(pattern_char)
            .collect::<String>()
    );
    lua
}

/// Where `committed` (the text of `lua/wire.lua`) differs from [`lua_prelude`]: None when it
/// is the same, else what differs and how to write it again.
pub fn prelude_difference(committed: &str) -> Option<String> {
    let rendered = lua_prelude();
    if committed == rendered {
        return None;
    }
    let (line, (want, found)) = rendered
        .lines()
        .map(Some)
        .chain(std::iter::repeat(None))
        .zip(committed.lines().map(Some).chain(std::iter::repeat(None)))
        .enumerate()
        .find(|(_, (a, b))| a != b)
        .unwrap_or((0, (None, None)));
    Some(format!(
        "lua/wire.lua differs from the Rust definition at line {}: expected {:?}, found {:?}; write it again with `{REGENERATE}`",
        line + 1,
        want.unwrap_or("the end"),
        found.unwrap_or("the end"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const COMMITTED: &str = include_str!("../../../../../lua/wire.lua");

    #[test]
    fn the_committed_prelude_is_the_rendered_one() {
        if let Some(difference) = prelude_difference(COMMITTED) {
            panic!("{difference}");
        }
    }

    /// The check sees a hand edit: one constant changed, a line added, a line removed.
    #[test]
    fn the_check_fails_on_a_hand_edited_prelude() {
        let rendered = lua_prelude();
        assert_eq!(prelude_difference(&rendered), None);
        let edited = rendered.replace(
            "local MAX_LIMIT = 1000000000000",
            "local MAX_LIMIT = 1000000000001",
        );
        assert_ne!(edited, rendered);
        let difference = prelude_difference(&edited).unwrap_or_default();
        assert!(
            difference.contains("local MAX_LIMIT = 1000000000000"),
            "{difference}"
        );
        assert!(difference.contains(REGENERATE), "{difference}");
        let added = format!("{rendered}local EXTRA = 1\n");
        assert!(prelude_difference(&added).is_some());
        let removed = rendered.replace("local OUTCOME_OVERRIDE = 4\n", "");
        assert!(prelude_difference(&removed).is_some());
    }

    #[test]
    fn every_algorithm_is_listed() {
        let listed = |a: Algorithm| match a {
            Algorithm::TokenBucket
            | Algorithm::Gcra
            | Algorithm::SlidingWindowCounter
            | Algorithm::SlidingWindowLog
            | Algorithm::FixedWindow
            | Algorithm::Concurrency => ALGORITHMS.contains(&a),
        };
        assert!(ALGORITHMS.into_iter().all(listed));
        assert!(listed(Algorithm::Concurrency) && listed(Algorithm::FixedWindow));
    }

    /// The prelude only defines locals: no statement at its top level but `local` ones.
    #[test]
    fn the_prelude_holds_only_local_constants() {
        for line in lua_prelude().lines() {
            assert!(
                line.is_empty()
                    || line.starts_with("-- ")
                    || line.starts_with("--   ")
                    || line.starts_with("local "),
                "{line}"
            );
            assert!(!line.starts_with("local function"), "{line}");
        }
        assert!(lua_prelude().contains(
            "local DEFINITION_FIELDS = '^([^~]*)~([^~]*)~([^~]*)~([^~]*)~([^~]*)~([^~]*)~([^~]*)$'"
        ));
    }
}
