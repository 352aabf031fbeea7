//! The override commands: set, get, rm and list the overrides of a limit for an identity, each
//! a hash at the override key the filter reads. Apart from the other commands as the largest
//! group that works on one kind of key.

use ratelimit_core::config::{Limit, Rule};
use ratelimit_core::request::keys::OVERRIDE_SUFFIX;
use serde_json::json;

use super::commit::del;
use super::{identity_json, identity_line, Context, Report};
use crate::audit::{self, Entry};
use crate::error::{Error, Result};
use crate::overrides::{self, Mode, Override};
use crate::store::Store;
use crate::target::{self, Identity};
use crate::when::{expiry, show_instant};

impl Context<'_> {
    pub(super) fn override_set(
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

    pub(super) fn override_get(
        &mut self,
        rule: &Rule,
        limit: &Limit,
        id: &Identity,
    ) -> Result<Report> {
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

    pub(super) fn override_rm(
        &mut self,
        rule: &Rule,
        limit: &Limit,
        id: &Identity,
    ) -> Result<Report> {
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

    pub(super) fn override_list(&mut self, rule: Option<&str>) -> Result<Report> {
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
}

/// The override at `key`, if there is one.
pub(super) fn read_override(store: &mut Store, key: &str, now: f64) -> Result<Option<Override>> {
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
}
