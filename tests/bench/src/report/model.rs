//! The results of one bench run: what every runner fills in and every part of the report
//! reads. No formatting here.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::spread::{median, Spread};
use crate::wrk::WrkRun;

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
    "filter-allow-1key-overrides",
    "filter-allow-1key-claim",
    "filter-deny-hotkey",
    "filter-bridge-down",
    "filter-bridge-hung",
    "baseline-llm",
    "filter-pass-through-llm",
    "filter-llm-usage",
    "filter-llm-usage-stream",
    "baseline-serial",
    "filter-serial",
    "baseline-repeat",
];

/// Algorithms also measured with several Envoy workers per replica, whose engines (batches
/// and deny caches) race on one key.
/// The busy-machine rows, by name.
pub const BUSY_ROWS: &[&str] = &["busy-loops", "cpu-quota"];

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

/// The processes whose CPU each throughput run reads, as labelled in `Cost::cpu`.
pub const PROCESSES: &[&str] = &["envoy", "webdis", "redis"];

/// The scenarios the fleet capacity is derived from: every request decided by Redis (no
/// deny cache, no lease), and the two references for Envoy's side.
pub const CAPACITY_SCENARIOS: &[&str] = &[
    "baseline",
    "filter-pass-through",
    "filter-allow-1key",
    "filter-allow-10k-keys",
    "filter-allow-1key-overrides",
    "filter-llm-usage",
];

/// The allow scenarios with and without a lease, side by side in the leases table.
pub const LEASE_PAIRS: &[(&str, &str)] = &[
    ("filter-allow-1key", "filter-allow-1key-leased"),
    ("filter-allow-10k-keys", "filter-allow-10k-keys-leased"),
];

/// The allow scenario with overrides off and its twin with overrides on (none set): what
/// the lookup costs.
pub const OVERRIDE_PAIR: (&str, &str) = ("filter-allow-1key", "filter-allow-1key-overrides");

/// The allow scenario keyed on a header and its twin keyed on a JWT claim in metadata.
pub const CLAIM_PAIR: (&str, &str) = ("filter-allow-1key", "filter-allow-1key-claim");

/// The accuracy rows with an override (token bucket, overrides on): each row's name, and the
/// override's limit and burst as a multiple of the policy's.
pub const OVERRIDE_ROWS: &[(&str, f64)] = &[("override-raised", 2.0), ("override-lowered", 0.5)];

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
    /// The ratio over each round, with its range.
    pub spread: Spread,
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
        v.map(|n| super::format::thousands(n as f64))
            .unwrap_or_else(|| "–".into())
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

    /// Decisions Redis made (the rest came from the deny cache or from a lease).
    pub fn redis_decisions(&self) -> u64 {
        self.decisions()
            .saturating_sub(self.deny_cache_hits + self.lease.hits.unwrap_or(0))
    }

    /// CPU seconds process `label` used over the run; None when it was not read.
    pub fn cpu_of(&self, label: &str) -> Option<f64> {
        self.cpu.iter().find(|(l, _)| l == label)?.1
    }

    /// Requests one decision call carried, on average.
    pub fn mean_batch(&self) -> Option<f64> {
        (self.bridge_calls > 0).then(|| self.redis_decisions() as f64 / self.bridge_calls as f64)
    }

    pub fn redis_total(&self) -> u64 {
        self.redis_commands.values().sum()
    }

    /// Adds another run's counters and CPU to these (the same processes, in the same order).
    pub fn add(&mut self, other: &Cost) {
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.fail_open += other.fail_open;
        self.bridge_errors += other.bridge_errors;
        self.webdis_calls += other.webdis_calls;
        self.bridge_calls += other.bridge_calls;
        self.deny_cache_hits += other.deny_cache_hits;
        self.webdis_connect_fails += other.webdis_connect_fails;
        let opt = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        self.lease = LeaseCounters {
            hits: opt(self.lease.hits, other.lease.hits),
            grants: opt(self.lease.grants, other.lease.grants),
            units_returned: opt(self.lease.units_returned, other.lease.units_returned),
        };
        for (name, n) in &other.redis_commands {
            *self.redis_commands.entry(name.clone()).or_insert(0) += n;
        }
        // Keys in Redis after the last run.
        self.redis_keys = other.redis_keys;
        if self.cpu.is_empty() {
            self.cpu = other.cpu.clone();
        } else {
            for ((_, mine), (_, theirs)) in self.cpu.iter_mut().zip(&other.cpu) {
                *mine = match (*mine, theirs) {
                    (Some(a), Some(b)) => Some(a + b),
                    _ => None,
                };
            }
        }
        self.machine_busy_s = match (self.machine_busy_s, other.machine_busy_s) {
            (Some(a), Some(b)) => Some(a + b),
            (None, b) if self.wall_s == 0.0 => b,
            _ => None,
        };
        self.wall_s += other.wall_s;
    }
}

