//! Usage settlements: what a usage limit's response really used, charged (or given back)
//! after the request was admitted. The engine records, per stream let through, what each of
//! its usage limits was charged up front ([`Metering`]); once the adapter has read the usage,
//! the difference is queued here and sent from the root in calls of their own (mode `settle`
//! of the decision script), at the worker's next wake-up or tick, grouped per Redis Cluster
//! slot and sized by the call size model, with a deadline, not while the breaker is open.
//!
//! Failures: a settlement whose call failed definitely (not sent, refused by the bridge or
//! Redis, past its deadline) is kept and sent again; the kept list is bounded, the oldest
//! dropped beyond it and counted lost. A call that timed out (no answer, or a 5xx) may
//! have been carried out: its debts are sent again (a rare double charge errs on the limit's
//! side) and its give-backs dropped and counted lost (never units the client did not pay
//! back).

use std::collections::HashMap;
use std::time::Duration;

use super::host::Host;
use super::refusals::Refusals;
use super::tally::Tally;
use super::Engine;
use crate::bounds::MAX_CALL_PATH_BYTES;
use crate::bridge::{
    parse_eval_reply, parse_script_load_reply, BridgeFailure, BridgeReply, BridgeRequest, CallSize,
    DecideCall, EvalOutcome, LimitShape,
};
use crate::config::{Admit, Clock, Config};
use crate::decision::Settlement;
use crate::metering::{Outcome, UsageMeter};
use crate::metrics::{Counter, RuleEvent};
use crate::request::plan::{LimitCheck, Plan};
use crate::response::Headers;
use crate::slot::key_slot;

/// Settlements kept for a later call at most (about 200 bytes each); beyond, the oldest are
/// dropped and counted in `ratelimit_usage_settlements_lost`.
pub const MAX_KEPT_SETTLEMENTS: usize = 4096;

/// Settlement calls in flight at most per worker: more settlements wait for their replies.
pub const MAX_SETTLEMENT_CALLS: usize = 4;

/// Streams let through whose usage limits wait for their response headers: bounded, the
/// oldest settled beyond it as a response whose usage cannot be read (the estimate stands).
pub const MAX_METERED_STREAMS: usize = 16_384;

/// A settlement call in flight.
#[derive(Debug)]
pub struct SettleCall {
    settlements: Vec<Settlement>,
    /// Waiting for `SCRIPT LOAD`, after Redis answered NOSCRIPT.
    loading: bool,
    timeout: Duration,
}

/// What became of a settlement call, for the engine (its breaker).
#[derive(Debug, PartialEq)]
pub enum Settled {
    /// Redis carried it out.
    Done,
    /// The script is being loaded; the call goes again after it.
    Reloading,
    /// It failed: its settlements were kept (debts and give-backs) or, after a timeout, its
    /// debts only; the rest were counted lost.
    Failed(BridgeFailure),
}

#[derive(Debug, Default)]
pub struct Settlements {
    kept: Vec<Settlement>,
    in_flight: HashMap<u32, SettleCall>,
    /// Usage limits of the streams let through, until their response is read.
    metering: HashMap<u32, (u64, UsageMeter)>,
    /// Order of `metering` entries, to forget the oldest.
    turn: u64,
    /// Settlements dropped and not yet counted.
    lost: u64,
}

