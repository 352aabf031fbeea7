//! The throughput sections: the headline table (req/s, ratios, CPU per request), latency
//! and errors, what the scenarios cost, where the time goes, and the per-phase table.

use super::format::{ms, opt2, sig3, thousands};
use super::table::Table;
use super::{against, per_round, Phase, Report, Scenario, PASS_THROUGH, PASS_THROUGH_LLM, PHASES};
use crate::spread::Spread;

/// A ratio's cell: the median and range, "(vs X)" when X is not Envoy alone.
fn ratio_cell(s: &Scenario, ratio: Option<Spread>) -> String {
    match ratio {
        Some(r) if s.compare_to != "baseline" => format!("{} (vs {})", r.cell(), s.compare_to),
        Some(r) => r.cell(),
        None => "–".into(),
    }
}

/// µs of CPU: the median and range, 1 decimal.
pub(super) fn us_cell(spread: &Spread) -> String {
    spread.cell_with(|v| format!("{v:.1}"))
}

impl Report {
    /// The pass-through scenario a filter scenario's Envoy CPU is set against: the floor on
    /// the same upstream (none for the floors themselves and the serial pair).
    pub fn floor_of(&self, s: &Scenario) -> Option<&Scenario> {
        let floor = match s.compare_to.as_str() {
            "baseline" => PASS_THROUGH,
            PASS_THROUGH_LLM => PASS_THROUGH_LLM,
            _ => return None,
        };
        (s.filter && s.name != floor)
            .then(|| self.scenario(floor))
            .flatten()
    }

    /// Envoy's µs of CPU per request over its floor's, round by round (each round's figure
    /// less the floor's in the same round).
    pub fn envoy_over_floor(&self, s: &Scenario) -> Option<Spread> {
        let floor = self.floor_of(s)?.cpu_us_per_request_by_round("envoy");
        let rounds: Vec<f64> = s
            .cpu_us_per_request_by_round("envoy")
            .into_iter()
            .filter_map(|(round, us)| floor.get(&round).map(|f| us - f))
            .collect();
        (!rounds.is_empty()).then(|| Spread::new(rounds))
    }

    /// The headline table: per scenario req/s, the ratios and CPU per request of each
    /// process, all medians over the rounds with their range (also what the docs show).
    pub fn throughput_table(&self) -> String {
        let mut t = Table::new()
            .left("scenario")
            .right("req/s")
            .right("× baseline")
            .right("× pass-through")
            .right("Envoy µs / req")
            .right("Envoy µs over the floor")
            .right("Webdis µs / req")
            .right("Redis µs / req")
            .right("Webdis µs / decision")
            .right("Redis µs / decision");
        for s in &self.scenarios {
            t.row([
                format!("`{}`", s.name),
                s.rounds().cell_with(thousands),
                ratio_cell(s, self.ratio(s)),
                self.pass_through_ratio(s).map_or("–".into(), |r| r.cell()),
                us_cell(&s.cpu_us_per_request("envoy")),
                self.envoy_over_floor(s).map_or("–".into(), |r| us_cell(&r)),
                us_cell(&s.cpu_us_per_request("webdis")),
                us_cell(&s.cpu_us_per_request("redis")),
                us_cell(&s.cpu_us_per_decision("webdis")),
                us_cell(&s.cpu_us_per_decision("redis")),
            ]);
        }
        t.render()
    }

    /// Below the headline table: req/s of each round, latencies, errors, what each runs.
    pub fn latency_table(&self) -> String {
        let mut t = Table::new()
            .left("scenario")
            .right("req/s per round")
            .right("p50 ms")
            .right("p99 ms")
            .right("non-2xx")
            .left("what");
        for s in &self.scenarios {
            t.row([
                format!("`{}`", s.name),
                s.rounds()
                    .rounds
                    .iter()
                    .map(|v| thousands(*v))
                    .collect::<Vec<_>>()
                    .join(" / "),
                ms(s.run.p50_ms),
                ms(s.run.p99_ms),
                thousands(s.run.non_2xx as f64),
                s.what.clone(),
            ]);
        }
        t.render()
    }

