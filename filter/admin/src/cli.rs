//! The command line: options may stand anywhere among the words, `--` ends them (for an
//! identity that starts with `-`), and each subcommand takes only the options it reads.

use crate::error::{Error, Result};

pub const USAGE: &str = "usage: ratelimit-admin [OPTIONS] COMMAND
Reads and changes the rate limiter's state in Redis, naming keys exactly as the filter does.

Commands:
  inspect RULE IDENTITY            each limit of RULE for IDENTITY: units left, when whole,
                                   debt, override
  reset RULE IDENTITY [LIMIT]      delete the state (every shard) of RULE's limits, or of one
  override set RULE IDENTITY LIMIT (--limit N [--burst N] | --unlimited | --blocked)
                                   [--expires WHEN] [--note TEXT]
  override get RULE IDENTITY LIMIT
  override list [RULE]             every override in Redis (keys: identities are hashed)
  override rm RULE IDENTITY LIMIT
  audit [--count N]                the latest changes (default 20)

Options:
  --config FILE    the filter config: its JSON, an Envoy config or Kubernetes manifests
                   (default: $RATELIMIT_ADMIN_CONFIG)
  --select N       the Nth filter config of FILE, when it holds several
  --redis URL      redis://USER:PASSWORD@HOST:PORT, any node of a Redis Cluster with
                   bridge.redis_cluster (default: $RATELIMIT_ADMIN_REDIS)
  --from LABEL     the rule's key.from entry IDENTITY is for (default: its first)
  --plan NAME      for a rule with plans, the plan whose numbers inspect uses (default: each
                   limit with the numbers of the first plan holding it; a limit's state and
                   override are the same in every plan)
  --by WHO         who makes a change, for the audit stream (default: the OS user: the
                   uid's name in /etc/passwd, else $LOGNAME, else $USER; a change with
                   none of them is refused)
  --json           machine-readable output
  -h, --help       this text
WHEN: a duration (90m, 2h, 7d), a Unix time in seconds, or RFC 3339 (2026-01-31T18:00:00Z).
Exit status: 0 done, 1 failed (config unreadable, Redis unreachable or refusing),
2 bad command line (unknown rule, limit or label, bad number, limit without overrides).";

/// What to do, with the options that apply to every command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cli {
    pub config: Option<String>,
    pub select: Option<usize>,
    pub redis: Option<String>,
    pub from: Option<String>,
    pub plan: Option<String>,
    pub by: Option<String>,
    pub json: bool,
    pub command: Command,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Help,
    Inspect {
        rule: String,
        identity: String,
    },
    Reset {
        rule: String,
        identity: String,
        limit: Option<String>,
    },
    OverrideSet {
        target: Named,
        setting: Setting,
        expires: Option<String>,
        note: Option<String>,
    },
    OverrideGet(Named),
    OverrideList {
        rule: Option<String>,
    },
    OverrideRm(Named),
    Audit {
        count: usize,
    },
}

/// One limit of one rule for one identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub rule: String,
    pub identity: String,
    pub limit: String,
}

/// What an override sets; numbers are checked against the limit's algorithm later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    Limit { limit: u64, burst: Option<u64> },
    Unlimited,
    Blocked,
}

/// Options taking a value, and flags.
const VALUED: &[&str] = &[
    "--config",
    "--select",
    "--redis",
    "--from",
    "--plan",
    "--by",
    "--limit",
    "--burst",
    "--expires",
    "--note",
    "--count",
];
const FLAGS: &[&str] = &["--json", "--unlimited", "--blocked", "--help", "-h"];

/// Default audit entries shown, and the most: the stream keeps about 10,000.
pub const DEFAULT_AUDIT_COUNT: usize = 20;
pub const MAX_AUDIT_COUNT: usize = 10_000;

#[derive(Default)]
struct Words {
    options: Vec<(String, Option<String>)>,
    positional: Vec<String>,
}

impl Words {
    fn take(&mut self, name: &str) -> Option<String> {
        let at = self.options.iter().position(|(n, _)| n == name)?;
        self.options.remove(at).1
    }

    fn flag(&mut self, name: &str) -> bool {
        let found = self.options.iter().any(|(n, _)| n == name);
        self.options.retain(|(n, _)| n != name);
        found
    }
}

