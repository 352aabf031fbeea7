//! The accuracy sections: the closed-loop runs (with and without leases) and the 3× overload
//! timelines.

use super::format::thousands;
use super::table::Table;
use super::{steady_seconds, Accuracy, LeaseCounters, Report, Timeline};

/// A table whose first columns are every accuracy table's (see [`accuracy_cells`]).
fn accuracy_columns() -> Table {
    accuracy_columns_after(Table::new())
}

/// `t` with every accuracy table's columns added (a table that names its rows first).
pub(super) fn accuracy_columns_after(t: Table) -> Table {
    t.left("algorithm")
        .left("replicas × workers × connections")
        .left("load")
        .right("window s")
        .right("requests")
        .right("allowed")
        .right("allowance")
        .right("tolerance")
        .right("overshoot")
        .right("allowed / allowance")
        .right("fail-open")
}

/// An accuracy run's cells under [`accuracy_columns`], each table adding its own after them.
pub(super) fn accuracy_cells(a: &Accuracy) -> Vec<String> {
    let load = match a.offered_per_sec {
        Some(rate) => format!("paced, {} req/s", thousands(rate)),
        None => "closed loop, as fast as answered".into(),
    };
    vec![
        a.algorithm.clone(),
        format!("{} × {} × {}", a.replicas, a.workers, a.conns_per_replica),
        load,
        format!("{:.3}", a.window_s),
        thousands(a.sent as f64),
        thousands(a.let_through() as f64),
        format!("{:.1} ({})", a.allowance, a.formula),
        format!("{:.2}", a.tolerance()),
        format!("**{}**", a.overshoot()),
        format!("{:.4}", a.let_through() as f64 / a.allowance),
        a.fail_open.to_string(),
    ]
}

impl Report {
    pub fn accuracy_table(&self) -> String {
        let mut t = accuracy_columns().left("allowed per replica");
        for a in self.accuracy.iter().chain([&self.timeline.run]) {
            let mut cells = accuracy_cells(a);
            cells.push(super::format::joined(&a.allowed_per_replica));
            t.row(cells);
        }
        t.render()
    }

    pub(super) fn accuracy_text(&self) -> String {
        let a = self.accuracy.first().cloned().unwrap_or_default();
        let mut r = format!(
            "Replicas: Envoys with 1 worker each (and, in the rows with 2 workers, Envoys with `--concurrency 2`, whose two engines per replica batch and cache refusals independently), each with its own Webdis (as a sidecar would be), all sharing one Redis. Every connection sends `GET /` with the same API key, so all replicas spend one key's state. Capacity (burst) C = {}, rate R = {} per second (for the window algorithms: a limit of R per 1 s window). The Envoys hold one rule per algorithm, chosen by a request header, so every algorithm runs on the same processes, one after the other, each on a fresh key. The clients count every response (each connection waits for its answer, so nothing is in flight when the run ends) and the filter's counters are read from every replica; the larger of the two counts is used, and fail-open passes count as let through, so a bridge failure cannot hide an overshoot (the runs use the shipped bridge timeout, 150 ms, and breaker, on a machine shared by every process of the run; fail-open must be 0).\n\nThe window runs from the first request sent to the last response read, so it contains every decision instant, and the allowance over it is an upper bound of what an exact limiter allows. **Tolerance at the start and end instants:** the first decision came between the first request sent and the first response read, the last between the last request sent and the last response read; the tolerance column is how much smaller the allowance is over that shortest possible span (first response read to last request sent). An overshoot smaller than the tolerance could go unseen; a limiter that checks and then sets in separate commands lets racing requests spend the same unit, and with dozens of connections racing on one key all through the run its overshoot would grow with the run, far past the tolerance. Overshoot = `allowed − floor(allowance)` when positive. The window algorithms' allowances are their guarantees (fixed windows align to the Unix epoch; the sliding window counter is bounded here by its per-window count), so an overshoot would be a bug, not the algorithm's design.\n\n",
            a.capacity, a.rate_per_sec,
        );
        r += &self.accuracy_table();
        r
    }

    /// The leased accuracy runs and the leased overload run, one row each.
    pub fn accuracy_leased_table(&self) -> String {
        let mut t = accuracy_columns()
            .right("lease hits")
            .right("lease grants")
            .right("units returned");
        let overload = Some(&self.timeline_leased.run).filter(|a| a.sent > 0);
        for a in self.accuracy_leased.iter().chain(overload) {
            let mut cells = accuracy_cells(a);
            cells.extend([
                LeaseCounters::cell(a.lease.hits),
                LeaseCounters::cell(a.lease.grants),
                LeaseCounters::cell(a.lease.units_returned),
            ]);
            t.row(cells);
        }
        t.render()
    }

