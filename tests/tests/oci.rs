//! The module as users get it. `make oci` writes target/dist (the module and its sha256) and a
//! Wasm OCI image layout in target/oci; here that image goes through a real registry (CNCF
//! Distribution, Debian's `docker-registry`, on loopback) and back with skopeo, and Envoy
//! limits requests with the module taken out of the pulled image. A rebuild of the image from
//! the same module must give the same manifest digest.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use e2e::procs::{envoy_config, Process, Webdis, WorkDir};
use e2e::{free_port, get, root, wait_for, wasm_path, Envoy, Redis};
use serde_json::Value;

/// The image's tag: the workspace version, which this crate shares.
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The demo policy in envoy/envoy.yaml: capacity 10.
const CAPACITY: usize = 10;
/// The repository the image is pushed to.
const REPOSITORY: &str = "ratelimit-filter";
/// How long the registry may take to listen on a loaded machine.
const REGISTRY_START: Duration = Duration::from_secs(60);

/// target/oci, written by `make oci`.
fn layout() -> PathBuf {
    let path = root().join("target/oci");
    assert!(
        path.join("index.json").exists(),
        "{} is missing: run `make oci` (make e2e-test does) first",
        path.display()
    );
    path
}

/// target/dist/ratelimit_filter.wasm, written by `make oci`.
fn dist_module() -> PathBuf {
    let path = root().join("target/dist/ratelimit_filter.wasm");
    assert!(
        path.exists(),
        "{} is missing: run `make oci` first",
        path.display()
    );
    path
}

/// The sha256 that target/dist/ratelimit_filter.wasm.sha256 publishes.
fn published_sha256() -> String {
    let file = root().join("target/dist/ratelimit_filter.wasm.sha256");
    let text = fs::read_to_string(&file).expect("read the .sha256 file");
    let (sha, name) = text.trim().split_once("  ").expect("sha256sum format");
    assert_eq!(name, "ratelimit_filter.wasm", "{}", file.display());
    sha.to_string()
}

/// Runs `command`; panics with its output if it fails. Returns its stdout.
fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e} (make setup-oci installs it)"));
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sha256_of(file: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(file));
    out.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn read_json(file: &Path) -> Value {
    let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    layout.join("blobs/sha256").join(hex)
}

/// The manifest digest of the one image in `layout`, which must be tagged `tag`.
fn manifest_digest(layout: &Path, tag: &str) -> String {
    let index = read_json(&layout.join("index.json"));
    let manifests = index["manifests"].as_array().expect("index manifests");
    assert_eq!(manifests.len(), 1, "one image in {}", layout.display());
    let manifest = &manifests[0];
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.ref.name"],
        tag,
        "the tag in {}",
        layout.display()
    );
    manifest["digest"].as_str().expect("digest").to_string()
}

/// Checks that the image tagged `tag` in `layout` is a Wasm image of the "compat" variant
/// (one tar+gzip layer holding only `plugin.wasm`, 0644, owner 0:0, mtime 0), and extracts
/// the module into `out`; returns its path.
fn extract_module(layout: &Path, tag: &str, out: &Path) -> PathBuf {
    let digest = manifest_digest(layout, tag);
    let manifest_blob = blob(layout, &digest);
    assert_eq!(
        format!("sha256:{}", sha256_of(&manifest_blob)),
        digest,
        "the manifest blob is what its digest names"
    );
    let manifest = read_json(&manifest_blob);
    assert_eq!(
        manifest["annotations"]["module.wasm.image/variant"],
        "compat"
    );
    let config = read_json(&blob(
        layout,
        manifest["config"]["digest"].as_str().expect("config"),
    ));
    assert_eq!(config["created"], "1970-01-01T00:00:00Z");
    assert!(config.get("history").is_none(), "no history: {config}");
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "one layer: {manifest}");
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let layer = blob(layout, layers[0]["digest"].as_str().expect("layer digest"));
    let listing = run(Command::new("tar")
        .args(["-tvzf"])
        .arg(&layer)
        .args(["--numeric-owner", "--full-time"]));
    let entries: Vec<Vec<&str>> = listing
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(entries.len(), 1, "one file in the layer:\n{listing}");
    let entry = &entries[0];
    assert_eq!(
        (entry[0], entry[1], entry[3], entry[4], entry[5]),
        ("-rw-r--r--", "0/0", "1970-01-01", "00:00:00", "plugin.wasm"),
        "{listing}"
    );
    fs::create_dir_all(out).expect("create extraction dir");
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&layer)
        .arg("-C")
        .arg(out)
        .arg("plugin.wasm"));
    out.join("plugin.wasm")
}

/// A CNCF Distribution registry on a free loopback port: plain HTTP, no auth, storage in the
/// test's WorkDir. Stopped by PID when dropped.
struct Registry {
    port: u16,
    _process: Process,
}

