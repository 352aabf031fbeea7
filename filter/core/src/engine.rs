//! One decision engine per worker (per wasm VM, owned by the root context). Request contexts
//! hand it their plans; it answers what it can at once (a bad request, a refusal it already
//! knows from the deny cache) and queues the rest. Whatever waits while a call is in flight
//! goes together in the next call (group commit, no timer: a request that finds the worker
//! idle is sent at once), and one `EVALSHA` decides the whole batch, each request all or
//! nothing over its own limits, in arrival order.
//!
//! Calls are started from the root context (through [`Host::wake`]), so their replies come to
//! the root and are never lost with the stream of whichever request happened to start them.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::bridge::{
    call_bytes, lease_units, parse_batch_reply, parse_eval_reply, parse_script_load_reply,
    BridgeFailure, BridgeReply, BridgeRequest, DecideCall, Decision, EvalOutcome, LimitResult,
    Refund, RequestShape,
};
use crate::config::{Bridge, Clock, Config, FailureMode};
use crate::deny_cache::{DenyCache, Refusal};
use crate::identity::RequestView;
use crate::lease::Leases;
use crate::local::{scaled, LocalLimits};
use crate::metrics::{Counter, Gauge, Histogram, PendingCounts, RuleEvent, RuleStats};
use crate::plan::{plan_memo, LimitCheck, Plan, PlanMemo};
use crate::response::{self, Headers, LocalResponse};
use crate::slot::key_slot;
use crate::split::{by_slot, Split};

/// A call's path stays within this many bytes (Webdis's shipped `http_max_request_size` is
/// 64 KiB); a batch stops growing before it would pass it. The configuration is refused if a
/// single request could need more.
pub const MAX_CALL_BYTES: usize = crate::bounds::MAX_CALL_PATH_BYTES;

/// The period of each worker's timer ([`Engine::on_tick`]): a stalled call is seen at most
/// this long after `breaker.stall` when no request comes to see it first, while every worker
/// pays only 40 callbacks a second.
pub const TICK: Duration = Duration::from_millis(25);

/// Give-back calls one worker sends per tick at most (see [`Engine::on_tick`]).
const MAX_GIVE_BACK_CALLS: usize = 4;

/// What the engine needs from its host (Envoy through proxy-wasm, or a fake in tests).
pub trait Host {
    /// Unix time in nanoseconds.
    fn now_unix_ns(&self) -> Option<u128>;
    /// Starts an HTTP call to the bridge; its reply comes to [`Engine::on_reply`] with the
    /// returned token.
    fn dispatch(
        &mut self,
        bridge: &Bridge,
        request: &BridgeRequest,
        timeout: Duration,
    ) -> Result<u32, String>;
    /// Asks for [`Engine::on_wakeup`] soon, from the worker's root context. False if it cannot.
    fn wake(&mut self) -> bool;
    /// Lets the paused request `ctx` go on upstream. False if that stream is gone.
    fn resume(&mut self, ctx: u32) -> bool;
    /// Answers request `ctx` locally. False if that stream is gone.
    fn answer(&mut self, ctx: u32, response: LocalResponse) -> bool;
    /// Adds `n` to a counter.
    fn count_n(&mut self, counter: Counter, n: u64);
    /// Adds `n` to per-rule stat `stat` (numbered by [`RuleStats`]).
    fn count_rule(&mut self, stat: usize, n: u64);
    fn count(&mut self, counter: Counter) {
        self.count_n(counter, 1);
    }
    fn record(&mut self, histogram: Histogram, value: u64);
    /// Adds `delta` (possibly negative) to a gauge shared by the workers.
    fn gauge_add(&mut self, gauge: Gauge, delta: i64);
    /// The circuit breaker opened (`open`) or closed, and why; the host logs it.
    fn report_breaker(&mut self, open: bool, why: &str);
    /// How many times any worker of this Envoy saw Redis lose its scripts (a restart);
    /// `bump` counts one more first. None if the host cannot share it.
    fn redis_restarts(&mut self, bump: bool) -> Option<u64>;
    /// A bridge failure the failure policy handled; the host logs it (rate-limited).
    fn report_failure(&mut self, failure: &BridgeFailure);
}

/// What the host should do with the request headers it is processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    Pause,
}

/// A request waiting for a call, or in one.
#[derive(Debug)]
struct Waiting {
    ctx: u32,
    plan: Plan,
    arrived_ns: u128,
    /// Redis Cluster: the hash slot of every key of `plan`; a call takes one slot's requests.
    slot: Option<u16>,
    /// Redis Cluster: this is part `.1` of the request split `.0` (its other parts live on
    /// other slots); its outcome goes to the split, not to the stream.
    part: Option<(u64, usize)>,
    lease: LeaseAsk,
}

/// Whether a waiting request asks for a lease of its limits' units, of at most how many
/// requests' worth (the worker's estimate of what the identity will spend, `Leases::ask`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseAsk {
    No,
    /// The request, and further requests' worth of units for later ones.
    Asks(u64),
    /// No request: units for the next requests of a lease that runs low (`ctx` is 0).
    Prefetch(u64),
}

impl LeaseAsk {
    /// The requests' worth asked for, if a lease is asked for.
    fn requests(self) -> Option<u64> {
        match self {
            LeaseAsk::No => None,
            LeaseAsk::Asks(n) | LeaseAsk::Prefetch(n) => Some(n),
        }
    }
}

impl Waiting {
    fn deadline_ns(&self) -> u128 {
        self.arrived_ns.saturating_add(self.plan.timeout.as_nanos())
    }

    /// What its part of a reply may hold: a lease asked for is k requests' worth of each
    /// limit's cost, k × cost within the limit's `max_units` (see `lua/decide.lua`).
    fn shape(&self) -> RequestShape {
        let most_leased = match self.lease.requests() {
            None => 0,
            Some(requests) => self
                .plan
                .checks
                .iter()
                .filter(|c| c.cost > 0)
                .filter_map(|c| c.lease.map(|l| lease_units(l, c, requests) / c.cost))
                .min()
                .unwrap_or(1)
                .saturating_sub(1),
        };
        RequestShape {
            limits: self.plan.checks.len(),
            most_leased,
        }
    }
}

/// Redis Cluster: the hash slot of a plan's keys (the first's: the caller knows they share it).
fn slot_of(config: &Config, plan: &Plan) -> Option<u16> {
    config
        .redis_cluster
        .then(|| plan.checks.first().map(|c| key_slot(c.key.as_bytes())))
        .flatten()
}

/// The bytes of a decision call's path besides its requests' (see [`call_bytes`]):
/// `/EVALSHA/<sha>/<keys>` and the clock, deadline, request and budget counts, each number at
/// its longest (20 digits).
fn call_fixed_bytes(config: &Config) -> usize {
    "/EVALSHA/".len() + config.script_sha.len() + 5 * (1 + 20)
}

/// A call giving `refunds` back, sent at `now` with `timeout`. Its clock must be no earlier
/// than any decision on these keys made before it reaches Redis, and Redis must drop it past
/// that clock: the clock (and deadline) is `now` plus the timeout plus the clock skew allowed
/// between replicas. A later clock only gives back less (the refill up to it is counted as
/// the bucket's), never more; with the skew alone most give-backs came too late to count.
fn refund_request(
    config: &Config,
    refunds: &[Refund],
    timeout: Duration,
    now: u128,
) -> BridgeRequest {
    let clock = now
        .saturating_add(timeout.as_nanos())
        .saturating_add(config.clock_skew.as_nanos());
    let call = DecideCall::refund(clock, clock / 1_000_000, refunds);
    BridgeRequest::evalsha(&config.script_sha, &call)
}

/// Redis Cluster: whether a plan's keys live on more than one slot (it cannot go as one call).
fn spans_slots(config: &Config, plan: &Plan) -> bool {
    if !config.redis_cluster {
        return false;
    }
    let mut slots = plan.checks.iter().map(|c| key_slot(c.key.as_bytes()));
    let first = slots.next();
    slots.any(|s| Some(s) != first)
}

/// When a call was sent: the clock its decisions were made with, and the Redis restarts this
/// worker knew of (a refusal from before the latest restart is not remembered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sent {
    at_ns: u128,
    restarts: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Waiting for the `EVALSHA` reply; `reloaded` once the script was loaded for this call.
    Deciding { reloaded: bool },
    /// Redis had lost the script; waiting for `SCRIPT LOAD`, then the same call goes again.
    LoadingScript,
}

#[derive(Debug)]
struct Call {
    token: u32,
    /// When this stage of the call was dispatched (Unix ns), for the stall check.
    dispatched_ns: u128,
    stage: Stage,
    /// The decision call, kept to send again after a script load.
    eval: BridgeRequest,
    members: Vec<Waiting>,
    /// The clock the script decides with (Unix ns): the instant the call was first sent; and
    /// the restarts known when it was last sent.
    sent: Sent,
    /// The request context that made the call, if not the root: its reply comes there, and
    /// is lost if that stream ends first.
    owner: Option<u32>,
}

enum Outcome {
    Decided(Decision),
    Failed(BridgeFailure),
}

/// What the one place that maps outcomes decided for a request.
enum Conclusion {
    Resume(Headers),
    Answer(LocalResponse),
}

/// The circuit breaker of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BreakerState {
    /// Calls go out; `failures` in a row failed.
    Closed { failures: u32 },
    /// No call but one probe per interval.
    Open {
        since_ns: u128,
        next_probe_ns: u128,
        probe: Option<u32>,
    },
}

impl Default for BreakerState {
    fn default() -> Self {
        BreakerState::Closed { failures: 0 }
    }
}

/// The request whose own callback is running: its verdict is returned, not resumed.
#[derive(Debug, Clone, Copy)]
struct Current {
    ctx: u32,
    verdict: Option<Verdict>,
}

#[derive(Debug, Default)]
pub struct Engine {
    waiting: VecDeque<Waiting>,
    in_flight: Vec<Call>,
    wake_pending: bool,
    deny_cache: DenyCache,
    /// Rate-limit headers for allowed requests, until their response headers pass.
    headers: HashMap<u32, Headers>,
    current: Option<Current>,
    /// Deny-cache refusals not yet added to the stats (`ratelimit_denied` and
    /// `ratelimit_deny_cache_hits`).
    uncounted_hits: u64,
    breaker: BreakerState,
    /// The state of the `local` failure mode.
    local: LocalLimits,
    /// Redis restarts (seen by any worker) this worker's deny cache is up to date with: a
    /// refusal outlives a restart another worker noticed by one tick at most.
    restarts_seen: u64,
    rule_stats: RuleStats,
    /// Per-rule counts not yet added to the stats (handed over with the deny-cache hits).
    pending: PendingCounts,
    /// Redis Cluster: requests decided in parts, one per slot, by number.
    splits: HashMap<u64, Split>,
    next_split: u64,
    /// Counts requests, so that sharded limits are spent from each shard in turn.
    turn: u64,
    leases: Leases,
    /// Requests allowed from leases, not yet added to the stats.
    uncounted_lease_hits: u64,
    /// Recent identities' Redis keys (bounded), for this engine's configuration.
    memo: PlanMemo,
}

impl Engine {
    /// A new engine for `config` (a new configuration starts with an empty deny cache).
    pub fn new(config: &Config) -> Self {
        let rule_stats = RuleStats::new(config);
        Engine {
            deny_cache: DenyCache::new(config.deny_cache_entries),
            pending: PendingCounts::new(rule_stats.len()),
            rule_stats,
            ..Default::default()
        }
    }

    /// Requests waiting for a call, and calls in flight (for tests and logs).
    pub fn load(&self) -> (usize, usize) {
        (self.waiting.len(), self.in_flight.len())
    }

    /// Request headers of `ctx` arrived (its own callback is running).
    pub fn on_request(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        ctx: u32,
        view: &dyn RequestView,
    ) -> Verdict {
        self.current = Some(Current { ctx, verdict: None });
        self.admit(config, host, ctx, view);
        let verdict = self.current.take().and_then(|c| c.verdict);
        verdict.unwrap_or(Verdict::Pause)
    }

    fn admit(&mut self, config: &Config, host: &mut impl Host, ctx: u32, view: &dyn RequestView) {
        self.turn = self.turn.wrapping_add(1);
        let plan = match plan_memo(config, view, self.turn, &mut self.memo) {
            Ok(plan) => plan,
            Err(bad) => {
                host.count(Counter::BadRequests);
                self.deliver(
                    host,
                    ctx,
                    Conclusion::Answer(response::bad_request(&bad.0)),
                    (0, 0),
                );
                return;
            }
        };
        // Measurement only (feature `phase-plan-only`, built by `make bench` for its
        // `filter-plan-only` scenario, never shipped): the plan's cost alone, then continue.
        if cfg!(feature = "phase-plan-only") {
            std::hint::black_box(&plan); // the plan is made in full, not optimised away
            self.deliver(host, ctx, Conclusion::Resume(Headers::new()), (0, 0));
            return;
        }
        if plan.checks.is_empty() {
            self.deliver(host, ctx, Conclusion::Resume(Headers::new()), (0, 0));
            return;
        }
        let Some(now) = host.now_unix_ns() else {
            let conclusion = self.conclude(
                config,
                host,
                &plan,
                Outcome::Failed(BridgeFailure::Clock),
                None,
            );
            self.deliver(host, ctx, conclusion, (0, 0));
            return;
        };
        if let Some(decision) = self.spend_lease(&plan, now) {
            let headers = response::rate_limit_headers(config, &plan.checks, &decision);
            self.deliver(host, ctx, Conclusion::Resume(headers), (0, 0));
            if self.leases.runs_low(&plan, now) {
                self.prefetch(config, host, ctx, plan, now);
            }
            return;
        }
        if let Some(refusal) = self.cached_refusal(config, &plan, now) {
            self.deliver(host, ctx, Conclusion::Answer(refusal), (0, 0));
            return;
        }
        self.check_stall(config, host, now);
        if matches!(self.breaker, BreakerState::Open { .. }) {
            let outcome = Outcome::Failed(BridgeFailure::BreakerOpen);
            let conclusion = self.conclude(config, host, &plan, outcome, None);
            self.deliver(host, ctx, conclusion, (0, 0));
            return;
        }
        if config.redis_cluster {
            let groups = by_slot(&plan.checks);
            if groups.len() > 1 {
                self.admit_split(config, host, ctx, plan, now, groups);
                return;
            }
        }
        let slot = slot_of(config, &plan);
        let lease = if plan.leasable() && self.leases.may_ask(&plan) {
            self.leases.asking(&plan, true);
            LeaseAsk::Asks(self.leases.ask(&plan, now))
        } else {
            LeaseAsk::No
        };
        self.waiting.push_back(Waiting {
            ctx,
            plan,
            arrived_ns: now,
            slot,
            part: None,
            lease,
        });
        if self.in_flight.is_empty() && self.waiting.len() == 1 {
            // An idle worker: this request alone goes at once, from its own context (no hop
            // through the root). Only its own verdict rides on the call.
            self.dispatch_ready(config, host, Some(ctx));
        } else {
            self.dispatch_later(config, host, ctx);
        }
    }

