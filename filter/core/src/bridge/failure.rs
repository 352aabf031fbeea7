//! Why the bridge gave no decision, and the one place a reply that refuses the filter is told
//! apart from an outage: an HTTP status or a Redis error becomes a [`Misconfiguration`] here.

use std::fmt;

use crate::bounds::MAX_ERROR_TEXT;
use crate::metrics::{Counter, RuleCount};

/// Why the bridge gave no decision. Every one of these goes to the failure policy.
#[derive(Debug, Clone, PartialEq)]
pub enum BridgeFailure {
    /// No response before Envoy's own timeout of the call: the connection failed or reset.
    NoResponse,
    /// No answer within the timeout (in the worker's own time), or none at all by Envoy's.
    Timeout,
    /// An HTTP status other than 200 and other than a refusal (503: Redis down).
    Status(u16),
    /// Redis answered with an error other than a refusal (shown truncated).
    Redis(String),
    /// The bridge answered and refused the filter: a setting is wrong ([`Misconfiguration`]).
    Misconfigured(Misconfiguration),
    /// The script is still missing after loading it.
    NoScript,
    /// A reply the filter cannot read.
    BadReply(&'static str),
    /// The host refused to start the call (for example an unknown cluster).
    Dispatch(String),
    /// The host could not tell the time.
    Clock,
    /// The call reached Redis after its deadline; Redis charged nothing.
    Stale,
    /// The worker's circuit breaker is open: no call was made.
    BreakerOpen,
    /// The request's timeout passed while it waited for a call.
    Expired,
    /// The stream that made the call ended, and its reply with it.
    Orphaned,
    /// Redis Cluster: the node that ran a call for several slots does not serve this
    /// request's keys (another node's slot, or a key gone from a slot being migrated). Redis
    /// refused them at a read, before the request wrote anything: it is sent again.
    NotServed(String),
    /// Redis Cluster: the slot of a call is being migrated or has moved (`TRYAGAIN`, `MOVED`,
    /// `ASK`, `CLUSTERDOWN` answered for the whole call): nothing ran, it is tried again.
    Moving(String),
}

/// What a failure tells an operator: the bridge answered too late, or not at all; or no call
/// was made because the breaker was open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureCause {
    /// Slow or hung: no answer in time, a call that reached Redis past its deadline, a request
    /// that waited past its timeout for a call.
    TimedOut,
    /// Down or broken: refused or reset, an HTTP error, a Redis error, a reply that cannot be
    /// read, a call the host refused to make.
    BridgeError,
    /// No call: the breaker was open.
    BreakerOpen,
}

impl BridgeFailure {
    pub fn cause(&self) -> FailureCause {
        match self {
            BridgeFailure::Timeout | BridgeFailure::Stale | BridgeFailure::Expired => {
                FailureCause::TimedOut
            }
            BridgeFailure::BreakerOpen => FailureCause::BreakerOpen,
            BridgeFailure::NoResponse
            | BridgeFailure::Status(_)
            | BridgeFailure::Redis(_)
            | BridgeFailure::Misconfigured(_)
            | BridgeFailure::NoScript
            | BridgeFailure::BadReply(_)
            | BridgeFailure::Dispatch(_)
            | BridgeFailure::Clock
            | BridgeFailure::Orphaned
            | BridgeFailure::NotServed(_)
            | BridgeFailure::Moving(_) => FailureCause::BridgeError,
        }
    }
}

impl BridgeFailure {
    /// What a reply to `call` with HTTP status `code` (not 200) is: 401 and 403 are the bridge
    /// refusing the filter (its credentials, or its ACL refusing the command), any other
    /// status the bridge failing.
    pub fn of_status(call: BridgeCall, code: u16) -> BridgeFailure {
        let cause = match call {
            BridgeCall::Decision => MisconfigCause::BridgeAuth,
            BridgeCall::ScriptLoad => MisconfigCause::ScriptLoadRefused,
        };
        match code {
            401 | 403 => BridgeFailure::Misconfigured(Misconfiguration {
                cause,
                refused: Refused::Status(code),
            }),
            _ => BridgeFailure::Status(code),
        }
    }

