//! The per-request state machine: plan the request, ask the bridge once for every limit,
//! load the script if Redis lost it, then let the request through or answer it, following
//! the failure policy when the bridge fails.

use std::time::Duration;

use crate::bridge::{
    parse_eval_reply, parse_script_load_reply, BridgeFailure, BridgeReply, BridgeRequest, Decision,
    EvalOutcome,
};
use crate::config::{Bridge, Clock, Config, FailureMode};
use crate::identity::RequestView;
use crate::plan::{plan, Plan};
use crate::response::{self, Headers, LocalResponse};

/// What the filter needs from its host (Envoy through proxy-wasm, or a fake in tests).
pub trait Host: RequestView {
    /// Unix time in nanoseconds.
    fn now_unix_ns(&self) -> Option<u128>;
    /// Starts an HTTP call to the bridge; its reply comes to [`RequestFlow::on_bridge_reply`].
    fn dispatch(
        &mut self,
        bridge: &Bridge,
        request: &BridgeRequest,
        timeout: Duration,
    ) -> Result<(), String>;
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
    /// Allowed, but a shadow limit would have refused it.
    ShadowDenied,
    FailureModeOpen,
    FailureModeClosed,
    BridgeErrors,
    ScriptLoads,
    /// Answered 400: a bad cost header, or a header that decides sent more than once.
    BadRequests,
}

impl Counter {
    pub const ALL: [Counter; 8] = [
        Counter::Allowed,
        Counter::Denied,
        Counter::ShadowDenied,
        Counter::FailureModeOpen,
        Counter::FailureModeClosed,
        Counter::BridgeErrors,
        Counter::ScriptLoads,
        Counter::BadRequests,
    ];

