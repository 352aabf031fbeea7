//! What a gRPC client is told: which requests Envoy answers in gRPC, the status codes of the
//! filter's refusals, and the retry delay as a `google.rpc.RetryInfo` inside the
//! `google.rpc.Status` of `grpc-status-details-bin`. Those three small messages are encoded by
//! hand (protobuf's wire format, a dozen lines): the filter takes no protobuf crate for them.

use serde::Deserialize;

use crate::encode::base64;

/// `google.rpc.Code` values the filter answers with.
pub const INVALID_ARGUMENT: u32 = 3;
pub const RESOURCE_EXHAUSTED: u32 = 8;
pub const UNAVAILABLE: u32 = 14;

/// The `type_url` of a `google.rpc.RetryInfo` packed in a `google.protobuf.Any`.
pub const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The gRPC status of a request refused by a limit (`grpc_over_limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrpcOverLimit {
    /// RESOURCE_EXHAUSTED (8), the code for a quota: retry policies, which retry
    /// UNAVAILABLE, leave it alone.
    #[default]
    ResourceExhausted,
    /// UNAVAILABLE (14), as Envoy's own rate-limit filter answers by default, for clients
    /// written against it.
    Unavailable,
}

impl GrpcOverLimit {
    pub fn code(self) -> u32 {
        match self {
            GrpcOverLimit::ResourceExhausted => RESOURCE_EXHAUSTED,
            GrpcOverLimit::Unavailable => UNAVAILABLE,
        }
    }
}

/// Whether Envoy answers a request with this `content-type` in gRPC, as its
/// `Grpc::Common::hasGrpcContentType` decides: exactly `application/grpc`, or
/// `application/grpc+` and a subtype (`+proto`, `+json`). Not `application/grpc-web`, and not
/// `application/grpc;…` either, which Envoy answers in HTTP: a gRPC status sent for it would
/// be dropped.
pub fn is_grpc_content_type(value: &[u8]) -> bool {
    match value.strip_prefix(b"application/grpc") {
        Some(rest) => rest.first().is_none_or(|&b| b == b'+'),
        None => false,
    }
}

/// `grpc-status-details-bin`: a `google.rpc.Status` {`code`, `message`, `details`: one
/// `RetryInfo` {`retry_delay`: `retry_ms`}}, in base64 without padding (gRPC's binary metadata;
/// receivers accept either). `code` and `message` must be those of the answer's `grpc-status`
/// and `grpc-message`: clients check that they agree.
pub fn status_details(code: u32, message: &str, retry_ms: u64) -> String {
    // google.protobuf.Duration {seconds = 1: int64, nanos = 2: int32}.
    let mut duration = Vec::with_capacity(16);
    push_varint_field(&mut duration, 1, retry_ms / 1000);
    push_varint_field(&mut duration, 2, retry_ms % 1000 * 1_000_000);
    // google.rpc.RetryInfo {retry_delay = 1: Duration}.
    let mut retry_info = Vec::with_capacity(duration.len() + 2);
    push_bytes_field(&mut retry_info, 1, &duration);
    // google.protobuf.Any {type_url = 1: string, value = 2: bytes}.
    let mut any = Vec::with_capacity(RETRY_INFO_TYPE_URL.len() + retry_info.len() + 4);
    push_bytes_field(&mut any, 1, RETRY_INFO_TYPE_URL.as_bytes());
    push_bytes_field(&mut any, 2, &retry_info);
    // google.rpc.Status {code = 1: int32, message = 2: string, details = 3: repeated Any}.
    let mut status = Vec::with_capacity(message.len() + any.len() + 8);
    push_varint_field(&mut status, 1, u64::from(code));
    push_bytes_field(&mut status, 2, message.as_bytes());
    push_bytes_field(&mut status, 3, &any);
    let mut text = base64(&status);
    text.truncate(text.trim_end_matches('=').len());
    text
}

/// A varint field (wire type 0); proto3 leaves a zero out.
fn push_varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        push_varint(out, u64::from(field) << 3);
        push_varint(out, value);
    }
}

/// A length-delimited field (wire type 2): a string, bytes or a message; an empty one is left
/// out.
fn push_bytes_field(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    if !value.is_empty() {
        push_varint(out, (u64::from(field) << 3) | 2);
        push_varint(out, value.len() as u64);
        out.extend_from_slice(value);
    }
}

/// Base 128, least significant group first, the high bit set on every byte but the last.
fn push_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn grpc_content_types_as_envoy_reads_them() {
        let grpc: [&[u8]; 4] = [
            b"application/grpc",
            b"application/grpc+proto",
            b"application/grpc+json",
            b"application/grpc+",
        ];
        for value in grpc {
            assert!(is_grpc_content_type(value), "{value:?}");
        }
        let not: [&[u8]; 8] = [
            b"application/grpc-web",
            b"application/grpc-web+proto",
            b"application/grpc-web-text",
            b"application/grpc;charset=utf-8",
            b"application/grpcx",
            b"Application/gRPC",
            b"application/json",
            b"",
        ];
        for value in not {
            assert!(!is_grpc_content_type(value), "{value:?}");
        }
    }

    /// As Python's protobuf (`google.rpc.status_pb2.Status(...).SerializeToString()`, with the
    /// RetryInfo packed by `Any.Pack`) writes the same messages, in base64 without padding.
    #[test]
    fn status_details_match_the_reference_encoder() {
        let cases = [
            (RESOURCE_EXHAUSTED, 1500, "CAgSE3JhdGUgbGltaXQgZXhjZWVkZWQaNgoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxIKCggIARCAyrXuAQ"),
            (UNAVAILABLE, 7_200_000, "CA4SE3JhdGUgbGltaXQgZXhjZWVkZWQaMQoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxIFCgMIoDg"),
            (RESOURCE_EXHAUSTED, 1, "CAgSE3JhdGUgbGltaXQgZXhjZWVkZWQaMgoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxIGCgQQwIQ9"),
        ];
        for (code, ms, want) in cases {
            assert_eq!(
                status_details(code, "rate limit exceeded", ms),
                want,
                "{code} {ms}"
            );
        }
    }

    #[test]
    fn varints_cross_the_byte_boundaries() {
        let cases: [(u64, &[u8]); 6] = [
            (0, &[0]),
            (1, &[1]),
            (127, &[0x7f]),
            (128, &[0x80, 0x01]),
            (300, &[0xac, 0x02]),
            (
                u64::MAX,
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            ),
        ];
        for (value, bytes) in cases {
            let mut out = Vec::new();
            push_varint(&mut out, value);
            assert_eq!(out, bytes, "{value}");
        }
    }

    /// An independent reading of what the encoder wrote: base64, then protobuf's wire format
    /// field by field, down to the delay.
    mod decode {
        pub fn base64(text: &str) -> Vec<u8> {
            const ALPHABET: &[u8] =
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            let mut bits = 0u32;
            let mut count = 0;
            let mut out = Vec::new();
            for c in text.bytes().filter(|&c| c != b'=') {
                let v = ALPHABET.iter().position(|&a| a == c).unwrap() as u32;
                bits = (bits << 6) | v;
                count += 6;
                if count >= 8 {
                    count -= 8;
                    out.push((bits >> count) as u8);
                    bits &= (1 << count) - 1;
                }
            }
            out
        }

        fn varint(bytes: &[u8], at: &mut usize) -> u64 {
            let (mut value, mut shift) = (0u64, 0);
            loop {
                let b = bytes[*at];
                *at += 1;
                value |= u64::from(b & 0x7f) << shift;
                if b < 0x80 {
                    return value;
                }
                shift += 7;
            }
        }

        /// Every field as (number, varint or bytes).
        pub fn fields(bytes: &[u8]) -> Vec<(u64, Result<u64, Vec<u8>>)> {
            let mut at = 0;
            let mut out = Vec::new();
            while at < bytes.len() {
                let key = varint(bytes, &mut at);
                let value = match key & 7 {
                    0 => Ok(varint(bytes, &mut at)),
                    2 => {
                        let len = varint(bytes, &mut at) as usize;
                        at += len;
                        Err(bytes[at - len..at].to_vec())
                    }
                    wire => panic!("wire type {wire}"),
                };
                out.push((key >> 3, value));
            }
            out
        }
    }

    #[test]
    fn status_details_decode_to_the_code_the_message_and_the_delay() {
        for (code, message, ms, seconds, nanos) in [
            (
                RESOURCE_EXHAUSTED,
                "rate limit exceeded",
                2_345,
                2,
                345_000_000,
            ),
            (UNAVAILABLE, "x", 999, 0, 999_000_000),
            (RESOURCE_EXHAUSTED, "", 86_400_000, 86_400, 0),
        ] {
            let text = status_details(code, message, ms);
            assert!(!text.contains('='), "unpadded: {text}");
            let status = decode::fields(&decode::base64(&text));
            let mut want = vec![(1, Ok(u64::from(code)))];
            if !message.is_empty() {
                want.push((2, Err(message.as_bytes().to_vec())));
            }
            let Some((3, Err(any))) = status.last().cloned() else {
                panic!("no details: {status:?}");
            };
            want.push((3, Err(any.clone())));
            assert_eq!(status, want);
            let any = decode::fields(&any);
            assert_eq!(any[0], (1, Err(RETRY_INFO_TYPE_URL.as_bytes().to_vec())));
            let (2, Err(retry_info)) = any[1].clone() else {
                panic!("no value: {any:?}");
            };
            let retry_info = decode::fields(&retry_info);
            let (1, Err(duration)) = retry_info[0].clone() else {
                panic!("no retry_delay: {retry_info:?}");
            };
            let mut want = Vec::new();
            if seconds > 0 {
                want.push((1, Ok(seconds)));
            }
            if nanos > 0 {
                want.push((2, Ok(nanos)));
            }
            assert_eq!(decode::fields(&duration), want, "{ms} ms");
        }
    }

    #[test]
    fn over_limit_codes() {
        assert_eq!(GrpcOverLimit::default().code(), 8);
        assert_eq!(GrpcOverLimit::Unavailable.code(), 14);
    }
}
