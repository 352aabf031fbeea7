//! The results of one bench run, and `report.md` made from them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value};

use super::measure::Machine;
use super::wrk::WrkRun;

/// The columns every accuracy table starts with (see [`accuracy_cells`]), and their rule.
const ACCURACY_COLUMNS: &str = "| algorithm | replicas × workers × connections | load | window s | requests | allowed | allowance | tolerance | overshoot | allowed / allowance | fail-open |";
const ACCURACY_RULE: &str = "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|";

/// An accuracy run's cells under [`ACCURACY_COLUMNS`], each table adding its own after them.
fn accuracy_cells(a: &Accuracy) -> String {
    let load = match a.offered_per_sec {
        Some(rate) => format!("paced, {} req/s", thousands(rate)),
        None => "closed loop, as fast as answered".into(),
    };
    format!(
        "| {} | {} × {} × {} | {} | {:.3} | {} | {} | {:.1} ({}) | {:.2} | **{}** | {:.4} | {} |",
        a.algorithm,
        a.replicas,
        a.workers,
        a.conns_per_replica,
        load,
        a.window_s,
        thousands(a.sent as f64),
        thousands(a.let_through() as f64),
        a.allowance,
        a.formula,
        a.tolerance(),
        a.overshoot(),
        a.let_through() as f64 / a.allowance,
        a.fail_open,
    )
}

/// Every throughput scenario, in the order they run; the report must list each.
pub const SCENARIOS: &[&str] = &[
    "baseline",
    "local_ratelimit",
    "filter-pass-through",
    "filter-plan-only",
    "filter-allow-1key",
    "filter-allow-10k-keys",
    "filter-allow-1key-leased",
    "filter-allow-10k-keys-leased",
    "filter-deny-hotkey",
    "filter-bridge-down",
    "filter-bridge-hung",
    "baseline-serial",
    "filter-serial",
    "baseline-repeat",
];

/// Algorithms also measured with several Envoy workers per replica, whose engines (batches
/// and deny caches) race on one key.
pub const CONCURRENT_ALGORITHMS: &[&str] = &["token_bucket", "sliding_window_log"];

/// Algorithms whose accuracy is also measured with leases on (the ones that take a lease).
pub const LEASED_ALGORITHMS: &[&str] = &["token_bucket", "gcra"];

/// The phases of a filtered request (issue 13's table), each with the scenario that stops
/// there, cheapest first.
pub const PHASES: &[(&str, &str)] = &[
    ("Envoy alone", "baseline"),
    (
        "pass-through: the filter loaded, no rule matching (the floor)",
        "filter-pass-through",
    ),
    (
        "plan only: rule match, key, SHA-1, Redis key strings, then continue",
        "filter-plan-only",
    ),
    (
        "deny hit: plan, then a local 429 from the deny cache",
        "filter-deny-hotkey",
    ),
    (
        "batched decision: plan, a share of one call, wait, resume",
        "filter-allow-1key",
    ),
    (
        "leased decision: plan, then a unit of the worker's lease (no call, no wait)",
        "filter-allow-1key-leased",
    ),
];

/// The allow scenarios with and without a lease, side by side in the leases table.
pub const LEASE_PAIRS: &[(&str, &str)] = &[
    ("filter-allow-1key", "filter-allow-1key-leased"),
    ("filter-allow-10k-keys", "filter-allow-10k-keys-leased"),
];

/// The refill per second of the unleased allow scenarios' limit (named in the leases text).
pub const UNLEASED_ALLOW_RATE: f64 = 1_000_000.0;

/// One row of the per-phase table.
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    pub label: &'static str,
    pub scenario: &'static str,
    pub rps: f64,
    /// Throughput over Envoy alone (`baseline`).
    pub ratio: f64,
    /// What a request costs, a plain request (Envoy alone) = 1: baseline req/s over req/s.
    pub cost: f64,
}

/// The whole seconds of a timeline after the first, without the last (a partial second).
pub fn steady_seconds(per_second: &[(u64, u64, u64)]) -> Vec<u64> {
    per_second
        .iter()
        .skip(1)
        .take(per_second.len().saturating_sub(2))
        .map(|s| s.0)
        .collect()
}

/// The filter's lease counters over a run (`wasmcustom.ratelimit_lease_*`, summed over the
/// replicas): each None when no Envoy exported it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LeaseCounters {
    /// Requests allowed from a lease, with no call.
    pub hits: Option<u64>,
    /// Leases granted.
    pub grants: Option<u64>,
    /// Unused leased units given back.
    pub units_returned: Option<u64>,
}

impl LeaseCounters {
    pub const HITS: &'static str = "wasmcustom.ratelimit_lease_hits";
    pub const GRANTS: &'static str = "wasmcustom.ratelimit_lease_grants";
    pub const UNITS_RETURNED: &'static str = "wasmcustom.ratelimit_lease_units_returned";

    /// From `/stats` deltas of one or more Envoys (a counter an Envoy does not export is
    /// not in its map).
    pub fn sum(stats: &[BTreeMap<String, u64>]) -> LeaseCounters {
        let sum = |name: &str| {
            stats
                .iter()
                .filter_map(|m| m.get(name).copied())
                .reduce(|a, b| a + b)
        };
        LeaseCounters {
            hits: sum(Self::HITS),
            grants: sum(Self::GRANTS),
            units_returned: sum(Self::UNITS_RETURNED),
        }
    }

    pub fn exported(&self) -> bool {
        self.hits.is_some() || self.grants.is_some() || self.units_returned.is_some()
    }

    /// A counter for a table: its value, or "–" when not exported.
    pub fn cell(v: Option<u64>) -> String {
        v.map(|n| thousands(n as f64)).unwrap_or_else(|| "–".into())
    }

    pub fn json(&self) -> Value {
        json!({"hits": self.hits, "grants": self.grants, "units_returned": self.units_returned})
    }
}

/// What one throughput scenario cost, from the counters read before and after it.
#[derive(Clone, Debug, Default)]
pub struct Cost {
    /// Decisions by the filter: allowed, denied (summed `wasmcustom.ratelimit_*`).
    pub allowed: u64,
    pub denied: u64,
    pub fail_open: u64,
    pub bridge_errors: u64,
    /// Requests Envoy started to Webdis (`cluster.webdis.upstream_rq_total`), and connections
    /// to it that failed (`upstream_cx_connect_fail`: Webdis down).
    pub webdis_calls: u64,
    /// Decision calls the filter made (`ratelimit_bridge_calls`) and requests its deny
    /// cache answered (`ratelimit_deny_cache_hits`).
    pub bridge_calls: u64,
    pub deny_cache_hits: u64,
    pub webdis_connect_fails: u64,
    /// The lease counters; None where the filter does not export them (a build without
    /// leases).
    pub lease: LeaseCounters,
    /// Redis calls per command, the bench's own left out.
    pub redis_commands: BTreeMap<String, u64>,
    /// Keys in Redis after the run (DBSIZE): the buckets the scenario made.
    pub redis_keys: u64,
    /// CPU seconds used during the run, per process (None: not running).
    pub cpu: Vec<(String, Option<f64>)>,
    /// Busy CPU seconds of the whole machine (wrk included).
    pub machine_busy_s: Option<f64>,
    pub wall_s: f64,
}

impl Cost {
    pub fn decisions(&self) -> u64 {
        self.allowed + self.denied
    }

    /// Decisions Redis made (the rest came from the deny cache).
    pub fn redis_decisions(&self) -> u64 {
        self.decisions().saturating_sub(self.deny_cache_hits)
    }

