//! How a change reaches Redis: its steps and audit entries in MULTI/EXEC transactions, one
//! on a single Redis, one per slot on a cluster, then saved to disk. Apart from the commands
//! because every change (reset, override set and rm) goes through it the same way.

use redis::Cmd;

use super::Context;
use crate::error::{Error, Result};

impl Context<'_> {
    /// Writes a change and its audit entries; the replies (counts: `DEL`s) of the change's
    /// commands marked `true`, in order. Each step is a MULTI/EXEC on the slot of its key. On
    /// a single Redis all steps and the entries are one MULTI/EXEC: they land together or not
    /// at all. On a cluster the stream is on another slot: the steps first, each on its slot,
    /// then the entries, so the stream never records a change that was not made; a failure
    /// (or a crash) after a step leaves that step done and unrecorded
    /// (docs/admin.md#redis-cluster).
    pub(super) fn commit(
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
}

pub(super) fn del(keys: &[String]) -> Cmd {
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
