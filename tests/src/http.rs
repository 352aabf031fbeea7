//! A minimal HTTP/1.1 client: one request per connection (`Connection: close`), raw header
//! bytes allowed, chunked bodies decoded; and reading responses off a keep-alive connection
//! (the flood and the bench's load).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// First value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `GET path` on 127.0.0.1:port with extra headers (values are raw bytes).
pub fn get(port: u16, path: &str, headers: &[(&str, &[u8])]) -> std::io::Result<Response> {
    request(port, "GET", path, headers, b"")
}

pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n")
        .into_bytes();
    for (name, value) in headers {
        req.extend_from_slice(name.as_bytes());
        req.extend_from_slice(b": ");
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() {
        req.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    stream.write_all(&req)?;
    let raw = read_response(&mut stream)?;
    parse(&raw).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unreadable response: {:?}", String::from_utf8_lossy(&raw)),
        )
    })
}

/// Reads one response: until its `Content-Length` or last chunk is in, else until the server
/// closes. (Waiting for the close alone costs a second whenever Envoy delays it.)
pub fn read_response(stream: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(raw);
        }
        raw.extend_from_slice(&buf[..n]);
        if is_complete(&raw) {
            return Ok(raw);
        }
    }
}

fn is_complete(raw: &[u8]) -> bool {
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let body = &raw[split + 4..];
    let header = |name: &str| {
        head.split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim() == name)
            .map(|(_, v)| v.trim().to_string())
    };
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        return body.ends_with(b"0\r\n\r\n");
    }
    match header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        Some(length) => body.len() >= length,
        None => false,
    }
}

/// A raw HTTP/1.1 response, if it is one.
pub fn parse(raw: &[u8]) -> Option<Response> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    if chunked {
        body = dechunk(&body)?;
    }
    Some(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

/// A response read from a keep-alive connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    pub status: u16,
    /// The connection stays open for the next request.
    pub keep: bool,
    /// It carried rate-limit headers: the limiter decided it (rather than its failure policy).
    pub decided: bool,
}

/// Reads one response (with a `Content-Length` body, as Envoy's direct and local replies have)
/// from a keep-alive connection, leaving the connection at the next response.
pub fn read_kept(conn: &mut BufReader<TcpStream>) -> std::io::Result<Kept> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut line = String::new();
    if conn.read_line(&mut line)? == 0 {
        return Err(bad("connection closed before the status line"));
    }
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let mut length = 0usize;
    let mut keep = true;
    let mut decided = false;
    loop {
        line.clear();
        if conn.read_line(&mut line)? == 0 {
            return Err(bad("connection closed in the headers"));
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let value = value.trim();
            let lower = name.to_ascii_lowercase();
            decided |= lower.starts_with("x-ratelimit-") || lower.starts_with("ratelimit");
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().map_err(|_| bad("bad content-length"))?;
            } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close")
            {
                keep = false;
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                return Err(bad("chunked response"));
            }
        }
    }
    let mut body = vec![0; length];
    conn.read_exact(&mut body)?;
    Ok(Kept {
        status,
        keep,
        decided,
    })
}

/// Part of a response body as it arrived: one HTTP chunk of a chunked body (the rest of a
/// chunk cut short by a close), or the whole body otherwise.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub at: std::time::Instant,
    pub data: Vec<u8>,
}

/// A response read part by part, each part with the time it arrived: a stream's events are
/// seen as they come (`text/event-stream` answers are one event per chunk).
#[derive(Debug, Clone)]
pub struct Streamed {
    pub status: u16,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    pub chunks: Vec<Arrival>,
    /// The body ended as its framing says (last chunk, `Content-Length` bytes, or the close
    /// of a body without either); false if the connection closed before.
    pub complete: bool,
}

impl Streamed {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body, chunks joined.
    pub fn body(&self) -> Vec<u8> {
        self.chunks.iter().flat_map(|c| c.data.clone()).collect()
    }
}

/// `POST path` (`Connection: close`) and the answer read part by part.
pub fn post_streamed(
    port: u16,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
) -> std::io::Result<Streamed> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req =
        format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n").into_bytes();
    for (name, value) in headers {
        req.extend_from_slice(name.as_bytes());
        req.extend_from_slice(b": ");
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    req.extend_from_slice(body);
    stream.write_all(&req)?;
    read_streamed(&mut BufReader::new(stream))
}

/// Reads one response off `conn` part by part, leaving a keep-alive connection at the next
/// response. Err if the connection closed (or broke) before the end of the headers; a body
/// cut short is returned with `complete` false.
pub fn read_streamed(conn: &mut BufReader<TcpStream>) -> std::io::Result<Streamed> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut line = String::new();
    if conn.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed before the status line",
        ));
    }
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if conn.read_line(&mut line)? == 0 {
            return Err(bad("connection closed in the headers"));
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    let mut out = Streamed {
        status,
        headers,
        chunks: Vec::new(),
        complete: false,
    };
    let chunked = out
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        loop {
            line.clear();
            if conn.read_line(&mut line).unwrap_or(0) == 0 {
                return Ok(out);
            }
            let size = line.trim().split(';').next().unwrap_or_default();
            let size = usize::from_str_radix(size.trim(), 16).map_err(|_| bad("chunk size"))?;
            if size == 0 {
                // Trailers, up to the blank line.
                loop {
                    line.clear();
                    if conn.read_line(&mut line).unwrap_or(0) == 0 {
                        return Ok(out);
                    }
                    if line.trim_end().is_empty() {
                        out.complete = true;
                        return Ok(out);
                    }
                }
            }
            let (data, whole) = read_up_to(conn, size);
            out.chunks.push(Arrival {
                at: std::time::Instant::now(),
                data,
            });
            let mut crlf = [0u8; 2];
            if !whole || conn.read_exact(&mut crlf).is_err() {
                return Ok(out);
            }
        }
    }
    let length = out.header("content-length").map(str::parse::<usize>);
    let (data, complete) = match length {
        Some(Ok(length)) => read_up_to(conn, length),
        Some(Err(_)) => return Err(bad("bad content-length")),
        None => {
            let mut data = Vec::new();
            let whole = conn.read_to_end(&mut data).is_ok();
            (data, whole)
        }
    };
    if !data.is_empty() {
        out.chunks.push(Arrival {
            at: std::time::Instant::now(),
            data,
        });
    }
    out.complete = complete;
    Ok(out)
}

/// Up to `n` bytes, and whether all `n` came before the connection closed or broke.
fn read_up_to(conn: &mut impl Read, n: usize) -> (Vec<u8>, bool) {
    let mut data = vec![0u8; n];
    let mut got = 0;
    while got < n {
        match conn.read(&mut data[got..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => got += k,
        }
    }
    data.truncate(got);
    (data, got == n)
}

/// The data of each complete event of a `text/event-stream` body (events end with a blank
/// line; the `data:` lines of one event joined with a newline, as the SSE spec says).
pub fn sse_data(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    let mut events: Vec<&str> = text.split("\n\n").collect();
    // What follows the last blank line is an event not ended.
    events.pop();
    events
        .into_iter()
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}
