//! What the report says about the run itself: the versions, the settings in words, the commit.

use std::process::Command;

use e2e::{envoy_bin, root, wasm_path};

use crate::config::Lease;
use crate::measure;
use crate::report::{thousands, OVERRIDE_ROWS};
use crate::run::concurrency::{
    CONCURRENCY_EVENTS, CONCURRENCY_EVENT_DELAY_MS, CONCURRENCY_MAX_DURATION_S, CONCURRENCY_SLOTS,
};
use crate::run::{leased_policy, LEASED_CLOCK_SKEW_MS};
use crate::settings::Settings;
use crate::wrk;

pub fn versions() -> Vec<(String, String)> {
    let wasm = wasm_path();
    vec![
        (
            "Envoy".to_string(),
            measure::first_line_of(&envoy_bin().display().to_string(), &["--version"])
                .split("version: ")
                .nth(1)
                .unwrap_or("?")
                .to_string(),
        ),
        (
            "Webdis".into(),
            measure::first_line_of("dpkg-query", &["-W", "-f", "${Version}", "webdis"]),
        ),
        (
            "Redis".into(),
            measure::first_line_of("redis-server", &["--version"]),
        ),
        ("wrk".into(), wrk::version()),
        (
            "rustc".into(),
            measure::first_line_of("rustc", &["--version"]),
        ),
        (
            "filter".into(),
            format!(
                "{} ({} bytes)",
                wasm.strip_prefix(root()).unwrap_or(&wasm).display(),
                std::fs::metadata(&wasm).map(|m| m.len()).unwrap_or(0)
            ),
        ),
    ]
}

/// The settings of the run, in words.
pub fn settings(s: &Settings) -> Vec<(String, String)> {
    vec![
        (
            "throughput runs".to_string(),
            format!(
                "{} interleaved rounds of wrk -t{} -c{} for {} s per run (the serial scenarios wrk -t1 -c1), {}; in each round `baseline` and `filter-pass-through`, then every other scenario followed by {}, the serial pair as `baseline-serial`, `filter-serial`, `baseline-serial`, and `baseline-repeat` last; every scenario's Envoy runs from the first round to the last",
                s.rounds,
                s.threads,
                s.connections,
                s.wrk_s,
                if s.warmup_s > 0 {
                    format!("after a {} s warm-up run per scenario before the first round, not counted", s.warmup_s)
                } else {
                    "no warm-up".to_string()
                },
                if s.quick {
                    "one of those two in turn (both after the last)"
                } else {
                    "those two again"
                }
            ),
        ),
        (
            "Envoy".into(),
            "1 worker (`--concurrency 1`) everywhere but the accuracy rows with 2 workers; the shipped envoy/envoy.yaml with its direct_response route (baseline: the wasm filter's entry removed; local_ratelimit: replaced by tests/bench/local_ratelimit.yaml)".into(),
        ),
        (
            "Webdis and Redis".into(),
            "the shipped envoy/webdis.json (2 threads, pool 4) and envoy/redis.conf (ACL users), each on a free loopback port; the throughput scenarios share one Redis and one Webdis, but `filter-bridge-hung`, whose own Webdis stays stopped, and `filter-bridge-down`, whose Envoy's Webdis port is 1 (nothing listens)".into(),
        ),
        (
            "filter, allow scenarios".into(),
            format!(
                "capacity 1,000,000,000, rate 1,000,000/s (never reached), bridge timeout {} ms, fail open",
                s.timeout_ms
            ),
        ),
        (
            "filter, leased scenarios".into(),
            {
                let p = leased_policy(s.timeout_ms);
                format!(
                    "{} limit {} per 1 s, burst {} (never reached, never full: see Leases), lease `{}`, bridge.clock_skew {} ms, bridge timeout {} ms, fail open",
                    p.algorithm,
                    p.rate_per_sec,
                    thousands(p.capacity as f64),
                    p.lease.map(|l| l.json().to_string()).unwrap_or_default(),
                    p.clock_skew_ms.unwrap_or(1000),
                    p.timeout_ms
                )
            },
        ),
        (
            "filter-plan-only".into(),
            "the filter built with the measurement-only feature `phase-plan-only` into target/phase-plan-only/ (plan, then continue undecided); the rule and load of filter-allow-1key".into(),
        ),
        (
            "filter-allow-1key-overrides".into(),
            "the rule and load of filter-allow-1key, its limit with `\"overrides\": true`, no override set in Redis (each decision's lookup finds nothing); an Envoy of its own".into(),
        ),
        (
            "filter-allow-1key-claim".into(),
            "the rule and load of filter-allow-1key keyed on `metadata:envoy.filters.http.jwt_authn:jwt_payload:sub`, which a `set_metadata` filter before the rate limiter sets on every request; an Envoy of its own".into(),
        ),
        (
            "filter-deny-hotkey".into(),
            format!(
                "one key, capacity 10, rate 1/s, bridge timeout {} ms",
                s.timeout_ms
            ),
        ),
        (
            "accuracy".into(),
            format!(
                "capacity {}, rate {}/s, the shipped bridge timeout ({} ms) and breaker; {} s closed-loop runs, {} connections per replica; overload run {} s, {} connections per replica",
                s.capacity, s.rate, s.timeout_ms, s.accuracy_s, s.accuracy_conns, s.overload_s, s.overload_conns
            ),
        ),
        (
            "accuracy with leases".into(),
            format!(
                "token_bucket and gcra as above, lease `{}`, bridge.clock_skew {} ms, on 4 replicas × 2 workers × {} connections; the overload run on the same Envoys",
                Lease::DEFAULT.json(),
                LEASED_CLOCK_SKEW_MS,
                s.accuracy_conns
            ),
        ),
        (
            "accuracy with an override".into(),
            format!(
                "token_bucket, capacity {}, rate {}/s, `\"overrides\": true`, on 4 replicas × 2 workers × {} connections for {} s, one key per row, its override set before the row's first request (no expiry): {}",
                s.capacity,
                s.rate,
                s.accuracy_conns,
                s.accuracy_s,
                OVERRIDE_ROWS
                    .iter()
                    .map(|(name, factor)| format!(
                        "`{name}` limit {} per 1 s, burst {}",
                        (s.rate * factor).round(),
                        (s.capacity as f64 * factor).round()
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ),
        (
            "accuracy of a concurrency limit".into(),
            format!(
                "one key, `limit` {CONCURRENCY_SLOTS} in flight, `max_duration` {CONCURRENCY_MAX_DURATION_S} s, bridge timeout 150 ms, fail open, on 4 replicas × 2 workers × {} keep-alive clients for {} s, each answer a stream of {CONCURRENCY_EVENTS} events {CONCURRENCY_EVENT_DELAY_MS} ms apart from the test upstream, the next request sent when it is read",
                s.accuracy_conns, s.accuracy_s
            ),
        ),
    ]
}

/// The commit, and whether the work tree differs from it.
pub fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(root())
            .arg("--no-optional-locks")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(sha) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("`{sha}` with uncommitted changes")
            } else {
                format!("`{sha}`")
            }
        }
        None => "unknown (not a git work tree)".into(),
    }
}
