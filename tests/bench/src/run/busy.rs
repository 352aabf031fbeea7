//! The busy-machine rows: the shipped bridge timeout and breaker on 2 replicas × 2 workers, one
//! fail-open and one fail-closed rule, while the machine is busy: (a) CPU-bound neighbours,
//! two busy loops per core; (b) each Envoy under a CPU quota of 0.6 CPU, as a Kubernetes CPU
//! limit sets one. Redis is healthy throughout: any request let through by policy or answered
//! 503 is the machine's doing, which the limiter must not turn into an outage.

use std::time::Duration;

use e2e::busy::{BusyLoops, CpuQuota, MixedLoad, MixedResult};
use e2e::procs::{Envoy, Redis, Webdis};

use super::Bench;
use crate::config::Front;
use crate::measure;
use crate::report::BusyRow;

/// The hot key's rule: units per second, and as many at once.
const HOT_RATE: u64 = 50;
const REPLICAS: usize = 2;
const WORKERS: u32 = 2;
const CONNS_PER_REPLICA: usize = 16;
const ACCOUNTS: usize = 1000;
/// The CPU quota of row (b): 60 ms per 100 ms period.
const QUOTA_US: (u64, u64) = (60_000, 100_000);

/// The rows named by `--only` (both without it), each on processes of its own.
pub fn run(b: &Bench) -> Vec<BusyRow> {
    crate::report::BUSY_ROWS
        .iter()
        .filter(|name| b.s.wants(name))
        .map(|name| row(b, name))
        .collect()
}

fn row(b: &Bench, name: &str) -> BusyRow {
    let s = &b.s;
    let duration = Duration::from_secs_f64(if s.quick { 3.0 } else { 10.0 });
    let redis = Redis::start(&b.dir);
    let webdis: Vec<Webdis> = (0..REPLICAS)
        .map(|_| Webdis::start(&b.dir, redis.port))
        .collect();
    let envoys: Vec<Envoy> = webdis
        .iter()
        .map(|w| b.start_envoy_workers(Front::Busy(HOT_RATE), w.port, WORKERS))
        .collect();
    // Each Envoy decides once first (the script loaded into the fresh Redis).
    for envoy in &envoys {
        e2e::wait_for("a decision", Duration::from_secs(30), || {
            let r = e2e::get(envoy.port, "/accounts", &[("x-api-key", b"warm-up")]).ok()?;
            r.header("x-ratelimit-limit").map(|_| ())
        });
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut row = BusyRow {
        name: name.to_string(),
        replicas: REPLICAS,
        workers: WORKERS,
        conns_per_replica: CONNS_PER_REPLICA,
        hot_rate: HOT_RATE,
        ..BusyRow::default()
    };
    let load = MixedLoad {
        ports: envoys.iter().map(|e| e.port).collect(),
        conns_per_port: CONNS_PER_REPLICA,
        duration,
        hot_key: format!("busy-{name}"),
        accounts: ACCOUNTS,
    };
    let before: Vec<_> = envoys
        .iter()
        .map(|e| measure::envoy_stats(e.admin_port))
        .collect();
    let result = match name {
        "busy-loops" => {
            row.how = format!(
                "{} busy loops ({} per core) for the whole run",
                2 * cores,
                2
            );
            let loops = BusyLoops::start(&b.dir, 2 * cores, duration + Duration::from_secs(30));
            let result = load.run();
            drop(loops);
            result
        }
        _ => {
            row.how = format!(
                "each Envoy in a cgroup with cpu.cfs_quota_us {} per cpu.cfs_period_us {} ({:.1} CPU)",
                QUOTA_US.0,
                QUOTA_US.1,
                QUOTA_US.0 as f64 / QUOTA_US.1 as f64
            );
            let quotas: Result<Vec<CpuQuota>, String> = envoys
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let quota = CpuQuota::new(&format!("bench-envoy-{i}"), QUOTA_US.0, QUOTA_US.1)?;
                    quota.add(e.process.pid())?;
                    Ok(quota)
                })
                .collect();
            match quotas {
                Ok(quotas) => {
                    let result = load.run();
                    row.throttled_periods = quotas.iter().map(CpuQuota::throttled_periods).sum();
                    // The quotas go with the Envoys (their processes are moved out first).
                    drop(quotas);
                    result
                }
                Err(why) => {
                    b.say(&format!("busy row {name} not run: {why}"));
                    row.skipped = Some(why);
                    return row;
                }
            }
        }
    };
    let deltas: Vec<_> = envoys
        .iter()
        .zip(&before)
        .map(|(e, b)| measure::delta(b, &measure::envoy_stats(e.admin_port)))
        .collect();
    let sum = |name: &str| -> u64 {
        deltas
            .iter()
            .map(|m| m.get(&format!("wasmcustom.{name}")).copied().unwrap_or(0))
            .sum()
    };
    fill(&mut row, &result);
    row.failure_mode_open = sum("ratelimit_failure_mode_open");
    row.failure_mode_closed = sum("ratelimit_failure_mode_closed");
    row.breaker_trips = sum("ratelimit_breaker_trips");
    row.bridge_timeouts = sum("ratelimit_bridge_timeouts");
    row.worker_lag_ms = sum("ratelimit_worker_lag_ms");
    b.say(&format!(
        "busy {name}: {} hot units passed (allowance {:.0}, overshoot {}, {} failed open), {} × 503 of {} fail-closed requests, {} breaker trips, workers late by {} ms",
        row.hot_units,
        row.hot_allowance(),
        row.overshoot(),
        row.hot_failed_open_units,
        row.closed_503,
        row.closed_requests,
        row.breaker_trips,
        row.worker_lag_ms
    ));
    row
}

/// What the clients saw.
fn fill(row: &mut BusyRow, result: &MixedResult) {
    row.span_s = result.span.as_secs_f64();
    row.hot_requests = result.answers.iter().filter(|a| a.hot).count() as u64;
    row.hot_units = result.allowed_units(true);
    row.hot_failed_open_units = result.undecided_units(true);
    row.closed_requests = result.answers.iter().filter(|a| !a.hot).count() as u64;
    row.closed_allowed = result.count(false, 200);
    row.closed_503 = result.count(false, 503);
    row.other = result
        .answers
        .iter()
        .filter(|a| ![200, 429, 503].contains(&a.status))
        .count() as u64;
}
