//! The busy-machine section: the shipped defaults while CPU-bound neighbours share the cores,
//! or under a CPU quota, with Redis healthy throughout.

use super::format::thousands;
use super::table::Table;
use super::{BusyRow, Report};

impl Report {
    pub fn busy_table(&self) -> String {
        let mut t = Table::new()
            .left("row")
            .left("what makes the machine busy")
            .right("span s")
            .right("hot: requests")
            .right("units passed")
            .right("allowance")
            .right("overshoot")
            .right("failed-open units")
            .right("fail-closed rule: requests")
            .right("503")
            .right("breaker trips")
            .right("timeouts")
            .right("worker lag ms")
            .right("throttled periods");
        for r in &self.busy {
            let Some(why) = &r.skipped else {
                t.row(cells(r));
                continue;
            };
            let mut row = vec![format!("`{}`", r.name), format!("not run: {why}")];
            row.extend(std::iter::repeat_n("–".to_string(), 12));
            t.row(row);
        }
        t.render()
    }

    pub(super) fn busy_text(&self) -> String {
        let Some(first) = self.busy.first() else {
            return String::new();
        };
        let mut r = format!(
            "{} replicas × {} workers × {} keep-alive connections (each Envoy with its own Webdis, one Redis, all healthy), the **shipped bridge timeout (150 ms) and breaker**. Two rules: a fail-open token bucket of {} units per second (burst {}) on one hot key, costs 1 to 5 in turn (half the connections); a fail-closed rule on 1,000 keys far below their limit (the other half). Every unit that passed counts, decided or let through by the failure policy: overshoot = units passed − ⌊allowance⌋ (a full bucket plus the refill over the span). Failed-open units: units that passed without rate-limit headers; 503: the fail-closed rule's requests the policy refused; timeouts: `ratelimit_bridge_timeouts`; worker lag: `ratelimit_worker_lag_ms`, how late the workers' timers fired (time the worker could not run, taken out of every request's timeout); throttled periods: CFS periods in which the quota stopped an Envoy. The goal is 0 in the overshoot, failed-open, 503 and breaker columns.\n\n",
            first.replicas,
            first.workers,
            first.conns_per_replica,
            first.hot_rate,
            first.hot_rate,
        );
        r += &self.busy_table();
        r
    }
}

fn cells(r: &BusyRow) -> Vec<String> {
    vec![
        format!("`{}`", r.name),
        r.how.clone(),
        format!("{:.2}", r.span_s),
        thousands(r.hot_requests as f64),
        thousands(r.hot_units as f64),
        format!("{:.0}", r.hot_allowance()),
        format!("**{}**", r.overshoot()),
        format!("**{}**", r.hot_failed_open_units),
        thousands(r.closed_requests as f64),
        format!("**{}**", r.closed_503),
        format!("**{}**", r.breaker_trips),
        r.bridge_timeouts.to_string(),
        thousands(r.worker_lag_ms as f64),
        r.throttled_periods.to_string(),
    ]
}
