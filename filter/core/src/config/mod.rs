//! The filter's JSON configuration: the validated model the request path reads (this file),
//! the serde layer as written with its defaults (`raw.rs`), its validation (`validate.rs` for
//! the top level and the bridge, `rules.rs` for rules and limits, `fields.rs` for the checks
//! both share), and locating serde's errors in the text (`locate.rs`). `Config::parse`, in the
//! `load` module, then checks what one request can carry. Every error names the
//! field it is about (`rules[0].limits[1].limit: must be >= 1`), so Envoy refuses a bad config
//! at start-up with a message an operator can act on.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

mod fields;
#[cfg(test)]
pub(crate) mod fixtures;
mod locate;
mod matching;
mod overlap;
mod plans;
mod raw;
mod rules;
pub mod sources;
mod usage;
mod validate;

pub use matching::{Condition, Match, PathMatch, Test};

use crate::bounds::{
    MAX_BATCH_REQUESTS, MAX_BREAKER_FAILURES, MAX_DENY_CACHE_ENTRIES, MAX_IN_FLIGHT,
};
pub use crate::calendar::{Calendar, Unit as CalendarUnit};
pub use overlap::may_overlap;
pub use raw::{parse_duration, show_duration};
pub use rules::MAX_COST;
pub use usage::{
    parse_bytes, AddIncludeUsage, Estimate, Format, HeaderUsage, Usage, UsageSource, MAX_USAGE,
};
pub(crate) use validate::parse_fields;

/// What a bridge failure (timeout, refused connection, bad reply) does to the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureMode {
    /// Let the request through: the limiter never turns into an outage.
    Open,
    /// Answer 503: for endpoints where an unmetered request costs more than a refused one.
    Closed,
    /// Each worker enforces the rule's limits itself, in memory, at `local_share` of each.
    Local,
}

/// Whose clock the decision uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// Envoy's time, passed to the script: deterministic, but replicas' clocks must agree.
    #[default]
    Proxy,
    /// Redis `TIME`: one clock for the whole fleet.
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    #[default]
    TokenBucket,
    Gcra,
    SlidingWindowCounter,
    SlidingWindowLog,
    FixedWindow,
    /// Requests in flight, not a rate: each admitted request has a hold until it ends.
    Concurrency,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// Whether a limit of it has a burst (a bucket's capacity) apart from its rate; the
    /// others hold `limit` at most.
    pub fn has_burst(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::Gcra)
    }

    /// Whether its units may be leased: its reply's reset is the earliest instant the state
    /// can be whole again (bucket full, window over), before which a unit charged early is
    /// the same as one charged when spent. A sliding window's units leave the window counted
    /// from their charge, so one spent later could let another in too early.
    pub fn leasable(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::FixedWindow
        )
    }
}

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum RateLimitHeaders {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    #[default]
    #[serde(rename = "x-ratelimit")]
    XRateLimit,
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
    #[serde(rename = "ietf")]
    Ietf,
    #[serde(rename = "both")]
    Both,
    /// OpenAI's: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, for the rule's
    /// most restrictive request limit and usage limit; `retry-after-ms` on a 429.
    #[serde(rename = "openai")]
    OpenAi,
    /// None of them (a 429 still carries `Retry-After`).
    #[serde(rename = "none")]
    None,
}

impl RateLimitHeaders {
    pub fn x_ratelimit(self) -> bool {
        matches!(self, RateLimitHeaders::XRateLimit | RateLimitHeaders::Both)
    }
    pub fn ietf(self) -> bool {
        matches!(self, RateLimitHeaders::Ietf | RateLimitHeaders::Both)
    }
}

/// The body of a 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum DenyBody {
    #[default]
    #[serde(rename = "text")]
    Text,
    /// RFC 9457 `application/problem+json`, type `quota-exceeded`.
    #[serde(rename = "problem+json")]
    ProblemJson,
}

/// How a request is admitted on a usage limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Admit {
    /// Charge the estimate up front (all or nothing with the rule's other limits), then settle
    /// the difference once the usage is known.
    #[default]
    Reserve,
    /// Admit while at least 1 unit is left, charge the usage once known.
    After,
}

/// What to do with a rule when none of its key sources is present on a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WhenMissing {
    /// Limit all such requests together under one `anonymous` key.
    #[default]
    Anonymous,
    /// The rule does not apply to the request.
    Skip,
}

