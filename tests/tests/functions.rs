//! The decision library (a Redis Function, called with `FCALL`) lost while clients are
//! calling, end to end (real Envoy with 2 workers, Webdis and Redis from the shipped configs):
//!
//! - `FUNCTION FLUSH` by an operator: the next call gets `ERR Function not found`, the filter
//!   loads the library again (`FUNCTION LOAD REPLACE`) and sends the call again; the requests
//!   wait for it rather than fail, and the limit stays exact: across the flush a bucket of N
//!   gives exactly N requests, and Redis's bucket holds what the N took, no more (no call
//!   charged twice) and no less (none lost).
//! - Redis killed and started again (library and keys gone): requests pass by the failure
//!   policy (open) while it is down, each one counted, and decisions come back for the
//!   loaded clients without any manual step, the library loaded into the new Redis.
//!
//! The load is a few client threads on 127.0.0.1, each bounded in requests, stopped when the
//! test has seen what it waits for (or fails).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use e2e::procs::filter_config_edit;
use e2e::{get, wait_for, wait_until, Stack};

/// Client threads of the load.
const CLIENTS: usize = 4;
/// The most requests one client sends: the load is bounded even if the test waits in vain.
const MAX_PER_CLIENT: u64 = 3_000;
/// How long the tests wait for Redis, Webdis's reconnection and the reload.
const PATIENCE: Duration = Duration::from_secs(60);
/// The bucket of the flush test: N requests per day. Its refill over the test (a few seconds:
/// N / 86,400 per second) stays far below one token, so exactly N are allowed.
const N: u64 = 200;

/// The filter's configuration: one token bucket of `limit` per `window` per API key. A
/// timeout far above a call and a reload on a loaded machine (the shipped 150 ms could let a
/// request fail open while its call is loaded again, which is not what the flush test
/// measures); the shipped failure mode (open).
fn filter_json(limit: u64, window: &str) -> String {
    format!(
        r#"{{"bridge": {{"username": "ratelimit", "password": "ratelimit-demo-secret", "timeout": "2s"}},
"rules": [{{"name": "api", "key": {{"from": ["header:x-api-key"]}},
  "limits": [{{"name": "quota", "algorithm": "token_bucket", "limit": {limit}, "window": "{window}"}}]}}]}}"#
    )
}

fn stack(name: &str, limit: u64, window: &str) -> Stack {
    let (from, to) = filter_config_edit(&filter_json(limit, window));
    Stack::start(name, &[(&from, &to)])
}

/// What the clients got, by kind.
#[derive(Debug, Default)]
struct Tally {
    /// 200 with `x-ratelimit-limit`: Redis decided it, allowed.
    allowed: AtomicU64,
    /// 429: refused (by Redis, or by a worker's deny cache from Redis's refusal).
    refused: AtomicU64,
    /// 200 without `x-ratelimit-limit`: passed by the failure policy, undecided.
    failed_open: AtomicU64,
    /// Anything else (another status, no answer), with what it was.
    other: Mutex<Vec<String>>,
}

impl Tally {
    fn answered(&self) -> u64 {
        self.allowed.load(Ordering::SeqCst)
            + self.refused.load(Ordering::SeqCst)
            + self.failed_open.load(Ordering::SeqCst)
    }

    fn decided(&self) -> u64 {
        self.allowed.load(Ordering::SeqCst) + self.refused.load(Ordering::SeqCst)
    }

    fn others(&self) -> Vec<String> {
        self.other.lock().map(|o| o.clone()).unwrap_or_default()
    }
}