/// One wrk run of a throughput scenario, at its place in the run.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    /// The round it belongs to, from 0.
    pub round: usize,
    /// Its place in the sequence of every wrk run of the throughput section: the runs of
    /// another scenario nearest to it in this order are what it is compared with.
    pub seq: usize,
    pub run: WrkRun,
    pub cost: Cost,
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub what: String,
    /// The scenario whose req/s and latency this one is compared with.
    pub compare_to: String,
    pub load: String,
    /// Every measured run (one per round; the reference scenarios run several times a round).
    pub runs: Vec<Measured>,
    /// Over all runs: req/s the median of the rounds, latencies the median of the runs (the
    /// maximum: the largest), requests, durations and errors summed.
    pub run: WrkRun,
    /// Over all runs, summed.
    pub cost: Cost,
    /// Whether the filter is in the path (the cost columns apply).
    pub filter: bool,
}

impl Scenario {
    pub fn new(
        name: &str,
        what: &str,
        compare_to: &str,
        load: &str,
        filter: bool,
        runs: Vec<Measured>,
    ) -> Scenario {
        let of =
            |f: fn(&WrkRun) -> f64| median(&runs.iter().map(|m| f(&m.run)).collect::<Vec<_>>());
        let mut cost = Cost::default();
        for m in &runs {
            cost.add(&m.cost);
        }
        let mut s = Scenario {
            name: name.into(),
            what: what.into(),
            compare_to: compare_to.into(),
            load: load.into(),
            run: WrkRun {
                requests: runs.iter().map(|m| m.run.requests).sum(),
                duration_s: runs.iter().map(|m| m.run.duration_s).sum(),
                rps: 0.0,
                mean_ms: of(|r| r.mean_ms),
                p50_ms: of(|r| r.p50_ms),
                p90_ms: of(|r| r.p90_ms),
                p99_ms: of(|r| r.p99_ms),
                max_ms: runs.iter().map(|m| m.run.max_ms).fold(0.0, f64::max),
                non_2xx: runs.iter().map(|m| m.run.non_2xx).sum(),
                socket_errors: runs.iter().map(|m| m.run.socket_errors).sum(),
            },
            cost,
            filter,
            runs,
        };
        s.run.rps = s.rounds().median();
        s
    }

    /// Req/s per round, in round order (a round with several runs: their median).
    pub fn rounds(&self) -> Spread {
        let mut by_round: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        for m in &self.runs {
            by_round.entry(m.round).or_default().push(m.run.rps);
        }
        Spread::new(by_round.values().map(|v| median(v)).collect())
    }

    /// µs of CPU of process `label` per request wrk completed, by round.
    pub fn cpu_us_per_request_by_round(&self, label: &str) -> BTreeMap<usize, f64> {
        self.cpu_us_per(label, |m| m.run.requests)
    }

    /// µs of CPU of process `label` per request, per round, in round order.
    pub fn cpu_us_per_request(&self, label: &str) -> Spread {
        Spread::new(
            self.cpu_us_per_request_by_round(label)
                .into_values()
                .collect(),
        )
    }

