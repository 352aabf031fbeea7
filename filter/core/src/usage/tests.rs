use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use Unreadable::*;
use UsageRead::{Found, Invalid, Missing};

fn path(text: &str) -> Vec<String> {
    parse_usage_path(text).unwrap()
}

/// Reads `body` in one chunk, then byte by byte, and checks both agree.
fn read(kind: BodyKind, at: &str, body: &[u8], complete: bool) -> UsageRead {
    let mut whole = UsageReader::new(kind, &path(at), 1 << 20);
    whole.feed(body);
    let one = whole.finish(complete);
    let mut bytes = UsageReader::new(kind, &path(at), 1 << 20);
    for b in body {
        bytes.feed(std::slice::from_ref(b));
    }
    assert_eq!(
        bytes.finish(complete),
        one,
        "byte by byte: {:?}",
        String::from_utf8_lossy(body)
    );
    one
}

fn json(body: &str) -> UsageRead {
    read(BodyKind::Json, "usage.total_tokens", body.as_bytes(), true)
}

const CHAT_COMPLETION: &str = r#"{
  "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
  "object": "chat.completion",
  "created": 1741569952,
  "model": "gpt-4.1-2025-04-14",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "Hello! How can I assist you today? \"usage\": {\"total_tokens\": 1}",
        "refusal": null,
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 19,
    "completion_tokens": 10,
    "total_tokens": 29,
    "prompt_tokens_details": {
      "cached_tokens": 0,
      "audio_tokens": 0
    },
    "completion_tokens_details": {
      "reasoning_tokens": 0,
      "audio_tokens": 0,
      "accepted_prediction_tokens": 0,
      "rejected_prediction_tokens": 0
    }
  },
  "service_tier": "default"
}"#;

#[test]
fn an_openai_chat_completion_gives_each_usage_field() {
    for (at, expected) in [
        ("usage.total_tokens", Found(29)),
        ("usage.prompt_tokens", Found(19)),
        ("usage.completion_tokens", Found(10)),
        ("usage.prompt_tokens_details.cached_tokens", Found(0)),
        ("usage.completion_tokens_details.reasoning_tokens", Found(0)),
        ("created", Found(1741569952)),
        ("usage.missing", Missing),
        ("usage", Invalid(NotANumber)),
        ("model", Invalid(NotANumber)),
        ("choices.usage", Missing),
        ("usage.total_tokens.deeper", Missing),
    ] {
        assert_eq!(
            read(BodyKind::Json, at, CHAT_COMPLETION.as_bytes(), true),
            expected,
            "{at}"
        );
    }
}