impl Settlements {
    /// Stream `ctx` was let through on `plan`: its usage limits wait for its response.
    /// `charged`: Redis charged the request (else it went through by the failure policy, and
    /// its usage is charged in full once read).
    pub fn admitted(
        &mut self,
        config: &Config,
        ctx: u32,
        plan: &Plan,
        charged: bool,
        tally: &mut Tally,
    ) {
        let mut meter = UsageMeter::default();
        for check in &plan.checks {
            let Some(usage) = usage_of(config, check) else {
                continue;
            };
            let reserved = if charged && usage.admit == Admit::Reserve {
                check.cost
            } else {
                0
            };
            tally.rule_n(check, RuleEvent::UsageReserved, reserved);
            meter.add(check.clone(), reserved, usage.from.clone());
        }
        if meter.is_empty() {
            return;
        }
        if self.metering.len() >= MAX_METERED_STREAMS {
            let oldest = self.metering.iter().min_by_key(|(_, (t, _))| *t);
            if let Some(&ctx) = oldest.map(|(ctx, _)| ctx) {
                // Settled as a response whose usage cannot be read: its estimate stands
                // (`after`: is charged), never free units.
                if let Some((_, forgotten)) = self.metering.remove(&ctx) {
                    finished(tally, self, forgotten.finish(false));
                }
            }
        }
        self.turn += 1;
        self.metering.insert(ctx, (self.turn, meter));
    }

    /// The meter of stream `ctx`, taken (None: it has no usage limit to settle).
    pub fn take_meter(&mut self, ctx: u32) -> Option<UsageMeter> {
        self.metering.remove(&ctx).map(|(_, meter)| meter)
    }

    /// The stream of `ctx` ended.
    pub fn forget(&mut self, ctx: u32) {
        self.metering.remove(&ctx);
    }

    /// Queues `settlement`, the oldest kept one dropped (and counted lost) beyond the bound.
    pub fn push(&mut self, settlement: Settlement) {
        if settlement.delta == 0 {
            return;
        }
        self.kept.push(settlement);
        self.bound();
    }

    /// Beyond [`MAX_KEPT_SETTLEMENTS`], give-backs go first (a give-back lost leaves units
    /// spent), oldest first; then the oldest debts.
    fn bound(&mut self) {
        let mut excess = self.kept.len().saturating_sub(MAX_KEPT_SETTLEMENTS);
        if excess == 0 {
            return;
        }
        self.lost += excess as u64;
        self.kept.retain(|s| {
            let drop = excess > 0 && s.delta < 0;
            excess -= usize::from(drop);
            !drop
        });
        self.kept.drain(..excess);
    }

    /// Settlements waiting for a call.
    pub fn waiting(&self) -> usize {
        self.kept.len()
    }

    /// Settlements dropped since the last time, taken (for the counter).
    pub fn take_lost(&mut self) -> u64 {
        std::mem::take(&mut self.lost)
    }

    /// The calls to send now: one per slot on a Redis Cluster, each within the call size
    /// bound, while fewer than [`MAX_SETTLEMENT_CALLS`] are in flight; the rest waits.
    pub fn calls(&mut self, config: &Config) -> Vec<(Vec<Settlement>, Duration)> {
        let free = MAX_SETTLEMENT_CALLS.saturating_sub(self.in_flight.len());
        if self.kept.is_empty() || free == 0 {
            return Vec::new();
        }
        let mut kept: Vec<(Option<u16>, Settlement)> = std::mem::take(&mut self.kept)
            .into_iter()
            .map(|s| {
                let slot = config
                    .redis_cluster
                    .then(|| key_slot(s.check.key.as_bytes()));
                (slot, s)
            })
            .collect();
        kept.sort_by_key(|(slot, _)| *slot);
        let call = CallSize::batch();
        let fixed = call.with_request(MAX_CALL_PATH_BYTES / 2, 0).bytes();
        let mut calls: Vec<(usize, Vec<Settlement>)> = Vec::new();
        let mut last_slot = None;
        for (slot, settlement) in kept {
            let size = call.limit_bytes(&LimitShape::settle(&settlement));
            let room = calls.len() < free;
            match calls.last_mut() {
                Some((bytes, group))
                    if last_slot == slot && *bytes + size <= MAX_CALL_PATH_BYTES =>
                {
                    *bytes += size;
                    group.push(settlement);
                }
                _ if room => {
                    calls.push((fixed + size, vec![settlement]));
                    last_slot = slot;
                }
                _ => self.kept.push(settlement),
            }
        }
        calls
            .into_iter()
            .map(|(_, group)| {
                // No request waits for it: it may take the lag allowance too, so that a
                // worker running late does not time out (and resend or lose) settlements.
                let timeout = group
                    .iter()
                    .filter_map(|s| config.rules.get(s.check.rule).map(|r| r.timeout))
                    .max()
                    .unwrap_or(config.clock_skew)
                    .saturating_add(config.lag_allowance)
                    .max(Duration::from_millis(1));
                (group, timeout)
            })
            .collect()
    }