    /// What a Redis error `message` in a reply to `call` is: Redis's ACL refusing a command or
    /// a key (the user Webdis logs in as may not run it) is a misconfiguration, any other
    /// error a Redis error. Redis says `NOPERM …` for a command it refuses at once; inside a
    /// script, Redis 7.0 says `ERR The user executing the script can't run this command or
    /// subcommand` (or `can't access at least one of the keys …`) without naming it, and later
    /// versions `… no permissions to run the 'hset' command`.
    pub fn of_redis_error(call: BridgeCall, message: &str) -> BridgeFailure {
        const REFUSALS: [&str; 4] = [
            "NOPERM",
            "no permissions to",
            "can't run this command",
            "can't access at least one of the keys",
        ];
        if !REFUSALS.iter().any(|r| message.contains(r)) {
            return BridgeFailure::Redis(shown_error(message));
        }
        let cause = match call {
            BridgeCall::Decision => MisconfigCause::RedisAcl,
            BridgeCall::ScriptLoad => MisconfigCause::ScriptLoadRefused,
        };
        BridgeFailure::Misconfigured(Misconfiguration {
            cause,
            refused: Refused::Redis(shown_error(message)),
        })
    }

    /// Whether the call this failure ended may have run in Redis unseen, so that whatever it
    /// carried must be taken as done (a hold taken, a charge made, a debt paid): it went out
    /// and no reply said what Redis did. Sent and unanswered (no response, a timeout, an
    /// answer lost with its stream), a 5xx (Envoy's 504 once the call's timeout passed, its
    /// 503 when the connection reset after the call went out; a hung Webdis reads the call
    /// when it runs again), a reply that cannot be read, and the breaker opening (it takes the
    /// calls in flight with it). Every other failure says the call did not run: refused before
    /// Redis (a 4xx, a refused dispatch, no clock, past its deadline), refused by Redis (an
    /// error, an ACL, no script, a slot served elsewhere or moving), or never sent.
    pub fn may_have_run(&self) -> bool {
        match self {
            BridgeFailure::NoResponse
            | BridgeFailure::Timeout
            | BridgeFailure::BadReply(_)
            | BridgeFailure::Orphaned
            | BridgeFailure::BreakerOpen => true,
            BridgeFailure::Status(code) => *code >= 500,
            BridgeFailure::Redis(_)
            | BridgeFailure::Misconfigured(_)
            | BridgeFailure::NoScript
            | BridgeFailure::Dispatch(_)
            | BridgeFailure::Clock
            | BridgeFailure::Stale
            | BridgeFailure::Expired
            | BridgeFailure::NotServed(_)
            | BridgeFailure::Moving(_) => false,
        }
    }

    /// The misconfiguration this failure is, if it is one.
    pub fn misconfiguration(&self) -> Option<&Misconfiguration> {
        match self {
            BridgeFailure::Misconfigured(m) => Some(m),
            _ => None,
        }
    }
}

/// Redis's error as shown in logs: its first [`MAX_ERROR_TEXT`] characters.
pub(super) fn shown_error(message: &str) -> String {
    let mut shown: String = message.chars().take(MAX_ERROR_TEXT).collect();
    if shown.len() < message.len() {
        shown.push('…');
    }
    shown
}

/// Which of the filter's calls a reply answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BridgeCall {
    /// `EVALSHA` of the decision script: decisions, the breaker's probes, settlements, refunds.
    Decision,
    /// `SCRIPT LOAD` of the decision script.
    ScriptLoad,
}

