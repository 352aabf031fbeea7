//! The per-request state machine: ask the bridge, load the script if Redis lost it, then let
//! the request through or answer it, following the failure policy when the bridge fails.

use crate::bridge::{
    parse_eval_reply, parse_script_load_reply, BridgeFailure, BridgeReply, BridgeRequest, Decision,
    EvalOutcome,
};
use crate::config::{Bridge, Config, FailureMode};
use crate::identity::{identify, redis_key};
use crate::response::{self, Headers, LocalResponse};

/// What the filter needs from its host (Envoy through proxy-wasm, or a fake in tests).
pub trait Host {
    /// A request header's raw value.
    fn request_header(&self, name: &str) -> Option<Vec<u8>>;
    /// The downstream peer, `ip:port`.
    fn source_address(&self) -> Option<String>;
    /// Unix time in nanoseconds.
    fn now_unix_ns(&self) -> Option<u128>;
    /// Starts an HTTP call to the bridge; its reply comes to [`RequestFlow::on_bridge_reply`].
    fn dispatch(&mut self, bridge: &Bridge, request: &BridgeRequest) -> Result<(), String>;
    fn send_response(&mut self, response: LocalResponse);
    /// Lets a paused request go on upstream.
    fn resume(&mut self);
    fn add_response_header(&mut self, name: &str, value: &str);
    fn count(&mut self, counter: Counter);
    /// A bridge failure the failure policy handled; the host logs it (rate-limited).
    fn report_failure(&mut self, failure: &BridgeFailure);
}

/// The filter's counters, one Envoy stat each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    Allowed,
    Denied,
    FailureModeOpen,
    FailureModeClosed,
    BridgeErrors,
    ScriptLoads,
}

impl Counter {
    pub const ALL: [Counter; 6] = [
        Counter::Allowed,
        Counter::Denied,
        Counter::FailureModeOpen,
        Counter::FailureModeClosed,
        Counter::BridgeErrors,
        Counter::ScriptLoads,
    ];

    /// The stat's name (`wasmcustom.NAME` in `/stats`, `NAME` in `/stats/prometheus`).
    pub fn name(self) -> &'static str {
        match self {
            Counter::Allowed => "ratelimit_allowed",
            Counter::Denied => "ratelimit_denied",
            Counter::FailureModeOpen => "ratelimit_failure_mode_open",
            Counter::FailureModeClosed => "ratelimit_failure_mode_closed",
            Counter::BridgeErrors => "ratelimit_bridge_errors",
            Counter::ScriptLoads => "ratelimit_script_loads",
        }
    }
}

/// What the host should do with the request headers it is processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    Pause,
}

#[derive(Debug, Default)]
enum Phase {
    #[default]
    Start,
    /// Waiting for the `EVALSHA` reply; `reloaded` once the script was loaded for this request.
    Deciding {
        eval: BridgeRequest,
        reloaded: bool,
    },
    /// Redis had lost the script; waiting for `SCRIPT LOAD`, then `eval` goes again.
    LoadingScript {
        eval: BridgeRequest,
    },
    /// Allowed: these headers go on the response.
    Allowed {
        headers: Headers,
    },
    Finished,
}

enum Outcome {
    Decided(Decision),
    Failed(BridgeFailure),
}

/// One request's way through the limiter.
#[derive(Debug, Default)]
pub struct RequestFlow {
    phase: Phase,
}

impl RequestFlow {
    pub fn new() -> Self {
        Self::default()
    }

    /// Request headers arrived: identify the caller and ask the bridge.
    pub fn on_request_headers(&mut self, config: &Config, host: &mut impl Host) -> Verdict {
        if !matches!(self.phase, Phase::Start) {
            return Verdict::Continue;
        }
        let api_key = host.request_header(&config.api_key_header);
        let source = host.source_address();
        let (kind, identity) = identify(api_key.as_deref(), source.as_deref());
        let key = redis_key(config, kind, identity);
        let Some(now_ns) = host.now_unix_ns() else {
            return self.finish(config, host, Outcome::Failed(BridgeFailure::Clock));
        };
        let eval = BridgeRequest::evalsha(config, &key, now_ns, 1);
        match host.dispatch(&config.bridge, &eval) {
            Ok(()) => {
                self.phase = Phase::Deciding {
                    eval,
                    reloaded: false,
                };
                Verdict::Pause
            }
            Err(why) => self.finish(config, host, Outcome::Failed(BridgeFailure::Dispatch(why))),
        }
    }

