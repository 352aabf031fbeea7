//! `"headers": "openai"` with the official `openai` Python client (installed into .venv by
//! `make setup-openai`): real Envoy, Webdis and Redis in front of the tests' OpenAI-compatible
//! upstream (`e2e::llm`). The client's side is tests/openai/client_check.py.

use e2e::llm::upstream_edits;
use e2e::python::{run_script, venv_python};
use e2e::{Envoy, LlmUpstream, Redis, Webdis, WorkDir};

/// 1 request a second and 4000 tokens a minute per `x-api-key`, the tokens estimated from the
/// request body; OpenAI's headers, problem+json bodies.
const FILTER: &str = r#"{
  "bridge": {"cluster": "webdis", "authority": "webdis", "username": "ratelimit",
             "password": "ratelimit-demo-secret", "timeout": "150ms"},
  "headers": "openai", "deny_body": "problem+json",
  "rules": [{"name": "llm", "key": {"from": ["header:x-api-key"]}, "limits": [
    {"name": "requests", "limit": 1, "window": "1s"},
    {"name": "tokens", "limit": 4000, "window": "1m",
     "usage": {"from": "body:usage.total_tokens",
               "estimate": {"request": {"completion_default": 16}}}}]}]
}"#;

#[test]
fn the_openai_client_reads_the_headers_and_honours_retry_after_ms() {
    let python = venv_python("openai", "setup-openai");
    let dir = WorkDir::new("openai");
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let upstream = LlmUpstream::start();
    let owned = upstream_edits(FILTER, upstream.port);
    let edits: Vec<(&str, &str)> = owned
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let envoy = Envoy::start(&dir, webdis.port, &edits);
    let url = format!("http://127.0.0.1:{}/v1", envoy.port);
    let text = run_script(&python, "tests/openai/client_check.py", &[url]);
    println!("{text}");
    // The request that never fits was counted, and reached no upstream.
    envoy.wait_counter("ratelimit_rule.llm.tokens.never_fits", 1);
    assert_eq!(
        upstream.requests(),
        3,
        "the allowed requests only: two of key-a, one of key-c"
    );
}
