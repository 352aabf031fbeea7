use std::collections::BTreeMap;

use super::*;
use crate::config::{Lease, Policy};
use crate::wrk::WrkRun;

/// CPU per request of Envoy, Webdis and Redis in the runs [`measured`] makes, µs.
const CPU_US: [f64; 3] = [30.0, 5.0, 10.0];

/// One run of `rps` req/s, its processes using [`CPU_US`] per request; its place in the run
/// is set by [`report`].
fn measured(round: usize, rps: f64, requests: u64) -> Measured {
    Measured {
        round,
        seq: 0,
        run: WrkRun {
            rps,
            requests,
            ..WrkRun::default()
        },
        cost: Cost {
            cpu: PROCESSES
                .iter()
                .zip(CPU_US)
                .map(|(p, us)| (p.to_string(), Some(us * requests as f64 / 1e6)))
                .collect(),
            ..Cost::default()
        },
    }
}

/// A scenario with one run per round at these req/s, `rps × 10` requests in all.
fn scenario_rounds(name: &str, rounds: &[f64]) -> Scenario {
    let total = (median_of(rounds) * 10.0) as u64;
    let n = rounds.len() as u64;
    let runs = rounds
        .iter()
        .enumerate()
        .map(|(i, rps)| {
            let share = total / n + if i as u64 == n - 1 { total % n } else { 0 };
            measured(i, *rps, share)
        })
        .collect();
    Scenario::new(name, "", "baseline", "", name.starts_with("filter"), runs)
}

fn median_of(v: &[f64]) -> f64 {
    crate::spread::median(v)
}

/// The same req/s in each of 3 rounds.
fn scenario(name: &str, rps: f64) -> Scenario {
    scenario_rounds(name, &[rps; 3])
}

/// A report of `scenarios`, run in this order in each round: a run's place is its round
/// × 100 + its scenario's index, so each scenario sits between the runs of the ones listed
/// before it in this round and those of the next round.
fn report(mut scenarios: Vec<Scenario>) -> Report {
    for (i, s) in scenarios.iter_mut().enumerate() {
        for m in &mut s.runs {
            m.seq = m.round * 100 + i;
        }
    }
    Report {
        quick: true,
        started_utc: String::new(),
        took_s: 0.0,
        commit: String::new(),
        machine: Machine::default(),
        versions: Vec::new(),
        settings: Vec::new(),
        scenarios,
        accuracy: Vec::new(),
        timeline: Timeline::default(),
        chart_file: String::new(),
        accuracy_leased: Vec::new(),
        accuracy_overrides: Vec::new(),
        usage: Vec::new(),
        concurrency: None,
        busy: Vec::new(),
        timeline_leased: Timeline::default(),
        chart_file_leased: String::new(),
        leased: Policy {
            algorithm: "token_bucket",
            capacity: 10_000_000,
            rate_per_sec: 1.0,
            timeout_ms: 150,
            failure_mode: "open",
            lease: Some(Lease::DEFAULT),
            clock_skew_ms: Some(10),
            overrides: false,
            claim: false,
        },
        outages: Vec::new(),
        floods: Vec::new(),
        cluster: Default::default(),
    }
}

#[test]
fn phases_are_throughput_and_cost_against_envoy_alone() {
    let r = report(vec![
        scenario("baseline", 50_000.0),
        scenario("filter-pass-through", 40_000.0),
        scenario("filter-plan-only", 25_000.0),
        scenario("filter-allow-1key", 10_000.0),
        scenario("filter-allow-1key-leased", 20_000.0),
    ]);
    let phases = r.phases();
    let names: Vec<&str> = phases.iter().map(|p| p.scenario).collect();
    // In the table's order; a phase whose scenario did not run is left out.
    assert_eq!(
        names,
        [
            "baseline",
            "filter-pass-through",
            "filter-plan-only",
            "filter-allow-1key",
            "filter-allow-1key-leased"
        ]
    );
    assert_eq!((phases[0].ratio, phases[0].cost), (1.0, 1.0));
    assert_eq!((phases[1].ratio, phases[1].cost), (0.8, 1.25));
    assert_eq!((phases[2].ratio, phases[2].cost), (0.5, 2.0));
    assert_eq!((phases[3].ratio, phases[3].cost), (0.2, 5.0));
    assert_eq!(phases[2].spread.rounds, [0.5, 0.5, 0.5]);
    let text = r.phase_text();
    assert!(
        text.contains("| `filter-plan-only` | 25,000 | 0.50 (0.50–0.50) | 2.00 |"),
        "{text}"
    );
    assert!(text.contains(
        "the wasm filter's floor costs 0.25 of a plain request, the plan 0.75 more; a batched decision +3.00 over the plan; a leased decision +0.50 over the plan."
    ));
    // Without a lease counter the text says the filter does not lease.
    assert!(text.contains("this filter build does not lease yet"));
    assert!(r.missing("").contains(&"the per-phase table".to_string()));
    assert!(report(vec![scenario("filter-plan-only", 1.0)])
        .phases()
        .is_empty());
}

