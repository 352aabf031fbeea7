//! The shipped configuration decides, end to end (real Envoy, Webdis and Redis from the shipped
//! configs on free loopback ports, each test its own): a fresh key gets exactly its capacity
//! then 429, keys are independent, hostile keys get ordinary buckets of their own, a readable
//! identity never meets its digest's bucket, and two Envoys share one limit exactly.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use e2e::procs::{Webdis, WorkDir};
use e2e::shipped::{assert_full_bucket_then_limited, hit};
use e2e::{get, Envoy, Redis, Stack};

/// The Redis key of the demo rule's bucket for API key `api_key`, as `envoy`'s filter names it.
fn bucket_key(envoy: &Envoy, api_key: &[u8]) -> String {
    envoy.keys().shipped_bucket(api_key)
}

fn digest(identity: &[u8]) -> String {
    ratelimit_core::sha1::sha1_hex(identity)
}

#[test]
fn fresh_key_gets_exactly_capacity_then_429() {
    let stack = Stack::start("e2e-capacity", &[]);
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
    let stack = Stack::start("e2e-independent", &[]);
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
        let tokens = stack.redis.hash_field(&expected, "tokens");
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
    let stack = Stack::start("e2e-hostile-hashed", &[]);
    assert_hostile_keys_get_ordinary_buckets(&stack, false);
}

#[test]
fn hostile_keys_stay_intact_when_identities_are_readable() {
    // Readable keys put the client's bytes themselves into the Webdis URL.
    let stack = Stack::start(
        "e2e-hostile-readable",
        &[("\"hash_identities\": true", "\"hash_identities\": false")],
    );
    assert_hostile_keys_get_ordinary_buckets(&stack, true);
}

#[test]
fn a_readable_identity_never_shares_the_bucket_of_its_digest() {
    let stack = Stack::start(
        "e2e-readable-vs-digest",
        &[("\"hash_identities\": true", "\"hash_identities\": false")],
    );
    // "a b" has a space, so it is hashed even here; its digest is 40 printable bytes, so as
    // an identity of its own it stays readable. Without the `=` that marks a readable
    // identity, both would be `{header:x-api-key:<hex>}`.
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
