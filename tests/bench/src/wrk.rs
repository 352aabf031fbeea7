//! Runs wrk against 127.0.0.1, bounded in time, and reads the summary that
//! `tests/bench/summary.lua` prints.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use e2e::root;

/// What wrk sends.
#[derive(Clone, Debug)]
pub enum Requests {
    /// `GET /` with this `x-api-key` on every request.
    OneKey(String),
    /// `GET /` with the keys of this many clients, in turn (`tests/bench/keys10k.lua`).
    ManyKeys(u32),
    /// `POST /v1/chat/completions` to the OpenAI-compatible test upstream
    /// (`tests/bench/llm.lua`), with this `x-api-key`, answered with `usage` total tokens, as
    /// one JSON body or (`stream`) an event stream whose last event carries the usage.
    Llm {
        key: String,
        stream: bool,
        usage: u64,
    },
}

#[derive(Clone, Debug)]
pub struct WrkLoad {
    pub threads: u32,
    pub connections: u32,
    pub duration_s: u64,
    pub requests: Requests,
}

/// wrk's summary of one run.
#[derive(Clone, Debug, Default)]
pub struct WrkRun {
    pub requests: u64,
    pub duration_s: f64,
    pub rps: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Responses whose status is not 2xx or 3xx.
    pub non_2xx: u64,
    /// Connect, read, write errors and timeouts.
    pub socket_errors: u64,
}

/// Runs wrk with `load` against `port`; its output goes to `raw_out` as well.
pub fn run(port: u16, load: &WrkLoad, raw_out: &Path) -> WrkRun {
    let bench_dir = root().join("tests/bench");
    let mut command = Command::new("wrk");
    command
        .arg(format!("-t{}", load.threads))
        .arg(format!("-c{}", load.connections))
        .arg(format!("-d{}s", load.duration_s))
        .args(["--timeout", "5s"]);
    let script_args: Vec<String> = match &load.requests {
        Requests::OneKey(key) => {
            command
                .args(["-H", &format!("x-api-key: {key}")])
                .arg("-s")
                .arg(bench_dir.join("summary.lua"));
            vec![]
        }
        Requests::ManyKeys(n) => {
            command.arg("-s").arg(bench_dir.join("keys10k.lua"));
            vec![n.to_string()]
        }
        Requests::Llm { key, stream, usage } => {
            command.arg("-s").arg(bench_dir.join("llm.lua"));
            let kind = if *stream { "stream" } else { "json" };
            vec![kind.to_string(), key.clone(), usage.to_string()]
        }
    };
    command.arg(format!("http://127.0.0.1:{port}/"));
    if !script_args.is_empty() {
        command.arg("--").args(&script_args);
    }
    let text = run_bounded(
        &mut command,
        Duration::from_secs(load.duration_s + 30),
        raw_out,
    );
    parse(&text).unwrap_or_else(|| {
        panic!(
            "no BENCH_JSON line in wrk's output ({}):\n{text}",
            raw_out.display()
        )
    })
}

/// Runs `command` with its output in `raw_out`, killing it if it outlives `limit`.
fn run_bounded(command: &mut Command, limit: Duration, raw_out: &Path) -> String {
    let out = std::fs::File::create(raw_out).expect("create wrk output file");
    let err = out.try_clone().expect("clone file handle");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run wrk (is it installed? `make setup`): {e}"));
    // Stopped with the harness's own processes if the bench is stopped by a signal.
    e2e::procs::track_pid(child.id());
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            e2e::procs::untrack_pid(child.id());
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            e2e::procs::untrack_pid(child.id());
            panic!("wrk ran past {limit:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::read_to_string(raw_out).unwrap_or_default()
}

fn parse(text: &str) -> Option<WrkRun> {
    let line = text.lines().find_map(|l| l.strip_prefix("BENCH_JSON "))?;
    let v: Value = serde_json::from_str(line).ok()?;
    let num = |v: &Value| v.as_f64().unwrap_or(0.0);
    let lat = &v["latency_us"];
    let errors = &v["errors"];
    let requests = v["requests"].as_u64()?;
    let duration_s = num(&v["duration_us"]) / 1e6;
    Some(WrkRun {
        requests,
        duration_s,
        rps: if duration_s > 0.0 {
            requests as f64 / duration_s
        } else {
            0.0
        },
        mean_ms: num(&lat["mean"]) / 1e3,
        p50_ms: num(&lat["p50"]) / 1e3,
        p90_ms: num(&lat["p90"]) / 1e3,
        p99_ms: num(&lat["p99"]) / 1e3,
        max_ms: num(&lat["max"]) / 1e3,
        non_2xx: errors["status"].as_u64().unwrap_or(0),
        socket_errors: ["connect", "read", "write", "timeout"]
            .iter()
            .map(|k| errors[*k].as_u64().unwrap_or(0))
            .sum(),
    })
}

/// `wrk -v`'s first line, e.g. `wrk debian/4.1.0-3+b2 [epoll] ...`.
pub fn version() -> String {
    Command::new("wrk")
        .arg("-v")
        .output()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            text.lines()
                .next()
                .unwrap_or("")
                .split(" Copyright")
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_else(|_| "not found".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_is_read() {
        let text = "Running 1s test\nBENCH_JSON {\"requests\":2000,\"duration_us\":2000000,\"bytes\":1,\"errors\":{\"connect\":0,\"read\":1,\"write\":0,\"status\":5,\"timeout\":2},\"latency_us\":{\"mean\":600.5,\"p50\":550,\"p90\":900,\"p99\":1200,\"max\":5000}}\n";
        let run = parse(text).unwrap();
        assert_eq!(run.requests, 2000);
        assert_eq!(run.rps, 1000.0);
        assert_eq!(run.p50_ms, 0.55);
        assert_eq!(run.p99_ms, 1.2);
        assert_eq!(run.non_2xx, 5);
        assert_eq!(run.socket_errors, 3);
    }
}
