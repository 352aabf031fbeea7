//! Which rules can apply to one request together: the bound on what one request carries
//! adds up only the rules whose matches may meet.

use super::{Match, PathMatch};

/// Whether one request can match both rules: false only when their matches provably exclude
/// each other. Sound because a request has one path, one method, and (repeats being refused)
/// at most one value of a header a rule matches on.
pub fn may_overlap(a: &Match, b: &Match) -> bool {
    let paths_meet = match (&a.path, &b.path) {
        (Some(PathMatch::Exact(x)), Some(PathMatch::Exact(y))) => x == y,
        (Some(PathMatch::Exact(x)), Some(PathMatch::Prefix(p)))
        | (Some(PathMatch::Prefix(p)), Some(PathMatch::Exact(x))) => x.starts_with(p.as_str()),
        (Some(PathMatch::Prefix(p)), Some(PathMatch::Prefix(q))) => {
            p.starts_with(q.as_str()) || q.starts_with(p.as_str())
        }
        _ => true,
    };
    let methods_meet = a.methods.is_empty()
        || b.methods.is_empty()
        || a.methods.iter().any(|m| b.methods.contains(m));
    let headers_meet = match (&a.header, &b.header) {
        (Some(x), Some(y)) if x.name == y.name => match (&x.value, &y.value) {
            (Some(v), Some(w)) => v == w,
            _ => true,
        },
        _ => true,
    };
    paths_meet && methods_meet && headers_meet
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::fixtures::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn overlap_is_symmetric_and_reflexive() {
        let c = parse(&config_json(
            "",
            &[
                rule_json("a", r#""path_prefix": "/api/""#, &limits(1)),
                rule_json(
                    "b",
                    r#""path_exact": "/api/x", "methods": ["GET"]"#,
                    &limits(1),
                ),
                rule_json("c", r#""path_exact": "/other""#, &limits(1)),
                rule_json(
                    "d",
                    r#""header": {"name": "x-t", "value": "1"}"#,
                    &limits(1),
                ),
                rule_json("e", "", &limits(1)),
            ],
        ))
        .unwrap();
        for a in &c.rules {
            assert!(may_overlap(&a.matcher, &a.matcher), "{}", a.name);
            for b in &c.rules {
                assert_eq!(
                    may_overlap(&a.matcher, &b.matcher),
                    may_overlap(&b.matcher, &a.matcher),
                    "{} / {}",
                    a.name,
                    b.name
                );
            }
        }
        assert!(!may_overlap(&c.rules[0].matcher, &c.rules[2].matcher));
        assert!(may_overlap(&c.rules[0].matcher, &c.rules[1].matcher));
    }
}
