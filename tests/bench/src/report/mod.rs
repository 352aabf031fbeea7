//! The report of one bench run: the model (`model`), a table builder (`table`), the prose of
//! each section (one file each, an `impl Report` block apiece), and results.json (`json`).
//!
//! Every throughput figure is a median over rounds with its range: a scenario's runs are
//! set against the runs of its reference scenario nearest before and after them (see
//! [`model::against`]), so a slowdown that starts midway moves one round, not the ratio.

mod accuracy;
mod busy;
mod capacity;
mod claims;
mod cluster;
mod concurrency;
mod flood;
pub mod format;
mod json;
mod leases;
pub mod model;
mod outage;
mod overrides;
mod table;
mod throughput;
mod usage;

pub use claims::CLAIM_OVER_HEADER_TARGET_US;
pub use format::thousands;
pub use json::rounds_problems;
pub use leases::LEASED_OVER_UNLEASED_TARGET;
pub use model::*;

use crate::measure::Machine;
use crate::spread::Spread;

pub struct Report {
    pub quick: bool,
    pub started_utc: String,
    pub took_s: f64,
    pub commit: String,
    pub machine: Machine,
    pub versions: Vec<(String, String)>,
    pub settings: Vec<(String, String)>,
    pub scenarios: Vec<Scenario>,
    pub accuracy: Vec<Accuracy>,
    pub timeline: Timeline,
    pub chart_file: String,
    /// The accuracy runs and the overload timeline again, with leases on.
    pub accuracy_leased: Vec<Accuracy>,
    pub timeline_leased: Timeline,
    pub chart_file_leased: String,
    /// The accuracy rows on keys with an override.
    pub accuracy_overrides: Vec<OverrideAccuracy>,
    /// The accuracy rows of usage limits.
    pub usage: Vec<UsageAccuracy>,
    /// The accuracy row of a concurrency limit.
    pub concurrency: Option<ConcurrencyAccuracy>,
    /// The busy-machine rows.
    pub busy: Vec<BusyRow>,
    /// The leased throughput scenarios' policy.
    pub leased: crate::config::Policy,
    pub outages: Vec<Outage>,
    pub floods: Vec<KeyFlood>,
    pub cluster: ClusterSection,
}

/// The scenario every filter scenario is also compared with: the filter loaded, no rule
/// matching, the floor any wasm filter pays here.
pub const PASS_THROUGH: &str = "filter-pass-through";

/// The floor of the usage scenarios: the filter loaded on the LLM upstream, no rule matching.
pub const PASS_THROUGH_LLM: &str = "filter-pass-through-llm";

impl Report {
    pub fn scenario(&self, name: &str) -> Option<&Scenario> {
        self.scenarios.iter().find(|s| s.name == name)
    }

    /// `s`'s req/s over `reference`'s, per round (each run of `s` against the reference's runs
    /// around it); None when the reference did not run.
    pub fn ratio_to(&self, s: &Scenario, reference: &str) -> Option<Spread> {
        if s.name == reference {
            return Some(Spread::new(vec![1.0; s.rounds().rounds.len()]));
        }
        let by_round = per_round(&against(s, self.scenario(reference)?), |x, r| x / r);
        (!by_round.is_empty()).then(|| Spread::new(by_round.into_values().collect()))
    }

    /// Against the scenario `s` names as its comparison.
    pub fn ratio(&self, s: &Scenario) -> Option<Spread> {
        self.ratio_to(s, &s.compare_to)
    }

    /// Throughput of a filter scenario over `filter-pass-through`.
    pub fn pass_through_ratio(&self, s: &Scenario) -> Option<Spread> {
        (s.filter && s.compare_to == "baseline")
            .then(|| self.ratio_to(s, PASS_THROUGH))
            .flatten()
    }