    /// The bridge answered (or timed out): decide, or load the script and ask again.
    pub fn on_bridge_reply(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        reply: BridgeReply<'_>,
    ) {
        let outcome = match std::mem::take(&mut self.phase) {
            Phase::Deciding { eval, reloaded } => match parse_eval_reply(reply) {
                Ok(EvalOutcome::Decided(decision)) => Outcome::Decided(decision),
                Ok(EvalOutcome::NoScript) if !reloaded => {
                    match host.dispatch(&config.bridge, &BridgeRequest::script_load()) {
                        Ok(()) => {
                            self.phase = Phase::LoadingScript { eval };
                            return;
                        }
                        Err(why) => Outcome::Failed(BridgeFailure::Dispatch(why)),
                    }
                }
                Ok(EvalOutcome::NoScript) => Outcome::Failed(BridgeFailure::NoScript),
                Err(failure) => Outcome::Failed(failure),
            },
            Phase::LoadingScript { eval } => {
                match parse_script_load_reply(reply, &config.script_sha) {
                    Ok(()) => {
                        host.count(Counter::ScriptLoads);
                        match host.dispatch(&config.bridge, &eval) {
                            Ok(()) => {
                                self.phase = Phase::Deciding {
                                    eval,
                                    reloaded: true,
                                };
                                return;
                            }
                            Err(why) => Outcome::Failed(BridgeFailure::Dispatch(why)),
                        }
                    }
                    Err(failure) => Outcome::Failed(failure),
                }
            }
            // A reply nobody waits for (cannot happen with one call in flight): ignore it.
            other => {
                self.phase = other;
                return;
            }
        };
        if self.finish(config, host, outcome) == Verdict::Continue {
            host.resume();
        }
    }

    /// Response headers are on their way to the client: add the rate-limit headers.
    pub fn on_response_headers(&mut self, host: &mut impl Host) {
        if let Phase::Allowed { headers } = std::mem::replace(&mut self.phase, Phase::Finished) {
            for (name, value) in &headers {
                host.add_response_header(name, value);
            }
        }
    }

