//! An idle Envoy's filter runs no timer, and work that comes after an idle spell is done as
//! before: requests are decided exactly, and what a stream leaves when it ends on an idle
//! worker (its concurrency hold's release, its usage settlement) still reaches Redis, sent at
//! the tick of the timer it starts again. Real Envoy (two workers), Webdis, Redis and the
//! tests' OpenAI-compatible upstream.

use std::time::Duration;

use e2e::http::post_streamed;
use e2e::llm::{chat_request, upstream_edits, EVENTS, EVENT_DELAY, USAGE};
use e2e::procs::envoy_config;
use e2e::{
    clear_of_window_end, free_port, get, wait_for, wait_until, Envoy, Keys, LlmUpstream, Redis,
    Webdis, WorkDir, DAY, MINUTE, TEST_SPAN,
};

/// How long a test waits for a state (a ceiling: a loaded machine can take seconds).
const WAIT: Duration = Duration::from_secs(20);

/// The gauge of workers whose timer runs; None if Envoy does not show it (so that a wait for
/// 0 cannot pass on a name Envoy does not know).
fn timers(envoy: &Envoy) -> Option<u64> {
    let name = "wasmcustom.ratelimit_worker_timers";
    let stats = get(envoy.admin_port, &format!("/stats?filter=^{name}$"), &[]).ok()?;
    stats
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.trim().parse().ok())
}

/// A POST of `body` to `path` for API key `key`, with the upstream's test headers `extra`:
/// its status (0: the connection failed).
fn post(port: u16, path: &str, key: &str, body: &[u8], extra: &[(&str, &[u8])]) -> u16 {
    let mut headers: Vec<(&str, &[u8])> = vec![
        ("x-api-key", key.as_bytes()),
        ("content-type", b"application/json"),
    ];
    headers.extend_from_slice(extra);
    post_streamed(port, path, &headers, body).map_or(0, |r| r.status)
}

#[test]
fn work_after_an_idle_spell_is_decided_and_what_a_stream_leaves_reaches_redis() {
    clear_of_window_end(DAY, TEST_SPAN);
    let dir = WorkDir::new("idle");
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let upstream = LlmUpstream::start();
    // Chat: one stream of a key at a time, and its tokens settled from the usage it reports
    // (1,000 reserved up front). Completions: 5 a minute per key.
    let json = r#"{"bridge": {"username": "ratelimit", "password": "ratelimit-demo-secret"},
"rules": [
  {"name": "llm", "match": {"path_prefix": "/v1/chat/"}, "key": {"from": ["header:x-api-key"]},
   "limits": [{"name": "streams", "algorithm": "concurrency", "limit": 1, "max_duration": "1m"},
              {"name": "tokens", "algorithm": "fixed_window", "limit": 1000000, "window": "1d",
               "usage": {"from": "body:usage.total_tokens", "estimate": 1000}}]},
  {"name": "burst", "match": {"path_prefix": "/v1/completions"}, "key": {"from": ["header:x-api-key"]},
   "limits": [{"name": "minute", "algorithm": "fixed_window", "limit": 5, "window": "1m"}]}]}"#;
    let owned = upstream_edits(json, upstream.port);
    let edits: Vec<(&str, &str)> = owned
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let (port, admin) = (free_port(), free_port());
    let envoy = Envoy::start_config(
        &dir,
        port,
        admin,
        &envoy_config(port, admin, webdis.port, &edits),
        2,
    );
    let keys = Keys::from_json(json);
    let holds_key = keys.limit_key("llm", "streams", "header:x-api-key", b"slow");
    let tokens_key = keys.limit_key("llm", "tokens", "header:x-api-key", b"slow");
    let held = || {
        redis
            .admin()
            .cmd(&["ZCARD", &holds_key])
            .map_or(-1, |r| r.int())
    };
    let charged = || {
        let n = redis
            .admin()
            .cmd(&["HGET", &tokens_key, "n"])
            .map(|r| r.text());
        n.ok().and_then(|t| t.parse::<u64>().ok())
    };

    // Nothing to do yet: no worker runs its timer.
    wait_timers(&envoy, 0, "no timer on a fresh Envoy");

    // A stream of 40 events 250 ms apart reporting 70 tokens: admitted, it holds the key's
    // one hold and 1,000 reserved tokens while it runs; a second stream is refused.
    let chat = chat_request("Say hello.", true, None);
    let long = {
        let chat = chat.clone();
        std::thread::spawn(move || {
            let extra: [(&str, &[u8]); 3] =
                [(EVENTS, b"40"), (EVENT_DELAY, b"250"), (USAGE, b"70")];
            post(port, "/v1/chat/completions", "slow", &chat, &extra)
        })
    };
    wait_for("the stream at the upstream", WAIT, || {
        (upstream.in_flight() == 1).then_some(())
    });
    let extra: [(&str, &[u8]); 1] = [(EVENTS, b"1")];
    assert_eq!(
        post(port, "/v1/chat/completions", "slow", &chat, &extra),
        429,
        "the hold is taken"
    );
    assert_eq!((held(), charged()), (1, Some(1000)));

    // While it streams, both workers go idle: the hold and the reservation need no timer.
    wait_until(
        "both timers stopped while the stream still runs",
        WAIT,
        || (timers(&envoy), upstream.in_flight()),
        |(timers, in_flight)| {
            assert_eq!(
                *in_flight, 1,
                "the stream ended before the workers went idle"
            );
            *timers == Some(0)
        },
    );

    // The stream ends on an idle worker: its release and its settlement (930 tokens given
    // back) start the timer again and reach Redis at its tick, with no other request.
    assert_eq!(long.join().expect("the stream's thread"), 200);
    wait_until("the hold released in Redis", WAIT, held, |n| *n == 0);
    wait_until("the usage settled in Redis", WAIT, charged, |n| {
        *n == Some(70)
    });
    wait_timers(&envoy, 0, "the timers stopped again");

    // Traffic again after the idle spell: 8 completions at once on a key allowed 5 a
    // minute are decided exactly (the first alone, the others batched behind it), all in
    // one fixed minute.
    let completion = br#"{"model": "test", "prompt": "hi"}"#;
    clear_of_window_end(MINUTE, Duration::from_secs(10));
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| post(port, "/v1/completions", "burst", completion, &[])))
            .collect();
        clients
            .into_iter()
            .map(|c| c.join().expect("a client thread"))
            .collect()
    });
    let allowed = statuses.iter().filter(|&&s| s == 200).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((allowed, refused), (5, 3), "{statuses:?}");
    let burst_key = keys.limit_key("burst", "minute", "header:x-api-key", b"burst");
    let count = redis
        .admin()
        .cmd(&["HGET", &burst_key, "n"])
        .expect("redis")
        .text();
    assert_eq!(count, "5");
    // The released hold is taken again.
    assert_eq!(
        post(port, "/v1/chat/completions", "slow", &chat, &extra),
        200
    );
    assert_eq!(
        envoy.counter("ratelimit_failure_mode_open"),
        0,
        "all decided by Redis"
    );
    assert_eq!(envoy.counter("ratelimit_engine_busy"), 0);
    wait_timers(&envoy, 0, "the timers stopped at the end");
}

/// Waits until the timers gauge shows `want` (it must be shown).
fn wait_timers(envoy: &Envoy, want: u64, what: &str) {
    wait_until(what, WAIT, || timers(envoy), |t| *t == Some(want));
}
