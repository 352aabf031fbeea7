//! One call of the decision script as the filter sends it, against a real Redis: all or nothing
//! over a request's limits, shadow limits, batches decided in order, a request's error kept to
//! itself, bad layouts and clocks, the deadline, and what the restricted user Webdis logs in as
//! may touch.

use e2e::script::*;

#[test]
fn all_limits_or_none_are_charged() {
    let (_dir, redis, mut s) = script("lua-all-or-nothing");
    let second = limit("rl:{k}:r:second", Algorithm::TokenBucket, 5, 1000);
    let day = limit("rl:{k}:r:day", Algorithm::FixedWindow, 2, 86_400_000);
    let both = [second.clone(), day.clone()];
    assert_eq!(s.decide(T0, &both).0, 1);
    assert_eq!(s.decide(T0, &both).0, 1);
    let (committed, answers) = s.decide(T0, &both);
    assert_eq!(committed, 0, "the daily quota refuses");
    assert_eq!(
        (answers[0].0, answers[0].1.as_str()),
        (1, "3"),
        "per-second would allow, uncharged"
    );
    assert_eq!(answers[1].0, 0);
    let tokens = redis.hash_field("rl:{k}:r:second", "tokens");
    assert_eq!(
        tokens, "3",
        "the refused request did not drain the per-second bucket"
    );
}

#[test]
fn a_refusing_shadow_limit_neither_blocks_nor_is_charged() {
    let (_dir, redis, mut s) = script("lua-shadow");
    let enforced = limit("rl:t:enforced", Algorithm::TokenBucket, 10, 1000);
    let shadow = L {
        shadow: true,
        ..limit("rl:t:shadow", Algorithm::FixedWindow, 1, 1000)
    };
    let both = [enforced, shadow];
    assert_eq!(s.decide(T0, &both).0, 1);
    let (committed, answers) = s.decide(T0, &both);
    assert_eq!(committed, 1, "a shadow limit never refuses the request");
    assert_eq!(answers[0].1, "8", "the enforced limit is charged");
    assert_eq!((answers[1].0, answers[1].1.as_str()), (0, "0"));
    let n = redis.hash_field("rl:t:shadow", "n");
    assert_eq!(n, "1", "the refusing shadow limit was not charged");
}

#[test]

fn a_bad_clock_or_layout_fails_the_call_and_bad_limits_fail_only_their_request() {
    let (_dir, _redis, mut s) = script("lua-badargs");
    let good = limit("rl:t:bad", Algorithm::TokenBucket, 1, 1000);
    for clock in ["1.5", "-1", "soon"] {
        match s.call(clock, std::slice::from_ref(&good)) {
            Resp::Error(message) => assert!(message.contains("ERR decide"), "{message}"),
            other => panic!("clock={clock}: expected an error, got {other:?}"),
        }
    }
    // A layout that does not add up (one argument short) fails the whole call.
    let mut command = s.command("1", &[std::slice::from_ref(&good)]);
    command.pop();
    match s.conn.cmd(&command).unwrap() {
        Resp::Error(message) => assert!(message.contains("ERR decide"), "{message}"),
        other => panic!("expected an error, got {other:?}"),
    }
    // Bad numbers for one request's limit: that request fails, the next is decided.
    let other = limit("rl:t:bad-other", Algorithm::Gcra, 5, 1000);
    for bad in [
        L {
            limit: 0,
            ..good.clone()
        },
        L {
            window: Window::ms(0),
            ..good.clone()
        },
        L {
            burst: 0,
            ..good.clone()
        },
        // A calendar window on another algorithm than fixed_window, and an offset beyond 14 h.
        good.clone().calendar(CalendarUnit::Month, 0),
        L {
            algorithm: Algorithm::FixedWindow,
            ..good.clone().calendar(CalendarUnit::Day, 841)
        },
    ] {
        let answers = s.decide_batch(
            T0,
            &[std::slice::from_ref(&bad), std::slice::from_ref(&other)],
        );
        assert_eq!(
            answers[0],
            Err("ERR decide: bad arguments for limit 1".into())
        );
        assert_eq!(answers[1].as_ref().map(|a| a.0), Ok(1));
    }
    // An algorithm the script does not know.
    let mut command = s.command("1", &[std::slice::from_ref(&good)]);
    let at = command
        .iter()
        .position(|a| a.starts_with("token_bucket~"))
        .unwrap();
    command[at] = command[at].replace("token_bucket", "leaky_bucket");
    let items = s.conn.cmd(&command).unwrap().items();
    assert_eq!((items[0].int(), items[1].int()), (1, -1));
    assert_eq!(items[2].text(), "ERR decide: bad arguments for limit 1");
    // A window that is neither digits nor a calendar window.
    let fixed = limit("rl:t:bad-fixed", Algorithm::FixedWindow, 1, 1000);
    for window in ["Y+0", "M330", "M+", "M+-5", "month", "D+1.5"] {
        let mut command = s.command("1", &[std::slice::from_ref(&fixed)]);
        let at = command
            .iter()
            .position(|a| a.starts_with("fixed_window~"))
            .unwrap();
        let mut fields: Vec<&str> = command[at].split('~').collect();
        fields[2] = window;
        command[at] = fields.join("~");
        let items = s.conn.cmd(&command).unwrap().items();
        assert_eq!((items[0].int(), items[1].int()), (1, -1), "{window}");
        assert_eq!(items[2].text(), "ERR decide: bad arguments for limit 1");
    }
}