    pub(super) fn throughput_text(&self) -> String {
        let mut r = self.throughput_table();
        r += &format!(
            "\nEvery cell is the median over the rounds, the lowest and highest round in brackets. Req/s: per round (a reference scenario that runs several times a round: the median of its runs in that round). × baseline and × pass-through: per round, the run over the mean of the runs of `baseline` (or `{PASS_THROUGH}`) nearest before and after it. **CPU per request** (µs): per round, the user + system time of each process over the round's runs of the scenario (`/proc/PID/stat`, every thread, {:.0} ms ticks) divided by the requests wrk completed in them. Webdis and Redis are the processes the scenario's Envoy calls; in a scenario whose Envoy calls none (Envoy alone, `local_ratelimit`, `filter-bridge-down`) they are the run's idle Webdis and Redis, which shows what the reading gives without work. Envoy µs over the floor: per round, the scenario's Envoy µs per request less those of the pass-through filter on the same upstream (`{PASS_THROUGH}`, or `{PASS_THROUGH_LLM}` for the usage scenarios) in the same round: what the rate limiter itself costs Envoy. Per decision: the Webdis and Redis CPU over the decisions Redis made (the filter's allowed + denied, less those answered by the deny cache or a lease), in the rounds in which Redis decided at least half the requests (where the deny cache or leases answer most, the few decisions left each carry the process's background work and the rounding of a clock tick: read the figures per request).\n\n",
            1000.0 / crate::measure::clock_ticks_per_second()
        );
        r += &self.latency_table();
        r += "\nReq/s per round, in the order the rounds ran; latencies: the median of the runs; non-2xx: summed over the runs.\n";
        if let Some((p50, p99)) = self.added_latency() {
            r += &format!(
                "\nAdded latency of one decision (1 connection, one request at a time): **+{p50:.3} ms p50, +{p99:.3} ms p99** (`filter-serial` minus `baseline-serial`, medians of the runs).\n"
            );
        }
        r
    }

    /// Added latency of one decision, from the two serial scenarios.
    pub fn added_latency(&self) -> Option<(f64, f64)> {
        let base = self.scenario("baseline-serial")?;
        let filter = self.scenario("filter-serial")?;
        Some((
            filter.run.p50_ms - base.run.p50_ms,
            filter.run.p99_ms - base.run.p99_ms,
        ))
    }

    pub fn cost_table(&self) -> String {
        let mut t = Table::new()
            .left("scenario")
            .left("filter: allowed / denied / failed open")
            .right("deny-cache hits")
            .right("Webdis calls / request")
            .right("mean batch")
            .right("Redis commands / decision")
            .left("cores busy: Envoy / Webdis / Redis")
            .right(&format!("machine busy (of {} cores)", self.machine.cores));
        for s in &self.scenarios {
            let c = &s.cost;
            let filter_only = |text: String| if s.filter { text } else { "–".into() };
            let per_req = |n: u64| {
                if s.filter && s.run.requests > 0 {
                    format!("{:.2}", n as f64 / s.run.requests as f64)
                } else {
                    "–".into()
                }
            };
            let per_decision = (c.redis_decisions() > 0)
                .then(|| c.redis_total() as f64 / c.redis_decisions() as f64);
            let cores: Vec<String> = c
                .cpu
                .iter()
                .map(|(_, cpu)| opt2(cpu.map(|v| v / c.wall_s)))
                .collect();
            t.row([
                format!("`{}`", s.name),
                filter_only(format!(
                    "{} / {} / {}",
                    thousands(c.allowed as f64),
                    thousands(c.denied as f64),
                    thousands(c.fail_open as f64)
                )),
                filter_only(thousands(c.deny_cache_hits as f64)),
                per_req(c.webdis_calls),
                c.mean_batch().map_or("–".into(), |b| format!("{b:.1}")),
                opt2(per_decision),
                cores.join(" / "),
                opt2(c.machine_busy_s.map(|b| b / c.wall_s)),
            ]);
        }
        t.render()
    }

    pub(super) fn cost_text(&self) -> String {
        let mut r = self.cost_table();
        r += "\nEvery column sums the scenario's runs over all rounds. Webdis calls per request: `cluster.webdis.upstream_rq_total` of Envoy over the requests wrk completed. Mean batch and Redis commands per decision: over the decisions Redis made (the filter's `ratelimit_allowed` + `ratelimit_denied`, less the deny cache's and the leases' answers); commands are `INFO commandstats` calls (commands run inside the script included, the bench's own INFO/AUTH left out). Cores busy: CPU seconds of each process (as in the headline table) over wall seconds. Machine busy: all cores, from `/proc/stat`, so wrk (which shares the cores) and anything else running are in it.\n\n";
        r += &self.where_the_time_goes();
        r
    }

