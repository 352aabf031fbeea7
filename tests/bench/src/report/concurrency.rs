//! The concurrency row: requests of one key in flight at once, as the upstream saw them,
//! against a concurrency limit, under more clients than slots on several replicas.

use super::format::thousands;
use super::table::Table;
use super::{ConcurrencyAccuracy, Report};

impl Report {
    pub fn concurrency_table(&self) -> String {
        let mut t = Table::new()
            .left("row")
            .right("slots")
            .left("replicas × workers × clients")
            .right("window s")
            .right("requests")
            .right("answered")
            .right("refused")
            .right("failed")
            .right("answers/s")
            .right("most in flight")
            .right("overshoot")
            .right("release calls")
            .right("slots taken / released (Redis)")
            .right("slots left")
            .right("settlements lost")
            .right("fail-open");
        for c in self.concurrency.iter() {
            t.row([
                format!("`{}`", c.name),
                c.limit.to_string(),
                format!("{} × {} × {}", c.replicas, c.workers, c.conns_per_replica),
                format!("{:.3}", c.span_s),
                thousands(c.sent as f64),
                thousands(c.answered as f64),
                thousands(c.refused as f64),
                thousands(c.failed as f64),
                format!("{:.1}", c.answers_per_s()),
                c.peak_in_flight.to_string(),
                format!("**{}**", c.overshoot()),
                thousands(c.release_calls as f64),
                format!(
                    "{} / {}",
                    thousands(c.slots_taken as f64),
                    thousands(c.slots_released as f64)
                ),
                match c.drained_ms {
                    Some(ms) => format!("0 ({ms:.0} ms)"),
                    None => format!("**{}**", c.slots_left),
                },
                c.settlements_lost.to_string(),
                c.fail_open.to_string(),
            ]);
        }
        t.render()
    }

    pub(super) fn concurrency_text(&self) -> String {
        let Some(c) = &self.concurrency else {
            return "Not run.\n".into();
        };
        let mut r = format!(
            "Replicas: {} Envoys with {} workers each, each with its own Webdis, all sharing one Redis; every request a streamed chat completion (`POST /v1/chat/completions`, `\"stream\": true`) routed to the OpenAI-compatible test upstream, which runs in the bench process and answers each with {} events {} ms apart (`x-test-events`, `x-test-event-delay-ms`). One rule with one limit, `{{\"algorithm\": \"concurrency\", \"limit\": {}, \"max_duration\": \"{}s\"}}`, on the `x-api-key` header; one API key for the whole row. {} clients ({} keep-alive connections per replica), more than the slots, each sending its next request as soon as its last answer has been read to its end (a refusal too) for {:.1} s: slots are taken, released and raced for all the time. The upstream counts the requests it is answering (from the request read to the last byte of its answer written), the row's requests alone.\n\n",
            c.replicas,
            c.workers,
            c.events,
            c.event_delay_ms,
            c.limit,
            c.max_duration_s,
            c.clients(),
            c.conns_per_replica,
            c.duration_s,
        );
        r += &self.concurrency_table();
        r += "\n- **Most in flight**: the most requests of the key the upstream was answering at one instant over the run: every request that reached it counts, decided or let through by the failure policy. **Overshoot**: `most in flight − slots` when positive: **must be 0** (a slot is taken in Redis before the request goes upstream, and released only after its stream has ended).\n";
        r += "- **Answered / refused**: streams read whole with status 200 / answers 429 seen by the clients; failed: any other outcome (another status, a stream cut short, no answer). **Answers/s**: answered over the window (first request sent to last response read); at most slots ÷ an answer's length, less the time each slot spends between a stream's end and its release reaching Redis.\n";
        r += "- **Release calls**: the filter's `ratelimit_usage_settlement_calls` over the run, summed over the replicas: calls of their own carrying releases (a release rides on the worker's next decision call when one goes out, else goes at its next tick, packed with the others waiting, so a call may carry several). **Slots taken / released**: the script's `ZADD` and `ZREM` in Redis (`INFO commandstats`): one per admitted request, one per release carried out; the two should be equal, and equal to the answered streams when none failed.\n";
        r += &format!(
            "- **Slots left**: `ZCARD` of the key once every stream had ended, polled every 10 ms for up to 5 s: 0, with how long after the last answer was read it was 0; a number in bold is what was still held at the bound (a release lost: it would stay held until its `max_duration`, {} s). **Settlements lost**: the filter's `ratelimit_usage_settlements_lost` (goal 0). Fail-open must be 0.\n",
            c.max_duration_s
        );
        r
    }
}

/// The row's figures for results.json.
pub fn concurrency_json(c: &ConcurrencyAccuracy) -> serde_json::Value {
    serde_json::json!({
        "name": c.name, "limit": c.limit, "max_duration_s": c.max_duration_s,
        "events": c.events, "event_delay_ms": c.event_delay_ms,
        "replicas": c.replicas, "workers": c.workers, "conns_per_replica": c.conns_per_replica,
        "clients": c.clients(), "duration_s": c.duration_s, "span_s": c.span_s,
        "peak_in_flight": c.peak_in_flight, "overshoot": c.overshoot(),
        "sent": c.sent, "answered": c.answered, "refused": c.refused, "failed": c.failed,
        "answers_per_s": c.answers_per_s(),
        "fail_open": c.fail_open, "release_calls": c.release_calls,
        "settlements_lost": c.settlements_lost,
        "slots_taken": c.slots_taken, "slots_released": c.slots_released,
        "slots_left": c.slots_left, "drained_ms": c.drained_ms,
    })
}
