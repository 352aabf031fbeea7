//! Every parser of outside input under random and mutated input (proptest, seeded): the
//! config, the bridge's replies, the cost header, X-Forwarded-For, the percent-encoder, and
//! the usage readers (JSON bodies and event streams, against serde_json and a reference event
//! parser, split into random chunks; the named formats `openai` and `anthropic` and a list of
//! paths over OpenAI and Anthropic answers, JSON and streamed, mutated and cut, allocating
//! nothing while reading), and the inflater of gzip and deflate bodies (against
//! flate2, mutated, split into random chunks).
//! None may panic, and each answers in its documented classes. `PROPTEST_CASES=N` runs N per
//! parser (`make fuzz`); the counts are printed.

use proptest::prelude::*;
use proptest::test_runner::TestRunner;

mod common;

use ratelimit_core::bridge::{parse_eval_reply, BridgeReply, EvalOutcome};
use ratelimit_core::config::BodyPath;
use ratelimit_core::config::{ClientIpPolicy, Config};
use ratelimit_core::encode::path_segment;
use ratelimit_core::request::address::client_ip;
use ratelimit_core::request::body::{BodyFields, BodyValues};
use ratelimit_core::request::plan::plan;
use ratelimit_core::request::view::BadRequest;
use ratelimit_core::testing::request::FakeRequest;

/// `bytes` cut where `cuts` say (each a fraction of its length), in order: how a body comes
/// in chunks.
fn pieces<'b>(bytes: &'b [u8], cuts: &[f64]) -> Vec<&'b [u8]> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|f| (f * bytes.len() as f64) as usize)
        .collect();
    at.extend([0, bytes.len()]);
    at.sort_unstable();
    at.windows(2).map(|pair| &bytes[pair[0]..pair[1]]).collect()
}

fn runner(cases: u32) -> TestRunner {
    common::seeded_runner(cases, 11)
}

/// Runs `test` on `strategy`, panics with the minimal failing input, returns the cases run.
fn check<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> u32
where
    S::Value: std::fmt::Debug,
{
    let mut runner = runner(cases);
    if let Err(failure) = runner.run(&strategy, test) {
        panic!("{name}: {failure}");
    }
    let run = runner.config().cases;
    println!("{name}: {run} random inputs, none panicked, every answer in its class");
    run
}

const VALID: &str = r#"{"bridge": {"timeout": "150ms"}, "failure_mode": "open",
"rules": [{"name": "api", "match": {"path_prefix": "/api/"}, "key": {"from": ["header:x-api-key", "client_ip"]},
"cost": {"header": "x-cost", "min": 1, "max": 10},
"limits": [{"name": "second", "limit": 10, "window": "1s", "burst": 20}, {"name": "day", "algorithm": "fixed_window", "limit": 1000, "window": "1d"}]}]}"#;

/// The valid config with a few bytes replaced, inserted or removed.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec((0usize..VALID.len(), any::<u8>(), 0u8..3), 1..6).prop_map(|edits| {
        let mut bytes = VALID.as_bytes().to_vec();
        for (at, byte, kind) in edits {
            let at = at.min(bytes.len().saturating_sub(1));
            match kind {
                0 => bytes[at] = byte,
                1 => bytes.insert(at, byte),
                _ => {
                    bytes.remove(at);
                }
            }
        }
        bytes
    })
}

#[test]
fn the_config_parser_answers_every_input_without_panicking() {
    assert!(Config::parse(VALID.as_bytes()).is_ok());
    let classes = |bytes: Vec<u8>| {
        match Config::parse(&bytes) {
            Ok(config) => prop_assert!(!config.rules.is_empty()),
            Err(e) => prop_assert!(!e.message.is_empty(), "an error says what is wrong"),
        }
        Ok(())
    };
    check("config, mutated", 20_000, mutated(), classes);
    check(
        "config, random bytes",
        20_000,
        prop::collection::vec(any::<u8>(), 0..300),
        classes,
    );
}

/// Bridge reply bodies: JSON arrays of random items under a command name, and random bytes.
fn reply_body() -> impl Strategy<Value = Vec<u8>> {
    let item = prop_oneof![
        (-2i64..5).prop_map(|n| n.to_string()),
        "[a-z0-9. ]{0,8}".prop_map(|s| format!("\"{s}\"")),
        Just("false".to_string()),
        Just("null".to_string()),
        Just("{}".to_string()),
        Just("\"NOSCRIPT No matching script\"".to_string()),
    ];
    prop_oneof![
        prop::collection::vec(item, 0..20)
            .prop_map(|items| { format!(r#"{{"EVALSHA":[{}]}}"#, items.join(",")).into_bytes() }),
        prop::collection::vec(any::<u8>(), 0..80),
    ]
}

#[test]
fn the_reply_parser_answers_every_body_without_panicking() {
    let strategy = (
        reply_body(),
        prop::collection::vec(1usize..4, 0..4),
        prop_oneof![Just(None), Just(Some(200u16)), Just(Some(503u16))],
    );
    check(
        "bridge replies",
        50_000,
        strategy,
        |(body, shape, status)| {
            let reply = BridgeReply {
                status,
                body: &body,
            };
            match parse_eval_reply(reply, &shape) {
                Ok(EvalOutcome::Decided(decisions)) => {
                    prop_assert_eq!(decisions.len(), shape.len());
                    for (d, n) in decisions.iter().zip(&shape) {
                        if let Ok(d) = d {
                            prop_assert_eq!(d.limits.len(), *n);
                            prop_assert!(d
                                .limits
                                .iter()
                                .all(|l| l.remaining >= 0.0 && l.retry_ms >= 0.0));
                        }
                    }
                }
                Ok(EvalOutcome::NoScript) | Err(_) => {}
            }
            Ok(())
        },
    );
}

fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..40),
        "[0-9 ,.:\\[\\]a-f-]{0,40}".prop_map(String::into_bytes),
    ]
}

#[test]
fn cost_headers_are_a_whole_number_within_bounds_or_a_400() {
    let config = Config::parse(VALID.as_bytes()).unwrap();
    check("cost header", 50_000, header_value(), |value| {
        let request = FakeRequest {
            headers: vec![
                (":method".into(), b"GET".to_vec()),
                (":path".into(), b"/api/x".to_vec()),
                ("x-cost".into(), value),
            ],
            source: Some("10.0.0.1:1234".into()),
            ..FakeRequest::default()
        };
        match plan(&config, &request) {
            Ok(p) => prop_assert!(p.checks.iter().all(|c| (1..=10).contains(&c.cost))),
            Err(BadRequest(message)) => {
                prop_assert_eq!(message, "x-cost must be a whole number from 1 to 10")
            }
        }
        Ok(())
    });
}

/// A query string of parameters named from a small set (so names repeat), values of any bytes
/// a client can put in a request line, percent-escapes and `+` included.
fn query_string() -> impl Strategy<Value = String> {
    let name = prop_oneof!["k", "key", "k%65y", "x", "k+", ""];
    let value = "[a-zA-Z0-9%+=._~!$'()*,;:@/?-]{0,12}";
    prop::collection::vec((name, value, any::<bool>()), 0..6).prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(n, v, eq)| {
                if eq {
                    format!("{n}={v}")
                } else {
                    n.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("&")
    })
}

