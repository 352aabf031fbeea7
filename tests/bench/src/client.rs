//! Load for the accuracy and overload runs: keep-alive connections, one request at a time on
//! each, every response counted by status, and the instants of the first request sent and the
//! last response read, which bound every decision the limiter took.

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// One HTTP/1.1 keep-alive connection to Envoy sending `GET /` (or `post`'s request) with
/// the given headers.
pub struct KeepAlive {
    port: u16,
    request: Vec<u8>,
    /// The answers are streams (chunked): read to their last chunk.
    streamed: bool,
    conn: Option<BufReader<TcpStream>>,
}

impl KeepAlive {
    pub fn new(port: u16, headers: &[(String, String)], post: Option<&Post>) -> KeepAlive {
        let line = match post {
            Some(p) => format!("POST {} HTTP/1.1\r\n", p.path),
            None => "GET / HTTP/1.1\r\n".to_string(),
        };
        let mut request = line + "Host: 127.0.0.1\r\n";
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        if let Some(p) = post {
            request.push_str(&format!(
                "content-type: application/json\r\ncontent-length: {}\r\n\r\n{}",
                p.body.len(),
                p.body
            ));
        } else {
            request.push_str("\r\n");
        }
        let request = request.into_bytes();
        KeepAlive {
            port,
            request,
            streamed: post.is_some_and(|p| p.streamed),
            conn: None,
        }
    }

    /// Opens the connection now (so that connecting is not part of the measured window).
    pub fn connect(&mut self) -> std::io::Result<()> {
        let stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        self.conn = Some(BufReader::new(stream));
        Ok(())
    }

    /// Sends one request and reads the whole response; returns its status and whether it
    /// carried rate-limit headers (the limiter decided it, rather than letting it through by
    /// its failure policy). The connection is reopened for the next request if the server
    /// closed it (it is not retried: a request that may have been decided is never sent twice).
    pub fn hit_decided(&mut self) -> std::io::Result<(u16, bool)> {
        if self.conn.is_none() {
            self.connect()?;
        }
        let result = match self.conn.as_mut() {
            Some(conn) if self.streamed => exchange_streamed(conn, &self.request),
            Some(conn) => exchange(conn, &self.request),
            None => Err(std::io::Error::other("not connected")),
        };
        match result {
            Ok((status, keep, decided)) => {
                if !keep {
                    self.conn = None;
                }
                Ok((status, decided))
            }
            Err(e) => {
                self.conn = None;
                Err(e)
            }
        }
    }
}

/// Writes `request`, reads one response; returns (status, connection still usable, rate-limit
/// headers present).
fn exchange(conn: &mut BufReader<TcpStream>, request: &[u8]) -> std::io::Result<(u16, bool, bool)> {
    conn.get_mut().write_all(request)?;
    let head = e2e::http::read_kept(conn)?;
    Ok((head.status, head.keep, head.decided))
}

/// [`exchange`] for an answer that may be a stream: read chunk by chunk to its end. A stream
/// cut short is an error (it was not answered whole, and the connection is unusable).
fn exchange_streamed(
    conn: &mut BufReader<TcpStream>,
    request: &[u8],
) -> std::io::Result<(u16, bool, bool)> {
    conn.get_mut().write_all(request)?;
    let answer = e2e::http::read_streamed(conn)?;
    if !answer.complete {
        return Err(std::io::Error::other("the answer ended early"));
    }
    let keep = !answer
        .header("connection")
        .is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let decided = answer
        .headers
        .iter()
        .any(|(name, _)| name.starts_with("x-ratelimit-") || name.starts_with("ratelimit"));
    Ok((answer.status, keep, decided))
}

/// A load on one key through several Envoys.
#[derive(Clone, Debug)]
pub struct Load {
    /// Envoy listener ports (one per replica).
    pub ports: Vec<u16>,
    pub conns_per_port: usize,
    pub duration: Duration,
    /// Headers of every request (the API key, ...).
    pub headers: Vec<(String, String)>,
    /// `None`: each connection sends its next request as soon as the last one is answered
    /// (the most contention). `Some(total)`: requests per second over all connections,
    /// evenly spaced and staggered between connections.
    pub paced_total_per_sec: Option<f64>,
    /// `None`: `GET /`. Some: a JSON POST (to the OpenAI-compatible test upstream).
    pub post: Option<Post>,
}

