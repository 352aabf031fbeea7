//! What the bench reads besides wrk: CPU time of each process from `/proc`, Redis
//! `INFO commandstats`, Envoy `/stats`, and the machine and versions.

use std::collections::BTreeMap;
use std::process::Command;

use e2e::http::get;
use e2e::resp::RedisConn;

/// CPU time (user + system, all threads) of a process so far, in seconds; None once gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // Fields 14 and 15 of the line (utime, stime) are 12 and 13 after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clock_ticks_per_second())
}

pub fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Calls per command from `INFO commandstats` (`cmdstat_evalsha:calls=12,...`), names in
/// lower case. Commands run inside scripts are counted too.
pub fn redis_commandstats(conn: &mut RedisConn) -> BTreeMap<String, u64> {
    let info = conn
        .cmd(&["INFO", "commandstats"])
        .expect("redis INFO commandstats")
        .text();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_ascii_lowercase(), calls))
        })
        .collect()
}

/// Commands the bench itself sends to Redis, left out of the per-decision counts.
pub const BENCH_OWN_COMMANDS: &[&str] =
    &["info", "auth", "ping", "hello", "client|setinfo", "dbsize"];

/// Every integer counter and gauge of an Envoy's `/stats`.
pub fn envoy_stats(admin_port: u16) -> BTreeMap<String, u64> {
    let Ok(response) = get(admin_port, "/stats", &[]) else {
        return BTreeMap::new();
    };
    response
        .text()
        .lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(": ")?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// `after - before` for every key of `after` (missing before = 0).
pub fn delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(*before.get(k).unwrap_or(&0))))
        .collect()
}

/// The machine: what the absolute figures hold for.
#[derive(Clone, Debug, Default)]
pub struct Machine {
    pub cpu_model: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub os: String,
}

pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    let os = std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_default();
    Machine {
        cpu_model,
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        memory_gib: memory_kib / 1024.0 / 1024.0,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        os,
    }
}

/// Busy CPU seconds of the whole machine so far (all cores, from the `cpu` line of
/// `/proc/stat`: everything but idle and iowait): shows whether the cores were saturated, and
/// counts wrk and anything else running too.
pub fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3)? + ticks.get(4)?;
    Some((total - idle) as f64 / clock_ticks_per_second())
}

/// First non-empty line of a command's output (stdout, else stderr), or "not found".
pub fn first_line_of(program: &str, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(out) => {
            let text = if out.stdout.is_empty() {
                String::from_utf8_lossy(&out.stderr).into_owned()
            } else {
                String::from_utf8_lossy(&out.stdout).into_owned()
            };
            text.lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("")
                .to_string()
        }
        Err(_) => "not found".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_of_this_process_is_read() {
        let own = cpu_seconds(std::process::id());
        assert!(own.is_some_and(|s| s >= 0.0));
    }

    #[test]
    fn deltas_count_new_keys_from_zero() {
        let before = BTreeMap::from([("a".to_string(), 5), ("b".to_string(), 1)]);
        let after = BTreeMap::from([("a".to_string(), 8), ("c".to_string(), 2)]);
        let d = delta(&before, &after);
        assert_eq!(d["a"], 3);
        assert_eq!(d["c"], 2);
        assert!(!d.contains_key("b"));
    }
}
