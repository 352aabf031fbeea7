//! `--probe URL`: the calls the filter makes, made against a live Webdis with a configuration's
//! credentials ([`ratelimit_core::bridge::Probe`] says what to send and what each answer
//! means), and a verdict: ready, refused (a setting is wrong, named), or failing (the bridge
//! is down or answers something else). Plain HTTP/1.1 over a socket: Webdis speaks nothing
//! else, and the checker needs no HTTP crate for four requests.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratelimit_core::bridge::{
    BridgeFailure, BridgeReply, BridgeRequest, CallKind, MisconfigCause, Probe, PROBE_TAG,
};
use ratelimit_core::config::Config;
use ratelimit_core::time::UnixNs;

/// How long a connection, a write or a read may take: far more than a healthy bridge needs.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// A reply longer than this is not one of Webdis's to these calls.
const MAX_REPLY_BYTES: u64 = 1 << 20;

/// Where Webdis listens: `http://HOST[:PORT][/]` (port 80 by default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
}

impl Target {
    pub fn parse(url: &str) -> Result<Target, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            format!("{url}: the bridge URL must start with http:// (Webdis speaks plain HTTP)")
        })?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains('/') || authority.contains('@') {
            return Err(format!(
                "{url}: the bridge URL is http://HOST[:PORT], without a path or credentials (they come from the config)"
            ));
        }
        // `[v6]:port`, `[v6]`, `host:port` or `host`.
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => {
                let port = port
                    .parse::<u16>()
                    .map_err(|_| format!("{url}: bad port {port:?}"))?;
                (host, port)
            }
            _ => (authority, 80),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("{url}: no host"));
        }
        Ok(Target {
            host: host.to_string(),
            port,
        })
    }
}

/// What a probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Every call the filter makes was answered as it needs.
    Ready,
    /// The bridge could not be reached, or answered something else (an outage, not a setting).
    Failing,
    /// The bridge refused a call: a setting is wrong.
    Refused,
}

/// One HTTP exchange: the reply's status and body, or why there was none.
fn exchange(
    target: &Target,
    config: &Config,
    request: &BridgeRequest,
) -> Result<(u16, Vec<u8>), String> {
    let addresses = (target.host.as_str(), target.port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", target.host))?;
    let mut last = format!("no address for {}", target.host);
    let mut stream = None;
    for address in addresses {
        match TcpStream::connect_timeout(&address, IO_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("cannot connect to {address}: {e}"),
        }
    }
    let mut stream = stream.ok_or(last)?;
    let io = |e: std::io::Error| format!("{}:{}: {e}", target.host, target.port);
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    // The filter's own headers: its authority and credentials. No `Connection: close`:
    // Webdis 0.1.9 then stops reading a body longer than a few kB (the script's) and never
    // answers; the reply is read by its length instead.
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\n",
        request.method, request.path, config.bridge.authority
    );
    if let Some(auth) = &config.bridge.authorization {
        head.push_str(&format!("Authorization: {auth}\r\n"));
    }
    let body = request.body.as_deref().unwrap_or_default();
    if request.body.is_some() {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).map_err(io)?;
    stream.write_all(body).map_err(io)?;
    // Read until the reply is whole: the connection stays open after it.
    let mut reply = Vec::new();
    let mut buffer = [0u8; 16 * 1024];
    loop {
        if let Some(whole) = whole_response(&reply) {
            return whole;
        }
        if reply.len() as u64 > MAX_REPLY_BYTES {
            return Err("the bridge's reply is too long".to_string());
        }
        match stream.read(&mut buffer).map_err(io)? {
            0 => {
                return parse_response(&reply, true).unwrap_or_else(|| {
                    Err("the bridge closed the connection before the end of its reply".to_string())
                })
            }
            n => reply.extend_from_slice(&buffer[..n]),
        }
    }
}

/// The reply in `reply`, once it holds all of it (by its length, or its last chunk).
fn whole_response(reply: &[u8]) -> Option<Result<(u16, Vec<u8>), String>> {
    parse_response(reply, false)
}

