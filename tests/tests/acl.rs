//! The Redis users that run the decision code (a function, or the script) may call every
//! command it calls, and load it: Redis checks ACLs inside functions and scripts, so a command missing from a shipped ACL fails every decision (or
//! refund) that reaches it, and only on the setup that ships that ACL. This reads the scripts
//! and the shipped Redis configs, the deployment recipes' included.
//!
//! The `ratelimit-admin` user of the operator's command may run exactly the commands the tool
//! sends (`ratelimit_admin::COMMANDS`, plus `CLUSTER_COMMANDS` on a cluster's nodes), on keys
//! under `rl:`: checked in every shipped config, and against a real Redis, which refuses it
//! every other command and every other key.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

use e2e::{Redis, Resp, WorkDir};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `redis.call('NAME'` in lua/*.lua, lower case, also through the local names the code
/// gives `redis.call` (`rcall, rpcall = redis.call, redis.pcall`). What `redis.pcall` runs is
/// left out: the code handles its refusal (`CLUSTER SLOTS` on a single Redis).
fn commands_the_scripts_call() -> BTreeSet<String> {
    let dir = repo().join("lua");
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut texts = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "lua") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        texts.push((path, text));
    }
    let mut callers = vec!["redis.call".to_string()];
    for (_, text) in &texts {
        callers.extend(aliases_of_redis_calls(text));
    }
    let mut commands = BTreeSet::new();
    for (path, text) in &texts {
        for caller in &callers {
            for quote in ["'", "\""] {
                let marker = format!("{caller}({quote}");
                for (at, _) in text.match_indices(&marker) {
                    // A whole name: `rcall(` is not the end of `ourcall(`.
                    let before = text[..at].chars().next_back();
                    if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                        continue;
                    }
                    let rest = &text[at + marker.len()..];
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphabetic())
                        .collect();
                    assert!(
                        !name.is_empty(),
                        "{}: a {caller} without a literal command",
                        path.display()
                    );
                    commands.insert(name.to_ascii_lowercase());
                }
            }
        }
    }
    commands
}

/// The names `text` gives `redis.call` in assignments such as `local call = redis.call` or
/// `rcall, rpcall = redis.call, redis.pcall`.
fn aliases_of_redis_calls(text: &str) -> Vec<String> {
    let mut aliases = Vec::new();
    for line in text.lines() {
        let line = line.trim().trim_start_matches("local ");
        let Some((names, values)) = line.split_once('=') else {
            continue;
        };
        for (name, value) in names.split(',').zip(values.split(',')) {
            let (name, value) = (name.trim(), value.trim());
            let plain =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if plain && value == "redis.call" {
                aliases.push(name.to_string());
            }
        }
    }
    aliases
}

/// The rules of user `user` in a Redis config (its `user NAME …` line, after the name). The
/// line may be indented: in a Kubernetes manifest it is inside a YAML block string.
fn user_rules(config: &str, user: &str) -> Vec<String> {
    let path = repo().join(config);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let start = format!("user {user} ");
    let line = text
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("{config}: no `user {user}` line"));
    line.split_whitespace()
        .skip(2)
        .map(str::to_string)
        .collect()
}

/// The commands user `user` of a Redis config may run (its `+cmd` rules, lower case).
fn user_commands(config: &str, user: &str) -> BTreeSet<String> {
    user_rules(config, user)
        .iter()
        .filter_map(|rule| rule.strip_prefix('+'))
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

fn default_user_commands(config: &str) -> BTreeSet<String> {
    user_commands(config, "default")
}

/// Every shipped config whose Redis the operator's command may reach: single Redis, and the
/// Redis Cluster's nodes, whose user also has what the cluster client sends.
const ADMIN_TOOL_CONFIGS: [&str; 4] = [
    "envoy/redis.conf",
    "deploy/kubernetes/10-redis.yaml",
    "deploy/compose/redis.conf",
    CLUSTER_NODE_CONFIG,
];
const CLUSTER_NODE_CONFIG: &str = "envoy/cluster/redis-node.conf";
const TOOL_USER: &str = "ratelimit-admin";

#[test]
fn the_scripts_call_the_commands_this_test_knows() {
    // A guard on the parser above: these are called by every setup.
    let called = commands_the_scripts_call();
    for command in ["hmget", "hset", "pexpire", "time"] {
        assert!(
            called.contains(command),
            "{command} not found in lua/*.lua: {called:?}"
        );
    }
}

#[test]
fn every_shipped_redis_acl_allows_every_command_the_scripts_call() {
    let called = commands_the_scripts_call();
    for config in [
        "envoy/redis.conf",
        "envoy/cluster/redis-node.conf",
        "deploy/kubernetes/10-redis.yaml",
        "deploy/compose/redis.conf",
    ] {
        let allowed = default_user_commands(config);
        let missing: Vec<&String> = called.iter().filter(|c| !allowed.contains(*c)).collect();
        assert!(
            missing.is_empty(),
            "{config}: the default user (which runs the decision script) may not run {missing:?}, which lua/*.lua calls"
        );
        // The script on every setup (a Redis Cluster, `bridge.redis_calls: "script"`), the
        // function where the filter calls it by default (not behind Envoy's redis_proxy).
        let mut needed = vec!["evalsha", "script|load"];
        if config != CLUSTER_NODE_CONFIG {
            needed.extend(["fcall", "function|load"]);
        }
        for needed in needed {
            assert!(
                allowed.contains(needed),
                "{config}: the default user may not run {needed}"
            );
        }
        // Loading is all it may do to the libraries and the script cache: no FLUSH, DELETE or
        // RESTORE through a whole-command or category rule.
        for whole in ["function", "script", "@all", "@scripting"] {
            assert!(
                !allowed.contains(whole),
                "{config}: the default user may run all of {whole}"
            );
        }
    }
}

#[test]
fn every_shipped_redis_has_the_admin_tools_user_with_exactly_its_commands_on_its_keys() {
    let wanted: BTreeSet<String> = ratelimit_admin::COMMANDS
        .iter()
        .map(|c| c.to_string())
        .collect();
    let mut on_cluster = wanted.clone();
    on_cluster.extend(
        ratelimit_admin::CLUSTER_COMMANDS
            .iter()
            .map(|c| c.to_string()),
    );
    for config in ADMIN_TOOL_CONFIGS {
        let rules = user_rules(config, TOOL_USER);
        assert_eq!(
            user_commands(config, TOOL_USER),
            if config == CLUSTER_NODE_CONFIG {
                on_cluster.clone()
            } else {
                wanted.clone()
            },
            "{config}: the {TOOL_USER} user's commands are those the tool sends"
        );
        let first_grant = rules.iter().position(|r| r.starts_with('+'));
        let reset = rules.iter().position(|r| r == "-@all");
        assert!(
            reset.is_some() && reset < first_grant,
            "{config}: -@all before any grant: {rules:?}"
        );
        let keys: Vec<&String> = rules
            .iter()
            .filter(|r| r.starts_with('~') || r.starts_with('%'))
            .collect();
        assert_eq!(keys, ["~rl:*"], "{config}: keys under the prefix only");
        assert!(
            rules.iter().all(|r| !r.starts_with('&')
                && r != "allkeys"
                && r != "allcommands"
                && !r.starts_with("+@")),
            "{config}: no channels, no categories, not all keys: {rules:?}"
        );
        for needed in ["on", "resetkeys", "resetchannels"] {
            assert!(
                rules.iter().any(|r| r == needed),
                "{config}: {needed} missing: {rules:?}"
            );
        }
    }
}

#[test]
fn the_admin_tools_user_runs_what_the_tool_sends_and_nothing_else() {
    let dir = WorkDir::new("acl-admin-user");
    let redis = Redis::start(&dir);
    let mut tool = redis.tool_user();
    // Each command as the tool sends it, on keys under the prefix, in the tool's order.
    let allowed: [&[&str]; 14] = [
        &["TIME"],
        &["MULTI"],
        &["DEL", "rl:{t:1}:r:l:override"],
        &[
            "HSET",
            "rl:{t:1}:r:l:override",
            "mode",
            "limit",
            "limit",
            "5",
        ],
        &[
            "XADD",
            "rl:{admin}:audit",
            "MAXLEN",
            "~",
            "10000",
            "*",
            "who",
            "t",
        ],
        &["EXEC"],
        &["HGETALL", "rl:{t:1}:r:l:override"],
        &["PTTL", "rl:{t:1}:r:l:override"],
        &["HMGET", "rl:{t:1}:r:l", "tokens", "ts"],
        &["ZRANGE", "rl:{t:1}:r:log", "0", "-1", "WITHSCORES"],
        &[
            "SCAN",
            "0",
            "MATCH",
            "rl:{*}:*:override",
            "COUNT",
            "1000",
            "TYPE",
            "hash",
        ],
        &["XREVRANGE", "rl:{admin}:audit", "+", "-", "COUNT", "20"],
        &["BGSAVE"],
        &["INFO", "persistence"],
    ];
    let tried: BTreeSet<String> = allowed.iter().map(|c| c[0].to_ascii_lowercase()).collect();
    let sent: BTreeSet<String> = ratelimit_admin::COMMANDS
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(tried, sent, "every command the tool sends is tried here");
    for command in allowed {
        let reply = tool.cmd(command).unwrap();
        assert!(!matches!(reply, Resp::Error(_)), "{command:?}: {reply:?}");
    }
    assert_eq!(
        redis
            .admin()
            .cmd(&["HGET", "rl:{t:1}:r:l:override", "limit"])
            .unwrap()
            .text(),
        "5",
        "the transaction ran"
    );
    // Commands the tool does not need, and keys outside the prefix: refused by the ACL.
    let refused: [&[&str]; 17] = [
        &["FLUSHALL"],
        &["FLUSHDB"],
        &["KEYS", "*"],
        &["CONFIG", "GET", "*"],
        &["EVAL", "return 1", "0"],
        &["EVALSHA", "0000000000000000000000000000000000000000", "0"],
        &["SCRIPT", "LOAD", "return 1"],
        &["SAVE"],
        &["ACL", "LIST"],
        &["GET", "rl:{t:1}:r:l"],
        &["SET", "rl:{t:1}:r:l", "1"],
        &["HSET", "other:x", "mode", "limit"],
        &["DEL", "other:x"],
        &["HGETALL", "session:1"],
        &["HMGET", "other:x", "tokens"],
        &["PEXPIREAT", "other:x", "1"],
        &["XADD", "other:audit", "*", "who", "t"],
    ];
    for command in refused {
        let reply = tool.cmd(command).unwrap();
        assert!(
            matches!(&reply, Resp::Error(e) if e.starts_with("NOPERM")),
            "{command:?} is refused: {reply:?}"
        );
    }
}