    /// µs of CPU of process `label` per decision Redis made, per round: only the rounds in
    /// which Redis decided at least half the requests (none without the filter). Where the
    /// deny cache or leases answer most requests, the few decisions left each carry the
    /// process's background work and a clock tick's worth of rounding, and the figure per
    /// request is the one to read.
    pub fn cpu_us_per_decision(&self, label: &str) -> Spread {
        if !self.filter {
            return Spread::default();
        }
        let mut units: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
        for m in &self.runs {
            let (decided, requests) = units.entry(m.round).or_default();
            *decided += m.cost.redis_decisions();
            *requests += m.run.requests;
        }
        Spread::new(
            self.cpu_us_per(label, |m| m.cost.redis_decisions())
                .into_iter()
                .filter(|(round, _)| {
                    units
                        .get(round)
                        .is_some_and(|(decided, requests)| 2 * decided >= *requests)
                })
                .map(|(_, us)| us)
                .collect(),
        )
    }

    /// Per round, the CPU of `label` over the round's runs (a reference runs several times a
    /// round: all of them) divided by their units (`per`), in µs. A round with a run whose
    /// CPU was not read, or without a unit, is left out.
    fn cpu_us_per(&self, label: &str, per: fn(&Measured) -> u64) -> BTreeMap<usize, f64> {
        let mut by_round: BTreeMap<usize, (Option<f64>, u64)> = BTreeMap::new();
        for m in &self.runs {
            let (cpu, units) = by_round.entry(m.round).or_insert((Some(0.0), 0));
            *cpu = cpu.zip(m.cost.cpu_of(label)).map(|(a, b)| a + b);
            *units += per(m);
        }
        by_round
            .into_iter()
            .filter_map(|(round, (cpu, units))| {
                let cpu = cpu.filter(|_| units > 0)?;
                Some((round, cpu * 1e6 / units as f64))
            })
            .collect()
    }
}

/// Per round, each run of `s` set against the runs of `reference` nearest to it in the
/// run's order (the one before and the one after, their mean): (round, s's req/s, the
/// reference's). A run with no reference run on either side is left out.
pub fn against(s: &Scenario, reference: &Scenario) -> Vec<(usize, f64, f64)> {
    let mut refs: Vec<&Measured> = reference.runs.iter().collect();
    refs.sort_by_key(|m| m.seq);
    s.runs
        .iter()
        .filter_map(|m| {
            let before = refs.iter().rev().find(|r| r.seq < m.seq);
            let after = refs.iter().find(|r| r.seq > m.seq);
            let around: Vec<f64> = before.into_iter().chain(after).map(|r| r.run.rps).collect();
            let mean = around.iter().sum::<f64>() / around.len() as f64;
            (!around.is_empty() && mean > 0.0).then_some((m.round, m.run.rps, mean))
        })
        .collect()
}

