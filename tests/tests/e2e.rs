//! End to end: real Envoy (with the release filter), Webdis and Redis, started from the shipped
//! configs on free loopback ports. Each test has its own processes, so none depends on another.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::procs::{envoy_config, filter_config_edit, validate_config, Webdis, WorkDir};
use e2e::{free_port, get, root, wait_for, Envoy, Redis, Response, Stack};

/// The demo policy in envoy/envoy.yaml: capacity 10, 10 tokens per minute.
const CAPACITY: usize = 10;

/// The Redis key of the demo rule's bucket for API key `api_key`, as `envoy`'s filter names it.
fn bucket_key(envoy: &Envoy, api_key: &[u8]) -> String {
    envoy.keys().shipped_bucket(api_key)
}

fn digest(identity: &[u8]) -> String {
    ratelimit_core::sha1::sha1_hex(identity)
}

fn hit(envoy: &Envoy, api_key: Option<&[u8]>) -> Response {
    match api_key {
        Some(key) => envoy.keyed(key),
        None => envoy.send("/", &[]),
    }
}

/// A fresh bucket: exactly CAPACITY requests pass, counting down, then 429 with the headers.
fn assert_full_bucket_then_limited(envoy: &Envoy, api_key: Option<&[u8]>) {
    let who = api_key.map(|k| String::from_utf8_lossy(&k[..k.len().min(40)]).into_owned());
    for i in 0..CAPACITY {
        let r = hit(envoy, api_key);
        assert_eq!(r.status, 200, "request {i} for {who:?}: {}", r.text());
        assert_eq!(r.header("x-ratelimit-limit"), Some("10"), "request {i}");
        let remaining = (CAPACITY - 1 - i).to_string();
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(remaining.as_str()),
            "request {i} for {who:?}"
        );
    }
    let r = hit(envoy, api_key);
    assert_eq!(r.status, 429, "request {CAPACITY} for {who:?}");
    // One token every 6 s at 10 per minute; whole again in 60 s.
    assert_eq!(r.header("retry-after"), Some("6"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("60"));
    assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(r.text(), "rate limit exceeded\n");
    // Set by Envoy for a local reply's text body (the filter does not send it twice).
    assert_eq!(r.header("content-type"), Some("text/plain"));
}

/// The shipped configuration with `edits` (its bridge timeout and breaker as shipped: a
/// loaded machine must not turn decisions into requests let through by policy).
fn shipped_stack(name: &str, edits: &[(&str, &str)]) -> Stack {
    Stack::start(name, edits)
}

#[test]
fn fresh_key_gets_exactly_capacity_then_429() {
    let stack = shipped_stack("e2e-capacity", &[]);
    assert_full_bucket_then_limited(&stack.envoy, Some(b"alice"));
    assert_eq!(stack.envoy.counter("ratelimit_allowed"), 10);
    assert_eq!(stack.envoy.counter("ratelimit_denied"), 1);
    assert_eq!(stack.envoy.counter("ratelimit_bridge_errors"), 0);
    // The identity is stored as a digest, never in clear.
    let keys = stack.redis.admin().cmd(&["KEYS", "*"]).unwrap().text();
    let expected = bucket_key(&stack.envoy, b"alice");
    assert!(expected.contains(&digest(b"alice")) && !expected.contains("alice"));
    assert_eq!(keys, format!("[{expected}]"));
}

#[test]
fn keys_are_independent_and_requests_without_a_key_are_limited_by_ip() {
    let stack = shipped_stack("e2e-independent", &[]);
    assert_full_bucket_then_limited(&stack.envoy, Some(b"key-a"));
    assert_full_bucket_then_limited(&stack.envoy, Some(b"key-b"));
    assert_eq!(hit(&stack.envoy, Some(b"key-a")).status, 429);
    // No API key (or an empty one): the client IP's bucket, shared by both.
    assert_full_bucket_then_limited(&stack.envoy, None);
    assert_eq!(hit(&stack.envoy, Some(b"")).status, 429);
    let ip_key =
        stack
            .envoy
            .keys()
            .limit_key("per_client", "per_minute", "client_ip", b"127.0.0.1");
    let exists = stack.redis.admin().cmd(&["EXISTS", &ip_key]).unwrap().int();
    assert_eq!(exists, 1, "bucket of 127.0.0.1, port stripped");
}

