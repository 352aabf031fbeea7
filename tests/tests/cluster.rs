//! On a Redis Cluster, end to end: real Envoy (the filter, and a redis_proxy listener), Webdis
//! pointed at that proxy, and a Redis Cluster of 3 masters + 3 replicas, all from the shipped
//! configs in envoy/cluster/ on free loopback ports.
//!
//! The shipped cluster config sets `bridge.redis_cluster`: a script whose keys are on
//! different slots is refused by Redis Cluster (CROSSSLOT), so every call carries one slot's
//! requests, and a request on several slots is decided per slot.

use std::time::{Duration, Instant};

use e2e::cluster::{envoy_config_file, ClusterStack, RedisCluster, NODE_USER, SLOTS};
use e2e::procs::WorkDir;
use e2e::shipped::RAISED_CEILING;
use e2e::{get, script_sha, Envoy, Keys, Resp};

/// The keys of the shipped cluster config's filter.
fn shipped_keys() -> Keys {
    Keys::from_envoy_file(&envoy_config_file())
}

/// The shipped limit (10 per minute) made `limit` per minute.
fn limit_edit(limit: u32) -> (String, String) {
    (
        r#""limit": 10, "window": "1m""#.to_string(),
        format!(r#""limit": {limit}, "window": "1m""#),
    )
}

/// The filter's counters and warnings, for assertion messages.
fn diagnose(stack: &ClusterStack) -> String {
    let counters: Vec<String> = [
        "ratelimit_allowed",
        "ratelimit_denied",
        "ratelimit_bridge_errors",
        "ratelimit_failure_mode_open",
        "ratelimit_script_loads",
    ]
    .iter()
    .map(|c| format!("{c}={}", stack.envoy.counter(c)))
    .collect();
    let log = stack.envoy.process.log_text();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("[wasm]") && (l.contains("warn") || l.contains("error")))
        .collect();
    format!("{}\n{}", counters.join(" "), warnings.join("\n"))
}

/// `list` as edits of the shipped cluster config, with its per-IP ceiling raised out of reach:
/// these tests send many identities' requests from one address.
fn edits(list: &[(String, String)]) -> Vec<(&str, &str)> {
    // First: an edit of the list may write a limit like the ceiling's.
    let mut edits = vec![RAISED_CEILING];
    edits.extend(list.iter().map(|(a, b)| (a.as_str(), b.as_str())));
    edits
}