#[test]
fn lease_counters_are_summed_where_exported() {
    let with = BTreeMap::from([
        (LeaseCounters::HITS.to_string(), 90),
        (LeaseCounters::GRANTS.to_string(), 2),
    ]);
    let more = BTreeMap::from([(LeaseCounters::HITS.to_string(), 10)]);
    let without = BTreeMap::from([("wasmcustom.ratelimit_allowed".to_string(), 5)]);
    let sum = LeaseCounters::sum(&[with, more, without.clone()]);
    assert_eq!(sum.hits, Some(100));
    assert_eq!(sum.grants, Some(2));
    assert_eq!(sum.units_returned, None);
    assert!(sum.exported());
    assert!(!LeaseCounters::sum(&[without]).exported());
    assert_eq!(LeaseCounters::cell(None), "–");
    assert_eq!(LeaseCounters::cell(Some(1234)), "1,234");
}

#[test]
fn the_lease_table_pairs_each_allow_scenario_with_its_leased_twin() {
    let mut leased = scenario("filter-allow-1key-leased", 20_000.0);
    leased.cost.allowed = 200_000;
    leased.cost.bridge_calls = 2_000;
    leased.cost.lease = LeaseCounters {
        hits: Some(198_000),
        grants: Some(2_000),
        units_returned: Some(50),
    };
    let r = report(vec![
        scenario("baseline", 50_000.0),
        scenario("filter-pass-through", 40_000.0),
        scenario("filter-allow-1key", 10_000.0),
        leased,
    ]);
    let text = r.lease_text();
    assert!(text.contains("`limit` 1 per 1 s, `burst` 10,000,000"));
    assert!(text.contains("`bridge.clock_skew` 10 ms"));
    assert!(text.contains("a lease's own 100 units take 100 s to refill"));
    assert!(text.contains("refill a lease of 100 units in 0.1 ms"));
    assert!(
        text.contains(
            "| `filter-allow-1key` | 10,000 | 0.20 (0.20–0.20) | 0.25 (0.25–0.25) | 0.0000 | – | – | – |"
        ),
        "{text}"
    );
    assert!(text.contains(
        "| `filter-allow-1key-leased` | 20,000 | 0.40 (0.40–0.40) | 0.50 (0.50–0.50) | 0.0100 | 198,000 (99.0%) | 2,000 | 50 |"
    ));
    // Leased over unleased, round by round.
    assert!(
        text.contains(
            "| `filter-allow-1key-leased` | `filter-allow-1key` | 2.00 (2.00–2.00) | 2.00 / 2.00 / 2.00 |"
        ),
        "{text}"
    );
    assert!(!text.contains("exports no lease counters"));
}

#[test]
fn leased_accuracy_runs_and_timeline_are_required() {
    let mut r = report(Vec::new());
    r.timeline_leased.per_second = vec![(200, 100, 0), (100, 200, 0)];
    assert!(r.timeline_leased_text().contains("too short"));
    r.timeline_leased.per_second.clear();
    let missing = r.missing("");
    for part in [
        "accuracy token_bucket with leases",
        "accuracy gcra with leases",
        "overload timeline with leases",
    ] {
        assert!(missing.contains(&part.to_string()), "{part}");
    }
    r.accuracy_leased = LEASED_ALGORITHMS
        .iter()
        .map(|a| Accuracy {
            algorithm: a.to_string(),
            sent: 10,
            allowance: 100.0,
            ..Accuracy::default()
        })
        .collect();
    r.timeline_leased.per_second = vec![(200, 100, 0), (100, 200, 0), (100, 200, 0)];
    r.timeline_leased.run.rate_per_sec = 100.0;
    let missing = r.missing("");
    assert!(
        !missing.iter().any(|m| m.contains("with leases")),
        "{missing:?}"
    );
    assert!(r
        .timeline_leased_text()
        .contains("against an allowance of R = 100 per second: 100;"));
}

#[test]
fn steady_seconds_leave_out_the_first_and_the_partial_last() {
    let per_second = [(200, 0, 0), (100, 1, 0), (99, 2, 0), (40, 0, 0)];
    assert_eq!(steady_seconds(&per_second), vec![100, 99]);
    assert!(steady_seconds(&per_second[..1]).is_empty());
}

