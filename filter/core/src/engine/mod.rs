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
use breaker::Breaker;

mod breaker;

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
    breaker: Breaker,
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
        if self.breaker.is_open() {
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
        if self.breaker.is_probe(token) {
            let ok = parse_eval_reply(reply, &[]).is_ok();
            let now = host.now_unix_ns().unwrap_or(0);
            // Answered (a missing script is the next call's to load): the bridge is back.
            if let Some(why) = self.breaker.probe_replied(ok, now) {
                host.gauge_add(Gauge::BreakerOpen, -1);
                host.report_breaker(false, &why);
            }
            return;
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
                        self.breaker.answered();
                        for (member, result) in call.members.into_iter().zip(results) {
                            let outcome = match result {
                                Ok(decision) => Outcome::Decided(decision),
                                Err(failure) => Outcome::Failed(failure),
                            };
                            self.settle(config, host, member, outcome, Some(call.sent), now);
                        }
                    }
                    Ok(EvalOutcome::NoScript) if !reloaded => {
                        self.breaker.answered();
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
                    self.breaker.answered();
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
        let opens = self.breaker.failed(config.breaker, &failure, now);
        self.fail_all(config, host, members, failure, now);
        if let Some(why) = opens {
            self.opened(config, host, now, &why);
        }
    }

    /// Opens the breaker if a call has been in flight for `breaker.stall`.
    fn check_stall(&mut self, config: &Config, host: &mut impl Host, now: u128) {
        let oldest = self.in_flight.iter().map(|c| c.dispatched_ns).min();
        if let Some(why) = self.breaker.stalled(config.breaker, oldest, now) {
            self.opened(config, host, now, &why);
        }
    }

    /// The breaker opened: every request waiting for the bridge, or in a call in flight, is
    /// decided now by its failure policy; until a probe is answered none waits for a call.
    /// (Replies to the abandoned calls that still come are ignored.)
    fn opened(&mut self, config: &Config, host: &mut impl Host, now: u128, why: &str) {
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
        let Some(settings) = config.breaker else {
            return;
        };
        if !self.breaker.probe_due(now) {
            return;
        }
        let deadline_ms =
            (now + settings.probe_interval.as_nanos() + config.clock_skew.as_nanos()) / 1_000_000;
        let call = DecideCall::new(&now.to_string(), deadline_ms, std::iter::empty());
        let request = BridgeRequest::evalsha(&config.script_sha, &call);
        let probe = host
            .dispatch(&config.bridge, &request, settings.probe_interval)
            .ok();
        self.breaker.probe_sent(config.breaker, probe, now);
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
        if self.breaker.is_open() || spans_slots(config, &plan) {
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
        if self.breaker.is_open() {
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
mod tests;