/// Why the bridge refuses the filter: one cause per setting to fix. Unlike an outage, it does
/// not pass by itself; every request it reaches follows its failure policy until an operator
/// fixes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MisconfigCause {
    /// Webdis answered 401 or 403 to a decision call: `bridge.username` / `bridge.password` are
    /// wrong, or Webdis's ACL does not enable `EVALSHA` for them.
    BridgeAuth,
    /// Redis refused a command or key the decision script needs (`NOPERM`): the Redis user
    /// Webdis logs in as lacks it.
    RedisAcl,
    /// `SCRIPT LOAD` was refused: by Webdis's ACL (403) or by Redis's (`NOPERM`).
    ScriptLoadRefused,
}

impl MisconfigCause {
    pub const ALL: [MisconfigCause; 3] = [
        MisconfigCause::BridgeAuth,
        MisconfigCause::RedisAcl,
        MisconfigCause::ScriptLoadRefused,
    ];

    /// Its name in logs, counters (`ratelimit_misconfigured_<name>`) and `ratelimit-check`.
    pub fn name(self) -> &'static str {
        match self {
            MisconfigCause::BridgeAuth => "bridge_auth",
            MisconfigCause::RedisAcl => "redis_acl",
            MisconfigCause::ScriptLoadRefused => "script_load_refused",
        }
    }
}

/// What the bridge answered when it refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Webdis's HTTP status (401, 403).
    Status(u16),
    /// Redis's error (shown truncated).
    Redis(String),
}

/// The bridge refused the filter: its cause and what it answered. Its text names the cause
/// and the settings to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misconfiguration {
    pub cause: MisconfigCause,
    pub refused: Refused,
}

impl Misconfiguration {
    /// The command Redis's error names (`… to run the 'hset' command`), if it names one.
    pub fn command(&self) -> Option<&str> {
        let Refused::Redis(message) = &self.refused else {
            return None;
        };
        let (_, rest) = message.split_once("run the '")?;
        let (command, _) = rest.split_once('\'')?;
        (!command.is_empty()).then_some(command)
    }

    /// Redis refused a key rather than a command.
    fn keys(&self) -> bool {
        matches!(&self.refused, Refused::Redis(m) if m.contains("keys"))
    }
}

/// The Redis user Webdis logs in as, where its rights are set.
const WEBDIS_REDIS_USER: &str = "the Redis user Webdis logs in as (`default` with webdis.json's \"redis_auth\"; its `user default ...` line in redis.conf)";

impl fmt::Display for Misconfiguration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cause = self.cause.name();
        match (&self.refused, self.cause) {
            (Refused::Status(code), MisconfigCause::ScriptLoadRefused) => write!(
                f,
                "{cause}: Webdis answered HTTP {code} to the load of the decision code (FUNCTION LOAD, or SCRIPT LOAD with bridge.redis_calls \"script\"): the entry of the \"acl\" in webdis.json whose \"http_basic_auth\" is bridge.username:bridge.password must enable \"FUNCTION\" (\"SCRIPT\" for scripts)"
            ),
            (Refused::Status(code), _) => write!(
                f,
                "{cause}: Webdis answered HTTP {code} to the decision call (FCALL, or EVALSHA with bridge.redis_calls \"script\"): either bridge.username / bridge.password in the filter configuration match no \"http_basic_auth\" entry of the \"acl\" in webdis.json, or that entry does not enable \"FCALL\" (\"EVALSHA\" for scripts)"
            ),
            (Refused::Redis(message), MisconfigCause::ScriptLoadRefused) => {
                let grant = self.command().unwrap_or("function|load");
                write!(
                    f,
                    "{cause}: Redis refused the load of the decision code ({message}): grant +{grant} to {WEBDIS_REDIS_USER}"
                )
            }
            (Refused::Redis(message), _) => match self.command() {
                Some(command) => write!(
                    f,
                    "{cause}: Redis refused '{command}', which the filter's calls need ({message}): grant +{command} to {WEBDIS_REDIS_USER}"
                ),
                None if self.keys() => write!(
                    f,
                    "{cause}: Redis refused the limiter's keys ({message}): {WEBDIS_REDIS_USER} must be allowed the keys under the filter's key_prefix (~PREFIX*)"
                ),
                None => write!(
                    f,
                    "{cause}: Redis refused a command the decision code runs ({message}): grant every command docs/security.md lists to {WEBDIS_REDIS_USER}; `ACL LOG` as an admin user names the command"
                ),
            },
        }
    }
}