#[test]
fn a_query_key_is_its_decoded_value_the_ip_or_a_400() {
    let config = Config::parse(
        br#"{"rules": [{"name": "r", "key": {"from": ["query:key", "client_ip"]},
             "limits": [{"name": "l", "limit": 5, "window": "1s"}]}]}"#,
    )
    .unwrap();
    check("query string", 50_000, query_string(), |query| {
        let request = FakeRequest::new("GET", &format!("/a?{query}"));
        // The parameter named `key` once decoded (`k%65y` is one of them).
        let copies = query
            .split('&')
            .filter(|p| matches!(p.split('=').next(), Some("key" | "k%65y")))
            .count();
        match plan(&config, &request) {
            Ok(p) => {
                prop_assert!(copies <= 1, "{query}: {copies} copies let through");
                let key = &p.checks[0].key;
                prop_assert!(
                    key.starts_with("rl:{query:key:") || key.starts_with("rl:{client_ip:"),
                    "{key}"
                );
            }
            Err(BadRequest(message)) => {
                prop_assert!(copies > 1, "{query}: refused with one copy");
                prop_assert_eq!(message, "query parameter key must be sent once")
            }
        }
        Ok(())
    });
}

#[test]
fn a_metadata_value_is_a_scalar_key_or_absent() {
    let config = Config::parse(
        br#"{"rules": [{"name": "r", "key": {"from": ["metadata:ns:sub", "client_ip"]},
             "limits": [{"name": "l", "limit": 5, "window": "1s"}]}]}"#,
    )
    .unwrap();
    check("metadata value", 50_000, header_value(), |value| {
        let request = FakeRequest::new("GET", "/").with_metadata("ns:sub", &value);
        let p = plan(&config, &request).map_err(|e| TestCaseError::fail(e.0))?;
        let by_claim = p.checks[0].key.starts_with("rl:{metadata:ns:sub:");
        let structure = ratelimit_core::request::source::is_structure(&value);
        prop_assert_eq!(by_claim, !value.is_empty() && !structure, "{:?}", value);
        Ok(())
    });
}

#[test]
fn x_forwarded_for_gives_an_address_or_nothing() {
    let strategy = (header_value(), 1usize..4, 8u8..=32, 16u8..=128);
    check(
        "x-forwarded-for",
        50_000,
        strategy,
        |(xff, hops, v4, v6)| {
            let request = FakeRequest {
                headers: vec![("x-forwarded-for".into(), xff)],
                source: Some("192.0.2.1:5555".into()),
                ..FakeRequest::default()
            };
            let policy = ClientIpPolicy {
                xff_trusted_hops: hops,
                ipv4_prefix: v4,
                ipv6_prefix: v6,
            };
            if let Some(ip) = client_ip(&request, &policy) {
                let address = ip.split('/').next().unwrap_or("");
                prop_assert!(
                    address.parse::<std::net::IpAddr>().is_ok(),
                    "not an address: {ip:?}"
                );
            }
            Ok(())
        },
    );
}

/// Decodes a Webdis path segment as Webdis does (`%XX`, and `+` as a space).
fn decode(segment: &str) -> Option<Vec<u8>> {
    let bytes = segment.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => return None,
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(out)
}

#[test]
fn the_encoder_keeps_every_value_one_intact_segment() {
    check(
        "percent-encoder",
        100_000,
        prop::collection::vec(any::<u8>(), 0..64),
        |value| {
            let segment = path_segment(&value);
            prop_assert!(segment
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_~%".contains(&b)));
            prop_assert_eq!(decode(&segment), Some(value));
            Ok(())
        },
    );
}

// ---- Usage readers -------------------------------------------------------------------------

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ratelimit_core::usage::{
    body_kind, parse_usage_path, BodyKind, Encoding, Inflater, RequestEstimate, Unreadable,
    UsageRead, UsageReader, INFLATER_BYTES, MAX_USAGE, READER_BYTES,
};
use serde_json::{Map, Value};

/// Counts the allocations of the current thread, to show that reading allocates nothing.
struct CountingAlloc;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

const USAGE_PATH: &str = "usage.total_tokens";

fn usage_path() -> Vec<String> {
    parse_usage_path(USAGE_PATH).unwrap()
}

/// Reads `body` split at `cuts` (fractions of its length).
fn read_usage(kind: BodyKind, body: &[u8], cuts: &[f64], complete: bool) -> UsageRead {
    let mut reader = UsageReader::new(kind, &usage_path(), u64::MAX);
    for piece in pieces(body, cuts) {
        reader.feed(piece);
    }
    reader.finish(complete)
}

/// Found and Missing exactly; every unreadable reason alike except a cut stream's.
fn class(read: UsageRead) -> String {
    match read {
        UsageRead::Invalid(Unreadable::Truncated) => "truncated".into(),
        UsageRead::Invalid(_) => "invalid".into(),
        other => format!("{other:?}"),
    }
}

fn kind_of(read: UsageRead) -> String {
    class(read).replace(|c: char| c.is_ascii_digit(), "")
}

/// What serde_json makes of a document: the usage read as the contract says, or `None` when
/// the comparison does not apply (a number serde_json cannot hold, a duplicated key, which
/// serde_json takes the last of).
fn serde_usage(body: &[u8]) -> Option<UsageRead> {
    match serde_json::from_slice::<Value>(body) {
        Err(e) if e.to_string().contains("number out of range") => None,
        Err(_) => Some(UsageRead::Invalid(Unreadable::NotJson)),
        Ok(_) if serde_json::from_slice::<NoDuplicates>(body).is_err() => None,
        Ok(value) => Some(judge(&value, &usage_path())),
    }
}

/// What stands at `path` of a document, as the contract reads it.
fn judge(document: &Value, path: &[String]) -> UsageRead {
    let mut at = Some(document);
    for segment in path {
        at = at.and_then(|v| v.as_object()).and_then(|o| o.get(segment));
    }
    match at {
        None | Some(Value::Null) => UsageRead::Missing,
        Some(v) => match v.as_u64() {
            Some(n) if n <= MAX_USAGE => UsageRead::Found(n),
            _ => UsageRead::Invalid(Unreadable::NotANumber),
        },
    }
}

/// Deserializes only JSON with no key twice in one object.
struct NoDuplicates;

impl<'de> serde::Deserialize<'de> for NoDuplicates {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicates)
    }
}

impl<'de> serde::de::Visitor<'de> for NoDuplicates {
    type Value = NoDuplicates;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON without duplicated keys")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<NoDuplicates>()?.is_some() {}
        Ok(self)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        let mut keys = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !keys.insert(key) {
                return Err(serde::de::Error::custom("duplicated key"));
            }
            map.next_value::<NoDuplicates>()?;
        }
        Ok(self)
    }
}

fn json_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_]{0,8}",
        Just("usage".to_string()),
        Just("total_tokens".to_string()),
        "[\"\\\\/\u{0}-\u{1f}é€😀a\u{7f}]{0,6}",
        any::<String>(),
    ]
}

