//! results.json: every figure of the report and the counters behind them. Each throughput
//! scenario (and each Redis Cluster setup) has its req/s per round under `rounds`, `rps`
//! being their median; each ratio has its median, range and rounds under `ratios`; the CPU
//! per request of each process likewise under `cpu_us_per_request`, each run's CPU seconds
//! and requests under `runs`.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::leases::LEASED_OVER_UNLEASED_TARGET;
use super::{Accuracy, Report, Scenario, LEASE_PAIRS, PASS_THROUGH, PROCESSES};

/// The least rounds every throughput figure must have.
pub const MIN_ROUNDS: usize = 3;

impl Report {
    fn scenario_json(&self, s: &Scenario) -> Value {
        let mut ratios = serde_json::Map::new();
        for reference in ["baseline", PASS_THROUGH, &s.compare_to] {
            let applies = reference == s.compare_to
                || (reference == PASS_THROUGH && self.pass_through_ratio(s).is_some());
            if let Some(spread) = self.ratio_to(s, reference).filter(|_| applies) {
                ratios.insert(reference.to_string(), spread.json());
            }
        }
        let per_process = |f: &dyn Fn(&str) -> Value| {
            PROCESSES
                .iter()
                .map(|p| (p.to_string(), f(p)))
                .collect::<serde_json::Map<_, _>>()
        };
        let cpu_us_per_decision = if s.filter {
            json!(per_process(&|p| s.cpu_us_per_decision(p).json()))
        } else {
            Value::Null
        };
        json!({
            "name": s.name, "what": s.what, "load": s.load, "compare_to": s.compare_to,
            "rps": s.run.rps,
            "rounds": s.rounds().rounds,
            "runs": s.runs.iter().map(|m| json!({
                "round": m.round, "seq": m.seq, "rps": m.run.rps, "requests": m.run.requests,
                "decisions": m.cost.decisions(), "redis_decisions": m.cost.redis_decisions(),
                "cpu_s": per_process(&|p| json!(m.cost.cpu_of(p))), "wall_s": m.cost.wall_s,
            })).collect::<Vec<_>>(),
            "cpu_us_per_request": per_process(&|p| s.cpu_us_per_request(p).json()),
            "cpu_us_per_decision": cpu_us_per_decision,
            "envoy_us_over_floor": self.envoy_over_floor(s).map(|r| r.json()),
            "floor": self.floor_of(s).map(|f| f.name.clone()),
            "ratio": self.ratio(s).map(|r| r.median()),
            "ratio_to_pass_through": self.pass_through_ratio(s).map(|r| r.median()),
            "ratios": ratios,
            "requests": s.run.requests, "duration_s": s.run.duration_s,
            "latency_ms": {"mean": s.run.mean_ms, "p50": s.run.p50_ms, "p90": s.run.p90_ms,
                            "p99": s.run.p99_ms, "max": s.run.max_ms},
            "non_2xx": s.run.non_2xx, "socket_errors": s.run.socket_errors,
            "filter": {"allowed": s.cost.allowed, "denied": s.cost.denied,
                       "fail_open": s.cost.fail_open, "bridge_errors": s.cost.bridge_errors},
            "webdis_calls": s.cost.webdis_calls,
            "bridge_calls": s.cost.bridge_calls,
            "deny_cache_hits": s.cost.deny_cache_hits,
            "mean_batch": s.cost.mean_batch(),
            "webdis_connect_fails": s.cost.webdis_connect_fails,
            "lease": s.cost.lease.json(),
            "machine_busy_s": s.cost.machine_busy_s,
            "redis_commands": s.cost.redis_commands,
            "redis_keys_after": s.cost.redis_keys,
            "cpu_s": s.cost.cpu.iter().map(|(l, c)| (l.clone(), json!(c))).collect::<serde_json::Map<_, _>>(),
            "wall_s": s.cost.wall_s,
        })
    }