/// The command line after the program's name; `env` gives the defaults from the environment.
pub fn parse(args: &[String], env: impl Fn(&str) -> Option<String>) -> Result<Cli> {
    // A variable set to nothing is one not set.
    let env = |name: &str| env(name).filter(|v| !v.is_empty());
    let mut words = Words::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            words.positional.extend(args.by_ref().cloned());
            break;
        }
        if !arg.starts_with('-') || arg == "-" {
            words.positional.push(arg.clone());
            continue;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        if words.options.iter().any(|(n, _)| *n == name) {
            return Err(Error::usage(format!("{name} is given twice")));
        }
        if VALUED.contains(&name.as_str()) {
            let value = match inline {
                Some(v) => v,
                None => args
                    .next()
                    .cloned()
                    .ok_or_else(|| Error::usage(format!("{name} needs a value")))?,
            };
            words.options.push((name, Some(value)));
        } else if FLAGS.contains(&name.as_str()) && inline.is_none() {
            words.options.push((name, None));
        } else {
            return Err(Error::usage(format!("unknown option {arg}")));
        }
    }
    if words.flag("--help") | words.flag("-h") {
        return Ok(Cli {
            config: None,
            select: None,
            redis: None,
            from: None,
            plan: None,
            by: None,
            json: false,
            command: Command::Help,
        });
    }
    let select = match words.take("--select") {
        None => None,
        Some(n) => Some(
            n.parse::<usize>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| Error::usage(format!("--select {n}: not a number from 1 on")))?,
        ),
    };
    let json = words.flag("--json");
    let config = words
        .take("--config")
        .or_else(|| env("RATELIMIT_ADMIN_CONFIG"));
    let redis = words
        .take("--redis")
        .or_else(|| env("RATELIMIT_ADMIN_REDIS"));
    let by = words.take("--by");
    let from = words.take("--from");
    let plan = words.take("--plan");
    let command = command(&mut words, from.is_some())?;
    if let Some((name, _)) = words.options.first() {
        let what = words
            .positional
            .first()
            .map_or("this command", String::as_str);
        return Err(Error::usage(format!("{name} does not apply to {what}")));
    }
    Ok(Cli {
        config,
        select,
        redis,
        from,
        plan,
        by,
        json,
        command,
    })
}

fn command(words: &mut Words, from: bool) -> Result<Command> {
    let p: Vec<String> = words.positional.clone();
    let p: Vec<&str> = p.iter().map(String::as_str).collect();
    let wrong = |form: &str| Error::usage(format!("usage: ratelimit-admin {form}"));
    let named = |rest: &[&str], form: &str| -> Result<Named> {
        match rest {
            [rule, identity, limit] => Ok(Named {
                rule: rule.to_string(),
                identity: identity.to_string(),
                limit: limit.to_string(),
            }),
            _ => Err(wrong(form)),
        }
    };
    let no_from = |what: &str| {
        if from {
            Err(Error::usage(format!("--from does not apply to {what}")))
        } else {
            Ok(())
        }
    };
    match p.as_slice() {
        [] => Err(Error::usage("no command given")),
        ["inspect", rest @ ..] => match rest {
            [rule, identity] => Ok(Command::Inspect {
                rule: rule.to_string(),
                identity: identity.to_string(),
            }),
            _ => Err(wrong("inspect RULE IDENTITY")),
        },
        ["reset", rest @ ..] => match rest {
            [rule, identity] | [rule, identity, _] => Ok(Command::Reset {
                rule: rule.to_string(),
                identity: identity.to_string(),
                limit: rest.get(2).map(|s| s.to_string()),
            }),
            _ => Err(wrong("reset RULE IDENTITY [LIMIT]")),
        },
        ["override", "set", rest @ ..] => {
            let form = "override set RULE IDENTITY LIMIT (--limit N [--burst N] | --unlimited | --blocked) [--expires WHEN] [--note TEXT]";
            let target = named(rest, form)?;
            let limit = words.take("--limit");
            let burst = words.take("--burst");
            let unlimited = words.flag("--unlimited");
            let blocked = words.flag("--blocked");
            let setting = match (limit, unlimited, blocked) {
                (Some(limit), false, false) => Setting::Limit {
                    limit: whole("--limit", &limit)?,
                    burst: burst.as_deref().map(|b| whole("--burst", b)).transpose()?,
                },
                (None, true, false) | (None, false, true) if burst.is_some() => {
                    return Err(Error::usage("--burst goes with --limit"));
                }
                (None, true, false) => Setting::Unlimited,
                (None, false, true) => Setting::Blocked,
                (None, false, false) => {
                    return Err(Error::usage(
                        "override set needs one of --limit N, --unlimited, --blocked",
                    ))
                }
                _ => {
                    return Err(Error::usage(
                        "--limit, --unlimited and --blocked exclude each other",
                    ))
                }
            };
            Ok(Command::OverrideSet {
                target,
                setting,
                expires: words.take("--expires"),
                note: words.take("--note"),
            })
        }
        ["override", "get", rest @ ..] => Ok(Command::OverrideGet(named(
            rest,
            "override get RULE IDENTITY LIMIT",
        )?)),
        ["override", "rm", rest @ ..] => Ok(Command::OverrideRm(named(
            rest,
            "override rm RULE IDENTITY LIMIT",
        )?)),
        ["override", "list", rest @ ..] => {
            no_from("override list")?;
            match rest {
                [] | [_] => Ok(Command::OverrideList {
                    rule: rest.first().map(|s| s.to_string()),
                }),
                _ => Err(wrong("override list [RULE]")),
            }
        }
        ["override", ..] => Err(wrong("override (set|get|list|rm) ...")),
        ["audit", rest @ ..] => {
            no_from("audit")?;
            if !rest.is_empty() {
                return Err(wrong("audit [--count N]"));
            }
            let count = match words.take("--count") {
                None => DEFAULT_AUDIT_COUNT,
                Some(n) => n
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_AUDIT_COUNT).contains(n))
                    .ok_or_else(|| {
                        Error::usage(format!(
                            "--count {n}: not a whole number from 1 to {MAX_AUDIT_COUNT}"
                        ))
                    })?,
            };
            Ok(Command::Audit { count })
        }
        [other, ..] => Err(Error::usage(format!("unknown command {other}"))),
    }
}

