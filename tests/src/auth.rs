//! Support for the tests of the auth recipes (envoy/examples/jwt_plans.yaml and
//! ext_authz_plans.yaml): two Envoys of two workers each sharing one Redis, requests spread
//! over both and counted by status, tokens minted by tests/auth/mint_tokens.py, and edits that
//! swap one block of a shipped YAML file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::get;
use crate::http::Response;
use crate::keys::Keys;
use crate::procs::{indent_of, Envoy, Redis, Webdis, WorkDir};

/// Redis, one Webdis per Envoy (as each replica would have its own) and two Envoys of two
/// workers each from one shipped config. Dropped in field order: Envoys first, Redis last.
pub struct Fleet {
    pub envoys: Vec<Envoy>,
    pub webdis: Vec<Webdis>,
    pub redis: Redis,
    pub dir: WorkDir,
}

impl Fleet {
    /// Starts the fleet from `file` with `edits` (each `from` must occur exactly once); the
    /// two Envoys start at once (each compiles the filter, the longest part of a start).
    pub fn start(name: &str, file: &Path, edits: &[(String, String)]) -> Fleet {
        let dir = WorkDir::new(name);
        let redis = Redis::start(&dir);
        let webdis: Vec<Webdis> = (0..2).map(|_| Webdis::start(&dir, redis.port)).collect();
        let edits: Vec<(&str, &str)> = edits
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let envoys = std::thread::scope(|scope| {
            let starts: Vec<_> = webdis
                .iter()
                .map(|w| {
                    let (dir, edits) = (&dir, &edits);
                    scope.spawn(move || Envoy::start_file_with(dir, file, w.port, edits))
                })
                .collect();
            starts
                .into_iter()
                .map(|s| s.join().expect("an Envoy started"))
                .collect()
        });
        Fleet {
            envoys,
            webdis,
            redis,
            dir,
        }
    }

    /// Request number `i`: `GET path` through Envoy `i % 2`.
    pub fn send(&self, i: usize, path: &str, headers: &[(&str, &[u8])]) -> Response {
        let envoy = &self.envoys[i % self.envoys.len()];
        get(envoy.port, path, headers).expect("an answer through envoy")
    }

    /// `n` requests `GET path` with `headers`, alternating Envoys, sent by `threads` clients
    /// at once (each request on its own connection, so both workers of each Envoy take some).
    pub fn burst(&self, n: usize, threads: usize, path: &str, headers: &[(&str, &[u8])]) -> Tally {
        self.burst_with(n, threads, |_| (path.to_string(), headers.to_vec()))
    }