/// `CLIENTS` threads sending requests through Envoy, each with the API key `key(client)`, until
/// stopped or `MAX_PER_CLIENT` each. Dropping it stops and joins them.
struct Load {
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(port: u16, key: impl Fn(usize) -> String) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Tally::default());
        let threads = (0..CLIENTS)
            .map(|client| {
                let (stop, tally, key) = (stop.clone(), tally.clone(), key(client));
                std::thread::spawn(move || {
                    for _ in 0..MAX_PER_CLIENT {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        match get(port, "/", &[("x-api-key", key.as_bytes())]) {
                            Ok(r) if r.status == 429 => &tally.refused,
                            Ok(r) if r.status == 200 && r.header("x-ratelimit-limit").is_some() => {
                                &tally.allowed
                            }
                            Ok(r) if r.status == 200 => &tally.failed_open,
                            Ok(r) => {
                                if let Ok(mut other) = tally.other.lock() {
                                    other.push(format!("HTTP {}: {}", r.status, r.text()));
                                }
                                continue;
                            }
                            Err(e) => {
                                if let Ok(mut other) = tally.other.lock() {
                                    other.push(format!("no answer: {e}"));
                                }
                                continue;
                            }
                        }
                        .fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        Load {
            stop,
            tally,
            threads,
        }
    }

    /// Stops the clients and waits for them: every request sent has its answer counted.
    fn finish(mut self) -> Arc<Tally> {
        self.join();
        self.tally.clone()
    }

    fn join(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.join();
    }
}

/// Whether Redis has the library the filter calls.
fn library_loaded(s: &Stack) -> bool {
    let library = e2e::decision_function().library_name();
    let listed = s
        .redis
        .admin()
        .cmd(&["FUNCTION", "LIST", "LIBRARYNAME", &library])
        .expect("FUNCTION LIST");
    !listed.items().is_empty()
}

#[test]
fn a_function_flush_under_load_is_reloaded_and_charges_nothing_twice() {
    let s = stack("functions-flush", N, "1d");
    // The library loaded by a first request of its own key.
    s.envoy.load_script("/");
    assert!(library_loaded(&s));
    let loads = s.envoy.counter("ratelimit_script_loads");
    let function_loads = s.redis.command_calls("function|load");
    assert_eq!((loads, function_loads), (1, 1));

    // Every client on one key: one bucket of N, spent by all of them at once.
    let load = Load::start(s.envoy.port, |_| "shared".to_string());
    // A tenth of the bucket spent: the flush comes while most of it is still to be decided.
    wait_for("the first decisions under load", PATIENCE, || {
        (load.tally.allowed.load(Ordering::SeqCst) >= N / 10).then_some(())
    });
    let reply = s.redis.admin().cmd(&["FUNCTION", "FLUSH"]).unwrap();
    assert_eq!(reply.text(), "OK");
    let at_flush = load.tally.answered();
    // The filter loads the library again by itself, and decisions go on.
    wait_for("the library loaded again", PATIENCE, || {
        (s.envoy.counter("ratelimit_script_loads") > loads && library_loaded(&s)).then_some(())
    });
    // Past the bucket: every client refused for a while, all N spent.
    wait_for("the bucket spent under load", PATIENCE, || {
        (load.tally.refused.load(Ordering::SeqCst) >= 2 * CLIENTS as u64).then_some(())
    });
    let tally = load.finish();
    let (allowed, refused, failed_open) = (
        tally.allowed.load(Ordering::SeqCst),
        tally.refused.load(Ordering::SeqCst),
        tally.failed_open.load(Ordering::SeqCst),
    );
    println!(
        "{} requests ({at_flush} before the flush): {allowed} allowed, {refused} refused, {failed_open} failed open; {} loads by the filter, {} FUNCTION LOAD in Redis",
        tally.answered(),
        s.envoy.counter("ratelimit_script_loads"),
        s.redis.command_calls("function|load"),
    );
    assert!(tally.others().is_empty(), "{:?}", tally.others());
    // The requests waited for the reload: none passed by policy, every one was decided.
    assert_eq!(failed_open, 0, "no request failed open across the flush");
    assert_eq!(s.envoy.counter("ratelimit_failure_mode_open"), 0);
    assert!(
        s.redis.command_calls("function|load") > function_loads,
        "Redis ran FUNCTION LOAD again"
    );
    // Exactly N allowed across the flush: no call charged twice (fewer), none lost (more).
    assert_eq!(allowed, N, "exactly the bucket, across the flush");
    // And Redis's bucket agrees: what is left is N less the requests it allowed (all of it
    // spent; the refill over the test is far below a token).
    let tokens = s.envoy.bucket_tokens(&s.redis, "api", "quota", "shared");
    let left = (N - allowed) as f64;
    assert!(
        (left..left + 0.5).contains(&tokens),
        "the bucket holds {tokens} tokens, {left} expected"
    );
}

#[test]
fn a_redis_restart_under_load_needs_no_manual_step() {
    // A limit no client reaches: every decided request is allowed.
    let mut s = stack("functions-restart", 1_000_000, "1s");
    s.envoy.wait_deciding("warm-up");
    let loads = s.envoy.counter("ratelimit_script_loads");
    let open_before = s.envoy.counter("ratelimit_failure_mode_open");
    // A key per client.
    let load = Load::start(s.envoy.port, |client| format!("client-{client}"));
    wait_for("decisions under load", PATIENCE, || {
        (load.tally.decided() >= 50).then_some(())
    });

    // Killed (no shutdown) and started again on its port: no key, no library (no snapshot:
    // the shipped config saves none). The clients may have the filter load it again before
    // this test can look: the loads counted below say it was missing.
    s.redis.restart();
    // Decisions come back for the loaded clients: Webdis reconnects, a probe closes each
    // worker's breaker, the first call finds no function and the filter loads it again.
    let resumed_from = load.tally.decided();
    wait_for("the clients' requests decided again", PATIENCE, || {
        (load.tally.decided() >= resumed_from + 50).then_some(())
    });
    let tally = load.finish();
    // The filter loaded the library into the new Redis (whose command counts start at 0).
    assert!(library_loaded(&s), "the library is loaded");
    assert!(s.envoy.counter("ratelimit_script_loads") > loads);
    assert!(s.redis.command_calls("function|load") >= 1);
    assert!(s.redis.command_calls("fcall") >= 1);
    assert!(tally.others().is_empty(), "{:?}", tally.others());
    assert_eq!(
        tally.refused.load(Ordering::SeqCst),
        0,
        "no client reaches its limit"
    );
    // Every request the clients saw pass undecided is one the filter passed by policy (open),
    // counted: nothing else let a request through without a decision.
    let failed_open = tally.failed_open.load(Ordering::SeqCst);
    let counted = wait_until(
        "every request failed open counted",
        Duration::from_secs(10),
        || s.envoy.counter("ratelimit_failure_mode_open") - open_before,
        |n| *n >= failed_open,
    );
    assert_eq!(counted, failed_open);
    println!(
        "{} requests: {} decided ({resumed_from} when Redis was back), {failed_open} failed open",
        tally.answered(),
        tally.decided()
    );
    s.envoy.process.assert_running();
}
