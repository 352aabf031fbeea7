//! A bridge that refuses the filter is loud, end to end (real Envoy with 2 workers, Webdis and
//! Redis): a wrong bridge password, a Webdis ACL without `FCALL` (one written for an older
//! release, which called only `EVALSHA`), or without `EVALSHA` for a filter calling the
//! script (`bridge.redis_calls: "script"`), and a Redis user (the one Webdis logs in as)
//! without `HSET` are each logged by Envoy at error level naming the cause
//! and the setting, counted under their cause, and decided by the failure policy as an outage
//! would be (open: 200; a fail-closed rule: 503); a real Prometheus with the shipped rules
//! fires the alert. Once the setting is fixed while Envoy runs, decisions come back by
//! themselves. `ratelimit-check --probe` names each cause (exit 1) and passes the fixed
//! bridge (exit 0).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ratelimit_core::bridge::PROBE_TAG;

use e2e::{free_port, root, wait_for, Envoy, Prometheus, Redis, Response, Webdis, WorkDir};

/// The password of the shipped Webdis ACL (envoy/webdis.json).
const SHIPPED_PASSWORD: &str = "ratelimit-demo-secret";
/// How long a fix may take to show: Webdis restarting on a loaded machine, then the next
/// probe of each worker's breaker (every 500 ms).
const FIX_TIMEOUT: Duration = Duration::from_secs(30);
/// One error line per cause and worker at most in this interval (filter/src/host.rs).
const LOG_INTERVAL: Duration = Duration::from_secs(10);
const WORKERS: u64 = 2;

/// Every request is under rule `api` (failure mode open); `/login` also under `login`, which
/// fails closed. A timeout far above a refusal's few ms, so that on a loaded machine a refusal
/// is never seen as a timeout instead. Decisions call the Redis Function (the default).
fn filter_json(password: &str) -> String {
    filter_json_calling(password, "function")
}

/// [`filter_json`] with `bridge.redis_calls` set to `calls` ("function" or "script").
fn filter_json_calling(password: &str, calls: &str) -> String {
    format!(
        r#"{{"bridge": {{"username": "ratelimit", "password": "{password}", "timeout": "2s", "redis_calls": "{calls}"}},
"rules": [{{"name": "api", "limits": [{{"name": "minute", "limit": 1000, "window": "1m"}}]}},
          {{"name": "login", "match": {{"path_prefix": "/login"}}, "failure_mode": "closed",
            "limits": [{{"name": "minute", "limit": 1000, "window": "1m"}}]}}]}}"#
    )
}

fn decided(r: &Response) -> bool {
    r.header("x-ratelimit-limit").is_some()
}

/// The failure policy applies as in an outage: through undecided under `api` (open), 503 under
/// `login` (closed). Two refused calls.
fn policy_applies(envoy: &Envoy, key: &str) {
    // Counted from here: on a loaded machine the first calls may have failed by policy.
    let open_before = envoy.counter("ratelimit_failure_mode_open");
    let closed_before = envoy.counter("ratelimit_failure_mode_closed");
    let open = envoy.keyed(key);
    assert_eq!(open.status, 200, "fail open: {}", open.text());
    assert!(!decided(&open), "not decided");
    let closed = envoy.keyed_at("/login", key);
    assert_eq!(closed.status, 503);
    assert_eq!(closed.text(), "rate limiter unavailable\n");
    envoy.wait_counter("ratelimit_failure_mode_open", open_before + 1);
    envoy.wait_counter("ratelimit_failure_mode_closed", closed_before + 1);
}

/// Envoy's error lines about a refusal of `cause`.
fn error_lines(envoy: &Envoy, cause: &str) -> Vec<String> {
    envoy
        .process
        .log_text()
        .lines()
        .filter(|l| l.contains("[error]") && l.contains("bridge misconfigured"))
        .filter(|l| l.contains(&format!(": {cause}: ")))
        .map(str::to_string)
        .collect()
}

