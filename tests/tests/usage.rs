//! Usage limits end to end: real Envoy, Webdis and Redis, and a tiny upstream of this file
//! answering like an OpenAI-compatible API (a JSON body with `usage.total_tokens`, as many as
//! the request's `x-tokens` header asks; on a path with `/stream`, an event stream whose last
//! data event carries the usage).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use e2e::http::request;
use e2e::procs::filter_config_edit;
use e2e::{wait_until, Envoy, Keys, Redis, Response, Webdis, WorkDir};

/// Serves every connection on its own thread: each request is answered 200 with a JSON body
/// whose `usage.total_tokens` is the request's `x-tokens` (0 without it). Returns its port.
fn start_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
    let port = listener.local_addr().expect("upstream address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve(stream));
        }
    });
    port
}

fn serve(stream: TcpStream) {
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut writer = stream;
    loop {
        let (mut length, mut tokens) = (0usize, 0u64);
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let stream = line.contains("/stream") || line.contains("/cut");
        let cut = line.contains("/cut");
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let trimmed = line.trim_end();
            if trimmed.is_empty() {
                break;
            }
            if let Some((name, value)) = trimmed.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    "x-tokens" => tokens = value.trim().parse().unwrap_or(0),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let usage = format!(
            r#""usage": {{"prompt_tokens": 1, "completion_tokens": {tokens}, "total_tokens": {tokens}}}"#
        );
        let (kind, answer) = if stream {
            let event = r#"{"choices": [{"delta": {"content": "hi"}}], "usage": null}"#;
            let last = format!(r#"{{"choices": [], {usage}}}"#);
            let text = if cut {
                // A later event with more usage, cut before its end: it must not count.
                let more = r#"{"choices": [], "usage": {"total_tokens": 999}}"#;
                format!("data: {event}\n\ndata: {last}\n\ndata: {more}\n\n")
            } else {
                format!("data: {event}\n\ndata: {event}\n\ndata: {last}\n\ndata: [DONE]\n\n")
            };
            ("text/event-stream", text)
        } else {
            let text = format!(r#"{{"choices": [{{"message": {{"content": "hi"}}}}], {usage}}}"#);
            ("application/json", text)
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if cut {
            // The stream breaks off inside its last event: promised more than is sent.
            let sent = response.len() - 10;
            let head = response.replacen(
                &format!("content-length: {}", answer.len()),
                &format!("content-length: {}", answer.len() + 1000),
                1,
            );
            let _ = writer.write_all(&head.as_bytes()[..sent]);
            return;
        }
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// The filter configuration: the shipped bridge (patient: a loaded machine must not make
/// requests pass by policy) and `limits` on one rule keyed by `x-api-key`.
fn filter_json(limits: &str) -> String {
    format!(
        r#"{{
  "bridge": {{"cluster": "webdis", "authority": "webdis", "username": "ratelimit",
             "password": "ratelimit-demo-secret", "timeout": "5s"}},
  "breaker": {{"stall": "5s"}},
  "rules": [{{"name": "llm", "key": {{"from": ["header:x-api-key"]}}, "limits": [{limits}]}}]
}}"#
    )
}

struct Llm {
    envoy: Envoy,
    _webdis: Webdis,
    redis: Redis,
    keys: Keys,
    _dir: WorkDir,
}

impl Llm {
    fn start(name: &str, limits: &str) -> Llm {
        let dir = WorkDir::new(name);
        let redis = Redis::start(&dir);
        let webdis = Webdis::start(&dir, redis.port);
        let upstream = start_upstream();
        let json = filter_json(limits);
        let (from, to) = filter_config_edit(&json);
        let route = (
            "                direct_response:\n                  status: 200\n                  body: { inline_string: \"hello from behind the rate limiter\\n\" }\n",
            "                route: { cluster: upstream }\n",
        );
        let cluster = format!(
            "  clusters:\n  - name: upstream\n    type: STATIC\n    connect_timeout: 1s\n    load_assignment:\n      cluster_name: upstream\n      endpoints:\n      - lb_endpoints:\n        - endpoint:\n            address:\n              socket_address: {{ address: 127.0.0.1, port_value: {upstream} }}\n"
        );
        let edits = [
            (from.as_str(), to.as_str()),
            route,
            ("  clusters:\n", cluster.as_str()),
        ];
        let envoy = Envoy::start(&dir, webdis.port, &edits);
        Llm {
            envoy,
            _webdis: webdis,
            redis,
            keys: Keys::from_json(&json),
            _dir: dir,
        }
    }

    /// A chat completion for `api_key` whose answer says it used `tokens`.
    fn chat(&self, api_key: &str, body: &str, tokens: u64) -> Response {
        self.post("/v1/chat/completions", api_key, body, tokens)
    }

    /// A POST of `body` to `path` for `api_key` whose answer says it used `tokens`.
    fn post(&self, path: &str, api_key: &str, body: &str, tokens: u64) -> Response {
        let tokens = tokens.to_string();
        let headers: [(&str, &[u8]); 3] = [
            ("x-api-key", api_key.as_bytes()),
            ("x-tokens", tokens.as_bytes()),
            ("content-type", b"application/json"),
        ];
        request(self.envoy.port, "POST", path, &headers, body.as_bytes())
            .expect("a request through envoy")
    }

    fn field(&self, key: &str, field: &str) -> Option<String> {
        let value = self.redis.admin().cmd(&["HGET", key, field]).ok()?;
        Some(value.text()).filter(|t| !t.is_empty())
    }
}

#[test]
fn a_json_response_charges_exactly_its_usage_and_the_rest_of_the_reservation_is_given_back() {
    // A day's fixed window: the count in Redis is exactly what was charged.
    let s = Llm::start(
        "usage-json",
        r#"{"name": "tokens", "algorithm": "fixed_window", "limit": 100000, "window": "1d",
            "usage": {"from": "body:usage.total_tokens",
                      "estimate": {"request": {"completion_default": 1000}}}}"#,
    );
    let key = s
        .keys
        .limit_key("llm", "tokens", "header:x-api-key", b"alice");
    // Reserved: the body's bytes and its max_tokens (500); used: 30.
    let body = r#"{"max_tokens": 500, "messages": "hi"}"#;
    let reserved = body.len() as u64 + 500;
    let r = s.chat("alice", body, 30);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("total_tokens"), "{}", r.text());
    assert_eq!(r.header("x-ratelimit-limit"), Some("100000"));
    let remaining = 100_000 - reserved;
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some(remaining.to_string().as_str())
    );
    // The settlement follows the response: the count becomes the usage alone.
    wait_until(
        "the usage settled in Redis",
        Duration::from_secs(10),
        || s.field(&key, "n"),
        |n| n.as_deref() == Some("30"),
    );
    let r = s.chat("alice", body, 1200);
    assert_eq!(r.status, 200);
    // 1,200 used against the reservation: the rest charged as debt.
    wait_until(
        "the debt settled in Redis",
        Duration::from_secs(10),
        || s.field(&key, "n"),
        |n| n.as_deref() == Some("1230"),
    );
    s.envoy
        .wait_counter("ratelimit_rule.llm.tokens.usage_charged", 1230);
    s.envoy
        .wait_counter("ratelimit_rule.llm.tokens.usage_debt", 1200 - reserved);
    s.envoy
        .wait_counter("ratelimit_rule.llm.tokens.usage_given_back", reserved - 30);
    s.envoy
        .wait_counter("ratelimit_rule.llm.tokens.usage_reserved", 2 * reserved);
}