/// A JSON request body POSTed to `path`, and a header whose value is the connection's number
/// (from 1, over all replicas): the seed of the upstream's random usage, one per connection.
#[derive(Clone, Debug)]
pub struct Post {
    pub path: String,
    pub body: String,
    pub seed_header: Option<String>,
    /// Added to the connection's number in `seed_header` (another sequence per run).
    pub seed_base: u64,
    /// The answers are streams (`"stream": true` in the body): each is read to its last event
    /// before the next request is sent.
    pub streamed: bool,
}

/// One response: when it was read (since the start of the load), how long it took, from which
/// replica, its status (0 for a failed exchange).
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub at: Duration,
    /// From writing the request to reading the whole response.
    pub took: Duration,
    pub replica: usize,
    pub status: u16,
    /// The response carried rate-limit headers.
    pub decided: bool,
}

pub struct LoadResult {
    pub events: Vec<Event>,
    /// The start of the load (what `Event::at` counts from), in Unix seconds.
    pub start_unix: f64,
}

/// The instants that bound the limiter's decisions, in Unix seconds: the first decision came
/// between `first_sent` and `first_read`, the last between `last_sent` and `last_read`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bounds {
    pub first_sent: f64,
    pub first_read: f64,
    pub last_sent: f64,
    pub last_read: f64,
}

impl LoadResult {
    pub fn bounds(&self) -> Bounds {
        let sent = |e: &Event| e.at.saturating_sub(e.took).as_secs_f64();
        let read = |e: &Event| e.at.as_secs_f64();
        let fold = |f: &dyn Fn(&Event) -> f64, min: bool| {
            let values = self.events.iter().map(f);
            let v = if min {
                values.fold(f64::INFINITY, f64::min)
            } else {
                values.fold(f64::NEG_INFINITY, f64::max)
            };
            self.start_unix + if v.is_finite() { v } else { 0.0 }
        };
        Bounds {
            first_sent: fold(&sent, true),
            first_read: fold(&read, true),
            last_sent: fold(&sent, false),
            last_read: fold(&read, false),
        }
    }

    pub fn count(&self, status: u16) -> u64 {
        self.events.iter().filter(|e| e.status == status).count() as u64
    }
}

/// Runs `load`; every connection is opened before the clock starts.
pub fn run(load: &Load) -> LoadResult {
    let total_conns = load.ports.len() * load.conns_per_port;
    // One start instant for all connections, late enough for all of them to be open by then.
    let delay = Duration::from_millis(100 + 5 * total_conns as u64);
    let start = Instant::now() + delay;
    let start_unix = (SystemTime::now() + delay)
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let interval = load
        .paced_total_per_sec
        .map(|rate| Duration::from_secs_f64(total_conns as f64 / rate));
    let results: Vec<Vec<Event>> = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for (replica, &port) in load.ports.iter().enumerate() {
            for c in 0..load.conns_per_port {
                let index = replica * load.conns_per_port + c;
                let mut headers = load.headers.clone();
                if let Some(Post {
                    seed_header: Some(name),
                    seed_base,
                    ..
                }) = &load.post
                {
                    headers.push((name.clone(), (seed_base + index as u64 + 1).to_string()));
                }
                let post = load.post.as_ref();
                let duration = load.duration;
                handles.push(scope.spawn(move || {
                    let mut client = KeepAlive::new(port, &headers, post);
                    let connected = client.connect();
                    let now = Instant::now();
                    if start > now {
                        std::thread::sleep(start - now);
                    }
                    let mut events = Vec::new();
                    if connected.is_err() {
                        return events;
                    }
                    let offset = interval
                        .map(|i| i.mul_f64(index as f64 / total_conns as f64))
                        .unwrap_or_default();
                    let mut next = start + offset;
                    loop {
                        if let Some(i) = interval {
                            let now = Instant::now();
                            if next > now {
                                std::thread::sleep(next - now);
                            }
                            next += i;
                        }
                        let sent = Instant::now();
                        if sent >= start + duration {
                            break;
                        }
                        let (status, decided) = client.hit_decided().unwrap_or((0, false));
                        let done = Instant::now();
                        events.push(Event {
                            at: done - start,
                            took: done - sent,
                            replica,
                            status,
                            decided,
                        });
                    }
                    events
                }));
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut events: Vec<Event> = results.into_iter().flatten().collect();
    events.sort_by_key(|e| e.at);
    LoadResult { events, start_unix }
}