#[test]
fn decisions_for_many_identities_go_to_the_master_of_their_slot() {
    // The per-IP rule set aside: each request is then one identity's, one call.
    let aside = [(
        r#""name": "per_ip","#.to_string(),
        r#""name": "per_ip", "match": { "path_exact": "/not-requested" },"#.to_string(),
    )];
    let stack = ClusterStack::start("cluster-spread", &edits(&aside));
    let cluster = &stack.cluster;
    println!(
        "cluster of {} nodes ready in {} ms",
        cluster.nodes.len(),
        cluster.startup.as_millis()
    );
    let masters = cluster.masters();
    let replicas = cluster.replicas();
    assert_eq!((masters.len(), replicas.len()), (3, 3));

    // SCRIPT LOAD through Webdis and the proxy loads the script on every master. Replicas do
    // not get it (Redis 7 does not replicate the script cache): a promoted replica answers
    // NOSCRIPT, and the filter loads the script again.
    let sha = script_sha();
    let reply = stack.load_script(&ratelimit_core::decision_script());
    assert_eq!(reply.text(), format!(r#"{{"SCRIPT":"{sha}"}}"#));
    for &m in &masters {
        assert!(cluster.script_exists(m, &sha), "script on master {m}");
    }
    for &r in &replicas {
        assert!(!cluster.script_exists(r, &sha), "script on replica {r}");
    }

    let identities = 60;
    for i in 0..identities {
        let r = stack.envoy.keyed(format!("user-{i}"));
        assert_eq!(r.status, 200, "user-{i}: {}", r.text());
        assert_eq!(r.header("x-ratelimit-remaining"), Some("9"), "user-{i}");
    }
    assert_eq!(stack.envoy.counter("ratelimit_allowed"), identities);
    assert_eq!(stack.envoy.counter("ratelimit_bridge_errors"), 0);
    assert_eq!(stack.envoy.counter("ratelimit_script_loads"), 0);

    // One EVALSHA per request, each on the master of its key's slot; none on replicas.
    let calls = cluster.command_calls_per_node("evalsha");
    println!("evalsha calls per node: {calls:?}");
    for &(node, n) in &calls {
        if masters.contains(&node) {
            assert!(n > 0, "master {node} decided nothing: {calls:?}");
        } else {
            assert_eq!(n, 0, "replica {node} ran EVALSHA: {calls:?}");
        }
    }
    let total: u64 = calls.iter().map(|&(_, n)| n).sum();
    assert_eq!(total, identities, "{calls:?}");
    // Each bucket is on the master of its slot (another master would answer MOVED), and
    // there is no other key.
    for i in 0..identities {
        let key = stack.envoy.keys().shipped_bucket(format!("user-{i}"));
        let owner = cluster.master_of_key(&key);
        let exists = cluster.admin(owner).cmd(&["EXISTS", &key]).unwrap();
        assert_eq!(exists, Resp::Int(1), "{key} on {owner}");
    }
    let keys: i64 = masters
        .iter()
        .map(|&m| cluster.admin(m).cmd(&["DBSIZE"]).unwrap().int())
        .sum();
    assert_eq!(keys, identities as i64);
}

#[test]
fn one_key_gets_exactly_its_limit() {
    let list = [limit_edit(5)];
    let stack = ClusterStack::start("cluster-exact", &edits(&list));
    let statuses: Vec<u16> = (0..20).map(|_| stack.envoy.keyed("alice").status).collect();
    println!("{statuses:?}");
    assert_eq!(statuses[..5], [200; 5], "{}", diagnose(&stack));
    assert_eq!(statuses[5..], [429; 15], "{}", diagnose(&stack));
    // The script was not loaded: the first call got NOSCRIPT and the filter loaded it.
    assert!(stack.envoy.counter("ratelimit_script_loads") >= 1);
    assert_eq!(stack.envoy.counter("ratelimit_bridge_errors"), 0);
    let key = stack.envoy.keys().shipped_bucket("alice");
    let owner = stack.cluster.master_of_key(&key);
    let tokens = stack.cluster.admin(owner).cmd(&["HGET", &key, "tokens"]);
    let tokens: f64 = tokens.unwrap().text().parse().expect("a token count");
    assert!(tokens < 1.0, "tokens left: {tokens}");
}

/// What a client of the proxy (Webdis, or anyone with its password) gets to run: the proxy
/// forwards FLUSHALL, KEYS, EVAL and the like, so the nodes' ACL is what refuses them.
#[test]
fn the_proxy_user_is_locked_down_on_every_node() {
    let stack = ClusterStack::start("cluster-lockdown", &[]);
    let cluster = &stack.cluster;
    let mut proxy = e2e::RedisConn::connect(stack.proxy_port).unwrap();
    let reply = proxy.cmd(&["CONFIG", "GET", "*"]).unwrap();
    assert!(
        matches!(&reply, Resp::Error(e) if e.starts_with("NOAUTH")),
        "{reply:?}"
    );
    let reply = proxy.cmd(&["AUTH", "wrong"]).unwrap();
    assert!(matches!(&reply, Resp::Error(_)), "{reply:?}");
    assert_eq!(
        proxy.cmd(&["AUTH", "webdis-demo-secret"]).unwrap(),
        Resp::Simple("OK".into())
    );
    for command in [
        &["FLUSHALL"][..],
        &["KEYS", "*"],
        &["EVAL", "return 1", "1", "rl:{a}"],
        &["HGET", "other:x", "tokens"],
    ] {
        let reply = proxy.cmd(command).unwrap();
        assert!(
            matches!(&reply, Resp::Error(e) if e.starts_with("NOPERM")),
            "{} through the proxy: {reply:?}",
            command.join(" ")
        );
    }
    let time = proxy.cmd(&["TIME"]).unwrap();
    assert!(matches!(time, Resp::Array(Some(_))), "{time:?}");

    let refused: &[&[&str]] = &[
        &["CLUSTER", "NODES"],
        &["CLUSTER", "RESET"],
        &["GET", "rl:x"],
        &["HGET", "other:x", "tokens"],
        &["ACL", "LIST"],
    ];
    for node in cluster.ports() {
        let mut conn = cluster.restricted(node);
        for command in e2e::procs::REFUSED_TO_WEBDIS.iter().chain(refused) {
            let reply = conn.cmd(command).unwrap();
            assert!(
                matches!(&reply, Resp::Error(e) if e.starts_with("NOPERM")),
                "{} on {node}: {reply:?}",
                command.join(" ")
            );
        }
        // What the proxy needs: the script, on the limiter's keys, and the slot map.
        let reply = conn
            .cmd(&["EVALSHA", &"0".repeat(40), "1", "rl:x"])
            .unwrap();
        let allowed = matches!(&reply, Resp::Error(e) if e.starts_with("NOSCRIPT"))
            || matches!(&reply, Resp::Error(e) if e.starts_with("MOVED"));
        assert!(allowed, "EVALSHA on {node}: {reply:?}");
        let slots = conn.cmd(&["CLUSTER", "SLOTS"]).unwrap();
        assert!(matches!(slots, Resp::Array(Some(_))), "{slots:?}");
        assert!(matches!(conn.cmd(&["TIME"]).unwrap(), Resp::Array(Some(_))));
        // A wrong password, or none, gets nothing.
        let wrong = e2e::RedisConn::login(node, NODE_USER.0, "wrong");
        assert!(wrong.is_err());
        let mut anonymous = e2e::RedisConn::connect(node).unwrap();
        let reply = anonymous.cmd(&["CLUSTER", "SLOTS"]).unwrap();
        assert!(
            matches!(&reply, Resp::Error(e) if e.starts_with("NOAUTH")),
            "{reply:?}"
        );
        // The replication user may only copy its master.
        let mut replica = e2e::RedisConn::login(node, "replica", "replica-demo-secret").unwrap();
        for command in [&["GET", "rl:x"][..], &["CLUSTER", "SLOTS"], &["FLUSHALL"]] {
            let reply = replica.cmd(command).unwrap();
            assert!(
                matches!(&reply, Resp::Error(e) if e.starts_with("NOPERM")),
                "{reply:?}"
            );
        }
    }
}

#[test]
fn keyslot_follows_hash_tags() {
    let dir = WorkDir::new("cluster-keyslot");
    let cluster = RedisCluster::start(&dir, 3, 0);
    // Known values (CRC16/XMODEM of the key, or of its {hash tag}, modulo 16384).
    assert_eq!(cluster.keyslot("foo"), 12182);
    assert_eq!(cluster.keyslot("{user1000}.following"), 3443);
    // The filter's own computation (ratelimit_core::slot) agrees with Redis on every kind of
    // key it writes, hash-tag edge cases, shard keys and arbitrary bytes.
    let mut keys: Vec<String> = vec![
        "foo{}{bar}".into(),
        "foo{{bar}}zap".into(),
        "foo{bar}{zap}".into(),
        "{}".into(),
        "{".into(),
        "}{x}".into(),
    ];
    let shipped = shipped_keys();
    keys.push(shipped.budget_counter("per_client", None));
    keys.push(shipped.overflow("per_client", "per_minute", None));
    let readable = Keys::from_json(
        r#"{"hash_identities": false, "rules": [{"name": "r", "key": {"from": ["client_ip"]},
            "limits": [{"name": "l", "limit": 1, "window": "1s"}]}]}"#,
    );
    for i in 0..300u64 {
        keys.push(shipped.shipped_bucket(format!("user-{i}")));
        keys.push(ratelimit_core::request::keys::shard_key(
            &shipped.shipped_bucket(format!("hot-{i}")),
            i % 7,
        ));
        let address = format!("10.0.{}.{}", i / 256, i % 256);
        keys.push(readable.limit_key("r", "l", "client_ip", address.as_bytes()));
        keys.push(format!("k{i}-\u{e9}-{}", "x".repeat((i % 40) as usize)));
    }
    for key in &keys {
        assert_eq!(
            ratelimit_core::slot::key_slot(key.as_bytes()),
            cluster.keyslot(key),
            "{key}"
        );
    }
    // Every limit of one identity lives on the slot of its hash tag.
    let key = shipped.shipped_bucket("alice");
    let tag = &key[key.find('{').unwrap() + 1..key.find('}').unwrap()];
    let slot = cluster.keyslot(tag);
    assert_eq!(cluster.keyslot(&key), slot);
    assert_eq!(cluster.keyslot(&key.replace("per_minute", "per_day")), slot);
    // The three masters share the slots, and each slot has one.
    let slots = cluster.slots();
    let covered: u32 = slots
        .iter()
        .map(|&(a, b, _)| u32::from(b) - u32::from(a) + 1)
        .sum();
    assert_eq!(covered, SLOTS);
    let mut owners: Vec<u16> = slots.iter().map(|&(_, _, m)| m).collect();
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(owners, {
        let mut m = cluster.masters();
        m.sort_unstable();
        m
    });
    assert!(owners.contains(&cluster.master_of_slot(slot)));
    assert_eq!(
        cluster.master_of_key("{user1000}.followers"),
        cluster.master_of_slot(3443)
    );
}

