//! Each subcommand: what it resolves from the config first (so a bad name never reaches
//! Redis), what it reads or changes, and its report, for people and as JSON.

use ratelimit_core::config::{Algorithm, Config, Limit, Rule};
use ratelimit_core::request::keys::OVERRIDE_SUFFIX;
use redis::Cmd;
use serde_json::{json, Value};

use crate::audit::{self, Entry};
use crate::cli::{Cli, Command, Named};
use crate::error::{Error, Result};
use crate::overrides::{self, Mode, Override};
use crate::state::{self, Standing};
use crate::store::Store;
use crate::target::{self, Identity};
use crate::when::{expiry, show_instant, show_span};

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

    /// Writes a change and its audit entries; the replies (counts: `DEL`s) of the change's
    /// commands marked `true`, in order. Each step is a MULTI/EXEC on the slot of its key. On
    /// a single Redis all steps and the entries are one MULTI/EXEC: they land together or not
    /// at all. On a cluster the stream is on another slot: the steps first, each on its slot,
    /// then the entries, so the stream never records a change that was not made; a failure
    /// (or a crash) after a step leaves that step done and unrecorded
    /// (docs/admin.md#redis-cluster).
    fn commit(
        &mut self,
        steps: Vec<(String, Vec<(Cmd, bool)>)>,
        entries: Vec<Cmd>,
        what: &str,
    ) -> Result<Vec<u64>> {
        // Every change is made durable (a snapshot on each master it touched) before the tool
        // says it is done: Redis keeps no other persistence (docs/operations.md#what-survives).
        let stream = self.audit_key();
        let mut touched: Vec<String> = steps.iter().map(|(key, _)| key.clone()).collect();
        touched.push(stream.clone());
        let replies = self.commit_steps(steps, entries, what)?;
        let keys: Vec<&str> = touched.iter().map(String::as_str).collect();
        self.store()?.save(&keys).map_err(|e| {
            Error::failure(format!(
                "{}; {what} is done and recorded in {stream}, not saved to disk yet (docs/operations.md#what-survives-a-restart)",
                e.message
            ))
        })?;
        Ok(replies)
    }

    fn commit_steps(
        &mut self,
        steps: Vec<(String, Vec<(Cmd, bool)>)>,
        entries: Vec<Cmd>,
        what: &str,
    ) -> Result<Vec<u64>> {
        let store = self.store()?;
        let transaction = |cmds: Vec<(Cmd, bool)>| {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for (cmd, keep) in cmds {
                pipe.add_command(cmd);
                if !keep {
                    pipe.ignore();
                }
            }
            pipe
        };
        if !store.is_cluster() {
            let mut all: Vec<(Cmd, bool)> = steps.into_iter().flat_map(|(_, s)| s).collect();
            all.extend(entries.into_iter().map(|e| (e, false)));
            return store.atomic(
                &transaction(all),
                "",
                &format!("{what} (MULTI … XADD … EXEC)"),
            );
        }
        let mut replies = Vec::new();
        for (done, (key, step)) in steps.into_iter().enumerate() {
            let names: Vec<String> = step.iter().map(|(c, _)| command_line(c)).collect();
            let got: Vec<u64> = store
                .atomic(
                    &transaction(step),
                    &key,
                    &format!("{what} (MULTI {} EXEC)", names.join(", ")),
                )
                .map_err(|e| {
                    if done > 0 {
                        partly_done(
                            e,
                            &format!("{done} earlier step(s) of {what} are done and not audited"),
                        )
                    } else {
                        e
                    }
                })?;
            replies.extend(got);
        }
        let stream = self.audit_key();
        for entry in entries {
            self.store()?
                .run::<redis::Value>(&entry, &format!("XADD {stream}"))
                .map_err(|e| {
                    partly_done(
                        e,
                        &format!("{what} is done but not (fully) recorded in {stream}"),
                    )
                })?;
        }
        Ok(replies)
    }

    fn inspect(&mut self, rule_name: &str, identity: &str) -> Result<Report> {
        let rule = target::rule(self.config, rule_name)?;
        let id = target::identity(self.config, rule, self.cli.from.as_deref(), identity)?;
        let now = self.now_ms(self.slot_key(rule, &id).as_deref())?;
        let mut human = format!("rule {}, identity {}\n", rule.name, identity_line(&id));
        let mut limits = Vec::new();
        for limit in &rule.limits {
            let found = if limit.overrides {
                let key = target::override_key_of(self.config, rule, limit, &id);
                read_override(self.store()?, &key, now)?
            } else {
                None
            };
            let (per_window, burst) = in_effect(limit, found.as_ref().map(|o| o.mode));
            let window = limit.window.longest_ms() as f64;
            let mut shards = Vec::new();
            let mut total = Standing {
                left: 0.0,
                whole_in_ms: 0.0,
                debt: 0.0,
            };
            for key in target::state_keys(self.config, rule, limit, &id) {
                let store = self.store()?;
                let stored = state::read(store, limit.algorithm, &key)?;
                let pttl: i64 = store.run(redis::cmd("PTTL").arg(&key), &format!("PTTL {key}"))?;
                let s = state::standing(
                    limit.algorithm,
                    stored.as_ref(),
                    per_window as f64,
                    window,
                    burst as f64,
                    limit.window.calendar(),
                    now,
                );
                total.left += s.left;
                total.whole_in_ms = total.whole_in_ms.max(s.whole_in_ms);
                total.debt += s.debt;
                shards.push(json!({
                    "key": key,
                    "exists": stored.is_some(),
                    "left": s.left,
                    "whole_in_ms": s.whole_in_ms,
                    "debt": s.debt,
                    "expires_in_ms": u64::try_from(pttl).ok(),
                }));
            }
            let mode = found.as_ref().map(|o| o.mode);
            let left = match mode {
                Some(Mode::Unlimited) => None,
                Some(Mode::Blocked) => Some(0.0),
                _ => Some(total.left),
            };
            let in_flight = match (limit.algorithm, left) {
                (Algorithm::Concurrency, Some(free)) => json!((per_window as f64 - free).max(0.0)),
                _ => Value::Null,
            };
            human.push_str(&limit_report(
                limit,
                found.as_ref(),
                left,
                &total,
                per_window,
                &shards,
                now,
            ));
            limits.push(json!({
                "limit": limit.name,
                "algorithm": limit.algorithm.name(),
                "config": {
                    "limit": limit.limit,
                    "window": limit.window.show(),
                    "burst": limit.burst,
                    "shards": limit.shards,
                    "overrides": limit.overrides,
                },
                "override": found.as_ref().map(Override::json),
                "in_effect": {
                    "mode": mode.map_or("config", Mode::name),
                    "limit": per_window,
                    "burst": burst,
                },
                "left": left,
                "whole_in_ms": total.whole_in_ms,
                "debt": total.debt,
                "shards": shards,
                // A concurrency limit's slots held now (its `left` are the free ones).
                "in_flight": in_flight,
            }));
        }
        Ok(Report {
            json: json!({
                "rule": rule.name,
                "identity": identity_json(&id),
                "now_ms": now as u64,
                "limits": limits,
            }),
            human,
        })
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

    fn override_set(
        &mut self,
        rule: &Rule,
        limit: &Limit,
        id: &Identity,
        mode: Mode,
        expires: Option<&str>,
        note: Option<&str>,
    ) -> Result<Report> {
        let key = target::override_key_of(self.config, rule, limit, id);
        let now = self.now_ms(Some(&key))? as u64;
        let expires_at = expires
            .map(|text| expiry(text, now))
            .transpose()
            .map_err(Error::usage)?;
        let fields = overrides::fields(mode, expires_at, &self.who, now, note);
        let mut detail: Vec<String> = fields
            .iter()
            .filter(|(f, _)| matches!(*f, "mode" | "limit" | "burst"))
            .map(|(f, v)| format!("{f}={v}"))
            .collect();
        detail.push(match expires_at {
            Some(at) => format!("expires={}", show_instant(at)),
            None => "expires=never".to_string(),
        });
        if let Some(note) = note {
            detail.push(format!("note={note:?}"));
        }
        let detail = detail.join(" ");
        // A new override replaces the old one whole: no field (a burst) outlives it. One key:
        // one slot, one MULTI on a cluster too.
        let mut hset = redis::cmd("HSET");
        hset.arg(&key).arg(&fields);
        let step = vec![(del(std::slice::from_ref(&key)), false), (hset, false)];
        let entry = audit::append(
            &self.audit_key(),
            &Entry {
                who: &self.who,
                what: "override set",
                rule: &rule.name,
                limit: &limit.name,
                key: &key,
                when_ms: now,
                detail: &detail,
            },
        );
        self.commit(vec![(key.clone(), step)], vec![entry], "override set")?;
        let set = Override {
            key: key.clone(),
            mode,
            by: Some(self.who.clone()),
            at_ms: Some(now),
            note: note.map(str::to_string),
            expires_at_ms: expires_at,
        };
        Ok(Report {
            human: format!(
                "override set: rule {}, limit {}, identity {}: {}\n  key {key}\n",
                rule.name,
                limit.name,
                identity_line(id),
                set.line(now)
            ),
            json: json!({
                "rule": rule.name,
                "limit": limit.name,
                "identity": identity_json(id),
                "override": set.json(),
            }),
        })
    }

    fn override_get(&mut self, rule: &Rule, limit: &Limit, id: &Identity) -> Result<Report> {
        let key = target::override_key_of(self.config, rule, limit, id);
        let now = self.now_ms(Some(&key))?;
        let found = read_override(self.store()?, &key, now)?;
        let mut human = format!(
            "rule {}, limit {}, identity {}: ",
            rule.name,
            limit.name,
            identity_line(id)
        );
        match &found {
            Some(o) => human.push_str(&format!("override {}\n  key {key}\n", o.line(now as u64))),
            None => human.push_str(&format!("no override\n  key {key}\n")),
        }
        if !limit.overrides {
            human.push_str("  note: this limit does not read overrides (no \"overrides\": true)\n");
        }
        Ok(Report {
            json: json!({
                "rule": rule.name,
                "limit": limit.name,
                "identity": identity_json(id),
                "key": key,
                "reads_overrides": limit.overrides,
                "override": found.as_ref().map(Override::json),
            }),
            human,
        })
    }

    fn override_rm(&mut self, rule: &Rule, limit: &Limit, id: &Identity) -> Result<Report> {
        let key = target::override_key_of(self.config, rule, limit, id);
        let now = self.now_ms(Some(&key))? as u64;
        let entry = audit::append(
            &self.audit_key(),
            &Entry {
                who: &self.who,
                what: "override rm",
                rule: &rule.name,
                limit: &limit.name,
                key: &key,
                when_ms: now,
                detail: "",
            },
        );
        let removed: u64 = self
            .commit(
                vec![(key.clone(), vec![(del(std::slice::from_ref(&key)), true)])],
                vec![entry],
                "override rm",
            )?
            .into_iter()
            .sum();
        Ok(Report {
            human: format!(
                "rule {}, limit {}, identity {}: {}\n  key {key}\n",
                rule.name,
                limit.name,
                identity_line(id),
                if removed > 0 {
                    "override removed"
                } else {
                    "no override to remove"
                }
            ),
            json: json!({
                "rule": rule.name,
                "limit": limit.name,
                "identity": identity_json(id),
                "key": key,
                "removed": removed > 0,
            }),
        })
    }

    fn override_list(&mut self, rule: Option<&str>) -> Result<Report> {
        let prefix = glob_escape(&self.config.key_prefix);
        let pattern = match rule {
            Some(name) => {
                let rule = target::rule(self.config, name)?;
                format!(
                    "{prefix}{{*}}:{}:*{OVERRIDE_SUFFIX}",
                    glob_escape(&rule.name)
                )
            }
            None => format!("{prefix}{{*}}:*{OVERRIDE_SUFFIX}"),
        };
        let now = self.now_ms(None)?;
        let keys = self.store()?.scan(&pattern, "hash")?;
        let mut human = String::new();
        let mut list = Vec::new();
        for key in keys {
            let Some((tag, rule_name, limit_name)) =
                split_override_key(&self.config.key_prefix, &key)
            else {
                continue;
            };
            let known = self
                .config
                .rules
                .iter()
                .find(|r| r.name == rule_name)
                .and_then(|r| r.limits.iter().find(|l| l.name == limit_name))
                .is_some_and(|l| l.overrides);
            let store = self.store()?;
            let entry = match read_override(store, &key, now) {
                Ok(Some(o)) => {
                    human.push_str(&format!(
                        "{rule_name}/{limit_name} {tag}: {}",
                        o.line(now as u64)
                    ));
                    json!({"key": key, "rule": rule_name, "limit": limit_name, "identity_tag": tag, "read_by_filter": known, "override": o.json()})
                }
                // Gone between SCAN and HGETALL (expired, removed).
                Ok(None) => continue,
                Err(e) => {
                    human.push_str(&format!("{rule_name}/{limit_name} {tag}: unreadable: {e}"));
                    json!({"key": key, "rule": rule_name, "limit": limit_name, "identity_tag": tag, "read_by_filter": known, "error": e.message})
                }
            };
            if !known {
                human.push_str(" (no limit of this config reads it)");
            }
            human.push('\n');
            list.push(entry);
        }
        if list.is_empty() {
            human.push_str("no overrides\n");
        }
        Ok(Report {
            json: json!({"pattern": pattern, "overrides": list}),
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

fn del(keys: &[String]) -> Cmd {
    let mut cmd = redis::cmd("DEL");
    cmd.arg(keys);
    cmd
}

/// `HSET rl:{…}:api:m:override`: a command's name and first key, for messages.
fn command_line(cmd: &Cmd) -> String {
    cmd.args_iter()
        .take(2)
        .filter_map(|a| match a {
            redis::Arg::Simple(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            redis::Arg::Cursor => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `e`, after part of a change on a cluster was made: says what stays done.
fn partly_done(e: Error, done: &str) -> Error {
    Error::failure(format!(
        "{}; {done} (docs/admin.md#redis-cluster)",
        e.message
    ))
}

/// The override at `key`, if there is one.
fn read_override(store: &mut Store, key: &str, now: f64) -> Result<Option<Override>> {
    let hash: Vec<(String, String)> =
        store.run(redis::cmd("HGETALL").arg(key), &format!("HGETALL {key}"))?;
    if hash.is_empty() {
        return Ok(None);
    }
    let pttl: i64 = store.run(redis::cmd("PTTL").arg(key), &format!("PTTL {key}"))?;
    let found = overrides::parse(key, &hash, pttl, now as u64).map_err(Error::failure)?;
    // Past its expiry the script ignores it: it is no override any more.
    Ok(Some(found).filter(|o| !o.expired(now as u64)))
}

/// The limit and burst a decision uses: the override's with mode `limit` (its burst defaults
/// to its limit), else the config's of one shard.
fn in_effect(limit: &Limit, mode: Option<Mode>) -> (u64, u64) {
    match mode {
        Some(Mode::Limit { limit: n, burst }) => {
            let has_burst = matches!(limit.algorithm, Algorithm::TokenBucket | Algorithm::Gcra);
            (n, if has_burst { burst.unwrap_or(n) } else { n })
        }
        _ => (limit.shard_limit(), limit.shard_burst()),
    }
}

fn limit_report(
    limit: &Limit,
    found: Option<&Override>,
    left: Option<f64>,
    total: &Standing,
    per_window: u64,
    shards: &[Value],
    now: f64,
) -> String {
    let mut out = match limit.algorithm {
        Algorithm::Concurrency => format!(
            "  limit {}: concurrency, {} in flight, each held at most {}",
            limit.name,
            limit.limit,
            limit.window.show()
        ),
        _ => format!(
            "  limit {}: {} {} per {}",
            limit.name,
            limit.algorithm.name(),
            limit.limit,
            limit.window.show()
        ),
    };
    if matches!(limit.algorithm, Algorithm::TokenBucket | Algorithm::Gcra) {
        out.push_str(&format!(", burst {}", limit.burst));
    }
    if limit.shards > 1 {
        out.push_str(&format!(", {} shards", limit.shards));
    }
    out.push('\n');
    match found {
        Some(o) => out.push_str(&format!("    override: {}\n", o.line(now as u64))),
        None if limit.overrides => out.push_str("    override: none\n"),
        None => {}
    }
    match left {
        None => out.push_str("    left now: unlimited (override)\n"),
        Some(left) => {
            let blocked = matches!(found.map(|o| o.mode), Some(Mode::Blocked));
            out.push_str(&format!(
                "    left now: {}{}",
                units(left),
                if blocked {
                    " (blocked by override)".to_string()
                } else {
                    format!(" of {}", per_window * limit.shards.max(1))
                }
            ));
            if total.whole_in_ms > 0.0 {
                out.push_str(&format!(
                    "; whole again in {}",
                    show_span(total.whole_in_ms)
                ));
            } else {
                out.push_str("; whole");
            }
            if total.debt > 0.0 {
                out.push_str(&format!("; debt {}", units(total.debt)));
            }
            out.push('\n');
        }
    }
    for shard in shards {
        let key = shard["key"].as_str().unwrap_or("");
        let state = match shard["expires_in_ms"].as_u64() {
            _ if shard["exists"] == json!(false) => "no state".to_string(),
            Some(ms) => format!("expires in {}", show_span(ms as f64)),
            None => "no expiry".to_string(),
        };
        if limit.shards > 1 {
            out.push_str(&format!(
                "    shard {key}: left {}, {state}\n",
                units(shard["left"].as_f64().unwrap_or(0.0))
            ));
        } else {
            out.push_str(&format!("    state {key}: {state}\n"));
        }
    }
    out
}

/// Units as people read them: whole when whole, else to 3 decimals.
fn units(n: f64) -> String {
    let rounded = (n * 1000.0).floor() / 1000.0;
    if rounded.fract() == 0.0 {
        format!("{rounded:.0}")
    } else {
        format!("{rounded}")
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

/// A key prefix or rule name inside a SCAN pattern: glob characters matched literally.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `prefix{tag}:rule:limit:override` → (`{tag}`, rule, limit). The tag ends at the first `}`:
/// neither a digest nor a readable identity holds a brace.
fn split_override_key<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, &'k str, &'k str)> {
    let rest = key.strip_prefix(prefix)?;
    let close = rest.find('}')?;
    let (tag, tail) = rest.split_at(close + 1);
    let tail = tail.strip_prefix(':')?.strip_suffix(OVERRIDE_SUFFIX)?;
    let (rule, limit) = tail.split_once(':')?;
    Some((tag, rule, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_keys_split_into_tag_rule_and_limit() {
        assert_eq!(
            split_override_key("rl:", "rl:{header:x-api-key:ab12}:api:per_minute:override"),
            Some(("{header:x-api-key:ab12}", "api", "per_minute"))
        );
        assert_eq!(split_override_key("rl:", "rl:{h=a}:api:m"), None);
        assert_eq!(glob_escape("r*l[1]:"), "r\\*l\\[1\\]:");
    }

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

    #[test]
    fn units_are_whole_or_three_decimals() {
        assert_eq!(units(7.0), "7");
        assert_eq!(units(7.00049), "7");
        assert_eq!(units(6.5), "6.5");
    }
}
