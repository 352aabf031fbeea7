//! A Redis Cluster of real `redis-server` nodes from
//! envoy/cluster/redis-node.conf, and the whole chain of envoy/cluster/ (Envoy with the filter
//! and a redis_proxy listener, Webdis pointed at that proxy) on free loopback ports. Every
//! process is stopped by PID when dropped.

use std::fs;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::http::{parse, read_response, Response};
use crate::procs::{command_calls_in, Envoy, Process, Webdis, WorkDir, PORT_ATTEMPTS, REDIS_ADMIN};
use crate::resp::{RedisConn, Resp};
use crate::{free_port, root, wait_for};

/// The restricted user of envoy/cluster/redis-node.conf, which Envoy's redis_proxy logs in to
/// the nodes as (the `default` user, like Webdis's on a single Redis).
pub const NODE_USER: (&str, &str) = ("default", "proxy-demo-secret");

/// Redis Cluster's hash slots.
pub const SLOTS: u32 = 16_384;

/// A node's cluster bus listens on its port plus this.
const BUS_OFFSET: u16 = 10_000;
/// The kernel's ephemeral ports start here: a bus port below it cannot be taken by a client
/// connection between the check and the bind.
const EPHEMERAL_START: u16 = 32_768;
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// envoy/cluster/envoy.yaml: the filter's listener plus the redis_proxy over the cluster.
pub fn envoy_config_file() -> PathBuf {
    root().join("envoy/cluster/envoy.yaml")
}

/// One `redis-server` of the cluster, in its own directory (its `nodes.conf` and log).
pub struct Node {
    pub port: u16,
    pub process: Process,
    pub dir: PathBuf,
}

/// A Redis Cluster on loopback, made with `redis-cli --cluster create`. Dropping it kills
/// every node by PID.
pub struct RedisCluster {
    /// In creation order: the first `masters` were made masters, the others replicas (which
    /// master each replicates is redis-cli's choice; ask [`RedisCluster::replicas_of`]).
    pub nodes: Vec<Node>,
    /// How long `start` took, from the first spawn to a cluster ready for traffic.
    pub startup: Duration,
    /// Masters killed with [`RedisCluster::kill_master`], with the slot ranges they served.
    killed: Vec<(u16, Vec<(u16, u16)>)>,
}

impl RedisCluster {
    /// `masters` masters (at least 3) with `replicas_per_master` replicas each, on free
    /// loopback ports, each node in its own directory under `dir`. Returns once every node
    /// reports `cluster_state:ok`, every node sees all slots served, and every replica is in
    /// sync with its master.
    pub fn start(dir: &WorkDir, masters: usize, replicas_per_master: usize) -> RedisCluster {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let started = Instant::now();
        let count = masters * (1 + replicas_per_master);
        let nodes: Vec<Node> = (0..count).map(|_| start_node(dir)).collect();
        let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
        create(dir, &ports, replicas_per_master);
        let mut cluster = RedisCluster {
            nodes,
            startup: Duration::ZERO,
            killed: Vec::new(),
        };
        cluster.wait_ready(START_TIMEOUT);
        cluster.startup = started.elapsed();
        cluster
    }

    /// Every node's port, in creation order (killed ones too).
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The ports of the nodes not killed.
    pub fn live_ports(&self) -> Vec<u16> {
        self.ports()
            .into_iter()
            .filter(|p| !self.is_killed(*p))
            .collect()
    }

    fn is_killed(&self, port: u16) -> bool {
        self.killed.iter().any(|(p, _)| *p == port)
    }

    /// A connection to `node` (a port) as the admin user.
    pub fn admin(&self, node: u16) -> RedisConn {
        admin_login(node).unwrap_or_else(|e| panic!("admin login on node {node}: {e}"))
    }

    /// A connection to `node` as the restricted user the proxy uses ([`NODE_USER`]).
    pub fn restricted(&self, node: u16) -> RedisConn {
        RedisConn::login(node, NODE_USER.0, NODE_USER.1)
            .unwrap_or_else(|e| panic!("login as {} on node {node}: {e}", NODE_USER.0))
    }

    /// The live nodes that are masters now.
    pub fn masters(&self) -> Vec<u16> {
        self.live_with_role("master")
    }

    /// The live nodes that are replicas now.
    pub fn replicas(&self) -> Vec<u16> {
        self.live_with_role("slave")
    }

