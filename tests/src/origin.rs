//! A small application behind Envoy for the limits charged by the response
//! (envoy/examples/charged_by_response.yaml): a login that answers 200 or 401 by the password,
//! and a search that prices each answer in a response header. On a free loopback port,
//! HTTP/1.1 with keep-alive, stopped when dropped; it logs what it answered so a test can
//! compare it with what Redis charged.
//!
//! | request | answer |
//! |---|---|
//! | `GET /login` with `x-user: NAME`, `x-password: right` | 200 |
//! | `GET /login` with any other password, or none | 401 |
//! | `GET /search?q=cached…` | 200, [`COST_HEADER`]: [`CACHED_COST`] |
//! | `GET /search?q=price-N` | 200, [`COST_HEADER`]: N (a price past the example's bounds) |
//! | `GET /search?q=…` (anything else) | 200, [`COST_HEADER`]: [`SCAN_COST`] |
//! | anything else | 404 |

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use crate::server::{lock, read_simple_request, Server, Service, SimpleRequest};

/// The response header that prices a search.
pub const COST_HEADER: &str = "x-search-cost";
/// The price of a search the application answers from its cache (`q` starting `cached`).
pub const CACHED_COST: u64 = 1;
/// The price of any other search (a full scan).
pub const SCAN_COST: u64 = 20;
/// The password every user logs in with.
pub const PASSWORD: &str = "right";

/// What the application answered.
#[derive(Debug, Default, Clone)]
pub struct Answered {
    /// Login answers by user: (200s, 401s).
    pub logins: BTreeMap<String, (u64, u64)>,
    /// The search prices it named, summed by API key (`x-api-key`).
    pub priced: BTreeMap<String, u64>,
}

struct Shared {
    stop: AtomicBool,
    answered: Mutex<Answered>,
}

impl Service for Shared {
    fn stop_flag(&self) -> &AtomicBool {
        &self.stop
    }
    fn serve(&self, stream: TcpStream) -> std::io::Result<()> {
        serve(stream, self)
    }
}

/// The application. Dropping it stops it.
pub struct Origin {
    pub port: u16,
    server: Server<Shared>,
}

impl Origin {
    pub fn start() -> Origin {
        let server = Server::start(
            "the application",
            Shared {
                stop: AtomicBool::new(false),
                answered: Mutex::new(Answered::default()),
            },
        );
        Origin {
            port: server.port,
            server,
        }
    }

    pub fn answered(&self) -> Answered {
        lock(&self.server.service.answered).clone()
    }
}

/// Answers requests off one connection until Envoy closes it.
fn serve(stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_simple_request(&mut reader, &shared.stop, 1 << 16)? {
        writer.write_all(answer(&request, shared).as_bytes())?;
        if request.closes() {
            return Ok(());
        }
    }
    Ok(())
}

fn answer(request: &SimpleRequest, shared: &Shared) -> String {
    let header = |name: &str| request.header(name);
    let target = request.target();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut answered = lock(&shared.answered);
    match path {
        "/login" => {
            let user = header("x-user").unwrap_or("").to_string();
            let right = header("x-password") == Some(PASSWORD);
            let counts = answered.logins.entry(user).or_default();
            if right {
                counts.0 += 1;
                plain(200, "OK", &[], "welcome\n")
            } else {
                counts.1 += 1;
                plain(401, "Unauthorized", &[], "wrong user or password\n")
            }
        }
        "/search" => {
            let q = query
                .split('&')
                .find_map(|p| p.strip_prefix("q="))
                .unwrap_or("");
            let cost = if let Some(price) = q.strip_prefix("price-") {
                price.parse().unwrap_or(0)
            } else if q.starts_with("cached") {
                CACHED_COST
            } else {
                SCAN_COST
            };
            let key = header("x-api-key").unwrap_or("").to_string();
            *answered.priced.entry(key).or_default() += cost;
            plain(200, "OK", &[(COST_HEADER, cost.to_string())], "results\n")
        }
        _ => plain(404, "Not Found", &[], "no such page\n"),
    }
}

fn plain(status: u16, reason: &str, extra: &[(&str, String)], body: &str) -> String {
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    format!("{head}\r\n{body}")
}