/// A master dies: its replica takes over with the buckets and the overrides it had copied,
/// the filter loads the script on it (the replica never had it) and the limits and the
/// overrides hold again. Meanwhile requests on its slots are decided by the failure policy
/// (open here).
#[test]
fn after_a_failover_limits_hold_and_the_script_is_loaded_again() {
    // The requests before the kill must be decided, even on a loaded machine; those on the
    // dead master's slots fail open, at the proxy's 1 s timeout at most.
    let list = [
        (
            r#""limit": 10, "window": "1m""#.to_string(),
            r#""limit": 5, "window": "1m", "overrides": true"#.to_string(),
        ),
        (
            r#""failure_mode": "open","#.to_string(),
            r#""failure_mode": "open", "deny_cache": false,"#.to_string(),
        ),
    ];
    let mut stack = ClusterStack::start("cluster-failover", &edits(&list));
    let statuses: Vec<u16> = (0..6).map(|_| stack.envoy.keyed("alice").status).collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 429],
        "{}",
        diagnose(&stack)
    );
    let named = stack.envoy.keys();
    let key = named.shipped_bucket("alice");
    let old = stack.cluster.master_of_key(&key);
    // Another identity on the same master, to see when decisions come back.
    let probe = (0..)
        .map(|i| format!("probe-{i}"))
        .find(|p| stack.cluster.master_of_key(&named.shipped_bucket(p)) == old)
        .unwrap();
    // An identity blocked by an operator, on the same master.
    let blocked = (0..)
        .map(|i| format!("blocked-{i}"))
        .find(|b| stack.cluster.master_of_key(&named.shipped_bucket(b)) == old)
        .unwrap();
    let block_key = format!("{}:override", named.shipped_bucket(&blocked));
    stack
        .cluster
        .admin(old)
        .cmd(&["HSET", &block_key, "mode", "blocked"])
        .unwrap();
    assert_eq!(
        stack.envoy.keyed(&blocked).status,
        429,
        "blocked before the kill"
    );
    let replica = stack.cluster.replicas_of(old);
    assert_eq!(replica.len(), 1);
    let sha = script_sha();
    assert!(!stack.cluster.script_exists(replica[0], &sha));
    // Replication is asynchronous: make sure the replica has alice's bucket before the crash.
    let acked = stack
        .cluster
        .admin(old)
        .cmd(&["WAIT", "1", "5000"])
        .unwrap();
    assert_eq!(acked, Resp::Int(1));
    let loads_before = stack.envoy.counter("ratelimit_script_loads");

    // Load all through the failover: 4 clients over 40 identities on every master.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let port = stack.envoy.port;
    let load: Vec<_> = (0..4)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut statuses = std::collections::BTreeMap::<u16, u64>::new();
                let mut i = t;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let key = format!("load-{}", i % 40);
                    let status = get(port, "/", &[("x-api-key", key.as_bytes())])
                        .map(|r| r.status)
                        .unwrap_or(0);
                    *statuses.entry(status).or_default() += 1;
                    i += 4;
                }
                statuses
            })
        })
        .collect();

    let killed = Instant::now();
    stack.cluster.kill_master(old);
    let new = stack.cluster.wait_failover(old, Duration::from_secs(30));
    let promoted = killed.elapsed();
    assert_eq!(new, replica[0]);
    // Requests on the dead master's slots fail open meanwhile; poll until one is decided.
    let decided = e2e::wait_for(
        "decisions on the new master",
        Duration::from_secs(30),
        || {
            let r = stack.envoy.keyed(&probe);
            r.header("x-ratelimit-limit").is_some().then_some(r)
        },
    );
    let back = killed.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut under_load = std::collections::BTreeMap::<u16, u64>::new();
    for worker in load {
        for (status, n) in worker.join().expect("load thread") {
            *under_load.entry(status).or_default() += n;
        }
    }
    println!("under load through the failover: {under_load:?}");
    assert!(
        under_load.keys().all(|s| *s == 200 || *s == 429),
        "every request answered, allowed or refused: {under_load:?}"
    );
    assert!(under_load.values().sum::<u64>() > 100, "{under_load:?}");
    println!(
        "failover: replica {new} promoted {} ms after master {old} was killed; decisions back after {} ms; \
         fail-open meanwhile: {}",
        promoted.as_millis(),
        back.as_millis(),
        stack.envoy.counter("ratelimit_failure_mode_open")
    );
    assert_eq!(decided.status, 200, "{}", diagnose(&stack));
    // 4, unless a call that failed at the filter still reached Redis and charged.
    let remaining: u32 = decided
        .header("x-ratelimit-remaining")
        .unwrap()
        .parse()
        .unwrap();
    assert!(remaining <= 4, "{remaining}: {}", diagnose(&stack));
    assert!(stack.envoy.counter("ratelimit_script_loads") > loads_before);
    assert!(stack.cluster.script_exists(new, &sha));
    // alice's bucket was copied to the replica before the kill: still empty, still refused
    // (by Redis: the deny cache is off here).
    assert_eq!(
        stack.cluster.admin(new).cmd(&["EXISTS", &key]).unwrap(),
        Resp::Int(1)
    );
    // Each worker has its own circuit breaker, and the other one may still be open (the
    // request then fails open, without rate-limit headers): wait for a decision.
    let decided = e2e::wait_for("a decision for alice", Duration::from_secs(10), || {
        let r = stack.envoy.keyed("alice");
        r.header("x-ratelimit-limit").is_some().then_some(r)
    });
    assert_eq!(decided.status, 429, "{}", diagnose(&stack));
    // The block came over with the rest, and decides on the new master.
    let r = e2e::wait_for(
        "a decision for the blocked identity",
        Duration::from_secs(10),
        || {
            let r = stack.envoy.keyed(&blocked);
            r.header("x-ratelimit-limit").is_some().then_some(r)
        },
    );
    assert_eq!(
        (r.status, r.header("retry-after")),
        (429, None),
        "{}",
        diagnose(&stack)
    );
}

