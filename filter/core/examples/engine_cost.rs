//! Time the engine spends on a request that makes no call, without Envoy: a deny-cache hit
//! (plan, cache lookup, the 429 built) and a lease hit (plan, a leased unit spent, the
//! rate-limit headers built), with a host that only counts what it is asked. What Envoy does
//! with the answer (host calls, headers, body) is not in these figures. Then a request
//! decided alone in a call (answered at once), keys of 10,000 clients in turn each back about
//! every 0.7 s, with leases off and on: what leases on cost identities that never lease.
//!
//! Natively: `cargo run --release -p ratelimit-core --features testing --example engine_cost`.
//! Under V8, as `plan_cost` (build for wasm32-wasip1, run the `.wasm` with node's WASI).

use std::time::Instant;

use ratelimit_core::engine::leases::EARN;
use ratelimit_core::testing::host::FakeHost;
use ratelimit_core::{BridgeReply, Config, Engine};

mod common;
use common::view;
use ratelimit_core::testing::request::FakeRequest;

/// The shared fake host, with what it recorded dropped after each request; `answers` counts
/// the refusals it was asked to send.
struct CountingHost {
    host: FakeHost,
    answers: u64,
}

fn config(extra: &str) -> Config {
    let json = format!(
        r#"{{{extra} "bridge": {{"clock_skew": "10ms"}}, "rules": [{{"name": "bench-token_bucket",
            "key": {{"from": ["header:x-api-key"]}},
            "limits": [{{"name": "bench", "limit": 1, "window": "1s", "burst": 10000000}}]}}]}}"#
    );
    Config::parse(json.as_bytes()).unwrap_or_else(|e| {
        eprintln!("{e:?}");
        std::process::exit(1)
    })
}

/// One request through the engine as the adapter drives it: headers, the response headers
/// taken, the context forgotten. A lease asked for from the root (a prefetch) is granted in
/// full at once, as a Redis with plenty left would.
fn one(
    engine: &mut Engine,
    config: &Config,
    counting: &mut CountingHost,
    ctx: u32,
    view: &FakeRequest,
) {
    let host = &mut counting.host;
    let wakes = host.wakes;
    engine.on_request(config, host, ctx, view);
    if host.wakes > wakes {
        engine.on_wakeup(config, host);
    }
    if let Some((token, call, _)) = host.dispatched.pop() {
        let mut segments = call.path.split('/').skip_while(|s| *s != "lease");
        let units = segments.nth(1).unwrap_or("1");
        let reply = format!(r#"{{"EVALSHA":[1,{units},1,1,"9990000","600000","0"]}}"#);
        let reply = BridgeReply {
            status: Some(200),
            body: reply.as_bytes(),
        };
        engine.on_reply(config, host, None, token, reply);
    }
    std::hint::black_box(engine.take_headers(ctx));
    engine.forget(config, host, ctx);
    counting.answers += host
        .answered
        .iter()
        .filter(|(_, r)| r.status == 429)
        .count() as u64;
    host.clear_log();
}

/// `plain` requests decided alone (allowed), then one whose call gets `reply`: the deny cache
/// entry or the lease the rest use.
fn primed(
    config: &Config,
    counting: &mut CountingHost,
    view: &FakeRequest,
    (plain, reply): (u32, &str),
) -> Engine {
    let mut engine = Engine::new(config);
    for ctx in 0..plain {
        one(&mut engine, config, counting, 1_000_000_000 + ctx, view);
    }
    let host = &mut counting.host;
    engine.on_request(config, host, 1, view);
    let reply = BridgeReply {
        status: Some(200),
        body: reply.as_bytes(),
    };
    let token = host.last_token();
    host.clear_log();
    engine.on_reply(config, host, Some(1), token, reply);
    engine.forget(config, host, 1);
    host.clear_log();
    engine
}

/// The fastest of five rounds of `N` requests of 10,000 keys in turn, each after a warm-up,
/// 70 µs apart (each key back every 0.7 s), the worker's tick every 25 ms.
fn time_keys(name: &str, config: &Config, host: &mut CountingHost) {
    const N: u32 = 100_000;
    const STEP_NS: u128 = 70_000;
    let views: Vec<FakeRequest> = (0..10_000)
        .map(|k| view(Some(&format!("client-{k}"))))
        .collect();
    let mut engine = Engine::new(config);
    let mut ctx = 1;
    let mut run = |engine: &mut Engine, host: &mut CountingHost, n: u32| {
        for _ in 0..n {
            ctx += 1;
            let now = host.host.now.unwrap_or(0) + STEP_NS;
            host.host.now = Some(now);
            if now % 25_000_000 < STEP_NS {
                engine.on_tick(config, &mut host.host);
            }
            one(
                engine,
                config,
                host,
                ctx,
                &views[ctx as usize % views.len()],
            );
        }
    };
    run(&mut engine, host, N);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        run(&mut engine, host, N);
        best = best.min(start.elapsed().as_nanos() as f64 / f64::from(N));
    }
    println!(
        "{name:<44} {best:>8.0} ns/request ({} calls, {} refused)",
        host.host.next_token, host.answers
    );
}

