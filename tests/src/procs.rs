//! Real processes for the tests, each on free loopback ports, stopped by PID on drop.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::Once;
use std::time::{Duration, Instant};

use crate::http::{get, Response};
use crate::keys::Keys;
use crate::resp::RedisConn;
use crate::{envoy_bin, free_port, root, wait_for, wait_for_value, wasm_path};

/// Commands the Redis user Webdis logs in as must not run (every shipped ACL refuses them):
/// the keyspace at large, the server's configuration, arbitrary Lua, the script cache, the
/// function libraries (it may load one, never flush or delete).
pub const REFUSED_TO_WEBDIS: [&[&str]; 7] = [
    &["FLUSHALL"],
    &["KEYS", "*"],
    &["CONFIG", "GET", "*"],
    &["EVAL", "return 1", "0"],
    &["SCRIPT", "FLUSH"],
    &["FUNCTION", "FLUSH"],
    &["FUNCTION", "DELETE", "ratelimit_lib"],
];

/// Redis admin user from envoy/redis.conf (the default user is Webdis's restricted one).
pub const REDIS_ADMIN: (&str, &str) = ("admin", "admin-demo-secret");
/// Password of Redis's default user, which Webdis logs in as (envoy/redis.conf).
pub const REDIS_WEBDIS_PASSWORD: &str = "webdis-demo-secret";
/// The user the operator's command ratelimit-admin logs in as (envoy/redis.conf).
pub const REDIS_TOOL: (&str, &str) = ("ratelimit-admin", "ratelimit-admin-demo-secret");

/// How long a process may take to start: Envoy compiles the filter first, which takes tens of
/// seconds on a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How many times a process is started on new ports when another took one first.
pub(crate) const PORT_ATTEMPTS: u32 = 5;
/// How long a test waits for a count to reach the stats (within a tick of the worker, far
/// less than this, even on a loaded machine).
const STAT_TIMEOUT: Duration = Duration::from_secs(10);

/// A folder for one test's configs and logs: target/e2e/NAME, emptied first, kept afterwards
/// so a failure can be read.
pub struct WorkDir {
    pub path: PathBuf,
}

impl WorkDir {
    pub fn new(name: &str) -> WorkDir {
        let path = root().join("target/e2e").join(name);
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create work dir");
        WorkDir { path }
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

/// The PIDs of the processes started and not reaped yet, 0 in a free slot: what
/// [`stop_all_on_panic`] and the handler of [`stop_all_on_signal`] stop. Atomics in a fixed
/// array rather than a `Mutex<Vec>`, because a signal handler may neither lock (the thread it
/// interrupted may hold the lock) nor allocate. Far more slots than processes any test process
/// runs at once; one more than that would go untracked, not fail.
const SLOTS: usize = 1024;
static PIDS: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];
/// Set by the first SIGINT, SIGTERM or SIGHUP: its handler is stopping everything, then ends
/// the process.
static SIGNALLED: AtomicBool = AtomicBool::new(false);
/// How long children get to exit after SIGTERM before SIGKILL: Redis, Webdis and Envoy take
/// milliseconds; SIGTERM first so a Redis stops its own forked children (replication) too.
const TERM_GRACE: Duration = Duration::from_secs(3);

/// Records `pid`, a child of this process, as one to stop; [`untrack_pid`] must follow once it
/// is reaped. [`Process`] does both; these are for a child started some other way.
pub fn track_pid(pid: u32) {
    if PIDS
        .iter()
        .any(|slot| slot.compare_exchange(0, pid, SeqCst, SeqCst).is_ok())
        && SIGNALLED.load(SeqCst)
    {
        // Started while the handler stops everything, perhaps after its last look.
        // SAFETY: kill(2) on our own child.
        unsafe { sys::kill(pid as i32, sys::SIGKILL) };
    }
}

/// Forgets `pid`, reaped, once: its number may be given to another process already, which
/// has a slot of its own.
pub fn untrack_pid(pid: u32) {
    let _ = PIDS
        .iter()
        .any(|slot| slot.compare_exchange(pid, 0, SeqCst, SeqCst).is_ok());
}

/// SIGTERM to every tracked process, up to [`TERM_GRACE`] for them to exit, then SIGKILL to any
/// left. Async-signal-safe: atomics and system calls only. Exit is seen with `WNOWAIT`, which
/// leaves the zombie: a process reaped here could get its PID reused while the thread owning
/// its [`Process`] still signals it by that number.
fn stop_all() {
    // SAFETY (every block here): kill(2) on our own children.
    each_tracked(|pid| unsafe {
        sys::kill(pid, sys::SIGTERM);
        // One paused (SIGSTOP, `Process::pause`) acts on SIGTERM only once continued.
        sys::kill(pid, sys::SIGCONT);
    });
    if !all_exit_within(TERM_GRACE) {
        each_tracked(|pid| {
            if running(pid) {
                unsafe { sys::kill(pid, sys::SIGKILL) };
            }
        });
        all_exit_within(Duration::from_secs(1));
    }
}

/// Whether `pid` is a child of ours that has not exited (neither reaped nor a zombie).
fn running(pid: i32) -> bool {
    let mut info = sys::SigInfo([0; 32]);
    // SAFETY: waitid(2) into a buffer the size of siginfo_t; WNOWAIT reaps nothing.
    let found = unsafe {
        sys::waitid(
            sys::P_PID,
            pid as u32,
            &mut info,
            sys::WEXITED | sys::WNOHANG | sys::WNOWAIT,
        )
    };
    // 0 with no signal number: not exited yet (-1: not our child any more, reaped).
    found == 0 && info.0[0] == 0
}

/// Calls `f` with each tracked PID (no allocation, no lock).
fn each_tracked(mut f: impl FnMut(i32)) {
    for slot in &PIDS {
        match slot.load(SeqCst) {
            0 => {}
            pid => f(pid as i32),
        }
    }
}

/// Polls until every tracked process has exited (reaped or a zombie), for up to `limit`.
fn all_exit_within(limit: Duration) -> bool {
    let step = Duration::from_millis(20);
    let mut waited = Duration::ZERO;
    loop {
        let mut left = false;
        each_tracked(|pid| left |= running(pid));
        if !left {
            return true;
        }
        if waited >= limit {
            return false;
        }
        let pause = sys::Timespec {
            tv_sec: 0,
            tv_nsec: step.as_nanos() as std::os::raw::c_long,
        };
        // SAFETY: nanosleep(2) with a valid timespec.
        unsafe { sys::nanosleep(&pause, std::ptr::null_mut()) };
        waited += step;
    }
}

/// Has a panic stop every process started here that is still running, before the panic goes
/// on: a build with `panic = "abort"` (the release profile, which `cargo run --release -p
/// bench` uses) runs no destructor, so nothing else would stop them.
pub fn stop_all_on_panic() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        if SIGNALLED.load(SeqCst) {
            // The signal's handler is stopping them (this panic is likely a child it
            // stopped), then ends the process: an abort here would cut it short.
            loop {
                std::thread::park();
            }
        }
        stop_all();
    }));
}

