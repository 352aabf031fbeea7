//! Usage limits end to end: real Envoy, Webdis and Redis in front of the tests'
//! OpenAI-compatible upstream (`e2e::llm`). Each charge is read in Redis (the limit's state
//! key), each count in Envoy's stats, and each test waits for the very state it asserts.

use std::time::{Duration, Instant};

use e2e::http::{post_streamed, sse_data, Streamed};
use e2e::llm::{
    chat_request, upstream_edits, Coding, Shape, ENCODING, EVENTS, EVENT_DELAY, PAD, SHAPE, USAGE,
    USAGE_RESPONSE_HEADER,
};
use e2e::{
    clear_of_window_end, get, wait_until, Envoy, Keys, LlmUpstream, Redis, Webdis, WorkDir, DAY,
    TEST_SPAN,
};

const WAIT: Duration = Duration::from_secs(15);

/// The filter configuration: the shipped bridge with `timeout` and `limits` on one rule `llm`
/// keyed by `x-api-key`.
fn filter_json(limits: &str, timeout: &str) -> String {
    format!(
        r#"{{
  "bridge": {{"cluster": "webdis", "authority": "webdis", "username": "ratelimit",
             "password": "ratelimit-demo-secret", "timeout": "{timeout}"}},
  "rules": [{{"name": "llm", "key": {{"from": ["header:x-api-key"]}}, "limits": [{limits}]}}]
}}"#
    )
}

struct Llm {
    envoy: Envoy,
    webdis: Webdis,
    redis: Redis,
    upstream: LlmUpstream,
    keys: Keys,
    _dir: WorkDir,
}

impl Llm {
    fn start(name: &str, limits: &str) -> Llm {
        Llm::start_with(name, limits, "150ms")
    }

    fn start_with(name: &str, limits: &str, timeout: &str) -> Llm {
        // Most of these limits count in a daily fixed window.
        clear_of_window_end(DAY, TEST_SPAN);
        let dir = WorkDir::new(name);
        let redis = Redis::start(&dir);
        let webdis = Webdis::start(&dir, redis.port);
        let upstream = LlmUpstream::start();
        let json = filter_json(limits, timeout);
        let owned = upstream_edits(&json, upstream.port);
        let edits: Vec<(&str, &str)> = owned
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let envoy = Envoy::start(&dir, webdis.port, &edits);
        Llm {
            envoy,
            webdis,
            redis,
            upstream,
            keys: Keys::from_json(&json),
            _dir: dir,
        }
    }

    /// A chat completion for `api_key` with `body` and the upstream's test headers `extra`.
    fn send(&self, api_key: &str, body: &[u8], extra: &[(&str, &[u8])]) -> Streamed {
        let mut headers: Vec<(&str, &[u8])> = vec![
            ("x-api-key", api_key.as_bytes()),
            ("content-type", b"application/json"),
        ];
        headers.extend_from_slice(extra);
        post_streamed(self.envoy.port, "/v1/chat/completions", &headers, body)
            .expect("an answer through envoy")
    }

    /// A JSON (or, with `stream`, streamed) completion whose usage is `tokens`.
    fn chat(&self, api_key: &str, stream: bool, tokens: u64) -> Streamed {
        let body = chat_request("Say hello.", stream, None);
        self.send(api_key, &body, &[(USAGE, tokens.to_string().as_bytes())])
    }

    fn key(&self, limit: &str, api_key: &str) -> String {
        self.keys
            .limit_key("llm", limit, "header:x-api-key", api_key.as_bytes())
    }

    /// A field of the state hash of `limit` for `api_key`.
    fn field(&self, limit: &str, api_key: &str, field: &str) -> Option<String> {
        let key = self.key(limit, api_key);
        let value = self.redis.admin().cmd(&["HGET", &key, field]).ok()?;
        Some(value.text()).filter(|t| !t.is_empty())
    }