#[test]
fn a_call_past_its_deadline_charges_nothing() {
    let (_dir, redis, mut s) = script("lua-deadline");
    let l = limit("rl:t:deadline", Algorithm::TokenBucket, 5, 1000);
    let redis_ms = || {
        let t = redis.admin().cmd(&["TIME"]).unwrap().items();
        t[0].text().parse::<u128>().unwrap() * 1000 + t[1].text().parse::<u128>().unwrap() / 1000
    };
    // A deadline already passed on Redis's clock (the filter gave up long ago): refused whole.
    match s.call_with_deadline("redis", redis_ms() - 1, std::slice::from_ref(&l)) {
        Resp::Error(message) => assert!(message.starts_with("EXPIRED"), "{message}"),
        other => panic!("expected EXPIRED, got {other:?}"),
    }
    assert_eq!(
        redis
            .admin()
            .cmd(&["EXISTS", "rl:t:deadline"])
            .unwrap()
            .int(),
        0,
        "nothing charged"
    );
    // A deadline still ahead: decided and charged as usual.
    let items = s
        .call_with_deadline("redis", redis_ms() + 60_000, std::slice::from_ref(&l))
        .items();
    assert_eq!((items[0].int(), items[1].int()), (1, 1));
    assert_eq!(redis.bucket_tokens("rl:t:deadline"), 4.0);
}

#[test]
fn a_batch_decides_in_order_exactly_as_one_call_per_request() {
    let (_dir, redis, mut s) = script("lua-batch-order");
    // The same 14 requests on two fresh keys: one batch, and one call each.
    let batched = limit("rl:t:batched", Algorithm::TokenBucket, 10, 60_000).with_burst(10);
    let single = L {
        key: "rl:t:single",
        ..batched.clone()
    };
    let costs = [1, 3, 1, 1, 4, 1, 2, 1, 1, 5, 1, 1, 1, 1];
    let requests: Vec<Vec<L>> = costs
        .iter()
        .map(|&cost| {
            vec![L {
                cost,
                ..batched.clone()
            }]
        })
        .collect();
    let refs: Vec<&[L]> = requests.iter().map(Vec::as_slice).collect();
    let in_batch: Vec<(i64, Vec<Answer>)> = s
        .decide_batch(T0, &refs)
        .into_iter()
        .map(|a| a.unwrap())
        .collect();
    let one_by_one: Vec<(i64, Vec<Answer>)> = costs
        .iter()
        .map(|&cost| {
            s.decide(
                T0,
                &[L {
                    cost,
                    ..single.clone()
                }],
            )
        })
        .collect();
    assert_eq!(in_batch, one_by_one);
    let allowed: Vec<i64> = in_batch.iter().map(|a| a.0).collect();
    assert_eq!(
        allowed,
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        "10 tokens, in arrival order"
    );
    let mut admin = redis.admin();
    let state =
        |admin: &mut e2e::RedisConn, key: &str| admin.cmd(&["HGET", key, "tokens"]).unwrap().text();
    assert_eq!(
        state(&mut admin, "rl:t:batched"),
        state(&mut admin, "rl:t:single")
    );
}

