//! The metrics as an operator sees them: a real Prometheus scrapes a real Envoy running the
//! filter (with the shipped `stats_tags` and the shipped alert rules), while the test sends
//! allowed and refused requests and then takes the bridge down. What Prometheus holds must
//! match what was sent, per rule and limit, and the failure alerts must fire.

use std::time::{Duration, Instant};

use e2e::procs::filter_config_edit;
use e2e::prometheus::JOB;
use e2e::{wait_until, Prometheus, Stack};

/// Polls Prometheus until `promql` gives exactly `want` (the scrape runs every second).
fn wait_value(prom: &Prometheus, promql: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = prom.query(promql);
        if got.len() == 1 && got[0].1 == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{promql}: want {want}, Prometheus has {got:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn prometheus_sees_the_per_rule_counters_and_the_failure_alerts() {
    let json = r#"{"bridge": {"username": "ratelimit", "password": "ratelimit-demo-secret"},
"failure_mode": "open",
"rules": [{"name": "api", "key": {"from": ["header:x-api-key"]},
  "limits": [{"name": "per_minute", "limit": 5, "window": "1m"}]}]}"#;
    let (from, to) = filter_config_edit(json);
    let mut s = Stack::start("scrape", &[(&from, &to)]);
    // The shipped rules with every `for:` at 0 s, so an alert fires on its first true
    // evaluation instead of minutes later.
    let rules = Prometheus::rules_with_for(&s.dir, "0s");
    let prom = Prometheus::start(&s.dir, &[s.envoy.admin_port], &rules);
    prom.wait_scraped(Duration::from_secs(30));
    // A scrape of the counters at 0 before any traffic: rate() sees all of it.
    wait_value(&prom, "ratelimit_allowed", 0.0);

    let statuses: Vec<u16> = (0..8).map(|_| s.envoy.keyed("alice").status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    assert_eq!(s.envoy.keyed("bob").status, 200);
    assert_eq!(s.envoy.keyed("bob").status, 200);

    // The bridge goes away: new clients are let through by the failure policy. Enough of them
    // that every worker's breaker sees its 5 failures in a row, however Envoy spreads them.
    s.webdis.process.stop();
    for n in 0..20 {
        assert_eq!(
            s.envoy.keyed(format!("carol-{n}")).status,
            200,
            "failing open"
        );
    }

    let per_limit = r#"{rule="api",limit="per_minute"}"#;
    wait_value(&prom, &format!("ratelimit_rule_allowed{per_limit}"), 7.0);
    wait_value(&prom, &format!("ratelimit_rule_denied{per_limit}"), 3.0);
    wait_value(
        &prom,
        &format!("ratelimit_rule_failed_open{per_limit}"),
        20.0,
    );
    wait_value(
        &prom,
        &format!("ratelimit_rule_failed_closed{per_limit}"),
        0.0,
    );
    wait_value(
        &prom,
        r#"ratelimit_rule_key_budget_exceeded{rule="api"}"#,
        0.0,
    );
    // Why the policy decided, per rule: Webdis refused (down) until a breaker opened, then no
    // call was made; nothing timed out.
    let cause = |name: &str| format!(r#"ratelimit_rule_{name}{{rule="api"}}"#);
    wait_until(
        "the 20 failures counted by cause",
        Duration::from_secs(60),
        || {
            let value = |name: &str| match prom.query(&cause(name)).as_slice() {
                [(_, v)] => *v,
                _ => -1.0,
            };
            (value("bridge_error"), value("breaker_open"))
        },
        |(errors, open)| *errors >= 5.0 && errors + open == 20.0,
    );
    wait_value(&prom, &cause("timed_out"), 0.0);
    wait_value(&prom, "ratelimit_allowed", 7.0);
    wait_value(&prom, "ratelimit_denied", 3.0);
    wait_value(&prom, "ratelimit_failure_mode_open", 20.0);
    wait_value(&prom, "ratelimit_failure_mode_closed", 0.0);

    let labels = prom.wait_alert("RateLimiterFailingOpen", "firing", Duration::from_secs(60));
    assert_eq!(labels.get("job").map(String::as_str), Some(JOB));
    prom.wait_alert("RateLimiterBreakerOpen", "firing", Duration::from_secs(60));
    // 3 refused of 10 decided is under the deny-rate threshold, nothing failed closed, and an
    // outage is no misconfiguration.
    wait_value(&prom, "ratelimit_misconfigured_bridge_auth", 0.0);
    let alerts = prom.alerts();
    for quiet in [
        "RateLimiterBridgeMisconfigured",
        "RateLimiterFailingClosed",
        "RateLimiterDenyRateHigh",
        "RateLimiterKeyBudgetExceeded",
        "RateLimiterUsageSettlementsLost",
    ] {
        assert!(
            alerts.iter().all(|(name, _, _)| name != quiet),
            "{quiet} should not fire: {alerts:?}"
        );
    }
}