#[test]
fn json_bodies_each_case() {
    let cases: &[(&str, UsageRead)] = &[
        (r#"{"usage": {"total_tokens": 0}}"#, Found(0)),
        (
            r#"{"usage":{"total_tokens":1000000000000}}"#,
            Found(MAX_USAGE),
        ),
        (r#" {"usage":{"total_tokens":7}} "#, Found(7)),
        (
            r#"{"a":[1,{"usage":{"total_tokens":5}}],"usage":{"total_tokens":8}}"#,
            Found(8),
        ),
        (r#"{"usage":{"x":{"total_tokens":5}}}"#, Missing),
        (r#"{"\u0075sage":{"total_tokens":9}}"#, Found(9)),
        (r#"{"usage":{"total_token\u0073":9}}"#, Found(9)),
        (r#"{"usage ":{"total_tokens":9}}"#, Missing),
        (r#"{"usagex":{"total_tokens":9}}"#, Missing),
        (r#"{"usag":{"total_tokens":9}}"#, Missing),
        // `null` at the path or on the way is absent.
        (r#"{"usage":{"total_tokens":null}}"#, Missing),
        (r#"{"usage":null}"#, Missing),
        (r#"{"usage":3}"#, Missing),
        (r#"{"usage":[{"total_tokens":3}]}"#, Missing),
        (r#"{}"#, Missing),
        (r#"[{"usage":{"total_tokens":3}}]"#, Missing),
        (r#"42"#, Missing),
        (r#""usage""#, Missing),
        // Not a whole number in range.
        (r#"{"usage":{"total_tokens":-1}}"#, Invalid(Negative)),
        (r#"{"usage":{"total_tokens":-0}}"#, Invalid(Negative)),
        (r#"{"usage":{"total_tokens":1.5}}"#, Invalid(NotAnInteger)),
        (r#"{"usage":{"total_tokens":12.0}}"#, Invalid(NotAnInteger)),
        (r#"{"usage":{"total_tokens":1e3}}"#, Invalid(NotAnInteger)),
        (r#"{"usage":{"total_tokens":1E+3}}"#, Invalid(NotAnInteger)),
        (
            r#"{"usage":{"total_tokens":1000000000001}}"#,
            Invalid(OutOfRange),
        ),
        (
            r#"{"usage":{"total_tokens":99999999999999999999999999}}"#,
            Invalid(OutOfRange),
        ),
        (r#"{"usage":{"total_tokens":"29"}}"#, Invalid(NotANumber)),
        (r#"{"usage":{"total_tokens":true}}"#, Invalid(NotANumber)),
        (r#"{"usage":{"total_tokens":{}}}"#, Invalid(NotANumber)),
        (r#"{"usage":{"total_tokens":[29]}}"#, Invalid(NotANumber)),
        // Duplicates on the path, in one object.
        (
            r#"{"usage":{"total_tokens":1,"total_tokens":1}}"#,
            Invalid(DuplicateKey),
        ),
        (
            r#"{"usage":{"total_tokens":1},"usage":{"x":1}}"#,
            Invalid(DuplicateKey),
        ),
        (
            r#"{"usage":{"total_tokens":1},"\u0075sage":null}"#,
            Invalid(DuplicateKey),
        ),
        (
            r#"{"usage":{"total_tokens":1,"x":{"total_tokens":2}}}"#,
            Found(1),
        ),
        (
            r#"{"a":{"usage":1},"a":{"usage":2},"usage":{"total_tokens":4}}"#,
            Found(4),
        ),
        // Malformed anywhere, even after the value.
        (r#"{"usage":{"total_tokens":29}},"#, Invalid(NotJson)),
        (r#"{"usage":{"total_tokens":29}} x"#, Invalid(NotJson)),
        (r#"{"usage":{"total_tokens":29},}"#, Invalid(NotJson)),
        (
            r#"{"usage":{"total_tokens":29}, "x": tru}"#,
            Invalid(NotJson),
        ),
        (
            r#"{"usage":{"total_tokens":29}, "x": "\q"}"#,
            Invalid(NotJson),
        ),
        (
            r#"{"usage":{"total_tokens":29}, "x": "\ud800"}"#,
            Invalid(NotJson),
        ),
        (
            r#"{"usage":{"total_tokens":29}, "x": "\udc00"}"#,
            Invalid(NotJson),
        ),
        (
            r#"{"usage":{"total_tokens":29}, "x": "\ud83d\ude00"}"#,
            Found(29),
        ),
        (
            r#"{"usage":{"total_tokens":29}, "x": 01}"#,
            Invalid(NotJson),
        ),
        (r#"{"usage":{"total_tokens":029}}"#, Invalid(NotJson)),
        (r#"{"usage":{"total_tokens":+29}}"#, Invalid(NotJson)),
        (r#"{"usage":{"total_tokens":29]}"#, Invalid(NotJson)),
        (r#"{"usage":{"total_tokens" 29}}"#, Invalid(NotJson)),
        (r#"{'usage':1}"#, Invalid(NotJson)),
        (
            "{\"usage\":{\"total_tokens\":29}, \"x\": \"a\nb\"}",
            Invalid(NotJson),
        ),
        ("", Invalid(NotJson)),
        ("   ", Invalid(NotJson)),
        // Cut short.
        (r#"{"usage":{"total_tokens":29}"#, Invalid(Truncated)),
        (r#"{"usage":{"total_tokens":29"#, Invalid(Truncated)),
        (r#"{"usage":{"total_tok"#, Invalid(Truncated)),
    ];
    for (body, expected) in cases {
        assert_eq!(json(body), *expected, "{body}");
    }
}

#[test]
fn json_rejects_invalid_utf8_in_strings() {
    for bad in [
        &b"\xff"[..],
        b"\xc0\xaf",
        b"\xe0\x80\xaf",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xc3",
    ] {
        let mut body = br#"{"usage":{"total_tokens":3},"x":""#.to_vec();
        body.extend_from_slice(bad);
        body.extend_from_slice(b"\"}");
        assert_eq!(
            read(BodyKind::Json, "usage.total_tokens", &body, true),
            Invalid(NotJson)
        );
    }
    let body = "{\"usage\":{\"total_tokens\":3},\"x\":\"é€😀\"}";
    assert_eq!(json(body), Found(3));
}

#[test]
fn nesting_beyond_the_bound_is_unreadable() {
    let deep = |n: usize| {
        format!(
            "{{\"usage\":{{\"total_tokens\":1}},\"x\":{}{}}}",
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    assert_eq!(json(&deep(MAX_DEPTH as usize - 1)), Found(1));
    assert_eq!(json(&deep(MAX_DEPTH as usize)), Invalid(TooDeep));
}

#[test]
fn a_json_body_counts_only_whole() {
    let body = br#"{"usage":{"total_tokens":29}}"#;
    assert_eq!(
        read(BodyKind::Json, "usage.total_tokens", body, false),
        Found(29)
    );
    let cut = &body[..body.len() - 1];
    assert_eq!(
        read(BodyKind::Json, "usage.total_tokens", cut, false),
        Invalid(Truncated)
    );
}

#[test]
fn a_body_over_the_bound_is_unreadable_and_done() {
    let body = br#"{"usage":{"total_tokens":29}}"#;
    let mut reader = UsageReader::new(
        BodyKind::Json,
        &path("usage.total_tokens"),
        body.len() as u64,
    );
    reader.feed(body);
    assert!(!reader.done());
    assert_eq!(reader.finish(true), Found(29));
    let mut reader = UsageReader::new(
        BodyKind::Json,
        &path("usage.total_tokens"),
        body.len() as u64 - 1,
    );
    reader.feed(body);
    assert!(reader.done());
    assert_eq!(reader.finish(true), Invalid(BodyTooLarge));
    let mut reader = UsageReader::new(BodyKind::EventStream, &path("usage.total_tokens"), 10);
    reader.feed(b"data: {}\n\n");
    assert!(!reader.done());
    reader.feed(b"\n");
    assert!(reader.done());
    assert_eq!(reader.finish(true), Invalid(BodyTooLarge));
}

#[test]
fn a_json_reader_is_done_once_unreadable() {
    let mut reader = UsageReader::new(BodyKind::Json, &path("usage.total_tokens"), 1 << 20);
    reader.feed(br#"{"usage":{"total_tokens":1,"total_tokens""#);
    assert!(reader.done());
    reader.feed(b":2}}");
    assert_eq!(reader.finish(true), Invalid(DuplicateKey));
}

fn stream(body: &str) -> UsageRead {
    read(
        BodyKind::EventStream,
        "usage.total_tokens",
        body.as_bytes(),
        true,
    )
}

/// OpenAI's `stream_options: {"include_usage": true}`: `"usage": null` in every chunk, the
/// usage in one last chunk with no choices, then `[DONE]`.
const OPENAI_STREAM: &str = concat!(
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11,\"prompt_tokens_details\":{\"cached_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\n",
    "data: [DONE]\n\n",
);

#[test]
fn an_openai_stream_gives_the_usage_of_its_last_chunk() {
    assert_eq!(stream(OPENAI_STREAM), Found(11));
    let crlf = OPENAI_STREAM.replace('\n', "\r\n");
    assert_eq!(stream(&crlf), Found(11));
    let cr = OPENAI_STREAM.replace('\n', "\r");
    assert_eq!(stream(&cr), Found(11));
    let at = |p: &str| read(BodyKind::EventStream, p, OPENAI_STREAM.as_bytes(), true);
    assert_eq!(at("usage.prompt_tokens"), Found(9));
    assert_eq!(
        at("usage.completion_tokens_details.reasoning_tokens"),
        Found(0)
    );
    // Without the usage chunk (the client did not ask for it).
    let without: String = OPENAI_STREAM
        .split("\n\n")
        .filter(|event| !event.contains("total_tokens"))
        .map(|event| format!("{event}\n\n"))
        .collect();
    assert_eq!(stream(&without), Missing);
}

#[test]
fn event_streams_each_case() {
    let u = |n: &str| format!("{{\"usage\":{{\"total_tokens\":{n}}}}}");
    let cases: Vec<(String, bool, UsageRead)> = vec![
        (format!("data: {}\n\n", u("5")), true, Found(5)),
        (format!("data:{}\n\n", u("5")), true, Found(5)),
        // One space only is skipped; more is JSON whitespace.
        (format!("data:   {}\n\n", u("5")), true, Found(5)),
        (format!("\u{feff}data: {}\n\n", u("5")), true, Found(5)),
        // The last event with a value wins; `null` and events without it do not count.
        (format!("data: {}\n\ndata: {}\n\n", u("5"), u("7")), true, Found(7)),
        (format!("data: {}\n\ndata: {}\n\n", u("5"), u("null")), true, Found(5)),
        (format!("data: {}\n\ndata: {{}}\n\n", u("5")), true, Found(5)),
        (format!("data: {}\n\ndata: {}\n\n", u("-1"), u("7")), true, Found(7)),
        (format!("data: {}\n\ndata: {}\n\n", u("7"), u("1.5")), true, Invalid(NotAnInteger)),
        // Data lines joined with a line feed, comments and other fields ignored.
        ("data: {\"usage\":\ndata: {\"total_tokens\":\ndata: 6}}\n\n".into(), true, Found(6)),
        (": keep-alive\nevent: message\nid: 3\nretry: 10\ndata: {\"usage\":{\"total_tokens\":6}}\n\n".into(), true, Found(6)),
        ("data: {\"usage\":\n: a comment between\ndata: {\"total_tokens\":6}}\n\n".into(), true, Found(6)),
        // A line feed is not allowed inside a JSON string.
        ("data: {\"usage\":{\"total_tokens\":6}, \"x\": \"a\ndata: b\"}\n\n".into(), true, Invalid(NotJson)),
        // A field named `data` only, `data` without a colon.
        (format!("datax: {}\n\n", u("5")), true, Missing),
        (format!("dat: {}\n\n", u("5")), true, Missing),
        (format!(" data: {}\n\n", u("5")), true, Missing),
        (format!("data\ndata: {}\n\n", u("5")), true, Found(5)),
        // `[DONE]`, blank data and events without data say nothing.
        ("data: [DONE]\n\n".into(), true, Missing),
        (format!("data: {}\n\ndata: [DONE]\n\n", u("5")), true, Found(5)),
        ("data:\n\nevent: x\n\n\n\n".into(), true, Missing),
        ("".into(), true, Missing),
        // Data that is not JSON: unreadable unless a later event has the usage.
        (format!("data: {}\n\ndata: hello\n\n", u("5")), true, Invalid(NotJson)),
        (format!("data: hello\n\ndata: {}\n\n", u("5")), true, Found(5)),
        ("data: [DONE] \n\n".into(), true, Invalid(NotJson)),
        (format!("data: {}\n\ndata: {{\"usage\":\n\n", u("5")), true, Invalid(NotJson)),
        (format!("data: {}{}\n\n", u("5"), u("5")), true, Invalid(NotJson)),
        ("data: {\"usage\":{\"total_tokens\":1,\"total_tokens\":1}}\n\n".into(), true, Invalid(DuplicateKey)),
        // Cut streams: a partial event is ignored; what was dispatched stands.
        (format!("data: {}\n\ndata: {}", u("5"), u("7")), false, Found(5)),
        (format!("data: {}\n\ndata: {}\n", u("5"), u("7")), true, Found(5)),
        (format!("data: {}\n\ndata: {{\"usa", u("5")), false, Found(5)),
        (format!("data: {}\n\n", u("5")), false, Found(5)),
        (format!("data: {}", u("5")), true, Invalid(Truncated)),
        (format!("data: {}\n", u("5")), false, Invalid(Truncated)),
        ("data: {}\n\n".into(), false, Invalid(Truncated)),
        ("data: {}\n\n".into(), true, Missing),
    ];
    for (body, complete, expected) in cases {
        assert_eq!(
            read(
                BodyKind::EventStream,
                "usage.total_tokens",
                body.as_bytes(),
                complete
            ),
            expected,
            "{body:?} complete={complete}"
        );
    }
}

#[test]
fn usage_headers_each_case() {
    for (value, expected) in [
        (&b"0"[..], Found(0)),
        (b"42", Found(42)),
        (b" 42\t", Found(42)),
        (b"007", Found(7)),
        (b"1000000000000", Found(MAX_USAGE)),
        (b"1000000000001", Invalid(OutOfRange)),
        (b"99999999999999999999999", Invalid(OutOfRange)),
        (b"-1", Invalid(Negative)),
        (b"1.5", Invalid(NotAnInteger)),
        (b"1e3", Invalid(NotAnInteger)),
        (b"", Invalid(NotANumber)),
        (b"  ", Invalid(NotANumber)),
        (b"+1", Invalid(NotANumber)),
        (b"-", Invalid(NotANumber)),
        (b"1,2", Invalid(NotANumber)),
        (b"1 2", Invalid(NotANumber)),
        (b"0x10", Invalid(NotANumber)),
        (b"\xff", Invalid(NotANumber)),
    ] {
        assert_eq!(
            usage_from_header(value),
            expected,
            "{:?}",
            String::from_utf8_lossy(value)
        );
    }
}

#[test]
fn body_kinds_by_media_type() {
    for (value, expected) in [
        (&b"application/json"[..], Some(BodyKind::Json)),
        (b"Application/JSON; charset=utf-8", Some(BodyKind::Json)),
        (b" application/json ;charset=utf-8", Some(BodyKind::Json)),
        (b"application/problem+json", Some(BodyKind::Json)),
        (b"application/vnd.api+JSON", Some(BodyKind::Json)),
        (b"text/event-stream", Some(BodyKind::EventStream)),
        (
            b"TEXT/Event-Stream; charset=utf-8",
            Some(BodyKind::EventStream),
        ),
        (b"application/+json", None),
        (b"application/jsonx", None),
        (b"application/x-ndjson", None),
        (b"text/json", None),
        (b"text/plain", None),
        (b"json", None),
        (b"", None),
        (b"text/event-stream-x", None),
    ] {
        assert_eq!(
            body_kind(value),
            expected,
            "{:?}",
            String::from_utf8_lossy(value)
        );
    }
}

#[test]
fn reasons_have_distinct_metric_names() {
    let all = [
        NotJson,
        Truncated,
        BodyTooLarge,
        TooDeep,
        DuplicateKey,
        NotANumber,
        Negative,
        NotAnInteger,
        OutOfRange,
    ];
    let names: std::collections::BTreeSet<&str> = all.iter().map(|r| r.name()).collect();
    assert_eq!(names.len(), all.len());
    assert!(names
        .iter()
        .all(|n| n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
}

#[test]
fn usage_paths_each_case() {
    assert_eq!(path("usage.total_tokens"), ["usage", "total_tokens"]);
    assert_eq!(path("a-b_C.9"), ["a-b_C", "9"]);
    assert_eq!(path("x"), ["x"]);
    assert_eq!(path("a.b.c.d.e.f.g.h").len(), MAX_SEGMENTS);
    assert!(parse_usage_path(&"x".repeat(MAX_SEGMENT_LEN)).is_ok());
    for bad in [
        "",
        ".",
        "a.",
        ".a",
        "a..b",
        "a.b.c.d.e.f.g.h.i",
        "a b",
        "a/b",
        "é",
        "a[0]",
    ] {
        let error = parse_usage_path(bad).unwrap_err();
        assert!(error.contains("usage path"), "{bad}: {error}");
    }
    assert!(parse_usage_path(&"x".repeat(MAX_SEGMENT_LEN + 1)).is_err());
}

#[test]
fn an_unusable_path_is_never_found() {
    for segments in [vec![], vec![String::new()], vec!["a".to_string(); 9]] {
        let mut reader = UsageReader::new(BodyKind::Json, &segments, 1 << 20);
        reader.feed(br#"{"a":1,"":2}"#);
        assert_eq!(reader.finish(true), Missing);
    }
}

fn estimate(body: &str, max_body: u64, default: u64) -> Result<u64, EstimateError> {
    let mut whole = RequestEstimate::new(max_body);
    whole.feed(body.as_bytes());
    let one = whole.finish(default);
    let mut bytes = RequestEstimate::new(max_body);
    for b in body.as_bytes() {
        bytes.feed(std::slice::from_ref(b));
    }
    assert_eq!(bytes.finish(default), one, "{body}");
    // The adapter asks once per usage limit of the request, each with its own default.
    assert_eq!(whole.finish(default), one, "{body}: asked again");
    one
}

#[test]
fn request_estimates_each_case() {
    let n = |body: &str| body.len() as u64;
    for (body, expected) in [
        (r#"{"model":"m","max_tokens":100}"#, 100),
        (
            r#"{"model":"m","max_completion_tokens":50,"max_tokens":100}"#,
            50,
        ),
        (r#"{"max_tokens":100,"max_completion_tokens":50}"#, 50),
        (r#"{"model":"m"}"#, 1024),
        (r#"{"max_tokens":null}"#, 1024),
        (r#"{"max_completion_tokens":null,"max_tokens":7}"#, 7),
        (r#"{"max_completion_tokens":"50","max_tokens":7}"#, 7),
        (r#"{"max_tokens":-5}"#, 1024),
        (r#"{"max_tokens":1.5}"#, 1024),
        (r#"{"max_tokens":1000000000001}"#, 1024),
        (r#"{"max_tokens":1,"max_tokens":2}"#, 1024),
        (r#"{"options":{"max_tokens":5}}"#, 1024),
        (r#"{"max_tokens":100"#, 1024),
        ("not json", 1024),
        ("", 1024),
    ] {
        assert_eq!(
            estimate(body, 1 << 20, 1024),
            Ok(n(body) + expected),
            "{body}"
        );
    }
    let body = r#"{"max_tokens":5}"#;
    assert_eq!(estimate(body, n(body), 1), Ok(n(body) + 5));
    assert_eq!(estimate(body, n(body) - 1, 1), Err(EstimateError::TooLarge));
    let mut partial = RequestEstimate::new(3);
    partial.feed(b"{\"m");
    assert!(!partial.too_large());
    partial.feed(b"a");
    assert!(partial.too_large());
    assert_eq!(EstimateError::TooLarge.name(), "too_large");
    assert_eq!(estimate("{}", 1 << 20, u64::MAX), Ok(u64::MAX));
}

#[test]
fn a_reader_holds_a_constant_number_of_bytes() {
    let long_path: Vec<String> = (0..MAX_SEGMENTS)
        .map(|_| "x".repeat(MAX_SEGMENT_LEN))
        .collect();
    for kind in [BodyKind::Json, BodyKind::EventStream] {
        let reader = UsageReader::new(kind, &long_path, u64::MAX);
        assert!(
            reader.memory_bytes() <= READER_BYTES,
            "{}",
            reader.memory_bytes()
        );
    }
    assert!(std::mem::size_of::<UsageReader>() <= 256);
    assert!(std::mem::size_of::<RequestEstimate>() <= 512);
    println!(
        "UsageReader: {} bytes + its paths; RequestEstimate: {} bytes + 48 bytes of keys",
        std::mem::size_of::<UsageReader>(),
        std::mem::size_of::<RequestEstimate>()
    );
}

#[test]
fn every_split_in_two_gives_the_same_usage() {
    let crlf = OPENAI_STREAM.replace('\n', "\r\n");
    let escaped = CHAT_COMPLETION
        .replace("\"usage\"", "\"\\u0075sage\"")
        .replace("Hello", "H\\u00e9llo \\ud83d\\ude00");
    for (kind, body, expected) in [
        (BodyKind::Json, CHAT_COMPLETION, Found(29)),
        (BodyKind::Json, escaped.as_str(), Found(29)),
        (BodyKind::EventStream, OPENAI_STREAM, Found(11)),
        (BodyKind::EventStream, crlf.as_str(), Found(11)),
    ] {
        let body = body.as_bytes();
        for at in 0..=body.len() {
            let mut reader = UsageReader::new(kind, &path("usage.total_tokens"), 1 << 20);
            reader.feed(&body[..at]);
            reader.feed(&body[at..]);
            assert_eq!(reader.finish(true), expected, "{kind:?} split at {at}");
        }
    }
}
