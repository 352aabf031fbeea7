//! Per-model token budgets (envoy/examples/llm_models.yaml) with the official `openai` Python
//! client (installed into .venv by `make setup-openai`; its side is tests/openai/models_check.py)
//! on two Envoys of two workers sharing one Redis, in front of the tests' OpenAI-compatible
//! upstream (`e2e::llm`): each model's budget charged exactly what the upstream reported, apart
//! from the other's, and `content-length` kept on every request the filter does not edit.

use std::time::Duration;

use e2e::auth::Fleet;
use e2e::python::{run_script, venv_python};
use e2e::{clear_of_window_end, root, wait_until, Keys, LlmUpstream, DAY, TEST_SPAN};
use ratelimit_core::request::identity::PART_SEPARATOR;

const EXAMPLE: &str = "envoy/examples/llm_models.yaml";
const WAIT: Duration = Duration::from_secs(15);
const GPT_4O: u64 = 3_200;
const MINI: u64 = 20_000;
/// What a gpt-4o-mini request of the concurrent phase reserves at most: its body (under 200
/// bytes) and its `max_tokens` (600).
const MINI_ESTIMATE: u64 = 800;

/// The example's edits for a test; its budgets count in daily fixed windows, so this also
/// waits until the day has a test's span left.
fn edits(upstream_port: u16) -> Vec<(String, String)> {
    clear_of_window_end(DAY, TEST_SPAN);
    [
        ("port_value: 8000", format!("port_value: {upstream_port}")),
        // A slow moment of a loaded machine must not let a request through undecided.
        (r#""timeout": "150ms""#, r#""timeout": "1s""#.to_string()),
        (r#""limit": 1000000,"#, format!(r#""limit": {GPT_4O},"#)),
        (r#""limit": 10000000,"#, format!(r#""limit": {MINI},"#)),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b))
    .collect()
}

/// The tokens Redis counts in `rule`'s day for `identity` (the key's value, then the model).
fn used(fleet: &Fleet, keys: &Keys, rule: &str, label: &str, parts: &[&str]) -> Option<u64> {
    let identity = parts.join(&char::from(PART_SEPARATOR).to_string());
    let key = keys.limit_key(rule, "tokens_day", label, identity.as_bytes());
    let n = fleet.redis.admin().cmd(&["HGET", &key, "n"]).ok()?;
    n.text().parse().ok()
}

#[test]
fn each_model_has_its_own_budget_charged_exactly_and_unedited_requests_keep_their_length() {
    let python = venv_python("openai", "setup-openai");
    let upstream = LlmUpstream::start();
    let edits = edits(upstream.port);
    let fleet = Fleet::start("llm-models", &root().join(EXAMPLE), &edits);
    let keys = fleet.keys();
    let urls: Vec<String> = fleet
        .envoys
        .iter()
        .map(|e| format!("http://127.0.0.1:{}/v1", e.port))
        .collect();
    let text = run_script(&python, "tests/openai/models_check.py", &urls);
    println!("{text}");
    let seen: serde_json::Value = serde_json::from_str(text.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("models_check's summary: {e}: {text}"));

    let model_key = "header:authorization+body:model";
    let settled = |rule: &str, label: &str, parts: &[&str], want: u64| {
        wait_until(
            &format!("{parts:?} settled in Redis at {want}"),
            WAIT,
            || used(&fleet, &keys, rule, label, parts),
            |n| *n == Some(want),
        );
    };
    // gpt-4o: 6 answers of 500 tokens let through, the 7th refused (the script checked the
    // statuses), 3,000 charged as the upstream reported.
    let alice_4o = upstream.served_for_model("sk-alice", "gpt-4o");
    assert_eq!((alice_4o.count, alice_4o.sum), (6, 3_000));
    settled("models", model_key, &["Bearer sk-alice", "gpt-4o"], 3_000);
    // gpt-4o-mini, from 4 clients at once over both Envoys: charged 500 per answer let through,
    // never past its own budget, refused only once less than an estimate was left.
    let allowed = seen["mini_allowed"].as_u64().expect("mini_allowed");
    let alice_mini = upstream.served_for_model("sk-alice", "gpt-4o-mini");
    assert_eq!(alice_mini.count, allowed);
    assert_eq!(alice_mini.sum, 500 * allowed);
    settled(
        "models",
        model_key,
        &["Bearer sk-alice", "gpt-4o-mini"],
        500 * allowed,
    );
    assert!(
        500 * allowed <= MINI,
        "{allowed} answers of 500 past {MINI}"
    );
    assert!(
        500 * allowed + 5 * MINI_ESTIMATE > MINI,
        "refused with {} of {MINI} used: 4 clients' reservations and a settlement or two on their way explain less",
        500 * allowed
    );
    // Any other model: the key's one shared budget.
    settled(
        "other_models",
        "header:authorization",
        &["Bearer sk-alice"],
        100,
    );
    // Bob's 3 plain requests, 3 streams the filter edited (they reported usage though the
    // client never asked) and 2 streams asking themselves: 800 tokens, all reported.
    let bob = upstream.served_for_model("sk-bob", "gpt-4o-mini");
    assert_eq!((bob.count, bob.sum, bob.unreported), (8, 800, 0));
    settled("models", model_key, &["Bearer sk-bob", "gpt-4o-mini"], 800);
    // Only the 3 edited streams reached the upstream without their content-length.
    assert_eq!(upstream.chunked_requests(), 3);
    assert_eq!(
        fleet.counter("ratelimit_failure_mode_open"),
        0,
        "nothing failed open"
    );
    assert_eq!(fleet.counter("ratelimit_bridge_errors"), 0);
}

/// A streamed request sent in chunks, `model` in its last chunk, ended by trailers (Envoy with
/// HTTP/1.1 trailers on): its model is read and charged; it is not edited for
/// `include_usage` (Envoy 1.40 sends a body edited at the trailers unedited: seen with the
/// edit made there, `replace_request_body` succeeding), so its stream reports no usage and
/// its estimate stands.
#[test]
fn a_body_ended_by_trailers_is_read_and_charged_its_estimate() {
    use std::io::{BufReader, Write};
    let upstream = LlmUpstream::start();
    let mut edits = edits(upstream.port);
    edits.push((
        "          stat_prefix: ingress\n".to_string(),
        "          stat_prefix: ingress\n          http_protocol_options: { enable_trailers: true }\n"
            .to_string(),
    ));
    let fleet = Fleet::start("llm-models-trailers", &root().join(EXAMPLE), &edits);
    let keys = fleet.keys();
    let chunks: [&[u8]; 3] = [
        br#"{"messages": [{"role": "user", "content": "Say hello."}],"#,
        br#" "stream": true, "max_tokens": 50,"#,
        br#" "model": "gpt-4o"}"#,
    ];
    // The estimate: the body's bytes and its max_tokens.
    let estimate = chunks.iter().map(|c| c.len() as u64).sum::<u64>() + 50;
    for (i, envoy) in fleet.envoys.iter().enumerate() {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", envoy.port)).expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAuthorization: Bearer sk-carol\r\nContent-Type: application/json\r\nx-test-usage: 300\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for chunk in chunks {
            request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            request.extend_from_slice(chunk);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"0\r\nx-client-trailer: done\r\n\r\n");
        conn.write_all(&request).expect("send");
        let answer = e2e::http::read_streamed(&mut BufReader::new(conn)).expect("an answer");
        assert_eq!(answer.status, 200, "request {i}");
        assert!(answer.complete, "request {i}: the whole stream");
    }
    // Both reached the upstream as gpt-4o requests, their streams without usage.
    let carol = upstream.served_for_model("sk-carol", "gpt-4o");
    assert_eq!((carol.count, carol.unreported), (0, 2));
    // Charged to carol's gpt-4o budget (the model read at the trailers), the estimate each.
    let settled = || {
        used(
            &fleet,
            &keys,
            "models",
            "header:authorization+body:model",
            &["Bearer sk-carol", "gpt-4o"],
        )
    };
    wait_until("carol's gpt-4o estimates in Redis", WAIT, settled, |n| {
        *n == Some(2 * estimate)
    });
    wait_until(
        "both streams counted as unread",
        WAIT,
        || fleet.counter("ratelimit_rule.models.tokens_day.usage_unread"),
        |n| *n == 2,
    );
}
