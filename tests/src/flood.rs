//! A flood of requests from distinct client addresses, as a spoofing attacker sends it: every
//! request carries an address of its own in `X-Forwarded-For` (10.0.0.0/8, numbered), sent
//! over many keep-alive connections so that a test can send 200,000 in seconds.

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Requests written before their responses are read, per connection. One: Envoy's HTTP/1
/// codec closes a connection whose pipelined responses pile up ("Too many responses queued"),
/// which happens when requests are answered without waiting (a breaker open, a deny-cache
/// hit) and 16 arrive at once; that is Envoy's flood protection, not the limiter's answer.
const PIPELINE: u32 = 1;

/// What a flood got back.
#[derive(Debug, Default, Clone)]
pub struct Flood {
    /// Responses by status code.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests that got no response (connection closed or timed out).
    pub lost: u64,
    /// Why connections broke (the first few).
    pub errors: Vec<String>,
    pub elapsed: Duration,
}

impl Flood {
    pub fn answered(&self) -> u64 {
        self.statuses.values().sum()
    }

    pub fn status(&self, code: u16) -> u64 {
        self.statuses.get(&code).copied().unwrap_or(0)
    }
}

/// The client address of flood request `n` (n < 2^24): 10.x.y.z.
pub fn flood_address(n: u32) -> String {
    format!("10.{}.{}.{}", (n >> 16) & 255, (n >> 8) & 255, n & 255)
}

/// Sends `GET /` once from each address `flood_address(first .. first + count)` to Envoy on
/// `port`, over `connections` connections. Gives up (counting the rest as lost) after
/// `time_limit`, so a broken limiter fails a test instead of hanging it.
pub fn flood(port: u16, first: u32, count: u32, connections: u32, time_limit: Duration) -> Flood {
    let started = Instant::now();
    let deadline = started + time_limit;
    let per = count.div_ceil(connections.max(1));
    let workers: Vec<_> = (0..connections.max(1))
        .map(|c| {
            let from = first + c * per;
            let to = (from + per).min(first + count);
            std::thread::spawn(move || flood_one(port, from, to, deadline))
        })
        .collect();
    let mut total = Flood::default();
    for worker in workers {
        let part = worker.join().unwrap_or_else(|_| Flood {
            lost: u64::from(per),
            ..Flood::default()
        });
        for (status, n) in part.statuses {
            *total.statuses.entry(status).or_default() += n;
        }
        total.lost += part.lost;
        total.errors.extend(part.errors);
    }
    total.errors.truncate(8);
    total.elapsed = started.elapsed();
    total
}

fn flood_one(port: u16, from: u32, to: u32, deadline: Instant) -> Flood {
    let mut out = Flood::default();
    let mut next = from;
    let mut conn: Option<BufReader<TcpStream>> = None;
    while next < to {
        if Instant::now() > deadline {
            out.lost += u64::from(to - next);
            break;
        }
        let stream = match conn.take() {
            Some(stream) => stream,
            None => match connect(port) {
                Ok(stream) => stream,
                Err(e) => {
                    out.errors.push(format!("connect: {e}"));
                    out.lost += u64::from(to - next);
                    break;
                }
            },
        };
        let batch = PIPELINE.min(to - next);
        match exchange(stream, next, batch) {
            Ok((stream, statuses)) => {
                for status in statuses {
                    *out.statuses.entry(status).or_default() += 1;
                }
                conn = Some(stream);
            }
            // A request whose response never came may have been decided: it is not resent.
            Err((answered, why)) => {
                for status in &answered {
                    *out.statuses.entry(*status).or_default() += 1;
                }
                out.lost += u64::from(batch) - answered.len() as u64;
                if out.errors.len() < 8 {
                    out.errors.push(why);
                }
            }
        }
        next += batch;
    }
    out
}

fn connect(port: u16) -> std::io::Result<BufReader<TcpStream>> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(BufReader::new(stream))
}

/// Statuses read, and the connection to go on with, or why it broke.
type Exchanged = Result<(BufReader<TcpStream>, Vec<u16>), (Vec<u16>, String)>;

/// Writes `batch` requests from addresses `first..`, reads their responses in order. On a
/// broken connection returns the statuses read so far and why it broke.
fn exchange(mut conn: BufReader<TcpStream>, first: u32, batch: u32) -> Exchanged {
    let mut requests = Vec::new();
    for n in first..first + batch {
        requests.extend_from_slice(
            format!(
                "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-For: {}\r\n\r\n",
                flood_address(n)
            )
            .as_bytes(),
        );
    }
    let mut statuses = Vec::with_capacity(batch as usize);
    if let Err(e) = conn.get_mut().write_all(&requests) {
        return Err((statuses, format!("write: {e}")));
    }
    for _ in 0..batch {
        match crate::http::read_kept(&mut conn) {
            Ok(crate::http::Kept { status, keep, .. }) => {
                statuses.push(status);
                if !keep && statuses.len() < batch as usize {
                    return Err((statuses, format!("connection: close after a {status}")));
                }
            }
            Err(e) => return Err((statuses, format!("read: {e}"))),
        }
    }
    Ok((conn, statuses))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flood_addresses_are_distinct_and_well_formed() {
        assert_eq!(flood_address(0), "10.0.0.0");
        assert_eq!(flood_address(199_999), "10.3.13.63");
        let all: std::collections::HashSet<String> = (0..70_000).map(flood_address).collect();
        assert_eq!(all.len(), 70_000);
        assert!(all.iter().all(|a| a.parse::<std::net::Ipv4Addr>().is_ok()));
    }
}
