//! The module fetched over HTTP (envoy/examples/remote_module.yaml, `vm_config.code.remote`):
//! a small server in the test serves the release module on loopback and counts the fetches.
//! With the right sha256 Envoy fetches it once and the filter limits; with a wrong one Envoy
//! fetches it 1 + num_retries times, stays INITIALIZING (no listener) meanwhile, then starts
//! without the filter, and `failure_policy` decides: FAIL_OPEN lets every request through
//! unmetered, FAIL_CLOSED answers 503. Real Envoy, Webdis and Redis.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use e2e::procs::{apply_edits, validate_config, WorkDir};
use e2e::{free_port, get, root, wait_for, wasm_path, Envoy, Redis, Webdis};

const EXAMPLE: &str = "envoy/examples/remote_module.yaml";
const MODULE_PATH: &str = "/ratelimit_filter.wasm";
/// Fetches of a module that never passes its check: the first and the shipped
/// `retry_policy.num_retries` (3, asserted by an edit below).
const ATTEMPTS: usize = 4;
/// How many times Envoy is started on new ports when another process took one first.
const PORT_ATTEMPTS: u32 = 5;
/// What the filter logs once its configuration is read (at info level).
const CONFIGURED: &str = "wasm log ratelimit ratelimit: configured:";
/// How long Envoy may take to fetch, retry (a jittered back-off of about a second each) and
/// start on a loaded machine.
const START: Duration = Duration::from_secs(120);

/// An HTTP server on a loopback port answering `GET /ratelimit_filter.wasm` with the module;
/// it counts those GETs, and holds every answer from the `hold_from`-th on until released.
struct ModuleServer {
    port: u16,
    gets: Arc<AtomicUsize>,
    released: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ModuleServer {
    fn start(module: Vec<u8>, hold_from: usize) -> ModuleServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the module server");
        let port = listener.local_addr().expect("local address").port();
        let gets = Arc::new(AtomicUsize::new(0));
        let released = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, r, s) = (gets.clone(), released.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    // Envoy has given up on this attempt if the answer fails: nothing to do.
                    let _ = answer(stream, &module, hold_from, &g, &r, &s);
                }
            }
        });
        ModuleServer {
            port,
            gets,
            released,
            stop,
            thread: Some(thread),
        }
    }

    fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }

    fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
    }
}

impl Drop for ModuleServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.release();
        // Wakes the accept loop, which then sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads one request off `stream` and answers it (one request per connection).
fn answer(
    mut stream: TcpStream,
    module: &[u8],
    hold_from: usize,
    gets: &AtomicUsize,
    released: &AtomicBool,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
    }
    if stop.load(Ordering::SeqCst) {
        return Ok(());
    }
    if request_line.starts_with(&format!("GET {MODULE_PATH} ")) {
        let n = gets.fetch_add(1, Ordering::SeqCst) + 1;
        while n >= hold_from && !released.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/wasm\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            module.len()
        );
        stream.write_all(head.as_bytes())?;
        stream.write_all(module)
    } else {
        stream
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    }
}

/// The module's sha256 as `sha256sum` prints it, the way a user gets it.
fn module_sha256() -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(wasm_path())
        .output()
        .expect("run sha256sum");
    assert!(out.status.success(), "sha256sum failed");
    let text = String::from_utf8(out.stdout).expect("sha256sum prints text");
    let hex = text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(hex.len(), 64, "{text}");
    hex
}

/// The shipped example on test ports, fetching from `module_port`, expecting `sha256`, with
/// `failure_policy`; returns (listener port, admin port, YAML).
fn example_config(
    module_port: u16,
    webdis_port: u16,
    sha256: &str,
    failure_policy: &str,
) -> (u16, u16, String) {
    let shipped = std::fs::read_to_string(root().join(EXAMPLE)).expect("read the example");
    let (port, admin_port) = (free_port(), free_port());
    let zeros = "0".repeat(64);
    let edits: Vec<(String, String)> = vec![
        (
            "port_value: 9901".into(),
            format!("port_value: {admin_port}"),
        ),
        ("port_value: 10000".into(), format!("port_value: {port}")),
        (
            "port_value: 7379".into(),
            format!("port_value: {webdis_port}"),
        ),
        (
            "port_value: 8000".into(),
            format!("port_value: {module_port}"),
        ),
        (
            format!("uri: http://127.0.0.1:8000{MODULE_PATH}"),
            format!("uri: http://127.0.0.1:{module_port}{MODULE_PATH}"),
        ),
        (
            format!("sha256: \"{zeros}\""),
            format!("sha256: \"{sha256}\""),
        ),
        (
            "failure_policy: FAIL_OPEN".into(),
            format!("failure_policy: {failure_policy}"),
        ),
        // ATTEMPTS counts on it.
        ("num_retries: 3".into(), "num_retries: 3".into()),
    ];
    (port, admin_port, apply_edits(&shipped, &edits))
}

/// Runs `start` (a module server, and an Envoy fetching from it that is LIVE or has exited)
/// until Envoy is LIVE. Should another test process bind one of Envoy's ports first, Envoy
/// exits, and `start` runs again: on new ports, with a fresh count of fetches.
fn with_ports_retried(
    mut start: impl FnMut() -> (ModuleServer, Result<Envoy, Envoy>),
) -> (Envoy, ModuleServer) {
    let mut attempt = 1;
    loop {
        match start() {
            (server, Ok(envoy)) => return (envoy, server),
            (_, Err(envoy))
                if attempt < PORT_ATTEMPTS
                    && envoy.process.log_text().contains("Address already in use") =>
            {
                attempt += 1
            }
            (_, Err(mut envoy)) => envoy.process.fail_exited(),
        }
    }
}