    /// Redis Cluster: a request whose keys live on several slots waits as one part per slot.
    fn admit_split(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        ctx: u32,
        plan: Plan,
        now: u128,
        groups: Vec<(u16, Vec<usize>)>,
    ) {
        let id = self.next_split;
        self.next_split = self.next_split.wrapping_add(1);
        let (slots, parts): (Vec<u16>, Vec<Vec<usize>>) = groups.into_iter().unzip();
        let split = Split::new(ctx, plan, now, parts);
        for (part, slot) in slots.into_iter().enumerate() {
            self.waiting.push_back(Waiting {
                ctx,
                plan: split.part_plan(part),
                arrived_ns: now,
                slot: Some(slot),
                part: Some((id, part)),
                lease: LeaseAsk::No,
            });
        }
        self.splits.insert(id, split);
        self.dispatch_later(config, host, ctx);
    }

    /// Where a waiting request's outcome goes: its stream, or (one part of a split request)
    /// the split, which concludes once every part is in.
    fn settle(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        member: Waiting,
        mut outcome: Outcome,
        sent: Option<Sent>,
        now: u128,
    ) {
        let sent_ns = sent.map_or(0, |s| s.at_ns);
        let prefetch = matches!(member.lease, LeaseAsk::Prefetch(_));
        if member.lease != LeaseAsk::No {
            self.leases.asking(&member.plan, false);
            if let Outcome::Decided(decision) = &mut outcome {
                let requests = decision.leased + u64::from(prefetch);
                if decision.allowed && requests > 0 {
                    host.count(Counter::LeaseGrants);
                    let skew = config.clock_skew.as_nanos();
                    self.leases
                        .grant(&member.plan, decision, requests, sent_ns, skew);
                }
            }
            if prefetch {
                // No stream to answer; a refusal still tells the next prefetch not to go.
                if let Outcome::Decided(decision) = &outcome {
                    if !decision.allowed {
                        self.remember_refusal(&member.plan, decision, sent);
                    }
                }
                return;
            }
        }
        let Some((id, part)) = member.part else {
            let conclusion = self.conclude(config, host, &member.plan, outcome, sent);
            self.deliver(host, member.ctx, conclusion, (member.arrived_ns, now));
            return;
        };
        let Some(split) = self.splits.get_mut(&id) else {
            return; // its stream is gone
        };
        let result = match outcome {
            Outcome::Decided(decision) => Ok(decision),
            Outcome::Failed(failure) => Err(failure),
        };
        split.stale |= sent.is_some_and(|s| s.restarts != self.restarts_seen);
        if !split.record(part, result, sent_ns) {
            return;
        }
        let Some(split) = self.splits.remove(&id) else {
            return;
        };
        let (plan, result, at) = split.outcome();
        let outcome = match result {
            Ok(decision) => Outcome::Decided(decision),
            Err(failure) => Outcome::Failed(failure),
        };
        let sent = Sent {
            at_ns: at,
            restarts: if split.stale {
                u64::MAX
            } else {
                self.restarts_seen
            },
        };
        let conclusion = self.conclude(config, host, &plan, outcome, Some(sent));
        if matches!(conclusion, Conclusion::Answer(_)) {
            self.refund(config, host, &split, now);
        }
        self.deliver(host, split.ctx, conclusion, (split.arrived_ns, now));
    }

    /// Gives back what the parts of a request that is not let through charged: one call per
    /// slot, whose reply is not waited for (a lost refund leaves units spent, never extra).
    fn refund(&mut self, config: &Config, host: &mut impl Host, split: &Split, now: u128) {
        for refunds in split.refunds() {
            for refund in &refunds {
                self.deny_cache.forget(&refund.check.key);
            }
            let request = refund_request(config, &refunds, split.plan.timeout, now);
            host.count(Counter::Refunds);
            if let Err(why) = host.dispatch(&config.bridge, &request, split.plan.timeout) {
                host.report_failure(&BridgeFailure::Dispatch(why));
            }
        }
    }

    /// Asks the root to send what waits (once), when a call slot is free.
    fn dispatch_later(&mut self, config: &Config, host: &mut impl Host, ctx: u32) {
        if self.waiting.is_empty()
            || self.in_flight.len() >= config.batch.max_in_flight
            || self.wake_pending
        {
            return;
        }
        if host.wake() {
            self.wake_pending = true;
        } else {
            // No way to reach the root: send from here rather than not at all.
            self.dispatch_ready(config, host, Some(ctx));
        }
    }

    /// The wake-up asked for with [`Host::wake`] (the root context is running).
    pub fn on_wakeup(&mut self, config: &Config, host: &mut impl Host) {
        self.wake_pending = false;
        self.flush_counts(host);
        self.dispatch_ready(config, host, None);
    }

    /// A call's reply (or its timeout) arrived, in the root context (`at` None) or in the
    /// request context that made the call.
    pub fn on_reply(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        at: Option<u32>,
        token: u32,
        reply: BridgeReply<'_>,
    ) {
        if let BreakerState::Open {
            probe: Some(probe), ..
        } = self.breaker
        {
            if probe == token {
                self.on_probe_reply(host, reply);
                return;
            }
        }
        let Some(i) = self.in_flight.iter().position(|c| c.token == token) else {
            return;
        };
        let call = self.in_flight.swap_remove(i);
        self.flush_counts(host);
        let now = host.now_unix_ns().unwrap_or(call.sent.at_ns);
        match call.stage {
            Stage::Deciding { reloaded } => {
                let shape: Vec<RequestShape> = call.members.iter().map(Waiting::shape).collect();
                match parse_batch_reply(reply, &shape) {
                    Ok(EvalOutcome::Decided(results)) => {
                        self.note_success();
                        for (member, result) in call.members.into_iter().zip(results) {
                            let outcome = match result {
                                Ok(decision) => Outcome::Decided(decision),
                                Err(failure) => Outcome::Failed(failure),
                            };
                            self.settle(config, host, member, outcome, Some(call.sent), now);
                        }
                    }
                    Ok(EvalOutcome::NoScript) if !reloaded => {
                        self.note_success();
                        // Redis restarted: what it refused before may fit again, here and
                        // (at their next tick) in the other workers. (Leases stay: they were
                        // charged, and the restart forgot far more than they hold; a fresh
                        // Redis answers NOSCRIPT too, so dropping them would lose the first.)
                        if let Some(n) = host.redis_restarts(true) {
                            self.restarts_seen = n;
                        }
                        self.reset_deny_cache(host);
                        let load = Call {
                            stage: Stage::LoadingScript,
                            ..call
                        };
                        self.send(config, host, load, now);
                    }
                    Ok(EvalOutcome::NoScript) => {
                        self.fail_call(config, host, call.members, BridgeFailure::NoScript, now)
                    }
                    Err(failure) => self.fail_call(config, host, call.members, failure, now),
                }
            }
            Stage::LoadingScript => match parse_script_load_reply(reply, &config.script_sha) {
                Ok(()) => {
                    self.note_success();
                    host.count(Counter::ScriptLoads);
                    let retry = Call {
                        stage: Stage::Deciding { reloaded: true },
                        ..call
                    };
                    self.send(config, host, retry, now);
                }
                Err(failure) => self.fail_call(config, host, call.members, failure, now),
            },
        }
        match at {
            None => self.dispatch_ready(config, host, None),
            Some(ctx) => self.dispatch_later(config, host, ctx),
        }
    }

    /// The worker's timer (every [`TICK`]), in the root context: sees a stalled call, sends
    /// the breaker's probe, learns of Redis restarts other workers saw.
    pub fn on_tick(&mut self, config: &Config, host: &mut impl Host) {
        self.flush_counts(host);
        if let Some(now) = host.now_unix_ns() {
            self.check_stall(config, host, now);
            self.probe_if_due(config, host, now);
            self.give_back(config, host, now);
        }
        if let Some(n) = host.redis_restarts(false) {
            if n != self.restarts_seen {
                self.restarts_seen = n;
                self.reset_deny_cache(host);
            }
        }
    }

    /// Adds the deny-cache refusals answered and the per-rule counts taken since the last
    /// time to the stats.
    fn flush_counts(&mut self, host: &mut impl Host) {
        let n = std::mem::take(&mut self.uncounted_hits);
        if n > 0 {
            host.count_n(Counter::Denied, n);
            host.count_n(Counter::DenyCacheHits, n);
        }
        let n = std::mem::take(&mut self.uncounted_lease_hits);
        if n > 0 {
            host.count_n(Counter::Allowed, n);
            host.count_n(Counter::LeaseHits, n);
        }
        self.pending.drain(|stat, n| host.count_rule(stat, n));
    }

    /// Counts `event` on a limit of a rule (handed to the stats later, see `flush_counts`).
    fn count_rule(&mut self, check: &LimitCheck, event: RuleEvent) {
        self.pending
            .add(self.rule_stats.event(check.rule, check.limit, event));
    }

    /// Forgets every refusal (Redis lost the state they came from).
    fn reset_deny_cache(&mut self, host: &mut impl Host) {
        if !self.deny_cache.is_empty() {
            self.deny_cache.clear();
            host.count(Counter::DenyCacheResets);
        }
    }

    /// Response headers of `ctx` are on their way: the rate-limit headers it was allowed with.
    pub fn take_headers(&mut self, ctx: u32) -> Option<Headers> {
        self.headers.remove(&ctx)
    }

    /// The stream of `ctx` ended: it no longer waits, and its headers are dropped. A call it
    /// is part of still decides the others (its own verdict goes nowhere) — unless the call
    /// was made from its context: that reply is lost with the stream, so the call's slot is
    /// freed at once and any other request on it fails by policy.
    pub fn forget(&mut self, config: &Config, host: &mut impl Host, ctx: u32) {
        let leases = &mut self.leases;
        self.waiting.retain(|w| {
            let gone = w.ctx == ctx && !matches!(w.lease, LeaseAsk::Prefetch(_));
            if gone && w.lease != LeaseAsk::No {
                leases.asking(&w.plan, false);
            }
            !gone
        });
        self.splits.retain(|_, s| s.ctx != ctx);
        self.headers.remove(&ctx);
        while let Some(i) = self.in_flight.iter().position(|c| c.owner == Some(ctx)) {
            let call = self.in_flight.swap_remove(i);
            let others: Vec<Waiting> = call.members.into_iter().filter(|m| m.ctx != ctx).collect();
            let now = host.now_unix_ns().unwrap_or(0);
            self.fail_all(config, host, others, BridgeFailure::Orphaned, now);
        }
        if !self.waiting.is_empty()
            && self.in_flight.len() < config.batch.max_in_flight
            && !self.wake_pending
            && host.wake()
        {
            self.wake_pending = true;
        }
    }

    /// Sends batches while a call slot is free and requests wait; `from` is the request
    /// context running, if not the root.
    fn dispatch_ready(&mut self, config: &Config, host: &mut impl Host, from: Option<u32>) {
        while self.in_flight.len() < config.batch.max_in_flight && !self.waiting.is_empty() {
            let Some(now) = host.now_unix_ns() else {
                let members: Vec<Waiting> = self.waiting.drain(..).collect();
                self.fail_all(config, host, members, BridgeFailure::Clock, 0);
                return;
            };
            if from.is_some() && !self.in_flight.is_empty() {
                // One call from a request context at most: the root sends the rest.
                break;
            }
            let members = self.next_batch(config, host, now);
            if members.is_empty() {
                continue;
            }
            let clock = match config.clock {
                Clock::Proxy => now.to_string(),
                Clock::Redis => "redis".to_string(),
            };
            // Redis charges nothing once the soonest of these requests has given up (plus the
            // clock skew allowed): their verdict is then the failure policy's.
            let deadline_ns = members
                .iter()
                .map(Waiting::deadline_ns)
                .min()
                .unwrap_or(now);
            let deadline_ms = deadline_ns.saturating_add(config.clock_skew.as_nanos()) / 1_000_000;
            let call = DecideCall::leasing(
                &clock,
                deadline_ms,
                members
                    .iter()
                    .map(|m| (m.plan.checks.as_slice(), m.lease.requests())),
            );
            let call = Call {
                token: 0,
                dispatched_ns: now,
                stage: Stage::Deciding { reloaded: false },
                eval: BridgeRequest::evalsha(&config.script_sha, &call),
                members,
                sent: Sent {
                    at_ns: now,
                    restarts: self.restarts_seen,
                },
                owner: from,
            };
            host.count(Counter::BridgeCalls);
            host.record(Histogram::BatchSize, call.members.len() as u64);
            self.send(config, host, call, now);
        }
    }

    /// Takes the next batch from the queue, in arrival order: at most `batch.max_requests`,
    /// within [`MAX_CALL_BYTES`]. Requests past their deadline fail by policy, and requests
    /// the deny cache now refuses (a reply that came while they waited) are answered.
    /// Redis Cluster: the batch takes only requests of the first waiting request's slot (the
    /// others keep their place in the queue).
    fn next_batch(&mut self, config: &Config, host: &mut impl Host, now: u128) -> Vec<Waiting> {
        let mut members = Vec::new();
        let mut bytes = call_fixed_bytes(config);
        let slot = self.waiting.front().and_then(|w| w.slot);
        let mut at = 0;
        while members.len() < config.batch.max_requests {
            let Some(next) = self.waiting.get(at) else {
                break;
            };
            if next.slot != slot {
                at += 1;
                continue;
            }
            let size = call_bytes(&next.plan.checks);
            if !members.is_empty() && bytes + size > MAX_CALL_BYTES {
                break;
            }
            let Some(w) = self.waiting.remove(at) else {
                break;
            };
            if now >= w.deadline_ns() {
                let outcome = Outcome::Failed(BridgeFailure::Expired);
                self.settle(config, host, w, outcome, None, now);
            } else if w.part.is_some() {
                // A part: its request was checked against the deny cache when it came.
                bytes += size;
                members.push(w);
            } else if matches!(w.lease, LeaseAsk::Prefetch(_)) {
                // Units for requests that may not come: not worth a call Redis would refuse.
                if self.refused_by_cache(&w.plan, now) {
                    self.drop_ask(&w);
                } else {
                    bytes += size;
                    members.push(w);
                }
            } else if let Some(decision) = self.spend_lease(&w.plan, now) {
                // A lease that came while it waited (a prefetch's) serves it.
                self.drop_ask(&w);
                let headers = response::rate_limit_headers(config, &w.plan.checks, &decision);
                let conclusion = Conclusion::Resume(headers);
                self.deliver(host, w.ctx, conclusion, (w.arrived_ns, now));
            } else if let Some(refusal) = self.cached_refusal(config, &w.plan, now) {
                self.drop_ask(&w);
                self.deliver(
                    host,
                    w.ctx,
                    Conclusion::Answer(refusal),
                    (w.arrived_ns, now),
                );
            } else {
                bytes += size;
                members.push(w);
            }
        }
        members
    }