impl Registry {
    fn start(dir: &WorkDir) -> Registry {
        const ATTEMPTS: u32 = 5;
        for attempt in 1..=ATTEMPTS {
            let port = free_port();
            let config = dir.file(&format!("registry-{port}.yml"));
            let storage = dir.file("registry-storage");
            fs::write(
                &config,
                format!(
                    "version: 0.1\n\
                     log:\n  level: info\n\
                     storage:\n  filesystem:\n    rootdirectory: {}\n\
                     http:\n  addr: 127.0.0.1:{port}\n",
                    storage.display()
                ),
            )
            .expect("write registry config");
            let mut process = Process::spawn(
                "docker-registry",
                Command::new("docker-registry").arg("serve").arg(&config),
                dir.file(&format!("registry-{port}.log")),
            );
            let listening = format!("listening on 127.0.0.1:{port}");
            let up = wait_for("the registry to answer /v2/", REGISTRY_START, || {
                if process.exited().is_some() {
                    return Some(false);
                }
                // Its own log first: a 200 from whoever else holds the port is not enough.
                if !process.log_text().contains(&listening) {
                    return None;
                }
                get(port, "/v2/", &[])
                    .ok()
                    .filter(|r| r.status == 200)
                    .map(|_| true)
            });
            if up {
                return Registry {
                    port,
                    _process: process,
                };
            }
            if attempt == ATTEMPTS || !process.log_text().contains("address already in use") {
                process.fail_exited();
            }
        }
        unreachable!("every attempt returns or fails")
    }

    fn reference(&self) -> String {
        format!("docker://127.0.0.1:{}/{REPOSITORY}:{VERSION}", self.port)
    }
}

/// skopeo with no signature policy to satisfy (the test registry holds no signatures).
fn skopeo() -> Command {
    let mut command = Command::new("skopeo");
    command.arg("--insecure-policy");
    command
}

#[test]
fn the_image_goes_through_a_registry_and_envoy_limits_with_the_pulled_module() {
    let layout = layout();
    let local_digest = manifest_digest(&layout, VERSION);
    let dir = WorkDir::new("oci-registry");
    let registry = Registry::start(&dir);

    let digest_file = dir.file("pushed.digest");
    run(skopeo()
        .args(["copy", "--dest-tls-verify=false", "--digestfile"])
        .arg(&digest_file)
        .arg(format!("oci:{}:{VERSION}", layout.display()))
        .arg(registry.reference()));
    let pushed = fs::read_to_string(&digest_file).expect("read digest file");
    assert_eq!(pushed.trim(), local_digest, "pushed as built");
    // The registry itself says which manifest the tag names.
    let answer = get(
        registry.port,
        &format!("/v2/{REPOSITORY}/manifests/{VERSION}"),
        &[("accept", b"application/vnd.oci.image.manifest.v1+json")],
    )
    .expect("ask the registry for the manifest");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        answer.header("docker-content-digest"),
        Some(local_digest.as_str())
    );

    let pulled = dir.file("pulled");
    run(skopeo()
        .args(["copy", "--src-tls-verify=false"])
        .arg(registry.reference())
        .arg(format!("oci:{}:{VERSION}", pulled.display())));
    assert_eq!(manifest_digest(&pulled, VERSION), local_digest);
    let module = extract_module(&pulled, VERSION, &dir.file("extracted"));
    assert_eq!(sha256_of(&module), published_sha256());
    assert_eq!(sha256_of(&module), sha256_of(&dist_module()));

    // Envoy with the shipped config, its module the one from the pulled image.
    let redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let built = format!("filename: {}", wasm_path().display());
    let from_image = format!("filename: {}", module.display());
    let edits = [(built.as_str(), from_image.as_str())];
    let (port, admin_port) = (free_port(), free_port());
    let yaml = envoy_config(port, admin_port, webdis.port, &edits);
    let envoy = Envoy::start_config(&dir, port, admin_port, &yaml, 2);
    let running = fs::read_to_string(&envoy.config_path).expect("read envoy config");
    assert!(running.contains(&from_image) && !running.contains(&built));

    for i in 0..CAPACITY {
        let r = envoy.keyed("oci");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        let remaining = (CAPACITY - 1 - i).to_string();
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(remaining.as_str()),
            "request {i}"
        );
    }
    let r = envoy.keyed("oci");
    assert_eq!(r.status, 429, "request {CAPACITY}: {}", r.text());
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    envoy.wait_counter("ratelimit_allowed", CAPACITY as u64);
    envoy.wait_counter("ratelimit_denied", 1);
}

/// The seconds of the clock, to see a second pass between two builds.
fn clock_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[test]
fn a_rebuild_from_the_same_module_gives_the_same_digest() {
    let shipped = manifest_digest(&layout(), VERSION);
    let dir = WorkDir::new("oci-reproducible");
    let script = root().join("deploy/oci-image.sh");

    let first_second = clock_second();
    run(Command::new(&script)
        .arg(dist_module())
        .arg(VERSION)
        .arg(dir.file("first")));
    // The second build: at least a second later, from a copy of the module with another
    // name and mtime, in another time zone: none of it may reach the image.
    wait_for("the clock to pass a second", Duration::from_secs(5), || {
        (clock_second() > first_second).then_some(())
    });
    let copy = dir.file("copy-of-module.wasm");
    fs::copy(dist_module(), &copy).expect("copy module");
    run(Command::new(&script)
        .env("TZ", "Asia/Tokyo")
        .arg(&copy)
        .arg(VERSION)
        .arg(dir.file("second")));

    let first = manifest_digest(&dir.file("first"), VERSION);
    let second = manifest_digest(&dir.file("second"), VERSION);
    println!("target/oci {shipped}\nfirst      {first}\nsecond     {second}");
    assert_eq!(first, second, "two builds, two digests");
    assert_eq!(first, shipped, "target/oci was built from another module");

    let module = extract_module(&dir.file("second"), VERSION, &dir.file("extracted"));
    assert_eq!(sha256_of(&module), published_sha256());
}
