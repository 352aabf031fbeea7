//! The throughput scenarios, in interleaved rounds: every scenario's Envoy runs from start to
//! end, and each round measures Envoy alone and the pass-through filter, then each scenario
//! followed by those two again (quick mode: by one of them in turn), so every run has runs of
//! both references close before and after it (see [`round_order`]). The report sets each run
//! against the nearest of them.

use std::collections::BTreeMap;
use std::time::Instant;

use e2e::procs::{Envoy, Redis, Webdis};
use e2e::resp::RedisConn;
use e2e::LlmUpstream;

use super::{filter_policy, leased_policy, Bench};
use crate::config::{Front, Policy, UsagePolicy};
use crate::measure::{self, BENCH_OWN_COMMANDS};
use crate::report::UNLEASED_ALLOW_RATE;
use crate::report::{Cost, LeaseCounters, Measured, Scenario, PASS_THROUGH, SCENARIOS};
use crate::variant;
use crate::wrk::{self, Requests, WrkLoad};

/// The scenarios every other one is set against, in the order they run after each scenario.
const REFERENCES: &[&str] = &["baseline", PASS_THROUGH];
/// The serial pair, run as reference, scenario, reference at the end of each round.
const SERIAL: (&str, &str) = ("baseline-serial", "filter-serial");
/// Envoy alone once more, last in each round: the noise between two runs of the same thing.
const REPEAT: &str = "baseline-repeat";
/// The scenarios on the OpenAI-compatible test upstream, run as a block after the others in
/// each round: each usage scenario bracketed by the pass-through filter on that upstream (its
/// reference), the block by Envoy alone on it.
const LLM_BLOCK: &[&str] = &[
    "baseline-llm",
    "filter-pass-through-llm",
    "filter-llm-usage",
    "filter-pass-through-llm",
    "filter-llm-usage-stream",
    "filter-pass-through-llm",
    "baseline-llm",
];
/// The references of the LLM block, which run several times a round.
const LLM_REFERENCES: &[&str] = &["baseline-llm", "filter-pass-through-llm"];
/// Total tokens of every answer in the LLM throughput scenarios, and the fixed estimate
/// reserved for each request (so each settlement gives back the difference).
const LLM_USAGE: u64 = 1000;
const LLM_ESTIMATE: u64 = 2000;

/// The order of one round's runs, of the scenarios in `names` (those that run): the
/// references, then each other scenario followed by the references again (`alternate`: by
/// one of them, in turn, so each scenario still has a run of both within two runs on either
/// side, in about three quarters of the runs); then the serial pair bracketed by its reference; then the
/// repeat. An unleased scenario is followed by its leased twin (and `filter-allow-1key` then by
/// its twin with overrides on), so the twins run close together.
pub fn round_order<'a>(names: &[&'a str], alternate: bool) -> Vec<&'a str> {
    let present = |wanted: &[&str]| -> Vec<&'a str> {
        wanted
            .iter()
            .filter_map(|w| names.iter().copied().find(|n| n == w))
            .collect()
    };
    let refs = present(REFERENCES);
    let mut order = refs.clone();
    let scenarios = present(RUN_ORDER);
    for (i, name) in scenarios.iter().enumerate() {
        order.push(name);
        // The last one is followed by both, as the first is preceded by both.
        match refs.get(i % refs.len().max(1)) {
            Some(one) if alternate && i + 1 < scenarios.len() => order.push(one),
            // Its turn's reference first: the one before it (followed by the other) then has
            // both within two runs after it, whether the scenarios are odd or even in number.
            Some(_) if alternate => {
                order.extend(refs.iter().cycle().skip(i % refs.len()).take(refs.len()))
            }
            _ => order.extend(&refs),
        }
    }
    // The LLM block, without the scenarios that do not run and without a reference twice in
    // a row.
    for name in LLM_BLOCK {
        if names.contains(name) && order.last() != Some(name) {
            order.push(name);
        }
    }
    let serial_ref = present(&[SERIAL.0]);
    order.extend(&serial_ref);
    let serial = present(&[SERIAL.1]);
    if !serial.is_empty() {
        order.extend(serial);
        order.extend(&serial_ref);
    }
    order.extend(present(&[REPEAT]));
    order
}

