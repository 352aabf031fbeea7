//! Redis through the `redis` crate's sync API: one connection (to a single Redis, or the
//! cluster client's, which keeps one per master and follows redirects), each command's error
//! turned into a message that names the command and, for an ACL refusal, the user's missing
//! right.

use std::collections::hash_map::{Entry, HashMap};
use std::time::Duration;

use redis::cluster::{ClusterClientBuilder, ClusterConnection};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ConnectionLike, ErrorKind, FromRedisValue,
    IntoConnectionInfo, Pipeline, RedisError, RedisResult, Value,
};

use crate::error::{Error, Result};

/// Every command the tool sends (lower case), for the ACL user of docs/admin.md; the ACL test
/// holds every shipped Redis config's `ratelimit-admin` user to exactly this list.
pub const COMMANDS: &[&str] = &[
    "bgsave",
    "del",
    "exec",
    "hgetall",
    "hmget",
    "hset",
    "info",
    "multi",
    "pttl",
    "scan",
    "time",
    "xadd",
    "xrevrange",
    "zrange",
];

/// How long a snapshot may take before the tool gives up waiting for it: Redis writes its
/// whole dataset (at most `maxmemory`) to disk.
const SAVE_TIMEOUT: Duration = Duration::from_secs(120);

/// What the cluster client sends besides [`COMMANDS`]: `CLUSTER SLOTS` for the slot map (the
/// tool's own list of masters too), `PING` to check each node's connection before using it.
pub const CLUSTER_COMMANDS: &[&str] = &["cluster|slots", "ping"];

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A single command of the tool is small; a Redis that takes longer is stuck.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// A master's address, as `CLUSTER SLOTS` names it.
type Node = (String, u16);

enum Conn {
    Single(redis::Connection),
    Cluster(Box<Cluster>),
}

struct Cluster {
    conn: ClusterConnection,
    /// The `--redis` URL's login, for the direct connections below.
    login: ConnectionInfo,
    /// Slot ranges and their masters, read on the first transaction.
    slots: Option<Vec<(u16, u16, Node)>>,
    /// A direct connection per master, for a MULTI/EXEC: the cluster client pipelines
    /// nothing, and one that followed a redirect in the middle of a MULTI would run the rest
    /// outside the transaction. On a direct connection a slot that moved makes the node refuse
    /// the queued commands and EXEC abort: nothing of it is done.
    direct: HashMap<Node, redis::Connection>,
}

pub struct Store {
    conn: Conn,
    /// The URL without its password, for messages.
    shown: String,
}

/// A connection to one Redis, with the tool's timeouts.
fn single(info: ConnectionInfo) -> RedisResult<redis::Connection> {
    let conn = redis::Client::open(info)?.get_connection_with_timeout(CONNECT_TIMEOUT)?;
    conn.set_read_timeout(Some(COMMAND_TIMEOUT))?;
    conn.set_write_timeout(Some(COMMAND_TIMEOUT))?;
    Ok(conn)
}