    /// The request settling `settlements` at `now` (Unix ns): Redis refuses it past `now` +
    /// `timeout` + the clock skew (then nothing was charged: the settlements are kept).
    pub fn request(
        config: &Config,
        settlements: &[Settlement],
        timeout: Duration,
        now: u128,
    ) -> BridgeRequest {
        let deadline = now.saturating_add((timeout + config.clock_skew).as_nanos());
        let mut call = DecideCall::settle(now, deadline / 1_000_000, settlements);
        if config.clock == Clock::Redis {
            // Settled on the clock the decisions were made with.
            call.args[0] = "redis".to_string();
        }
        BridgeRequest::evalsha(&config.script_sha, &call)
    }

    /// A call of `settlements` was sent with `token`.
    pub fn sent(&mut self, token: u32, settlements: Vec<Settlement>, timeout: Duration) {
        let call = SettleCall {
            settlements,
            loading: false,
            timeout,
        };
        self.in_flight.insert(token, call);
    }

    /// A call of `settlements` could not be sent: they are kept for the next time.
    pub fn unsent(&mut self, settlements: Vec<Settlement>) {
        self.keep(settlements);
    }

    /// Whether `token` is a settlement call in flight.
    pub fn owns(&self, token: u32) -> bool {
        self.in_flight.contains_key(&token)
    }

    /// The reply to settlement call `token`. Returns what became of it and, when the script
    /// must be loaded first or again, the call to send next (`SCRIPT LOAD`, or the
    /// settlement again) with the call to register it under once dispatched.
    pub fn reply(
        &mut self,
        config: &Config,
        token: u32,
        reply: BridgeReply<'_>,
        now: u128,
    ) -> (Settled, Option<(BridgeRequest, SettleCall)>) {
        let Some(call) = self.in_flight.remove(&token) else {
            return (Settled::Done, None);
        };
        if call.loading {
            return match parse_script_load_reply(reply, &config.script_sha) {
                Ok(()) => {
                    let request = Self::request(config, &call.settlements, call.timeout, now);
                    let again = SettleCall {
                        loading: false,
                        ..call
                    };
                    (Settled::Reloading, Some((request, again)))
                }
                Err(failure) => {
                    self.keep(call.settlements);
                    (Settled::Failed(failure), None)
                }
            };
        }
        match parse_eval_reply(reply, &[call.settlements.len()]) {
            Ok(EvalOutcome::Decided(results)) => match results.into_iter().next() {
                Some(Ok(_)) => (Settled::Done, None),
                // Redis could not carry out this request (a bad argument, a Redis error):
                // sending it again would fail the same way.
                Some(Err(failure)) => {
                    self.lost += call.settlements.len() as u64;
                    (Settled::Failed(failure), None)
                }
                // The script ran, and its reply lacks this entry: as if carried out unseen.
                None => {
                    self.after_doubt(call.settlements);
                    (Settled::Failed(BridgeFailure::BadReply("no entry")), None)
                }
            },
            Ok(EvalOutcome::NoScript) => {
                let again = SettleCall {
                    loading: true,
                    ..call
                };
                (
                    Settled::Reloading,
                    Some((BridgeRequest::script_load(), again)),
                )
            }
            // Sent, and may have been carried out: no answer, a 5xx (Envoy's own 504 once the
            // call's timeout passed, its 503 when the connection reset after the call went
            // out; a hung Webdis reads the call when it runs again), a reply that cannot be
            // read.
            Err(
                failure @ (BridgeFailure::NoResponse
                | BridgeFailure::Status(500..)
                | BridgeFailure::BadReply(_)),
            ) => {
                self.after_doubt(call.settlements);
                (Settled::Failed(failure), None)
            }
            Err(failure) => {
                self.keep(call.settlements);
                (Settled::Failed(failure), None)
            }
        }
    }