fn json_key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just("usage".to_string()),
        3 => Just("total_tokens".to_string()),
        1 => Just("prompt_tokens".to_string()),
        3 => json_string(),
    ]
}

/// What may stand at the path: numbers on both sides of each bound, and what is not one.
fn usage_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (0u64..=100_000).prop_map(Value::from),
        1 => (MAX_USAGE - 2..=MAX_USAGE + 2).prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => (-3i64..3).prop_map(Value::from),
        1 => prop_oneof![Just(12.0), Just(1.5), Just(-0.0), Just(1e300), any::<f64>()].prop_map(Value::from),
        1 => Just(Value::Null),
        1 => json_string().prop_map(Value::from),
        1 => Just(serde_json::json!({"total_tokens": 3})),
        1 => Just(serde_json::json!([3])),
        1 => any::<bool>().prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        json_string().prop_map(Value::from),
        usage_value(),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(json_key(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A document: usually an object, often with a `usage` object holding `total_tokens`,
/// compact or pretty, `usage` sometimes written with a `\u` escape.
fn json_document() -> impl Strategy<Value = String> {
    (
        prop::collection::btree_map(json_key(), json_value(), 0..4),
        prop::option::weighted(
            0.8,
            (
                usage_value(),
                prop::collection::btree_map(json_key(), json_value(), 0..3),
            ),
        ),
        0u8..8,
        any::<bool>(),
        any::<bool>(),
        json_value(),
    )
        .prop_map(|(top, usage, style, pretty, escaped, other)| {
            let mut top: Map<String, Value> = top.into_iter().collect();
            if let Some((value, mut rest)) = usage {
                rest.insert("total_tokens".into(), value);
                top.insert("usage".into(), Value::Object(rest.into_iter().collect()));
            }
            let document = if style == 0 {
                other
            } else {
                Value::Object(top)
            };
            let text = if pretty {
                serde_json::to_string_pretty(&document).unwrap()
            } else {
                serde_json::to_string(&document).unwrap()
            };
            if escaped {
                text.replace("\"usage\"", "\"\\u0075sage\"")
            } else {
                text
            }
        })
}

fn mutate(mut bytes: Vec<u8>, edits: Vec<(usize, u8, u8)>) -> Vec<u8> {
    for (at, byte, kind) in edits {
        let at = at % (bytes.len() + 1);
        match kind {
            0 if at < bytes.len() => bytes[at] = byte,
            1 => bytes.insert(at, byte),
            _ if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => {}
        }
    }
    bytes
}

fn edits() -> impl Strategy<Value = Vec<(usize, u8, u8)>> {
    let byte = prop_oneof![
        any::<u8>(),
        prop::sample::select(b"{}[]\",:\\0123456789.-+eEtrunflsa \n\r".to_vec()),
    ];
    prop::collection::vec((any::<usize>(), byte, 0u8..3), 0..4)
}

fn cuts() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(0.0f64..1.0, 0..8)
}

#[test]
fn json_usage_is_read_as_serde_json_reads_it_whatever_the_chunks() {
    let compared = std::cell::Cell::new(0u32);
    let classes = std::cell::RefCell::new(std::collections::BTreeMap::<String, u32>::new());
    let strategy = (json_document(), prop_oneof![Just(vec![]), edits()], cuts());
    let run = check(
        "usage, JSON bodies",
        10_000,
        strategy,
        |(document, edits, cuts)| {
            let body = mutate(document.into_bytes(), edits);
            let whole = read_usage(BodyKind::Json, &body, &[], true);
            let split = read_usage(BodyKind::Json, &body, &cuts, true);
            prop_assert_eq!(split, whole, "split at {:?}", cuts);
            if let Some(expected) = serde_usage(&body) {
                compared.set(compared.get() + 1);
                // serde_json does not tell a cut document from a malformed one.
                let invalid = |read| match read {
                    UsageRead::Invalid(_) => UsageRead::Invalid(Unreadable::NotJson),
                    read => read,
                };
                prop_assert_eq!(
                    class(invalid(whole)),
                    class(expected),
                    "{}",
                    String::from_utf8_lossy(&body)
                );
                *classes
                    .borrow_mut()
                    .entry(kind_of(invalid(whole)))
                    .or_default() += 1;
            }
            Ok(())
        },
    );
    println!(
        "usage, JSON bodies: {} compared with serde_json: {:?}",
        compared.get(),
        classes.borrow()
    );
    assert!(compared.get() > run / 2, "most inputs compared");
    if run >= 1_000 {
        assert_eq!(
            classes.borrow().len(),
            3,
            "Found, Missing and Invalid each drawn"
        );
    }
}

/// The event stream interpretation of the WHATWG HTML standard, on a whole stream at once:
/// the data of each dispatched event, and whether the stream ends inside an event.
fn reference_events(text: &[u8]) -> (Vec<Vec<u8>>, bool) {
    let text = text.strip_prefix(b"\xef\xbb\xbf").unwrap_or(text);
    let mut lines = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < text.len() {
        match text[i] {
            b'\r' => {
                lines.push(&text[start..i]);
                if text.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
                start = i + 1;
            }
            b'\n' => {
                lines.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    let partial_line = start < text.len();
    let mut buffer: Vec<u8> = Vec::new();
    let mut events = Vec::new();
    for line in lines {
        if line.is_empty() {
            if !buffer.is_empty() {
                buffer.pop();
                events.push(std::mem::take(&mut buffer));
            }
            continue;
        }
        if line[0] == b':' {
            continue;
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        if name == b"data" {
            buffer.extend_from_slice(value);
            buffer.push(b'\n');
        }
    }
    (events, !buffer.is_empty() || partial_line)
}

/// An event that says nothing: `[DONE]`, or blank data.
fn says_nothing(data: &[u8]) -> bool {
    data == b"[DONE]" || data.iter().all(|b| b" \t\r\n".contains(b))
}

/// What the reference parser reads of a stream, each event's data judged by serde_json.
/// `None` when serde_json cannot judge.
fn reference_stream(text: &[u8], complete: bool) -> Option<UsageRead> {
    let (events, cut_in_event) = reference_events(text);
    let mut last = None;
    for data in events.iter().filter(|d| !says_nothing(d)) {
        match serde_usage(data)? {
            UsageRead::Missing => {}
            read => last = Some(read),
        }
    }
    Some(match last {
        Some(read) => read,
        None if !complete || cut_in_event => UsageRead::Invalid(Unreadable::Truncated),
        None => UsageRead::Missing,
    })
}

/// Streams of events: JSON documents over one or several data lines, `[DONE]`, comments,
/// other fields, blank data; each line ended by `\n`, `\r\n` or `\r`.
fn event_stream() -> impl Strategy<Value = Vec<u8>> {
    let event = prop_oneof![
        6 => (json_document(), any::<bool>()).prop_map(|(doc, one_line)| {
            let doc = if one_line { doc.replace('\n', " ") } else { doc };
            doc.split('\n').map(|line| format!("data: {line}")).collect::<Vec<_>>()
        }),
        1 => Just(vec!["data: [DONE]".to_string()]),
        1 => Just(vec![": keep-alive".to_string()]),
        1 => Just(vec!["event: message".to_string(), "id: 7".to_string(), "data:{}".to_string()]),
        1 => Just(vec!["data".to_string()]),
        1 => "[a-z: ]{0,12}".prop_map(|line| vec![line]),
    ];
    let ending = prop::sample::select(vec!["\n", "\r\n", "\r"]);
    (
        any::<bool>(),
        prop::collection::vec(
            (
                event,
                prop::collection::vec(ending, 12),
                prop::bool::weighted(0.8),
            ),
            0..6,
        ),
    )
        .prop_map(|(bom, events)| {
            let mut text = if bom {
                "\u{feff}".to_string()
            } else {
                String::new()
            };
            for (lines, endings, blank_line) in events {
                for (line, ending) in lines.iter().zip(endings.iter().cycle()) {
                    text.push_str(line);
                    text.push_str(ending);
                }
                if blank_line {
                    text.push_str(endings[0]);
                }
            }
            text.into_bytes()
        })
}

#[test]
fn event_streams_are_read_as_the_reference_parser_reads_them_whatever_the_chunks() {
    let compared = std::cell::Cell::new(0u32);
    let classes = std::cell::RefCell::new(std::collections::BTreeMap::<String, u32>::new());
    let strategy = (
        event_stream(),
        prop_oneof![Just(vec![]), edits()],
        cuts(),
        prop::option::weighted(0.2, 0.0f64..1.0),
    );
    let run = check(
        "usage, event streams",
        5_000,
        strategy,
        |(stream, edits, cuts, cut)| {
            let mut body = mutate(stream, edits);
            let complete = cut.is_none();
            if let Some(cut) = cut {
                body.truncate((cut * body.len() as f64) as usize);
            }
            let whole = read_usage(BodyKind::EventStream, &body, &[], complete);
            let split = read_usage(BodyKind::EventStream, &body, &cuts, complete);
            prop_assert_eq!(split, whole, "split at {:?}", cuts);
            if let Some(expected) = reference_stream(&body, complete) {
                compared.set(compared.get() + 1);
                prop_assert_eq!(
                    class(whole),
                    class(expected),
                    "{:?}",
                    String::from_utf8_lossy(&body)
                );
                *classes.borrow_mut().entry(kind_of(whole)).or_default() += 1;
            }
            Ok(())
        },
    );
    println!(
        "usage, event streams: {} compared with the reference: {:?}",
        compared.get(),
        classes.borrow()
    );
    assert!(compared.get() > run / 2, "most inputs compared");
    if run >= 1_000 {
        assert_eq!(
            classes.borrow().len(),
            4,
            "Found, Missing, Invalid and truncated each drawn"
        );
    }
}

// ---- Named formats and lists of paths ----------------------------------------------------------

use ratelimit_core::config::UsageSource;
use ratelimit_core::usage::{BodyUsage, PATH_BYTES, READER_BASE_BYTES};

/// The readers under test, built by the config parser from their `from` (so that the names
/// are checked to give these readers): the list reads the output tokens of all three APIs.
const READERS: [(&str, &str); 3] = [
    ("openai", r#""openai""#),
    ("anthropic", r#""anthropic""#),
    (
        "list",
        r#"["body:usage.completion_tokens", "body:usage.output_tokens", "body:response.usage.output_tokens"]"#,
    ),
];

fn body_usage(from: &str) -> BodyUsage {
    let text = format!(
        r#"{{"rules": [{{"name": "llm", "match": {{"path_prefix": "/"}}, "key": {{"from": ["client_ip"]}},
        "limits": [{{"name": "tokens", "limit": 1000, "window": "1m", "usage": {{"from": {from}, "estimate": 10}}}}]}}]}}"#
    );
    let config = Config::parse(text.as_bytes()).unwrap();
    match &config.rules[0].limits[0].usage.as_ref().unwrap().from {
        UsageSource::Body(usage) => usage.clone(),
        other => panic!("{from}: {other:?}"),
    }
}

/// Reads `body` split at `cuts` with `usage`, failing if reading allocates or the reader's size
/// moves or exceeds its documented bound.
fn read_flat(
    kind: BodyKind,
    usage: &BodyUsage,
    body: &[u8],
    cuts: &[f64],
    complete: bool,
) -> Result<UsageRead, TestCaseError> {
    let mut reader = UsageReader::of(kind, usage, 1 << 20);
    let size = reader.memory_bytes();
    prop_assert!(size <= READER_BASE_BYTES + usage.paths().count() * PATH_BYTES);
    // Cut before counting: only the reading must not allocate.
    let pieces = pieces(body, cuts);
    let before = allocations();
    for piece in pieces {
        reader.feed(piece);
    }
    let read = reader.finish(complete);
    prop_assert_eq!(allocations(), before, "reading allocated");
    prop_assert_eq!(reader.memory_bytes(), size);
    Ok(read)
}

/// Each field of `usage` in one document as serde_json reads it (the first of its paths with
/// something there), `None` where serde_json cannot judge (see [`serde_usage`]).
fn serde_fields(data: &[u8], usage: &BodyUsage) -> Option<Vec<UsageRead>> {
    match serde_json::from_slice::<Value>(data) {
        Err(e) if e.to_string().contains("number out of range") => None,
        Err(_) => Some(vec![
            UsageRead::Invalid(Unreadable::NotJson);
            usage.fields.len()
        ]),
        Ok(_) if serde_json::from_slice::<NoDuplicates>(data).is_err() => None,
        Ok(value) => Some(
            usage
                .fields
                .iter()
                .map(|field| {
                    field
                        .paths
                        .iter()
                        .map(|path| judge(&value, path))
                        .find(|read| *read != UsageRead::Missing)
                        .unwrap_or(UsageRead::Missing)
                })
                .collect(),
        ),
    }
}

/// The documented sum: any unreadable field makes the usage unreadable, a required field in
/// no document makes it missing, an optional one counts 0.
fn reference_sum(usage: &BodyUsage, reads: &[Option<UsageRead>]) -> UsageRead {
    let mut total: u128 = 0;
    let mut missing = false;
    for (field, read) in usage.fields.iter().zip(reads) {
        match read.unwrap_or(UsageRead::Missing) {
            UsageRead::Found(n) => total += u128::from(n),
            UsageRead::Missing => missing |= field.required,
            invalid => return invalid,
        }
    }
    if missing {
        UsageRead::Missing
    } else if total > u128::from(MAX_USAGE) {
        UsageRead::Invalid(Unreadable::OutOfRange)
    } else {
        UsageRead::Found(total as u64)
    }
}

/// What `usage` reads of a body by the reference (serde_json, and the reference event parser
/// with the last event carrying each field winning).
fn reference_read(
    kind: BodyKind,
    usage: &BodyUsage,
    body: &[u8],
    complete: bool,
) -> Option<UsageRead> {
    match kind {
        BodyKind::Json => {
            let fields = serde_fields(body, usage)?;
            let reads: Vec<_> = fields.into_iter().map(Some).collect();
            Some(reference_sum(usage, &reads))
        }
        BodyKind::EventStream => {
            let (events, cut_in_event) = reference_events(body);
            let mut last = vec![None; usage.fields.len()];
            for data in events.iter().filter(|d| !says_nothing(d)) {
                for (entry, read) in last.iter_mut().zip(serde_fields(data, usage)?) {
                    if read != UsageRead::Missing {
                        *entry = Some(read);
                    }
                }
            }
            Some(match reference_sum(usage, &last) {
                UsageRead::Missing if !complete || cut_in_event => {
                    UsageRead::Invalid(Unreadable::Truncated)
                }
                read => read,
            })
        }
    }
}

/// A provider's answer as the generator wrote it, and what the reader of its own format (and
/// the list) must read of it, known from the numbers put in.
#[derive(Debug, Clone)]
struct Answer {
    body: Vec<u8>,
    /// By [`READERS`]; `None`: left to the reference alone.
    expected: [Option<UsageRead>; 3],
}

fn tokens() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => 0u64..=100_000,
        1 => MAX_USAGE - 2..=MAX_USAGE + 2,
    ]
}