    /// Requests one decision call carried, on average.
    pub fn mean_batch(&self) -> Option<f64> {
        (self.bridge_calls > 0).then(|| self.redis_decisions() as f64 / self.bridge_calls as f64)
    }

    pub fn redis_total(&self) -> u64 {
        self.redis_commands.values().sum()
    }
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub what: String,
    /// The scenario whose req/s and latency this one is compared with.
    pub compare_to: String,
    pub load: String,
    pub run: WrkRun,
    pub cost: Cost,
    /// Whether the filter is in the path (the cost columns apply).
    pub filter: bool,
}

/// One accuracy run: several replicas, one key, a known capacity and rate.
#[derive(Clone, Debug, Default)]
pub struct Accuracy {
    pub algorithm: String,
    pub replicas: usize,
    /// Envoy worker threads per replica (each has its own engine and deny cache).
    pub workers: u32,
    pub conns_per_replica: usize,
    pub capacity: u64,
    pub rate_per_sec: f64,
    /// Offered requests/s over all connections when paced; None: as fast as answered.
    pub offered_per_sec: Option<f64>,
    pub duration_s: f64,
    /// From the first request sent to the last response read.
    pub window_s: f64,

    /// The most an exact limiter of this algorithm may allow in the window, and how.
    pub allowance: f64,
    /// The same over the shortest span the decisions may have taken (first response read to
    /// last request sent): what the exact allowance is at least.
    pub allowance_inner: f64,
    pub formula: String,
    pub sent: u64,
    pub allowed: u64,
    pub denied: u64,
    pub failed: u64,
    /// From the filter's counters, summed over the replicas.
    pub filter_allowed: u64,
    pub filter_denied: u64,
    pub fail_open: u64,
    pub allowed_per_replica: Vec<u64>,
    /// The lease counters, summed over the replicas.
    pub lease: LeaseCounters,
    /// The limit's `lease` as the config writes it ("" without), and `bridge.clock_skew`.
    pub lease_setting: String,
    pub clock_skew_ms: Option<u64>,
}

impl Accuracy {
    /// Requests let through by any route (counted by the clients, or by the filter: a
    /// fail-open pass counts as let through), the larger.
    pub fn let_through(&self) -> u64 {
        self.allowed.max(self.filter_allowed + self.fail_open)
    }

    /// The allowance's tolerance, in requests: how much the exact allowance over the
    /// decisions' own span may be below the one used.
    pub fn tolerance(&self) -> f64 {
        self.allowance - self.allowance_inner
    }

    /// Requests let through beyond the allowance.
    pub fn overshoot(&self) -> u64 {
        self.let_through()
            .saturating_sub(self.allowance.floor() as u64)
    }
}

/// Allowed, denied and failed responses in each second of the overload run.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub run: Accuracy,
    pub per_second: Vec<(u64, u64, u64)>,
}

/// A bridge outage under steady load: Webdis stopped, then resumed.
#[derive(Clone, Debug, Default)]
pub struct Outage {
    pub failure_mode: String,
    pub connections: usize,
    /// Seconds since the load started.
    pub stop_s: f64,
    pub resume_s: f64,
    pub slice_s: f64,
    pub slices: Vec<super::svg::Slice>,
    /// When a worker's breaker opened (the gauge went above 0) and when all had closed again.
    pub breaker_open_s: Option<f64>,
    pub breaker_closed_s: Option<f64>,
    /// From the stop to the first request let through without waiting (under 10 ms), and from
    /// the resume to the first decided one.
    pub first_fast_after_stop_ms: Option<f64>,
    pub first_decided_after_resume_ms: Option<f64>,
    pub answered: u64,
    /// Requests with no answer, or another status than 200.
    pub failed: u64,
    /// The slowest request sent after the breaker opened and before the resume, ms.
    pub slowest_while_open_ms: f64,
    pub chart_file: String,
    /// Local mode: the most the fleet may let through per second while the bridge is out
    /// (limit × local_share × workers × replicas), and what it did, per whole second of the
    /// outage after the first.
    pub local_bound_per_s: Option<f64>,
    pub allowed_per_s_while_out: Vec<u64>,
}

/// A flood of distinct spoofed client addresses against a per-IP rule, with or without a key
/// budget: what it leaves in Redis and what it costs in memory.
#[derive(Clone, Debug, Default)]
pub struct KeyFlood {
    /// The rule's `key_budget` as written, or None.
    pub budget: Option<String>,
    pub addresses: u64,
    pub seconds: f64,
    pub allowed: u64,
    pub denied: u64,
    pub lost: u64,
    pub budget_exceeded: u64,
    pub keys_before: u64,
    pub keys_after: u64,
    /// Redis `used_memory`, Envoy's and Webdis's resident memory, in bytes, before and after.
    pub redis_memory: (u64, u64),
    pub envoy_rss: (u64, u64),
    pub webdis_rss: (u64, u64),
}

pub struct Report {
    pub quick: bool,
    pub started_utc: String,
    pub took_s: f64,
    pub commit: String,
    pub machine: Machine,
    pub versions: Vec<(String, String)>,
    pub settings: Vec<(String, String)>,
    pub scenarios: Vec<Scenario>,
    pub accuracy: Vec<Accuracy>,
    pub timeline: Timeline,
    pub chart_file: String,
    /// The accuracy runs and the overload timeline again, with leases on.
    pub accuracy_leased: Vec<Accuracy>,
    pub timeline_leased: Timeline,
    pub chart_file_leased: String,
    /// The leased throughput scenarios' policy.
    pub leased: super::config::Policy,
    pub outages: Vec<Outage>,
    pub floods: Vec<KeyFlood>,
    pub cluster: super::cluster::ClusterSection,
}

