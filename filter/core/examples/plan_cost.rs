//! Time of one request's plan (rule matching, identity, Redis keys), without Envoy: a view that
//! keeps the request's headers as the adapter does (read once, looked up by name).
//!
//! Natively: `cargo run --release -p ratelimit-core --features testing --example plan_cost`.
//! Under V8, the engine Envoy runs the filter in:
//! `cargo build --release --target wasm32-wasip1 -p ratelimit-core --features testing --example plan_cost` then
//! `node --no-warnings -e 'const {WASI}=require("node:wasi");const w=new WASI({version:"preview1"});WebAssembly.instantiate(require("fs").readFileSync(process.argv[1]),w.getImportObject()).then(({instance})=>w.start(instance))' target/wasm32-wasip1/release/examples/plan_cost.wasm`

use std::time::Instant;

use ratelimit_core::request::memo::PlanMemo;
use ratelimit_core::request::plan::plan_memo;
use ratelimit_core::Config;

mod common;
use common::view;
use ratelimit_core::testing::request::FakeRequest;

/// The fastest of five rounds, each after a warm-up: the machine is shared and noisy.
fn time(name: &str, config: &Config, view: &FakeRequest, memo: &mut PlanMemo) {
    const N: u64 = 100_000;
    let mut checks = 0;
    for turn in 0..N / 10 {
        checks += plan_memo(config, view, turn, memo).map_or(0, |p| p.checks.len());
    }
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        for turn in 0..N {
            checks += plan_memo(config, view, turn, memo).map_or(0, |p| p.checks.len());
        }
        best = best.min(start.elapsed().as_nanos() as f64 / N as f64);
    }
    let checks = checks / (5 * N + N / 10) as usize;
    println!("{name:<40} {best:>8.0} ns/plan ({checks} checks)");
}

fn main() {
    let bench = |rule: &str| {
        Config::parse(format!(r#"{{"rules": [{rule}]}}"#).as_bytes()).unwrap_or_else(|e| {
            eprintln!("{e:?}");
            std::process::exit(1)
        })
    };
    // The bench's rule (tests/bench/src/config.rs): one limit keyed on x-api-key.
    let keyed = bench(
        r#"{"name": "bench-token_bucket", "key": {"from": ["header:x-api-key"]},
            "limits": [{"name": "bench", "algorithm": "token_bucket", "limit": 1, "window": "1s", "burst": 10}]}"#,
    );
    // The shipped rule: the API key, else the client IP.
    let shipped = bench(
        r#"{"name": "per_client", "key": {"from": ["header:x-api-key", "client_ip"]},
            "limits": [{"name": "per_minute", "algorithm": "token_bucket", "limit": 10, "window": "1m"}]}"#,
    );
    let never = bench(
        r#"{"name": "bench", "match": {"path_exact": "/never-requested-by-the-bench"},
            "key": {"from": ["header:x-api-key"]}, "limits": [{"name": "bench", "limit": 1, "window": "1s"}]}"#,
    );
    let memo = PlanMemo::default;
    let fresh = || PlanMemo::with_capacity(0);
    let abuser = view(Some("bench-abuser"));
    time("no rule matches", &never, &abuser, &mut memo());
    time("x-api-key, memo", &keyed, &abuser, &mut memo());
    time("x-api-key, no memo", &keyed, &abuser, &mut fresh());
    time("client_ip, memo", &shipped, &view(None), &mut memo());
    time("client_ip, no memo", &shipped, &view(None), &mut fresh());
}