    pub fn json(&self) -> Value {
        let accuracy_json = |a: &Accuracy| {
            json!({
                "algorithm": a.algorithm, "replicas": a.replicas, "workers": a.workers,
                "conns_per_replica": a.conns_per_replica, "capacity": a.capacity,
                "rate_per_sec": a.rate_per_sec, "offered_per_sec": a.offered_per_sec,
                "duration_s": a.duration_s, "window_s": a.window_s,
                "allowance_inner": a.allowance_inner, "tolerance": a.tolerance(), "sent": a.sent,
                "allowed": a.allowed, "denied": a.denied, "failed": a.failed,
                "filter_allowed": a.filter_allowed, "filter_denied": a.filter_denied,
                "fail_open": a.fail_open, "allowed_per_replica": a.allowed_per_replica,
                "allowance": a.allowance, "formula": a.formula, "overshoot": a.overshoot(),
                "lease": a.lease.json(), "lease_setting": a.lease_setting,
                "clock_skew_ms": a.clock_skew_ms,
            })
        };
        let accuracy: Vec<Value> = self
            .accuracy
            .iter()
            .chain([&self.timeline.run])
            .map(accuracy_json)
            .collect();
        let overload = Some(&self.timeline_leased.run).filter(|a| a.sent > 0);
        let accuracy_leased: Vec<Value> = self
            .accuracy_leased
            .iter()
            .chain(overload)
            .map(accuracy_json)
            .collect();
        let leased_over_unleased: Vec<Value> = LEASE_PAIRS
            .iter()
            .filter_map(|(unleased, leased)| {
                let spread = self.pair_ratio(leased, unleased)?;
                let mut v = spread.json();
                v["scenario"] = json!(leased);
                v["over"] = json!(unleased);
                v["how"] = json!("per round, each scenario's req/s over the filter-pass-through runs around it, the first over the second");
                if *unleased == "filter-allow-10k-keys" {
                    v["target_at_least"] = json!(LEASED_OVER_UNLEASED_TARGET);
                }
                Some(v)
            })
            .collect();
        let mut all = json!({
            "quick": self.quick, "started_utc": self.started_utc, "took_s": self.took_s,
            "commit": self.commit,
            "machine": {"cpu_model": self.machine.cpu_model, "cores": self.machine.cores,
                        "memory_gib": self.machine.memory_gib, "kernel": self.machine.kernel,
                        "os": self.machine.os},
            "versions": self.versions.iter().cloned().collect::<BTreeMap<_, _>>(),
            "settings": self.settings.iter().cloned().collect::<BTreeMap<_, _>>(),
            "scenarios": self.scenarios.iter().map(|s| self.scenario_json(s)).collect::<Vec<_>>(),
            "leased_over_unleased": leased_over_unleased,
            "overrides_over_off": self.overrides_over_off_json(),
            "accuracy": accuracy,
            "overload_per_second": self.timeline.per_second,
            "accuracy_leased": accuracy_leased,
            "accuracy_overrides": self.accuracy_overrides_json(accuracy_json),
            "usage_accuracy": self.usage.iter().map(super::usage::usage_json).collect::<Vec<_>>(),
            "concurrency_accuracy": self.concurrency.as_ref().map(super::concurrency::concurrency_json),
            "busy_machine": self.busy.iter().map(|r| json!({
                "name": r.name, "how": r.how, "skipped": r.skipped,
                "replicas": r.replicas, "workers": r.workers,
                "conns_per_replica": r.conns_per_replica, "span_s": r.span_s,
                "hot_rate": r.hot_rate, "hot_requests": r.hot_requests,
                "hot_units_passed": r.hot_units, "hot_allowance": r.hot_allowance(),
                "overshoot": r.overshoot(), "failed_open_units": r.hot_failed_open_units,
                "closed_requests": r.closed_requests, "closed_allowed": r.closed_allowed,
                "closed_503": r.closed_503, "other": r.other,
                "filter": {"failure_mode_open": r.failure_mode_open,
                           "failure_mode_closed": r.failure_mode_closed,
                           "breaker_trips": r.breaker_trips,
                           "bridge_timeouts": r.bridge_timeouts,
                           "worker_lag_ms": r.worker_lag_ms},
                "throttled_periods": r.throttled_periods,
            })).collect::<Vec<_>>(),
            "overload_leased_per_second": self.timeline_leased.per_second,
            "phases": self.phases().iter().map(|p| json!({
                "phase": p.label, "scenario": p.scenario, "rps": p.rps,
                "ratio_to_baseline": p.ratio, "cost_of_a_request": p.cost,
                "ratio_to_baseline_rounds": p.spread.json(),
            })).collect::<Vec<_>>(),
            "cluster": {
                "throughput": self.cluster.throughput.iter().enumerate().map(|(i, t)| json!({
                    "setup": t.setup, "rps": t.run.rps, "rounds": t.rounds().rounds,
                    "ratio_to_one_redis": self.cluster_ratio(i).map(|s| s.json()),
                    "p99_ms": t.run.p99_ms, "requests": t.run.requests,
                    "bridge_calls": t.bridge_calls, "decided": t.decided, "evalsha_per_node": t.per_node,
                })).collect::<Vec<_>>(),
                "accuracy": self.cluster.accuracy.iter().map(|a| json!({
                    "rule": a.run.algorithm, "shards": a.shards, "sent": a.run.sent,
                    "allowed": a.run.let_through(), "allowance": a.run.allowance,
                    "overshoot": a.run.overshoot(), "fail_open": a.run.fail_open,
                    "evalsha_per_node": a.per_node,
                })).collect::<Vec<_>>(),
                "prediction": self.cluster.prediction,
            },
            "key_floods": self.floods.iter().map(|f| json!({
                "budget": f.budget, "addresses": f.addresses, "seconds": f.seconds,
                "allowed": f.allowed, "denied": f.denied, "lost": f.lost,
                "budget_exceeded": f.budget_exceeded, "keys_before": f.keys_before,
                "keys_after": f.keys_after, "redis_used_memory": [f.redis_memory.0, f.redis_memory.1],
                "envoy_rss": [f.envoy_rss.0, f.envoy_rss.1], "webdis_rss": [f.webdis_rss.0, f.webdis_rss.1],
            })).collect::<Vec<_>>(),
        });
        // Set apart: one more key in the macro above passes its recursion limit.
        all["fleet_capacity"] = self.capacity_json();
        all["claim_over_header"] = self.claim_over_header_json();
        all
    }
}

