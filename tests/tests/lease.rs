//! Leases end to end: a worker serves requests from units it leased without a call, another
//! replica is still admitted while the first holds a lease, and the limit is never exceeded,
//! with leases given back when they end. Real Envoys, Webdis and Redis.

use std::time::{Duration, Instant};

use e2e::{get, wait_for, wait_until, Envoy, Redis, Webdis, WorkDir};
use ratelimit_core::engine::leases::EARN;

/// A bucket of `burst` that refills 10 per hour (nothing comes back during a test), leases of
/// at most 10 units, half of what is left, given back after 1 s. The replicas share one clock
/// (one machine): a clock skew of 50 ms. No deny cache, so that units given back are seen at
/// once.
fn config(burst: u64) -> String {
    format!(
        r#"{{"bridge": {{"username": "ratelimit", "password": "ratelimit-demo-secret", "clock_skew": "50ms"}},
"deny_cache": false,
"lease": {{"max_units": 10, "fraction": 0.5, "max_ms": 1000}},
"rules": [{{"name": "api", "key": {{"from": ["header:x-api-key"]}},
  "limits": [{{"name": "quota", "limit": 10, "window": "1h", "burst": {burst}}}]}}]}}"#
    )
}

/// An Envoy with `workers` worker threads on the shipped config with [`config`].
fn envoy(dir: &WorkDir, webdis: &Webdis, burst: u64, workers: u32) -> Envoy {
    Envoy::start_filter(dir, webdis.port, &config(burst), workers)
}

fn status(envoy: &Envoy, key: &str) -> u16 {
    envoy.keyed(key).status
}

/// `key` earns a lease on `envoy`'s worker: its first [`EARN`] - 1 requests go as plain
/// decisions (each allowed here), so its next one asks for a lease. Returns them.
fn earn(envoy: &Envoy, key: &str) -> u64 {
    for _ in 1..EARN {
        assert_eq!(status(envoy, key), 200);
    }
    EARN as u64 - 1
}

