//! Rolling upgrades: replicas of two releases decide on the same keys at once, each through its
//! own code. The state format is the same, so a limit holds across both: what one charges, the
//! other sees, and together they allow exactly the limit.
//!
//! - The previous call layout (`tests/upgrade/previous.lua`, nine arguments per limit) beside
//!   the current one, both as scripts.
//! - The release before the Redis Function form
//!   (`tests/upgrade/release_before_functions.lua`, called with `EVALSHA`) beside this release
//!   calling its function (`FCALL`), for every algorithm.

use e2e::script::*;

/// The previous script, loaded as Webdis's user; its hash.
fn load_previous(s: &mut Script) -> String {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/upgrade/previous.lua"))
            .expect("tests/upgrade/previous.lua");
    let sha = s.conn.cmd(&["SCRIPT", "LOAD", &text]).unwrap().text();
    assert_ne!(sha, s.sha, "two scripts side by side");
    sha
}

/// One decision of cost 1 by the previous script, in its layout: (allowed, remaining).
fn previous_decides(s: &mut Script, sha: &str, now: u128, l: &L) -> (i64, f64) {
    let (limit, window) = (l.limit.to_string(), 60_000.to_string());
    let burst = l.burst.to_string();
    let clock = now.to_string();
    let command = [
        "EVALSHA",
        sha,
        "1",
        l.key,
        &clock,
        "0",
        "1",
        "0",
        "1",
        "1",
        l.algorithm.name(),
        &limit,
        &window,
        &burst,
        "1",
        "enforce",
        "0",
        "0",
    ];
    let items = s.conn.cmd(&command).unwrap().items();
    assert_eq!((items[0].int(), items[2].int()), (1, 1), "{items:?}");
    let remaining = items[4].text().parse().expect("remaining is a number");
    (items[1].int(), remaining)
}

#[test]
fn the_previous_and_the_current_script_share_every_limit_during_an_upgrade() {
    let (_dir, _redis, mut s) = script("lua-upgrade");
    let previous = load_previous(&mut s);
    let keys = [
        "rl:{u:tb}:r:l",
        "rl:{u:gcra}:r:l",
        "rl:{u:fw}:r:l",
        "rl:{u:swc}:r:l",
        "rl:{u:log}:r:l",
    ];
    let algorithms = [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
    ];
    for (key, algorithm) in keys.into_iter().zip(algorithms) {
        let l = limit(key, algorithm, 10, 60_000);
        let mut allowed = 0;
        let mut last_remaining = 10.0;
        // One clock instant (nothing refills): the two scripts take turns, 14 requests.
        for turn in 0..14 {
            let (ok, remaining) = if turn % 2 == 0 {
                previous_decides(&mut s, &previous, T0, &l)
            } else {
                let (ok, answers) = s.decide(T0, std::slice::from_ref(&l));
                (ok, answers[0].1.parse().expect("remaining is a number"))
            };
            allowed += ok;
            if ok == 1 {
                assert_eq!(
                    remaining,
                    last_remaining - 1.0,
                    "{algorithm:?} turn {turn}: each sees what the other charged"
                );
                last_remaining = remaining;
            }
        }
        assert_eq!(allowed, 10, "{algorithm:?}: exactly the limit across both");
    }
}

/// SHA-1 of the script the release before the Function form loaded and called with `EVALSHA`.
const BEFORE_FUNCTIONS_SHA: &str = "568bf27f4dd216b9cf14d67b52517316a8f167eb";

/// A replica of the release before the Function form: its script, byte for byte as that
/// release sent it, loaded as Webdis's user and called with `EVALSHA` on its own connection.
fn release_before_functions(redis: &Redis) -> Script {
    let file = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/upgrade/release_before_functions.lua"
    ))
    .expect("tests/upgrade/release_before_functions.lua");
    let (_header, text) = file
        .split_once("\n\n")
        .expect("a header comment, an empty line, then the script");
    assert_eq!(
        ratelimit_core::sha1::sha1_hex(text.as_bytes()),
        BEFORE_FUNCTIONS_SHA,
        "the script that release sent, byte for byte"
    );
    let mut conn = redis.webdis_user();
    let sha = conn.cmd(&["SCRIPT", "LOAD", text]).unwrap().text();
    assert_eq!(sha, BEFORE_FUNCTIONS_SHA);
    let program = Program {
        kind: CallKind::Script,
        handle: sha.clone(),
    };
    Script {
        conn,
        sha,
        program,
        fields_apart: true,
    }
}

/// A replica of this release: its library loaded, its function called with `FCALL`, as the
/// filter calls Redis by default.
fn this_release(redis: &Redis) -> Script {
    let s = Script::calling(redis, CallKind::Function);
    assert_eq!(s.program.command(), "FCALL");
    s
}

/// Every algorithm with a rate (all but concurrency), each with a key per use: the two
/// releases alternating at one instant, alternating over time, and this release alone.
const RATES: [(Algorithm, [&str; 3]); 5] = [
    (
        Algorithm::TokenBucket,
        ["rl:{f:tb}:r:l", "rl:{f:tb:t}:r:l", "rl:{f:tb:a}:r:l"],
    ),
    (
        Algorithm::Gcra,
        ["rl:{f:gcra}:r:l", "rl:{f:gcra:t}:r:l", "rl:{f:gcra:a}:r:l"],
    ),
    (
        Algorithm::FixedWindow,
        ["rl:{f:fw}:r:l", "rl:{f:fw:t}:r:l", "rl:{f:fw:a}:r:l"],
    ),
    (
        Algorithm::SlidingWindowCounter,
        ["rl:{f:swc}:r:l", "rl:{f:swc:t}:r:l", "rl:{f:swc:a}:r:l"],
    ),
    (
        Algorithm::SlidingWindowLog,
        ["rl:{f:log}:r:l", "rl:{f:log:t}:r:l", "rl:{f:log:a}:r:l"],
    ),
];

