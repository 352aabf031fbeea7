//! The Redis Cluster part of the bench: the same load against one Redis and against a
//! 3-master cluster (through Envoy's redis_proxy, envoy/cluster/), round by round in one run;
//! accuracy on the cluster; and a hot key with and without `shards`.

use std::time::Duration;

use serde_json::{json, Value};

use e2e::cluster::{envoy_config_file, ClusterStack};
use e2e::procs::{filter_config_edit_in, filter_json_block, Stack};
use e2e::root;

use super::Bench;
use crate::client::Load;
use crate::config::{Policy, ALGORITHMS, POLICY_HEADER};
use crate::measure;
use crate::report::{ClusterAccuracy, ClusterSection, ClusterThroughput};
use crate::wrk::{self, Requests, WrkLoad};

/// The filter JSON of `file` (a shipped Envoy config) with `rules` and a bridge `timeout`,
/// keeping everything else (credentials, `redis_cluster`, the breaker) as shipped.
fn filter_json(file: &std::path::Path, rules: Value, timeout: &str) -> String {
    let shipped = std::fs::read_to_string(file).expect("read the Envoy config");
    let (block, _) = filter_json_block(&shipped);
    let mut config: Value = serde_json::from_str(&block).expect("the filter JSON");
    config["bridge"]["timeout"] = json!(timeout);
    config["rules"] = rules;
    serde_json::to_string_pretty(&config).expect("JSON")
}

fn allow_rules() -> Value {
    json!([{"name": "bench", "key": {"from": ["header:x-api-key"]},
            "limits": [{"name": "bench", "limit": 1_000_000, "burst": 1_000_000_000u64, "window": "1s"}]}])
}

fn per_node_delta(before: &[(u16, u64)], after: &[(u16, u64)], masters: &[u16]) -> Vec<(u16, u64)> {
    after
        .iter()
        .filter(|(node, _)| masters.contains(node))
        .map(|&(node, n)| {
            let was = before
                .iter()
                .find(|(b, _)| *b == node)
                .map_or(0, |(_, n)| *n);
            (node, n.saturating_sub(was))
        })
        .collect()
}

fn throughput_run(
    envoy: &e2e::Envoy,
    load: &WrkLoad,
    raw: &std::path::Path,
    calls: &mut dyn FnMut() -> Vec<(u16, u64)>,
    masters: &[u16],
) -> ClusterThroughput {
    let before_stats = measure::envoy_stats(envoy.admin_port);
    let before_calls = calls();
    let run = wrk::run(envoy.port, load, raw);
    let after = measure::envoy_stats(envoy.admin_port);
    let delta = measure::delta(&before_stats, &after);
    let get = |name: &str| delta.get(name).copied().unwrap_or(0);
    ClusterThroughput {
        setup: String::new(),
        bridge_calls: get("wasmcustom.ratelimit_bridge_calls"),
        decided: get("wasmcustom.ratelimit_allowed") + get("wasmcustom.ratelimit_denied"),
        per_node: per_node_delta(&before_calls, &calls(), masters),
        runs: vec![run.clone()],
        run,
    }
}