/// A validated configuration, ready for the request path.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub bridge: Bridge,
    pub clock: Clock,
    pub key_prefix: String,
    pub hash_identities: bool,
    pub client_ip: ClientIpPolicy,
    pub headers: RateLimitHeaders,
    pub deny_body: DenyBody,
    /// The gRPC status of a gRPC request refused by a limit.
    pub grpc_over_limit: crate::grpc::GrpcOverLimit,
    pub rules: Vec<Rule>,
    pub batch: Batch,
    /// The circuit breaker of each worker; None: never opens.
    pub breaker: Option<Breaker>,
    /// How far Envoy's and Redis's clocks may differ: a call that reaches Redis later than its
    /// timeout plus this charges nothing.
    pub clock_skew: Duration,
    /// How much longer than its timeout, in wall-clock time, a request may wait for a call when
    /// its worker runs late (the timeout counts the worker's own time, see `engine::lag`).
    pub lag_allowance: Duration,
    /// Refused keys a worker remembers until they could fit; 0 turns the deny cache off.
    pub deny_cache_entries: usize,
    /// The part of each limit one worker enforces on its own in the `local` failure mode.
    pub local_share: f64,
    /// The bridge reaches a Redis Cluster (through Envoy's `redis_proxy`): every call's keys
    /// share one hash slot, and a request whose limits live on several slots is decided per
    /// slot, all or nothing through refunds.
    pub redis_cluster: bool,
    /// Redis Cluster with key budgets: per slot, the number n of a hash tag `{b<n>}` on that
    /// slot ([`crate::slot::slot_tags`]), for the slot's budget counter and overflow state.
    pub budget_slot_tags: crate::slot::SlotTags,
    /// What Redis runs for a decision call: the decision library's function (`FCALL`) or the
    /// decision script (`EVALSHA`), named by their hash (`bridge.redis_calls`).
    pub program: crate::program::Program,
    /// Some limit is metered by usage: streams let through are followed to their response.
    pub metered: bool,
    /// The `body:` paths the rules read: a request a rule reading one matches is held until
    /// its body ends, and the body is scanned for each.
    pub body_fields: Vec<BodyPath>,
}

/// How a worker groups decisions into bridge calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Requests one call decides at most.
    pub max_requests: usize,
    /// Calls one worker has in flight at most; requests wait for a free one.
    pub max_in_flight: usize,
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            max_requests: 64,
            max_in_flight: 1,
        }
    }
}

/// When a worker stops calling a failing bridge, and how it finds out that it is back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    /// Consecutive failed calls that open the breaker.
    pub failures: u32,
    /// A call without an answer for this long (in the worker's own time) while other
    /// requests wait opens it; None: the call's own timeout.
    pub stall: Option<Duration>,
    /// While open, one probe call per interval; an answer closes it.
    pub probe_interval: Duration,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            failures: 5,
            stall: None,
            probe_interval: Duration::from_millis(500),
        }
    }
}

pub const DEFAULT_DENY_CACHE_ENTRIES: usize = 10_000;
const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(1);
/// A worker's own lateness is taken out of a request's timeout up to this much: a throttled
/// or overloaded proxy runs its callbacks tens of ms late (a CFS period is 100 ms), and a
/// second covers several periods of it while still bounding the wait when the bridge hangs too.
const DEFAULT_LAG_ALLOWANCE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq)]
pub struct Bridge {
    /// Envoy cluster that reaches Webdis.
    pub cluster: String,
    /// `:authority` of the calls to Webdis.
    pub authority: String,
    /// Ready-made `Authorization` header value, when Webdis requires basic auth.
    pub authorization: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIpPolicy {
    /// 0: the connection's peer. N > 0: the Nth address from the right of X-Forwarded-For.
    pub xff_trusted_hops: usize,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub name: String,
    pub matcher: Match,
    pub key: KeySpec,
    pub limits: Vec<Limit>,
    pub cost: Cost,
    pub failure_mode: FailureMode,
    pub timeout: Duration,
    pub shadow: bool,
    /// At most this many new identities may create state per window.
    pub key_budget: Option<KeyBudget>,
    /// The plan this rule is, when it was written as one of a rule's `plans`: each plan is a
    /// rule of its own with the plan's limits, under the rule's name, its match narrowed to
    /// the requests of that plan (the default plan's to every value no other plan names).
    pub plan: Option<String>,
}

impl Rule {
    /// The `body:` paths this rule reads: in its key, its conditions (a plan's included).
    pub fn body_paths(&self) -> impl Iterator<Item = &BodyPath> {
        let key = self.key.alternatives.iter().flat_map(|a| a.sources.iter());
        let conditions = self.matcher.conditions.iter().map(|c| &c.source);
        key.chain(conditions).filter_map(|source| match source {
            KeySource::Body(path) => Some(path),
            _ => None,
        })
    }
}

/// A bound on how fast a rule's key space grows: new identities (none of the rule's keys
/// exist in Redis) may create state at most `new_keys` times per `window`, counted in Redis
/// by the decision script. Identities that already have state are never affected.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyBudget {
    pub new_keys: u64,
    pub window: Duration,
    pub over_budget: OverBudget,
}

