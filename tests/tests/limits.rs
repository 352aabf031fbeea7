//! The shipped configuration decides, end to end (real Envoy, Webdis and Redis from the shipped
//! configs on free loopback ports, each test its own): a fresh key gets exactly its capacity
//! then 429, keys are independent and held together by the client IP's ceiling (a flood of
//! made-up keys gets what the address gets), hostile keys get ordinary buckets of their own, a
//! readable identity never meets its digest's bucket, and two Envoys share one limit exactly.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use e2e::procs::{Webdis, WorkDir};
use e2e::shipped::{assert_full_bucket_then_limited, hit, IP_CEILING, RAISED_CEILING};
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
    // The identity is stored as a digest, never in clear, beside the address's ceiling.
    let mut keys: Vec<String> = stack
        .redis
        .admin()
        .cmd(&["KEYS", "*"])
        .unwrap()
        .items()
        .iter()
        .map(|k| k.text())
        .collect();
    keys.sort();
    let expected = bucket_key(&stack.envoy, b"alice");
    assert!(expected.contains(&digest(b"alice")) && !expected.contains("alice"));
    let ceiling = ip_bucket(&stack.envoy);
    let mut want = vec![expected, ceiling];
    want.sort();
    assert_eq!(keys, want);
}

/// The Redis key of the per-IP ceiling's bucket of 127.0.0.1.
fn ip_bucket(envoy: &Envoy) -> String {
    envoy
        .keys()
        .limit_key("per_ip", "per_minute", "client_ip", b"127.0.0.1")
}

#[test]
fn keys_are_independent_and_held_together_by_the_ip_ceiling() {
    let stack = Stack::start("e2e-independent", &[]);
    assert_full_bucket_then_limited(&stack.envoy, Some(b"key-a"));
    assert_full_bucket_then_limited(&stack.envoy, Some(b"key-b"));
    assert_eq!(hit(&stack.envoy, Some(b"key-a")).status, 429);
    // Key c's 10 are the address's last 10 (the headers show whichever is whole later).
    let statuses: Vec<u16> = (0..11)
        .map(|_| hit(&stack.envoy, Some(b"key-c")).status)
        .collect();
    assert_eq!(statuses, [[200; 10].as_slice(), &[429]].concat());
    // 30 allowed from 127.0.0.1 in all: a made-up key per request, no key at all or an empty
    // one, every further request is refused by the address's ceiling.
    for i in 0..IP_CEILING {
        let made_up = format!("made-up-{i}");
        let r = hit(&stack.envoy, Some(made_up.as_bytes()));
        assert_eq!(r.status, 429, "{made_up}: {}", r.text());
        assert_eq!(
            r.header("x-ratelimit-limit"),
            Some("30"),
            "the ceiling refuses"
        );
    }
    assert_eq!(hit(&stack.envoy, None).status, 429);
    assert_eq!(hit(&stack.envoy, Some(b"")).status, 429);
    let exists = stack
        .redis
        .admin()
        .cmd(&["EXISTS", &ip_bucket(&stack.envoy)])
        .unwrap()
        .int();
    assert_eq!(exists, 1, "bucket of 127.0.0.1, port stripped");
    assert_eq!(stack.envoy.counter("ratelimit_allowed"), 30);
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
        hostile_keys().len() + 1,
        "one bucket each, and the address's: {keys:?}"
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
    let stack = Stack::start("e2e-hostile-hashed", &[RAISED_CEILING]);
    assert_hostile_keys_get_ordinary_buckets(&stack, false);
}

#[test]
fn hostile_keys_stay_intact_when_identities_are_readable() {
    // Readable keys put the client's bytes themselves into the Webdis URL.
    let stack = Stack::start(
        "e2e-hostile-readable",
        &[
            ("\"hash_identities\": true", "\"hash_identities\": false"),
            RAISED_CEILING,
        ],
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
    let ceiling = ip_bucket(&stack.envoy);
    let keys: Vec<String> = keys
        .iter()
        .map(|k| k.text())
        .filter(|k| *k != ceiling)
        .collect();
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
    let edits = [
        (
            "\"limit\": 10, \"window\": \"1m\"",
            "\"limit\": 50, \"window\": \"1d\"",
        ),
        RAISED_CEILING,
    ];
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
