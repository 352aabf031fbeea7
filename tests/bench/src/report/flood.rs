//! Key floods, with and without a key budget, side by side.

use super::format::thousands;
use super::table::Table;
use super::Report;

impl Report {
    pub(super) fn flood_text(&self) -> String {
        let mib = |b: u64| format!("{:.1}", b as f64 / 1_048_576.0);
        let mut t = Table::new()
            .left("key budget")
            .right("addresses")
            .right("seconds")
            .right("req/s")
            .right("allowed")
            .right("refused")
            .right("over budget")
            .right("Redis keys after")
            .left("Redis used_memory MiB before → after")
            .left("Envoy RSS MiB before → after")
            .left("Webdis RSS MiB before → after");
        for f in &self.floods {
            t.row([
                f.budget
                    .as_deref()
                    .map_or("none".to_string(), |b| format!("`{b}`")),
                thousands(f.addresses as f64),
                format!("{:.1}", f.seconds),
                thousands(f.addresses as f64 / f.seconds.max(1e-9)),
                thousands(f.allowed as f64),
                thousands(f.denied as f64),
                thousands(f.budget_exceeded as f64),
                thousands(f.keys_after as f64),
                format!("{} → {}", mib(f.redis_memory.0), mib(f.redis_memory.1)),
                format!("{} → {}", mib(f.envoy_rss.0), mib(f.envoy_rss.1)),
                format!("{} → {}", mib(f.webdis_rss.0), mib(f.webdis_rss.1)),
            ]);
        }
        let mut r = String::from(
            "One Envoy (1 worker), a per-IP rule (`xff_trusted_hops: 1`, token bucket 10 per minute), each request from a new address in `X-Forwarded-For`, 32 keep-alive connections.\n\n",
        );
        r += &t.render();
        if self.floods.iter().any(|f| f.lost > 0) {
            let lost: u64 = self.floods.iter().map(|f| f.lost).sum();
            r += &format!("\n{lost} flood requests got no answer.\n");
        }
        r
    }
}