    /// A follow-up of a call (its script load, or the call again) was dispatched.
    pub fn resent(&mut self, token: u32, call: SettleCall) {
        self.in_flight.insert(token, call);
    }

    /// A follow-up could not be dispatched: its settlements are kept.
    pub fn not_resent(&mut self, call: SettleCall) {
        self.keep(call.settlements);
    }

    /// Settlements of a call that may have been carried out: debts are sent again (a rare
    /// double charge errs on the limit's side), give-backs dropped and counted lost (never
    /// units the client did not pay back).
    fn after_doubt(&mut self, settlements: Vec<Settlement>) {
        let (debts, give_backs): (Vec<_>, Vec<_>) =
            settlements.into_iter().partition(|s| s.delta > 0);
        self.lost += give_backs.len() as u64;
        self.keep(debts);
    }

    /// Settlements sent again before the ones queued since (they are older).
    fn keep(&mut self, mut settlements: Vec<Settlement>) {
        settlements.append(&mut self.kept);
        self.kept = settlements;
        self.bound();
    }
}

/// The `usage` of the limit `check` is on, if it is a usage limit.
pub fn usage_of<'c>(config: &'c Config, check: &LimitCheck) -> Option<&'c crate::config::Usage> {
    config
        .rules
        .get(check.rule)?
        .limits
        .get(check.limit)?
        .usage
        .as_ref()
}

/// What a stream let through gets back once its response comes: the rate-limit headers it
/// was allowed with and the meter of its usage limits; what becomes of their usage; and the
/// stream's end.
impl Engine {
    /// Response headers of `ctx` are on their way: the rate-limit headers it was allowed with.
    pub fn take_headers(&mut self, ctx: u32) -> Option<Headers> {
        self.delivery.take_headers(ctx)
    }

    /// The usage limits stream `ctx` was let through on, to read its response for (taken;
    /// None: it has none, or was not let through).
    pub fn take_meter(&mut self, ctx: u32) -> Option<UsageMeter> {
        self.settlements.take_meter(ctx)
    }

    /// A response's usage limits came to `outcomes` (see [`UsageMeter::finish`]): counted,
    /// and their settlements sent from the root at its next wake-up (or tick). Callable from
    /// any context: nothing is sent from it.
    pub fn settle_usage(&mut self, host: &mut impl Host, outcomes: Vec<Outcome>) {
        let sets = &mut self.settlements;
        finished(&mut self.tally, sets, outcomes);
        count_lost(host, sets);
        if sets.waiting() > 0 && !self.wake_pending && host.wake() {
            self.wake_pending = true;
        }
        self.tally.flush(host);
    }

    /// The stream of `ctx` ended: it no longer waits, and its headers are dropped. A call it
    /// is part of still decides the others (its own verdict goes nowhere) — unless the call
    /// was made from its context: that reply is lost with the stream, so the call's slot is
    /// freed at once and any other request on it fails by policy.
    pub fn forget(&mut self, config: &Config, host: &mut impl Host, ctx: u32) {
        self.delivery.forget(ctx);
        self.splits.forget(ctx);
        self.settlements.forget(ctx);
        if self.queue.load() == (0, 0) {
            return; // nothing waits nor is in flight (most streams end so)
        }
        let orphans = self.queue.forget(ctx, &mut self.leases);
        if !orphans.is_empty() {
            let now = host.now_unix_ns().unwrap_or(0);
            self.fail(config, host, orphans, BridgeFailure::Orphaned, now, false);
        }
        self.wake(config, host, None);
    }