/// Requests for `keys`, each sent `rounds` times, over `threads` concurrent connections (each
/// thread walks the keys from its own offset); statuses per key.
fn concurrent(
    envoy: &Envoy,
    keys: &[String],
    rounds: usize,
    threads: usize,
) -> std::collections::BTreeMap<String, Vec<u16>> {
    let port = envoy.port;
    let results = std::sync::Mutex::new(std::collections::BTreeMap::<String, Vec<u16>>::new());
    std::thread::scope(|scope| {
        for t in 0..threads {
            let results = &results;
            scope.spawn(move || {
                for round in 0..rounds {
                    for i in 0..keys.len() {
                        let key = &keys[(i + t * 7 + round) % keys.len()];
                        let status = get(port, "/", &[("x-api-key", key.as_bytes())])
                            .map(|r| r.status)
                            .unwrap_or(0);
                        if let Ok(mut all) = results.lock() {
                            all.entry(key.clone()).or_default().push(status);
                        }
                    }
                }
            });
        }
    });
    results.into_inner().unwrap_or_default()
}

/// Many clients on many slots at once: calls carry one slot each (no CROSSSLOT), requests
/// share calls, and every identity gets exactly its limit.
#[test]
fn concurrent_clients_on_many_slots_get_exactly_their_limits() {
    let list = [limit_edit(5)];
    let stack = ClusterStack::start("cluster-concurrent", &edits(&list));
    assert_eq!(stack.envoy.keyed("warm-up").status, 200);
    let keys: Vec<String> = (0..24).map(|i| format!("client-{i}")).collect();
    let by_key = concurrent(&stack.envoy, &keys, 2, 8);
    for (key, statuses) in &by_key {
        assert_eq!(statuses.len(), 16, "{key}");
        let allowed = statuses.iter().filter(|s| **s == 200).count();
        let refused = statuses.iter().filter(|s| **s == 429).count();
        assert_eq!(
            (allowed, refused),
            (5, 11),
            "{key}: {statuses:?} {}",
            diagnose(&stack)
        );
    }
    assert_eq!(
        stack.envoy.counter("ratelimit_bridge_errors"),
        0,
        "{}",
        diagnose(&stack)
    );
    let masters = stack.cluster.masters();
    let calls = stack.cluster.command_calls_per_node("evalsha");
    let on_masters: Vec<u64> = calls
        .iter()
        .filter(|(node, _)| masters.contains(node))
        .map(|(_, n)| *n)
        .collect();
    println!(
        "evalsha per master: {on_masters:?}, bridge calls {}",
        stack.envoy.counter("ratelimit_bridge_calls")
    );
    assert!(on_masters.iter().all(|n| *n > 0), "{calls:?}");

    // One hot key, 16 connections at once: exactly its capacity.
    let hot = vec!["hot".to_string()];
    let statuses = &concurrent(&stack.envoy, &hot, 10, 16)["hot"];
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        5,
        "{statuses:?}"
    );
    assert_eq!(statuses.len(), 160);
}