pub fn thousands(n: f64) -> String {
    let n = n.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Seconds with 3 significant digits (the CPU columns span three orders of magnitude).
fn sig3(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let digits = (2 - v.abs().log10().floor() as i32).max(0) as usize;
    format!("{v:.digits$}")
}

impl Report {
    pub fn scenario(&self, name: &str) -> Option<&Scenario> {
        self.scenarios.iter().find(|s| s.name == name)
    }

    fn ratio(&self, s: &Scenario) -> Option<f64> {
        let base = self.scenario(&s.compare_to)?;
        (base.run.rps > 0.0).then(|| s.run.rps / base.run.rps)
    }

    /// Throughput of a filter scenario over `filter-pass-through` (the filter loaded, no rule
    /// matching): the floor any wasm filter pays here.
    pub fn pass_through_ratio(&self, s: &Scenario) -> Option<f64> {
        let floor = self.scenario("filter-pass-through")?;
        (s.filter && s.compare_to == "baseline" && floor.run.rps > 0.0)
            .then(|| s.run.rps / floor.run.rps)
    }

    /// CPU seconds per 1,000 requests of process `label` in scenario `s`.
    fn cpu_per_1k(s: &Scenario, label: &str) -> Option<f64> {
        let cpu = s.cost.cpu.iter().find(|(l, _)| l == label)?.1?;
        (s.run.requests > 0).then(|| cpu / s.run.requests as f64 * 1000.0)
    }

    /// The throughput table (also what the README shows).
    pub fn throughput_table(&self) -> String {
        let mut t = String::from(
            "| scenario | req/s | × baseline | × pass-through | p50 ms | p99 ms | non-2xx | what |\n|---|---:|---:|---:|---:|---:|---:|---|\n",
        );
        for s in &self.scenarios {
            let ratio = self
                .ratio(s)
                .map(|r| {
                    if s.compare_to == "baseline" {
                        format!("{r:.2}")
                    } else {
                        format!("{r:.2} (vs {})", s.compare_to)
                    }
                })
                .unwrap_or_else(|| "–".into());
            let floor = self
                .pass_through_ratio(s)
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "–".into());
            let _ = writeln!(
                t,
                "| `{}` | {} | {} | {} | {} | {} | {} | {} |",
                s.name,
                thousands(s.run.rps),
                ratio,
                floor,
                ms(s.run.p50_ms),
                ms(s.run.p99_ms),
                thousands(s.run.non_2xx as f64),
                s.what
            );
        }
        t
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
        let mut t = format!(
            "| scenario | filter: allowed / denied / failed open | deny-cache hits | Webdis calls / request | mean batch | Redis commands / decision | CPU s per 1,000 req: Envoy | Webdis | Redis | cores busy: Envoy / Webdis / Redis | machine busy (of {} cores) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n",
            self.machine.cores
        );
        for s in &self.scenarios {
            let per_req = |n: u64| {
                if !s.filter || s.run.requests == 0 {
                    "–".to_string()
                } else {
                    format!("{:.2}", n as f64 / s.run.requests as f64)
                }
            };
            let per_decision = if s.cost.redis_decisions() == 0 {
                "–".to_string()
            } else {
                format!(
                    "{:.2}",
                    s.cost.redis_total() as f64 / s.cost.redis_decisions() as f64
                )
            };
            let batch = s
                .cost
                .mean_batch()
                .map(|b| format!("{b:.1}"))
                .unwrap_or_else(|| "–".into());
            let cpu = |label: &str| {
                Report::cpu_per_1k(s, label)
                    .map(sig3)
                    .unwrap_or_else(|| "–".into())
            };
            let cores: Vec<String> = s
                .cost
                .cpu
                .iter()
                .map(|(_, c)| {
                    c.map(|c| format!("{:.2}", c / s.cost.wall_s))
                        .unwrap_or_else(|| "–".into())
                })
                .collect();
            let busy = s
                .cost
                .machine_busy_s
                .map(|b| format!("{:.2}", b / s.cost.wall_s))
                .unwrap_or_else(|| "–".into());
            let _ = writeln!(
                t,
                "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                s.name,
                if s.filter {
                    format!(
                        "{} / {} / {}",
                        thousands(s.cost.allowed as f64),
                        thousands(s.cost.denied as f64),
                        thousands(s.cost.fail_open as f64)
                    )
                } else {
                    "–".into()
                },
                if s.filter {
                    thousands(s.cost.deny_cache_hits as f64)
                } else {
                    "–".into()
                },
                per_req(s.cost.webdis_calls),
                batch,
                per_decision,
                cpu("envoy"),
                cpu("webdis"),
                cpu("redis"),
                cores.join(" / "),
                busy
            );
        }
        t
    }

    pub fn accuracy_table(&self) -> String {
        let mut t = format!("{ACCURACY_COLUMNS} allowed per replica |\n{ACCURACY_RULE}---|\n");
        for a in self.accuracy.iter().chain([&self.timeline.run]) {
            let _ = writeln!(
                t,
                "{} {} |",
                accuracy_cells(a),
                a.allowed_per_replica
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(" / ")
            );
        }
        t
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
        let envoy_base = Report::cpu_per_1k(base, "envoy").unwrap_or(0.0);
        let envoy = Report::cpu_per_1k(allow, "envoy").unwrap_or(0.0);
        let webdis = Report::cpu_per_1k(allow, "webdis").unwrap_or(0.0);
        let redis = Report::cpu_per_1k(allow, "redis").unwrap_or(0.0);
        let total = envoy + webdis + redis;
        let _ = writeln!(
            out,
            "- Per 1,000 allowed requests (`filter-allow-1key`) the chain used {} CPU s: Envoy {} ({:.0}%), Webdis {} ({:.0}%), Redis {} ({:.0}%). Envoy without the filter used {} per 1,000 (`baseline`), so the filter makes each request cost Envoy {:.1}× as much: the wasm callbacks, the request's share of a call-out (an HTTP request to Webdis and its response) and resuming the paused request.",
            sig3(total),
            sig3(envoy),
            100.0 * envoy / total.max(f64::MIN_POSITIVE),
            sig3(webdis),
            100.0 * webdis / total.max(f64::MIN_POSITIVE),
            sig3(redis),
            100.0 * redis / total.max(f64::MIN_POSITIVE),
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
            let _ = writeln!(
                out,
                "- Concurrent decisions share calls: {:.3} Webdis calls per request in `filter-allow-1key`, a mean batch of {:.1} requests per `EVALSHA`. Per batch, Redis ran {:.2} commands counted by `INFO commandstats`, i.e. per request {} (the commands inside the script are counted too).",
                allow.cost.webdis_calls as f64 / allow.run.requests.max(1) as f64,
                allow.cost.mean_batch().unwrap_or(0.0),
                allow.cost.redis_total() as f64 / allow.cost.bridge_calls.max(1) as f64,
                per.join(", ")
            );
        }
        if let Some(deny) = self.scenario("filter-deny-hotkey") {
            if deny.cost.decisions() > 0 {
                let _ = writeln!(
                    out,
                    "- A refused abuser is answered by its worker: in `filter-deny-hotkey` the deny cache answered {} of {} decisions ({:.1}%) without a call, and {:.4} Webdis calls were made per request.",
                    thousands(deny.cost.deny_cache_hits as f64),
                    thousands(deny.cost.decisions() as f64),
                    100.0 * deny.cost.deny_cache_hits as f64 / deny.cost.decisions() as f64,
                    deny.cost.webdis_calls as f64 / deny.run.requests.max(1) as f64,
                );
            }
        }
        if let Some(many) = self.scenario("filter-allow-10k-keys") {
            let _ = writeln!(
                out,
                "- Many keys cost about what one key costs: `filter-allow-10k-keys` ran at {:.2}× the one-key throughput, with {} keys in Redis after it (DBSIZE).",
                many.run.rps / allow.run.rps.max(f64::MIN_POSITIVE),
                thousands(many.cost.redis_keys as f64)
            );
        }
        if let Some(busy) = allow.cost.machine_busy_s {
            let _ = writeln!(
                out,
                "- During `filter-allow-1key` the machine was {:.0}% busy ({:.2} of {} cores, wrk included): the chain is bound by CPU, so its req/s here are a measure of CPU per request more than of a limit of the design.",
                100.0 * busy / allow.cost.wall_s / self.machine.cores.max(1) as f64,
                busy / allow.cost.wall_s,
                self.machine.cores
            );
        }
        if let Some((p50, p99)) = self.added_latency() {
            let _ = writeln!(
                out,
                "- One decision adds {p50:.3} ms at the median and {p99:.3} ms at p99 to a request on an idle connection (`filter-serial` vs `baseline-serial`)."
            );
        }
        if let (Some(down), Some(hung)) = (
            self.scenario("filter-bridge-down"),
            self.scenario("filter-bridge-hung"),
        ) {
            let _ = writeln!(
                out,
                "- With Webdis down requests fail open at {:.2}× pass-through ({:.4} failed connects per request: each worker's breaker opens after 5 refused calls, then only a probe per 500 ms connects); with Webdis hung at {:.2}× (p50 {} ms): the breaker opens on the first call stalled for 25 ms, then no request waits for the bridge.",
                self.pass_through_ratio(down).unwrap_or(0.0),
                down.cost.webdis_connect_fails as f64 / down.run.requests.max(1) as f64,
                self.pass_through_ratio(hung).unwrap_or(0.0),
                ms(hung.run.p50_ms),
            );
        }
        if let Some(repeat) = self.scenario("baseline-repeat") {
            let _ = writeln!(
                out,
                "- Noise: `baseline` measured again at the end of the throughput runs gave {:.2}× the first; ratios closer together than that say nothing.",
                self.ratio(repeat).unwrap_or(0.0)
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
                Some(Phase {
                    label,
                    scenario: name,
                    rps: s.run.rps,
                    ratio: s.run.rps / base.run.rps,
                    cost: base.run.rps / s.run.rps,
                })
            })
            .collect()
    }

    /// Issue 13's table, re-measured in this run, and what each phase adds.
    pub fn phase_text(&self) -> String {
        let phases = self.phases();
        let mut r = String::from(
            "Each row is a throughput scenario of this run that takes the request one phase further (Envoy 1 worker, `wrk -t2 -c32`). `filter-plan-only` is the filter built with the measurement-only cargo feature `phase-plan-only` (into `target/phase-plan-only/`, never shipped): each request is planned, then continues undecided; same rule and load as `filter-allow-1key`. Cost of a request: `baseline` req/s over the row's req/s, a plain request through Envoy alone = 1 (the machine is CPU-bound, so this is the CPU a request takes).\n\n| phase | scenario | req/s | × Envoy alone | cost of a request (plain = 1) |\n|---|---|---:|---:|---:|\n",
        );
        for p in &phases {
            let _ = writeln!(
                r,
                "| {} | `{}` | {} | {:.2} | {:.2} |",
                p.label,
                p.scenario,
                thousands(p.rps),
                p.ratio,
                p.cost
            );
        }
        let cost = |name: &str| phases.iter().find(|p| p.scenario == name).map(|p| p.cost);
        if let (Some(floor), Some(plan)) = (cost("filter-pass-through"), cost("filter-plan-only")) {
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
            let _ = writeln!(r, "\nSo: {}.", parts.join("; "));
        }
        if let Some(leased) = self.scenario("filter-allow-1key-leased") {
            let note = if leased.cost.lease.exported() {
                Report::lease_note(leased)
            } else {
                "The leased row served no request from a lease: this filter build does not lease yet (see Leases).".to_string()
            };
            let _ = writeln!(r, "\n{note}");
        }
        r
    }

    /// What the leased scenario's counters say: how many requests a lease served.
    fn lease_note(s: &Scenario) -> String {
        match s.cost.lease.hits {
            None => format!(
                "`{}`: this filter build exports no lease counters, so it does not lease yet (the `lease` config parses but has no effect until the engine's leases land): the leased rows measure the unleased path under a slowly refilling limit.",
                s.name
            ),
            Some(hits) => format!(
                "`{}`: {} of {} decisions ({:.1}%) came from a lease; {:.4} bridge calls per request.",
                s.name,
                thousands(hits as f64),
                thousands(s.cost.decisions() as f64),
                100.0 * hits as f64 / s.cost.decisions().max(1) as f64,
                s.cost.bridge_calls as f64 / s.run.requests.max(1) as f64
            ),
        }
    }

    /// The allow scenarios with and without a lease: why this limit, and what leases saved.
    pub fn lease_text(&self) -> String {
        let p = &self.leased;
        let lease = p.lease.unwrap_or(super::config::Lease::DEFAULT);
        let mut r = String::new();
        let per_key = self
            .scenario("filter-allow-10k-keys-leased")
            .map(|s| s.run.rps / 10_000.0);
        let one_key = self
            .scenario("filter-allow-1key-leased")
            .map_or(0.0, |s| s.run.rps);
        let _ = writeln!(
            r,
            "`filter-allow-1key-leased` and `filter-allow-10k-keys-leased` run the loads of `filter-allow-1key` and `filter-allow-10k-keys` against one Envoy (1 worker) whose rule is a {} with `limit` {} per 1 s, `burst` {} and `lease` {{`max_units` {}, `fraction` {}, `max_ms` {}}}, and `bridge.clock_skew` {} ms (every replica here shares one clock; the default 1 s would end at once every lease on a bucket that is full again within a second).\n",
            p.algorithm,
            p.rate_per_sec,
            thousands(p.capacity as f64),
            lease.max_units,
            lease.fraction,
            lease.max_ms,
            p.clock_skew_ms.map_or("1000".to_string(), |v| v.to_string()),
        );
        let _ = writeln!(
            r,
            "Why this limit: every request of the run must still be allowed (a run spends far less than the burst), and the bucket must not be full. A lease lasts until the earlier of `max_ms` and the instant the bucket in Redis would be full again (minus the clock skew), so leases pay off only where an identity spends faster than its limit refills: here the one key spends about {} units per second and each of the 10,000 keys about {} per second, against a refill of {} per second, and even a lease's own {} units take {} s to refill, longer than `max_ms`. A lease then serves what its identity asks for within `max_ms`: nearly every request of the one hot key, but only the few that each of the 10,000 keys sends in that time. With a bucket that refills faster than it is spent (for example the unleased scenarios' {} per second, which refill a lease of {} units in {} ms), every lease ends almost at once, each request takes a new one, and the leased scenario costs like the unleased one.\n",
            thousands(one_key),
            per_key.map_or("?".to_string(), |v| format!("{v:.1}")),
            p.rate_per_sec,
            lease.max_units,
            thousands(lease.max_units as f64 / p.rate_per_sec.max(f64::MIN_POSITIVE)),
            thousands(UNLEASED_ALLOW_RATE),
            lease.max_units,
            lease.max_units as f64 / UNLEASED_ALLOW_RATE * 1000.0,
        );
        let _ = writeln!(
            r,
            "| scenario | req/s | × baseline | × filter-pass-through | bridge calls / request | lease hits | lease grants | units returned |\n|---|---:|---:|---:|---:|---:|---:|---:|"
        );
        for name in LEASE_PAIRS.iter().flat_map(|(a, b)| [a, b]) {
            let Some(s) = self.scenario(name) else {
                continue;
            };
            let hits = match s.cost.lease.hits {
                Some(n) => format!(
                    "{} ({:.1}%)",
                    thousands(n as f64),
                    100.0 * n as f64 / s.run.requests.max(1) as f64
                ),
                None => "–".into(),
            };
            let _ = writeln!(
                r,
                "| `{}` | {} | {} | {} | {:.4} | {} | {} | {} |",
                s.name,
                thousands(s.run.rps),
                self.ratio(s).map_or("–".to_string(), |v| format!("{v:.2}")),
                self.pass_through_ratio(s)
                    .map_or("–".to_string(), |v| format!("{v:.2}")),
                s.cost.bridge_calls as f64 / s.run.requests.max(1) as f64,
                hits,
                LeaseCounters::cell(s.cost.lease.grants),
                LeaseCounters::cell(s.cost.lease.units_returned),
            );
        }
        let _ = writeln!(
            r,
            "\nBridge calls: `ratelimit_bridge_calls` (decision calls) over the requests wrk completed. Lease hits (requests allowed from a lease, with no call; in % of the requests), grants and units returned: `ratelimit_lease_hits`, `ratelimit_lease_grants`, `ratelimit_lease_units_returned`; – where the filter does not export them."
        );
        if let Some(leased) = self.scenario("filter-allow-1key-leased") {
            if !leased.cost.lease.exported() {
                let _ = writeln!(r, "\n{}", Report::lease_note(leased));
            }
        }
        r
    }

    /// The leased accuracy runs and the leased overload run, one row each.
    pub fn accuracy_leased_table(&self) -> String {
        let mut t = format!(
            "{ACCURACY_COLUMNS} lease hits | lease grants | units returned |\n{ACCURACY_RULE}---:|---:|---:|\n"
        );
        let overload = Some(&self.timeline_leased.run).filter(|a| a.sent > 0);
        for a in self.accuracy_leased.iter().chain(overload) {
            let _ = writeln!(
                t,
                "{} {} | {} | {} |",
                accuracy_cells(a),
                LeaseCounters::cell(a.lease.hits),
                LeaseCounters::cell(a.lease.grants),
                LeaseCounters::cell(a.lease.units_returned),
            );
        }
        t
    }

    fn accuracy_leased_text(&self) -> String {
        let mut r = String::new();
        let Some(a) = self.accuracy_leased.first() else {
            return r;
        };
        let _ = writeln!(
            r,
            "The same measurement with leases on, on processes of its own (a fresh Redis, 4 Webdis, 4 Envoys with `--concurrency 2`: 8 engines, each holding its own leases): token bucket and GCRA, C = {}, R = {} per second, `lease` `{}`, `bridge.clock_skew` {} ms (one clock on this machine). Units are charged in Redis before a request spends them, so the overshoot must be 0; units one worker holds in a lease while another is refused lower allowed / allowance (target ≥ 0.97). The last row is the 3× overload run below.\n",
            a.capacity,
            a.rate_per_sec,
            a.lease_setting,
            a.clock_skew_ms.map_or("1000".into(), |v| v.to_string()),
        );
        r.push_str(&self.accuracy_leased_table());
        let overload = Some(&self.timeline_leased.run).filter(|a| a.sent > 0);
        if !self
            .accuracy_leased
            .iter()
            .chain(overload)
            .any(|a| a.lease.exported())
        {
            let _ = writeln!(
                r,
                "\nThis filter build exports no lease counters, so it does not lease yet (the config parses, with no effect): these rows measure the unleased engine under the leased configuration."
            );
        }
        r
    }

    fn timeline_leased_text(&self) -> String {
        let t = &self.timeline_leased;
        let mut r = String::new();
        if t.per_second.is_empty() {
            return r;
        }
        let _ = writeln!(
            r,
            "The same overload with leases on: {} replicas × {} workers × {} connections offer {} req/s (3 × R) on one key for {:.0} s ({}, C = {}, R = {}/s; the Envoys of the leased accuracy rows).\n",
            t.run.replicas,
            t.run.workers,
            t.run.conns_per_replica,
            thousands(t.run.offered_per_sec.unwrap_or(0.0)),
            t.run.duration_s,
            t.run.algorithm,
            t.run.capacity,
            t.run.rate_per_sec
        );
        let _ = writeln!(
            r,
            "![allowed and denied per second, leases on]({})\n",
            self.chart_file_leased
        );
        let steady = steady_seconds(&t.per_second);
        if steady.is_empty() {
            let _ = writeln!(
                r,
                "The run is too short for whole seconds after the first (quick mode): {} allowed, overshoot **{}**, lease hits {}.",
                thousands(t.run.let_through() as f64),
                t.run.overshoot(),
                LeaseCounters::cell(t.run.lease.hits),
            );
        } else {
            let allowance = t.run.rate_per_sec;
            let mean = steady.iter().sum::<u64>() as f64 / steady.len() as f64;
            let _ = writeln!(
                r,
                "First second: {} allowed (the burst C plus a second of refill), {} denied. Allowed in each whole second after it, against an allowance of R = {} per second: {}; mean {:.1} ({:.3} of the allowance), from {} to {}. Over the whole run: {} allowed, overshoot **{}**, lease hits {}.",
                t.per_second.first().map(|s| s.0).unwrap_or(0),
                t.per_second.first().map(|s| s.1).unwrap_or(0),
                allowance,
                steady
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                mean,
                mean / allowance.max(f64::MIN_POSITIVE),
                steady.iter().min().copied().unwrap_or(0),
                steady.iter().max().copied().unwrap_or(0),
                thousands(t.run.let_through() as f64),
                t.run.overshoot(),
                LeaseCounters::cell(t.run.lease.hits),
            );
        }
        r
    }

    pub fn markdown(&self) -> String {
        let mut r = String::new();
        let mode = if self.quick {
            "Quick mode (`make bench-quick`): every scenario, in short runs; a smoke test, not figures to quote."
        } else {
            "Full run (`make bench`)."
        };
        let _ = writeln!(r, "# Benchmark report\n");
        let _ = writeln!(
            r,
            "{} Started {} UTC, took {:.0} s, at commit {}. **All figures come from this one run**, on a 2-core machine that other work (tests run by others) may have shared: absolute numbers are noisy, the ratios within the run are what to read.\n",
            mode, self.started_utc, self.took_s, self.commit
        );
        let _ = writeln!(r, "## Machine and versions\n");
        let m = &self.machine;
        let _ = writeln!(
            r,
            "- CPU: {}, {} cores; {:.1} GiB memory; {}; Linux {}",
            m.cpu_model, m.cores, m.memory_gib, m.os, m.kernel
        );
        for (name, version) in &self.versions {
            let _ = writeln!(r, "- {name}: {version}");
        }
        let _ = writeln!(r, "\n## Settings\n");
        for (name, value) in &self.settings {
            let _ = writeln!(r, "- {name}: {value}");
        }
        let _ = writeln!(r, "\n## Throughput and latency\n");
        r.push_str(&self.throughput_table());
        if let Some((p50, p99)) = self.added_latency() {
            let _ = writeln!(
                r,
                "\nAdded latency of one decision (1 connection, one request at a time): **+{p50:.3} ms p50, +{p99:.3} ms p99** (`filter-serial` minus `baseline-serial`)."
            );
        }
        let _ = writeln!(r, "\n## Where the cost is\n");
        r.push_str(&self.cost_table());
        let _ = writeln!(
            r,
            "\nWebdis calls per request: `cluster.webdis.upstream_rq_total` of Envoy over the requests wrk completed. Redis commands per decision: `INFO commandstats` calls (commands run inside the script included, the bench's own INFO/AUTH left out) over the filter's decisions (`ratelimit_allowed` + `ratelimit_denied`). CPU: utime + stime from `/proc/PID/stat` over the run (10 ms ticks); cores busy = CPU seconds / wall seconds. Machine busy: all cores, from `/proc/stat`, so wrk (which shares the cores) and anything else running are in it.\n"
        );
        r.push_str(&self.where_the_time_goes());
        let _ = writeln!(
            r,
            "\n## Where a filtered request's time goes, phase by phase\n"
        );
        r.push_str(&self.phase_text());
        let _ = writeln!(r, "\n## Leases\n");
        r.push_str(&self.lease_text());
        let _ = writeln!(r, "\n## Global accuracy\n");
        r.push_str(&self.accuracy_text());
        let _ = writeln!(r, "\n### With leases\n");
        r.push_str(&self.accuracy_leased_text());
        let _ = writeln!(r, "\n## Under 3× overload, over time\n");
        r.push_str(&self.timeline_text());
        let _ = writeln!(r, "\n### With leases\n");
        r.push_str(&self.timeline_leased_text());
        let _ = writeln!(r, "\n## A bridge outage, over time\n");
        for o in &self.outages {
            r.push_str(&Report::outage_text(o));
        }
        let _ = writeln!(r, "\n## A flood of new client addresses\n");
        r.push_str(&self.flood_table());
        let _ = writeln!(r, "\n## Redis Cluster\n");
        r.push_str(&self.cluster_text());
        let _ = writeln!(r, "\n## Raw outputs\n");
        let _ = writeln!(
            r,
            "Beside this report: `results.json` (every figure above and the counters behind them), `raw/*.wrk.txt` (wrk's output per scenario, warm-ups too), `raw/overload-per-second.csv` and `raw/overload-leased-per-second.csv`, `{}` and `{}`, and `procs/` (the configs and logs of every process the run started).",
            self.chart_file, self.chart_file_leased
        );
        r
    }

    fn accuracy_text(&self) -> String {
        let mut r = String::new();
        let a = self.accuracy.first().cloned().unwrap_or_default();
        let _ = writeln!(
            r,
            "Replicas: Envoys with 1 worker each (and, in the rows with 2 workers, Envoys with `--concurrency 2`, whose two engines per replica batch and cache refusals independently), each with its own Webdis (as a sidecar would be), all sharing one Redis. Every connection sends `GET /` with the same API key, so all replicas spend one key's state. Capacity (burst) C = {}, rate R = {} per second (for the window algorithms: a limit of R per 1 s window). The Envoys hold one rule per algorithm, chosen by a request header, so every algorithm runs on the same processes, one after the other, each on a fresh key. The clients count every response (each connection waits for its answer, so nothing is in flight when the run ends) and the filter's counters are read from every replica; the larger of the two counts is used, and fail-open passes count as let through, so a bridge failure cannot hide an overshoot (the runs use a 5 s bridge timeout and breaker stall; fail-open must be 0).\n\nThe window runs from the first request sent to the last response read, so it contains every decision instant, and the allowance over it is an upper bound of what an exact limiter allows. **Tolerance at the start and end instants:** the first decision came between the first request sent and the first response read, the last between the last request sent and the last response read; the tolerance column is how much smaller the allowance is over that shortest possible span (first response read to last request sent). An overshoot smaller than the tolerance could go unseen; a limiter that checks and then sets in separate commands lets racing requests spend the same unit, and with dozens of connections racing on one key all through the run its overshoot would grow with the run, far past the tolerance. Overshoot = `allowed − floor(allowance)` when positive. The window algorithms' allowances are their guarantees (fixed windows align to the Unix epoch; the sliding window counter is bounded here by its per-window count), so an overshoot would be a bug, not the algorithm's design.\n",
            a.capacity,
            a.rate_per_sec,
        );
        r.push_str(&self.accuracy_table());
        r
    }

    fn outage_text(o: &Outage) -> String {
        let ms = |v: Option<f64>| {
            v.map(|v| format!("{v:.1} ms"))
                .unwrap_or_else(|| "not seen".into())
        };
        let s = |v: Option<f64>| {
            v.map(|v| format!("{v:.2} s"))
                .unwrap_or_else(|| "not seen".into())
        };
        let mut r = String::new();
        let limit = if o.failure_mode == "local" {
            "one key far over its limit (100 per second, burst 100; `local_share` 1/8)"
        } else {
            "a limit never reached"
        };
        let _ = writeln!(
            r,
            "### Failure mode `{}`\n\nOne Envoy (1 worker), the shipped bridge timeout (150 ms) and breaker (5 failures, 25 ms stall, a probe per 500 ms), {limit}; {} keep-alive connections as fast as answered. Webdis is stopped (SIGSTOP) at {:.2} s and resumed (SIGCONT) at {:.2} s.\n",
            o.failure_mode, o.connections, o.stop_s, o.resume_s
        );
        let _ = writeln!(
            r,
            "![requests per second and p99 through the outage]({})\n",
            o.chart_file
        );
        let _ = writeln!(
            r,
            "- From the stop to the first request let through without waiting: **{}**; the breaker opened at {} (since the load started).",
            ms(o.first_fast_after_stop_ms),
            s(o.breaker_open_s)
        );
        let _ = writeln!(
            r,
            "- While open, the slowest request took {:.1} ms (the timeout is 150 ms).",
            o.slowest_while_open_ms
        );
        let _ = writeln!(
            r,
            "- From the resume to the first decided request: **{}**; every breaker was closed again at {}.",
            ms(o.first_decided_after_resume_ms),
            s(o.breaker_closed_s)
        );
        let refused: f64 = o.slices.iter().map(|c| c.refused_per_s * o.slice_s).sum();
        let _ = writeln!(
            r,
            "- {} requests answered 200 or 429 ({} of them 429), {} failed or answered otherwise.",
            thousands(o.answered as f64),
            thousands(refused),
            o.failed
        );
        if let Some(bound) = o.local_bound_per_s {
            let _ = writeln!(
                r,
                "- Allowed per whole second while Webdis was out: {} (bound: limit × local_share × workers × replicas = {bound:.1} per second; the first of these seconds may add the local burst, 100 × local_share = 12.5).",
                o.allowed_per_s_while_out
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        r
    }

    fn timeline_text(&self) -> String {
        let t = &self.timeline;
        let mut r = String::new();
        let _ = writeln!(
            r,
            "{} replicas × {} connections offer {} req/s (3 × R) on one key for {:.0} s ({}, C = {}, R = {}/s). Allowed and denied per second, summed over the replicas:\n",
            t.run.replicas,
            t.run.conns_per_replica,
            thousands(t.run.offered_per_sec.unwrap_or(0.0)),
            t.run.duration_s,
            t.run.algorithm,
            t.run.capacity,
            t.run.rate_per_sec
        );
        let _ = writeln!(r, "![allowed and denied per second]({})\n", self.chart_file);
        let steady = steady_seconds(&t.per_second);
        if !steady.is_empty() {
            let min = steady.iter().min().copied().unwrap_or(0);
            let max = steady.iter().max().copied().unwrap_or(0);
            let mean = steady.iter().sum::<u64>() as f64 / steady.len() as f64;
            let _ = writeln!(
                r,
                "First second: {} allowed (the burst C plus a second of refill), {} denied. Whole seconds after it: {} allowed per second, mean {:.1}, for R = {}.",
                t.per_second.first().map(|s| s.0).unwrap_or(0),
                t.per_second.first().map(|s| s.1).unwrap_or(0),
                if min == max {
                    format!("exactly {min}")
                } else {
                    format!("{min} to {max}")
                },
                mean,
                t.run.rate_per_sec
            );
        }
        r
    }

    pub fn json(&self) -> Value {
        let scenarios: Vec<Value> = self
            .scenarios
            .iter()
            .map(|s| {
                json!({
                    "name": s.name, "what": s.what, "load": s.load, "compare_to": s.compare_to,
                    "ratio": self.ratio(s),
                    "requests": s.run.requests, "duration_s": s.run.duration_s, "rps": s.run.rps,
                    "latency_ms": {"mean": s.run.mean_ms, "p50": s.run.p50_ms, "p90": s.run.p90_ms,
                                    "p99": s.run.p99_ms, "max": s.run.max_ms},
                    "non_2xx": s.run.non_2xx, "socket_errors": s.run.socket_errors,
                    "filter": {"allowed": s.cost.allowed, "denied": s.cost.denied,
                               "fail_open": s.cost.fail_open, "bridge_errors": s.cost.bridge_errors},
                    "webdis_calls": s.cost.webdis_calls,
                    "bridge_calls": s.cost.bridge_calls,
                    "deny_cache_hits": s.cost.deny_cache_hits,
                    "mean_batch": s.cost.mean_batch(),
                    "ratio_to_pass_through": self.pass_through_ratio(s),
                    "webdis_connect_fails": s.cost.webdis_connect_fails,
                    "lease": s.cost.lease.json(),
                    "machine_busy_s": s.cost.machine_busy_s,
                    "redis_commands": s.cost.redis_commands,
                    "redis_keys_after": s.cost.redis_keys,
                    "cpu_s": s.cost.cpu.iter().map(|(l, c)| (l.clone(), json!(c))).collect::<serde_json::Map<_, _>>(),
                    "wall_s": s.cost.wall_s,
                })
            })
            .collect();
        let accuracy_json = |a: &Accuracy| {
            json!({
                "algorithm": a.algorithm, "replicas": a.replicas, "workers": a.workers,
                "conns_per_replica": a.conns_per_replica, "capacity": a.capacity,
                "rate_per_sec": a.rate_per_sec, "offered_per_sec": a.offered_per_sec,
                "duration_s": a.duration_s, "window_s": a.window_s,
                "allowance_inner": a.allowance_inner, "tolerance": a.tolerance(), "sent": a.sent,
                "allowed": a.allowed, "denied": a.denied, "failed": a.failed,
                "filter_allowed": a.filter_allowed, "filter_denied": a.filter_denied,
                "fail_open": a.fail_open, "allowed_per_replica": a.allowed_per_replica,
                "allowance": a.allowance, "formula": a.formula, "overshoot": a.overshoot(),
                "lease": a.lease.json(), "lease_setting": a.lease_setting,
                "clock_skew_ms": a.clock_skew_ms,
            })
        };
        let accuracy: Vec<Value> = self
            .accuracy
            .iter()
            .chain([&self.timeline.run])
            .map(accuracy_json)
            .collect();
        let overload = Some(&self.timeline_leased.run).filter(|a| a.sent > 0);
        let accuracy_leased: Vec<Value> = self
            .accuracy_leased
            .iter()
            .chain(overload)
            .map(accuracy_json)
            .collect();
        json!({
            "quick": self.quick, "started_utc": self.started_utc, "took_s": self.took_s,
            "commit": self.commit,
            "machine": {"cpu_model": self.machine.cpu_model, "cores": self.machine.cores,
                        "memory_gib": self.machine.memory_gib, "kernel": self.machine.kernel,
                        "os": self.machine.os},
            "versions": self.versions.iter().cloned().collect::<BTreeMap<_, _>>(),
            "settings": self.settings.iter().cloned().collect::<BTreeMap<_, _>>(),
            "scenarios": scenarios,
            "accuracy": accuracy,
            "overload_per_second": self.timeline.per_second,
            "accuracy_leased": accuracy_leased,
            "overload_leased_per_second": self.timeline_leased.per_second,
            "phases": self.phases().iter().map(|p| json!({
                "phase": p.label, "scenario": p.scenario, "rps": p.rps,
                "ratio_to_baseline": p.ratio, "cost_of_a_request": p.cost,
            })).collect::<Vec<_>>(),
            "cluster": {
                "throughput": self.cluster.throughput.iter().map(|t| json!({
                    "setup": t.setup, "rps": t.run.rps, "p99_ms": t.run.p99_ms, "requests": t.run.requests,
                    "bridge_calls": t.bridge_calls, "decided": t.decided, "evalsha_per_node": t.per_node,
                })).collect::<Vec<_>>(),
                "accuracy": self.cluster.accuracy.iter().map(|a| json!({
                    "rule": a.run.algorithm, "shards": a.shards, "sent": a.run.sent,
                    "allowed": a.run.let_through(), "allowance": a.run.allowance,
                    "overshoot": a.run.overshoot(), "fail_open": a.run.fail_open,
                    "evalsha_per_node": a.per_node,
                })).collect::<Vec<_>>(),
                "prediction": self.cluster.prediction,
            },
            "key_floods": self.floods.iter().map(|f| json!({
                "budget": f.budget, "addresses": f.addresses, "seconds": f.seconds,
                "allowed": f.allowed, "denied": f.denied, "lost": f.lost,
                "budget_exceeded": f.budget_exceeded, "keys_before": f.keys_before,
                "keys_after": f.keys_after, "redis_used_memory": [f.redis_memory.0, f.redis_memory.1],
                "envoy_rss": [f.envoy_rss.0, f.envoy_rss.1], "webdis_rss": [f.webdis_rss.0, f.webdis_rss.1],
            })).collect::<Vec<_>>(),
        })
    }

    /// One Redis and a 3-master cluster under the same load; accuracy and shards on the
    /// cluster; the simulation's prediction for the cluster run.
    pub fn cluster_text(&self) -> String {
        use super::cluster::shares;
        let c = &self.cluster;
        let mut r = String::new();
        let _ = writeln!(
            r,
            "The same Envoy config (2 workers, one rule that allows everything, `wrk -t2 -c32`, 10,000 API keys in turn) against one Redis (envoy/envoy.yaml) and against a Redis Cluster of 3 masters + 3 replicas behind Envoy's `redis_proxy` (envoy/cluster/, `bridge.redis_cluster`), one after the other in this run.\n"
        );
        let _ = writeln!(
            r,
            "| setup | req/s | p99 ms | requests | bridge calls per request | `EVALSHA` per node | node shares |"
        );
        let _ = writeln!(r, "|---|---:|---:|---:|---:|---|---|");
        for t in &c.throughput {
            let _ = writeln!(
                r,
                "| {} | {} | {:.2} | {} | {:.3} | {} | {} |",
                t.setup,
                thousands(t.run.rps),
                t.run.p99_ms,
                thousands(t.run.requests as f64),
                t.bridge_calls as f64 / t.decided.max(1) as f64,
                t.per_node
                    .iter()
                    .map(|(_, n)| thousands(*n as f64))
                    .collect::<Vec<_>>()
                    .join(" / "),
                shares(&t.per_node),
            );
        }
        let _ = writeln!(
            r,
            "\nAccuracy on the cluster: one key, 16 connections on one Envoy with 2 workers, C = R = 99 per second; the sharded rule splits the key over 3 slots of 33 each. Overshoot must be 0; allowed / allowance below 1 is what sharding costs (a shard refusing while another still has tokens).\n"
        );
        let _ = writeln!(
            r,
            "| rule | shards | window s | requests | allowed | allowance | overshoot | allowed / allowance | fail-open | `EVALSHA` per master | shares |"
        );
        let _ = writeln!(r, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
        for a in &c.accuracy {
            let x = &a.run;
            let _ = writeln!(
                r,
                "| {} | {} | {:.3} | {} | {} | {:.1} | **{}** | {:.4} | {} | {} | {} |",
                x.algorithm,
                a.shards,
                x.window_s,
                thousands(x.sent as f64),
                thousands(x.let_through() as f64),
                x.allowance,
                x.overshoot(),
                x.let_through() as f64 / x.allowance.max(1e-9),
                x.fail_open,
                a.per_node
                    .iter()
                    .map(|(_, n)| thousands(*n as f64))
                    .collect::<Vec<_>>()
                    .join(" / "),
                shares(&a.per_node),
            );
        }
        match c.prediction.as_ref().and_then(|p| p["scenarios"].get(0)) {
            Some(p) => {
                let measured = c.throughput.iter().find(|t| t.per_node.len() > 1);
                let node_shares: Vec<String> = p["nodes"]
                    .as_array()
                    .map(|nodes| {
                        nodes
                            .iter()
                            .map(|n| {
                                format!(
                                    "{:.0}%",
                                    100.0 * n["call_fraction"].as_f64().unwrap_or(0.0)
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let _ = writeln!(
                    r,
                    "\nThe fleet simulation at this scale (`python3 tests/sim/fleet.py --small --json --rate {:.0}`, the measured rate), next to what was measured:\n",
                    measured.map_or(0.0, |m| m.run.rps)
                );
                let _ = writeln!(
                    r,
                    "| | calls per request | mean batch | node shares | p99 ms |"
                );
                let _ = writeln!(r, "|---|---:|---:|---|---:|");
                let _ = writeln!(
                    r,
                    "| predicted | {:.3} | {:.2} | {} | {:.2} (the decision alone) |",
                    p["calls_per_request"].as_f64().unwrap_or(0.0),
                    p["mean_batch"].as_f64().unwrap_or(0.0),
                    node_shares.join(" / "),
                    p["latency_ms"]["p99"].as_f64().unwrap_or(0.0),
                );
                if let Some(m) = measured {
                    let calls = m.bridge_calls as f64 / m.decided.max(1) as f64;
                    let _ = writeln!(
                        r,
                        "| measured | {:.3} | {:.2} | {} | {:.2} (wrk, the whole request) |",
                        calls,
                        1.0 / calls.max(1e-9),
                        shares(&m.per_node),
                        m.run.p99_ms,
                    );
                }
            }
            None => {
                let _ = writeln!(
                    r,
                    "\n(The fleet simulation did not run: no python3 or no tests/sim/fleet.py.)"
                );
            }
        }
        r
    }

    /// Key floods, with and without a key budget, side by side.
    pub fn flood_table(&self) -> String {
        let mut r = String::new();
        let mib = |b: u64| format!("{:.1}", b as f64 / 1_048_576.0);
        let _ = writeln!(
            r,
            "One Envoy (1 worker), a per-IP rule (`xff_trusted_hops: 1`, token bucket 10 per minute), each request from a new address in `X-Forwarded-For`, 32 keep-alive connections.\n"
        );
        let _ = writeln!(
            r,
            "| key budget | addresses | seconds | req/s | allowed | refused | over budget | Redis keys after | Redis used_memory MiB before → after | Envoy RSS MiB before → after | Webdis RSS MiB before → after |"
        );
        let _ = writeln!(r, "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|");
        for f in &self.floods {
            let _ = writeln!(
                r,
                "| {} | {} | {:.1} | {} | {} | {} | {} | {} | {} → {} | {} → {} | {} → {} |",
                f.budget
                    .as_deref()
                    .map_or("none".to_string(), |b| format!("`{b}`")),
                thousands(f.addresses as f64),
                f.seconds,
                thousands(f.addresses as f64 / f.seconds.max(1e-9)),
                thousands(f.allowed as f64),
                thousands(f.denied as f64),
                thousands(f.budget_exceeded as f64),
                thousands(f.keys_after as f64),
                mib(f.redis_memory.0),
                mib(f.redis_memory.1),
                mib(f.envoy_rss.0),
                mib(f.envoy_rss.1),
                mib(f.webdis_rss.0),
                mib(f.webdis_rss.1),
            );
        }
        if self.floods.iter().any(|f| f.lost > 0) {
            let lost: u64 = self.floods.iter().map(|f| f.lost).sum();
            let _ = writeln!(r, "\n{lost} flood requests got no answer.");
        }
        r
    }

    /// Names of scenarios or parts missing from the markdown: empty when complete.
    pub fn missing(&self, markdown: &str) -> Vec<String> {
        let mut missing: Vec<String> = SCENARIOS
            .iter()
            .filter(|name| !markdown.contains(&format!("| `{name}` |")))
            .map(|s| s.to_string())
            .collect();
        for algorithm in super::config::ALGORITHMS.iter().map(|a| a.name) {
            for replicas in [2, 4] {
                let found = self
                    .accuracy
                    .iter()
                    .any(|a| a.algorithm == *algorithm && a.replicas == replicas && a.sent > 0);
                if !found {
                    missing.push(format!("accuracy {algorithm} {replicas} replicas"));
                }
            }
        }
        for algorithm in CONCURRENT_ALGORITHMS {
            let found = self
                .accuracy
                .iter()
                .any(|a| a.algorithm == *algorithm && a.workers > 1 && a.sent > 0);
            if !found {
                missing.push(format!("accuracy {algorithm} with several workers"));
            }
        }
        if self.cluster.throughput.len() < 2
            || self.cluster.throughput.iter().any(|t| t.run.requests == 0)
        {
            missing.push("cluster throughput".to_string());
        }
        for shards in [1, 3] {
            if !self
                .cluster
                .accuracy
                .iter()
                .any(|a| a.shards == shards && a.run.sent > 0)
            {
                missing.push(format!("cluster accuracy with {shards} shard(s)"));
            }
        }
        for budget in [false, true] {
            if !self
                .floods
                .iter()
                .any(|f| f.budget.is_some() == budget && f.addresses > 0 && f.lost == 0)
            {
                missing.push(format!(
                    "key flood {}",
                    if budget {
                        "with a budget"
                    } else {
                        "without a budget"
                    }
                ));
            }
        }
        for mode in ["open", "local"] {
            if !self
                .outages
                .iter()
                .any(|o| o.failure_mode == mode && !o.slices.is_empty())
            {
                missing.push(format!("outage timeline, failure mode {mode}"));
            }
        }
        if self.timeline.per_second.is_empty() {
            missing.push("overload timeline".into());
        }
        for algorithm in LEASED_ALGORITHMS {
            let found = self
                .accuracy_leased
                .iter()
                .any(|a| a.algorithm == *algorithm && a.sent > 0);
            if !found {
                missing.push(format!("accuracy {algorithm} with leases"));
            }
        }
        if self.timeline_leased.per_second.is_empty() {
            missing.push("overload timeline with leases".into());
        }
        if self.phases().len() < PHASES.len() {
            missing.push("the per-phase table".into());
        }
        missing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Lease, Policy};

    fn scenario(name: &str, rps: f64) -> Scenario {
        Scenario {
            name: name.into(),
            what: String::new(),
            compare_to: "baseline".into(),
            load: String::new(),
            run: WrkRun {
                rps,
                requests: (rps * 10.0) as u64,
                ..WrkRun::default()
            },
            cost: Cost::default(),
            filter: name.starts_with("filter"),
        }
    }

    fn report(scenarios: Vec<Scenario>) -> Report {
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
        let text = r.phase_text();
        assert!(text.contains("| `filter-plan-only` | 25,000 | 0.50 | 2.00 |"));
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
            text.contains("| `filter-allow-1key` | 10,000 | 0.20 | 0.25 | 0.0000 | – | – | – |")
        );
        assert!(text.contains(
            "| `filter-allow-1key-leased` | 20,000 | 0.40 | 0.50 | 0.0100 | 198,000 (99.0%) | 2,000 | 50 |"
        ));
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
    fn numbers_are_formatted_for_reading() {
        assert_eq!(thousands(50931.4), "50,931");
        assert_eq!(thousands(204.0), "204");
        assert_eq!(thousands(1234567.0), "1,234,567");
        assert_eq!(sig3(0.0196), "0.0196");
        assert_eq!(sig3(0.123), "0.123");
        assert_eq!(sig3(1.5), "1.50");
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
}