    /// Waits until the fixed-window count of `limit` for `api_key` is `n`.
    fn wait_count(&self, limit: &str, api_key: &str, n: u64, what: &str) {
        let want = n.to_string();
        wait_until(
            what,
            WAIT,
            || self.field(limit, api_key, "n"),
            |v| v.as_deref() == Some(want.as_str()),
        );
    }

    fn counter(&self, limit: &str, event: &str) -> u64 {
        self.envoy
            .counter(&format!("ratelimit_rule.llm.{limit}.{event}"))
    }

    fn wait_counter(&self, limit: &str, event: &str, want: u64) {
        self.envoy
            .wait_counter(&format!("ratelimit_rule.llm.{limit}.{event}"), want);
    }

    /// No wasm panic and no failed filter callback in Envoy's log.
    fn assert_no_wasm_failure(&self) {
        let log = self.envoy.process.log_text();
        for bad in ["panicked", "Function: proxy_on_", "wasm trap"] {
            assert!(
                !log.contains(bad),
                "Envoy's log holds {bad:?}:\n{}",
                log.lines()
                    .filter(|l| l.contains(bad))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
}

/// The value of `metric` labelled rule `llm` and `limit` in /stats/prometheus.
fn per_rule(envoy: &Envoy, metric: &str, limit: &str) -> Option<f64> {
    let text = get(envoy.admin_port, "/stats/prometheus", &[])
        .expect("envoy admin /stats/prometheus")
        .text();
    let limit = format!("limit=\"{limit}\"");
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(metric)?.strip_prefix('{')?;
        let (labels, value) = rest.split_once("} ")?;
        let labels: Vec<&str> = labels.split(',').collect();
        (labels.len() == 2 && labels.contains(&"rule=\"llm\"") && labels.contains(&limit.as_str()))
            .then(|| value.trim().parse().ok())?
    })
}

/// When the chunk holding `needle` arrived.
fn arrived(r: &Streamed, needle: &str) -> Instant {
    r.chunks
        .iter()
        .find(|c| String::from_utf8_lossy(&c.data).contains(needle))
        .map(|c| c.at)
        .unwrap_or_else(|| panic!("no chunk holds {needle}"))
}

/// JSON answers and streams charge exactly the usage the upstream reported, read from a
/// body path and from a response header; the per-rule counters say so in /stats/prometheus
/// with rule and limit labels.
#[test]
fn json_and_streamed_answers_charge_exactly_their_usage_from_the_body_or_a_header() {
    // Fixed windows of a day: the count in Redis is exactly what was charged.
    let s = Llm::start(
        "usage-exact",
        r#"{"name": "body", "algorithm": "fixed_window", "limit": 1000000, "window": "1d",
            "usage": {"from": "body:usage.total_tokens", "estimate": 1000}},
           {"name": "header", "algorithm": "fixed_window", "limit": 1000000, "window": "1d",
            "usage": {"from": "header:x-usage-tokens", "estimate": 1000}}"#,
    );
    let r = s.chat("json", false, 30);
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body()).expect("JSON");
    assert_eq!(v["usage"]["total_tokens"], 30);
    assert_eq!(r.header("x-ratelimit-limit"), Some("1000000"));
    s.wait_count("body", "json", 30, "the JSON usage settled in Redis");

    let r = s.chat("stream", true, 77);
    assert!(r.complete, "the stream ended early");
    let data = sse_data(&r.body());
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    s.wait_count("body", "stream", 77, "the stream's usage settled in Redis");

    // The usage in a response header, as JSON and as a stream.
    for (stream, tokens) in [(false, 40), (true, 45)] {
        let body = chat_request("Say hello.", stream, None);
        let tokens_text = tokens.to_string();
        let r = s.send(
            "header",
            &body,
            &[
                (SHAPE, Shape::Header.name().as_bytes()),
                (USAGE, tokens_text.as_bytes()),
            ],
        );
        assert_eq!(r.header(USAGE_RESPONSE_HEADER), Some(tokens_text.as_str()));
    }
    s.wait_count(
        "header",
        "header",
        85,
        "the header's usage settled in Redis",
    );
    // Redis charged what the upstream reported, no more, no less.
    assert_eq!(s.upstream.served_for("json").sum, 30);
    assert_eq!(s.upstream.served_for("stream").sum, 77);
    assert_eq!(s.upstream.served_for("header").sum, 85);

    // Each limit read only its own source: the other one's estimate stands (unread).
    s.wait_count("header", "json", 1000, "the header limit kept its estimate");
    s.wait_count("body", "header", 2000, "the body limit kept its estimates");
    let counts = [
        ("usage_reserved", 4000.0, 4000.0),
        ("usage_charged", 2107.0, 2085.0),
        ("usage_given_back", 1893.0, 1915.0),
        ("usage_debt", 0.0, 0.0),
        ("usage_unread", 2.0, 2.0),
    ];
    for (event, body, header) in counts {
        let metric = format!("ratelimit_rule_{event}");
        for (limit, want) in [("body", body), ("header", header)] {
            wait_until(
                &format!("{metric}{{limit={limit}}}"),
                WAIT,
                || per_rule(&s.envoy, &metric, limit),
                |v| *v == Some(want),
            );
        }
    }
    s.assert_no_wasm_failure();
}

