//! `make bench`: every scenario in one run, on processes it starts itself (Redis, Webdis,
//! Envoy on free loopback ports) and stops again, then `target/bench/report.md` with
//! `results.json` and the raw outputs beside it. `--quick` (or BENCH_QUICK=1): the same
//! scenarios, short, for a smoke run (written to `target/bench-quick/`). `--out DIR` writes
//! elsewhere; `--only a,b` runs just these throughput scenarios (and the override, usage,
//! concurrency and busy-machine rows named); `--rounds N` sets the rounds
//! (at least 3: fewer fail the check of results.json).
//!
//! The runners are in `run/` (one file per part), the report in `report/`; the filter's config
//! schema is known only to `config::filter_json` (and, for the Redis Cluster section,
//! `run::cluster`).

mod about;
mod artifacts;
mod client;
mod config;
mod idle;
mod measure;
mod report;
mod run;
mod settings;
mod spread;
mod svg;
mod variant;
mod wrk;

use std::process::Command;
use std::time::Instant;

use e2e::procs::WorkDir;

use artifacts::write;
use run::Bench;
use settings::Settings;

fn main() {
    let s = Settings::from_args();
    // A run that panics midway stops the Redis, Webdis and Envoys it started.
    e2e::procs::stop_all_on_panic();
    let started = Instant::now();
    let started_utc = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M:%S"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    prepare_output(&s.out);
    let b = Bench {
        dir: WorkDir {
            path: s.out.join("procs"),
        },
        s,
        started,
    };
    let s = &b.s;
    b.say(&format!(
        "bench ({}), output in {}",
        if s.quick { "quick" } else { "full" },
        s.out.display()
    ));

    let report = run::everything(&b, started_utc);
    let idle = idle::run(&b);
    let everything = s.only.is_none();
    artifacts::charts(&report, &s.out);
    let markdown = report.markdown() + &idle.as_ref().map(idle::Idle::markdown).unwrap_or_default();
    write(&s.out.join("report.md"), &markdown);
    let mut results = report.json();
    if let (Some(idle), Some(all)) = (&idle, results.as_object_mut()) {
        all.insert("idle".into(), idle.json());
    }
    let json = serde_json::to_string_pretty(&results).unwrap_or_default();
    write(&s.out.join("results.json"), &json);

    println!("{}", report.throughput_table());
    println!("{}", report.capacity_table());
    println!("{}", report.phase_text());
    println!("{}", report.lease_text());
    // The rounds as results.json holds them, read back from the file.
    let written = std::fs::read_to_string(s.out.join("results.json")).unwrap_or_default();
    let results = serde_json::from_str(&written).unwrap_or(serde_json::Value::Null);
    let mut problems = report::rounds_problems(&results);
    if everything {
        println!("{}", report.accuracy_table());
        println!("{}", report.accuracy_leased_table());
        problems.extend(report.missing(&markdown));
    } else {
        println!("{}", report.cost_table());
    }
    if !report.accuracy_overrides.is_empty() {
        println!("{}", report.accuracy_overrides_table());
    }
    if !report.busy.is_empty() {
        println!("{}", report.busy_table());
    }
    if !report.usage.is_empty() {
        println!("{}", report.usage_table());
    }
    if report.concurrency.is_some() {
        println!("{}", report.concurrency_table());
    }
    if let Some(idle) = &idle {
        println!("{}", idle.markdown());
    }
    if !everything && !report.cluster.throughput.is_empty() {
        println!("{}", report.cluster_text());
    }
    if !problems.is_empty() {
        eprintln!(
            "the report is incomplete: {} ({} and results.json beside it)",
            problems.join("; "),
            s.out.join("report.md").display()
        );
        std::process::exit(1);
    }
    // The leases check, in the log too: a warning, not a failure (a loaded machine
    // can move it; the range says how far).
    if let Some(pair) = report.pair_ratio("filter-allow-10k-keys-leased", "filter-allow-10k-keys") {
        b.say(&format!(
            "filter-allow-10k-keys-leased over filter-allow-10k-keys, per round: {} ({}){}",
            pair.cell(),
            pair.rounds
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(" / "),
            if pair.median() < report::LEASED_OVER_UNLEASED_TARGET {
                format!(
                    ", below the {:.2} target",
                    report::LEASED_OVER_UNLEASED_TARGET
                )
            } else {
                String::new()
            }
        ));
    }
    if let Some(spread) = report.claim_over_header_us() {
        b.say(&format!(
            "filter-allow-1key-claim less filter-allow-1key, Envoy µs per request, per round: {:+.1} ({}){}",
            spread.median(),
            spread
                .rounds
                .iter()
                .map(|r| format!("{r:+.1}"))
                .collect::<Vec<_>>()
                .join(" / "),
            if spread.median() > report::CLAIM_OVER_HEADER_TARGET_US {
                format!(", above the +{} µs target", report::CLAIM_OVER_HEADER_TARGET_US)
            } else {
                String::new()
            }
        ));
    }
    b.say(&format!(
        "done: {} ({}each throughput scenario with {} rounds)",
        s.out.join("report.md").display(),
        if everything {
            "every scenario present, "
        } else {
            ""
        },
        s.rounds
    ));
}

/// Empties `out` for this run. Only an earlier bench output (or nothing) is replaced: `--out`
/// must not empty any other folder. The marker is written first, so a run that stopped
/// half-way is replaced too.
fn prepare_output(out: &std::path::Path) {
    let marker = out.join(".bench-output");
    let empty = match std::fs::read_dir(out) {
        Ok(mut entries) => entries.next().is_none(),
        Err(_) => true,
    };
    if !empty && !marker.exists() && !out.join("report.md").exists() {
        eprintln!(
            "{} holds files that no bench run wrote: not replacing it; choose another --out",
            out.display()
        );
        std::process::exit(2);
    }
    let _ = std::fs::remove_dir_all(out);
    for dir in ["raw", "procs"] {
        std::fs::create_dir_all(out.join(dir)).expect("create the output folder");
    }
    write(
        &marker,
        "written by `make bench` (tests/bench); replaced by the next run\n",
    );
}
