//! What the cost examples share: a request as the adapter sees it (headers read once, looked
//! up by name), with the headers wrk sends to the bench's Envoy.

use ratelimit_core::identity::{first_header, header_count};
use ratelimit_core::RequestView;

pub struct View {
    pub headers: Vec<(String, Vec<u8>)>,
    pub source: Option<String>,
}

impl RequestView for View {
    fn header(&self, name: &str) -> Option<&[u8]> {
        first_header(&self.headers, name)
    }
    fn header_copies(&self, name: &str) -> usize {
        header_count(&self.headers, name)
    }
    fn source_address(&self) -> Option<String> {
        self.source.clone()
    }
    fn route_name(&self) -> Option<String> {
        None
    }
}

/// The bench's request, with `x-api-key: api_key` if given.
pub fn view(api_key: Option<&str>) -> View {
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
    View {
        headers,
        source: Some("127.0.0.1:53124".into()),
    }
}
