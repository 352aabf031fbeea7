//! The decision engine of each worker end to end: concurrent requests share calls, refused
//! keys are answered without calls until exactly when they could fit, and a client that
//! leaves while its batch is in flight takes nobody else's decision with it. Real Envoy (one
//! worker, so every request meets the same engine), Webdis and Redis, each test its own.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use e2e::{get, wait_for_value, Envoy, Redis, Response, Webdis, WorkDir};

struct OneWorker {
    envoy: Envoy,
    webdis: Webdis,
    redis: Redis,
    _dir: WorkDir,
}

/// How long a test waits for a state (a ceiling: a loaded machine can take seconds).
const PATIENCE: Duration = Duration::from_secs(20);

/// Redis, Webdis and an Envoy with one worker whose filter holds `rules`. Calls time out after
/// 30 s (and the breaker takes a call as hung only then): these tests hold calls in flight on
/// purpose (Webdis paused), and a shorter timeout would let requests through by policy.
fn start(name: &str, rules: &str) -> OneWorker {
    let dir = WorkDir::new(name);
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let json = format!(
        r#"{{"bridge": {{"username": "ratelimit", "password": "ratelimit-demo-secret", "timeout": "30s"}},
"rules": {rules}}}"#
    );
    let envoy = Envoy::start_filter(&dir, webdis.port, &json, 1);
    OneWorker {
        envoy,
        webdis,
        redis,
        _dir: dir,
    }
}

#[test]
fn concurrent_requests_share_calls() {
    let s = start(
        "engine-share",
        r#"[{"name": "api", "limits": [{"name": "second", "limit": 1000000, "window": "1s"}]}]"#,
    );
    s.envoy.load_script("/");
    let (in_redis, calls, upstream) = (
        s.redis.decision_calls(),
        s.envoy.counter("ratelimit_bridge_calls"),
        s.envoy.stat("cluster.webdis.upstream_rq_total"),
    );
    const THREADS: usize = 16;
    const EACH: usize = 40;
    let port = s.envoy.port;
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                scope.spawn(move || {
                    (0..EACH)
                        .map(|i| {
                            // Half on one hot key, half on keys of their own.
                            let key = if i % 2 == 0 {
                                "hot".to_string()
                            } else {
                                format!("client-{t}-{i}")
                            };
                            get(port, "/", &[("x-api-key", key.as_bytes())])
                                .map(|r| r.status)
                                .unwrap_or(0)
                        })
                        .collect::<Vec<u16>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("client thread"))
            .collect()
    });
    let requests = (THREADS * EACH) as u64;
    assert!(statuses.iter().all(|&st| st == 200), "{statuses:?}");
    assert_eq!(s.envoy.counter("ratelimit_allowed"), requests + 1);
    let in_redis = s.redis.decision_calls() - in_redis;
    let calls = s.envoy.counter("ratelimit_bridge_calls") - calls;
    let upstream = s.envoy.stat("cluster.webdis.upstream_rq_total") - upstream;
    // Every decision call is one FCALL, counted alike by the filter, Envoy and Redis.
    assert_eq!((calls, upstream), (in_redis, in_redis));
    assert!(
        in_redis * 2 <= requests,
        "{requests} requests took {in_redis} calls: concurrent ones should share"
    );
    // No callback found the worker's engine busy (Envoy defers a callback that would
    // re-enter the filter): the counter is exported, and 0.
    let busy = get(
        s.envoy.admin_port,
        "/stats?filter=ratelimit_engine_busy",
        &[],
    )
    .expect("envoy admin /stats")
    .text();
    assert_eq!(busy.trim(), "wasmcustom.ratelimit_engine_busy: 0");
    // And the hot key was charged once per request, exactly.
    let tokens = s.envoy.bucket_tokens(&s.redis, "api", "second", "hot");
    let hot = (THREADS * EACH / 2) as f64;
    // Refill while the test ran adds back at most 1,000,000 per second of its duration.
    assert!(tokens >= 1_000_000.0 - hot, "{tokens}");
}

fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

