//! Usage settlements in the decision script, against a real Redis: a debt refuses until it is
//! repaid (with the exact retry), a give-back never raises a limit past its allowance, and mode
//! `after` admits while a unit is left and charges nothing.

use e2e::script::*;

const METERED: [(Algorithm, &str); 4] = [
    (Algorithm::TokenBucket, "rl:t:u-tb"),
    (Algorithm::Gcra, "rl:t:u-gcra"),
    (Algorithm::FixedWindow, "rl:t:u-fw"),
    (Algorithm::SlidingWindowCounter, "rl:t:u-swc"),
];

#[test]
fn token_bucket_debt_refuses_until_repaid_with_the_exact_retry() {
    let (_dir, _redis, mut s) = script("lua-settle-debt-tb");
    // 100 tokens per second (1 per 10 ms); a reservation of 40, then the usage was 130.
    let l = limit("rl:t:debt-tb", Algorithm::TokenBucket, 100, 1000);
    let reserve = L {
        cost: 40,
        ..l.clone()
    };
    assert_eq!(
        s.one(T0, &reserve),
        (1, "60".into(), "400".into(), "0".into())
    );
    s.settle(T0, &l, 90);
    // Balance -30: never shown below 0; a request of 40 fits once 70 tokens came back (700 ms).
    assert_eq!(
        s.one(T0, &reserve),
        (0, "0".into(), "1300".into(), "700".into())
    );
    assert_eq!(s.one(T0 + 699 * MS, &reserve).0, 0);
    assert_eq!(
        s.one(T0 + 700 * MS, &reserve),
        (1, "0".into(), "1000".into(), "0".into())
    );
}

#[test]
fn fixed_window_debt_is_repaid_by_the_next_windows() {
    let (_dir, _redis, mut s) = script("lua-settle-debt-fw");
    let l = limit("rl:t:debt-fw", Algorithm::FixedWindow, 10, 1000);
    assert_eq!(s.one(T0, &l).0, 1);
    // The response used 25: 24 more, 25 counted in a window of 10: the next window starts at
    // 15, the one after at 5, and a request fits again only then (2 s from now).
    s.settle(T0, &l, 24);
    assert_eq!(s.one(T0, &l), (0, "0".into(), "3000".into(), "2000".into()));
    assert_eq!(
        s.one(T0 + 1500 * MS, &l),
        (0, "0".into(), "1500".into(), "500".into())
    );
    assert_eq!(
        s.one(T0 + 2000 * MS, &l),
        (1, "4".into(), "1000".into(), "0".into())
    );
}

#[test]
fn a_debt_refuses_on_every_metered_algorithm_and_a_give_back_restores_it() {
    let (_dir, _redis, mut s) = script("lua-settle-all");
    for (algorithm, key) in METERED {
        let l = limit(key, algorithm, 10, 1000);
        let reserve = L {
            cost: 4,
            ..l.clone()
        };
        assert_eq!(s.one(T0, &reserve).0, 1, "{algorithm:?}");
        // The usage was 12: 8 more, the balance is 10 - 12 < 0.
        s.settle(T0, &l, 8);
        let (allowed, remaining, _, retry) = s.one(T0, &l);
        assert_eq!((allowed, remaining.as_str()), (0, "0"), "{algorithm:?}");
        assert!(
            retry.parse::<u64>().unwrap() > 100,
            "{algorithm:?}: {retry}"
        );
        // Giving back 12 (the whole usage) makes the limit whole, and no more than whole.
        s.settle(T0, &l, -12);
        let whole = L {
            cost: 10,
            ..l.clone()
        };
        assert_eq!(s.one(T0, &whole).0, 1, "{algorithm:?}: all 10 back");
        assert_eq!(s.one(T0, &l).0, 0, "{algorithm:?}: not one more");
    }
}

#[test]
fn a_give_back_never_raises_a_limit_past_its_allowance() {
    let (_dir, redis, mut s) = script("lua-settle-bound");
    for (algorithm, key) in METERED {
        let l = limit(key, algorithm, 10, 1000);
        let reserve = L {
            cost: 5,
            ..l.clone()
        };
        assert_eq!(s.one(T0, &reserve).0, 1, "{algorithm:?}");
        s.settle(T0, &l, -1000);
        let whole = L {
            cost: 10,
            ..l.clone()
        };
        assert_eq!(s.one(T0, &whole).0, 1, "{algorithm:?}: whole again");
        assert_eq!(s.one(T0, &l).0, 0, "{algorithm:?}: never more than whole");
        // A give-back on a state that expired (or never was) adds nothing to a fresh one.
        let fresh = L {
            key: match algorithm {
                Algorithm::TokenBucket => "rl:t:u-fresh-tb",
                Algorithm::Gcra => "rl:t:u-fresh-gcra",
                Algorithm::FixedWindow => "rl:t:u-fresh-fw",
                _ => "rl:t:u-fresh-swc",
            },
            ..l.clone()
        };
        s.settle(T0, &fresh, -5);
        assert_eq!(redis.admin().cmd(&["EXISTS", fresh.key]).unwrap().int(), 0);
        // A debt on it is charged on a fresh state: 10 - 13 leaves nothing.
        s.settle(T0, &fresh, 13);
        assert_eq!(
            s.one(T0, &fresh).0,
            0,
            "{algorithm:?}: a debt on a fresh state"
        );
    }
}

#[test]
fn after_mode_admits_while_a_unit_is_left_and_charges_nothing() {
    let (_dir, _redis, mut s) = script("lua-after");
    for (algorithm, key) in METERED {
        let after = L {
            cost: 500,
            after: true,
            ..limit(key, algorithm, 10, 1000)
        };
        // The estimate (500) is far above the limit; the request is let in charging nothing.
        let (allowed, remaining, _, _) = s.one(T0, &after);
        assert_eq!((allowed, remaining.as_str()), (1, "10"), "{algorithm:?}");
        assert_eq!((s.one(T0, &after).0, s.one(T0, &after).0), (1, 1));
        // Its usage (9) leaves 1 unit: still admitted; 1 more: refused until a unit is back.
        s.settle(T0, &after, 9);
        assert_eq!(s.one(T0, &after).0, 1, "{algorithm:?}");
        s.settle(T0, &after, 1);
        let (allowed, remaining, _, retry) = s.one(T0, &after);
        assert_eq!((allowed, remaining.as_str()), (0, "0"), "{algorithm:?}");
        assert!(retry.parse::<u64>().unwrap() > 0, "{algorithm:?}");
    }
    // Token bucket: 10 per second, 3 units of debt: a unit is left again after 400 ms.
    let after = L {
        after: true,
        ..limit("rl:t:u-after-tb", Algorithm::TokenBucket, 10, 1000)
    };
    s.settle(T0, &after, 13);
    assert_eq!(
        s.one(T0, &after),
        (0, "0".into(), "1300".into(), "400".into())
    );
    assert_eq!(s.one(T0 + 400 * MS, &after).0, 1);
}

#[test]
fn a_settlement_request_holds_only_settlements() {
    let (_dir, _redis, mut s) = script("lua-settle-bad");
    let l = limit("rl:t:u-bad", Algorithm::SlidingWindowLog, 10, 1000);
    let command = DecideCall::settle(
        T0,
        0,
        &[Settlement {
            check: l.check(),
            delta: 3,
        }],
    )
    .command(s.program.command(), &s.program.handle);
    let items = s.conn.cmd(&command).unwrap().items();
    assert_eq!(items[1].int(), -1, "{items:?}: no settlement for a log");
}
