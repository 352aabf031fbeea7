//! A key read from a JWT claim in dynamic metadata against the same key read from a header:
//! what keying on what Envoy verified costs Envoy.

use serde_json::{json, Value};

use super::table::Table;
use super::throughput::us_cell;
use super::{Report, CLAIM_PAIR};
use crate::spread::Spread;

/// The most Envoy CPU per request a key from a claim may cost over one from a header, in µs
/// (the median of the rounds' differences).
pub const CLAIM_OVER_HEADER_TARGET_US: f64 = 5.0;

impl Report {
    /// Per round, the claim scenario's Envoy µs per request less the header scenario's.
    pub fn claim_over_header_us(&self) -> Option<Spread> {
        let (header, claim) = CLAIM_PAIR;
        let (h, c) = (self.scenario(header)?, self.scenario(claim)?);
        let h = h.cpu_us_per_request_by_round("envoy");
        let rounds: Vec<f64> = c
            .cpu_us_per_request_by_round("envoy")
            .iter()
            .filter_map(|(round, us)| h.get(round).map(|base| us - base))
            .collect();
        (!rounds.is_empty()).then(|| Spread::new(rounds))
    }

    pub(super) fn claim_cost_text(&self) -> String {
        let (header, claim) = CLAIM_PAIR;
        if self.scenario(claim).is_none() {
            return "Not run.\n".into();
        }
        let mut r = format!(
            "`{claim}` runs the rule and load of `{header}` keyed on `metadata:envoy.filters.http.jwt_authn:jwt_payload:sub` instead of the `x-api-key` header, on an Envoy of its own where a `set_metadata` filter before the rate limiter puts that claim into every request's dynamic metadata, as `jwt_authn` with `payload_in_metadata` does once it has verified a token (the token's verification is `jwt_authn`'s cost, not measured here).\n\n"
        );
        let mut t = Table::new()
            .left("scenario")
            .right("CPU µs / req: Envoy")
            .right("Webdis")
            .right("Redis");
        for name in [header, claim] {
            let Some(s) = self.scenario(name) else {
                continue;
            };
            let cpu = |label: &str| us_cell(&s.cpu_us_per_request(label));
            t.row([
                format!("`{name}`"),
                cpu("envoy"),
                cpu("webdis"),
                cpu("redis"),
            ]);
        }
        r += &t.render();
        if let Some(spread) = self.claim_over_header_us() {
            r += &format!(
                "\nEnvoy µs per request keyed on the claim less keyed on the header, per round: **{}**, rounds {} (target: at most +{CLAIM_OVER_HEADER_TARGET_US} µs, the median).\n",
                us_cell(&spread),
                spread
                    .rounds
                    .iter()
                    .map(|v| format!("{v:+.1}"))
                    .collect::<Vec<_>>()
                    .join(" / ")
            );
        }
        r
    }

    pub(super) fn claim_over_header_json(&self) -> Value {
        match self.claim_over_header_us() {
            Some(spread) => {
                let mut v = spread.json();
                v["scenario"] = json!(CLAIM_PAIR.1);
                v["over"] = json!(CLAIM_PAIR.0);
                v["how"] =
                    json!("per round, Envoy µs of CPU per request of the first less the second");
                v["target_us"] = json!(CLAIM_OVER_HEADER_TARGET_US);
                v
            }
            None => Value::Null,
        }
    }
}