    /// Scenario `a` over scenario `b`, per round: each over the pass-through runs around it,
    /// one over the other (so a slowdown between the two runs cancels); without
    /// pass-through runs, their req/s in the same round.
    pub fn pair_ratio(&self, a: &str, b: &str) -> Option<Spread> {
        let (a, b) = (self.scenario(a)?, self.scenario(b)?);
        let of = |s: &Scenario| match self.scenario(PASS_THROUGH) {
            Some(p) => per_round(&against(s, p), |x, r| x / r),
            None => per_round(
                &s.runs
                    .iter()
                    .map(|m| (m.round, m.run.rps, 1.0))
                    .collect::<Vec<_>>(),
                |x, _| x,
            ),
        };
        let (ra, rb) = (of(a), of(b));
        let rounds: Vec<f64> = ra
            .iter()
            .filter_map(|(round, x)| rb.get(round).filter(|y| **y > 0.0).map(|y| x / y))
            .collect();
        (!rounds.is_empty()).then(|| Spread::new(rounds))
    }

    pub fn markdown(&self) -> String {
        let mut r = String::new();
        let mode = if self.quick {
            "Quick mode (`make bench-quick`): every scenario, in short runs; a smoke test, not figures to quote."
        } else {
            "Full run (`make bench`)."
        };
        let rounds = self
            .scenarios
            .iter()
            .map(|s| s.rounds().rounds.len())
            .max()
            .unwrap_or(0);
        r += "# Benchmark report\n\n";
        r += &format!(
            "{mode} Started {} UTC, took {:.0} s, at commit {}. **All figures come from this one run**, on a 2-core machine that other work (tests run by others) may have shared: absolute numbers are noisy. The throughput scenarios ran in {rounds} interleaved rounds, each run set against the runs of Envoy alone and of the pass-through filter nearest before and after it; every ratio is the median over the rounds, with the lowest and highest round in brackets. A range that is wide says the machine was disturbed during the run.\n\n",
            self.started_utc, self.took_s, self.commit
        );
        r += "## Machine and versions\n\n";
        let m = &self.machine;
        r += &format!(
            "- CPU: {}, {} cores; {:.1} GiB memory; {}; Linux {}\n",
            m.cpu_model, m.cores, m.memory_gib, m.os, m.kernel
        );
        for (name, version) in &self.versions {
            r += &format!("- {name}: {version}\n");
        }
        r += "\n## Settings\n\n";
        for (name, value) in &self.settings {
            r += &format!("- {name}: {value}\n");
        }
        r += "\n## Throughput and latency\n\n";
        r += &self.throughput_text();
        r += "\n## Fleet capacity\n\n";
        r += &self.capacity_text();
        r += "\n## Where the cost is\n\n";
        r += &self.cost_text();
        r += "\n## Where a filtered request's time goes, phase by phase\n\n";
        r += &self.phase_text();
        r += "\n## Leases\n\n";
        r += &self.lease_text();
        r += "\n## Overrides\n\n";
        r += &self.override_cost_text();
        r += "\n## Keys from verified metadata\n\n";
        r += &self.claim_cost_text();
        r += "\n## Global accuracy\n\n";
        r += &self.accuracy_text();
        r += "\n### With leases\n\n";
        r += &self.accuracy_leased_text();
        r += "\n### With an override\n\n";
        r += &self.accuracy_overrides_text();
        r += "\n### On a busy machine\n\n";
        r += &self.busy_text();
        r += "\n### Usage limits (LLM tokens)\n\n";
        r += &self.usage_text();
        r += "\n### Concurrency limits (requests in flight)\n\n";
        r += &self.concurrency_text();
        r += "\n## Under 3× overload, over time\n\n";
        r += &self.timeline_text();
        r += "\n### With leases\n\n";
        r += &self.timeline_leased_text();
        r += "\n## A bridge outage, over time\n\n";
        for o in &self.outages {
            r += &outage::outage_text(o);
        }
        r += "\n## A flood of new client addresses\n\n";
        r += &self.flood_text();
        r += "\n## Redis Cluster\n\n";
        r += &self.cluster_text();
        r += "\n## Raw outputs\n\n";
        r += &format!(
            "Beside this report: `results.json` (every figure above and the counters behind them; each throughput scenario with its req/s per round under `rounds` and its CPU per request per round under `cpu_us_per_request`), `raw/*.wrk.txt` (wrk's output of every run, named by scenario, round and place in the run, warm-ups too), `raw/overload-per-second.csv` and `raw/overload-leased-per-second.csv`, `{}` and `{}`, and `procs/` (the configs and logs of every process the run started).\n",
            self.chart_file, self.chart_file_leased
        );
        r
    }