/// What happens to a new identity while its rule's key budget is used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverBudget {
    /// Limited under the rule's one shared `overflow` identity: a flood shares one bucket.
    #[default]
    Shared,
    /// Refused (429) until the budget's window ends.
    Deny,
}

/// A key budget as each slot of a Redis Cluster counts it: a script sees only its own slot,
/// so each of the 16,384 slots admits ⌈new_keys / 16384⌉ new identities per window stretched
/// so that all slots together admit new_keys per `window` at most.
pub fn cluster_budget(budget: &KeyBudget) -> (u64, Duration) {
    let slots = u64::from(crate::slot::SLOTS);
    let per_slot = budget.new_keys.div_ceil(slots);
    let ms = budget.window.as_millis() * u128::from(per_slot) * u128::from(slots)
        / u128::from(budget.new_keys.max(1));
    (
        per_slot,
        Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX)),
    )
}

/// How long a limit's state lives at most, in ms (the scripts' `PEXPIRE` less its margin).
pub fn state_lifetime_ms(algorithm: Algorithm, limit: u64, window: Window, burst: u64) -> u128 {
    let window = window.longest_ms();
    match algorithm {
        // Full again once burst tokens came back at limit per window; GCRA's TAT is at most
        // burst intervals of window / limit ahead.
        Algorithm::TokenBucket | Algorithm::Gcra => {
            (u128::from(burst) * window).div_ceil(u128::from(limit.max(1)))
        }
        Algorithm::SlidingWindowCounter => 2 * window,
        Algorithm::FixedWindow | Algorithm::SlidingWindowLog | Algorithm::Concurrency => window,
    }
}

impl OverBudget {
    pub fn name(self) -> &'static str {
        match self {
            OverBudget::Shared => "shared",
            OverBudget::Deny => "deny",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct KeySpec {
    /// Tried in order; the first whose sources are all present is the key.
    pub alternatives: Vec<KeyAlternative>,
    pub when_missing: WhenMissing,
}

#[derive(Debug, Clone, PartialEq)]
pub struct KeyAlternative {
    /// As written in the config (`header:x-api-key+path`): names the key's kind.
    pub label: String,
    pub sources: Vec<KeySource>,
}

/// Where a key, a match or a plan reads a value of the request.
#[derive(Debug, Clone, PartialEq)]
pub enum KeySource {
    /// A request header (lower-case name): the client chooses it.
    Header(String),
    ClientIp,
    Route,
    Method,
    /// The path without its query string.
    Path,
    /// A query parameter (its name as written, compared after percent-decoding): the client
    /// chooses it.
    Query(String),
    /// A value in the stream's dynamic metadata, which a filter before this one set (a JWT
    /// claim from `jwt_authn`, an `ext_authz` result): what Envoy verified.
    Metadata(MetadataPath),
    /// A value in the request body's JSON (`model`): the client chooses it. Read once the body
    /// has ended; a rule reading one holds the body until then.
    Body(BodyPath),
}

impl KeySource {
    /// Whether the client chooses the value (a header, a query parameter, the path or the
    /// method): a client can send a fresh one with every request.
    pub fn client_chosen(&self) -> bool {
        matches!(
            self,
            KeySource::Header(_)
                | KeySource::Query(_)
                | KeySource::Path
                | KeySource::Method
                | KeySource::Body(_)
        )
    }
}

/// `metadata:NAMESPACE:KEY[:KEY…]`: the value at KEY… in the filter metadata of NAMESPACE.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MetadataPath {
    pub namespace: String,
    pub keys: Vec<String>,
}

impl MetadataPath {
    /// The property path Envoy reads it at (`get_property`).
    pub fn property(&self) -> Vec<&str> {
        let mut path = vec!["metadata", "filter_metadata", self.namespace.as_str()];
        path.extend(self.keys.iter().map(String::as_str));
        path
    }
}

/// `body:KEY[:KEY…]`: the value at KEY… in the request body's JSON object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BodyPath {
    pub keys: Vec<String>,
}

