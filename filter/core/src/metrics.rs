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
    }
}

stats! {
    /// Gauges (summed over the workers, each adding and taking away its own part).
    Gauge {
        /// Workers whose circuit breaker is open.
        BreakerOpen => "ratelimit_breaker_open",
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
        assert_eq!(Counter::ALL.len(), 13);
        assert!(names.iter().all(|n| n.starts_with("ratelimit_")));
    }
}
