//! Redis through the `redis` crate's sync API: one connection, each command's error turned
//! into a message that names the command and, for an ACL refusal, the user's missing right.

use std::time::Duration;

use redis::{Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError};

use crate::error::{Error, Result};

/// Every command the tool sends (lower case), for the ACL user of docs/admin.md; the ACL test
/// holds every shipped Redis config's `ratelimit-admin` user to exactly this list.
pub const COMMANDS: &[&str] = &[
    "del",
    "exec",
    "hgetall",
    "hmget",
    "hset",
    "multi",
    "pexpireat",
    "pttl",
    "scan",
    "time",
    "xadd",
    "xrevrange",
    "zrange",
];

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A single command of the tool is small; a Redis that takes longer is stuck.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Store {
    conn: redis::Connection,
    /// The URL without its password, for messages.
    shown: String,
}

impl Store {
    pub fn connect(url: &str) -> Result<Store> {
        let shown = without_password(url);
        let client = redis::Client::open(url)
            .map_err(|e| Error::usage(format!("--redis {shown}: not a Redis URL: {e}")))?;
        let conn = client
            .get_connection_with_timeout(CONNECT_TIMEOUT)
            .map_err(|e| {
                let why = explain(&e);
                if e.kind() == ErrorKind::AuthenticationFailed {
                    Error::failure(format!("Redis at {shown}: {why}"))
                } else {
                    Error::failure(format!("cannot reach Redis at {shown}: {why}"))
                }
            })?;
        conn.set_read_timeout(Some(COMMAND_TIMEOUT))
            .and_then(|()| conn.set_write_timeout(Some(COMMAND_TIMEOUT)))
            .map_err(|e| Error::failure(format!("Redis at {shown}: {e}")))?;
        Ok(Store { conn, shown })
    }

    /// Runs one command; `what` names it in an error (`HMGET rl:{…}:api:m`).
    pub fn run<T: FromRedisValue>(&mut self, cmd: &Cmd, what: &str) -> Result<T> {
        cmd.query(&mut self.conn).map_err(|e| self.error(what, &e))
    }

    /// Runs commands in one MULTI/EXEC: a change and its audit entry land together or not at
    /// all.
    pub fn atomic<T: FromRedisValue>(&mut self, pipe: &Pipeline, what: &str) -> Result<T> {
        pipe.query(&mut self.conn).map_err(|e| self.error(what, &e))
    }

    /// Redis's clock, Unix ms with its µs as a fraction: every instant the tool computes or
    /// writes is on the clock the script reads (`TIME`), not on this machine's.
    pub fn time_ms(&mut self) -> Result<f64> {
        let (seconds, micros): (u64, u64) = self.run(&redis::cmd("TIME"), "TIME")?;
        Ok(seconds as f64 * 1000.0 + micros as f64 / 1000.0)
    }

    fn error(&self, what: &str, e: &RedisError) -> Error {
        Error::failure(format!("Redis at {}: {what}: {}", self.shown, explain(e)))
    }
}

/// A Redis error for people: what an ACL refusal, a cluster node or a lost connection means
/// for this tool.
fn explain(e: &RedisError) -> String {
    let text = e.to_string();
    match (e.kind(), e.code()) {
        (_, Some("NOPERM")) => format!(
            "refused by Redis's ACL for this user ({text}): the tool's user needs the rights listed in docs/admin.md"
        ),
        (ErrorKind::AuthenticationFailed, _) => format!("login refused ({text}): check the URL's user and password"),
        _ if e.is_cluster_error() => format!(
            "{text}: this is a Redis Cluster node; ratelimit-admin works with a single Redis (docs/admin.md)"
        ),
        (_, Some("WRONGTYPE")) => format!("{text}: the key holds another kind of value than the filter writes there"),
        _ if e.is_io_error() || e.is_timeout() || e.is_connection_refusal() => format!("{text} (is Redis running there?)"),
        _ => text,
    }
}

/// `redis://user:secret@host:6379/0` → `redis://user:***@host:6379/0`.
pub fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_password() {
        assert_eq!(
            without_password("redis://ratelimit-admin:s3cr:et@127.0.0.1:6379/0"),
            "redis://ratelimit-admin:***@127.0.0.1:6379/0"
        );
        assert_eq!(without_password("redis://127.0.0.1"), "redis://127.0.0.1");
    }

    #[test]
    fn the_command_list_is_sorted_and_lower_case() {
        let mut sorted = COMMANDS.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, COMMANDS);
        assert!(COMMANDS
            .iter()
            .all(|c| c.bytes().all(|b| b.is_ascii_lowercase())));
    }
}