    /// Sends `call` in its stage: the decision, or the script load before it. The timeout is
    /// what is left of its members' soonest deadline.
    fn send(&mut self, config: &Config, host: &mut impl Host, mut call: Call, now: u128) {
        let deadline = call
            .members
            .iter()
            .map(Waiting::deadline_ns)
            .min()
            .unwrap_or(now);
        if deadline <= now {
            self.fail_all(config, host, call.members, BridgeFailure::Expired, now);
            return;
        }
        let timeout = Duration::from_nanos(u64::try_from(deadline - now).unwrap_or(u64::MAX))
            .max(Duration::from_millis(1));
        let script_load;
        let request = match call.stage {
            Stage::Deciding { .. } => &call.eval,
            Stage::LoadingScript => {
                script_load = BridgeRequest::script_load();
                &script_load
            }
        };
        match host.dispatch(&config.bridge, request, timeout) {
            Ok(token) => {
                call.token = token;
                call.dispatched_ns = now;
                // A reply to a call sent again after a restart decides on the new state.
                call.sent.restarts = self.restarts_seen;
                self.in_flight.push(call);
            }
            Err(why) => {
                let failure = BridgeFailure::Dispatch(why);
                self.fail_call(config, host, call.members, failure, now)
            }
        }
    }

    /// A call failed: its requests follow their policy, and the breaker counts it.
    fn fail_call(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        members: Vec<Waiting>,
        failure: BridgeFailure,
        now: u128,
    ) {
        self.fail_all(config, host, members, failure.clone(), now);
        let (Some(breaker), BreakerState::Closed { failures }) = (config.breaker, self.breaker)
        else {
            return;
        };
        let failures = failures + 1;
        self.breaker = BreakerState::Closed { failures };
        if failures >= breaker.failures {
            let why = format!("{failures} calls in a row failed, the last: {failure}");
            self.trip(config, host, now, &why);
        }
    }

    /// The bridge answered a call: the run of failures is over.
    fn note_success(&mut self) {
        if let BreakerState::Closed { .. } = self.breaker {
            self.breaker = BreakerState::Closed { failures: 0 };
        }
    }

    /// Opens the breaker if a call has been in flight for `breaker.stall`.
    fn check_stall(&mut self, config: &Config, host: &mut impl Host, now: u128) {
        let (Some(breaker), BreakerState::Closed { .. }) = (config.breaker, self.breaker) else {
            return;
        };
        let Some(oldest) = self.in_flight.iter().map(|c| c.dispatched_ns).min() else {
            return;
        };
        let age = now.saturating_sub(oldest);
        if age >= breaker.stall.as_nanos() {
            let why = format!("a call has been in flight for {} ms", age / 1_000_000);
            self.trip(config, host, now, &why);
        }
    }

    /// Opens the breaker: every request waiting for the bridge, or in a call in flight, is
    /// decided now by its failure policy; until a probe is answered none waits for a call.
    /// (Replies to the abandoned calls that still come are ignored.)
    fn trip(&mut self, config: &Config, host: &mut impl Host, now: u128, why: &str) {
        let interval = config
            .breaker
            .map(|b| b.probe_interval.as_nanos())
            .unwrap_or(0);
        self.breaker = BreakerState::Open {
            since_ns: now,
            next_probe_ns: now.saturating_add(interval),
            probe: None,
        };
        host.count(Counter::BreakerTrips);
        host.gauge_add(Gauge::BreakerOpen, 1);
        host.report_breaker(true, why);
        let mut members: Vec<Waiting> = self.waiting.drain(..).collect();
        for call in self.in_flight.drain(..) {
            members.extend(call.members);
        }
        self.fail_all(config, host, members, BridgeFailure::BreakerOpen, now);
    }

    /// While open, one probe per `breaker.probe_interval`: an empty decision call, which
    /// answers only if Webdis, Redis and the script all do.
    fn probe_if_due(&mut self, config: &Config, host: &mut impl Host, now: u128) {
        let (
            Some(breaker),
            BreakerState::Open {
                since_ns,
                next_probe_ns,
                probe: None,
            },
        ) = (config.breaker, self.breaker)
        else {
            return;
        };
        if now < next_probe_ns {
            return;
        }
        let deadline_ms =
            (now + breaker.probe_interval.as_nanos() + config.clock_skew.as_nanos()) / 1_000_000;
        let call = DecideCall::new(&now.to_string(), deadline_ms, std::iter::empty());
        let request = BridgeRequest::evalsha(&config.script_sha, &call);
        let probe = host
            .dispatch(&config.bridge, &request, breaker.probe_interval)
            .ok();
        self.breaker = BreakerState::Open {
            since_ns,
            next_probe_ns: now.saturating_add(breaker.probe_interval.as_nanos()),
            probe,
        };
    }

    fn on_probe_reply(&mut self, host: &mut impl Host, reply: BridgeReply<'_>) {
        let BreakerState::Open {
            since_ns,
            next_probe_ns,
            ..
        } = self.breaker
        else {
            return;
        };
        match parse_eval_reply(reply, &[]) {
            // Answered (a missing script is the next call's to load): the bridge is back.
            Ok(_) => {
                self.breaker = BreakerState::Closed { failures: 0 };
                host.gauge_add(Gauge::BreakerOpen, -1);
                let now = host.now_unix_ns().unwrap_or(since_ns);
                let why = format!(
                    "a probe was answered after {} ms open",
                    now.saturating_sub(since_ns) / 1_000_000
                );
                host.report_breaker(false, &why);
            }
            Err(_) => {
                self.breaker = BreakerState::Open {
                    since_ns,
                    next_probe_ns,
                    probe: None,
                };
            }
        }
    }

    fn fail_all(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        members: Vec<Waiting>,
        failure: BridgeFailure,
        now: u128,
    ) {
        for member in members {
            let outcome = Outcome::Failed(failure.clone());
            self.settle(config, host, member, outcome, None, now);
        }
    }

    /// A waiting request that asked for a lease leaves without a call: its keys may ask again.
    fn drop_ask(&mut self, w: &Waiting) {
        if w.lease != LeaseAsk::No {
            self.leases.asking(&w.plan, false);
        }
    }

    /// Spends leased units on a request of `plan` if this worker holds enough (counted).
    fn spend_lease(&mut self, plan: &Plan, now: u128) -> Option<Decision> {
        if !plan.leasable() || self.leases.is_empty() {
            return None;
        }
        let decision = self.leases.spend(plan, now)?;
        self.uncounted_lease_hits += 1;
        for check in &plan.checks {
            self.count_rule(check, RuleEvent::Allowed);
        }
        Some(decision)
    }

    /// Whether the deny cache knows an enforced limit of `plan` to refuse it now (nothing
    /// counted).
    fn refused_by_cache(&self, plan: &Plan, now: u128) -> bool {
        plan.checks
            .iter()
            .any(|c| !c.shadow && self.deny_cache.covering(&c.key, c.cost, now).is_some())
    }

    /// Asks for the next lease of `plan`'s limits before the current one runs out, so the
    /// requests after it do not wait at the boundary. Sent like a request, from the root.
    /// Redis Cluster: only a plan on one slot (a call holds one slot's keys); the keys of a
    /// plan on several slots are refilled by their own single-slot requests.
    fn prefetch(&mut self, config: &Config, host: &mut impl Host, ctx: u32, plan: Plan, now: u128) {
        if matches!(self.breaker, BreakerState::Open { .. }) || spans_slots(config, &plan) {
            return;
        }
        host.count(Counter::LeasePrefetches);
        self.leases.asking(&plan, true);
        self.waiting.push_back(Waiting {
            ctx: 0,
            slot: slot_of(config, &plan),
            lease: LeaseAsk::Prefetch(self.leases.ask(&plan, now)),
            plan,
            arrived_ns: now,
            part: None,
        });
        self.dispatch_later(config, host, ctx);
    }

    /// Gives back what leases held past their end, in as few calls as fit (one per slot on a
    /// Redis Cluster), without waiting for the replies: a lost give-back leaves units spent,
    /// never extra. Not while the breaker is open (the calls would fail): the units wait for
    /// the first tick after it closes (the script gives back only what each charge still holds
    /// back, however late).
    fn give_back(&mut self, config: &Config, host: &mut impl Host, now: u128) {
        self.leases.expire(now);
        if matches!(self.breaker, BreakerState::Open { .. }) {
            return;
        }
        let returns = self.leases.take_returns();
        if returns.is_empty() {
            return;
        }
        let mut returns: Vec<(Option<u16>, Refund)> = returns
            .into_iter()
            .map(|r| {
                let slot = config
                    .redis_cluster
                    .then(|| key_slot(r.check.key.as_bytes()));
                (slot, r)
            })
            .collect();
        returns.sort_by_key(|(slot, _)| *slot);
        // One call per slot and per MAX_CALL_BYTES, at most MAX_GIVE_BACK_CALLS a tick: the
        // rest waits for the next tick (a Redis Cluster spreads keys over many slots).
        let mut calls: Vec<(usize, Vec<Refund>)> = Vec::new();
        let mut last_slot = None;
        let mut left = Vec::new();
        for (slot, refund) in returns {
            let size = call_bytes(std::slice::from_ref(&refund.check));
            let room = calls.len() < MAX_GIVE_BACK_CALLS;
            match calls.last_mut() {
                Some((bytes, group)) if last_slot == slot && *bytes + size <= MAX_CALL_BYTES => {
                    *bytes += size;
                    group.push(refund);
                }
                _ if room => {
                    calls.push((size, vec![refund]));
                    last_slot = slot;
                }
                _ => left.push(refund),
            }
        }
        self.leases.keep_returns(left);
        for (_, refunds) in calls {
            // As long as a decision on these keys may take (the longest of their rules').
            let timeout = refunds
                .iter()
                .filter_map(|r| config.rules.get(r.check.rule).map(|rule| rule.timeout))
                .max()
                .unwrap_or(config.clock_skew)
                .max(Duration::from_millis(1));
            for refund in &refunds {
                self.deny_cache.forget(&refund.check.key);
            }
            let units: u64 = refunds.iter().map(|r| r.check.cost).sum();
            host.count_n(Counter::LeaseUnitsReturned, units);
            let request = refund_request(config, &refunds, timeout, now);
            if let Err(why) = host.dispatch(&config.bridge, &request, timeout) {
                host.report_failure(&BridgeFailure::Dispatch(why));
            }
        }
    }

    /// A 429 from the deny cache, if an enforced limit of `plan` is known to refuse it now.
    fn cached_refusal(&mut self, config: &Config, plan: &Plan, now: u128) -> Option<LocalResponse> {
        if self.deny_cache.is_empty() {
            return None;
        }
        let mut checks: Vec<LimitCheck> = Vec::new();
        let mut limits: Vec<LimitResult> = Vec::new();
        for check in plan.checks.iter().filter(|c| !c.shadow) {
            if let Some(r) = self.deny_cache.covering(&check.key, check.cost, now) {
                let ms = |at: u128| at.saturating_sub(now) as f64 / 1e6;
                self.pending.add(
                    self.rule_stats
                        .event(check.rule, check.limit, RuleEvent::Denied),
                );
                checks.push(check.clone());
                limits.push(LimitResult {
                    allowed: false,
                    remaining: 0.0,
                    reset_ms: ms(r.reset_at_ns),
                    retry_ms: ms(r.until_ns),
                    over_budget: false,
                });
            }
        }
        if checks.is_empty() {
            return None;
        }
        // Counted in the stats at the next tick or reply: two host calls fewer on the hot path.
        self.uncounted_hits += 1;
        let decision = Decision {
            allowed: false,
            limits,
            leased: 0,
        };
        Some(response::denied(config, &checks, &decision))
    }

    /// The one place an outcome becomes "let it through" or "answer it". `sent` is when the
    /// call that decided it was sent (for the deny cache).
    fn conclude(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        plan: &Plan,
        outcome: Outcome,
        sent: Option<Sent>,
    ) -> Conclusion {
        match outcome {
            Outcome::Decided(decision) if decision.allowed => {
                host.count(Counter::Allowed);
                if decision.limits.iter().any(|l| !l.allowed) {
                    host.count(Counter::ShadowDenied);
                }
                self.count_decision(host, plan, &decision);
                Conclusion::Resume(response::rate_limit_headers(
                    config,
                    &plan.checks,
                    &decision,
                ))
            }
            Outcome::Decided(decision) => {
                host.count(Counter::Denied);
                self.count_decision(host, plan, &decision);
                self.remember_refusal(plan, &decision, sent);
                Conclusion::Answer(response::denied(config, &plan.checks, &decision))
            }
            Outcome::Failed(failure) => {
                // An open breaker was logged once when it opened; no call failed here.
                if failure != BridgeFailure::BreakerOpen {
                    host.count(Counter::BridgeErrors);
                    host.report_failure(&failure);
                }
                for check in &plan.checks {
                    let local = plan.failure_mode == FailureMode::Local
                        && config
                            .rules
                            .get(check.rule)
                            .is_some_and(|r| r.failure_mode == FailureMode::Local);
                    let event = match plan.failure_mode {
                        FailureMode::Closed => RuleEvent::FailedClosed,
                        _ if local => RuleEvent::FailedLocal,
                        _ => RuleEvent::FailedOpen,
                    };
                    self.count_rule(check, event);
                }
                match plan.failure_mode {
                    FailureMode::Local => self.decide_locally(config, host, plan),
                    FailureMode::Open => {
                        host.count(Counter::FailureModeOpen);
                        Conclusion::Resume(Headers::new())
                    }
                    FailureMode::Closed => {
                        host.count(Counter::FailureModeClosed);
                        Conclusion::Answer(response::unavailable())
                    }
                }
            }
        }
    }