/// A request limited per API key and per client IP has its limits on two slots: decided in two
/// calls, all or nothing. Refused by the per-key limit, what the per-IP limit charged for it is
/// given back. (Windows of an hour: what refills while a loaded machine runs the test stays
/// far below a unit.)
#[test]
fn a_request_on_two_slots_refused_by_one_gives_back_what_the_other_charged() {
    // The shipped rules, per API key and per client IP, with numbers of this test.
    let rules = [
        (
            r#""key": { "from": ["header:x-api-key"], "when_missing": "skip" },
                          "limits": [
                            { "name": "per_minute", "algorithm": "token_bucket", "limit": 10, "window": "1m" }"#,
            r#""key": { "from": ["header:x-api-key"], "when_missing": "skip" },
                          "limits": [
                            { "name": "per_minute", "algorithm": "token_bucket", "limit": 3, "window": "1h" }"#,
        ),
        (
            r#""limit": 30, "window": "1m""#,
            r#""limit": 100, "window": "1h""#,
        ),
    ];
    let stack = ClusterStack::start("cluster-two-slots", &rules);
    let named = stack.envoy.keys();
    let key = named.shipped_bucket("k");
    // The bucket of the per-IP rule on 127.0.0.1.
    let ip = named.limit_key("per_ip", "per_minute", "client_ip", b"127.0.0.1");
    assert_ne!(stack.cluster.keyslot(&key), stack.cluster.keyslot(&ip));
    let statuses: Vec<u16> = (0..5).map(|_| stack.envoy.keyed("k").status).collect();
    // The 4th is refused by Redis (per key) and its per-IP charge given back; so is the 5th,
    // unless the worker that takes it already holds the refusal in its deny cache (then it
    // charges nothing and needs no refund).
    assert_eq!(statuses, [200, 200, 200, 429, 429], "{}", diagnose(&stack));
    e2e::wait_for(
        "a refund per refusal by Redis",
        Duration::from_secs(5),
        || {
            let refunds = stack.envoy.counter("ratelimit_refunds");
            let cached = stack.envoy.counter("ratelimit_deny_cache_hits");
            (refunds >= 1 && refunds + cached == 2).then_some(())
        },
    );
    let left = e2e::wait_for("the refund to land", Duration::from_secs(5), || {
        let left = stack.bucket_tokens(&ip);
        (left > 96.5).then_some(left)
    });
    // 100 - 3 charged (plus a few ms of refill), not 96 or 95: the refused requests' charges
    // are back.
    assert!(left < 97.5, "{left}");
    assert!(stack.bucket_tokens(&key) < 1.0);
    println!("per-IP bucket after 3 allowed and 2 refused: {left}");
}

/// An identity whose shard keys land on three different masters.
fn spread_identity(keys: &Keys, cluster: &RedisCluster) -> String {
    (0..)
        .map(|i| format!("hot-{i}"))
        .find(|id| {
            let masters: std::collections::HashSet<u16> = (0..3)
                .map(|s| cluster.master_of_key(&shard_key(keys, id, s)))
                .collect();
            masters.len() == 3
        })
        .unwrap_or_default()
}

fn shard_key(keys: &Keys, api_key: &str, shard: u64) -> String {
    ratelimit_core::request::keys::shard_key(&keys.shipped_bucket(api_key), shard)
}

/// A hot key split in 3 shards is decided on 3 masters, each holding a third of its limit:
/// never more than the limit in all.
#[test]
fn a_hot_key_in_shards_spreads_over_the_masters_and_never_overshoots() {
    let list = [(
        r#""limit": 10, "window": "1m" }"#.to_string(),
        r#""limit": 30, "window": "1m", "shards": 3 }"#.to_string(),
    )];
    let stack = ClusterStack::start("cluster-shards", &edits(&list));
    let named = stack.envoy.keys();
    let id = spread_identity(&named, &stack.cluster);
    let statuses: Vec<u16> = (0..90).map(|_| stack.envoy.keyed(&id).status).collect();
    let allowed = statuses.iter().filter(|s| **s == 200).count();
    println!("{id}: {allowed} of 90 allowed");
    assert_eq!(allowed, 30, "{statuses:?} {}", diagnose(&stack));
    for shard in 0..3 {
        let key = shard_key(&named, &id, shard);
        let left = stack.bucket_tokens(&key);
        assert!(left < 1.0, "{key}: {left}");
    }
}

/// With a Redis Cluster a key budget is counted per slot (a script sees one slot): 16,384 new
/// identities per hour over all slots is one per slot per hour. A second new identity on a
/// slot is refused (over_budget `deny`), an identity that exists is not, and another slot has its own.
#[test]
fn on_a_redis_cluster_a_key_budget_counts_per_slot() {
    let budget = (
        r#""name": "per_client","#.to_string(),
        r#""name": "per_client", "key_budget": {"new_keys": 16384, "window": "1h", "over_budget": "deny"},"#
            .to_string(),
    );
    let stack = ClusterStack::start("cluster-budget", &edits(&[budget]));
    let named = stack.envoy.keys();
    let slot_of = |k: &str| ratelimit_core::slot::key_slot(named.shipped_bucket(k).as_bytes());
    let first = "budget-0".to_string();
    let same = (1..)
        .map(|i| format!("budget-{i}"))
        .find(|k| slot_of(k) == slot_of(&first))
        .unwrap_or_default();
    let other = (1..)
        .map(|i| format!("other-{i}"))
        .find(|k| slot_of(k) != slot_of(&first))
        .unwrap_or_default();
    assert_eq!(
        stack.envoy.keyed(&first).status,
        200,
        "{}",
        diagnose(&stack)
    );
    let refused = stack.envoy.keyed(&same);
    assert_eq!(refused.status, 429, "{}", diagnose(&stack));
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&retry), "{retry}");
    assert_eq!(
        stack.envoy.keyed(&first).status,
        200,
        "an existing identity"
    );
    assert_eq!(
        stack.envoy.keyed(&other).status,
        200,
        "another slot, its own budget"
    );
    let slot = slot_of(&first);
    let tag = ratelimit_core::slot::slot_tags()[usize::from(slot)];
    let counter = named.budget_counter("per_client", Some(tag));
    assert_eq!(stack.cluster.keyslot(&counter), slot);
    let owner = stack.cluster.master_of_slot(slot);
    let n = stack
        .cluster
        .admin(owner)
        .cmd(&["HGET", &counter, "n"])
        .unwrap();
    assert_eq!(n.text(), "1");
    e2e::wait_for("the over-budget count", Duration::from_secs(5), || {
        (stack.envoy.counter("ratelimit_key_budget_exceeded") == 1).then_some(())
    });
}

