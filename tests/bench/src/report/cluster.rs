//! The Redis Cluster section: one Redis against a 3-master cluster under the same load, round
//! by round; accuracy and shards on the cluster; the simulation's prediction.

use super::format::thousands;
use super::table::Table;
use super::Report;
use crate::spread::Spread;

impl Report {
    /// Each setup's req/s over the first setup's (one Redis), round by round (the two run
    /// one after the other in each round).
    pub fn cluster_ratio(&self, setup: usize) -> Option<Spread> {
        let first = self.cluster.throughput.first()?;
        let this = self.cluster.throughput.get(setup)?;
        let rounds: Vec<f64> = this
            .runs
            .iter()
            .zip(&first.runs)
            .filter(|(_, f)| f.rps > 0.0)
            .map(|(t, f)| t.rps / f.rps)
            .collect();
        (!rounds.is_empty()).then(|| Spread::new(rounds))
    }

    pub fn cluster_text(&self) -> String {
        let c = &self.cluster;
        let mut r = format!(
            "The same Envoy config (2 workers, one rule that allows everything, `wrk -t2 -c32`, 10,000 API keys in turn) against one Redis (envoy/envoy.yaml) and against a Redis Cluster of 3 masters + 3 replicas behind Envoy's `redis_proxy` (envoy/cluster/, `bridge.redis_cluster`), both running at once and measured one after the other in each of {} rounds.\n\n",
            c.throughput.first().map_or(0, |t| t.runs.len())
        );
        let per_node = |nodes: &[(u16, u64)]| {
            nodes
                .iter()
                .map(|(_, n)| thousands(*n as f64))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let mut t = Table::new()
            .left("setup")
            .right("req/s (median)")
            .right("req/s per round")
            .right("× one Redis")
            .right("p99 ms")
            .right("requests")
            .right("bridge calls per request")
            .left("`EVALSHA` per node")
            .left("node shares");
        for (i, row) in c.throughput.iter().enumerate() {
            t.row([
                row.setup.clone(),
                thousands(row.run.rps),
                row.rounds()
                    .rounds
                    .iter()
                    .map(|v| thousands(*v))
                    .collect::<Vec<_>>()
                    .join(" / "),
                self.cluster_ratio(i).map_or("–".into(), |s| s.cell()),
                format!("{:.2}", row.run.p99_ms),
                thousands(row.run.requests as f64),
                format!("{:.3}", row.bridge_calls as f64 / row.decided.max(1) as f64),
                per_node(&row.per_node),
                shares(&row.per_node),
            ]);
        }
        r += &t.render();
        r += "\nAccuracy on the cluster: one key, 16 connections on one Envoy with 2 workers, C = R = 99 per second; the sharded rule splits the key over 3 slots of 33 each. Overshoot must be 0; allowed / allowance below 1 is what sharding costs (a shard refusing while another still has tokens).\n\n";
        let mut t = Table::new()
            .left("rule")
            .right("shards")
            .right("window s")
            .right("requests")
            .right("allowed")
            .right("allowance")
            .right("overshoot")
            .right("allowed / allowance")
            .right("fail-open")
            .left("`EVALSHA` per master")
            .left("shares");
        for a in &c.accuracy {
            let x = &a.run;
            t.row([
                x.algorithm.clone(),
                a.shards.to_string(),
                format!("{:.3}", x.window_s),
                thousands(x.sent as f64),
                thousands(x.let_through() as f64),
                format!("{:.1}", x.allowance),
                format!("**{}**", x.overshoot()),
                format!("{:.4}", x.let_through() as f64 / x.allowance.max(1e-9)),
                x.fail_open.to_string(),
                per_node(&a.per_node),
                shares(&a.per_node),
            ]);
        }
        r += &t.render();
        r += &self.prediction_text();
        r
    }

    /// The fleet simulation's prediction for the measured cluster run, beside the measurement.
    fn prediction_text(&self) -> String {
        let c = &self.cluster;
        let Some(p) = c.prediction.as_ref().and_then(|p| p["scenarios"].get(0)) else {
            return "\n(The fleet simulation did not run: no python3 or no tests/sim/fleet.py.)\n"
                .into();
        };
        let measured = c.throughput.iter().find(|t| t.per_node.len() > 1);
        let node_shares: Vec<String> = p["nodes"]
            .as_array()
            .map(|nodes| {
                nodes
                    .iter()
                    .map(|n| format!("{:.0}%", 100.0 * n["call_fraction"].as_f64().unwrap_or(0.0)))
                    .collect()
            })
            .unwrap_or_default();
        let mut t = Table::new()
            .left("")
            .right("calls per request")
            .right("mean batch")
            .left("node shares")
            .right("p99 ms");
        t.row([
            "predicted".to_string(),
            format!("{:.3}", p["calls_per_request"].as_f64().unwrap_or(0.0)),
            format!("{:.2}", p["mean_batch"].as_f64().unwrap_or(0.0)),
            node_shares.join(" / "),
            format!(
                "{:.2} (the decision alone)",
                p["latency_ms"]["p99"].as_f64().unwrap_or(0.0)
            ),
        ]);
        if let Some(m) = measured {
            let calls = m.bridge_calls as f64 / m.decided.max(1) as f64;
            t.row([
                "measured".to_string(),
                format!("{calls:.3}"),
                format!("{:.2}", 1.0 / calls.max(1e-9)),
                shares(&m.per_node),
                format!("{:.2} (wrk, the whole request)", m.run.p99_ms),
            ]);
        }
        format!(
            "\nThe fleet simulation at this scale (`python3 tests/sim/fleet.py --small --json --rate {:.0}`, the measured rate), next to what was measured:\n\n{}",
            measured.map_or(0.0, |m| m.run.rps),
            t.render()
        )
    }
}

/// Shares of a per-node list, for the report.
fn shares(per_node: &[(u16, u64)]) -> String {
    let total: u64 = per_node.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return "-".to_string();
    }
    per_node
        .iter()
        .map(|(_, n)| format!("{:.0}%", 100.0 * *n as f64 / total as f64))
        .collect::<Vec<_>>()
        .join(" / ")
}