    /// Puts what Redis refused in the deny cache, until the instant it would fit (from the
    /// clock the decision was made with). Not from a call sent before the latest Redis restart:
    /// its reply can come after the deny cache was reset and put back what the restart undid.
    fn remember_refusal(&mut self, plan: &Plan, decision: &Decision, sent: Option<Sent>) {
        let Some(sent) = sent.filter(|s| s.restarts == self.restarts_seen) else {
            return;
        };
        let sent_ns = sent.at_ns;
        for (check, result) in plan.checks.iter().zip(&decision.limits) {
            if !result.allowed && !check.shadow {
                let at = |ms: f64| sent_ns.saturating_add((ms * 1e6) as u128);
                let refusal = Refusal {
                    until_ns: at(result.retry_ms),
                    reset_at_ns: at(result.reset_ms),
                    cost: check.cost,
                };
                self.deny_cache.insert(&check.key, refusal);
            }
        }
    }

    /// Per-rule counts of a decision from Redis: what each limit did, and the rules whose key
    /// budget a new identity found used up (once per rule and request).
    fn count_decision(&mut self, host: &mut impl Host, plan: &Plan, decision: &Decision) {
        let mut budget_rule = None;
        for (check, result) in plan.checks.iter().zip(&decision.limits) {
            let event = match (result.allowed, check.shadow) {
                (true, _) => RuleEvent::Allowed,
                (false, true) => RuleEvent::ShadowDenied,
                (false, false) => RuleEvent::Denied,
            };
            // A limit that allowed a request another limit refused did nothing to count.
            if decision.allowed || event != RuleEvent::Allowed {
                self.count_rule(check, event);
            }
            if result.over_budget && budget_rule != Some(check.rule) {
                if budget_rule.is_none() {
                    host.count(Counter::KeyBudgetExceeded);
                }
                budget_rule = Some(check.rule);
                self.pending
                    .add(self.rule_stats.budget_exceeded(check.rule));
            }
        }
    }

    /// The `local` failure mode: the limits of the request's rules that fail locally, decided
    /// by this worker alone at `local_share` of each (the others let it through).
    fn decide_locally(&mut self, config: &Config, host: &mut impl Host, plan: &Plan) -> Conclusion {
        host.count(Counter::FailureModeLocal);
        let checks: Vec<LimitCheck> = plan
            .checks
            .iter()
            .filter(|c| {
                config
                    .rules
                    .get(c.rule)
                    .is_some_and(|r| r.failure_mode == FailureMode::Local)
            })
            .map(|c| scaled(c, config.local_share))
            .collect();
        let Some(now) = host.now_unix_ns() else {
            return Conclusion::Resume(Headers::new());
        };
        let decision = self.local.decide(&checks, now);
        if decision.allowed {
            host.count(Counter::Allowed);
            Conclusion::Resume(response::rate_limit_headers(config, &checks, &decision))
        } else {
            host.count(Counter::Denied);
            Conclusion::Answer(response::denied(config, &checks, &decision))
        }
    }