/// Has SIGINT, SIGTERM and SIGHUP stop every process started here, then end this process with
/// status 128 + the signal, as a shell reports one killed by it: by default they end it at
/// once, and its Redis, Webdis and Envoys would run on. Done by [`Process::spawn`] (once per
/// process), so every user of the harness has it; a signal whose disposition someone else set
/// (ignored, as a shell does for `cmd &`, or handled) is left alone.
pub fn stop_all_on_signal() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        for sig in [sys::SIGINT, sys::SIGTERM, sys::SIGHUP] {
            let handler = on_signal as extern "C" fn(std::os::raw::c_int) as usize;
            // SAFETY: signal(2) with a handler that is async-signal-safe. glibc's signal()
            // keeps the handler installed and restarts interrupted calls (BSD semantics).
            unsafe {
                let previous = sys::signal(sig, handler);
                if previous != sys::SIG_DFL && previous != sys::SIG_ERR {
                    sys::signal(sig, previous);
                }
            }
        }
    });
}

extern "C" fn on_signal(sig: std::os::raw::c_int) {
    // A second signal, or one on another thread, while the first one's stop runs: it ends
    // the process anyway.
    if SIGNALLED.swap(true, SeqCst) {
        return;
    }
    stop_all();
    // Reaped here, as the process ends: left as zombies, they would wait for whatever
    // inherits them (PID 1, perhaps no init) to reap them.
    // SAFETY: waitpid(2) on our own children; _exit(2) runs no atexit handler or destructor,
    // which are not async-signal-safe.
    unsafe {
        each_tracked(|pid| {
            sys::waitpid(pid, std::ptr::null_mut(), sys::WNOHANG);
        });
        sys::_exit(128 + sig)
    }
}

/// The C library's calls the signal handler makes (std links libc, so no crate for them).
/// Linux's numbers: the harness reads /proc, it runs on Linux only.
mod sys {
    use std::os::raw::{c_int, c_long};

    pub const SIGHUP: c_int = 1;
    pub const SIGINT: c_int = 2;
    pub const SIGKILL: c_int = 9;
    pub const SIGTERM: c_int = 15;
    pub const SIGCONT: c_int = 18;
    pub const SIG_DFL: usize = 0;
    pub const SIG_ERR: usize = usize::MAX;
    pub const P_PID: c_int = 1;
    pub const WNOHANG: c_int = 1;
    pub const WEXITED: c_int = 4;
    pub const WNOWAIT: c_int = 0x0100_0000;

    /// siginfo_t: 128 bytes, `si_signo` first.
    #[repr(C, align(8))]
    pub struct SigInfo(pub [c_int; 32]);

    #[repr(C)]
    pub struct Timespec {
        pub tv_sec: c_long,
        pub tv_nsec: c_long,
    }

    extern "C" {
        pub fn kill(pid: c_int, sig: c_int) -> c_int;
        pub fn signal(sig: c_int, handler: usize) -> usize;
        pub fn waitid(idtype: c_int, id: u32, info: *mut SigInfo, options: c_int) -> c_int;
        pub fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
        pub fn nanosleep(req: *const Timespec, rem: *mut Timespec) -> c_int;
        pub fn _exit(status: c_int) -> !;
    }
}

/// A socket on 127.0.0.1, as /proc/net/tcp lists it.
struct LoopbackSocket {
    listening: bool,
    /// Bytes received and not read yet (for a listening socket, connections not accepted).
    unread: u64,
    inode: String,
}

