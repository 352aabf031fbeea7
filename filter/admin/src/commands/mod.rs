//! Each subcommand: what it resolves from the config first (so a bad name never reaches
//! Redis), what it reads or changes, and its report, for people and as JSON. `inspect`, the
//! override commands and the write path every change shares are in their own modules.

mod commit;
mod inspect;
mod override_commands;

use ratelimit_core::config::{Config, Limit, Rule};
use redis::Cmd;
use serde_json::{json, Value};

use crate::audit::{self, Entry};
use crate::cli::{Cli, Command, Named};
use crate::error::{Error, Result};
use crate::overrides;
use crate::store::Store;
use crate::target::{self, Identity};
use commit::del;

/// What a command prints: `human` on a terminal, `json` with `--json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub json: Value,
    pub human: String,
}

/// Runs `cli`'s command; `user` is who makes a change when `--by` is not given (the OS user,
/// [`crate::operator::os_user`]). A change nobody is named for is refused: its audit entry
/// would name no one.
pub fn run(cli: &Cli, user: Option<String>) -> Result<Report> {
    let who = cli.by.clone().or(user).filter(|w| !w.trim().is_empty());
    let changes = matches!(
        cli.command,
        Command::Reset { .. } | Command::OverrideSet { .. } | Command::OverrideRm(_)
    );
    let who = match who {
        Some(who) => who,
        None if changes => {
            return Err(Error::usage(
                "who makes this change? give --by WHO: this uid has no name in /etc/passwd, \
                 and neither $LOGNAME nor $USER is set",
            ))
        }
        // Reads record nobody.
        None => String::new(),
    };
    let path = cli.config.as_deref().ok_or_else(|| {
        Error::usage("no filter config: give --config FILE or set RATELIMIT_ADMIN_CONFIG")
    })?;
    let config = target::by_name(target::load(path, cli.select)?, cli.plan.as_deref())?;
    let mut ctx = Context {
        config: &config,
        cli,
        who,
        store: None,
    };
    match &cli.command {
        Command::Help => Ok(Report {
            json: json!({"usage": crate::USAGE}),
            human: format!("{}\n", crate::USAGE),
        }),
        Command::Inspect { rule, identity } => ctx.inspect(rule, identity),
        Command::Reset {
            rule,
            identity,
            limit,
        } => ctx.reset(rule, identity, limit.as_deref()),
        Command::OverrideSet {
            target,
            setting,
            expires,
            note,
        } => {
            let (rule, limit, id) = ctx.named(target)?;
            overrides::require_overrides(rule, limit)?;
            let mode = overrides::check(rule, limit, setting)?;
            ctx.override_set(rule, limit, &id, mode, expires.as_deref(), note.as_deref())
        }
        Command::OverrideGet(target) => {
            let (rule, limit, id) = ctx.named(target)?;
            ctx.override_get(rule, limit, &id)
        }
        Command::OverrideRm(target) => {
            let (rule, limit, id) = ctx.named(target)?;
            ctx.override_rm(rule, limit, &id)
        }
        Command::OverrideList { rule } => ctx.override_list(rule.as_deref()),
        Command::Audit { count } => ctx.audit(*count),
    }
}

struct Context<'a> {
    config: &'a Config,
    cli: &'a Cli,
    who: String,
    store: Option<Store>,
}

impl<'a> Context<'a> {
    /// The Redis connection, made on first use: a command line the config refuses never
    /// needs Redis.
    fn store(&mut self) -> Result<&mut Store> {
        if self.store.is_none() {
            let url = self.cli.redis.as_deref().ok_or_else(|| {
                Error::usage("no Redis: give --redis URL or set RATELIMIT_ADMIN_REDIS")
            })?;
            self.store = Some(Store::connect(url, self.config.redis_cluster)?);
        }
        self.store
            .as_mut()
            .ok_or_else(|| Error::failure("no Redis connection"))
    }

    /// Redis's time, on the clock of `key`'s master on a cluster.
    fn now_ms(&mut self, key: Option<&str>) -> Result<f64> {
        self.store()?.time_ms(key)
    }

    /// A key on `id`'s slot in `rule` (its first limit's override key), for its master's
    /// clock. A shard's key is on another slot, whose clock the tool does not read: the
    /// masters' clocks are expected to agree (NTP).
    fn slot_key(&self, rule: &Rule, id: &Identity) -> Option<String> {
        rule.limits
            .first()
            .map(|limit| target::override_key_of(self.config, rule, limit, id))
    }

    fn named(&self, n: &Named) -> Result<(&'a Rule, &'a Limit, Identity)> {
        let rule = target::rule(self.config, &n.rule)?;
        let limit = target::limit(rule, &n.limit)?;
        let id = target::identity(self.config, rule, self.cli.from.as_deref(), &n.identity)?;
        Ok((rule, limit, id))
    }

