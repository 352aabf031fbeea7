//! What an operator set survives Redis: overrides set and removed with ratelimit-admin (a
//! raise, a block without expiry, a block with one), then Redis killed (SIGKILL, no clean
//! shutdown) and started again with the shipped envoy/redis.conf. Redis loads the snapshot the
//! tool had it write after each change, so every override decides from the first decision
//! after the restart, and the audit stream is whole. Real Envoy (2 workers), Webdis and Redis.

use std::time::Duration;

use e2e::admin::Admin;
use e2e::procs::filter_config_edit;
use e2e::{wait_for, Response, Stack};

/// 5 an hour per API key (nothing comes back during a test), overrides on.
const CONFIG: &str = r#"{"bridge": {"username": "ratelimit", "password": "ratelimit-demo-secret", "timeout": "150ms"},
"rules": [{"name": "api", "key": {"from": ["header:x-api-key"]},
  "limits": [{"name": "quota", "limit": 5, "window": "1h", "overrides": true}]}]}"#;

/// How long Redis, Webdis's reconnection and the filter's script reload may take.
const PATIENCE: Duration = Duration::from_secs(60);

fn statuses(s: &Stack, key: &str, n: usize) -> Vec<u16> {
    (0..n).map(|_| s.envoy.keyed(key).status).collect()
}

/// Waits until a request is decided again (Redis back, Webdis reconnected, the script loaded),
/// with a key no test counts on.
fn wait_deciding(s: &Stack, probe: &str) -> Response {
    wait_for("decisions after the restart", PATIENCE, || {
        Some(s.envoy.keyed(probe)).filter(|r| r.header("x-ratelimit-limit").is_some())
    })
}

#[test]
fn overrides_and_the_audit_are_in_force_again_after_redis_is_killed() {
    let (from, to) = filter_config_edit(CONFIG);
    let mut s = Stack::start("durable-overrides", &[(&from, &to)]);
    let config = s.dir.file("filter.json");
    std::fs::write(&config, CONFIG).unwrap();
    let admin = Admin::new(&s.redis, &config);
    wait_deciding(&s, "warm-up");

    for args in [
        &["override", "set", "api", "rich", "quota", "--limit", "12"][..],
        &["override", "set", "api", "abuser", "quota", "--blocked"],
        &[
            "override",
            "set",
            "api",
            "temp",
            "quota",
            "--blocked",
            "--expires",
            "1h",
        ],
        &["override", "set", "api", "gone", "quota", "--blocked"],
        &["override", "rm", "api", "gone", "quota"],
    ] {
        admin.json(args);
    }
    // Redis is killed: no shutdown, no save of its own (the shipped config has none).
    s.redis.restart();
    wait_deciding(&s, "after-first-restart");

    assert_eq!(
        statuses(&s, "rich", 14),
        [vec![200; 12], vec![429; 2]].concat(),
        "the raise decides"
    );
    let abuser = s.envoy.keyed("abuser");
    assert_eq!(abuser.status, 429);
    assert_eq!(abuser.header("retry-after"), None, "a block without expiry");
    let temp = s.envoy.keyed("temp");
    assert_eq!(temp.status, 429);
    let wait: u64 = temp.header("retry-after").unwrap_or("0").parse().unwrap();
    assert!(
        (3000..=3600).contains(&wait),
        "the block's expiry: {wait} s"
    );
    assert_eq!(
        statuses(&s, "gone", 6),
        [vec![200; 5], vec![429; 1]].concat(),
        "a removed override stays removed: the config's 5"
    );

    // The audit is whole: each change, newest first, by whom.
    let audit = admin.json(&["audit", "--count", "10"]);
    let entries = audit["entries"].as_array().unwrap();
    let whats: Vec<&str> = entries
        .iter()
        .map(|e| e["what"].as_str().unwrap())
        .collect();
    assert_eq!(
        whats,
        [
            "override rm",
            "override set",
            "override set",
            "override set",
            "override set"
        ],
        "{audit}"
    );
    assert!(entries.iter().all(|e| e["who"] == "test-operator"));

    // A change just before a crash is there too: it was saved before the tool returned.
    admin.json(&["override", "rm", "api", "temp", "quota"]);
    let loads = s.envoy.counter("ratelimit_script_loads");
    s.redis.restart();
    wait_deciding(&s, "after-second-restart");
    // The snapshot holds the decision library too (loaded long before it was written): Redis
    // starts with it, no call finds it missing and the filter loads nothing, so no worker
    // forgets its cached refusals as after a reload. A worker that refused "temp" above
    // answers from its deny cache for at most 1 s on a limit with overrides
    // (OVERRIDE_STALE_MS), then asks Redis, which decides without the removed block.
    assert_eq!(s.envoy.counter("ratelimit_script_loads"), loads);
    let temp = wait_for("the removed block to be decided away", PATIENCE, || {
        Some(s.envoy.keyed("temp")).filter(|r| r.status == 200)
    });
    assert!(
        temp.header("x-ratelimit-limit").is_some(),
        "the block was removed: decided, not failed open"
    );
    assert_eq!(s.envoy.keyed("abuser").status, 429, "the other block stays");
    let audit = admin.json(&["audit", "--count", "10"]);
    assert_eq!(audit["entries"].as_array().unwrap().len(), 6, "{audit}");
}
