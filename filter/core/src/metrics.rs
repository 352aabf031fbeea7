//! The filter's stats, declared once: each list below makes the enum, its `ALL` and its
//! names, so a new stat cannot be forgotten in one of them. In `/stats` a stat shows as
//! `wasmcustom.NAME`, in `/stats/prometheus` as `NAME`.

macro_rules! stats {
    ($(#[$meta:meta])* $kind:ident { $($(#[$doc:meta])* $variant:ident => $name:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $kind {
            $($(#[$doc])* $variant,)*
        }

        impl $kind {
            pub const ALL: &'static [$kind] = &[$($kind::$variant,)*];

            pub fn name(self) -> &'static str {
                match self {
                    $($kind::$variant => $name,)*
                }
            }
        }
    };
}

stats! {
    /// Counters.
    Counter {
        Allowed => "ratelimit_allowed",
        Denied => "ratelimit_denied",
        /// Allowed, but a shadow limit would have refused it.
        ShadowDenied => "ratelimit_shadow_denied",
        FailureModeOpen => "ratelimit_failure_mode_open",
        FailureModeClosed => "ratelimit_failure_mode_closed",
        /// Decided by the worker alone, in memory, because the bridge failed.
        FailureModeLocal => "ratelimit_failure_mode_local",
        BridgeErrors => "ratelimit_bridge_errors",
        ScriptLoads => "ratelimit_script_loads",
        /// Answered 400: a bad or repeated header the limiter reads.
        BadRequests => "ratelimit_bad_requests",
        /// Decision calls sent to the bridge (each decides a batch of requests).
        BridgeCalls => "ratelimit_bridge_calls",
        /// Refused by the worker's deny cache, without a call.
        DenyCacheHits => "ratelimit_deny_cache_hits",
        /// A worker forgot the refusals it held because Redis restarted.
        DenyCacheResets => "ratelimit_deny_cache_resets",
        /// A worker's circuit breaker opened.
        BreakerTrips => "ratelimit_breaker_trips",
        /// A new identity arrived while its rule's key budget was used up.
        KeyBudgetExceeded => "ratelimit_key_budget_exceeded",
        /// Redis Cluster: calls giving back what one slot charged for a request another slot
        /// refused.
        Refunds => "ratelimit_refunds",
        /// Redis Cluster: requests sent again because a node did not serve their keys or
        /// their slot was moving (nothing of them had run).
        ClusterResends => "ratelimit_cluster_resends",
        /// Redis Cluster: slot maps learnt from a node (which slots share a master).
        ClusterSlotMaps => "ratelimit_cluster_slot_maps",
        /// Allowed from units this worker had leased, without a call.
        LeaseHits => "ratelimit_lease_hits",
        /// Leases granted (a decision that also took units for later requests).
        LeaseGrants => "ratelimit_lease_grants",
        /// Calls asking for the next lease before the current one runs out.
        LeasePrefetches => "ratelimit_lease_prefetches",
        /// Leased units not spent in time, offered back to Redis (the script gives back
        /// only what their charge still holds back).
        LeaseUnitsReturned => "ratelimit_lease_units_returned",
        /// A callback found the worker's engine still held by another callback (a host call
        /// that re-entered the filter) and went on without it: a request continued
        /// undecided, a bridge reply was dropped, a timer or wake-up was skipped, or a
        /// finished request was not forgotten. Expected to stay 0.
        EngineBusy => "ratelimit_engine_busy",
        /// Usage settlements dropped without reaching Redis: beyond the bound on those kept
        /// for later, or a give-back whose call timed out (it may have been made).
        UsageSettlementsLost => "ratelimit_usage_settlements_lost",
        /// Usage settlements and concurrency releases sent in a decision call going out
        /// anyway, rather than in a call of their own.
        UsageSettlementsRiding => "ratelimit_usage_settlements_riding",
        /// Calls settling usage limits.
        UsageSettlementCalls => "ratelimit_usage_settlement_calls",
        /// Milliseconds the worker's timer fired late (beyond 5 ms of jitter): time the
        /// worker could not run on time (CPU contention, a CPU quota). Not counted against
        /// the bridge: request timeouts count the worker's own time.
        WorkerLagMs => "ratelimit_worker_lag_ms",
        /// Requests whose call had no answer within their timeout (or waited past it): the
        /// bridge slow or hung. A subset of `ratelimit_bridge_errors`.
        BridgeTimeouts => "ratelimit_bridge_timeouts",
        /// Calls the bridge refused because Webdis refused the filter's credentials or its
        /// `EVALSHA` (401/403): decision calls, the breaker's probes, settlements.
        MisconfiguredBridgeAuth => "ratelimit_misconfigured_bridge_auth",
        /// Calls whose reply was Redis's ACL refusing a command or key the decision script
        /// needs (`NOPERM`), once per call however many of its requests it refused.
        MisconfiguredRedisAcl => "ratelimit_misconfigured_redis_acl",
        /// Script loads refused, by Webdis's ACL (403) or Redis's (`NOPERM`).
        MisconfiguredScriptLoadRefused => "ratelimit_misconfigured_script_load_refused",
    }
}

stats! {
    /// What happened to one limit of one rule on one request: a counter per rule, limit and
    /// event, `ratelimit_rule.<rule>.<limit>.<event>`.
    RuleEvent {
        /// The request was allowed, and this limit allowed it.
        Allowed => "allowed",
        /// This limit refused the request (by Redis or the deny cache).
        Denied => "denied",
        /// This limit of a shadow rule would have refused the request.
        ShadowDenied => "shadow_denied",
        /// The bridge failed and the request was let through.
        FailedOpen => "failed_open",
        /// The bridge failed and the request was answered 503.
        FailedClosed => "failed_closed",
        /// The bridge failed and this worker decided the limit in memory.
        FailedLocal => "failed_local",
        /// Usage limits: units charged before the request went upstream (`reserve`).
        UsageReserved => "usage_reserved",
        /// Usage limits: units of usage read from responses (or the estimate where it could
        /// not be read), the final charge of each response.
        UsageCharged => "usage_charged",
        /// Usage limits: reserved units given back (the usage was below the estimate).
        UsageGivenBack => "usage_given_back",
        /// Usage limits: units charged above the estimate (debt).
        UsageDebt => "usage_debt",
        /// Usage limits: responses whose usage could not be read (the estimate stands).
        UsageUnread => "usage_unread",
        /// Redis decided this limit under the identity's override.
        Overridden => "overridden",
        /// The identity's override of this limit is malformed: ignored, the config decided.
        BadOverride => "bad_override",
        /// This limit refused a request that costs more than it ever holds (its burst or
        /// limit): no wait would have let it through.
        NeverFits => "never_fits",
    }
}

stats! {
    /// What happened to a request on one rule (once per rule and request, whatever its
    /// limits): a counter per rule and event, `ratelimit_rule.<rule>.<event>`.
    RuleCount {
        /// A new identity found the rule's key budget used up.
        KeyBudgetExceeded => "key_budget_exceeded",
        /// The bridge did not answer in time (slow or hung): the rule's policy decided.
        TimedOut => "timed_out",
        /// The bridge failed otherwise (refused, reset, an HTTP or Redis error, a reply that
        /// cannot be read): the rule's policy decided.
        BridgeError => "bridge_error",
        /// The breaker was open, no call was made: the rule's policy decided.
        BreakerOpen => "breaker_open",
    }
}

/// Where per-rule stats start in Envoy: `ratelimit_rule.<rule>.<limit>.<event>` and
/// `ratelimit_rule.<rule>.<count>` (a [`RuleCount`]). Envoy's `stats_tags` (see envoy/envoy.yaml)
/// turn the names into `ratelimit_rule_<event>{rule="…",limit="…"}` for Prometheus. Rule and
/// limit names hold only letters, digits, `-` and `_`, so the dots are unambiguous.
pub const RULE_STAT_PREFIX: &str = "ratelimit_rule";

/// The per-rule stats of a configuration, numbered: for each rule, for each of its limits,
/// one per [`RuleEvent`]; then for each rule one per [`RuleCount`]. Cardinality follows the
/// configuration, never the identities.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuleStats {
    /// Index of each rule's first limit stat.
    starts: Vec<usize>,
    limits: usize,
}