/// Compressed answers (gzip, and deflate zlib-wrapped or raw) are charged exactly their usage,
/// read from the body inflated as it passes, while the client receives the compressed bytes
/// exactly as the upstream sent them.
#[test]
fn compressed_answers_charge_exactly_their_usage_and_pass_unchanged() {
    let s = Llm::start(
        "usage-compressed",
        r#"{"name": "body", "algorithm": "fixed_window", "limit": 1000000, "window": "1d",
            "usage": {"from": "body:usage.total_tokens", "estimate": 1000}}"#,
    );
    let mut expected = 0;
    for (i, coding) in Coding::ALL.into_iter().enumerate() {
        for (stream, tokens) in [(false, 30 + i as u64), (true, 70 + i as u64)] {
            let key = format!(
                "{}-{}",
                coding.name(),
                if stream { "stream" } else { "json" }
            );
            let body = chat_request("Say hello.", stream, None);
            let tokens_text = tokens.to_string();
            let r = s.send(
                &key,
                &body,
                &[
                    ("accept-encoding", b"gzip, deflate"),
                    (ENCODING, coding.name().as_bytes()),
                    (USAGE, tokens_text.as_bytes()),
                    (EVENTS, b"5"),
                ],
            );
            assert_eq!(r.status, 200, "{key}");
            assert!(r.complete, "{key}: the answer ended early");
            assert_eq!(r.header("content-encoding"), Some(coding.header()), "{key}");
            let sent = s.upstream.sent_body_for(&key).expect("the upstream's body");
            assert!(
                r.body() == sent,
                "{key}: the client got {} bytes, not the {} the upstream sent",
                r.body().len(),
                sent.len()
            );
            s.wait_count(
                "body",
                &key,
                tokens,
                &format!("{key}: its usage settled in Redis"),
            );
            // Redis charged what the upstream reported, no more, no less.
            assert_eq!(s.upstream.served_for(&key).sum, tokens, "{key}");
            expected += tokens;
        }
    }
    s.wait_counter("body", "usage_charged", expected);
    assert_eq!(s.counter("body", "usage_unread"), 0);
    s.assert_no_wasm_failure();
}

