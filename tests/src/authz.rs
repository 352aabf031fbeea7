//! A small HTTP authorization service for Envoy's `ext_authz` filter (its `http_service`): on a
//! free loopback port, HTTP/1.1 with keep-alive, a thread per connection, stopped (every
//! thread joined, every socket closed) when dropped.
//!
//! Each check request is answered from the API key it carries (`x-api-key`, the one header the
//! shipped example forwards):
//!
//! | the check carries | answer |
//! |---|---|
//! | no `x-api-key` | 200, no caller headers: an anonymous request, let through |
//! | a key of a [`Caller`] | 200 with `x-caller-id` and, if the caller has one, `x-caller-plan` |
//! | any other key | 403 |
//!
//! It counts the checks it answered, per key, and remembers every request header name it saw,
//! so a test can tell what Envoy asked and forwarded.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use crate::server::{lock, read_simple_request, Server, Service};

/// The header a check's API key is read from.
pub const API_KEY: &str = "x-api-key";
/// The answer headers the example turns into dynamic metadata.
pub const CALLER_ID: &str = "x-caller-id";
pub const CALLER_PLAN: &str = "x-caller-plan";
/// A check request carrying a body longer than this is refused (a check has none).
const MAX_BODY: usize = 1 << 20;

/// An API key the service knows, and who it belongs to.
#[derive(Debug, Clone)]
pub struct Caller {
    pub key: String,
    pub id: String,
    pub plan: Option<String>,
}

impl Caller {
    pub fn new(key: &str, id: &str, plan: Option<&str>) -> Caller {
        Caller {
            key: key.into(),
            id: id.into(),
            plan: plan.map(Into::into),
        }
    }
}

/// What the service answered so far.
#[derive(Debug, Default, Clone)]
pub struct Checks {
    /// Checks without an API key (allowed as anonymous).
    pub anonymous: u64,
    /// Checks per API key, known or not.
    pub by_key: HashMap<String, u64>,
    /// Checks refused (403).
    pub refused: u64,
    /// Every request header name seen, lower case.
    pub header_names: BTreeSet<String>,
}

impl Checks {
    /// Every check answered.
    pub fn total(&self) -> u64 {
        self.anonymous + self.by_key.values().sum::<u64>()
    }
}

struct Shared {
    callers: Vec<Caller>,
    stop: AtomicBool,
    checks: Mutex<Checks>,
}

impl Service for Shared {
    fn stop_flag(&self) -> &AtomicBool {
        &self.stop
    }
    fn serve(&self, stream: TcpStream) -> std::io::Result<()> {
        serve(stream, self)
    }
}

/// The service. Dropping it stops it.
pub struct AuthzService {
    pub port: u16,
    server: Server<Shared>,
}

impl AuthzService {
    /// Starts it on a free loopback port, knowing `callers`; it accepts connections when this
    /// returns.
    pub fn start(callers: Vec<Caller>) -> AuthzService {
        let server = Server::start(
            "the authorization service",
            Shared {
                callers,
                stop: AtomicBool::new(false),
                checks: Mutex::new(Checks::default()),
            },
        );
        AuthzService {
            port: server.port,
            server,
        }
    }

    /// What it answered so far.
    pub fn checks(&self) -> Checks {
        lock(&self.server.service.checks).clone()
    }
}

/// Answers checks off one connection until Envoy closes it.
fn serve(stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_simple_request(&mut reader, &shared.stop, MAX_BODY)? {
        let answer = answer(request.header(API_KEY), shared);
        {
            let mut checks = lock(&shared.checks);
            checks
                .header_names
                .extend(request.headers.iter().map(|(n, _)| n.clone()));
        }
        writer.write_all(&answer)?;
        if request.closes() {
            return Ok(());
        }
    }
    Ok(())
}

/// The raw answer to a check carrying API key `key`, counted.
fn answer(key: Option<&str>, shared: &Shared) -> Vec<u8> {
    let mut checks = lock(&shared.checks);
    let Some(key) = key else {
        checks.anonymous += 1;
        return b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec();
    };
    *checks.by_key.entry(key.to_string()).or_default() += 1;
    match shared.callers.iter().find(|c| c.key == key) {
        Some(caller) => {
            let mut head = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n{CALLER_ID}: {}\r\n",
                caller.id
            );
            if let Some(plan) = &caller.plan {
                head.push_str(&format!("{CALLER_PLAN}: {plan}\r\n"));
            }
            head.push_str("\r\n");
            head.into_bytes()
        }
        None => {
            checks.refused += 1;
            b"HTTP/1.1 403 Forbidden\r\ncontent-length: 16\r\ncontent-type: text/plain\r\n\r\nunknown API key\n"
                .to_vec()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::get;

    #[test]
    fn keys_are_answered_with_their_caller_and_the_service_stops() {
        let service = AuthzService::start(vec![
            Caller::new("k-pro", "acme", Some("pro")),
            Caller::new("k-none", "dan", None),
        ]);
        let port = service.port;
        let r = get(port, "/authz/x", &[(API_KEY, b"k-pro")]).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header(CALLER_ID), Some("acme"));
        assert_eq!(r.header(CALLER_PLAN), Some("pro"));
        let r = get(port, "/authz/x", &[(API_KEY, b"k-none")]).unwrap();
        assert_eq!((r.status, r.header(CALLER_PLAN)), (200, None));
        assert_eq!(r.header(CALLER_ID), Some("dan"));
        let r = get(port, "/authz/x", &[(CALLER_ID, b"acme")]).unwrap();
        assert_eq!((r.status, r.header(CALLER_ID)), (200, None), "anonymous");
        let r = get(port, "/authz/x", &[(API_KEY, b"made-up")]).unwrap();
        assert_eq!(r.status, 403);
        let checks = service.checks();
        assert_eq!(
            (checks.total(), checks.anonymous, checks.refused),
            (4, 1, 1)
        );
        assert!(checks.header_names.contains(CALLER_ID));
        drop(service);
        assert!(get(port, "/", &[]).is_err(), "stopped");
    }
}