    /// The live replicas of `master`.
    pub fn replicas_of(&self, master: u16) -> Vec<u16> {
        self.replicas()
            .into_iter()
            .filter(|&r| {
                let role = self.admin(r).cmd(&["ROLE"]).expect("ROLE").items();
                role.get(2).map(Resp::text) == Some(master.to_string())
            })
            .collect()
    }

    fn live_with_role(&self, role: &str) -> Vec<u16> {
        self.live_ports()
            .into_iter()
            .filter(|&p| {
                let reply = self.admin(p).cmd(&["ROLE"]).expect("ROLE").items();
                reply.first().map(Resp::text).as_deref() == Some(role)
            })
            .collect()
    }

    /// The slot ranges and the master port serving each, as a live node sees them
    /// (`CLUSTER SLOTS`).
    pub fn slots(&self) -> Vec<(u16, u16, u16)> {
        let node = *self.live_ports().first().expect("a live node");
        slots_seen_by(node).unwrap_or_else(|e| panic!("CLUSTER SLOTS on {node}: {e}"))
    }

    /// The port of the master serving `slot`.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        self.slots()
            .into_iter()
            .find(|&(start, end, _)| (start..=end).contains(&slot))
            .map(|(_, _, master)| master)
            .unwrap_or_else(|| panic!("no node serves slot {slot}"))
    }

    /// The slot of `key`, as Redis computes it (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        let node = *self.live_ports().first().expect("a live node");
        let reply = self.admin(node).cmd(&["CLUSTER", "KEYSLOT", key]).unwrap();
        u16::try_from(reply.int()).expect("a slot fits u16")
    }

    /// The master holding `key` (the master of its slot).
    pub fn master_of_key(&self, key: &str) -> u16 {
        self.master_of_slot(self.keyslot(key))
    }

    /// Whether the script `sha` is in `node`'s script cache.
    pub fn script_exists(&self, node: u16, sha: &str) -> bool {
        let reply = self.admin(node).cmd(&["SCRIPT", "EXISTS", sha]).unwrap();
        reply.items().first().map(Resp::int) == Some(1)
    }

    /// How many times each live node ran `command` (lower case, e.g. `evalsha`), from
    /// `INFO commandstats`, in node order.
    pub fn command_calls_per_node(&self, command: &str) -> Vec<(u16, u64)> {
        self.live_ports()
            .into_iter()
            .map(|p| {
                let stats = self.admin(p).cmd(&["INFO", "commandstats"]).unwrap().text();
                (p, command_calls_in(&stats, command))
            })
            .collect()
    }

    /// The node id of `node` (`CLUSTER MYID`).
    pub fn node_id(&self, node: u16) -> String {
        self.admin(node)
            .cmd(&["CLUSTER", "MYID"])
            .expect("CLUSTER MYID")
            .text()
    }

    /// Reshards `slot` from its master to `to`, as `redis-cli --cluster reshard` does: the
    /// slot IMPORTING on `to` and MIGRATING on its master, its keys moved `batch` at a time
    /// with `MIGRATE`, then the slot given to `to` on every master. Returns the keys moved.
    pub fn migrate_slot(&self, slot: u16, to: u16, batch: usize) -> usize {
        let from = self.master_of_slot(slot);
        assert_ne!(from, to, "slot {slot} is already on {to}");
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let slot_text = slot.to_string();
        let setslot = |node: u16, how: &[&str]| {
            let mut command = vec!["CLUSTER", "SETSLOT", slot_text.as_str()];
            command.extend_from_slice(how);
            let reply = self.admin(node).cmd(&command).expect("CLUSTER SETSLOT");
            assert_eq!(
                reply,
                Resp::Simple("OK".into()),
                "SETSLOT {how:?} on {node}"
            );
        };
        setslot(to, &["IMPORTING", &from_id]);
        setslot(from, &["MIGRATING", &to_id]);
        let mut moved = 0;
        loop {
            let mut source = self.admin(from);
            let count = batch.to_string();
            let keys = source
                .cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_text, &count])
                .expect("GETKEYSINSLOT")
                .items();
            if keys.is_empty() {
                break;
            }
            let port = to.to_string();
            let mut command = vec!["MIGRATE", "127.0.0.1", port.as_str(), "", "0", "5000"];
            command.extend(["AUTH2", REDIS_ADMIN.0, REDIS_ADMIN.1, "KEYS"]);
            let names: Vec<String> = keys.iter().map(Resp::text).collect();
            command.extend(names.iter().map(String::as_str));
            let reply = source.cmd(&command).expect("MIGRATE");
            assert_eq!(reply, Resp::Simple("OK".into()), "MIGRATE {names:?}");
            moved += names.len();
        }
        // The new owner first, then the old one, then the others (as redis-cli does).
        setslot(to, &["NODE", &to_id]);
        setslot(from, &["NODE", &to_id]);
        for master in self.masters() {
            if master != to && master != from {
                setslot(master, &["NODE", &to_id]);
            }
        }
        moved
    }

    /// Kills the master on `port` (SIGKILL to its PID), as a crash would; its replica takes
    /// over after `cluster-node-timeout` (see [`RedisCluster::wait_failover`]).
    pub fn kill_master(&mut self, port: u16) {
        assert!(
            self.masters().contains(&port),
            "{port} is not a live master"
        );
        let ranges: Vec<(u16, u16)> = self
            .slots()
            .into_iter()
            .filter(|&(_, _, m)| m == port)
            .map(|(start, end, _)| (start, end))
            .collect();
        assert!(!ranges.is_empty(), "master {port} serves no slot");
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster");
        node.process.stop();
        self.killed.push((port, ranges));
    }

    /// Polls until a replica of `old_master` (killed with [`RedisCluster::kill_master`]) was
    /// promoted: every live node reports `cluster_state:ok` and sees all slots served by live
    /// nodes, the old master's slots by one new master. Returns that master's port.
    pub fn wait_failover(&self, old_master: u16, timeout: Duration) -> u16 {
        let (_, old_ranges) = self
            .killed
            .iter()
            .find(|(p, _)| *p == old_master)
            .unwrap_or_else(|| panic!("{old_master} was not killed with kill_master"));
        let probe = old_ranges[0].0;
        wait_for(
            &format!("a replica of {old_master} to take over its slots"),
            timeout,
            || {
                let mut owner = None;
                for node in self.live_ports() {
                    if !cluster_info(node).ok()?.contains("cluster_state:ok") {
                        return None;
                    }
                    let slots = slots_seen_by(node).ok()?;
                    if covered(&slots) != SLOTS || slots.iter().any(|&(_, _, m)| self.is_killed(m))
                    {
                        return None;
                    }
                    let new = slots
                        .iter()
                        .find(|&&(start, end, _)| (start..=end).contains(&probe))
                        .map(|&(_, _, m)| m)?;
                    if owner.is_some_and(|o| o != new) {
                        return None;
                    }
                    owner = Some(new);
                }
                let owner = owner?;
                let role = admin_login(owner).ok()?.cmd(&["ROLE"]).ok()?.items();
                (role.first().map(Resp::text).as_deref() == Some("master")).then_some(owner)
            },
        )
    }

    /// Polls until the cluster is ready for traffic: every live node reports
    /// `cluster_state:ok`, knows every node and sees all 16384 slots served, and every replica
    /// is in sync with its master.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let count = self.nodes.len().to_string();
        wait_for("the Redis Cluster to be ready", timeout, || {
            let killed: Vec<u16> = self.killed.iter().map(|(p, _)| *p).collect();
            for node in self.nodes.iter_mut().filter(|n| !killed.contains(&n.port)) {
                node.process.assert_running();
            }
            for node in self.live_ports() {
                let info = cluster_info(node).ok()?;
                let field = |name: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(&format!("{name}:")))
                        .map(str::trim)
                        .map(str::to_string)
                };
                if field("cluster_state")? != "ok"
                    || field("cluster_slots_ok")? != SLOTS.to_string()
                    || field("cluster_known_nodes")? != count
                    || covered(&slots_seen_by(node).ok()?) != SLOTS
                {
                    return None;
                }
                let replication = admin_login(node)
                    .ok()?
                    .cmd(&["INFO", "replication"])
                    .ok()?
                    .text();
                if replication.contains("role:slave")
                    && !replication.contains("master_link_status:up")
                {
                    return None;
                }
            }
            for master in self.masters() {
                self.replicated(master).then_some(())?;
            }
            Some(())
        });
    }

    /// Whether every replica of `master` acknowledges a write made on it now, waiting up to
    /// 100 ms (a SET and DEL of a key of its own, then `WAIT`). A replica whose link is up can
    /// still not be copying: after its first sync (diskless, as configured) its master holds
    /// the writes back until the replica's first `REPLCONF ACK`, up to a second later, and a
    /// master killed meanwhile takes them with it.
    pub fn replicated(&self, master: u16) -> bool {
        let check = || -> std::io::Result<bool> {
            let mut conn = admin_login(master)?;
            let role = conn.cmd(&["ROLE"])?.items();
            let replicas = match role.get(2) {
                Some(Resp::Array(Some(list))) => list.len(),
                _ => 0,
            };
            let key = (0..)
                .map(|i| format!("harness:replicated:{{{i}}}"))
                .find(|key| self.master_of_key(key) == master)
                .expect("some key is on this master");
            conn.cmd(&["SET", &key, "1"])?;
            conn.cmd(&["DEL", &key])?;
            let acked = conn.cmd(&["WAIT", &replicas.to_string(), "100"])?;
            Ok(acked == Resp::Int(replicas as i64))
        };
        check().unwrap_or(false)
    }
}

