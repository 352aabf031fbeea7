//! Outages of the bridge end to end: a hung Webdis is seen by each worker's circuit breaker at
//! the timeout, after which no request waits for it; a dead one costs no wait and fails open
//! or closed by policy; calls that reach Redis after their deadline charge nothing; Envoy's
//! own circuit breaker on the `webdis` cluster refuses a flood of calls, each counted as a
//! bridge failure; and a Redis restart needs no manual step. Real Envoy (2 workers unless
//! said), Webdis and Redis.

use std::time::{Duration, Instant};

use e2e::procs::{envoy_config, filter_config_edit, Webdis, WorkDir};
use e2e::shipped::{assert_full_bucket_then_limited, hit};
use e2e::{free_port, get, wait_for, wait_until, Envoy, Redis, Response, Stack};

/// The shipped bridge credentials and 150 ms timeout (plus `bridge_extra` bridge keys), and
/// `extra` top-level keys.
fn stack(name: &str, bridge_extra: &str, extra: &str, more_edits: &[(&str, &str)]) -> Stack {
    let json = format!(
        r#"{{"bridge": {{"username": "ratelimit", "password": "ratelimit-demo-secret", "timeout": "150ms"{bridge_extra}}},
{extra}
"rules": [{{"name": "api", "limits": [{{"name": "minute", "limit": 1000, "window": "1m"}}]}}]}}"#
    );
    let (from, to) = filter_config_edit(&json);
    let mut edits = vec![(from.as_str(), to.as_str())];
    edits.extend_from_slice(more_edits);
    Stack::start(name, &edits)
}

fn decided(r: &Response) -> bool {
    r.header("x-ratelimit-limit").is_some()
}

/// Sends requests from `threads` clients until `stop` says so; returns (status, time taken,
/// decided) of each.
fn load(
    envoy: &Envoy,
    threads: usize,
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<(u16, Duration, bool)> {
    use std::sync::atomic::Ordering;
    let port = envoy.port;
    std::thread::scope(|scope| {
        let clients: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut seen = Vec::new();
                    let deadline = Instant::now() + Duration::from_secs(20);
                    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                        let key = format!("load-{t}");
                        let started = Instant::now();
                        let r = get(port, "/", &[("x-api-key", key.as_bytes())]);
                        let took = started.elapsed();
                        match r {
                            Ok(r) => seen.push((r.status, took, decided(&r))),
                            Err(_) => seen.push((0, took, false)),
                        }
                    }
                    seen
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|c| c.join().expect("client thread"))
            .collect()
    })
}

#[test]
fn webdis_hung_under_load_costs_one_timeout_then_no_request_waits_and_decisions_resume() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = stack("outage-hung-load", "", "", &[]);
    // On a loaded machine the first calls (the script loaded) can outlast the timeout or the
    // breaker's stall: the test starts from a decision with every breaker closed.
    assert!(decided(&s.envoy.wait_deciding("warm-up")));
    let stop = AtomicBool::new(false);
    let seen = std::thread::scope(|scope| {
        let loaded = scope.spawn(|| load(&s.envoy, 8, &stop));
        // Some decisions, then Webdis hangs for a second, then it is back.
        wait_for("decisions under load", Duration::from_secs(5), || {
            (s.envoy.counter("ratelimit_allowed") > 50).then_some(())
        });
        s.webdis.process.pause();
        wait_for("a breaker to open", Duration::from_secs(5), || {
            (s.envoy.counter("ratelimit_breaker_trips") >= 1).then_some(())
        });
        let fails = s.envoy.counter("ratelimit_failure_mode_open");
        wait_for(
            "requests answered while hung",
            Duration::from_secs(5),
            || (s.envoy.counter("ratelimit_failure_mode_open") > fails + 100).then_some(()),
        );
        s.webdis.process.resume();
        let allowed = s.envoy.counter("ratelimit_allowed");
        wait_for("decisions after the resume", Duration::from_secs(5), || {
            (s.envoy.counter("ratelimit_allowed") > allowed + 50).then_some(())
        });
        stop.store(true, Ordering::SeqCst);
        loaded.join().expect("load")
    });
    assert!(
        seen.iter().all(|(status, _, _)| *status == 200),
        "every request answered 200"
    );
    // The requests in flight when it hung waited for the 150 ms timeout (of the worker's own
    // time: longer on a loaded machine, never past the 1 s lag allowance on top); once the
    // breaker is open, none waits.
    let slowest = seen
        .iter()
        .map(|(_, took, _)| *took)
        .max()
        .unwrap_or_default();
    assert!(
        slowest < Duration::from_millis(1150),
        "a request waited past the timeout and the lag allowance: {slowest:?}"
    );
    let mut passed: Vec<Duration> = seen
        .iter()
        .filter(|(_, _, d)| !d)
        .map(|(_, took, _)| *took)
        .collect();
    let undecided = passed.len();
    assert!(undecided > 100, "{undecided} let through by policy");
    passed.sort();
    let median = passed[undecided / 2];
    assert!(
        median < Duration::from_millis(50),
        "requests let through waited {median:?} (median)"
    );
    assert!(
        seen.last().is_some_and(|(_, _, d)| *d) || seen.iter().rev().take(20).any(|(_, _, d)| *d)
    );
    wait_for("every breaker closed", Duration::from_secs(5), || {
        s.envoy.keyed("probe");
        (s.envoy.stat("wasmcustom.ratelimit_breaker_open") == 0).then_some(())
    });
}

