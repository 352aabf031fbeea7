//! The filter's rate-limit headers on a response that carries the upstream's own: an
//! OpenAI-compatible API sends `x-ratelimit-*` on every answer, and two values of one header
//! reach a client as one list (`1999000, 2734`), which no client reads as a number.
//!
//! Each header that describes one limit gets one value. The headers that describe a limit
//! together (its limit, remaining and reset) come from one side, whichever has fewer units
//! left: the filter's on a tie or when the upstream's count is not a number, the upstream's
//! when its own limit is the tighter. The IETF fields (`RateLimit`, `RateLimit-Policy`) are
//! lists of named limits, so the filter's items go after the upstream's.

use super::Headers;

/// What becomes of one response header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// This value and no other: any the upstream sent is removed first.
    Set(&'static str, String),
    /// Added beside any the upstream sent (a list field).
    Append(&'static str, String),
    /// The upstream's removed: its limit is described by the filter's headers of the set.
    Remove(&'static str),
}

/// The headers that describe one limit together, the remaining count second.
const SETS: [[&str; 3]; 3] = [
    [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ],
    [
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ],
    [
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ],
];

/// The IETF fields, lists of one item per limit.
const LISTS: [&str; 2] = ["ratelimit", "ratelimit-policy"];

/// How the filter's `ours` go onto a response whose own header `name` is `upstream(name)`
/// (its first value). Looks up only the remaining count of each set the filter writes.
pub fn writes(ours: Headers, upstream: &mut dyn FnMut(&str) -> Option<String>) -> Vec<Write> {
    let mut out = Vec::with_capacity(ours.len() + 1);
    for set in SETS {
        let of_set: Vec<&(&'static str, String)> =
            ours.iter().filter(|(name, _)| set.contains(name)).collect();
        if of_set.is_empty() {
            continue;
        }
        let count = |value: Option<&str>| {
            value
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|n| n.is_finite() && *n >= 0.0)
        };
        let remaining = set[1];
        let mine = count(
            of_set
                .iter()
                .find(|(name, _)| *name == remaining)
                .map(|(_, v)| v.as_str()),
        );
        let theirs = count(upstream(remaining).as_deref());
        if let (Some(mine), Some(theirs)) = (mine, theirs) {
            if theirs < mine {
                continue;
            }
        }
        for name in set {
            match of_set.iter().find(|(n, _)| *n == name) {
                Some((name, value)) => out.push(Write::Set(name, value.clone())),
                None => out.push(Write::Remove(name)),
            }
        }
    }
    for (name, value) in ours {
        if LISTS.contains(&name) {
            out.push(Write::Append(name, value));
        } else if !SETS.iter().any(|set| set.contains(&name)) {
            out.push(Write::Set(name, value));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn openai(requests: (u64, u64), tokens: (u64, u64)) -> Headers {
        vec![
            ("x-ratelimit-limit-requests", requests.0.to_string()),
            ("x-ratelimit-remaining-requests", requests.1.to_string()),
            ("x-ratelimit-reset-requests", "1s".to_string()),
            ("x-ratelimit-limit-tokens", tokens.0.to_string()),
            ("x-ratelimit-remaining-tokens", tokens.1.to_string()),
            ("x-ratelimit-reset-tokens", "6m0s".to_string()),
        ]
    }

    fn from<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl FnMut(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn without_the_upstreams_headers_every_one_is_set() {
        let w = writes(openai((60, 59), (4000, 3900)), &mut from(&[]));
        let set: Vec<Write> = openai((60, 59), (4000, 3900))
            .into_iter()
            .map(|(n, v)| Write::Set(n, v))
            .collect();
        assert_eq!(w, set);
    }

    #[test]
    fn each_set_comes_whole_from_the_side_with_fewer_units_left() {
        // The upstream's tokens are tighter (2,734 left against 3,900), its requests looser.
        let upstream = [
            ("x-ratelimit-remaining-requests", "9999"),
            ("x-ratelimit-remaining-tokens", "2734"),
        ];
        let w = writes(openai((60, 59), (4000, 3900)), &mut from(&upstream));
        assert_eq!(
            w,
            vec![
                Write::Set("x-ratelimit-limit-requests", "60".into()),
                Write::Set("x-ratelimit-remaining-requests", "59".into()),
                Write::Set("x-ratelimit-reset-requests", "1s".into()),
            ]
        );
        // A tie, or an upstream count that is no number, keeps the filter's.
        for theirs in ["3900", "many", "-1", "1999000, 2734", ""] {
            let upstream = [("x-ratelimit-remaining-tokens", theirs)];
            let w = writes(openai((60, 59), (4000, 3900)), &mut from(&upstream));
            assert!(
                w.contains(&Write::Set("x-ratelimit-remaining-tokens", "3900".into())),
                "{theirs}: {w:?}"
            );
        }
    }

    #[test]
    fn a_header_of_the_set_the_filter_does_not_write_is_removed() {
        // A block without expiry shows no reset: the upstream's would describe another limit.
        let ours = vec![
            ("x-ratelimit-limit", "0".to_string()),
            ("x-ratelimit-remaining", "0".to_string()),
        ];
        let upstream = [("x-ratelimit-remaining", "5"), ("x-ratelimit-reset", "30")];
        assert_eq!(
            writes(ours, &mut from(&upstream)),
            vec![
                Write::Set("x-ratelimit-limit", "0".into()),
                Write::Set("x-ratelimit-remaining", "0".into()),
                Write::Remove("x-ratelimit-reset"),
            ]
        );
    }

    #[test]
    fn the_ietf_lists_are_appended_and_other_headers_set() {
        let ours = vec![
            ("ratelimit-policy", "\"api.minute\";q=10;w=60".to_string()),
            ("ratelimit", "\"api.minute\";r=9;t=60".to_string()),
            ("retry-after", "3".to_string()),
        ];
        let mut asked = Vec::new();
        let w = writes(ours, &mut |name: &str| {
            asked.push(name.to_string());
            None
        });
        assert_eq!(
            w,
            vec![
                Write::Append("ratelimit-policy", "\"api.minute\";q=10;w=60".into()),
                Write::Append("ratelimit", "\"api.minute\";r=9;t=60".into()),
                Write::Set("retry-after", "3".into()),
            ]
        );
        assert!(
            asked.is_empty(),
            "no set written, nothing looked up: {asked:?}"
        );
    }
}