/// The scenarios between the references, in the order they run.
const RUN_ORDER: &[&str] = &[
    "local_ratelimit",
    "filter-plan-only",
    "filter-allow-1key",
    "filter-allow-1key-leased",
    "filter-allow-1key-overrides",
    "filter-allow-1key-claim",
    "filter-allow-10k-keys",
    "filter-allow-10k-keys-leased",
    "filter-deny-hotkey",
    "filter-bridge-hung",
    "filter-bridge-down",
];

/// What a throughput scenario runs against: the Envoy, and the processes whose CPU counts:
/// the Webdis it calls (or, calling none, the run's idle one) and Redis.
struct Target<'a> {
    envoy: &'a Envoy,
    webdis: &'a Webdis,
    redis: &'a Redis,
    filter: bool,
}

/// A scenario to measure: its name and text, its load, and where it runs.
struct Spec<'a> {
    name: &'static str,
    what: &'static str,
    compare_to: &'static str,
    load: WrkLoad,
    target: Target<'a>,
}

/// A scenario, if its Envoy runs.
fn spec<'a>(
    name: &'static str,
    what: &'static str,
    compare_to: &'static str,
    load: &WrkLoad,
    target: Option<Target<'a>>,
) -> Option<Spec<'a>> {
    target.map(|target| Spec {
        name,
        what,
        compare_to,
        load: load.clone(),
        target,
    })
}

/// A target on `envoy`, if it runs.
fn target<'a>(
    redis: &'a Redis,
    envoy: &'a Option<Envoy>,
    webdis: &'a Webdis,
    filter: bool,
) -> Option<Target<'a>> {
    envoy.as_ref().map(|envoy| Target {
        envoy,
        webdis,
        redis,
        filter,
    })
}

