//! The auth recipes end to end: envoy/examples/jwt_plans.yaml (Envoy's jwt_authn, the key and
//! the plan from verified claims) and envoy/examples/ext_authz_plans.yaml (an HTTP ext_authz
//! service naming the caller and its plan), each run as shipped on two Envoys of two workers
//! sharing one Redis, with only what a test must change: a JWKS made by the test in place of
//! the remote one, the authorization service's port.
//!
//! Each shows, counting every answer by status (the limiter is exact: no tolerance): one bucket
//! per caller across both Envoys; each plan's number (pro 20, free 5, anything else 2, all per
//! hour, so nothing refills during a test); unknown or missing plans in the default; anonymous
//! requests in the client IP's bucket; and that nothing a client sends of its own choosing
//! (headers, query parameters, an invalid credential) reaches a caller's bucket or plan: the
//! Redis keys afterwards are exactly the callers' and the IP's, and each caller's allowance is
//! counted whole after the attempts.

use std::collections::{BTreeMap, BTreeSet};

use e2e::auth::{mint_tokens, yaml_block, Fleet, Tally};
use e2e::authz::{AuthzService, Caller, API_KEY};
use e2e::procs::indent_of;
use e2e::{root, wait_for_value};

const JWT_EXAMPLE: &str = "envoy/examples/jwt_plans.yaml";
const EXT_AUTHZ_EXAMPLE: &str = "envoy/examples/ext_authz_plans.yaml";
/// The provider of jwt_plans.yaml.
const ISSUER: &str = "https://idp.example.com/";
const AUDIENCE: &str = "https://api.example.com";
/// The rule and limit of both examples.
const RULE: &str = "api";
const LIMIT: &str = "per_hour";
const SUB: &str = "metadata:envoy.filters.http.jwt_authn:jwt_payload:sub";
const CALLER: &str = "metadata:envoy.filters.http.ext_authz:x-caller-id";
/// The subject of mint_tokens.py's token `zoe`.
const ZOE: &str = "zoë/ü+ x{1}";
/// Every request of a test comes from this address: the anonymous requests' identity.
const CLIENT_IP: &str = "127.0.0.1";
/// Clients sending requests at once.
const CLIENTS: usize = 6;
/// How long a count may take to reach the stats (a worker's next tick, far less).
const STATS: std::time::Duration = std::time::Duration::from_secs(10);

/// `n` answers of which `allowed` got 200 and the rest 429, every one decided under `limit`.
fn exact(n: usize, allowed: usize, limit: u64) -> Tally {
    let mut statuses = BTreeMap::from([(200, allowed)]);
    if n > allowed {
        statuses.insert(429, n - allowed);
    }
    Tally {
        statuses,
        limits: BTreeMap::from([(limit.to_string(), n)]),
    }
}

/// Every answer was decided in Redis (none failed open), `allowed` and `denied` in all, by
/// both Envoys, each of whose two workers took connections.
fn assert_decided_by_both(fleet: &Fleet, allowed: u64, denied: u64) {
    wait_for_value("allowed, both Envoys", STATS, allowed, || {
        fleet.counter("ratelimit_allowed")
    });
    wait_for_value("denied, both Envoys", STATS, denied, || {
        fleet.counter("ratelimit_denied")
    });
    for envoy in &fleet.envoys {
        assert!(envoy.counter("ratelimit_allowed") > 0, "each Envoy decided");
        assert_eq!(envoy.counter("ratelimit_bridge_errors"), 0);
        assert_eq!(envoy.counter("ratelimit_failure_mode_open"), 0);
    }
    let workers = fleet.connections_per_worker();
    assert!(
        workers.iter().flatten().all(|&n| n > 0),
        "every worker took connections: {workers:?}"
    );
}

/// A request's headers: names and raw values.
type Headers = Vec<(&'static str, &'static [u8])>;