    /// Like [`Fleet::burst`], request number `i` being `GET` of what `request(i)` gives (a
    /// path and headers).
    pub fn burst_with<'h>(
        &self,
        n: usize,
        threads: usize,
        request: impl Fn(usize) -> (String, Vec<(&'h str, &'h [u8])>) + Sync,
    ) -> Tally {
        let request = &request;
        let answers: Vec<Response> = std::thread::scope(|scope| {
            let clients: Vec<_> = (0..threads)
                .map(|t| {
                    scope.spawn(move || {
                        (t..n)
                            .step_by(threads)
                            .map(|i| {
                                let (path, headers) = request(i);
                                self.send(i, &path, &headers)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            clients
                .into_iter()
                .flat_map(|c| c.join().expect("a client thread"))
                .collect()
        });
        Tally::of(&answers)
    }

    /// The Redis keys of the filter configuration the Envoys run (both run the same).
    pub fn keys(&self) -> Keys {
        self.envoys[0].keys()
    }

    /// Every key in Redis.
    pub fn redis_keys(&self) -> BTreeSet<String> {
        let items = self.redis.admin().cmd(&["KEYS", "*"]).unwrap().items();
        items.iter().map(|k| k.text()).collect()
    }

    /// A counter or gauge from /stats, summed over both Envoys.
    pub fn stat(&self, full_name: &str) -> u64 {
        self.envoys.iter().map(|e| e.stat(full_name)).sum()
    }

    /// A filter counter (`wasmcustom.NAME`), summed over both Envoys.
    pub fn counter(&self, name: &str) -> u64 {
        self.stat(&format!("wasmcustom.{name}"))
    }

    /// Connections each worker of each Envoy accepted on the listener, Envoy by Envoy.
    pub fn connections_per_worker(&self) -> Vec<Vec<u64>> {
        self.envoys
            .iter()
            .map(|e| {
                (0..2)
                    .map(|w| {
                        e.stat(&format!(
                            "listener.127.0.0.1_{}.worker_{w}.downstream_cx_total",
                            e.port
                        ))
                    })
                    .collect()
            })
            .collect()
    }
}

/// Answers counted by status, and the `x-ratelimit-limit` values of the decided ones.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    pub statuses: BTreeMap<u16, usize>,
    /// `x-ratelimit-limit` of each answer that carries one, counted.
    pub limits: BTreeMap<String, usize>,
}

impl Tally {
    pub fn of(answers: &[Response]) -> Tally {
        let mut tally = Tally::default();
        for r in answers {
            *tally.statuses.entry(r.status).or_default() += 1;
            if let Some(limit) = r.header("x-ratelimit-limit") {
                *tally.limits.entry(limit.to_string()).or_default() += 1;
            }
        }
        tally
    }

    /// The statuses as `(status, count)` pairs, in status order.
    pub fn statuses(&self) -> Vec<(u16, usize)> {
        self.statuses.iter().map(|(s, n)| (*s, *n)).collect()
    }
}

/// The text of the block that starts at the one line reading `first` (trimmed): that line and
/// every following line indented deeper, blank lines inside included, each ending in `\n`.
/// For an edit that swaps a whole block of a shipped YAML file for the test's own.
pub fn yaml_block(yaml: &str, first: &str) -> String {
    let lines: Vec<&str> = yaml.lines().collect();
    let starts: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].trim() == first)
        .collect();
    assert_eq!(starts.len(), 1, "{first:?} is not on exactly one line");
    let start = starts[0];
    let indent = indent_of(lines[start]);
    let mut end = start + 1;
    while end < lines.len() && (lines[end].trim().is_empty() || indent_of(lines[end]) > indent) {
        end += 1;
    }
    while end > start + 1 && lines[end - 1].trim().is_empty() {
        end -= 1;
    }
    lines[start..end].iter().map(|l| format!("{l}\n")).collect()
}

/// Tokens from tests/auth/mint_tokens.py: the JWKS that verifies the valid ones, and each
/// token by the script's name for it.
pub struct Minted {
    pub jwks: String,
    pub tokens: BTreeMap<String, String>,
}

impl Minted {
    /// `Authorization: Bearer` value of token `name`.
    pub fn bearer(&self, name: &str) -> Vec<u8> {
        let token = self
            .tokens
            .get(name)
            .unwrap_or_else(|| panic!("mint_tokens.py made no token {name:?}"));
        format!("Bearer {token}").into_bytes()
    }
}

/// Runs tests/auth/mint_tokens.py once, with the .venv's Python (PyJWT and cryptography,
/// installed by `make setup-auth`).
pub fn mint_tokens(issuer: &str, audience: &str) -> Minted {
    let python = crate::python::venv_python("jwt, cryptography", "setup-auth");
    let args = [issuer.to_string(), audience.to_string()];
    let out = crate::python::run_script(&python, "tests/auth/mint_tokens.py", &args);
    let json: serde_json::Value = serde_json::from_str(&out).expect("mint_tokens.py prints JSON");
    let jwks = json["jwks"].as_str().expect("a jwks string").to_string();
    let tokens = json["tokens"]
        .as_object()
        .expect("a tokens object")
        .iter()
        .map(|(name, t)| (name.clone(), t.as_str().expect("a token").to_string()))
        .collect();
    Minted { jwks, tokens }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_its_line_and_the_lines_below_it() {
        let yaml = "a:\n  b:\n    c: 1\n\n    d: 2\n  e: 3\n- name: x\n  f: 4\n- name: y\n";
        assert_eq!(yaml_block(yaml, "b:"), "  b:\n    c: 1\n\n    d: 2\n");
        assert_eq!(yaml_block(yaml, "- name: x"), "- name: x\n  f: 4\n");
        assert_eq!(yaml_block(yaml, "- name: y"), "- name: y\n");
    }

    #[test]
    fn tallies_count_statuses_and_limits() {
        let answer = |status: u16, limit: Option<&str>| Response {
            status,
            headers: limit
                .map(|l| vec![("x-ratelimit-limit".to_string(), l.to_string())])
                .unwrap_or_default(),
            body: Vec::new(),
        };
        let t = Tally::of(&[
            answer(200, Some("5")),
            answer(429, Some("5")),
            answer(401, None),
        ]);
        assert_eq!(t.statuses(), [(200, 1), (401, 1), (429, 1)]);
        assert_eq!(t.limits, BTreeMap::from([("5".to_string(), 2)]));
    }
}
