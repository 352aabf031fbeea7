//! What the client sees: rate-limit headers, the 429, the fail-closed 503, the 400 and the
//! 413, each also as a gRPC client gets it.

use serde_json::json;

use crate::check::LimitCheck;
use crate::config::{Algorithm, Config, DenyBody, RateLimitHeaders};
use crate::decision::{Decision, LimitResult, Override};
use crate::grpc;
use crate::request::view::RequestView;
use crate::time::UnixNs;

pub mod upstream;

pub type Headers = Vec<(&'static str, String)>;

/// A response the filter answers itself instead of forwarding the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    pub status: u16,
    pub headers: Headers,
    pub body: String,
    /// The gRPC status of an answer to a gRPC request; None: Envoy would map the HTTP status
    /// itself for a gRPC client (429 and 503 both to UNAVAILABLE).
    pub grpc_status: Option<u32>,
}

/// What a refused request is answered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Http,
    /// Envoy answers a gRPC request's local reply with a trailers-only gRPC response: its
    /// `grpc-status`, the body as `grpc-message`, the headers as metadata.
    Grpc,
}

impl Protocol {
    /// gRPC if Envoy answers this request in gRPC (its `content-type`, see
    /// [`grpc::is_grpc_content_type`]).
    pub fn of(view: &dyn RequestView) -> Protocol {
        match view.header("content-type") {
            Some(value) if grpc::is_grpc_content_type(value) => Protocol::Grpc,
            _ => Protocol::Http,
        }
    }
}

/// Whether and when a refused gRPC call may be tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// After this many ms: `grpc-retry-pushback-ms` and a `RetryInfo`.
    After(u64),
    /// Never with the same request: a pushback of -1, which gRPC's retry policies read as
    /// "do not retry" (a retry would be refused again, each attempt counted).
    Never,
    /// Unknown (the limiter is down): the client's own backoff.
    Backoff,
}

pub const DENIED_BODY: &str = "rate limit exceeded\n";
pub const UNAVAILABLE_BODY: &str = "rate limiter unavailable\n";
pub const QUOTA_EXCEEDED_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// A limit's name as headers and bodies show it, `rule.limit`: written where it is shown, not
/// made for every decided request (the `x-ratelimit` headers never show it).
#[derive(Clone, Copy)]
struct PolicyName<'a>(&'a str, &'a str);

impl std::fmt::Display for PolicyName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// One limit's numbers as clients see them.
struct Shown<'a> {
    policy: PolicyName<'a>,
    quota: u64,
    window_s: u64,
    remaining: u64,
    /// Seconds until the limit is whole again; None when it never is (an identity blocked
    /// without expiry), so no header claims a time.
    reset_s: Option<u64>,
    /// Seconds until a request fits again if this one was refused, else `reset_s`.
    t: u64,
    refused: bool,
    shadow: bool,
    retry_ms: f64,
    /// Refused with no time to wait for: blocked by an override without expiry, or a request
    /// that never fits.
    never: bool,
    /// Refused because the request costs more than the limit ever holds (`quota`).
    never_fits: bool,
    cost: u64,
    reset_ms: f64,
    /// Which of OpenAI's header sets describes it: a usage limit counts tokens, any other
    /// limit requests (a concurrency limit neither).
    openai: Option<OpenAiSet>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenAiSet {
    Requests,
    Tokens,
}

/// `now_ms` (Unix ms) dates the decision: a calendar window's `w` is the length of the window
/// it fell in (a month of 28 to 31 days).
fn shown<'a>(
    config: &'a Config,
    check: &LimitCheck,
    result: &LimitResult,
    now_ms: f64,
) -> Shown<'a> {
    let (rule, limit) = config
        .rules
        .get(check.rule)
        .and_then(|r| {
            r.limits
                .get(check.limit)
                .map(|l| (r.name.as_str(), l.name.as_str()))
        })
        .unwrap_or(("rule", "limit"));
    let usage = config
        .rules
        .get(check.rule)
        .and_then(|r| r.limits.get(check.limit))
        .is_some_and(|l| l.usage.is_some());
    let openai = match (check.algorithm, usage) {
        (Algorithm::Concurrency, _) => None,
        (_, true) => Some(OpenAiSet::Tokens),
        (_, false) => Some(OpenAiSet::Requests),
    };
    // The script replies retry 0 for a block without expiry (its PTTL is -1).
    let blocked_for_good = result.overridden == Some(Override::Blocked) && result.retry_ms == 0.0;
    let reset_s = (!blocked_for_good).then(|| whole_seconds_up(result.reset_ms));
    // A blocked identity may send nothing: its limit shows as 0, as `q=0` in RateLimit-Policy.
    let quota = match result.overridden {
        Some(Override::Limit(quota)) => quota,
        Some(Override::Blocked) => 0,
        Some(Override::Unlimited) | None => check.quota,
    };
    Shown {
        policy: PolicyName(rule, limit),
        quota,
        window_s: whole_seconds_up(check.window.length_at(now_ms)).max(1),
        remaining: whole_units(result.remaining),
        reset_s,
        t: match (result.allowed, reset_s) {
            (true, Some(reset_s)) => reset_s,
            _ => retry_after_secs(result.retry_ms),
        },
        refused: !result.allowed,
        shadow: check.mode.is_shadow(),
        retry_ms: result.retry_ms,
        never: result.never_fits || blocked_for_good,
        never_fits: result.never_fits,
        cost: check.cost,
        reset_ms: result.reset_ms,
        openai,
    }
}

