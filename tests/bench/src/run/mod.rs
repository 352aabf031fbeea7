//! The runners, one file per part of the bench, each starting the processes it measures and
//! stopping them again; and what they share.

pub mod accuracy;
pub mod busy;
pub mod cluster;
pub mod concurrency;
pub mod flood;
pub mod outage;
pub mod throughput;
pub mod usage;

use std::time::Instant;

use e2e::free_port;
use e2e::procs::{Envoy, WorkDir};

use crate::config::{self, Front, Lease, Policy};
use crate::report::{Report, Timeline};
use crate::settings::Settings;
use crate::{about, measure};

/// A bench run under way: its settings, where the processes write, when it started.
pub struct Bench {
    pub s: Settings,
    pub dir: WorkDir,
    pub started: Instant,
}

impl Bench {
    /// Progress on stderr, with the time since the start.
    pub fn say(&self, text: &str) {
        eprintln!("[{:>4.0}s] {text}", self.started.elapsed().as_secs_f64());
    }

    pub fn start_envoy(&self, front: Front, webdis_port: u16) -> Envoy {
        self.start_envoy_workers(front, webdis_port, 1)
    }

    pub fn start_envoy_workers(&self, front: Front, webdis_port: u16, workers: u32) -> Envoy {
        let port = free_port();
        let mut admin = free_port();
        while admin == port {
            admin = free_port();
        }
        let yaml = config::envoy_yaml(&front, port, admin, webdis_port);
        Envoy::start_config(&self.dir, port, admin, &yaml, workers)
    }
}

/// Every part of the bench, one after the other (with `--only`, the throughput scenarios and
/// rows named), and the report of them.
pub fn everything(b: &Bench, started_utc: String) -> Report {
    let s = &b.s;
    let scenarios = throughput::run(b);
    let all = s.only.is_none();
    let (accuracy, timeline) = if all {
        accuracy::unleased(b)
    } else {
        Default::default()
    };
    // With --only, the busy rows it names.
    let busy = busy::run(b);
    let outages = if all {
        vec![outage::run(b, "open"), outage::run(b, "local")]
    } else {
        Vec::new()
    };
    let floods = if all {
        vec![
            flood::run(b, None),
            flood::run(b, Some(r#"{"new_keys": 1000, "window": "10s"}"#)),
        ]
    } else {
        Vec::new()
    };
    let cluster = if all || s.wants("cluster") {
        cluster::run(b, s.rounds)
    } else {
        Default::default()
    };
    let (accuracy_leased, timeline_leased): (_, Timeline) = if all {
        accuracy::leased(b)
    } else {
        Default::default()
    };
    // With --only, the override, usage and concurrency rows it names (they are quick and need
    // processes of their own).
    let accuracy_overrides = accuracy::overrides(b);
    let usage = usage::run(b);
    let concurrency = concurrency::run(b);
    Report {
        quick: s.quick,
        started_utc,
        took_s: b.started.elapsed().as_secs_f64(),
        commit: about::commit(),
        machine: measure::machine(),
        versions: about::versions(),
        settings: about::settings(s),
        scenarios,
        accuracy,
        timeline,
        chart_file: "overload.svg".into(),
        accuracy_leased,
        timeline_leased,
        chart_file_leased: "overload-leased.svg".into(),
        accuracy_overrides,
        usage,
        concurrency,
        busy,
        leased: leased_policy(s.timeout_ms),
        outages,
        floods,
        cluster,
    }
}

/// `bridge.clock_skew` of the leased runs: every replica here runs on one machine, one clock.
pub const LEASED_CLOCK_SKEW_MS: u64 = 10;

/// The leased throughput scenarios' limit: every request allowed (a burst of 10 million, far
/// more than a run spends) and a bucket never full for long (a refill of 1 per second, far
/// below what the load spends; a lease's 100 units take 100 s to come back), so a lease lasts
/// its `max_ms`. (The filter refuses a burst whose state would live over 732 days: 10 million
/// at 1 per second is 116.) See the report's Leases section.
pub fn leased_policy(timeout_ms: u64) -> Policy {
    Policy {
        lease: Some(Lease::DEFAULT),
        clock_skew_ms: Some(LEASED_CLOCK_SKEW_MS),
        ..filter_policy(10_000_000, 1.0, timeout_ms)
    }
}

pub fn filter_policy(capacity: u64, rate: f64, timeout_ms: u64) -> Policy {
    Policy {
        failure_mode: "open",
        algorithm: "token_bucket",
        capacity,
        rate_per_sec: rate,
        timeout_ms,
        lease: None,
        clock_skew_ms: None,
        overrides: false,
        claim: false,
    }
}

/// Unix time in seconds.
pub fn unix_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use e2e::root;

    /// Every throughput policy makes a config the filter accepts (checked with its own
    /// parser on the shipped config), so no scenario dies at Envoy's start.
    #[test]
    fn the_throughput_policies_are_valid_filter_configs() {
        let shipped = std::fs::read_to_string(root().join("envoy/envoy.yaml")).expect("envoy.yaml");
        let (block, _) = e2e::procs::filter_json_block(&shipped);
        let shipped: serde_json::Value = serde_json::from_str(&block).expect("JSON");
        let policies = [
            filter_policy(1_000_000_000, 1_000_000.0, 150),
            filter_policy(10, 1.0, 150),
            leased_policy(150),
        ];
        for p in policies {
            let json = config::filter_json(&shipped, &[p], false).to_string();
            let parsed = ratelimit_core::Config::parse(json.as_bytes());
            assert!(parsed.is_ok(), "{p:?}: {:?}", parsed.err());
        }
        let leased = config::filter_json(&shipped, &[leased_policy(150)], false).to_string();
        let parsed = ratelimit_core::Config::parse(leased.as_bytes()).expect("valid");
        assert!(parsed.rules[0].limits[0].lease.is_some());
    }
}
