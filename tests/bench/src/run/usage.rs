//! The accuracy rows of usage limits: 4 Envoys with 2 workers, 8 connections each, on one
//! Redis, every request a chat completion to the OpenAI-compatible test upstream (in this
//! process) whose answer uses a pseudo-random number of tokens; one API key per row spends a
//! token bucket far smaller than what the load asks for.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::procs::{Envoy, Redis, Webdis};
use e2e::{llm, LlmUpstream};

use super::Bench;
use crate::client::{self, Load, Post};
use crate::config::{Front, UsagePolicy, BODY_USAGE, STATUS_USAGE, USAGE_ROW_HEADER};
use crate::measure;
use crate::report::{
    UsageAccuracy, STATUS_ROW_UNITS, USAGE_RANGE, USAGE_ROWS, USAGE_STATUS_ROW, USAGE_WEIGHTED_ROW,
    WEIGHTED_ROW_UNITS, WEIGHTS,
};

/// The token bucket of every row: this many tokens, refilled over an hour (about 11 a
/// second), so the run spends the burst and the refill counts little, but exactly.
pub const USAGE_TOKENS: u64 = 40_000;
pub const USAGE_WINDOW_S: u64 = 3600;

/// The rows' rules, one per row, picked by [`USAGE_ROW_HEADER`].
pub fn policies() -> Vec<UsagePolicy> {
    USAGE_ROWS
        .iter()
        .map(|(name, admit, estimate)| {
            let (tokens, from, weights) = match *name {
                USAGE_STATUS_ROW => (STATUS_ROW_UNITS, STATUS_USAGE, None),
                USAGE_WEIGHTED_ROW => (WEIGHTED_ROW_UNITS, "openai", Some(WEIGHTS)),
                _ => (USAGE_TOKENS, BODY_USAGE, None),
            };
            UsagePolicy {
                name,
                admit,
                requests_per_s: 1_000_000,
                tokens,
                window_s: USAGE_WINDOW_S,
                from,
                weights,
                estimate: *estimate,
                timeout_ms: 150,
            }
        })
        .collect()
}

/// The rows named by `--only` (all without it), on processes of their own.
pub fn run(b: &Bench) -> Vec<UsageAccuracy> {
    let s = &b.s;
    let wanted: Vec<_> = USAGE_ROWS.iter().filter(|r| s.wants(r.0)).collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let redis = Redis::start(&b.dir);
    let upstream = LlmUpstream::start();
    let policies = policies();
    let workers = 2;
    let webdis: Vec<Webdis> = (0..4).map(|_| Webdis::start(&b.dir, redis.port)).collect();
    let front = Front::Llm {
        policies: Some(&policies),
        never_match: false,
        upstream: upstream.port,
    };
    let envoys: Vec<Envoy> = webdis
        .iter()
        .map(|w| b.start_envoy_workers(front, w.port, workers))
        .collect();
    let mut rows = Vec::new();
    for (i, policy) in policies.iter().enumerate() {
        if !wanted.iter().any(|r| r.0 == policy.name) {
            continue;
        }
        let row = one_row(b, &envoys, workers, &upstream, policy, 1000 * i as u64);
        b.say(&format!(
            "accuracy {}: {} requests, {} admitted, {} refused; {} tokens used of an allowance of {:.1}: overshoot {} (bound {}), under-admission {}, settlements lost {}",
            row.name, row.sent, row.admitted, row.refused, row.used, row.allowance,
            row.overshoot(), row.overshoot_bound(), row.under_admission(), row.settlements_lost
        ));
        rows.push(row);
    }
    rows
}

fn one_row(
    b: &Bench,
    envoys: &[Envoy],
    workers: u32,
    upstream: &LlmUpstream,
    policy: &UsagePolicy,
    seed_base: u64,
) -> UsageAccuracy {
    let s = &b.s;
    let key = format!("accuracy-{}", policy.name);
    let range = format!("{}-{}", USAGE_RANGE.0, USAGE_RANGE.1);
    let answer = policy.answer_status();
    let mut headers = vec![
        ("x-api-key".to_string(), key.clone()),
        (USAGE_ROW_HEADER.to_string(), policy.name.to_string()),
        (llm::USAGE_RANGE.to_string(), range),
    ];
    if answer != 200 {
        headers.push((llm::STATUS.to_string(), answer.to_string()));
    }
    let load = Load {
        ports: envoys.iter().map(|e| e.port).collect(),
        conns_per_port: s.accuracy_conns,
        duration: Duration::from_secs_f64(s.accuracy_s),
        headers,
        paced_total_per_sec: None,
        post: Some(Post {
            path: "/v1/chat/completions".into(),
            body: r#"{"model":"gpt-test","messages":[{"role":"user","content":"Say hello."}]}"#
                .into(),
            seed_header: Some(llm::USAGE_RANDOM.to_string()),
            seed_base,
            streamed: false,
        }),
    };
    let served_before = upstream.served_for(&key);
    let split_before = upstream.served_split_for(&key);
    let before: Vec<_> = envoys
        .iter()
        .map(|e| measure::envoy_stats(e.admin_port))
        .collect();
    let result = client::run(&load);
    let deltas: Vec<BTreeMap<String, u64>> = envoys
        .iter()
        .zip(&before)
        .map(|(e, b)| measure::delta(b, &measure::envoy_stats(e.admin_port)))
        .collect();
    let served = upstream.served_for(&key);
    let split = upstream.served_split_for(&key);
    // Counters of this row's rule: `ratelimit_rule.<rule>.tokens.<event>`, and global ones.
    let sum = |name: &str| -> u64 {
        deltas
            .iter()
            .map(|m| m.get(name).copied().unwrap_or(0))
            .sum()
    };
    let rule = |event: &str| {
        sum(&format!(
            "wasmcustom.ratelimit_rule.{}.tokens.{event}",
            policy.name
        ))
    };
    let bounds = result.bounds();
    let allowance =
        |from: f64, to: f64| policy.tokens as f64 + policy.rate_per_sec() * (to - from).max(0.0);
    UsageAccuracy {
        name: policy.name.to_string(),
        admit: policy.admit.to_string(),
        estimate: policy.estimate,
        usage_range: USAGE_RANGE,
        tokens: policy.tokens,
        window_s: policy.window_s,
        replicas: envoys.len(),
        workers,
        conns_per_replica: load.conns_per_port,
        duration_s: s.accuracy_s,
        span_s: bounds.last_read - bounds.first_sent,
        allowance: allowance(bounds.first_sent, bounds.last_read),
        allowance_inner: allowance(bounds.first_read, bounds.last_sent),
        // Counted by status, each answer is 1 unit; weighted, its input and output tokens
        // at their weights (whole: no rounding); else its tokens.
        used: match (policy.from, policy.weights) {
            (STATUS_USAGE, _) => served.count - served_before.count,
            (_, Some((input, output))) => {
                (split.0 - split_before.0) * input + (split.1 - split_before.1) * output
            }
            _ => served.sum - served_before.sum,
        },
        answered: served.count - served_before.count,
        sent: result.events.len() as u64,
        admitted: result.count(answer),
        refused: result.count(429),
        failed: result
            .events
            .iter()
            .filter(|e| e.status != answer && e.status != 429)
            .count() as u64,
        fail_open: sum("wasmcustom.ratelimit_failure_mode_open"),
        settlements_lost: sum("wasmcustom.ratelimit_usage_settlements_lost"),
        debt: rule("usage_debt"),
        given_back: rule("usage_given_back"),
        unread: rule("usage_unread"),
    }
}
