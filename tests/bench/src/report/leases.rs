//! The Leases section: why the leased scenarios' limit, the allow scenarios with and without
//! a lease side by side, and leased over unleased per round.

use super::format::thousands;
use super::table::Table;
use super::{LeaseCounters, Report, Scenario, LEASE_PAIRS, UNLEASED_ALLOW_RATE};

/// The least leased / unleased throughput the 10,000-key pair should show: leases on must
/// not make a workload whose keys rarely hold a lease slower than the bench's spread.
pub const LEASED_OVER_UNLEASED_TARGET: f64 = 0.90;

impl Report {
    /// What the leased scenario's counters say: how many requests a lease served.
    pub(super) fn lease_note(s: &Scenario) -> String {
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
        let lease = p.lease.unwrap_or(crate::config::Lease::DEFAULT);
        let mut r = String::new();
        let per_key = self
            .scenario("filter-allow-10k-keys-leased")
            .map(|s| s.run.rps / 10_000.0);
        let one_key = self
            .scenario("filter-allow-1key-leased")
            .map_or(0.0, |s| s.run.rps);
        r += &format!(
            "`filter-allow-1key-leased` and `filter-allow-10k-keys-leased` run the loads of `filter-allow-1key` and `filter-allow-10k-keys` against one Envoy (1 worker) whose rule is a {} with `limit` {} per 1 s, `burst` {} and `lease` {{`max_units` {}, `fraction` {}, `max_ms` {}}}, and `bridge.clock_skew` {} ms (every replica here shares one clock; the default 1 s would end at once every lease on a bucket that is full again within a second).\n\n",
            p.algorithm,
            p.rate_per_sec,
            thousands(p.capacity as f64),
            lease.max_units,
            lease.fraction,
            lease.max_ms,
            p.clock_skew_ms.map_or("1000".to_string(), |v| v.to_string()),
        );
        r += &format!(
            "Why this limit: every request of the run must still be allowed (a run spends far less than the burst), and the bucket must not be full. A lease lasts until the earlier of `max_ms` and the instant the bucket in Redis would be full again (minus the clock skew), so leases pay off only where an identity spends faster than its limit refills: here the one key spends about {} units per second and each of the 10,000 keys about {} per second, against a refill of {} per second, and even a lease's own {} units take {} s to refill, longer than `max_ms`. A key earns a lease once it came 4 times within `max_ms` on the worker: the one hot key at once, and then nearly every one of its requests is served from a lease; each of the 10,000 keys, back about every half second or more, rarely or never, so its requests stay plain decisions, as with leases off. With a bucket that refills faster than it is spent (for example the unleased scenarios' {} per second, which refill a lease of {} units in {} ms), every lease ends almost at once, each request takes a new one, and the leased scenario costs like the unleased one.\n\n",
            thousands(one_key),
            per_key.map_or("?".to_string(), |v| format!("{v:.1}")),
            p.rate_per_sec,
            lease.max_units,
            thousands(lease.max_units as f64 / p.rate_per_sec.max(f64::MIN_POSITIVE)),
            thousands(UNLEASED_ALLOW_RATE),
            lease.max_units,
            lease.max_units as f64 / UNLEASED_ALLOW_RATE * 1000.0,
        );
        let mut t = Table::new()
            .left("scenario")
            .right("req/s")
            .right("× baseline")
            .right("× filter-pass-through")
            .right("bridge calls / request")
            .right("lease hits")
            .right("lease grants")
            .right("units returned");
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
            t.row([
                format!("`{}`", s.name),
                thousands(s.run.rps),
                self.ratio(s).map_or("–".to_string(), |v| v.cell()),
                self.pass_through_ratio(s)
                    .map_or("–".to_string(), |v| v.cell()),
                format!(
                    "{:.4}",
                    s.cost.bridge_calls as f64 / s.run.requests.max(1) as f64
                ),
                hits,
                LeaseCounters::cell(s.cost.lease.grants),
                LeaseCounters::cell(s.cost.lease.units_returned),
            ]);
        }
        r += &t.render();
        r += "\nBridge calls: `ratelimit_bridge_calls` (decision calls) over the requests wrk completed, all rounds. Lease hits (requests allowed from a lease, with no call; in % of the requests), grants and units returned: `ratelimit_lease_hits`, `ratelimit_lease_grants`, `ratelimit_lease_units_returned`; – where the filter does not export them.\n";
        r += &self.leased_over_unleased_text();
        if let Some(leased) = self.scenario("filter-allow-1key-leased") {
            if !leased.cost.lease.exported() {
                r += &format!("\n{}\n", Report::lease_note(leased));
            }
        }
        r
    }

    /// Each leased scenario over its unleased twin, per round.
    fn leased_over_unleased_text(&self) -> String {
        let mut t = Table::new()
            .left("leased")
            .left("over")
            .right("median (lowest–highest round)")
            .right("per round");
        for (unleased, leased) in LEASE_PAIRS {
            if let Some(spread) = self.pair_ratio(leased, unleased) {
                t.row([
                    format!("`{leased}`"),
                    format!("`{unleased}`"),
                    spread.cell(),
                    spread
                        .rounds
                        .iter()
                        .map(|v| format!("{v:.2}"))
                        .collect::<Vec<_>>()
                        .join(" / "),
                ]);
            }
        }
        if t.len() == 0 {
            return String::new();
        }
        format!(
            "\nLeased over unleased, per round: each scenario's req/s over the `filter-pass-through` runs around it, the leased one over the unleased one (so a slowdown between the two cancels). Leases on should cost a workload whose keys rarely hold a lease nothing beyond the bench's spread: the 10,000-key pair should stay at or above {LEASED_OVER_UNLEASED_TARGET:.2}.\n\n{}",
            t.render()
        )
    }
}