/// The throughput scenarios, on one Redis; the filter's scenarios share one Webdis, but for
/// `filter-bridge-hung`, whose Webdis stays stopped (SIGSTOP) all through.
pub fn run(b: &Bench) -> Vec<Scenario> {
    let s = &b.s;
    // Built before anything runs, so that the build's CPU is in no measurement.
    let plan_only = s.wants("filter-plan-only").then(|| {
        b.say("building the filter with feature phase-plan-only");
        variant::build("phase-plan-only")
    });
    let redis = Redis::start(&b.dir);
    let webdis = Webdis::start(&b.dir, redis.port);
    let hung_webdis = Webdis::start(&b.dir, redis.port);
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
    let allow = [filter_policy(
        1_000_000_000,
        UNLEASED_ALLOW_RATE,
        s.timeout_ms,
    )];
    let leased = [leased_policy(s.timeout_ms)];
    // The allow policy with overrides on; the bench sets no override, so each lookup finds
    // nothing.
    let overriding = [Policy {
        overrides: true,
        ..allow[0]
    }];
    // The allow policy keyed on a JWT claim that a set_metadata filter puts in the metadata.
    let claiming = [Policy {
        claim: true,
        ..allow[0]
    }];
    let deny = [filter_policy(10, 1.0, s.timeout_ms)];
    let envoy = |front: Front, webdis_port: u16| b.start_envoy(front, webdis_port);
    let want = |names: &[&str]| names.iter().any(|n| s.wants(n));
    // Each Envoy starts only if one of its scenarios runs.
    let baseline =
        want(&["baseline", "baseline-serial", REPEAT]).then(|| envoy(Front::Baseline, webdis.port));
    let local = want(&["local_ratelimit"]).then(|| envoy(Front::LocalRateLimit, webdis.port));
    let pass = want(&[PASS_THROUGH]).then(|| envoy(Front::PassThrough(&allow), webdis.port));
    let plan = plan_only
        .as_ref()
        .map(|wasm| envoy(Front::Variant(&allow, wasm), webdis.port));
    let allowing = want(&[
        "filter-allow-1key",
        "filter-allow-10k-keys",
        "filter-serial",
    ])
    .then(|| envoy(Front::Filter(&allow), webdis.port));
    let leasing = want(&["filter-allow-1key-leased", "filter-allow-10k-keys-leased"])
        .then(|| envoy(Front::Filter(&leased), webdis.port));
    let overrides = want(&["filter-allow-1key-overrides"])
        .then(|| envoy(Front::Filter(&overriding), webdis.port));
    let claims =
        want(&["filter-allow-1key-claim"]).then(|| envoy(Front::Filter(&claiming), webdis.port));
    let denying = want(&["filter-deny-hotkey"]).then(|| envoy(Front::Filter(&deny), webdis.port));
    let hung =
        want(&["filter-bridge-hung"]).then(|| envoy(Front::Filter(&allow), hung_webdis.port));
    // Nothing listens on port 1: every connection to the bridge is refused.
    let down = want(&["filter-bridge-down"]).then(|| envoy(Front::Filter(&allow), 1));
    // The upstream of the LLM scenarios runs in this process (its CPU is the bench's).
    let llm_wanted = want(LLM_BLOCK);
    let llm = llm_wanted.then(LlmUpstream::start);
    let usage_policy = [llm_usage_policy(s.timeout_ms)];
    let llm_port = llm.as_ref().map_or(0, |u| u.port);
    let llm_envoy = |policies: Option<&[UsagePolicy]>, never_match: bool| {
        let front = Front::Llm {
            policies,
            never_match,
            upstream: llm_port,
        };
        envoy(front, webdis.port)
    };
    let baseline_llm = want(&["baseline-llm"]).then(|| llm_envoy(None, false));
    let pass_llm = want(&["filter-pass-through-llm"]).then(|| llm_envoy(Some(&usage_policy), true));
    let usage_llm = want(&["filter-llm-usage", "filter-llm-usage-stream"])
        .then(|| llm_envoy(Some(&usage_policy), false));
    hung_webdis.process.pause();

    let ten_k = many(Requests::ManyKeys(10_000));
    let deny_load = many(Requests::OneKey("bench-abuser".into()));
    let llm_load = |stream: bool| {
        many(Requests::Llm {
            key: "bench-client".into(),
            stream,
            usage: LLM_USAGE,
        })
    };
    let (llm_json, llm_stream) = (llm_load(false), llm_load(true));
    let candidates = [
        spec("baseline", "Envoy, same route, no rate-limit filter", "baseline", &one_key, target(&redis, &baseline, &webdis, false)),
        spec("baseline-serial", "as baseline, 1 connection, one request at a time", "baseline-serial", &serial, target(&redis, &baseline, &webdis, false)),
        spec(REPEAT, "baseline again, at the end of each round: the run's noise", "baseline", &one_key, target(&redis, &baseline, &webdis, false)),
        spec("local_ratelimit", "Envoy's built-in local_ratelimit, limit never reached", "baseline", &one_key, target(&redis, &local, &webdis, false)),
        spec(PASS_THROUGH, "the filter loaded, its rule matching no request: the floor of any wasm filter here", "baseline", &one_key, target(&redis, &pass, &webdis, true)),
        spec("filter-plan-only", "the filter built with `phase-plan-only`: each request planned as in filter-allow-1key, then let through undecided", "baseline", &one_key, target(&redis, &plan, &webdis, true)),
        spec("filter-allow-1key", "the filter, every request allowed, one key", "baseline", &one_key, target(&redis, &allowing, &webdis, true)),
        spec("filter-allow-10k-keys", "the filter, every request allowed, keys of 10,000 clients in turn", "baseline", &ten_k, target(&redis, &allowing, &webdis, true)),
        spec("filter-serial", "as filter-allow-1key, 1 connection, one request at a time", "baseline-serial", &serial, target(&redis, &allowing, &webdis, true)),
        spec("filter-allow-1key-leased", "as filter-allow-1key with a lease on a limit spent faster than it refills (see Leases)", "baseline", &one_key, target(&redis, &leasing, &webdis, true)),
        spec("filter-allow-10k-keys-leased", "as filter-allow-10k-keys with a lease on the same limit", "baseline", &ten_k, target(&redis, &leasing, &webdis, true)),
        spec("filter-allow-1key-overrides", "as filter-allow-1key with `\"overrides\": true` on the limit and no override set: each decision also looks up the key's override and finds none", "baseline", &one_key, target(&redis, &overrides, &webdis, true)),
        spec("filter-allow-1key-claim", "as filter-allow-1key keyed on a JWT claim in dynamic metadata (metadata:envoy.filters.http.jwt_authn:jwt_payload:sub) that a set_metadata filter puts there, instead of the x-api-key header", "baseline", &one_key, target(&redis, &claims, &webdis, true)),
        spec("filter-deny-hotkey", "the filter, one abusive key far over its limit (capacity 10, 1/s): nearly all 429", "baseline", &deny_load, target(&redis, &denying, &webdis, true)),
        spec("filter-bridge-hung", "the filter, its Webdis stopped (SIGSTOP): the breaker opens on the first call without an answer for its timeout while requests wait, then requests fail open without a call", "baseline", &one_key, target(&redis, &hung, &hung_webdis, true)),
        spec("filter-bridge-down", "the filter, nothing listening on its Webdis port: connection refused, the breaker opens, fail open without a call", "baseline", &one_key, target(&redis, &down, &webdis, true)),
        spec("baseline-llm", "Envoy alone, every request a chat completion (POST, JSON answer) to the OpenAI-compatible test upstream in the bench process", "baseline-llm", &llm_json, target(&redis, &baseline_llm, &webdis, false)),
        spec("filter-pass-through-llm", "as baseline-llm with the filter loaded, its usage rule matching no request: the reference of the usage scenarios", "baseline-llm", &llm_json, target(&redis, &pass_llm, &webdis, true)),
        spec("filter-llm-usage", "as baseline-llm with a rule of a request limit and a token limit (`reserve`, fixed estimate 2,000, usage 1,000 read from the JSON body, the rest given back), nothing refused", "filter-pass-through-llm", &llm_json, target(&redis, &usage_llm, &webdis, true)),
        spec("filter-llm-usage-stream", "as filter-llm-usage, each answer an event stream whose last event carries the usage", "filter-pass-through-llm", &llm_stream, target(&redis, &usage_llm, &webdis, true)),
    ];
    let specs: Vec<Spec> = candidates
        .into_iter()
        .flatten()
        .filter(|sp| s.wants(sp.name))
        .collect();
    let mut runs = measure_rounds(b, &specs, &mut admin);
    hung_webdis.process.resume();
    drop(llm);
    let mut out: Vec<Scenario> = specs
        .iter()
        .map(|sp| {
            let l = &sp.load;
            Scenario::new(
                sp.name,
                sp.what,
                sp.compare_to,
                &format!(
                    "wrk -t{} -c{} -d{}s, {} rounds",
                    l.threads, l.connections, l.duration_s, s.rounds
                ),
                sp.target.filter,
                runs.remove(sp.name).unwrap_or_default(),
            )
        })
        .collect();
    out.sort_by_key(|sc| SCENARIOS.iter().position(|n| *n == sc.name));
    out
}

