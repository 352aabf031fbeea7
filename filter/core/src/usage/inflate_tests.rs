use super::*;
use crate::usage::{BodyKind, UsageRead, UsageReader};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use std::io::Write;

const JSON: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! \"usage\": {\"total_tokens\": 1}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29}}"#;

const STREAM: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n",
    "data: [DONE]\n\n",
);

#[derive(Debug, Clone, Copy)]
enum Format {
    Gzip,
    Zlib,
    Raw,
}

const FORMATS: [Format; 3] = [Format::Gzip, Format::Zlib, Format::Raw];

fn compress(format: Format, body: &[u8]) -> Vec<u8> {
    let level = flate2::Compression::default();
    let out = match format {
        Format::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), level);
            e.write_all(body).and_then(|_| e.finish())
        }
        Format::Zlib => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), level);
            e.write_all(body).and_then(|_| e.finish())
        }
        Format::Raw => {
            let mut e = flate2::write::DeflateEncoder::new(Vec::new(), level);
            e.write_all(body).and_then(|_| e.finish())
        }
    };
    out.unwrap()
}

fn encoding_of(format: Format) -> Encoding {
    match format {
        Format::Gzip => Encoding::Gzip,
        Format::Zlib | Format::Raw => Encoding::Deflate,
    }
}

/// Inflates `chunks` in turn: what came out, and the inflater.
fn inflate_chunks(encoding: Encoding, chunks: &[&[u8]], bound: u64) -> (Vec<u8>, Inflater) {
    let mut inflater = Inflater::new(encoding, bound).unwrap();
    let mut out = Vec::new();
    for chunk in chunks {
        inflater.feed(chunk, &mut |bytes| out.extend_from_slice(bytes));
    }
    (out, inflater)
}

/// The usage a reader finds in what `chunks` inflate to.
fn usage(kind: BodyKind, encoding: Encoding, chunks: &[&[u8]]) -> (UsageRead, Inflater) {
    let path = ["usage".to_string(), "total_tokens".to_string()];
    let mut reader = UsageReader::new(kind, &path, 1 << 20);
    let mut inflater = Inflater::new(encoding, 1 << 20).unwrap();
    for chunk in chunks {
        inflater.feed(chunk, &mut |bytes| reader.feed(bytes));
    }
    (reader.finish(inflater.ended()), inflater)
}

#[test]
fn content_encodings_each_case() {
    for (value, expected) in [
        (None, Encoding::Identity),
        (Some("identity"), Encoding::Identity),
        (Some(""), Encoding::Identity),
        (Some("gzip"), Encoding::Gzip),
        (Some(" GZip "), Encoding::Gzip),
        (Some("x-gzip"), Encoding::Gzip),
        (Some("identity, gzip"), Encoding::Gzip),
        (Some("deflate"), Encoding::Deflate),
        (Some("Deflate"), Encoding::Deflate),
        (Some("br"), Encoding::Unsupported),
        (Some("zstd"), Encoding::Unsupported),
        (Some("compress"), Encoding::Unsupported),
        (Some("gzip, br"), Encoding::Unsupported),
        (Some("gzip, gzip"), Encoding::Unsupported),
        (Some("deflate, gzip"), Encoding::Unsupported),
    ] {
        assert_eq!(encoding(value.map(str::as_bytes)), expected, "{value:?}");
    }
    assert!(Inflater::new(Encoding::Identity, 1).is_none());
    assert!(Inflater::new(Encoding::Unsupported, 1).is_none());
    let names = [
        InflateError::Unsupported.name(),
        InflateError::Corrupt.name(),
        InflateError::TooLarge.name(),
    ];
    assert_eq!(
        names,
        [
            "unsupported_encoding",
            "corrupt_encoding",
            "inflated_too_large"
        ]
    );
}