/// The sockets whose local address is 127.0.0.1:`port`, listening or connected. A dual-stack
/// socket bound to 127.0.0.1 (gRPC's servers bind so) is listed in /proc/net/tcp6, at the
/// IPv4-mapped address.
fn loopback_sockets(port: u16) -> Vec<LoopbackSocket> {
    let mut sockets = Vec::new();
    for (file, local) in [
        ("/proc/net/tcp", format!("0100007F:{port:04X}")),
        (
            "/proc/net/tcp6",
            format!("0000000000000000FFFF00000100007F:{port:04X}"),
        ),
    ] {
        let Ok(table) = fs::read_to_string(file) else {
            continue;
        };
        // Fields: sl local_address rem_address st tx_queue:rx_queue ... inode (the tenth).
        sockets.extend(
            table
                .lines()
                .skip(1)
                .map(|line| line.split_whitespace().collect::<Vec<_>>())
                .filter(|f| f.len() > 9 && f[1] == local)
                .map(|f| LoopbackSocket {
                    listening: f[3] == "0A",
                    unread: f[4]
                        .split_once(':')
                        .and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok())
                        .unwrap_or(0),
                    inode: f[9].to_string(),
                }),
        );
    }
    sockets
}

/// A thread state letter of /proc's: stopped by a signal (`T`) or while traced (`t`).
fn stopped(state: char) -> bool {
    matches!(state, 'T' | 't')
}

/// A child process that is killed and reaped when dropped.
pub struct Process {
    pub name: String,
    child: Child,
    pub log: PathBuf,
    /// Whether its PID is still in [`PIDS`].
    tracked: bool,
}

impl Process {
    pub fn spawn(name: &str, command: &mut Command, log: PathBuf) -> Process {
        stop_all_on_signal();
        let out = fs::File::create(&log).expect("create log");
        let err = out.try_clone().expect("clone log handle");
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        track_pid(child.id());
        Process {
            name: name.to_string(),
            child,
            log,
            tracked: true,
        }
    }

    /// Whether this process itself holds the listening socket on 127.0.0.1:`port`. An answer
    /// on the port is not enough: every test process on the machine draws ports from one range,
    /// and a server that lost the port to another process's server answers for a moment before
    /// it exits, while the other one answers for good (Linux: /proc/net/tcp and the fds).
    pub fn listens_on(&self, port: u16) -> bool {
        let inodes: Vec<String> = loopback_sockets(port)
            .into_iter()
            .filter(|s| s.listening)
            .map(|s| format!("socket:[{}]", s.inode))
            .collect();
        let Ok(fds) = fs::read_dir(format!("/proc/{}/fd", self.child.id())) else {
            return false;
        };
        fds.flatten().any(|fd| {
            fs::read_link(fd.path())
                .map(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
                .unwrap_or(false)
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.try_wait().ok().flatten();
        if status.is_some() {
            self.untrack();
        }
        status
    }

    /// Its PID out of [`PIDS`] once reaped (no earlier: a signal's handler must still stop
    /// it), and only once.
    fn untrack(&mut self) {
        if std::mem::take(&mut self.tracked) {
            untrack_pid(self.child.id());
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics, with the end of the log, if the process has exited.
    pub fn assert_running(&mut self) {
        if self.exited().is_some() {
            self.fail_exited();
        }
    }

    /// Panics with the exit status and the end of the log.
    pub fn fail_exited(&mut self) -> ! {
        panic!("{}", self.exit_report());
    }

    /// How it exited, and the end of its log.
    fn exit_report(&mut self) -> String {
        let status = self.exited().map(|s| s.to_string()).unwrap_or_default();
        let log = self.log_text();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("{} exited ({status}):\n{}", self.name, tail.join("\n"))
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {} failed", self.pid());
    }

    /// SIGSTOP: the process hangs, its sockets stay open. Returns once every thread is
    /// stopped: `kill` returns when the signal is sent, and a thread busy on a loaded machine
    /// can still answer a request before it takes the signal.
    pub fn pause(&self) {
        self.signal("STOP");
        wait_for("every thread stopped", Duration::from_secs(10), || {
            self.thread_states()
                .iter()
                .all(|s| stopped(*s))
                .then_some(())
        });
    }

    /// SIGCONT; returns once no thread is stopped any more.
    pub fn resume(&self) {
        self.signal("CONT");
        wait_for("every thread running", Duration::from_secs(10), || {
            (!self.thread_states().iter().any(|s| stopped(*s))).then_some(())
        });
    }

    /// The state letter of each of its threads (`/proc/PID/task/TID/stat`, after the name).
    fn thread_states(&self) -> Vec<char> {
        let tasks = PathBuf::from(format!("/proc/{}/task", self.pid()));
        let Ok(entries) = fs::read_dir(&tasks) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| fs::read_to_string(e.path().join("stat")).ok())
            .filter_map(|stat| {
                let after_name = &stat[stat.rfind(')')? + 1..];
                after_name.trim_start().chars().next()
            })
            .collect()
    }

    pub fn stop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        self.untrack();
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // A stopped process would ignore nothing, but SIGKILL works on it too.
        self.stop();
    }
}

pub struct Redis {
    pub port: u16,
    pub process: Process,
    dir: PathBuf,
}

impl Redis {
    /// How many connections to its port hold bytes it has not read (commands waiting while it
    /// is paused): their receive queues, where a FIN counts one.
    pub fn connections_with_unread_bytes(&self) -> usize {
        loopback_sockets(self.port)
            .iter()
            .filter(|s| !s.listening && s.unread > 1)
            .count()
    }

    /// Redis with the shipped envoy/redis.conf (users and ACLs), on a free port.
    pub fn start(dir: &WorkDir) -> Redis {
        on_a_free_port(|port| Redis::try_start(dir.path.clone(), port, &[]))
    }

    /// The same Redis run under `wrapper` (a command and its arguments, e.g. valgrind's), for
    /// measurements that count what Redis executes.
    pub fn start_wrapped(dir: &WorkDir, wrapper: &[&str]) -> Redis {
        on_a_free_port(|port| Redis::try_start(dir.path.clone(), port, wrapper))
    }

    fn start_on(dir: PathBuf, port: u16) -> Redis {
        Redis::try_start(dir, port, &[]).unwrap_or_else(|report| panic!("{report}"))
    }

    /// Redis on `port`, or how it exited.
    fn try_start(dir: PathBuf, port: u16, wrapper: &[&str]) -> Result<Redis, String> {
        let conf = root().join("envoy/redis.conf");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg("redis-server");
                c
            }
            None => Command::new("redis-server"),
        };
        // A snapshot of its own per port: several Redis of one test share its folder, and one
        // restarted on its port loads what it saved (docs/operations.md#what-survives-a-restart).
        command
            .arg(conf)
            .args(["--port", &port.to_string(), "--dir"])
            .arg(&dir)
            .args(["--dbfilename", &format!("redis-{port}.rdb")]);
        if !wrapper.is_empty() {
            // Its timer's work (serverCron, 10 times a second) grows with the run's wall time,
            // which valgrind stretches by however busy the machine is: once a second, what it
            // adds to a count of the commands' own work is small and steady.
            command.args(["--hz", "1"]);
        }
        let mut process = Process::spawn(
            "redis-server",
            &mut command,
            dir.join(format!("redis-{port}.log")),
        );
        let exited = wait_for("redis to answer PING", START_TIMEOUT, || {
            if process.exited().is_some() {
                return Some(true);
            }
            let mut conn = RedisConn::login(port, REDIS_ADMIN.0, REDIS_ADMIN.1).ok()?;
            conn.cmd(&["PING"]).ok()?;
            process.listens_on(port).then_some(false)
        });
        if exited {
            return Err(process.exit_report());
        }
        Ok(Redis { port, process, dir })
    }

    /// A connection as the admin user.
    pub fn admin(&self) -> RedisConn {
        RedisConn::login(self.port, REDIS_ADMIN.0, REDIS_ADMIN.1).expect("redis admin login")
    }

    /// A connection as the restricted user Webdis uses.
    pub fn webdis_user(&self) -> RedisConn {
        RedisConn::login(self.port, "default", REDIS_WEBDIS_PASSWORD).expect("redis login")
    }

    /// A connection as the user ratelimit-admin logs in as.
    pub fn tool_user(&self) -> RedisConn {
        RedisConn::login(self.port, REDIS_TOOL.0, REDIS_TOOL.1).expect("redis login")
    }

    /// The URL ratelimit-admin is given for this Redis, as `user` with `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("redis://{user}:{password}@127.0.0.1:{}", self.port)
    }