#[test]
fn in_a_batch_each_request_is_all_or_nothing_over_its_own_limits() {
    let (_dir, _redis, mut s) = script("lua-batch-atomic");
    let second = limit("rl:{k}:r:second", Algorithm::TokenBucket, 5, 1000);
    let day = limit("rl:{k}:r:day", Algorithm::FixedWindow, 1, 86_400_000);
    let both = [second.clone(), day.clone()];
    let answers = s.decide_batch(T0, &[&both, &both, std::slice::from_ref(&second)]);
    let committed: Vec<i64> = answers.iter().map(|a| a.as_ref().unwrap().0).collect();
    assert_eq!(committed, [1, 0, 1]);
    // The second request was refused by the day limit and did not charge the second's bucket:
    // the third sees 5 - 1 - 1 = 3 left.
    assert_eq!(
        answers[1].as_ref().unwrap().1[0].1,
        "4",
        "uncharged: 4 left as before"
    );
    assert_eq!(answers[2].as_ref().unwrap().1[0].1, "3");
}

#[test]
fn a_redis_error_in_one_request_leaves_the_others_decided() {
    let (_dir, redis, mut s) = script("lua-batch-error");
    // A key holding another type (a limit whose algorithm changed): WRONGTYPE for that one.
    let mut admin = redis.admin();
    admin.cmd(&["ZADD", "rl:t:wrong", "1", "x"]).unwrap();
    let wrong = limit("rl:t:wrong", Algorithm::TokenBucket, 5, 1000);
    let fine = limit("rl:t:fine", Algorithm::TokenBucket, 5, 1000);
    let answers = s.decide_batch(
        T0,
        &[
            std::slice::from_ref(&fine),
            &[fine.clone(), wrong],
            std::slice::from_ref(&fine),
        ],
    );
    assert_eq!(answers[0].as_ref().unwrap().1[0].1, "4");
    let error = answers[1].as_ref().unwrap_err();
    assert!(error.starts_with("WRONGTYPE"), "{error}");
    assert_eq!(
        answers[2].as_ref().unwrap().1[0].1,
        "3",
        "the failed one charged nothing"
    );
}

#[test]
fn the_restricted_user_can_touch_only_limiter_keys() {
    let (_dir, redis, mut s) = script("lua-acl");
    match s.call(
        "1",
        &[limit("not-a-limiter-key", Algorithm::TokenBucket, 1, 1000)],
    ) {
        Resp::Error(message) => assert!(message.starts_with("NOPERM"), "{message}"),
        other => panic!("expected NOPERM, got {other:?}"),
    }
    let mut conn = redis.webdis_user();
    let others: [&[&str]; 1] = [&["DEL", "rl:x"]];
    for command in e2e::procs::REFUSED_TO_WEBDIS.iter().chain(&others) {
        match conn.cmd(command).unwrap() {
            Resp::Error(message) => {
                assert!(message.starts_with("NOPERM"), "{command:?}: {message}")
            }
            other => panic!("{command:?} should be refused, got {other:?}"),
        }
    }
}