#[test]
fn the_crc_is_gzip_s() {
    assert_eq!(crc32(0, b"123456789"), 0xcbf4_3926);
    let mut crc = flate2::Crc::new();
    crc.update(JSON.as_bytes());
    assert_eq!(
        crc32(crc32(0, &JSON.as_bytes()[..7]), &JSON.as_bytes()[7..]),
        crc.sum()
    );
}

#[test]
fn every_format_and_body_split_anywhere_gives_the_usage() {
    for format in FORMATS {
        for (kind, body, expected) in [
            (BodyKind::Json, JSON, UsageRead::Found(29)),
            (BodyKind::EventStream, STREAM, UsageRead::Found(11)),
        ] {
            let packed = compress(format, body.as_bytes());
            let encoding = encoding_of(format);
            let (out, inflater) = inflate_chunks(encoding, &[&packed], 1 << 20);
            assert_eq!(out, body.as_bytes(), "{format:?}");
            assert!(
                inflater.ended() && inflater.failed().is_none(),
                "{format:?}"
            );
            for at in 0..=packed.len() {
                let (read, inflater) = usage(kind, encoding, &[&packed[..at], &packed[at..]]);
                assert_eq!(read, expected, "{format:?} {kind:?} split at {at}");
                assert!(inflater.ended(), "{format:?} split at {at}");
            }
            let bytes: Vec<&[u8]> = packed.chunks(1).collect();
            assert_eq!(
                usage(kind, encoding, &bytes).0,
                expected,
                "{format:?} byte by byte"
            );
        }
    }
}

#[test]
fn a_large_body_passes_through_the_window_whole() {
    // Longer than the window and the step buffer, poorly compressible in places.
    let mut body = String::from("{\"choices\":[");
    for i in 0..20_000u32 {
        body.push_str(&format!(
            "{{\"index\":{i},\"text\":\"{:x}\"}},",
            i.wrapping_mul(2_654_435_761)
        ));
    }
    body.push_str("{}],\"usage\":{\"total_tokens\":123456}}");
    for format in FORMATS {
        let packed = compress(format, body.as_bytes());
        let chunks: Vec<&[u8]> = packed.chunks(1000).collect();
        let (out, inflater) = inflate_chunks(encoding_of(format), &chunks, 1 << 24);
        assert!(out == body.as_bytes() && inflater.ended(), "{format:?}");
        let (read, _) = usage(BodyKind::Json, encoding_of(format), &chunks);
        assert_eq!(read, UsageRead::Found(123456), "{format:?}");
    }
}

#[test]
fn gzip_header_fields_and_members_are_skipped_and_read() {
    // A header with every optional field (extra, name, comment, header CRC), around flate2's
    // raw deflate data and a trailer of its CRC.
    let data = compress(Format::Raw, JSON.as_bytes());
    let mut crc = flate2::Crc::new();
    crc.update(JSON.as_bytes());
    let mut member = vec![
        0x1f,
        0x8b,
        8,
        FHCRC | FEXTRA | FNAME | FCOMMENT,
        1,
        2,
        3,
        4,
        0,
        255,
    ];
    member.extend_from_slice(&[3, 0, b'a', b'b', b'c']);
    member.extend_from_slice(b"usage.json\0a comment\0");
    member.extend_from_slice(&[0x12, 0x34]);
    member.extend_from_slice(&data);
    member.extend_from_slice(&crc.sum().to_le_bytes());
    member.extend_from_slice(&(JSON.len() as u32).to_le_bytes());
    for at in 0..=member.len() {
        let (out, inflater) =
            inflate_chunks(Encoding::Gzip, &[&member[..at], &member[at..]], 1 << 20);
        assert!(out == JSON.as_bytes() && inflater.ended(), "split at {at}");
    }
    // Two members: the body's halves, compressed apart (RFC 1952 allows several).
    let (a, b) = STREAM.as_bytes().split_at(100);
    let mut two = compress(Format::Gzip, a);
    two.extend(compress(Format::Gzip, b));
    let (read, inflater) = usage(BodyKind::EventStream, Encoding::Gzip, &[&two]);
    assert_eq!(read, UsageRead::Found(11));
    assert!(inflater.ended());
    // Deflate ignores bytes after its end.
    let mut trailing = compress(Format::Zlib, JSON.as_bytes());
    trailing.extend_from_slice(b"\0\0garbage");
    let (read, inflater) = usage(BodyKind::Json, Encoding::Deflate, &[&trailing]);
    assert_eq!((read, inflater.failed()), (UsageRead::Found(29), None));
}