#[test]
fn overshoot_is_what_passed_beyond_the_floor_of_the_allowance() {
    let a = Accuracy {
        capacity: 100,
        rate_per_sec: 100.0,
        window_s: 10.004,
        allowance: 1100.4,
        allowance_inner: 1100.1,
        allowed: 1100,
        filter_allowed: 1100,
        ..Accuracy::default()
    };
    assert_eq!(a.overshoot(), 0);
    let racy = Accuracy {
        allowed: 1103,
        ..a.clone()
    };
    assert_eq!(racy.overshoot(), 3);
    let fail_open = Accuracy { fail_open: 2, ..a };
    assert_eq!(fail_open.overshoot(), 2);
}

/// A slowdown during one round moves that round's req/s of both the scenario and the
/// reference runs around it: the ratio stays, and the median ignores the odd round.
#[test]
fn each_run_is_set_against_the_reference_runs_around_it() {
    // Round 2 (index 1) ran on a machine twice as slow; round 3 was disturbed only during the
    // scenario's own run.
    let r = report(vec![
        scenario_rounds("filter-pass-through", &[40_000.0, 20_000.0, 40_000.0]),
        scenario_rounds("filter-allow-1key", &[20_000.0, 10_000.0, 8_000.0]),
    ]);
    let s = r.scenario("filter-allow-1key").expect("scenario");
    // Each run sits between the reference's run of its round and that of the next round.
    let ratio = r.ratio_to(s, PASS_THROUGH).expect("ratio");
    assert_eq!(
        ratio.rounds,
        [20_000.0 / 30_000.0, 10_000.0 / 30_000.0, 0.2]
    );
    let one_sided = report(vec![
        scenario_rounds("filter-allow-1key", &[20_000.0, 10_000.0, 8_000.0]),
        scenario_rounds("filter-pass-through", &[40_000.0, 20_000.0, 40_000.0]),
    ]);
    let s = one_sided.scenario("filter-allow-1key").expect("scenario");
    let ratio = one_sided.ratio_to(s, PASS_THROUGH).expect("ratio");
    // The first run has a reference run only after it.
    assert_eq!(ratio.rounds, [0.5, 10_000.0 / 30_000.0, 8_000.0 / 30_000.0]);
    assert_eq!(ratio.median(), 10_000.0 / 30_000.0);
    assert_eq!(ratio.min(), 8_000.0 / 30_000.0);
    assert_eq!(ratio.max(), 0.5);
    // Req/s: the median of the rounds.
    assert_eq!(s.run.rps, 10_000.0);
    assert_eq!(s.rounds().rounds, [20_000.0, 10_000.0, 8_000.0]);
    // No reference run, no ratio.
    assert!(one_sided.ratio_to(s, "baseline").is_none());
}

/// The leased / unleased check: both over the pass-through runs around them, per round.
#[test]
fn leased_over_unleased_is_a_median_over_rounds_of_normalised_req_s() {
    let r = report(vec![
        scenario_rounds("filter-pass-through", &[40_000.0, 20_000.0, 40_000.0]),
        scenario_rounds("filter-allow-10k-keys", &[20_000.0, 10_000.0, 20_000.0]),
        scenario_rounds(
            "filter-allow-10k-keys-leased",
            &[19_000.0, 9_000.0, 18_000.0],
        ),
    ]);
    let pair = r
        .pair_ratio("filter-allow-10k-keys-leased", "filter-allow-10k-keys")
        .expect("pair");
    assert_eq!(pair.rounds.len(), 3);
    assert!((pair.median() - 0.9).abs() < 1e-12, "{pair:?}");
    assert!((pair.min() - 0.9).abs() < 1e-12 && (pair.max() - 0.95).abs() < 1e-12);
    let json = r.json();
    let pairs = json["leased_over_unleased"].as_array().expect("pairs");
    let ten_k = pairs
        .iter()
        .find(|p| p["scenario"] == "filter-allow-10k-keys-leased")
        .expect("10k pair");
    assert_eq!(ten_k["over"], "filter-allow-10k-keys");
    assert_eq!(ten_k["rounds"].as_array().map(Vec::len), Some(3));
    assert_eq!(ten_k["target_at_least"], 0.9);
}

