//! Overrides in the decision script, against a real Redis: an operator's hash beside the state
//! (`<state key>:override`) read in the same call: another limit and burst, `unlimited`,
//! `blocked` (with or without expiry), and malformed overrides ignored and reported.

use e2e::script::*;

const KEY: &str = "rl:{k=a}:r:l";
const OVERRIDE: &str = "rl:{k=a}:r:l:override";

fn set(redis: &Redis, fields: &[&str]) {
    let mut admin = redis.admin();
    admin.cmd(&["DEL", OVERRIDE]).unwrap();
    let mut command = vec!["HSET", OVERRIDE];
    command.extend_from_slice(fields);
    admin.cmd(&command).unwrap();
}

/// How many of `n` requests of cost 1 at `now` are allowed, and the outcome of the last one.
fn allowed_of(s: &mut Script, now: u128, l: &L, n: usize) -> (usize, i64) {
    let mut allowed = 0;
    let mut last = 0;
    for _ in 0..n {
        let (outcome, ..) = s.one(now, l);
        allowed += usize::from(outcome & 1 == 1);
        last = outcome;
    }
    (allowed, last)
}

#[test]
fn without_an_override_a_limit_that_reads_overrides_decides_as_configured() {
    let (_dir, _redis, mut s) = script("lua-overrides-none");
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
    ] {
        let key: &'static str = Box::leak(format!("rl:{{k=a}}:r:{}", algorithm.name()).into());
        let plain = limit(key, algorithm, 5, 1000);
        let (allowed, last) = allowed_of(&mut s, T0, &plain.with_overrides(), 7);
        assert_eq!((allowed, last), (5, 0), "{}", algorithm.name());
    }
}

#[test]
fn a_limit_override_raises_and_lowers_the_limit_from_the_next_call() {
    let (_dir, redis, mut s) = script("lua-overrides-limit");
    let l = limit(KEY, Algorithm::TokenBucket, 5, 1000).with_overrides();
    set(
        &redis,
        &[
            "mode", "limit", "limit", "20", "by", "ops", "note", "plan B",
        ],
    );
    let (allowed, _) = allowed_of(&mut s, T0, &l, 25);
    assert_eq!(allowed, 20, "the override's limit (and burst) apply");
    let (outcome, remaining, reset, _) = s.one(T0, &l);
    assert_eq!(
        outcome,
        4 + 16 * 20,
        "refused under the override, which says its quota"
    );
    assert_eq!(remaining, "0");
    assert_eq!(
        reset, "1000",
        "a bucket of 20 refilled at 20/s is whole in 1 s"
    );
    // Half a second later the refill is the override's rate: 10 tokens.
    let (allowed, _) = allowed_of(&mut s, T0 + 500 * MS, &l, 12);
    assert_eq!(allowed, 10);
    // Lowered to 2 per second with a burst of 3: the bucket holds 3 at most, from the next
    // call on.
    set(&redis, &["mode", "limit", "limit", "2", "burst", "3"]);
    let later = T0 + 10 * S;
    let (allowed, last) = allowed_of(&mut s, later, &l, 5);
    assert_eq!((allowed, last), (3, 4 + 16 * 3));
    // Removed: the config's numbers again.
    redis.admin().cmd(&["DEL", OVERRIDE]).unwrap();
    let (allowed, last) = allowed_of(&mut s, later + 10 * S, &l, 7);
    assert_eq!((allowed, last), (5, 0));
}

#[test]
fn a_lowered_window_limit_counts_what_was_already_spent() {
    let (_dir, redis, mut s) = script("lua-overrides-window");
    let l = limit(KEY, Algorithm::FixedWindow, 10, 60_000).with_overrides();
    assert_eq!(allowed_of(&mut s, T0, &l, 4).0, 4);
    set(&redis, &["mode", "limit", "limit", "5"]);
    assert_eq!(allowed_of(&mut s, T0 + S, &l, 3), (1, 4 + 16 * 5));
    // A burst on an algorithm without one is malformed: ignored, the config applies.
    set(&redis, &["mode", "limit", "limit", "5", "burst", "9"]);
    assert_eq!(s.one(T0 + 2 * S, &l).0, 1 + 8);
}