#[test]
fn a_corrupt_stream_is_unreadable() {
    let gzip = compress(Format::Gzip, JSON.as_bytes());
    let zlib = compress(Format::Zlib, JSON.as_bytes());
    for (name, bytes) in [
        ("not gzip", b"{\"usage\":{\"total_tokens\":1}}".to_vec()),
        ("bad method", [&[0x1f, 0x8b, 7][..], &gzip[3..]].concat()),
        (
            "reserved flags",
            [&[0x1f, 0x8b, 8, 0x20][..], &gzip[4..]].concat(),
        ),
    ] {
        let (_, inflater) = inflate_chunks(Encoding::Gzip, &[&bytes], 1 << 20);
        assert_eq!(inflater.failed(), Some(InflateError::Corrupt), "{name}");
    }
    // Any byte changed after the header (the data, its CRC, its size) is caught.
    for at in 10..gzip.len() {
        let mut bad = gzip.clone();
        bad[at] ^= 0x55;
        let (read, inflater) = usage(BodyKind::Json, Encoding::Gzip, &[&bad]);
        assert!(
            inflater.failed() == Some(InflateError::Corrupt) || !inflater.ended(),
            "byte {at}: {read:?}"
        );
        // Once failed, nothing more is read.
        let mut inflater = inflater;
        let mut more = 0;
        if inflater.failed().is_some() {
            inflater.feed(&gzip, &mut |b| more += b.len());
            assert_eq!(more, 0);
        }
    }
    // zlib's Adler-32 is checked.
    let mut bad = zlib.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let (_, inflater) = inflate_chunks(Encoding::Deflate, &[&bad], 1 << 20);
    assert_eq!(inflater.failed(), Some(InflateError::Corrupt));
    // A cut stream is not corrupt, only not ended.
    let (_, inflater) = inflate_chunks(Encoding::Gzip, &[&gzip[..gzip.len() - 3]], 1 << 20);
    assert_eq!((inflater.failed(), inflater.ended()), (None, false));
}

#[test]
fn a_bomb_stops_at_the_bound() {
    let bound = 1 << 20;
    let zeros = vec![0u8; 8 << 20];
    for format in FORMATS {
        let packed = compress(format, &zeros);
        assert!(packed.len() < 64 << 10, "{}", packed.len());
        let mut inflater = Inflater::new(encoding_of(format), bound).unwrap();
        let mut out = 0u64;
        for chunk in packed.chunks(4096) {
            inflater.feed(chunk, &mut |b| out += b.len() as u64);
        }
        assert_eq!(
            inflater.failed(),
            Some(InflateError::TooLarge),
            "{format:?}"
        );
        assert!(out <= bound, "{format:?}: {out}");
    }
    // The compressed bytes count too (empty stored blocks inflate to nothing).
    let mut inflater = Inflater::new(Encoding::Deflate, 100).unwrap();
    let empty_block = [0u8, 0, 0, 0xff, 0xff];
    for _ in 0..21 {
        inflater.feed(&empty_block, &mut |_| {});
    }
    assert_eq!(inflater.failed(), Some(InflateError::TooLarge));
}

#[test]
fn an_inflater_holds_a_constant_number_of_bytes() {
    let inflater = Inflater::new(Encoding::Gzip, 1).unwrap();
    assert!(
        inflater.memory_bytes() <= INFLATER_BYTES,
        "{}",
        inflater.memory_bytes()
    );
    println!(
        "Inflater: {} bytes ({} of miniz_oxide's state)",
        inflater.memory_bytes(),
        std::mem::size_of::<InflateState>()
    );
}
