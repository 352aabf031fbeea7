//! The named formats (OpenAI, Anthropic), lists of paths, the estimate's output bounds by
//! format, and where `include_usage` is added to a request.

use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use Unreadable::*;
use UsageRead::{Found, Invalid, Missing};

/// Reads `body` whole, byte by byte and split at every point: all agree.
fn read(kind: BodyKind, usage: &BodyUsage, body: &str, complete: bool) -> UsageRead {
    let body = body.as_bytes();
    let mut whole = UsageReader::of(kind, usage, 1 << 20);
    whole.feed(body);
    let one = whole.finish(complete);
    let mut bytes = UsageReader::of(kind, usage, 1 << 20);
    for b in body {
        bytes.feed(std::slice::from_ref(b));
    }
    assert_eq!(bytes.finish(complete), one, "byte by byte");
    for at in (0..=body.len()).step_by(7) {
        let mut split = UsageReader::of(kind, usage, 1 << 20);
        split.feed(&body[..at]);
        split.feed(&body[at..]);
        assert_eq!(split.finish(complete), one, "split at {at}");
    }
    one
}

const RESPONSES_JSON: &str = r#"{"id":"resp_1","object":"response","status":"completed",
 "output":[{"type":"message","content":[{"type":"output_text","text":"usage: {\"total_tokens\": 1}"}]}],
 "usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,
          "output_tokens_details":{"reasoning_tokens":0},"total_tokens":123}}"#;

const RESPONSES_STREAM: &str = concat!(
    "event: response.created\n",
    "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n",
    "event: response.output_text.delta\n",
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"Hi\"}\n\n",
    "event: response.completed\n",
    "data: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":5,\"output_tokens\":2,\"total_tokens\":7}}}\n\n",
);

const EMBEDDINGS: &str = r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.2]}],
 "model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}"#;

const ANTHROPIC_JSON: &str = r#"{"id":"msg_1","type":"message","role":"assistant",
 "content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn",
 "usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":40,"output_tokens":13}}"#;

const ANTHROPIC_STREAM: &str = concat!(
    "event: message_start\n",
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":3,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
    "event: ping\n",
    "data: {\"type\": \"ping\"}\n\n",
    "event: message_delta\n",
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},\"usage\":{\"output_tokens\":9}}\n\n",
    "event: message_delta\n",
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n",
    "event: message_stop\n",
    "data: {\"type\":\"message_stop\"}\n\n",
);

const CHAT_STREAM: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n",
    "data: [DONE]\n\n",
);