/// The layout of a Redis Cluster call for several slots of one node (no key declared, the
/// keys at the head of ARGV), on a single Redis: decided exactly as the same batch with its
/// keys declared, one-limit requests (the fast path) and others alike; asked for the slot map,
/// a Redis without cluster support replies an empty one; a key count that does not add up
/// fails the call before anything is charged.
#[test]
fn a_call_that_declares_no_key_decides_as_one_that_declares_them() {
    let (_dir, redis, mut s) = script("lua-on-node");
    let batch = |prefix: &'static str| -> Vec<Vec<L>> {
        let key = |name: &str| -> &'static str { Box::leak(format!("{prefix}{name}").into()) };
        let one = limit(key("one"), Algorithm::TokenBucket, 4, 60_000).with_burst(4);
        let window = limit(key("window"), Algorithm::FixedWindow, 2, 60_000);
        let shadow = L {
            shadow: true,
            ..limit(key("shadow"), Algorithm::Gcra, 1, 60_000)
        };
        let mut requests = Vec::new();
        for _ in 0..4 {
            requests.push(vec![one.clone()]);
            requests.push(vec![one.clone(), window.clone(), shadow.clone()]);
        }
        requests
    };
    let (declared, on_node) = (batch("rl:{a}:declared:"), batch("rl:{b}:node:"));
    let declared_refs: Vec<&[L]> = declared.iter().map(Vec::as_slice).collect();
    let node_refs: Vec<&[L]> = on_node.iter().map(Vec::as_slice).collect();
    let want = s.decide_batch(T0, &declared_refs);
    let (got, after) = s.decide_on_node(T0, &node_refs, false);
    assert_eq!(got, want);
    assert!(after.is_empty(), "no map asked: {after:?}");
    let committed: Vec<i64> = got.iter().map(|a| a.as_ref().unwrap().0).collect();
    assert_eq!(
        committed,
        [1, 1, 1, 1, 0, 0, 0, 0],
        "4 tokens, the window's 2 within them, the shadow limit never refuses"
    );
    let mut admin = redis.admin();
    for (a, b) in [("one", "tokens"), ("window", "n")] {
        let field = |admin: &mut e2e::RedisConn, prefix: &str| {
            admin
                .cmd(&["HGET", &format!("{prefix}{a}"), b])
                .unwrap()
                .text()
        };
        assert_eq!(
            field(&mut admin, "rl:{a}:declared:"),
            field(&mut admin, "rl:{b}:node:"),
            "{a}"
        );
    }

    // Asked for the map: "slots" and no range (no cluster support), after the requests.
    let fresh = limit("rl:{c}:map", Algorithm::TokenBucket, 5, 1000);
    let (got, after) = s.decide_on_node(T0, &[std::slice::from_ref(&fresh)], true);
    assert_eq!(got[0].as_ref().map(|a| a.0), Ok(1));
    let after: Vec<String> = after.iter().map(Resp::text).collect();
    assert_eq!(after, ["slots", "0"]);

    // A key count past the arguments, or none: the whole call fails, nothing charged.
    let untouched = limit("rl:{d}:untouched", Algorithm::TokenBucket, 5, 1000);
    for count in ["0", "99", "x"] {
        let mut command = s.command_on_node("1", &[std::slice::from_ref(&untouched)], false);
        command[4] = count.into();
        match s.conn.cmd(&command).unwrap() {
            Resp::Error(message) => assert!(message.contains("bad key count"), "{message}"),
            other => panic!("count {count}: expected an error, got {other:?}"),
        }
    }
    let exists = admin.cmd(&["EXISTS", "rl:{d}:untouched"]).unwrap().int();
    assert_eq!(exists, 0, "nothing charged");
}