/// Generated text that looks like what the readers look for.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => json_string(),
        1 => Just(r#"{"usage":{"total_tokens":9,"input_tokens":9}}"#.to_string()),
        1 => Just("data: [DONE]\n\nevent: message_delta\n".to_string()),
    ]
}

fn sum(numbers: &[u64]) -> UsageRead {
    let total: u128 = numbers.iter().map(|&n| u128::from(n)).sum();
    if numbers.iter().any(|&n| n > MAX_USAGE) || total > u128::from(MAX_USAGE) {
        UsageRead::Invalid(Unreadable::OutOfRange)
    } else {
        UsageRead::Found(total as u64)
    }
}

/// Events as a server writes them: an optional `event:` line, the data on one line (or, pretty,
/// over several data lines), a blank line.
fn events(events: &[(&str, Value)], ending: &str, pretty: bool) -> String {
    let mut text = String::new();
    for (name, data) in events {
        if !name.is_empty() {
            text.push_str(&format!("event: {name}{ending}"));
        }
        let data = if pretty {
            serde_json::to_string_pretty(data).unwrap()
        } else {
            serde_json::to_string(data).unwrap()
        };
        for line in data.split('\n') {
            text.push_str(&format!("data: {line}{ending}"));
        }
        text.push_str(ending);
    }
    text
}