/// The request's estimate (bytes + max_tokens) is charged before the upstream answers, the
/// stream reaches the client as it is sent, and the unused part is given back after; a
/// body over max_body is answered 413 and never reaches the upstream.
#[test]
fn the_estimate_is_charged_up_front_then_given_back_and_a_stream_is_not_held() {
    let s = Llm::start(
        "usage-reserve",
        r#"{"name": "tokens", "algorithm": "fixed_window", "limit": 1000000, "window": "1d",
            "usage": {"from": "body:usage.total_tokens",
                      "estimate": {"request": {"completion_default": 1000, "max_body": "1KiB"}}}}"#,
    );
    let body = chat_request("Say hello.", true, Some(500));
    let reserved = body.len() as u64 + 500;
    std::thread::scope(|scope| {
        // 4 content events 400 ms apart: the upstream holds its answer (and its usage) 1.6 s.
        let request = scope.spawn(|| {
            s.send(
                "alice",
                &body,
                &[(USAGE, b"120"), (EVENTS, b"4"), (EVENT_DELAY, b"400")],
            )
        });
        s.wait_count("tokens", "alice", reserved, "the estimate charged up front");
        assert!(
            !request.is_finished(),
            "the answer ended before the reservation was seen"
        );
        let r = request.join().expect("the request thread");
        assert!(r.complete, "the stream ended early");
        let spread = arrived(&r, "[DONE]") - arrived(&r, "data: {");
        assert!(
            spread >= Duration::from_millis(1200),
            "the first event came only {spread:?} before the last: the stream was held back"
        );
    });
    s.wait_count("tokens", "alice", 120, "the unused estimate given back");
    s.wait_counter("tokens", "usage_given_back", reserved - 120);
    s.wait_counter("tokens", "usage_reserved", reserved);

    // 1 KiB of body at most: a longer one is answered 413, uncharged, never answered upstream.
    let served = s.upstream.requests();
    let big = chat_request(&"x".repeat(1100), false, None);
    let r = s.send("bob", &big, &[]);
    assert_eq!(r.status, 413, "{}", String::from_utf8_lossy(&r.body()));
    assert_eq!(
        s.upstream.requests(),
        served,
        "the upstream read the request"
    );
    let exists = s
        .redis
        .admin()
        .cmd(&["EXISTS", &s.key("tokens", "bob")])
        .expect("EXISTS")
        .int();
    assert_eq!(exists, 0, "a refused body charged something");
    s.assert_no_wasm_failure();
}

/// A usage above the estimate is charged as debt: the key is refused with a Retry-After
/// that counts the debt, and admitted again once refill has repaid it.
#[test]
fn debt_refuses_until_repaid_with_the_right_retry_after() {
    // 100 tokens per 2 s (50 a second), 50 reserved per request.
    let s = Llm::start(
        "usage-debt",
        r#"{"name": "tokens", "limit": 100, "window": "2s",
            "usage": {"from": "body:usage.total_tokens", "estimate": 50}}"#,
    );
    let r = s.chat("bob", false, 250);
    assert_eq!(r.status, 200);
    // 250 used against 50 reserved: 200 of debt, the bucket below zero once settled.
    let tokens = || {
        let t: f64 = s.field("tokens", "bob", "tokens")?.parse().ok()?;
        let ts: u128 = s.field("tokens", "bob", "ts")?.parse().ok()?;
        Some((t, ts))
    };
    let (stored, ts) = wait_until("the debt settled in Redis", WAIT, tokens, |v| {
        v.is_some_and(|(t, _)| t < 0.0)
    })
    .expect("a bucket");
    s.wait_counter("tokens", "usage_debt", 200);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    // The balance now, refilled at 50 a second since the state was written.
    let elapsed = now.saturating_sub(ts) as f64 / 1e9;
    let balance = (stored + 50.0 * elapsed).min(100.0);
    let r = s.chat("bob", false, 1);
    let refused_at = Instant::now();
    assert_eq!(r.status, 429, "admitted at a balance of {balance}");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    // Until the balance covers the next estimate (50), rounded up as the filter rounds.
    let expected = ((50.0 - balance) / 50.0).ceil() as i64;
    let retry: i64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After in seconds");
    assert!(
        (retry - expected).abs() <= 1,
        "Retry-After {retry}, expected {expected} (balance {balance})"
    );
    // Refused until repaid, admitted once it is.
    let admitted = wait_until(
        "admitted again",
        Duration::from_secs(retry as u64 + 5),
        || s.chat("bob", false, 1).status,
        |status| *status == 200,
    );
    assert_eq!(admitted, 200);
    let waited = refused_at.elapsed().as_secs_f64();
    assert!(
        waited >= (retry - 1) as f64,
        "admitted after {waited:.2} s, Retry-After said {retry}"
    );
    s.assert_no_wasm_failure();
}

