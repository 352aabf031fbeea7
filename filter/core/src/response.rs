//! What the client sees: rate-limit headers, the 429 and the fail-closed 503.

use crate::bridge::Decision;
use crate::config::Limit;

pub type Headers = Vec<(&'static str, String)>;

/// A response the filter answers itself instead of forwarding the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    pub status: u16,
    pub headers: Headers,
    pub body: &'static str,
}

pub const DENIED_BODY: &str = "rate limit exceeded\n";
pub const UNAVAILABLE_BODY: &str = "rate limiter unavailable\n";

/// Headers added to an allowed request's response.
pub fn allowed_headers(limit: &Limit, decision: &Decision) -> Headers {
    vec![
        ("x-ratelimit-limit", limit.capacity.to_string()),
        (
            "x-ratelimit-remaining",
            whole_tokens(decision.remaining).to_string(),
        ),
    ]
}

/// The 429 for a refused request.
pub fn denied(limit: &Limit, decision: &Decision) -> LocalResponse {
    LocalResponse {
        status: 429,
        headers: vec![
            (
                "retry-after",
                retry_after_secs(decision.retry_after_ms).to_string(),
            ),
            ("x-ratelimit-limit", limit.capacity.to_string()),
            ("x-ratelimit-remaining", "0".to_string()),
            ("content-type", "text/plain".to_string()),
        ],
        body: DENIED_BODY,
    }
}

/// The 503 of `failure_mode: closed`.
pub fn unavailable() -> LocalResponse {
    LocalResponse {
        status: 503,
        headers: vec![("content-type", "text/plain".to_string())],
        body: UNAVAILABLE_BODY,
    }
}

/// `Retry-After` in whole seconds, rounded up (an earlier retry would be refused again), and
/// at least 1, since 0 invites an immediate retry.
pub fn retry_after_secs(retry_after_ms: f64) -> u64 {
    let secs = (retry_after_ms / 1000.0).ceil();
    if secs.is_finite() && secs >= 1.0 {
        secs as u64
    } else {
        1
    }
}

/// Whole tokens left: a client can spend only whole requests.
fn whole_tokens(remaining: f64) -> u64 {
    if remaining.is_finite() && remaining > 0.0 {
        remaining.floor() as u64
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const LIMIT: Limit = Limit {
        capacity: 10,
        rate_per_second: 1.0,
    };

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        let cases = [
            (0.0, 1),
            (1.0, 1),
            (999.0, 1),
            (1000.0, 1),
            (1001.0, 2),
            (5999.5, 6),
            (f64::NAN, 1),
            (f64::INFINITY, 1),
            (-5.0, 1),
        ];
        for (ms, secs) in cases {
            assert_eq!(retry_after_secs(ms), secs, "{ms} ms");
        }
    }

    #[test]
    fn allowed_headers_show_whole_tokens_left() {
        let d = Decision {
            allowed: true,
            remaining: 3.75,
            retry_after_ms: 0.0,
        };
        assert_eq!(
            allowed_headers(&LIMIT, &d),
            vec![
                ("x-ratelimit-limit", "10".to_string()),
                ("x-ratelimit-remaining", "3".to_string())
            ]
        );
    }

    #[test]
    fn denied_is_a_429_with_retry_after() {
        let d = Decision {
            allowed: false,
            remaining: 0.4,
            retry_after_ms: 3600.0,
        };
        let r = denied(&LIMIT, &d);
        assert_eq!(r.status, 429);
        assert_eq!(
            r.headers,
            vec![
                ("retry-after", "4".to_string()),
                ("x-ratelimit-limit", "10".to_string()),
                ("x-ratelimit-remaining", "0".to_string()),
                ("content-type", "text/plain".to_string()),
            ]
        );
        assert_eq!(r.body, DENIED_BODY);
    }

    #[test]
    fn unavailable_is_a_503() {
        assert_eq!(unavailable().status, 503);
        assert_eq!(unavailable().body, UNAVAILABLE_BODY);
    }
}