fn shown_all<'a>(
    config: &'a Config,
    checks: &[LimitCheck],
    decision: &Decision,
    now: UnixNs,
) -> Vec<Shown<'a>> {
    let now_ms = now.unix_ms();
    // An identity's unlimited limit has nothing to show.
    checks
        .iter()
        .zip(&decision.limits)
        .filter(|(_, r)| r.overridden != Some(Override::Unlimited))
        .map(|(c, r)| shown(config, c, r, now_ms))
        .collect()
}

/// The limit the single-valued headers describe: when refused, the refusing limit with the
/// longest wait (one with no time to wait for first); else the one with the fewest units left
/// (the later reset on a tie, never whole again the latest).
fn most_restrictive<'a, 'c>(limits: &[&'a Shown<'c>], denied: bool) -> Option<&'a Shown<'c>> {
    if denied {
        return limits
            .iter()
            .copied()
            .filter(|s| s.refused && !s.shadow)
            .max_by(|a, b| {
                a.never
                    .cmp(&b.never)
                    .then(a.retry_ms.total_cmp(&b.retry_ms))
            });
    }
    let whole_in = |s: &Shown| s.reset_s.unwrap_or(u64::MAX);
    limits.iter().copied().min_by(|a, b| {
        a.remaining
            .cmp(&b.remaining)
            .then(whole_in(b).cmp(&whole_in(a)))
    })
}

/// Rate-limit headers for a request decided at `now` (allowed or refused), as
/// configured.
pub fn rate_limit_headers(
    config: &Config,
    checks: &[LimitCheck],
    decision: &Decision,
    now: UnixNs,
) -> Headers {
    if config.headers == RateLimitHeaders::None {
        return Headers::new();
    }
    headers_for(
        config,
        &shown_all(config, checks, decision, now),
        !decision.allowed,
    )
}