/// `after`: admitted while a unit is left, whatever the estimate, charged the usage once
/// read (debt allowed), refused at a balance of 0 or less.
#[test]
fn after_mode_admits_while_a_unit_is_left_and_charges_the_usage() {
    let s = Llm::start(
        "usage-after",
        r#"{"name": "tokens", "algorithm": "fixed_window", "limit": 100, "window": "1d",
            "usage": {"from": "body:usage.total_tokens", "admit": "after", "estimate": 1000}}"#,
    );
    // An estimate of 1,000 on a limit of 100: admitted all the same, nothing charged up front.
    assert_eq!(s.chat("erin", false, 60).status, 200);
    s.wait_count("tokens", "erin", 60, "the usage charged");
    assert_eq!(s.chat("erin", true, 60).status, 200, "40 left: admitted");
    s.wait_count("tokens", "erin", 120, "the stream's usage charged, as debt");
    let r = s.chat("erin", false, 60);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(s.upstream.served_for("erin").count, 2);
    // A balance of exactly 0 is refused too.
    assert_eq!(s.chat("finn", false, 100).status, 200);
    s.wait_count("tokens", "finn", 100, "the whole limit used");
    assert_eq!(s.chat("finn", false, 1).status, 429);
    s.wait_counter("tokens", "usage_charged", 220);
    // Nothing reserved, nothing given back; debt counts units above the estimate (1,000): none.
    assert_eq!(s.counter("tokens", "usage_reserved"), 0);
    assert_eq!(s.counter("tokens", "usage_given_back"), 0);
    assert_eq!(s.counter("tokens", "usage_debt"), 0);
    s.assert_no_wasm_failure();
}

/// Every bad answer, as JSON and as a stream, and a body past the read bound: none panics,
/// none gives tokens back (the estimate stays charged), each is counted in usage_unread.
#[test]
fn bad_upstream_input_keeps_the_estimate_and_is_counted() {
    let s = Llm::start(
        "usage-bad",
        r#"{"name": "tokens", "algorithm": "fixed_window", "limit": 1000000000, "window": "1d",
            "usage": {"from": "body:usage.total_tokens", "estimate": 100}}"#,
    );
    // Every bad shape: the usage in a header is a good answer for a header-sourced limit.
    let bad: Vec<Shape> = Shape::ALL
        .into_iter()
        .filter(|s| *s != Shape::Header)
        .collect();
    // (API key, streamed, the upstream's test header making the answer bad)
    let mut cases: Vec<(String, bool, (&str, String))> = Vec::new();
    for shape in bad {
        for stream in [false, true] {
            let name = format!(
                "{}-{}",
                shape.name(),
                if stream { "stream" } else { "json" }
            );
            cases.push((name, stream, (SHAPE, shape.name().to_string())));
        }
    }
    // 17 MiB of padding before the usage: past the 16 MiB read bound.
    cases.push((
        "padded-json".into(),
        false,
        (PAD, (17u64 << 20).to_string()),
    ));
    for (i, (name, stream, (header, value))) in cases.iter().enumerate() {
        let body = chat_request("Say hello.", *stream, None);
        let headers: [(&str, &[u8]); 3] = [
            ("x-api-key", name.as_bytes()),
            (header, value.as_bytes()),
            (USAGE, b"40"),
        ];
        // A reset or cut answer may break the client's connection: only the state counts.
        let r = post_streamed(s.envoy.port, "/v1/chat/completions", &headers, &body);
        if *header == PAD {
            // The whole padded answer reached the client (the filter reads, never holds).
            let r = r.expect("the padded answer");
            assert_eq!(r.status, 200);
            assert!(r.complete && r.body().len() > 17 << 20, "padded answer cut");
        }
        s.wait_counter("tokens", "usage_unread", i as u64 + 1);
        s.wait_count(
            "tokens",
            name,
            100,
            &format!("{name}: the estimate charged"),
        );
    }
    let n = cases.len() as u64;
    s.wait_counter("tokens", "usage_charged", 100 * n);
    assert_eq!(s.counter("tokens", "usage_given_back"), 0);
    assert_eq!(s.counter("tokens", "usage_debt"), 0);
    // Nothing given back later either: every count still holds the estimate.
    for (name, _, _) in &cases {
        assert_eq!(
            s.field("tokens", name, "n").as_deref(),
            Some("100"),
            "{name}"
        );
    }
    s.assert_no_wasm_failure();
}

