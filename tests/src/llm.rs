//! A small OpenAI-compatible upstream for the usage tests and the bench: `POST
//! /v1/chat/completions` and `POST /v1/completions` on a free loopback port, HTTP/1.1 with
//! keep-alive, a thread per connection, stopped (every thread joined, every socket closed)
//! when dropped.
//!
//! Each answer carries a usage the test chose, and the server keeps a log of every usage it
//! reported, per API key, so a test can compare what the upstream reported with what Redis
//! charged. Request headers select the answer:
//!
//! | header | effect |
//! |---|---|
//! | `x-test-usage: N` | total tokens N, split `prompt = N / 4`, `completion = N - prompt`; default [`DEFAULT_USAGE`] |
//! | `x-test-usage-random: SEED` | a pseudo-random total from the seed and the server's request counter, in `x-test-usage-range: LO-HI` (default [`DEFAULT_RANGE`]) |
//! | `x-test-shape: NAME` | a bad answer, see [`Shape`] |
//! | `x-test-pad: BYTES` | a JSON string field of BYTES bytes before `usage` (a body larger than a read bound) |
//! | `x-test-events: N` | content events of a stream (default [`DEFAULT_EVENTS`]) |
//! | `x-test-event-delay-ms: MS` | a pause before each event after the first |
//! | `x-test-status: CODE` | the answer's status code (the body as for 200) |
//! | `x-test-encoding: NAME` | the body compressed: `gzip`, `deflate` (zlib-wrapped) or `deflate-raw` (raw deflate, sent as `deflate`), see [`Coding`]; a stream is flushed after each event; a [`Shape::Cut`] answer is not compressed |
//! | `x-test-response-headers: NAME=VALUE;NAME=VALUE` | these headers on the answer, as a provider sends its own `x-ratelimit-*` |
//! | `x-test-cached: N` | N of the prompt tokens (at most all) reported as cached (`prompt_tokens_details.cached_tokens`); default 0 |
//!
//! The request body is read by its `Content-Length` or chunked; `stream` and
//! `stream_options.include_usage` are taken from it as OpenAI does: a stream carries a usage
//! chunk (`choices: []`) before `data: [DONE]` only when `include_usage` is true, and then
//! every other chunk has `"usage": null`. A request body that is not JSON is answered 400,
//! another path 404 (neither is logged as an answer).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::server::{lock, read_headers, Server, Service};

/// Total tokens of an answer when the request names none.
pub const DEFAULT_USAGE: u64 = 100;
/// Range of `x-test-usage-random` when the request gives no `x-test-usage-range`.
pub const DEFAULT_RANGE: (u64, u64) = (1, 1000);
/// Content events of a stream when the request gives no `x-test-events`.
pub const DEFAULT_EVENTS: u32 = 3;
/// The response header of [`Shape::Header`], holding the total tokens.
pub const USAGE_RESPONSE_HEADER: &str = "x-usage-tokens";
/// Request headers the server reads.
pub const USAGE: &str = "x-test-usage";
pub const USAGE_RANDOM: &str = "x-test-usage-random";
pub const USAGE_RANGE: &str = "x-test-usage-range";
pub const SHAPE: &str = "x-test-shape";
pub const PAD: &str = "x-test-pad";
pub const EVENTS: &str = "x-test-events";
pub const EVENT_DELAY: &str = "x-test-event-delay-ms";
pub const STATUS: &str = "x-test-status";
pub const ENCODING: &str = "x-test-encoding";
pub const RESPONSE_HEADERS: &str = "x-test-response-headers";
pub const CACHED: &str = "x-test-cached";
/// The model named in answers when the request names none.
pub const MODEL: &str = "gpt-test";
/// A request body larger than this is refused (413): the server holds bodies whole.
const MAX_REQUEST_BODY: usize = 64 << 20;
/// The value of [`Shape::Huge`]: 10^20, past u64.
const HUGE: &str = "100000000000000000000";

/// A bad answer, chosen by `x-test-shape: NAME` (NAME is [`Shape::name`]). None of them
/// reports a usage to the log except [`Shape::Header`], whose usage is valid but sent in the
/// response header [`USAGE_RESPONSE_HEADER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// No `usage` key at all (and no usage chunk in a stream).
    Missing,
    /// `"usage": null`.
    Null,
    /// `total_tokens` negative (the other fields too).
    Negative,
    /// `total_tokens` with a fraction (`N.5`).
    Fractional,
    /// `total_tokens` 10^20, past what any counter holds.
    Huge,
    /// `total_tokens` a string (`"N"`).
    Text,
    /// `total_tokens` twice in the usage object: N, then 1.
    Duplicate,
    /// A body (or every event's data) that is not JSON, with the same content type.
    NotJson,
    /// The connection closed in the middle of the usage event (after its `total_tokens`
    /// value, before the event ends), or in the middle of a JSON body.
    Cut,
    /// The usage in the response header [`USAGE_RESPONSE_HEADER`], none in the body.
    Header,
    /// The connection closed once the request is read, before any byte of an answer.
    Reset,
}

impl Shape {
    pub const ALL: [Shape; 11] = [
        Shape::Missing,
        Shape::Null,
        Shape::Negative,
        Shape::Fractional,
        Shape::Huge,
        Shape::Text,
        Shape::Duplicate,
        Shape::NotJson,
        Shape::Cut,
        Shape::Header,
        Shape::Reset,
    ];

    /// The value of `x-test-shape` that selects it.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Missing => "missing",
            Shape::Null => "null",
            Shape::Negative => "negative",
            Shape::Fractional => "fractional",
            Shape::Huge => "huge",
            Shape::Text => "string",
            Shape::Duplicate => "duplicate",
            Shape::NotJson => "not-json",
            Shape::Cut => "cut",
            Shape::Header => "header",
            Shape::Reset => "reset",
        }
    }

    pub fn from_name(name: &str) -> Option<Shape> {
        Shape::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// How an answer's body is compressed, chosen by `x-test-encoding: NAME` ([`Coding::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Gzip,
    /// zlib-wrapped deflate, as RFC 9110 defines `deflate`.
    Deflate,
    /// Raw deflate sent as `Content-Encoding: deflate`, as some servers do.
    DeflateRaw,
}

impl Coding {
    pub const ALL: [Coding; 3] = [Coding::Gzip, Coding::Deflate, Coding::DeflateRaw];

    pub fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
            Coding::DeflateRaw => "deflate-raw",
        }
    }

    pub fn from_name(name: &str) -> Option<Coding> {
        Coding::ALL.into_iter().find(|c| c.name() == name.trim())
    }

    /// The `Content-Encoding` it is sent with.
    pub fn header(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate | Coding::DeflateRaw => "deflate",
        }
    }
}