/// What an answer is drawn from: numbers (`n`), texts, options (`flags`), the line ending of
/// a stream, and whether its JSON is pretty (in a stream, over several data lines).
#[derive(Debug, Clone)]
struct Draw {
    stream: bool,
    n: [u64; 5],
    texts: Vec<String>,
    flags: u8,
    ending: &'static str,
    pretty: bool,
}

impl Draw {
    fn json(&self, document: &Value) -> String {
        if self.pretty {
            serde_json::to_string_pretty(document).unwrap()
        } else {
            serde_json::to_string(document).unwrap()
        }
    }

    fn events(&self, list: &[(&str, Value)]) -> String {
        events(list, self.ending, self.pretty)
    }
}

/// A chat completion (or a chunk stream with its usage chunk and `[DONE]`): its own total; the
/// list takes `completion_tokens`, first of its paths, over an `output_tokens` also there.
fn chat_answer(d: &Draw) -> (String, [Option<UsageRead>; 3]) {
    use serde_json::json;
    let [p, c, t, x, _] = d.n;
    let mut usage = json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": t});
    if d.flags & 1 != 0 {
        usage["output_tokens"] = json!(x);
    }
    let body = if d.stream {
        let chunk = |content: &str| {
            let choice = json!({"index": 0, "delta": {"content": content}});
            json!({"id": "chatcmpl-1", "choices": [choice], "usage": null})
        };
        let mut list: Vec<(&str, Value)> = d.texts.iter().map(|s| ("", chunk(s))).collect();
        list.push((
            "",
            json!({"id": "chatcmpl-1", "choices": [], "usage": usage}),
        ));
        d.events(&list) + &format!("data: [DONE]{0}{0}", d.ending)
    } else {
        let message = json!({"role": "assistant", "content": d.texts.concat()});
        d.json(&json!({"id": "chatcmpl-1", "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": usage}))
    };
    (body, [Some(sum(&[t])), None, Some(sum(&[c]))])
}

/// The Responses API: the usage in its JSON, or in its stream's `response.completed` after
/// a `response.created` whose usage is null.
fn responses_answer(d: &Draw) -> (String, [Option<UsageRead>; 3]) {
    use serde_json::json;
    let [p, c, t, _, _] = d.n;
    let usage = json!({"input_tokens": p, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": c, "total_tokens": t});
    let body = if d.stream {
        let created = json!({"type": "response.created", "sequence_number": 0,
            "response": {"id": "resp_1", "status": "in_progress", "usage": null}});
        let mut list = vec![("response.created", created)];
        for (i, s) in d.texts.iter().enumerate() {
            let delta = json!({"type": "response.output_text.delta",
                "sequence_number": i + 1, "delta": s});
            list.push(("response.output_text.delta", delta));
        }
        let mut text = d.events(&list);
        if d.flags & 2 != 0 {
            text.push_str(&format!(": keep-alive{0}{0}", d.ending));
        }
        let completed = json!({"type": "response.completed",
            "response": {"id": "resp_1", "status": "completed", "usage": usage}});
        text + &d.events(&[("response.completed", completed)])
    } else {
        let output = json!([{"type": "message",
            "content": [{"type": "output_text", "text": d.texts.concat()}]}]);
        d.json(
            &json!({"id": "resp_1", "object": "response", "status": "completed",
            "output": output, "usage": usage}),
        )
    };
    (body, [Some(sum(&[t])), None, Some(sum(&[c]))])
}

/// An Anthropic message: input, output and the cache counts present, added up. A stream has
/// them in `message_start` (output 1), then 0 to 3 `message_delta` with cumulative output
/// counts, the last `c`; some servers repeat the input counts there, or send them null.
fn anthropic_answer(d: &Draw) -> (String, [Option<UsageRead>; 3]) {
    use serde_json::json;
    let [p, c, _, x, y] = d.n;
    let mut cache = Map::new();
    let mut counted = vec![p];
    if d.flags & 1 != 0 {
        cache.insert("cache_creation_input_tokens".into(), json!(x));
        counted.push(x);
    }
    if d.flags & 2 != 0 {
        cache.insert("cache_read_input_tokens".into(), json!(y));
        counted.push(y);
    }
    if !d.stream {
        let mut usage = cache;
        usage.insert("input_tokens".into(), json!(p));
        usage.insert("output_tokens".into(), json!(c));
        counted.push(c);
        let body = d.json(
            &json!({"id": "msg_1", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": d.texts.concat()}],
            "stop_reason": "end_turn", "usage": usage}),
        );
        return (body, [None, Some(sum(&counted)), Some(sum(&[c]))]);
    }
    let mut start = cache.clone();
    start.insert("input_tokens".into(), json!(p));
    start.insert("output_tokens".into(), json!(1));
    let message = json!({"id": "msg_1", "type": "message", "role": "assistant",
        "content": [], "usage": start});
    let block = json!({"type": "text", "text": ""});
    let mut list = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": message}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": block}),
        ),
    ];
    for s in &d.texts {
        let delta = json!({"type": "text_delta", "text": s});
        list.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": delta}),
        ));
    }
    if d.flags & 4 != 0 {
        list.push(("ping", json!({"type": "ping"})));
    }
    list.push((
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    let deltas = u64::from(d.flags >> 3 & 3);
    for j in 1..=deltas {
        let mut usage = Map::new();
        usage.insert("output_tokens".into(), json!(c * j / deltas));
        match d.flags >> 5 & 3 {
            1 => {
                usage.extend(cache.clone());
                usage.insert("input_tokens".into(), json!(p));
            }
            2 => {
                usage.insert("input_tokens".into(), Value::Null);
            }
            _ => {}
        }
        list.push((
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": "end_turn"}, "usage": usage}),
        ));
    }
    list.push(("message_stop", json!({"type": "message_stop"})));
    counted.push(if deltas > 0 { c } else { 1 });
    let output = if deltas > 0 {
        sum(&[c])
    } else {
        UsageRead::Missing
    };
    (d.events(&list), [None, Some(sum(&counted)), Some(output)])
}

/// An OpenAI chat completion or Responses API answer, or an Anthropic message, as JSON or as
/// a stream by `kind`, from random numbers and texts.
fn provider_answer(kind: BodyKind) -> impl Strategy<Value = Answer> {
    (
        0u8..3,
        prop::array::uniform5(tokens()),
        prop::collection::vec(text(), 0..4),
        any::<u8>(),
        prop::sample::select(vec!["\n", "\r\n", "\r"]),
        any::<bool>(),
    )
        .prop_map(move |(family, n, texts, flags, ending, pretty)| {
            let draw = Draw {
                stream: kind == BodyKind::EventStream,
                n,
                texts,
                flags,
                ending,
                pretty,
            };
            let (body, expected) = match family {
                0 => chat_answer(&draw),
                1 => responses_answer(&draw),
                _ => anthropic_answer(&draw),
            };
            Answer {
                body: body.into_bytes(),
                expected,
            }
        })
}

/// Answers, and random bytes (some drawn from the readers' vocabulary) with no expectation.
fn answer_or_noise(kind: BodyKind) -> impl Strategy<Value = Answer> {
    let noise = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        "(data: |event: |\\{|\\}|\"usage\"|\"message\"|\"total_tokens\"|\"input_tokens\"|\"output_tokens\"|:|,|[0-9]|\n|\r| ){0,40}"
            .prop_map(String::into_bytes),
    ]
    .prop_map(|body| Answer {
        body,
        expected: [None; 3],
    });
    prop_oneof![4 => provider_answer(kind), 1 => noise]
}

