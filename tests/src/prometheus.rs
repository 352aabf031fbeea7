//! A real Prometheus for the tests: scrapes Envoys' `/stats/prometheus` every second, evaluates
//! a rules file (the shipped `envoy/prometheus/rules.yml`, or a copy with shorter `for:`), and
//! answers instant queries and the alerts list through its HTTP API. Started on a free port with
//! its config and data in the test's WorkDir, stopped by PID when dropped.
//!
//! Counters and gauges show at the next scrape; Envoy's histograms (`ratelimit_decision_ms`,
//! `ratelimit_batch_size`) change in `/stats/prometheus` only at its stats flush (every 5 s by
//! default), so poll for them rather than expecting them after one scrape.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::http::get;
use crate::procs::{Process, WorkDir};
use crate::{free_port, root, wait_for};

/// Labels of one series or alert, sorted by name.
pub type Labels = BTreeMap<String, String>;

/// Scrape and rule-evaluation interval: short, so a test sees a change within seconds.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// The scrape job's name: the `job` label of every scraped series.
pub const JOB: &str = "envoy";

const START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Prometheus {
    pub port: u16,
    pub process: Process,
    pub config_path: PathBuf,
    /// The scrape targets, `127.0.0.1:PORT`, as in the `instance` label.
    pub targets: Vec<String>,
}

impl Prometheus {
    /// The rules Prometheus users get: envoy/prometheus/rules.yml.
    pub fn shipped_rules() -> PathBuf {
        root().join("envoy/prometheus/rules.yml")
    }

    /// A copy of the shipped rules in `dir` with every alert's `for:` set to `duration`
    /// (e.g. `"0s"`): the shipped ones are minutes long, longer than a test should wait to
    /// see an alert fire. Expressions and thresholds stay as shipped.
    pub fn rules_with_for(dir: &WorkDir, duration: &str) -> PathBuf {
        let shipped = fs::read_to_string(Prometheus::shipped_rules()).expect("read rules.yml");
        let rules = with_for(&shipped, duration);
        let path = dir.file("rules.yml");
        fs::write(&path, rules).expect("write rules copy");
        path
    }

    /// Prometheus scraping Envoy admin ports `targets` on 127.0.0.1 (job [`JOB`], every
    /// [`INTERVAL`]) and evaluating `rules`; waits until it is ready, its rules loaded.
    pub fn start(dir: &WorkDir, targets: &[u16], rules: &Path) -> Prometheus {
        let port = free_port();
        let targets: Vec<String> = targets.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let rules = rules
            .canonicalize()
            .unwrap_or_else(|e| panic!("rules file {}: {e}", rules.display()));
        let config_path = dir.file(&format!("prometheus-{port}.yml"));
        fs::write(&config_path, config_yaml(&targets, &rules)).expect("write prometheus config");
        let data = dir.file(&format!("prometheus-{port}-data"));
        let mut command = Command::new("prometheus");
        command
            // Nothing relative should resolve outside the test's folder.
            .current_dir(&dir.path)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let mut process = Process::spawn(
            "prometheus",
            &mut command,
            dir.file(&format!("prometheus-{port}.log")),
        );
        let config_text = config_path.display().to_string();
        wait_for("prometheus to be ready", START_TIMEOUT, || {
            // A bad config or rules file makes Prometheus exit: show its log, not a timeout.
            process.assert_running();
            // Ready means the config and its rule files are loaded and the storage is open.
            get(port, "/-/ready", &[])
                .ok()
                .filter(|r| r.status == 200)?;
            // Ready from whoever holds the port is not enough: it must be this Prometheus.
            get(port, "/api/v1/status/flags", &[])
                .ok()
                .filter(|r| r.text().contains(&*config_text))
        });
        Prometheus {
            port,
            process,
            config_path,
            targets,
        }
    }

    /// GET `path` on Prometheus, the body as text (API errors are JSON with a 4xx/5xx status,
    /// left to the parsers so that their message is shown).
    fn api(&self, path: &str) -> String {
        match get(self.port, path, &[]) {
            Ok(response) => response.text(),
            // Most likely Prometheus died: its log says why.
            Err(e) => panic!(
                "prometheus GET {path}: {e}; its log:\n{}",
                tail(&self.process.log_text(), 30)
            ),
        }
    }

    /// An instant query at the current time: each series' labels and value (a scalar result
    /// is one entry with no labels). Panics if Prometheus refuses the query.
    pub fn query(&self, promql: &str) -> Vec<(Labels, f64)> {
        let body = self.api(&format!("/api/v1/query?query={}", percent_encode(promql)));
        parse_query(&body).unwrap_or_else(|e| panic!("query {promql:?}: {e}"))
    }

    /// The alerts now pending or firing: (alertname, state, labels), state `"pending"` or
    /// `"firing"`; the labels include `alertname`, the rule's own (`severity`) and the
    /// expression's (`job`, `instance`, `rule`, ...).
    pub fn alerts(&self) -> Vec<(String, String, Labels)> {
        let body = self.api("/api/v1/alerts");
        parse_alerts(&body).unwrap_or_else(|e| panic!("alerts: {e}"))
    }