/// Requests whose path or headers claim to be alice on the pro plan (or another client IP),
/// as a client may send them: none may count as anything but the sender's own identity.
fn claims_of_the_clients_choosing() -> Vec<(&'static str, Headers)> {
    vec![
        ("/?sub=alice&plan=pro", vec![]),
        ("/?x-caller-id=alice&x-caller-plan=pro", vec![]),
        ("/?jwt_payload.sub=alice&jwt_payload.plan=pro", vec![]),
        ("/", vec![("x-jwt-sub", b"alice"), ("x-jwt-plan", b"pro")]),
        ("/", vec![("sub", b"alice"), ("plan", b"pro")]),
        (
            "/",
            vec![("x-caller-id", b"alice"), ("x-caller-plan", b"pro")],
        ),
        ("/", vec![("x-api-key", b"alice")]),
        // {"sub":"alice","plan":"pro"}, base64url: what jwt_authn's forward_payload_header
        // would carry, were it configured.
        (
            "/",
            vec![("x-jwt-payload", b"eyJzdWIiOiJhbGljZSIsInBsYW4iOiJwcm8ifQ")],
        ),
        ("/", vec![("x-forwarded-for", b"10.1.2.3")]),
    ]
}

/// The shipped jwt_plans.yaml with a local JWKS (`jwks`) in place of the remote one, and
/// without the identity provider's cluster (nothing left uses it; a test resolves no name).
fn jwt_edits(jwks: &str) -> Vec<(String, String)> {
    let yaml = std::fs::read_to_string(root().join(JWT_EXAMPLE)).expect("read the example");
    let remote = yaml_block(&yaml, "remote_jwks:");
    let indent = " ".repeat(indent_of(remote.lines().next().unwrap_or_default()));
    let inline = serde_json::to_string(jwks).expect("a JSON string is a YAML string");
    let local = format!("{indent}local_jwks:\n{indent}  inline_string: {inline}\n");
    let idp = yaml_block(&yaml, "- name: idp");
    vec![(remote, local), (idp, String::new())]
}

