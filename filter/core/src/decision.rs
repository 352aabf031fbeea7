//! What a decision is, apart from how it travels: what Redis (or a lease, or the local
//! fallback) decided for a request and each of its limits, and a charge to give back.

use crate::check::LimitCheck;
use crate::time::UnixNs;

/// What Redis decided for one limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitResult {
    pub allowed: bool,
    /// Units left after this request (charged only if the request was allowed).
    pub remaining: f64,
    /// Milliseconds until the limit is whole again.
    pub reset_ms: f64,
    /// When refused: milliseconds until this request would be allowed (0 when it never is).
    pub retry_ms: f64,
    /// Refused because the request costs more than the limit ever holds (a bucket's burst, a
    /// window's limit): no wait makes it fit.
    pub never_fits: bool,
    /// A new identity over its rule's key budget: refused for it (over_budget `deny`) or decided on
    /// the rule's shared overflow state (over_budget `shared`).
    pub over_budget: bool,
    /// The identity's override that decided this limit, if one did.
    pub overridden: Option<Override>,
    /// An override was found for the identity but is malformed: the config's numbers applied.
    pub bad_override: bool,
}

/// An operator's override of one limit for one identity, as the script applied it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Override {
    /// Another limit (and burst) per window: its quota as headers show it (the burst for
    /// token_bucket and gcra, else the limit).
    Limit(u64),
    /// Allowed, charged nothing.
    Unlimited,
    /// Refused until the override expires.
    Blocked,
}

/// What Redis decided for one request: all limits, in the order they were sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Every enforced limit allowed, and the request was charged.
    pub allowed: bool,
    pub limits: Vec<LimitResult>,
    /// Further requests of the same costs charged with this one as a lease (0: none); each
    /// limit's `remaining` and `reset_ms` then describe the state after the whole lease.
    pub leased: u64,
}

/// A charge to give back: the limit, the clock the charge was decided with, and the
/// `remaining` it replied.
#[derive(Debug, Clone, PartialEq)]
pub struct Refund {
    pub check: LimitCheck,
    pub charged_at_ns: UnixNs,
    pub left: f64,
}

/// A usage limit's settlement, once its response's usage is known: the units used less what
/// was charged before the request went upstream. Positive: charged as debt (never refused);
/// negative: given back (never past the full allowance). See `SETTLES` in `lua/lib.lua`.
#[derive(Debug, Clone, PartialEq)]
pub struct Settlement {
    pub check: LimitCheck,
    pub delta: i64,
}