/// A free port for a node whose bus port (port + 10000) is free too, both below the
/// ephemeral range.
fn node_port() -> u16 {
    for _ in 0..20_000 {
        let port = free_port();
        if port < EPHEMERAL_START - BUS_OFFSET
            && TcpListener::bind(("127.0.0.1", port + BUS_OFFSET)).is_ok()
        {
            return port;
        }
    }
    panic!(
        "no free port p below {} with p + {BUS_OFFSET} free too",
        EPHEMERAL_START - BUS_OFFSET
    );
}

/// A node on a free port, answering PING. Should another process bind its port or its bus
/// port first (every test process on the machine draws from one range), it exits, and
/// another is started on other ports.
fn start_node(dir: &WorkDir) -> Node {
    let mut attempt = 1;
    loop {
        let mut node = spawn_node(dir, node_port());
        let port = node.port;
        let exited = wait_for("a cluster node to answer PING", START_TIMEOUT, || {
            if node.process.exited().is_some() {
                return Some(true);
            }
            let mut conn = admin_login(port).ok()?;
            conn.cmd(&["PING"]).ok()?;
            node.process.listens_on(port).then_some(false)
        });
        if !exited {
            return node;
        }
        let log = node.process.log_text();
        if attempt >= PORT_ATTEMPTS || !log.contains("Address already in use") {
            node.process.fail_exited();
        }
        attempt += 1;
    }
}