impl RuleStats {
    pub fn new(config: &crate::config::Config) -> Self {
        let mut starts = Vec::with_capacity(config.rules.len());
        let mut limits = 0;
        for rule in &config.rules {
            starts.push(limits);
            limits += rule.limits.len();
        }
        RuleStats { starts, limits }
    }

    /// How many stats there are.
    pub fn len(&self) -> usize {
        self.limits * RuleEvent::ALL.len() + self.starts.len() * RuleCount::ALL.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stat of `event` on limit `limit` of rule `rule`.
    pub fn event(&self, rule: usize, limit: usize, event: RuleEvent) -> Option<usize> {
        let start = self.starts.get(rule)?;
        Some((start + limit) * RuleEvent::ALL.len() + event as usize)
    }

    /// The stat of `count` on rule `rule`.
    pub fn count(&self, rule: usize, count: RuleCount) -> Option<usize> {
        (rule < self.starts.len()).then(|| {
            self.limits * RuleEvent::ALL.len() + rule * RuleCount::ALL.len() + count as usize
        })
    }

    /// Every stat's name, by index.
    pub fn names(config: &crate::config::Config) -> Vec<String> {
        let mut names = Vec::new();
        for rule in &config.rules {
            for limit in &rule.limits {
                for event in RuleEvent::ALL {
                    names.push(format!(
                        "{RULE_STAT_PREFIX}.{}.{}.{}",
                        rule.name,
                        limit.name,
                        event.name()
                    ));
                }
            }
        }
        for rule in &config.rules {
            for count in RuleCount::ALL {
                names.push(format!("{RULE_STAT_PREFIX}.{}.{}", rule.name, count.name()));
            }
        }
        names
    }
}

/// Per-rule counts a worker has not yet handed to the host: counted in memory on the request
/// path, added to Envoy's stats in one host call per stat on the worker's tick.
#[derive(Debug, Default)]
pub struct PendingCounts {
    counts: Vec<u64>,
    touched: Vec<usize>,
}

impl PendingCounts {
    pub fn new(stats: usize) -> Self {
        PendingCounts {
            counts: vec![0; stats],
            touched: Vec::new(),
        }
    }

