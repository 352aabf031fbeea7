//! Every parser of outside input under random and mutated input (proptest, seeded): the
//! config, the bridge's replies, the cost header, X-Forwarded-For and the percent-encoder.
//! None may panic, and each answers in its documented classes. `PROPTEST_CASES=N` runs N per
//! parser (`make fuzz`); the counts are printed.

use proptest::prelude::*;
use proptest::test_runner::TestRunner;

mod common;

use ratelimit_core::bridge::{parse_eval_reply, BridgeReply, EvalOutcome};
use ratelimit_core::config::{ClientIpPolicy, Config};
use ratelimit_core::encode::path_segment;
use ratelimit_core::request::identity::client_ip;
use ratelimit_core::request::plan::plan;
use ratelimit_core::request::view::BadRequest;
use ratelimit_core::testing::request::FakeRequest;

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
            route: None,
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
                route: None,
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