#[test]
fn the_example_validates_as_shipped() {
    // Validation does not fetch the module: it checks the Envoy config around it (the shipped
    // sha256 is a placeholder that matches no module).
    let (ok, output) = validate_config(&root(), &root().join(EXAMPLE));
    assert!(ok, "{EXAMPLE} does not validate:\n{output}");
    assert!(output.contains("OK"), "{output}");
}

#[test]
fn the_module_fetched_once_with_its_sha256_limits_requests() {
    let module = std::fs::read(wasm_path()).expect("read the module");
    let sha256 = module_sha256();
    let dir = WorkDir::new("remote-module");
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let (envoy, server) = with_ports_retried(|| {
        let server = ModuleServer::start(module.clone(), usize::MAX);
        let (port, admin_port, yaml) =
            example_config(server.port, webdis.port, &sha256, "FAIL_OPEN");
        let started = Envoy::launch_config(&dir, port, admin_port, &yaml, 2).wait_live();
        (server, started)
    });
    // One fetch, on the main thread; the workers' VMs are made from it.
    assert_eq!(server.gets(), 1);
    assert_eq!(envoy.stat("wasm.remote_load_fetch_successes"), 1);
    assert_eq!(envoy.stat("wasm.remote_load_fetch_failures"), 0);
    // The filter logs this when it starts (what the wrong-sha256 tests look for in vain).
    assert!(envoy.process.log_text().contains(CONFIGURED));
    for i in 0..10 {
        let r = envoy.keyed("alice");
        assert_eq!(r.status, 200, "request {i}");
        let remaining = (9 - i).to_string();
        assert_eq!(r.header("x-ratelimit-remaining"), Some(remaining.as_str()));
    }
    let r = envoy.keyed("alice");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("6"));
    assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
    assert_eq!(server.gets(), 1, "requests do not fetch the module again");
}

/// Envoy on the example with a wrong sha256 and `failure_policy`: watched while it fetches
/// (the last attempt held by the server), then LIVE. Returns it with what it talks to.
fn started_with_a_wrong_sha256(
    name: &str,
    failure_policy: &str,
) -> (Envoy, ModuleServer, Webdis, Redis, WorkDir) {
    let module = std::fs::read(wasm_path()).expect("read the module");
    // A digest of another module (the right one with its last hex digit changed).
    let right = module_sha256();
    let last = if right.ends_with('0') { "1" } else { "0" };
    let wrong = format!("{}{last}", &right[..63]);
    let dir = WorkDir::new(name);
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let (envoy, server) = with_ports_retried(|| {
        let server = ModuleServer::start(module.clone(), ATTEMPTS);
        let (port, admin_port, yaml) =
            example_config(server.port, webdis.port, &wrong, failure_policy);
        let started = watch_the_fetches(&dir, &server, port, admin_port, &yaml);
        (server, started)
    });
    assert_eq!(server.gets(), ATTEMPTS, "no fetch after the last retry");
    assert_eq!(envoy.stat("wasm.remote_load_fetch_failures"), 1);
    assert_eq!(envoy.stat("wasm.remote_load_fetch_successes"), 0);
    let log = envoy.process.log_text();
    for line in [
        "Retry limit exceeded for fetching data from remote data source.",
        "Plugin ratelimit failed to load",
    ] {
        assert!(log.contains(line), "the log lacks {line:?}:\n{log}");
    }
    // The filter never ran: it logs its configuration when it starts.
    assert!(!log.contains(CONFIGURED), "{log}");
    (envoy, server, webdis, redis, dir)
}

/// Launches Envoy on `yaml` and checks its state while the last fetch is held: still
/// initializing, its listener not bound. Then lets the fetch fail and waits until it is LIVE
/// (Ok) or has exited (Err).
fn watch_the_fetches(
    dir: &WorkDir,
    server: &ModuleServer,
    port: u16,
    admin_port: u16,
    yaml: &str,
) -> Result<Envoy, Envoy> {
    let mut launched = Envoy::launch_config(dir, port, admin_port, yaml, 2);
    let fetched = wait_for("every fetch attempt", START, || {
        if launched.process.exited().is_some() {
            return Some(false);
        }
        (server.gets() == ATTEMPTS).then_some(true)
    });
    if !fetched {
        return Err(launched);
    }
    let ready = wait_for("the admin to answer", START, || {
        get(admin_port, "/ready", &[]).ok()
    });
    // The answer was this Envoy's, not another process's on a port it failed to bind.
    launched.process.assert_running();
    assert_eq!(ready.text().trim(), "INITIALIZING");
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the listener accepts before the module is fetched"
    );
    server.release();
    launched.wait_live()
}

#[test]
fn a_wrong_sha256_with_fail_open_lets_every_request_through_unmetered() {
    let (envoy, _server, _webdis, redis, _dir) =
        started_with_a_wrong_sha256("remote-wrong-sha256-open", "FAIL_OPEN");
    for i in 0..15 {
        let r = envoy.keyed("alice");
        assert_eq!(r.status, 200, "request {i}");
        assert_eq!(r.text(), "hello from behind the rate limiter\n");
        assert_eq!(
            r.header("x-ratelimit-limit"),
            None,
            "request {i} was decided"
        );
    }
    assert_eq!(redis.decision_calls(), 0);
}

#[test]
fn a_wrong_sha256_with_fail_closed_answers_503() {
    let (envoy, _server, _webdis, redis, _dir) =
        started_with_a_wrong_sha256("remote-wrong-sha256-closed", "FAIL_CLOSED");
    for i in 0..3 {
        let r = envoy.keyed("alice");
        assert_eq!(r.status, 503, "request {i}: {}", r.text());
        assert!(r.body.is_empty(), "request {i}: {}", r.text());
    }
    assert_eq!(redis.decision_calls(), 0);
}