/// `f(s's req/s, the reference's)` per run, the median of each round's, in round order.
pub fn per_round(pairs: &[(usize, f64, f64)], f: fn(f64, f64) -> f64) -> BTreeMap<usize, f64> {
    let mut by_round: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for &(round, x, r) in pairs {
        by_round.entry(round).or_default().push(f(x, r));
    }
    by_round.into_iter().map(|(k, v)| (k, median(&v))).collect()
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

/// An accuracy run on a key with an override: its allowance is the override's.
#[derive(Clone, Debug, Default)]
pub struct OverrideAccuracy {
    /// One of [`OVERRIDE_ROWS`].
    pub name: String,
    /// The limit as the config writes it (per 1 s, and its burst); the run's `capacity` and
    /// `rate_per_sec` are the override's.
    pub config_limit: u64,
    pub config_burst: u64,
    /// What the config's numbers would allow over the run's window: had the override been
    /// ignored, the run would be held to this.
    pub config_allowance: f64,
    /// Decisions Redis made under the override, and overrides it found malformed and ignored
    /// (`ratelimit_rule.<rule>.<limit>.overridden`, `.bad_override`, summed over the replicas).
    pub overridden: u64,
    pub bad_override: u64,
    pub run: Accuracy,
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
    pub slices: Vec<crate::svg::Slice>,
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

/// One setup under the same throughput load, over the rounds.
#[derive(Clone, Debug, Default)]
pub struct ClusterThroughput {
    pub setup: String,
    /// One wrk run per round.
    pub runs: Vec<WrkRun>,
    /// Over the runs: req/s and p99 their medians, requests summed.
    pub run: WrkRun,
    /// Summed over the runs.
    pub bridge_calls: u64,
    pub decided: u64,
    /// `EVALSHA` calls per Redis node (masters only), over the runs.
    pub per_node: Vec<(u16, u64)>,
}

impl ClusterThroughput {
    /// Req/s per round.
    pub fn rounds(&self) -> Spread {
        Spread::new(self.runs.iter().map(|r| r.rps).collect())
    }

    /// Adds one round's run, and sets the medians again.
    pub fn add(&mut self, round: ClusterThroughput) {
        self.bridge_calls += round.bridge_calls;
        self.decided += round.decided;
        for (node, n) in round.per_node {
            match self.per_node.iter_mut().find(|(m, _)| *m == node) {
                Some((_, total)) => *total += n,
                None => self.per_node.push((node, n)),
            }
        }
        self.runs.extend(round.runs);
        let of = |f: fn(&WrkRun) -> f64| median(&self.runs.iter().map(f).collect::<Vec<_>>());
        self.run = WrkRun {
            requests: self.runs.iter().map(|r| r.requests).sum(),
            duration_s: self.runs.iter().map(|r| r.duration_s).sum(),
            rps: of(|r| r.rps),
            mean_ms: of(|r| r.mean_ms),
            p50_ms: of(|r| r.p50_ms),
            p90_ms: of(|r| r.p90_ms),
            p99_ms: of(|r| r.p99_ms),
            max_ms: self.runs.iter().map(|r| r.max_ms).fold(0.0, f64::max),
            non_2xx: self.runs.iter().map(|r| r.non_2xx).sum(),
            socket_errors: self.runs.iter().map(|r| r.socket_errors).sum(),
        };
    }
}

/// A closed-loop accuracy run on the cluster, and how its calls spread over the masters.
#[derive(Clone, Debug, Default)]
pub struct ClusterAccuracy {
    pub shards: u64,
    pub run: Accuracy,
    pub per_node: Vec<(u16, u64)>,
}

#[derive(Clone, Debug, Default)]
pub struct ClusterSection {
    pub throughput: Vec<ClusterThroughput>,
    pub accuracy: Vec<ClusterAccuracy>,
    /// What `tests/sim/fleet.py --small` predicts for the measured cluster run (its JSON), if
    /// Python and the simulation ran.
    pub prediction: Option<Value>,
}

/// The accuracy rows of usage limits, each on a fresh key: (name, admit, fixed estimate).
/// The range of the usage answered is [`USAGE_RANGE`]; `reserve` rows with an estimate at its
/// top can never run into debt; `usage-estimate-too-low` shows what an estimate below the usage
/// costs.
pub const USAGE_ROWS: &[(&str, &str, u64)] = &[
    ("usage-reserve", "reserve", USAGE_RANGE.1),
    ("usage-estimate-too-low", "reserve", 500),
    ("usage-after", "after", USAGE_RANGE.1),
    (USAGE_STATUS_ROW, "reserve", 1),
    (USAGE_WEIGHTED_ROW, "reserve", WEIGHTED_TOP),
];

/// The usage row with weighted tokens: OpenAI's format, input ×[`WEIGHTS`]`.0`, output
/// ×[`WEIGHTS`]`.1`, in a bucket of [`WEIGHTED_ROW_UNITS`] an hour; the estimate is the
/// weighted top of the range (a quarter of the tokens input, the rest output).
pub const USAGE_WEIGHTED_ROW: &str = "usage-weighted";
pub const WEIGHTS: (u64, u64) = (1, 3);
pub const WEIGHTED_ROW_UNITS: u64 = 100_000;
pub const WEIGHTED_TOP: u64 =
    USAGE_RANGE.1 / 4 * WEIGHTS.0 + (USAGE_RANGE.1 - USAGE_RANGE.1 / 4) * WEIGHTS.1;

/// The usage row counted by status: every answer a 401, 1 unit each (failed logins), the
/// bucket [`STATUS_ROW_UNITS`] an hour.
pub const USAGE_STATUS_ROW: &str = "usage-status";
pub const STATUS_ROW_UNITS: u64 = 2_000;

/// The total tokens of each answer in the usage rows: uniform in this range, pseudo-random
/// per connection (the upstream's `x-test-usage-random`).
pub const USAGE_RANGE: (u64, u64) = (1, 2000);

/// One accuracy run of a usage limit: several replicas spending one key's token bucket with
/// answers of random usage.
#[derive(Clone, Debug, Default)]
pub struct UsageAccuracy {
    pub name: String,
    /// `reserve` or `after`.
    pub admit: String,
    pub estimate: u64,
    pub usage_range: (u64, u64),
    /// The token bucket: `tokens` (its burst, full at the start) refilled per `window_s`.
    pub tokens: u64,
    pub window_s: u64,
    pub replicas: usize,
    pub workers: u32,
    pub conns_per_replica: usize,
    pub duration_s: f64,
    /// From the first request sent to the last response read.
    pub span_s: f64,
    /// What an exact limiter may let be used over the span: tokens + refill × span.
    pub allowance: f64,
    /// The same over the shortest span the decisions may have taken.
    pub allowance_inner: f64,
    /// Tokens the upstream answered with (its log, for this row's key): the usage of the
    /// admitted requests.
    pub used: u64,
    /// Answers the upstream gave (requests admitted and sent upstream).
    pub answered: u64,
    pub sent: u64,
    pub admitted: u64,
    pub refused: u64,
    /// Exchanges that failed or had another status.
    pub failed: u64,
    pub fail_open: u64,
    /// The filter's counters over the run, summed over the replicas.
    pub settlements_lost: u64,
    pub debt: u64,
    pub given_back: u64,
    pub unread: u64,
}

impl UsageAccuracy {
    /// Tokens used beyond the allowance.
    pub fn overshoot(&self) -> u64 {
        self.used.saturating_sub(self.allowance.floor() as u64)
    }

    /// Tokens of the allowance no admitted request used, although requests kept coming (the
    /// load outlasts the budget, so each of them is a unit the limiter declined).
    pub fn under_admission(&self) -> u64 {
        (self.allowance.floor() as u64).saturating_sub(self.used)
    }

    /// The most that may be used beyond the allowance: `after`, every request in flight
    /// (one per connection) using the top of the range; `reserve`, each using the top of the
    /// range above its estimate (0 when the estimate covers it).
    pub fn overshoot_bound(&self) -> u64 {
        let in_flight = (self.replicas * self.conns_per_replica) as u64;
        let top = match self.name.as_str() {
            USAGE_STATUS_ROW => 1,
            USAGE_WEIGHTED_ROW => WEIGHTED_TOP,
            _ => self.usage_range.1,
        };
        let per_request = match self.admit.as_str() {
            "after" => top,
            _ => top.saturating_sub(self.estimate),
        };
        in_flight * per_request
    }
}

/// The accuracy row of a concurrency limit, by name (`--only concurrency`).
pub const CONCURRENCY_ROW: &str = "concurrency";

/// The accuracy row of a concurrency limit: clients on several replicas stream answers on one
/// key, more clients than slots; judged by the most requests of the key the upstream answered
/// at once.
#[derive(Clone, Debug, Default)]
pub struct ConcurrencyAccuracy {
    pub name: String,
    /// Requests of the key in flight at once, and how long a slot never released is held.
    pub limit: u64,
    pub max_duration_s: u64,
    /// Each answer: this many events, this far apart.
    pub events: u32,
    pub event_delay_ms: u64,
    pub replicas: usize,
    pub workers: u32,
    pub conns_per_replica: usize,
    pub duration_s: f64,
    /// From the first request sent to the last response read.
    pub span_s: f64,
    /// The most requests the upstream answered at once (every request that reached it,
    /// decided or let through by the failure policy).
    pub peak_in_flight: u64,
    pub sent: u64,
    /// Streams answered whole (200), refused (429), anything else (another status, a
    /// stream cut short, no answer).
    pub answered: u64,
    pub refused: u64,
    pub failed: u64,
    /// The filter's counters over the run, summed over the replicas.
    pub fail_open: u64,
    pub release_calls: u64,
    pub settlements_lost: u64,
    /// What Redis ran over the run: `ZADD` (a slot taken) and `ZREM` (a slot released) in
    /// the script, from `INFO commandstats`.
    pub slots_taken: u64,
    pub slots_released: u64,
    /// ZCARD of the key once every stream had ended, polled until 0 or a bound: its last
    /// value, and how long after the last stream ended it was 0 (None: not within the bound).
    pub slots_left: u64,
    pub drained_ms: Option<f64>,
}

impl ConcurrencyAccuracy {
    /// Requests in flight at once beyond the limit.
    pub fn overshoot(&self) -> u64 {
        self.peak_in_flight.saturating_sub(self.limit)
    }

    /// Streams answered per second of the span.
    pub fn answers_per_s(&self) -> f64 {
        if self.span_s > 0.0 {
            self.answered as f64 / self.span_s
        } else {
            0.0
        }
    }

    pub fn clients(&self) -> usize {
        self.replicas * self.conns_per_replica
    }
}

/// A busy-machine row: the mixed load of `e2e::busy::MixedLoad` on 2 replicas × 2 workers
/// with the shipped bridge timeout and breaker, beside CPU-bound neighbours or with each
/// Envoy under a CPU quota. Every unit that passed counts, decided or let through by the
/// failure policy.
#[derive(Clone, Debug, Default)]
pub struct BusyRow {
    /// `busy-loops` or `cpu-quota`.
    pub name: String,
    /// What made the machine busy.
    pub how: String,
    /// Why the row could not run here (no cgroup v1 cpu controller, not root), if it did not.
    pub skipped: Option<String>,
    pub replicas: usize,
    pub workers: u32,
    pub conns_per_replica: usize,
    /// From before the first request to after the last answer.
    pub span_s: f64,
    /// The hot key's rule: its rate (and burst) per second, requests, units passed (status
    /// 200, decided or not), units passed without a decision.
    pub hot_rate: u64,
    pub hot_requests: u64,
    pub hot_units: u64,
    pub hot_failed_open_units: u64,
    /// The fail-closed rule: requests, allowed, answered 503.
    pub closed_requests: u64,
    pub closed_allowed: u64,
    pub closed_503: u64,
    /// Answers other than 200, 429 and 503, and exchanges that got no answer.
    pub other: u64,
    /// The filters' counters over the run, summed over the replicas.
    pub failure_mode_open: u64,
    pub failure_mode_closed: u64,
    pub breaker_trips: u64,
    pub bridge_timeouts: u64,
    pub worker_lag_ms: u64,
    /// CPU quota: CFS periods in which the Envoys were throttled.
    pub throttled_periods: u64,
}

impl BusyRow {
    /// The most an exact limiter lets pass on the hot key over the run: a full bucket plus
    /// the refill over its span.
    pub fn hot_allowance(&self) -> f64 {
        self.hot_rate as f64 * (1.0 + self.span_s)
    }

    /// Hot units passed beyond the allowance.
    pub fn overshoot(&self) -> u64 {
        self.hot_units
            .saturating_sub(self.hot_allowance().floor() as u64)
    }
}