impl fmt::Display for BridgeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BridgeFailure::NoResponse => write!(
                f,
                "no response from the bridge (connection refused or reset)"
            ),
            BridgeFailure::Timeout => write!(f, "no answer from the bridge within the timeout"),
            BridgeFailure::Status(code) => write!(f, "bridge answered HTTP {code}"),
            BridgeFailure::Redis(message) => write!(f, "redis error: {message}"),
            BridgeFailure::Misconfigured(refusal) => write!(f, "{refusal}"),
            BridgeFailure::NoScript => write!(f, "script still missing after SCRIPT LOAD"),
            BridgeFailure::BadReply(why) => write!(f, "unreadable bridge reply: {why}"),
            BridgeFailure::Dispatch(why) => write!(f, "could not call the bridge: {why}"),
            BridgeFailure::Clock => write!(f, "host clock unavailable"),
            BridgeFailure::Stale => write!(f, "the call reached Redis after its deadline"),
            BridgeFailure::BreakerOpen => write!(f, "the circuit breaker is open"),
            BridgeFailure::Expired => write!(f, "timed out waiting for a bridge call"),
            BridgeFailure::Orphaned => write!(f, "the stream that made the call ended"),
            BridgeFailure::NotServed(message) => {
                write!(f, "redis cluster node does not serve the keys: {message}")
            }
            BridgeFailure::Moving(message) => write!(f, "redis cluster slot moving: {message}"),
        }
    }
}

impl MisconfigCause {
    /// The counter of the calls the bridge refused for this cause.
    pub fn counter(self) -> Counter {
        match self {
            MisconfigCause::BridgeAuth => Counter::MisconfiguredBridgeAuth,
            MisconfigCause::RedisAcl => Counter::MisconfiguredRedisAcl,
            MisconfigCause::ScriptLoadRefused => Counter::MisconfiguredScriptLoadRefused,
        }
    }
}