/// The section: `rounds` rounds of `wrk_s` seconds of the 10,000-key allow load on each
/// setup (2 workers each, both running all through, measured one after the other), then
/// `accuracy_s` closed-loop runs on one key of the cluster.
pub fn run(b: &Bench, rounds: usize) -> ClusterSection {
    let (wrk_s, accuracy_s, out) = (b.s.wrk_s, b.s.accuracy_s, &b.s.out);
    let say = |text: &str| b.say(text);
    let mut section = ClusterSection::default();
    let load = WrkLoad {
        threads: 2,
        connections: 32,
        duration_s: wrk_s,
        requests: Requests::ManyKeys(10_000),
    };
    let single_file = root().join("envoy/envoy.yaml");
    let json = filter_json(&single_file, allow_rules(), "150ms");
    let (from, to) = filter_config_edit_in(&single_file, &json);
    let single = Stack::start("bench-cluster-single", &[(&from, &to)]);
    let cluster_file = envoy_config_file();
    let json = filter_json(&cluster_file, allow_rules(), "150ms");
    let (from, to) = filter_config_edit_in(&cluster_file, &json);
    let cluster = ClusterStack::start("bench-cluster", &[(&from, &to)]);
    let masters = cluster.cluster.masters();
    let mut rows = [
        ClusterThroughput {
            setup: "one Redis".into(),
            ..Default::default()
        },
        ClusterThroughput {
            setup: "Redis Cluster, 3 masters".into(),
            ..Default::default()
        },
    ];
    for round in 0..rounds {
        say(&format!(
            "cluster section, round {} of {rounds}: one Redis, then a Redis Cluster of 3 masters (2 workers, 10,000 keys)",
            round + 1
        ));
        let mut calls = || {
            let mut conn = single.redis.admin();
            let n = measure::redis_commandstats(&mut conn)
                .get("evalsha")
                .copied()
                .unwrap_or(0);
            vec![(single.redis.port, n)]
        };
        let row = throughput_run(
            &single.envoy,
            &load,
            &out.join(format!("raw/cluster-single.round{}.txt", round + 1)),
            &mut calls,
            &[single.redis.port],
        );
        rows[0].add(row);
        let mut calls = || cluster.cluster.command_calls_per_node("evalsha");
        let row = throughput_run(
            &cluster.envoy,
            &load,
            &out.join(format!("raw/cluster-3-masters.round{}.txt", round + 1)),
            &mut calls,
            &masters,
        );
        rows[1].add(row);
    }
    drop(single);
    drop(cluster);
    section.prediction = predict(rows[1].run.rps);
    section.throughput = rows.to_vec();
    // Accuracy: C = R = 99 (a multiple of 3, for the sharded rule), one key, 16 connections
    // on an Envoy with 2 workers.
    let policy = Policy {
        failure_mode: "open",
        algorithm: "token_bucket",
        capacity: 99,
        rate_per_sec: 99.0,
        timeout_ms: 150,
        lease: None,
        clock_skew_ms: None,
        overrides: false,
        claim: false,
    };
    let runs: [(&str, &str, u64); 3] = [
        ("token_bucket", "token_bucket", 1),
        ("gcra", "gcra", 1),
        ("token_bucket-sharded", "token_bucket", 3),
    ];
    let rules: Vec<Value> = runs
        .iter()
        .map(|(name, algorithm, shards)| {
            json!({"name": name, "key": {"from": ["header:x-api-key"]},
                   "match": {"header": {"name": POLICY_HEADER, "value": name}},
                   "limits": [{"name": "bench", "algorithm": algorithm, "limit": 99,
                               "burst": 99, "window": "1s", "shards": shards}]})
        })
        .collect();
    let json = filter_json(&cluster_file, json!(rules), "150ms");
    let (from, to) = filter_config_edit_in(&cluster_file, &json);
    let stack = ClusterStack::start("bench-cluster-accuracy", &[(&from, &to)]);
    let masters = stack.cluster.masters();
    // The sharded run's key: one whose 3 shards hash to slots of 3 different masters (which
    // masters a key's shards reach is a matter of hashing; this shows the spread, not luck).
    let sharded_key = (0..)
        .map(|i| format!("cluster-accuracy-sharded-{i}"))
        .find(|id| {
            let digest = ratelimit_core::sha1::sha1_hex(id.as_bytes());
            let base = format!("rl:{{header:x-api-key:{digest}}}:token_bucket-sharded:bench");
            let owners: std::collections::HashSet<u16> = (0..3)
                .map(|s| {
                    let key = ratelimit_core::request::keys::shard_key(&base, s);
                    stack
                        .cluster
                        .master_of_slot(ratelimit_core::slot::key_slot(key.as_bytes()))
                })
                .collect();
            owners.len() == 3
        })
        .unwrap_or_default();
    for (name, algorithm, shards) in runs {
        let Some(spec) = ALGORITHMS.iter().find(|a| a.name == algorithm) else {
            continue;
        };
        let load = Load {
            ports: vec![stack.envoy.port],
            conns_per_port: 16,
            duration: Duration::from_secs_f64(accuracy_s),
            headers: vec![
                (
                    "x-api-key".to_string(),
                    if shards > 1 {
                        sharded_key.clone()
                    } else {
                        format!("cluster-accuracy-{name}")
                    },
                ),
                (POLICY_HEADER.to_string(), name.to_string()),
            ],
            paced_total_per_sec: None,
            post: None,
        };
        let before = stack.cluster.command_calls_per_node("evalsha");
        let p = Policy {
            algorithm: spec.name,
            ..policy
        };
        let (mut run, _) = crate::run::accuracy::accuracy_run(
            std::slice::from_ref(&stack.envoy),
            2,
            spec,
            &p,
            &load,
            accuracy_s,
        );
        run.algorithm = name.to_string();
        let per_node = per_node_delta(
            &before,
            &stack.cluster.command_calls_per_node("evalsha"),
            &masters,
        );
        say(&format!(
            "cluster accuracy {name}: {} requests, {} allowed, allowance {:.1}, overshoot {}, calls per master {:?}",
            run.sent,
            run.let_through(),
            run.allowance,
            run.overshoot(),
            per_node.iter().map(|(_, n)| n).collect::<Vec<_>>()
        ));
        section.accuracy.push(ClusterAccuracy {
            shards,
            run,
            per_node,
        });
    }
    section
}

/// The fleet simulation's prediction for the measured small run (1 proxy, 2 workers, 3
/// masters, 10,000 keys at the measured rate), if python3 and the script are there.
fn predict(rps: f64) -> Option<Value> {
    let script = root().join("tests/sim/fleet.py");
    if !script.exists() {
        return None;
    }
    let out = std::process::Command::new("python3")
        .arg(&script)
        .args(["--small", "--json", "--rate"])
        .arg(format!("{}", rps.round() as u64))
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}