#[test]
fn webdis_killed_costs_no_wait_and_a_restart_brings_decisions_back() {
    let mut s = stack("outage-webdis-killed", "", "", &[]);
    assert!(decided(&s.envoy.wait_deciding("k")));
    s.webdis.process.stop();
    for _ in 0..20 {
        let started = Instant::now();
        let r = s.envoy.keyed("k");
        assert_eq!(r.status, 200);
        assert!(!decided(&r));
        assert!(started.elapsed() < Duration::from_millis(140));
    }
    // Connection refused five times in a row opens a worker's breaker. Once both workers'
    // are open, only their probes connect: one per worker per 500 ms.
    assert!(s.envoy.counter("ratelimit_breaker_trips") >= 1);
    wait_for(
        "both workers' breakers open",
        Duration::from_secs(10),
        || {
            s.envoy.keyed("k");
            (s.envoy.stat("wasmcustom.ratelimit_breaker_open") == 2).then_some(())
        },
    );
    let connects = s.envoy.stat("cluster.webdis.upstream_cx_connect_fail");
    let started = Instant::now();
    for _ in 0..20 {
        s.envoy.keyed("k");
    }
    let probes = 2 * (started.elapsed().as_millis() as u64 / 500 + 1);
    let tried = s.envoy.stat("cluster.webdis.upstream_cx_connect_fail") - connects;
    assert!(
        tried <= probes,
        "while open, only probes try to connect: {tried} connects, at most {probes} probes"
    );
    let redis_port = s.redis.port;
    s.webdis.restart(&s.dir, redis_port);
    wait_for(
        "decisions after Webdis is back",
        Duration::from_secs(5),
        || decided(&s.envoy.keyed("k")).then_some(()),
    );
}

#[test]
fn calls_that_reach_redis_after_their_deadline_charge_nothing() {
    // A short skew allowance, so that the test need not wait a second for the deadline.
    let mut s = stack(
        "outage-stale",
        r#", "clock_skew": "100ms", "lag_allowance": "100ms""#,
        r#""breaker": false,"#,
        &[],
    );
    assert!(decided(&s.envoy.wait_deciding("warm-up")));
    let before = s.redis.decision_calls();
    // Redis hangs: Webdis passes each call on and it waits in Redis's sockets; each request
    // fails open after its 150 ms.
    s.redis.process.pause();
    for _ in 0..5 {
        let r = s.envoy.keyed("stale");
        assert_eq!(r.status, 200);
        assert!(!decided(&r));
    }
    // Wait until the clock (this machine's, which Redis reads) is past every deadline
    // (request + 150 ms + 100 ms lag allowance + 100 ms skew).
    let sent = Instant::now();
    wait_for("the deadlines to pass", Duration::from_secs(5), || {
        (sent.elapsed() > Duration::from_millis(350)).then_some(())
    });
    s.redis.process.resume();
    // Redis runs what it reads at once: once no connection holds unread bytes, every call
    // that reached it has run.
    wait_for(
        "Redis to run the calls it held",
        Duration::from_secs(5),
        || (s.redis.connections_with_unread_bytes() == 0).then_some(()),
    );
    assert!(
        s.redis.decision_calls() > before,
        "no call reached Redis while it hung"
    );
    let key = s
        .envoy
        .keys()
        .limit_key("api", "minute", "header:x-api-key", b"stale");
    assert_eq!(
        s.redis.admin().cmd(&["EXISTS", &key]).unwrap().int(),
        0,
        "the stale calls charged nothing"
    );
    // And a call in time still charges. Webdis 0.1.9 writes a reply to the descriptor its
    // request came on, which a newer connection may hold once the caller has gone (fixed in
    // Webdis 0.1.20): a fresh Webdis serves it.
    let redis_port = s.redis.port;
    s.webdis.restart(&s.dir, redis_port);
    wait_for(
        "a decision from the new Webdis",
        Duration::from_secs(5),
        || decided(&s.envoy.keyed("stale")).then_some(()),
    );
    assert_eq!(s.redis.bucket_tokens(&key), 999.0);
}