/// Keys that would add, shift or alter script arguments if put in the Webdis URL unencoded.
fn hostile_keys() -> Vec<Vec<u8>> {
    vec![
        b"a/b".to_vec(),
        b"a+b".to_vec(),
        b"a b".to_vec(),
        b"100%".to_vec(),
        b"%2F".to_vec(),
        b"key.json".to_vec(),
        b"key.txt".to_vec(),
        b"0".to_vec(),
        "clé-ünïcødé-鍵".as_bytes().to_vec(),
        vec![b'k'; 8192],
        b"a/1000000/1000000".to_vec(),
        b"x/1000000/1000000/1/1".to_vec(),
        b"?q=1#frag".to_vec(),
    ]
}

fn assert_hostile_keys_get_ordinary_buckets(stack: &Stack, readable: bool) {
    for key in hostile_keys() {
        assert_full_bucket_then_limited(&stack.envoy, Some(&key));
    }
    // "a+b" and "a b" are different callers: a `+` decoded to a space would merge them.
    let keys = stack.redis.admin().cmd(&["KEYS", "*"]).unwrap().items();
    assert_eq!(
        keys.len(),
        hostile_keys().len(),
        "one bucket each: {keys:?}"
    );
    for key in hostile_keys() {
        let printable = key.len() <= 128
            && key
                .iter()
                .all(|&b| b.is_ascii_graphic() && b != b'{' && b != b'}');
        let expected = bucket_key(&stack.envoy, &key);
        // Readable (`{label=identity}`) exactly when asked for and printable, else hashed.
        let readable_form = format!("={}}}", String::from_utf8_lossy(&key));
        assert_eq!(
            expected.contains(&readable_form),
            readable && printable,
            "{expected}"
        );
        assert_eq!(
            expected.contains(&digest(&key)),
            !(readable && printable),
            "{expected}"
        );
        let tokens = stack
            .redis
            .admin()
            .cmd(&["HGET", &expected, "tokens"])
            .unwrap()
            .text();
        // Drained by exactly this key's requests (what refilled since is a fraction of a token).
        let tokens: f64 = tokens.parse().unwrap_or(f64::NAN);
        assert!(
            tokens < 1.0,
            "bucket {expected} should exist and be drained: {tokens}"
        );
    }
    assert_eq!(stack.envoy.counter("ratelimit_bridge_errors"), 0);
}

#[test]
fn hostile_keys_each_get_their_own_ordinary_bucket() {
    let stack = shipped_stack("e2e-hostile-hashed", &[]);
    assert_hostile_keys_get_ordinary_buckets(&stack, false);
}

#[test]
fn hostile_keys_stay_intact_when_identities_are_readable() {
    // Readable keys put the client's bytes themselves into the Webdis URL.
    let stack = shipped_stack(
        "e2e-hostile-readable",
        &[("\"hash_identities\": true", "\"hash_identities\": false")],
    );
    assert_hostile_keys_get_ordinary_buckets(&stack, true);
}