/// A compressor of one answer's body (flate2), flushed at each event of a stream so each
/// event reaches the client as it is written.
enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Zlib(flate2::write::ZlibEncoder<Vec<u8>>),
    Raw(flate2::write::DeflateEncoder<Vec<u8>>),
}

impl Encoder {
    fn new(coding: Coding) -> Encoder {
        let level = flate2::Compression::default();
        match coding {
            Coding::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(Vec::new(), level)),
            Coding::Deflate => Encoder::Zlib(flate2::write::ZlibEncoder::new(Vec::new(), level)),
            Coding::DeflateRaw => {
                Encoder::Raw(flate2::write::DeflateEncoder::new(Vec::new(), level))
            }
        }
    }

    /// Compresses `data` and flushes: the bytes that make it decodable so far.
    fn flushed(&mut self, data: &[u8]) -> std::io::Result<Vec<u8>> {
        let out = match self {
            Encoder::Gzip(e) => {
                e.write_all(data)?;
                e.flush()?;
                e.get_mut()
            }
            Encoder::Zlib(e) => {
                e.write_all(data)?;
                e.flush()?;
                e.get_mut()
            }
            Encoder::Raw(e) => {
                e.write_all(data)?;
                e.flush()?;
                e.get_mut()
            }
        };
        Ok(std::mem::take(out))
    }

    /// The end of the compressed data (and gzip's trailer).
    fn finish(self) -> std::io::Result<Vec<u8>> {
        match self {
            Encoder::Gzip(e) => e.finish(),
            Encoder::Zlib(e) => e.finish(),
            Encoder::Raw(e) => e.finish(),
        }
    }
}

/// The whole of `body` compressed.
pub fn compress(coding: Coding, body: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder = Encoder::new(coding);
    let mut out = encoder.flushed(body)?;
    out.extend(encoder.finish()?);
    Ok(out)
}

/// What the server reported, for one API key or for all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    /// Sum of the valid usages reported (in the body or in [`USAGE_RESPONSE_HEADER`]),
    /// whatever the answer's status (`x-test-status`).
    pub sum: u64,
    /// Answers that reported a valid usage.
    pub count: u64,
    /// Answers that reported none, or an invalid one (a [`Shape`], a stream without
    /// `include_usage`).
    pub unreported: u64,
}

#[derive(Default)]
struct Log {
    all: Served,
    by_key: HashMap<String, Served>,
    /// Per key, the prompt and completion tokens of the usages in `by_key` ([`split`]).
    split_by_key: HashMap<String, (u64, u64)>,
    /// Per key and the request's `model`.
    by_model: HashMap<(String, String), Served>,
}

struct Shared {
    stop: AtomicBool,
    /// Numbers answers: the seed of random usages and the ids.
    counter: AtomicU64,
    requests: AtomicU64,
    chunked_requests: AtomicU64,
    /// Requests being answered now, and the most at once (concurrency limits).
    in_flight: AtomicU64,
    peak_in_flight: AtomicU64,
    log: Mutex<Log>,
    /// The body bytes of the last compressed answer to each API key, as sent.
    sent: Mutex<HashMap<String, Vec<u8>>>,
}

impl Service for Shared {
    fn stop_flag(&self) -> &AtomicBool {
        &self.stop
    }
    fn serve(&self, stream: TcpStream) -> std::io::Result<()> {
        serve(stream, self)
    }
}

/// The upstream. Dropping it stops it: the accept loop ends, every open connection is shut
/// down and every thread joined.
pub struct LlmUpstream {
    pub port: u16,
    server: Server<Shared>,
}

impl LlmUpstream {
    /// Starts it on a free loopback port; it accepts connections when this returns.
    pub fn start() -> LlmUpstream {
        let server = Server::start(
            "the LLM upstream",
            Shared {
                stop: AtomicBool::new(false),
                counter: AtomicU64::new(0),
                requests: AtomicU64::new(0),
                chunked_requests: AtomicU64::new(0),
                in_flight: AtomicU64::new(0),
                peak_in_flight: AtomicU64::new(0),
                log: Mutex::new(Log::default()),
                sent: Mutex::new(HashMap::new()),
            },
        );
        LlmUpstream {
            port: server.port,
            server,
        }
    }

    /// What it reported, all keys together.
    pub fn served(&self) -> Served {
        lock(&self.server.service.log).all
    }

    /// Of what [`Self::served_for`] sums for `key`: the prompt and the completion tokens.
    pub fn served_split_for(&self, key: &str) -> (u64, u64) {
        lock(&self.server.service.log)
            .split_by_key
            .get(key)
            .copied()
            .unwrap_or_default()
    }

    /// What it reported to requests with API key `key` (as [`Self::served_for`]) naming
    /// `model` in their body.
    pub fn served_for_model(&self, key: &str, model: &str) -> Served {
        lock(&self.server.service.log)
            .by_model
            .get(&(key.to_string(), model.to_string()))
            .copied()
            .unwrap_or_default()
    }

    /// What it reported to requests with API key `key`: the `x-api-key` header, else the
    /// `Authorization` header without its `Bearer ` prefix.
    pub fn served_for(&self, key: &str) -> Served {
        lock(&self.server.service.log)
            .by_key
            .get(key)
            .copied()
            .unwrap_or_default()
    }

    /// Requests read, whatever their answer.
    pub fn requests(&self) -> u64 {
        self.server.service.requests.load(Ordering::SeqCst)
    }

    /// The body of the last compressed answer (`x-test-encoding`) to API key `key`, as it
    /// was sent (chunk framing removed), to compare with what the client received.
    pub fn sent_body_for(&self, key: &str) -> Option<Vec<u8>> {
        lock(&self.server.service.sent).get(key).cloned()
    }

    /// Requests whose body came chunked.
    pub fn chunked_requests(&self) -> u64 {
        self.server.service.chunked_requests.load(Ordering::SeqCst)
    }

    /// Requests being answered now (read, their answer not yet all written).
    pub fn in_flight(&self) -> u64 {
        self.server.service.in_flight.load(Ordering::SeqCst)
    }

    /// The most requests answered at once so far.
    pub fn peak_in_flight(&self) -> u64 {
        self.server.service.peak_in_flight.load(Ordering::SeqCst)
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.server.open_connections()
    }
}

