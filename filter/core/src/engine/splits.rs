//! Redis Cluster: a script may only touch keys of one hash slot, so a request whose limits
//! live on several slots (say a per-IP rule and a per-API-key rule) is decided in parts, one
//! per slot, each in a call of its own slot. All or nothing still holds: when a part is
//! refused, what the other parts charged is given back (refunded) in a call per slot.
//!
//! Until a refund lands (one round trip after the last part's reply), the refunded units are
//! still spent: another request on those keys can be refused in that window although the
//! limit would have had room (a false refusal), never allowed beyond the limit. A refund that
//! is lost (the bridge fails) leaves the units spent until they refill.

use std::collections::HashMap;

use super::lag::Moment;
use super::queue::{Origin, Outcome, Sent, Waiting};
use crate::bridge::BridgeFailure;
use crate::check::LimitCheck;
use crate::config::Config;
use crate::decision::{Decision, LimitResult, Refund};
use crate::request::plan::Plan;
use crate::time::UnixNs;

/// A request decided in parts.
#[derive(Debug)]
pub struct Split {
    pub ctx: u32,
    pub plan: Plan,
    pub arrived_ns: UnixNs,
    /// Each part's checks, as indexes into `plan.checks`.
    parts: Vec<Vec<usize>>,
    pending: usize,
    results: Vec<Option<LimitResult>>,
    /// Parts that committed (charged), with the clock they were decided with.
    charged: Vec<(usize, UnixNs)>,
    /// The clock of the first part refused.
    refused_at: Option<UnixNs>,
    failure: Option<BridgeFailure>,
    /// A part was decided by a call sent before a Redis restart this worker learnt of since:
    /// its refusals are not remembered.
    pub stale: bool,
}

impl Split {
    pub fn new(ctx: u32, plan: Plan, arrived_ns: UnixNs, parts: Vec<Vec<usize>>) -> Self {
        Split {
            ctx,
            arrived_ns,
            pending: parts.len(),
            results: vec![None; plan.checks.len()],
            plan,
            parts,
            charged: Vec::new(),
            refused_at: None,
            failure: None,
            stale: false,
        }
    }

    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// The plan of part `part`: its checks, the request's timeout and failure policy.
    pub fn part_plan(&self, part: usize) -> Plan {
        let checks = self.parts.get(part).map_or_else(Vec::new, |indexes| {
            indexes
                .iter()
                .filter_map(|&i| self.plan.checks.get(i).cloned())
                .collect()
        });
        Plan {
            checks,
            ..self.plan.clone()
        }
    }

    /// Records what part `part` got (decided with clock `sent_ns`); true once every part is in.
    pub fn record(
        &mut self,
        part: usize,
        outcome: Result<Decision, BridgeFailure>,
        sent_ns: UnixNs,
    ) -> bool {
        let Some(indexes) = self.parts.get(part) else {
            return self.pending == 0;
        };
        match outcome {
            Ok(decision) => {
                for (&i, result) in indexes.iter().zip(decision.limits) {
                    if let Some(entry) = self.results.get_mut(i) {
                        *entry = Some(result);
                    }
                }
                if decision.allowed {
                    self.charged.push((part, sent_ns));
                } else if self.refused_at.is_none() {
                    self.refused_at = Some(sent_ns);
                }
            }
            Err(failure) => {
                if self.failure.is_none() {
                    self.failure = Some(failure);
                }
            }
        }
        self.pending = self.pending.saturating_sub(1);
        self.pending == 0
    }

    /// What the request as a whole got, once every part is in, with the plan to conclude it
    /// with and the clock of the decision: refused if any part was refused (over the checks
    /// that were decided), else failed if any part failed, else allowed.
    pub fn outcome(&self) -> (Plan, Result<Decision, BridgeFailure>, UnixNs) {
        if let Some(at) = self.refused_at {
            let (checks, limits): (Vec<LimitCheck>, Vec<LimitResult>) = self
                .plan
                .checks
                .iter()
                .zip(&self.results)
                .filter_map(|(c, r)| r.map(|r| (c.clone(), r)))
                .unzip();
            let plan = Plan {
                checks,
                ..self.plan.clone()
            };
            let decision = Decision {
                allowed: false,
                limits,
                leased: 0,
            };
            return (plan, Ok(decision), at);
        }
        if let Some(failure) = &self.failure {
            return (self.plan.clone(), Err(failure.clone()), UnixNs::from_ns(0));
        }
        let limits: Vec<LimitResult> = self.results.iter().flatten().copied().collect();
        let at = self
            .charged
            .iter()
            .map(|(_, at)| *at)
            .max()
            .unwrap_or_default();
        let decision = Decision {
            allowed: limits.len() == self.plan.checks.len(),
            limits,
            leased: 0,
        };
        (self.plan.clone(), Ok(decision), at)
    }

