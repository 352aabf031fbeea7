//! Key budgets in the decision script, against a real Redis: new identities up to the budget, then
//! one shared overflow bucket or a refusal until the window ends; late calls and refused requests
//! do not count.

use e2e::script::*;

/// A per-identity limit of 5 per second under a budget of 3 new identities per minute.
fn budgeted(key: &'static str, over_budget: OverBudget) -> L {
    L {
        budget: Some(("ip", 3, 60_000, over_budget)),
        ..limit(key, Algorithm::TokenBucket, 5, 1000)
    }
}

#[test]
fn a_key_budget_admits_new_identities_up_to_its_count_then_shares_one_overflow_bucket() {
    let (_dir, redis, mut s) = script("lua-budget-shared");
    let ids = ["rl:{ip=1}:ip:s", "rl:{ip=2}:ip:s", "rl:{ip=3}:ip:s"];
    for id in ids {
        assert_eq!(s.one(T0, &budgeted(id, OverBudget::Shared)).0, 1, "{id}");
    }
    let budget = |field: &str| {
        redis
            .admin()
            .cmd(&["HGET", "rl:{key_budget}:ip", field])
            .unwrap()
            .text()
    };
    assert_eq!(budget("n"), "3");
    // Budget used up: new identities share the overflow bucket (outcome 1 + 2), and no state
    // is created for them.
    for (i, id) in ["rl:{ip=4}:ip:s", "rl:{ip=5}:ip:s"].iter().enumerate() {
        let (outcome, remaining, _, _) = s.one(T0, &budgeted(id, OverBudget::Shared));
        assert_eq!(outcome, 3, "{id}");
        assert_eq!(
            remaining,
            (4 - i).to_string(),
            "one overflow bucket for all"
        );
        assert_eq!(redis.admin().cmd(&["EXISTS", id]).unwrap().int(), 0);
    }
    assert_eq!(redis.bucket_tokens("rl:{overflow}:ip:token_bucket"), 3.0);
    assert_eq!(budget("n"), "3", "the overflow identity uses no budget");
    // An existing identity is never affected: its own bucket, exactly its own limit.
    for i in 0..4 {
        assert_eq!(s.one(T0, &budgeted(ids[0], OverBudget::Shared)).0, 1, "{i}");
    }
    assert_eq!(s.one(T0, &budgeted(ids[0], OverBudget::Shared)).0, 0);
    // The overflow bucket refuses like any other once spent: 3 left, then refused.
    for _ in 0..3 {
        assert_eq!(
            s.one(T0, &budgeted("rl:{ip=6}:ip:s", OverBudget::Shared)).0,
            3
        );
    }
    assert_eq!(
        s.one(T0, &budgeted("rl:{ip=7}:ip:s", OverBudget::Shared)).0,
        2
    );
    // The next budget window admits new identities again.
    let next = T0 + 60 * S;
    assert_eq!(
        s.one(next, &budgeted("rl:{ip=8}:ip:s", OverBudget::Shared))
            .0,
        1
    );
    assert_eq!(budget("n"), "1");
    assert!(
        redis
            .admin()
            .cmd(&["PTTL", "rl:{key_budget}:ip"])
            .unwrap()
            .int()
            > 0
    );
}

/// Calls reach Redis out of their clocks' order (several workers and proxies, calls queued on
/// a busy machine): one stamped just before a budget window ends can run after others
/// stamped in the next window. It counts against the newest window; restarting the count of
/// its own older window let the next window count its new identities from 0 a second time
/// (a flood under load admitted 4,029 new identities where 4 windows of 1,000 allow 4,000).
#[test]
fn a_late_call_stamped_in_the_previous_budget_window_does_not_restart_the_count() {
    let (_dir, redis, mut s) = script("lua-budget-late");
    let next = T0 + 60 * S;
    let budget = || {
        redis
            .admin()
            .cmd(&["HMGET", "rl:{key_budget}:ip", "w", "n"])
            .unwrap()
            .items()
            .iter()
            .map(Resp::text)
            .collect::<Vec<String>>()
    };
    // Two of the next window's three new identities.
    for id in ["rl:{ip=1}:ip:s", "rl:{ip=2}:ip:s"] {
        assert_eq!(s.one(next, &budgeted(id, OverBudget::Shared)).0, 1, "{id}");
    }
    let window = (next / MS / 60_000).to_string();
    assert_eq!(budget(), [window.clone(), "2".into()]);
    // A call stamped 1 ms before that window began, run now: its new identity is the
    // window's third.
    let late = s.one(next - MS, &budgeted("rl:{ip=3}:ip:s", OverBudget::Shared));
    assert_eq!(late.0, 1);
    assert_eq!(
        budget(),
        [window, "3".into()],
        "counted in the newest window"
    );
    // The window is full: a fourth new identity shares the overflow bucket.
    let fourth = s.one(next, &budgeted("rl:{ip=4}:ip:s", OverBudget::Shared));
    assert_eq!(fourth.0, 3, "over the budget: {fourth:?}");
    assert_eq!(
        redis.admin().cmd(&["DBSIZE"]).unwrap().int(),
        5,
        "3 + counter + overflow"
    );
}

#[test]
fn a_key_budget_with_over_budget_deny_refuses_new_identities_until_its_window_ends() {
    let (_dir, redis, mut s) = script("lua-budget-deny");
    let at = T0 + 15 * S;
    for id in ["rl:{ip=1}:ip:s", "rl:{ip=2}:ip:s", "rl:{ip=3}:ip:s"] {
        assert_eq!(s.one(at, &budgeted(id, OverBudget::Deny)).0, 1);
    }
    // The window is [T0, T0 + 60 s): a refusal 15 s in waits the 45 s left.
    let got = s.one(at, &budgeted("rl:{ip=4}:ip:s", OverBudget::Deny));
    assert_eq!(got, (2, "0".into(), "45000".into(), "45000".into()));
    assert_eq!(
        redis.admin().cmd(&["DBSIZE"]).unwrap().int(),
        4,
        "3 buckets + the counter"
    );
    // Existing identities go on.
    assert_eq!(
        s.one(at, &budgeted("rl:{ip=2}:ip:s", OverBudget::Deny)).0,
        1
    );
}

#[test]
fn only_a_new_identity_that_is_charged_uses_the_budget() {
    let (_dir, redis, mut s) = script("lua-budget-charged");
    // Refused on another limit of the request (all or nothing): no state, no budget used.
    let blocker = limit("rl:t:blocker", Algorithm::FixedWindow, 1, 60_000);
    assert_eq!(s.one(T0, &blocker).0, 1);
    let (committed, _) = s.decide(
        T0,
        &[
            budgeted("rl:{ip=1}:ip:s", OverBudget::Deny),
            blocker.clone(),
        ],
    );
    assert_eq!(committed, 0);
    assert_eq!(
        redis
            .admin()
            .cmd(&["EXISTS", "rl:{key_budget}:ip", "rl:{ip=1}:ip:s"])
            .unwrap()
            .int(),
        0
    );
    // Two limits of one rule in one request and a second request of the same new identity in
    // the same batch: one identity, one unit of budget.
    let second = L {
        key: "rl:{ip=2}:ip:m",
        ..budgeted("rl:{ip=2}:ip:m", OverBudget::Deny)
    };
    let request = [budgeted("rl:{ip=2}:ip:s", OverBudget::Deny), second];
    let answers = s.decide_batch(T0, &[&request, &request]);
    assert!(
        answers.iter().all(|a| a.as_ref().unwrap().0 == 1),
        "{answers:?}"
    );
    assert_eq!(redis.hash_field("rl:{key_budget}:ip", "n"), "1");
}