fn spawn_node(dir: &WorkDir, port: u16) -> Node {
    let node_dir = dir.path.join(format!("node-{port}"));
    fs::create_dir_all(&node_dir).expect("create node dir");
    let mut command = Command::new("redis-server");
    command
        .arg(root().join("envoy/cluster/redis-node.conf"))
        .args(["--port", &port.to_string(), "--dir"])
        .arg(&node_dir);
    let process = Process::spawn(
        &format!("redis-server {port}"),
        &mut command,
        node_dir.join("redis.log"),
    );
    Node {
        port,
        process,
        dir: node_dir,
    }
}

/// `redis-cli --cluster create` as the admin user: the first nodes become masters, the rest
/// replicas.
fn create(dir: &WorkDir, ports: &[u16], replicas_per_master: usize) {
    let log = dir.file("cluster-create.log");
    let out = fs::File::create(&log).expect("create log");
    let err = out.try_clone().expect("clone log handle");
    let status = Command::new("redis-cli")
        .env("REDISCLI_AUTH", REDIS_ADMIN.1)
        .args(["--user", REDIS_ADMIN.0, "--cluster", "create"])
        .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
        .args([
            "--cluster-replicas",
            &replicas_per_master.to_string(),
            "--cluster-yes",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .expect("run redis-cli --cluster create");
    assert!(
        status.success(),
        "redis-cli --cluster create failed ({status}):\n{}",
        fs::read_to_string(&log).unwrap_or_default()
    );
}

fn admin_login(port: u16) -> std::io::Result<RedisConn> {
    RedisConn::login(port, REDIS_ADMIN.0, REDIS_ADMIN.1)
}

fn cluster_info(port: u16) -> std::io::Result<String> {
    Ok(admin_login(port)?.cmd(&["CLUSTER", "INFO"])?.text())
}

/// `CLUSTER SLOTS` on `port`: (first slot, last slot, master port) per range.
fn slots_seen_by(port: u16) -> std::io::Result<Vec<(u16, u16, u16)>> {
    let reply = admin_login(port)?.cmd(&["CLUSTER", "SLOTS"])?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "bad CLUSTER SLOTS reply");
    let Resp::Array(Some(ranges)) = reply else {
        return Err(bad());
    };
    ranges
        .iter()
        .map(|range| {
            let Resp::Array(Some(fields)) = range else {
                return Err(bad());
            };
            let number = |r: Option<&Resp>| match r {
                Some(Resp::Int(n)) => u16::try_from(*n).map_err(|_| bad()),
                _ => Err(bad()),
            };
            let master = match fields.get(2) {
                Some(Resp::Array(Some(node))) => number(node.get(1))?,
                _ => return Err(bad()),
            };
            Ok((number(fields.first())?, number(fields.get(1))?, master))
        })
        .collect()
}

/// How many slots the ranges cover.
fn covered(slots: &[(u16, u16, u16)]) -> u32 {
    slots
        .iter()
        .map(|&(start, end, _)| u32::from(end) - u32::from(start) + 1)
        .sum()
}

/// The chain of envoy/cluster/ on free ports: Envoy (the filter's listener and the
/// redis_proxy listener) -> ... -> Webdis -> that redis_proxy -> a Redis Cluster of 3 masters
/// with one replica each. Dropped in field order: Envoy first, the cluster last.
pub struct ClusterStack {
    pub envoy: Envoy,
    pub webdis: Webdis,
    pub cluster: RedisCluster,
    /// The redis_proxy listener of `envoy`, which Webdis logs in to.
    pub proxy_port: u16,
    pub dir: WorkDir,
}

impl ClusterStack {
    /// The `tokens` field of a token bucket's state, read on the master of its slot (NaN if
    /// it has none).
    pub fn bucket_tokens(&self, key: &str) -> f64 {
        let owner = self.cluster.master_of_key(key);
        let reply = self.cluster.admin(owner).cmd(&["HGET", key, "tokens"]);
        reply
            .ok()
            .and_then(|r| r.text().parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// Everything of envoy/cluster/ with `edits` applied to its envoy.yaml (each `from` must
    /// occur exactly once; see `procs::filter_config_edit_in` for the filter's JSON).
    pub fn start(name: &str, edits: &[(&str, &str)]) -> ClusterStack {
        let dir = WorkDir::new(name);
        let cluster = RedisCluster::start(&dir, 3, 1);
        let masters = cluster.masters();
        let proxy_port = free_port();
        let webdis_port = free_port();
        // The shipped config's other ports: the redis_proxy listener and the three seeds.
        let moves: Vec<(String, String)> = [(6380, proxy_port)]
            .into_iter()
            .chain([7000, 7001, 7002].into_iter().zip(masters.iter().copied()))
            .map(|(from, to)| (format!("port_value: {from}"), format!("port_value: {to}")))
            .collect();
        let all_edits: Vec<(&str, &str)> = moves
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .chain(edits.iter().copied())
            .collect();
        // Envoy first: it is ready only once its redis_proxy has read the cluster's slots,
        // and Webdis logs in to that proxy when it starts.
        let envoy = Envoy::start_file_with(&dir, &envoy_config_file(), webdis_port, &all_edits);
        let webdis = Webdis::start_with_config(
            &dir,
            &root().join("envoy/cluster/webdis.json"),
            proxy_port,
            webdis_port,
        );
        let stack = ClusterStack {
            envoy,
            webdis,
            cluster,
            proxy_port,
            dir,
        };
        stack.wait_bridge();
        stack
    }

    /// Polls until a command goes through Webdis and the proxy to the nodes (a `SCRIPT LOAD`
    /// of a one-line script, which touches no key and no counter the tests read).
    fn wait_bridge(&self) {
        let auth = self.webdis.authorization();
        wait_for("Webdis -> redis_proxy -> cluster", START_TIMEOUT, || {
            let reply = self.script_load(b"return 'ready'", &auth).ok()?;
            (reply.status == 200 && reply.text().starts_with("{\"SCRIPT\":")).then_some(())
        });
    }

    /// `PUT /SCRIPT/LOAD` of `script` through Webdis with the shipped credentials.
    pub fn load_script(&self, script: &str) -> Response {
        let auth = self.webdis.authorization();
        self.script_load(script.as_bytes(), &auth)
            .expect("PUT /SCRIPT/LOAD through webdis")
    }

    /// Written by hand rather than with `http::request`: Webdis 0.1.9 never answers a PUT
    /// whose body is over about 4 KB when the request says `Connection: close` (the filter's
    /// calls through Envoy do not say it).
    fn script_load(&self, script: &[u8], auth: &[u8]) -> std::io::Result<Response> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.webdis.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut req = format!(
            "PUT /SCRIPT/LOAD HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nAuthorization: ",
            script.len()
        )
        .into_bytes();
        req.extend_from_slice(auth);
        req.extend_from_slice(b"\r\n\r\n");
        req.extend_from_slice(script);
        stream.write_all(&req)?;
        let raw = read_response(&mut stream)?;
        parse(&raw).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "unreadable webdis reply")
        })
    }
}