#[test]
fn a_flood_over_envoys_own_circuit_breaker_counts_as_bridge_failures() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let shipped_limits =
        "      - max_connections: 64\n        max_pending_requests: 64\n        max_requests: 64\n";
    let tight =
        "      - max_connections: 1\n        max_pending_requests: 0\n        max_requests: 1\n";
    // Two workers, one call each in flight at most: with one connection and no queue for
    // the bridge, the second worker's call is refused at once whenever both are busy.
    let s = stack(
        "outage-cluster-breaker",
        "",
        r#""breaker": false,"#,
        &[(shipped_limits, tight)],
    );
    let stop = AtomicBool::new(false);
    let seen = std::thread::scope(|scope| {
        let loaded = scope.spawn(|| load(&s.envoy, 16, &stop));
        wait_for(
            "the cluster's circuit breaker to refuse calls",
            Duration::from_secs(10),
            || (s.envoy.stat("cluster.webdis.upstream_rq_pending_overflow") >= 5).then_some(()),
        );
        stop.store(true, Ordering::SeqCst);
        loaded.join().expect("load")
    });
    assert!(
        seen.iter().all(|(status, _, _)| *status == 200),
        "failing open, all answered"
    );
    // Every refused call is counted by Envoy first, then by the filter as it fails its
    // requests open: the counts are compared once the filter's have caught up.
    let counts = || {
        let overflow = s.envoy.stat("cluster.webdis.upstream_rq_pending_overflow");
        let errors = s.envoy.counter("ratelimit_bridge_errors");
        let open = s.envoy.counter("ratelimit_failure_mode_open");
        (overflow, errors, open)
    };
    let (overflow, errors, open) = wait_until(
        "a bridge error and a request failed open per refused call",
        Duration::from_secs(5),
        counts,
        |(overflow, errors, open)| errors >= overflow && open >= overflow,
    );
    assert!(
        errors >= overflow,
        "{errors} bridge errors for {overflow} refused calls"
    );
    assert!(open >= overflow);
}

#[test]
fn local_mode_keeps_limiting_while_the_bridge_is_down() {
    // 8 per minute globally; each of the 2 workers enforces a quarter of it, 2, on its own.
    let json = r#"{"bridge": {"username": "ratelimit", "password": "ratelimit-demo-secret", "timeout": "150ms"},
"failure_mode": "local", "local_share": 0.25,
"rules": [{"name": "api", "limits": [{"name": "minute", "limit": 8, "window": "1m"}]}]}"#;
    let (from, to) = filter_config_edit(json);
    let mut s = Stack::start("outage-local", &[(&from, &to)]);
    assert!(decided(&s.envoy.wait_deciding("warm-up")));
    s.webdis.process.stop();
    let statuses: Vec<u16> = (0..20).map(|_| s.envoy.keyed("abuser").status).collect();
    let allowed = statuses.iter().filter(|&&st| st == 200).count();
    assert!(
        (2..=4).contains(&allowed),
        "at most 2 per worker while Redis is out of reach: {statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&st| st == 429).count(),
        20 - allowed
    );
    let refused = s.envoy.keyed("abuser");
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("x-ratelimit-limit"), Some("2"));
    assert!(refused.header("retry-after").is_some());
    assert!(s.envoy.counter("ratelimit_failure_mode_local") >= 21);
    // Another client has its own share.
    assert_eq!(s.envoy.keyed("someone-else").status, 200);
}

#[test]
fn webdis_down_fails_open_at_once() {
    // Patient, so that nothing fails before Webdis is stopped.
    let mut stack = Stack::start("e2e-webdis-down-open", &[]);
    assert_eq!(hit(&stack.envoy, Some(b"k")).status, 200);
    stack.webdis.process.stop();
    for _ in 0..5 {
        let started = Instant::now();
        let r = hit(&stack.envoy, Some(b"k"));
        let took = started.elapsed();
        assert_eq!(r.status, 200, "fail open lets the request through");
        assert_eq!(
            r.header("x-ratelimit-limit"),
            None,
            "no decision, no headers"
        );
        // Connection refused is immediate: far below the 5 s timeout.
        assert!(took < Duration::from_millis(1000), "took {took:?}");
    }
    assert_eq!(stack.envoy.counter("ratelimit_failure_mode_open"), 5);
    assert_eq!(stack.envoy.counter("ratelimit_bridge_errors"), 5);
    let log = stack.envoy.process.log_text();
    let warnings = log
        .matches("bridge failure, failure policy applied")
        .count();
    // One line per worker per 10 s at most (2 workers), not one per request.
    assert!(
        (1..=2).contains(&warnings),
        "{warnings} failure lines:\n{log}"
    );
}