/// Webdis stopped (SIGSTOP) when settlements are due: they are kept, and land once it is
/// back; a debt is never lost (at worst charged once more per call that timed out, as
/// documented), a give-back is made at most once.
#[test]
fn settlements_due_while_webdis_hangs_land_after_it_resumes() {
    let s = Llm::start_with(
        "usage-paused",
        r#"{"name": "tokens", "algorithm": "fixed_window", "limit": 1000000, "window": "1d",
            "usage": {"from": "body:usage.total_tokens", "estimate": 100}}"#,
        "1s",
    );
    s.envoy.wait_counter("ratelimit_usage_settlements_lost", 0);
    let stats = get(s.envoy.admin_port, "/stats/prometheus", &[])
        .expect("/stats/prometheus")
        .text();
    assert!(
        stats.contains("ratelimit_usage_settlements_lost"),
        "ratelimit_usage_settlements_lost is not exported"
    );
    let calls = s.envoy.counter("ratelimit_usage_settlement_calls");
    std::thread::scope(|scope| {
        let streams: Vec<_> = [("debt", b"700" as &[u8]), ("back", b"30")]
            .into_iter()
            .map(|(key, usage)| {
                let s = &s;
                scope.spawn(move || {
                    s.send(
                        key,
                        &chat_request("Say hello.", true, None),
                        &[(USAGE, usage), (EVENTS, b"3"), (EVENT_DELAY, b"300")],
                    )
                })
            })
            .collect();
        s.wait_count("tokens", "debt", 100, "the debt's estimate reserved");
        s.wait_count("tokens", "back", 100, "the give-back's estimate reserved");
        s.webdis.process.pause();
        for stream in streams {
            assert!(stream.join().expect("a request thread").complete);
        }
    });
    // The settlement call is made while Webdis hangs, and times out (Envoy answers it 504
    // after 1 s): it was sent, so Webdis may still carry it out once it runs again.
    wait_until(
        "a settlement call timed out",
        WAIT,
        || s.envoy.stat("cluster.webdis.upstream_rq_timeout"),
        |n| *n >= 1,
    );
    assert!(s.envoy.counter("ratelimit_usage_settlement_calls") > calls);
    assert_eq!(s.field("tokens", "debt", "n").as_deref(), Some("100"));
    // Its give-back is dropped and counted lost (sending it again could give it twice), its
    // debt kept and sent again.
    s.envoy.wait_counter("ratelimit_usage_settlements_lost", 1);
    let timeouts = s.envoy.stat("cluster.webdis.upstream_rq_timeout");
    s.webdis.process.resume();
    // The debt (600) lands once, and once more for each call that timed out and that Webdis
    // carried out all the same (on the limit's side).
    let debt = wait_until(
        "the debt charged after Webdis resumed",
        WAIT,
        || {
            s.field("tokens", "debt", "n")
                .and_then(|n| n.parse::<u64>().ok())
        },
        |n| n.is_some_and(|n| n >= 700 && (n - 100) % 600 == 0),
    );
    let charged = debt.map(|n| (n - 100) / 600).unwrap_or(0);
    assert!(
        charged <= timeouts + 1,
        "the debt charged {charged} times after {timeouts} timeouts"
    );
    // A decision made after the resume has reached Redis, so has what Webdis held before it.
    assert_eq!(s.chat("probe", false, 5).status, 200);
    s.wait_count("tokens", "probe", 5, "a request after the resume settled");
    // The give-back was made at most once: 30 (Webdis carried out the call that timed out)
    // or 100 (it did not: the reservation stays spent). Never below the usage.
    let back = s.field("tokens", "back", "n");
    assert!(
        matches!(back.as_deref(), Some("100") | Some("30")),
        "give-back: n = {back:?} for a usage of 30 (debt {debt:?})"
    );
    assert_eq!(s.counter("tokens", "usage_unread"), 0);
    s.assert_no_wasm_failure();
}

