//! The smoke test of an Envoy version (`make compat` runs it with each supported Envoy through
//! $ENVOY_BIN; `make test` with the default one): the shipped envoy/envoy.yaml limits a key to
//! exactly its capacity, refuses the next request with 429 and the filter's default headers,
//! counts per rule and limit in /stats/prometheus under the shipped `stats_tags`, and fails open
//! within its timeout while Webdis hangs. Real Envoy, Webdis and Redis.

use std::time::{Duration, Instant};

use e2e::{get, wait_until, Envoy, Response, Stack};

/// What a request may take while Webdis hangs: the shipped 150 ms timeout plus the 1 s lag
/// allowance (a loaded machine's worker may run late), and as much again. A hung call that
/// Envoy never timed out would take forever.
const HUNG_DEADLINE: Duration = Duration::from_millis(2300);
/// The shipped rule and its limit (10 per minute).
const RULE: (&str, &str) = ("per_client", "per_minute");

fn decided(r: &Response) -> bool {
    r.header("x-ratelimit-limit").is_some()
}

/// The value of `metric` with labels rule and limit equal to [`RULE`] in /stats/prometheus.
fn per_rule(envoy: &Envoy, metric: &str) -> Option<f64> {
    let text = get(envoy.admin_port, "/stats/prometheus", &[])
        .expect("envoy admin /stats/prometheus")
        .text();
    let rule = format!("rule=\"{}\"", RULE.0);
    let limit = format!("limit=\"{}\"", RULE.1);
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(metric)?.strip_prefix('{')?;
        let (labels, value) = rest.split_once("} ")?;
        let labels: Vec<&str> = labels.split(',').collect();
        (labels.len() == 2 && labels.contains(&rule.as_str()) && labels.contains(&limit.as_str()))
            .then(|| value.trim().parse().ok())?
    })
}

/// Polls until `metric` for [`RULE`] is `want` (a count reaches the stats at the worker's next
/// tick, after the answer that it counts).
fn wait_per_rule(envoy: &Envoy, metric: &str, want: f64) {
    wait_until(
        metric,
        Duration::from_secs(10),
        || per_rule(envoy, metric),
        |v| *v == Some(want),
    );
}

#[test]
fn exact_limit_then_429_with_its_headers_and_per_rule_stats() {
    let s = Stack::start("smoke-limit", &[]);
    for i in 0..10 {
        let r = s.envoy.keyed("alice");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(r.header("x-ratelimit-limit"), Some("10"), "request {i}");
        let remaining = (9 - i).to_string();
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(remaining.as_str()),
            "request {i}"
        );
    }
    let r = s.envoy.keyed("alice");
    assert_eq!(r.status, 429);
    // One token every 6 s at 10 per minute; whole again in 60 s.
    assert_eq!(r.header("retry-after"), Some("6"));
    assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("60"));
    assert_eq!(r.text(), "rate limit exceeded\n");
    // The IETF headers are sent only when asked for (`headers`).
    assert_eq!(r.header("ratelimit"), None);
    assert_eq!(r.header("ratelimit-policy"), None);

    s.envoy.wait_counter("ratelimit_allowed", 10);
    s.envoy.wait_counter("ratelimit_denied", 1);
    wait_per_rule(&s.envoy, "ratelimit_rule_allowed", 10.0);
    wait_per_rule(&s.envoy, "ratelimit_rule_denied", 1.0);
    wait_per_rule(&s.envoy, "ratelimit_rule_failed_open", 0.0);
    assert_eq!(s.envoy.counter("ratelimit_bridge_errors"), 0);
}

#[test]
fn a_hung_bridge_fails_open_within_the_timeout() {
    let s = Stack::start("smoke-hung", &[]);
    // Starts from a decision: the script is loaded and the bridge answers.
    assert!(decided(&s.envoy.wait_deciding("warm-up")));
    s.webdis.process.pause();
    let failed_open = s.envoy.counter("ratelimit_failure_mode_open");
    let sent: u64 = 6;
    for n in 0..sent {
        let started = Instant::now();
        let r = s.envoy.keyed(format!("hung-{n}"));
        let took = started.elapsed();
        assert_eq!(r.status, 200, "request {n} while hung: {}", r.text());
        assert!(!decided(&r), "request {n} was decided while Webdis hangs");
        assert!(
            took < HUNG_DEADLINE,
            "request {n} took {took:?} while Webdis hangs"
        );
    }
    s.envoy
        .wait_counter("ratelimit_failure_mode_open", failed_open + sent);
    wait_per_rule(&s.envoy, "ratelimit_rule_failed_open", sent as f64);
    s.webdis.process.resume();
}
