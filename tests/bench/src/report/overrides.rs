//! The Overrides sections: what overrides on cost a key that has none (the allow scenario
//! with and without them), and the accuracy rows on keys with an override.

use serde_json::{json, Value};

use super::accuracy::{accuracy_cells, accuracy_columns_after};
use super::format::{opt2, thousands};
use super::table::Table;
use super::throughput::us_cell;
use super::{OverrideAccuracy, Report, Scenario, OVERRIDE_PAIR, PASS_THROUGH};

impl Report {
    /// The allow scenario with overrides off and on, side by side, and on over off per round.
    pub(super) fn override_cost_text(&self) -> String {
        let (off, on) = OVERRIDE_PAIR;
        if self.scenario(on).is_none() {
            return "Not run.\n".into();
        }
        let mut r = format!(
            "`{on}` runs the rule and load of `{off}` on an Envoy of its own whose limit has `\"overrides\": true`, with no override set in Redis: every decision also reads the key's override (`HMGET` of `<state key>:override`, in the same script call as the state) and finds none. The two rows side by side say what overrides on cost the identities that have none.\n\n"
        );
        let mut t = Table::new()
            .left("scenario")
            .right("req/s")
            .right("× baseline")
            .right(&format!("× {PASS_THROUGH}"))
            .right("CPU µs / req: Envoy")
            .right("Webdis")
            .right("Redis")
            .right("Redis commands / decision")
            .right("HMGET / decision")
            .right("fail-open");
        for name in [off, on] {
            let Some(s) = self.scenario(name) else {
                continue;
            };
            let cpu = |label: &str| us_cell(&s.cpu_us_per_request(label));
            let per_decision = |n: u64| {
                let decisions = s.cost.redis_decisions();
                opt2((decisions > 0).then(|| n as f64 / decisions as f64))
            };
            t.row([
                format!("`{name}`"),
                thousands(s.run.rps),
                self.ratio(s).map_or("–".into(), |v| v.cell()),
                self.pass_through_ratio(s).map_or("–".into(), |v| v.cell()),
                cpu("envoy"),
                cpu("webdis"),
                cpu("redis"),
                per_decision(s.cost.redis_total()),
                per_decision(hmget(s)),
                thousands(s.cost.fail_open as f64),
            ]);
        }
        r += &t.render();
        r += "\nCPU per request: as in the headline table (µs per request wrk completed, per round; the median and range). Redis commands (and `HMGET`s) per decision: `INFO commandstats` calls, the commands inside the script included, over the filter's decisions; the token bucket reads its state with one `HMGET`, and with overrides on each decision reads the override with another.\n";
        if let Some(spread) = self.pair_ratio(on, off) {
            r += &format!(
                "\nOverrides on over off, per round (each scenario's req/s over the `{PASS_THROUGH}` runs around it, then one over the other, so a slowdown between the two cancels): **{}**, rounds {}.\n",
                spread.cell(),
                spread
                    .rounds
                    .iter()
                    .map(|v| format!("{v:.2}"))
                    .collect::<Vec<_>>()
                    .join(" / ")
            );
        }
        r
    }

    pub fn accuracy_overrides_table(&self) -> String {
        let mut t = accuracy_columns_after(
            Table::new()
                .left("row")
                .left("config: limit per 1 s, burst")
                .left("override: limit per 1 s, burst"),
        )
        .right("allowance under the config")
        .right("decisions under the override")
        .right("malformed overrides");
        for o in &self.accuracy_overrides {
            let mut cells = vec![
                format!("`{}`", o.name),
                format!("{}, {}", o.config_limit, o.config_burst),
                format!("{}, {}", o.run.rate_per_sec, o.run.capacity),
            ];
            cells.extend(accuracy_cells(&o.run));
            cells.extend([
                format!("{:.1}", o.config_allowance),
                thousands(o.overridden as f64),
                o.bad_override.to_string(),
            ]);
            t.row(cells);
        }
        t.render()
    }

    pub(super) fn accuracy_overrides_text(&self) -> String {
        let Some(o) = self.accuracy_overrides.first() else {
            return "Not run.\n".into();
        };
        let mut r = format!(
            "The closed-loop measurement above on keys with an override, on processes of its own (a fresh Redis, 4 Webdis, 4 Envoys with `--concurrency 2`: 8 engines): one rule, a {} with `limit` {} per 1 s, `burst` {} and `\"overrides\": true`; one key per row, {} connections per replica for {:.1} s. Before a row's first request its key's override is written in Redis (`HSET <state key>:override mode limit limit L burst B`, no expiry), so each of its decisions enforces the override's numbers: the allowance (and the algorithm's C and R in the table) are the override's. The script reads the override in the same call as the state, so these rows must be as exact as the others: **overshoot must be 0**. Allowed / allowance near 1 says the override decided: had the config decided instead, the rows would be held to the allowance under the config (a raised override about half its own, a lowered one about twice it). Decisions under the override: the filter's `ratelimit_rule.<rule>.<limit>.overridden` summed over the replicas (decisions Redis made; refusals from a worker's deny cache are not decisions); malformed overrides (`bad_override`) must be 0. Every unit that passed counts, decided or failed open.\n\n",
            o.run.algorithm,
            o.config_limit,
            o.config_burst,
            o.run.conns_per_replica,
            o.run.duration_s,
        );
        r += &self.accuracy_overrides_table();
        r
    }

    /// The override rows for results.json, each with its accuracy run's figures.
    pub(super) fn accuracy_overrides_json(&self, run: impl Fn(&super::Accuracy) -> Value) -> Value {
        json!(self
            .accuracy_overrides
            .iter()
            .map(|o: &OverrideAccuracy| {
                let mut v = run(&o.run);
                v["name"] = json!(o.name);
                v["config"] = json!({"limit": o.config_limit, "burst": o.config_burst});
                v["override"] = json!({"limit": o.run.rate_per_sec, "burst": o.run.capacity});
                v["allowance_under_config"] = json!(o.config_allowance);
                v["overridden"] = json!(o.overridden);
                v["bad_override"] = json!(o.bad_override);
                v
            })
            .collect::<Vec<_>>())
    }

    /// The override pair for results.json: on over off per round.
    pub(super) fn overrides_over_off_json(&self) -> Value {
        let (off, on) = OVERRIDE_PAIR;
        match self.pair_ratio(on, off) {
            Some(spread) => {
                let mut v = spread.json();
                v["scenario"] = json!(on);
                v["over"] = json!(off);
                v["how"] = json!("per round, each scenario's req/s over the filter-pass-through runs around it, the first over the second");
                v
            }
            None => Value::Null,
        }
    }
}

/// `HMGET` calls Redis counted during the scenario's runs (state reads and override lookups).
fn hmget(s: &Scenario) -> u64 {
    s.cost.redis_commands.get("hmget").copied().unwrap_or(0)
}
