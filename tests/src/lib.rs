//! Test harness: starts real Redis, Webdis, Envoy and Prometheus processes on free loopback
//! ports from the project's shipped configs, polls them until ready, and stops them by PID when
//! dropped. `cluster` does the same for a Redis Cluster behind Envoy's redis_proxy.
//! Also a minimal HTTP/1.1 client and a minimal Redis (RESP) client, so the tests need no crates,
//! and `llm`, an OpenAI-compatible upstream whose answers carry the usage a test chose;
//! `admin` runs the operator's command, ratelimit-admin, as a user would; `authz` is an HTTP
//! authorization service for Envoy's ext_authz, `auth` the support of the auth recipes' tests;
//! `grpc`, a gRPC upstream on the official grpcio server.

pub mod admin;
pub mod auth;
pub mod authz;
pub mod busy;
pub mod cluster;
pub mod flood;
pub mod grpc;
pub mod http;
pub mod keys;
pub mod llm;
pub mod origin;
pub mod procs;
pub mod prometheus;
pub mod python;
pub mod resp;
pub mod script;
pub mod server;
pub mod sf;
pub mod shipped;

pub use http::{get, Response};
pub use keys::Keys;
pub use llm::LlmUpstream;
pub use procs::{Envoy, Redis, Stack, Webdis, WorkDir};
pub use prometheus::Prometheus;
pub use resp::{RedisConn, Resp};

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The workspace root (tests/ is one level below it).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The release filter the tests load; `make test` builds it first.
pub fn wasm_path() -> PathBuf {
    let path = root().join("target/wasm32-wasip1/release/ratelimit_filter.wasm");
    assert!(
        path.exists(),
        "{} is missing: run `make build` (make test does) first",
        path.display()
    );
    path
}

/// The Envoy binary: $ENVOY_BIN, else the one `make setup` installed into .venv.
pub fn envoy_bin() -> PathBuf {
    if let Ok(bin) = std::env::var("ENVOY_BIN") {
        return PathBuf::from(bin);
    }
    let lib = root().join(".venv/lib");
    if let Ok(entries) = std::fs::read_dir(&lib) {
        for entry in entries.flatten() {
            let candidate = entry.path().join("site-packages/envoy/_bin/envoy");
            if candidate.exists() {
                return candidate;
            }
        }
    }
    panic!("no Envoy binary: set ENVOY_BIN or run `make setup` to install it into .venv");
}

/// Polls `check` every 20 ms until it returns Some, or panics after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, check: impl FnMut() -> Option<T>) -> T {
    poll(timeout, check).unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

pub const MINUTE: Duration = Duration::from_secs(60);
pub const HOUR: Duration = Duration::from_secs(3600);
pub const DAY: Duration = Duration::from_secs(86_400);
/// Longer than any one test counts in a fixed window.
pub const TEST_SPAN: Duration = Duration::from_secs(120);

/// Waits until the fixed window of length `window` (aligned to the Unix epoch, as the
/// decision code aligns `fixed_window` limits: a `1d` window ends at 00:00 UTC) has at least
/// `needed` left, so that a test counting in that window never sees it start again midway.
/// Waits at most `needed`.
pub fn clear_of_window_end(window: Duration, needed: Duration) {
    assert!(
        needed < window,
        "{needed:?} never fits in a {window:?} window"
    );
    let left = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("a clock after 1970")
            .as_millis();
        let window = window.as_millis();
        Duration::from_millis((window - now % window) as u64)
    };
    wait_until(
        "enough of the fixed window left",
        needed + Duration::from_secs(1),
        left,
        |left| *left >= needed,
    );
}

/// Polls `read` every 20 ms until it returns `want`; panics after `timeout` with the last
/// value read. For a state reached asynchronously (a count reaches the stats at the worker's
/// next tick): a test waits for the very state it asserts, not for another one beside it.
pub fn wait_for_value<T: PartialEq + std::fmt::Debug>(
    what: &str,
    timeout: Duration,
    want: T,
    read: impl FnMut() -> T,
) -> T {
    wait_until(what, timeout, read, |v| *v == want)
}

/// Polls `read` every 20 ms until `done` holds for what it returns, and returns that; panics
/// after `timeout` with the last value read.
pub fn wait_until<T: std::fmt::Debug>(
    what: &str,
    timeout: Duration,
    mut read: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let mut last = None;
    let reached = poll(timeout, || {
        let value = read();
        if done(&value) {
            return Some(value);
        }
        last = Some(value);
        None
    });
    reached.unwrap_or_else(|| {
        panic!("timed out after {timeout:?} waiting for {what}: the last value read was {last:?}")
    })
}

/// `check` every 20 ms until it returns Some; None once `timeout` has passed.
fn poll<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free TCP port on 127.0.0.1, below the kernel's ephemeral range (32768+), so that the
/// many client connections of a test cannot take it between this call and the server's bind.
/// Each process starts at its own place in the range, so concurrent test runs rarely meet.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    if NEXT.load(Ordering::SeqCst) == u32::MAX {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let start = (std::process::id().wrapping_mul(7919) ^ nanos) % SPAN;
        let _ = NEXT.compare_exchange(u32::MAX, start, Ordering::SeqCst, Ordering::SeqCst);
    }
    for _ in 0..SPAN {
        let port = LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN;
        let port = u16::try_from(port).expect("port fits u16");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOW}..{}", LOW + SPAN);
}

/// Embedded script hash, as the filter computes it.
pub fn script_sha() -> String {
    ratelimit_core::sha1::sha1_hex(ratelimit_core::decision_script().as_bytes())
}

/// The decision library's function as the filter calls it by default (`FCALL`).
pub fn decision_function() -> ratelimit_core::program::Program {
    ratelimit_core::program::Program::new(ratelimit_core::program::CallKind::Function)
}
