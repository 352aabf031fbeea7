//! Usage settlements: what a usage limit's response really used, charged (or given back)
//! after the request was admitted. The engine records, per stream let through, what each of
//! its usage limits was charged up front ([`Metering`]); once the adapter has read the usage,
//! the difference is queued here and sent from the root (mode `settle` of the decision
//! script): riding as the last request of the next decision call the root sends, in the room
//! its batch left and on its slot ([`Settlements::riders`]), or at the worker's next tick in
//! calls of their own, grouped per Redis Cluster slot and sized by the call size model, with a
//! deadline, not while the breaker is open. A give-back does not wait for the tick when no
//! settlement call is out ([`Settlements::gives_back_now`]). Riding, a settlement takes the decision call's
//! clock and deadline, and its outcome is read from the call's last entry, apart from the
//! decisions ([`Settlements::ridden`]).
//!
//! Failures: a settlement whose call failed definitely (not sent, refused by the bridge or
//! Redis, past its deadline) is kept and sent again; the kept list is bounded, the oldest
//! dropped beyond it and counted lost. A call that timed out (no answer, or a 5xx) may
//! have been carried out: its debts are sent again (a rare double charge errs on the limit's
//! side) and its give-backs dropped and counted lost (never units the client did not pay
//! back).

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use super::packing::pack;
use super::script::{Read, Stage};
use super::tally::Tally;
pub use crate::bounds::MAX_SETTLEMENT_CALLS;
pub use crate::bounds::{MAX_KEPT_SETTLEMENTS, MAX_METERED_STREAMS};
use crate::bridge::{
    parse_eval_reply, BridgeFailure, BridgeReply, BridgeRequest, DecideCall, EvalOutcome,
    MisconfigCause, Misconfiguration,
};
use crate::check::LimitCheck;
use crate::config::{Admit, Clock, Config};
use crate::decision::Settlement;
use crate::metering::{UsageCharge, UsageMeter};
use crate::metrics::RuleEvent;
use crate::request::plan::Plan;
use crate::time::UnixNs;

/// A settlement call in flight.
#[derive(Debug)]
pub struct SettleCall {
    settlements: Vec<Settlement>,
    /// Its stage: sent, or the script's load before it goes again.
    stage: Stage,
    timeout: Duration,
}

impl SettleCall {
    /// Envoy's timeout of it.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
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
                    self.finished(tally, forgotten.finish(false));
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

