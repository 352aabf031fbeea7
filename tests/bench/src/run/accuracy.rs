//! The accuracy runs: every algorithm on 2 and 4 replicas sharing one key, with several
//! workers per replica, with leases on, with an override; and the paced 3× overload
//! timelines.

use std::time::Duration;

use e2e::procs::{Envoy, Redis, Webdis};
use e2e::resp::Resp;
use ratelimit_core::request::keys::override_key;

use super::{Bench, LEASED_CLOCK_SKEW_MS};
use crate::client::{self, Load};
use crate::config::{
    Algorithm, Front, Lease, Override, Policy, ALGORITHMS, LIMIT_NAME, POLICY_HEADER,
};
use crate::measure;
use crate::report::{
    Accuracy, LeaseCounters, OverrideAccuracy, Timeline, CONCURRENT_ALGORITHMS, LEASED_ALGORITHMS,
    OVERRIDE_ROWS,
};

/// The accuracy runs (2 and 4 replicas, each algorithm) and the overload timeline (the first
/// algorithm), on a fresh Redis shared by 4 Envoys, each with its own Webdis. The Envoys hold
/// one rule per algorithm, picked by a request header.
pub fn unleased(b: &Bench) -> (Vec<Accuracy>, Timeline) {
    let s = &b.s;
    let redis = Redis::start(&b.dir);
    let policies: Vec<Policy> = ALGORITHMS
        .iter()
        .map(|a| Policy {
            failure_mode: "open",
            algorithm: a.name,
            capacity: s.capacity,
            rate_per_sec: s.rate,
            timeout_ms: s.timeout_ms,
            lease: None,
            clock_skew_ms: None,
            overrides: false,
            claim: false,
        })
        .collect();
    let webdis: Vec<Webdis> = (0..4).map(|_| Webdis::start(&b.dir, redis.port)).collect();
    let envoys: Vec<Envoy> = webdis
        .iter()
        .map(|w| b.start_envoy(Front::Filter(&policies), w.port))
        .collect();
    let mut runs = Vec::new();
    for (algorithm, policy) in ALGORITHMS.iter().zip(&policies) {
        for replicas in [2, 4] {
            let key = format!("accuracy-{}-{replicas}", algorithm.name);
            let envoys = &envoys[..replicas];
            runs.push(closed_loop(b, envoys, 1, algorithm, policy, key));
        }
    }
    {
        // Several workers per replica: each worker's engine batches and caches refusals on
        // its own, all racing on one key.
        let workers = 2;
        let envoys2: Vec<Envoy> = webdis
            .iter()
            .map(|w| b.start_envoy_workers(Front::Filter(&policies), w.port, workers))
            .collect();
        for name in CONCURRENT_ALGORITHMS {
            let Some((algorithm, policy)) = ALGORITHMS
                .iter()
                .zip(&policies)
                .find(|(a, _)| a.name == *name)
            else {
                continue;
            };
            let key = format!("accuracy-{}-workers", algorithm.name);
            runs.push(closed_loop(b, &envoys2, workers, algorithm, policy, key));
        }
    }
    let timeline = overload(
        b,
        &envoys,
        1,
        &policies[0],
        format!("overload-{}", ALGORITHMS[0].name),
    );
    (runs, timeline)
}

/// The paced 3× overload run on one key of `policy`'s algorithm, through `envoys`: allowed,
/// denied and failed per second.
fn overload(b: &Bench, envoys: &[Envoy], workers: u32, policy: &Policy, key: String) -> Timeline {
    let s = &b.s;
    let Some(algorithm) = ALGORITHMS.iter().find(|a| a.name == policy.algorithm) else {
        return Timeline::default();
    };
    let load = Load {
        ports: envoys.iter().map(|e| e.port).collect(),
        conns_per_port: s.overload_conns,
        duration: Duration::from_secs_f64(s.overload_s),
        headers: accuracy_headers(algorithm.name, key),
        paced_total_per_sec: Some(3.0 * policy.rate_per_sec),
        post: None,
    };
    let (run, result) = accuracy_run(envoys, workers, algorithm, policy, &load, s.overload_s);
    let seconds = s.overload_s.ceil() as usize;
    let mut per_second = vec![(0u64, 0u64, 0u64); seconds];
    for e in &result.events {
        let i = (e.at.as_secs_f64().floor() as usize).min(seconds - 1);
        match e.status {
            200 => per_second[i].0 += 1,
            429 => per_second[i].1 += 1,
            _ => per_second[i].2 += 1,
        }
    }
    b.say(&format!(
        "overload {}{}: {} requests, {} allowed, allowance {:.1}, overshoot {}",
        algorithm.name,
        if policy.lease.is_some() {
            ", leased"
        } else {
            ""
        },
        run.sent,
        run.let_through(),
        run.allowance,
        run.overshoot()
    ));
    Timeline { run, per_second }
}