#[test]
fn debt_refuses_until_repaid_with_a_retry_after_that_counts_it() {
    // 600 tokens a minute (10 a second), 100 reserved per request from a fixed estimate.
    let s = Llm::start(
        "usage-debt",
        r#"{"name": "tokens", "limit": 600, "window": "1m",
            "usage": {"from": "body:usage.total_tokens", "estimate": 100}}"#,
    );
    let key = s
        .keys
        .limit_key("llm", "tokens", "header:x-api-key", b"bob");
    assert_eq!(s.chat("bob", "{}", 900).status, 200);
    // 900 used: the bucket holds 600 - 900 = -300 once settled.
    wait_until(
        "the debt settled in Redis",
        Duration::from_secs(10),
        || s.field(&key, "tokens").and_then(|t| t.parse::<f64>().ok()),
        |t| t.is_some_and(|t| t < 0.0),
    );
    let r = s.chat("bob", "{}", 1);
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    // 100 tokens needed from about -300: about 40 s at 10 a second.
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((35..=40).contains(&retry), "Retry-After {retry}");
}

#[test]
fn a_stream_charges_the_usage_of_its_last_event_and_a_body_too_large_is_answered_413() {
    let s = Llm::start(
        "usage-stream",
        r#"{"name": "tokens", "algorithm": "fixed_window", "limit": 100000, "window": "1d",
            "usage": {"from": "body:usage.total_tokens",
                      "estimate": {"request": {"completion_default": 100, "max_body": "64B"}}}}"#,
    );
    let key = s
        .keys
        .limit_key("llm", "tokens", "header:x-api-key", b"carol");
    let r = s.post("/v1/stream", "carol", r#"{"stream": true}"#, 77);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().ends_with("data: [DONE]\n\n"), "{}", r.text());
    wait_until(
        "the stream's usage settled in Redis",
        Duration::from_secs(10),
        || s.field(&key, "n"),
        |n| n.as_deref() == Some("77"),
    );
    // 65 bytes of body: over max_body, answered by the filter, nothing charged.
    let big = format!(r#"{{"messages": "{}"}}"#, "x".repeat(49));
    assert_eq!(big.len(), 65);
    let r = s.chat("dave", &big, 5);
    assert_eq!(r.status, 413, "{}", r.text());
    let dave = s
        .keys
        .limit_key("llm", "tokens", "header:x-api-key", b"dave");
    let exists = s.redis.admin().cmd(&["EXISTS", &dave]).unwrap().int();
    assert_eq!(exists, 0, "no state for a refused body");
}

#[test]
fn after_mode_admits_while_a_unit_is_left_and_charges_the_usage() {
    let s = Llm::start(
        "usage-after",
        r#"{"name": "tokens", "algorithm": "fixed_window", "limit": 100, "window": "1d",
            "usage": {"from": "body:usage.total_tokens", "admit": "after", "estimate": 1000}}"#,
    );
    let key = s
        .keys
        .limit_key("llm", "tokens", "header:x-api-key", b"erin");
    // An estimate of 1,000 on a limit of 100: admitted all the same, charged its usage.
    let r = s.chat("erin", "{}", 60);
    assert_eq!(r.status, 200, "{}", r.text());
    wait_until(
        "the usage charged",
        Duration::from_secs(10),
        || s.field(&key, "n"),
        |n| n.as_deref() == Some("60"),
    );
    assert_eq!(s.chat("erin", "{}", 60).status, 200, "40 left: admitted");
    wait_until(
        "the debt charged",
        Duration::from_secs(10),
        || s.field(&key, "n"),
        |n| n.as_deref() == Some("120"),
    );
    let r = s.chat("erin", "{}", 60);
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
}

#[test]
fn a_stream_cut_early_settles_the_usage_it_read() {
    let s = Llm::start(
        "usage-cut",
        r#"{"name": "tokens", "algorithm": "fixed_window", "limit": 100000, "window": "1d",
            "usage": {"from": "body:usage.total_tokens", "estimate": 100}}"#,
    );
    let key = s
        .keys
        .limit_key("llm", "tokens", "header:x-api-key", b"fay");
    // A complete event says 33; the next one (999) is cut inside: 33 is settled.
    let _ = s.post("/v1/cut", "fay", "{}", 33);
    wait_until(
        "the usage read before the cut settled",
        Duration::from_secs(10),
        || s.field(&key, "n"),
        |n| n.as_deref() == Some("33"),
    );
    s.envoy
        .wait_counter("ratelimit_rule.llm.tokens.usage_charged", 33);
}
