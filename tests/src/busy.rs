//! A busy machine, as operators get one: CPU-bound neighbours sharing the cores (busy loops),
//! or a CPU limit on the proxy as Kubernetes sets one (a CFS quota through the cgroup v1 cpu
//! controller). Both are undone when dropped: the loops killed by PID, the cgroup removed.

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::procs::{Process, WorkDir};

/// Processes that spin on the CPU until dropped (each also stops by itself after `longest`,
/// should the test die without dropping it).
pub struct BusyLoops {
    loops: Vec<Process>,
}

impl BusyLoops {
    /// `n` busy loops.
    pub fn start(dir: &WorkDir, n: usize, longest: Duration) -> BusyLoops {
        let script = format!(
            "import time\nend = time.time() + {}\nwhile time.time() < end:\n    pass\n",
            longest.as_secs().max(1)
        );
        let loops = (0..n)
            .map(|i| {
                Process::spawn(
                    "busy loop",
                    Command::new("python3").args(["-c", &script]),
                    dir.file(&format!("busy-{i}.log")),
                )
            })
            .collect();
        BusyLoops { loops }
    }

    pub fn len(&self) -> usize {
        self.loops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.loops.is_empty()
    }

    /// How many still run (each should, until dropped).
    pub fn running(&mut self) -> usize {
        let mut running = 0;
        for process in &mut self.loops {
            running += usize::from(process.exited().is_none());
        }
        running
    }
}

/// The cgroup v1 cpu controller's mount, where it is.
const CPU_CGROUPS: &str = "/sys/fs/cgroup/cpu";

/// A cgroup with a CPU quota (`quota_us` of CPU time per `period_us`), removed when dropped
/// (once its processes have gone: drop it after them).
pub struct CpuQuota {
    path: PathBuf,
}

impl CpuQuota {
    /// A new cgroup `name` limited to `quota_us` per `period_us` (60,000 per 100,000: 0.6
    /// CPU). Err says why it cannot be made here (no cgroup v1 cpu controller, not root).
    pub fn new(name: &str, quota_us: u64, period_us: u64) -> Result<CpuQuota, String> {
        let base = PathBuf::from(CPU_CGROUPS);
        if !base.join("cpu.cfs_quota_us").exists() {
            return Err(format!(
                "no cgroup v1 cpu controller at {CPU_CGROUPS} (cpu.cfs_quota_us)"
            ));
        }
        let path = base.join(format!("{name}-{}", std::process::id()));
        fs::create_dir_all(&path).map_err(|e| format!("mkdir {}: {e}", path.display()))?;
        let quota = CpuQuota { path };
        quota.write("cpu.cfs_period_us", period_us)?;
        quota.write("cpu.cfs_quota_us", quota_us)?;
        Ok(quota)
    }

    fn write(&self, file: &str, value: u64) -> Result<(), String> {
        let path = self.path.join(file);
        fs::write(&path, value.to_string()).map_err(|e| format!("write {}: {e}", path.display()))
    }

    /// Puts process `pid`, every thread of it, under the quota.
    pub fn add(&self, pid: u32) -> Result<(), String> {
        self.write("cgroup.procs", u64::from(pid))
    }

    /// How many periods the quota throttled its processes so far (cpu.stat `nr_throttled`).
    pub fn throttled_periods(&self) -> u64 {
        fs::read_to_string(self.path.join("cpu.stat"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        // Processes still inside go back to the root group first, or rmdir fails.
        if let Ok(procs) = fs::read_to_string(self.path.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = fs::write(PathBuf::from(CPU_CGROUPS).join("cgroup.procs"), pid);
            }
        }
        let _ = fs::remove_dir(&self.path);
    }
}

/// The load of the busy-machine runs: on each port, `conns_per_port` keep-alive connections,
/// each sending its next request as soon as the last is answered. Even connections spend the
/// hot key on `/hot` with costs 1 to 5 in turn (`x-cost`); odd ones go through `accounts`
/// keys on `/accounts`, one unit each.
pub struct MixedLoad {
    pub ports: Vec<u16>,
    pub conns_per_port: usize,
    pub duration: Duration,
    pub hot_key: String,
    pub accounts: usize,
}

/// One response: on `/hot` or not, the units it cost, its status (0: no answer), and whether
/// the limiter decided it (rate-limit headers) rather than its failure policy.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub hot: bool,
    pub cost: u64,
    pub status: u16,
    pub decided: bool,
}

