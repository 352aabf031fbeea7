//! The operator's command, ratelimit-admin, run as a user runs it: the built binary, a config
//! file, a Redis URL, and what it prints and exits with.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::procs::{Redis, REDIS_TOOL};
use crate::root;

/// The release build of ratelimit-admin, the one docs/admin.md installs; `make admin-test`
/// builds it first (`make admin`).
pub fn admin_bin() -> PathBuf {
    let path = root().join("target/release/ratelimit-admin");
    assert!(
        path.exists(),
        "{} is missing: run `make admin` (make admin-test does) first",
        path.display()
    );
    path
}

/// What one run gave.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The JSON it printed (run with `--json`).
    pub fn json(&self) -> serde_json::Value {
        assert_eq!(self.code, 0, "{self:?}");
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

/// ratelimit-admin over one config file and one Redis URL.
pub struct Admin {
    pub config: PathBuf,
    pub redis: String,
    /// Who changes, for the audit stream (`--by`).
    pub by: String,
}

impl Admin {
    /// As the shipped ratelimit-admin user, on `redis`, with the filter config `config`.
    pub fn new(redis: &Redis, config: &Path) -> Admin {
        Admin {
            config: config.to_path_buf(),
            redis: redis.url_as(REDIS_TOOL.0, REDIS_TOOL.1),
            by: "test-operator".to_string(),
        }
    }

    /// Runs `args` with `--config`, `--redis` and `--by` from the environment (as an operator
    /// sets them), so a test's words are only the command's own.
    pub fn run(&self, args: &[&str]) -> Run {
        let mut command = self.command(args);
        command.arg("--by").arg(&self.by);
        self.finish(args, command)
    }

    /// Runs `args` without `--by`, with `$LOGNAME` and `$USER` unset but for `env`: the
    /// tool names who makes a change itself.
    pub fn run_unnamed(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut command = self.command(args);
        command
            .env_remove("LOGNAME")
            .env_remove("USER")
            .envs(env.iter().copied());
        self.finish(args, command)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(admin_bin());
        command
            .args(args)
            .env("RATELIMIT_ADMIN_CONFIG", &self.config)
            .env("RATELIMIT_ADMIN_REDIS", &self.redis);
        command
    }

    fn finish(&self, args: &[&str], mut command: Command) -> Run {
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("run ratelimit-admin: {e}"));
        let run = Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        assert!(
            !run.stderr.contains("panicked"),
            "ratelimit-admin {args:?} panicked: {}",
            run.stderr
        );
        run
    }

    /// `args` with `--json`, which must succeed: the JSON it printed.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut with = args.to_vec();
        with.push("--json");
        self.run(&with).json()
    }

    /// `args`, which must fail with exit status `code`: what it wrote on stderr.
    pub fn fails(&self, code: i32, args: &[&str]) -> String {
        let run = self.run(args);
        assert_eq!(
            (run.code, run.stdout.as_str()),
            (code, ""),
            "ratelimit-admin {args:?}: {run:?}"
        );
        run.stderr
    }
}