/// The request headers of an accuracy run: the key, and the header that picks the rule.
fn accuracy_headers(algorithm: &str, key: String) -> Vec<(String, String)> {
    vec![
        ("x-api-key".to_string(), key),
        (POLICY_HEADER.to_string(), algorithm.to_string()),
    ]
}

/// The accuracy runs with leases on (token bucket and GCRA, 4 replicas × 2 workers), and the
/// overload timeline with leases on, on processes of their own: a fresh Redis, 4 Webdis, 4
/// Envoys with 2 workers whose rules take a lease.
pub fn leased(b: &Bench) -> (Vec<Accuracy>, Timeline) {
    let s = &b.s;
    let redis = Redis::start(&b.dir);
    let policies: Vec<Policy> = LEASED_ALGORITHMS
        .iter()
        .map(|name| Policy {
            failure_mode: "open",
            algorithm: name,
            capacity: s.capacity,
            rate_per_sec: s.rate,
            timeout_ms: s.timeout_ms,
            lease: Some(Lease::DEFAULT),
            clock_skew_ms: Some(LEASED_CLOCK_SKEW_MS),
            overrides: false,
            claim: false,
        })
        .collect();
    let workers = 2;
    let webdis: Vec<Webdis> = (0..4).map(|_| Webdis::start(&b.dir, redis.port)).collect();
    let envoys: Vec<Envoy> = webdis
        .iter()
        .map(|w| b.start_envoy_workers(Front::Filter(&policies), w.port, workers))
        .collect();
    let mut runs = Vec::new();
    for policy in &policies {
        let Some(algorithm) = ALGORITHMS.iter().find(|a| a.name == policy.algorithm) else {
            continue;
        };
        let key = format!("accuracy-{}-leased", algorithm.name);
        runs.push(closed_loop(b, &envoys, workers, algorithm, policy, key));
    }
    let timeline = overload(
        b,
        &envoys,
        workers,
        &policies[0],
        format!("overload-{}-leased", policies[0].algorithm),
    );
    (runs, timeline)
}

/// The accuracy rows with an override named by `--only` (all without it), on processes of
/// their own: a fresh Redis, 4 Webdis, 4 Envoys with 2 workers whose token bucket has
/// overrides on. Each row's key gets its override (limit and burst a multiple of the
/// policy's) before its first request, and is judged against the override's allowance.
pub fn overrides(b: &Bench) -> Vec<OverrideAccuracy> {
    let s = &b.s;
    let wanted: Vec<_> = OVERRIDE_ROWS.iter().filter(|r| s.wants(r.0)).collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let Some(algorithm) = ALGORITHMS.iter().find(|a| a.name == "token_bucket") else {
        return Vec::new();
    };
    let redis = Redis::start(&b.dir);
    let policy = Policy {
        failure_mode: "open",
        algorithm: algorithm.name,
        capacity: s.capacity,
        rate_per_sec: s.rate,
        timeout_ms: s.timeout_ms,
        lease: None,
        clock_skew_ms: None,
        overrides: true,
        claim: false,
    };
    let workers = 2;
    let webdis: Vec<Webdis> = (0..4).map(|_| Webdis::start(&b.dir, redis.port)).collect();
    let envoys: Vec<Envoy> = webdis
        .iter()
        .map(|w| b.start_envoy_workers(Front::Filter(&[policy]), w.port, workers))
        .collect();
    // The keys as the filter names them, from the config the Envoys run.
    let keys = envoys[0].keys();
    let mut admin = redis.admin();
    let counter = |event: &str| {
        format!(
            "wasmcustom.ratelimit_rule.{}.{LIMIT_NAME}.{event}",
            policy.rule_name()
        )
    };
    let mut rows = Vec::new();
    for (name, factor) in wanted {
        let key = format!("accuracy-{name}");
        let o = Override {
            limit: (s.rate * factor).round() as u64,
            burst: (s.capacity as f64 * factor).round() as u64,
        };
        let state = keys.limit_key(
            &policy.rule_name(),
            LIMIT_NAME,
            "header:x-api-key",
            key.as_bytes(),
        );
        let hash = override_key(&state);
        let mut hset = vec!["HSET".to_string(), hash.clone()];
        hset.extend(o.fields());
        let reply = admin.cmd(&hset);
        assert!(
            matches!(reply, Ok(Resp::Int(3))),
            "HSET of the override {hash}: {reply:?}"
        );
        let under = o.applied_to(&policy);
        let load = Load {
            ports: envoys.iter().map(|e| e.port).collect(),
            conns_per_port: s.accuracy_conns,
            duration: Duration::from_secs_f64(s.accuracy_s),
            headers: accuracy_headers(algorithm.name, key),
            paced_total_per_sec: None,
            post: None,
        };
        let before: Vec<_> = envoys
            .iter()
            .map(|e| measure::envoy_stats(e.admin_port))
            .collect();
        let (run, _) = accuracy_run(&envoys, workers, algorithm, &under, &load, s.accuracy_s);
        // Each worker adds its per-rule counts at its next tick (25 ms).
        std::thread::sleep(Duration::from_millis(200));
        let sum = |name: &str| -> u64 {
            envoys
                .iter()
                .zip(&before)
                .map(|(e, b)| {
                    let d = measure::delta(b, &measure::envoy_stats(e.admin_port));
                    d.get(name).copied().unwrap_or(0)
                })
                .sum()
        };
        let row = OverrideAccuracy {
            name: name.to_string(),
            config_limit: s.rate as u64,
            config_burst: s.capacity,
            // A bucket's allowance depends on the span only, not on where it starts.
            config_allowance: (algorithm.allowance)(&policy, 0.0, run.window_s),
            overridden: sum(&counter("overridden")),
            bad_override: sum(&counter("bad_override")),
            run,
        };
        b.say(&format!(
            "accuracy {name} (limit {} burst {} over the config's {} and {}), {} replicas x {workers} workers: {} requests, {} allowed, allowance {:.1}, overshoot {}, {} decisions under the override, {} malformed",
            o.limit,
            o.burst,
            row.config_limit,
            row.config_burst,
            envoys.len(),
            row.run.sent,
            row.run.let_through(),
            row.run.allowance,
            row.run.overshoot(),
            row.overridden,
            row.bad_override
        ));
        rows.push(row);
    }
    rows
}

