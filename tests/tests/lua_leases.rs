//! Refunds and leases in the decision script, against a real Redis: a refund gives back what an
//! untouched charge took and never what the limit has refilled since; a lease takes a fraction of
//! what is left, sized by the tightest limit, all or none.

use e2e::script::*;

const ALL: [Algorithm; 5] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
];

#[test]
fn a_refund_gives_back_what_an_untouched_charge_took() {
    let (_dir, _redis, mut s) = script("lua-refund");
    let keys = [
        "rl:t:r-tb",
        "rl:t:r-gcra",
        "rl:t:r-fw",
        "rl:t:r-swc",
        "rl:t:r-swl",
    ];
    for (algorithm, key) in ALL.into_iter().zip(keys) {
        let l = limit(key, algorithm, 10, 1000);
        let charge = L {
            cost: 3,
            ..l.clone()
        };
        let (allowed, left, _, _) = s.one(T0, &charge);
        assert_eq!((allowed, left.as_str()), (1, "7"), "{algorithm:?}");
        s.refund(T0 + MS, &charge, T0, left.parse().unwrap());
        // The whole limit is there again: as if the charge had never been made.
        let whole = L {
            cost: 10,
            ..l.clone()
        };
        assert_eq!(s.one(T0 + MS, &whole).0, 1, "{algorithm:?}: all 10 back");
        assert_eq!(s.one(T0 + MS, &l).0, 0, "{algorithm:?}: not one more");
    }
}

#[test]
fn a_refund_never_gives_back_what_the_limit_has_since_refilled() {
    let (_dir, _redis, mut s) = script("lua-refund-absorbed");
    // 10 per second, bucket of 10. A charge of 5, then 2 s: the bucket is full again anyway,
    // so the charge holds nothing back any more. A refund must not add to the full bucket.
    for (algorithm, key) in [
        (Algorithm::TokenBucket, "rl:t:a-tb"),
        (Algorithm::Gcra, "rl:t:a-gcra"),
    ] {
        let l = limit(key, algorithm, 10, 1000);
        let charge = L {
            cost: 5,
            ..l.clone()
        };
        let (_, left, _, _) = s.one(T0, &charge);
        let later = T0 + 2 * S;
        assert_eq!(s.one(later, &l).1, "9", "{algorithm:?}");
        s.refund(later + MS, &charge, T0, left.parse().unwrap());
        let whole = L {
            cost: 10,
            ..l.clone()
        };
        assert_eq!(
            s.one(later + MS, &whole).0,
            0,
            "{algorithm:?}: still 9, not 10"
        );
        let nine = L {
            cost: 9,
            ..l.clone()
        };
        assert_eq!(s.one(later + MS, &nine).0, 1, "{algorithm:?}");
    }
    // A window that has moved on no longer counts the charge: nothing to give back.
    let fw = limit("rl:t:a-fw", Algorithm::FixedWindow, 10, 1000);
    let charge = L {
        cost: 5,
        ..fw.clone()
    };
    s.one(T0, &charge);
    let next = T0 + S + MS;
    assert_eq!(
        s.one(
            next,
            &L {
                cost: 8,
                ..fw.clone()
            }
        )
        .0,
        1
    );
    s.refund(next + MS, &charge, T0, 5.0);
    assert_eq!(
        s.one(
            next + MS,
            &L {
                cost: 3,
                ..fw.clone()
            }
        )
        .0,
        0,
        "2 left, not 7"
    );
    // Partly refilled: a bucket of 10 at 10/s charged 8 at T0 (2 left) holds 5 at T0 + 300 ms,
    // and would have been full without the charge: it holds back 5, not 8.
    let tb = limit("rl:t:a-tb2", Algorithm::TokenBucket, 10, 1000);
    let charge = L {
        cost: 8,
        ..tb.clone()
    };
    s.one(T0, &charge);
    s.refund(T0 + 300 * MS, &charge, T0, 2.0);
    // Without the charge: 10. With it, at T0 + 300 ms: 5. Back: min(8, 10 - 5) = 5.
    assert_eq!(
        s.one(
            T0 + 300 * MS,
            &L {
                cost: 10,
                ..tb.clone()
            }
        )
        .0,
        1
    );
}

#[test]
fn a_refund_request_holds_only_refunds_and_bad_refunds_fail_alone() {
    let (_dir, _redis, mut s) = script("lua-refund-bad");
    let l = limit("rl:t:rb", Algorithm::TokenBucket, 10, 1000);
    let refund = Refund {
        check: l.check(),
        charged_at_ns: UnixNs::from_ns(T0),
        left: 1.0,
    };
    let mut command =
        DecideCall::refund(T0, 0, &[refund]).command(s.program.command(), &s.program.handle);
    // The call's last two arguments are the refund's clock and what the charge left.
    let at = command.len() - 2;
    assert_eq!(command[at], T0.to_string());
    command[at] = "soon".into();
    let items = s.conn.cmd(&command).unwrap().items();
    assert_eq!((items[0].int(), items[1].int()), (1, -1));
    assert_eq!(items[2].text(), "ERR decide: bad arguments for limit 1");
}

/// A limit that asks for leases of at most `max_units`, `fraction` of what is left.
fn leasing(l: L, max_units: u64, fraction: f64) -> L {
    L {
        lease: Some(Lease {
            max_units,
            fraction,
            max_ms: 1000,
        }),
        ..l
    }
}