/// Waits for Envoy's first error line about `cause`, which must say each of `says`; no other
/// cause is counted, and the refusals are not logged as an outage.
fn refusal_logged(envoy: &Envoy, cause: &str, says: &[&str]) {
    let lines = wait_for("an error line naming the cause", FIX_TIMEOUT, || {
        let lines = error_lines(envoy, cause);
        (!lines.is_empty()).then_some(lines)
    });
    for needle in says {
        assert!(
            lines[0].contains(needle),
            "{:?} does not say {needle:?}",
            lines[0]
        );
    }
    assert!(
        lines[0].ends_with("(0 similar lines suppressed)"),
        "{}",
        lines[0]
    );
    for other in ["bridge_auth", "redis_acl", "script_load_refused"] {
        if other != cause {
            assert_eq!(
                envoy.counter(&format!("ratelimit_misconfigured_{other}")),
                0
            );
        }
    }
    let log = envoy.process.log_text();
    assert!(
        !log.contains("bridge failure, failure policy applied"),
        "a refusal is not reported as an outage:\n{log}"
    );
}

/// At most one error line per worker and interval since `started`.
fn throttled(envoy: &Envoy, cause: &str, started: Instant) {
    let lines = error_lines(envoy, cause).len() as u64;
    let intervals = started.elapsed().as_secs() / LOG_INTERVAL.as_secs() + 1;
    assert!(
        (1..=WORKERS * intervals).contains(&lines),
        "{lines} error lines in {:?}",
        started.elapsed()
    );
}

/// Decisions come back without restarting Envoy: a request decided, under each rule.
fn decisions_come_back(envoy: &Envoy) {
    wait_for("decisions to come back", FIX_TIMEOUT, || {
        decided(&envoy.keyed("after-the-fix")).then_some(())
    });
    wait_for("a decision under the closed rule", FIX_TIMEOUT, || {
        let r = envoy.keyed_at("/login", "after-the-fix");
        (r.status == 200 && decided(&r)).then_some(())
    });
}