/// Every answer of a load, and how long it ran from before its first request to after its
/// last answer (a span containing every decision).
pub struct MixedResult {
    pub answers: Vec<Answer>,
    pub span: Duration,
}

impl MixedResult {
    /// Units allowed (status 200) on `/hot` (`hot`) or on `/accounts`.
    pub fn allowed_units(&self, hot: bool) -> u64 {
        self.answers
            .iter()
            .filter(|a| a.hot == hot && a.status == 200)
            .map(|a| a.cost)
            .sum()
    }

    pub fn count(&self, hot: bool, status: u16) -> u64 {
        self.answers
            .iter()
            .filter(|a| a.hot == hot && a.status == status)
            .count() as u64
    }

    /// Units allowed without a decision (let through by the failure policy).
    pub fn undecided_units(&self, hot: bool) -> u64 {
        self.answers
            .iter()
            .filter(|a| a.hot == hot && a.status == 200 && !a.decided)
            .map(|a| a.cost)
            .sum()
    }
}

/// The name of account `n` (its `x-api-key`).
pub fn account(n: usize) -> String {
    format!("account-{n}")
}

impl MixedLoad {
    pub fn run(&self) -> MixedResult {
        use std::io::{BufReader, Write};
        use std::net::TcpStream;
        use std::time::Instant;
        let started = Instant::now();
        let until = started + self.duration;
        let answers = std::thread::scope(|scope| {
            let mut clients = Vec::new();
            for (p, &port) in self.ports.iter().enumerate() {
                for c in 0..self.conns_per_port {
                    let n = p * self.conns_per_port + c;
                    clients.push(scope.spawn(move || {
                        let hot = c % 2 == 0;
                        let mut answers = Vec::new();
                        let mut conn: Option<BufReader<TcpStream>> = None;
                        let mut i = n * 7919;
                        while Instant::now() < until {
                            i += 1;
                            let cost = if hot { 1 + (i % 5) as u64 } else { 1 };
                            let request = if hot {
                                format!("GET /hot HTTP/1.1\r\nHost: x\r\nx-api-key: {}\r\nx-cost: {cost}\r\n\r\n", self.hot_key)
                            } else {
                                let key = account(i % self.accounts.max(1));
                                format!("GET /accounts HTTP/1.1\r\nHost: x\r\nx-api-key: {key}\r\n\r\n")
                            };
                            let stream = match conn.take() {
                                Some(stream) => Some(stream),
                                // A request never answered would hold the run.
                                None => TcpStream::connect(("127.0.0.1", port))
                                    .and_then(|s| {
                                        s.set_read_timeout(Some(Duration::from_secs(10)))?;
                                        Ok(s)
                                    })
                                    .ok()
                                    .map(BufReader::new),
                            };
                            let Some(mut stream) = stream else {
                                answers.push(Answer { hot, cost, status: 0, decided: false });
                                continue;
                            };
                            let sent = stream.get_mut().write_all(request.as_bytes());
                            match sent.and_then(|()| crate::http::read_kept(&mut stream)) {
                                Ok(kept) => {
                                    answers.push(Answer {
                                        hot,
                                        cost,
                                        status: kept.status,
                                        decided: kept.decided,
                                    });
                                    if kept.keep {
                                        conn = Some(stream);
                                    }
                                }
                                Err(_) => answers.push(Answer {
                                    hot,
                                    cost,
                                    status: 0,
                                    decided: false,
                                }),
                            }
                        }
                        answers
                    }));
                }
            }
            clients
                .into_iter()
                .flat_map(|c| c.join().unwrap_or_default())
                .collect()
        });
        MixedResult {
            answers,
            span: started.elapsed(),
        }
    }
}
