//! `make bench`: every scenario in one run, on processes it starts itself (Redis, Webdis,
//! Envoy on free loopback ports) and stops again, then `target/bench/report.md` with the raw
//! outputs beside it. `--quick` (or BENCH_QUICK=1): the same scenarios, short, for a smoke run
//! (written to `target/bench-quick/`). `--out DIR` writes elsewhere.
//!
//! The parts are in `tests/bench/src/`; the filter's config schema is known only to
//! `config::filter_json` (and, for the Redis Cluster section, `cluster::filter_json`).

mod client;
mod cluster;
mod config;
mod measure;
mod report;
mod svg;
mod variant;
mod wrk;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use client::Load;
use config::{Algorithm, Front, Lease, Policy, ALGORITHMS};
use e2e::procs::{Envoy, Redis, Webdis, WorkDir};
use e2e::resp::RedisConn;
use e2e::{envoy_bin, free_port, root, wasm_path};
use measure::BENCH_OWN_COMMANDS;
use report::{
    Accuracy, Cost, KeyFlood, LeaseCounters, Outage, Report, Scenario, Timeline,
    CONCURRENT_ALGORITHMS, LEASED_ALGORITHMS, SCENARIOS,
};
use wrk::{Requests, WrkLoad};

struct Settings {
    quick: bool,
    /// `--only a,b`: just these throughput scenarios, no accuracy runs (for measuring a
    /// change by hand; the report then says what it lacks).
    only: Option<Vec<String>>,
    out: PathBuf,
    /// Length of each measured wrk run, and of the warm-up before it.
    wrk_s: u64,
    warmup_s: u64,
    threads: u32,
    connections: u32,
    /// The accuracy runs: length, connections per replica, the limit.
    accuracy_s: f64,
    accuracy_conns: usize,
    overload_s: f64,
    overload_conns: usize,
    capacity: u64,
    rate: f64,
    /// Bridge timeout of the throughput scenarios (the shipped default).
    timeout_ms: u64,
}

impl Settings {
    fn from_args() -> Settings {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let env_quick = std::env::var("BENCH_QUICK")
            .map(|v| !v.is_empty() && v != "0")
            .unwrap_or(false);
        let quick = env_quick || args.iter().any(|a| a == "--quick");
        let out = args
            .iter()
            .position(|a| a == "--out")
            .and_then(|i| args.get(i + 1))
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                root().join(if quick {
                    "target/bench-quick"
                } else {
                    "target/bench"
                })
            });
        let only = args
            .iter()
            .position(|a| a == "--only")
            .and_then(|i| args.get(i + 1))
            .map(|list| list.split(',').map(str::to_string).collect());
        Settings {
            quick,
            only,
            out,
            wrk_s: if quick { 1 } else { 10 },
            warmup_s: if quick { 0 } else { 2 },
            threads: 2,
            connections: 32,
            // Not a whole number of seconds: the window algorithms' allowance is a step function of
            // the span, whose start and end are known to a few ms, so keep the span off the steps.
            accuracy_s: if quick { 1.5 } else { 10.5 },
            accuracy_conns: 8,
            overload_s: if quick { 2.0 } else { 20.0 },
            overload_conns: 4,
            capacity: 100,
            rate: 100.0,
            timeout_ms: 150,
        }
    }
}

impl Settings {
    /// Whether throughput scenario `name` runs (`--only` names the ones that do).
    fn wants(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == name))
    }
}

/// Progress on stderr, with the time since the start.
fn say(started: Instant, text: &str) {
    eprintln!("[{:>4.0}s] {text}", started.elapsed().as_secs_f64());
}