/// Asks on each replica in turn (paced, while leases end and give their units back) until
/// `allowed` reaches `limit`, then three more times each: returns the allowed count.
fn top_up(replicas: &[&Envoy], key: &str, mut allowed: u64, limit: u64) -> u64 {
    let started = Instant::now();
    while allowed < limit && started.elapsed() < Duration::from_secs(10) {
        for e in replicas {
            if status(e, key) == 200 {
                allowed += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(100)); // pacing while leases end
    }
    for e in replicas {
        for _ in 0..3 {
            if status(e, key) == 200 {
                allowed += 1;
            }
        }
    }
    allowed
}

fn decisions(redis: &Redis) -> u64 {
    redis.decision_calls()
}

#[test]
fn a_lease_serves_requests_without_calls() {
    let dir = WorkDir::new("lease-serves");
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let e = envoy(&dir, &webdis, 1000, 1);
    let statuses: Vec<u16> = (0..40).map(|_| status(&e, "served")).collect();
    assert_eq!(statuses, vec![200; 40]);
    // Lease hits reach the stats at the worker's tick: the counts are read once all 40 are
    // there (allowed first, as the tick adds them; the hits only ever grow after it).
    e.wait_counter("ratelimit_allowed", 40);
    let (hits, calls) = (
        e.counter("ratelimit_lease_hits"),
        e.counter("ratelimit_bridge_calls"),
    );
    println!(
        "40 requests: {hits} from leases, {calls} decision calls, {} in Redis, {} grants, {} prefetches",
        decisions(&redis),
        e.counter("ratelimit_lease_grants"),
        e.counter("ratelimit_lease_prefetches")
    );
    // Leases of 10: 4 requests in 40 decided in Redis at most, and the prefetches.
    assert!(hits >= 30, "{hits} requests from leases");
    assert!(calls <= 10, "{calls} calls");
    assert!(decisions(&redis) <= 10);
}

#[test]
fn units_a_lease_did_not_spend_go_back_to_redis_when_it_ends() {
    let dir = WorkDir::new("lease-give-back");
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let e = envoy(&dir, &webdis, 100, 1);
    // The key earns a lease; then a lease taken (the next request and a few for later), and
    // 2 of them spent.
    let spent = earn(&e, "idle") + 3;
    for _ in 0..3 {
        assert_eq!(status(&e, "idle"), 200);
    }
    let left = 100.0 - spent as f64;
    // A prefetch may still be in flight after the third answer: read Redis only once every
    // lease asked for has come back (each is granted here, the bucket being nearly full).
    wait_for("the prefetched lease", Duration::from_secs(5), || {
        let asked = 1 + e.counter("ratelimit_lease_prefetches");
        (e.counter("ratelimit_lease_grants") == asked).then_some(())
    });
    let held = e.bucket_tokens(&redis, "api", "quota", "idle");
    assert!(held < left, "{held} left in Redis while units are leased");
    // The lease ends after 1 s: its unspent units come back, all of them (the bucket cannot
    // have been full since), and only they: the requests stay spent.
    let back = wait_for("the unspent units back", Duration::from_secs(5), || {
        let now = e.bucket_tokens(&redis, "api", "quota", "idle");
        (now >= left - 0.01).then_some(now)
    });
    assert!(
        back < left + 0.01,
        "{back}: 100 less the {spent} spent (refill: 10 an hour)"
    );
    let returned = e.counter("ratelimit_lease_units_returned");
    println!("{held} in Redis while leased, {back} after; {returned} units given back");
    assert!((left - held - returned as f64).abs() < 0.01);
}

#[test]
fn a_second_replica_is_admitted_while_the_first_holds_a_lease_and_the_limit_holds() {
    const BURST: u64 = 20;
    let dir = WorkDir::new("lease-replicas");
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let a = envoy(&dir, &webdis, BURST, 1);
    let b = envoy(&dir, &webdis, BURST, 1);
    // The key earns a lease on A, which then takes 4 of the 17 left (its request and 3 more);
    // B is still admitted, from what is left.
    let earned = earn(&a, "shared");
    assert_eq!(status(&a, "shared"), 200);
    assert_eq!(status(&b, "shared"), 200);
    assert_eq!(a.counter("ratelimit_lease_grants"), 1);
    // Both keep asking: never more than the 20 in all.
    let mut allowed = earned + 2;
    for _ in 0..30 {
        for e in [&a, &b] {
            if status(e, "shared") == 200 {
                allowed += 1;
            }
        }
    }
    println!(
        "A: {} from leases, B: {}; {allowed} allowed of {BURST}",
        a.counter("ratelimit_lease_hits"),
        b.counter("ratelimit_lease_hits")
    );
    assert!(allowed <= BURST, "{allowed} allowed: over the limit");
    // Lease hits reach the stats at the worker's next tick.
    wait_until(
        "B's lease hits counted",
        Duration::from_secs(5),
        || b.counter("ratelimit_lease_hits"),
        |hits| *hits > 0,
    );
    // Units still held when the requests stopped are given back when their lease ends
    // (1 s): then every one of the 20 has been allowed, and not one more.
    let allowed = top_up(&[&a, &b], "shared", allowed, BURST);
    println!(
        "units given back: A {}, B {}",
        a.counter("ratelimit_lease_units_returned"),
        b.counter("ratelimit_lease_units_returned")
    );
    assert_eq!(allowed, BURST, "exactly the limit, all of it");
}

#[test]
fn concurrent_clients_on_two_replicas_with_two_workers_never_pass_the_limit() {
    const BURST: u64 = 100;
    let dir = WorkDir::new("lease-concurrent");
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let replicas = [
        envoy(&dir, &webdis, BURST, 2),
        envoy(&dir, &webdis, BURST, 2),
    ];
    let ports: Vec<u16> = replicas.iter().map(|e| e.port).collect();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let port = ports[t % 2];
            std::thread::spawn(move || {
                (0..60)
                    .filter(|_| {
                        get(port, "/", &[("x-api-key", b"hot".as_slice())])
                            .expect("request through envoy")
                            .status
                            == 200
                    })
                    .count() as u64
            })
        })
        .collect();
    let allowed: u64 = threads.into_iter().map(|t| t.join().expect("client")).sum();
    assert!(allowed <= BURST, "{allowed} allowed: over the limit");
    // Lease hits reach the stats at each worker's next tick.
    let hits = wait_until(
        "lease hits counted",
        Duration::from_secs(5),
        || {
            replicas
                .iter()
                .map(|e| e.counter("ratelimit_lease_hits"))
                .sum::<u64>()
        },
        |hits| *hits > 0,
    );
    println!("480 requests: {allowed} allowed of {BURST}, {hits} from leases");
    // What leases still held when the clients stopped comes back when they end.
    let [x, y] = &replicas;
    let allowed = top_up(&[x, y], "hot", allowed, BURST);
    let returned: u64 = replicas
        .iter()
        .map(|e| e.counter("ratelimit_lease_units_returned"))
        .sum();
    println!("then {allowed} allowed; {returned} units given back");
    assert_eq!(allowed, BURST, "exactly the limit, all of it");
}