    /// Sends the settlements that wait (from the root), unless the breaker is open.
    pub(super) fn send_settlements(&mut self, config: &Config, host: &mut impl Host) {
        if let Some(now) = host.now_unix_ns().filter(|_| !self.breaker.is_open()) {
            send(
                config,
                host,
                (&mut self.settlements, &mut self.refusals),
                now,
            );
        }
    }

    /// The reply to settlement call `token`: a failure counts for the breaker.
    pub(super) fn settlement_reply(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        token: u32,
        reply: BridgeReply<'_>,
    ) {
        let now = host.now_unix_ns().unwrap_or(0);
        match on_reply(config, host, &mut self.settlements, token, reply, now) {
            None => self.breaker.answered(),
            Some(failure) => {
                let opens = self.breaker.failed(config.breaker, &failure, now);
                self.opened(config, host, now, opens);
            }
        }
    }
}

/// Sends the settlements that wait, from the root (their replies must come to it), when the
/// breaker is closed: the caller checks.
pub fn send(
    config: &Config,
    host: &mut impl Host,
    (settlements, refusals): (&mut Settlements, &mut Refusals),
    now: u128,
) {
    for (group, timeout) in settlements.calls(config) {
        // Units given back may pay for a request the deny cache would refuse until its
        // Retry-After: such keys are asked again.
        for settlement in group.iter().filter(|s| s.delta < 0) {
            refusals.forget(&settlement.check.key);
        }
        let request = Settlements::request(config, &group, timeout, now);
        match host.dispatch(&config.bridge, &request, timeout) {
            Ok(token) => {
                host.count(Counter::UsageSettlementCalls);
                settlements.sent(token, group, timeout);
            }
            Err(why) => {
                host.report_failure(&BridgeFailure::Dispatch(why));
                settlements.unsent(group);
            }
        }
    }
    count_lost(host, settlements);
}

/// The reply to settlement call `token`: its follow-up sent if it needs one. Returns the
/// failure, for the breaker (None: the bridge answered).
pub fn on_reply(
    config: &Config,
    host: &mut impl Host,
    settlements: &mut Settlements,
    token: u32,
    reply: BridgeReply<'_>,
    now: u128,
) -> Option<BridgeFailure> {
    let (settled, next) = settlements.reply(config, token, reply, now);
    if let Some((request, call)) = next {
        let timeout = call.timeout;
        match host.dispatch(&config.bridge, &request, timeout) {
            Ok(token) => settlements.resent(token, call),
            Err(_) => settlements.not_resent(call),
        }
    }
    count_lost(host, settlements);
    match settled {
        Settled::Done | Settled::Reloading => None,
        Settled::Failed(failure) => {
            host.report_failure(&failure);
            Some(failure)
        }
    }
}

pub fn count_lost(host: &mut impl Host, settlements: &mut Settlements) {
    let lost = settlements.take_lost();
    if lost > 0 {
        host.count_n(Counter::UsageSettlementsLost, lost);
    }
}

/// Counts what each usage limit of a finished response comes to, and queues its settlement.
pub fn finished(tally: &mut Tally, settlements: &mut Settlements, outcomes: Vec<Outcome>) {
    for outcome in outcomes {
        let check = &outcome.check;
        tally.rule_n(check, RuleEvent::UsageCharged, outcome.charged);
        tally.rule_n(check, RuleEvent::UsageGivenBack, outcome.given_back());
        tally.rule_n(check, RuleEvent::UsageDebt, outcome.debt());
        if outcome.unread.is_some() {
            tally.rule(check, RuleEvent::UsageUnread);
        }
        if let Some(settlement) = outcome.settlement() {
            settlements.push(settlement);
        }
    }
}
