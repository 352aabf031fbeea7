//! What a bench run measures and for how long: `make bench` (full) or `--quick`.

use std::path::PathBuf;

use e2e::root;

pub struct Settings {
    pub quick: bool,
    /// `--only a,b`: just these throughput scenarios, override, usage and concurrency accuracy
    /// rows and busy-machine rows, no other accuracy runs (for measuring a change by hand; the
    /// report then says what it lacks).
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

/// What `--help` prints, and an unknown or malformed flag.
pub const USAGE: &str = "usage: bench [--quick] [--out DIR] [--only a,b,...] [--rounds N]
  --quick        every part, short (also BENCH_QUICK=1); output in target/bench-quick
  --out DIR      write the report there (default target/bench, or target/bench-quick)
  --only a,b     just these throughput scenarios, override, usage and concurrency
                 accuracy rows and busy-machine rows; `cluster`: the Redis Cluster section
  --rounds N     rounds of the throughput scenarios (default 7, 3 with --quick; at least 3)
  --help         this text";

/// The flags as given.
#[derive(Debug, Default, PartialEq)]
struct Flags {
    quick: bool,
    out: Option<PathBuf>,
    only: Option<Vec<String>>,
    rounds: Option<usize>,
    help: bool,
}

/// Reads the command line; Err says what is wrong with it.
fn flags(args: &[String]) -> Result<Flags, String> {
    let mut flags = Flags::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .cloned()
                .ok_or_else(|| format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--quick" => flags.quick = true,
            "--help" | "-h" => flags.help = true,
            "--out" => flags.out = Some(PathBuf::from(value()?)),
            "--only" => flags.only = Some(value()?.split(',').map(str::to_string).collect()),
            "--rounds" => {
                let text = value()?;
                let n = text
                    .parse()
                    .map_err(|_| format!("--rounds {text}: not a whole number"))?;
                flags.rounds = Some(n);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(flags)
}

impl Settings {
    /// The settings of this run, from the command line; `--help` prints the usage and exits,
    /// a bad command line prints it with what is wrong and exits with status 2, before
    /// anything starts.
    pub fn from_args() -> Settings {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let flags = match flags(&args) {
            Ok(flags) if flags.help => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            Ok(flags) => flags,
            Err(why) => {
                eprintln!("bench: {why}\n{USAGE}");
                std::process::exit(2);
            }
        };
        let env_quick = std::env::var("BENCH_QUICK")
            .map(|v| !v.is_empty() && v != "0")
            .unwrap_or(false);
        let quick = env_quick || flags.quick;
        let out = flags.out.unwrap_or_else(|| {
            root().join(if quick {
                "target/bench-quick"
            } else {
                "target/bench"
            })
        });
        Settings {
            quick,
            only: flags.only,
            out,
            rounds: flags.rounds.unwrap_or(if quick { 3 } else { 7 }),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn flags_are_read_and_anything_else_is_refused() {
        let f = flags(&args("--quick --only a,b --rounds 5 --out /tmp/x")).unwrap();
        assert!(f.quick && !f.help);
        assert_eq!(f.only, Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(f.rounds, Some(5));
        assert_eq!(f.out, Some(PathBuf::from("/tmp/x")));
        assert!(flags(&args("--help")).unwrap().help);
        assert_eq!(
            flags(&args("--fast")),
            Err("unknown argument --fast".into())
        );
        assert_eq!(
            flags(&args("--rounds")),
            Err("--rounds needs a value".into())
        );
        assert_eq!(
            flags(&args("--rounds many")),
            Err("--rounds many: not a whole number".into())
        );
        assert_eq!(flags(&[]), Ok(Flags::default()));
    }
}