    /// Redis's clock (`TIME`) in Unix ns: the clock the tool computes with.
    pub fn time_ns(&self) -> u128 {
        let items = self.admin().cmd(&["TIME"]).unwrap().items();
        let seconds: u128 = items[0].text().parse().unwrap();
        let micros: u128 = items[1].text().parse().unwrap();
        seconds * 1_000_000_000 + micros * 1_000
    }

    /// How many times Redis ran `command` (lower case, e.g. `evalsha`), from `INFO commandstats`.
    pub fn command_calls(&self, command: &str) -> u64 {
        let stats = self.admin().cmd(&["INFO", "commandstats"]).unwrap().text();
        command_calls_in(&stats, command)
    }

    /// Decision calls Redis has run (decisions, refunds, settlements): `FCALL` and `EVALSHA`.
    pub fn decision_calls(&self) -> u64 {
        let stats = self.admin().cmd(&["INFO", "commandstats"]).unwrap().text();
        command_calls_in(&stats, "fcall") + command_calls_in(&stats, "evalsha")
    }

    /// A field of the hash at `key` (empty if there is none), read as the admin user.
    pub fn hash_field(&self, key: &str, field: &str) -> String {
        self.admin().cmd(&["HGET", key, field]).unwrap().text()
    }

    /// The `tokens` field of a token bucket's state, NaN if it has none.
    pub fn bucket_tokens(&self, key: &str) -> f64 {
        let text = self.admin().cmd(&["HGET", key, "tokens"]).unwrap().text();
        text.parse().unwrap_or(f64::NAN)
    }

    /// Kills Redis and starts a new one on the same port: all keys and scripts are gone.
    pub fn restart(&mut self) {
        self.process.stop();
        let port = self.port;
        let dir = self.dir.clone();
        wait_for("the old redis port to be free", START_TIMEOUT, || {
            std::net::TcpListener::bind(("127.0.0.1", port)).ok()
        });
        *self = Redis::start_on(dir, port);
    }
}