    /// The one place an outcome becomes "let it through" or "answer it".
    fn finish(&mut self, config: &Config, host: &mut impl Host, outcome: Outcome) -> Verdict {
        self.phase = Phase::Finished;
        match outcome {
            Outcome::Decided(decision) if decision.allowed => {
                host.count(Counter::Allowed);
                self.phase = Phase::Allowed {
                    headers: response::allowed_headers(&config.limit, &decision),
                };
                Verdict::Continue
            }
            Outcome::Decided(decision) => {
                host.count(Counter::Denied);
                host.send_response(response::denied(&config.limit, &decision));
                Verdict::Pause
            }
            Outcome::Failed(failure) => {
                host.count(Counter::BridgeErrors);
                host.report_failure(&failure);
                match config.failure_mode {
                    FailureMode::Open => {
                        host.count(Counter::FailureModeOpen);
                        Verdict::Continue
                    }
                    FailureMode::Closed => {
                        host.count(Counter::FailureModeClosed);
                        host.send_response(response::unavailable());
                        Verdict::Pause
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Records what the flow asks of its host.
    #[derive(Default)]
    struct FakeHost {
        api_key: Option<Vec<u8>>,
        source: Option<String>,
        now: Option<u128>,
        refuse_dispatch: bool,
        dispatched: Vec<BridgeRequest>,
        responses: Vec<LocalResponse>,
        resumed: usize,
        response_headers: Vec<(String, String)>,
        counters: Vec<Counter>,
        failures: Vec<BridgeFailure>,
    }

    impl Host for FakeHost {
        fn request_header(&self, name: &str) -> Option<Vec<u8>> {
            assert_eq!(name, "x-api-key");
            self.api_key.clone()
        }
        fn source_address(&self) -> Option<String> {
            self.source.clone()
        }
        fn now_unix_ns(&self) -> Option<u128> {
            self.now
        }
        fn dispatch(&mut self, _bridge: &Bridge, request: &BridgeRequest) -> Result<(), String> {
            if self.refuse_dispatch {
                return Err("cluster not found".into());
            }
            self.dispatched.push(request.clone());
            Ok(())
        }
        fn send_response(&mut self, response: LocalResponse) {
            self.responses.push(response);
        }
        fn resume(&mut self) {
            self.resumed += 1;
        }
        fn add_response_header(&mut self, name: &str, value: &str) {
            self.response_headers.push((name.into(), value.into()));
        }
        fn count(&mut self, counter: Counter) {
            self.counters.push(counter);
        }
        fn report_failure(&mut self, failure: &BridgeFailure) {
            self.failures.push(failure.clone());
        }
    }

    fn config(mode: &str) -> Config {
        let json =
            format!(r#"{{"failure_mode": "{mode}", "limit": {{"capacity": 10, "rate": 1}}}}"#);
        Config::parse(json.as_bytes()).unwrap()
    }

    fn host() -> FakeHost {
        FakeHost {
            api_key: Some(b"k1".to_vec()),
            source: Some("10.1.2.3:4567".into()),
            now: Some(1_000_000_000_000),
            ..FakeHost::default()
        }
    }

    fn ok(body: &str) -> BridgeReply<'_> {
        BridgeReply {
            status: Some(200),
            body: body.as_bytes(),
        }
    }

    const NOSCRIPT: &str = r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#;

    #[test]
    fn allowed_request_resumes_and_gets_headers() {
        let c = config("open");
        let mut h = host();
        let mut flow = RequestFlow::new();
        assert_eq!(flow.on_request_headers(&c, &mut h), Verdict::Pause);
        assert_eq!(h.dispatched.len(), 1);
        assert!(h.dispatched[0].path.starts_with("/EVALSHA/"));
        flow.on_bridge_reply(&c, &mut h, ok(r#"{"EVALSHA":[1,"9","0"]}"#));
        assert_eq!(h.resumed, 1);
        assert!(h.responses.is_empty());
        flow.on_response_headers(&mut h);
        assert_eq!(
            h.response_headers,
            vec![
                ("x-ratelimit-limit".to_string(), "10".to_string()),
                ("x-ratelimit-remaining".to_string(), "9".to_string())
            ]
        );
        assert_eq!(h.counters, vec![Counter::Allowed]);
        // Headers go on once only.
        flow.on_response_headers(&mut h);
        assert_eq!(h.response_headers.len(), 2);
    }

    #[test]
    fn denied_request_gets_a_429_and_is_not_resumed() {
        let c = config("open");
        let mut h = host();
        let mut flow = RequestFlow::new();
        flow.on_request_headers(&c, &mut h);
        flow.on_bridge_reply(&c, &mut h, ok(r#"{"EVALSHA":[0,"0.5","500"]}"#));
        assert_eq!(h.resumed, 0);
        assert_eq!(h.responses.len(), 1);
        assert_eq!(h.responses[0].status, 429);
        flow.on_response_headers(&mut h);
        assert!(
            h.response_headers.is_empty(),
            "the 429 carries its own headers"
        );
        assert_eq!(h.counters, vec![Counter::Denied]);
    }

    #[test]
    fn noscript_loads_the_script_and_retries_the_same_call_once() {
        let c = config("open");
        let mut h = host();
        let mut flow = RequestFlow::new();
        flow.on_request_headers(&c, &mut h);
        flow.on_bridge_reply(&c, &mut h, ok(NOSCRIPT));
        assert_eq!(h.dispatched.len(), 2);
        assert_eq!(h.dispatched[1], BridgeRequest::script_load());
        let loaded = format!(r#"{{"SCRIPT":"{}"}}"#, c.script_sha);
        flow.on_bridge_reply(&c, &mut h, ok(&loaded));
        assert_eq!(h.dispatched.len(), 3);
        assert_eq!(h.dispatched[2], h.dispatched[0]);
        flow.on_bridge_reply(&c, &mut h, ok(r#"{"EVALSHA":[1,"9","0"]}"#));
        assert_eq!(h.resumed, 1);
        assert_eq!(h.counters, vec![Counter::ScriptLoads, Counter::Allowed]);
    }

    #[test]
    fn second_noscript_is_a_failure_not_a_loop() {
        let c = config("open");
        let mut h = host();
        let mut flow = RequestFlow::new();
        flow.on_request_headers(&c, &mut h);
        flow.on_bridge_reply(&c, &mut h, ok(NOSCRIPT));
        let loaded = format!(r#"{{"SCRIPT":"{}"}}"#, c.script_sha);
        flow.on_bridge_reply(&c, &mut h, ok(&loaded));
        flow.on_bridge_reply(&c, &mut h, ok(NOSCRIPT));
        assert_eq!(h.dispatched.len(), 3);
        assert_eq!(h.failures, vec![BridgeFailure::NoScript]);
        assert_eq!(h.resumed, 1);
    }

    #[test]
    fn failure_open_lets_the_request_through() {
        let c = config("open");
        let mut h = host();
        let mut flow = RequestFlow::new();
        flow.on_request_headers(&c, &mut h);
        flow.on_bridge_reply(
            &c,
            &mut h,
            BridgeReply {
                status: None,
                body: b"",
            },
        );
        assert_eq!(h.resumed, 1);
        assert!(h.responses.is_empty());
        assert_eq!(
            h.counters,
            vec![Counter::BridgeErrors, Counter::FailureModeOpen]
        );
        assert_eq!(h.failures, vec![BridgeFailure::NoResponse]);
        flow.on_response_headers(&mut h);
        assert!(h.response_headers.is_empty());
    }

    #[test]
    fn failure_closed_answers_503() {
        let c = config("closed");
        let mut h = host();
        let mut flow = RequestFlow::new();
        flow.on_request_headers(&c, &mut h);
        flow.on_bridge_reply(
            &c,
            &mut h,
            BridgeReply {
                status: Some(503),
                body: b"",
            },
        );
        assert_eq!(h.resumed, 0);
        assert_eq!(h.responses[0].status, 503);
        assert_eq!(
            h.counters,
            vec![Counter::BridgeErrors, Counter::FailureModeClosed]
        );
    }

    #[test]
    fn failed_script_load_follows_the_policy() {
        let c = config("closed");
        let mut h = host();
        let mut flow = RequestFlow::new();
        flow.on_request_headers(&c, &mut h);
        flow.on_bridge_reply(&c, &mut h, ok(NOSCRIPT));
        flow.on_bridge_reply(
            &c,
            &mut h,
            BridgeReply {
                status: Some(403),
                body: b"",
            },
        );
        assert_eq!(h.responses[0].status, 503);
        assert_eq!(h.failures, vec![BridgeFailure::Status(403)]);
    }

    #[test]
    fn refused_dispatch_decides_at_once() {
        for (mode, verdict) in [("open", Verdict::Continue), ("closed", Verdict::Pause)] {
            let c = config(mode);
            let mut h = FakeHost {
                refuse_dispatch: true,
                ..host()
            };
            let mut flow = RequestFlow::new();
            assert_eq!(flow.on_request_headers(&c, &mut h), verdict);
            assert_eq!(h.resumed, 0, "nothing to resume: it never paused");
            assert_eq!(
                h.failures,
                vec![BridgeFailure::Dispatch("cluster not found".into())]
            );
        }
    }

    #[test]
    fn missing_clock_follows_the_policy() {
        let c = config("open");
        let mut h = FakeHost {
            now: None,
            ..host()
        };
        let mut flow = RequestFlow::new();
        assert_eq!(flow.on_request_headers(&c, &mut h), Verdict::Continue);
        assert_eq!(h.failures, vec![BridgeFailure::Clock]);
        assert!(h.dispatched.is_empty());
    }

    #[test]
    fn key_comes_from_api_key_else_ip() {
        let c = config("open");
        let with_key = {
            let mut h = host();
            RequestFlow::new().on_request_headers(&c, &mut h);
            h.dispatched[0].path.clone()
        };
        let by_ip = {
            let mut h = FakeHost {
                api_key: None,
                ..host()
            };
            RequestFlow::new().on_request_headers(&c, &mut h);
            h.dispatched[0].path.clone()
        };
        let key_segment = |path: &str| path.split('/').nth(4).unwrap().to_string();
        assert_eq!(
            key_segment(&with_key),
            format!("rl%3Akey%3A{}", crate::sha1::sha1_hex(b"k1"))
        );
        assert_eq!(
            key_segment(&by_ip),
            format!("rl%3Aip%3A{}", crate::sha1::sha1_hex(b"10.1.2.3"))
        );
    }

    #[test]
    fn a_stray_reply_changes_nothing() {
        let c = config("open");
        let mut h = host();
        let mut flow = RequestFlow::new();
        flow.on_bridge_reply(&c, &mut h, ok(r#"{"EVALSHA":[1,"9","0"]}"#));
        assert_eq!(h.resumed, 0);
        assert!(h.counters.is_empty());
        assert_eq!(flow.on_request_headers(&c, &mut h), Verdict::Pause);
    }
}
