//! The failure and decision policy: what an outcome (a decision from Redis, or a failure)
//! does to a request, counted; and the `local` failure mode, which decides on this worker
//! alone while the bridge fails.

use super::host::Host;
use super::leases::Leases;
use super::local::{scaled, LocalLimits, Seen, SeenOverrides};
use super::queue::Outcome;
use super::refusals::Refusals;
use super::tally::Tally;
use crate::bridge::{BridgeFailure, FailureCause};
use crate::check::LimitCheck;
use crate::config::{Config, FailureMode};
use crate::decision::{Decision, LimitResult, Override};
use crate::metrics::{Counter, RuleCount, RuleEvent};
use crate::request::plan::Plan;
use crate::response::{self, Headers, LocalResponse, Protocol};
use crate::time::UnixNs;

/// What the policy decided for a request.
pub enum Conclusion {
    Resume(Headers),
    Answer(LocalResponse),
}

#[derive(Debug, Default)]
pub struct Policy {
    /// The state of the `local` failure mode.
    local: LocalLimits,
    /// The overrides Redis applied lately, for the `local` failure mode.
    seen: SeenOverrides,
}

impl Policy {
    /// The one place an outcome becomes "let it through" or "answer it" (in `protocol`),
    /// counted; `now` (the worker's latest clock) dates its headers.
    pub fn conclude(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        tally: &mut Tally,
        (plan, now, protocol): (&Plan, UnixNs, Protocol),
        outcome: Outcome,
    ) -> Conclusion {
        if let Outcome::Decided(decision) = &outcome {
            if plan.checks.iter().any(|c| c.overrides) {
                self.seen.saw(&plan.checks, decision, now);
            }
        }
        match outcome {
            // Decisions come in a reply: counted once per batch, when its callback returns
            // (every caller flushes the tally then), with their per-rule twins.
            Outcome::Decided(decision) if decision.allowed => {
                tally.count(Counter::Allowed);
                if decision.limits.iter().any(|l| !l.allowed) {
                    tally.count(Counter::ShadowDenied);
                }
                count_decision(tally, plan, &decision);
                Conclusion::Resume(response::rate_limit_headers(
                    config,
                    &plan.checks,
                    &decision,
                    now,
                ))
            }
            Outcome::Decided(decision) => {
                tally.count(Counter::Denied);
                count_decision(tally, plan, &decision);
                let answer = response::denied(config, protocol, &plan.checks, &decision, now);
                Conclusion::Answer(answer)
            }
            Outcome::Failed(failure) => {
                // An open breaker was logged once when it opened; no call failed here. A
                // refusal was reported (an error) once per call, by the engine.
                let cause = failure.cause();
                if failure != BridgeFailure::BreakerOpen {
                    host.count(Counter::BridgeErrors);
                    if failure.misconfiguration().is_none() {
                        host.report_failure(&failure);
                    }
                }
                if cause == FailureCause::TimedOut {
                    host.count(Counter::BridgeTimeouts);
                }
                let mut counted_rule = None;
                for check in &plan.checks {
                    if counted_rule != Some(check.rule) {
                        counted_rule = Some(check.rule);
                        tally.rule_count(check.rule, cause.rule_count());
                    }
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
                    tally.rule(check, event);
                }
                match plan.failure_mode {
                    FailureMode::Local => self.decide_locally(config, host, plan, protocol),
                    FailureMode::Open => {
                        host.count(Counter::FailureModeOpen);
                        Conclusion::Resume(Headers::new())
                    }
                    FailureMode::Closed => {
                        host.count(Counter::FailureModeClosed);
                        Conclusion::Answer(response::unavailable(protocol))
                    }
                }
            }
        }
    }