/// OpenAI's Responses API and Anthropic's Messages API, JSON and streamed, each charged
/// exactly the usage the upstream reported; a streamed chat completion without
/// `include_usage` is sent with it and charged exactly too.
#[test]
fn named_formats_charge_exactly_and_include_usage_is_added() {
    let s = Llm::start(
        "usage-formats",
        r#"{"name": "openai", "algorithm": "fixed_window", "limit": 1000000, "window": "1d",
            "usage": {"from": "openai", "include_usage": true,
                      "estimate": {"request": {"completion_default": 1000}}}},
           {"name": "anthropic", "algorithm": "fixed_window", "limit": 1000000, "window": "1d",
            "usage": {"from": "anthropic", "estimate": 1000}}"#,
    );
    let post = |key: &str, path: &str, stream: bool, tokens: u64| {
        let body = format!(
            r#"{{"model":"m","stream":{stream},"max_tokens":64,"messages":[{{"role":"user","content":"hi"}}]}}"#
        );
        let tokens = tokens.to_string();
        let headers: Vec<(&str, &[u8])> = vec![
            ("x-api-key", key.as_bytes()),
            ("content-type", b"application/json"),
            (USAGE, tokens.as_bytes()),
        ];
        let r = post_streamed(s.envoy.port, path, &headers, body.as_bytes()).expect("an answer");
        assert_eq!(r.status, 200, "{path}");
        assert!(r.complete, "{path}");
        r
    };
    post("resp-json", "/v1/responses", false, 31);
    post("resp-stream", "/v1/responses", true, 42);
    post("msg-json", "/v1/messages", false, 53);
    post("msg-stream", "/v1/messages", true, 64);
    let r = post("inject", "/v1/chat/completions", true, 75);
    // The client sees the extra last chunk: no choices, the usage.
    let data = sse_data(&r.body());
    let usage_chunk = &data[data.len() - 2];
    let v: serde_json::Value = serde_json::from_str(usage_chunk).expect("JSON chunk");
    assert_eq!(v["choices"], serde_json::json!([]));
    assert_eq!(v["usage"]["total_tokens"], 75);
    s.wait_count("openai", "resp-json", 31, "the Responses API JSON usage");
    s.wait_count("openai", "resp-stream", 42, "response.completed's usage");
    s.wait_count("anthropic", "msg-json", 53, "the Messages API JSON usage");
    s.wait_count(
        "anthropic",
        "msg-stream",
        64,
        "message_start + message_delta",
    );
    s.wait_count("openai", "inject", 75, "the injected include_usage stream");
    for (key, sum) in [
        ("resp-json", 31),
        ("resp-stream", 42),
        ("msg-json", 53),
        ("msg-stream", 64),
        ("inject", 75),
    ] {
        assert_eq!(s.upstream.served_for(key).sum, sum, "{key}");
    }
    s.assert_no_wasm_failure();
}