    pub fn add(&mut self, stat: Option<usize>) {
        self.add_n(stat, 1);
    }

    pub fn add_n(&mut self, stat: Option<usize>, n: u64) {
        if n == 0 {
            return;
        }
        let Some(i) = stat else {
            return;
        };
        let Some(count) = self.counts.get_mut(i) else {
            return;
        };
        if *count == 0 {
            self.touched.push(i);
        }
        *count = count.saturating_add(n);
    }

    pub fn is_empty(&self) -> bool {
        self.touched.is_empty()
    }

    /// Hands every pending count to `report` (stat, count) and forgets them.
    pub fn drain(&mut self, mut report: impl FnMut(usize, u64)) {
        for i in self.touched.drain(..) {
            if let Some(count) = self.counts.get_mut(i) {
                report(i, std::mem::take(count));
            }
        }
    }
}

stats! {
    /// Gauges (summed over the workers, each adding and taking away its own part).
    Gauge {
        /// Workers whose circuit breaker is open.
        BreakerOpen => "ratelimit_breaker_open",
        /// Workers whose timer runs: they have work under way (requests waiting or calls
        /// out, an open breaker, leases, settlements or releases to send). 0 when idle.
        WorkerTimers => "ratelimit_worker_timers",
    }
}

stats! {
    /// Histograms.
    Histogram {
        /// Requests decided by one bridge call.
        BatchSize => "ratelimit_batch_size",
        /// Milliseconds (rounded up) from a request's headers to its verdict, for requests
        /// that waited for the bridge.
        DecisionMs => "ratelimit_decision_ms",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn every_stat_is_listed_once_with_its_own_name() {
        let mut names: Vec<&str> = Counter::ALL.iter().map(|c| c.name()).collect();
        names.extend(Histogram::ALL.iter().map(|h| h.name()));
        names.extend(Gauge::ALL.iter().map(|g| g.name()));
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count);
        assert_eq!(Counter::ALL.len(), 30);
        assert!(names.iter().all(|n| n.starts_with("ratelimit_")));
    }

    #[test]
    fn rule_stats_are_numbered_in_the_order_of_their_names() {
        let config = crate::config::Config::parse(
            br#"{"rules": [
              {"name": "api", "limits": [{"name": "second", "limit": 5, "window": "1s"},
                                         {"name": "day", "limit": 50, "window": "1d"}]},
              {"name": "login", "limits": [{"name": "minute", "limit": 5, "window": "1m"}]}]}"#,
        )
        .unwrap();
        let stats = RuleStats::new(&config);
        let names = RuleStats::names(&config);
        assert_eq!(stats.len(), names.len());
        assert_eq!(
            names.len(),
            3 * RuleEvent::ALL.len() + 2 * RuleCount::ALL.len()
        );
        let name = |i: Option<usize>| names[i.unwrap()].as_str();
        assert_eq!(
            name(stats.event(0, 1, RuleEvent::Denied)),
            "ratelimit_rule.api.day.denied"
        );
        assert_eq!(
            name(stats.event(1, 0, RuleEvent::FailedLocal)),
            "ratelimit_rule.login.minute.failed_local"
        );
        assert_eq!(
            name(stats.count(1, RuleCount::KeyBudgetExceeded)),
            "ratelimit_rule.login.key_budget_exceeded"
        );
        assert_eq!(
            name(stats.count(0, RuleCount::TimedOut)),
            "ratelimit_rule.api.timed_out"
        );
        assert_eq!(
            name(stats.count(1, RuleCount::BreakerOpen)),
            "ratelimit_rule.login.breaker_open"
        );
        assert_eq!(stats.event(2, 0, RuleEvent::Allowed), None);
        assert_eq!(stats.count(2, RuleCount::TimedOut), None);
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
    }

    #[test]
    fn pending_counts_are_handed_over_once() {
        let mut pending = PendingCounts::new(4);
        pending.add(Some(2));
        pending.add(Some(0));
        pending.add(Some(2));
        pending.add(Some(9)); // out of range: ignored
        pending.add(None);
        let mut seen = Vec::new();
        pending.drain(|i, n| seen.push((i, n)));
        assert_eq!(seen, [(2, 2), (0, 1)]);
        pending.drain(|i, n| seen.push((i, n)));
        assert_eq!(seen.len(), 2, "nothing twice");
    }
}
