//! The usage rows: usage-metered limits (LLM tokens) under load from several replicas, the
//! tokens used against the allowance.

use super::format::thousands;
use super::table::Table;
use super::{
    Report, UsageAccuracy, STATUS_ROW_UNITS, USAGE_STATUS_ROW, USAGE_WEIGHTED_ROW,
    WEIGHTED_ROW_UNITS, WEIGHTS,
};

impl Report {
    pub fn usage_table(&self) -> String {
        let mut t = Table::new()
            .left("row")
            .left("admit")
            .right("estimate")
            .left("replicas × workers × connections")
            .right("window s")
            .right("requests")
            .right("admitted")
            .right("refused")
            .right("failed")
            .right("tokens used")
            .right("allowance")
            .right("overshoot")
            .right("overshoot bound")
            .right("under-admission")
            .right("debt charged (reserve)")
            .right("settlements lost")
            .right("fail-open");
        for u in &self.usage {
            t.row([
                format!("`{}`", u.name),
                u.admit.clone(),
                thousands(u.estimate as f64),
                format!("{} × {} × {}", u.replicas, u.workers, u.conns_per_replica),
                format!("{:.3}", u.span_s),
                thousands(u.sent as f64),
                thousands(u.admitted as f64),
                thousands(u.refused as f64),
                thousands(u.failed as f64),
                thousands(u.used as f64),
                format!("{:.1}", u.allowance),
                format!("**{}**", thousands(u.overshoot() as f64)),
                thousands(u.overshoot_bound() as f64),
                thousands(u.under_admission() as f64),
                thousands(u.debt as f64),
                u.settlements_lost.to_string(),
                u.fail_open.to_string(),
            ]);
        }
        t.render()
    }

    pub(super) fn usage_text(&self) -> String {
        let Some(u) = self.usage.first() else {
            return "Not run.\n".into();
        };
        let mut r = format!(
            "Replicas: Envoys with {} workers each, each with its own Webdis, all sharing one Redis; every request a chat completion (`POST /v1/chat/completions`, a small JSON body) routed to the OpenAI-compatible test upstream, which runs in the bench process and answers each with a total usage drawn uniformly from {}–{} tokens (`x-test-usage-random`, a seed per connection), read by the filter from `usage.total_tokens` of the JSON body. One API key per row, one rule per row (picked by a request header) with a request limit nothing reaches and a token bucket of {} tokens refilled over {} s (about {:.1} a second), full at the start; the estimate is fixed, charged up front by `reserve` and given back or charged as debt when the usage is read; `after` admits while a token is left and charges the usage when read. Each connection sends its next request when the last is answered, far faster than the bucket refills, so the budget runs out early in each run and the rest is refused.\n\n",
            u.workers,
            thousands(u.usage_range.0 as f64),
            thousands(u.usage_range.1 as f64),
            thousands(u.tokens as f64),
            u.window_s,
            u.tokens as f64 / u.window_s as f64,
        );
        r += &self.usage_table();
        r += "\n- **Tokens used**: the sum of the usage the upstream answered to the row's key (its own log): the tokens of the admitted requests, whatever the filter read or settled.\n";
        r += "- **Allowance**: what an exact limiter lets be used over the window (first request sent to last response read): the bucket plus its refill over the window, C + R × window. The refill over the shortest span the decisions may have taken is less by a few tokens at most.\n";
        r += "- **Overshoot**: `tokens used − floor(allowance)` when positive. The goal of `reserve` with an estimate at the top of the range is 0: every admitted request held its largest possible usage before it went upstream. **Overshoot bound**: `after`, the requests in flight (one per connection) × the top of the range; `reserve`, the requests in flight × (top of the range − estimate), 0 when the estimate covers every usage. A `reserve` row whose estimate is below some usages runs into debt: the debt column is the filter's `usage_debt` counter: tokens charged above a reservation (an `after` request reserves nothing, so its whole usage is charged when read and counts as none).\n";
        r += "- **Under-admission**: `floor(allowance) − tokens used` when positive: tokens of the allowance that no admitted request used by the end of the run, although requests kept coming and were refused. With `reserve` it is the balance left when the next reservation no longer fits (less than one estimate), plus the give-backs of the requests still in flight at the end.\n";
        r += &format!("- **`{USAGE_STATUS_ROW}`**: the same load with every answer a 401 (failed logins), counted by status (`\"from\": \"status:401\"`): each request holds 1 unit while it runs and its 401 keeps it, so a unit is used per answer, in a bucket of {} an hour; its tokens used are the upstream's answers, its admitted the 401s. Overshoot goal 0 with bound 0: every attempt let through held its unit first.\n", thousands(STATUS_ROW_UNITS as f64));
        r += &format!("- **`{USAGE_WEIGHTED_ROW}`**: the same load read in OpenAI's format with weights, input ×{} and output ×{} (a quarter of each answer's tokens is input), in a bucket of {} units an hour; its tokens used are the upstream's input and output tokens at those weights, its estimate the weighted top of the range. Overshoot goal 0 with bound 0.\n", WEIGHTS.0, WEIGHTS.1, thousands(WEIGHTED_ROW_UNITS as f64));
        r += "- **Admitted / refused**: responses 200 / 429 seen by the clients; failed: any other outcome. **Settlements lost**: the filter's `ratelimit_usage_settlements_lost` over the run, summed over the replicas (goal 0). Fail-open must be 0 (the shipped bridge timeout and breaker).\n";
        r
    }
}

/// A row's figures for results.json.
pub fn usage_json(u: &UsageAccuracy) -> serde_json::Value {
    serde_json::json!({
        "name": u.name, "admit": u.admit, "estimate": u.estimate,
        "usage_range": [u.usage_range.0, u.usage_range.1],
        "tokens": u.tokens, "window_s": u.window_s,
        "replicas": u.replicas, "workers": u.workers, "conns_per_replica": u.conns_per_replica,
        "duration_s": u.duration_s, "span_s": u.span_s,
        "allowance": u.allowance, "allowance_inner": u.allowance_inner,
        "used": u.used, "answered": u.answered,
        "overshoot": u.overshoot(), "overshoot_bound": u.overshoot_bound(),
        "under_admission": u.under_admission(),
        "sent": u.sent, "admitted": u.admitted, "refused": u.refused, "failed": u.failed,
        "fail_open": u.fail_open, "settlements_lost": u.settlements_lost,
        "debt": u.debt, "given_back": u.given_back, "unread": u.unread,
    })
}
