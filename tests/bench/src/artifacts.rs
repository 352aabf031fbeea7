//! The files beside report.md: the charts and the per-second CSVs.

use std::path::Path;

use crate::report::Report;
use crate::svg;

/// Writes `text` to `path`; a bench that cannot write its output stops.
pub fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// The overload charts and CSVs, and the outage charts, of `r` into `out`.
pub fn charts(r: &Report, out: &Path) {
    let timelines = [
        (&r.timeline, &r.chart_file, "", "overload-per-second.csv"),
        (
            &r.timeline_leased,
            &r.chart_file_leased,
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
        write(&out.join(file), &svg);
        let csv: String = std::iter::once("second,allowed,denied,failed\n".to_string())
            .chain(
                t.per_second
                    .iter()
                    .enumerate()
                    .map(|(i, (a, d, f))| format!("{i},{a},{d},{f}\n")),
            )
            .collect();
        write(&out.join("raw").join(csv_file), &csv);
    }
    for o in r.outages.iter().filter(|o| !o.slices.is_empty()) {
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
        write(&out.join(&o.chart_file), &chart);
    }
}