/// A limit's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// A fixed length; windows aligned to the Unix epoch, so every replica agrees on edges.
    Fixed(Duration),
    /// A calendar day, ISO week or month in a fixed UTC offset (`fixed_window` only).
    Calendar(Calendar),
}

impl Window {
    /// A fixed window of `ms` milliseconds.
    pub const fn ms(ms: u64) -> Window {
        Window::Fixed(Duration::from_millis(ms))
    }

    /// Its length in ms; for a calendar window, its unit's longest (a month of 31 days).
    pub fn longest_ms(self) -> u128 {
        match self {
            Window::Fixed(d) => d.as_millis(),
            Window::Calendar(c) => u128::from(c.longest_ms()),
        }
    }

    /// The length (ms) of the window holding Unix ms `now`: a calendar month's own.
    pub fn length_at(self, now: f64) -> f64 {
        match self {
            Window::Fixed(d) => d.as_millis() as f64,
            Window::Calendar(c) => c.length_at(now),
        }
    }

    /// The calendar, if it is a calendar window.
    pub fn calendar(self) -> Option<Calendar> {
        match self {
            Window::Fixed(_) => None,
            Window::Calendar(c) => Some(c),
        }
    }

    /// As the config writes it: `1m`, `month`, `day at +05:30`.
    pub fn show(self) -> String {
        match self {
            Window::Fixed(d) => show_duration(d),
            Window::Calendar(c) if c.offset_minutes == 0 => c.unit.name().to_string(),
            Window::Calendar(c) => format!("{} at UTC{}", c.unit.name(), c.show_offset()),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub name: String,
    pub algorithm: Algorithm,
    /// Requests (cost units) per window.
    pub limit: u64,
    pub window: Window,
    /// Token bucket and GCRA: the most that can be spent at once (default: `limit`).
    pub burst: u64,
    /// Each identity's state split over this many keys (1: not split), each holding
    /// limit / shards and burst / shards (rounded down): one hot identity spreads over several
    /// Redis Cluster nodes. A request spends from one shard, taken in turn.
    pub shards: u64,
    /// Units a worker may take ahead and spend without a call (token bucket, GCRA and fixed
    /// window only).
    pub lease: Option<Lease>,
    /// Metered by the usage read from the response (None: by the rule's cost per request).
    pub usage: Option<Usage>,
    /// Each decision also reads the identity's override (another limit, `unlimited` or
    /// `blocked`, set at runtime by an operator) beside its state, in the same script call.
    pub overrides: bool,
}

/// How a worker leases units of a limit: one call charges the request and up to this many
/// more units at once, which later requests of that identity spend locally (no call, no
/// wait). Units are spent in Redis before any request uses them, so no limit is exceeded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lease {
    /// Units one lease holds at most (the request's own cost included).
    pub max_units: u64,
    /// A lease takes at most this part of what is left of the limit: near the limit a lease
    /// is the request alone, and decisions are exact per request again.
    pub fraction: f64,
    /// A lease's unused units are given back after this long (sooner when the bucket would be
    /// full again by then, see the README).
    pub max_ms: u64,
}

impl Default for Lease {
    fn default() -> Self {
        Lease {
            max_units: 100,
            fraction: 0.1,
            max_ms: 1000,
        }
    }
}

impl Limit {
    /// The quota a client sees in headers: the burst for buckets, the limit for windows (of
    /// one shard, which is what a request spends from).
    pub fn quota(&self) -> u64 {
        if self.algorithm.has_burst() {
            self.shard_burst()
        } else {
            self.shard_limit()
        }
    }

    /// What one shard holds per window.
    pub fn shard_limit(&self) -> u64 {
        self.limit / self.shards.max(1)
    }

    /// What one shard can spend at once.
    pub fn shard_burst(&self) -> u64 {
        self.burst / self.shards.max(1)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Cost {
    Fixed(u64),
    /// Taken from a request header, which must hold an integer in `min..=max`; absent: `default`.
    Header {
        name: String,
        min: u64,
        max: u64,
        default: u64,
    },
}

/// A configuration error: the field (`rules[0].name`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

pub(crate) fn invalid(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_string(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests;
