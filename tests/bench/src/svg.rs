//! Line charts written as SVG text: allowed and denied requests per second (the overload run),
//! and requests per second with their p99 through a bridge outage (the outage timelines).

use std::fmt::Write as _;

const W: f64 = 760.0;
const H: f64 = 380.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

/// `per_second[i]` = (allowed, denied, failed) in second i. Dashed lines mark the limit's
/// rate and the offered load.
pub fn chart(title: &str, per_second: &[(u64, u64, u64)], rate: f64, offered: f64) -> String {
    let n = per_second.len().max(1);
    let top_value = per_second
        .iter()
        .map(|s| s.0.max(s.1) as f64)
        .fold(offered.max(rate), f64::max);
    let y_max = nice_ceiling(top_value * 1.1);
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    // Each second's count is drawn at the middle of that second.
    let x = |second: f64| LEFT + plot_w * second / n as f64;
    let y = |value: f64| TOP + plot_h * (1.0 - value / y_max);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        W / 2.0,
        escape(title)
    );
    // Horizontal grid and y labels.
    for i in 0..=5 {
        let value = y_max * i as f64 / 5.0;
        let yy = y(value);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e0e0e0"/>"##,
            W - RIGHT
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            yy + 4.0,
            value.round()
        );
    }
    // X ticks every second (or every few when long).
    let step = (n / 15).max(1);
    for second in (0..=n).step_by(step) {
        let xx = x(second as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#999"/>"##,
            TOP + plot_h,
            TOP + plot_h + 4.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{second}</text>"#,
            TOP + plot_h + 18.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since the load started</text>"#,
        LEFT + plot_w / 2.0,
        H - 22.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">requests per second</text>"#,
        TOP + plot_h / 2.0
    );
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>"##
    );
    // Reference lines.
    for (value, colour, label) in [
        (offered, "#888888", format!("offered {offered:.0}/s")),
        (rate, "#1f5fbf", format!("limit rate {rate}/s")),
    ] {
        let yy = y(value);
        let _ = writeln!(
            s,
            r#"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="{colour}" stroke-dasharray="6 4"/>"#,
            W - RIGHT
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="{colour}">{label}</text>"#,
            W - RIGHT - 4.0,
            yy - 4.0
        );
    }
    // The series.
    let series: [(&str, &str, Pick); 2] = [
        ("allowed", "#2a9d3a", |p| p.0),
        ("denied", "#d1495b", |p| p.1),
    ];
    for (i, (name, colour, pick)) in series.iter().enumerate() {
        let points: Vec<String> = per_second
            .iter()
            .enumerate()
            .map(|(sec, p)| format!("{:.1},{:.1}", x(sec as f64 + 0.5), y(pick(p) as f64)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2.5"/>"#,
            points.join(" ")
        );
        for point in &points {
            let (px, py) = point.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(s, r#"<circle cx="{px}" cy="{py}" r="3" fill="{colour}"/>"#);
        }
        let lx = LEFT + 10.0 + 110.0 * i as f64;
        let ly = H - 6.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="2.5"/><text x="{:.1}" y="{ly}">{name}</text>"#,
            ly - 4.0,
            lx + 24.0,
            ly - 4.0,
            lx + 30.0
        );
    }
    let failed: u64 = per_second.iter().map(|p| p.2).sum();
    if failed > 0 {
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#d1495b">{failed} failed exchanges</text>"##,
            W - RIGHT,
            H - 6.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// One slice of an outage timeline.
#[derive(Clone, Copy, Debug, Default)]
pub struct Slice {
    /// Requests answered in the slice, per second: allowed by a decision (with rate-limit
    /// headers), let through by the failure policy (without), and refused (429).
    pub allowed_per_s: f64,
    pub undecided_per_s: f64,
    pub refused_per_s: f64,
    /// 99th percentile of the time taken by the requests answered in the slice, ms.
    pub p99_ms: f64,
}

/// A panel of the outage chart: its top, its y maximum, its label, and its series (name,
/// colour, one value per slice).
type Panel<'a> = (f64, f64, &'a str, Vec<(&'a str, &'a str, Vec<f64>)>);

/// Two panels over time: requests per second (allowed, let through by policy; refusals, far
/// more numerous under overload, are left to the text) and their p99, with vertical lines at `marks` (seconds since the load started, label, colour)
/// and, if given, a dashed horizontal line at `bound` requests per second.
pub fn outage(
    title: &str,
    slices: &[Slice],
    slice_s: f64,
    marks: &[(f64, String, &str)],
    bound: Option<(f64, String)>,
) -> String {
    const PANEL: f64 = 200.0;
    const GAP: f64 = 50.0;
    let h = TOP + PANEL + GAP + PANEL + BOTTOM;
    let span = slices.len().max(1) as f64 * slice_s;
    let plot_w = W - LEFT - RIGHT;
    let x = |t: f64| LEFT + plot_w * t / span;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        W / 2.0,
        escape(title)
    );
    let rate_max = nice_ceiling(
        slices
            .iter()
            .map(|c| c.allowed_per_s.max(c.undecided_per_s))
            .fold(1.0, f64::max)
            * 1.1,
    );
    let p99_max = nice_ceiling(slices.iter().map(|c| c.p99_ms).fold(1.0, f64::max) * 1.1);
    let panels: [Panel; 2] = [
        (
            TOP,
            rate_max,
            "requests per second",
            vec![
                (
                    "allowed",
                    "#2a9d3a",
                    slices.iter().map(|c| c.allowed_per_s).collect(),
                ),
                (
                    "let through by policy",
                    "#e07b00",
                    slices.iter().map(|c| c.undecided_per_s).collect(),
                ),
            ],
        ),
        (
            TOP + PANEL + GAP,
            p99_max,
            "p99 ms",
            vec![("p99", "#6a3d9a", slices.iter().map(|c| c.p99_ms).collect())],
        ),
    ];
    for (top, max, label, series) in &panels {
        let y = |v: f64| top + PANEL * (1.0 - v / max);
        for i in 0..=4 {
            let value = max * i as f64 / 4.0;
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                y(value),
                W - RIGHT,
                y(value),
                LEFT - 6.0,
                y(value) + 4.0,
                value
            );
        }
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL}" fill="none" stroke="#999"/><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{label}</text>"##,
            top + PANEL / 2.0
        );
        for (i, (name, colour, values)) in series.iter().enumerate() {
            let points: Vec<String> = values
                .iter()
                .enumerate()
                .map(|(k, v)| format!("{:.1},{:.1}", x((k as f64 + 0.5) * slice_s), y(*v)))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/><text x="{:.1}" y="{:.1}" fill="{colour}">{name}</text>"#,
                points.join(" "),
                LEFT + 8.0 + 170.0 * i as f64,
                top + 14.0
            );
        }
        if let (Some((value, text)), "requests per second") = (&bound, *label) {
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#1f5fbf" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#1f5fbf">{}</text>"##,
                y(*value),
                W - RIGHT,
                y(*value),
                W - RIGHT - 4.0,
                y(*value) - 4.0,
                escape(text)
            );
        }
        for (t, mark, colour) in marks {
            let _ = writeln!(
                s,
                r#"<line x1="{:.1}" y1="{top}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-dasharray="4 3"/>"#,
                x(*t),
                x(*t),
                top + PANEL
            );
            if *label == "requests per second" {
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" fill="{colour}" font-size="10">{}</text>"#,
                    x(*t) + 3.0,
                    top + PANEL
                        - 6.0
                        - 12.0 * (marks.iter().position(|m| m.0 == *t).unwrap_or(0) % 4) as f64,
                    escape(mark)
                );
            }
        }
    }
    let ticks = span.ceil() as usize;
    for second in 0..=ticks {
        let xx = x(second as f64);
        let _ = writeln!(
            s,
            r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{second}</text>"#,
            h - BOTTOM + 18.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since the load started ({} ms slices)</text>"#,
        LEFT + plot_w / 2.0,
        h - 22.0,
        (slice_s * 1000.0).round()
    );
    s.push_str("</svg>\n");
    s
}

/// Picks one count out of (allowed, denied, failed).
type Pick = fn(&(u64, u64, u64)) -> u64;

/// 1, 2 or 5 times a power of ten, at least `v`.
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * power)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_is_svg_with_both_series() {
        let svg = chart("t <x>", &[(200, 100, 0), (100, 200, 0)], 100.0, 300.0);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t &lt;x&gt;"));
        assert_eq!(nice_ceiling(330.0), 500.0);
        assert_eq!(nice_ceiling(150.0), 200.0);
    }

    #[test]
    fn the_outage_chart_has_both_panels_and_the_marks() {
        let slice = Slice {
            allowed_per_s: 100.0,
            undecided_per_s: 5.0,
            refused_per_s: 0.0,
            p99_ms: 2.0,
        };
        let marks = vec![(1.0, "Webdis stopped".to_string(), "#000")];
        let svg = outage("o", &[slice; 20], 0.1, &marks, Some((50.0, "bound".into())));
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert_eq!(svg.matches("stroke-dasharray").count(), 3);
        assert!(svg.contains("Webdis stopped"));
    }
}