fn headers_for(config: &Config, limits: &[Shown<'_>], denied: bool) -> Headers {
    let mut headers = Headers::new();
    let all: Vec<&Shown> = limits.iter().collect();
    if config.headers.x_ratelimit() {
        if let Some(s) = most_restrictive(&all, denied) {
            headers.push(("x-ratelimit-limit", s.quota.to_string()));
            headers.push((
                "x-ratelimit-remaining",
                if denied { 0 } else { s.remaining }.to_string(),
            ));
            if let Some(reset_s) = s.reset_s {
                headers.push(("x-ratelimit-reset", reset_s.to_string()));
            }
        }
    }
    if config.headers.ietf() && !limits.is_empty() {
        // draft-ietf-httpapi-ratelimit-headers-10: Lists of Items, one per limit, each a
        // String naming the policy. Names are restricted to [A-Za-z0-9_-.], no escaping needed.
        let policy: Vec<String> = limits
            .iter()
            .map(|s| format!("\"{}\";q={};w={}", s.policy, s.quota, s.window_s))
            .collect();
        let state: Vec<String> = limits
            .iter()
            .map(|s| match s.never {
                true => format!("\"{}\";r={}", s.policy, s.remaining),
                false => format!("\"{}\";r={};t={}", s.policy, s.remaining, s.t),
            })
            .collect();
        headers.push(("ratelimit-policy", policy.join(", ")));
        headers.push(("ratelimit", state.join(", ")));
    }
    if config.headers == RateLimitHeaders::OpenAi {
        let sets = [
            (
                OpenAiSet::Requests,
                [
                    "x-ratelimit-limit-requests",
                    "x-ratelimit-remaining-requests",
                    "x-ratelimit-reset-requests",
                ],
            ),
            (
                OpenAiSet::Tokens,
                [
                    "x-ratelimit-limit-tokens",
                    "x-ratelimit-remaining-tokens",
                    "x-ratelimit-reset-tokens",
                ],
            ),
        ];
        for (set, [limit, remaining, reset]) in sets {
            let of_set: Vec<&Shown> = all
                .iter()
                .copied()
                .filter(|s| s.openai == Some(set))
                .collect();
            // On a 429 the set's refusing limit, if one of its limits refused; else the one
            // with the fewest units left.
            let shown = most_restrictive(&of_set, denied).or(most_restrictive(&of_set, false));
            if let Some(s) = shown {
                headers.push((limit, s.quota.to_string()));
                headers.push((remaining, s.remaining.to_string()));
                if s.reset_s.is_some() {
                    headers.push((reset, openai_duration(s.reset_ms)));
                }
            }
        }
    }
    headers
}

/// A wait as OpenAI writes it (Go's duration format, to the millisecond): `0s`, `120ms`,
/// `1s`, `1.5s`, `6m0s`, `2h3m4s`. Rounded up: a client that waits that long finds the limit
/// whole.
fn openai_duration(ms: f64) -> String {
    let ms = if ms.is_finite() && ms > 0.0 {
        ms.ceil() as u64
    } else {
        0
    };
    if ms == 0 {
        return "0s".to_string();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let secs = if frac == 0 {
        format!("{s}s")
    } else {
        let digits = format!("{frac:03}");
        format!("{s}.{}s", digits.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

/// The 429 for a refused request. `Retry-After` is the wait until every refusing limit would
/// allow it, so never earlier than the `t` of any refusing policy in `RateLimit`; none when a
/// refusing limit has no such time (an identity blocked without expiry, a request that costs
/// more than a limit ever holds: the body then says so). Decided at `now`.
///
/// A gRPC client gets `grpc_over_limit`'s status instead, `rate limit exceeded` (and why no
/// wait helps, if so) as its message, the same rate-limit headers as metadata, and the wait in
/// ms as `grpc-retry-pushback-ms` and a `RetryInfo`, or a pushback of -1 where no wait helps.
pub fn denied(
    config: &Config,
    protocol: Protocol,
    checks: &[LimitCheck],
    decision: &Decision,
    now: UnixNs,
) -> LocalResponse {
    let limits = shown_all(config, checks, decision, now);
    let violated: Vec<&Shown> = limits.iter().filter(|s| s.refused && !s.shadow).collect();
    let retry_after = violated.iter().map(|s| s.t).max().unwrap_or(1).max(1);
    let never = violated.iter().any(|s| s.never);
    // Why no wait helps: one sentence per limit the request can never fit.
    let never_fits: Vec<String> = violated
        .iter()
        .filter(|s| s.never_fits)
        .map(|s| {
            format!(
                "{}: this request costs {}, more than the {} the limit ever holds",
                s.policy, s.cost, s.quota
            )
        })
        .collect();
    // Until every refusing limit would allow the request, in whole ms (at least 1).
    let retry_ms = violated
        .iter()
        .map(|s| s.retry_ms.ceil())
        .fold(1.0, f64::max);
    if protocol == Protocol::Grpc {
        let message = match never_fits.is_empty() {
            true => DENIED_BODY.trim_end().to_string(),
            false => format!("{}: {}", DENIED_BODY.trim_end(), never_fits.join("; ")),
        };
        let retry = match never {
            true => Retry::Never,
            // The same wait as Retry-After's when the ms cannot be told.
            false if retry_ms.is_finite() => Retry::After(retry_ms as u64),
            false => Retry::After(retry_after.saturating_mul(1000)),
        };
        let headers = headers_for(config, &limits, true);
        return grpc_answer(429, config.grpc_over_limit.code(), message, retry, headers);
    }
    let mut headers = Headers::new();
    if !never {
        headers.push(("retry-after", retry_after.to_string()));
    }
    if config.headers == RateLimitHeaders::OpenAi {
        if never {
            // OpenAI's clients retry a 429 with backoff unless told not to.
            headers.push(("x-should-retry", "false".to_string()));
        } else {
            headers.push(("retry-after-ms", format!("{retry_ms}")));
        }
    }
    headers.extend(headers_for(config, &limits, true));
    let body = match config.deny_body {
        // Envoy gives a local reply with a body `content-type: text/plain` itself: one header
        // less to send (each costs Envoy about as much as a tenth of a plain request).
        DenyBody::Text if never_fits.is_empty() => DENIED_BODY.to_string(),
        DenyBody::Text => format!("{DENIED_BODY}{}\n", never_fits.join("\n")),
        DenyBody::ProblemJson => {
            headers.push(("content-type", "application/problem+json".to_string()));
            let names: Vec<String> = violated.iter().map(|s| s.policy.to_string()).collect();
            let mut problem = json!({
                "type": QUOTA_EXCEEDED_TYPE,
                "title": "Request cannot be satisfied as assigned quota has been exceeded",
                "status": 429,
                "violated-policies": names,
            });
            if !never_fits.is_empty() {
                problem["detail"] = never_fits.join("; ").into();
            }
            problem.to_string()
        }
    };
    LocalResponse {
        status: 429,
        headers,
        body,
        grpc_status: None,
    }
}

/// The 503 of `failure_mode: closed`; UNAVAILABLE for a gRPC client, without a pushback: the
/// limiter's outage has no known end, so a client's retry policy backs off as it would for any
/// unavailable server.
pub fn unavailable(protocol: Protocol) -> LocalResponse {
    if protocol == Protocol::Grpc {
        let message = UNAVAILABLE_BODY.trim_end().to_string();
        return grpc_answer(503, grpc::UNAVAILABLE, message, Retry::Backoff, vec![]);
    }
    text(503, UNAVAILABLE_BODY.to_string())
}

/// The 400 for a request the limiter cannot cost (a bad cost header); INVALID_ARGUMENT for a
/// gRPC client, not to be retried as it is.
pub fn bad_request(protocol: Protocol, message: &str) -> LocalResponse {
    if protocol == Protocol::Grpc {
        let message = message.to_string();
        return grpc_answer(400, grpc::INVALID_ARGUMENT, message, Retry::Never, vec![]);
    }
    text(400, format!("{message}\n"))
}

/// The 413 for a request whose body is larger than a usage limit's `max_body` (its estimate
/// is read from the body). RESOURCE_EXHAUSTED for a gRPC client, as gRPC itself answers a
/// message larger than the receiver takes, with a pushback of -1 and no `RetryInfo`: no wait
/// makes the body fit.
pub fn body_too_large(protocol: Protocol, max_body: u64) -> LocalResponse {
    let message = format!("request body larger than {max_body} bytes");
    if protocol == Protocol::Grpc {
        return grpc_answer(413, grpc::RESOURCE_EXHAUSTED, message, Retry::Never, vec![]);
    }
    text(413, format!("{message}\n"))
}

fn text(status: u16, body: String) -> LocalResponse {
    LocalResponse {
        status,
        headers: vec![("content-type", "text/plain".to_string())],
        body,
        grpc_status: None,
    }
}

/// A refusal as a gRPC client gets it. Envoy turns it into a trailers-only response:
/// `grpc-status: code`, `message` as `grpc-message` (percent-encoded by Envoy, so without the
/// text body's newline), `headers` as metadata. `status` is kept for Envoy's HTTP answer
/// should it not take the request for gRPC after all.
fn grpc_answer(
    status: u16,
    code: u32,
    message: String,
    retry: Retry,
    mut headers: Headers,
) -> LocalResponse {
    match retry {
        Retry::After(ms) => {
            headers.push(("grpc-retry-pushback-ms", ms.to_string()));
            let details = grpc::status_details(code, &message, ms);
            headers.push(("grpc-status-details-bin", details));
        }
        Retry::Never => headers.push(("grpc-retry-pushback-ms", "-1".to_string())),
        Retry::Backoff => {}
    }
    LocalResponse {
        status,
        headers,
        body: message,
        grpc_status: Some(code),
    }
}

/// `Retry-After` in whole seconds, rounded up (an earlier retry would be refused again), and
/// at least 1, since 0 invites an immediate retry.
pub fn retry_after_secs(retry_ms: f64) -> u64 {
    whole_seconds_up(retry_ms).max(1)
}

fn whole_seconds_up(ms: f64) -> u64 {
    let secs = (ms / 1000.0).ceil();
    if secs.is_finite() && secs >= 0.0 {
        secs as u64
    } else {
        0
    }
}

/// Whole units left: a client can spend only whole requests. The small allowance absorbs
/// float error (9.999999999 tokens are 10).
fn whole_units(remaining: f64) -> u64 {
    let whole = (remaining + 1e-9).floor();
    if whole.is_finite() && whole > 0.0 {
        whole as u64
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Mode;
    use crate::config::{Algorithm, Window};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// 2025-11-30 08:00 UTC.
    const NOW: UnixNs = UnixNs::from_ns(1_764_489_600_000_000_000);

    fn config(headers: &str, body: &str) -> Config {
        let json = format!(
            r#"{{"headers": "{headers}", "deny_body": "{body}", "rules": [{{"name": "api", "limits": [
                {{"name": "second", "limit": 10, "window": "1s", "burst": 20}},
                {{"name": "day", "algorithm": "fixed_window", "limit": 1000, "window": "1d"}}]}}]}}"#
        );
        Config::parse(json.as_bytes()).unwrap()
    }

    fn checks(shadow_day: bool) -> Vec<LimitCheck> {
        let base = LimitCheck {
            rule: 0,
            limit: 0,
            key: "k1".into(),
            algorithm: Algorithm::TokenBucket,
            per_window: 10,
            quota: 20,
            window: Window::ms(1000),
            burst: 20,
            cost: 1,
            mode: Mode::of(false, None, false, None),
            overrides: false,
        };
        vec![
            base.clone(),
            LimitCheck {
                limit: 1,
                key: "k2".into(),
                algorithm: Algorithm::FixedWindow,
                per_window: 1000,
                quota: 1000,
                window: Window::ms(86_400_000),
                mode: Mode::of(false, None, shadow_day, None),
                overrides: false,
                ..base
            },
        ]
    }

    fn result(allowed: bool, remaining: f64, reset_ms: f64, retry_ms: f64) -> LimitResult {
        LimitResult {
            allowed,
            remaining,
            reset_ms,
            retry_ms,
            over_budget: false,
            overridden: None,
            bad_override: false,
            never_fits: false,
        }
    }

    fn get<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    fn denied_http(c: &Config, checks: &[LimitCheck], d: &Decision, now: UnixNs) -> LocalResponse {
        denied(c, Protocol::Http, checks, d, now)
    }

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
    fn allowed_headers_describe_the_most_restrictive_limit() {
        let c = config("x-ratelimit", "text");
        let d = Decision {
            allowed: true,
            limits: vec![
                result(true, 19.0, 100.0, 0.0),
                result(true, 3.9999999999, 50_000_000.0, 0.0),
            ],
            leased: 0,
        };
        let h = rate_limit_headers(&c, &checks(false), &d, NOW);
        assert_eq!(get(&h, "x-ratelimit-limit"), Some("1000"));
        assert_eq!(get(&h, "x-ratelimit-remaining"), Some("4"));
        assert_eq!(get(&h, "x-ratelimit-reset"), Some("50000"));
        assert_eq!(get(&h, "ratelimit"), None);
    }

    #[test]
    fn ietf_fields_list_every_limit() {
        let c = config("both", "text");
        let d = Decision {
            allowed: true,
            limits: vec![
                result(true, 19.5, 50.0, 0.0),
                result(true, 999.0, 3_600_000.0, 0.0),
            ],
            leased: 0,
        };
        let h = rate_limit_headers(&c, &checks(false), &d, NOW);
        assert_eq!(
            get(&h, "ratelimit-policy"),
            Some(r#""api.second";q=20;w=1, "api.day";q=1000;w=86400"#)
        );
        assert_eq!(
            get(&h, "ratelimit"),
            Some(r#""api.second";r=19;t=1, "api.day";r=999;t=3600"#)
        );
        assert_eq!(get(&h, "x-ratelimit-remaining"), Some("19"));
    }

    /// A calendar month's `w` is the length of the month the request falls in; `t` and the
    /// reset count to its end.
    #[test]
    fn a_calendar_window_shows_the_length_of_the_current_one() {
        let c = config("both", "text");
        let mut month = checks(false);
        month[1].window = Window::Calendar(crate::calendar::Calendar {
            unit: crate::calendar::Unit::Month,
            offset_minutes: 0,
        });
        // 16 hours to December at NOW (November 30, 08:00 UTC).
        let d = Decision {
            allowed: true,
            limits: vec![
                result(true, 19.5, 50.0, 0.0),
                result(true, 9.0, 57_600_000.0, 0.0),
            ],
            leased: 0,
        };
        let h = rate_limit_headers(&c, &month, &d, NOW);
        assert_eq!(
            get(&h, "ratelimit-policy"),
            Some(r#""api.second";q=20;w=1, "api.day";q=1000;w=2592000"#)
        );
        assert_eq!(
            get(&h, "ratelimit"),
            Some(r#""api.second";r=19;t=1, "api.day";r=9;t=57600"#)
        );
        assert_eq!(get(&h, "x-ratelimit-reset"), Some("57600"));
        // In December the same limit shows 31 days.
        let december = NOW.plus_ns(57_600_000_000_000);
        let h = rate_limit_headers(&c, &month, &d, december);
        assert!(get(&h, "ratelimit-policy").is_some_and(|p| p.ends_with("w=2678400")));
    }

    #[test]
    fn headers_none_adds_nothing() {
        let mut c = config("x-ratelimit", "text");
        c.headers = RateLimitHeaders::None;
        let d = Decision {
            allowed: true,
            limits: vec![result(true, 1.0, 1.0, 0.0), result(true, 1.0, 1.0, 0.0)],
            leased: 0,
        };
        assert!(rate_limit_headers(&c, &checks(false), &d, NOW).is_empty());
        let refused = Decision {
            allowed: false,
            limits: vec![result(false, 0.0, 1.0, 2500.0), result(true, 1.0, 1.0, 0.0)],
            leased: 0,
        };
        let r = denied_http(&c, &checks(false), &refused, NOW);
        // (Envoy adds `content-type: text/plain` to a local reply's text body itself.)
        assert_eq!(r.headers, vec![("retry-after", "3".to_string())]);
    }

    #[test]
    fn denied_waits_for_every_violated_limit() {
        let c = config("both", "text");
        let d = Decision {
            allowed: false,
            limits: vec![
                result(false, 0.5, 1500.0, 50.0),
                result(false, 0.0, 7_200_000.0, 7_200_000.0),
            ],
            leased: 0,
        };
        let r = denied_http(&c, &checks(false), &d, NOW);
        assert_eq!(r.status, 429);
        assert_eq!(get(&r.headers, "retry-after"), Some("7200"));
        assert_eq!(get(&r.headers, "x-ratelimit-limit"), Some("1000"));
        assert_eq!(get(&r.headers, "x-ratelimit-remaining"), Some("0"));
        assert_eq!(
            get(&r.headers, "ratelimit"),
            Some(r#""api.second";r=0;t=1, "api.day";r=0;t=7200"#)
        );
        assert_eq!(r.body, DENIED_BODY);
    }

    #[test]
    fn a_refusing_shadow_limit_does_not_set_retry_after() {
        let c = config("x-ratelimit", "text");
        let d = Decision {
            allowed: false,
            limits: vec![
                result(false, 0.0, 1000.0, 100.0),
                result(false, 0.0, 9_000_000.0, 9_000_000.0),
            ],
            leased: 0,
        };
        let r = denied_http(&c, &checks(true), &d, NOW);
        assert_eq!(get(&r.headers, "retry-after"), Some("1"));
        assert_eq!(get(&r.headers, "x-ratelimit-limit"), Some("20"));
    }

    fn blocked(retry_ms: f64) -> LimitResult {
        LimitResult {
            overridden: Some(Override::Blocked),
            ..result(false, 0.0, retry_ms, retry_ms)
        }
    }

    /// A blocked identity may send nothing: its limit shows as 0. A block with expiry is over,
    /// and the limit back, after its remaining time; a block without expiry never is, so no
    /// header claims a time: no Retry-After, no X-RateLimit-Reset, no `t`.
    #[test]
    fn a_blocked_identity_shows_a_limit_of_0_and_a_reset_only_if_the_block_ends() {
        let c = config("both", "text");
        let for_an_hour = Decision {
            allowed: false,
            limits: vec![blocked(3_600_000.0), result(true, 999.0, 1000.0, 0.0)],
            leased: 0,
        };
        let r = denied_http(&c, &checks(false), &for_an_hour, NOW);
        assert_eq!(get(&r.headers, "retry-after"), Some("3600"));
        assert_eq!(get(&r.headers, "x-ratelimit-limit"), Some("0"));
        assert_eq!(get(&r.headers, "x-ratelimit-remaining"), Some("0"));
        assert_eq!(get(&r.headers, "x-ratelimit-reset"), Some("3600"));
        assert_eq!(
            get(&r.headers, "ratelimit-policy"),
            Some(r#""api.second";q=0;w=1, "api.day";q=1000;w=86400"#)
        );
        assert_eq!(
            get(&r.headers, "ratelimit"),
            Some(r#""api.second";r=0;t=3600, "api.day";r=999;t=1"#)
        );

        let for_good = Decision {
            limits: vec![blocked(0.0), result(true, 999.0, 1000.0, 0.0)],
            ..for_an_hour
        };
        let r = denied_http(&c, &checks(false), &for_good, NOW);
        assert_eq!(get(&r.headers, "retry-after"), None);
        assert_eq!(get(&r.headers, "x-ratelimit-limit"), Some("0"));
        assert_eq!(get(&r.headers, "x-ratelimit-remaining"), Some("0"));
        assert_eq!(get(&r.headers, "x-ratelimit-reset"), None);
        assert_eq!(
            get(&r.headers, "ratelimit-policy"),
            Some(r#""api.second";q=0;w=1, "api.day";q=1000;w=86400"#)
        );
        assert_eq!(
            get(&r.headers, "ratelimit"),
            Some(r#""api.second";r=0, "api.day";r=999;t=1"#)
        );
        // The same headers as gRPC metadata.
        let r = denied(&c, Protocol::Grpc, &checks(false), &for_good, NOW);
        assert_eq!(get(&r.headers, "x-ratelimit-limit"), Some("0"));
        assert_eq!(get(&r.headers, "x-ratelimit-reset"), None);
    }

    /// A shadow limit that would block for good is shown on an allowed response (it has the
    /// fewest units left) without a reset.
    #[test]
    fn an_allowed_response_shows_no_reset_for_a_shadow_block_without_expiry() {
        let d = Decision {
            allowed: true,
            limits: vec![result(true, 5.0, 1000.0, 0.0), blocked(0.0)],
            leased: 0,
        };
        let h = rate_limit_headers(&config("both", "text"), &checks(true), &d, NOW);
        assert_eq!(get(&h, "x-ratelimit-limit"), Some("0"));
        assert_eq!(get(&h, "x-ratelimit-remaining"), Some("0"));
        assert_eq!(get(&h, "x-ratelimit-reset"), None);
        assert_eq!(
            get(&h, "ratelimit"),
            Some(r#""api.second";r=5;t=1, "api.day";r=0"#)
        );
    }

    /// A rule of 60 requests a minute and a usage limit of 4000 tokens a minute.
    fn openai_config() -> Config {
        let json = r#"{"headers": "openai", "rules": [{"name": "llm", "limits": [
            {"name": "requests", "limit": 60, "window": "1m"},
            {"name": "tokens", "limit": 4000, "window": "1m",
             "usage": {"from": "body:usage.total_tokens", "estimate": 500}}]}]}"#;
        Config::parse(json.as_bytes()).unwrap()
    }

    fn openai_checks(token_cost: u64) -> Vec<LimitCheck> {
        let c = checks(false);
        vec![
            LimitCheck {
                per_window: 60,
                quota: 60,
                burst: 60,
                ..c[0].clone()
            },
            LimitCheck {
                limit: 1,
                key: "k2".into(),
                per_window: 4000,
                quota: 4000,
                burst: 4000,
                cost: token_cost,
                ..c[0].clone()
            },
        ]
    }

    #[test]
    fn openai_durations_are_written_as_go_does() {
        let cases = [
            (0.0, "0s"),
            (0.2, "1ms"),
            (120.0, "120ms"),
            (1000.0, "1s"),
            (1500.0, "1.5s"),
            (360_000.0, "6m0s"),
            (7_384_000.0, "2h3m4s"),
            (7_384_250.0, "2h3m4.25s"),
        ];
        for (ms, text) in cases {
            assert_eq!(openai_duration(ms), text, "{ms} ms");
        }
    }

    #[test]
    fn openai_headers_name_the_request_limit_and_the_token_limit() {
        let d = Decision {
            allowed: true,
            limits: vec![
                result(true, 59.0, 1000.0, 0.0),
                result(true, 3500.0, 7500.0, 0.0),
            ],
            leased: 0,
        };
        let h = rate_limit_headers(&openai_config(), &openai_checks(500), &d, NOW);
        let want = [
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-limit-tokens", "4000"),
            ("x-ratelimit-remaining-tokens", "3500"),
            ("x-ratelimit-reset-tokens", "7.5s"),
        ];
        let want: Headers = want.iter().map(|(n, v)| (*n, v.to_string())).collect();
        assert_eq!(h, want);
    }

    #[test]
    fn an_openai_429_carries_retry_after_ms_or_says_not_to_retry() {
        let d = Decision {
            allowed: false,
            limits: vec![
                result(true, 59.0, 1000.0, 0.0),
                result(false, 300.0, 55_000.0, 2_501.0),
            ],
            leased: 0,
        };
        let r = denied_http(&openai_config(), &openai_checks(500), &d, NOW);
        assert_eq!(get(&r.headers, "retry-after"), Some("3"));
        assert_eq!(get(&r.headers, "retry-after-ms"), Some("2501"));
        assert_eq!(get(&r.headers, "x-should-retry"), None);
        assert_eq!(get(&r.headers, "x-ratelimit-remaining-tokens"), Some("300"));
        assert_eq!(get(&r.headers, "x-ratelimit-reset-tokens"), Some("55s"));
        let never = LimitResult {
            never_fits: true,
            ..result(false, 4000.0, 0.0, 0.0)
        };
        let d = Decision {
            allowed: false,
            limits: vec![result(true, 59.0, 1000.0, 0.0), never],
            leased: 0,
        };
        let r = denied_http(&openai_config(), &openai_checks(5000), &d, NOW);
        assert_eq!(get(&r.headers, "retry-after"), None);
        assert_eq!(get(&r.headers, "retry-after-ms"), None);
        assert_eq!(get(&r.headers, "x-should-retry"), Some("false"));
        assert!(r.body.contains(
            "llm.tokens: this request costs 5000, more than the 4000 the limit ever holds"
        ));
        // A block without expiry on the requests limit: its set shows 0 and no reset, and the
        // client is told not to retry.
        let d = Decision {
            allowed: false,
            limits: vec![blocked(0.0), result(true, 3500.0, 7500.0, 0.0)],
            leased: 0,
        };
        let r = denied_http(&openai_config(), &openai_checks(500), &d, NOW);
        assert_eq!(get(&r.headers, "x-should-retry"), Some("false"));
        assert_eq!(get(&r.headers, "retry-after"), None);
        assert_eq!(get(&r.headers, "x-ratelimit-limit-requests"), Some("0"));
        assert_eq!(get(&r.headers, "x-ratelimit-remaining-requests"), Some("0"));
        assert_eq!(get(&r.headers, "x-ratelimit-reset-requests"), None);
        assert_eq!(get(&r.headers, "x-ratelimit-reset-tokens"), Some("7.5s"));
    }

    /// A request of cost 25 on the `second` limit, which holds 20 at most: refused, no wait
    /// helps; the `day` limit allows it.
    fn never_fitting() -> (Vec<LimitCheck>, Decision) {
        let mut c = checks(false);
        c[0].cost = 25;
        let never = LimitResult {
            never_fits: true,
            ..result(false, 20.0, 0.0, 0.0)
        };
        let d = Decision {
            allowed: false,
            limits: vec![never, result(true, 999.0, 1000.0, 0.0)],
            leased: 0,
        };
        (c, d)
    }

    #[test]
    fn a_request_that_never_fits_gets_no_retry_time_and_is_told_why() {
        let (c, d) = never_fitting();
        let r = denied_http(&config("ietf", "text"), &c, &d, NOW);
        assert_eq!(r.status, 429);
        assert_eq!(get(&r.headers, "retry-after"), None);
        assert_eq!(
            get(&r.headers, "ratelimit"),
            Some("\"api.second\";r=20, \"api.day\";r=999;t=1")
        );
        assert_eq!(
            r.body,
            "rate limit exceeded\napi.second: this request costs 25, more than the 20 the limit ever holds\n"
        );
        let r = denied_http(&config("ietf", "problem+json"), &c, &d, NOW);
        let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(
            body["detail"],
            "api.second: this request costs 25, more than the 20 the limit ever holds"
        );
        assert_eq!(body["violated-policies"], json!(["api.second"]));
    }

    #[test]
    fn problem_json_names_the_violated_policies() {
        let c = config("x-ratelimit", "problem+json");
        let d = Decision {
            allowed: false,
            limits: vec![
                result(false, 0.0, 1000.0, 100.0),
                result(true, 10.0, 1000.0, 0.0),
            ],
            leased: 0,
        };
        let r = denied_http(&c, &checks(false), &d, NOW);
        assert_eq!(
            get(&r.headers, "content-type"),
            Some("application/problem+json")
        );
        let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["type"], QUOTA_EXCEEDED_TYPE);
        assert_eq!(body["status"], 429);
        assert_eq!(body["violated-policies"], json!(["api.second"]));
    }

    #[test]
    fn unavailable_and_bad_request() {
        assert_eq!(unavailable(Protocol::Http).status, 503);
        assert_eq!(unavailable(Protocol::Http).body, UNAVAILABLE_BODY);
        assert_eq!(unavailable(Protocol::Http).grpc_status, None);
        let r = bad_request(Protocol::Http, "x-cost must be a whole number from 1 to 10");
        assert_eq!(
            (r.status, r.body.as_str()),
            (400, "x-cost must be a whole number from 1 to 10\n")
        );
    }

    #[test]
    fn the_protocol_is_read_from_the_content_type() {
        use crate::testing::request::FakeRequest;
        let grpc = |ct: &str| {
            FakeRequest::new("POST", "/pkg.Svc/Call").with("content-type", ct.as_bytes())
        };
        assert_eq!(Protocol::of(&grpc("application/grpc")), Protocol::Grpc);
        assert_eq!(
            Protocol::of(&grpc("application/grpc+proto")),
            Protocol::Grpc
        );
        assert_eq!(Protocol::of(&grpc("application/grpc-web")), Protocol::Http);
        assert_eq!(Protocol::of(&FakeRequest::new("GET", "/")), Protocol::Http);
    }

    #[test]
    fn a_grpc_client_over_its_limit_gets_resource_exhausted_with_the_wait() {
        let c = config("both", "problem+json");
        let d = Decision {
            allowed: false,
            limits: vec![
                result(false, 0.5, 1500.0, 1234.2),
                result(true, 10.0, 1000.0, 0.0),
            ],
            leased: 0,
        };
        let http = denied_http(&c, &checks(false), &d, NOW);
        let r = denied(&c, Protocol::Grpc, &checks(false), &d, NOW);
        assert_eq!((r.status, r.grpc_status), (429, Some(8)));
        assert_eq!(r.body, "rate limit exceeded", "grpc-message, no newline");
        assert_eq!(get(&r.headers, "grpc-retry-pushback-ms"), Some("1235"));
        assert_eq!(
            get(&r.headers, "grpc-status-details-bin"),
            Some(crate::grpc::status_details(8, "rate limit exceeded", 1235).as_str())
        );
        // The rate-limit headers as metadata, the same as the 429's; nothing only HTTP reads.
        for name in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "ratelimit",
            "ratelimit-policy",
        ] {
            assert_eq!(get(&r.headers, name), get(&http.headers, name), "{name}");
            assert!(get(&r.headers, name).is_some(), "{name}");
        }
        for name in ["retry-after", "content-type"] {
            assert_eq!(get(&r.headers, name), None, "{name}");
        }
        // Envoy's own default mapping, asked for: UNAVAILABLE, still with the wait.
        let mut unavailable = c.clone();
        unavailable.grpc_over_limit = crate::grpc::GrpcOverLimit::Unavailable;
        let r = denied(&unavailable, Protocol::Grpc, &checks(false), &d, NOW);
        assert_eq!(r.grpc_status, Some(14));
        assert_eq!(get(&r.headers, "grpc-retry-pushback-ms"), Some("1235"));
        assert_eq!(
            get(&r.headers, "grpc-status-details-bin"),
            Some(crate::grpc::status_details(14, "rate limit exceeded", 1235).as_str())
        );
    }

    #[test]
    fn a_grpc_call_no_wait_helps_is_told_not_to_retry() {
        let (c, d) = never_fitting();
        let r = denied(&config("x-ratelimit", "text"), Protocol::Grpc, &c, &d, NOW);
        assert_eq!(r.grpc_status, Some(8));
        assert_eq!(
            r.body,
            "rate limit exceeded: api.second: this request costs 25, more than the 20 the limit ever holds"
        );
        assert_eq!(get(&r.headers, "grpc-retry-pushback-ms"), Some("-1"));
        assert_eq!(get(&r.headers, "grpc-status-details-bin"), None);
        // Blocked by an override without expiry: no time to wait for either.
        let blocked = LimitResult {
            overridden: Some(Override::Blocked),
            ..result(false, 0.0, 0.0, 0.0)
        };
        let d = Decision {
            allowed: false,
            limits: vec![blocked, result(true, 999.0, 1000.0, 0.0)],
            leased: 0,
        };
        let r = denied(
            &config("x-ratelimit", "text"),
            Protocol::Grpc,
            &checks(false),
            &d,
            NOW,
        );
        assert_eq!(r.body, "rate limit exceeded");
        assert_eq!(get(&r.headers, "grpc-retry-pushback-ms"), Some("-1"));
        assert_eq!(get(&r.headers, "grpc-status-details-bin"), None);
    }

    #[test]
    fn grpc_unavailable_invalid_argument_and_too_large() {
        let r = unavailable(Protocol::Grpc);
        assert_eq!((r.status, r.grpc_status), (503, Some(14)));
        assert_eq!(r.body, "rate limiter unavailable");
        assert!(r.headers.is_empty(), "no pushback: {:?}", r.headers);
        let r = bad_request(Protocol::Grpc, "x-cost must be a whole number from 1 to 10");
        assert_eq!((r.status, r.grpc_status), (400, Some(3)));
        assert_eq!(r.body, "x-cost must be a whole number from 1 to 10");
        assert_eq!(
            r.headers,
            vec![("grpc-retry-pushback-ms", "-1".to_string())]
        );
        let r = body_too_large(Protocol::Grpc, 65536);
        assert_eq!((r.status, r.grpc_status), (413, Some(8)));
        assert_eq!(r.body, "request body larger than 65536 bytes");
        assert_eq!(
            r.headers,
            vec![("grpc-retry-pushback-ms", "-1".to_string())]
        );
        let r = body_too_large(Protocol::Http, 65536);
        assert_eq!((r.status, r.grpc_status), (413, None));
        assert_eq!(r.body, "request body larger than 65536 bytes\n");
    }
}