/// The edits that route the shipped envoy/envoy.yaml to this upstream instead of its
/// direct response, with the filter configuration `filter_json`: pass them to
/// [`crate::Envoy::start`] or [`crate::procs::envoy_config`].
pub fn upstream_edits(filter_json: &str, upstream_port: u16) -> Vec<(String, String)> {
    let (from, to) = crate::procs::filter_config_edit(filter_json);
    let route = (
        "                direct_response:\n                  status: 200\n                  body: { inline_string: \"hello from behind the rate limiter\\n\" }\n".to_string(),
        "                route: { cluster: upstream, timeout: 60s }\n".to_string(),
    );
    let cluster = format!(
        "  clusters:\n  - name: upstream\n    type: STATIC\n    connect_timeout: 1s\n    load_assignment:\n      cluster_name: upstream\n      endpoints:\n      - lb_endpoints:\n        - endpoint:\n            address:\n              socket_address: {{ address: 127.0.0.1, port_value: {upstream_port} }}\n"
    );
    vec![(from, to), route, ("  clusters:\n".to_string(), cluster)]
}

/// One request as read off the connection.
struct Request {
    method: String,
    path: String,
    /// Lower-case names.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn number(&self, name: &str) -> Option<u64> {
        self.header(name).and_then(|v| v.trim().parse().ok())
    }

    /// The API key the log is kept under.
    fn key(&self) -> Option<String> {
        if let Some(key) = self.header("x-api-key") {
            return Some(key.to_string());
        }
        let auth = self.header("authorization")?;
        Some(auth.strip_prefix("Bearer ").unwrap_or(auth).to_string())
    }
}

fn bad_input(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// Serves requests off one connection until the client closes it or asks to.
fn serve(stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let Some(request) = read_request(&mut reader, &mut writer, shared)? else {
            return Ok(());
        };
        if shared.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let close = request
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.peak_in_flight.fetch_max(now, Ordering::SeqCst);
        let answered = answer(&request, &mut writer, shared);
        shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        if !answered? || close {
            return Ok(());
        }
    }
}

/// Reads one request; None when the client closed the connection between requests.
fn read_request(
    reader: &mut BufReader<TcpStream>,
    writer: &mut TcpStream,
    shared: &Shared,
) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(path)) = (parts.next(), parts.next()) else {
        return Err(bad_input("bad request line"));
    };
    let (method, path) = (method.to_string(), path.to_string());
    let headers = read_headers(reader)?;
    let mut request = Request {
        method,
        path,
        headers,
        body: Vec::new(),
    };
    if request
        .header("expect")
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
    {
        writer.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    }
    let chunked = request
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        request.body = read_chunked(reader)?;
        shared.chunked_requests.fetch_add(1, Ordering::SeqCst);
    } else if let Some(length) = request.number("content-length") {
        let length = usize::try_from(length).map_err(|_| bad_input("content-length"))?;
        if length > MAX_REQUEST_BODY {
            return Err(bad_input("request body too large"));
        }
        request.body = vec![0; length];
        reader.read_exact(&mut request.body)?;
    }
    shared.requests.fetch_add(1, Ordering::SeqCst);
    Ok(Some(request))
}

/// A chunked body, decoded (chunk extensions and trailers ignored).
fn read_chunked(reader: &mut BufReader<TcpStream>) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(bad_input("connection closed in a chunked body"));
        }
        let size = line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size.trim(), 16).map_err(|_| bad_input("chunk size"))?;
        if size == 0 {
            // Trailers, up to the blank line.
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > MAX_REQUEST_BODY {
            return Err(bad_input("request body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        let mut crlf = [0u8; 2];
        reader.read_exact(&mut crlf)?;
    }
}

/// The endpoint a request is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completions,
    /// OpenAI's Responses API: usage in the JSON, or in the stream's `response.completed`.
    Responses,
    /// Anthropic's Messages API: input (with cache counts) and output tokens apart.
    Messages,
}

/// Everything an answer is made of.
struct Plan {
    endpoint: Endpoint,
    id: String,
    model: String,
    usage: u64,
    shape: Option<Shape>,
    pad: usize,
    events: u32,
    delay: Duration,
    status: u16,
    coding: Option<Coding>,
    /// Headers of the upstream's own, from [`RESPONSE_HEADERS`].
    headers: Vec<(String, String)>,
    /// Prompt tokens reported as cached ([`CACHED`]).
    cached: u64,
}

/// Answers one request; false if the connection must close after it.
fn answer(request: &Request, out: &mut TcpStream, shared: &Shared) -> std::io::Result<bool> {
    let endpoint = match (request.method.as_str(), request.path.split('?').next()) {
        ("POST", Some("/v1/chat/completions")) => Endpoint::Chat,
        ("POST", Some("/v1/completions")) => Endpoint::Completions,
        ("POST", Some("/v1/responses")) => Endpoint::Responses,
        ("POST", Some("/v1/messages")) => Endpoint::Messages,
        _ => {
            write_json(out, 404, &[], &error_body("no such endpoint"))?;
            return Ok(true);
        }
    };
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&request.body) else {
        write_json(out, 400, &[], &error_body("the request body is not JSON"))?;
        return Ok(true);
    };
    let stream = json["stream"].as_bool().unwrap_or(false);
    let include_usage = json["stream_options"]["include_usage"]
        .as_bool()
        .unwrap_or(false);
    let n = shared.counter.fetch_add(1, Ordering::SeqCst);
    let shape = request.header(SHAPE).and_then(Shape::from_name);
    let plan = Plan {
        endpoint,
        id: match endpoint {
            Endpoint::Chat => format!("chatcmpl-test-{n}"),
            Endpoint::Completions => format!("cmpl-test-{n}"),
            Endpoint::Responses => format!("resp_test_{n}"),
            Endpoint::Messages => format!("msg_test_{n}"),
        },
        model: json["model"].as_str().unwrap_or(MODEL).to_string(),
        usage: chosen_usage(request, n),
        shape,
        pad: request
            .number(PAD)
            .and_then(|p| usize::try_from(p).ok())
            .unwrap_or(0),
        events: request
            .number(EVENTS)
            .and_then(|e| u32::try_from(e).ok())
            .unwrap_or(DEFAULT_EVENTS)
            .max(1),
        delay: Duration::from_millis(request.number(EVENT_DELAY).unwrap_or(0)),
        status: request
            .number(STATUS)
            .and_then(|s| u16::try_from(s).ok())
            .filter(|s| (200..600).contains(s))
            .unwrap_or(200),
        coding: request.header(ENCODING).and_then(Coding::from_name),
        headers: request
            .header(RESPONSE_HEADERS)
            .map(|h| {
                h.split(';')
                    .filter_map(|pair| pair.split_once('='))
                    .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
                    .collect()
            })
            .unwrap_or_default(),
        cached: request.number(CACHED).unwrap_or(0),
    };
    if shape == Some(Shape::Reset) {
        record(shared, request, &plan.model, None);
        let _ = out.shutdown(Shutdown::Both);
        return Ok(false);
    }
    if matches!(endpoint, Endpoint::Responses | Endpoint::Messages) {
        // These always report their usage (shapes are the OpenAI endpoints').
        record(shared, request, &plan.model, Some(plan.usage));
        return answer_provider(&plan, stream, out);
    }
    let reported = match shape {
        Some(Shape::Header) => Some(plan.usage),
        Some(_) => None,
        None if stream && !include_usage => None,
        None => Some(plan.usage),
    };
    record(shared, request, &plan.model, reported);
    let mut sent = Sent {
        shared,
        key: plan.coding.and(request.key()),
    };
    if stream {
        answer_stream(&plan, include_usage, out, shared, &mut sent)
    } else {
        answer_json(&plan, out, &mut sent)
    }
}