#[test]
fn openai_reads_chat_completions_embeddings_and_the_responses_api() {
    let openai = BodyUsage::openai();
    let json = |body| read(BodyKind::Json, &openai, body, true);
    let stream = |body| read(BodyKind::EventStream, &openai, body, true);
    assert_eq!(json(RESPONSES_JSON), Found(123));
    assert_eq!(json(EMBEDDINGS), Found(8));
    assert_eq!(json(r#"{"usage":{"total_tokens":29}}"#), Found(29));
    assert_eq!(stream(RESPONSES_STREAM), Found(7));
    assert_eq!(stream(CHAT_STREAM), Found(11));
    // A stream without its usage event (no include_usage, or cut before response.completed).
    let no_usage = CHAT_STREAM.replace("\"total_tokens\":11", "\"other\":11");
    assert_eq!(stream(&no_usage), Missing);
    let cut = &RESPONSES_STREAM[..RESPONSES_STREAM.find("event: response.completed").unwrap()];
    assert_eq!(
        read(BodyKind::EventStream, &openai, cut, false),
        Invalid(Truncated)
    );
    // The first path present wins, even if a later one is present too.
    assert_eq!(
        json(r#"{"response":{"usage":{"total_tokens":5}},"usage":{"total_tokens":6}}"#),
        Found(6)
    );
    assert_eq!(
        json(r#"{"usage":{"total_tokens":"6"},"response":{"usage":{"total_tokens":5}}}"#),
        Invalid(NotANumber)
    );
    assert_eq!(json(r#"{"usage":{"total_tokens":6}"#), Invalid(Truncated));
    assert_eq!(json(""), Invalid(NotJson));
}

#[test]
fn anthropic_adds_input_output_and_both_cache_counts() {
    let anthropic = BodyUsage::anthropic();
    let json = |body| read(BodyKind::Json, &anthropic, body, true);
    let stream = |body: &str, complete| read(BodyKind::EventStream, &anthropic, body, complete);
    assert_eq!(json(ANTHROPIC_JSON), Found(25 + 100 + 40 + 13));
    // Cache counts are optional; input and output are not.
    assert_eq!(
        json(r#"{"usage":{"input_tokens":25,"output_tokens":13}}"#),
        Found(38)
    );
    assert_eq!(json(r#"{"usage":{"input_tokens":25}}"#), Missing);
    assert_eq!(
        json(r#"{"usage":{"input_tokens":25,"output_tokens":13,"cache_read_input_tokens":-1}}"#),
        Invalid(Negative)
    );
    assert_eq!(
        json(r#"{"usage":{"input_tokens":25,"output_tokens":13,"cache_read_input_tokens":null}}"#),
        Found(38)
    );
    assert_eq!(
        json(r#"{"usage":{"input_tokens":600000000000,"output_tokens":600000000000}}"#),
        Invalid(OutOfRange)
    );
    // Streamed: message_start's input and cache counts, the last message_delta's output.
    assert_eq!(stream(ANTHROPIC_STREAM, true), Found(25 + 3 + 15));
    // A message_delta that repeats the input counts (cumulative) replaces message_start's.
    let repeated = ANTHROPIC_STREAM.replace(
        "\"usage\":{\"output_tokens\":15}",
        "\"usage\":{\"input_tokens\":30,\"cache_creation_input_tokens\":3,\"output_tokens\":15}",
    );
    assert_eq!(stream(&repeated, true), Found(30 + 3 + 15));
    // Cut after the first delta: what was read counts.
    let cut = &ANTHROPIC_STREAM[..ANTHROPIC_STREAM.find("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end").unwrap()];
    assert_eq!(stream(cut, false), Found(25 + 3 + 9));
    // Cut before any usage.
    let start = &ANTHROPIC_STREAM[..ANTHROPIC_STREAM.find("event: message_start").unwrap() + 5];
    assert_eq!(stream(start, false), Invalid(Truncated));
    // An error event and no usage.
    let error =
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n";
    assert_eq!(stream(error, true), Missing);
}

#[test]
fn a_list_of_paths_reads_the_first_present() {
    let paths = BodyUsage::first_of(vec![
        parse_usage_path("usage.total_tokens").unwrap(),
        parse_usage_path("meta.tokens").unwrap(),
    ]);
    let json = |body| read(BodyKind::Json, &paths, body, true);
    assert_eq!(json(r#"{"meta":{"tokens":4}}"#), Found(4));
    assert_eq!(
        json(r#"{"meta":{"tokens":4},"usage":{"total_tokens":9}}"#),
        Found(9)
    );
    assert_eq!(json(r#"{"usage":null,"meta":{"tokens":4}}"#), Found(4));
    assert_eq!(
        json(r#"{"meta":{"tokens":4,"tokens":5}}"#),
        Invalid(DuplicateKey)
    );
    assert_eq!(json(r#"{}"#), Missing);
}

#[test]
fn a_reader_of_many_paths_holds_a_constant_per_path() {
    for usage in [BodyUsage::openai(), BodyUsage::anthropic()] {
        let paths = usage.paths().count();
        for kind in [BodyKind::Json, BodyKind::EventStream] {
            let mut reader = UsageReader::of(kind, &usage, u64::MAX);
            let before = reader.memory_bytes();
            assert!(before <= READER_BASE_BYTES + paths * PATH_BYTES, "{before}");
            for _ in 0..2000 {
                reader.feed(ANTHROPIC_STREAM.as_bytes());
            }
            assert_eq!(reader.memory_bytes(), before);
        }
    }
    let long: Vec<Vec<String>> = (0..MAX_PATHS)
        .map(|_| {
            (0..MAX_SEGMENTS)
                .map(|_| "x".repeat(MAX_SEGMENT_LEN))
                .collect()
        })
        .collect();
    let reader = UsageReader::of(BodyKind::EventStream, &BodyUsage::first_of(long), 1);
    assert!(reader.memory_bytes() <= READER_BASE_BYTES + MAX_PATHS * PATH_BYTES);
}

fn estimate_with(body: &str, keys: OutputKeys) -> u64 {
    let mut e = RequestEstimate::new(1 << 20);
    e.feed(body.as_bytes());
    e.finish_with(1000, keys).unwrap() - body.len() as u64
}

#[test]
fn each_format_reads_its_output_bound() {
    let chat = r#"{"max_tokens": 5, "max_completion_tokens": 7, "max_output_tokens": 9}"#;
    assert_eq!(estimate_with(chat, OutputKeys::Completion), 7);
    assert_eq!(estimate_with(chat, OutputKeys::OpenAi), 7);
    assert_eq!(estimate_with(chat, OutputKeys::Anthropic), 5);
    let responses = r#"{"input": "hi", "max_output_tokens": 9}"#;
    assert_eq!(estimate_with(responses, OutputKeys::OpenAi), 9);
    assert_eq!(estimate_with(responses, OutputKeys::Completion), 1000);
    assert_eq!(estimate_with(responses, OutputKeys::Anthropic), 1000);
    assert_eq!(
        estimate_with(r#"{"max_tokens": 64}"#, OutputKeys::Anthropic),
        64
    );
    assert_eq!(
        estimate_with(r#"{"max_tokens": -1}"#, OutputKeys::Anthropic),
        1000
    );
}

fn with_include_usage(body: &str) -> Option<String> {
    let mut e = RequestEstimate::new(1 << 20).with_stream_keys();
    for b in body.as_bytes() {
        e.feed(std::slice::from_ref(b));
    }
    let edited = e.include_usage()?.apply(body.as_bytes())?;
    Some(String::from_utf8(edited).unwrap())
}

#[test]
fn include_usage_is_added_to_streamed_requests_lacking_it() {
    let added = |body: &str| {
        let edited = with_include_usage(body)?;
        let value: serde_json::Value = serde_json::from_str(&edited).expect("still JSON");
        assert_eq!(value["stream_options"]["include_usage"], true, "{edited}");
        let mut original: serde_json::Value = serde_json::from_str(body).unwrap();
        let mut edited_value = value.clone();
        // Nothing else changed.
        original.as_object_mut().unwrap().remove("stream_options");
        edited_value
            .as_object_mut()
            .unwrap()
            .remove("stream_options");
        assert_eq!(original, edited_value);
        Some(value["stream_options"].clone())
    };
    let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
    assert_eq!(
        added(r#"{"model":"m","stream":true,"messages":[]}"#),
        Some(json(r#"{"include_usage":true}"#))
    );
    assert_eq!(
        added(" \n{\"stream\": true}"),
        Some(json(r#"{"include_usage":true}"#))
    );
    assert_eq!(
        added(r#"{"stream":true,"stream_options":{"include_obfuscation":false}}"#),
        Some(json(
            r#"{"include_usage":true,"include_obfuscation":false}"#
        ))
    );
    assert_eq!(
        added(r#"{"stream":true,"stream_options":{ }}"#),
        Some(json(r#"{"include_usage":true}"#))
    );
    // Nothing to add: not streamed, already there (the client's own false is kept), a
    // stream_options that is not an object, a body that is not whole JSON.
    for body in [
        r#"{"stream":false}"#,
        r#"{"messages":[]}"#,
        r#"{"stream":"true"}"#,
        r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
        r#"{"stream":true,"stream_options":{"include_usage":false}}"#,
        r#"{"stream":true,"stream_options":null}"#,
        r#"{"stream":true,"#,
        r#"{"stream":true,"stream":true}"#,
        r#"{"x":{"stream":true}}"#,
    ] {
        assert_eq!(with_include_usage(body), None, "{body}");
    }
    // Not asked for (no stream keys scanned).
    let mut plain = RequestEstimate::new(1 << 20);
    plain.feed(br#"{"stream":true}"#);
    assert_eq!(plain.include_usage(), None);
    // The body given is not the one scanned.
    let mut e = RequestEstimate::new(1 << 20).with_stream_keys();
    e.feed(br#"  {"stream":true}"#);
    assert_eq!(e.include_usage().unwrap().apply(b"{}"), None);
}

/// Weights in thousandths: input 1, output 4, cached input 0.125, cache writes 1.25.
const WEIGHTS: Weights = Weights {
    input: 1000,
    output: 4000,
    cached_input: 125,
    cache_write: 1250,
};

#[test]
fn openai_weighted_takes_the_cached_input_out_of_the_input() {
    let usage = BodyUsage::openai_weighted(&WEIGHTS);
    let chat = r#"{"object":"chat.completion","usage":{"prompt_tokens":1000,"completion_tokens":200,
        "total_tokens":1200,"prompt_tokens_details":{"cached_tokens":400}}}"#;
    // (1000 - 400) × 1 + 400 × 0.125 + 200 × 4
    assert_eq!(read(BodyKind::Json, &usage, chat, true), Found(1450));
    // No details: every input token is uncached.
    let plain = r#"{"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}"#;
    assert_eq!(read(BodyKind::Json, &usage, plain, true), Found(22));
    // The Responses API, JSON (cached 0) and its stream's response.completed.
    assert_eq!(
        read(BodyKind::Json, &usage, RESPONSES_JSON, true),
        Found(36 + 87 * 4)
    );
    assert_eq!(
        read(BodyKind::EventStream, &usage, RESPONSES_STREAM, true),
        Found(5 + 2 * 4)
    );
    // A part of a unit is charged as a whole one; without output there is no usage.
    let w = Weights {
        input: 1,
        ..WEIGHTS
    };
    let tiny = r#"{"usage":{"prompt_tokens":3,"completion_tokens":0}}"#;
    assert_eq!(
        read(BodyKind::Json, &BodyUsage::openai_weighted(&w), tiny, true),
        Found(1)
    );
    let no_output = r#"{"usage":{"prompt_tokens":3}}"#;
    assert_eq!(read(BodyKind::Json, &usage, no_output, true), Missing);
}

#[test]
fn anthropic_weighted_weighs_each_count() {
    let usage = BodyUsage::anthropic_weighted(&WEIGHTS);
    // 25 × 1 + 13 × 4 + 100 × 1.25 + 40 × 0.125
    assert_eq!(
        read(BodyKind::Json, &usage, ANTHROPIC_JSON, true),
        Found(25 + 52 + 125 + 5)
    );
    // The stream: input and cache counts from message_start, output from the last
    // message_delta: 25 + 15 × 4 + 3 × 1.25, rounded up.
    assert_eq!(
        read(BodyKind::EventStream, &usage, ANTHROPIC_STREAM, true),
        Found(25 + 15 * 4 + 4)
    );
    // Unweighted, the same reader gives the plain sum.
    assert_eq!(
        read(
            BodyKind::Json,
            &BodyUsage::anthropic(),
            ANTHROPIC_JSON,
            true
        ),
        Found(25 + 100 + 40 + 13)
    );
}