    /// Waits until every target has been scraped successfully (`up` is 1 for each).
    pub fn wait_scraped(&self, timeout: Duration) {
        let want = self.targets.len();
        wait_for("prometheus to scrape every target", timeout, || {
            let up = self.query(&format!("up{{job=\"{JOB}\"}} == 1"));
            (up.len() == want).then_some(())
        });
    }

    /// Waits until alert `name` is in `state` (`"pending"` or `"firing"`); returns its labels
    /// (the first such alert's, if the expression gives several).
    pub fn wait_alert(&self, name: &str, state: &str, timeout: Duration) -> Labels {
        wait_for(&format!("alert {name} to be {state}"), timeout, || {
            self.alerts()
                .into_iter()
                .find(|(n, s, _)| n == name && s == state)
                .map(|(_, _, labels)| labels)
        })
    }
}

/// The config: one job scraping `targets` at Envoy's Prometheus path, loading `rules`.
/// Strings are written as JSON strings, which YAML reads as they are (a path with spaces or
/// quotes stays one string).
pub fn config_yaml(targets: &[String], rules: &Path) -> String {
    let quote = |s: &str| Value::from(s).to_string();
    let targets: Vec<String> = targets.iter().map(|t| quote(t)).collect();
    let secs = INTERVAL.as_secs();
    format!(
        "global:\n  scrape_interval: {secs}s\n  scrape_timeout: {secs}s\n  evaluation_interval: {secs}s\n\
         rule_files:\n  - {rules}\n\
         scrape_configs:\n  - job_name: {job}\n    metrics_path: /stats/prometheus\n    \
         static_configs:\n      - targets: [{targets}]\n",
        rules = quote(&rules.display().to_string()),
        job = quote(JOB),
        targets = targets.join(", "),
    )
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `rules` with the value of every `for:` line replaced by `duration`.
pub fn with_for(rules: &str, duration: &str) -> String {
    rules
        .lines()
        .map(|line| {
            let body = line.trim_start();
            if body.starts_with("for:") {
                let indent = &line[..line.len() - body.len()];
                format!("{indent}for: {duration}\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect()
}

/// Percent-encodes a query-string value: every byte but the unreserved ones (RFC 3986:
/// letters, digits, `-._~`) as `%XX`, so PromQL's `{}"=+&#[] ` and spaces survive the URL.
pub fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for &byte in value.as_bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The `data` of a Prometheus API reply, or its error.
fn api_data(body: &str) -> Result<Value, String> {
    let mut reply: Value =
        serde_json::from_str(body).map_err(|e| format!("not JSON ({e}): {body:?}"))?;
    if reply["status"] != "success" {
        return Err(format!(
            "{}: {}",
            reply["errorType"].as_str().unwrap_or("error"),
            reply["error"].as_str().unwrap_or(body)
        ));
    }
    Ok(reply["data"].take())
}

/// A sample value: Prometheus writes floats as strings, `NaN`, `+Inf` and `-Inf` included.
fn sample_value(pair: &Value) -> Result<f64, String> {
    let text = pair[1]
        .as_str()
        .ok_or_else(|| format!("no [time, \"value\"] pair: {pair}"))?;
    text.parse()
        .map_err(|_| format!("value {text:?} is not a number"))
}

fn labels(object: &Value) -> Result<Labels, String> {
    let map = object
        .as_object()
        .ok_or_else(|| format!("labels are not an object: {object}"))?;
    map.iter()
        .map(|(name, value)| match value.as_str() {
            Some(v) => Ok((name.clone(), v.to_string())),
            None => Err(format!("label {name} is not a string: {value}")),
        })
        .collect()
}

/// The result of `/api/v1/query`: a vector, or a scalar as one entry without labels.
pub fn parse_query(body: &str) -> Result<Vec<(Labels, f64)>, String> {
    let data = api_data(body)?;
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .ok_or("vector without a result array")?
            .iter()
            .map(|sample| Ok((labels(&sample["metric"])?, sample_value(&sample["value"])?)))
            .collect(),
        Some("scalar") => Ok(vec![(Labels::new(), sample_value(&data["result"])?)]),
        other => Err(format!(
            "result type {other:?}: query an instant vector or a scalar"
        )),
    }
}

/// The alerts of `/api/v1/alerts`: (alertname, state, labels).
pub fn parse_alerts(body: &str) -> Result<Vec<(String, String, Labels)>, String> {
    let data = api_data(body)?;
    data["alerts"]
        .as_array()
        .ok_or("no alerts array")?
        .iter()
        .map(|alert| {
            let labels = labels(&alert["labels"])?;
            let name = labels
                .get("alertname")
                .cloned()
                .ok_or_else(|| format!("alert without alertname: {alert}"))?;
            let state = alert["state"]
                .as_str()
                .ok_or_else(|| format!("alert without state: {alert}"))?;
            Ok((name, state.to_string(), labels))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels_of(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(percent_encode("up"), "up");
        assert_eq!(
            percent_encode(r#"sum by (job) (rate(x{a="b c"}[5m])) > 0.5"#),
            "sum%20by%20%28job%29%20%28rate%28x%7Ba%3D%22b%20c%22%7D%5B5m%5D%29%29%20%3E%200.5"
        );
        // Characters a query string would otherwise split on or decode: & = + # %, and UTF-8.
        assert_eq!(percent_encode("a&b=c+d#e%f"), "a%26b%3Dc%2Bd%23e%25f");
        assert_eq!(percent_encode("é-._~"), "%C3%A9-._~");
    }

    #[test]
    fn vectors_and_scalars_are_parsed() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"job":"envoy","rule":"login","limit":"per_ip"},"value":[1700000000.123,"0.75"]},
            {"metric":{},"value":[1700000000.123,"NaN"]},
            {"metric":{"instance":"127.0.0.1:9901"},"value":[1700000000,"+Inf"]},
            {"metric":{"instance":"127.0.0.1:9902"},"value":[1700000000,"-Inf"]}]}}"#;
        let result = parse_query(body).unwrap();
        assert_eq!(result.len(), 4);
        assert_eq!(
            result[0],
            (
                labels_of(&[("job", "envoy"), ("limit", "per_ip"), ("rule", "login")]),
                0.75
            )
        );
        assert!(result[1].0.is_empty() && result[1].1.is_nan());
        assert_eq!(result[2].1, f64::INFINITY);
        assert_eq!(result[3].1, f64::NEG_INFINITY);

        let scalar =
            r#"{"status":"success","data":{"resultType":"scalar","result":[1700000000,"2"]}}"#;
        assert_eq!(parse_query(scalar).unwrap(), vec![(Labels::new(), 2.0)]);
        let empty = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert!(parse_query(empty).unwrap().is_empty());
    }

    #[test]
    fn api_errors_and_odd_replies_are_errors() {
        let error =
            r#"{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected"}"#;
        assert_eq!(
            parse_query(error).unwrap_err(),
            "bad_data: 1:5: parse error: unexpected"
        );
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(parse_query(matrix).unwrap_err().contains("matrix"));
        assert!(parse_query("404 page not found")
            .unwrap_err()
            .contains("not JSON"));
        let bad_value = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{},"value":[1,"many"]}]}}"#;
        assert!(parse_query(bad_value).unwrap_err().contains("many"));
    }

    #[test]
    fn alerts_are_parsed() {
        let body = r#"{"status":"success","data":{"alerts":[
            {"labels":{"alertname":"RateLimiterFailingOpen","job":"envoy","severity":"warning"},
             "annotations":{"summary":"s"},"state":"pending","activeAt":"2026-01-01T00:00:00Z","value":"1e+00"},
            {"labels":{"alertname":"RateLimiterBreakerOpen","instance":"127.0.0.1:9901","job":"envoy","severity":"warning"},
             "annotations":{},"state":"firing","activeAt":"2026-01-01T00:00:00Z","value":"2e+00"}]}}"#;
        let alerts = parse_alerts(body).unwrap();
        assert_eq!(alerts.len(), 2);
        assert_eq!(alerts[0].0, "RateLimiterFailingOpen");
        assert_eq!(alerts[0].1, "pending");
        assert_eq!(
            alerts[0].2,
            labels_of(&[
                ("alertname", "RateLimiterFailingOpen"),
                ("job", "envoy"),
                ("severity", "warning")
            ])
        );
        assert_eq!(
            (alerts[1].0.as_str(), alerts[1].1.as_str()),
            ("RateLimiterBreakerOpen", "firing")
        );
        assert_eq!(alerts[1].2["instance"], "127.0.0.1:9901");
        let none = r#"{"status":"success","data":{"alerts":[]}}"#;
        assert!(parse_alerts(none).unwrap().is_empty());
    }

    #[test]
    fn the_config_scrapes_every_target_and_loads_the_rules() {
        let targets = vec!["127.0.0.1:20001".to_string(), "127.0.0.1:20002".to_string()];
        let config = config_yaml(&targets, Path::new("/tmp/a \"b\"/rules.yml"));
        assert_eq!(
            config,
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - \"/tmp/a \\\"b\\\"/rules.yml\"\n\
             scrape_configs:\n  - job_name: \"envoy\"\n    metrics_path: /stats/prometheus\n    \
             static_configs:\n      - targets: [\"127.0.0.1:20001\", \"127.0.0.1:20002\"]\n"
        );
    }

    #[test]
    fn rules_with_for_changes_every_for_and_nothing_else() {
        let shipped = fs::read_to_string(Prometheus::shipped_rules()).unwrap();
        let fast = with_for(&shipped, "0s");
        let fors = |text: &str| {
            text.lines()
                .filter(|l| l.trim_start().starts_with("for:"))
                .count()
        };
        assert_eq!(fors(&fast), fors(&shipped));
        assert!(fors(&shipped) >= 7, "one `for:` per alert");
        assert!(fast
            .lines()
            .filter(|l| l.trim_start().starts_with("for:"))
            .all(|l| l.trim() == "for: 0s"));
        let rest = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| !l.trim_start().starts_with("for:"))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(rest(&fast), rest(&shipped));
    }
}