#[test]
fn jwt_subjects_and_plans_from_verified_claims_are_exact_across_two_envoys() {
    let minted = mint_tokens(ISSUER, AUDIENCE);
    let fleet = Fleet::start(
        "auth-jwt",
        &root().join(JWT_EXAMPLE),
        &jwt_edits(&minted.jwks),
    );
    let bearer = |name: &str| minted.bearer(name);

    // No token: the client IP's bucket, in the default plan.
    assert_eq!(
        fleet.burst(6, CLIENTS, "/", &[]),
        exact(6, 2, 2),
        "anonymous"
    );

    // Claims of the client's own choosing, without a token: still the client IP, whose
    // bucket is empty now; decided under the default plan's 2, not pro's 20.
    let spoofs = claims_of_the_clients_choosing();
    for (i, (path, headers)) in spoofs.iter().enumerate() {
        let r = fleet.send(i, path, headers);
        assert_eq!(
            (r.status, r.header("x-ratelimit-limit")),
            (429, Some("2")),
            "{path} {headers:?}"
        );
    }

    // Tokens that fail verification, each claiming alice's pro plan, sent with the claims
    // above too: refused by jwt_authn (401; 403 for another audience), never decided.
    let invalid = [
        ("expired", 401),
        ("forged", 401),
        ("alg_none", 401),
        ("tampered", 401),
        ("hs256_public_key", 401),
        ("other_issuer", 401),
        ("other_audience", 403),
    ];
    let mut refused = 0usize;
    for (name, status) in invalid {
        let token = bearer(name);
        for (i, (path, headers)) in spoofs.iter().enumerate() {
            let mut headers = headers.clone();
            headers.push(("authorization", &token));
            let r = fleet.send(i, path, &headers);
            assert_eq!(r.status, status, "token {name}, {path} {headers:?}");
            assert_eq!(r.header("x-ratelimit-limit"), None, "decided: {name}");
            refused += 1;
        }
        // In the query parameter jwt_authn also reads by default.
        let path = format!("/?access_token={}", minted.tokens[name]);
        let r = fleet.send(refused, &path, &[]);
        assert_eq!(r.status, status, "token {name} in access_token");
        refused += 1;
    }

    // bob (free) sending alice's and pro's names beside his token: his own 5.
    let bob = bearer("bob");
    let tally = fleet.burst(
        9,
        CLIENTS,
        "/?sub=alice&plan=pro",
        &[
            ("authorization", &bob),
            ("x-jwt-sub", b"alice"),
            ("x-jwt-plan", b"pro"),
            ("x-caller-plan", b"pro"),
        ],
    );
    assert_eq!(tally, exact(9, 5, 5), "bob, free");

    // A subject with non-ASCII bytes, `/`, `+`, a space and braces: handed over intact, a
    // bucket of its own.
    let zoe = bearer("zoe");
    let tally = fleet.burst(6, CLIENTS, "/", &[("authorization", &zoe)]);
    assert_eq!(tally, exact(6, 5, 5), "zoë, free");

    // alice (pro), two tokens of hers: one bucket, her plan's 20, whole after everything
    // above claimed her name.
    let (alice, alice2) = (bearer("alice"), bearer("alice2"));
    let tally = fleet.burst_with(30, CLIENTS, |i| {
        let token = if i % 4 < 2 { &alice } else { &alice2 };
        ("/".to_string(), vec![("authorization", token.as_slice())])
    });
    assert_eq!(tally, exact(30, 20, 20), "alice, pro, two tokens");

    // Plans no plan names: "enterprise", "FREE" (plans compare exactly), no plan claim, a
    // list and an object (not scalars): the default's 2 each, under their own subject.
    let defaults = ["carol", "dave", "erin", "frank", "grace"];
    for name in defaults {
        let token = bearer(name);
        let tally = fleet.burst(4, 4, "/", &[("authorization", &token)]);
        assert_eq!(tally, exact(4, 2, 2), "{name}: the default plan");
    }

    // Exactly one bucket per subject and the client IP's, nothing else.
    let keys = fleet.keys();
    let mut expected: BTreeSet<String> = ["alice", "bob", ZOE]
        .iter()
        .chain(defaults.iter())
        .map(|s| keys.limit_key(RULE, LIMIT, SUB, s.as_bytes()))
        .collect();
    expected.insert(keys.limit_key(RULE, LIMIT, "client_ip", CLIENT_IP.as_bytes()));
    assert_eq!(fleet.redis_keys(), expected);

    // Both Envoys decided, nothing failed open; jwt_authn refused every invalid token.
    let allowed = 2 + 5 + 5 + 20 + 2 * defaults.len() as u64;
    let denied = 4 + spoofs.len() as u64 + 4 + 1 + 10 + 2 * defaults.len() as u64;
    assert_decided_by_both(&fleet, allowed, denied);
    assert_eq!(fleet.stat("http.ingress.jwt_authn.denied"), refused as u64);
    println!(
        "jwt: allowed {allowed}, denied {denied}, refused by jwt_authn {refused}; connections per worker {:?}; Redis keys {:#?}",
        fleet.connections_per_worker(),
        fleet.redis_keys()
    );
}

