//! Which rules can apply to one request together: the bound on what one request carries
//! adds up only the rules whose matches may meet.

use super::{Match, PathMatch, Test};

/// Whether one request can match both rules: false only when their matches provably exclude
/// each other. Sound because a request has one path, one method, and (repeats being refused)
/// at most one value of each source a rule matches on.
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
    let conditions_meet = !a.conditions.iter().any(|x| {
        b.conditions
            .iter()
            .any(|y| x.source == y.source && excludes(&x.test, &y.test))
    });
    paths_meet && methods_meet && conditions_meet
}

/// Whether no value of one source passes both tests.
fn excludes(a: &Test, b: &Test) -> bool {
    let within = |v: &[Vec<u8>], w: &[Vec<u8>]| v.iter().all(|x| w.contains(x));
    match (a, b) {
        (Test::In(v), Test::In(w)) => !v.iter().any(|x| w.contains(x)),
        (Test::In(v), Test::NotIn(w)) | (Test::NotIn(w), Test::In(v)) => within(v, w),
        (Test::In(_) | Test::Present, Test::Absent)
        | (Test::Absent, Test::In(_) | Test::Present) => true,
        _ => false,
    }
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

    #[test]
    fn plans_and_disjoint_conditions_exclude_each_other() {
        let c = parse(
            r#"{"rules": [
              {"name": "api", "plan_from": "metadata:ns:plan", "plans": [
                {"name": "pro", "values": ["pro"], "limits": [{"name": "l", "limit": 5, "window": "1s"}]},
                {"name": "free", "values": ["free"], "limits": [{"name": "l", "limit": 2, "window": "1s"}]},
                {"name": "other", "default": true, "limits": [{"name": "l", "limit": 1, "window": "1s"}]}]},
              {"name": "absent", "match": {"sources": [{"source": "metadata:ns:plan", "present": false}]},
               "limits": [{"name": "l", "limit": 1, "window": "1s"}]},
              {"name": "present", "match": {"sources": [{"source": "metadata:ns:plan", "present": true}]},
               "limits": [{"name": "l", "limit": 1, "window": "1s"}]},
              {"name": "other_source", "match": {"sources": [{"source": "metadata:ns:tier", "in": ["pro"]}]},
               "limits": [{"name": "l", "limit": 1, "window": "1s"}]}]}"#,
        )
        .unwrap();
        let m = |i: usize| &c.rules[i].matcher;
        let (pro, free, other, absent, present, tier) = (0, 1, 2, 3, 4, 5);
        for (a, b) in [
            (pro, free),
            (pro, other),
            (free, other),
            (pro, absent),
            (present, absent),
        ] {
            assert!(!may_overlap(m(a), m(b)), "{a} / {b}");
            assert!(!may_overlap(m(b), m(a)), "{b} / {a}");
        }
        for (a, b) in [
            (other, absent),
            (pro, present),
            (other, present),
            (pro, tier),
        ] {
            assert!(may_overlap(m(a), m(b)), "{a} / {b}");
        }
    }
}