/// The breaker's probe is a call of no request and no key: it stays in the declared layout
/// (its clock first), is answered with no decision and charges nothing, with a deadline or
/// without, on either clock.
#[test]
fn a_call_of_no_request_and_no_key_is_answered_empty() {
    let (_dir, redis, mut s) = script("lua-probe");
    for (clock, deadline) in [
        (T0.to_string(), 0),
        (T0.to_string(), u128::MAX / 2),
        ("redis".to_string(), 0),
    ] {
        let command = DecideCall::new(&clock, deadline, std::iter::empty())
            .command(s.program.command(), &s.program.handle);
        assert_eq!(command[2], "0", "no key declared");
        let items = s.conn.cmd(&command).unwrap().items();
        assert_eq!(items.len(), 1, "{clock} {deadline}: {items:?}");
        assert_eq!(items[0].int(), 0);
    }
    assert_eq!(redis.admin().cmd(&["DBSIZE"]).unwrap().int(), 0);
}

/// The script form (`EVALSHA`, a Redis Cluster's), whose code keeps nothing from call to call
/// and defines each algorithm and the general path at their first use in the call, decides
/// every case table the Rust twin is held to, and any mix of calls exactly as the function does.
#[test]
fn the_script_form_decides_as_the_function_does() {
    let (_dir, redis) = start("lua-script-form");
    let mut script = Script::calling(&redis, CallKind::Script);
    let keys = [
        "rl:{s}:t0",
        "rl:{s}:t1",
        "rl:{s}:t2",
        "rl:{s}:t3",
        "rl:{s}:t4",
        "rl:{s}:t5",
    ];
    assert!(cases::TABLES.len() <= keys.len());
    for (table, key) in cases::TABLES.iter().zip(keys) {
        run_table(&mut script, key, table);
    }

    // The same calls through each form, each in its own Redis: the same answers.
    let (_dir_f, redis_f) = start("lua-script-form-function");
    let mut function = Script::calling(&redis_f, CallKind::Function);
    let tb = limit("rl:{m}:tb", Algorithm::TokenBucket, 3, 1000).with_burst(4);
    let log = limit("rl:{m}:log", Algorithm::SlidingWindowLog, 2, 1000);
    let counter = limit("rl:{m}:swc", Algorithm::SlidingWindowCounter, 5, 1000).with_overrides();
    let gcra = limit("rl:{m}:gcra", Algorithm::Gcra, 2, 1000);
    let leased = L {
        lease: Some(Lease {
            max_units: 3,
            fraction: 0.5,
            max_ms: 1000,
        }),
        ..limit("rl:{m}:lease", Algorithm::FixedWindow, 10, 1000)
    };
    let shadow = L {
        shadow: true,
        ..limit("rl:{m}:shadow", Algorithm::FixedWindow, 1, 1000)
    };
    let held = limit("rl:{m}:c", Algorithm::Concurrency, 1, 5000);
    let batches: Vec<Vec<Vec<L>>> = (0..4)
        .map(|_| {
            vec![
                vec![tb.clone()],
                vec![tb.clone(), log.clone()],
                vec![counter.clone(), gcra.clone()],
                vec![leased.clone()],
                vec![shadow.clone(), gcra.clone()],
                vec![held.clone().held_by("w0-1")],
                vec![held.clone().held_by("w0-2")],
            ]
        })
        .collect();
    for (i, batch) in batches.iter().enumerate() {
        let requests: Vec<&[L]> = batch.iter().map(Vec::as_slice).collect();
        let now = T0 + i as u128 * 300 * MS;
        let by_script = script.decide_batch(now, &requests);
        assert_eq!(
            by_script,
            function.decide_batch(now, &requests),
            "batch {i}"
        );
        assert!(
            by_script.iter().all(Result::is_ok),
            "batch {i}: {by_script:?}"
        );
    }
    let now = T0 + 2 * S;
    script.settle(now, &tb, 2);
    function.settle(now, &tb, 2);
    script.refund(now, &gcra, T0, 0.0);
    function.refund(now, &gcra, T0, 0.0);
    assert_eq!(script.one(now, &tb), function.one(now, &tb));
    assert_eq!(script.one(now, &gcra), function.one(now, &gcra));
}