/// The requests of the timed run: (ms after T0, cost); refusals and refills both happen.
fn timed_run() -> Vec<(u128, u64)> {
    (0..30u64)
        .map(|i| (u128::from(i) * 450, if i % 3 == 0 { 2 } else { 1 }))
        .collect()
}

#[test]
fn the_release_before_functions_and_this_one_share_every_limit_during_an_upgrade() {
    let (_dir, redis) = start("lua-upgrade-functions");
    let (mut before, mut this) = (release_before_functions(&redis), this_release(&redis));
    let (fcalls, evalshas) = (redis.command_calls("fcall"), redis.command_calls("evalsha"));
    let (mut by_function, mut by_script) = (0, 0);
    for (algorithm, [instant_key, timed_key, alone_key]) in RATES {
        // One instant (nothing refills): the two releases take turns, 14 requests of cost 1
        // on a limit of 10.
        let l = limit(instant_key, algorithm, 10, 60_000);
        let mut allowed = 0;
        let mut last_remaining = 10.0;
        let mut refusals = Vec::new();
        for turn in 0..14 {
            let replica = if turn % 2 == 0 {
                by_script += 1;
                &mut before
            } else {
                by_function += 1;
                &mut this
            };
            let answer = replica.one(T0, &l);
            let remaining: f64 = answer.1.parse().expect("remaining is a number");
            if answer.0 == 1 {
                allowed += 1;
                assert_eq!(
                    remaining,
                    last_remaining - 1.0,
                    "{algorithm:?} turn {turn}: each sees what the other charged"
                );
                last_remaining = remaining;
            } else {
                refusals.push(answer);
            }
        }
        assert_eq!(allowed, 10, "{algorithm:?}: exactly the limit across both");
        assert!(
            refusals.windows(2).all(|w| w[0] == w[1]),
            "{algorithm:?}: both refuse alike once it is spent: {refusals:?}"
        );

        // Over time, costs 1 and 2 on a limit of 5 a 10 s window: turn by turn, the two
        // releases alternating answer exactly what this release alone answers.
        let timed = limit(timed_key, algorithm, 5, 10_000);
        let alone = limit(alone_key, algorithm, 5, 10_000);
        let mut outcomes = [0; 2];
        for (turn, (at, cost)) in timed_run().into_iter().enumerate() {
            let now = T0 + at * MS;
            let replica = if turn % 2 == 0 {
                by_script += 1;
                &mut before
            } else {
                by_function += 1;
                &mut this
            };
            let shared = replica.one(
                now,
                &L {
                    cost,
                    ..timed.clone()
                },
            );
            by_function += 1;
            let own = this.one(
                now,
                &L {
                    cost,
                    ..alone.clone()
                },
            );
            assert_eq!(
                shared, own,
                "{algorithm:?} turn {turn} at {at} ms, cost {cost}: the same state either way"
            );
            outcomes[shared.0 as usize] += 1;
        }
        assert!(
            outcomes[0] > 0 && outcomes[1] > 0,
            "{algorithm:?}: the run both refuses and allows: {outcomes:?}"
        );
    }
    assert_eq!(
        (
            redis.command_calls("evalsha") - evalshas,
            redis.command_calls("fcall") - fcalls
        ),
        (by_script, by_function),
        "the release before called its script, this one its function"
    );
}

#[test]
fn the_release_before_functions_and_this_one_share_concurrency_slots() {
    const KEY: &str = "rl:{f:in_flight}:r:l";
    let (_dir, redis) = start("lua-upgrade-functions-concurrency");
    let (mut before, mut this) = (release_before_functions(&redis), this_release(&redis));
    let slots = |member| limit(KEY, Algorithm::Concurrency, 2, 5_000).held_by(member);
    let held = || redis.admin().cmd(&["ZCARD", KEY]).unwrap().int();
    assert_eq!(before.one(T0, &slots("w.1")).0, 1);
    assert_eq!(this.one(T0, &slots("w.2")).0, 1);
    assert_eq!(held(), 2, "one slot held by each release");
    // Full for both: each sees the other's slot.
    let refused = before.one(T0 + MS, &slots("w.3"));
    assert_eq!(refused.0, 0);
    assert_eq!(this.one(T0 + MS, &slots("w.3")), refused);
    // This release frees the slot the release before took, and the release before gets in.
    this.settle(T0 + 2 * MS, &slots("w.1"), -1);
    assert_eq!(held(), 1);
    assert_eq!(before.one(T0 + 3 * MS, &slots("w.3")).0, 1);
    // The release before frees this release's slot, and this release gets in.
    before.settle(T0 + 4 * MS, &slots("w.2"), -1);
    assert_eq!(held(), 1);
    assert_eq!(this.one(T0 + 5 * MS, &slots("w.4")).0, 1);
    assert_eq!(held(), 2);
    assert_eq!(before.one(T0 + 6 * MS, &slots("w.5")).0, 0, "full again");
}
