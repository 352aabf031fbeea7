//! The Overrides section: what overrides on cost a key that has none (the allow scenario
//! with and without them).

use serde_json::{json, Value};

use super::format::{opt2, sig3, thousands};
use super::table::Table;
use super::{Report, Scenario, OVERRIDE_PAIR, PASS_THROUGH};

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
            .right("CPU s per 1,000 req: Envoy")
            .right("Webdis")
            .right("Redis")
            .right("Redis commands / decision")
            .right("HMGET / decision")
            .right("fail-open");
        for name in [off, on] {
            let Some(s) = self.scenario(name) else {
                continue;
            };
            let cpu = |label: &str| Report::cpu_per_1k(s, label).map_or("–".into(), sig3);
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
        r += "\nCPU: utime + stime of each process over the scenario's runs, all rounds, per 1,000 requests wrk completed. Redis commands (and `HMGET`s) per decision: `INFO commandstats` calls, the commands inside the script included, over the filter's decisions; the token bucket reads its state with one `HMGET`, and with overrides on each decision reads the override with another.\n";
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
