//! A bridge outage under steady load: Webdis stopped and resumed while one Envoy answers,
//! per 100 ms, with the breaker's gauge.

use std::time::Duration;

use e2e::procs::{Redis, Webdis};

use super::{filter_policy, unix_s, Bench};
use crate::client::{self, Load};
use crate::config::{Front, Policy};
use crate::measure;
use crate::report::Outage;
use crate::svg;

/// Steady load through one Envoy while Webdis is stopped and resumed: requests per second,
/// decided or let through, and their p99 per 100 ms, with the breaker's state read from
/// Envoy's gauge every 10 ms.
pub fn run(b: &Bench, failure_mode: &'static str) -> Outage {
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = &b.s;
    let redis = Redis::start(&b.dir);
    let webdis = Webdis::start(&b.dir, redis.port);
    // Open: a limit never reached, so every answer is a decision or a pass. Local: one key far
    // over 100 per second, so what each mode lets through shows.
    let local = failure_mode == "local";
    let policy = if local {
        Policy {
            failure_mode,
            ..filter_policy(100, 100.0, s.timeout_ms)
        }
    } else {
        filter_policy(1_000_000_000, 1_000_000.0, s.timeout_ms)
    };
    let envoy = b.start_envoy(Front::Filter(&[policy]), webdis.port);
    let (before, stopped, after) = if s.quick {
        (1.0, 2.0, 1.5)
    } else {
        (2.0, 5.0, 2.0)
    };
    let connections = 8;
    let load = Load {
        ports: vec![envoy.port],
        conns_per_port: connections,
        duration: Duration::from_secs_f64(before + stopped + after),
        headers: vec![("x-api-key".to_string(), "outage-timeline".to_string())],
        paced_total_per_sec: None,
        post: None,
    };
    let done = AtomicBool::new(false);
    let admin = envoy.admin_port;
    let (result, gauge, stop_unix, resume_unix) = std::thread::scope(|scope| {
        let poller = scope.spawn(|| {
            let mut changes: Vec<(f64, u64)> = Vec::new();
            while !done.load(Ordering::SeqCst) {
                let value = measure::envoy_stats(admin)
                    .get("wasmcustom.ratelimit_breaker_open")
                    .copied()
                    .unwrap_or(0);
                if changes.last().map(|c| c.1) != Some(value) {
                    changes.push((unix_s(), value));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            changes
        });
        let loaded = scope.spawn(|| client::run(&load));
        std::thread::sleep(Duration::from_secs_f64(0.2 + before));
        let stop_unix = unix_s();
        webdis.process.pause();
        std::thread::sleep(Duration::from_secs_f64(stopped));
        let resume_unix = unix_s();
        webdis.process.resume();
        let result = loaded.join().unwrap_or_else(|_| client::LoadResult {
            events: Vec::new(),
            start_unix: stop_unix,
        });
        done.store(true, Ordering::SeqCst);
        let gauge = poller.join().unwrap_or_default();
        (result, gauge, stop_unix, resume_unix)
    });
    let base = result.start_unix;
    let stop_s = stop_unix - base;
    let resume_s = resume_unix - base;
    let slice_s = 0.1;
    let n = ((before + stopped + after) / slice_s).ceil() as usize;
    let mut took: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut slices = vec![svg::Slice::default(); n];
    for e in &result.events {
        let i = ((e.at.as_secs_f64() / slice_s) as usize).min(n - 1);
        match (e.status, e.decided) {
            (200, true) => slices[i].allowed_per_s += 1.0 / slice_s,
            (200, false) => slices[i].undecided_per_s += 1.0 / slice_s,
            (429, _) => slices[i].refused_per_s += 1.0 / slice_s,
            _ => {}
        }
        took[i].push(e.took.as_secs_f64() * 1000.0);
    }
    for (slice, times) in slices.iter_mut().zip(&mut took) {
        times.sort_by(f64::total_cmp);
        if !times.is_empty() {
            let k = ((times.len() as f64 * 0.99).ceil() as usize).clamp(1, times.len()) - 1;
            slice.p99_ms = times[k];
        }
    }
    let at = |e: &client::Event| e.at.as_secs_f64();
    let sent = |e: &client::Event| (e.at - e.took).as_secs_f64();
    let breaker_open_s = gauge
        .iter()
        .find(|(t, v)| *t >= stop_unix && *v > 0)
        .map(|(t, _)| t - base);
    let breaker_closed_s = gauge
        .iter()
        .find(|(t, v)| *t >= resume_unix && *v == 0)
        .map(|(t, _)| t - base);
    let first_fast_after_stop_ms = result
        .events
        .iter()
        .find(|e| sent(e) >= stop_s && e.took.as_millis() < 10 && (!e.decided || local))
        .map(|e| (at(e) - stop_s) * 1000.0);
    let first_decided_after_resume_ms = result
        .events
        .iter()
        .find(|e| at(e) >= resume_s && e.decided)
        .map(|e| (at(e) - resume_s) * 1000.0);
    let open_from = breaker_open_s.unwrap_or(resume_s);
    let slowest_while_open_ms = result
        .events
        .iter()
        .filter(|e| sent(e) >= open_from && at(e) <= resume_s)
        .map(|e| e.took.as_secs_f64() * 1000.0)
        .fold(0.0, f64::max);
    // Local mode: what the fleet (here 1 replica × 1 worker) may let through per second.
    let local_bound_per_s = local.then_some(100.0 * 0.125);
    let allowed_per_s_while_out: Vec<u64> = if local {
        let first = stop_s.ceil() as u64;
        let last = resume_s.floor() as u64;
        (first..last)
            .map(|sec| {
                result
                    .events
                    .iter()
                    .filter(|e| e.status == 200 && at(e) >= sec as f64 && at(e) < (sec + 1) as f64)
                    .count() as u64
            })
            .collect()
    } else {
        Vec::new()
    };
    let outage = Outage {
        failure_mode: failure_mode.into(),
        local_bound_per_s,
        allowed_per_s_while_out,
        connections,
        stop_s,
        resume_s,
        slice_s,
        slices,
        breaker_open_s,
        breaker_closed_s,
        first_fast_after_stop_ms,
        first_decided_after_resume_ms,
        answered: result.count(200) + result.count(429),
        failed: result.events.len() as u64 - result.count(200) - result.count(429),
        slowest_while_open_ms,
        chart_file: format!("outage-{failure_mode}.svg"),
    };
    b.say(&format!(
            "outage ({failure_mode}): first fast answer {:?} ms after the stop, first decision {:?} ms after the resume, slowest while open {:.1} ms",
            outage.first_fast_after_stop_ms.map(|v| v.round()),
            outage.first_decided_after_resume_ms.map(|v| v.round()),
            outage.slowest_while_open_ms
        ),
    );
    outage
}