    /// What to give back when the request is not let through: per part that charged, the
    /// limits it charged (those that allowed), each with its charge's clock and remaining.
    pub fn refunds(&self) -> Vec<Vec<Refund>> {
        self.charged
            .iter()
            .filter_map(|&(part, at)| {
                let refunds: Vec<Refund> = self
                    .parts
                    .get(part)?
                    .iter()
                    .filter_map(|&i| {
                        let result = self.results.get(i)?.as_ref()?;
                        let check = self.plan.checks.get(i)?;
                        result.allowed.then(|| Refund {
                            check: check.clone(),
                            charged_at_ns: at,
                            left: result.remaining,
                        })
                    })
                    .collect();
                (!refunds.is_empty()).then_some(refunds)
            })
            .collect()
    }
}

/// A split request whose parts are all in: its plan and outcome as one request, and when
/// the decision was sent (None: nothing to remember in the deny cache).
pub struct Finished {
    pub split: Split,
    pub plan: Plan,
    pub outcome: Outcome,
    pub sent: Option<Sent>,
}

/// The requests of a worker being decided in parts, by number.
#[derive(Debug, Default)]
pub struct Splits {
    open: HashMap<u64, Split>,
    next: u64,
}

impl Splits {
    /// Starts deciding the plan of stream `ctx` (arrived at `at`, asked about leases and
    /// refusals when `checked`) in the parts `groups` (from [`super::slots::groups`]), which wait for calls.
    pub fn start(
        &mut self,
        config: &Config,
        ctx: u32,
        plan: Plan,
        at: Moment,
        groups: Vec<(u16, Vec<usize>)>,
        checked: u64,
    ) -> Vec<Waiting> {
        let now = at.wall_ns;
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        let (slots, parts): (Vec<u16>, Vec<Vec<usize>>) = groups.into_iter().unzip();
        let split = Split::new(ctx, plan, now, parts);
        let parts = slots
            .into_iter()
            .enumerate()
            .map(|(part, slot)| {
                let origin = Origin::Part {
                    ctx,
                    split: id,
                    part,
                };
                let mut waiting =
                    Waiting::new(config, origin, split.part_plan(part), at, None, None);
                waiting.slot = Some(slot);
                waiting.checked = Some(checked);
                waiting
            })
            .collect();
        self.open.insert(id, split);
        parts
    }