/// Every scenario's req/s per round is in results.json beside `rps`, their median, and a
/// results.json without them is caught.
#[test]
fn results_json_holds_the_rounds_of_every_scenario() {
    let mut r = report(vec![
        scenario_rounds("baseline", &[50_000.0, 40_000.0, 45_000.0]),
        scenario_rounds("filter-pass-through", &[40_000.0, 30_000.0, 35_000.0]),
        scenario_rounds("filter-allow-1key", &[10_000.0, 9_000.0, 12_000.0]),
    ]);
    let mut single = ClusterThroughput {
        setup: "one Redis".into(),
        ..Default::default()
    };
    single.runs = [5_000.0, 6_000.0, 4_000.0]
        .iter()
        .map(|rps| WrkRun {
            rps: *rps,
            ..WrkRun::default()
        })
        .collect();
    single.run.rps = 5_000.0;
    r.cluster.throughput = vec![single];
    let json = r.json();
    let scenarios = json["scenarios"].as_array().expect("scenarios");
    assert_eq!(scenarios.len(), 3);
    for s in scenarios {
        assert_eq!(s["rounds"].as_array().map(Vec::len), Some(3), "{s}");
    }
    let allow = &scenarios[2];
    assert_eq!(allow["rps"], 10_000.0);
    assert_eq!(
        allow["rounds"],
        serde_json::json!([10_000.0, 9_000.0, 12_000.0])
    );
    let to_pass = &allow["ratios"][PASS_THROUGH];
    assert_eq!(to_pass["rounds"].as_array().map(Vec::len), Some(3));
    assert_eq!(allow["ratio_to_pass_through"], to_pass["median"]);
    assert_eq!(
        json["cluster"]["throughput"][0]["rounds"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );
    assert_eq!(rounds_problems(&json), Vec::<String>::new());

    // Too few rounds, a missing list, a median that is not the rounds', a cluster setup short
    // of rounds: each is named.
    let mut broken = json.clone();
    broken["scenarios"][0]["rounds"] = serde_json::json!([50_000.0, 40_000.0]);
    broken["scenarios"][1]
        .as_object_mut()
        .expect("object")
        .remove("rounds");
    broken["scenarios"][2]["rps"] = serde_json::json!(11_000.0);
    broken["cluster"]["throughput"][0]["rounds"] = serde_json::json!([5_000.0, 0.0, 4_000.0]);
    let problems = rounds_problems(&broken);
    assert_eq!(problems.len(), 4, "{problems:?}");
    assert!(problems[0].starts_with("scenario \"baseline\": 2 rounds"));
    assert!(problems[1].starts_with("scenario \"filter-pass-through\": 0 rounds"));
    assert!(problems[2].contains("is not the median of its rounds"));
    assert!(problems[3].starts_with("cluster setup \"one Redis\": 2 rounds"));
    assert_eq!(
        rounds_problems(&serde_json::json!({})),
        ["no throughput scenario"]
    );
}

#[test]
fn a_scenario_sums_its_runs_costs_and_takes_medians_of_its_latencies() {
    let run = |round, rps, p99_ms, allowed, cpu| Measured {
        round,
        seq: round,
        run: WrkRun {
            rps,
            requests: 100,
            p99_ms,
            ..WrkRun::default()
        },
        cost: Cost {
            allowed,
            cpu: vec![("envoy".into(), Some(cpu))],
            wall_s: 1.0,
            machine_busy_s: Some(0.5),
            ..Cost::default()
        },
    };
    let s = Scenario::new(
        "filter-allow-1key",
        "",
        "baseline",
        "",
        true,
        vec![
            run(0, 100.0, 3.0, 10, 0.25),
            run(1, 300.0, 1.0, 20, 0.5),
            run(2, 200.0, 2.0, 30, 0.25),
        ],
    );
    assert_eq!((s.run.rps, s.run.p99_ms, s.run.requests), (200.0, 2.0, 300));
    assert_eq!(s.cost.allowed, 60);
    assert_eq!(s.cost.cpu, vec![("envoy".to_string(), Some(1.0))]);
    assert_eq!((s.cost.wall_s, s.cost.machine_busy_s), (3.0, Some(1.5)));
}

fn usage_row(name: &str, admit: &str, estimate: u64, used: u64) -> UsageAccuracy {
    UsageAccuracy {
        name: name.into(),
        admit: admit.into(),
        estimate,
        usage_range: (1, 2000),
        tokens: 40_000,
        window_s: 3600,
        replicas: 4,
        workers: 2,
        conns_per_replica: 8,
        allowance: 40_016.7,
        used,
        sent: 100,
        admitted: 30,
        refused: 70,
        ..UsageAccuracy::default()
    }
}

#[test]
fn usage_overshoot_and_under_admission_are_measured_against_the_floor_of_the_allowance() {
    let exact = usage_row("usage-reserve", "reserve", 2000, 40_016);
    assert_eq!((exact.overshoot(), exact.under_admission()), (0, 0));
    let short = usage_row("usage-reserve", "reserve", 2000, 38_650);
    assert_eq!((short.overshoot(), short.under_admission()), (0, 1366));
    let over = usage_row("usage-after", "after", 2000, 63_044);
    assert_eq!((over.overshoot(), over.under_admission()), (23_028, 0));
    // The bound: 32 requests in flight, each at most the top of the range (after) or the top
    // above the estimate (reserve).
    assert_eq!(over.overshoot_bound(), 32 * 2000);
    assert_eq!(short.overshoot_bound(), 0);
    let low = usage_row("usage-estimate-too-low", "reserve", 500, 48_621);
    assert_eq!(low.overshoot_bound(), 32 * 1500);
}

#[test]
fn every_usage_row_is_required_in_the_report_and_in_results_json() {
    let mut r = report(Vec::new());
    let missing = r.missing("");
    for (name, _, _) in USAGE_ROWS {
        assert!(
            missing.contains(&format!("usage accuracy row {name}")),
            "{name}: {missing:?}"
        );
    }
    r.usage = USAGE_ROWS
        .iter()
        .map(|(name, admit, estimate)| usage_row(name, admit, *estimate, 40_000))
        .collect();
    let markdown = r.markdown();
    let missing = r.missing(&markdown);
    assert!(
        !missing.iter().any(|m| m.contains("usage accuracy")),
        "{missing:?}"
    );
    assert!(markdown.contains("| `usage-after` | after | 2,000 | 4 × 2 × 8 |"));
    let json = r.json();
    assert_eq!(
        json["usage_accuracy"].as_array().map(Vec::len),
        Some(USAGE_ROWS.len())
    );
    assert_eq!(json["usage_accuracy"][2]["overshoot_bound"], 64_000);
    assert_eq!(json["usage_accuracy"][0]["under_admission"], 16);
    // A row that ran without a request counts as missing.
    r.usage[1].sent = 0;
    let missing = r.missing(&r.markdown());
    assert!(missing.contains(&"usage accuracy row usage-estimate-too-low".to_string()));
}

fn concurrency_row(peak: u64) -> ConcurrencyAccuracy {
    ConcurrencyAccuracy {
        name: CONCURRENCY_ROW.into(),
        limit: 8,
        max_duration_s: 600,
        events: 4,
        event_delay_ms: 50,
        replicas: 4,
        workers: 2,
        conns_per_replica: 8,
        duration_s: 1.5,
        span_s: 2.0,
        peak_in_flight: peak,
        sent: 500,
        answered: 60,
        refused: 440,
        slots_taken: 60,
        slots_released: 60,
        drained_ms: Some(30.0),
        ..ConcurrencyAccuracy::default()
    }
}

/// The concurrency row is judged by the most in flight at the upstream against the slots,
/// is required in the report and in results.json, and says when slots were left held.
#[test]
fn the_concurrency_row_is_judged_by_the_most_in_flight_and_required() {
    assert_eq!(concurrency_row(8).overshoot(), 0);
    assert_eq!(concurrency_row(3).overshoot(), 0);
    assert_eq!(concurrency_row(11).overshoot(), 3);
    assert_eq!(concurrency_row(8).answers_per_s(), 30.0);
    assert_eq!(concurrency_row(8).clients(), 32);

    let mut r = report(Vec::new());
    let wanted = format!("concurrency accuracy row {CONCURRENCY_ROW}");
    assert!(r.missing("").contains(&wanted));
    assert!(r
        .markdown()
        .contains("### Concurrency limits (requests in flight)\n\nNot run."));
    r.concurrency = Some(concurrency_row(8));
    let markdown = r.markdown();
    assert!(!r.missing(&markdown).contains(&wanted), "{markdown}");
    assert!(markdown.contains("| `concurrency` | 8 | 4 × 2 × 8 |"));
    assert!(markdown.contains("| **0** |"));
    assert!(markdown.contains("| 0 (30 ms) |"));
    let json = r.json();
    assert_eq!(json["concurrency_accuracy"]["overshoot"], 0);
    assert_eq!(json["concurrency_accuracy"]["clients"], 32);
    assert_eq!(json["concurrency_accuracy"]["slots_released"], 60);

    // Slots still held at the bound show in bold; a row without a request is missing.
    let mut left = concurrency_row(8);
    (left.slots_left, left.drained_ms) = (2, None);
    r.concurrency = Some(left);
    assert!(r.concurrency_table().contains("| **2** |"));
    if let Some(c) = r.concurrency.as_mut() {
        c.sent = 0;
    }
    assert!(r.missing(&r.markdown()).contains(&wanted));
}

/// A busy row counts every unit that passed, decided or not, against a full bucket plus the
/// refill over its span; a row that could not run says why, and both count as present.
#[test]
fn busy_rows_count_failed_open_units_and_say_why_one_did_not_run() {
    let row = BusyRow {
        name: "busy-loops".into(),
        how: "4 busy loops".into(),
        hot_rate: 50,
        span_s: 10.2,
        hot_requests: 3000,
        hot_units: 600,
        hot_failed_open_units: 40,
        ..BusyRow::default()
    };
    assert_eq!(row.hot_allowance(), 560.0);
    assert_eq!(row.overshoot(), 40);
    let mut r = report(Vec::new());
    r.busy = vec![
        row,
        BusyRow {
            name: "cpu-quota".into(),
            skipped: Some("not root".into()),
            ..BusyRow::default()
        },
    ];
    let text = r.busy_table();
    assert!(text.contains("| `busy-loops` | 4 busy loops |"), "{text}");
    assert!(text.contains("**40**"), "{text}");
    assert!(text.contains("not run: not root"), "{text}");
    let missing = r.missing("");
    assert!(
        !missing.iter().any(|m| m.starts_with("busy-machine row")),
        "{missing:?}"
    );
    r.busy.pop();
    assert!(r
        .missing("")
        .contains(&"busy-machine row cpu-quota".to_string()));
}

/// An override row as the runner fills it: allowance under the override's numbers (C, R of
/// the run), the config's own beside it.
fn override_row(name: &str, factor: f64, allowed: u64) -> OverrideAccuracy {
    OverrideAccuracy {
        name: name.into(),
        config_limit: 100,
        config_burst: 100,
        config_allowance: 1150.0,
        overridden: allowed + 10,
        bad_override: 0,
        run: Accuracy {
            algorithm: "token_bucket".into(),
            replicas: 4,
            workers: 2,
            conns_per_replica: 8,
            capacity: (100.0 * factor) as u64,
            rate_per_sec: 100.0 * factor,
            window_s: 10.5,
            allowance: 1150.0 * factor,
            allowance_inner: 1150.0 * factor - 2.0,
            formula: "C + R × window".into(),
            sent: 5000,
            allowed,
            filter_allowed: allowed,
            ..Accuracy::default()
        },
    }
}

#[test]
fn every_override_row_is_required_and_judged_against_the_override() {
    let mut r = report(Vec::new());
    let missing = r.missing("");
    for (name, _) in OVERRIDE_ROWS {
        assert!(
            missing.contains(&format!("override accuracy row {name}")),
            "{name}: {missing:?}"
        );
    }
    assert!(missing.contains(&"filter-allow-1key-overrides".to_string()));
    r.accuracy_overrides = vec![
        override_row("override-raised", 2.0, 2290),
        override_row("override-lowered", 0.5, 576),
    ];
    let markdown = r.markdown();
    let missing = r.missing(&markdown);
    assert!(
        !missing.iter().any(|m| m.contains("override accuracy")),
        "{missing:?}"
    );
    assert!(
        markdown.contains("| `override-raised` | 100, 100 | 200, 200 | token_bucket | 4 × 2 × 8 |"),
        "{markdown}"
    );
    // 576 allowed against floor(575.0): one over.
    assert_eq!(r.accuracy_overrides[1].run.overshoot(), 1);
    assert!(markdown.contains("| **1** |"));
    assert!(markdown.contains("| 1150.0 | 586 | 0 |"), "{markdown}");
    let json = r.json();
    let rows = json["accuracy_overrides"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["name"], "override-raised");
    assert_eq!(rows[0]["override"]["burst"], 200);
    assert_eq!(rows[0]["config"]["limit"], 100);
    assert_eq!(rows[0]["overshoot"], 0);
    assert_eq!(rows[1]["overshoot"], 1);
    assert_eq!(rows[1]["allowance_under_config"], 1150.0);
}

#[test]
fn the_cost_of_overrides_sets_the_allow_scenario_with_them_against_it_without() {
    let r = report(vec![scenario("baseline", 50_000.0)]);
    assert_eq!(r.override_cost_text(), "Not run.\n");
    assert!(r.json()["overrides_over_off"].is_null());
    let mut off = scenario("filter-allow-1key", 10_000.0);
    let mut on = scenario("filter-allow-1key-overrides", 9_000.0);
    for (s, hmget) in [(&mut off, 100), (&mut on, 200)] {
        s.cost.allowed = 100;
        s.cost.redis_commands =
            BTreeMap::from([("evalsha".to_string(), 10), ("hmget".to_string(), hmget)]);
    }
    let r = report(vec![
        scenario("baseline", 50_000.0),
        scenario("filter-pass-through", 40_000.0),
        off,
        on,
    ]);
    let text = r.override_cost_text();
    assert!(
        text.contains("| `filter-allow-1key` | 10,000 | 0.20 (0.20–0.20) | 0.25 (0.25–0.25) | 30.0 (30.0–30.0) | 5.0 (5.0–5.0) | 10.0 (10.0–10.0) | 1.10 | 1.00 | 0 |"),
        "{text}"
    );
    assert!(
        text.contains("| `filter-allow-1key-overrides` | 9,000 | 0.18 (0.18–0.18) | 0.23 (0.23–0.23) | 30.0 (30.0–30.0) | 5.0 (5.0–5.0) | 10.0 (10.0–10.0) | 2.10 | 2.00 | 0 |"),
        "{text}"
    );
    assert!(
        text.contains("**0.90 (0.90–0.90)**, rounds 0.90 / 0.90 / 0.90"),
        "{text}"
    );
    let pair = &r.json()["overrides_over_off"];
    assert_eq!(pair["scenario"], "filter-allow-1key-overrides");
    assert_eq!(pair["over"], "filter-allow-1key");
}

/// A run of `requests` requests, all decided (`from_cache` of them by the deny cache, `leased`
/// from a lease), its processes using `cpu_s` seconds (None: not read).
fn run_with_cpu(
    round: usize,
    requests: u64,
    cpu_s: [Option<f64>; 3],
    from_cache: u64,
    leased: u64,
) -> Measured {
    let mut m = measured(round, requests as f64, requests);
    m.cost.cpu = PROCESSES
        .iter()
        .zip(cpu_s)
        .map(|(p, s)| (p.to_string(), s))
        .collect();
    m.cost.allowed = requests - from_cache;
    m.cost.denied = from_cache;
    m.cost.deny_cache_hits = from_cache;
    m.cost.bridge_calls = 10;
    m.cost.lease.hits = Some(leased);
    m
}

/// A filter scenario of three rounds: the second with two runs (their CPU and requests
/// summed), the third with half its requests from leases and no Webdis reading.
fn allow_scenario() -> Scenario {
    let runs = vec![
        run_with_cpu(0, 1000, [Some(0.08), Some(0.01), Some(0.02)], 0, 0),
        run_with_cpu(1, 500, [Some(0.03), Some(0.004), Some(0.01)], 0, 0),
        run_with_cpu(1, 500, [Some(0.05), Some(0.006), Some(0.01)], 0, 0),
        run_with_cpu(2, 1000, [Some(0.07), None, Some(0.02)], 0, 500),
    ];
    Scenario::new("filter-allow-1key", "", "baseline", "", true, runs)
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
}

#[test]
fn cpu_per_request_is_a_figure_per_round_of_each_process() {
    let s = allow_scenario();
    let envoy = s.cpu_us_per_request("envoy");
    assert!(close(&envoy.rounds, &[80.0, 80.0, 70.0]), "{envoy:?}");
    // The round whose Webdis reading is missing is left out, not counted as 0.
    assert!(close(&s.cpu_us_per_request("webdis").rounds, &[10.0, 10.0]));
    // Per decision Redis made: the leased half of round 3 cost Redis no decision.
    let redis = s.cpu_us_per_decision("redis");
    assert!(close(&redis.rounds, &[20.0, 20.0, 40.0]), "{redis:?}");
    assert_eq!(s.cost.redis_decisions(), 2500);
    // The deny cache's answers are no Redis decision either; a round in which Redis decided
    // under half the requests has no figure per decision; no filter, no figure.
    let deny = Scenario::new(
        "filter-deny-hotkey",
        "",
        "baseline",
        "",
        true,
        vec![
            run_with_cpu(0, 1000, [Some(0.05), Some(0.0), Some(0.01)], 500, 0),
            run_with_cpu(1, 1000, [Some(0.05), Some(0.0), Some(0.01)], 990, 0),
        ],
    );
    assert!(close(&deny.cpu_us_per_decision("redis").rounds, &[20.0]));
    assert!(close(
        &deny.cpu_us_per_request("redis").rounds,
        &[10.0, 10.0]
    ));
    assert!(scenario("baseline", 50_000.0)
        .cpu_us_per_decision("redis")
        .is_empty());
}

#[test]
fn the_headline_table_sets_cpu_per_request_beside_req_s_and_the_floor() {
    let r = report(vec![
        scenario_rounds("baseline", &[50_000.0, 40_000.0, 45_000.0]),
        scenario("filter-pass-through", 40_000.0),
        allow_scenario(),
    ]);
    let allow = r.scenario("filter-allow-1key").expect("allow");
    // Envoy over the floor, round by round: the pass-through's Envoy used 30 µs per request.
    let over = r.envoy_over_floor(allow).expect("over the floor");
    assert!(close(&over.rounds, &[50.0, 50.0, 40.0]), "{over:?}");
    assert!(r
        .envoy_over_floor(r.scenario(PASS_THROUGH).expect("floor"))
        .is_none());
    assert!(r
        .envoy_over_floor(r.scenario("baseline").expect("baseline"))
        .is_none());
    let table = r.throughput_table();
    assert!(
        table.contains("| `baseline` | 45,000 (40,000–50,000) | 1.00 (1.00–1.00) | – | 30.0 (30.0–30.0) | – | 5.0 (5.0–5.0) | 10.0 (10.0–10.0) | – | – |"),
        "{table}"
    );
    assert!(
        table.contains("| `filter-allow-1key` | 1,000 (500–1,000) |"),
        "{table}"
    );
    assert!(
        table.contains("| 80.0 (70.0–80.0) | 50.0 (40.0–50.0) | 10.0 (10.0–10.0) | 20.0 (20.0–20.0) | 10.0 (10.0–10.0) | 20.0 (20.0–40.0) |"),
        "{table}"
    );
    // Latencies and what each scenario runs are in the table below it.
    let text = r.throughput_text();
    assert!(
        text.contains("| scenario | req/s per round | p50 ms |"),
        "{text}"
    );
    assert!(
        text.contains("| `baseline` | 50,000 / 40,000 / 45,000 |"),
        "{text}"
    );
}

#[test]
fn fleet_capacity_is_what_one_core_carries_per_round() {
    let mut r = report(vec![
        scenario("baseline", 50_000.0),
        scenario("filter-pass-through", 40_000.0),
        allow_scenario(),
    ]);
    let capacity = r.capacity();
    assert_eq!(capacity.len(), 3);
    let allow = &capacity[2];
    assert!(close(
        &allow.envoy.rounds,
        &[12_500.0, 12_500.0, 1e6 / 70.0]
    ));
    assert!(close(&allow.redis.rounds, &[50_000.0, 50_000.0, 25_000.0]));
    assert!(close(&allow.webdis.rounds, &[100_000.0, 100_000.0]));
    assert!(capacity[0].redis.is_empty());
    let text = r.capacity_text();
    assert!(
        text.contains("| `filter-allow-1key` | 62.5 | 50,000 (25,000–50,000) | 100,000 (100,000–100,000) | 12,500 (12,500–14,286) |"),
        "{text}"
    );
    assert!(
        text.contains("| `baseline` | – | – | – | 33,333 (33,333–33,333) |"),
        "{text}"
    );
    // Scenarios of the table that did not run make it incomplete.
    let missing = r.missing("");
    assert!(missing.contains(&"the fleet capacity table".to_string()));
    for name in CAPACITY_SCENARIOS.iter().skip(3) {
        let mut s = allow_scenario();
        s.name = name.to_string();
        r.scenarios.push(s);
    }
    let missing = r.missing("");
    assert!(
        !missing.contains(&"the fleet capacity table".to_string()),
        "{missing:?}"
    );
    let json = r.json();
    let rows = json["fleet_capacity"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(rows.len(), CAPACITY_SCENARIOS.len());
    assert_eq!(rows[2]["scenario"], "filter-allow-1key");
    assert_eq!(rows[2]["redis_decisions_per_core_s"]["median"], 50_000.0);
    assert!(rows[0]["redis_decisions_per_core_s"]["median"].is_null());
}

/// results.json holds every process's CPU per request per round and each run's readings, and
/// a results.json without them is caught.
#[test]
fn results_json_holds_cpu_per_request_per_round() {
    let r = report(vec![
        scenario("baseline", 50_000.0),
        scenario("filter-pass-through", 40_000.0),
        allow_scenario(),
    ]);
    let json = r.json();
    let allow = &json["scenarios"][2];
    let envoy = allow["cpu_us_per_request"]["envoy"]["rounds"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(envoy.len(), 3);
    assert_eq!(
        allow["cpu_us_per_request"]["redis"]["rounds"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );
    assert_eq!(
        allow["cpu_us_per_decision"]["redis"]["rounds"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );
    assert_eq!(
        allow["envoy_us_over_floor"]["rounds"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );
    assert_eq!(allow["floor"], PASS_THROUGH);
    assert_eq!(allow["runs"][3]["cpu_s"]["envoy"], 0.07);
    assert!(allow["runs"][3]["cpu_s"]["webdis"].is_null());
    assert_eq!(allow["runs"][3]["redis_decisions"], 500);
    assert!(json["scenarios"][0]["cpu_us_per_decision"].is_null());
    // The allow scenario lacks a Webdis figure in one round.
    let problems = rounds_problems(&json);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0]
            .starts_with("scenario \"filter-allow-1key\": webdis CPU per request in 2 of 3 rounds"),
        "{problems:?}"
    );
    let mut broken = json.clone();
    broken["scenarios"][0]
        .as_object_mut()
        .expect("object")
        .remove("cpu_us_per_request");
    assert_eq!(rounds_problems(&broken).len(), 4);
}