/// `ratelimit-check --probe` of the Webdis on `port` with the filter config in `config`:
/// exit status, stdout, stderr.
fn probe(config: &Path, port: u16) -> (i32, String, String) {
    let bin = root().join("target/debug/ratelimit-check");
    assert!(
        bin.exists(),
        "{} is missing: `cargo build -p ratelimit-check` (make e2e-test does) first",
        bin.display()
    );
    let out = Command::new(bin)
        .arg("--probe")
        .arg(format!("http://127.0.0.1:{port}"))
        .arg(config)
        .output()
        .expect("run ratelimit-check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The probe names `cause` and exits 1.
fn probe_refused(envoy: &Envoy, port: u16, cause: &str) {
    let (code, out, err) = probe(&envoy.config_path, port);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains(&format!("REFUSED: {cause}: ")), "{out}");
    assert!(
        err.contains(&format!("refuses this config ({cause})")),
        "{err}"
    );
}

/// Every key in Redis but the probe's, with its content: what the probe must not change.
fn identities_state(redis: &Redis) -> BTreeMap<String, String> {
    let mut admin = redis.admin();
    let keys = admin.cmd(&["KEYS", "*"]).unwrap().items();
    keys.iter()
        .map(|k| k.text())
        .filter(|k| !k.contains(PROBE_TAG))
        .map(|k| {
            let content = match admin.cmd(&["TYPE", &k]).unwrap().text().as_str() {
                "hash" => admin.cmd(&["HGETALL", &k]).unwrap().text(),
                "zset" => admin
                    .cmd(&["ZRANGE", &k, "0", "-1", "WITHSCORES"])
                    .unwrap()
                    .text(),
                other => other.to_string(),
            };
            (k, content)
        })
        .collect()
}

/// The probe finds every call answered and exits 0, and leaves every identity's state as it
/// was: it wrote only keys of its own, which expire.
fn probe_ready(envoy: &Envoy, port: u16, redis: &Redis) {
    let before = identities_state(redis);
    assert!(!before.is_empty(), "decisions made state to compare");
    let (code, out, err) = probe(&envoy.config_path, port);
    assert_eq!((code, err.as_str()), (0, ""), "{out}");
    assert!(out.contains("answers every call of this config"), "{out}");
    assert!(!out.contains("REFUSED"), "{out}");
    assert_eq!(
        identities_state(redis),
        before,
        "no identity's state changed"
    );
    let mut admin = redis.admin();
    let own = admin
        .cmd(&["KEYS", &format!("rl:{PROBE_TAG}:*")])
        .unwrap()
        .items();
    assert!(!own.is_empty(), "the probe decided on keys of its own");
    for key in own {
        let ttl = admin.cmd(&["PTTL", &key.text()]).unwrap().int();
        assert!(ttl > 0, "{}: expires ({ttl})", key.text());
    }
}

#[test]
fn a_wrong_bridge_password_is_an_error_naming_the_setting_until_webdis_accepts_it() {
    let dir = WorkDir::new("misconfigured-password");
    let redis = Redis::start(&dir);
    let mut webdis = Webdis::start(&dir, redis.port);
    let password = "not-the-shipped-one";
    let envoy = Envoy::start_filter(&dir, webdis.port, &filter_json(password), 2);
    // The shipped rules, as shipped: the alert has no `for:`. A scrape of the counter at 0
    // first, as in production, where it is exported from the filter's start.
    let prom = Prometheus::start(&dir, &[envoy.admin_port], &Prometheus::shipped_rules());
    prom.wait_scraped(FIX_TIMEOUT);
    wait_for("the refusals counter scraped at 0", FIX_TIMEOUT, || {
        let seen = prom.query("ratelimit_misconfigured_bridge_auth");
        (seen.len() == 1 && seen[0].1 == 0.0).then_some(())
    });
    let started = Instant::now();
    policy_applies(&envoy, "k");
    envoy.wait_counter("ratelimit_misconfigured_bridge_auth", 2);
    refusal_logged(
        &envoy,
        "bridge_auth",
        &[
            "HTTP 403",
            "bridge.username / bridge.password",
            "\"http_basic_auth\"",
            "webdis.json",
            "\"EVALSHA\"",
        ],
    );
    // The alert fires within a minute of the refusal (here, scraped and evaluated every
    // second: seconds), naming the cause and the instance.
    let labels = prom.wait_alert(
        "RateLimiterBridgeMisconfigured",
        "firing",
        Duration::from_secs(60),
    );
    assert_eq!(labels.get("cause").map(String::as_str), Some("bridge_auth"));
    let instance = format!("127.0.0.1:{}", envoy.admin_port);
    assert_eq!(labels.get("instance"), Some(&instance));
    assert_eq!(labels.get("severity").map(String::as_str), Some("critical"));
    probe_refused(&envoy, webdis.port, "bridge_auth");
    // Refusals open the breakers like failures; their probes keep being refused and counted
    // with no request at all, so the alert stays on while nothing is fixed.
    wait_for("a breaker open", FIX_TIMEOUT, || {
        envoy.keyed("k");
        (envoy.counter("ratelimit_breaker_trips") >= 1).then_some(())
    });
    let refused = envoy.counter("ratelimit_misconfigured_bridge_auth");
    wait_for("refused probes counted", FIX_TIMEOUT, || {
        (envoy.counter("ratelimit_misconfigured_bridge_auth") >= refused + 2).then_some(())
    });
    throttled(&envoy, "bridge_auth", started);
    // Fixed on Webdis's side (its ACL takes the password the filter has): Envoy is not
    // restarted, a probe sees the fix and decisions come back.
    let accepting = Webdis::edited_config(&dir, "webdis-accepting.json", |c| {
        c["acl"][1]["http_basic_auth"] = format!("ratelimit:{password}").into();
    });
    webdis.restart_with(&dir, &accepting, redis.port);
    decisions_come_back(&envoy);
    probe_ready(&envoy, webdis.port, &redis);
}

/// A Webdis ACL whose entry for the filter enables `enabled` only refuses the decision call
/// of a filter with `bridge.redis_calls: calls`: an error line naming the setting, counted,
/// decided by policy, the probe naming it, until the shipped ACL is back.
fn webdis_acl_refuses_the_decision_call(name: &str, enabled: &[&str], calls: &str) {
    let dir = WorkDir::new(name);
    let redis = Redis::start(&dir);
    let without = Webdis::edited_config(&dir, "webdis-refusing.json", |c| {
        c["acl"][1]["enabled"] = serde_json::json!(enabled);
    });
    let mut webdis = Webdis::start_with_config(&dir, &without, redis.port, free_port());
    let json = filter_json_calling(SHIPPED_PASSWORD, calls);
    let envoy = Envoy::start_filter(&dir, webdis.port, &json, 2);
    let started = Instant::now();
    policy_applies(&envoy, "k");
    envoy.wait_counter("ratelimit_misconfigured_bridge_auth", 2);
    refusal_logged(
        &envoy,
        "bridge_auth",
        &[
            "HTTP 403",
            "webdis.json",
            "does not enable \"FCALL\" (\"EVALSHA\" for scripts)",
        ],
    );
    probe_refused(&envoy, webdis.port, "bridge_auth");
    throttled(&envoy, "bridge_auth", started);
    // The shipped ACL back: decisions come back without restarting Envoy.
    webdis.restart_with(&dir, &root().join("envoy/webdis.json"), redis.port);
    decisions_come_back(&envoy);
    probe_ready(&envoy, webdis.port, &redis);
    // Nothing was called but what `calls` says.
    let (function, script) = (redis.command_calls("fcall"), redis.command_calls("evalsha"));
    match calls {
        "script" => assert!(function == 0 && script > 0, "{function} / {script}"),
        _ => assert!(function > 0 && script == 0, "{function} / {script}"),
    }
}

/// The ACL of a webdis.json written for a release that called only the script: the function's
/// call is refused.
#[test]
fn a_webdis_acl_without_fcall_is_an_error_naming_the_setting_until_it_is_restored() {
    webdis_acl_refuses_the_decision_call(
        "misconfigured-webdis-acl",
        &["EVALSHA", "SCRIPT"],
        "function",
    );
}

/// The same refusal on the script's path (`bridge.redis_calls: "script"`).
#[test]
fn with_scripts_a_webdis_acl_without_evalsha_is_an_error_naming_the_setting_until_it_is_restored() {
    webdis_acl_refuses_the_decision_call(
        "misconfigured-webdis-acl-script",
        &["FCALL", "FUNCTION", "SCRIPT"],
        "script",
    );
}

#[test]
fn a_redis_user_without_hset_is_an_error_naming_the_setting_until_acl_setuser_restores_it() {
    let dir = WorkDir::new("misconfigured-redis-acl");
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let envoy = Envoy::start_filter(&dir, webdis.port, &filter_json(SHIPPED_PASSWORD), 2);
    // Deciding first (the library loaded), then the Redis user Webdis logs in as loses HSET,
    // which every allowed decision writes with.
    envoy.wait_deciding("before");
    let mut admin = redis.admin();
    let setuser = |rule: &str| {
        let mut admin = redis.admin();
        let reply = admin.cmd(&["ACL", "SETUSER", "default", rule]).unwrap();
        assert_eq!(reply.text(), "OK");
    };
    let trips = envoy.counter("ratelimit_breaker_trips");
    setuser("-hset");
    let started = Instant::now();
    policy_applies(&envoy, "a-new-key");
    envoy.wait_counter("ratelimit_misconfigured_redis_acl", 2);
    refusal_logged(
        &envoy,
        "redis_acl",
        &[
            "Redis refused a command the decision code runs",
            "the Redis user Webdis logs in as",
            "redis.conf",
            "ACL LOG",
        ],
    );
    // Redis answered: no breaker opens, each call is refused and counted.
    assert_eq!(envoy.counter("ratelimit_breaker_trips"), trips);
    // What Redis's ACL log says the filter lacked.
    let log = admin.cmd(&["ACL", "LOG", "1"]).unwrap().text();
    assert!(log.contains("hset"), "{log}");
    probe_refused(&envoy, webdis.port, "redis_acl");
    throttled(&envoy, "redis_acl", started);
    setuser("+hset");
    decisions_come_back(&envoy);
    probe_ready(&envoy, webdis.port, &redis);
}
