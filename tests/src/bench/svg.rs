//! A line chart of allowed and denied requests per second, written as SVG text.

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
}