    /// Names of scenarios or parts missing from the markdown: empty when complete.
    pub fn missing(&self, markdown: &str) -> Vec<String> {
        let mut missing: Vec<String> = SCENARIOS
            .iter()
            .filter(|name| !markdown.contains(&format!("| `{name}` |")))
            .map(|s| s.to_string())
            .collect();
        for algorithm in crate::config::ALGORITHMS.iter().map(|a| a.name) {
            for replicas in [2, 4] {
                let found = self
                    .accuracy
                    .iter()
                    .any(|a| a.algorithm == *algorithm && a.replicas == replicas && a.sent > 0);
                if !found {
                    missing.push(format!("accuracy {algorithm} {replicas} replicas"));
                }
            }
        }
        for algorithm in CONCURRENT_ALGORITHMS {
            let found = self
                .accuracy
                .iter()
                .any(|a| a.algorithm == *algorithm && a.workers > 1 && a.sent > 0);
            if !found {
                missing.push(format!("accuracy {algorithm} with several workers"));
            }
        }
        if self.cluster.throughput.len() < 2
            || self.cluster.throughput.iter().any(|t| t.run.requests == 0)
        {
            missing.push("cluster throughput".to_string());
        }
        for shards in [1, 3] {
            if !self
                .cluster
                .accuracy
                .iter()
                .any(|a| a.shards == shards && a.run.sent > 0)
            {
                missing.push(format!("cluster accuracy with {shards} shard(s)"));
            }
        }
        for budget in [false, true] {
            if !self
                .floods
                .iter()
                .any(|f| f.budget.is_some() == budget && f.addresses > 0 && f.lost == 0)
            {
                missing.push(format!(
                    "key flood {}",
                    if budget {
                        "with a budget"
                    } else {
                        "without a budget"
                    }
                ));
            }
        }
        for mode in ["open", "local"] {
            if !self
                .outages
                .iter()
                .any(|o| o.failure_mode == mode && !o.slices.is_empty())
            {
                missing.push(format!("outage timeline, failure mode {mode}"));
            }
        }
        if self.timeline.per_second.is_empty() {
            missing.push("overload timeline".into());
        }
        for name in BUSY_ROWS {
            if !self
                .busy
                .iter()
                .any(|r| r.name == *name && (r.hot_requests > 0 || r.skipped.is_some()))
            {
                missing.push(format!("busy-machine row {name}"));
            }
        }
        for algorithm in LEASED_ALGORITHMS {
            let found = self
                .accuracy_leased
                .iter()
                .any(|a| a.algorithm == *algorithm && a.sent > 0);
            if !found {
                missing.push(format!("accuracy {algorithm} with leases"));
            }
        }
        for (name, _) in OVERRIDE_ROWS {
            if !self
                .accuracy_overrides
                .iter()
                .any(|o| o.name == *name && o.run.sent > 0)
                || !markdown.contains(&format!("| `{name}` |"))
            {
                missing.push(format!("override accuracy row {name}"));
            }
        }
        for (name, _, _) in USAGE_ROWS {
            if !self.usage.iter().any(|u| u.name == *name && u.sent > 0)
                || !markdown.contains(&format!("| `{name}` |"))
            {
                missing.push(format!("usage accuracy row {name}"));
            }
        }
        if self.concurrency.as_ref().is_none_or(|c| c.sent == 0)
            || !markdown.contains(&format!("| `{CONCURRENCY_ROW}` |"))
        {
            missing.push(format!("concurrency accuracy row {CONCURRENCY_ROW}"));
        }
        if self.timeline_leased.per_second.is_empty() {
            missing.push("overload timeline with leases".into());
        }
        if self.capacity().len() < CAPACITY_SCENARIOS.len()
            || self
                .capacity()
                .iter()
                .any(|c| c.envoy.is_empty() || (c.decided && c.redis.is_empty()))
        {
            missing.push("the fleet capacity table".into());
        }
        if self.phases().len() < PHASES.len() {
            missing.push("the per-phase table".into());
        }
        missing
    }
}

#[cfg(test)]
mod tests;