#[test]
fn ext_authz_callers_and_plans_are_exact_across_two_envoys() {
    let service = AuthzService::start(vec![
        Caller::new("key-acme-1", "acme", Some("pro")),
        Caller::new("key-acme-2", "acme", Some("pro")),
        Caller::new("key-bobco", "bobco", Some("free")),
        Caller::new("key-corp", "corp", Some("enterprise")),
        Caller::new("key-dan", "dan", None),
        Caller::new("key-eve", "eve", Some("FREE")),
    ]);
    let edits = [
        (
            "port_value: 9002".to_string(),
            format!("port_value: {}", service.port),
        ),
        (
            "uri: http://127.0.0.1:9002".to_string(),
            format!("uri: http://127.0.0.1:{}", service.port),
        ),
    ];
    let fleet = Fleet::start("auth-ext-authz", &root().join(EXT_AUTHZ_EXAMPLE), &edits);
    let mut sent = 0u64;

    // No key: allowed by the service as anonymous, the client IP's bucket, the default plan.
    assert_eq!(
        fleet.burst(6, CLIENTS, "/", &[]),
        exact(6, 2, 2),
        "anonymous"
    );
    sent += 6;

    // Claims of the client's own choosing, without a key: still the client IP, now empty.
    let spoofs: Vec<_> = claims_of_the_clients_choosing()
        .into_iter()
        .filter(|(_, headers)| headers.iter().all(|(name, _)| *name != API_KEY))
        .collect();
    for (i, (path, headers)) in spoofs.iter().enumerate() {
        let r = fleet.send(i, path, headers);
        assert_eq!(
            (r.status, r.header("x-ratelimit-limit")),
            (429, Some("2")),
            "{path} {headers:?}"
        );
        sent += 1;
    }

    // Keys the service does not know, claiming acme's pro plan: 403, never decided.
    for i in 0..4 {
        let key = format!("made-up-{i}");
        let r = fleet.send(
            i,
            "/",
            &[
                (API_KEY, key.as_bytes()),
                ("x-caller-id", b"acme"),
                ("x-caller-plan", b"pro"),
            ],
        );
        assert_eq!(r.status, 403, "{key}");
        assert_eq!(r.header("x-ratelimit-limit"), None, "decided: {key}");
        sent += 1;
    }

    // bobco (free) sending acme's name and pro beside its key: its own 5.
    let tally = fleet.burst(
        9,
        CLIENTS,
        "/?x-caller-id=acme&x-caller-plan=pro",
        &[
            (API_KEY, b"key-bobco"),
            ("x-caller-id", b"acme"),
            ("x-caller-plan", b"pro"),
        ],
    );
    assert_eq!(tally, exact(9, 5, 5), "bobco, free");
    sent += 9;

    // acme (pro) with both of its keys: one bucket, the plan's 20, whole after every claim
    // of its name above.
    let tally = fleet.burst_with(30, CLIENTS, |i| {
        let key: &[u8] = if i % 4 < 2 {
            b"key-acme-1"
        } else {
            b"key-acme-2"
        };
        ("/".to_string(), vec![(API_KEY, key)])
    });
    assert_eq!(tally, exact(30, 20, 20), "acme, pro, two keys");
    sent += 30;

    // A plan no plan names ("enterprise", "FREE") or none: the default's 2 each.
    let defaults = [("corp", "key-corp"), ("dan", "key-dan"), ("eve", "key-eve")];
    for (caller, key) in defaults {
        let tally = fleet.burst(4, 4, "/", &[(API_KEY, key.as_bytes())]);
        assert_eq!(tally, exact(4, 2, 2), "{caller}: the default plan");
        sent += 4;
    }

    // Exactly one bucket per caller and the client IP's, nothing else.
    let keys = fleet.keys();
    let mut expected: BTreeSet<String> = ["acme", "bobco"]
        .into_iter()
        .chain(defaults.iter().map(|(caller, _)| *caller))
        .map(|c| keys.limit_key(RULE, LIMIT, CALLER, c.as_bytes()))
        .collect();
    expected.insert(keys.limit_key(RULE, LIMIT, "client_ip", CLIENT_IP.as_bytes()));
    assert_eq!(fleet.redis_keys(), expected);

    // The service was asked about every request, and saw only the API key of the client's
    // headers (the client's x-caller-* never reached it).
    let checks = service.checks();
    assert_eq!(checks.total(), sent);
    assert_eq!(checks.refused, 4);
    assert!(
        !checks
            .header_names
            .iter()
            .any(|n| n.starts_with("x-caller-")),
        "{:?}",
        checks.header_names
    );

    let allowed = 2 + 5 + 20 + 2 * defaults.len() as u64;
    let denied = 4 + spoofs.len() as u64 + 4 + 10 + 2 * defaults.len() as u64;
    assert_decided_by_both(&fleet, allowed, denied);
    println!(
        "ext_authz: allowed {allowed}, denied {denied}, checks {sent} ({} refused); connections per worker {:?}; Redis keys {:#?}",
        checks.refused,
        fleet.connections_per_worker(),
        fleet.redis_keys()
    );

    // The service gone: refused (failure_mode_allow: false), not let through as anonymous.
    drop(service);
    for i in 0..2 {
        let r = fleet.send(i, "/", &[(API_KEY, b"key-acme-1")]);
        assert_eq!(r.status, 403, "the authorization service is down");
        assert_eq!(r.header("x-ratelimit-limit"), None);
    }
}