    pub(super) fn accuracy_leased_text(&self) -> String {
        let Some(a) = self.accuracy_leased.first() else {
            return String::new();
        };
        let mut r = format!(
            "The same measurement with leases on, on processes of its own (a fresh Redis, 4 Webdis, 4 Envoys with `--concurrency 2`: 8 engines, each holding its own leases): token bucket and GCRA, C = {}, R = {} per second, `lease` `{}`, `bridge.clock_skew` {} ms (one clock on this machine). Units are charged in Redis before a request spends them, so the overshoot must be 0; units one worker holds in a lease while another is refused lower allowed / allowance (target ≥ 0.97). The last row is the 3× overload run below.\n\n",
            a.capacity,
            a.rate_per_sec,
            a.lease_setting,
            a.clock_skew_ms.map_or("1000".into(), |v| v.to_string()),
        );
        r += &self.accuracy_leased_table();
        let overload = Some(&self.timeline_leased.run).filter(|a| a.sent > 0);
        if !self
            .accuracy_leased
            .iter()
            .chain(overload)
            .any(|a| a.lease.exported())
        {
            r += "\nThis filter build exports no lease counters, so it does not lease yet (the config parses, with no effect): these rows measure the unleased engine under the leased configuration.\n";
        }
        r
    }

    pub(super) fn timeline_text(&self) -> String {
        let t = &self.timeline;
        let mut r = format!(
            "{} replicas × {} connections offer {} req/s (3 × R) on one key for {:.0} s ({}, C = {}, R = {}/s). Allowed and denied per second, summed over the replicas:\n\n",
            t.run.replicas,
            t.run.conns_per_replica,
            thousands(t.run.offered_per_sec.unwrap_or(0.0)),
            t.run.duration_s,
            t.run.algorithm,
            t.run.capacity,
            t.run.rate_per_sec
        );
        r += &format!("![allowed and denied per second]({})\n\n", self.chart_file);
        let steady = steady_seconds(&t.per_second);
        if !steady.is_empty() {
            let min = steady.iter().min().copied().unwrap_or(0);
            let max = steady.iter().max().copied().unwrap_or(0);
            let mean = steady.iter().sum::<u64>() as f64 / steady.len() as f64;
            let (first_allowed, first_denied) = first_second(t);
            r += &format!(
                "First second: {first_allowed} allowed (the burst C plus a second of refill), {first_denied} denied. Whole seconds after it: {} allowed per second, mean {mean:.1}, for R = {}.\n",
                if min == max {
                    format!("exactly {min}")
                } else {
                    format!("{min} to {max}")
                },
                t.run.rate_per_sec
            );
        }
        r
    }

    pub(super) fn timeline_leased_text(&self) -> String {
        let t = &self.timeline_leased;
        if t.per_second.is_empty() {
            return String::new();
        }
        let mut r = format!(
            "The same overload with leases on: {} replicas × {} workers × {} connections offer {} req/s (3 × R) on one key for {:.0} s ({}, C = {}, R = {}/s; the Envoys of the leased accuracy rows).\n\n",
            t.run.replicas,
            t.run.workers,
            t.run.conns_per_replica,
            thousands(t.run.offered_per_sec.unwrap_or(0.0)),
            t.run.duration_s,
            t.run.algorithm,
            t.run.capacity,
            t.run.rate_per_sec
        );
        r += &format!(
            "![allowed and denied per second, leases on]({})\n\n",
            self.chart_file_leased
        );
        let steady = steady_seconds(&t.per_second);
        if steady.is_empty() {
            r += &format!(
                "The run is too short for whole seconds after the first (quick mode): {} allowed, overshoot **{}**, lease hits {}.\n",
                thousands(t.run.let_through() as f64),
                t.run.overshoot(),
                LeaseCounters::cell(t.run.lease.hits),
            );
        } else {
            let allowance = t.run.rate_per_sec;
            let mean = steady.iter().sum::<u64>() as f64 / steady.len() as f64;
            let (first_allowed, first_denied) = first_second(t);
            r += &format!(
                "First second: {first_allowed} allowed (the burst C plus a second of refill), {first_denied} denied. Allowed in each whole second after it, against an allowance of R = {} per second: {}; mean {:.1} ({:.3} of the allowance), from {} to {}. Over the whole run: {} allowed, overshoot **{}**, lease hits {}.\n",
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
}

/// Allowed and denied in the timeline's first second.
fn first_second(t: &Timeline) -> (u64, u64) {
    t.per_second.first().map_or((0, 0), |s| (s.0, s.1))
}
