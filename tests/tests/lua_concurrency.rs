//! Concurrency limits in the decision script, against a real Redis: holds named by request id
//! until released or until their admission's deadline (`max_duration`), all or nothing with
//! the request's other limits, and released by id from a refund too.

use e2e::script::*;

const KEY: &str = "rl:{k=a}:r:in_flight";

/// At most `limit` in flight, each held at most 5 s.
fn holds(limit: u64, member: &'static str) -> L {
    limit_of(limit).held_by(member)
}

fn limit_of(n: u64) -> L {
    limit(KEY, Algorithm::Concurrency, n, 5_000)
}

fn held(redis: &Redis) -> i64 {
    redis.admin().cmd(&["ZCARD", KEY]).unwrap().int()
}

#[test]
fn requests_are_admitted_while_fewer_than_the_limit_are_in_flight_and_a_release_frees_one() {
    let (_dir, redis, mut s) = script("lua-concurrency-hold");
    assert_eq!(
        s.one(T0, &holds(2, "w.1")),
        (1, "1".into(), "0".into(), "0".into())
    );
    assert_eq!(s.one(T0, &holds(2, "w.2")).0, 1);
    assert_eq!(held(&redis), 2);
    // Full: refused, retry within a second, whole again by the oldest deadline at the latest.
    let (outcome, remaining, reset, retry) = s.one(T0 + 1000 * MS, &holds(2, "w.3"));
    assert_eq!((outcome, remaining.as_str()), (0, "0"));
    assert_eq!((reset.as_str(), retry.as_str()), ("4000", "1000"));
    // The hold's score is its deadline: admission + max_duration.
    let score = redis.admin().cmd(&["ZSCORE", KEY, "w.1"]).unwrap().text();
    assert_eq!(score, ((T0 / MS) + 5_000).to_string());
    // w.1's stream ended: its release ends its hold, and w.3 gets in.
    s.settle(T0 + 1001 * MS, &holds(2, "w.1"), -1);
    assert_eq!(held(&redis), 1);
    assert_eq!(s.one(T0 + 1002 * MS, &holds(2, "w.3")).0, 1);
    // A release of a hold already gone releases nothing more.
    s.settle(T0 + 1003 * MS, &holds(2, "w.1"), -1);
    assert_eq!(held(&redis), 2);
    let ttl = redis.admin().cmd(&["PTTL", KEY]).unwrap().int();
    assert!((60_000..=65_000).contains(&ttl), "PTTL {ttl}");
}

#[test]
fn a_hold_never_released_ends_at_its_deadline_not_before() {
    let (_dir, redis, mut s) = script("lua-concurrency-deadline");
    assert_eq!(s.one(T0, &holds(1, "gone.1")).0, 1);
    let (outcome, _, reset, retry) = s.one(T0 + 4_999 * MS, &holds(1, "w.2"));
    assert_eq!((outcome, reset.as_str(), retry.as_str()), (0, "1", "1"));
    assert_eq!(s.one(T0 + 5_000 * MS, &holds(1, "w.2")).0, 1);
    assert_eq!(
        held(&redis),
        1,
        "the expired hold is gone, the new one taken"
    );
}

#[test]
fn a_hold_is_taken_only_if_every_limit_of_the_request_allows() {
    let (_dir, redis, mut s) = script("lua-concurrency-all-or-nothing");
    let rate = limit("rl:{k=a}:r:per_second", Algorithm::TokenBucket, 1, 1000);
    let (committed, _) = s.decide(T0, &[holds(5, "w.1"), rate.clone()]);
    assert_eq!(committed, 1);
    let (committed, answers) = s.decide(T0, &[holds(5, "w.2"), rate]);
    assert_eq!(committed, 0);
    assert_eq!(answers[0].0, 1, "the concurrency limit had room");
    assert_eq!(
        held(&redis),
        1,
        "but no hold is taken for a refused request"
    );
    // Redis Cluster: a slot given back because another slot refused the request.
    s.refund(T0 + MS, &holds(5, "w.1"), T0, 4.0);
    assert_eq!(held(&redis), 0);
}

#[test]
fn a_concurrency_limit_without_a_request_id_is_refused_as_bad_arguments() {
    let (_dir, redis, mut s) = script("lua-concurrency-bad");
    let answer = s.decide_batch(T0, &[&[holds(2, "")], &[holds(2, "w.1")]]);
    assert!(
        matches!(&answer[0], Err(e) if e.contains("bad arguments")),
        "{answer:?}"
    );
    assert!(
        matches!(&answer[1], Ok((1, _))),
        "the other request is decided"
    );
    assert_eq!(held(&redis), 1);
    // With an override: another number of holds, read in the same call.
    let over = || limit_of(2).with_overrides();
    redis
        .admin()
        .cmd(&[
            "HSET",
            "rl:{k=a}:r:in_flight:override",
            "mode",
            "limit",
            "limit",
            "3",
        ])
        .unwrap();
    assert_eq!(s.one(T0, &over().held_by("w.2")).0, 1 + 4 + 16 * 3);
    assert_eq!(s.one(T0, &over().held_by("w.3")).0, 1 + 4 + 16 * 3);
    assert_eq!(s.one(T0, &over().held_by("w.4")).0, 4 + 16 * 3);
}

/// A hold under no request id (a plan sent before its request was admitted) could never be
/// released: that request is refused with an error naming its limit, and nothing is held.
#[test]
fn a_hold_under_no_id_is_refused_as_malformed() {
    let (_dir, redis, mut s) = script("lua-concurrency-no-id");
    let answers = s.decide_batch(T0, &[&[holds(2, "")], &[holds(2, "w.1")]]);
    assert_eq!(
        answers[0],
        Err("ERR decide: bad arguments for limit 1".to_string())
    );
    assert_eq!(answers[1].as_ref().map(|a| a.0), Ok(1), "{answers:?}");
    assert_eq!(held(&redis), 1);
}