/// An HTTP/1.1 response: its status and body; None while `reply` does not hold all of it.
/// `ended`: the connection closed, so a body without a length ends here.
fn parse_response(reply: &[u8], ended: bool) -> Option<Result<(u16, Vec<u8>), String>> {
    let Some(end) = reply.windows(4).position(|w| w == b"\r\n\r\n") else {
        return ended.then(|| {
            Err("the bridge closed the connection before the end of a reply's headers".into())
        });
    };
    let head = String::from_utf8_lossy(&reply[..end]);
    let mut lines = head.split("\r\n");
    let Some(status) = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
    else {
        return Some(Err("the bridge's reply has no HTTP status line".into()));
    };
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse::<usize>().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        }
    }
    let rest = &reply[end + 4..];
    match (chunked, length) {
        (true, _) => match dechunk(rest) {
            Ok(Some(body)) => Some(Ok((status, body))),
            Ok(None) if !ended => None,
            Ok(None) => Some(Err("the bridge's chunked reply ended early".into())),
            Err(why) => Some(Err(why.into())),
        },
        (false, Some(n)) => match rest.get(..n) {
            Some(body) => Some(Ok((status, body.to_vec()))),
            None if !ended => None,
            None => Some(Err(
                "the bridge's reply is shorter than its Content-Length".into()
            )),
        },
        (false, None) => ended.then(|| Ok((status, rest.to_vec()))),
    }
}

/// A chunked body, decoded; None while its last chunk has not come.
fn dechunk(mut rest: &[u8]) -> Result<Option<Vec<u8>>, &'static str> {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let size = String::from_utf8_lossy(&rest[..line_end]);
        let size = size.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| "a chunk's size is not hex")?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(Some(body));
        }
        let (Some(chunk), Some(after)) = (rest.get(..size), rest.get(size + 2..)) else {
            return Ok(None);
        };
        body.extend_from_slice(chunk);
        rest = after;
    }
}

/// One step: sends `request`, and reads the reply with `read` (a reply that never came is
/// the bridge down).
fn step<T>(
    target: &Target,
    config: &Config,
    request: &BridgeRequest,
    read: impl FnOnce(BridgeReply<'_>) -> Result<T, BridgeFailure>,
) -> Result<T, StepError> {
    let (status, body) = exchange(target, config, request).map_err(StepError::Unreachable)?;
    read(BridgeReply {
        status: Some(status),
        body: &body,
    })
    .map_err(StepError::Bridge)
}

enum StepError {
    Unreachable(String),
    Bridge(BridgeFailure),
}

impl StepError {
    /// Its line, and what it makes of the probe.
    fn report(&self) -> (String, Verdict) {
        match self {
            StepError::Unreachable(why) => (format!("FAILED: {why}"), Verdict::Failing),
            StepError::Bridge(failure) if failure.misconfiguration().is_some() => {
                (format!("REFUSED: {failure}"), Verdict::Refused)
            }
            StepError::Bridge(failure) => (format!("FAILED: {failure}"), Verdict::Failing),
        }
    }
}

/// What a probe found: the worst of its calls, and the cause of each refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub verdict: Verdict,
    pub causes: Vec<MisconfigCause>,
}

/// What a probe wrote and found so far.
struct Report<'a> {
    out: &'a mut String,
    found: Found,
}

impl Report<'_> {
    fn line(&mut self, text: String, found: Verdict) {
        self.out.push_str(&format!("  {text}\n"));
        self.found.verdict = self.found.verdict.max(found);
    }

    /// The step `what` failed with `error`.
    fn failed(&mut self, what: &str, error: &StepError) {
        let (text, found) = error.report();
        if let StepError::Bridge(failure) = error {
            if let Some(m) = failure.misconfiguration() {
                self.found.causes.push(m.cause);
            }
        }
        self.line(format!("{what}: {text}"), found);
    }
}