    fn audit_key(&self) -> String {
        audit::key(&self.config.key_prefix)
    }

    fn reset(&mut self, rule_name: &str, identity: &str, limit: Option<&str>) -> Result<Report> {
        let rule = target::rule(self.config, rule_name)?;
        let limits: Vec<&Limit> = match limit {
            Some(name) => vec![target::limit(rule, name)?],
            None => rule.limits.iter().collect(),
        };
        let id = target::identity(self.config, rule, self.cli.from.as_deref(), identity)?;
        let now = self.now_ms(self.slot_key(rule, &id).as_deref())? as u64;
        let stream = self.audit_key();
        // A sharded limit's shards are on different slots: on a cluster one DEL per key.
        let per_key = self.store()?.is_cluster();
        let mut steps = Vec::new();
        let mut entries = Vec::new();
        let mut changed = Vec::new();
        for limit in &limits {
            let keys = target::state_keys(self.config, rule, limit, &id);
            let dels: Vec<(String, Cmd)> = if per_key {
                keys.iter()
                    .map(|k| (k.clone(), del(std::slice::from_ref(k))))
                    .collect()
            } else {
                vec![(String::new(), del(&keys))]
            };
            let replies = dels.len();
            steps.extend(dels.into_iter().map(|(k, d)| (k, vec![(d, true)])));
            let joined = keys.join(" ");
            entries.push(audit::append(
                &stream,
                &Entry {
                    who: &self.who,
                    what: "reset",
                    rule: &rule.name,
                    limit: &limit.name,
                    key: &joined,
                    when_ms: now,
                    detail: "",
                },
            ));
            changed.push((limit.name.as_str(), keys, replies));
        }
        let counts = self.commit(steps, entries, "reset")?;
        let mut counts = counts.into_iter();
        let mut human = String::new();
        let mut json_limits = Vec::new();
        for (name, keys, replies) in &changed {
            let n: u64 = counts.by_ref().take(*replies).sum();
            human.push_str(&format!(
                "reset rule {}, limit {name}, identity {}: {n} of {} state key{} deleted\n",
                rule.name,
                identity_line(&id),
                keys.len(),
                if keys.len() == 1 { "" } else { "s" }
            ));
            json_limits.push(json!({"limit": name, "keys": keys, "deleted": n}));
        }
        Ok(Report {
            json: json!({"rule": rule.name, "identity": identity_json(&id), "limits": json_limits}),
            human,
        })
    }

    fn audit(&mut self, count: usize) -> Result<Report> {
        let stream = self.audit_key();
        let entries = audit::latest(self.store()?, &stream, count)?;
        let mut human: String = entries.iter().map(|e| audit::line(e) + "\n").collect();
        if entries.is_empty() {
            human.push_str(&format!("no entries in {stream}\n"));
        }
        Ok(Report {
            json: json!({"stream": stream, "entries": entries}),
            human,
        })
    }
}

fn identity_line(id: &Identity) -> String {
    match &id.grouped {
        Some(group) => format!(
            "{} {group} (the address's group, as the filter keys it)",
            id.label
        ),
        None => format!("{} {:?}", id.label, id.shown()),
    }
}

fn identity_json(id: &Identity) -> Value {
    json!({"label": id.label, "value": id.shown(), "grouped": id.grouped.is_some()})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change needs someone to name in the audit stream, checked before anything is read;
    /// a read does not.
    #[test]
    fn a_change_nobody_is_named_for_is_refused() {
        let cli = |words: &str| {
            let mut args: Vec<String> = words.split_whitespace().map(str::to_string).collect();
            args.extend([
                "--config".to_string(),
                "/nonexistent/filter.json".to_string(),
            ]);
            crate::parse(&args, |_| None).unwrap()
        };
        let unreadable = |e: Error| e.message.contains("/nonexistent/filter.json");
        for change in [
            "reset api k",
            "override set api k m --blocked",
            "override rm api k m",
        ] {
            let err = run(&cli(change), None).unwrap_err();
            assert_eq!(err.kind, crate::Kind::Usage, "{change}: {err}");
            assert!(err.message.contains("give --by WHO"), "{change}: {err}");
            // Named by the OS user or by --by: on to the config (which cannot be read).
            assert!(unreadable(
                run(&cli(change), Some("ana".into())).unwrap_err()
            ));
            let by = format!("{change} --by ana");
            assert!(unreadable(run(&cli(&by), None).unwrap_err()), "{by}");
        }
        for read in [
            "inspect api k",
            "override get api k m",
            "override list",
            "audit",
        ] {
            assert!(unreadable(run(&cli(read), None).unwrap_err()), "{read}");
        }
    }
}