#[test]
fn a_readable_identity_never_shares_the_bucket_of_its_digest() {
    let stack = shipped_stack(
        "e2e-readable-vs-digest",
        &[("\"hash_identities\": true", "\"hash_identities\": false")],
    );
    // "a b" has a space, so it is hashed even here; its digest is 40 printable bytes, so as
    // an identity of its own it stays readable. Both used to be `{header:x-api-key:<hex>}`.
    let hashed = b"a b";
    let hex = digest(hashed);
    assert_full_bucket_then_limited(&stack.envoy, Some(hashed));
    assert_full_bucket_then_limited(&stack.envoy, Some(hex.as_bytes()));
    let mut keys = stack.redis.admin().cmd(&["KEYS", "*"]).unwrap().items();
    keys.sort_by_key(|k| k.text());
    let keys: Vec<String> = keys.iter().map(|k| k.text()).collect();
    let (hashed_key, readable_key) = (
        bucket_key(&stack.envoy, hashed),
        bucket_key(&stack.envoy, hex.as_bytes()),
    );
    assert!(hashed_key.contains(&format!(":{hex}}}")), "{hashed_key}");
    assert!(
        readable_key.contains(&format!("={hex}}}")),
        "{readable_key}"
    );
    assert_eq!(keys, [hashed_key, readable_key]);
}

#[test]
fn webdis_down_fails_open_at_once() {
    // Patient, so that nothing fails before Webdis is stopped.
    let mut stack = shipped_stack("e2e-webdis-down-open", &[]);
    assert_eq!(hit(&stack.envoy, Some(b"k")).status, 200);
    stack.webdis.process.stop();
    for _ in 0..5 {
        let started = Instant::now();
        let r = hit(&stack.envoy, Some(b"k"));
        let took = started.elapsed();
        assert_eq!(r.status, 200, "fail open lets the request through");
        assert_eq!(
            r.header("x-ratelimit-limit"),
            None,
            "no decision, no headers"
        );
        // Connection refused is immediate: far below the 5 s timeout.
        assert!(took < Duration::from_millis(1000), "took {took:?}");
    }
    assert_eq!(stack.envoy.counter("ratelimit_failure_mode_open"), 5);
    assert_eq!(stack.envoy.counter("ratelimit_bridge_errors"), 5);
    let log = stack.envoy.process.log_text();
    let warnings = log
        .matches("bridge failure, failure policy applied")
        .count();
    // One line per worker per 10 s at most (2 workers), not one per request.
    assert!(
        (1..=2).contains(&warnings),
        "{warnings} failure lines:\n{log}"
    );
}

#[test]
fn webdis_down_fails_closed_with_503() {
    let mut stack = shipped_stack(
        "e2e-webdis-down-closed",
        &[("\"failure_mode\": \"open\"", "\"failure_mode\": \"closed\"")],
    );
    assert_eq!(hit(&stack.envoy, Some(b"k")).status, 200);
    stack.webdis.process.stop();
    let r = hit(&stack.envoy, Some(b"k"));
    assert_eq!(r.status, 503);
    assert_eq!(r.text(), "rate limiter unavailable\n");
    assert_eq!(stack.envoy.counter("ratelimit_failure_mode_closed"), 1);
    assert_eq!(stack.envoy.counter("ratelimit_failure_mode_open"), 0);
}

#[test]
fn webdis_hung_costs_a_request_its_timeout_until_the_breaker_opens_and_decisions_come_back() {
    // The shipped timeout and breaker, which this test is about; it starts once a request is
    // decided with every breaker closed.
    let stack = Stack::start("e2e-webdis-hung", &[]);
    assert_eq!(stack.envoy.wait_deciding("k").status, 200);
    let failed_open = stack.envoy.counter("ratelimit_failure_mode_open");
    stack.webdis.process.pause();
    // One request at a time: each call has no answer for its 150 ms timeout (of the worker's
    // own time, never past the 1 s lag allowance on top), and with no other request waiting
    // it is one failure of the breaker's run; five in a row open it, and from then on the
    // worker answers at once.
    let mut took = Vec::new();
    while stack.envoy.counter("ratelimit_breaker_trips") == 0 {
        assert!(took.len() < 30, "no breaker opened: {took:?}");
        let started = Instant::now();
        let r = hit(&stack.envoy, Some(b"k"));
        took.push(started.elapsed());
        assert_eq!(r.status, 200, "fail open");
        assert!(r.header("x-ratelimit-limit").is_none(), "not decided");
    }
    assert!(
        took.iter().all(|t| *t < Duration::from_millis(1150)),
        "a request waited past its timeout and the lag allowance: {took:?}"
    );
    assert!(took.len() >= 5, "five calls in a row fail first: {took:?}");
    assert!(stack.envoy.stat("wasmcustom.ratelimit_breaker_open") >= 1);
    assert_eq!(
        stack.envoy.counter("ratelimit_failure_mode_open"),
        failed_open + took.len() as u64
    );
    assert_eq!(
        stack.envoy.counter("ratelimit_bridge_timeouts"),
        took.len() as u64,
        "each counted as a timeout"
    );
    stack.webdis.process.resume();
    // A probe (one per 500 ms), or the late answer of a call given up on, closes the
    // breaker; decisions come back.
    wait_for("decisions to come back", Duration::from_secs(5), || {
        hit(&stack.envoy, Some(b"k"))
            .header("x-ratelimit-limit")
            .map(|_| ())
    });
    wait_for("every breaker closed", Duration::from_secs(5), || {
        hit(&stack.envoy, Some(b"k"));
        (stack.envoy.stat("wasmcustom.ratelimit_breaker_open") == 0).then_some(())
    });
}

