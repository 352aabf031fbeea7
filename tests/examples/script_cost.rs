//! What one decision costs Redis inside the decision script, per algorithm and batch size:
//! batches of 1, 16 and 64 decisions (each on a key of its own) sent through EVALSHA to a real
//! Redis, as the filter's own argument builder writes them, and Redis's CPU read from
//! `INFO cpu` (user + system) before and after. Run it on a quiet machine:
//!
//! ```text
//! cargo run --release -p e2e --example script_cost [-- DECISIONS]
//! ```
//!
//! DECISIONS per row (default 64,000). It prints a markdown table: µs of Redis CPU per decision,
//! the Redis commands per decision (the script's own, from `INFO commandstats`) and the bytes
//! of the call's arguments per decision (what Webdis parses).

use e2e::script::*;

const ALGORITHMS: [Algorithm; 6] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
    Algorithm::Concurrency,
];
const BATCHES: [usize; 3] = [1, 16, 64];
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

fn main() {
    let decisions: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(64_000);
    let (_dir, redis, mut script) = script("script-cost");
    let keys: Vec<&'static str> = (0..KEYS)
        .map(|i| &*Box::leak(format!("rl:{{k:{i:040}}}:bench:l").into_boxed_str()))
        .collect();
    println!("| algorithm | batch | µs of Redis CPU per decision | Redis commands per decision | argument bytes per decision |");
    println!("|---|---:|---:|---:|---:|");
    for algorithm in ALGORITHMS {
        for batch in BATCHES {
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
            let mut bytes = 0usize;
            let mut now = T0;
            for _ in 0..calls {
                let requests: Vec<&[L]> = (0..batch)
                    .map(|_| {
                        turn = (turn + 1) % KEYS;
                        limits[turn].as_slice()
                    })
                    .collect();
                now += MS;
                let command = script.command(&now.to_string(), &requests);
                bytes += command.iter().map(String::len).sum::<usize>();
                script.conn.cmd(&command).unwrap();
            }
            let n = (calls * batch) as f64;
            let cpu = (redis_cpu(&redis) - cpu0) / n * 1e6;
            // The two INFO calls of the reading itself are not the script's.
            let ran = (commands(&redis) - commands0).saturating_sub(2) as f64 / n;
            println!(
                "| {} | {batch} | {cpu:.1} | {ran:.2} | {:.0} |",
                algorithm.name(),
                bytes as f64 / n
            );
            redis.admin().cmd(&["FLUSHALL"]).unwrap();
            script = Script::new(&redis);
        }
    }
}
