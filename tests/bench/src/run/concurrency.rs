//! The accuracy row of a concurrency limit: 4 Envoys with 2 workers, each with its own Webdis,
//! on one Redis; more clients than slots, all on one API key, each streaming answers from the
//! OpenAI-compatible test upstream (in this process) back to back. The upstream counts the
//! requests it is answering: the most at once is what the limit is judged by.

use std::time::{Duration, Instant};

use e2e::procs::{Envoy, Redis, Webdis};
use e2e::resp::RedisConn;
use e2e::{llm, LlmUpstream};

use super::Bench;
use crate::client::{self, Load, Post};
use crate::config::{ConcurrencyPolicy, Front, CONCURRENCY_LIMIT_NAME};
use crate::measure;
use crate::report::{ConcurrencyAccuracy, CONCURRENCY_ROW};

/// The row's limit: slots per key, far fewer than the clients (4 replicas × the accuracy
/// connections per replica).
pub const CONCURRENCY_SLOTS: u64 = 8;
/// Far above any answer here: a release that never came would show as a slot still held
/// after the run, not be hidden by its expiry.
pub const CONCURRENCY_MAX_DURATION_S: u64 = 600;
/// Each answer: this many events, this far apart (about 150 ms a stream).
pub const CONCURRENCY_EVENTS: u32 = 4;
pub const CONCURRENCY_EVENT_DELAY_MS: u64 = 50;
/// How long the slots may take to be released once every stream has ended: each release
/// leaves at its worker's next wake-up, far sooner than this.
const DRAIN_BOUND: Duration = Duration::from_secs(5);

pub fn policy() -> ConcurrencyPolicy {
    ConcurrencyPolicy {
        name: CONCURRENCY_ROW,
        limit: CONCURRENCY_SLOTS,
        max_duration_s: CONCURRENCY_MAX_DURATION_S,
        timeout_ms: 150,
    }
}

/// The row, if `--only` names it (always without), on processes of its own: the upstream's
/// peak then counts this row's requests alone.
pub fn run(b: &Bench) -> Option<ConcurrencyAccuracy> {
    let s = &b.s;
    if !s.wants(CONCURRENCY_ROW) {
        return None;
    }
    let redis = Redis::start(&b.dir);
    let upstream = LlmUpstream::start();
    let policy = policy();
    let workers = 2;
    let webdis: Vec<Webdis> = (0..4).map(|_| Webdis::start(&b.dir, redis.port)).collect();
    let front = Front::LlmConcurrency {
        policy: &policy,
        upstream: upstream.port,
    };
    let envoys: Vec<Envoy> = webdis
        .iter()
        .map(|w| b.start_envoy_workers(front, w.port, workers))
        .collect();
    let key = format!("accuracy-{}", policy.name);
    let slots_key = envoys[0].keys().limit_key(
        policy.name,
        CONCURRENCY_LIMIT_NAME,
        "header:x-api-key",
        key.as_bytes(),
    );
    let load = Load {
        ports: envoys.iter().map(|e| e.port).collect(),
        conns_per_port: s.accuracy_conns,
        duration: Duration::from_secs_f64(s.accuracy_s),
        headers: vec![
            ("x-api-key".to_string(), key),
            (llm::EVENTS.to_string(), CONCURRENCY_EVENTS.to_string()),
            (
                llm::EVENT_DELAY.to_string(),
                CONCURRENCY_EVENT_DELAY_MS.to_string(),
            ),
        ],
        paced_total_per_sec: None,
        post: Some(Post {
            path: "/v1/chat/completions".into(),
            body: r#"{"model":"gpt-test","messages":[{"role":"user","content":"Say hello."}],"stream":true}"#
                .into(),
            seed_header: None,
            seed_base: 0,
            streamed: true,
        }),
    };
    let mut admin = redis.admin();
    let commands_before = measure::redis_commandstats(&mut admin);
    let before: Vec<_> = envoys
        .iter()
        .map(|e| measure::envoy_stats(e.admin_port))
        .collect();
    let result = client::run(&load);
    // Every client has read its last answer; the upstream may still be closing one.
    let ended = Instant::now();
    while upstream.in_flight() > 0 && ended.elapsed() < DRAIN_BOUND {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (slots_left, drained_ms) = drain(&mut admin, &slots_key, ended);
    // After the drain: every release that reached Redis was counted when it was sent.
    let deltas: Vec<_> = envoys
        .iter()
        .zip(&before)
        .map(|(e, b)| measure::delta(b, &measure::envoy_stats(e.admin_port)))
        .collect();
    let commands = measure::delta(&commands_before, &measure::redis_commandstats(&mut admin));
    let sum = |name: &str| -> u64 {
        deltas
            .iter()
            .map(|m| m.get(name).copied().unwrap_or(0))
            .sum()
    };
    let bounds = result.bounds();
    let row = ConcurrencyAccuracy {
        name: policy.name.to_string(),
        limit: policy.limit,
        max_duration_s: policy.max_duration_s,
        events: CONCURRENCY_EVENTS,
        event_delay_ms: CONCURRENCY_EVENT_DELAY_MS,
        replicas: envoys.len(),
        workers,
        conns_per_replica: load.conns_per_port,
        duration_s: s.accuracy_s,
        span_s: bounds.last_read - bounds.first_sent,
        peak_in_flight: upstream.peak_in_flight(),
        sent: result.events.len() as u64,
        answered: result.count(200),
        refused: result.count(429),
        failed: result
            .events
            .iter()
            .filter(|e| e.status != 200 && e.status != 429)
            .count() as u64,
        fail_open: sum("wasmcustom.ratelimit_failure_mode_open"),
        release_calls: sum("wasmcustom.ratelimit_usage_settlement_calls"),
        settlements_lost: sum("wasmcustom.ratelimit_usage_settlements_lost"),
        slots_taken: commands.get("zadd").copied().unwrap_or(0),
        slots_released: commands.get("zrem").copied().unwrap_or(0),
        slots_left,
        drained_ms,
    };
    b.say(&format!(
        "accuracy {}: {} clients on {} replicas x {workers} workers, {} slots: {} requests, {} answered ({:.1}/s), {} refused, {} failed; at most {} in flight at the upstream: overshoot {}; {} release calls, {} slots taken and {} released in Redis, {} left{}; fail-open {}",
        row.name,
        row.clients(),
        row.replicas,
        row.limit,
        row.sent,
        row.answered,
        row.answers_per_s(),
        row.refused,
        row.failed,
        row.peak_in_flight,
        row.overshoot(),
        row.release_calls,
        row.slots_taken,
        row.slots_released,
        row.slots_left,
        row.drained_ms
            .map_or_else(String::new, |ms| format!(" (0 within {ms:.0} ms)")),
        row.fail_open
    ));
    Some(row)
}

/// Polls ZCARD of `key` until 0 or [`DRAIN_BOUND`] after `since`: its last value, and the ms
/// from `since` to when it was 0.
fn drain(admin: &mut RedisConn, key: &str, since: Instant) -> (u64, Option<f64>) {
    loop {
        let held = admin
            .cmd(&["ZCARD", key])
            .map(|r| r.int().max(0) as u64)
            .unwrap_or(u64::MAX);
        if held == 0 {
            return (0, Some(since.elapsed().as_secs_f64() * 1000.0));
        }
        if since.elapsed() >= DRAIN_BOUND {
            return (held, None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