    /// A finished response's usage limits came to `outcomes`: each counted, and its
    /// settlement queued.
    pub fn finished(&mut self, tally: &mut Tally, outcomes: Vec<UsageCharge>) {
        for outcome in outcomes {
            let check = &outcome.check;
            tally.rule_n(check, RuleEvent::UsageCharged, outcome.charged);
            tally.rule_n(check, RuleEvent::UsageGivenBack, outcome.given_back());
            tally.rule_n(check, RuleEvent::UsageDebt, outcome.debt());
            if outcome.unread.is_some() {
                tally.rule(check, RuleEvent::UsageUnread);
            }
            if let Some(settlement) = outcome.settlement() {
                self.push(settlement);
            }
        }
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
            let drop = excess > 0 && s.delta < 0 && !is_release(s);
            excess -= usize::from(drop);
            !drop
        });
        self.kept.drain(..excess);
    }

    /// Settlements waiting for a call.
    pub fn waiting(&self) -> usize {
        self.kept.len()
    }

    /// A give-back waits and no settlement call is out: it goes now rather than at the next
    /// tick, so units a response did not use are free again within a round trip (a user's
    /// successful logins never pile up reservations). One call at a time: what comes
    /// meanwhile goes when its reply is in.
    pub fn gives_back_now(&self) -> bool {
        self.in_flight.is_empty() && self.kept.iter().any(|s| s.delta < 0)
    }

    /// The settlements to send with a decision call going out anyway, oldest first: those
    /// `fits` takes (its slot, the room left in the call). The rest waits.
    pub fn riders(&mut self, mut fits: impl FnMut(&Settlement) -> bool) -> Vec<Settlement> {
        if self.kept.is_empty() {
            return Vec::new();
        }
        let (riders, left): (Vec<_>, Vec<_>) = std::mem::take(&mut self.kept)
            .into_iter()
            .partition(|s| fits(s));
        self.kept = left;
        riders
    }

    /// What became of settlements that rode on a decision call, by the call's outcome (the
    /// request's own, when Redis answered): as for a call of their own (see
    /// [`Settlements::reply`]): carried out; a request Redis could not carry out, dropped; a
    /// call that may have been carried out unseen, debts and releases sent again; one that
    /// definitely was not, kept.
    pub fn ridden(&mut self, riders: Vec<Settlement>, outcome: Result<(), &BridgeFailure>) {
        if riders.is_empty() {
            return;
        }
        match outcome {
            Ok(()) => {}
            Err(
                BridgeFailure::Redis(_)
                | BridgeFailure::Misconfigured(Misconfiguration {
                    cause: MisconfigCause::RedisAcl,
                    ..
                }),
            ) => self.lost += riders.len() as u64,
            Err(failure) if failure.may_have_run() => self.after_doubt(riders),
            Err(_) => self.keep(riders),
        }
    }

    /// Settlements dropped since the last time, taken (for the counter).
    pub fn take_lost(&mut self) -> u64 {
        std::mem::take(&mut self.lost)
    }

    /// The calls to send now ([`pack`]) while fewer than [`MAX_SETTLEMENT_CALLS`] are in
    /// flight; the rest waits. No request waits for them: each may take the lag allowance on
    /// top of its timeout, so that a worker running late does not time out (and resend or
    /// lose) settlements.
    pub fn calls(&mut self, config: &Config) -> Vec<(Vec<Settlement>, Duration)> {
        let free = MAX_SETTLEMENT_CALLS.saturating_sub(self.in_flight.len());
        if self.kept.is_empty() || free == 0 {
            return Vec::new();
        }
        let packed = pack(config, std::mem::take(&mut self.kept), free);
        self.kept = packed.left;
        packed
            .calls
            .into_iter()
            .map(|(group, timeout)| (group, timeout.saturating_add(config.lag_allowance)))
            .collect()
    }

    /// The request settling `settlements` at `now`: Redis refuses it past `now` +
    /// `timeout` + the clock skew (then nothing was charged: the settlements are kept).
    pub fn request(
        config: &Config,
        settlements: &[Settlement],
        timeout: Duration,
        now: UnixNs,
    ) -> BridgeRequest {
        let deadline = now.plus(timeout + config.clock_skew);
        let mut call = DecideCall::settle(now.as_ns(), deadline.as_ms(), settlements);
        if config.clock == Clock::Redis {
            // Settled on the clock the decisions were made with.
            call.args[0] = "redis".to_string();
        }
        config.program.decide(&call)
    }

    /// A call of `settlements` was sent with `token`.
    pub fn sent(&mut self, token: u32, settlements: Vec<Settlement>, timeout: Duration) {
        let call = SettleCall {
            settlements,
            stage: Stage::default(),
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
        now: UnixNs,
    ) -> (Settled, Option<(BridgeRequest, SettleCall)>) {
        let Some(call) = self.in_flight.remove(&token) else {
            return (Settled::Done, None);
        };
        let n = call.settlements.len();
        let read = call.stage.read(config, reply, |reply| {
            match parse_eval_reply(reply, &[n])? {
                EvalOutcome::Decided(results) => Ok(Some(results)),
                EvalOutcome::NoScript => Ok(None),
            }
        });
        match read {
            Read::Ran(results) => match results.into_iter().next() {
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
            Read::Missing | Read::Loaded => {
                let again = SettleCall {
                    stage: call.stage.after(&read),
                    ..call
                };
                // Made again after a load: its deadline counts from now.
                let eval = || {
                    Cow::Owned(Self::request(
                        config,
                        &again.settlements,
                        again.timeout,
                        now,
                    ))
                };
                let request = again.stage.request(config, eval).into_owned();
                (Settled::Reloading, Some((request, again)))
            }
            // Sent, and may have been carried out unseen.
            Read::Failed(failure) if failure.may_have_run() => {
                self.after_doubt(call.settlements);
                (Settled::Failed(failure), None)
            }
            Read::Failed(failure) => {
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
        // A release is sent again too: releasing a hold twice releases it once.
        let (debts, give_backs): (Vec<_>, Vec<_>) = settlements
            .into_iter()
            .partition(|s| s.delta > 0 || is_release(s));
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

/// A concurrency hold's release, not a usage settlement.
fn is_release(settlement: &Settlement) -> bool {
    settlement.check.mode.takes_hold()
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