/// A slot is resharded to another master while clients keep sending (`CLUSTER SETSLOT
/// IMPORTING/MIGRATING`, its keys moved with `MIGRATE` a few at a time, `SETSLOT NODE`).
/// Workers put the requests of every slot of a master in one call, so calls that hold the
/// moving slot meet a node that no longer serves its keys; those requests go again in a call
/// of their own slot (the proxy follows `ASK` and `MOVED` for it). Every request is decided,
/// exactly once: each identity gets exactly its limit, none passes by the failure policy.
#[test]
fn a_slot_resharded_under_load_keeps_every_decision_exact() {
    let limit = 10;
    let list = [
        (
            r#""limit": 10, "window": "1m""#.to_string(),
            format!(r#""limit": {limit}, "window": "1h""#),
        ),
        (
            r#""failure_mode": "open","#.to_string(),
            r#""failure_mode": "open", "batch": {"max_in_flight": 2},"#.to_string(),
        ),
    ];
    let stack = ClusterStack::start("cluster-reshard", &edits(&list));
    let named = stack.envoy.keys();
    let cluster = &stack.cluster;
    let slots = cluster.slots();
    let master_of = |key: &str| {
        let slot = ratelimit_core::slot::key_slot(key.as_bytes());
        slots
            .iter()
            .find(|&&(a, b, _)| (a..=b).contains(&slot))
            .map(|&(_, _, m)| m)
            .unwrap_or_default()
    };
    let slot_of = |id: &str| ratelimit_core::slot::key_slot(named.shipped_bucket(id).as_bytes());
    // Three identities on the slot that moves; eight more on its master; four elsewhere.
    let slot = slot_of("move-0");
    let from = master_of(&named.shipped_bucket("move-0"));
    let to = *cluster.masters().iter().find(|&&m| m != from).unwrap();
    let moving: Vec<String> = (0..)
        .map(|i| format!("move-{i}"))
        .filter(|id| slot_of(id) == slot)
        .take(3)
        .collect();
    let staying: Vec<String> = (0..)
        .map(|i| format!("stay-{i}"))
        .filter(|id| master_of(&named.shipped_bucket(id)) == from && slot_of(id) != slot)
        .take(8)
        .collect();
    let elsewhere: Vec<String> = (0..)
        .map(|i| format!("other-{i}"))
        .filter(|id| master_of(&named.shipped_bucket(id)) != from)
        .take(4)
        .collect();
    let ids: Vec<String> = [&moving[..], &staying[..], &elsewhere[..]].concat();
    assert_eq!(
        stack.envoy.keyed("warm-up").status,
        200,
        "{}",
        diagnose(&stack)
    );

    // Per identity: requests sent, allowed with the limit's headers, refused; anything else.
    type Seen = std::collections::BTreeMap<String, (u64, u64, u64)>;
    let seen = std::sync::Mutex::new(Seen::new());
    let undecided = std::sync::Mutex::new(Vec::<(String, u16)>::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let sent_of = |seen: &Seen| ids.iter().map(|id| seen.get(id).map_or(0, |s| s.0)).min();
    let port = stack.envoy.port;
    let mut moved = 0;
    std::thread::scope(|scope| {
        for t in 0..8 {
            let (ids, seen, undecided, stop) = (&ids, &seen, &undecided, &stop);
            scope.spawn(move || {
                let mut i = t * 5;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let id = &ids[i % ids.len()];
                    i += 1;
                    let reply = get(port, "/", &[("x-api-key", id.as_bytes())]);
                    let (status, decided) = reply.map_or((0, false), |r| {
                        (r.status, r.header("x-ratelimit-limit").is_some())
                    });
                    let mut all = seen.lock().unwrap();
                    let entry = all.entry(id.clone()).or_default();
                    entry.0 += 1;
                    match (status, decided) {
                        (200, true) => entry.1 += 1,
                        (429, true) => entry.2 += 1,
                        _ => undecided.lock().unwrap().push((id.clone(), status)),
                    }
                }
            });
        }
        // Some requests on every identity first (the workers learn the slot map), then the
        // resharding while they go on, then more on every identity.
        e2e::wait_for("4 requests per identity", Duration::from_secs(60), || {
            (sent_of(&seen.lock().unwrap())? >= 4).then_some(())
        });
        moved = cluster.migrate_slot(slot, to, 2);
        let after = sent_of(&seen.lock().unwrap()).unwrap_or(0);
        e2e::wait_for(
            "more requests per identity",
            Duration::from_secs(60),
            || {
                let least = sent_of(&seen.lock().unwrap())?;
                (least >= after + 6 && least > limit + 4).then_some(())
            },
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let seen = seen.into_inner().unwrap();
    let undecided = undecided.into_inner().unwrap();
    println!(
        "slot {slot} moved from {from} to {to} with {moved} keys; resends {}, slot maps {}; {seen:?}",
        stack.envoy.counter("ratelimit_cluster_resends"),
        stack.envoy.counter("ratelimit_cluster_slot_maps"),
    );
    assert_eq!(moved, moving.len(), "the moving identities' buckets");
    assert!(undecided.is_empty(), "{undecided:?} {}", diagnose(&stack));
    for id in &ids {
        let (sent, allowed, refused) = seen[id];
        assert_eq!(
            (allowed, refused),
            (limit, sent - limit),
            "{id}: {} {}",
            if moving.contains(id) { "moved" } else { "" },
            diagnose(&stack)
        );
    }
    assert_eq!(stack.envoy.counter("ratelimit_failure_mode_open"), 0);
    assert!(stack.envoy.counter("ratelimit_cluster_slot_maps") >= 1);
    // The moved buckets live on their new master, spent.
    assert_eq!(cluster.master_of_slot(slot), to);
    for id in &moving {
        let key = named.shipped_bucket(id);
        let exists = cluster.admin(to).cmd(&["EXISTS", &key]).unwrap();
        assert_eq!(exists, Resp::Int(1), "{key} on {to}");
        assert!(stack.bucket_tokens(&key) < 1.0, "{key}");
    }
}