/// The fastest of five rounds of `N` requests, each after a warm-up: the machine is noisy.
fn time(
    name: &str,
    config: &Config,
    host: &mut CountingHost,
    engine: &mut Engine,
    view: &FakeRequest,
) {
    const N: u32 = 100_000;
    for ctx in 0..N / 10 {
        one(engine, config, host, 2 + ctx, view);
    }
    let mut best = f64::MAX;
    for round in 0..5 {
        let start = Instant::now();
        for ctx in 0..N {
            one(engine, config, host, 2 + N * (round + 1) + ctx, view);
        }
        best = best.min(start.elapsed().as_nanos() as f64 / f64::from(N));
    }
    println!(
        "{name:<44} {best:>8.0} ns/request ({} calls, {} refused)",
        host.host.next_token, host.answers
    );
}

fn main() {
    let abuser = view(Some("bench-abuser"));
    let now = 1_000_000_000_000_000_000;
    let fresh = || CountingHost {
        host: FakeHost {
            now: Some(now),
            ..FakeHost::default()
        },
        answers: 0,
    };
    // Refused, retry in 10 minutes: every later request is a deny-cache hit.
    let refused = r#"{"EVALSHA":[1,0,1,0,"0","600000","600000"]}"#;
    for (name, extra) in [
        ("deny-cache hit, X-RateLimit headers", ""),
        (
            "deny-cache hit, no rate-limit headers",
            r#""headers": "none","#,
        ),
    ] {
        let c = config(extra);
        let mut host = fresh();
        let mut engine = primed(&c, &mut host, &abuser, (0, refused));
        time(name, &c, &mut host, &mut engine, &abuser);
    }
    // The key earns a lease (3 requests decided alone), then is allowed with a first lease
    // of 4 requests' worth (the first ask), then the prefetches.
    let leased = r#"{"EVALSHA":[1,4,1,1,"9990000","600000","0"]}"#;
    for (name, extra) in [
        ("lease hit, X-RateLimit headers", ""),
        ("lease hit, no rate-limit headers", r#""headers": "none","#),
    ] {
        let extra = format!(
            r#"{extra} "lease": {{"max_units": 10000000, "fraction": 1, "max_ms": 60000}},"#
        );
        let c = config(&extra);
        let mut host = fresh();
        let plain = EARN as u32 - 1;
        let mut engine = primed(&c, &mut host, &abuser, (plain, leased));
        time(name, &c, &mut host, &mut engine, &abuser);
    }
    for (name, extra) in [
        ("decided, 10,000 keys, leases off", ""),
        (
            "decided, 10,000 keys, leases on",
            r#""lease": {"max_units": 100, "fraction": 0.1, "max_ms": 1000},"#,
        ),
    ] {
        let c = config(extra);
        time_keys(name, &c, &mut fresh());
    }
}