impl Store {
    /// A connection to the Redis at `url`, or with `cluster` to the Redis Cluster that `url`'s
    /// node belongs to (the node tells the client the others).
    pub fn connect(url: &str, cluster: bool) -> Result<Store> {
        let shown = without_password(url);
        let login = url
            .into_connection_info()
            .map_err(|e| Error::usage(format!("--redis {shown}: not a Redis URL: {e}")))?;
        let unreachable = |e: RedisError| {
            let why = explain(&e, cluster);
            if e.kind() == ErrorKind::AuthenticationFailed {
                Error::failure(format!("Redis at {shown}: {why}"))
            } else {
                Error::failure(format!("cannot reach Redis at {shown}: {why}"))
            }
        };
        if !cluster {
            let conn = single(login).map_err(unreachable)?;
            return Ok(Store {
                conn: Conn::Single(conn),
                shown,
            });
        }
        // A cluster has database 0 only; the client would ignore another silently.
        if login.redis.db != 0 {
            return Err(Error::usage(format!(
                "--redis {shown}: a Redis Cluster has database 0 only"
            )));
        }
        // The cluster client reports a refused login, PING or CLUSTER SLOTS only as "failed to
        // check startup nodes": the same first steps on the given node say which.
        let mut seed = single(login.clone()).map_err(unreachable)?;
        for (cmd, what) in [
            (redis::cmd("PING"), "PING"),
            (redis::cmd("CLUSTER").arg("SLOTS").clone(), "CLUSTER SLOTS"),
        ] {
            cmd.query::<Value>(&mut seed).map_err(|e| {
                Error::failure(format!("Redis at {shown}: {what}: {}", explain(&e, true)))
            })?;
        }
        let conn = ClusterClientBuilder::new(vec![login.clone()])
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(COMMAND_TIMEOUT)
            .build()
            .and_then(|client| client.get_connection())
            .map_err(unreachable)?;
        conn.set_write_timeout(Some(COMMAND_TIMEOUT))
            .map_err(|e| Error::failure(format!("Redis at {shown}: {e}")))?;
        Ok(Store {
            conn: Conn::Cluster(Box::new(Cluster {
                conn,
                login,
                slots: None,
                direct: HashMap::new(),
            })),
            shown,
        })
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    fn like(&mut self) -> &mut dyn ConnectionLike {
        match &mut self.conn {
            Conn::Single(c) => c,
            Conn::Cluster(c) => &mut c.conn,
        }
    }

    /// Runs one command; `what` names it in an error (`HMGET rl:{…}:api:m`). On a cluster the
    /// client sends it to the master of its key's slot (a keyless one to any node) and follows
    /// redirects.
    pub fn run<T: FromRedisValue>(&mut self, cmd: &Cmd, what: &str) -> Result<T> {
        cmd.query(self.like()).map_err(|e| self.error(what, &e))
    }

    /// Runs commands in one MULTI/EXEC: they land together or not at all. On a cluster every
    /// key of `pipe` is on the slot of `key`, and it runs on that slot's master.
    pub fn atomic<T: FromRedisValue>(
        &mut self,
        pipe: &Pipeline,
        key: &str,
        what: &str,
    ) -> Result<T> {
        if !self.is_cluster() {
            return pipe.query(self.like()).map_err(|e| self.error(what, &e));
        }
        let node = self.master_of(key)?;
        let shown = self.shown.clone();
        let Conn::Cluster(c) = &mut self.conn else {
            return Err(Error::failure("no cluster connection"));
        };
        let on_node = |e: RedisError| {
            Error::failure(format!(
                "Redis at {shown}: {what} on {}:{}: {}",
                node.0,
                node.1,
                explain(&e, true)
            ))
        };
        let conn = match c.direct.entry(node.clone()) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let info = ConnectionInfo {
                    addr: ConnectionAddr::Tcp(node.0.clone(), node.1),
                    redis: c.login.redis.clone(),
                };
                e.insert(single(info).map_err(on_node)?)
            }
        };
        pipe.query(conn).map_err(on_node)
    }

    /// The master serving `key`'s slot, from the slot map read on first use.
    fn master_of(&mut self, key: &str) -> Result<Node> {
        let slot = ratelimit_core::slot::key_slot(key.as_bytes());
        if matches!(&self.conn, Conn::Cluster(c) if c.slots.is_none()) {
            let ranges = self.slot_ranges()?;
            if let Conn::Cluster(c) = &mut self.conn {
                c.slots = Some(ranges);
            }
        }
        let found = match &self.conn {
            Conn::Cluster(c) => c
                .slots
                .iter()
                .flatten()
                .find(|(first, last, _)| (*first..=*last).contains(&slot))
                .map(|(_, _, node)| node.clone()),
            Conn::Single(_) => None,
        };
        found.ok_or_else(|| {
            Error::failure(format!(
                "Redis at {}: no master serves slot {slot} of {key} (CLUSTER SLOTS)",
                self.shown
            ))
        })
    }

    /// Makes what is in Redis now durable: a snapshot (`BGSAVE`) on the master serving each of
    /// `keys` (the one Redis, on a single one), waited for until Redis reports it written. Redis
    /// loads its last snapshot when it starts, so a change saved here outlives a crash. A
    /// snapshot running already may have started before the change: the tool waits for it,
    /// then starts its own.
    pub fn save(&mut self, keys: &[&str]) -> Result<()> {
        let mut slots: Vec<Option<u16>> = Vec::new();
        if self.is_cluster() {
            let mut nodes: Vec<Node> = Vec::new();
            for key in keys {
                let node = self.master_of(key)?;
                if !nodes.contains(&node) {
                    nodes.push(node);
                    slots.push(Some(ratelimit_core::slot::key_slot(key.as_bytes())));
                }
            }
        } else {
            slots.push(None);
        }
        for slot in slots {
            self.save_on(slot)?;
        }
        Ok(())
    }

    /// A command on the master of `slot` (the one Redis for None).
    fn on_node<T: FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        slot: Option<u16>,
        what: &str,
    ) -> Result<T> {
        match (&mut self.conn, slot) {
            (Conn::Cluster(c), Some(slot)) => {
                let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                    slot,
                    SlotAddr::Master,
                )));
                c.conn
                    .route_command(cmd, at)
                    .and_then(|v| redis::from_redis_value(&v))
                    .map_err(|e| self.error(what, &e))
            }
            _ => self.run(cmd, what),
        }
    }

    /// `INFO persistence` of the master of `slot`: (snapshots written since it started, one
    /// running now, the last one's status).
    fn persistence(&mut self, slot: Option<u16>) -> Result<(u64, bool, String)> {
        let text: String = self.on_node(
            redis::cmd("INFO").arg("persistence"),
            slot,
            "INFO persistence",
        )?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        };
        let saves = field("rdb_saves").and_then(|v| v.parse().ok());
        let running = field("rdb_bgsave_in_progress").map(|v| v == "1");
        let status = field("rdb_last_bgsave_status").unwrap_or_default();
        match (saves, running) {
            (Some(saves), Some(running)) => Ok((saves, running, status)),
            _ => Err(Error::failure(format!(
                "Redis at {}: INFO persistence has no rdb_saves / rdb_bgsave_in_progress (Redis 7 or later is needed)",
                self.shown
            ))),
        }
    }

    fn save_on(&mut self, slot: Option<u16>) -> Result<()> {
        let started = std::time::Instant::now();
        let wait = |store: &mut Store,
                    until: &dyn Fn(u64, bool) -> bool|
         -> Result<(u64, bool, String)> {
            loop {
                let p = store.persistence(slot)?;
                if until(p.0, p.1) {
                    return Ok(p);
                }
                if started.elapsed() > SAVE_TIMEOUT {
                    return Err(Error::failure(format!(
                        "Redis at {}: its snapshot (BGSAVE) was not written within {} s: the change is in force but not durable yet",
                        store.shown,
                        SAVE_TIMEOUT.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        let (before, _, _) = wait(self, &|_, running| !running)?;
        if let Err(e) = self.on_node::<Value>(&redis::cmd("BGSAVE"), slot, "BGSAVE") {
            // Another snapshot began in between: it forked before this change, perhaps.
            if !e.message.contains("in progress") {
                return Err(e);
            }
            wait(self, &|_, running| !running)?;
            self.on_node::<Value>(&redis::cmd("BGSAVE"), slot, "BGSAVE")?;
        }
        let (_, _, status) = wait(self, &|saves, running| saves > before && !running)?;
        if status != "ok" {
            return Err(Error::failure(format!(
                "Redis at {}: its snapshot failed (rdb_last_bgsave_status: {status}): the change is in force but not durable; Redis's log says why (its `dir` must be writable)",
                self.shown
            )));
        }
        Ok(())
    }

    /// Redis's clock, Unix ms with its µs as a fraction: every instant the tool computes or
    /// writes is on the clock the script reads (`TIME`), not on this machine's. On a cluster
    /// the script of `key`'s identity runs on its slot's master: that master's clock (any
    /// node's without a key).
    pub fn time_ms(&mut self, key: Option<&str>) -> Result<f64> {
        let time = redis::cmd("TIME");
        let (seconds, micros): (u64, u64) = match (&mut self.conn, key) {
            (Conn::Cluster(c), Some(key)) => {
                let slot = ratelimit_core::slot::key_slot(key.as_bytes());
                let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                    slot,
                    SlotAddr::Master,
                )));
                c.conn
                    .route_command(&time, at)
                    .and_then(|v| redis::from_redis_value(&v))
                    .map_err(|e| self.error(&format!("TIME on the master of {key}"), &e))?
            }
            _ => self.run(&time, "TIME")?,
        };
        Ok(seconds as f64 * 1000.0 + micros as f64 / 1000.0)
    }

    /// Every key matching `pattern` whose type is `kind`, from every master of a cluster (a
    /// SCAN walks one node's keys only), with no key twice.
    pub fn scan(&mut self, pattern: &str, kind: &str) -> Result<Vec<String>> {
        let what = format!("SCAN MATCH {pattern}");
        let nodes = match self.conn {
            Conn::Single(_) => vec![None],
            Conn::Cluster(_) => self.masters()?.into_iter().map(Some).collect(),
        };
        let mut keys = Vec::new();
        for node in nodes {
            let mut cursor = "0".to_string();
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(&cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .arg("TYPE")
                    .arg(kind);
                let (next, batch): (String, Vec<String>) = match (&mut self.conn, &node) {
                    (Conn::Cluster(c), Some(node)) => {
                        let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: node.0.clone(),
                            port: node.1,
                        });
                        c.conn
                            .route_command(&cmd, at)
                            .and_then(|v| redis::from_redis_value(&v))
                            .map_err(|e| {
                                self.error(&format!("{what} on {}:{}", node.0, node.1), &e)
                            })?
                    }
                    _ => self.run(&cmd, &what)?,
                };
                keys.extend(batch);
                if next == "0" {
                    break;
                }
                cursor = next;
            }
        }
        // SCAN may return a key more than once.
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// The masters serving slots now.
    fn masters(&mut self) -> Result<Vec<Node>> {
        let mut masters: Vec<Node> = self
            .slot_ranges()?
            .into_iter()
            .map(|(_, _, node)| node)
            .collect();
        masters.sort();
        masters.dedup();
        Ok(masters)
    }

    /// `CLUSTER SLOTS`: per slot range its first and last slot, then its master's address
    /// first.
    fn slot_ranges(&mut self) -> Result<Vec<(u16, u16, Node)>> {
        let ranges: Vec<Vec<Value>> =
            self.run(redis::cmd("CLUSTER").arg("SLOTS"), "CLUSTER SLOTS")?;
        let mut out = Vec::new();
        for range in ranges {
            let parsed = match (range.first(), range.get(1), range.get(2)) {
                (Some(first), Some(last), Some(Value::Array(node))) if node.len() >= 2 => {
                    (|| -> RedisResult<(u16, u16, Node)> {
                        Ok((
                            redis::from_redis_value(first)?,
                            redis::from_redis_value(last)?,
                            (
                                redis::from_redis_value(&node[0])?,
                                redis::from_redis_value(&node[1])?,
                            ),
                        ))
                    })()
                }
                _ => Err(RedisError::from((
                    ErrorKind::TypeError,
                    "a slot range without its bounds and master",
                ))),
            };
            out.push(parsed.map_err(|e| self.error("CLUSTER SLOTS", &e))?);
        }
        Ok(out)
    }

    fn error(&self, what: &str, e: &RedisError) -> Error {
        Error::failure(format!(
            "Redis at {}: {what}: {}",
            self.shown,
            explain(e, self.is_cluster())
        ))
    }
}

/// A Redis error for people: what an ACL refusal, a cluster node or a lost connection means
/// for this tool.
fn explain(e: &RedisError, cluster: bool) -> String {
    let text = e.to_string();
    match (e.kind(), e.code()) {
        (_, Some("NOPERM")) => format!(
            "refused by Redis's ACL for this user ({text}): the tool's user needs the rights listed in docs/admin.md"
        ),
        _ if cluster && text.contains("cluster support disabled") => format!(
            "{text}: this Redis is no cluster node, and the config's bridge.redis_cluster is true (docs/admin.md)"
        ),
        (ErrorKind::AuthenticationFailed, _) => format!("login refused ({text}): check the URL's user and password"),
        // The cluster client follows redirects itself; one reaching here is a single Redis
        // config pointed at a cluster node.
        _ if e.is_cluster_error() && !cluster => format!(
            "{text}: this is a Redis Cluster node, and the config's bridge.redis_cluster is false (docs/admin.md)"
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