/// Runs the three readers over `kind` bodies: mutated, cut, split into chunks.
fn read_formats(name: &str, kind: BodyKind, cases: u32) {
    let usages = READERS.map(|(_, from)| body_usage(from));
    let tally = std::cell::RefCell::new(std::collections::BTreeMap::<String, u32>::new());
    let count = |key: String| *tally.borrow_mut().entry(key).or_default() += 1;
    let strategy = (
        answer_or_noise(kind),
        prop_oneof![Just(vec![]), edits()],
        cuts(),
        prop::option::weighted(0.2, 0.0f64..1.0),
    );
    let run = check(name, cases, strategy, |(answer, edits, cuts, cut)| {
        let mutated = !edits.is_empty();
        let mut body = mutate(answer.body.clone(), edits);
        let complete = cut.is_none();
        if let Some(cut) = cut {
            body.truncate((cut * body.len() as f64) as usize);
        }
        // serde_json does not tell a cut document from a malformed one; a stream, it does.
        let class_of = |read| match (kind, read) {
            (BodyKind::Json, UsageRead::Invalid(_)) => "invalid".to_string(),
            (_, read) => class(read),
        };
        for (((reader, _), usage), expected) in READERS.iter().zip(&usages).zip(answer.expected) {
            let whole = read_flat(kind, usage, &body, &[], complete)?;
            let split = read_flat(kind, usage, &body, &cuts, complete)?;
            prop_assert_eq!(split, whole, "{} split at {:?}", reader, cuts);
            let shown = || format!("{reader}: {:?}", String::from_utf8_lossy(&body));
            if !mutated && complete {
                if let Some(expected) = expected {
                    prop_assert_eq!(class_of(whole), class_of(expected), "{}", shown());
                }
            }
            let reference = reference_read(kind, usage, &body, complete);
            if !mutated && complete && expected.is_some() {
                prop_assert!(reference.is_some(), "the reference judges every answer");
            }
            let Some(reference) = reference else {
                continue;
            };
            prop_assert_eq!(class_of(whole), class_of(reference), "{}", shown());
            count(format!("{reader} {}", kind_of(reference)));
            // A mutation that left the usage as it was: the unmutated answer, exactly.
            if mutated && expected.is_some() {
                let unmutated = reference_read(kind, usage, &answer.body, true);
                if unmutated == Some(reference) && matches!(reference, UsageRead::Found(_)) {
                    prop_assert_eq!(whole, reference);
                    count(format!("{reader} mutated, usage kept"));
                }
            }
        }
        Ok(())
    });
    let tally = tally.into_inner();
    println!("{name}: classes compared with the reference: {tally:?}");
    if run >= 1_000 {
        for (reader, _) in READERS {
            for class in ["Found()", "Missing", "invalid", "mutated, usage kept"] {
                assert!(
                    tally.contains_key(&format!("{reader} {class}")),
                    "{reader}: no {class:?} drawn"
                );
            }
        }
    }
}

#[test]
fn named_formats_and_lists_of_paths_read_json_bodies_as_serde_json_does() {
    read_formats("usage formats, JSON bodies", BodyKind::Json, 3_000);
}

#[test]
fn named_formats_and_lists_of_paths_read_event_streams_as_the_reference_does() {
    read_formats("usage formats, event streams", BodyKind::EventStream, 3_000);
}

#[test]
fn request_estimates_are_the_same_whatever_the_chunks() {
    let strategy = (json_document(), prop_oneof![Just(vec![]), edits()], cuts());
    check(
        "usage, request estimates",
        5_000,
        strategy,
        |(document, edits, cuts)| {
            let body = mutate(document.replace("usage", "max_tokens").into_bytes(), edits);
            let estimate = |cuts: &[f64]| {
                let mut estimate = RequestEstimate::new(1 << 20);
                for piece in pieces(&body, cuts) {
                    estimate.feed(piece);
                }
                estimate.finish(1024)
            };
            let whole = estimate(&[]);
            prop_assert_eq!(estimate(&cuts), whole);
            let expected = match serde_json::from_slice::<Value>(&body) {
                Ok(Value::Object(o)) if serde_json::from_slice::<NoDuplicates>(&body).is_ok() => {
                    match o.get("max_tokens").and_then(Value::as_u64) {
                        Some(n) if n <= MAX_USAGE => n,
                        _ => 1024,
                    }
                }
                Err(e) if e.to_string().contains("number out of range") => return Ok(()),
                Ok(Value::Object(_)) => return Ok(()),
                _ => 1024,
            };
            prop_assert_eq!(whole, Ok(body.len() as u64 + expected));
            Ok(())
        },
    );
}

