//! The engine's stats not yet handed to the host: the requests answered from leases and the
//! deny cache (counted on the hot path without a host call, handed over at the next tick or
//! reply), the decisions of a reply (one host call per counter for the whole batch, not one
//! per request) and the per-rule counts (both handed over when the callback that counted them
//! returns).

use super::host::Host;
use crate::check::LimitCheck;
use crate::config::Config;
use crate::metrics::{Counter, PendingCounts, RuleCount, RuleEvent, RuleStats};
use crate::request::plan::Plan;

#[derive(Debug, Default)]
pub struct Tally {
    rule_stats: RuleStats,
    /// Per-rule counts not yet added to the stats.
    pending: PendingCounts,
    /// Deny-cache refusals not yet added (`ratelimit_denied`, `ratelimit_deny_cache_hits`).
    deny_hits: u64,
    /// Requests allowed from leases not yet added (`ratelimit_allowed`, `ratelimit_lease_hits`).
    lease_hits: u64,
    /// Global counts not yet added (a reply's decisions), each counter once.
    counts: Vec<(Counter, u64)>,
}

impl Tally {
    pub fn new(config: &Config) -> Self {
        let rule_stats = RuleStats::new(config);
        Tally {
            pending: PendingCounts::new(rule_stats.len()),
            rule_stats,
            ..Default::default()
        }
    }

    /// Counts one more of `counter`, added at the next [`Tally::flush`].
    pub fn count(&mut self, counter: Counter) {
        match self.counts.iter_mut().find(|(c, _)| *c == counter) {
            Some((_, n)) => *n += 1,
            None => self.counts.push((counter, 1)),
        }
    }

    /// Counts `event` on a limit of a rule.
    pub fn rule(&mut self, check: &LimitCheck, event: RuleEvent) {
        self.pending
            .add(self.rule_stats.event(check.rule, check.limit, event));
    }

    /// Adds `n` to `event` on a limit of a rule.
    pub fn rule_n(&mut self, check: &LimitCheck, event: RuleEvent, n: u64) {
        self.pending
            .add_n(self.rule_stats.event(check.rule, check.limit, event), n);
    }

    /// Counts `count` on rule `rule`.
    pub fn rule_count(&mut self, rule: usize, count: RuleCount) {
        self.pending.add(self.rule_stats.count(rule, count));
    }

    /// A request of `plan` was allowed from leases.
    pub fn lease_hit(&mut self, plan: &Plan) {
        self.lease_hits += 1;
        for check in &plan.checks {
            self.rule(check, RuleEvent::Allowed);
        }
    }

    /// A request was refused from the deny cache, by the limits `checks`.
    pub fn deny_hit(&mut self, checks: &[LimitCheck]) {
        self.deny_hits += 1;
        for check in checks {
            self.rule(check, RuleEvent::Denied);
        }
    }

    /// Whether nothing waits to be handed to the host.
    pub fn is_empty(&self) -> bool {
        self.deny_hits == 0 && self.lease_hits == 0 && self.pending.is_empty()
    }

    /// Deny-cache refusals not handed to the host yet.
    #[cfg(test)]
    pub fn uncounted_deny_hits(&self) -> u64 {
        self.deny_hits
    }

    /// Hands what was counted since the last time to the host.
    pub fn flush(&mut self, host: &mut impl Host) {
        let n = std::mem::take(&mut self.deny_hits);
        if n > 0 {
            host.count_n(Counter::Denied, n);
            host.count_n(Counter::DenyCacheHits, n);
        }
        let n = std::mem::take(&mut self.lease_hits);
        if n > 0 {
            host.count_n(Counter::Allowed, n);
            host.count_n(Counter::LeaseHits, n);
        }
        for (counter, n) in self.counts.drain(..) {
            host.count_n(counter, n);
        }
        self.pending.drain(|stat, n| host.count_rule(stat, n));
    }
}
