//! The idle rows: Envoy alone and Envoy with the filter and the shipped config, 2 workers each,
//! no traffic, measured side by side over the same window (so that whatever else the machine
//! runs meanwhile weighs on both alike): CPU in % of one core from `/proc/PID/stat`, and the
//! thread wake-ups per second (context switches of all the process's threads, from
//! `/proc/PID/task/*/status`: a count, steadier than CPU time on a shared machine).

use std::time::{Duration, Instant};

use e2e::free_port;
use e2e::procs::{envoy_config, Envoy, Redis, Webdis};
use serde_json::{json, Value};

use crate::config::{self, Front};
use crate::measure::{clock_ticks_per_second, cpu_seconds};
use crate::run::Bench;

/// Workers of each Envoy.
const WORKERS: u32 = 2;
/// What the filter may add to an idle Envoy, in % of one core.
const TARGET_PCT: f64 = 0.2;
/// The gauge of workers whose timer runs.
const TIMERS: &str = "wasmcustom.ratelimit_worker_timers";

pub struct Row {
    name: &'static str,
    cpu_pct: f64,
    wakeups_per_s: f64,
}

pub struct Idle {
    seconds: f64,
    settle_s: f64,
    rows: Vec<Row>,
    /// The filter's `ratelimit_worker_timers` at the end (None: not shown).
    timers: Option<u64>,
}

/// The idle rows (20 s, 4 s with `--quick`), or None with `--only` not naming `idle`.
pub fn run(b: &Bench) -> Option<Idle> {
    if b.s
        .only
        .as_ref()
        .is_some_and(|o| !o.iter().any(|n| n == "idle"))
    {
        return None;
    }
    let (seconds, settle_s) = if b.s.quick { (4.0, 2.0) } else { (20.0, 5.0) };
    b.say(&format!(
        "idle: Envoy alone and with the filter, {WORKERS} workers, {seconds} s"
    ));
    let redis = Redis::start(&b.dir);
    let webdis = Webdis::start(&b.dir, redis.port);
    let start = |yaml: &dyn Fn(u16, u16) -> String| {
        let (port, admin) = (free_port(), free_port());
        Envoy::start_config(&b.dir, port, admin, &yaml(port, admin), WORKERS)
    };
    let alone =
        start(&|port, admin| config::envoy_yaml(&Front::Baseline, port, admin, webdis.port));
    let filter = start(&|port, admin| envoy_config(port, admin, webdis.port, &[]));
    // Start-up (the module compiled for each worker, the listeners) is not idling.
    std::thread::sleep(Duration::from_secs_f64(settle_s));
    let pids = [alone.process.pid(), filter.process.pid()];
    let before = pids.map(|pid| (cpu_seconds(pid), wakeups(pid)));
    let began = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let after = pids.map(|pid| (cpu_seconds(pid), wakeups(pid)));
    let took = began.elapsed().as_secs_f64();
    let rows = ["alone", "filter"]
        .into_iter()
        .zip(before.into_iter().zip(after))
        .map(|(name, ((cpu0, wake0), (cpu1, wake1)))| Row {
            name,
            cpu_pct: cpu1
                .zip(cpu0)
                .map_or(f64::NAN, |(a, b)| (a - b) / took * 100.0),
            wakeups_per_s: wake1.saturating_sub(wake0) as f64 / took,
        })
        .collect();
    let timers = timers(filter.admin_port);
    Some(Idle {
        seconds: took,
        settle_s,
        rows,
        timers,
    })
}

/// Context switches so far over every thread of `pid` (each one a wake-up of a thread that
/// slept or was preempted).
fn wakeups(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split(':').nth(1)?.trim().parse::<u64>().ok())
                .collect::<Vec<u64>>()
        })
        .sum()
}

fn timers(admin_port: u16) -> Option<u64> {
    let stats = e2e::http::get(admin_port, &format!("/stats?filter=^{TIMERS}$"), &[]).ok()?;
    stats
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{TIMERS}: ")))
        .and_then(|v| v.trim().parse().ok())
}

impl Idle {
    fn row(&self, name: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.name == name)
    }

    /// What the filter adds, in % of one core.
    fn added_pct(&self) -> f64 {
        match (self.row("filter"), self.row("alone")) {
            (Some(f), Some(a)) => f.cpu_pct - a.cpu_pct,
            _ => f64::NAN,
        }
    }

    /// The report's section.
    pub fn markdown(&self) -> String {
        let mut r = String::from("\n## Idle\n\n");
        r += &format!(
            "Two Envoys side by side, {WORKERS} workers each, no traffic, measured over the same {:.1} s (after {:.0} s for their start-up): Envoy alone (the shipped config without the filter) and Envoy with the filter and the shipped config. CPU is `utime + stime` of the process over the window, counted by the kernel in steps of {:.0} ms (here {:.2} % of a core); wake-ups are the context switches of all its threads.\n\n",
            self.seconds,
            self.settle_s,
            1000.0 / clock_ticks_per_second(),
            100.0 / clock_ticks_per_second() / self.seconds
        );
        r += "| Envoy | CPU, % of one core | thread wake-ups / s |\n|---|---:|---:|\n";
        for row in &self.rows {
            let name = match row.name {
                "alone" => "alone",
                _ => "with the filter",
            };
            r += &format!(
                "| {name} | {:.2} | {:.1} |\n",
                row.cpu_pct, row.wakeups_per_s
            );
        }
        r += &format!(
            "\nThe filter adds {:.2} % of a core (target: at most {TARGET_PCT}). Workers whose timer ran at the end (`ratelimit_worker_timers`): {}.\n",
            // Rounded first, so that a difference just below 0 reads 0.00, not -0.00.
            (self.added_pct() * 100.0).round() / 100.0 + 0.0,
            self.timers.map_or("not shown".to_string(), |t| t.to_string())
        );
        r
    }

    /// The section of `results.json`.
    pub fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(
                |r| json!({"name": r.name, "cpu_pct": r.cpu_pct, "wakeups_per_s": r.wakeups_per_s}),
            )
            .collect();
        json!({
            "workers": WORKERS, "seconds": self.seconds, "settle_s": self.settle_s,
            "cpu_step_pct": 100.0 / clock_ticks_per_second() / self.seconds,
            "rows": rows, "filter_added_pct": self.added_pct(),
            "target_at_most_pct": TARGET_PCT, "worker_timers_at_end": self.timers,
        })
    }
}
