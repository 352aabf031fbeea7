//! A rolling upgrade: replicas on the previous call layout (`tests/upgrade/previous.lua`, nine
//! arguments per limit) and on the current one decide on the same keys at once, each through
//! its own script. The state format is the same, so a limit holds across both: what one
//! charges, the other sees, and together they allow exactly the limit.

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