impl FailureCause {
    /// The per-rule count of a request a bridge failure of this cause left to the policy.
    pub fn rule_count(self) -> RuleCount {
        match self {
            FailureCause::TimedOut => RuleCount::TimedOut,
            FailureCause::BridgeError => RuleCount::BridgeError,
            FailureCause::BreakerOpen => RuleCount::BreakerOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::reply::{parse_eval_reply, BridgeReply, EvalOutcome};
    use crate::program::Program;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn a_call_may_have_run_when_it_went_out_and_no_reply_said_what_redis_did() {
        let acl = BridgeFailure::of_redis_error(BridgeCall::Decision, "NOPERM no");
        let auth = BridgeFailure::of_status(BridgeCall::Decision, 401);
        let cases = [
            (BridgeFailure::NoResponse, true),
            (BridgeFailure::Timeout, true),
            (BridgeFailure::Status(500), true),
            (BridgeFailure::Status(503), true),
            (BridgeFailure::Status(504), true),
            (BridgeFailure::Status(413), false),
            (BridgeFailure::Status(400), false),
            (BridgeFailure::Redis("ERR x".into()), false),
            (acl, false),
            (auth, false),
            (BridgeFailure::NoScript, false),
            (BridgeFailure::BadReply("x"), true),
            (BridgeFailure::Dispatch("x".into()), false),
            (BridgeFailure::Clock, false),
            (BridgeFailure::Stale, false),
            (BridgeFailure::BreakerOpen, true),
            (BridgeFailure::Expired, false),
            (BridgeFailure::Orphaned, true),
            (BridgeFailure::NotServed("x".into()), false),
            (BridgeFailure::Moving("x".into()), false),
        ];
        for (failure, may) in cases {
            assert_eq!(failure.may_have_run(), may, "{failure:?}");
        }
    }

    fn reply(status: u16, body: &str) -> BridgeReply<'_> {
        BridgeReply {
            status: Some(status),
            body: body.as_bytes(),
        }
    }

    /// What a decision call's reply is: the failure of the whole call, or of its one request.
    fn decision(status: u16, body: &str) -> BridgeFailure {
        match parse_eval_reply(reply(status, body), &[1]) {
            Err(failure) => failure,
            Ok(EvalOutcome::Decided(mut results)) => match results.pop() {
                Some(Err(failure)) => failure,
                other => panic!("{body}: decided {other:?}"),
            },
            Ok(EvalOutcome::NoScript) => panic!("{body}: NOSCRIPT"),
        }
    }

    fn script_load(status: u16, body: &str) -> BridgeFailure {
        match Program::script_named(SHA).parse_load_reply(reply(status, body)) {
            Err(failure) => failure,
            Ok(()) => panic!("{body}: loaded"),
        }
    }

    /// Replies as Webdis 0.1.9 and Redis 7.0.15 send them, and the forms of later Redis
    /// versions: each refusal has its cause, the command when Redis
    /// names it, and a text naming the settings to check.
    #[test]
    fn refusals_are_told_apart_by_cause_with_the_setting_to_fix() {
        let cases: Vec<(BridgeFailure, MisconfigCause, Option<&str>, &[&str])> = vec![
            // Wrong basic auth, or Webdis's ACL without EVALSHA: 403, empty body.
            (
                decision(403, ""),
                MisconfigCause::BridgeAuth,
                None,
                &[
                    "HTTP 403",
                    "bridge.username",
                    "bridge.password",
                    "http_basic_auth",
                    "\"FCALL\"",
                    "\"EVALSHA\"",
                ],
            ),
            (
                decision(401, ""),
                MisconfigCause::BridgeAuth,
                None,
                &["HTTP 401", "bridge.username"],
            ),
            // Redis's ACL refusing EVALSHA itself, before the script runs.
            (
                decision(
                    200,
                    r#"{"EVALSHA":[false,"NOPERM this user has no permissions to run the 'evalsha' command"]}"#,
                ),
                MisconfigCause::RedisAcl,
                Some("evalsha"),
                &[
                    "grant +evalsha to the Redis user Webdis logs in as",
                    "redis.conf",
                ],
            ),
            // A command the script calls, refused inside it (Redis 7.0: the command unnamed),
            // for one request of the batch...
            (
                decision(
                    200,
                    r#"{"EVALSHA":[1,-1,"ERR The user executing the script can't run this command or subcommand"]}"#,
                ),
                MisconfigCause::RedisAcl,
                None,
                &["redis.conf", "docs/security.md", "ACL LOG"],
            ),
            // ...or for the whole call (a command the script runs before its requests).
            (
                decision(
                    200,
                    r#"{"EVALSHA":[false,"ERR The user executing the script can't run this command or subcommand script: 2dce277c75f216c0cc34ec209486675d4a6ea9da, on @user_script:694."]}"#,
                ),
                MisconfigCause::RedisAcl,
                None,
                &["ACL LOG"],
            ),
            // Later Redis versions name it.
            (
                decision(
                    200,
                    r#"{"EVALSHA":[1,-1,"NOPERM User default has no permissions to run the 'hset' command"]}"#,
                ),
                MisconfigCause::RedisAcl,
                Some("hset"),
                &["'hset'", "grant +hset"],
            ),
            // Keys outside the user's pattern (a key_prefix the ACL does not cover).
            (
                decision(
                    200,
                    r#"{"EVALSHA":[false,"NOPERM this user has no permissions to access one of the keys used as arguments"]}"#,
                ),
                MisconfigCause::RedisAcl,
                None,
                &["key_prefix"],
            ),
            (
                decision(
                    200,
                    r#"{"EVALSHA":[1,-1,"ERR The user executing the script can't access at least one of the keys mentioned in the command arguments"]}"#,
                ),
                MisconfigCause::RedisAcl,
                None,
                &["key_prefix"],
            ),
            // SCRIPT LOAD refused by Webdis's ACL, or by Redis's.
            (
                script_load(403, ""),
                MisconfigCause::ScriptLoadRefused,
                None,
                &["SCRIPT LOAD", "HTTP 403", "webdis.json", "\"SCRIPT\""],
            ),
            (
                script_load(
                    200,
                    r#"{"SCRIPT":[false,"NOPERM this user has no permissions to run the 'script|load' command"]}"#,
                ),
                MisconfigCause::ScriptLoadRefused,
                Some("script|load"),
                &["load of the decision code", "+script|load", "redis.conf"],
            ),
        ];
        for (failure, cause, command, says) in cases {
            let m = failure
                .misconfiguration()
                .unwrap_or_else(|| panic!("not a misconfiguration: {failure:?}"));
            assert_eq!(m.cause, cause, "{failure:?}");
            assert_eq!(m.command(), command, "{failure:?}");
            assert_eq!(failure.cause(), FailureCause::BridgeError, "{failure:?}");
            let text = failure.to_string();
            assert!(text.starts_with(cause.name()), "{text}");
            for needle in says {
                assert!(text.contains(needle), "{text:?} does not say {needle:?}");
            }
        }
    }

    /// An outage or another Redis error is not a misconfiguration.
    #[test]
    fn outages_and_other_errors_are_not_refusals() {
        let cases = [
            (
                parse_eval_reply(
                    BridgeReply {
                        status: None,
                        body: b"",
                    },
                    &[1],
                )
                .err(),
                BridgeFailure::NoResponse,
            ),
            (Some(decision(503, "")), BridgeFailure::Status(503)),
            (Some(decision(500, "")), BridgeFailure::Status(500)),
            (Some(decision(405, "")), BridgeFailure::Status(405)),
            (Some(script_load(503, "")), BridgeFailure::Status(503)),
            (
                Some(decision(
                    200,
                    r#"{"EVALSHA":[false,"ERR user_script:14: attempt to compare nil"]}"#,
                )),
                BridgeFailure::Redis("ERR user_script:14: attempt to compare nil".into()),
            ),
            (
                Some(decision(
                    200,
                    r#"{"EVALSHA":[1,-1,"OOM command not allowed when used memory > 'maxmemory'."]}"#,
                )),
                BridgeFailure::Redis(
                    "OOM command not allowed when used memory > 'maxmemory'.".into(),
                ),
            ),
            (
                Some(decision(
                    200,
                    r#"{"EVALSHA":[1,-1,"WRONGTYPE Operation against a key holding the wrong kind of value"]}"#,
                )),
                BridgeFailure::Redis(
                    "WRONGTYPE Operation against a key holding the wrong kind of value".into(),
                ),
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got.as_ref(), Some(&want));
            assert!(want.misconfiguration().is_none(), "{want:?}");
        }
    }

    #[test]
    fn each_cause_has_its_own_name() {
        let names: Vec<&str> = MisconfigCause::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names, ["bridge_auth", "redis_acl", "script_load_refused"]);
    }

    /// One counter per cause, named after it (what the alert and the runbook read).
    #[test]
    fn each_misconfiguration_cause_has_its_counter() {
        for cause in MisconfigCause::ALL {
            assert_eq!(
                cause.counter().name(),
                format!("ratelimit_misconfigured_{}", cause.name())
            );
        }
    }
}
