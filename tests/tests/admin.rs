//! ratelimit-admin against a real Redis, as the restricted user it ships with: overrides as
//! the script reads them (the hash's fields, the key's TTL), resets that delete exactly one
//! identity's state, `inspect` agreeing with what the decision script replies next, the audit
//! stream, and a clear error with its exit status for each bad input.

use std::collections::BTreeMap;

use e2e::admin::Admin;
use e2e::cluster::RedisCluster;
use e2e::procs::{REDIS_ADMIN, REDIS_TOOL, REDIS_WEBDIS_PASSWORD};
use e2e::script::*;
use e2e::Keys;
use ratelimit_core::request::keys::{override_key, shard_key};
use serde_json::Value;

const CONFIG: &str = r#"{"bridge": {"cluster": "webdis"}, "ipv4_prefix": 24, "rules": [
  {"name": "api", "key": {"from": ["header:x-api-key", "client_ip"]}, "limits": [
    {"name": "per_minute", "limit": 10, "window": "1m", "overrides": true},
    {"name": "per_day", "algorithm": "fixed_window", "limit": 1000, "window": "1d", "overrides": true},
    {"name": "sharded", "limit": 90, "window": "1s", "shards": 3}]},
  {"name": "each", "limits": [
    {"name": "tb", "limit": 10, "window": "1d"},
    {"name": "gcra", "algorithm": "gcra", "limit": 10, "window": "1d"},
    {"name": "fw", "algorithm": "fixed_window", "limit": 10, "window": "366d"},
    {"name": "swc", "algorithm": "sliding_window_counter", "limit": 10, "window": "183d"},
    {"name": "swl", "algorithm": "sliding_window_log", "limit": 10, "window": "1d"}]},
  {"name": "holds", "limits": [
    {"name": "streams", "algorithm": "concurrency", "limit": 3, "max_duration": "10m"},
    {"name": "monthly", "algorithm": "fixed_window", "limit": 100, "window": "month", "utc_offset": "+05:30"}]}]}"#;

struct Setup {
    dir: WorkDir,
    redis: Redis,
    script: Script,
    keys: Keys,
    admin: Admin,
}

fn setup(name: &str) -> Setup {
    let (dir, redis, script) = e2e::script::script(name);
    let config = dir.file("filter.json");
    std::fs::write(&config, CONFIG).unwrap();
    let admin = Admin::new(&redis, &config);
    Setup {
        dir,
        redis,
        script,
        keys: Keys::from_json(CONFIG),
        admin,
    }
}

/// A limit of the config as the script gets it, on `key` (a test's key lives for the test).
fn as_script(key: &str, algorithm: Algorithm, n: u64, window_ms: u64) -> L {
    limit(
        Box::leak(key.to_string().into_boxed_str()),
        algorithm,
        n,
        window_ms,
    )
}

fn hash(redis: &Redis, key: &str) -> BTreeMap<String, String> {
    let items = redis.admin().cmd(&["HGETALL", key]).unwrap().items();
    items
        .chunks(2)
        .map(|pair| (pair[0].text(), pair[1].text()))
        .collect()
}

fn pttl(redis: &Redis, key: &str) -> i64 {
    redis.admin().cmd(&["PTTL", key]).unwrap().int()
}

fn exists(redis: &Redis, key: &str) -> bool {
    redis.admin().cmd(&["EXISTS", key]).unwrap().int() == 1
}

fn audit_len(redis: &Redis) -> i64 {
    redis
        .admin()
        .cmd(&["XLEN", "rl:{admin}:audit"])
        .unwrap()
        .int()
}