fn main() {
    let s = Settings::from_args();
    let started = Instant::now();
    let started_utc = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M:%S"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    // Only an earlier bench output (or nothing) is replaced: `--out` must not empty any other
    // folder. The marker is written first, so a run that stopped half-way is replaced too.
    let marker = s.out.join(".bench-output");
    let empty = match std::fs::read_dir(&s.out) {
        Ok(mut entries) => entries.next().is_none(),
        Err(_) => true,
    };
    if !empty && !marker.exists() && !s.out.join("report.md").exists() {
        eprintln!(
            "{} holds files that no bench run wrote: not replacing it; choose another --out",
            s.out.display()
        );
        std::process::exit(2);
    }
    let _ = std::fs::remove_dir_all(&s.out);
    std::fs::create_dir_all(s.out.join("raw")).expect("create the output folder");
    write(
        &marker,
        "written by `make bench` (tests/src/bin/bench.rs); replaced by the next run\n",
    );
    std::fs::create_dir_all(s.out.join("procs")).expect("create the output folder");
    let dir = WorkDir {
        path: s.out.join("procs"),
    };
    let wasm = wasm_path();
    say(
        started,
        &format!(
            "bench ({}), output in {}",
            if s.quick { "quick" } else { "full" },
            s.out.display()
        ),
    );

    let mut scenarios = throughput(&s, &dir, started);
    scenarios.sort_by_key(|sc| SCENARIOS.iter().position(|n| *n == sc.name));
    let (accuracy, timeline, outages, floods, cluster) = if s.only.is_some() {
        (
            Vec::new(),
            Timeline::default(),
            Vec::new(),
            Vec::new(),
            cluster::ClusterSection::default(),
        )
    } else {
        let (accuracy, timeline) = accuracy(&s, &dir, started);
        let outages = vec![
            outage_run(&s, &dir, started, "open"),
            outage_run(&s, &dir, started, "local"),
        ];
        let floods = vec![
            key_flood(&s, &dir, started, None),
            key_flood(
                &s,
                &dir,
                started,
                Some(r#"{"new_keys": 1000, "window": "10s"}"#),
            ),
        ];
        let cluster = cluster::run(s.wrk_s, s.accuracy_s, &s.out, &|text| say(started, text));
        (accuracy, timeline, outages, floods, cluster)
    };
    let (accuracy_leased, timeline_leased) = if s.only.is_some() {
        (Vec::new(), Timeline::default())
    } else {
        leased_accuracy(&s, &dir, started)
    };

    let versions = vec![
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
    ];
    let settings = vec![
        (
            "throughput runs".to_string(),
            format!(
                "wrk -t{} -c{} for {} s each, {}; the serial scenarios wrk -t1 -c1",
                s.threads,
                s.connections,
                s.wrk_s,
                if s.warmup_s > 0 {
                    format!("after a {} s warm-up run that is not counted", s.warmup_s)
                } else {
                    "no warm-up".to_string()
                }
            ),
        ),
        (
            "Envoy".into(),
            "1 worker (`--concurrency 1`) everywhere but the accuracy rows with 2 workers; the shipped envoy/envoy.yaml with its direct_response route (baseline: the wasm filter's entry removed; local_ratelimit: replaced by tests/bench/local_ratelimit.yaml)".into(),
        ),
        (
            "Webdis and Redis".into(),
            "the shipped envoy/webdis.json (2 threads, pool 4) and envoy/redis.conf (ACL users), each on a free loopback port".into(),
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
                    report::thousands(p.capacity as f64),
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
            "filter-deny-hotkey".into(),
            format!(
                "one key, capacity 10, rate 1/s, bridge timeout {} ms",
                s.timeout_ms
            ),
        ),
        (
            "accuracy".into(),
            format!(
                "capacity {}, rate {}/s, bridge timeout 5 s and breaker stall 5 s; {} s closed-loop runs, {} connections per replica; overload run {} s, {} connections per replica",
                s.capacity, s.rate, s.accuracy_s, s.accuracy_conns, s.overload_s, s.overload_conns
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
    ];
    let chart_file = "overload.svg".to_string();
    let chart_file_leased = "overload-leased.svg".to_string();
    let report = Report {
        quick: s.quick,
        started_utc,
        took_s: started.elapsed().as_secs_f64(),
        commit: commit(),
        machine: measure::machine(),
        versions,
        settings,
        scenarios,
        accuracy,
        timeline,
        chart_file: chart_file.clone(),
        accuracy_leased,
        timeline_leased,
        chart_file_leased: chart_file_leased.clone(),
        leased: leased_policy(s.timeout_ms),
        outages,
        floods,
        cluster,
    };
    let timelines = [
        (&report.timeline, &chart_file, "", "overload-per-second.csv"),
        (
            &report.timeline_leased,
            &chart_file_leased,
            ", leases on",
            "overload-leased-per-second.csv",
        ),
    ];
    for (t, file, note, csv_file) in timelines {
        if t.per_second.is_empty() {
            continue;
        }
        let workers = if t.run.workers > 1 {
            format!(" × {} workers", t.run.workers)
        } else {
            String::new()
        };
        let svg = svg::chart(
            &format!(
                "{}: one key, {} replicas{workers}, C = {}, R = {}/s, offered {:.0}/s = 3 × R{note}",
                t.run.algorithm,
                t.run.replicas,
                t.run.capacity,
                t.run.rate_per_sec,
                t.run.offered_per_sec.unwrap_or(0.0)
            ),
            &t.per_second,
            t.run.rate_per_sec,
            t.run.offered_per_sec.unwrap_or(0.0),
        );
        write(&s.out.join(file), &svg);
        let csv: String = std::iter::once("second,allowed,denied,failed\n".to_string())
            .chain(
                t.per_second
                    .iter()
                    .enumerate()
                    .map(|(i, (a, d, f))| format!("{i},{a},{d},{f}\n")),
            )
            .collect();
        write(&s.out.join("raw").join(csv_file), &csv);
    }
    for o in report.outages.iter().filter(|o| !o.slices.is_empty()) {
        let mut marks = vec![
            (o.stop_s, "Webdis stopped".to_string(), "#000000"),
            (o.resume_s, "Webdis resumed".to_string(), "#000000"),
        ];
        if let Some(t) = o.breaker_open_s {
            marks.push((t, "breaker open".to_string(), "#d1495b"));
        }
        if let Some(t) = o.breaker_closed_s {
            marks.push((t, "breaker closed".to_string(), "#1f5fbf"));
        }
        let title = format!(
            "Webdis stopped for {:.0} s under {} connections (failure mode {})",
            o.resume_s - o.stop_s,
            o.connections,
            o.failure_mode
        );
        let bound = o
            .local_bound_per_s
            .map(|b| (b, format!("local bound {b:.1}/s")));
        let chart = svg::outage(&title, &o.slices, o.slice_s, &marks, bound);
        write(&s.out.join(&o.chart_file), &chart);
    }
    let markdown = report.markdown();
    write(&s.out.join("report.md"), &markdown);
    let json = serde_json::to_string_pretty(&report.json()).unwrap_or_default();
    write(&s.out.join("results.json"), &json);

    println!("{}", report.throughput_table());
    println!("{}", report.phase_text());
    println!("{}", report.lease_text());
    if s.only.is_some() {
        println!("{}", report.cost_table());
        return;
    }
    println!("{}", report.accuracy_table());
    println!("{}", report.accuracy_leased_table());
    let missing = report.missing(&markdown);
    if !missing.is_empty() {
        eprintln!(
            "the report misses: {} ({})",
            missing.join(", "),
            s.out.join("report.md").display()
        );
        std::process::exit(1);
    }
    say(
        started,
        &format!(
            "done: {} (every scenario present)",
            s.out.join("report.md").display()
        ),
    );
}

fn write(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// The commit, and whether the work tree differs from it.
fn commit() -> String {
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

fn start_envoy(dir: &WorkDir, front: Front, webdis_port: u16) -> Envoy {
    start_envoy_workers(dir, front, webdis_port, 1)
}

fn start_envoy_workers(dir: &WorkDir, front: Front, webdis_port: u16, workers: u32) -> Envoy {
    let port = free_port();
    let mut admin = free_port();
    while admin == port {
        admin = free_port();
    }
    let yaml = config::envoy_yaml(&front, port, admin, webdis_port);
    Envoy::start_config(dir, port, admin, &yaml, workers)
}

/// `bridge.clock_skew` of the leased runs: every replica here runs on one machine, one clock.
const LEASED_CLOCK_SKEW_MS: u64 = 10;

/// The leased throughput scenarios' limit: every request allowed (a burst of 10 million, far
/// more than a run spends) and a bucket never full for long (a refill of 1 per second, far
/// below what the load spends; a lease's 100 units take 100 s to come back), so a lease lasts
/// its `max_ms`. (The filter refuses a burst whose state would live over 732 days: 10 million
/// at 1 per second is 116.) See the report's Leases section.
fn leased_policy(timeout_ms: u64) -> Policy {
    Policy {
        lease: Some(Lease::DEFAULT),
        clock_skew_ms: Some(LEASED_CLOCK_SKEW_MS),
        ..filter_policy(10_000_000, 1.0, timeout_ms)
    }
}

fn filter_policy(capacity: u64, rate: f64, timeout_ms: u64) -> Policy {
    Policy {
        failure_mode: "open",
        algorithm: "token_bucket",
        capacity,
        rate_per_sec: rate,
        timeout_ms,
        lease: None,
        clock_skew_ms: None,
    }
}

/// What a throughput scenario runs against: the Envoy, and the processes whose CPU counts.
struct Target<'a> {
    envoy: &'a Envoy,
    webdis: Option<&'a Webdis>,
    redis: &'a Redis,
    filter: bool,
}

impl<'a> Target<'a> {
    fn new(envoy: &'a Envoy, webdis: Option<&'a Webdis>, redis: &'a Redis, filter: bool) -> Self {
        Target {
            envoy,
            webdis,
            redis,
            filter,
        }
    }
}

/// The throughput scenarios, on one Redis and one Webdis.
fn throughput(s: &Settings, dir: &WorkDir, started: Instant) -> Vec<Scenario> {
    // Built before anything runs, so that the build's CPU is in no measurement.
    let plan_only = s.wants("filter-plan-only").then(|| {
        say(started, "building the filter with feature phase-plan-only");
        variant::build("phase-plan-only")
    });
    let redis = Redis::start(dir);
    let mut webdis = Webdis::start(dir, redis.port);
    let mut admin = redis.admin();
    let many = |requests: Requests| WrkLoad {
        threads: s.threads,
        connections: s.connections,
        duration_s: s.wrk_s,
        requests,
    };
    let one_key = many(Requests::OneKey("bench-client".into()));
    let serial = WrkLoad {
        threads: 1,
        connections: 1,
        ..one_key.clone()
    };
    let mut out = Vec::new();
    let mut run = |name: &str, what: &str, compare_to: &str, load: &WrkLoad, t: &Target| {
        if !s.wants(name) {
            return;
        }
        let scenario = measure_scenario(s, &mut admin, name, what, compare_to, load, t);
        say(
            started,
            &format!(
                "{name}: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms",
                scenario.run.rps, scenario.run.p50_ms, scenario.run.p99_ms
            ),
        );
        out.push(scenario);
    };

    {
        let envoy = start_envoy(dir, Front::Baseline, webdis.port);
        let t = Target::new(&envoy, None, &redis, false);
        run(
            "baseline",
            "Envoy, same route, no rate-limit filter",
            "baseline",
            &one_key,
            &t,
        );
        run(
            "baseline-serial",
            "as baseline, 1 connection, one request at a time",
            "baseline-serial",
            &serial,
            &t,
        );
    }
    {
        let envoy = start_envoy(dir, Front::LocalRateLimit, webdis.port);
        let t = Target::new(&envoy, None, &redis, false);
        run(
            "local_ratelimit",
            "Envoy's built-in local_ratelimit, limit never reached",
            "baseline",
            &one_key,
            &t,
        );
    }
    let allow = filter_policy(1_000_000_000, report::UNLEASED_ALLOW_RATE, s.timeout_ms);
    {
        let envoy = start_envoy(dir, Front::PassThrough(&[allow]), webdis.port);
        let t = Target::new(&envoy, Some(&webdis), &redis, true);
        run(
            "filter-pass-through",
            "the filter loaded, its rule matching no request: the floor of any wasm filter here",
            "baseline",
            &one_key,
            &t,
        );
    }
    if let Some(wasm) = &plan_only {
        let envoy = start_envoy(dir, Front::Variant(&[allow], wasm), webdis.port);
        let t = Target::new(&envoy, Some(&webdis), &redis, true);
        run(
            "filter-plan-only",
            "the filter built with `phase-plan-only`: each request planned as in filter-allow-1key, then let through undecided",
            "baseline",
            &one_key,
            &t,
        );
    }
    let envoy = start_envoy(dir, Front::Filter(&[allow]), webdis.port);
    {
        let t = Target::new(&envoy, Some(&webdis), &redis, true);
        run(
            "filter-allow-1key",
            "the filter, every request allowed, one key",
            "baseline",
            &one_key,
            &t,
        );
        run(
            "filter-allow-10k-keys",
            "the filter, every request allowed, keys of 10,000 clients in turn",
            "baseline",
            &many(Requests::ManyKeys(10_000)),
            &t,
        );
        run(
            "filter-serial",
            "as filter-allow-1key, 1 connection, one request at a time",
            "baseline-serial",
            &serial,
            &t,
        );
    }
    if s.wants("filter-allow-1key-leased") || s.wants("filter-allow-10k-keys-leased") {
        let leased = start_envoy(
            dir,
            Front::Filter(&[leased_policy(s.timeout_ms)]),
            webdis.port,
        );
        let t = Target::new(&leased, Some(&webdis), &redis, true);
        run(
            "filter-allow-1key-leased",
            "as filter-allow-1key with a lease on a limit spent faster than it refills (see Leases)",
            "baseline",
            &one_key,
            &t,
        );
        run(
            "filter-allow-10k-keys-leased",
            "as filter-allow-10k-keys with a lease on the same limit",
            "baseline",
            &many(Requests::ManyKeys(10_000)),
            &t,
        );
    }
    {
        let deny = start_envoy(
            dir,
            Front::Filter(&[filter_policy(10, 1.0, s.timeout_ms)]),
            webdis.port,
        );
        let t = Target::new(&deny, Some(&webdis), &redis, true);
        run(
            "filter-deny-hotkey",
            "the filter, one abusive key far over its limit (capacity 10, 1/s): nearly all 429",
            "baseline",
            &many(Requests::OneKey("bench-abuser".into())),
            &t,
        );
    }
    webdis.process.pause();
    {
        let t = Target::new(&envoy, Some(&webdis), &redis, true);
        run(
            "filter-bridge-hung",
            "the filter, Webdis stopped (SIGSTOP): the breaker opens on the first stalled call, then requests fail open without a call",
            "baseline",
            &one_key,
            &t,
        );
    }
    webdis.process.resume();
    webdis.process.stop();
    {
        let t = Target::new(&envoy, None, &redis, true);
        run(
            "filter-bridge-down",
            "the filter, Webdis killed: connection refused, the breaker opens, fail open without a call",
            "baseline",
            &one_key,
            &t,
        );
    }
    drop(envoy);
    {
        // The first baseline again, last: how far the machine drifted during the run.
        let envoy = start_envoy(dir, Front::Baseline, 1);
        let t = Target::new(&envoy, None, &redis, false);
        run(
            "baseline-repeat",
            "baseline again, after all the others: the run's noise",
            "baseline",
            &one_key,
            &t,
        );
    }
    out
}

fn measure_scenario(
    s: &Settings,
    admin: &mut RedisConn,
    name: &str,
    what: &str,
    compare_to: &str,
    load: &WrkLoad,
    t: &Target,
) -> Scenario {
    let raw = s.out.join("raw");
    if s.warmup_s > 0 {
        let warmup = WrkLoad {
            duration_s: s.warmup_s,
            ..load.clone()
        };
        wrk::run(t.envoy.port, &warmup, &wrk::raw_path(&raw, name, true));
    }
    let mut procs = vec![("envoy", t.envoy.process.pid())];
    if t.filter {
        procs.push(("webdis", t.webdis.map(|w| w.process.pid()).unwrap_or(0)));
        procs.push(("redis", t.redis.process.pid()));
    }
    let cpu_before: Vec<Option<f64>> = procs
        .iter()
        .map(|(_, pid)| measure::cpu_seconds(*pid))
        .collect();
    let redis_before = measure::redis_commandstats(admin);
    let stats_before = measure::envoy_stats(t.envoy.admin_port);
    let busy_before = measure::machine_busy_seconds();
    let wall = Instant::now();
    let run = wrk::run(t.envoy.port, load, &wrk::raw_path(&raw, name, false));
    let wall_s = wall.elapsed().as_secs_f64();
    let machine_busy_s = match (busy_before, measure::machine_busy_seconds()) {
        (Some(b), Some(a)) => Some(a - b),
        _ => None,
    };
    let stats = measure::delta(&stats_before, &measure::envoy_stats(t.envoy.admin_port));
    let mut redis_commands = measure::delta(&redis_before, &measure::redis_commandstats(admin));
    redis_commands.retain(|name, calls| *calls > 0 && !BENCH_OWN_COMMANDS.contains(&name.as_str()));
    let cpu = procs
        .iter()
        .zip(cpu_before)
        .map(|((label, pid), before)| {
            let used = match (before, measure::cpu_seconds(*pid)) {
                (Some(b), Some(a)) if *pid != 0 => Some(a - b),
                _ => None,
            };
            (label.to_string(), used)
        })
        .collect();
    let stat = |name: &str| stats.get(name).copied().unwrap_or(0);
    Scenario {
        name: name.into(),
        what: what.into(),
        compare_to: compare_to.into(),
        load: format!(
            "wrk -t{} -c{} -d{}s",
            load.threads, load.connections, load.duration_s
        ),
        run,
        cost: Cost {
            allowed: stat("wasmcustom.ratelimit_allowed"),
            denied: stat("wasmcustom.ratelimit_denied"),
            fail_open: stat("wasmcustom.ratelimit_failure_mode_open"),
            bridge_errors: stat("wasmcustom.ratelimit_bridge_errors"),
            webdis_calls: stat("cluster.webdis.upstream_rq_total"),
            bridge_calls: stat("wasmcustom.ratelimit_bridge_calls"),
            deny_cache_hits: stat("wasmcustom.ratelimit_deny_cache_hits"),
            webdis_connect_fails: stat("cluster.webdis.upstream_cx_connect_fail"),
            lease: LeaseCounters::sum(std::slice::from_ref(&stats)),
            redis_commands,
            redis_keys: admin
                .cmd(&["DBSIZE"])
                .map(|r| r.text().parse().unwrap_or(0))
                .unwrap_or(0),
            cpu,
            machine_busy_s,
            wall_s,
        },
        filter: t.filter,
    }
}

/// The accuracy runs (2 and 4 replicas, each algorithm) and the overload timeline (the first
/// algorithm), on a fresh Redis shared by 4 Envoys, each with its own Webdis. The Envoys hold
/// one rule per algorithm, picked by a request header.
fn accuracy(s: &Settings, dir: &WorkDir, started: Instant) -> (Vec<Accuracy>, Timeline) {
    let redis = Redis::start(dir);
    let policies: Vec<Policy> = ALGORITHMS
        .iter()
        .map(|a| Policy {
            failure_mode: "open",
            algorithm: a.name,
            capacity: s.capacity,
            rate_per_sec: s.rate,
            timeout_ms: 5000,
            lease: None,
            clock_skew_ms: None,
        })
        .collect();
    let webdis: Vec<Webdis> = (0..4).map(|_| Webdis::start(dir, redis.port)).collect();
    let envoys: Vec<Envoy> = webdis
        .iter()
        .map(|w| start_envoy(dir, Front::Filter(&policies), w.port))
        .collect();
    let mut runs = Vec::new();
    for (algorithm, policy) in ALGORITHMS.iter().zip(&policies) {
        for replicas in [2, 4] {
            let key = format!("accuracy-{}-{replicas}", algorithm.name);
            let envoys = &envoys[..replicas];
            runs.push(closed_loop(s, started, envoys, 1, algorithm, policy, key));
        }
    }
    {
        // Several workers per replica: each worker's engine batches and caches refusals on
        // its own, all racing on one key.
        let workers = 2;
        let envoys2: Vec<Envoy> = webdis
            .iter()
            .map(|w| start_envoy_workers(dir, Front::Filter(&policies), w.port, workers))
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
            runs.push(closed_loop(
                s, started, &envoys2, workers, algorithm, policy, key,
            ));
        }
    }
    let timeline = overload(
        s,
        started,
        &envoys,
        1,
        &policies[0],
        format!("overload-{}", ALGORITHMS[0].name),
    );
    (runs, timeline)
}

/// The paced 3× overload run on one key of `policy`'s algorithm, through `envoys`: allowed,
/// denied and failed per second.
fn overload(
    s: &Settings,
    started: Instant,
    envoys: &[Envoy],
    workers: u32,
    policy: &Policy,
    key: String,
) -> Timeline {
    let Some(algorithm) = ALGORITHMS.iter().find(|a| a.name == policy.algorithm) else {
        return Timeline::default();
    };
    let load = Load {
        ports: envoys.iter().map(|e| e.port).collect(),
        conns_per_port: s.overload_conns,
        duration: Duration::from_secs_f64(s.overload_s),
        headers: accuracy_headers(algorithm.name, key),
        paced_total_per_sec: Some(3.0 * policy.rate_per_sec),
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
    say(
        started,
        &format!(
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
        ),
    );
    Timeline { run, per_second }
}

/// The request headers of an accuracy run: the key, and the header that picks the rule.
fn accuracy_headers(algorithm: &str, key: String) -> Vec<(String, String)> {
    vec![
        ("x-api-key".to_string(), key),
        (config::POLICY_HEADER.to_string(), algorithm.to_string()),
    ]
}

/// The accuracy runs with leases on (token bucket and GCRA, 4 replicas × 2 workers), and the
/// overload timeline with leases on, on processes of their own: a fresh Redis, 4 Webdis, 4
/// Envoys with 2 workers whose rules take a lease.
fn leased_accuracy(s: &Settings, dir: &WorkDir, started: Instant) -> (Vec<Accuracy>, Timeline) {
    let redis = Redis::start(dir);
    let policies: Vec<Policy> = LEASED_ALGORITHMS
        .iter()
        .map(|name| Policy {
            failure_mode: "open",
            algorithm: name,
            capacity: s.capacity,
            rate_per_sec: s.rate,
            timeout_ms: 5000,
            lease: Some(Lease::DEFAULT),
            clock_skew_ms: Some(LEASED_CLOCK_SKEW_MS),
        })
        .collect();
    let workers = 2;
    let webdis: Vec<Webdis> = (0..4).map(|_| Webdis::start(dir, redis.port)).collect();
    let envoys: Vec<Envoy> = webdis
        .iter()
        .map(|w| start_envoy_workers(dir, Front::Filter(&policies), w.port, workers))
        .collect();
    let mut runs = Vec::new();
    for policy in &policies {
        let Some(algorithm) = ALGORITHMS.iter().find(|a| a.name == policy.algorithm) else {
            continue;
        };
        let key = format!("accuracy-{}-leased", algorithm.name);
        runs.push(closed_loop(
            s, started, &envoys, workers, algorithm, policy, key,
        ));
    }
    let timeline = overload(
        s,
        started,
        &envoys,
        workers,
        &policies[0],
        format!("overload-{}-leased", policies[0].algorithm),
    );
    (runs, timeline)
}

/// One closed-loop accuracy run: `s.accuracy_conns` connections per Envoy spending `key` under
/// `algorithm`'s rule for `s.accuracy_s`, as fast as answered; says what it saw.
fn closed_loop(
    s: &Settings,
    started: Instant,
    envoys: &[Envoy],
    workers: u32,
    algorithm: &Algorithm,
    policy: &Policy,
    key: String,
) -> Accuracy {
    let load = Load {
        ports: envoys.iter().map(|e| e.port).collect(),
        conns_per_port: s.accuracy_conns,
        duration: Duration::from_secs_f64(s.accuracy_s),
        headers: accuracy_headers(algorithm.name, key),
        paced_total_per_sec: None,
    };
    let (run, _) = accuracy_run(envoys, workers, algorithm, policy, &load, s.accuracy_s);
    say(
        started,
        &format!(
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

fn accuracy_run(
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

/// Unix time in seconds.
fn unix_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Steady load through one Envoy while Webdis is stopped and resumed: requests per second,
/// decided or let through, and their p99 per 100 ms, with the breaker's state read from
/// Envoy's gauge every 10 ms.
fn outage_run(s: &Settings, dir: &WorkDir, started: Instant, failure_mode: &'static str) -> Outage {
    use std::sync::atomic::{AtomicBool, Ordering};
    let redis = Redis::start(dir);
    let webdis = Webdis::start(dir, redis.port);
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
    let envoy = start_envoy(dir, Front::Filter(&[policy]), webdis.port);
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
    say(
        started,
        &format!(
            "outage ({failure_mode}): first fast answer {:?} ms after the stop, first decision {:?} ms after the resume, slowest while open {:.1} ms",
            outage.first_fast_after_stop_ms.map(|v| v.round()),
            outage.first_decided_after_resume_ms.map(|v| v.round()),
            outage.slowest_while_open_ms
        ),
    );
    outage
}

/// Resident memory of a process, bytes (`VmRSS` in /proc), 0 if unreadable.
fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|l| {
                l.strip_prefix("VmRSS:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
        })
        .map_or(0, |kb| kb * 1024)
}

/// Redis `used_memory`, bytes.
fn redis_used_memory(conn: &mut RedisConn) -> u64 {
    conn.cmd(&["INFO", "memory"])
        .ok()
        .and_then(|info| {
            info.text().lines().find_map(|l| {
                l.strip_prefix("used_memory:")
                    .and_then(|v| v.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

/// A flood of new client addresses (one request each) against a per-IP rule, with or without
/// `budget` (the rule's `key_budget` JSON): keys created, and Redis, Envoy and Webdis memory
/// before and after.
fn key_flood(s: &Settings, dir: &WorkDir, started: Instant, budget: Option<&str>) -> KeyFlood {
    let addresses: u32 = if s.quick { 20_000 } else { 200_000 };
    say(
        started,
        &format!(
            "key flood: {addresses} new addresses, key budget {}",
            budget.unwrap_or("none")
        ),
    );
    let redis = Redis::start(dir);
    let webdis = Webdis::start(dir, redis.port);
    let json = format!(
        r#"{{"bridge": {{"username": "ratelimit", "password": "ratelimit-demo-secret", "timeout": "{}ms"}},
"xff_trusted_hops": 1,
"rules": [{{"name": "per_ip", "key": {{"from": ["client_ip"]}}, {}
  "limits": [{{"name": "minute", "limit": 10, "window": "1m"}}]}}]}}"#,
        s.timeout_ms,
        budget.map_or(String::new(), |b| format!(r#""key_budget": {b},"#))
    );
    let (from, to) = e2e::procs::filter_config_edit(&json);
    let port = free_port();
    let mut admin = free_port();
    while admin == port {
        admin = free_port();
    }
    let yaml = e2e::procs::envoy_config(port, admin, webdis.port, &[(&from, &to)]);
    let envoy = Envoy::start_config(dir, port, admin, &yaml, 1);
    // One request first, so that the script is loaded and the Envoy's memory is warm.
    let _ = e2e::get(port, "/", &[("x-forwarded-for", b"192.0.2.1")]);
    let mut conn = redis.admin();
    let dbsize = |conn: &mut RedisConn| conn.cmd(&["DBSIZE"]).map(|r| r.int() as u64).unwrap_or(0);
    let keys_before = dbsize(&mut conn);
    let redis_before = redis_used_memory(&mut conn);
    let envoy_before = rss_bytes(envoy.process.pid());
    let webdis_before = rss_bytes(webdis.process.pid());
    let flood = e2e::flood::flood(port, 0, addresses, 32, Duration::from_secs(300));
    let envoy_after = rss_bytes(envoy.process.pid());
    let webdis_after = rss_bytes(webdis.process.pid());
    let result = KeyFlood {
        budget: budget.map(str::to_string),
        addresses: u64::from(addresses),
        seconds: flood.elapsed.as_secs_f64(),
        allowed: flood.status(200),
        denied: flood.status(429),
        lost: flood.lost + flood.answered() - flood.status(200) - flood.status(429),
        budget_exceeded: envoy.counter("ratelimit_key_budget_exceeded"),
        keys_before,
        keys_after: dbsize(&mut conn),
        redis_memory: (redis_before, redis_used_memory(&mut conn)),
        envoy_rss: (envoy_before, envoy_after),
        webdis_rss: (webdis_before, webdis_after),
    };
    say(
        started,
        &format!(
            "key flood done in {:.1} s: {} keys in Redis",
            result.seconds, result.keys_after
        ),
    );
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every throughput policy makes a config the filter accepts (checked with its own
    /// parser on the shipped config), so no scenario dies at Envoy's start.
    #[test]
    fn the_throughput_policies_are_valid_filter_configs() {
        let shipped = std::fs::read_to_string(root().join("envoy/envoy.yaml")).expect("envoy.yaml");
        let (block, _) = e2e::procs::filter_json_block(&shipped);
        let shipped: serde_json::Value = serde_json::from_str(&block).expect("JSON");
        let policies = [
            filter_policy(1_000_000_000, 1_000_000.0, 150),
            filter_policy(10, 1.0, 150),
            leased_policy(150),
        ];
        for p in policies {
            let json = config::filter_json(&shipped, &[p], false).to_string();
            let parsed = ratelimit_core::Config::parse(json.as_bytes());
            assert!(parsed.is_ok(), "{p:?}: {:?}", parsed.err());
        }
        let leased = config::filter_json(&shipped, &[leased_policy(150)], false).to_string();
        let parsed = ratelimit_core::Config::parse(leased.as_bytes()).expect("valid");
        assert!(parsed.rules[0].limits[0].lease.is_some());
    }
}