/// A whole number as written: digits only (no sign, no exponent, no fraction).
fn whole(option: &str, text: &str) -> Result<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::usage(format!("{option} {text}: not a whole number")));
    }
    text.parse()
        .map_err(|_| Error::usage(format!("{option} {text}: too large")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(line: &str) -> Result<Cli> {
        let args: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        parse(&args, |_| None)
    }

    #[test]
    fn options_stand_anywhere() {
        let cli = run("override set api k m --limit 5 --config c.json --burst=9 --json").unwrap();
        assert_eq!(cli.config.as_deref(), Some("c.json"));
        assert!(cli.json);
        assert_eq!(
            cli.command,
            Command::OverrideSet {
                target: Named {
                    rule: "api".into(),
                    identity: "k".into(),
                    limit: "m".into()
                },
                setting: Setting::Limit {
                    limit: 5,
                    burst: Some(9)
                },
                expires: None,
                note: None,
            }
        );
    }

    #[test]
    fn an_identity_may_start_with_a_dash_after_the_double_dash() {
        let cli = run("inspect --from client_ip -- api -x").unwrap();
        assert_eq!(
            cli.command,
            Command::Inspect {
                rule: "api".into(),
                identity: "-x".into()
            }
        );
    }

    #[test]
    fn the_environment_gives_defaults() {
        let args: Vec<String> = ["audit".to_string()].to_vec();
        let cli = parse(&args, |name| Some(format!("from {name}"))).unwrap();
        assert_eq!(cli.redis.as_deref(), Some("from RATELIMIT_ADMIN_REDIS"));
        assert_eq!(cli.config.as_deref(), Some("from RATELIMIT_ADMIN_CONFIG"));
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        for (line, message) in [
            ("", "no command given"),
            ("frobnicate", "unknown command frobnicate"),
            (
                "inspect api",
                "usage: ratelimit-admin inspect RULE IDENTITY",
            ),
            ("audit --limit 3", "--limit does not apply to audit"),
            (
                "audit --count 0",
                "--count 0: not a whole number from 1 to 10000",
            ),
            (
                "override set a k m",
                "override set needs one of --limit N, --unlimited, --blocked",
            ),
            (
                "override set a k m --limit -3",
                "--limit -3: not a whole number",
            ),
            (
                "override set a k m --limit 1e3",
                "--limit 1e3: not a whole number",
            ),
            (
                "override set a k m --limit 3 --blocked",
                "--limit, --unlimited and --blocked exclude each other",
            ),
            (
                "override set a k m --unlimited --burst 3",
                "--burst goes with --limit",
            ),
            (
                "override get a k m --note x",
                "--note does not apply to override",
            ),
            (
                "override list --from x",
                "--from does not apply to override list",
            ),
            ("inspect a k --json --json", "--json is given twice"),
            ("inspect a k --frob", "unknown option --frob"),
            ("--select 0 audit", "--select 0: not a number from 1 on"),
        ] {
            assert_eq!(
                run(line).map_err(|e| e.message),
                Err(message.to_string()),
                "{line}"
            );
        }
    }
}
