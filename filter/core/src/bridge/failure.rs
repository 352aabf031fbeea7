//! Why the bridge gave no decision.

use std::fmt;

/// Why the bridge gave no decision. Every one of these goes to the failure policy.
#[derive(Debug, Clone, PartialEq)]
pub enum BridgeFailure {
    /// No response before Envoy's own timeout of the call: the connection failed or reset.
    NoResponse,
    /// No answer within the timeout (in the worker's own time), or none at all by Envoy's.
    Timeout,
    /// An HTTP status other than 200 (403: credentials or ACL; 503: Redis down).
    Status(u16),
    /// Redis answered with an error (shown truncated).
    Redis(String),
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