/// The log of a compressed answer's body, kept as each part is written (before it is, so a
/// client that has the answer finds it logged).
struct Sent<'a> {
    shared: &'a Shared,
    /// None: not logged (a plain answer, or no API key).
    key: Option<String>,
}

impl Sent<'_> {
    fn push(&mut self, data: &[u8]) {
        if let Some(key) = &self.key {
            lock(&self.shared.sent)
                .entry(key.clone())
                .or_default()
                .extend_from_slice(data);
        }
    }

    fn start(&mut self) {
        if let Some(key) = &self.key {
            lock(&self.shared.sent).insert(key.clone(), Vec::new());
        }
    }
}

/// A Responses API or Messages API answer, JSON or streamed, carrying `plan.usage` in all.
fn answer_provider(plan: &Plan, stream: bool, out: &mut TcpStream) -> std::io::Result<bool> {
    let (input, output) = split(plan.usage);
    let text: String = CONTENT.concat();
    let (id, model) = (&plan.id, &plan.model);
    // Anthropic: a quarter of the input each as cache writes and reads.
    let (cache_write, cache_read) = (input / 4, input / 4);
    let fresh = input - cache_write - cache_read;
    let events: Vec<(&str, String)> = match (plan.endpoint, stream) {
        (Endpoint::Messages, false) => {
            let body = format!(
                r#"{{"id":"{id}","type":"message","role":"assistant","model":"{model}","content":[{{"type":"text","text":"{text}"}}],"stop_reason":"end_turn","stop_sequence":null,"usage":{{"input_tokens":{fresh},"cache_creation_input_tokens":{cache_write},"cache_read_input_tokens":{cache_read},"output_tokens":{output}}}}}"#
            );
            write_json(out, plan.status, &[], &body)?;
            return Ok(true);
        }
        (Endpoint::Responses, false) => {
            let body = format!(
                r#"{{"id":"{id}","object":"response","status":"completed","model":"{model}","output":[{{"type":"message","role":"assistant","content":[{{"type":"output_text","text":"{text}"}}]}}],"usage":{{"input_tokens":{input},"output_tokens":{output},"total_tokens":{}}}}}"#,
                plan.usage
            );
            write_json(out, plan.status, &[], &body)?;
            return Ok(true);
        }
        (Endpoint::Messages, true) => vec![
            (
                "message_start",
                format!(
                    r#"{{"type":"message_start","message":{{"id":"{id}","type":"message","role":"assistant","model":"{model}","content":[],"usage":{{"input_tokens":{fresh},"cache_creation_input_tokens":{cache_write},"cache_read_input_tokens":{cache_read},"output_tokens":1}}}}}}"#
                ),
            ),
            (
                "content_block_delta",
                format!(
                    r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{text}"}}}}"#
                ),
            ),
            (
                "message_delta",
                format!(
                    r#"{{"type":"message_delta","delta":{{"stop_reason":null}},"usage":{{"output_tokens":{}}}}}"#,
                    output / 2
                ),
            ),
            (
                "message_delta",
                format!(
                    r#"{{"type":"message_delta","delta":{{"stop_reason":"end_turn"}},"usage":{{"output_tokens":{output}}}}}"#
                ),
            ),
            ("message_stop", r#"{"type":"message_stop"}"#.to_string()),
        ],
        _ => vec![
            (
                "response.created",
                format!(
                    r#"{{"type":"response.created","sequence_number":0,"response":{{"id":"{id}","status":"in_progress","usage":null}}}}"#
                ),
            ),
            (
                "response.output_text.delta",
                format!(
                    r#"{{"type":"response.output_text.delta","sequence_number":1,"delta":"{text}"}}"#
                ),
            ),
            (
                "response.completed",
                format!(
                    r#"{{"type":"response.completed","sequence_number":2,"response":{{"id":"{id}","status":"completed","usage":{{"input_tokens":{input},"output_tokens":{output},"total_tokens":{}}}}}}}"#,
                    plan.usage
                ),
            ),
        ],
    };
    let head = response_head(plan.status, "text/event-stream; charset=utf-8", &[], None);
    out.write_all(head.as_bytes())?;
    for (name, data) in events {
        write_chunk(out, format!("event: {name}\ndata: {data}\n\n").as_bytes())?;
    }
    out.write_all(b"0\r\n\r\n")?;
    Ok(true)
}

/// The total tokens of an answer, as the request chose it.
fn chosen_usage(request: &Request, n: u64) -> u64 {
    if let Some(seed) = request.number(USAGE_RANDOM) {
        let (lo, hi) = request
            .header(USAGE_RANGE)
            .and_then(parse_range)
            .unwrap_or(DEFAULT_RANGE);
        return lo + splitmix64(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) % (hi - lo + 1);
    }
    request.number(USAGE).unwrap_or(DEFAULT_USAGE)
}

/// `LO-HI` with LO <= HI.
pub fn parse_range(text: &str) -> Option<(u64, u64)> {
    let (lo, hi) = text.split_once('-')?;
    let (lo, hi) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
    (lo <= hi && hi < u64::MAX).then_some((lo, hi))
}

/// A well-mixed 64-bit hash (SplitMix64's finalizer).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How a total is split: `prompt = total / 4`, `completion = total - prompt`.
pub fn split(total: u64) -> (u64, u64) {
    let prompt = total / 4;
    (prompt, total - prompt)
}

fn record(shared: &Shared, request: &Request, model: &str, usage: Option<u64>) {
    let mut log = lock(&shared.log);
    let add = |served: &mut Served| match usage {
        Some(n) => {
            served.sum += n;
            served.count += 1;
        }
        None => served.unreported += 1,
    };
    add(&mut log.all);
    if let Some(key) = request.key() {
        if let Some(n) = usage {
            let (prompt, completion) = split(n);
            let parts = log.split_by_key.entry(key.clone()).or_default();
            parts.0 += prompt;
            parts.1 += completion;
        }
        add(log.by_key.entry(key.clone()).or_default());
        add(log.by_model.entry((key, model.to_string())).or_default());
    }
}

/// The `usage` member (`"usage":…`) of an answer as its shape makes it, or None for none.
fn usage_member(plan: &Plan) -> Option<String> {
    let (prompt, completion) = split(plan.usage);
    let total = plan.usage;
    let cached = plan.cached.min(prompt);
    let details = format!(
        r#""prompt_tokens_details":{{"cached_tokens":{cached},"audio_tokens":0}},"completion_tokens_details":{{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}"#
    );
    let counts = match plan.shape {
        Some(Shape::Missing | Shape::Header | Shape::Reset) => return None,
        Some(Shape::Null) => return Some(r#""usage":null"#.to_string()),
        Some(Shape::Negative) => format!(
            r#""prompt_tokens":-{prompt},"completion_tokens":-{completion},"total_tokens":-{total}"#
        ),
        Some(Shape::Fractional) => format!(
            r#""prompt_tokens":{prompt},"completion_tokens":{completion}.5,"total_tokens":{total}.5"#
        ),
        Some(Shape::Huge) => {
            format!(r#""prompt_tokens":{prompt},"completion_tokens":{HUGE},"total_tokens":{HUGE}"#)
        }
        Some(Shape::Text) => format!(
            r#""prompt_tokens":"{prompt}","completion_tokens":"{completion}","total_tokens":"{total}""#
        ),
        Some(Shape::Duplicate) => format!(
            r#""prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":{total},"total_tokens":1"#
        ),
        None | Some(Shape::NotJson | Shape::Cut) => format!(
            r#""prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":{total}"#
        ),
    };
    Some(format!(r#""usage":{{{counts},{details}}}"#))
}

/// The padding member (with its comma), or nothing.
fn pad_member(plan: &Plan) -> String {
    if plan.pad == 0 {
        return String::new();
    }
    format!(r#""padding":"{}","#, "x".repeat(plan.pad))
}

const CONTENT: [&str; 8] = [
    "Hello",
    " from",
    " the",
    " test",
    " upstream",
    ",",
    " token",
    " by token.",
];

fn created() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `sent`: the body bytes as written.
fn answer_json(plan: &Plan, out: &mut TcpStream, sent: &mut Sent) -> std::io::Result<bool> {
    let text: String = CONTENT.concat();
    let choice = match plan.endpoint {
        Endpoint::Chat => format!(
            r#"{{"index":0,"message":{{"role":"assistant","content":"{text}","refusal":null,"annotations":[]}},"logprobs":null,"finish_reason":"stop"}}"#
        ),
        _ => {
            format!(r#"{{"text":"{text}","index":0,"logprobs":null,"finish_reason":"stop"}}"#)
        }
    };
    let object = match plan.endpoint {
        Endpoint::Chat => "chat.completion",
        _ => "text_completion",
    };
    let usage = usage_member(plan)
        .map(|u| format!(",{u}"))
        .unwrap_or_default();
    let body = if plan.shape == Some(Shape::NotJson) {
        format!("{}usage: {} tokens, not JSON", pad_member(plan), plan.usage)
    } else {
        format!(
            r#"{{"id":"{}","object":"{object}","created":{},"model":"{}","choices":[{choice}],{}"service_tier":"default","system_fingerprint":null{usage}}}"#,
            plan.id,
            created(),
            plan.model,
            pad_member(plan),
        )
    };
    let mut extra = extra_headers(plan);
    if let Some(coding) = plan.coding.filter(|_| plan.shape != Some(Shape::Cut)) {
        let body = compress(coding, body.as_bytes())?;
        extra.push(("Content-Encoding", coding.header().to_string()));
        let mut bytes =
            response_head(plan.status, "application/json", &extra, Some(body.len())).into_bytes();
        bytes.extend_from_slice(&body);
        sent.start();
        sent.push(&body);
        out.write_all(&bytes)?;
        return Ok(true);
    }
    if plan.shape == Some(Shape::Cut) {
        let head = response_head(plan.status, "application/json", &extra, Some(body.len()));
        out.write_all(head.as_bytes())?;
        out.write_all(&body.as_bytes()[..body.len() / 2])?;
        let _ = out.shutdown(Shutdown::Both);
        return Ok(false);
    }
    write_json(out, plan.status, &extra, &body)?;
    Ok(true)
}

fn usage_header(plan: &Plan) -> Option<(&'static str, String)> {
    (plan.shape == Some(Shape::Header)).then(|| (USAGE_RESPONSE_HEADER, plan.usage.to_string()))
}

/// The answer's headers besides its content type and framing: the usage header of
/// [`Shape::Header`], then those the request asked for.
fn extra_headers(plan: &Plan) -> Vec<(&str, String)> {
    let mut extra: Vec<(&str, String)> = usage_header(plan).into_iter().collect();
    extra.extend(plan.headers.iter().map(|(n, v)| (n.as_str(), v.clone())));
    extra
}

fn response_head(
    status: u16,
    content_type: &str,
    extra: &[(&str, String)],
    length: Option<usize>,
) -> String {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\n",
        reason(status)
    );
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    match length {
        Some(length) => head.push_str(&format!("Content-Length: {length}\r\n\r\n")),
        None => head.push_str("Transfer-Encoding: chunked\r\n\r\n"),
    }
    head
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

fn write_json(
    out: &mut TcpStream,
    status: u16,
    extra: &[(&str, String)],
    body: &str,
) -> std::io::Result<()> {
    let mut bytes = response_head(status, "application/json", extra, Some(body.len())).into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    out.write_all(&bytes)
}

fn error_body(message: &str) -> String {
    format!(
        r#"{{"error":{{"message":"{message}","type":"invalid_request_error","param":null,"code":null}}}}"#
    )
}

/// Writes `data` as one HTTP chunk.
fn write_chunk(out: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    let mut bytes = format!("{:x}\r\n", data.len()).into_bytes();
    bytes.extend_from_slice(data);
    bytes.extend_from_slice(b"\r\n");
    out.write_all(&bytes)
}

/// The data of each event of a stream, in order (`[DONE]` last).
fn stream_events(plan: &Plan, include_usage: bool) -> Vec<String> {
    let (object, created) = match plan.endpoint {
        Endpoint::Chat => ("chat.completion.chunk", created()),
        _ => ("text_completion", created()),
    };
    let head = format!(
        r#"{{"id":"{}","object":"{object}","created":{created},"model":"{}","system_fingerprint":null"#,
        plan.id, plan.model
    );
    let null_usage = if include_usage {
        r#","usage":null"#
    } else {
        ""
    };
    let mut events = Vec::new();
    for i in 0..plan.events {
        let last = i + 1 == plan.events;
        let text = CONTENT[i as usize % CONTENT.len()];
        let finish = if last { r#""stop""# } else { "null" };
        let choice = match plan.endpoint {
            Endpoint::Chat if i == 0 => format!(
                r#"{{"index":0,"delta":{{"role":"assistant","content":"{text}","refusal":null}},"logprobs":null,"finish_reason":{finish}}}"#
            ),
            Endpoint::Chat => format!(
                r#"{{"index":0,"delta":{{"content":"{text}"}},"logprobs":null,"finish_reason":{finish}}}"#
            ),
            _ => {
                format!(r#"{{"text":"{text}","index":0,"logprobs":null,"finish_reason":{finish}}}"#)
            }
        };
        events.push(format!(r#"{head},"choices":[{choice}]{null_usage}}}"#));
    }
    if include_usage {
        if let Some(usage) = usage_member(plan) {
            events.push(format!(
                r#"{head},{}"choices":[],{usage}}}"#,
                pad_member(plan)
            ));
        }
    }
    if plan.shape == Some(Shape::NotJson) {
        for event in &mut events {
            *event = format!("not json: {}", event.len());
        }
    }
    events.push("[DONE]".to_string());
    events
}

fn answer_stream(
    plan: &Plan,
    include_usage: bool,
    out: &mut TcpStream,
    shared: &Shared,
    sent: &mut Sent,
) -> std::io::Result<bool> {
    sent.start();
    let mut extra = extra_headers(plan);
    // A cut answer is sent as it is: its point is where the plain bytes stop.
    let coding = plan.coding.filter(|_| plan.shape != Some(Shape::Cut));
    let mut encoder = coding.map(|coding| {
        extra.push(("Content-Encoding", coding.header().to_string()));
        Encoder::new(coding)
    });
    let head = response_head(
        plan.status,
        "text/event-stream; charset=utf-8",
        &extra,
        None,
    );
    out.write_all(head.as_bytes())?;
    let events = stream_events(plan, include_usage);
    let usage_event = events.len().checked_sub(2);
    for (i, data) in events.iter().enumerate() {
        if (i > 0 && !pause(plan.delay, shared)) || shared.stop.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let event = format!("data: {data}\n\n");
        let cut_here = plan.shape == Some(Shape::Cut) && Some(i) == usage_event;
        if cut_here {
            // Up to just past the total's value: a reader that took the partial event
            // would find a number there.
            let end = event
                .find(r#""total_tokens":"#)
                .map(|at| at + r#""total_tokens":"#.len() + plan.usage.to_string().len() + 1)
                .unwrap_or(event.len() / 2);
            write_chunk(out, &event.as_bytes()[..end])?;
            let _ = out.shutdown(Shutdown::Both);
            return Ok(false);
        }
        let data = match encoder.as_mut() {
            Some(encoder) => encoder.flushed(event.as_bytes())?,
            None => event.into_bytes(),
        };
        // An empty chunk would end the body.
        if !data.is_empty() {
            sent.push(&data);
            write_chunk(out, &data)?;
        }
    }
    if let Some(encoder) = encoder {
        let end = encoder.finish()?;
        if !end.is_empty() {
            sent.push(&end);
            write_chunk(out, &end)?;
        }
    }
    out.write_all(b"0\r\n\r\n")?;
    Ok(true)
}

/// Sleeps `delay` in short steps; false if the server is stopping meanwhile (a dropped
/// server does not wait for a slow stream).
fn pause(delay: Duration, shared: &Shared) -> bool {
    let deadline = std::time::Instant::now() + delay;
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return false;
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return true;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(10)));
    }
}

/// An OpenAI chat completion request body: one user message `prompt`, `stream`, and with it
/// `stream_options.include_usage`; `max_tokens` if given.
pub fn chat_request(prompt: &str, stream: bool, max_tokens: Option<u64>) -> Vec<u8> {
    let mut body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
    });
    if stream {
        body["stream"] = true.into();
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    if let Some(max) = max_tokens {
        body["max_tokens"] = max.into();
    }
    body.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{self, Streamed};
    use std::time::Instant;

    fn post(
        upstream: &LlmUpstream,
        headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> std::io::Result<Streamed> {
        http::post_streamed(upstream.port, "/v1/chat/completions", headers, body)
    }

    fn json_of(r: &Streamed) -> serde_json::Value {
        serde_json::from_slice(&r.body()).expect("a JSON body")
    }

    /// The `data:` of each event of an event stream (complete events only).
    fn events(r: &Streamed) -> Vec<String> {
        http::sse_data(&r.body())
    }

    fn inflate(coding: Coding, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let done = match coding {
            Coding::Gzip => flate2::read::GzDecoder::new(bytes).read_to_end(&mut out),
            Coding::Deflate => flate2::read::ZlibDecoder::new(bytes).read_to_end(&mut out),
            Coding::DeflateRaw => flate2::read::DeflateDecoder::new(bytes).read_to_end(&mut out),
        };
        done.expect("a compressed body");
        out
    }

    #[test]
    fn compressed_answers_decode_to_the_plain_ones_and_are_logged_as_sent() {
        let up = LlmUpstream::start();
        for coding in Coding::ALL {
            let json = chat_request("Hi", false, None);
            let headers: [(&str, &[u8]); 3] = [
                ("x-api-key", b"k"),
                (USAGE, b"42"),
                (ENCODING, coding.name().as_bytes()),
            ];
            let r = post(&up, &headers, &json).unwrap();
            assert_eq!(r.header("content-encoding"), Some(coding.header()));
            assert_eq!(up.sent_body_for("k"), Some(r.body()));
            let v: serde_json::Value = serde_json::from_slice(&inflate(coding, &r.body())).unwrap();
            assert_eq!(v["usage"]["total_tokens"], 42);

            let stream = chat_request("Hi", true, None);
            let r = post(&up, &headers, &stream).unwrap();
            assert!(r.complete && r.chunks.len() > 1, "{coding:?}");
            assert_eq!(up.sent_body_for("k"), Some(r.body()));
            let data = http::sse_data(&inflate(coding, &r.body()));
            assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
            assert!(
                data.iter().any(|d| d.contains(r#""total_tokens":42"#)),
                "{data:?}"
            );
        }
        assert_eq!(up.served_for("k").sum, 6 * 42);
    }

    #[test]
    fn json_answers_carry_the_chosen_usage_split_as_openai_does() {
        let up = LlmUpstream::start();
        let r = post(
            &up,
            &[("x-test-usage", b"1000"), ("x-api-key", b"k1")],
            &chat_request("hi", false, None),
        )
        .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("application/json"));
        let v = json_of(&r);
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["usage"]["total_tokens"], 1000);
        assert_eq!(v["usage"]["prompt_tokens"], 250);
        assert_eq!(v["usage"]["completion_tokens"], 750);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        // The default, and the Authorization key.
        let r = post(
            &up,
            &[("authorization", b"Bearer sk-2")],
            &chat_request("hi", false, None),
        )
        .unwrap();
        assert_eq!(json_of(&r)["usage"]["total_tokens"], DEFAULT_USAGE);
        let k1 = Served {
            sum: 1000,
            count: 1,
            unreported: 0,
        };
        assert_eq!(up.served_for("k1"), k1);
        assert_eq!(up.served_for("sk-2").sum, DEFAULT_USAGE);
        assert_eq!(up.served().sum, 1000 + DEFAULT_USAGE);
        assert_eq!(up.served().count, 2);
        let r = http::post_streamed(
            up.port,
            "/v1/completions",
            &[("x-test-usage", b"8")],
            br#"{"model":"m","prompt":"p"}"#,
        )
        .unwrap();
        let v = json_of(&r);
        assert_eq!(
            (v["object"].as_str(), v["model"].as_str()),
            (Some("text_completion"), Some("m"))
        );
        assert_eq!(v["usage"]["total_tokens"], 8);
    }

    #[test]
    fn streams_send_events_one_by_one_then_the_usage_then_done() {
        let up = LlmUpstream::start();
        let r = post(
            &up,
            &[
                ("x-test-usage", b"77"),
                ("x-test-events", b"4"),
                ("x-test-event-delay-ms", b"100"),
            ],
            &chat_request("hi", true, None),
        )
        .unwrap();
        assert!(r.complete);
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("content-type"),
            Some("text/event-stream; charset=utf-8")
        );
        assert_eq!(r.header("transfer-encoding"), Some("chunked"));
        let data = events(&r);
        assert_eq!(data.len(), 4 + 2, "{data:?}");
        for d in &data[..4] {
            let v: serde_json::Value = serde_json::from_str(d).unwrap();
            assert_eq!(v["object"], "chat.completion.chunk");
            assert!(v["usage"].is_null() && v.get("usage").is_some(), "{d}");
            assert_eq!(v["choices"].as_array().map(Vec::len), Some(1));
        }
        let usage: serde_json::Value = serde_json::from_str(&data[4]).unwrap();
        assert_eq!(usage["choices"], serde_json::json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 77);
        assert_eq!(data[5], "[DONE]");
        // One event per chunk, each flushed after the pause before it: the first arrives
        // well before the last is sent.
        assert_eq!(r.chunks.len(), 6);
        let first = r.chunks[0].at;
        let last = r.chunks[5].at;
        assert!(
            last.duration_since(first) >= Duration::from_millis(500),
            "{:?}",
            last - first
        );
        assert_eq!(up.served().sum, 77);
    }

    #[test]
    fn a_stream_without_include_usage_has_no_usage_and_is_unreported() {
        let up = LlmUpstream::start();
        let body = br#"{"model":"m","messages":[],"stream":true}"#;
        let r = post(&up, &[("x-test-usage", b"5")], body).unwrap();
        let data = events(&r);
        assert_eq!(data.len(), DEFAULT_EVENTS as usize + 1);
        assert!(data.iter().all(|d| !d.contains("usage")), "{data:?}");
        assert_eq!(
            up.served(),
            Served {
                sum: 0,
                count: 0,
                unreported: 1
            }
        );
    }

    #[test]
    fn random_usages_are_deterministic_and_within_the_range() {
        let draw = || {
            let up = LlmUpstream::start();
            let got: Vec<u64> = (0..50)
                .map(|_| {
                    let r = post(
                        &up,
                        &[
                            ("x-test-usage-random", b"42"),
                            ("x-test-usage-range", b"10-20"),
                        ],
                        &chat_request("hi", false, None),
                    )
                    .unwrap();
                    json_of(&r)["usage"]["total_tokens"].as_u64().unwrap()
                })
                .collect();
            assert_eq!(up.served().sum, got.iter().sum::<u64>());
            got
        };
        let a = draw();
        assert!(a.iter().all(|n| (10..=20).contains(n)), "{a:?}");
        assert!(
            a.iter().collect::<std::collections::HashSet<_>>().len() > 5,
            "{a:?}"
        );
        assert_eq!(a, draw());
        assert_eq!(parse_range("5-5"), Some((5, 5)));
        assert_eq!(parse_range("6-5"), None);
    }

    /// The usage member's text in a JSON body (the raw bytes, as a bad shape is not
    /// always JSON).
    fn usage_text(body: &[u8]) -> String {
        let text = String::from_utf8_lossy(body);
        text.find(r#""usage""#)
            .map(|at| text[at..].to_string())
            .unwrap_or_default()
    }

    #[test]
    fn each_bad_shape_in_a_json_answer() {
        let up = LlmUpstream::start();
        let ask = |shape: Shape| {
            post(
                &up,
                &[
                    ("x-test-shape", shape.name().as_bytes()),
                    ("x-test-usage", b"40"),
                ],
                &chat_request("hi", false, None),
            )
        };
        let text = |shape| usage_text(&ask(shape).unwrap().body());
        assert!(!String::from_utf8_lossy(&ask(Shape::Missing).unwrap().body()).contains("usage"));
        assert_eq!(
            json_of(&ask(Shape::Null).unwrap())["usage"],
            serde_json::Value::Null
        );
        assert!(text(Shape::Negative).contains(r#""total_tokens":-40"#));
        assert!(text(Shape::Fractional).contains(r#""total_tokens":40.5"#));
        assert!(text(Shape::Huge).contains(r#""total_tokens":100000000000000000000"#));
        assert!(text(Shape::Text).contains(r#""total_tokens":"40""#));
        assert!(text(Shape::Duplicate).contains(r#""total_tokens":40,"total_tokens":1,"#));
        let not_json = ask(Shape::NotJson).unwrap();
        assert_eq!(not_json.header("content-type"), Some("application/json"));
        assert!(serde_json::from_slice::<serde_json::Value>(&not_json.body()).is_err());
        let header = ask(Shape::Header).unwrap();
        assert_eq!(header.header(USAGE_RESPONSE_HEADER), Some("40"));
        assert!(!String::from_utf8_lossy(&header.body()).contains("usage"));
        // Cut: half the promised body, then the close.
        let cut = ask(Shape::Cut).unwrap();
        assert!(!cut.complete);
        let promised: usize = cut.header("content-length").unwrap().parse().unwrap();
        assert_eq!(cut.body().len(), promised / 2);
        // Reset: not a byte.
        let reset = ask(Shape::Reset);
        assert!(reset.is_err(), "{reset:?}");
        // Only the header shape reported a valid usage.
        assert_eq!(
            up.served(),
            Served {
                sum: 40,
                count: 1,
                unreported: 10
            }
        );
        assert_eq!(up.requests(), 11);
    }

    #[test]
    fn each_bad_shape_in_a_stream() {
        let up = LlmUpstream::start();
        let ask = |shape: Shape| {
            post(
                &up,
                &[
                    ("x-test-shape", shape.name().as_bytes()),
                    ("x-test-usage", b"40"),
                ],
                &chat_request("hi", true, None),
            )
        };
        let last_usage = |shape| {
            let r = ask(shape).unwrap();
            assert!(r.complete, "{shape:?}");
            let data = events(&r);
            assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{shape:?}");
            data[data.len() - 2].clone()
        };
        assert!(!last_usage(Shape::Missing).contains(r#""usage":{"#));
        assert!(last_usage(Shape::Null).contains(r#""choices":[],"usage":null}"#));
        assert!(last_usage(Shape::Negative).contains(r#""total_tokens":-40"#));
        assert!(last_usage(Shape::Fractional).contains(r#""total_tokens":40.5"#));
        assert!(last_usage(Shape::Huge).contains(r#""total_tokens":100000000000000000000"#));
        assert!(last_usage(Shape::Text).contains(r#""total_tokens":"40""#));
        assert!(last_usage(Shape::Duplicate).contains(r#""total_tokens":40,"total_tokens":1,"#));
        let not_json = ask(Shape::NotJson).unwrap();
        let data = events(&not_json);
        assert!(
            data[..data.len() - 1]
                .iter()
                .all(|d| d.starts_with("not json")),
            "{data:?}"
        );
        let header = ask(Shape::Header).unwrap();
        assert_eq!(header.header(USAGE_RESPONSE_HEADER), Some("40"));
        assert!(!String::from_utf8_lossy(&header.body()).contains(r#""usage":{"#));
        // Cut inside the usage event, just past the total's value: no blank line after it,
        // no last chunk.
        let cut = ask(Shape::Cut).unwrap();
        assert!(!cut.complete);
        let body = String::from_utf8(cut.body()).unwrap();
        assert!(body.ends_with(r#""total_tokens":40,"#), "{body}");
        assert_eq!(events(&cut).len(), DEFAULT_EVENTS as usize);
        assert!(ask(Shape::Reset).is_err());
        assert_eq!(
            up.served(),
            Served {
                sum: 40,
                count: 1,
                unreported: 10
            }
        );
    }

    #[test]
    fn padding_comes_before_the_usage() {
        let up = LlmUpstream::start();
        for stream in [false, true] {
            let r = post(
                &up,
                &[("x-test-pad", b"100000"), ("x-test-usage", b"9")],
                &chat_request("hi", stream, None),
            )
            .unwrap();
            let body = String::from_utf8(r.body()).unwrap();
            assert!(body.len() > 100_000);
            let pad = body.find(&"x".repeat(100_000)).unwrap();
            assert!(pad < body.find(r#""total_tokens":9"#).unwrap());
        }
        assert_eq!(
            up.served(),
            Served {
                sum: 18,
                count: 2,
                unreported: 0
            }
        );
    }

    #[test]
    fn keep_alive_chunked_requests_and_many_connections() {
        let up = LlmUpstream::start();
        // Three requests on one connection, the second with a chunked body.
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", up.port)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let body = chat_request("keep", true, None);
        let plain = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-test-usage: 3\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        conn.write_all(plain.as_bytes()).unwrap();
        conn.write_all(&body).unwrap();
        assert_eq!(http::read_streamed(&mut reader).unwrap().status, 200);
        let (a, b) = body.split_at(10);
        let chunked = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-test-usage: 4\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n{:x};ext=1\r\n{}\r\n0\r\n\r\n",
            a.len(),
            String::from_utf8_lossy(a),
            b.len(),
            String::from_utf8_lossy(b)
        );
        conn.write_all(chunked.as_bytes()).unwrap();
        let r = http::read_streamed(&mut reader).unwrap();
        assert!(r.complete);
        assert!(events(&r).iter().any(|d| d.contains(r#""total_tokens":4"#)));
        let json = chat_request("keep", false, None);
        let last = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-test-usage: 5\r\nContent-Length: {}\r\n\r\n",
            json.len()
        );
        conn.write_all(last.as_bytes()).unwrap();
        conn.write_all(&json).unwrap();
        let r = http::read_streamed(&mut reader).unwrap();
        assert_eq!(json_of(&r)["usage"]["total_tokens"], 5);
        assert_eq!(up.chunked_requests(), 1);
        assert_eq!(up.open_connections(), 1);
        // Many connections at once, several requests each.
        let workers: Vec<_> = (0..32)
            .map(|_| {
                let (port, last, json) = (up.port, last.clone(), json.clone());
                std::thread::spawn(move || {
                    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                    conn.set_read_timeout(Some(Duration::from_secs(10)))
                        .unwrap();
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    for _ in 0..10 {
                        conn.write_all(last.as_bytes()).unwrap();
                        conn.write_all(&json).unwrap();
                        assert_eq!(http::read_streamed(&mut reader).unwrap().status, 200);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(up.served().sum, 3 + 4 + 5 + 32 * 10 * 5);
        assert_eq!(up.requests(), 3 + 320);
    }

    #[test]
    fn unknown_paths_and_bodies_that_are_not_json() {
        let up = LlmUpstream::start();
        let r = http::post_streamed(up.port, "/v1/embeddings", &[], b"{}").unwrap();
        assert_eq!(r.status, 404);
        let r = http::post_streamed(up.port, "/v1/chat/completions", &[], b"nope").unwrap();
        assert_eq!(r.status, 400);
        let r = post(
            &up,
            &[("x-test-status", b"500")],
            &chat_request("x", false, None),
        )
        .unwrap();
        assert_eq!(r.status, 500);
        assert_eq!(json_of(&r)["usage"]["total_tokens"], DEFAULT_USAGE);
    }

    #[test]
    fn dropping_it_closes_open_connections_and_stops_serving() {
        let up = LlmUpstream::start();
        let port = up.port;
        let mut idle = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        // A stream in progress, paused between events.
        let streaming = std::thread::spawn(move || {
            http::post_streamed(
                port,
                "/v1/chat/completions",
                &[("x-test-event-delay-ms", b"60000")],
                &chat_request("slow", true, None),
            )
        });
        crate::wait_for("two open connections", Duration::from_secs(10), || {
            (up.open_connections() == 2 && up.requests() == 1).then_some(())
        });
        let started = Instant::now();
        drop(up);
        assert!(started.elapsed() < Duration::from_secs(5));
        let mut buf = [0u8; 1];
        assert_eq!(
            idle.read(&mut buf).unwrap_or(0),
            0,
            "the idle connection is closed"
        );
        let r = streaming.join().unwrap().unwrap();
        assert!(!r.complete);
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    }
}