    /// The outcome of part `part` of split `id`, decided by a call sent at `sent` (the deny
    /// cache is at `epoch`). Once every part is in, the split is taken and concluded as one
    /// request; None before, or if its stream is gone.
    pub fn part_decided(
        &mut self,
        id: u64,
        part: usize,
        outcome: Outcome,
        sent: Option<Sent>,
        epoch: u64,
    ) -> Option<Finished> {
        let split = self.open.get_mut(&id)?;
        // Decided by a call sent before a Redis restart: no refusal of it is remembered.
        split.stale |= sent.is_some_and(|s| s.epoch != epoch);
        let result = match outcome {
            Outcome::Decided(decision) => Ok(decision),
            Outcome::Failed(failure) => Err(failure),
        };
        if !split.record(part, result, sent.map_or(UnixNs::from_ns(0), |s| s.at_ns)) {
            return None;
        }
        let split = self.open.remove(&id)?;
        let (plan, result, at_ns) = split.outcome();
        let outcome = match result {
            Ok(decision) => Outcome::Decided(decision),
            Err(failure) => Outcome::Failed(failure),
        };
        let sent = (!split.stale).then_some(Sent { at_ns, epoch });
        Some(Finished {
            split,
            plan,
            outcome,
            sent,
        })
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// The stream of `ctx` ended: its splits are dropped (their parts' outcomes go nowhere).
    pub fn forget(&mut self, ctx: u32) {
        self.open.retain(|_, s| s.ctx != ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::plan::{plan_of, token_bucket_check};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn plan(keys: &[&str]) -> Plan {
        plan_of(keys.iter().map(|k| token_bucket_check(k)).collect())
    }

    fn result(allowed: bool, remaining: f64) -> LimitResult {
        LimitResult {
            allowed,
            remaining,
            reset_ms: 100.0,
            retry_ms: if allowed { 0.0 } else { 100.0 },
            over_budget: false,
            overridden: None,
            bad_override: false,
            never_fits: false,
        }
    }

    fn decided(allowed: bool, limits: Vec<LimitResult>) -> Result<Decision, BridgeFailure> {
        Ok(Decision {
            allowed,
            limits,
            leased: 0,
        })
    }

    #[test]
    fn a_refused_part_refuses_the_request_and_the_charged_parts_are_given_back() {
        let p = plan(&["rl:{ip:a}:r:s", "rl:{key:b}:k:s", "rl:{ip:a}:r:m"]);
        let mut s = Split::new(7, p, UnixNs::from_ns(1), vec![vec![0, 2], vec![1]]);
        assert_eq!(s.part_plan(0).checks.len(), 2);
        assert!(!s.record(
            0,
            decided(true, vec![result(true, 4.0), result(true, 9.0)]),
            UnixNs::from_ns(100)
        ));
        assert!(s.record(
            1,
            decided(false, vec![result(false, 0.0)]),
            UnixNs::from_ns(200)
        ));
        let (plan, outcome, at) = s.outcome();
        assert_eq!(at.as_ns(), 200);
        assert_eq!(plan.checks.len(), 3);
        assert!(!outcome.unwrap().allowed);
        let refunds = s.refunds();
        assert_eq!(refunds.len(), 1, "one call for the part that charged");
        let lefts: Vec<(String, u128, f64)> = refunds[0]
            .iter()
            .map(|r| (r.check.key.to_string(), r.charged_at_ns.as_ns(), r.left))
            .collect();
        assert_eq!(
            lefts,
            vec![
                ("rl:{ip:a}:r:s".to_string(), 100, 4.0),
                ("rl:{ip:a}:r:m".to_string(), 100, 9.0)
            ]
        );
    }

    #[test]
    fn every_part_allowed_allows_the_request_with_every_limit() {
        let p = plan(&["rl:{ip:a}:r:s", "rl:{key:b}:k:s"]);
        let mut s = Split::new(7, p, UnixNs::from_ns(1), vec![vec![0], vec![1]]);
        s.record(
            1,
            decided(true, vec![result(true, 3.0)]),
            UnixNs::from_ns(200),
        );
        assert!(s.record(
            0,
            decided(true, vec![result(true, 4.0)]),
            UnixNs::from_ns(100)
        ));
        let (plan, outcome, _) = s.outcome();
        let decision = outcome.unwrap();
        assert!(decision.allowed);
        assert_eq!(plan.checks.len(), 2);
        assert_eq!(decision.limits[0].remaining, 4.0, "in the plan's order");
    }

    #[test]
    fn a_failed_part_fails_the_request_unless_another_was_refused() {
        let p = plan(&["rl:{ip:a}:r:s", "rl:{key:b}:k:s"]);
        let mut s = Split::new(7, p.clone(), UnixNs::from_ns(1), vec![vec![0], vec![1]]);
        s.record(
            0,
            decided(true, vec![result(true, 3.0)]),
            UnixNs::from_ns(100),
        );
        s.record(1, Err(BridgeFailure::NoResponse), UnixNs::from_ns(0));
        assert_eq!(s.outcome().1, Err(BridgeFailure::NoResponse));
        assert_eq!(s.refunds().len(), 1, "given back if the policy refuses");

        let mut s = Split::new(7, p, UnixNs::from_ns(1), vec![vec![0], vec![1]]);
        s.record(0, Err(BridgeFailure::NoResponse), UnixNs::from_ns(0));
        s.record(
            1,
            decided(false, vec![result(false, 0.0)]),
            UnixNs::from_ns(100),
        );
        let (plan, outcome, _) = s.outcome();
        assert!(!outcome.unwrap().allowed, "a refusal from Redis is certain");
        assert_eq!(plan.checks.len(), 1, "over the checks decided");
        assert!(s.refunds().is_empty());
    }

    #[test]
    fn a_shadow_limit_that_refused_was_not_charged_and_is_not_given_back() {
        let mut p = plan(&["rl:{ip:a}:r:s", "rl:{key:b}:k:s", "rl:{ip:a}:w:s"]);
        p.checks[2].mode = crate::check::Mode::Shadow { budget: None };
        let mut s = Split::new(7, p, UnixNs::from_ns(1), vec![vec![0, 2], vec![1]]);
        s.record(
            0,
            decided(true, vec![result(true, 3.0), result(false, 0.0)]),
            UnixNs::from_ns(100),
        );
        s.record(
            1,
            decided(false, vec![result(false, 0.0)]),
            UnixNs::from_ns(100),
        );
        let refunds = s.refunds();
        assert_eq!(refunds[0].len(), 1);
        assert_eq!(&*refunds[0][0].check.key, "rl:{ip:a}:r:s");
    }
}
