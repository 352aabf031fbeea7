//! A busy machine is not an outage: with the shipped bridge timeout and breaker, 2 Envoys × 2
//! workers beside CPU-bound neighbours (two busy loops per core) still decide every request
//! in Redis, exactly. No request passes by the failure policy (open or closed), no breaker
//! opens, and every unit the clients were allowed is the one Redis counted.

use std::time::Duration;

use e2e::busy::{account, BusyLoops, MixedLoad};
use e2e::procs::{Envoy, Redis, Webdis, WorkDir};
use e2e::{get, wait_for};

/// The shipped bridge (credentials; timeout, breaker and lag allowance left to their
/// defaults) and two rules: a fail-open token bucket of 50 units per second on one hot key,
/// costs 1 to 5, with a tally of every unit it charged; a fail-closed rule on many keys, far
/// below its limit, counting every request in Redis.
const FILTER: &str = r#"{
  "bridge": {"username": "ratelimit", "password": "ratelimit-demo-secret"},
  "rules": [
    {"name": "hot", "match": {"path_prefix": "/hot"}, "key": {"from": ["header:x-api-key"]},
     "cost": {"header": "x-cost", "min": 1, "max": 5},
     "limits": [{"name": "per_second", "limit": 50, "window": "1s"},
                {"name": "tally", "algorithm": "sliding_window_log", "limit": 10000, "window": "1d"}]},
    {"name": "accounts", "match": {"path_prefix": "/accounts"}, "failure_mode": "closed",
     "key": {"from": ["header:x-api-key"]},
     "limits": [{"name": "per_day", "algorithm": "sliding_window_log", "limit": 10000, "window": "1d"}]}
  ]}"#;

const HOT_KEY: &str = "busy-hot";
const ACCOUNTS: usize = 1000;
const LOAD: Duration = Duration::from_secs(6);

#[test]
fn a_busy_machine_still_decides_every_request_exactly() {
    let dir = WorkDir::new("busy-loops");
    let redis = Redis::start(&dir);
    let webdis: Vec<Webdis> = (0..2).map(|_| Webdis::start(&dir, redis.port)).collect();
    let envoys: Vec<Envoy> = webdis
        .iter()
        .map(|w| Envoy::start_filter(&dir, w.port, FILTER, 2))
        .collect();
    // Each Envoy decides once before the load (the script is loaded into Redis).
    for envoy in &envoys {
        wait_for("a decision on each Envoy", Duration::from_secs(30), || {
            let r = get(envoy.port, "/accounts", &[("x-api-key", b"warm-up")]).ok()?;
            r.header("x-ratelimit-limit").map(|_| ())
        });
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut loops = BusyLoops::start(&dir, 2 * cores, Duration::from_secs(60));
    let load = MixedLoad {
        ports: envoys.iter().map(|e| e.port).collect(),
        conns_per_port: 16,
        duration: LOAD,
        hot_key: HOT_KEY.to_string(),
        accounts: ACCOUNTS,
    };
    let result = load.run();
    assert_eq!(loops.running(), loops.len(), "the busy loops ran all along");
    drop(loops);

    let sum = |name: &str| envoys.iter().map(|e| e.counter(name)).sum::<u64>();
    let lag_ms = sum("ratelimit_worker_lag_ms");
    let (hot_units, accounts_allowed) = (result.allowed_units(true), result.allowed_units(false));
    let span = result.span.as_secs_f64();
    eprintln!(
        "busy machine: {} requests in {span:.1} s, {hot_units} hot units allowed, {accounts_allowed} account requests, workers late by {lag_ms} ms in all",
        result.answers.len(),
    );
    assert!(result.answers.len() > 1000, "too little load to judge");
    let mut others = std::collections::BTreeMap::new();
    for a in result
        .answers
        .iter()
        .filter(|a| ![200, 429].contains(&a.status))
    {
        *others.entry(a.status).or_insert(0u64) += 1;
    }
    assert!(
        others.is_empty(),
        "answers other than 200 and 429 (status: count): {others:?}"
    );
    let undecided = result.answers.iter().filter(|a| !a.decided).count();
    assert_eq!(undecided, 0, "requests passed without a decision");
    for counter in [
        "ratelimit_failure_mode_open",
        "ratelimit_failure_mode_closed",
        "ratelimit_breaker_trips",
        "ratelimit_bridge_errors",
    ] {
        assert_eq!(sum(counter), 0, "{counter}");
    }
    // Exact: what passed is what Redis charged, within the hot key's allowance.
    let keys = envoys[0].keys();
    let mut admin = redis.admin();
    let zcard = |admin: &mut e2e::RedisConn, key: &str| {
        admin.cmd(&["ZCARD", key]).expect("ZCARD").int() as u64
    };
    let tally = keys.limit_key("hot", "tally", "header:x-api-key", HOT_KEY.as_bytes());
    assert_eq!(
        zcard(&mut admin, &tally),
        hot_units,
        "hot units charged in Redis"
    );
    let allowance = (50.0 + 50.0 * span).floor() as u64;
    assert!(
        hot_units <= allowance,
        "{hot_units} hot units passed, allowance {allowance}"
    );
    let charged: u64 = (0..ACCOUNTS)
        .map(|a| {
            let account = account(a);
            let key = keys.limit_key(
                "accounts",
                "per_day",
                "header:x-api-key",
                account.as_bytes(),
            );
            zcard(&mut admin, &key)
        })
        .sum();
    assert_eq!(
        charged, accounts_allowed,
        "account requests counted in Redis"
    );
}