    /// Where the time goes, in words, from the figures.
    pub fn where_the_time_goes(&self) -> String {
        let mut out = String::new();
        let (Some(base), Some(allow)) = (
            self.scenario("baseline"),
            self.scenario("filter-allow-1key"),
        ) else {
            return out;
        };
        let share = |part: f64, total: f64| 100.0 * part / total.max(f64::MIN_POSITIVE);
        // Medians over the rounds, as in the headline table.
        let us = |s: &Scenario, label: &str| {
            let spread = s.cpu_us_per_request(label);
            if spread.is_empty() {
                0.0
            } else {
                spread.median()
            }
        };
        let envoy_base = us(base, "envoy");
        let envoy = us(allow, "envoy");
        let webdis = us(allow, "webdis");
        let redis = us(allow, "redis");
        let total = envoy + webdis + redis;
        out += &format!(
            "- Per allowed request (`filter-allow-1key`, medians of the rounds) the chain used {} µs of CPU: Envoy {} ({:.0}%), Webdis {} ({:.0}%), Redis {} ({:.0}%). Envoy without the filter used {} µs per request (`baseline`), so the filter makes each request cost Envoy {:.1}× as much: the wasm callbacks, the request's share of a call-out (an HTTP request to Webdis and its response) and resuming the paused request.\n",
            sig3(total),
            sig3(envoy),
            share(envoy, total),
            sig3(webdis),
            share(webdis, total),
            sig3(redis),
            share(redis, total),
            sig3(envoy_base),
            envoy / envoy_base.max(f64::MIN_POSITIVE),
        );
        if allow.cost.decisions() > 0 {
            let decisions = allow.cost.redis_decisions().max(1) as f64;
            // Commands of nearly every decision by rate; the rare ones (a script load) by count.
            let per: Vec<String> = allow
                .cost
                .redis_commands
                .iter()
                .map(|(name, n)| {
                    let rate = *n as f64 / decisions;
                    if rate >= 0.005 {
                        format!("{name} {rate:.2}")
                    } else {
                        format!("{name} {n} in all")
                    }
                })
                .collect();
            out += &format!(
                "- Concurrent decisions share calls: {:.3} Webdis calls per request in `filter-allow-1key`, a mean batch of {:.1} requests per decision call (`FCALL`). Per batch, Redis ran {:.2} commands counted by `INFO commandstats`, i.e. per request {} (the commands inside the script are counted too).\n",
                allow.cost.webdis_calls as f64 / allow.run.requests.max(1) as f64,
                allow.cost.mean_batch().unwrap_or(0.0),
                allow.cost.redis_total() as f64 / allow.cost.bridge_calls.max(1) as f64,
                per.join(", ")
            );
        }
        if let Some(deny) = self.scenario("filter-deny-hotkey") {
            if deny.cost.decisions() > 0 {
                out += &format!(
                    "- A refused abuser is answered by its worker: in `filter-deny-hotkey` the deny cache answered {} of {} decisions ({:.1}%) without a call, and {:.4} Webdis calls were made per request.\n",
                    thousands(deny.cost.deny_cache_hits as f64),
                    thousands(deny.cost.decisions() as f64),
                    100.0 * deny.cost.deny_cache_hits as f64 / deny.cost.decisions() as f64,
                    deny.cost.webdis_calls as f64 / deny.run.requests.max(1) as f64,
                );
            }
        }
        if let Some(many) = self.scenario("filter-allow-10k-keys") {
            out += &format!(
                "- Many keys cost about what one key costs: `filter-allow-10k-keys` ran at {} × the one-key throughput (each over the pass-through runs around it, per round), with {} keys in Redis after it (DBSIZE).\n",
                self.pair_ratio(&many.name, &allow.name).map_or("–".into(), |r| r.cell()),
                thousands(many.cost.redis_keys as f64)
            );
        }
        if let Some(busy) = allow.cost.machine_busy_s {
            out += &format!(
                "- During `filter-allow-1key` the machine was {:.0}% busy ({:.2} of {} cores, wrk included): the chain is bound by CPU, so its req/s here are a measure of CPU per request more than of a limit of the design.\n",
                100.0 * busy / allow.cost.wall_s / self.machine.cores.max(1) as f64,
                busy / allow.cost.wall_s,
                self.machine.cores
            );
        }
        if let Some((p50, p99)) = self.added_latency() {
            out += &format!(
                "- One decision adds {p50:.3} ms at the median and {p99:.3} ms at p99 to a request on an idle connection (`filter-serial` vs `baseline-serial`).\n"
            );
        }
        if let (Some(down), Some(hung)) = (
            self.scenario("filter-bridge-down"),
            self.scenario("filter-bridge-hung"),
        ) {
            let cell = |s: &Scenario| self.pass_through_ratio(s).map_or("–".into(), |r| r.cell());
            out += &format!(
                "- With Webdis down requests fail open at {} × pass-through ({:.4} failed connects per request: each worker's breaker opens after 5 refused calls, then only a probe per 500 ms connects); with Webdis hung at {} × pass-through (p50 {} ms): the breaker opens on the first call without an answer for its whole timeout (150 ms of the worker's own time) while requests wait, then no request waits for the bridge.\n",
                cell(down),
                down.cost.webdis_connect_fails as f64 / down.run.requests.max(1) as f64,
                cell(hung),
                ms(hung.run.p50_ms),
            );
        }
        if let Some(repeat) = self.scenario("baseline-repeat") {
            out += &format!(
                "- Noise: `baseline` measured again at the end of each round gave {} × the baseline runs around it; ratios closer together than that range say nothing.\n",
                self.ratio(repeat).map_or("–".into(), |r| r.cell())
            );
        }
        out
    }