/// How many times `command` (lower case, e.g. `evalsha`) ran, from the text of
/// `INFO commandstats`; 0 if it never did.
pub fn command_calls_in(stats: &str, command: &str) -> u64 {
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub struct Webdis {
    pub port: u16,
    pub process: Process,
    /// `user:password` that the shipped ACL accepts.
    pub basic_auth: String,
    /// The shipped config it was made from (a restart uses it again).
    config_file: PathBuf,
}

impl Webdis {
    /// Webdis with the shipped envoy/webdis.json, pointed at `redis_port`, on a free port.
    pub fn start(dir: &WorkDir, redis_port: u16) -> Webdis {
        let file = root().join("envoy/webdis.json");
        on_a_free_port(|port| Webdis::try_start(dir, &file, redis_port, port))
    }

    /// Webdis from another shipped config (e.g. envoy/cluster/webdis.json), pointed at
    /// `redis_port` (a Redis, or anything speaking its protocol such as Envoy's redis_proxy),
    /// listening on `port`.
    pub fn start_with_config(dir: &WorkDir, file: &Path, redis_port: u16, port: u16) -> Webdis {
        Webdis::start_on(dir, file, redis_port, port)
    }

    /// Kills Webdis and starts a new one on the same port, from the same config.
    pub fn restart(&mut self, dir: &WorkDir, redis_port: u16) {
        let file = self.config_file.clone();
        self.restart_with(dir, &file, redis_port);
    }

    /// Kills Webdis and starts a new one on the same port, from config `file` (an operator
    /// changing Webdis's settings while Envoy runs).
    pub fn restart_with(&mut self, dir: &WorkDir, file: &Path, redis_port: u16) {
        self.process.stop();
        let port = self.port;
        wait_for("the old webdis port to be free", START_TIMEOUT, || {
            std::net::TcpListener::bind(("127.0.0.1", port)).ok()
        });
        *self = Webdis::start_on(dir, file, redis_port, port);
    }

    /// The shipped envoy/webdis.json changed by `edit`, written to `dir` as `name`: a Webdis
    /// config for [`Webdis::start_with_config`] (which sets its ports and log).
    pub fn edited_config(
        dir: &WorkDir,
        name: &str,
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> PathBuf {
        let shipped = fs::read_to_string(root().join("envoy/webdis.json")).expect("webdis.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&shipped).expect("webdis.json is JSON");
        edit(&mut config);
        let path = dir.file(name);
        fs::write(&path, config.to_string()).expect("write webdis config");
        path
    }

    fn start_on(dir: &WorkDir, file: &Path, redis_port: u16, port: u16) -> Webdis {
        Webdis::try_start(dir, file, redis_port, port).unwrap_or_else(|report| panic!("{report}"))
    }

    /// Webdis on `port`, or how it exited (with the end of its own log file).
    fn try_start(dir: &WorkDir, file: &Path, redis_port: u16, port: u16) -> Result<Webdis, String> {
        let shipped =
            fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let mut config: serde_json::Value =
            serde_json::from_str(&shipped).expect("webdis.json is JSON");
        config["redis_port"] = redis_port.into();
        config["http_port"] = port.into();
        let logfile = dir.file(&format!("webdis-{port}.log"));
        config["logfile"] = logfile.display().to_string().into();
        let basic_auth = config["acl"]
            .as_array()
            .and_then(|acl| acl.iter().find_map(|e| e["http_basic_auth"].as_str()))
            .expect("webdis.json has an http_basic_auth ACL entry")
            .to_string();
        let path = dir.file(&format!("webdis-{port}.json"));
        fs::write(&path, config.to_string()).expect("write webdis config");
        let mut process = Process::spawn(
            "webdis",
            Command::new("webdis").arg(&path),
            dir.file(&format!("webdis-{port}.out")),
        );
        let exited = wait_for("webdis to answer HTTP", START_TIMEOUT, || {
            if process.exited().is_some() {
                return Some(true);
            }
            get(port, "/PING", &[]).ok()?;
            process.listens_on(port).then_some(false)
        });
        if exited {
            let log = fs::read_to_string(&logfile).unwrap_or_default();
            return Err(format!("{}\n{log}", process.exit_report()));
        }
        Ok(Webdis {
            port,
            process,
            basic_auth,
            config_file: file.to_path_buf(),
        })
    }

    /// `Authorization` header value with the shipped credentials.
    pub fn authorization(&self) -> Vec<u8> {
        format!(
            "Basic {}",
            ratelimit_core::encode::base64(self.basic_auth.as_bytes())
        )
        .into_bytes()
    }
}

pub struct Envoy {
    pub port: u16,
    pub admin_port: u16,
    pub process: Process,
    pub config_path: PathBuf,
}

impl Envoy {
    /// The shipped envoy/envoy.yaml on free ports, talking to Webdis on `webdis_port`, with
    /// `edits` applied (each `from` must occur exactly once). Waits until it is LIVE.
    pub fn start(dir: &WorkDir, webdis_port: u16, edits: &[(&str, &str)]) -> Envoy {
        Envoy::start_file_with(dir, &root().join("envoy/envoy.yaml"), webdis_port, edits)
    }

    /// The shipped envoy/envoy.yaml with `filter_json` as the whole filter configuration
    /// (see [`filter_config_edit`]) and `workers` worker threads; waits until it is LIVE.
    pub fn start_filter(dir: &WorkDir, webdis_port: u16, filter_json: &str, workers: u32) -> Envoy {
        let (from, to) = filter_config_edit(filter_json);
        let (port, admin_port) = (free_port(), free_port());
        let yaml = envoy_config(port, admin_port, webdis_port, &[(&from, &to)]);
        Envoy::start_config(dir, port, admin_port, &yaml, workers)
    }

    /// Starts Envoy without waiting for readiness (for configs that must be refused).
    pub fn launch(dir: &WorkDir, webdis_port: u16, edits: &[(&str, &str)]) -> Envoy {
        let (port, admin_port) = (free_port(), free_port());
        let file = root().join("envoy/envoy.yaml");
        let config = envoy_config_from(&file, port, admin_port, webdis_port, edits);
        Envoy::launch_config(dir, port, admin_port, &config, 2)
    }

    /// Like [`Envoy::start`], from another config written for the same ports and files (the
    /// examples in envoy/examples/, envoy/cluster/envoy.yaml), with `edits` (each `from` must
    /// occur exactly once), e.g. to move the other ports of envoy/cluster/envoy.yaml.
    pub fn start_file_with(
        dir: &WorkDir,
        file: &Path,
        webdis_port: u16,
        edits: &[(&str, &str)],
    ) -> Envoy {
        let (port, admin_port) = (free_port(), free_port());
        let config = envoy_config_from(file, port, admin_port, webdis_port, edits);
        Envoy::start_config(dir, port, admin_port, &config, 2)
    }

    /// Starts Envoy on `config` (YAML already written for `port` and `admin_port`) with
    /// `concurrency` worker threads, and waits until it is LIVE. Envoy binds its listener
    /// only once the filter is compiled (seconds on a loaded machine), and every test process
    /// on the machine draws ports from one range: should another process bind `port` or
    /// `admin_port` first, Envoy exits, and is started again on other ports.
    pub fn start_config(
        dir: &WorkDir,
        port: u16,
        admin_port: u16,
        config: &str,
        concurrency: u32,
    ) -> Envoy {
        let (mut port, mut admin_port, mut config) = (port, admin_port, config.to_string());
        let mut attempt = 1;
        loop {
            match Envoy::launch_config(dir, port, admin_port, &config, concurrency).wait_live() {
                Ok(envoy) => return envoy,
                Err(envoy)
                    if attempt < PORT_ATTEMPTS
                        && envoy.process.log_text().contains("Address already in use") =>
                {
                    let (new_port, new_admin) = (free_port(), free_port());
                    config = move_port(&config, port, new_port);
                    config = move_port(&config, admin_port, new_admin);
                    (port, admin_port) = (new_port, new_admin);
                    attempt += 1;
                }
                Err(mut envoy) => envoy.process.fail_exited(),
            }
        }
    }

    /// Polls until this Envoy is LIVE (Ok), or until it has exited (Err).
    pub fn wait_live(mut self) -> Result<Envoy, Envoy> {
        let admin = self.admin_port;
        let config_path = self.config_path.display().to_string();
        let process = &mut self.process;
        let exited = wait_for("envoy to be LIVE", START_TIMEOUT, || {
            if process.exited().is_some() {
                return Some(true);
            }
            get(admin, "/ready", &[])
                .ok()
                .filter(|r| r.status == 200 && r.text().contains("LIVE"))?;
            // LIVE from whoever holds the port is not enough: it must be this Envoy.
            get(admin, "/server_info", &[])
                .ok()
                .filter(|r| r.text().contains(&*config_path))
                .map(|_| false)
        });
        if exited {
            Err(self)
        } else {
            Ok(self)
        }
    }

    /// Starts Envoy on `config` (YAML written for `port` and `admin_port`) without waiting
    /// for readiness: for a test that watches it start ([`Envoy::wait_live`] then waits).
    pub fn launch_config(
        dir: &WorkDir,
        port: u16,
        admin_port: u16,
        config: &str,
        concurrency: u32,
    ) -> Envoy {
        let config_path = dir.file(&format!("envoy-{port}.yaml"));
        fs::write(&config_path, without_reuse_port(config)).expect("write envoy config");
        let mut command = Command::new(envoy_bin());
        command.arg("-c").arg(&config_path).args([
            "--concurrency",
            &concurrency.to_string(),
            "--disable-hot-restart",
            "--log-level",
            "info",
        ]);
        let process = Process::spawn(
            "envoy",
            &mut command,
            dir.file(&format!("envoy-{port}.log")),
        );
        Envoy {
            port,
            admin_port,
            process,
            config_path,
        }
    }

    /// A request to the listener; panics if it gets no HTTP answer.
    pub fn send(&self, path: &str, headers: &[(&str, &[u8])]) -> Response {
        get(self.port, path, headers).expect("request through envoy")
    }

    /// `GET /` with API key `key` (`x-api-key`, the key of the shipped rule).
    pub fn keyed(&self, key: impl AsRef<[u8]>) -> Response {
        self.keyed_at("/", key)
    }

    /// `GET path` with API key `key`.
    pub fn keyed_at(&self, path: &str, key: impl AsRef<[u8]>) -> Response {
        self.send(path, &[("x-api-key", key.as_ref())])
    }

    /// Waits until no worker's circuit breaker is open, then sends a request with API key
    /// `key`, until one is decided (it carries `x-ratelimit-limit`); returns that one. The
    /// start of a test that then takes the bridge down: on a loaded machine the first calls
    /// (the script loaded, connections opened) can outlast the breaker's stall, and requests
    /// pass by policy until a probe closes it.
    pub fn wait_deciding(&self, key: &str) -> Response {
        let closed = || self.stat("wasmcustom.ratelimit_breaker_open") == 0;
        wait_for("a decision with every breaker closed", STAT_TIMEOUT, || {
            if !closed() {
                return None;
            }
            let r = self.keyed(key);
            (r.header("x-ratelimit-limit").is_some() && closed()).then_some(r)
        })
    }

    /// The decision code loaded before a test counts: the first request after Redis starts
    /// gets `ERR Function not found` and the filter loads the library (`FUNCTION LOAD
    /// REPLACE`, then the `FCALL` again; `NOSCRIPT`, `SCRIPT LOAD` and `EVALSHA` with
    /// scripts). One request to `path` with an API key of its own does that.
    pub fn load_script(&self, path: &str) {
        assert_eq!(self.keyed_at(path, "warm-up").status, 200);
        assert_eq!(self.counter("ratelimit_script_loads"), 1);
    }

    /// The tokens left in the bucket of `api_key` under rule `rule`, limit `limit` (keyed by
    /// `x-api-key`), as this Envoy's filter names it.
    pub fn bucket_tokens(&self, redis: &Redis, rule: &str, limit: &str, api_key: &str) -> f64 {
        let key = self
            .keys()
            .limit_key(rule, limit, "header:x-api-key", api_key.as_bytes());
        redis.bucket_tokens(&key)
    }

    /// The Redis keys of the filter configuration this Envoy runs.
    pub fn keys(&self) -> Keys {
        Keys::from_envoy_file(&self.config_path)
    }

    /// A filter counter from /stats (`wasmcustom.NAME`), 0 if not there yet.
    pub fn counter(&self, name: &str) -> u64 {
        self.stat(&format!("wasmcustom.{name}"))
    }

    /// Any counter or gauge from /stats.
    pub fn stat(&self, full_name: &str) -> u64 {
        let stats = get(
            self.admin_port,
            &format!("/stats?filter=^{full_name}$"),
            &[],
        )
        .expect("envoy admin /stats");
        stats
            .text()
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{full_name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Polls until filter counter `name` is exactly `want`: a count may reach the stats at
    /// the worker's next tick, after the answer that it counts.
    pub fn wait_counter(&self, name: &str, want: u64) {
        self.wait_stat(&format!("wasmcustom.{name}"), want);
    }

    /// Polls until counter or gauge `full_name` is exactly `want`.
    pub fn wait_stat(&self, full_name: &str, want: u64) {
        wait_for_value(full_name, STAT_TIMEOUT, want, || self.stat(full_name));
    }
}

/// The shipped envoy.yaml with test ports, the absolute wasm path and `edits`.
pub fn envoy_config(
    port: u16,
    admin_port: u16,
    webdis_port: u16,
    edits: &[(&str, &str)],
) -> String {
    envoy_config_from(
        &root().join("envoy/envoy.yaml"),
        port,
        admin_port,
        webdis_port,
        edits,
    )
}

/// An Envoy config file written for the shipped ports, moved to the test's ports.
pub fn envoy_config_from(
    file: &Path,
    port: u16,
    admin_port: u16,
    webdis_port: u16,
    edits: &[(&str, &str)],
) -> String {
    let shipped = fs::read_to_string(file).expect("read envoy config");
    let wasm = wasm_path();
    let mut replacements = vec![
        (
            "port_value: 9901".to_string(),
            format!("port_value: {admin_port}"),
        ),
        (
            "port_value: 10000".to_string(),
            format!("port_value: {port}"),
        ),
        (
            "port_value: 7379".to_string(),
            format!("port_value: {webdis_port}"),
        ),
        (
            "filename: target/wasm32-wasip1/release/ratelimit_filter.wasm".to_string(),
            format!("filename: {}", wasm.display()),
        ),
    ];
    replacements.extend(edits.iter().map(|(a, b)| (a.to_string(), b.to_string())));
    apply_edits(&shipped, &replacements)
}

/// Starts a server with `start` on a free port, or, should it exit because another process
/// bound that port first (every test process on the machine draws from one range), on
/// another.
fn on_a_free_port<T>(mut start: impl FnMut(u16) -> Result<T, String>) -> T {
    let mut attempt = 1;
    loop {
        match start(free_port()) {
            Ok(server) => return server,
            Err(report) if attempt < PORT_ATTEMPTS && report.contains("Address already in use") => {
                attempt += 1
            }
            Err(report) => panic!("{report}"),
        }
    }
}

/// `config` with `enable_reuse_port: false` on every listener. Envoy binds its listeners with
/// SO_REUSEPORT by default, so two Envoys of two test processes that drew the same free port
/// would both start and share its connections silently; without it the second one exits with
/// "Address already in use" and is started again on another port.
pub fn without_reuse_port(config: &str) -> String {
    let mut out = String::with_capacity(config.len() + 64);
    // The indent of the `listeners:` key while inside its list, and of the list's items.
    let (mut listeners, mut item) = (None::<usize>, None::<usize>);
    for line in config.lines() {
        out.push_str(line);
        out.push('\n');
        let (indent, text) = (indent_of(line), line.trim_start());
        if text == "listeners:" {
            (listeners, item) = (Some(indent), None);
            continue;
        }
        let Some(key) = listeners else { continue };
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        if indent < key || (indent == key && !text.starts_with('-')) {
            listeners = None;
            continue;
        }
        if text.starts_with("- ") && *item.get_or_insert(indent) == indent {
            out.push_str(&" ".repeat(indent + 2));
            out.push_str("enable_reuse_port: false\n");
        }
    }
    out
}

/// `config` (an Envoy config) with `port_value: from` made `port_value: to`.
fn move_port(config: &str, from: u16, to: u16) -> String {
    apply_edits(
        config,
        &[(format!("port_value: {from} "), format!("port_value: {to} "))],
    )
}

/// Replaces each `from` with its `to`; each `from` must occur exactly once, so a config
/// change that makes an edit miss fails loudly instead of silently testing the wrong thing.
pub fn apply_edits(text: &str, edits: &[(String, String)]) -> String {
    let mut text = text.to_string();
    for (from, to) in edits {
        let count = text.matches(from.as_str()).count();
        assert_eq!(count, 1, "edit {from:?} matches {count} times, not once");
        text = text.replacen(from.as_str(), to, 1);
    }
    text
}

/// Redis, Webdis and Envoy wired together from the shipped configs. Dropped in field order:
/// Envoy first, Redis last.
pub struct Stack {
    pub envoy: Envoy,
    pub webdis: Webdis,
    pub redis: Redis,
    pub dir: WorkDir,
}

impl Stack {
    pub fn start(name: &str, edits: &[(&str, &str)]) -> Stack {
        let dir = WorkDir::new(name);
        let redis = Redis::start(&dir);
        let webdis = Webdis::start(&dir, redis.port);
        let envoy = Envoy::start(&dir, webdis.port, edits);
        Stack {
            envoy,
            webdis,
            redis,
            dir,
        }
    }
}

/// Runs `envoy --mode validate` on a config file from `cwd`; returns (success, output).
pub fn validate_config(cwd: &Path, config: &Path) -> (bool, String) {
    let out = Command::new(envoy_bin())
        .current_dir(cwd)
        .args(["--mode", "validate", "-c"])
        .arg(config)
        .output()
        .expect("run envoy --mode validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// An edit for `Envoy::start` that swaps the whole filter JSON of the shipped envoy.yaml for
/// `json` (the block under `value: |`).
pub fn filter_config_edit(json: &str) -> (String, String) {
    filter_config_edit_in(&root().join("envoy/envoy.yaml"), json)
}

/// Like [`filter_config_edit`], for another Envoy config that loads the filter (e.g.
/// envoy/cluster/envoy.yaml).
pub fn filter_config_edit_in(file: &Path, json: &str) -> (String, String) {
    let shipped =
        fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    let (old, indent) = filter_json_block(&shipped);
    let new: String = json
        .lines()
        .map(|line| format!("{indent}{line}\n"))
        .collect();
    (old, new)
}

/// The text of the block scalar (`value: |`) holding the wasm filter's JSON, with its
/// indentation, exactly as in `yaml` (lines end with `\n`), and that indentation.
pub fn filter_json_block(yaml: &str) -> (String, String) {
    let lines: Vec<&str> = yaml.lines().collect();
    let wasm = lines
        .iter()
        .position(|l| l.contains("envoy.extensions.filters.http.wasm.v3.Wasm"))
        .expect("envoy.yaml has a wasm filter");
    let value = (wasm..lines.len())
        .find(|&i| lines[i].trim() == "value: |")
        .expect("the wasm filter's configuration has `value: |`");
    let value_indent = indent_of(lines[value]);
    let mut end = value + 1;
    while end < lines.len()
        && (lines[end].trim().is_empty() || indent_of(lines[end]) > value_indent)
    {
        end += 1;
    }
    while end > value + 1 && lines[end - 1].trim().is_empty() {
        end -= 1;
    }
    let block: String = lines[value + 1..end]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    let indent = " ".repeat(indent_of(lines[value + 1]));
    (block, indent)
}

pub fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listener of every shipped Envoy config gets the setting once, at its own level.
    #[test]
    fn each_listener_of_the_shipped_configs_binds_without_reuse_port() {
        for (file, listeners) in [("envoy/envoy.yaml", 1), ("envoy/cluster/envoy.yaml", 2)] {
            let config = fs::read_to_string(root().join(file)).expect("read config");
            let edited = without_reuse_port(&config);
            assert_eq!(
                edited.matches("enable_reuse_port: false").count(),
                listeners,
                "{file}"
            );
            let lines: Vec<&str> = edited.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                if line.trim_start() == "enable_reuse_port: false" {
                    let item = lines[i - 1];
                    assert!(item.trim_start().starts_with("- name:"), "{file}: {item}");
                    assert_eq!(indent_of(line), indent_of(item) + 2, "{file}");
                }
            }
            assert_eq!(edited.replace("    enable_reuse_port: false\n", ""), config);
        }
    }

    /// A server is told apart from another process that merely answers on its port: only the
    /// process holding the listening socket is said to listen on it.
    #[test]
    fn only_the_process_holding_the_socket_listens_on_its_port() {
        let dir = WorkDir::new("procs-listens-on");
        let port = free_port();
        let script = format!(
            "import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', {port}))\ns.listen()\ntime.sleep(30)"
        );
        let server = Process::spawn(
            "python3",
            Command::new("python3").args(["-c", &script]),
            dir.file("listener.log"),
        );
        let other = Process::spawn(
            "sleep",
            Command::new("sleep").arg("30"),
            dir.file("sleep.log"),
        );
        wait_for("the listener to hold its port", START_TIMEOUT, || {
            server.listens_on(port).then_some(())
        });
        assert!(!other.listens_on(port), "a process without the socket");
        assert!(!server.listens_on(port.wrapping_add(1)), "another port");
    }
}