#[test]
fn unlimited_allows_and_charges_nothing_and_blocked_refuses_until_its_expiry() {
    let (_dir, redis, mut s) = script("lua-overrides-modes");
    let l = limit(KEY, Algorithm::TokenBucket, 2, 1000).with_overrides();
    set(&redis, &["mode", "unlimited"]);
    let (allowed, last) = allowed_of(&mut s, T0, &l, 50);
    assert_eq!((allowed, last), (50, 1 + 4));
    let state = redis.admin().cmd(&["EXISTS", KEY]).unwrap().int();
    assert_eq!(state, 0, "nothing charged, no state written");
    // A settlement of a usage limit under `unlimited` charges nothing either.
    s.settle(T0 + MS, &l, 100);
    assert_eq!(redis.admin().cmd(&["EXISTS", KEY]).unwrap().int(), 0);

    set(&redis, &["mode", "blocked"]);
    let (outcome, remaining, reset, retry) = s.one(T0 + 2 * MS, &l);
    assert_eq!((outcome, remaining.as_str()), (4, "0"));
    assert_eq!(
        (reset.as_str(), retry.as_str()),
        ("0", "0"),
        "no expiry: no time to wait for"
    );
    // An expiry is a field (Unix ms on the decision's clock), not a TTL: eviction that
    // reaches only keys with a TTL never reaches an override.
    let t0_ms = T0 / MS;
    let until = (t0_ms + 90_000).to_string();
    set(&redis, &["mode", "blocked", "until", &until]);
    let (outcome, _, reset, retry) = s.one(T0 + 3 * MS, &l);
    assert_eq!(outcome, 4);
    assert_eq!(
        (reset.as_str(), retry.as_str()),
        ("89997", "89997"),
        "the wait is until its expiry"
    );
    assert_eq!(
        redis.admin().cmd(&["PTTL", OVERRIDE]).unwrap().int(),
        -1,
        "no TTL while in force"
    );
    // Past its expiry: the config's numbers again, and the override goes a minute later.
    assert_eq!(allowed_of(&mut s, T0 + 90_000 * MS, &l, 3), (2, 0));
    let ttl = redis.admin().cmd(&["PTTL", OVERRIDE]).unwrap().int();
    assert!(
        (1..=60_000).contains(&ttl),
        "an expired override is removed: {ttl}"
    );
    // One with a TTL of its own (as written before expiries were fields) still works.
    set(&redis, &["mode", "blocked"]);
    redis.admin().cmd(&["PEXPIRE", OVERRIDE, "90000"]).unwrap();
    let (outcome, _, _, retry) = s.one(T0 + 200_000 * MS, &l);
    assert_eq!(outcome, 4);
    let retry: u64 = retry.parse().unwrap();
    assert!(
        (80_000..=90_000).contains(&retry),
        "retry is the block's TTL: {retry}"
    );
    redis.admin().cmd(&["PEXPIREAT", OVERRIDE, "1"]).unwrap();
    assert_eq!(allowed_of(&mut s, T0 + 200_001 * MS, &l, 3), (2, 0));
}

#[test]
fn an_override_in_a_shadow_rule_or_a_lease_ask_is_read_too() {
    let (_dir, redis, mut s) = script("lua-overrides-shadow-lease");
    let shadow = L {
        shadow: true,
        ..limit(KEY, Algorithm::TokenBucket, 5, 1000).with_overrides()
    };
    set(&redis, &["mode", "blocked"]);
    let (committed, answers) = s.decide(T0, &[shadow]);
    assert_eq!(
        (committed, answers[0].0),
        (1, 4),
        "a shadow limit reports the block and refuses nothing"
    );
    let leased = L {
        lease: Some(Lease {
            max_units: 10,
            fraction: 0.5,
            max_ms: 1000,
        }),
        ..limit(KEY, Algorithm::TokenBucket, 100, 1000).with_overrides()
    };
    set(&redis, &["mode", "unlimited"]);
    let (committed, answers) = s.decide(T0, std::slice::from_ref(&leased));
    assert_eq!(
        (committed, answers[0].0),
        (1, 5),
        "no lease of an unlimited identity: each request is decided"
    );
    set(&redis, &["mode", "limit", "limit", "40"]);
    let (committed, answers) = s.decide(T0, &[leased]);
    assert_eq!(answers[0].0, 1 + 4 + 16 * 40);
    assert_eq!(committed, 10, "a lease within the override's numbers");
    assert_eq!(answers[0].1, "30");
}

#[test]
fn a_malformed_override_is_reported_and_the_config_decides() {
    let (_dir, redis, mut s) = script("lua-overrides-malformed");
    let l = limit(KEY, Algorithm::SlidingWindowLog, 3, 1000).with_overrides();
    let bad: &[&[&str]] = &[
        &["mode", "bogus"],
        &["mode", "limit"],
        &["mode", "limit", "limit", "0"],
        &["mode", "limit", "limit", "-5"],
        &["mode", "limit", "limit", "1e3"],
        &["mode", "limit", "limit", "0x10"],
        &["mode", "limit", "limit", "20000"],
        &["mode", "limit", "limit", "1000000000001"],
        &["mode", "unlimited", "limit", "5"],
        &["limit", "5"],
        &["mode", "blocked", "until", "soon"],
        &["mode", "blocked", "until", "-1"],
        &["until", "99999999999999"],
    ];
    for (i, fields) in bad.iter().enumerate() {
        set(&redis, fields);
        let now = T0 + i as u128 * 10 * S;
        let outcomes: Vec<i64> = (0..4).map(|_| s.one(now, &l).0).collect();
        assert_eq!(
            outcomes,
            [9, 9, 9, 8],
            "{fields:?}: the config's 3, flagged"
        );
    }
    // Not a hash at all (written by hand): the same, never a failed decision.
    let mut admin = redis.admin();
    admin.cmd(&["DEL", OVERRIDE]).unwrap();
    admin.cmd(&["SET", OVERRIDE, "unlimited"]).unwrap();
    assert_eq!(s.one(T0 + 200 * S, &l).0, 9);
    // A token bucket whose state would outlive two years under the override's numbers.
    admin.cmd(&["DEL", OVERRIDE]).unwrap();
    let bucket = limit(
        "rl:{k=b}:r:l",
        Algorithm::TokenBucket,
        5,
        30 * 24 * 3_600_000,
    )
    .with_overrides();
    admin
        .cmd(&[
            "HSET",
            "rl:{k=b}:r:l:override",
            "mode",
            "limit",
            "limit",
            "1",
            "burst",
            "1000",
        ])
        .unwrap();
    assert_eq!(s.one(T0, &bucket).0, 9);
}