    /// The per-phase rows whose scenario ran (none without `baseline`).
    pub fn phases(&self) -> Vec<Phase> {
        let Some(base) = self.scenario("baseline").filter(|b| b.run.rps > 0.0) else {
            return Vec::new();
        };
        PHASES
            .iter()
            .filter_map(|(label, name)| {
                let s = self.scenario(name).filter(|s| s.run.rps > 0.0)?;
                let spread = self.ratio_to(s, "baseline")?;
                // The cost per round from the same pairs, so that a round's cost is exactly
                // the inverse of its ratio.
                let cost = if s.name == base.name {
                    1.0
                } else {
                    crate::spread::median(
                        &per_round(&against(s, base), |x, r| r / x)
                            .into_values()
                            .collect::<Vec<_>>(),
                    )
                };
                Some(Phase {
                    label,
                    scenario: name,
                    rps: s.run.rps,
                    ratio: spread.median(),
                    cost,
                    spread,
                })
            })
            .collect()
    }

    /// Issue 13's table, re-measured in this run, and what each phase adds.
    pub fn phase_text(&self) -> String {
        let phases = self.phases();
        let mut r = String::from(
            "Each row is a throughput scenario of this run that takes the request one phase further (Envoy 1 worker, `wrk -t2 -c32`). `filter-plan-only` is the filter built with the measurement-only cargo feature `phase-plan-only` (into `target/phase-plan-only/`, never shipped): each request is planned, then continues undecided; same rule and load as `filter-allow-1key`. Cost of a request: the `baseline` runs around the row's runs over the row's req/s (median of the rounds), a plain request through Envoy alone = 1 (the machine is CPU-bound, so this is the CPU a request takes).\n\n",
        );
        let mut t = Table::new()
            .left("phase")
            .left("scenario")
            .right("req/s")
            .right("× Envoy alone")
            .right("cost of a request (plain = 1)");
        for p in &phases {
            t.row([
                p.label.to_string(),
                format!("`{}`", p.scenario),
                thousands(p.rps),
                p.spread.cell(),
                format!("{:.2}", p.cost),
            ]);
        }
        r += &t.render();
        let cost = |name: &str| phases.iter().find(|p| p.scenario == name).map(|p| p.cost);
        if let (Some(floor), Some(plan)) = (cost(PASS_THROUGH), cost("filter-plan-only")) {
            let mut parts = vec![format!(
                "the wasm filter's floor costs {:.2} of a plain request, the plan {:.2} more",
                floor - 1.0,
                plan - floor
            )];
            for (name, what) in [
                ("filter-deny-hotkey", "a deny-cache hit"),
                ("filter-allow-1key", "a batched decision"),
                ("filter-allow-1key-leased", "a leased decision"),
            ] {
                if let Some(c) = cost(name) {
                    parts.push(format!("{what} {:+.2} over the plan", c - plan));
                }
            }
            r += &format!("\nSo: {}.\n", parts.join("; "));
        }
        if let Some(leased) = self.scenario("filter-allow-1key-leased") {
            let note = if leased.cost.lease.exported() {
                Report::lease_note(leased)
            } else {
                "The leased row served no request from a lease: this filter build does not lease yet (see Leases).".to_string()
            };
            r += &format!("\n{note}\n");
        }
        r
    }
}
