//! What the cost examples share: the request wrk sends to the bench's Envoy.

use ratelimit_core::testing::request::FakeRequest;

/// The bench's request, with `x-api-key: api_key` if given.
pub fn view(api_key: Option<&str>) -> FakeRequest {
    let mut headers: Vec<(String, Vec<u8>)> = [
        (":authority", "127.0.0.1:10000"),
        (":path", "/"),
        (":method", "GET"),
        (":scheme", "http"),
        ("x-forwarded-proto", "http"),
        ("x-request-id", "0b7a2f4e-6a0c-4bd8-9d1b-3c0f8f0b9c11"),
    ]
    .iter()
    .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
    .collect();
    if let Some(k) = api_key {
        headers.push(("x-api-key".into(), k.as_bytes().to_vec()));
    }
    FakeRequest {
        headers,
        source: Some("127.0.0.1:53124".into()),
        ..FakeRequest::default()
    }
}