/// The LLM throughput scenarios' rule: a request limit and a token limit, both far above what
/// a run spends (nothing is refused), the tokens reserved at a fixed estimate and settled.
pub fn llm_usage_policy(timeout_ms: u64) -> UsagePolicy {
    UsagePolicy {
        name: "bench-llm",
        admit: "reserve",
        requests_per_s: 1_000_000_000,
        tokens: 1_000_000_000_000,
        window_s: 1,
        from: crate::config::BODY_USAGE,
        weights: None,
        estimate: LLM_ESTIMATE,
        timeout_ms,
    }
}

/// Every round of `specs` in [`round_order`], each run at its place in the sequence.
fn measure_rounds(
    b: &Bench,
    specs: &[Spec],
    admin: &mut RedisConn,
) -> BTreeMap<&'static str, Vec<Measured>> {
    let s = &b.s;
    let names: Vec<&str> = specs.iter().map(|sp| sp.name).collect();
    // Quick mode alternates the references after each scenario, to stay short.
    let order = round_order(&names, s.quick);
    let mut runs: BTreeMap<&'static str, Vec<Measured>> = BTreeMap::new();
    let mut seq = 0;
    for round in 0..s.rounds {
        b.say(&format!(
            "throughput round {} of {}: {} runs of {} s",
            round + 1,
            s.rounds,
            order.len(),
            s.wrk_s
        ));
        for name in &order {
            let Some(spec) = specs.iter().find(|sp| sp.name == *name) else {
                continue;
            };
            if round == 0 && s.warmup_s > 0 && !runs.contains_key(name) {
                let warmup = WrkLoad {
                    duration_s: s.warmup_s,
                    ..spec.load.clone()
                };
                let raw = s.out.join("raw").join(format!("{name}.warmup.wrk.txt"));
                wrk::run(spec.target.envoy.port, &warmup, &raw);
            }
            let raw = s
                .out
                .join("raw")
                .join(format!("{name}.round{}.{seq:03}.wrk.txt", round + 1));
            let (run, cost) = measure_run(admin, &spec.load, &spec.target, &raw);
            runs.entry(name).or_default().push(Measured {
                round,
                seq,
                run,
                cost,
            });
            seq += 1;
        }
        for spec in specs {
            if let Some(m) = runs.get(spec.name).and_then(|r| r.last()) {
                if m.round == round
                    && !REFERENCES.contains(&spec.name)
                    && !LLM_REFERENCES.contains(&spec.name)
                {
                    b.say(&format!(
                        "  {}: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms",
                        spec.name, m.run.rps, m.run.p50_ms, m.run.p99_ms
                    ));
                }
            }
        }
    }
    runs
}

