//! The shipped demo policy (envoy/envoy.yaml: `per_client`, 10 per minute, burst 10, keyed by
//! `x-api-key`; `per_ip`, 30 per minute per client IP, every request) as tests see it through
//! a real Envoy.

use crate::http::Response;
use crate::procs::Envoy;

/// The demo policy's capacity per API key: 10, refilled at 10 per minute.
pub const CAPACITY: usize = 10;
/// The demo's ceiling per client IP: 30, refilled at 30 per minute.
pub const IP_CEILING: usize = 30;

/// An edit of the shipped envoy.yaml raising the per-IP ceiling out of reach, for a test of
/// the per-key rule's mechanics with more keys from one address than the ceiling allows.
pub const RAISED_CEILING: (&str, &str) = (
    "\"limit\": 30, \"window\": \"1m\"",
    "\"limit\": 1000000, \"window\": \"1m\"",
);

/// `GET /` with API key `api_key`, or without one (the client IP is then the identity).
pub fn hit(envoy: &Envoy, api_key: Option<&[u8]>) -> Response {
    match api_key {
        Some(key) => envoy.keyed(key),
        None => envoy.send("/", &[]),
    }
}

/// A fresh bucket: exactly [`CAPACITY`] requests pass, counting down, then 429 with the
/// headers.
pub fn assert_full_bucket_then_limited(envoy: &Envoy, api_key: Option<&[u8]>) {
    let who = api_key.map(|k| String::from_utf8_lossy(&k[..k.len().min(40)]).into_owned());
    for i in 0..CAPACITY {
        let r = hit(envoy, api_key);
        assert_eq!(r.status, 200, "request {i} for {who:?}: {}", r.text());
        assert_eq!(r.header("x-ratelimit-limit"), Some("10"), "request {i}");
        let remaining = (CAPACITY - 1 - i).to_string();
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(remaining.as_str()),
            "request {i} for {who:?}"
        );
    }
    let r = hit(envoy, api_key);
    assert_eq!(r.status, 429, "request {CAPACITY} for {who:?}");
    // One token every 6 s at 10 per minute; whole again in 60 s.
    assert_eq!(r.header("retry-after"), Some("6"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("60"));
    assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(r.text(), "rate limit exceeded\n");
    // Set by Envoy for a local reply's text body (the filter does not send it twice).
    assert_eq!(r.header("content-type"), Some("text/plain"));
}