#[test]
fn content_types_are_read_by_media_type_only() {
    check(
        "usage, content types",
        20_000,
        ("[a-zA-Z+/;=. -]{0,30}", any::<bool>()),
        |(value, upper)| {
            let value = if upper { value.to_uppercase() } else { value };
            let media = value.split(';').next().unwrap().trim().to_ascii_lowercase();
            let expected = if media == "text/event-stream" {
                Some(BodyKind::EventStream)
            } else if media == "application/json"
                || (media.starts_with("application/")
                    && media.ends_with("+json")
                    && media != "application/+json")
            {
                Some(BodyKind::Json)
            } else {
                None
            };
            prop_assert_eq!(body_kind(value.as_bytes()), expected);
            Ok(())
        },
    );
}

/// A 10 MB JSON body with a 1 MB string and a 10 MB event stream: the readers allocate
/// nothing while reading and keep their size.
#[test]
fn usage_readers_hold_constant_memory_on_large_bodies() {
    let string = "x".repeat(1 << 20);
    let mut json = String::from("{\"a\":[");
    while json.len() < 10 << 20 {
        json.push_str(&format!(
            "{{\"s\":\"{string}\",\"n\":[1,2.5,{{\"usage\":null}}]}},"
        ));
    }
    json.push_str("0],\"usage\":{\"total_tokens\":42}}");
    let mut events = String::new();
    while events.len() < 10 << 20 {
        events.push_str(&format!(
            "data: {{\"s\":\"{}\",\"usage\":null}}\n\n",
            &string[..1000]
        ));
    }
    events.push_str("data: {\"usage\":{\"total_tokens\":42}}\n\ndata: [DONE]\n\n");
    for (kind, body) in [
        (BodyKind::Json, json.as_bytes()),
        (BodyKind::EventStream, events.as_bytes()),
    ] {
        let mut reader = UsageReader::new(kind, &usage_path(), u64::MAX);
        let size = reader.memory_bytes();
        assert!(size <= READER_BYTES, "{size}");
        let before = allocations();
        let started = std::time::Instant::now();
        for chunk in body.chunks(16 << 10) {
            reader.feed(chunk);
        }
        let read = reader.finish(true);
        let took = started.elapsed();
        assert_eq!(allocations(), before, "{kind:?}: reading allocated");
        assert_eq!(reader.memory_bytes(), size);
        assert_eq!(read, UsageRead::Found(42), "{kind:?}");
        println!(
            "{kind:?}: {} MB read in {took:?} by a {size}-byte reader, no allocation",
            body.len() >> 20
        );
    }
    let mut estimate = RequestEstimate::new(u64::MAX);
    let before = allocations();
    estimate.feed(json.as_bytes());
    assert_eq!(estimate.finish(5), Ok(json.len() as u64 + 5));
    assert_eq!(allocations(), before, "estimating allocated");
}

// ---- Compressed bodies -----------------------------------------------------------------------

use e2e::llm::{compress, Coding};
use std::io::Read;