#[test]
fn redis_restart_needs_no_manual_step() {
    // One worker: it sees the restart itself and forgets its refusals at once. (With several,
    // the others forget theirs at their next tick: the engine's unit tests cover that.)
    let dir = WorkDir::new("e2e-redis-restart");
    let mut redis = Redis::start(&dir);
    let webdis = Webdis::start(&dir, redis.port);
    let (port, admin_port) = (free_port(), free_port());
    let config = envoy_config(port, admin_port, webdis.port, &[]);
    let envoy = Envoy::start_config(&dir, port, admin_port, &config, 1);
    assert_full_bucket_then_limited(&envoy, Some(b"before"));
    // The worker holds the refusal in its deny cache once it answers from it.
    let hits = envoy.counter("ratelimit_deny_cache_hits");
    wait_for(
        "a refusal answered from the deny cache",
        Duration::from_secs(5),
        || {
            assert_eq!(hit(&envoy, Some(b"before")).status, 429);
            (envoy.counter("ratelimit_deny_cache_hits") > hits).then_some(())
        },
    );
    let resets = envoy.counter("ratelimit_deny_cache_resets");
    redis.restart();
    // Webdis reconnects within about half a second; until then requests fail open.
    wait_for(
        "decisions to come back after the restart",
        Duration::from_secs(20),
        || {
            hit(&envoy, Some(b"probe"))
                .header("x-ratelimit-limit")
                .map(|_| ())
        },
    );
    // Redis lost the script: the filter loaded it again by itself, and forgot the refusals
    // Redis made before (the buckets are gone: "before" starts full again).
    assert!(envoy.counter("ratelimit_script_loads") >= 2);
    assert!(envoy.counter("ratelimit_deny_cache_resets") > resets);
    assert_full_bucket_then_limited(&envoy, Some(b"before"));
    assert_full_bucket_then_limited(&envoy, Some(b"after"));
}

