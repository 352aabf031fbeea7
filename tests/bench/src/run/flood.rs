//! A flood of new client addresses against a per-IP rule, with and without a key budget:
//! keys created, and what the processes' memory did.

use std::time::Duration;

use e2e::free_port;
use e2e::procs::{Envoy, Redis, Webdis};
use e2e::resp::RedisConn;

use super::Bench;
use crate::report::KeyFlood;

/// Resident memory of a process, bytes (`VmRSS` in /proc), 0 if unreadable.
fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|l| {
                l.strip_prefix("VmRSS:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
        })
        .map_or(0, |kb| kb * 1024)
}

/// Redis `used_memory`, bytes.
fn redis_used_memory(conn: &mut RedisConn) -> u64 {
    conn.cmd(&["INFO", "memory"])
        .ok()
        .and_then(|info| {
            info.text().lines().find_map(|l| {
                l.strip_prefix("used_memory:")
                    .and_then(|v| v.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

/// A flood of new client addresses (one request each) against a per-IP rule, with or without
/// `budget` (the rule's `key_budget` JSON): keys created, and Redis, Envoy and Webdis memory
/// before and after.
pub fn run(b: &Bench, budget: Option<&str>) -> KeyFlood {
    let s = &b.s;
    let addresses: u32 = if s.quick { 20_000 } else { 200_000 };
    b.say(&format!(
        "key flood: {addresses} new addresses, key budget {}",
        budget.unwrap_or("none")
    ));
    let redis = Redis::start(&b.dir);
    let webdis = Webdis::start(&b.dir, redis.port);
    let json = format!(
        r#"{{"bridge": {{"username": "ratelimit", "password": "ratelimit-demo-secret", "timeout": "{}ms"}},
"xff_trusted_hops": 1,
"rules": [{{"name": "per_ip", "key": {{"from": ["client_ip"]}}, {}
  "limits": [{{"name": "minute", "limit": 10, "window": "1m"}}]}}]}}"#,
        s.timeout_ms,
        budget.map_or(String::new(), |b| format!(r#""key_budget": {b},"#))
    );
    let (from, to) = e2e::procs::filter_config_edit(&json);
    let port = free_port();
    let mut admin = free_port();
    while admin == port {
        admin = free_port();
    }
    let yaml = e2e::procs::envoy_config(port, admin, webdis.port, &[(&from, &to)]);
    let envoy = Envoy::start_config(&b.dir, port, admin, &yaml, 1);
    // One request first, so that the script is loaded and the Envoy's memory is warm.
    let _ = e2e::get(port, "/", &[("x-forwarded-for", b"192.0.2.1")]);
    let mut conn = redis.admin();
    let dbsize = |conn: &mut RedisConn| conn.cmd(&["DBSIZE"]).map(|r| r.int() as u64).unwrap_or(0);
    let keys_before = dbsize(&mut conn);
    let redis_before = redis_used_memory(&mut conn);
    let envoy_before = rss_bytes(envoy.process.pid());
    let webdis_before = rss_bytes(webdis.process.pid());
    let flood = e2e::flood::flood(port, 0, addresses, 32, Duration::from_secs(300));
    let envoy_after = rss_bytes(envoy.process.pid());
    let webdis_after = rss_bytes(webdis.process.pid());
    let result = KeyFlood {
        budget: budget.map(str::to_string),
        addresses: u64::from(addresses),
        seconds: flood.elapsed.as_secs_f64(),
        allowed: flood.status(200),
        denied: flood.status(429),
        lost: flood.lost + flood.answered() - flood.status(200) - flood.status(429),
        budget_exceeded: envoy.counter("ratelimit_key_budget_exceeded"),
        keys_before,
        keys_after: dbsize(&mut conn),
        redis_memory: (redis_before, redis_used_memory(&mut conn)),
        envoy_rss: (envoy_before, envoy_after),
        webdis_rss: (webdis_before, webdis_after),
    };
    b.say(&format!(
        "key flood done in {:.1} s: {} keys in Redis",
        result.seconds, result.keys_after
    ));
    result
}
