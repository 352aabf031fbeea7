//! What one decision costs Redis inside the decision code, per algorithm and batch size:
//! batches of 1, 16 and 64 decisions (each on a key of its own) sent to a real Redis as the
//! filter calls it by default (`FCALL` of the library's function; `--script`: `EVALSHA` of the
//! script, as on a Redis Cluster), written by the filter's own argument builder, and Redis's CPU
//! read from `INFO cpu` (user + system) before and after. Run it on a quiet machine:
//!
//! ```text
//! cargo run --release -p e2e --example script_cost [-- [--callgrind] [--script] [ALGORITHM ...] DECISIONS]
//! ```
//!
//! ALGORITHMs (names as in the config) restrict the rows to theirs.
//! DECISIONS per row (default 64,000; 4,096 with `--callgrind`); the batches are of decisions each
//! on a key of its own, and one of 16 on a single key (a hot identity). It prints a markdown table: µs
//! of Redis CPU per decision, the Redis commands per decision (the script's own, from
//! `INFO commandstats`) and the bytes of the call's arguments per decision (what Webdis parses).
//! With `--callgrind`, Redis runs under valgrind's callgrind and the table gives the
//! instructions Redis executed per decision instead of its CPU time: a count that a loaded
//! machine does not change (callgrind's own overhead makes the CPU figure meaningless there).

use e2e::script::*;

const ALGORITHMS: [Algorithm; 6] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
    Algorithm::Concurrency,
];
/// Batch sizes, and whether the batch's decisions are on one key (a hot identity) rather than
/// each on its own.
const BATCHES: [(usize, bool); 4] = [(1, false), (16, false), (64, false), (16, true)];
/// Distinct keys a row cycles through: far more than a batch, as many identities would be.
const KEYS: usize = 4096;

/// Redis's CPU seconds so far (user + system, `INFO cpu`).
fn redis_cpu(redis: &Redis) -> f64 {
    let info = redis.admin().cmd(&["INFO", "cpu"]).unwrap().text();
    ["used_cpu_sys:", "used_cpu_user:"]
        .iter()
        .filter_map(|field| {
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .sum()
}

/// Every command Redis ran so far, from `INFO commandstats` (the script's own included).
fn commands(redis: &Redis) -> u64 {
    let stats = redis.admin().cmd(&["INFO", "commandstats"]).unwrap().text();
    stats
        .lines()
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next())
        .filter_map(|n| n.parse::<u64>().ok())
        .sum()
}

/// Redis under callgrind: its counters zeroed before a row and dumped after it.
struct Callgrind {
    pid: String,
    dir: std::path::PathBuf,
}

impl Callgrind {
    fn control(&self, option: &str) {
        let status = std::process::Command::new("callgrind_control")
            .args([option, &self.pid])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("callgrind_control (valgrind) runs");
        assert!(status.success(), "callgrind_control {option} {}", self.pid);
    }

    /// The instructions Redis executed since the last zeroing: the newest dump's `summary:`.
    fn instructions(&self) -> f64 {
        self.control("-d");
        let newest = std::fs::read_dir(&self.dir)
            .expect("work dir")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("callgrind.out"))
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
            .expect("a callgrind dump");
        let text = std::fs::read_to_string(newest.path()).expect("read the dump");
        text.lines()
            .find_map(|l| {
                l.strip_prefix("summary:")
                    .or_else(|| l.strip_prefix("totals:"))
            })
            .and_then(|n| n.trim().parse().ok())
            .expect("the dump's instruction total")
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let callgrind = args.iter().any(|a| a == "--callgrind");
    let kind = match args.iter().any(|a| a == "--script") {
        true => CallKind::Script,
        false => CallKind::Function,
    };
    let decisions: usize = args
        .iter()
        .find_map(|n| n.parse().ok())
        .unwrap_or(if callgrind { 4_096 } else { 64_000 });
    let dir = WorkDir::new("script-cost");
    let out_file = format!(
        "--callgrind-out-file={}/callgrind.out.%p",
        dir.path.display()
    );
    let redis = match callgrind {
        true => Redis::start_wrapped(&dir, &["valgrind", "--tool=callgrind", &out_file]),
        false => Redis::start(&dir),
    };
    let grind = callgrind.then(|| Callgrind {
        pid: redis.process.pid().to_string(),
        dir: dir.path.clone(),
    });
    let mut script = Script::calling(&redis, kind);
    let keys: Vec<&'static str> = (0..KEYS)
        .map(|i| &*Box::leak(format!("rl:{{k:{i:040}}}:bench:l").into_boxed_str()))
        .collect();
    let measure = match callgrind {
        true => "Redis instructions per decision",
        false => "µs of Redis CPU per decision",
    };
    println!("| algorithm | batch | keys | {measure} | Redis commands per decision | argument bytes per decision |");
    println!("|---|---:|---|---:|---:|---:|");
    let named: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let only = |a: &Algorithm| {
        !named
            .iter()
            .any(|n| ALGORITHMS.iter().any(|x| x.name() == n.as_str()))
            || named.iter().any(|n| n.as_str() == a.name())
    };
    for algorithm in ALGORITHMS.into_iter().filter(only) {
        for (batch, one_key) in BATCHES {
            let mut turn = 0usize;
            let limits: Vec<Vec<L>> = (0..KEYS)
                .map(|i| {
                    // A limit nothing reaches: every decision is allowed and charged.
                    let l = limit(keys[i], algorithm, 1_000_000, 60_000).held_by("w-1");
                    vec![l]
                })
                .collect();
            let calls = decisions.div_ceil(batch);
            let (cpu0, commands0) = (redis_cpu(&redis), commands(&redis));
            if let Some(g) = &grind {
                g.control("-z");
            }
            let mut bytes = 0usize;
            let mut now = T0;
            for _ in 0..calls {
                let requests: Vec<&[L]> = (0..batch)
                    .map(|_| {
                        turn = if one_key { 0 } else { (turn + 1) % KEYS };
                        limits[turn].as_slice()
                    })
                    .collect();
                now += MS;
                let command = script.command(&now.to_string(), &requests);
                bytes += command.iter().map(String::len).sum::<usize>();
                script.conn.cmd(&command).unwrap();
            }
            let n = (calls * batch) as f64;
            let cost = match &grind {
                Some(g) => format!("{:.0}", g.instructions() / n),
                None => format!("{:.1}", (redis_cpu(&redis) - cpu0) / n * 1e6),
            };
            // The two INFO calls of the reading itself are not the script's.
            let ran = (commands(&redis) - commands0).saturating_sub(2) as f64 / n;
            println!(
                "| {} | {batch} | {} | {cost} | {ran:.2} | {:.0} |",
                algorithm.name(),
                if one_key { "one" } else { "each its own" },
                bytes as f64 / n
            );
            redis.admin().cmd(&["FLUSHALL"]).unwrap();
            script = Script::calling(&redis, kind);
        }
    }
}