#[test]
fn the_deny_cache_answers_without_calls_and_expires_exactly() {
    // Two tokens, one more per second.
    let s = start(
        "engine-deny-cache",
        r#"[{"name": "api", "limits": [{"name": "second", "limit": 1, "window": "1s", "burst": 2}]}]"#,
    );
    s.envoy.load_script("/");
    let first_sent = unix_ms();
    assert_eq!(s.envoy.keyed("abuser").status, 200);
    assert_eq!(s.envoy.keyed("abuser").status, 200);
    let second_read = unix_ms();
    assert_eq!(s.envoy.keyed("abuser").status, 429, "refused by Redis");
    let before = s.redis.decision_calls();
    // Ask again and again until allowed. Every request read before a token can be back (1 s
    // after the first was decided, which was after it was sent) must be refused, and the first
    // request sent after one is surely back (1 s after the second was answered) allowed.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut refused = 0u64;
    let allowed_sent = loop {
        assert!(Instant::now() < deadline, "never allowed again");
        let sent = unix_ms();
        let r = s.envoy.keyed("abuser");
        let read = unix_ms();
        if r.status == 200 {
            break sent;
        }
        assert_eq!(r.status, 429);
        assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
        assert_eq!(r.header("retry-after"), Some("1"));
        assert!(
            sent <= second_read + 1000.0,
            "a request sent {:.1} ms after a token was surely back was refused",
            sent - second_read - 1000.0
        );
        refused += 1;
        assert!(read >= first_sent, "time runs forward");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        allowed_sent >= first_sent + 1000.0 - 1.0,
        "allowed {:.1} ms before a token could be back",
        first_sent + 1000.0 - allowed_sent
    );
    assert!(refused >= 10, "refused {refused} times in between");
    // Only the request that was finally allowed went to Redis.
    assert_eq!(s.redis.decision_calls() - before, 1);
    // The deny cache's answers reach the stats within a tick: both counts are waited for.
    wait_for_value(
        "the cached refusals to be counted (hits, denied)",
        PATIENCE,
        (refused, refused + 1),
        || {
            (
                s.envoy.counter("ratelimit_deny_cache_hits"),
                s.envoy.counter("ratelimit_denied"),
            )
        },
    );
}

/// A request sent on a connection of its own, its answer read later (or never).
struct Pending(TcpStream);

impl Pending {
    fn send(port: u16, key: &str) -> Pending {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to envoy");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let request = format!(
            "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nx-api-key: {key}\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .expect("send the request");
        Pending(stream)
    }

    fn answer(mut self) -> Response {
        let raw = e2e::http::read_response(&mut self.0).expect("read the answer");
        e2e::http::parse(&raw).expect("an HTTP response")
    }
}

#[test]
fn clients_that_leave_while_their_call_is_in_flight_take_no_other_decision_with_them() {
    let s = start(
        "engine-disconnect",
        r#"[{"name": "api", "limits": [{"name": "hour", "limit": 100, "window": "1h"}]}]"#,
    );
    s.envoy.load_script("/");
    let active = || s.envoy.stat("http.ingress.downstream_rq_active");
    let calls = || s.envoy.counter("ratelimit_bridge_calls");
    let calls_before = calls();
    s.webdis.process.pause();
    // A finds the worker idle: its call goes at once, from its own stream.
    let a = Pending::send(s.envoy.port, "shared");
    wait_for_value("A's call", PATIENCE, calls_before + 1, calls);
    // B, C and D wait behind it.
    let b = Pending::send(s.envoy.port, "shared");
    let c = Pending::send(s.envoy.port, "shared");
    let d = Pending::send(s.envoy.port, "shared");
    wait_for_value("4 requests in Envoy", PATIENCE, 4, active);
    // A leaves: its reply would be lost with its stream, so its room is freed at once and
    // the root sends B, C and D in one call.
    drop(a);
    wait_for_value("the batch of B, C and D", PATIENCE, calls_before + 2, calls);
    // C leaves while that batch is in flight.
    drop(c);
    wait_for_value("C gone", PATIENCE, 2, active);
    s.webdis.process.resume();
    for (name, pending) in [("B", b), ("D", d)] {
        let r = pending.answer();
        assert_eq!(r.status, 200, "{name}");
        assert!(
            r.header("x-ratelimit-remaining").is_some(),
            "{name} was decided by Redis, not let through by policy"
        );
    }
    assert_eq!(s.envoy.counter("ratelimit_failure_mode_open"), 0);
    assert_eq!(s.envoy.counter("ratelimit_bridge_errors"), 0);
    // B, C and D were decided in one call; A's call ran too, its answer went nowhere. All
    // four were charged, as Redis decided them.
    // Read with the counts that tell a stray decision apart (a call more, a request more).
    wait_for_value(
        "the batch decided (allowed, calls, requests, engine busy)",
        PATIENCE,
        (1 + 3, calls_before + 2, 1 + 4, 0),
        || {
            (
                s.envoy.counter("ratelimit_allowed"),
                calls(),
                s.envoy.stat("http.ingress.downstream_rq_total"),
                s.envoy.counter("ratelimit_engine_busy"),
            )
        },
    );
    let tokens = s.envoy.bucket_tokens(&s.redis, "api", "hour", "shared");
    assert!((96.0..97.0).contains(&tokens), "4 charged: {tokens}");
}