/// What is wrong with the rounds of a results.json (empty: nothing): every scenario and every
/// Redis Cluster setup needs at least [`MIN_ROUNDS`] positive req/s under `rounds`, and `rps`
/// their median; every scenario a CPU per request of each process in each of those rounds. Read from the JSON as written, so a writer that drops them is caught.
pub fn rounds_problems(results: &Value) -> Vec<String> {
    fn check(label: String, v: &Value) -> Option<String> {
        let rounds: Vec<f64> = v["rounds"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        if rounds.len() < MIN_ROUNDS || rounds.iter().any(|r| *r <= 0.0) {
            Some(format!(
                "{label}: {} rounds with req/s above 0 ({}), {MIN_ROUNDS} needed",
                rounds.iter().filter(|r| **r > 0.0).count(),
                v["rounds"]
            ))
        } else if v["rps"].as_f64() != Some(crate::spread::median(&rounds)) {
            Some(format!(
                "{label}: rps {} is not the median of its rounds {:?}",
                v["rps"], rounds
            ))
        } else {
            None
        }
    }
    /// CPU per request of every process, one figure of at least 0 per round of req/s.
    fn check_cpu(label: String, v: &Value) -> Vec<String> {
        let rounds = v["rounds"].as_array().map_or(0, Vec::len);
        PROCESSES
            .iter()
            .filter_map(|p| {
                let cpu = &v["cpu_us_per_request"][*p]["rounds"];
                let figures: Vec<f64> = cpu
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_f64).collect())
                    .unwrap_or_default();
                (figures.len() < rounds.max(MIN_ROUNDS) || figures.iter().any(|f| *f < 0.0)).then(
                    || {
                        format!(
                            "{label}: {p} CPU per request in {} of {rounds} rounds ({cpu})",
                            figures.len()
                        )
                    },
                )
            })
            .collect()
    }
    let mut problems = Vec::new();
    let scenarios = results["scenarios"].as_array().cloned().unwrap_or_default();
    // `--only cluster` runs the Redis Cluster section alone.
    let cluster = results["cluster"]["throughput"]
        .as_array()
        .is_some_and(|t| !t.is_empty());
    if scenarios.is_empty() && !cluster {
        problems.push("no throughput scenario".into());
    }
    for s in &scenarios {
        let label = format!("scenario {}", s["name"]);
        problems.extend(check(label.clone(), s));
        problems.extend(check_cpu(label, s));
    }
    for c in results["cluster"]["throughput"]
        .as_array()
        .into_iter()
        .flatten()
    {
        problems.extend(check(format!("cluster setup {}", c["setup"]), c));
    }
    problems
}