/// One closed-loop accuracy run: `s.accuracy_conns` connections per Envoy spending `key` under
/// `algorithm`'s rule for `s.accuracy_s`, as fast as answered; says what it saw.
fn closed_loop(
    b: &Bench,
    envoys: &[Envoy],
    workers: u32,
    algorithm: &Algorithm,
    policy: &Policy,
    key: String,
) -> Accuracy {
    let s = &b.s;
    let load = Load {
        ports: envoys.iter().map(|e| e.port).collect(),
        conns_per_port: s.accuracy_conns,
        duration: Duration::from_secs_f64(s.accuracy_s),
        headers: accuracy_headers(algorithm.name, key),
        paced_total_per_sec: None,
        post: None,
    };
    let (run, _) = accuracy_run(envoys, workers, algorithm, policy, &load, s.accuracy_s);
    b.say(&format!(
            "accuracy {}{}, {} replicas x {workers} workers: {} requests, {} allowed, allowance {:.1}, overshoot {}, lease hits {}",
            algorithm.name,
            if policy.lease.is_some() { " leased" } else { "" },
            envoys.len(),
            run.sent,
            run.let_through(),
            run.allowance,
            run.overshoot(),
            LeaseCounters::cell(run.lease.hits)
        ),
    );
    run
}

pub fn accuracy_run(
    envoys: &[Envoy],
    workers: u32,
    algorithm: &Algorithm,
    policy: &Policy,
    load: &Load,
    duration_s: f64,
) -> (Accuracy, client::LoadResult) {
    let sum = |stats: &[std::collections::BTreeMap<String, u64>], name: &str| -> u64 {
        stats
            .iter()
            .map(|m| m.get(name).copied().unwrap_or(0))
            .sum()
    };
    let before: Vec<_> = envoys
        .iter()
        .map(|e| measure::envoy_stats(e.admin_port))
        .collect();
    let result = client::run(load);
    let deltas: Vec<_> = envoys
        .iter()
        .zip(&before)
        .map(|(e, b)| measure::delta(b, &measure::envoy_stats(e.admin_port)))
        .collect();
    let b = result.bounds();
    let run = Accuracy {
        algorithm: policy.algorithm.to_string(),
        allowance: (algorithm.allowance)(policy, b.first_sent, b.last_read),
        allowance_inner: (algorithm.allowance)(policy, b.first_read, b.last_sent.max(b.first_read)),
        formula: algorithm.formula.to_string(),
        replicas: envoys.len(),
        workers,
        conns_per_replica: load.conns_per_port,
        capacity: policy.capacity,
        rate_per_sec: policy.rate_per_sec,
        offered_per_sec: load.paced_total_per_sec,
        duration_s,
        window_s: b.last_read - b.first_sent,
        sent: result.events.len() as u64,
        allowed: result.count(200),
        denied: result.count(429),
        failed: result
            .events
            .iter()
            .filter(|e| e.status != 200 && e.status != 429)
            .count() as u64,
        filter_allowed: sum(&deltas, "wasmcustom.ratelimit_allowed"),
        filter_denied: sum(&deltas, "wasmcustom.ratelimit_denied"),
        fail_open: sum(&deltas, "wasmcustom.ratelimit_failure_mode_open"),
        lease: LeaseCounters::sum(&deltas),
        lease_setting: policy
            .lease
            .map(|l| l.json().to_string())
            .unwrap_or_default(),
        clock_skew_ms: policy.clock_skew_ms,
        allowed_per_replica: (0..envoys.len())
            .map(|r| {
                result
                    .events
                    .iter()
                    .filter(|e| e.replica == r && e.status == 200)
                    .count() as u64
            })
            .collect(),
    };
    (run, result)
}
