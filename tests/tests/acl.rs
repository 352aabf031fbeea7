//! The Redis users that run the decision script may call every command the scripts call: Redis
//! checks ACLs inside scripts, so a command missing from a shipped ACL fails every decision (or
//! refund) that reaches it, and only on the setup that ships that ACL. No processes: this reads
//! the scripts and the shipped Redis configs, the deployment recipes' included.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `redis.call('NAME'` in lua/*.lua, lower case.
fn commands_the_scripts_call() -> BTreeSet<String> {
    let mut commands = BTreeSet::new();
    let dir = repo().join("lua");
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "lua") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for quote in ["'", "\""] {
            let marker = format!("redis.call({quote}");
            for (at, _) in text.match_indices(&marker) {
                let rest = &text[at + marker.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphabetic())
                    .collect();
                assert!(
                    !name.is_empty(),
                    "{}: a redis.call without a literal command",
                    path.display()
                );
                commands.insert(name.to_ascii_lowercase());
            }
        }
    }
    commands
}

/// The commands the `default` user of a Redis config may run (its `+cmd` rules, lower case).
/// The line may be indented: in a Kubernetes manifest it is inside a YAML block string.
fn default_user_commands(config: &str) -> BTreeSet<String> {
    let path = repo().join(config);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let line = text
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with("user default "))
        .unwrap_or_else(|| panic!("{config}: no `user default` line"));
    line.split_whitespace()
        .filter_map(|rule| rule.strip_prefix('+'))
        .map(str::to_ascii_lowercase)
        .collect()
}

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
        for needed in ["evalsha", "script|load"] {
            assert!(
                allowed.contains(needed),
                "{config}: the default user may not run {needed}"
            );
        }
    }
}