/// Probes the bridge at `target` with `config`'s credentials, writing a line per call to
/// `out` (each starting with two spaces), and says what it found.
pub fn probe(config: &Config, target: &Target, out: &mut String) -> Found {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let run = format!("{}-{now}", std::process::id());
    let probe = Probe::new(config, &run, UnixNs::from_ns(now));
    let mut report = Report {
        out,
        found: Found {
            verdict: Verdict::Ready,
            causes: Vec::new(),
        },
    };
    let (call, load, code) = match config.program.kind {
        CallKind::Function => ("FCALL", "FUNCTION LOAD", "library"),
        CallKind::Script => ("EVALSHA", "SCRIPT LOAD", "script"),
    };
    let reach =
        format!("{call} with bridge.username / bridge.password (the filter's decision call)");
    let reach = reach.as_str();
    let loaded = match step(target, config, &probe.reach(), Probe::read_reach) {
        Ok(loaded) => {
            let script = match loaded {
                true => format!("the {code} is loaded"),
                false => format!("the {code} is not loaded yet: the filter loads it"),
            };
            report.line(format!("{reach}: OK, {script}"), Verdict::Ready);
            loaded
        }
        Err(e) => {
            // Every other call would be refused or fail the same way.
            report.failed(reach, &e);
            return report.found;
        }
    };
    let load = format!("{load} (the filter loads its {code} after a Redis restart)");
    let load = load.as_str();
    let read_load = |r: BridgeReply<'_>| probe.read_script_load(r);
    let loaded = match step(target, config, &config.program.load(), read_load) {
        Ok(()) => {
            report.line(format!("{load}: OK"), Verdict::Ready);
            true
        }
        Err(e) => {
            report.failed(load, &e);
            loaded
        }
    };
    if !loaded {
        let text = format!("a decision: not tried, the {code} could not be loaded");
        report.line(text, Verdict::Ready);
        return report.found;
    }
    let decide = format!(
        "a decision of the config's {} limits on keys of the probe's own ({}{}:{run}:...)",
        probe.checks.len(),
        config.key_prefix,
        PROBE_TAG
    );
    let read_decide = |r: BridgeReply<'_>| probe.read_decide(r);
    let decision = match step(target, config, &probe.decide(), read_decide) {
        Ok(decision) => {
            report.line(format!("{decide}: OK"), Verdict::Ready);
            decision
        }
        Err(e) => {
            report.failed(&decide, &e);
            return report.found;
        }
    };
    let back = "giving back what it charged (as a lease's give-back, a concurrency hold's release)";
    let read_back = |r: BridgeReply<'_>| probe.read_give_back(r);
    match step(target, config, &probe.give_back(&decision), read_back) {
        Ok(()) => report.line(format!("{back}: OK"), Verdict::Ready),
        Err(e) => report.failed(back, &e),
    }
    report.found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_urls_are_host_and_port() {
        let t = |host: &str, port| {
            Ok(Target {
                host: host.to_string(),
                port,
            })
        };
        assert_eq!(Target::parse("http://127.0.0.1:7379"), t("127.0.0.1", 7379));
        assert_eq!(Target::parse("http://webdis/"), t("webdis", 80));
        assert_eq!(Target::parse("http://[::1]:7379"), t("::1", 7379));
        assert_eq!(Target::parse("http://[::1]"), t("::1", 80));
        for bad in [
            "https://webdis:7379",
            "127.0.0.1:7379",
            "http://",
            "http://webdis:7379/EVALSHA",
            "http://u:p@webdis:7379",
            "http://webdis:port",
            "http://:7379",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn replies_are_read_by_length_to_the_end_or_in_chunks() {
        let whole = |s: &str| parse_response(s.as_bytes(), false);
        let closed = |s: &str| parse_response(s.as_bytes(), true);
        assert_eq!(
            whole("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcdef"),
            Some(Ok((200, b"abc".to_vec())))
        );
        assert_eq!(
            whole("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"),
            Some(Ok((403, vec![])))
        );
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(whole(chunked), Some(Ok((200, b"abcde".to_vec()))));
        // Not whole yet: more is read; whole at the connection's end.
        for part in [
            "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc",
            "HTTP/1.1 200 OK\r\n",
            &chunked[..chunked.len() - 5],
            "HTTP/1.0 200 OK\r\n\r\n{}",
        ] {
            assert_eq!(whole(part), None, "{part:?}");
        }
        assert_eq!(
            closed("HTTP/1.0 200 OK\r\n\r\n{}"),
            Some(Ok((200, b"{}".to_vec())))
        );
        assert!(matches!(
            closed("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc"),
            Some(Err(_))
        ));
        assert!(matches!(closed("HTTP/1.1 200 OK\r\n"), Some(Err(_))));
        assert!(matches!(whole("garbage\r\n\r\n"), Some(Err(_))));
    }
}
