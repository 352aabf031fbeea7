//! What a bench run measures and for how long: `make bench` (full) or `--quick`.

use std::path::PathBuf;

use e2e::root;

pub struct Settings {
    pub quick: bool,
    /// `--only a,b`: just these throughput scenarios, usage accuracy rows and busy-machine
    /// rows, no other accuracy runs (for measuring a change by hand; the report then says
    /// what it lacks).
    pub only: Option<Vec<String>>,
    pub out: PathBuf,
    /// Rounds of the throughput scenarios (each figure is the median over them; `--rounds N`
    /// for more, fewer than 3 fail the run's check), the length
    /// of each measured wrk run, and of the one warm-up run per scenario before the first round.
    pub rounds: usize,
    pub wrk_s: u64,
    pub warmup_s: u64,
    pub threads: u32,
    pub connections: u32,
    /// The accuracy runs: length, connections per replica, the limit.
    pub accuracy_s: f64,
    pub accuracy_conns: usize,
    pub overload_s: f64,
    pub overload_conns: usize,
    pub capacity: u64,
    pub rate: f64,
    /// Bridge timeout of the throughput scenarios (the shipped default).
    pub timeout_ms: u64,
}

impl Settings {
    pub fn from_args() -> Settings {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let env_quick = std::env::var("BENCH_QUICK")
            .map(|v| !v.is_empty() && v != "0")
            .unwrap_or(false);
        let quick = env_quick || args.iter().any(|a| a == "--quick");
        let value_of = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
        };
        let out = value_of("--out").map(PathBuf::from).unwrap_or_else(|| {
            root().join(if quick {
                "target/bench-quick"
            } else {
                "target/bench"
            })
        });
        let only = value_of("--only").map(|list| list.split(',').map(str::to_string).collect());
        Settings {
            quick,
            only,
            out,
            rounds: value_of("--rounds")
                .and_then(|n| n.parse().ok())
                .unwrap_or(if quick { 3 } else { 7 }),
            wrk_s: if quick { 1 } else { 2 },
            warmup_s: if quick { 0 } else { 2 },
            threads: 2,
            connections: 32,
            // Not a whole number of seconds: the window algorithms' allowance is a step function of
            // the span, whose start and end are known to a few ms, so keep the span off the steps.
            accuracy_s: if quick { 1.5 } else { 10.5 },
            accuracy_conns: 8,
            overload_s: if quick { 2.0 } else { 20.0 },
            overload_conns: 4,
            capacity: 100,
            rate: 100.0,
            timeout_ms: 150,
        }
    }

    /// Whether throughput scenario `name` runs (`--only` names the ones that do).
    pub fn wants(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == name))
    }
}