#[test]
fn two_envoys_sharing_redis_allow_exactly_capacity_in_total() {
    const CAP: usize = 50;
    const CONNECTIONS_PER_ENVOY: usize = 8;
    const REQUESTS_PER_CONNECTION: usize = 15;
    let dir = WorkDir::new("e2e-global");
    let redis = Redis::start(&dir);
    // Each replica has its own Webdis, as it would next to each Envoy; Redis is the one shared
    // part. Negligible refill (50 per day), the shipped timeout and breaker: failures are
    // counted and must be zero, even on a loaded machine.
    let edits = [(
        "\"limit\": 10, \"window\": \"1m\"",
        "\"limit\": 50, \"window\": \"1d\"",
    )];
    let webdis: Vec<Webdis> = (0..2).map(|_| Webdis::start(&dir, redis.port)).collect();
    let envoys: Vec<Envoy> = webdis
        .iter()
        .map(|w| Envoy::start(&dir, w.port, &edits))
        .collect();

    let allowed = Arc::new(AtomicUsize::new(0));
    let denied = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for envoy in &envoys {
            for _ in 0..CONNECTIONS_PER_ENVOY {
                let (allowed, denied, port) = (allowed.clone(), denied.clone(), envoy.port);
                scope.spawn(move || {
                    for _ in 0..REQUESTS_PER_CONNECTION {
                        let r = get(port, "/", &[("x-api-key", b"shared-hot-key")]).unwrap();
                        match r.status {
                            200 => allowed.fetch_add(1, Ordering::SeqCst),
                            429 => denied.fetch_add(1, Ordering::SeqCst),
                            other => panic!("unexpected status {other}"),
                        };
                    }
                });
            }
        }
    });
    let total = 2 * CONNECTIONS_PER_ENVOY * REQUESTS_PER_CONNECTION;
    for envoy in &envoys {
        assert_eq!(envoy.counter("ratelimit_bridge_errors"), 0);
        assert!(
            envoy.counter("ratelimit_allowed") > 0,
            "both replicas took part"
        );
    }
    assert_eq!(
        allowed.load(Ordering::SeqCst),
        CAP,
        "allowed across both replicas"
    );
    assert_eq!(denied.load(Ordering::SeqCst), total - CAP);
}

#[test]
fn bad_filter_config_stops_envoy_and_names_the_field() {
    let dir = WorkDir::new("e2e-bad-config");
    let cases = [
        (
            "\"limit\": 10",
            "\"limit\": 0",
            "rules[0].limits[0].limit: must be >= 1",
        ),
        (
            "\"window\": \"1m\"",
            "\"window\": \"0s\"",
            "rules[0].limits[0].window: must be > 0",
        ),
        (
            "\"token_bucket\"",
            "\"leaky_bucket\"",
            "rules[0].limits[0].algorithm: unknown variant `leaky_bucket`",
        ),
        (
            "\"failure_mode\": \"open\"",
            "\"failure_mode\": \"sometimes\"",
            "failure_mode: unknown variant `sometimes`",
        ),
        (
            "\"timeout\": \"150ms\"",
            "\"timeout\": \"0ms\"",
            "bridge.timeout: must be between 1ms and 60s",
        ),
        (
            "\"key_prefix\": \"rl:\"",
            "\"key_prefx\": \"rl:\"",
            "key_prefx: unknown field `key_prefx`",
        ),
    ];
    for (from, to, message) in cases {
        // Webdis is never reached: the config is refused before any request.
        let mut envoy = Envoy::launch(&dir, 1, &[(from, to)]);
        let status = envoy
            .process
            .wait_exit(Duration::from_secs(30))
            .expect("envoy should exit on a bad filter config");
        assert!(!status.success(), "{to}: exit status {status}");
        let log = envoy.process.log_text();
        assert!(
            log.contains(&format!("invalid filter configuration: {message}")),
            "{to}: log does not name the field:\n{log}"
        );
    }
}