#[test]
fn webdis_down_fails_closed_with_503() {
    let mut stack = Stack::start(
        "e2e-webdis-down-closed",
        &[("\"failure_mode\": \"open\"", "\"failure_mode\": \"closed\"")],
    );
    assert_eq!(hit(&stack.envoy, Some(b"k")).status, 200);
    stack.webdis.process.stop();
    let r = hit(&stack.envoy, Some(b"k"));
    assert_eq!(r.status, 503);
    assert_eq!(r.text(), "rate limiter unavailable\n");
    assert_eq!(stack.envoy.counter("ratelimit_failure_mode_closed"), 1);
    assert_eq!(stack.envoy.counter("ratelimit_failure_mode_open"), 0);
}

#[test]
fn webdis_hung_costs_a_request_its_timeout_until_the_breaker_opens_and_decisions_come_back() {
    // The shipped timeout and breaker, which this test is about; it starts once a request is
    // decided with every breaker closed.
    let stack = Stack::start("e2e-webdis-hung", &[]);
    assert_eq!(stack.envoy.wait_deciding("k").status, 200);
    let failed_open = stack.envoy.counter("ratelimit_failure_mode_open");
    stack.webdis.process.pause();
    // One request at a time: each call has no answer for its 150 ms timeout (of the worker's
    // own time, never past the 1 s lag allowance on top), and with no other request waiting
    // it is one failure of the breaker's run; five in a row open it, and from then on the
    // worker answers at once.
    let mut took = Vec::new();
    while stack.envoy.counter("ratelimit_breaker_trips") == 0 {
        assert!(took.len() < 30, "no breaker opened: {took:?}");
        let started = Instant::now();
        let r = hit(&stack.envoy, Some(b"k"));
        took.push(started.elapsed());
        assert_eq!(r.status, 200, "fail open");
        assert!(r.header("x-ratelimit-limit").is_none(), "not decided");
    }
    assert!(
        took.iter().all(|t| *t < Duration::from_millis(1150)),
        "a request waited past its timeout and the lag allowance: {took:?}"
    );
    assert!(took.len() >= 5, "five calls in a row fail first: {took:?}");
    assert!(stack.envoy.stat("wasmcustom.ratelimit_breaker_open") >= 1);
    assert_eq!(
        stack.envoy.counter("ratelimit_failure_mode_open"),
        failed_open + took.len() as u64
    );
    assert_eq!(
        stack.envoy.counter("ratelimit_bridge_timeouts"),
        took.len() as u64,
        "each counted as a timeout"
    );
    stack.webdis.process.resume();
    // A probe (one per 500 ms), or the late answer of a call given up on, closes the
    // breaker; decisions come back.
    wait_for("decisions to come back", Duration::from_secs(5), || {
        hit(&stack.envoy, Some(b"k"))
            .header("x-ratelimit-limit")
            .map(|_| ())
    });
    wait_for("every breaker closed", Duration::from_secs(5), || {
        hit(&stack.envoy, Some(b"k"));
        (stack.envoy.stat("wasmcustom.ratelimit_breaker_open") == 0).then_some(())
    });
}

#[test]
fn redis_restart_needs_no_manual_step() {
    // One worker: it sees the restart itself and forgets its refusals at once. (With several,
    // the others forget theirs at their next tick: the engine's unit tests cover that.)
    let dir = WorkDir::new("e2e-redis-restart");
    let mut redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let (port, admin_port) = (free_port(), free_port());
    let config = envoy_config(port, admin_port, webdis.port, &[]);
    let envoy = Envoy::start_config(&dir, port, admin_port, &config, 1);
    assert_full_bucket_then_limited(&envoy, Some(b"before"));
    // The worker holds the refusal in its deny cache once it answers from it.
    let hits = envoy.counter("ratelimit_deny_cache_hits");
    wait_for(
        "a refusal answered from the deny cache",
        Duration::from_secs(5),
        || {
            assert_eq!(hit(&envoy, Some(b"before")).status, 429);
            (envoy.counter("ratelimit_deny_cache_hits") > hits).then_some(())
        },
    );
    let resets = envoy.counter("ratelimit_deny_cache_resets");
    redis.restart();
    // Webdis reconnects within about half a second; until then requests fail open.
    wait_for(
        "decisions to come back after the restart",
        Duration::from_secs(20),
        || {
            hit(&envoy, Some(b"probe"))
                .header("x-ratelimit-limit")
                .map(|_| ())
        },
    );
    // Redis lost the decision code: the filter loaded it again by itself, and forgot the refusals
    // Redis made before (the buckets are gone: "before" starts full again).
    assert!(envoy.counter("ratelimit_script_loads") >= 2);
    assert!(envoy.counter("ratelimit_deny_cache_resets") > resets);
    assert_full_bucket_then_limited(&envoy, Some(b"before"));
    assert_full_bucket_then_limited(&envoy, Some(b"after"));
}
