//! Test harness: starts real Redis, Webdis and Envoy processes on free loopback ports from the
//! project's shipped configs, polls them until ready, and stops them by PID when dropped.
//! Also a minimal HTTP/1.1 client and a minimal Redis (RESP) client, so the tests need no crates.

pub mod http;
pub mod procs;
pub mod resp;

pub use http::{get, Response};
pub use procs::{Envoy, Redis, Stack, Webdis, WorkDir};
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
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free TCP port on 127.0.0.1 (the OS picks it; the listener is closed again at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// Embedded script hash, as the filter computes it.
pub fn script_sha() -> String {
    ratelimit_core::sha1::sha1_hex(ratelimit_core::TOKEN_BUCKET_LUA.as_bytes())
}