#[test]
fn over_bound_configs_fail_validation_naming_the_field() {
    let dir = WorkDir::new("e2e-over-bound");
    let limit = "\"algorithm\": \"token_bucket\", \"limit\": 10, \"window\": \"1m\"";
    // Five rules applying to every request, 13 limits each: 65 limits in one call.
    let limits: Vec<String> = (0..13)
        .map(|j| format!(r#"{{"name": "l{j}", "limit": 1, "window": "1s"}}"#))
        .collect();
    let rules: Vec<String> = (0..5)
        .map(|i| format!(r#"{{"name": "r{i}", "limits": [{}]}}"#, limits.join(", ")))
        .collect();
    let (filter_from, filter_to) =
        filter_config_edit(&format!(r#"{{"rules": [{}]}}"#, rules.join(", ")));
    let cases = [
        (
            limit.to_string(),
            limit.replace("\"1m\"", "\"99999999999d\""),
            "rules[0].limits[0].window: must be at most 366d",
        ),
        (
            limit.to_string(),
            limit.replace("10", "1000000000001"),
            "rules[0].limits[0].limit: must be at most 1000000000000",
        ),
        (
            limit.to_string(),
            limit.replace("\"1m\"", "\"366d\", \"burst\": 30"),
            "rules[0].limits[0].burst: the state would live burst / limit × window, longer than 732d: lower burst or window",
        ),
        (
            limit.to_string(),
            limit
                .replace("token_bucket", "sliding_window_log")
                .replace("10", "10001"),
            "rules[0].limits[0].limit: sliding_window_log keeps one entry per unit: must be at most 10000",
        ),
        (
            filter_from,
            filter_to,
            "rules[0]: a request it matches can carry 65 limits",
        ),
    ];
    for (i, (from, to, message)) in cases.iter().enumerate() {
        let yaml = envoy_config(free_port(), free_port(), 1, &[(from.as_str(), to.as_str())]);
        let path = dir.file(&format!("over-bound-{i}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let (ok, output) = validate_config(&root(), &path);
        assert!(!ok, "case {i} validated:\n{output}");
        assert!(
            output.contains(&format!("invalid filter configuration: {message}")),
            "case {i}: the output does not name the field:\n{output}"
        );
    }
}

#[test]
fn shipped_envoy_configs_validate() {
    e2e::wasm_path();
    let mut checked = Vec::new();
    let envoy = root().join("envoy");
    for dir in [envoy.clone(), envoy.join("examples"), envoy.join("cluster")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let (ok, output) = validate_config(&root(), &path);
                assert!(ok, "{} does not validate:\n{output}", path.display());
                assert!(output.contains("OK"), "{output}");
                let name = path.strip_prefix(&envoy).unwrap();
                checked.push(name.to_string_lossy().into_owned());
            }
        }
    }
    checked.sort();
    assert_eq!(
        checked,
        [
            "cluster/envoy.yaml",
            "envoy.yaml",
            "examples/internal_shadow.yaml",
            "examples/llm_tokens.yaml",
            "examples/login_per_ip.yaml",
            "examples/public_api_tiers.yaml",
            "examples/remote_module.yaml"
        ]
    );
}

#[test]
fn webdis_with_the_shipped_config_refuses_everything_but_the_limiter() {
    let stack = shipped_stack("e2e-lockdown", &[]);
    assert_eq!(hit(&stack.envoy, Some(b"k")).status, 200);
    let port = stack.webdis.port;
    let auth = stack.webdis.authorization();
    let with_auth: [(&str, &[u8]); 1] = [("authorization", &auth)];
    for path in [
        "/FLUSHALL",
        "/KEYS/*",
        "/CONFIG/GET/*",
        "/EVAL/return%201/0",
        "/EVAL/return%20redis.call('FLUSHALL')/0",
        "/SET/rl:x/1",
        "/DEL/rl:x",
        "/HSET/rl:x/tokens/999",
    ] {
        let r = get(port, path, &with_auth).unwrap();
        assert_eq!(
            r.status,
            403,
            "{path} should be refused by Webdis's ACL: {}",
            r.text()
        );
    }
    // Without the credentials even the limiter's own command is refused.
    let sha = e2e::script_sha();
    let r = get(port, &format!("/EVALSHA/{sha}/1/rl:x/1/1/1/1"), &[]).unwrap();
    assert_eq!(r.status, 403);
    // SCRIPT passes Webdis (its ACL cannot tell LOAD from FLUSH), Redis's ACL stops FLUSH.
    let r = get(port, "/SCRIPT/FLUSH", &with_auth).unwrap();
    assert!(r.text().contains("NOPERM"), "{}", r.text());
    // Nothing was flushed: the bucket is still there, and the script too.
    let mut admin = stack.redis.admin();
    assert_eq!(admin.cmd(&["DBSIZE"]).unwrap().int(), 1);
    let exists = admin.cmd(&["SCRIPT", "EXISTS", &sha]).unwrap().items();
    assert_eq!(exists[0].int(), 1);
}
