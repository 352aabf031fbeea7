//! A bridge outage under steady load, one subsection per failure mode.

use super::format::thousands;
use super::Outage;

pub(super) fn outage_text(o: &Outage) -> String {
    let ms = |v: Option<f64>| v.map_or_else(|| "not seen".into(), |v| format!("{v:.1} ms"));
    let s = |v: Option<f64>| v.map_or_else(|| "not seen".into(), |v| format!("{v:.2} s"));
    let limit = if o.failure_mode == "local" {
        "one key far over its limit (100 per second, burst 100; `local_share` 1/8)"
    } else {
        "a limit never reached"
    };
    let mut r = format!(
        "### Failure mode `{}`\n\nOne Envoy (1 worker), the shipped bridge timeout (150 ms) and breaker (5 failures in a row, or a call without an answer for its timeout while requests wait; a probe per 500 ms), {limit}; {} keep-alive connections as fast as answered. Webdis is stopped (SIGSTOP) at {:.2} s and resumed (SIGCONT) at {:.2} s.\n\n",
        o.failure_mode, o.connections, o.stop_s, o.resume_s
    );
    r += &format!(
        "![requests per second and p99 through the outage]({})\n\n",
        o.chart_file
    );
    r += &format!(
        "- From the stop to the first request let through without waiting: **{}**; the breaker opened at {} (since the load started).\n",
        ms(o.first_fast_after_stop_ms),
        s(o.breaker_open_s)
    );
    r += &format!(
        "- While open, the slowest request took {:.1} ms (the timeout is 150 ms).\n",
        o.slowest_while_open_ms
    );
    r += &format!(
        "- From the resume to the first decided request: **{}**; every breaker was closed again at {}.\n",
        ms(o.first_decided_after_resume_ms),
        s(o.breaker_closed_s)
    );
    let refused: f64 = o.slices.iter().map(|c| c.refused_per_s * o.slice_s).sum();
    r += &format!(
        "- {} requests answered 200 or 429 ({} of them 429), {} failed or answered otherwise.\n",
        thousands(o.answered as f64),
        thousands(refused),
        o.failed
    );
    if let Some(bound) = o.local_bound_per_s {
        r += &format!(
            "- Allowed per whole second while Webdis was out: {} (bound: limit × local_share × workers × replicas = {bound:.1} per second; the first of these seconds may add the local burst, 100 × local_share = 12.5).\n",
            o.allowed_per_s_while_out
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    r
}