/// One wrk run of `load` against `t`, with what it cost: the counters, Redis commands and CPU
/// read before and after it.
fn measure_run(
    admin: &mut RedisConn,
    load: &WrkLoad,
    t: &Target,
    raw: &std::path::Path,
) -> (wrk::WrkRun, Cost) {
    let procs = [
        ("envoy", t.envoy.process.pid()),
        ("webdis", t.webdis.process.pid()),
        ("redis", t.redis.process.pid()),
    ];
    let redis_before = measure::redis_commandstats(admin);
    let stats_before = measure::envoy_stats(t.envoy.admin_port);
    // The CPU window holds the wrk run alone: the bench's own reads of the counters (an
    // admin request to Envoy, INFO to Redis) fall outside it.
    let busy_before = measure::machine_busy_seconds();
    let cpu_before: Vec<Option<f64>> = procs
        .iter()
        .map(|(_, pid)| measure::cpu_seconds(*pid))
        .collect();
    let wall = Instant::now();
    let run = wrk::run(t.envoy.port, load, raw);
    let wall_s = wall.elapsed().as_secs_f64();
    let cpu = procs
        .iter()
        .zip(cpu_before)
        .map(|((label, pid), before)| {
            let used = match (before, measure::cpu_seconds(*pid)) {
                (Some(b), Some(a)) => Some(a - b),
                _ => None,
            };
            (label.to_string(), used)
        })
        .collect();
    let machine_busy_s = match (busy_before, measure::machine_busy_seconds()) {
        (Some(b), Some(a)) => Some(a - b),
        _ => None,
    };
    let stats = measure::delta(&stats_before, &measure::envoy_stats(t.envoy.admin_port));
    let mut redis_commands = measure::delta(&redis_before, &measure::redis_commandstats(admin));
    redis_commands.retain(|name, calls| *calls > 0 && !BENCH_OWN_COMMANDS.contains(&name.as_str()));
    let stat = |name: &str| stats.get(name).copied().unwrap_or(0);
    let cost = Cost {
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
    };
    (run, cost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_runs_between_runs_of_both_references() {
        let order = round_order(SCENARIOS, false);
        // Every scenario runs once a round, the references more often.
        for name in SCENARIOS {
            let n = order.iter().filter(|o| *o == name).count();
            assert!(n >= 1, "{name} missing from {order:?}");
            if !REFERENCES.contains(name) && *name != SERIAL.0 && !LLM_REFERENCES.contains(name) {
                assert_eq!(n, 1, "{name} runs {n} times a round");
            }
        }
        for (i, name) in order.iter().enumerate() {
            if !RUN_ORDER.contains(name) {
                continue;
            }
            // Just before: the references (the round's start, or after the previous scenario);
            // just after: the references again.
            assert_eq!(order[i - 2..i], *REFERENCES, "before {name}: {order:?}");
            assert_eq!(order[i + 1..i + 3], *REFERENCES, "after {name}: {order:?}");
        }
        let serial = order.iter().position(|o| *o == SERIAL.1).expect("serial");
        assert_eq!((order[serial - 1], order[serial + 1]), (SERIAL.0, SERIAL.0));
        assert_eq!(order.last(), Some(&REPEAT));
        // A leased scenario runs right after its unleased twin (the references between them).
        for (unleased, leased) in crate::report::LEASE_PAIRS {
            let u = order.iter().position(|o| o == unleased).expect("unleased");
            assert_eq!(order[u + 3], *leased);
        }
        // Overrides on runs right after the leased twin of the scenario it is set against.
        let (off, on) = crate::report::OVERRIDE_PAIR;
        let u = order.iter().position(|o| *o == off).expect("off");
        assert_eq!(order[u + 6], on);
    }

    #[test]
    fn each_usage_scenario_runs_between_runs_of_the_pass_through_on_the_same_upstream() {
        for alternate in [false, true] {
            let order = round_order(SCENARIOS, alternate);
            for name in ["filter-llm-usage", "filter-llm-usage-stream"] {
                let i = order.iter().position(|o| *o == name).expect(name);
                assert_eq!(order[i - 1], "filter-pass-through-llm", "{order:?}");
                assert_eq!(order[i + 1], "filter-pass-through-llm", "{order:?}");
            }
            let pass = order.iter().position(|o| *o == "filter-pass-through-llm");
            assert_eq!(order[pass.expect("pass") - 1], "baseline-llm");
        }
        // Without the stream scenario, the reference does not run twice in a row.
        let order = round_order(
            &[
                "filter-llm-usage",
                "filter-pass-through-llm",
                "baseline-llm",
            ],
            false,
        );
        assert_eq!(
            order,
            [
                "baseline-llm",
                "filter-pass-through-llm",
                "filter-llm-usage",
                "filter-pass-through-llm",
                "baseline-llm"
            ]
        );
    }

    #[test]
    fn without_some_scenarios_the_order_keeps_the_others() {
        for alternate in [false, true] {
            let order = round_order(&["filter-allow-1key", "baseline"], alternate);
            assert_eq!(order, ["baseline", "filter-allow-1key", "baseline"]);
            assert!(round_order(&[], alternate).is_empty());
        }
    }

    #[test]
    fn alternating_references_keep_both_within_two_runs_of_each_scenario() {
        // An even and an odd number of scenarios between the references.
        let fewer: Vec<&str> = SCENARIOS
            .iter()
            .copied()
            .filter(|n| *n != "local_ratelimit")
            .collect();
        for names in [SCENARIOS, &fewer[..]] {
            alternating_keeps_both_references_near(names);
        }
        let full = round_order(SCENARIOS, false);
        let order = round_order(SCENARIOS, true);
        assert!(
            order.len() * 5 <= full.len() * 4,
            "{} vs {}",
            order.len(),
            full.len()
        );
    }

    fn alternating_keeps_both_references_near(names: &[&str]) {
        let order = round_order(names, true);
        for (i, name) in order.iter().enumerate() {
            if !RUN_ORDER.contains(name) {
                continue;
            }
            for reference in REFERENCES {
                let before = order[..i].iter().rev().position(|o| o == reference);
                let after = order[i + 1..].iter().position(|o| o == reference);
                // Position 0 is the run right next to it.
                assert!(
                    before.is_some_and(|d| d <= 2),
                    "{reference} before {name}: {order:?}"
                );
                assert!(
                    after.is_some_and(|d| d <= 2),
                    "{reference} after {name}: {order:?}"
                );
            }
            assert!(
                REFERENCES.contains(&order[i + 1]),
                "after {name}: {order:?}"
            );
        }
    }
}