    /// The stat's name (`wasmcustom.NAME` in `/stats`, `NAME` in `/stats/prometheus`).
    pub fn name(self) -> &'static str {
        match self {
            Counter::Allowed => "ratelimit_allowed",
            Counter::Denied => "ratelimit_denied",
            Counter::ShadowDenied => "ratelimit_shadow_denied",
            Counter::FailureModeOpen => "ratelimit_failure_mode_open",
            Counter::FailureModeClosed => "ratelimit_failure_mode_closed",
            Counter::BridgeErrors => "ratelimit_bridge_errors",
            Counter::ScriptLoads => "ratelimit_script_loads",
            Counter::BadRequests => "ratelimit_bad_requests",
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
        plan: Plan,
        reloaded: bool,
    },
    /// Redis had lost the script; waiting for `SCRIPT LOAD`, then `eval` goes again.
    LoadingScript {
        eval: BridgeRequest,
        plan: Plan,
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

    /// Request headers arrived: find the matching rules and ask the bridge about all of them.
    pub fn on_request_headers(&mut self, config: &Config, host: &mut impl Host) -> Verdict {
        if !matches!(self.phase, Phase::Start) {
            return Verdict::Continue;
        }
        let plan = match plan(config, host) {
            Ok(plan) => plan,
            Err(bad) => {
                self.phase = Phase::Finished;
                host.count(Counter::BadRequests);
                host.send_response(response::bad_request(&bad.0));
                return Verdict::Pause;
            }
        };
        if plan.checks.is_empty() {
            self.phase = Phase::Finished;
            return Verdict::Continue;
        }
        let clock = match config.clock {
            Clock::Redis => "redis".to_string(),
            Clock::Proxy => match host.now_unix_ns() {
                Some(now) => now.to_string(),
                None => {
                    return self.finish(config, host, &plan, Outcome::Failed(BridgeFailure::Clock))
                }
            },
        };
        let eval = BridgeRequest::evalsha(&config.script_sha, &clock, &plan.checks);
        match host.dispatch(&config.bridge, &eval, plan.timeout) {
            Ok(()) => {
                self.phase = Phase::Deciding {
                    eval,
                    plan,
                    reloaded: false,
                };
                Verdict::Pause
            }
            Err(why) => self.finish(
                config,
                host,
                &plan,
                Outcome::Failed(BridgeFailure::Dispatch(why)),
            ),
        }
    }

    /// The bridge answered (or timed out): decide, or load the script and ask again.
    pub fn on_bridge_reply(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        reply: BridgeReply<'_>,
    ) {
        let (plan, outcome) = match std::mem::take(&mut self.phase) {
            Phase::Deciding {
                eval,
                plan,
                reloaded,
            } => match parse_eval_reply(reply, plan.checks.len()) {
                Ok(EvalOutcome::Decided(decision)) => (plan, Outcome::Decided(decision)),
                Ok(EvalOutcome::NoScript) if !reloaded => {
                    match host.dispatch(&config.bridge, &BridgeRequest::script_load(), plan.timeout)
                    {
                        Ok(()) => {
                            self.phase = Phase::LoadingScript { eval, plan };
                            return;
                        }
                        Err(why) => (plan, Outcome::Failed(BridgeFailure::Dispatch(why))),
                    }
                }
                Ok(EvalOutcome::NoScript) => (plan, Outcome::Failed(BridgeFailure::NoScript)),
                Err(failure) => (plan, Outcome::Failed(failure)),
            },
            Phase::LoadingScript { eval, plan } => {
                match parse_script_load_reply(reply, &config.script_sha) {
                    Ok(()) => {
                        host.count(Counter::ScriptLoads);
                        match host.dispatch(&config.bridge, &eval, plan.timeout) {
                            Ok(()) => {
                                self.phase = Phase::Deciding {
                                    eval,
                                    plan,
                                    reloaded: true,
                                };
                                return;
                            }
                            Err(why) => (plan, Outcome::Failed(BridgeFailure::Dispatch(why))),
                        }
                    }
                    Err(failure) => (plan, Outcome::Failed(failure)),
                }
            }
            // A reply nobody waits for (cannot happen with one call in flight): ignore it.
            other => {
                self.phase = other;
                return;
            }
        };
        if self.finish(config, host, &plan, outcome) == Verdict::Continue {
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
    fn finish(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        plan: &Plan,
        outcome: Outcome,
    ) -> Verdict {
        self.phase = Phase::Finished;
        match outcome {
            Outcome::Decided(decision) if decision.allowed => {
                host.count(Counter::Allowed);
                if decision.limits.iter().any(|l| !l.allowed) {
                    host.count(Counter::ShadowDenied);
                }
                self.phase = Phase::Allowed {
                    headers: response::rate_limit_headers(config, &plan.checks, &decision),
                };
                Verdict::Continue
            }
            Outcome::Decided(decision) => {
                host.count(Counter::Denied);
                host.send_response(response::denied(config, &plan.checks, &decision));
                Verdict::Pause
            }
            Outcome::Failed(failure) => {
                host.count(Counter::BridgeErrors);
                host.report_failure(&failure);
                match plan.failure_mode {
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
    use crate::identity::tests::FakeRequest;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A request, and a record of what the flow asks of its host.
    #[derive(Default)]
    struct FakeHost {
        request: FakeRequest,
        now: Option<u128>,
        refuse_dispatch: bool,
        dispatched: Vec<(BridgeRequest, Duration)>,
        responses: Vec<LocalResponse>,
        resumed: usize,
        response_headers: Vec<(String, String)>,
        counters: Vec<Counter>,
        failures: Vec<BridgeFailure>,
    }

    impl RequestView for FakeHost {
        fn header(&self, name: &str) -> Option<Vec<u8>> {
            self.request.header(name)
        }
        fn header_copies(&self, name: &str) -> usize {
            self.request.header_copies(name)
        }
        fn source_address(&self) -> Option<String> {
            self.request.source_address()
        }
        fn route_name(&self) -> Option<String> {
            self.request.route_name()
        }
    }

    impl Host for FakeHost {
        fn now_unix_ns(&self) -> Option<u128> {
            self.now
        }
        fn dispatch(
            &mut self,
            _bridge: &Bridge,
            request: &BridgeRequest,
            timeout: Duration,
        ) -> Result<(), String> {
            if self.refuse_dispatch {
                return Err("cluster not found".into());
            }
            self.dispatched.push((request.clone(), timeout));
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

    fn config(extra: &str) -> Config {
        let json = format!(
            r#"{{{extra} "rules": [
                {{"name": "all", "limits": [{{"name": "minute", "limit": 10, "window": "1m"}}]}},
                {{"name": "costly", "match": {{"path_prefix": "/costly"}}, "cost": {{"header": "x-cost", "min": 1, "max": 5}},
                  "limits": [{{"name": "minute", "limit": 10, "window": "1m"}}]}},
                {{"name": "watch", "match": {{"path_prefix": "/watch"}}, "shadow": true,
                  "limits": [{{"name": "minute", "limit": 10, "window": "1m"}}]}}
            ]}}"#
        );
        Config::parse(json.as_bytes()).unwrap()
    }

    fn host(path: &str) -> FakeHost {
        FakeHost {
            request: FakeRequest::new("GET", path).with("x-api-key", b"k1"),
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

    /// A reply with only a status (or none: a timeout), as Webdis's failures come.
    fn bare(status: Option<u16>) -> BridgeReply<'static> {
        BridgeReply { status, body: b"" }
    }

    /// Starts a request and feeds it `replies` in order.
    fn replay(c: &Config, h: &mut FakeHost, replies: &[BridgeReply<'_>]) -> RequestFlow {
        let mut flow = RequestFlow::new();
        flow.on_request_headers(c, h);
        for reply in replies {
            flow.on_bridge_reply(c, h, *reply);
        }
        flow
    }

    const ALLOW_ONE: &str = r#"{"EVALSHA":[1,1,1,"9","6000","0"]}"#;
    const NOSCRIPT: &str = r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#;

    #[test]
    fn allowed_request_resumes_and_gets_headers() {
        let c = config("");
        let mut h = host("/");
        let mut flow = RequestFlow::new();
        assert_eq!(flow.on_request_headers(&c, &mut h), Verdict::Pause);
        assert_eq!(h.dispatched.len(), 1);
        let (eval, timeout) = &h.dispatched[0];
        assert!(eval.path.starts_with("/EVALSHA/"));
        assert!(
            eval.path.contains("/1000000000000/1/"),
            "proxy clock passed: {}",
            eval.path
        );
        assert_eq!(*timeout, Duration::from_millis(150));
        flow.on_bridge_reply(&c, &mut h, ok(ALLOW_ONE));
        assert_eq!(h.resumed, 1);
        assert!(h.responses.is_empty());
        flow.on_response_headers(&mut h);
        assert_eq!(
            h.response_headers,
            vec![
                ("x-ratelimit-limit".to_string(), "10".to_string()),
                ("x-ratelimit-remaining".to_string(), "9".to_string()),
                ("x-ratelimit-reset".to_string(), "6".to_string())
            ]
        );
        assert_eq!(h.counters, vec![Counter::Allowed]);
        // Headers go on once only.
        flow.on_response_headers(&mut h);
        assert_eq!(h.response_headers.len(), 3);
    }

    #[test]
    fn redis_clock_sends_no_time() {
        let c = config(r#""clock": "redis","#);
        let mut h = FakeHost {
            now: None,
            ..host("/")
        };
        RequestFlow::new().on_request_headers(&c, &mut h);
        assert!(
            h.dispatched[0].0.path.contains("/redis/1/"),
            "{}",
            h.dispatched[0].0.path
        );
    }

    #[test]
    fn two_matching_rules_are_decided_in_one_call() {
        let c = config("");
        let mut h = host("/costly/x");
        let mut flow = RequestFlow::new();
        flow.on_request_headers(&c, &mut h);
        assert_eq!(h.dispatched.len(), 1);
        assert!(h.dispatched[0].0.path.contains("/EVALSHA/"));
        assert_eq!(h.dispatched[0].0.path.matches("token_bucket").count(), 2);
        flow.on_bridge_reply(
            &c,
            &mut h,
            ok(r#"{"EVALSHA":[1,2,1,"9","6000","0",1,"3","6000","0"]}"#),
        );
        assert_eq!(h.resumed, 1);
        flow.on_response_headers(&mut h);
        assert!(h
            .response_headers
            .contains(&("x-ratelimit-remaining".into(), "3".into())));
    }

    #[test]
    fn denied_request_gets_a_429_and_is_not_resumed() {
        let c = config("");
        let mut h = host("/");
        let mut flow = replay(
            &c,
            &mut h,
            &[ok(r#"{"EVALSHA":[0,1,0,"0.5","3000","500"]}"#)],
        );
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
    fn shadow_denial_is_counted_but_never_blocks() {
        let c = config("");
        let mut h = host("/watch");
        let mut flow = RequestFlow::new();
        flow.on_request_headers(&c, &mut h);
        assert!(h.dispatched[0].0.path.ends_with("/shadow"));
        flow.on_bridge_reply(
            &c,
            &mut h,
            ok(r#"{"EVALSHA":[1,2,1,"5","6000","0",0,"0","6000","3000"]}"#),
        );
        assert_eq!(h.resumed, 1);
        assert!(h.responses.is_empty());
        assert_eq!(h.counters, vec![Counter::Allowed, Counter::ShadowDenied]);
    }

    #[test]
    fn bad_cost_is_a_400_without_a_bridge_call() {
        let c = config("");
        let mut h = host("/costly");
        h.request = h.request.with("x-cost", b"lots");
        let mut flow = RequestFlow::new();
        assert_eq!(flow.on_request_headers(&c, &mut h), Verdict::Pause);
        assert!(h.dispatched.is_empty());
        assert_eq!(h.responses[0].status, 400);
        assert_eq!(
            h.responses[0].body,
            "x-cost must be a whole number from 1 to 5\n"
        );
        assert_eq!(h.counters, vec![Counter::BadRequests]);
    }

    #[test]
    fn no_matching_rule_means_no_call() {
        let c = Config::parse(
            br#"{"rules": [{"name": "r", "match": {"path_exact": "/only"}, "limits": [{"name": "l", "limit": 1, "window": "1s"}]}]}"#,
        )
        .unwrap();
        let mut h = host("/other");
        let mut flow = RequestFlow::new();
        assert_eq!(flow.on_request_headers(&c, &mut h), Verdict::Continue);
        assert!(h.dispatched.is_empty());
        assert!(h.counters.is_empty());
    }

    #[test]
    fn noscript_loads_the_script_and_retries_the_same_call_once() {
        let c = config("");
        let mut h = host("/");
        let mut flow = replay(&c, &mut h, &[ok(NOSCRIPT)]);
        assert_eq!(h.dispatched.len(), 2);
        assert_eq!(h.dispatched[1].0, BridgeRequest::script_load());
        let loaded = format!(r#"{{"SCRIPT":"{}"}}"#, c.script_sha);
        flow.on_bridge_reply(&c, &mut h, ok(&loaded));
        assert_eq!(h.dispatched.len(), 3);
        assert_eq!(h.dispatched[2], h.dispatched[0]);
        flow.on_bridge_reply(&c, &mut h, ok(ALLOW_ONE));
        assert_eq!(h.resumed, 1);
        assert_eq!(h.counters, vec![Counter::ScriptLoads, Counter::Allowed]);
    }

    #[test]
    fn second_noscript_is_a_failure_not_a_loop() {
        let c = config("");
        let mut h = host("/");
        let mut flow = replay(&c, &mut h, &[ok(NOSCRIPT)]);
        let loaded = format!(r#"{{"SCRIPT":"{}"}}"#, c.script_sha);
        flow.on_bridge_reply(&c, &mut h, ok(&loaded));
        flow.on_bridge_reply(&c, &mut h, ok(NOSCRIPT));
        assert_eq!(h.dispatched.len(), 3);
        assert_eq!(h.failures, vec![BridgeFailure::NoScript]);
        assert_eq!(h.resumed, 1);
    }

    #[test]
    fn failure_open_lets_the_request_through() {
        let c = config("");
        let mut h = host("/");
        let mut flow = replay(&c, &mut h, &[bare(None)]);
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
        let c = config(r#""failure_mode": "closed","#);
        let mut h = host("/");
        replay(&c, &mut h, &[bare(Some(503))]);
        assert_eq!(h.resumed, 0);
        assert_eq!(h.responses[0].status, 503);
        assert_eq!(
            h.counters,
            vec![Counter::BridgeErrors, Counter::FailureModeClosed]
        );
    }

    #[test]
    fn failed_script_load_follows_the_policy() {
        let c = config(r#""failure_mode": "closed","#);
        let mut h = host("/");
        replay(&c, &mut h, &[ok(NOSCRIPT), bare(Some(403))]);
        assert_eq!(h.responses[0].status, 503);
        assert_eq!(h.failures, vec![BridgeFailure::Status(403)]);
    }

    #[test]
    fn a_reply_for_another_number_of_limits_is_a_failure() {
        let c = config("");
        let mut h = host("/");
        replay(
            &c,
            &mut h,
            &[ok(r#"{"EVALSHA":[1,2,1,"9","6000","0",1,"9","6000","0"]}"#)],
        );
        assert_eq!(
            h.failures,
            vec![BridgeFailure::BadReply(
                "EVALSHA result has the wrong number of limits"
            )]
        );
        assert_eq!(h.resumed, 1);
    }

    #[test]
    fn refused_dispatch_decides_at_once() {
        for (extra, verdict) in [
            ("", Verdict::Continue),
            (r#""failure_mode": "closed","#, Verdict::Pause),
        ] {
            let c = config(extra);
            let mut h = FakeHost {
                refuse_dispatch: true,
                ..host("/")
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
        let c = config("");
        let mut h = FakeHost {
            now: None,
            ..host("/")
        };
        let mut flow = RequestFlow::new();
        assert_eq!(flow.on_request_headers(&c, &mut h), Verdict::Continue);
        assert_eq!(h.failures, vec![BridgeFailure::Clock]);
        assert!(h.dispatched.is_empty());
    }

    #[test]
    fn a_stray_reply_changes_nothing() {
        let c = config("");
        let mut h = host("/");
        let mut flow = RequestFlow::new();
        flow.on_bridge_reply(&c, &mut h, ok(ALLOW_ONE));
        assert_eq!(h.resumed, 0);
        assert!(h.counters.is_empty());
        assert_eq!(flow.on_request_headers(&c, &mut h), Verdict::Pause);
    }
}