/// What flate2 inflates `bytes` to, or None where it finds them invalid: every gzip member
/// read (RFC 1952 allows several); `deflate` as zlib when its first two bytes are a zlib
/// header (RFC 1950: method 8, a window of at most 32 KiB, the check bits), else raw.
fn flate2_inflate(coding: Coding, bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let zlib = match bytes {
        [cmf, flg, ..] => {
            cmf & 0x0f == 8 && cmf >> 4 <= 7 && (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 == 0
        }
        _ => false,
    };
    let read = match coding {
        Coding::Gzip => flate2::read::MultiGzDecoder::new(bytes).read_to_end(&mut out),
        Coding::Deflate | Coding::DeflateRaw if zlib => {
            flate2::read::ZlibDecoder::new(bytes).read_to_end(&mut out)
        }
        Coding::Deflate | Coding::DeflateRaw => {
            flate2::read::DeflateDecoder::new(bytes).read_to_end(&mut out)
        }
    };
    read.ok().map(|_| out)
}

/// Inflates `bytes` split at `cuts`: what came out, whether it ended whole, whether it failed.
fn inflate_split(coding: Coding, bytes: &[u8], cuts: &[f64], bound: u64) -> (Vec<u8>, bool, bool) {
    let encoding = match coding {
        Coding::Gzip => Encoding::Gzip,
        Coding::Deflate | Coding::DeflateRaw => Encoding::Deflate,
    };
    let mut inflater = Inflater::new(encoding, bound).unwrap();
    let mut out = Vec::new();
    for piece in pieces(bytes, cuts) {
        inflater.feed(piece, &mut |b| out.extend_from_slice(b));
    }
    (out, inflater.ended(), inflater.failed().is_some())
}

#[test]
fn compressed_bodies_are_inflated_as_flate2_inflates_them_whatever_the_chunks() {
    let agreed = std::cell::Cell::new(0u32);
    let strategy = (
        json_document(),
        prop::sample::select(Coding::ALL.to_vec()),
        prop_oneof![Just(vec![]), edits()],
        cuts(),
    );
    let run = check(
        "inflate, gzip and deflate bodies",
        5_000,
        strategy,
        |(document, coding, edits, cuts)| {
            let packed = compress(coding, document.as_bytes()).unwrap();
            let unmutated = edits.is_empty();
            let bytes = mutate(packed, edits);
            let whole = inflate_split(coding, &bytes, &[], 1 << 20);
            let split = inflate_split(coding, &bytes, &cuts, 1 << 20);
            prop_assert_eq!(&split, &whole, "split at {:?}", cuts);
            let (out, ended, failed) = whole;
            if unmutated {
                prop_assert!(ended && !failed && out == document.as_bytes());
            }
            // What flate2 reads whole, this reads the same; deflate, nothing more.
            if let Some(expected) = flate2_inflate(coding, &bytes) {
                agreed.set(agreed.get() + 1);
                prop_assert!(ended && !failed, "{coding:?}: flate2 read it");
                prop_assert_eq!(out, expected);
            } else if ended && !failed {
                // Accepted where flate2 refuses: only header fields this does not check.
                prop_assert_eq!(coding, Coding::Gzip);
            }
            // Bounded: a small bound stops it, never past the bound.
            let (small, _, _) = inflate_split(coding, &bytes, &cuts, 64);
            prop_assert!(small.len() <= 64);
            Ok(())
        },
    );
    println!(
        "inflate: {} of {run} agreed with flate2 on a valid stream",
        agreed.get()
    );
    assert!(agreed.get() > run / 3, "enough valid inputs");
}

/// A 10 MB JSON body gzip-compressed: the inflater allocates nothing while inflating, keeps its
/// size, and the usage is read through it.
#[test]
fn an_inflater_holds_constant_memory_on_a_large_body() {
    let mut json = String::from("{\"a\":[");
    let mut i = 0u64;
    while json.len() < 10 << 20 {
        json.push_str(&format!(
            "{{\"n\":{},\"s\":\"{:x}\"}},",
            i,
            i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ));
        i += 1;
    }
    json.push_str("0],\"usage\":{\"total_tokens\":42}}");
    for coding in Coding::ALL {
        let packed = compress(coding, json.as_bytes()).unwrap();
        let encoding = if coding == Coding::Gzip {
            Encoding::Gzip
        } else {
            Encoding::Deflate
        };
        let mut inflater = Inflater::new(encoding, u64::MAX).unwrap();
        let size = inflater.memory_bytes();
        assert!(size <= INFLATER_BYTES, "{size}");
        let mut reader = UsageReader::new(BodyKind::Json, &usage_path(), u64::MAX);
        let before = allocations();
        let started = std::time::Instant::now();
        for chunk in packed.chunks(16 << 10) {
            inflater.feed(chunk, &mut |b| reader.feed(b));
        }
        let took = started.elapsed();
        assert_eq!(allocations(), before, "{coding:?}: inflating allocated");
        assert!(
            inflater.ended() && inflater.failed().is_none(),
            "{coding:?}"
        );
        assert_eq!(reader.finish(true), UsageRead::Found(42), "{coding:?}");
        println!(
            "{coding:?}: {} MB ({} KB compressed) inflated and read in {took:?}, {size}-byte inflater, no allocation",
            json.len() >> 20,
            packed.len() >> 10
        );
    }
}

/// The `body:` values of `paths` in `body`, fed in the pieces `cuts` make.
fn body_values(body: &[u8], paths: &[BodyPath], cuts: &[f64]) -> BodyValues {
    let mut fields = BodyFields::new(paths);
    for piece in pieces(body, cuts) {
        fields.feed(piece);
    }
    fields.values(body.len() as u64, &mut |from, len| {
        let from = (from as usize).min(body.len());
        body[from..(from + len).min(body.len())].to_vec()
    })
}

/// What a `body:` source gives at `path` of a valid document: a non-empty string of at most
/// 4096 bytes, a number, a bool; None for the rest.
fn reference_body_value(document: &Value, path: &[String]) -> Option<Value> {
    let mut at = document;
    for key in path {
        at = at.as_object()?.get(key)?;
    }
    match at {
        Value::String(s) if s.is_empty() || s.len() > 4096 => None,
        Value::String(_) | Value::Number(_) | Value::Bool(_) => Some(at.clone()),
        _ => None,
    }
}

/// The paths the body tests read: through `usage`, and beside it.
fn body_paths() -> Vec<BodyPath> {
    [
        vec!["usage"],
        vec!["usage", "total_tokens"],
        vec!["total_tokens"],
    ]
    .into_iter()
    .map(|keys| BodyPath {
        keys: keys.into_iter().map(String::from).collect(),
    })
    .collect()
}

/// A `body:` value's bytes as the JSON value they stand for: a string's decoded text when a
/// string is expected, else a number or a bool as written.
fn as_value(bytes: &[u8], expected: &Option<Value>) -> Value {
    match expected {
        Some(Value::String(_)) => Value::String(String::from_utf8_lossy(bytes).into()),
        _ => serde_json::from_slice(bytes).unwrap_or(Value::Null),
    }
}

#[test]
fn body_values_are_read_as_serde_json_reads_them_whatever_the_chunks() {
    let paths = body_paths();
    let compared = Cell::new(0u32);
    let found = Cell::new(0u32);
    let strategy = (json_document(), prop_oneof![Just(vec![]), edits()], cuts());
    let run = check(
        "body: values",
        10_000,
        strategy,
        |(document, edits, cuts)| {
            let body = mutate(document.into_bytes(), edits);
            let whole = body_values(&body, &paths, &[]);
            prop_assert_eq!(
                &body_values(&body, &paths, &cuts),
                &whole,
                "split at {:?}",
                cuts
            );
            let parsed = serde_json::from_slice::<Value>(&body);
            if parsed
                .as_ref()
                .is_err_and(|e| e.to_string().contains("number out of range"))
            {
                // Valid JSON serde_json cannot hold (9e999): no reference.
                return Ok(());
            }
            let Ok(value) = parsed else {
                // Not JSON (or cut): refused, as the upstream could read it otherwise; blank:
                // absent.
                let blank = body.iter().all(|b| b" \t\r\n".contains(b));
                for path in &paths {
                    if blank {
                        prop_assert_eq!(whole.get(path), Ok(None));
                    } else {
                        prop_assert!(
                            whole.get(path).is_err(),
                            "{}",
                            String::from_utf8_lossy(&body)
                        );
                    }
                }
                return Ok(());
            };
            if serde_json::from_slice::<NoDuplicates>(&body).is_err() {
                return Ok(());
            }
            compared.set(compared.get() + 1);
            for path in &paths {
                let ours = whole.get(path).map_err(|e| TestCaseError::fail(e.0))?;
                let expected = reference_body_value(&value, &path.keys);
                // Ours are bytes: a string's decoded text, a number or bool as written.
                let ours = ours.map(|bytes| as_value(bytes, &expected));
                found.set(found.get() + u32::from(ours.is_some()));
                prop_assert_eq!(
                    ours,
                    expected,
                    "{:?} in {}",
                    path.keys,
                    String::from_utf8_lossy(&body)
                );
            }
            Ok(())
        },
    );
    println!(
        "body: values: {} documents compared with serde_json, {} values found",
        compared.get(),
        found.get()
    );
    assert!(compared.get() > run / 2, "most inputs compared");
    assert!(found.get() > run / 4, "values drawn");
}

#[test]
fn a_body_key_sent_twice_refuses_only_the_paths_through_it() {
    let paths = body_paths();
    let drawn = Cell::new(0u32);
    let strategy = (json_document(), cuts(), any::<bool>());
    let run = check(
        "body: keys sent twice",
        5_000,
        strategy,
        |(document, cuts, escaped)| {
            let Ok(Value::Object(top)) = serde_json::from_str::<Value>(&document) else {
                return Ok(());
            };
            if !top.contains_key("usage")
                || serde_json::from_str::<NoDuplicates>(&document).is_err()
            {
                return Ok(());
            }
            drawn.set(drawn.get() + 1);
            // A second `usage` first, written plainly or escaped: the limiter must not pick
            // one copy when the upstream could pick the other.
            let first = if escaped {
                r#""\u0075sage""#
            } else {
                r#""usage""#
            };
            let rest = document.trim_start().strip_prefix('{').unwrap_or_default();
            let body = format!("{{{first}: 1, {rest}");
            let values = body_values(body.as_bytes(), &paths, &cuts);
            for path in &paths[..2] {
                let refused = values.get(path).map_err(|e| e.0);
                prop_assert!(
                    refused
                        .as_ref()
                        .is_err_and(|m| m.contains("must be sent once")),
                    "{:?} in {}: {:?}",
                    path.keys,
                    body,
                    refused
                );
            }
            // A path that does not run through the repeated key reads as before.
            let other = values
                .get(&paths[2])
                .map_err(|e| TestCaseError::fail(e.0))?;
            let expected = reference_body_value(&Value::Object(top), &paths[2].keys);
            let other = other.map(|bytes| as_value(bytes, &expected));
            prop_assert_eq!(other, expected, "{}", body);
            Ok(())
        },
    );
    println!(
        "body: keys sent twice: {} documents drawn with a repeated key",
        drawn.get()
    );
    assert!(
        drawn.get() > run / 4,
        "documents with a top-level usage drawn"
    );
}