#[test]
fn an_override_is_set_read_listed_and_removed_in_the_scripts_format() {
    let s = setup("admin-override");
    let key = override_key(
        &s.keys
            .limit_key("api", "per_minute", "header:x-api-key", b"alice"),
    );

    // With an expiry: the hash holds exactly the format, the expiry in `until` and no TTL
    // (eviction, volatile-lru, reaches only keys with one).
    let set = s.admin.json(&[
        "override",
        "set",
        "api",
        "alice",
        "per_minute",
        "--limit",
        "100",
        "--burst",
        "200",
        "--expires",
        "1h",
        "--note",
        "incident 7",
    ]);
    assert_eq!(set["override"]["key"], key.as_str());
    let fields = hash(&s.redis, &key);
    let at = fields["at"].parse::<u128>().unwrap();
    let now_ms = s.redis.time_ns() / 1_000_000;
    assert!(
        at <= now_ms && now_ms - at < 60_000,
        "at {at}, now {now_ms}"
    );
    let expires_at = set["override"]["expires_at_ms"].as_u64().unwrap();
    assert_eq!(u128::from(expires_at), at + 3_600_000);
    let until = expires_at.to_string();
    let want: BTreeMap<String, String> = [
        ("mode", "limit"),
        ("limit", "100"),
        ("burst", "200"),
        ("until", until.as_str()),
        ("by", "test-operator"),
        ("at", fields["at"].as_str()),
        ("note", "incident 7"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(fields, want);
    assert_eq!(pttl(&s.redis, &key), -1, "the expiry is a field, not a TTL");

    let got = s
        .admin
        .json(&["override", "get", "api", "alice", "per_minute"]);
    assert_eq!(got["override"]["mode"], "limit");
    assert_eq!(
        (
            got["override"]["limit"].as_u64(),
            got["override"]["burst"].as_u64()
        ),
        (Some(100), Some(200))
    );
    assert_eq!(got["override"]["note"], "incident 7");
    let human = s
        .admin
        .run(&["override", "get", "api", "alice", "per_minute"]);
    assert!(
        human
            .stdout
            .contains("override limit 100, burst 200, until "),
        "{human:?}"
    );

    // Replaced whole, without an expiry: no burst left behind, no TTL.
    s.admin.json(&[
        "override",
        "set",
        "api",
        "alice",
        "per_minute",
        "--unlimited",
    ]);
    let fields = hash(&s.redis, &key);
    assert_eq!(
        fields.keys().map(String::as_str).collect::<Vec<_>>(),
        ["at", "by", "mode"]
    );
    assert_eq!(fields["mode"], "unlimited");
    assert_eq!(pttl(&s.redis, &key), -1, "no expiry: until removed");
    assert_eq!(
        s.admin
            .json(&["override", "get", "api", "alice", "per_minute"])["override"]["expires_at_ms"],
        Value::Null
    );

    // An expiry as a Unix time and as RFC 3339: `until` that instant.
    let in_two_hours = (s.redis.time_ns() / 1_000_000_000 + 7200).to_string();
    let bob_key = override_key(
        &s.keys
            .limit_key("api", "per_day", "header:x-api-key", b"bob"),
    );
    s.admin.json(&[
        "override",
        "set",
        "api",
        "bob",
        "per_day",
        "--blocked",
        "--expires",
        &in_two_hours,
    ]);
    assert_eq!(hash(&s.redis, &bob_key)["mode"], "blocked");
    let until: u128 = hash(&s.redis, &bob_key)["until"].parse().unwrap();
    let in_ms: u128 = in_two_hours.parse::<u128>().unwrap() * 1000;
    assert_eq!(until, in_ms);
    let ip_key = override_key(
        &s.keys
            .limit_key("api", "per_day", "client_ip", b"203.0.113.0/24"),
    );
    let set = s.admin.json(&[
        "override",
        "set",
        "api",
        "203.0.113.9",
        "per_day",
        "--from",
        "client_ip",
        "--limit",
        "5",
        "--expires",
        "2999-01-01T00:00:00Z",
    ]);
    assert_eq!(
        set["override"]["key"],
        ip_key.as_str(),
        "the address grouped into its /24"
    );
    assert_eq!(set["override"]["expires_at_ms"], 32_472_144_000_000u64);
    assert_eq!(hash(&s.redis, &ip_key)["limit"], "5");

    // Listed by key (identities are hashed), all or one rule's.
    let list = s.admin.json(&["override", "list"]);
    let mut listed: Vec<&str> = list["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["key"].as_str().unwrap())
        .collect();
    listed.sort_unstable();
    let mut want = vec![key.as_str(), bob_key.as_str(), ip_key.as_str()];
    want.sort_unstable();
    assert_eq!(listed, want);
    let one = &list["overrides"][0];
    assert_eq!(
        (one["rule"].as_str(), one["read_by_filter"].as_bool()),
        (Some("api"), Some(true))
    );
    assert_eq!(
        s.admin.json(&["override", "list", "each"])["overrides"],
        serde_json::json!([])
    );

    // Removed: the key is gone; removing again finds nothing.
    let rm = s
        .admin
        .json(&["override", "rm", "api", "alice", "per_minute"]);
    assert_eq!(rm["removed"], true);
    assert!(!exists(&s.redis, &key));
    assert_eq!(
        s.admin
            .json(&["override", "rm", "api", "alice", "per_minute"])["removed"],
        false
    );
    assert_eq!(
        s.admin
            .json(&["override", "get", "api", "alice", "per_minute"])["override"],
        Value::Null
    );
    assert_eq!(
        s.admin.json(&["override", "list"])["overrides"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    drop(s.dir);
}

#[test]
fn reset_deletes_one_identitys_state_and_nothing_else() {
    let mut s = setup("admin-reset");
    let now = s.redis.time_ns();
    let state = |who: &[u8], limit: &str| s.keys.limit_key("api", limit, "header:x-api-key", who);
    let (alice_m, alice_d, bob_m) = (
        state(b"alice", "per_minute"),
        state(b"alice", "per_day"),
        state(b"bob", "per_minute"),
    );
    let shards: Vec<String> = (0..3)
        .map(|n| shard_key(&state(b"alice", "sharded"), n))
        .collect();
    for key in [&alice_m, &bob_m] {
        assert_eq!(
            s.script
                .one(now, &as_script(key, Algorithm::TokenBucket, 10, 60_000))
                .0,
            1
        );
    }
    assert_eq!(
        s.script
            .one(
                now,
                &as_script(&alice_d, Algorithm::FixedWindow, 1000, 86_400_000)
            )
            .0,
        1
    );
    for key in &shards {
        assert_eq!(
            s.script
                .one(now, &as_script(key, Algorithm::TokenBucket, 30, 1000))
                .0,
            1
        );
    }
    s.admin.json(&[
        "override",
        "set",
        "api",
        "alice",
        "per_minute",
        "--limit",
        "50",
    ]);
    let override_ = override_key(&alice_m);

    // One limit: only its key.
    let one = s.admin.json(&["reset", "api", "alice", "per_day"]);
    assert_eq!(one["limits"][0]["deleted"], 1);
    assert!(!exists(&s.redis, &alice_d));
    assert!(exists(&s.redis, &alice_m));

    // Every limit of the rule, every shard; bob's state and alice's override stay.
    let all = s.admin.json(&["reset", "api", "alice"]);
    let deleted: Vec<u64> = all["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["deleted"].as_u64().unwrap())
        .collect();
    assert_eq!(deleted, [1, 0, 3]);
    for key in shards.iter().chain([&alice_m]) {
        assert!(!exists(&s.redis, key), "{key} deleted");
    }
    assert!(exists(&s.redis, &bob_m), "another identity's state stays");
    assert!(exists(&s.redis, &override_), "reset leaves the override");
}

#[test]
fn inspect_says_what_the_script_replies_next_on_every_algorithm() {
    let mut s = setup("admin-inspect");
    let day = 86_400_000;
    let limits = [
        ("tb", Algorithm::TokenBucket, day),
        ("gcra", Algorithm::Gcra, day),
        ("fw", Algorithm::FixedWindow, 366 * day),
        ("swc", Algorithm::SlidingWindowCounter, 183 * day),
        ("swl", Algorithm::SlidingWindowLog, day),
    ];
    for (name, algorithm, window) in limits {
        let key = s.keys.limit_key("each", name, "header:x-api-key", b"carol");
        let l = L {
            cost: 3,
            ..as_script(&key, algorithm, 10, window)
        };
        let (allowed, remaining, ..) = s.script.one(s.redis.time_ns(), &l);
        assert_eq!(allowed, 1, "{name}");
        let report = s.admin.json(&["inspect", "each", "carol"]);
        let shown = report["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["limit"] == name)
            .unwrap()
            .clone();
        assert_eq!(shown["algorithm"], algorithm.name());
        assert_eq!(shown["shards"][0]["key"], key.as_str());
        let left = shown["left"].as_f64().unwrap();
        let replied: f64 = remaining.parse().unwrap();
        // Buckets refill 10 a day: well under 0.01 between the call and the inspection.
        assert!(
            (left - replied).abs() < 0.01,
            "{name}: inspect {left}, script {replied}"
        );
        // The next request of cost 1 gets what inspect said, less 1.
        let next = L {
            cost: 1,
            ..l.clone()
        };
        let (_, after, ..) = s.script.one(s.redis.time_ns(), &next);
        let after: f64 = after.parse().unwrap();
        assert!(
            (after - (left - 1.0)).abs() < 0.01,
            "{name}: next reply {after}, inspect said {left}"
        );
        assert!(
            shown["whole_in_ms"].as_f64().unwrap() > 0.0,
            "{name}: not whole"
        );
        assert_eq!(shown["debt"], 0.0);
        assert_eq!(shown["in_flight"], Value::Null);
    }

    // Debt from a usage settlement: nothing left, the debt shown, whole only once repaid.
    let key = s.keys.limit_key("each", "fw", "header:x-api-key", b"dave");
    let l = as_script(&key, Algorithm::FixedWindow, 10, 366 * day);
    let now = s.redis.time_ns();
    assert_eq!(s.script.one(now, &l).0, 1);
    s.script.settle(now, &l, 14);
    let report = s.admin.json(&["inspect", "each", "dave"]);
    let fw = report["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["limit"] == "fw")
        .unwrap()
        .clone();
    assert_eq!(
        (fw["left"].as_f64(), fw["debt"].as_f64()),
        (Some(0.0), Some(5.0))
    );
    let human = s.admin.run(&["inspect", "each", "dave"]);
    assert!(
        human.stdout.contains("left now: 0 of 10; whole again in "),
        "{}",
        human.stdout
    );
    assert!(human.stdout.contains("; debt 5\n"), "{}", human.stdout);

    // An override in effect: its numbers, for a fresh state its whole burst.
    s.admin.json(&[
        "override",
        "set",
        "api",
        "erin",
        "per_minute",
        "--limit",
        "40",
        "--burst",
        "60",
    ]);
    let report = s.admin.json(&["inspect", "api", "erin"]);
    let m = &report["limits"][0];
    assert_eq!(
        (m["in_effect"]["mode"].as_str(), m["left"].as_f64()),
        (Some("limit"), Some(60.0))
    );
    assert_eq!(m["override"]["limit"], 40);
    s.admin.json(&[
        "override",
        "set",
        "api",
        "erin",
        "per_minute",
        "--unlimited",
    ]);
    assert_eq!(
        s.admin.json(&["inspect", "api", "erin"])["limits"][0]["left"],
        Value::Null
    );
    s.admin
        .json(&["override", "set", "api", "erin", "per_minute", "--blocked"]);
    assert_eq!(
        s.admin.json(&["inspect", "api", "erin"])["limits"][0]["left"],
        0.0
    );
}

#[test]
fn every_change_appends_one_audit_entry_and_the_stream_stays_bounded() {
    let s = setup("admin-audit");
    s.admin.json(&[
        "override",
        "set",
        "api",
        "alice",
        "per_minute",
        "--limit",
        "5",
    ]);
    s.admin
        .json(&["override", "rm", "api", "alice", "per_minute"]);
    s.admin.json(&["reset", "api", "alice", "per_day"]);
    s.admin.json(&["inspect", "api", "alice"]);
    s.admin
        .json(&["override", "get", "api", "alice", "per_minute"]);
    assert_eq!(audit_len(&s.redis), 3, "reads append nothing");
    let audit = s.admin.json(&["audit"]);
    let entries = audit["entries"].as_array().unwrap();
    let what: Vec<&str> = entries
        .iter()
        .map(|e| e["what"].as_str().unwrap())
        .collect();
    assert_eq!(
        what,
        ["reset", "override rm", "override set"],
        "newest first"
    );
    let state = s
        .keys
        .limit_key("api", "per_day", "header:x-api-key", b"alice");
    let reset = &entries[0];
    assert_eq!(
        (
            reset["who"].as_str(),
            reset["rule"].as_str(),
            reset["limit"].as_str(),
            reset["key"].as_str()
        ),
        (
            Some("test-operator"),
            Some("api"),
            Some("per_day"),
            Some(state.as_str())
        )
    );
    assert!(reset["when"].as_str().unwrap().parse::<u64>().is_ok());
    assert!(entries[2]["detail"]
        .as_str()
        .unwrap()
        .contains("mode=limit limit=5 expires=never"));
    assert_eq!(
        s.admin.json(&["audit", "--count", "1"])["entries"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let human = s.admin.run(&["audit"]);
    assert!(
        human
            .stdout
            .contains(" test-operator override rm api/per_minute rl:{"),
        "{}",
        human.stdout
    );

    // Bounded: a stream filled past the bound is trimmed back by the next change (MAXLEN ~
    // trims whole nodes of 100 entries, so up to 100 more may stay).
    let mut admin = s.redis.admin();
    for i in 0..10_100 {
        admin
            .cmd(&[
                "XADD",
                "rl:{admin}:audit",
                "*",
                "what",
                "filler",
                "i",
                &i.to_string(),
            ])
            .unwrap();
    }
    s.admin.json(&["reset", "api", "alice"]);
    let len = audit_len(&s.redis);
    assert!((10_000..=10_100).contains(&len), "XLEN {len}");
}

/// Without `--by`, a change names the OS user running the tool: its uid's name (as `id -un`
/// gives it), whatever `$USER` and `$LOGNAME` say; with no name for the uid, `$LOGNAME` or
/// `$USER`, and with none of them the change is refused. `--by` wins (every other test).
#[test]
fn a_change_without_by_names_the_os_user() {
    let s = setup("admin-operator");
    let id = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let uid_name = String::from_utf8(id.stdout).unwrap().trim().to_string();
    let set = [
        "override",
        "set",
        "api",
        "alice",
        "per_minute",
        "--limit",
        "5",
    ];
    let others = [("USER", "mallory"), ("LOGNAME", "mallory")];
    if id.status.success() && !uid_name.is_empty() {
        let run = s.admin.run_unnamed(&set, &others);
        assert_eq!(run.code, 0, "{run:?}");
        let run = s
            .admin
            .run_unnamed(&["reset", "api", "alice", "per_minute"], &[]);
        assert_eq!(run.code, 0, "{run:?}");
        let state = s
            .keys
            .limit_key("api", "per_minute", "header:x-api-key", b"alice");
        assert_eq!(hash(&s.redis, &override_key(&state))["by"], uid_name);
        let audit = s.admin.json(&["audit"]);
        let who: Vec<&str> = audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["who"].as_str().unwrap())
            .collect();
        assert_eq!(who, [uid_name.as_str(), uid_name.as_str()]);
    } else {
        // This uid has no name (a container's): the environment names the author, or nobody
        // does and the change is refused, with nothing written.
        let run = s.admin.run_unnamed(&set, &[("LOGNAME", "ana")]);
        assert_eq!(run.code, 0, "{run:?}");
        let run = s.admin.run_unnamed(&set, &[]);
        assert_eq!((run.code, run.stdout.as_str()), (2, ""), "{run:?}");
        assert!(run.stderr.contains("give --by WHO"), "{}", run.stderr);
        assert_eq!(audit_len(&s.redis), 1);
    }
}

#[test]
fn each_bad_input_is_a_clear_error_with_its_exit_status() {
    let s = setup("admin-errors");
    let a = &s.admin;
    // Usage: exit status 2, nothing printed on stdout, the name that is wrong.
    for (args, message) in [
        (&["inspect", "web", "k"][..], "unknown rule \"web\": the config's rules are api, each"),
        (&["reset", "api", "k", "hourly"], "rule api: unknown limit \"hourly\": its limits are per_minute, per_day, sharded"),
        (&["inspect", "api", "k", "--from", "route"], "rule api: --from \"route\" is not one of its key.from entries: header:x-api-key, client_ip, anonymous"),
        (&["override", "set", "api", "k", "sharded", "--limit", "5"], "rule api, limit sharded: this limit does not read overrides"),
        (&["override", "set", "api", "k", "per_minute", "--limit", "0"], "rule api, limit per_minute: --limit 0: must be from 1 to 1000000000000 for token_bucket"),
        (&["override", "set", "api", "k", "per_minute", "--limit", "1000000000001"], "--limit 1000000000001: must be from 1 to 1000000000000"),
        (&["override", "set", "api", "k", "per_minute", "--limit", "ten"], "--limit ten: not a whole number"),
        (&["override", "set", "api", "k", "per_minute", "--limit", "5", "--burst", "0"], "--burst 0: must be from 1 to 1000000000000"),
        (&["override", "set", "api", "k", "per_day", "--limit", "5", "--burst", "9"], "rule api, limit per_day: --burst: fixed_window has no burst (only token_bucket and gcra do)"),
        (&["override", "set", "api", "k", "per_minute", "--limit", "5", "--expires", "yesterday"], "--expires yesterday: neither a duration"),
        (&["override", "set", "api", "k", "per_minute", "--limit", "5", "--expires", "1000"], "is not in the future"),
        (&["override", "frob"], "usage: ratelimit-admin override (set|get|list|rm)"),
        (&["inspect", "api"], "usage: ratelimit-admin inspect RULE IDENTITY"),
        (&["audit", "--count", "x"], "--count x: not a whole number from 1 to 10000"),
    ] {
        let err = a.fails(2, args);
        assert!(err.contains(message), "{args:?}: {err}");
    }
    assert_eq!(audit_len(&s.redis), 0, "no change was made");

    // A config the tool cannot read: exit status 1, the file and what is wrong.
    let with_config = |name: &str, text: Option<&str>| {
        let path = s.dir.file(name);
        if let Some(text) = text {
            std::fs::write(&path, text).unwrap();
        }
        Admin {
            config: path,
            redis: a.redis.clone(),
            by: a.by.clone(),
        }
    };
    let missing = with_config("missing.json", None).fails(1, &["audit"]);
    assert!(missing.contains("missing.json: cannot read"), "{missing}");
    let broken = with_config(
        "broken.json",
        Some(&CONFIG.replace(r#""limit": 10,"#, r#""limit": 0,"#)),
    );
    let err = broken.fails(1, &["audit"]);
    assert!(
        err.contains("invalid filter configuration: rules[0].limits[0].limit: must be >= 1"),
        "{err}"
    );
    let err = with_config("garbage.yaml", Some("a: [unclosed")).fails(1, &["audit"]);
    assert!(err.contains("not valid YAML or JSON"), "{err}");
    // Several configs in one file: choose with --select.
    let two = format!(
        "---\n{CONFIG}\n---\n{}\n",
        CONFIG.replace("\"api\"", "\"web\"")
    );
    let several = with_config("two.yaml", Some(&two));
    let err = several.fails(2, &["inspect", "web", "k"]);
    assert!(err.contains("two.yaml holds 2 filter configs: choose one with --select N:\n  --select 1: document 1\n  --select 2: document 2"), "{err}");
    assert_eq!(
        several.run(&["inspect", "web", "k", "--select", "2"]).code,
        0
    );
    // A cluster config pointed at a single Redis: the tool's user there may not PING (the
    // cluster client's connection check), and a user that may learns it is no cluster node.
    let on_single = with_config(
        "cluster.json",
        Some(&CONFIG.replace(
            r#""cluster": "webdis""#,
            r#""cluster": "webdis", "redis_cluster": true"#,
        )),
    );
    let err = on_single.fails(1, &["audit"]);
    assert!(err.contains("PING: refused by Redis's ACL"), "{err}");
    let err = Admin {
        redis: s.redis.url_as(REDIS_ADMIN.0, REDIS_ADMIN.1),
        ..with_config("cluster.json", None)
    }
    .fails(1, &["audit"]);
    assert!(
        err.contains("no cluster node, and the config's bridge.redis_cluster is true"),
        "{err}"
    );

    // Redis unreachable, a wrong password, a user without the tool's rights.
    let closed = e2e::free_port();
    let unreachable = Admin {
        redis: format!(
            "redis://{}:{}@127.0.0.1:{closed}",
            REDIS_TOOL.0, REDIS_TOOL.1
        ),
        ..with_config("filter.json", None)
    };
    let err = unreachable.fails(1, &["inspect", "api", "k"]);
    assert!(
        err.contains(&format!(
            "cannot reach Redis at redis://ratelimit-admin:***@127.0.0.1:{closed}"
        )),
        "{err}"
    );
    assert!(
        !err.contains(REDIS_TOOL.1),
        "the password is not shown: {err}"
    );
    let wrong = Admin {
        redis: s.redis.url_as(REDIS_TOOL.0, "not-the-password"),
        ..with_config("filter.json", None)
    };
    let err = wrong.fails(1, &["audit"]);
    assert!(err.contains("login refused"), "{err}");
    let webdis = Admin {
        redis: s.redis.url_as("default", REDIS_WEBDIS_PASSWORD),
        ..with_config("filter.json", None)
    };
    let err = webdis.fails(1, &["reset", "api", "k"]);
    assert!(
        err.contains("refused by Redis's ACL for this user"),
        "{err}"
    );
    let err = webdis.fails(1, &["override", "list"]);
    assert!(
        err.contains("SCAN") && err.contains("refused by Redis's ACL"),
        "{err}"
    );
    let err = Admin {
        redis: String::new(),
        ..with_config("filter.json", None)
    }
    .fails(2, &["audit"]);
    assert!(
        err.contains("no Redis: give --redis URL or set RATELIMIT_ADMIN_REDIS"),
        "{err}"
    );
    let err = a.fails(2, &["audit", "--redis", "http://127.0.0.1:6379"]);
    assert!(
        err.contains("--redis http://127.0.0.1:6379: not a Redis URL"),
        "{err}"
    );
}

#[test]
fn inspect_counts_the_holds_in_flight_and_a_calendar_window_as_the_script_does() {
    let mut s = setup("admin-inspect-holds");
    let key = s
        .keys
        .limit_key("holds", "streams", "header:x-api-key", b"erin");
    let holds = as_script(&key, Algorithm::Concurrency, 3, 600_000);
    let now = s.redis.time_ns();
    assert_eq!(s.script.one(now, &holds.clone().held_by("w-1")).0, 1);
    assert_eq!(s.script.one(now, &holds.clone().held_by("w-2")).0, 1);
    let month_key = s
        .keys
        .limit_key("holds", "monthly", "header:x-api-key", b"erin");
    let monthly = L {
        cost: 7,
        ..as_script(&month_key, Algorithm::FixedWindow, 100, 0).calendar(CalendarUnit::Month, 330)
    };
    assert_eq!(s.script.one(now, &monthly).0, 1);
    let report = s.admin.json(&["inspect", "holds", "erin"]);
    let limits = report["limits"].as_array().unwrap();
    let streams = limits.iter().find(|x| x["limit"] == "streams").unwrap();
    assert_eq!(streams["in_flight"], 2.0);
    assert_eq!(streams["left"], 1.0);
    let month = limits.iter().find(|x| x["limit"] == "monthly").unwrap();
    assert_eq!(month["left"], 93.0, "the calendar month's count: {month}");
    assert_eq!(month["config"]["window"], "month at UTC+05:30");
    // Released: one more allowed.
    s.script
        .settle(s.redis.time_ns(), &holds.held_by("w-1"), -1);
    let report = s.admin.json(&["inspect", "holds", "erin"]);
    let streams = report["limits"][0].clone();
    assert_eq!(
        (streams["in_flight"].clone(), streams["left"].clone()),
        (1.0.into(), 2.0.into())
    );
    let human = s.admin.run(&["inspect", "holds", "erin"]).stdout;
    assert!(
        human.contains("concurrency, 3 in flight, each held at most 10m"),
        "{human}"
    );
}

/// On a Redis Cluster (`bridge.redis_cluster`), as the tool's user of
/// envoy/cluster/redis-node.conf: every key of one identity is on its tag's slot, on the master
/// of that slot; a sharded limit's shards are reset on each of theirs; `override list` finds
/// the overrides of every master; each change is audited on the stream's own slot.
#[test]
fn on_a_redis_cluster_every_command_works_on_the_identitys_slot() {
    let dir = WorkDir::new("admin-cluster");
    let cluster = RedisCluster::start(&dir, 3, 0);
    let text = CONFIG.replace(
        r#""cluster": "webdis""#,
        r#""cluster": "webdis", "redis_cluster": true"#,
    );
    let config = dir.file("filter.json");
    std::fs::write(&config, &text).unwrap();
    let keys = Keys::from_json(&text);
    let seed = cluster.ports()[0];
    let admin = Admin {
        config,
        redis: format!("redis://{}:{}@127.0.0.1:{seed}", REDIS_TOOL.0, REDIS_TOOL.1),
        by: "test-operator".to_string(),
    };
    let state =
        |id: &str, limit: &str| keys.limit_key("api", limit, "header:x-api-key", id.as_bytes());
    let tag_slot =
        |key: &str| cluster.keyslot(&key[key.find('{').unwrap() + 1..key.find('}').unwrap()]);
    let exists = |key: &str| {
        cluster
            .admin(cluster.master_of_key(key))
            .cmd(&["EXISTS", key])
            .unwrap()
            .int()
    };

    // Identities until every master holds one's override.
    let masters = cluster.masters();
    let mut ids: Vec<String> = Vec::new();
    let mut covered = BTreeMap::new();
    for i in 0..200 {
        let id = format!("c-{i}");
        let master = cluster.master_of_key(&override_key(&state(&id, "per_minute")));
        if covered.insert(master, id.clone()).is_none() {
            ids.push(id);
        }
        if covered.len() == masters.len() {
            break;
        }
    }
    assert_eq!(covered.len(), masters.len(), "an identity on every master");

    for (n, id) in ids.iter().enumerate() {
        let set = admin.json(&[
            "override",
            "set",
            "api",
            id,
            "per_minute",
            "--limit",
            &(5 + n).to_string(),
            "--expires",
            "1h",
        ]);
        let key = override_key(&state(id, "per_minute"));
        assert_eq!(set["override"]["key"], key.as_str());
        assert_eq!(
            cluster.keyslot(&key),
            tag_slot(&key),
            "{key}: on its tag's slot"
        );
        assert_eq!(exists(&key), 1, "{key} is on the master of its slot");
        let mut master = cluster.admin(cluster.master_of_key(&key));
        assert_eq!(
            master.cmd(&["PTTL", &key]).unwrap().int(),
            -1,
            "{key}: no TTL"
        );
        let until: u64 = master
            .cmd(&["HGET", &key, "until"])
            .unwrap()
            .text()
            .parse()
            .unwrap();
        assert_eq!(
            Some(until),
            set["override"]["expires_at_ms"].as_u64(),
            "{key}"
        );
        // Saved by the master of its slot before the tool returned.
        let persistence = master.cmd(&["INFO", "persistence"]).unwrap().text();
        assert!(
            !persistence.contains("rdb_saves:0\r\n"),
            "{key}: {persistence}"
        );
        let got = admin.json(&["override", "get", "api", id, "per_minute"]);
        assert_eq!(got["override"]["limit"], 5 + n as u64, "{got}");
        assert_eq!(got["override"]["by"], "test-operator");
    }
    let list = admin.json(&["override", "list"]);
    let mut listed: Vec<String> = list["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["key"].as_str().unwrap().to_string())
        .collect();
    listed.sort();
    let mut wanted: Vec<String> = ids
        .iter()
        .map(|id| override_key(&state(id, "per_minute")))
        .collect();
    wanted.sort();
    assert_eq!(listed, wanted, "one override on each master, all listed");
    let on: Vec<u16> = {
        let mut m: Vec<u16> = listed.iter().map(|k| cluster.master_of_key(k)).collect();
        m.sort_unstable();
        m.dedup();
        m
    };
    assert_eq!(on.len(), masters.len(), "{on:?}");

    // inspect and reset: one identity's limits on its slot, the shards on theirs.
    let id = &ids[0];
    let mut written = vec![state(id, "per_minute")];
    written.extend((0..3).map(|n| shard_key(&state(id, "sharded"), n)));
    let shard_slots: Vec<u16> = written[1..].iter().map(|k| cluster.keyslot(k)).collect();
    assert!(
        shard_slots.windows(2).any(|w| w[0] != w[1]),
        "the shards are on several slots: {shard_slots:?}"
    );
    for key in &written {
        let mut node = cluster.admin(cluster.master_of_key(key));
        let now = node.cmd(&["TIME"]).unwrap().items()[0].text();
        node.cmd(&["HSET", key, "tokens", "1", "ts", &format!("{now}000")])
            .unwrap();
    }
    let report = admin.json(&["inspect", "api", id]);
    let limits = report["limits"].as_array().unwrap();
    let per_minute = limits.iter().find(|l| l["limit"] == "per_minute").unwrap();
    assert_eq!(per_minute["override"]["limit"], 5, "{per_minute}");
    assert_eq!(per_minute["shards"][0]["exists"], true, "{per_minute}");
    let sharded = limits.iter().find(|l| l["limit"] == "sharded").unwrap();
    let shards: Vec<&Value> = sharded["shards"].as_array().unwrap().iter().collect();
    assert_eq!(shards.len(), 3);
    assert!(shards.iter().all(|s| s["exists"] == true), "{sharded}");
    let reset = admin.json(&["reset", "api", id]);
    let deleted: BTreeMap<String, u64> = reset["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["limit"].as_str().unwrap().to_string(),
                l["deleted"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(deleted["per_minute"], 1);
    assert_eq!(deleted["sharded"], 3, "each shard deleted on its slot");
    assert!(written.iter().all(|k| exists(k) == 0), "no state left");
    // The override is no state: a reset keeps it.
    assert_eq!(exists(&override_key(&state(id, "per_minute"))), 1);

    // rm, then get and list say it is gone.
    let rm = admin.json(&["override", "rm", "api", id, "per_minute"]);
    assert_eq!(rm["removed"], true);
    assert_eq!(
        admin.json(&["override", "get", "api", id, "per_minute"])["override"],
        Value::Null
    );
    assert_eq!(
        admin.json(&["override", "list"])["overrides"]
            .as_array()
            .unwrap()
            .len(),
        ids.len() - 1
    );

    // Every change audited, newest first, on the stream's own slot.
    let audit = admin.json(&["audit", "--count", "100"]);
    let whats: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["what"].as_str().unwrap())
        .collect();
    let mut expected = vec!["override rm"];
    expected.extend(["reset"; 3]);
    expected.extend(vec!["override set"; ids.len()]);
    assert_eq!(whats, expected);
    let stream = "rl:{admin}:audit";
    assert_eq!(
        cluster
            .admin(cluster.master_of_key(stream))
            .cmd(&["XLEN", stream])
            .unwrap()
            .int(),
        expected.len() as i64
    );
}