    /// The `local` failure mode: the limits of the request's rules that fail locally, decided
    /// by this worker alone at `local_share` of each (the others let it through).
    fn decide_locally(
        &mut self,
        config: &Config,
        host: &mut impl Host,
        plan: &Plan,
        protocol: Protocol,
    ) -> Conclusion {
        host.count(Counter::FailureModeLocal);
        let Some(now) = host.now_unix_ns().map(UnixNs::from_ns) else {
            return Conclusion::Resume(Headers::new());
        };
        let mut blocked = Vec::new();
        let checks: Vec<LimitCheck> = plan
            .checks
            .iter()
            .filter(|c| {
                config
                    .rules
                    .get(c.rule)
                    .is_some_and(|r| r.failure_mode == FailureMode::Local)
            })
            .filter_map(|c| match self.seen.apply(c, now) {
                Seen::Check(c) => Some(scaled(&c, config.local_share)),
                Seen::Unlimited => None,
                Seen::Blocked => {
                    blocked.push(c.clone());
                    None
                }
            })
            .collect();
        if !blocked.is_empty() {
            host.count(Counter::Denied);
            let refused = LimitResult {
                allowed: false,
                remaining: 0.0,
                reset_ms: 0.0,
                retry_ms: 0.0,
                over_budget: false,
                overridden: Some(Override::Blocked),
                bad_override: false,
                never_fits: false,
            };
            let decision = Decision {
                allowed: false,
                limits: vec![refused; blocked.len()],
                leased: 0,
            };
            let answer = response::denied(config, protocol, &blocked, &decision, now);
            return Conclusion::Answer(answer);
        }
        let decision = self.local.decide(&checks, now);
        if decision.allowed {
            host.count(Counter::Allowed);
            Conclusion::Resume(response::rate_limit_headers(
                config, &checks, &decision, now,
            ))
        } else {
            host.count(Counter::Denied);
            Conclusion::Answer(response::denied(config, protocol, &checks, &decision, now))
        }
    }
}

/// A request of `plan` the worker answers without Redis at `now`, counted: allowed from
/// leased units, or refused from the deny cache (in `protocol`; counted in the stats at the
/// next tick or reply: host calls fewer on the hot path).
pub fn serve_locally(
    config: &Config,
    (leases, refusals, tally): (&mut Leases, &Refusals, &mut Tally),
    (plan, protocol): (&Plan, Protocol),
    now: UnixNs,
) -> Option<Conclusion> {
    if plan.leasable() && !leases.is_empty() {
        if let Some(decision) = leases.spend(plan, now) {
            tally.lease_hit(plan);
            let headers = response::rate_limit_headers(config, &plan.checks, &decision, now);
            return Some(Conclusion::Resume(headers));
        }
    }
    let (checks, decision) = refusals.refusal(plan, now)?;
    tally.deny_hit(&checks);
    Some(Conclusion::Answer(response::denied(
        config, protocol, &checks, &decision, now,
    )))
}

/// Per-rule counts of a decision from Redis: what each limit did, and the rules whose key
/// budget a new identity found used up (once per rule and request).
fn count_decision(tally: &mut Tally, plan: &Plan, decision: &Decision) {
    let mut budget_rule = None;
    for (check, result) in plan.checks.iter().zip(&decision.limits) {
        let event = match (result.allowed, check.mode.is_shadow()) {
            (true, _) => RuleEvent::Allowed,
            (false, true) => RuleEvent::ShadowDenied,
            (false, false) => RuleEvent::Denied,
        };
        // A limit that allowed a request another limit refused did nothing to count.
        if decision.allowed || event != RuleEvent::Allowed {
            tally.rule(check, event);
        }
        if result.overridden.is_some() {
            tally.rule(check, RuleEvent::Overridden);
        }
        if result.bad_override {
            tally.rule(check, RuleEvent::BadOverride);
        }
        if result.never_fits {
            tally.rule(check, RuleEvent::NeverFits);
        }
        if result.over_budget && budget_rule != Some(check.rule) {
            if budget_rule.is_none() {
                tally.count(Counter::KeyBudgetExceeded);
            }
            budget_rule = Some(check.rule);
            tally.rule_count(check.rule, RuleCount::KeyBudgetExceeded);
        }
    }
}
