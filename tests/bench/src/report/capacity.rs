//! The Fleet capacity section: what one core of Redis, Webdis and Envoy carries, from the
//! headline table's CPU per request and per decision.

use serde_json::{json, Value};

use super::format::thousands;
use super::table::Table;
use super::{Report, Scenario, CAPACITY_SCENARIOS, PASS_THROUGH};
use crate::spread::Spread;

/// One row: a scenario and what a core carries under it, per round.
#[derive(Clone, Debug)]
pub struct Capacity<'a> {
    pub scenario: &'a Scenario,
    /// Whether Redis decides its requests (not a reference: Envoy alone, the floor).
    pub decided: bool,
    /// Decisions per second per core of Redis and of Webdis (none without the filter).
    pub redis: Spread,
    pub webdis: Spread,
    /// Requests per second per core of Envoy.
    pub envoy: Spread,
}

/// 1,000,000 over each round's µs: units per second per core, per round.
fn per_core(us: &Spread) -> Spread {
    Spread::new(
        us.rounds
            .iter()
            .filter(|v| **v > 0.0)
            .map(|v| 1e6 / v)
            .collect(),
    )
}

fn cell(s: &Spread) -> String {
    s.cell_with(thousands)
}

impl Report {
    /// The capacity rows of the scenarios that ran, in [`CAPACITY_SCENARIOS`]' order.
    pub fn capacity(&self) -> Vec<Capacity<'_>> {
        CAPACITY_SCENARIOS
            .iter()
            .filter_map(|name| self.scenario(name))
            .map(|s| Capacity {
                scenario: s,
                decided: !["baseline", PASS_THROUGH].contains(&s.name.as_str()),
                redis: per_core(&s.cpu_us_per_decision("redis")),
                webdis: per_core(&s.cpu_us_per_decision("webdis")),
                envoy: per_core(&s.cpu_us_per_request("envoy")),
            })
            .collect()
    }

    pub fn capacity_table(&self) -> String {
        let mut t = Table::new()
            .left("scenario")
            .right("mean batch")
            .right("decisions/s per Redis core")
            .right("decisions/s per Webdis core")
            .right("requests/s per Envoy core");
        for c in self.capacity() {
            t.row([
                format!("`{}`", c.scenario.name),
                c.scenario
                    .cost
                    .mean_batch()
                    .map_or("–".into(), |b| format!("{b:.1}")),
                cell(&c.redis),
                cell(&c.webdis),
                cell(&c.envoy),
            ]);
        }
        t.render()
    }

    pub(super) fn capacity_text(&self) -> String {
        if self.capacity().is_empty() {
            return "Not run.\n".into();
        }
        let mut r = String::from(
            "What one core of each process carries at 100% CPU, from the headline table: per round, 1,000,000 over the round's µs of CPU per decision Redis made (Redis, Webdis) or per request (Envoy, 1 worker); the median over the rounds, lowest–highest round in brackets. The decided rows are those in which Redis decides every request (no deny cache, no lease); `baseline` and `filter-pass-through` give Envoy's side without the filter and at the floor.\n\n",
        );
        r += &self.capacity_table();
        r += "\nA fleet deciding R requests per second needs about R over a row's figure in cores of each (more for headroom: size at the utilisation you can run at). Redis's figure holds at the mean batch of the run: a call's fixed cost is shared by the decisions it carries, and a large fleet, whose workers each see few concurrent requests, sends about one decision per call, each then paying the whole fixed cost (`docs/scaling.md` derives the fleet from these figures). The usage row's decision includes its settlement (the usage read from the answer and the rest given back, on a later call).\n";
        r
    }

    /// The rows for results.json.
    pub(super) fn capacity_json(&self) -> Value {
        self.capacity()
            .iter()
            .map(|c| {
                json!({
                    "scenario": c.scenario.name,
                    "mean_batch": c.scenario.cost.mean_batch(),
                    "redis_decisions_per_core_s": c.redis.json(),
                    "webdis_decisions_per_core_s": c.webdis.json(),
                    "envoy_requests_per_core_s": c.envoy.json(),
                })
            })
            .collect()
    }
}