    /// Carries out a conclusion for `ctx`: returned as the verdict if its own callback is
    /// running, else resumed or answered through the host. `(arrived_ns, now)` gives the
    /// decision latency of requests that waited (arrived 0: not waited; the clock is read once
    /// per callback by the caller, not once per request).
    fn deliver(
        &mut self,
        host: &mut impl Host,
        ctx: u32,
        conclusion: Conclusion,
        (arrived_ns, now): (u128, u128),
    ) {
        let own = self.current.is_some_and(|c| c.ctx == ctx);
        let verdict = match conclusion {
            Conclusion::Answer(response) => {
                host.answer(ctx, response);
                Verdict::Pause
            }
            Conclusion::Resume(headers) => {
                if !headers.is_empty() {
                    self.headers.insert(ctx, headers);
                }
                Verdict::Continue
            }
        };
        if own {
            self.current = Some(Current {
                ctx,
                verdict: Some(verdict),
            });
            return;
        }
        if verdict == Verdict::Continue && !host.resume(ctx) {
            self.headers.remove(&ctx);
        }
        if arrived_ns > 0 && now >= arrived_ns {
            let ms = (now - arrived_ns).div_ceil(1_000_000);
            host.record(Histogram::DecisionMs, u64::try_from(ms).unwrap_or(u64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::tests::FakeRequest;
    use std::collections::HashSet;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const T0: u128 = 1_000_000_000_000;
    const MS: u128 = 1_000_000;

    /// A record of what the engine asks of its host, with a clock the test moves.
    #[derive(Default)]
    struct FakeHost {
        now: Option<u128>,
        refuse_dispatch: bool,
        cannot_wake: bool,
        gone: HashSet<u32>,
        next_token: u32,
        dispatched: Vec<(u32, BridgeRequest, Duration)>,
        wakes: usize,
        resumed: Vec<u32>,
        answered: Vec<(u32, LocalResponse)>,
        counters: Vec<Counter>,
        rule_counts: HashMap<usize, u64>,
        histograms: Vec<(Histogram, u64)>,
        failures: Vec<BridgeFailure>,
        restarts: u64,
        breaker_open: i64,
        breaker_log: Vec<(bool, String)>,
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
        ) -> Result<u32, String> {
            if self.refuse_dispatch {
                return Err("cluster not found".into());
            }
            self.next_token += 1;
            self.dispatched
                .push((self.next_token, request.clone(), timeout));
            Ok(self.next_token)
        }
        fn wake(&mut self) -> bool {
            self.wakes += 1;
            !self.cannot_wake
        }
        fn resume(&mut self, ctx: u32) -> bool {
            if self.gone.contains(&ctx) {
                return false;
            }
            self.resumed.push(ctx);
            true
        }
        fn answer(&mut self, ctx: u32, response: LocalResponse) -> bool {
            if self.gone.contains(&ctx) {
                return false;
            }
            self.answered.push((ctx, response));
            true
        }
        fn count_n(&mut self, counter: Counter, n: u64) {
            for _ in 0..n {
                self.counters.push(counter);
            }
        }
        fn count_rule(&mut self, stat: usize, n: u64) {
            *self.rule_counts.entry(stat).or_default() += n;
        }
        fn record(&mut self, histogram: Histogram, value: u64) {
            self.histograms.push((histogram, value));
        }
        fn report_failure(&mut self, failure: &BridgeFailure) {
            self.failures.push(failure.clone());
        }
        fn redis_restarts(&mut self, bump: bool) -> Option<u64> {
            self.restarts += u64::from(bump);
            Some(self.restarts)
        }
        fn gauge_add(&mut self, gauge: Gauge, delta: i64) {
            assert_eq!(gauge, Gauge::BreakerOpen);
            self.breaker_open += delta;
        }
        fn report_breaker(&mut self, open: bool, why: &str) {
            self.breaker_log.push((open, why.to_string()));
        }
    }

    impl FakeHost {
        fn new() -> Self {
            FakeHost {
                now: Some(T0),
                ..Default::default()
            }
        }
        fn count_of(&self, counter: Counter) -> usize {
            self.counters.iter().filter(|c| **c == counter).count()
        }
        /// The per-rule stats the host was given, by name (`ratelimit_rule.all.minute.denied`).
        fn rule_counts(&self, c: &Config) -> Vec<(String, u64)> {
            let names = RuleStats::names(c);
            let mut counts: Vec<(String, u64)> = self
                .rule_counts
                .iter()
                .map(|(i, n)| (names[*i].clone(), *n))
                .collect();
            counts.sort();
            counts
        }
        fn last_token(&self) -> u32 {
            self.dispatched.last().map(|d| d.0).unwrap_or(0)
        }
        /// The number of requests in the decision call `i` (its ARGV[2]).
        fn batch_size(&self, i: usize) -> usize {
            let path = &self.dispatched[i].1.path;
            let segments: Vec<&str> = path.split('/').collect();
            let keys: usize = segments[3].parse().unwrap();
            segments[4 + keys + 2].parse().unwrap()
        }
        fn statuses(&self) -> Vec<(u32, u16)> {
            self.answered.iter().map(|(c, r)| (*c, r.status)).collect()
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

    /// A config with `extra` top-level keys, a fresh engine for it, and a fake host.
    fn setup(extra: &str) -> (Config, Engine, FakeHost) {
        let c = config(extra);
        let e = Engine::new(&c);
        (c, e, FakeHost::new())
    }

    fn req(path: &str, key: &str) -> FakeRequest {
        FakeRequest::new("GET", path).with("x-api-key", key.as_bytes())
    }

    fn ok(body: &str) -> BridgeReply<'_> {
        BridgeReply {
            status: Some(200),
            body: body.as_bytes(),
        }
    }

    /// One request's part of a reply.
    #[derive(Clone, Copy)]
    enum R {
        /// Allowed, one limit, with this many left.
        Allow(u32),
        /// Refused, one limit, retry in this many ms.
        Refuse(u32),
        /// Allowed, then the shadow limit refused.
        AllowShadowRefused,
        Error,
    }

    fn reply(requests: &[R]) -> String {
        let mut items = vec![requests.len().to_string()];
        for r in requests {
            items.push(match r {
                R::Allow(left) => format!(r#"1,1,1,"{left}","6000","0""#),
                R::Refuse(retry) => format!(r#"0,1,0,"0.5","3000","{retry}""#),
                R::AllowShadowRefused => r#"1,2,1,"5","6000","0",0,"0","6000","3000""#.into(),
                R::Error => {
                    r#"-1,"WRONGTYPE Operation against a key holding the wrong kind of value""#
                        .into()
                }
            });
        }
        format!(r#"{{"EVALSHA":[{}]}}"#, items.join(","))
    }

    /// A request arrives, and the worker is woken (as Envoy would, right after) if this
    /// arrival asked for a wake-up.
    fn arrive(e: &mut Engine, c: &Config, h: &mut FakeHost, ctx: u32, r: &FakeRequest) -> Verdict {
        let wakes = h.wakes;
        let verdict = e.on_request(c, h, ctx, r);
        if h.wakes > wakes && !h.cannot_wake {
            e.on_wakeup(c, h);
        }
        verdict
    }

    #[test]
    fn a_lone_request_on_an_idle_worker_is_sent_at_once_from_its_own_context() {
        let (c, mut e, mut h) = setup("");
        assert_eq!(e.on_request(&c, &mut h, 7, &req("/", "k")), Verdict::Pause);
        assert_eq!(h.wakes, 0, "no hop through the root");
        assert_eq!(h.dispatched.len(), 1);
        let (token, call, timeout) = h.dispatched[0].clone();
        assert!(call.path.starts_with("/EVALSHA/"));
        assert!(
            call.path
                .contains("/1000000000000/1001150/1/0/1/1/token_bucket/"),
            "{}",
            call.path
        );
        assert_eq!(timeout, Duration::from_millis(150));
        h.now = Some(T0 + 2 * MS + 1);
        e.on_reply(&c, &mut h, Some(7), token, ok(&reply(&[R::Allow(9)])));
        assert_eq!(h.resumed, vec![7]);
        assert!(h.answered.is_empty());
        assert_eq!(
            e.take_headers(7),
            Some(vec![
                ("x-ratelimit-limit", "10".to_string()),
                ("x-ratelimit-remaining", "9".to_string()),
                ("x-ratelimit-reset", "6".to_string())
            ])
        );
        assert_eq!(e.take_headers(7), None, "headers go on once");
        assert_eq!(h.counters, vec![Counter::BridgeCalls, Counter::Allowed]);
        assert_eq!(
            h.histograms,
            vec![(Histogram::BatchSize, 1), (Histogram::DecisionMs, 3)]
        );
        assert_eq!(e.load(), (0, 0));
    }

    #[test]
    fn requests_waiting_behind_a_request_made_call_are_sent_by_the_root() {
        let (c, mut e, mut h) = setup("");
        e.on_request(&c, &mut h, 1, &req("/", "a"));
        e.on_request(&c, &mut h, 2, &req("/", "b"));
        assert_eq!(
            (h.dispatched.len(), h.wakes),
            (1, 0),
            "no slot free: it waits"
        );
        // The reply comes to request 1's context: 2 is not sent from there, the root is woken.
        e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Allow(9)])));
        assert_eq!((h.dispatched.len(), h.wakes), (1, 1));
        e.on_wakeup(&c, &mut h);
        assert_eq!(h.dispatched.len(), 2);
        assert_eq!(h.resumed, vec![1]);
    }

    #[test]
    fn a_request_made_call_whose_stream_ends_frees_its_slot_at_once() {
        let (c, mut e, mut h) = setup("");
        e.on_request(&c, &mut h, 1, &req("/", "a"));
        e.on_request(&c, &mut h, 2, &req("/", "b"));
        // Client 1 disconnects: its call's reply will never come (the SDK drops it).
        h.gone.insert(1);
        e.forget(&c, &mut h, 1);
        assert_eq!(e.load(), (1, 0));
        assert_eq!(h.wakes, 1, "the root sends what waits");
        e.on_wakeup(&c, &mut h);
        e.on_reply(&c, &mut h, None, 2, ok(&reply(&[R::Allow(9)])));
        assert_eq!(h.resumed, vec![2]);
        assert!(h.failures.is_empty());
    }

    #[test]
    fn requests_that_arrive_during_a_call_share_the_next_one_in_arrival_order() {
        let (c, mut e, mut h) = setup("");
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        for (ctx, key) in [(2, "b"), (3, "c"), (4, "b")] {
            assert_eq!(
                e.on_request(&c, &mut h, ctx, &req("/", key)),
                Verdict::Pause
            );
        }
        assert_eq!(h.wakes, 0, "a call is in flight: nothing to wake");
        assert_eq!(h.dispatched.len(), 1);
        assert_eq!(e.load(), (3, 1));
        e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Allow(9)])));
        assert_eq!(h.wakes, 1);
        e.on_wakeup(&c, &mut h);
        assert_eq!(h.dispatched.len(), 2, "the three waiting go in one call");
        assert_eq!(h.batch_size(1), 3);
        let path = &h.dispatched[1].1.path;
        let b = sha1_key("b");
        let c_key = sha1_key("c");
        assert!(
            path.find(&b).unwrap() < path.find(&c_key).unwrap(),
            "keys in arrival order, b once: {path}"
        );
        assert_eq!(path.matches(&b).count(), 1);
        e.on_reply(
            &c,
            &mut h,
            None,
            2,
            ok(&reply(&[R::Allow(9), R::Refuse(6000), R::Allow(8)])),
        );
        assert_eq!(h.resumed, vec![1, 2, 4]);
        assert_eq!(h.statuses(), vec![(3, 429)]);
        assert_eq!(
            h.histograms
                .iter()
                .filter(|(k, _)| *k == Histogram::BatchSize)
                .map(|(_, v)| *v)
                .collect::<Vec<_>>(),
            vec![1, 3]
        );
    }

    /// Deny-cache hits, counted in the stats or not yet.
    fn hits(e: &Engine, h: &FakeHost) -> usize {
        h.count_of(Counter::DenyCacheHits) + e.uncounted_hits as usize
    }

    fn sha1_key(identity: &str) -> String {
        crate::sha1::sha1_hex(identity.as_bytes())
    }

    #[test]
    fn batches_respect_max_requests_and_max_in_flight() {
        let (c, mut e, mut h) = setup(r#""batch": {"max_requests": 2, "max_in_flight": 2},"#);
        for ctx in 1..=8 {
            e.on_request(&c, &mut h, ctx, &req("/", &format!("k{ctx}")));
        }
        assert_eq!(h.dispatched.len(), 1, "the first went alone, at once");
        assert_eq!(h.wakes, 1, "a second slot is free: the root is woken once");
        e.on_wakeup(&c, &mut h);
        assert_eq!(h.dispatched.len(), 2, "two calls in flight at most");
        assert_eq!((h.batch_size(0), h.batch_size(1)), (1, 2));
        assert_eq!(e.load(), (5, 2));
        e.on_reply(&c, &mut h, None, 2, ok(&reply(&[R::Allow(1), R::Allow(1)])));
        assert_eq!(h.resumed, vec![2, 3]);
        assert_eq!(h.dispatched.len(), 3);
        assert_eq!(h.batch_size(2), 2);
        e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Allow(1)])));
        assert_eq!(h.dispatched.len(), 3, "not from a request's context");
        e.on_wakeup(&c, &mut h);
        assert_eq!(h.batch_size(3), 2);
        assert_eq!(e.load(), (1, 2));
    }

    /// Failing closed: request 1 alone, refused; then a batch of three: allowed, allowed with
    /// a shadow limit refusing (`/watch`), and a Redis error.
    fn mixed_batch() -> (Config, Engine, FakeHost) {
        let (c, mut e, mut h) = setup(r#""failure_mode": "closed","#);
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        for (ctx, path) in [(2, "/"), (3, "/watch"), (4, "/")] {
            e.on_request(&c, &mut h, ctx, &req(path, &format!("k{ctx}")));
        }
        e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(500)])));
        e.on_reply(
            &c,
            &mut h,
            None,
            2,
            ok(&reply(&[R::Allow(3), R::AllowShadowRefused, R::Error])),
        );
        (c, e, h)
    }

    #[test]
    fn per_rule_counts_say_what_each_limit_did_and_reach_the_stats_on_the_tick() {
        let (c, mut e, mut h) = mixed_batch();
        // Key "a" again: refused by the deny cache, without a call.
        arrive(&mut e, &c, &mut h, 5, &req("/", "a"));
        assert_eq!(h.statuses().last(), Some(&(5, 429)));
        let before = h.rule_counts(&c);
        e.on_tick(&c, &mut h);
        let count = |name: &str| (format!("ratelimit_rule.{name}"), 1);
        let mut want = vec![
            ("ratelimit_rule.all.minute.allowed".to_string(), 2),
            ("ratelimit_rule.all.minute.denied".to_string(), 2),
            count("all.minute.failed_closed"),
            count("watch.minute.shadow_denied"),
        ];
        want.sort();
        assert_eq!(h.rule_counts(&c), want);
        assert!(before.len() < want.len(), "the last ones wait for the tick");
        e.on_tick(&c, &mut h);
        assert_eq!(h.rule_counts(&c), want, "handed over once");
    }

    #[test]
    fn a_new_identity_over_its_key_budget_is_counted_once_per_rule() {
        let c = Config::parse(
            br#"{"rules": [{"name": "ip", "key": {"from": ["client_ip"]},
                "key_budget": {"new_keys": 100, "window": "1m", "over_budget": "deny"},
                "limits": [{"name": "second", "limit": 5, "window": "1s"},
                           {"name": "minute", "limit": 50, "window": "1m"}]}]}"#,
        )
        .unwrap();
        let mut e = Engine::new(&c);
        let mut h = FakeHost::new();
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        assert!(
            h.dispatched[0].1.path.contains("/1/1/"),
            "one budget in the call"
        );
        let over = r#"{"EVALSHA":[1,0,2,2,"0","30000","30000",2,"0","30000","30000"]}"#;
        e.on_reply(&c, &mut h, Some(1), 1, ok(over));
        assert_eq!(h.statuses(), vec![(1, 429)]);
        assert_eq!(h.count_of(Counter::KeyBudgetExceeded), 1);
        e.on_tick(&c, &mut h);
        assert_eq!(
            h.rule_counts(&c),
            vec![
                ("ratelimit_rule.ip.key_budget_exceeded".to_string(), 1),
                ("ratelimit_rule.ip.minute.denied".to_string(), 1),
                ("ratelimit_rule.ip.second.denied".to_string(), 1),
            ]
        );
    }

    /// The keys of a decision call (its `KEYS`), decoded.
    fn call_keys(request: &BridgeRequest) -> Vec<String> {
        let segments: Vec<&str> = request.path.split('/').collect();
        let n: usize = segments[3].parse().unwrap();
        let decode = |s: &str| {
            let bytes = s.as_bytes();
            let mut out = Vec::new();
            let mut i = 0;
            while i < bytes.len() {
                if bytes[i] == b'%' {
                    out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                    i += 3;
                } else {
                    out.push(bytes[i]);
                    i += 1;
                }
            }
            String::from_utf8(out).unwrap()
        };
        segments[4..4 + n].iter().map(|s| decode(s)).collect()
    }

    fn cluster_config() -> Config {
        Config::parse(
            br#"{"bridge": {"redis_cluster": true}, "rules": [
                {"name": "per_key", "key": {"from": ["header:x-api-key"], "when_missing": "skip"},
                 "limits": [{"name": "minute", "limit": 10, "window": "1m"}]},
                {"name": "per_ip", "match": {"path_prefix": "/both"}, "key": {"from": ["client_ip"]},
                 "limits": [{"name": "minute", "limit": 10, "window": "1m"}]}
            ]}"#,
        )
        .unwrap()
    }

    #[test]
    fn in_cluster_mode_a_call_holds_one_slots_requests() {
        let c = cluster_config();
        assert_eq!(
            c.batch.max_in_flight, 8,
            "several slots in flight by default"
        );
        let mut e = Engine::new(&c);
        let mut h = FakeHost::new();
        // Busy worker: 20 keys wait, on many slots.
        arrive(&mut e, &c, &mut h, 1, &req("/", "first"));
        for ctx in 2..22 {
            e.on_request(&c, &mut h, ctx, &req("/", &format!("k{}", ctx % 5)));
        }
        e.on_wakeup(&c, &mut h);
        assert!(h.dispatched.len() > 2);
        let mut requests = 0;
        for (_, call, _) in &h.dispatched {
            let slots: HashSet<u16> = call_keys(call)
                .iter()
                .map(|k| key_slot(k.as_bytes()))
                .collect();
            assert_eq!(slots.len(), 1, "{:?}", call_keys(call));
        }
        for i in 0..h.dispatched.len() {
            requests += h.batch_size(i);
        }
        assert!(requests <= 21);
    }

    #[test]
    fn in_cluster_mode_a_request_on_two_slots_is_all_or_nothing_through_a_refund() {
        let c = cluster_config();
        let mut e = Engine::new(&c);
        let mut h = FakeHost::new();
        // The API key and the client IP live on different slots: two parts, two calls.
        arrive(&mut e, &c, &mut h, 1, &req("/both", "k"));
        assert_eq!(h.dispatched.len(), 2);
        let (first, second) = (h.dispatched[0].0, h.dispatched[1].0);
        e.on_reply(&c, &mut h, None, first, ok(&reply(&[R::Allow(9)])));
        assert!(
            h.resumed.is_empty() && h.answered.is_empty(),
            "waits for both"
        );
        e.on_reply(&c, &mut h, None, second, ok(&reply(&[R::Refuse(500)])));
        assert_eq!(h.statuses(), vec![(1, 429)]);
        // The part that charged is given back, in a call of its own slot.
        assert_eq!(h.dispatched.len(), 3);
        let refund = &h.dispatched[2].1;
        assert!(
            refund.path.contains("/refund/1000000000000/9"),
            "{}",
            refund.path
        );
        assert_eq!(call_keys(refund), call_keys(&h.dispatched[0].1));
        assert_eq!(h.count_of(Counter::Refunds), 1);

        // Both parts allow: allowed, with the headers of both limits, nothing given back. (From
        // another address: the deny cache now refuses the first one without a call.)
        let mut other = req("/both", "k");
        other.source = Some("10.9.9.9:1234".into());
        arrive(&mut e, &c, &mut h, 2, &other);
        let tokens: Vec<u32> = h.dispatched[3..].iter().map(|d| d.0).collect();
        assert_eq!(tokens.len(), 2);
        e.on_reply(&c, &mut h, None, tokens[1], ok(&reply(&[R::Allow(8)])));
        e.on_reply(&c, &mut h, None, tokens[0], ok(&reply(&[R::Allow(8)])));
        assert_eq!(h.resumed, vec![2]);
        assert_eq!(e.take_headers(2).map(|h| h.len()), Some(3));
        assert_eq!(h.dispatched.len(), 5);
        assert_eq!(h.count_of(Counter::Refunds), 1);
        assert!(e.splits.is_empty());
    }

    #[test]
    fn in_cluster_mode_a_failed_part_follows_the_policy_and_a_gone_client_leaves_nothing() {
        let c = cluster_config();
        let mut e = Engine::new(&c);
        let mut h = FakeHost::new();
        arrive(&mut e, &c, &mut h, 1, &req("/both", "k"));
        let (first, second) = (h.dispatched[0].0, h.dispatched[1].0);
        e.on_reply(&c, &mut h, None, first, ok(&reply(&[R::Allow(9)])));
        e.on_reply(&c, &mut h, None, second, none());
        assert_eq!(
            h.resumed,
            vec![1],
            "fails open: what was charged stays charged"
        );
        assert_eq!(h.count_of(Counter::Refunds), 0);

        arrive(&mut e, &c, &mut h, 2, &req("/both", "k"));
        e.forget(&c, &mut h, 2);
        assert!(e.splits.is_empty());
        let token = h.dispatched[2].0;
        e.on_reply(&c, &mut h, None, token, ok(&reply(&[R::Allow(9)])));
        assert_eq!(h.resumed, vec![1]);
    }

    #[test]
    fn each_request_of_a_batch_gets_its_own_verdict_and_errors_stay_its_own() {
        let (_c, _e, h) = mixed_batch();
        assert_eq!(h.resumed, vec![2, 3]);
        assert_eq!(h.statuses(), vec![(1, 429), (4, 503)]);
        assert_eq!(h.count_of(Counter::ShadowDenied), 1);
        assert_eq!(h.count_of(Counter::FailureModeClosed), 1);
        assert_eq!(
            h.failures,
            vec![BridgeFailure::Redis(
                "WRONGTYPE Operation against a key holding the wrong kind of value".into()
            )]
        );
    }

    #[test]
    fn a_whole_call_failing_follows_each_request_policy() {
        let (c, mut e, mut h) = setup("");
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        e.on_reply(&c, &mut h, None, 1, none());
        assert_eq!(h.resumed, vec![1]);
        assert_eq!(h.failures, vec![BridgeFailure::NoResponse]);
        assert_eq!(
            h.counters,
            vec![
                Counter::BridgeCalls,
                Counter::BridgeErrors,
                Counter::FailureModeOpen
            ]
        );
        assert_eq!(e.take_headers(1), None);
    }

    #[test]
    fn replies_for_streams_that_are_gone_still_decide_the_others() {
        let (c, mut e, mut h) = setup("");
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        for ctx in 2..=4 {
            e.on_request(&c, &mut h, ctx, &req("/", &format!("k{ctx}")));
        }
        // 3 disconnects while waiting: it is not sent. 1 disconnects while its call is out.
        e.forget(&c, &mut h, 3);
        h.gone.insert(1);
        h.gone.insert(3);
        e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Allow(9)])));
        assert_eq!(h.resumed, Vec::<u32>::new());
        assert_eq!(e.take_headers(1), None, "nothing kept for a gone stream");
        assert_eq!(h.batch_size(1), 2, "3 left the queue");
        h.gone.insert(2);
        e.on_reply(&c, &mut h, None, 2, ok(&reply(&[R::Allow(9), R::Allow(8)])));
        assert_eq!(h.resumed, vec![4]);
        assert_eq!(h.count_of(Counter::Allowed), 3, "decided all the same");
        assert_eq!(e.load(), (0, 0));
    }

    #[test]
    fn noscript_loads_the_script_and_sends_the_same_call_once_more() {
        let (c, mut e, mut h) = setup("");
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        e.on_request(&c, &mut h, 2, &req("/", "b"));
        let noscript = r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#;
        e.on_reply(&c, &mut h, None, 1, ok(noscript));
        assert_eq!(h.dispatched.len(), 2, "the load takes the only slot");
        assert_eq!(h.dispatched[1].1, BridgeRequest::script_load());
        let loaded = format!(r#"{{"SCRIPT":"{}"}}"#, c.script_sha);
        e.on_reply(&c, &mut h, None, 2, ok(&loaded));
        assert_eq!(h.dispatched[2].1, h.dispatched[0].1, "the same call again");
        e.on_reply(&c, &mut h, None, 3, ok(noscript));
        assert_eq!(h.failures, vec![BridgeFailure::NoScript], "no loop");
        assert_eq!(h.resumed, vec![1]);
        assert_eq!(h.batch_size(3), 1, "then the next batch goes");
        assert_eq!(h.count_of(Counter::ScriptLoads), 1);
    }

    #[test]
    fn a_redis_restart_empties_the_deny_cache() {
        let (c, mut e, mut h) = setup("");
        arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
        e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(6000)])));
        arrive(&mut e, &c, &mut h, 2, &req("/", "other"));
        let noscript = r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#;
        e.on_reply(&c, &mut h, None, 2, ok(noscript));
        e.on_request(&c, &mut h, 3, &req("/", "k"));
        assert_eq!(hits(&e, &h), 0, "asked Redis again");
        assert_eq!(h.restarts, 1, "told the other workers");
        assert_eq!(h.count_of(Counter::DenyCacheResets), 1);
        e.on_tick(&c, &mut h);
        h.restarts += 1;
        e.on_tick(&c, &mut h);
        assert_eq!(h.count_of(Counter::DenyCacheResets), 1, "nothing to forget");
    }

    #[test]
    fn a_restart_another_worker_saw_empties_this_deny_cache() {
        let (c, mut e, mut h) = setup("");
        arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
        e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(60_000)])));
        e.on_request(&c, &mut h, 2, &req("/", "k"));
        assert_eq!(hits(&e, &h), 1);
        h.restarts += 1;
        e.on_request(&c, &mut h, 3, &req("/", "k"));
        assert_eq!(hits(&e, &h), 2, "not yet known here");
        e.on_tick(&c, &mut h);
        assert_eq!(h.count_of(Counter::DenyCacheResets), 1);
        e.on_request(&c, &mut h, 4, &req("/", "k"));
        assert_eq!(hits(&e, &h), 2, "forgotten: asked again");
        assert_eq!(e.load(), (0, 1), "sent to Redis");
        e.on_tick(&c, &mut h);
        assert_eq!(h.count_of(Counter::DenyCacheResets), 1, "once per restart");
    }

    #[test]
    fn refused_keys_are_answered_locally_until_they_could_fit() {
        let (c, mut e, mut h) = setup(r#""breaker": false,"#);
        arrive(&mut e, &c, &mut h, 1, &req("/", "abuser"));
        h.now = Some(T0 + MS);
        e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(6000)])));
        let first = h.answered[0].1.clone();
        assert_eq!(first.status, 429);
        // 1 s later: answered without a call, Retry-After counting down from 6 s.
        h.now = Some(T0 + 1000 * MS);
        assert_eq!(
            e.on_request(&c, &mut h, 2, &req("/", "abuser")),
            Verdict::Pause
        );
        assert_eq!(h.dispatched.len(), 1, "no call");
        let cached = &h.answered[1].1;
        assert_eq!(cached.status, 429);
        let header = |r: &LocalResponse, n: &str| {
            r.headers
                .iter()
                .find(|(name, _)| *name == n)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(header(&first, "retry-after").as_deref(), Some("6"));
        assert_eq!(header(cached, "retry-after").as_deref(), Some("5"));
        assert_eq!(
            header(cached, "x-ratelimit-remaining").as_deref(),
            Some("0")
        );
        assert_eq!(header(cached, "x-ratelimit-limit").as_deref(), Some("10"));
        assert_eq!(cached.body, first.body);
        assert_eq!(hits(&e, &h), 1);
        assert_eq!(
            h.count_of(Counter::Denied),
            1,
            "the cached one is counted later"
        );
        e.on_tick(&c, &mut h);
        assert_eq!(h.count_of(Counter::Denied), 2);
        assert_eq!(h.count_of(Counter::DenyCacheHits), 1);
        // Another key is not affected; the same key is asked again exactly at the instant.
        e.on_request(&c, &mut h, 3, &req("/", "someone-else"));
        assert_eq!(h.dispatched.len(), 2);
        h.now = Some(T0 + 6000 * MS - 1);
        e.on_request(&c, &mut h, 4, &req("/", "abuser"));
        assert_eq!(hits(&e, &h), 2);
        h.now = Some(T0 + 6000 * MS);
        e.on_request(&c, &mut h, 5, &req("/", "abuser"));
        assert_eq!(hits(&e, &h), 2, "expired: asked again");
        assert_eq!(e.load(), (1, 1));
    }

    #[test]
    fn a_smaller_cost_is_asked_and_a_larger_one_is_not() {
        let (c, mut e, mut h) = setup("");
        let costly = |cost: &str| req("/costly", "k").with("x-cost", cost.as_bytes());
        arrive(&mut e, &c, &mut h, 1, &costly("3"));
        let two_limits = r#"{"EVALSHA":[1,0,2,1,"10","0","0",0,"2","3000","1000"]}"#;
        e.on_reply(&c, &mut h, None, 1, ok(two_limits));
        assert_eq!(h.statuses(), vec![(1, 429)]);
        e.on_request(&c, &mut h, 2, &costly("4"));
        assert_eq!(hits(&e, &h), 1, "cost 4 >= 3: refused");
        e.on_request(&c, &mut h, 3, &costly("2"));
        assert_eq!(hits(&e, &h), 1, "cost 2 may fit: asked");
        assert_eq!(e.load(), (0, 1));
        // The rule "all" (not refused) alone is not covered by the entry of "costly".
        e.on_request(&c, &mut h, 4, &req("/", "k"));
        assert_eq!(hits(&e, &h), 1);
    }

    #[test]
    fn shadow_refusals_are_not_cached_and_the_cache_can_be_off() {
        for extra in ["", r#""deny_cache": false,"#] {
            let c = config(extra);
            let mut e = Engine::new(&c);
            let mut h = FakeHost::new();
            arrive(&mut e, &c, &mut h, 1, &req("/watch", "k"));
            e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::AllowShadowRefused])));
            e.on_request(&c, &mut h, 2, &req("/watch", "k"));
            assert_eq!(hits(&e, &h), 0);
        }
        let (c, mut e, mut h) = setup(r#""deny_cache": false,"#);
        arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
        e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(6000)])));
        e.on_request(&c, &mut h, 2, &req("/", "k"));
        assert_eq!(hits(&e, &h), 0, "off: asked again");
    }

    #[test]
    fn the_cache_is_bounded_and_keeps_the_latest_refusals() {
        let (c, mut e, mut h) = setup(r#""deny_cache": {"max_entries": 2},"#);
        for (ctx, key) in [(1, "a"), (2, "b"), (3, "c")] {
            arrive(&mut e, &c, &mut h, ctx, &req("/", key));
            let token = h.last_token();
            e.on_reply(
                &c,
                &mut h,
                None,
                token,
                ok(&reply(&[R::Refuse(1000 * ctx)])),
            );
        }
        assert_eq!(e.deny_cache.len(), 2);
        e.on_request(&c, &mut h, 10, &req("/", "a"));
        assert_eq!(hits(&e, &h), 0, "a expired first: evicted");
        for (ctx, key) in [(11, "b"), (12, "c")] {
            e.on_request(&c, &mut h, ctx, &req("/", key));
        }
        assert_eq!(hits(&e, &h), 2);
    }

    #[test]
    fn waiting_requests_the_last_reply_refused_are_answered_without_a_call() {
        let (c, mut e, mut h) = setup("");
        arrive(&mut e, &c, &mut h, 1, &req("/", "hot"));
        for ctx in 2..=5 {
            e.on_request(&c, &mut h, ctx, &req("/", "hot"));
        }
        e.on_request(&c, &mut h, 6, &req("/", "other"));
        e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(6000)])));
        assert_eq!(
            h.statuses(),
            vec![(1, 429), (2, 429), (3, 429), (4, 429), (5, 429)]
        );
        assert_eq!(h.dispatched.len(), 2);
        assert_eq!(h.batch_size(1), 1, "only the other key is asked");
        assert_eq!(hits(&e, &h), 4);
    }

    #[test]
    fn a_request_past_its_timeout_in_the_queue_fails_by_policy_and_calls_get_what_is_left() {
        // Calls stay out for 150 ms here: no breaker, or it would see them stall.
        let (c, mut e, mut h) = setup(r#""breaker": false,"#);
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        h.now = Some(T0 + 100 * MS);
        e.on_request(&c, &mut h, 2, &req("/", "b"));
        h.now = Some(T0 + 120 * MS);
        e.on_request(&c, &mut h, 3, &req("/", "c"));
        // The first call times out at 150 ms; request 2 (150 ms from 100) is still in time.
        h.now = Some(T0 + 150 * MS);
        e.on_reply(&c, &mut h, None, 1, none());
        assert_eq!(h.dispatched[1].2, Duration::from_millis(100));
        assert_eq!(h.batch_size(1), 2);
        h.now = Some(T0 + 260 * MS);
        e.on_request(&c, &mut h, 4, &req("/", "d"));
        h.now = Some(T0 + 280 * MS);
        e.on_reply(&c, &mut h, None, 2, ok(&reply(&[R::Allow(1), R::Allow(1)])));
        assert_eq!(h.dispatched.len(), 3);
        h.now = Some(T0 + 500 * MS);
        e.on_request(&c, &mut h, 5, &req("/", "e"));
        e.on_reply(&c, &mut h, None, 3, none());
        // 5 arrived at 500 and waited for nothing: sent. None waited past its timeout.
        assert_eq!(h.resumed, vec![1, 2, 3, 4]);
        assert!(h.failures.iter().all(|f| *f == BridgeFailure::NoResponse));
        // Now one that does expire in the queue: the call in flight outlives it.
        let c2 = config(
            r#""breaker": false, "batch": {"max_in_flight": 1}, "bridge": {"timeout": "1s"},"#,
        );
        let mut e = Engine::new(&c2);
        let mut h = FakeHost::new();
        arrive(&mut e, &c2, &mut h, 1, &req("/", "a"));
        h.now = Some(T0 + 10 * MS);
        e.on_request(&c2, &mut h, 2, &req("/", "b"));
        h.now = Some(T0 + 1010 * MS);
        e.on_reply(&c2, &mut h, None, 1, ok(&reply(&[R::Allow(1)])));
        assert_eq!(h.failures, vec![BridgeFailure::Expired]);
        assert_eq!(h.resumed, vec![1, 2], "open: let through");
        assert_eq!(h.dispatched.len(), 1, "nothing left to send");
    }

    #[test]
    fn bad_requests_unmatched_requests_and_clock_failures_are_decided_at_once() {
        let (c, mut e, mut h) = setup("");
        let bad = req("/costly", "k").with("x-cost", b"lots");
        assert_eq!(e.on_request(&c, &mut h, 1, &bad), Verdict::Pause);
        assert_eq!(h.answered[0].1.status, 400);
        assert_eq!(
            h.answered[0].1.body,
            "x-cost must be a whole number from 1 to 5\n"
        );
        assert_eq!(h.counters, vec![Counter::BadRequests]);
        let only = Config::parse(
            br#"{"rules": [{"name": "r", "match": {"path_exact": "/only"}, "limits": [{"name": "l", "limit": 1, "window": "1s"}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            e.on_request(&only, &mut h, 2, &req("/other", "k")),
            Verdict::Continue
        );
        h.now = None;
        assert_eq!(
            e.on_request(&c, &mut h, 3, &req("/", "k")),
            Verdict::Continue
        );
        assert_eq!(h.failures, vec![BridgeFailure::Clock]);
        assert_eq!(h.wakes, 0);
        assert!(h.dispatched.is_empty() && h.resumed.is_empty());
    }

    #[test]
    fn without_a_wake_up_the_request_sends_itself_and_a_refused_dispatch_decides_it_at_once() {
        for (extra, verdict) in [
            ("", Verdict::Continue),
            (r#""failure_mode": "closed","#, Verdict::Pause),
        ] {
            let c = config(extra);
            let mut e = Engine::new(&c);
            let mut h = FakeHost {
                cannot_wake: true,
                refuse_dispatch: true,
                ..FakeHost::new()
            };
            assert_eq!(e.on_request(&c, &mut h, 1, &req("/", "k")), verdict);
            assert!(
                h.resumed.is_empty(),
                "its own verdict is returned, not resumed"
            );
            assert_eq!(
                h.failures,
                vec![BridgeFailure::Dispatch("cluster not found".into())]
            );
        }
        let c = config("");
        let mut e = Engine::new(&c);
        let mut h = FakeHost {
            cannot_wake: true,
            ..FakeHost::new()
        };
        assert_eq!(e.on_request(&c, &mut h, 1, &req("/", "k")), Verdict::Pause);
        assert_eq!(h.dispatched.len(), 1, "sent from the request itself");
        e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Allow(1)])));
        assert_eq!(h.resumed, vec![1]);
    }

    #[test]
    fn a_stray_reply_changes_nothing() {
        let (c, mut e, mut h) = setup("");
        e.on_reply(&c, &mut h, None, 42, ok(&reply(&[R::Allow(1)])));
        assert!(h.resumed.is_empty() && h.counters.is_empty());
        arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
        e.on_reply(&c, &mut h, None, 42, ok(&reply(&[R::Allow(1)])));
        assert_eq!(e.load(), (0, 1));
    }

    #[test]
    fn a_reply_for_another_shape_fails_the_batch() {
        let (c, mut e, mut h) = setup("");
        arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
        e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Allow(1), R::Allow(1)])));
        assert_eq!(
            h.failures,
            vec![BridgeFailure::BadReply(
                "EVALSHA result has the wrong number of requests"
            )]
        );
        assert_eq!(h.resumed, vec![1]);
    }

    /// A call that timed out or could not connect: no status at all.
    fn none() -> BridgeReply<'static> {
        BridgeReply {
            status: None,
            body: b"",
        }
    }

    #[test]
    fn the_breaker_opens_after_failures_in_a_row_and_then_decides_without_calls() {
        let (c, mut e, mut h) = setup(r#""breaker": {"failures": 3},"#);
        // Two failures, a success, then three failures: only a run of three opens it.
        for (ctx, reply) in [
            (1, None),
            (2, None),
            (3, Some(R::Allow(1))),
            (4, None),
            (5, None),
        ] {
            e.on_request(&c, &mut h, ctx, &req("/", "k"));
            let token = h.last_token();
            match reply {
                Some(r) => e.on_reply(&c, &mut h, Some(ctx), token, ok(&reply_of(r))),
                None => e.on_reply(&c, &mut h, Some(ctx), token, none()),
            }
        }
        assert_eq!(h.breaker_open, 0);
        e.on_request(&c, &mut h, 6, &req("/", "k"));
        let token = h.last_token();
        e.on_reply(
            &c,
            &mut h,
            Some(6),
            token,
            BridgeReply {
                status: Some(503),
                body: b"",
            },
        );
        assert_eq!(h.breaker_open, 1);
        assert_eq!(h.count_of(Counter::BreakerTrips), 1);
        assert_eq!(
            h.breaker_log,
            vec![(
                true,
                "3 calls in a row failed, the last: bridge answered HTTP 503".into()
            )]
        );
        // Open: decided by the policy at once, no call, not a bridge error, not logged again.
        let (calls, errors, logged) = (
            h.dispatched.len(),
            h.count_of(Counter::BridgeErrors),
            h.failures.len(),
        );
        assert_eq!(
            e.on_request(&c, &mut h, 7, &req("/", "k")),
            Verdict::Continue
        );
        assert_eq!(h.dispatched.len(), calls);
        assert_eq!(h.count_of(Counter::BridgeErrors), errors);
        assert_eq!(h.failures.len(), logged);
        assert_eq!(h.count_of(Counter::FailureModeOpen), 6);
        let closed = config(r#""failure_mode": "closed", "breaker": {"failures": 1},"#);
        let mut e = Engine::new(&closed);
        let mut h = FakeHost::new();
        e.on_request(&closed, &mut h, 1, &req("/", "k"));
        e.on_reply(&closed, &mut h, Some(1), 1, none());
        assert_eq!(
            e.on_request(&closed, &mut h, 2, &req("/", "k")),
            Verdict::Pause
        );
        assert_eq!(h.statuses(), vec![(1, 503), (2, 503)]);
    }

    fn reply_of(r: R) -> String {
        reply(&[r])
    }

    #[test]
    fn a_stalled_call_opens_the_breaker_and_releases_every_waiting_request() {
        let (c, mut e, mut h) = setup("");
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        e.on_request(&c, &mut h, 2, &req("/", "b"));
        e.on_request(&c, &mut h, 3, &req("/", "c"));
        h.now = Some(T0 + 24 * MS);
        e.on_tick(&c, &mut h);
        assert_eq!(h.breaker_open, 0, "24 ms is no stall yet");
        h.now = Some(T0 + 25 * MS);
        e.on_tick(&c, &mut h);
        assert_eq!(h.breaker_open, 1);
        assert_eq!(
            h.resumed,
            vec![2, 3, 1],
            "all released at once, by the open policy"
        );
        assert_eq!(e.load(), (0, 0));
        assert_eq!(
            h.breaker_log[0],
            (true, "a call has been in flight for 25 ms".into())
        );
        // The abandoned call's reply, if it still comes, changes nothing.
        e.on_reply(&c, &mut h, Some(1), 1, ok(&reply_of(R::Allow(1))));
        assert_eq!(h.count_of(Counter::Allowed), 0);
        // A stall is also seen by the next request, without a tick.
        let mut e = Engine::new(&c);
        let mut h = FakeHost::new();
        e.on_request(&c, &mut h, 1, &req("/", "a"));
        h.now = Some(T0 + 30 * MS);
        assert_eq!(
            e.on_request(&c, &mut h, 2, &req("/", "b")),
            Verdict::Continue
        );
        assert_eq!(h.resumed, vec![1]);
        assert_eq!(h.breaker_open, 1);
    }

    #[test]
    fn one_probe_per_interval_and_an_answer_closes_the_breaker() {
        let (c, mut e, mut h) = setup(r#""breaker": {"failures": 1, "probe_interval": "500ms"},"#);
        e.on_request(&c, &mut h, 1, &req("/", "a"));
        e.on_reply(&c, &mut h, Some(1), 1, none());
        assert_eq!(h.breaker_open, 1);
        h.now = Some(T0 + 499 * MS);
        e.on_tick(&c, &mut h);
        assert_eq!(h.dispatched.len(), 1, "no probe before the interval");
        h.now = Some(T0 + 500 * MS);
        e.on_tick(&c, &mut h);
        assert_eq!(h.dispatched.len(), 2);
        let (probe, call, timeout) = h.dispatched[1].clone();
        assert!(
            call.path.ends_with("/0"),
            "an empty decision call: {}",
            call.path
        );
        assert_eq!(timeout, Duration::from_millis(500));
        e.on_tick(&c, &mut h);
        assert_eq!(h.dispatched.len(), 2, "one probe at a time");
        // The probe fails: the next goes one interval later.
        h.now = Some(T0 + 600 * MS);
        e.on_reply(
            &c,
            &mut h,
            None,
            probe,
            BridgeReply {
                status: Some(503),
                body: b"",
            },
        );
        assert_eq!(h.breaker_open, 1);
        h.now = Some(T0 + 999 * MS);
        e.on_tick(&c, &mut h);
        assert_eq!(h.dispatched.len(), 2);
        h.now = Some(T0 + 1000 * MS);
        e.on_tick(&c, &mut h);
        assert_eq!(h.dispatched.len(), 3);
        h.now = Some(T0 + 1002 * MS);
        e.on_reply(&c, &mut h, None, 3, ok(r#"{"EVALSHA":[0]}"#));
        assert_eq!(h.breaker_open, 0);
        assert_eq!(
            h.breaker_log.last(),
            Some(&(false, "a probe was answered after 1002 ms open".to_string()))
        );
        // Closed: requests are sent again.
        e.on_request(&c, &mut h, 2, &req("/", "b"));
        assert_eq!(h.dispatched.len(), 4);
    }

    #[test]
    fn without_a_breaker_nothing_opens() {
        let (c, mut e, mut h) = setup(r#""breaker": false,"#);
        for ctx in 1..=10 {
            e.on_request(&c, &mut h, ctx, &req("/", "k"));
            let token = h.last_token();
            e.on_reply(&c, &mut h, Some(ctx), token, none());
        }
        e.on_request(&c, &mut h, 11, &req("/", "k"));
        h.now = Some(T0 + 10_000 * MS);
        e.on_tick(&c, &mut h);
        assert_eq!(h.breaker_open, 0);
        assert_eq!(h.dispatched.len(), 11);
    }

    #[test]
    fn a_call_carries_the_deadline_after_which_redis_must_not_charge() {
        let (c, mut e, mut h) = setup(r#""bridge": {"timeout": "200ms", "clock_skew": "1s"},"#);
        e.on_request(&c, &mut h, 1, &req("/", "k"));
        // T0 + 200 ms + 1 s, in ms.
        assert!(h.dispatched[0].1.path.contains("/1000000000000/1001200/1/"));
        e.on_reply(
            &c,
            &mut h,
            Some(1),
            1,
            ok(r#"{"EVALSHA":[false,"EXPIRED decide: the call reached Redis after its deadline"]}"#),
        );
        assert_eq!(h.failures, vec![BridgeFailure::Stale]);
        assert_eq!(h.resumed, vec![1]);
    }

    #[test]
    fn local_mode_limits_each_worker_to_its_share_while_the_bridge_fails() {
        let c =
            config(r#""failure_mode": "local", "local_share": 0.5, "breaker": {"failures": 1},"#);
        let mut e = Engine::new(&c);
        let mut h = FakeHost::new();
        // The call fails: the request is decided here, on 5 of the 10 per minute.
        e.on_request(&c, &mut h, 1, &req("/", "k"));
        e.on_reply(&c, &mut h, Some(1), 1, none());
        assert_eq!(h.resumed, vec![1]);
        assert_eq!(
            e.take_headers(1),
            Some(vec![
                ("x-ratelimit-limit", "5".to_string()),
                ("x-ratelimit-remaining", "4".to_string()),
                ("x-ratelimit-reset", "12".to_string())
            ])
        );
        // The breaker is open: the rest are decided here at once, without a call.
        let verdicts: Vec<Verdict> = (2..=6)
            .map(|ctx| e.on_request(&c, &mut h, ctx, &req("/", "k")))
            .collect();
        use Verdict::{Continue, Pause};
        assert_eq!(verdicts, [Continue, Continue, Continue, Continue, Pause]);
        assert_eq!(h.statuses(), vec![(6, 429)]);
        assert_eq!(h.dispatched.len(), 1);
        assert_eq!(h.count_of(Counter::FailureModeLocal), 6);
        assert_eq!(h.count_of(Counter::Allowed), 5);
        assert_eq!(h.count_of(Counter::Denied), 1);
        // Another key has a share of its own.
        assert_eq!(e.on_request(&c, &mut h, 7, &req("/", "other")), Continue);
    }

    /// Leases of at most 10 units, half of what is left, for 1 s; replicas' clocks within 10 ms.
    const LEASING: &str = r#""lease": {"max_units": 10, "fraction": 0.5, "max_ms": 1000}, "bridge": {"clock_skew": "10ms"},"#;

    /// A committed request that took `k` requests' worth, `left` left, whole in `reset_ms`.
    fn leased(k: u64, left: u32, reset_ms: u32) -> String {
        format!(r#"{{"EVALSHA":[1,{k},1,1,"{left}","{reset_ms}","0"]}}"#)
    }

    /// A request of key "k" arrives (see `arrive`).
    fn ask_k(e: &mut Engine, c: &Config, h: &mut FakeHost, ctx: u32) -> Verdict {
        arrive(e, c, h, ctx, &req("/", "k"))
    }

    /// With [`LEASING`], request 1 of key "k" was decided and took `k` requests' worth,
    /// `left` left in Redis, whole again in `reset_ms`.
    fn leasing_k(k: u64, left: u32, reset_ms: u32) -> (Config, Engine, FakeHost) {
        let (c, mut e, mut h) = setup(LEASING);
        ask_k(&mut e, &c, &mut h, 1);
        e.on_reply(&c, &mut h, Some(1), 1, ok(&leased(k, left, reset_ms)));
        (c, e, h)
    }

    fn remaining(e: &mut Engine, ctx: u32) -> String {
        let headers = e.take_headers(ctx).unwrap_or_default();
        headers
            .iter()
            .find(|(name, _)| *name == "x-ratelimit-remaining")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    #[test]
    fn a_lease_serves_requests_without_a_call_and_the_next_is_asked_for_before_it_runs_out() {
        let (c, mut e, mut h) = setup(LEASING);
        assert_eq!(ask_k(&mut e, &c, &mut h, 1), Verdict::Pause);
        let (token, call, _) = h.dispatched[0].clone();
        // A key it has not leased before: 4 requests' worth at most (of max_units 10).
        assert!(call.path.contains("/1/lease/4/0%2E5"), "{}", call.path);
        // Redis charged 4 requests' worth: this one and 3 held here; 6 left in the bucket.
        e.on_reply(&c, &mut h, Some(1), token, ok(&leased(4, 6, 30_000)));
        assert_eq!(h.resumed, vec![1]);
        assert_eq!(
            remaining(&mut e, 1),
            "9",
            "what Redis left plus what is held here"
        );
        assert_eq!(h.count_of(Counter::LeaseGrants), 1);
        // The next ones go through at once, with no call.
        for ctx in [2, 3] {
            assert_eq!(ask_k(&mut e, &c, &mut h, ctx), Verdict::Continue);
        }
        assert_eq!(remaining(&mut e, 3), "7");
        // Half of the lease or less is left: the next is asked for (a prefetch from the root)
        // while requests go on from the unit still held.
        assert_eq!(h.count_of(Counter::LeasePrefetches), 1);
        let (prefetch, call, _) = h.dispatched[1].clone();
        assert!(call.path.contains("/1/lease/4/0%2E5"), "{}", call.path);
        assert_eq!(ask_k(&mut e, &c, &mut h, 4), Verdict::Continue);
        // Spent: the next one waits (the call slot is the prefetch's) ...
        assert_eq!(ask_k(&mut e, &c, &mut h, 5), Verdict::Pause);
        assert_eq!(h.dispatched.len(), 2, "one ask in flight at most");
        // ... and is served by the lease the prefetch brings (its own request's worth is
        // units too), without a call of its own.
        e.on_reply(&c, &mut h, None, prefetch, ok(&leased(4, 2, 30_000)));
        assert_eq!(h.resumed, vec![1, 5]);
        assert!(h.answered.is_empty());
        assert_eq!(remaining(&mut e, 5), "5");
        for ctx in [6, 7] {
            assert_eq!(ask_k(&mut e, &c, &mut h, ctx), Verdict::Continue);
        }
        // The first lease was spent before it ended: the next asks for twice as much.
        assert_eq!(h.count_of(Counter::LeasePrefetches), 2);
        let (_, call, _) = h.dispatched[2].clone();
        assert!(call.path.contains("/1/lease/8/0%2E5"), "{}", call.path);
        e.on_tick(&c, &mut h);
        assert_eq!(h.count_of(Counter::Allowed), 7);
        assert_eq!(h.count_of(Counter::LeaseHits), 6);
        assert_eq!(
            h.rule_counts(&c),
            vec![("ratelimit_rule.all.minute.allowed".to_string(), 7)]
        );
    }

    #[test]
    fn a_lease_spent_slowly_is_not_refilled_ahead() {
        let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
        // 2 of 3 spent in 700 ms of a lease of 1 s: at that pace the last unit outlasts it.
        h.now = Some(T0 + 600 * MS);
        assert_eq!(ask_k(&mut e, &c, &mut h, 2), Verdict::Continue);
        h.now = Some(T0 + 700 * MS);
        assert_eq!(ask_k(&mut e, &c, &mut h, 3), Verdict::Continue);
        assert_eq!(h.count_of(Counter::LeasePrefetches), 0);
        assert_eq!(h.dispatched.len(), 1);
        // Spent as fast (2 in 200 ms), the next lease is asked for ahead.
        let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
        h.now = Some(T0 + 200 * MS);
        for ctx in [2, 3] {
            assert_eq!(ask_k(&mut e, &c, &mut h, ctx), Verdict::Continue);
        }
        assert_eq!(h.count_of(Counter::LeasePrefetches), 1);
    }

    #[test]
    fn after_a_lease_that_served_nothing_a_key_asks_again_only_when_it_comes_back_soon() {
        let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
        // Nothing spent in its second: all 3 go back, and the next request asks for no lease.
        h.now = Some(T0 + 1000 * MS);
        e.on_tick(&c, &mut h);
        assert_eq!(h.count_of(Counter::LeaseUnitsReturned), 3);
        h.now = Some(T0 + 1500 * MS);
        ask_k(&mut e, &c, &mut h, 2);
        let (token, call, _) = h.dispatched.last().cloned().unwrap();
        assert!(call.path.contains("/1/lease/1/0%2E5"), "{}", call.path);
        e.on_reply(&c, &mut h, Some(2), token, ok(&reply(&[R::Allow(5)])));
        // Not back within half a lease's time (500 ms): still none.
        h.now = Some(T0 + 2100 * MS);
        ask_k(&mut e, &c, &mut h, 3);
        let (token, call, _) = h.dispatched.last().cloned().unwrap();
        assert!(call.path.contains("/1/lease/1/0%2E5"), "{}", call.path);
        e.on_reply(&c, &mut h, Some(3), token, ok(&reply(&[R::Allow(4)])));
        // Back within it: a lease of 2 again.
        h.now = Some(T0 + 2500 * MS);
        ask_k(&mut e, &c, &mut h, 4);
        let (_, call, _) = h.dispatched.last().cloned().unwrap();
        assert!(call.path.contains("/1/lease/2/0%2E5"), "{}", call.path);
    }

    #[test]
    fn a_lease_ends_before_its_bucket_could_be_full_again_and_what_is_left_goes_back() {
        // Whole again in 50 ms: usable for 40 (the clock skew of 10 ms off), not 1 s.
        let (c, mut e, mut h) = leasing_k(4, 1, 50);
        h.now = Some(T0 + 39 * MS);
        assert_eq!(ask_k(&mut e, &c, &mut h, 2), Verdict::Continue);
        h.now = Some(T0 + 40 * MS);
        assert_eq!(ask_k(&mut e, &c, &mut h, 3), Verdict::Pause);
        let calls = h.dispatched.len();
        // The next tick gives the 2 unspent units back, charged at T0 with 1 left, by a refund
        // whose clock and deadline are the tick's time plus the rule's timeout and the skew.
        h.now = Some(T0 + 45 * MS);
        e.on_tick(&c, &mut h);
        assert_eq!(h.dispatched.len(), calls + 1);
        let (_, call, timeout) = h.dispatched[calls].clone();
        let clock = T0 + 205 * MS;
        assert!(
            call.path
                .contains(&format!("/{clock}/{}/1/0/1/", clock / MS)),
            "{}",
            call.path
        );
        assert!(
            call.path
                .ends_with(&format!("/token_bucket/10/60000/10/2/refund/{T0}/1")),
            "{}",
            call.path
        );
        assert_eq!(timeout, Duration::from_millis(150));
        assert_eq!(h.count_of(Counter::LeaseUnitsReturned), 2);
        // Nothing is given back twice.
        e.on_tick(&c, &mut h);
        assert_eq!(h.dispatched.len(), calls + 1);
        // It served 1 of its 3: the next lease of this key is asked for 2 requests' worth.
        let (token, _, _) = h.dispatched[calls - 1].clone();
        e.on_reply(&c, &mut h, Some(3), token, ok(&reply(&[R::Allow(1)])));
        ask_k(&mut e, &c, &mut h, 4);
        let (_, call, _) = h.dispatched.last().cloned().unwrap();
        assert!(call.path.contains("/1/lease/2/0%2E5"), "{}", call.path);
    }

    #[test]
    fn near_the_limit_a_decision_is_the_request_alone_and_a_refusal_leases_nothing() {
        let (c, mut e, mut h) = setup(LEASING);
        ask_k(&mut e, &c, &mut h, 1);
        e.on_reply(&c, &mut h, Some(1), 1, ok(&reply(&[R::Allow(1)])));
        // No lease: the next request is decided in Redis, and asks again.
        assert_eq!(ask_k(&mut e, &c, &mut h, 2), Verdict::Pause);
        assert!(h.dispatched[1].1.path.contains("/lease/"));
        e.on_reply(&c, &mut h, Some(2), 2, ok(&reply(&[R::Refuse(6000)])));
        assert_eq!(h.statuses(), vec![(2, 429)]);
        assert_eq!(h.count_of(Counter::LeaseGrants), 0);
        // The refusal is cached as usual; the next key still asks for a lease.
        assert_eq!(ask_k(&mut e, &c, &mut h, 3), Verdict::Pause);
        assert_eq!(h.dispatched.len(), 2);
        arrive(&mut e, &c, &mut h, 4, &req("/", "other"));
        assert!(h.dispatched[2].1.path.contains("/lease/"));
    }

    #[test]
    fn a_reply_granting_more_than_was_asked_is_a_bridge_failure_and_leases_nothing() {
        // 10 units at most: k = 10 is the most a reply may say.
        let (c, mut e, mut h) = leasing_k(11, 0, 30_000);
        assert!(
            matches!(h.failures[0], BridgeFailure::BadReply(_)),
            "{:?}",
            h.failures
        );
        assert_eq!(h.count_of(Counter::FailureModeOpen), 1);
        assert_eq!(ask_k(&mut e, &c, &mut h, 2), Verdict::Pause);
        // A request that asked for none may not be granted one either.
        let (c, mut e, mut h) = setup("");
        ask_k(&mut e, &c, &mut h, 1);
        e.on_reply(&c, &mut h, Some(1), 1, ok(&leased(2, 0, 30_000)));
        assert!(
            matches!(h.failures[0], BridgeFailure::BadReply(_)),
            "{:?}",
            h.failures
        );
    }

    #[test]
    fn while_the_breaker_is_open_or_after_a_restart_leased_units_are_still_spent() {
        let (c, mut e, mut h) = setup(&format!(r#"{LEASING} "breaker": {{"failures": 1}},"#));
        ask_k(&mut e, &c, &mut h, 1);
        e.on_reply(&c, &mut h, Some(1), 1, ok(&leased(4, 5, 30_000)));
        // Another key's call fails: the breaker opens.
        arrive(&mut e, &c, &mut h, 2, &req("/", "other"));
        e.on_reply(&c, &mut h, Some(2), 2, none());
        assert_eq!(h.breaker_open, 1);
        // Units already charged in Redis are still this worker's to spend.
        assert_eq!(ask_k(&mut e, &c, &mut h, 3), Verdict::Continue);
        assert_eq!(
            h.count_of(Counter::LeasePrefetches),
            0,
            "no call while open"
        );
        // A restart another worker saw (or a fresh Redis's first NOSCRIPT) leaves the lease.
        h.restarts += 1;
        e.on_tick(&c, &mut h);
        for ctx in [4, 5] {
            assert_eq!(ask_k(&mut e, &c, &mut h, ctx), Verdict::Continue);
        }
        assert_eq!(
            h.count_of(Counter::FailureModeOpen),
            1,
            "only the other key's failure"
        );
        e.on_tick(&c, &mut h);
        assert_eq!(h.count_of(Counter::LeaseHits), 3);
    }

    #[test]
    fn give_backs_due_while_the_breaker_is_open_are_sent_once_it_closes() {
        let breaker = r#""breaker": {"failures": 1, "probe_interval": "500ms"},"#;
        let (c, mut e, mut h) = setup(&format!("{LEASING} {breaker}"));
        ask_k(&mut e, &c, &mut h, 1);
        // 3 units held here, for 1 s.
        e.on_reply(&c, &mut h, Some(1), 1, ok(&leased(4, 6, 30_000)));
        arrive(&mut e, &c, &mut h, 2, &req("/", "other"));
        e.on_reply(&c, &mut h, Some(2), 2, none());
        assert_eq!(h.breaker_open, 1);
        // The lease ends while the breaker is open: no give-back call now (only the probe).
        h.now = Some(T0 + 1000 * MS);
        e.on_tick(&c, &mut h);
        assert_eq!(h.dispatched.len(), 3);
        let probe = h.dispatched[2].0;
        assert_eq!(h.count_of(Counter::LeaseUnitsReturned), 0);
        // The probe is answered: the next tick gives the 3 units back.
        e.on_reply(&c, &mut h, None, probe, ok(r#"{"EVALSHA":[0]}"#));
        assert_eq!(h.breaker_open, 0);
        h.now = Some(T0 + 1025 * MS);
        e.on_tick(&c, &mut h);
        assert_eq!(
            h.count_of(Counter::LeaseUnitsReturned),
            3,
            "the units kept while the breaker was open are given back"
        );
        assert!(h.dispatched[3].1.path.contains("/refund/"));
    }

    #[test]
    fn in_cluster_mode_a_plan_on_two_slots_served_from_leases_sends_no_cross_slot_call() {
        let c = Config::parse(
            br#"{"bridge": {"redis_cluster": true}, "lease": {"max_units": 10, "fraction": 0.5, "max_ms": 1000},
                "rules": [
                {"name": "per_key", "key": {"from": ["header:x-api-key"], "when_missing": "skip"},
                 "limits": [{"name": "minute", "limit": 100, "window": "1m"}]},
                {"name": "per_ip", "match": {"path_prefix": "/both"}, "key": {"from": ["client_ip"]},
                 "limits": [{"name": "minute", "limit": 100, "window": "1m"}]}
            ]}"#,
        )
        .unwrap();
        let mut e = Engine::new(&c);
        let mut h = FakeHost::new();
        // Each key gets a lease of its own (3 units held) from a plan of its own slot alone.
        arrive(&mut e, &c, &mut h, 1, &req("/", "k"));
        e.on_reply(&c, &mut h, Some(1), 1, ok(&leased(4, 60, 30_000)));
        arrive(&mut e, &c, &mut h, 2, &FakeRequest::new("GET", "/both"));
        e.on_reply(&c, &mut h, Some(2), 2, ok(&leased(4, 60, 30_000)));
        assert_eq!(h.count_of(Counter::LeaseGrants), 2);
        // Requests carrying both keys are served from the two leases, which run low.
        for ctx in [3, 4] {
            assert_eq!(
                arrive(&mut e, &c, &mut h, ctx, &req("/both", "k")),
                Verdict::Continue
            );
        }
        for (_, call, _) in &h.dispatched {
            let slots: HashSet<u16> = call_keys(call)
                .iter()
                .map(|k| key_slot(k.as_bytes()))
                .collect();
            assert_eq!(slots.len(), 1, "a call on one slot: {:?}", call_keys(call));
        }
    }

    #[test]
    fn a_batch_leaves_room_for_the_fixed_part_of_the_call() {
        // Requests of 40 limits each; the names are padded until whole requests fill the
        // call's bytes to within 60 of the bound (less than any call's fixed part: EVALSHA,
        // the script's hash, the clock and the deadline).
        let rules = |pad: usize| -> String {
            (0..4)
                .map(|r| {
                    let limits = (0..10)
                        .map(|i| {
                            let extra = pad.saturating_sub(60 * (r * 10 + i)).min(60);
                            let name = format!("l{i}{}", "x".repeat(extra));
                            format!(r#"{{"name": "{name}", "limit": 10, "window": "1m"}}"#)
                        })
                        .collect::<Vec<_>>()
                        .join(",");
                    format!(r#"{{"name": "r{r}", "limits": [{limits}]}}"#)
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        let parse = |pad: usize| {
            let json = format!(
                r#"{{"batch": {{"max_requests": 256}}, "rules": [{}]}}"#,
                rules(pad)
            );
            let c = Config::parse(json.as_bytes()).unwrap();
            let size = call_bytes(&crate::plan::plan(&c, &req("/", "k0")).unwrap().checks);
            (c, size)
        };
        // Each byte of padding adds one to a request's size.
        let (_, unpadded) = parse(0);
        let pad = (0..2000)
            .find(|pad| MAX_CALL_BYTES % (unpadded + pad) < 60)
            .expect("a padding that fills the call");
        let (c, size) = parse(pad);
        assert_eq!(size, unpadded + pad);
        let fit = MAX_CALL_BYTES / size;
        let mut e = Engine::new(&c);
        let mut h = FakeHost::new();
        arrive(&mut e, &c, &mut h, 1, &req("/", "first"));
        for ctx in 2..(fit as u32 + 3) {
            let r = req("/", &format!("k{ctx}"));
            assert_eq!(call_bytes(&crate::plan::plan(&c, &r).unwrap().checks), size);
            arrive(&mut e, &c, &mut h, ctx, &r);
        }
        e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Allow(9)])));
        assert_eq!(h.dispatched.len(), 2);
        let batch = h.batch_size(1);
        assert!(
            batch * size + 60 <= MAX_CALL_BYTES,
            "{batch} requests of {size} bytes leave no room for the call's fixed part"
        );
    }

    #[test]
    fn a_give_back_forgets_the_refusals_of_its_keys() {
        let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
        h.now = Some(T0 + 200 * MS);
        for ctx in [2, 3] {
            assert_eq!(ask_k(&mut e, &c, &mut h, ctx), Verdict::Continue);
        }
        // The prefetch is refused: the key is remembered as refused for 6 s.
        let prefetch = h.last_token();
        e.on_reply(&c, &mut h, None, prefetch, ok(&reply(&[R::Refuse(6000)])));
        // The lease ends with a unit unspent: it goes back to Redis, which may now fit one.
        h.now = Some(T0 + 1000 * MS);
        e.on_tick(&c, &mut h);
        assert_eq!(h.count_of(Counter::LeaseUnitsReturned), 1);
        h.now = Some(T0 + 1100 * MS);
        assert_eq!(
            ask_k(&mut e, &c, &mut h, 4),
            Verdict::Pause,
            "asked Redis again, not refused from the deny cache"
        );
        assert!(h.answered.is_empty(), "{:?}", h.statuses());
    }

    #[test]
    fn a_refusal_from_a_call_sent_before_a_restart_is_not_cached() {
        let (c, mut e, mut h) = setup(r#""batch": {"max_in_flight": 2},"#);
        arrive(&mut e, &c, &mut h, 1, &req("/", "a"));
        arrive(&mut e, &c, &mut h, 2, &req("/", "b"));
        assert_eq!(h.dispatched.len(), 2, "two calls in flight");
        // The second call finds Redis restarted: the deny cache is reset ...
        let noscript = r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#;
        e.on_reply(&c, &mut h, None, 2, ok(noscript));
        assert_eq!(h.restarts, 1);
        // ... and the first one's refusal, decided before the restart, comes after it.
        e.on_reply(&c, &mut h, None, 1, ok(&reply(&[R::Refuse(6000)])));
        assert_eq!(h.statuses(), vec![(1, 429)]);
        arrive(&mut e, &c, &mut h, 3, &req("/", "a"));
        assert_eq!(hits(&e, &h), 0, "the old refusal was not cached");
    }

    #[test]
    fn a_give_back_has_the_time_of_a_decision_to_reach_redis() {
        // Replicas' clocks within 10 ms; the rule's timeout is the default 150 ms.
        let (c, mut e, mut h) = leasing_k(4, 6, 30_000);
        h.now = Some(T0 + 1000 * MS);
        e.on_tick(&c, &mut h);
        let (_, call, timeout) = h.dispatched.last().cloned().unwrap();
        assert!(call.path.contains("/refund/"), "{}", call.path);
        assert_eq!(timeout, Duration::from_millis(150));
        let segments: Vec<&str> = call.path.split('/').collect();
        let keys: usize = segments[3].parse().unwrap();
        let deadline_ms: u128 = segments[4 + keys + 1].parse().unwrap();
        assert!(
            deadline_ms >= (T0 + 1000 * MS + 150 * MS) / MS,
            "a deadline {} ms after the give-back is sent, less than its timeout",
            deadline_ms - (T0 + 1000 * MS) / MS
        );
    }

    #[test]
    fn a_grant_given_back_at_once_is_not_counted_in_the_headers() {
        // Whole again in 5 ms, less than the 10 ms of clock skew: the 3 units held go back.
        let (_c, mut e, h) = leasing_k(4, 6, 5);
        assert_eq!(h.resumed, vec![1]);
        assert_eq!(
            remaining(&mut e, 1),
            "6",
            "what Redis left, nothing held here"
        );
    }
}