#[test]
fn a_lease_takes_a_fraction_of_what_is_left_and_near_the_limit_only_the_request() {
    let (_dir, _redis, mut s) = script("lua-lease-sizes");
    // Buckets of 100 that refill 1 per 1000 s: nothing comes back during the test.
    // A fixed window of 100 per 1000 s: the same units, which come back when the window ends.
    for (algorithm, key) in [
        (Algorithm::TokenBucket, "rl:t:lease-tb"),
        (Algorithm::Gcra, "rl:t:lease-gcra"),
        (Algorithm::FixedWindow, "rl:t:lease-fw"),
    ] {
        let base = match algorithm {
            Algorithm::FixedWindow => limit(key, algorithm, 100, 1_000_000),
            _ => limit(key, algorithm, 1, 1_000_000).with_burst(100),
        };
        let l = leasing(base, 10, 0.25);
        // k = min(10, floor(0.25 × left before)): 10 while 40 or more are left, then smaller,
        // then the request alone (k = 1) for the last few, then refused.
        let mut sizes = Vec::new();
        let mut lefts = Vec::new();
        loop {
            let (k, answers) = s.decide(T0, std::slice::from_ref(&l));
            if k == 0 {
                assert_eq!(answers[0].0, 0, "{algorithm:?}: refused");
                break;
            }
            sizes.push(k);
            let left: f64 = answers[0].1.parse().unwrap();
            lefts.push(left.round() as i64);
        }
        assert_eq!(
            sizes,
            [10, 10, 10, 10, 10, 10, 10, 7, 5, 4, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1],
            "{algorithm:?}"
        );
        assert_eq!(
            sizes.iter().sum::<i64>(),
            100,
            "{algorithm:?}: every unit, once"
        );
        assert_eq!(
            lefts[..8],
            [90, 80, 70, 60, 50, 40, 30, 23],
            "{algorithm:?}"
        );
        assert_eq!(*lefts.last().unwrap(), 0, "{algorithm:?}");
    }
}

#[test]
fn a_lease_is_sized_by_its_tightest_limit_and_the_cost_and_taken_on_all_or_none() {
    let (_dir, _redis, mut s) = script("lua-lease-limits");
    let wide = leasing(
        L {
            burst: 1000,
            cost: 2,
            ..limit("rl:t:lease-wide", Algorithm::TokenBucket, 1, 1_000_000)
        },
        100,
        0.5,
    );
    let narrow = leasing(
        L {
            burst: 40,
            cost: 2,
            ..limit("rl:t:lease-narrow", Algorithm::Gcra, 1, 1_000_000)
        },
        100,
        0.5,
    );
    // Narrow: floor(0.5 × 40 / 2) = 10 requests of cost 2, on both limits.
    let (k, answers) = s.decide(T0, &[wide.clone(), narrow.clone()]);
    assert_eq!(k, 10);
    assert_eq!(answers[0].1, "980");
    assert_eq!(answers[1].1, "20");
    // A limit without a lease in the request: the request alone.
    let plain = L {
        lease: None,
        ..narrow.clone()
    };
    let (k, answers) = s.decide(T0, &[wide.clone(), plain]);
    assert_eq!(
        (k, answers[0].1.as_str(), answers[1].1.as_str()),
        (1, "978", "18")
    );
    // max_units counts units, not requests: 3 units hold one request of cost 2.
    let capped = leasing(
        L {
            burst: 1000,
            cost: 2,
            ..limit("rl:t:lease-capped", Algorithm::TokenBucket, 1, 1_000_000)
        },
        3,
        1.0,
    );
    assert_eq!(s.decide(T0, std::slice::from_ref(&capped)).0, 1);
    // Refused requests take no lease and charge nothing.
    let empty = leasing(
        L {
            burst: 1,
            cost: 2,
            ..limit("rl:t:lease-empty", Algorithm::TokenBucket, 1, 1_000_000)
        },
        100,
        1.0,
    );
    let (k, answers) = s.decide(T0, &[wide, empty]);
    assert_eq!((k, answers[0].1.as_str()), (0, "978"));
}

#[test]
fn a_lease_on_a_window_or_with_bad_numbers_fails_only_its_request() {
    let (_dir, _redis, mut s) = script("lua-lease-bad");
    let good = limit("rl:t:lease-good", Algorithm::TokenBucket, 10, 1000);
    let window = leasing(
        limit("rl:t:lease-window", Algorithm::SlidingWindowLog, 10, 1000),
        5,
        0.5,
    );
    let answers = s.decide_batch(T0, &[&[window], std::slice::from_ref(&good)]);
    assert!(
        matches!(&answers[0], Err(e) if e.contains("bad arguments for limit 1")),
        "{answers:?}"
    );
    assert!(matches!(&answers[1], Ok((1, _))), "{answers:?}");
    for (max_units, fraction) in [(5, 0.0), (5, 1.5)] {
        let bad = leasing(
            limit("rl:t:lease-bad", Algorithm::TokenBucket, 10, 1000),
            max_units,
            fraction,
        );
        let answers = s.decide_batch(T0, &[&[bad]]);
        assert!(answers[0].is_err(), "{max_units} {fraction}: {answers:?}");
    }
    // The builder never asks for 0 units; the script refuses them anyway.
    let l = leasing(
        limit("rl:t:lease-bad", Algorithm::TokenBucket, 10, 1000),
        5,
        0.5,
    );
    let mut command = s.command(&T0.to_string(), &[&[l]]);
    // The call's last two arguments are its one limit's lease units and fraction.
    let at = command.len() - 2;
    assert_eq!(command[at + 1], "0.500000");
    command[at] = "0".to_string();
    let reply = s.conn.cmd(&command).unwrap().items();
    assert_eq!(reply[1].int(), -1, "{reply:?}");
}
