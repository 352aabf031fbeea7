//! Concurrency limits end to end: at most N requests of a key in flight at the upstream across
//! two Envoys of two workers each, a streamed answer keeping its hold to its last event, and
//! the holds of an Envoy killed mid-stream ended at their `max_duration`, not before. Real
//! Envoys, Webdis, Redis and an OpenAI-compatible test upstream that counts the requests it is
//! answering.

use std::time::{Duration, Instant};

use e2e::http::post_streamed;
use e2e::llm::{chat_request, upstream_edits, LlmUpstream, EVENTS, EVENT_DELAY};
use e2e::procs::envoy_config;
use e2e::{free_port, wait_for, Envoy, Redis, Webdis, WorkDir};

struct Stack {
    replicas: Vec<Envoy>,
    upstream: LlmUpstream,
    _webdis: Webdis,
    _redis: Redis,
    _dir: WorkDir,
}

/// `in_flight` requests of a key at most, each held at most `max_duration`; the shipped
/// defaults otherwise. `replicas` Envoys of 2 workers route to the test upstream.
fn stack(name: &str, in_flight: u64, max_duration: &str, replicas: usize) -> Stack {
    let dir = WorkDir::new(name);
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let upstream = LlmUpstream::start();
    let json = format!(
        r#"{{"bridge": {{"username": "ratelimit", "password": "ratelimit-demo-secret"}},
"rules": [{{"name": "llm", "key": {{"from": ["header:x-api-key"]}},
  "limits": [{{"name": "streams", "algorithm": "concurrency", "limit": {in_flight}, "max_duration": "{max_duration}"}}]}}]}}"#
    );
    let owned = upstream_edits(&json, upstream.port);
    let edits: Vec<(&str, &str)> = owned
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let replicas = (0..replicas)
        .map(|_| {
            let (port, admin) = (free_port(), free_port());
            let yaml = envoy_config(port, admin, webdis.port, &edits);
            Envoy::start_config(&dir, port, admin, &yaml, 2)
        })
        .collect();
    Stack {
        replicas,
        upstream,
        _webdis: webdis,
        _redis: redis,
        _dir: dir,
    }
}

/// A streamed chat completion of `events` events `delay_ms` apart, for API key `key`: its
/// status (0: the connection failed).
fn stream(port: u16, key: &str, events: u32, delay_ms: u64) -> u16 {
    let (events, delay) = (events.to_string(), delay_ms.to_string());
    let headers: [(&str, &[u8]); 4] = [
        ("x-api-key", key.as_bytes()),
        ("content-type", b"application/json"),
        (EVENTS, events.as_bytes()),
        (EVENT_DELAY, delay.as_bytes()),
    ];
    let body = chat_request("hi", true, Some(10));
    post_streamed(port, "/v1/chat/completions", &headers, &body).map_or(0, |r| r.status)
}

#[test]
fn requests_in_flight_never_exceed_the_limit_across_two_replicas_and_holds_are_taken_again() {
    const LIMIT: u64 = 3;
    let s = stack("concurrency-fleet", LIMIT, "1m", 2);
    let ports: Vec<u16> = s.replicas.iter().map(|e| e.port).collect();
    // 12 clients, each streaming answers of about 300 ms back to back for 3 s, spread over
    // both replicas.
    let until = Instant::now() + Duration::from_secs(3);
    let clients: Vec<_> = (0..12)
        .map(|i| {
            let port = ports[i % ports.len()];
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                while Instant::now() < until {
                    let status = stream(port, "tenant", 4, 100);
                    statuses.push(status);
                    if status == 429 {
                        std::thread::sleep(Duration::from_millis(50)); // a client's pause
                    }
                }
                statuses
            })
        })
        .collect();
    let statuses: Vec<u16> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("a client thread"))
        .collect();
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    println!(
        "{ok} answered, {refused} refused of {}; at most {} in flight at the upstream",
        statuses.len(),
        s.upstream.peak_in_flight()
    );
    assert_eq!(
        ok + refused,
        statuses.len(),
        "only 200 and 429: {statuses:?}"
    );
    assert!(
        s.upstream.peak_in_flight() <= LIMIT,
        "over the limit in flight"
    );
    assert!(
        refused > 0,
        "12 clients against a limit of 3 are refused some of the time"
    );
    assert!(
        ok as u64 > 2 * LIMIT,
        "released holds are taken again: {ok} answered"
    );
    for e in &s.replicas {
        assert_eq!(e.counter("ratelimit_failure_mode_open"), 0);
    }
}

#[test]
fn a_streamed_answer_keeps_its_hold_to_its_last_event() {
    let s = stack("concurrency-stream", 1, "1m", 1);
    let port = s.replicas[0].port;
    let long = std::thread::spawn(move || stream(port, "one", 8, 150));
    wait_for(
        "the stream at the upstream",
        Duration::from_secs(10),
        || (s.upstream.in_flight() == 1).then_some(()),
    );
    let refused = s.replicas[0].keyed_at("/v1/other", "one");
    assert_eq!(
        refused.status, 429,
        "the hold is kept while the stream runs"
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(long.join().expect("the stream's thread"), 200);
    // Released when the stream ended: the next request of the key gets in (once the release,
    // sent at the worker's next wake-up, has reached Redis).
    wait_for("the hold released", Duration::from_secs(5), || {
        (stream(port, "one", 1, 0) == 200).then_some(())
    });
}

#[test]
fn the_holds_of_an_envoy_killed_mid_stream_end_at_max_duration_not_before() {
    const MAX_MS: u64 = 3_000;
    let s = stack("concurrency-killed", 2, "3s", 2);
    let a = s.replicas[0].port;
    let sent = Instant::now();
    let _streams: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(move || stream(a, "k", 100, 100)))
        .collect();
    wait_for(
        "two streams at the upstream",
        Duration::from_secs(10),
        || (s.upstream.in_flight() == 2).then_some(()),
    );
    let admitted_by = sent.elapsed();
    s.replicas[0].process.signal("KILL");
    let b = s.replicas[1].port;
    // Replica B is refused until the killed streams' holds reach their deadline.
    // An answer is decided before it arrives, and after it was asked for.
    let (asked, answered) = wait_for("a hold released", Duration::from_secs(15), || {
        let asked = sent.elapsed();
        (stream(b, "k", 1, 0) == 200).then(|| (asked, sent.elapsed()))
    });
    println!(
        "admitted within {admitted_by:?} of the send; a hold allowed when asked {asked:?} after it"
    );
    assert!(
        answered >= Duration::from_millis(MAX_MS),
        "allowed by {answered:?}, before max_duration"
    );
    assert!(
        asked <= admitted_by + Duration::from_millis(MAX_MS + 1_500),
        "first allowed when asked {asked:?} after the send: long after max_duration"
    );
}
