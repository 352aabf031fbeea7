//! Encodings for what the filter sends to Webdis.

/// Percent-encodes one Webdis path segment.
///
/// Webdis splits the path on `/`, percent-decodes each segment, turns `+` into a space, reads a
/// `.ext` suffix on the last segment as an output format and an all-digit first segment as a
/// database number. Only unreserved letters, digits, `-`, `_` and `~` pass through; every other
/// byte, `.` included, is sent as `%XX`, so a value always stays exactly one argument with
/// exactly its own bytes, whatever a client put in it.
pub fn path_segment(value: &[u8]) -> String {
    let mut out = String::with_capacity(path_segment_len(value));
    push_path_segment(&mut out, value);
    out
}

/// [`path_segment`] appended to `out`: a call's path is written in place, argument after
/// argument, without a string of its own for each.
pub fn push_path_segment(out: &mut String, value: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0x0f)] as char);
        }
    }
}

/// The length of `path_segment(value)`, without building it.
pub fn path_segment_len(value: &[u8]) -> usize {
    value
        .iter()
        .map(|&b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~') {
                1
            } else {
                3
            }
        })
        .sum()
}

/// Standard base64 with padding (RFC 4648), for the `Authorization: Basic` header.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 0x3f) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn unreserved_bytes_pass_through() {
        assert_eq!(path_segment(b"AZaz09-_~"), "AZaz09-_~");
    }

    #[test]
    fn every_byte_webdis_interprets_is_encoded() {
        let cases: &[(&[u8], &str)] = &[
            (b"a/b", "a%2Fb"),
            (b"a+b", "a%2Bb"),
            (b"a b", "a%20b"),
            (b"100%", "100%25"),
            (b"x?y#z", "x%3Fy%23z"),
            (b"key.json", "key%2Ejson"),
            (b"..", "%2E%2E"),
            ("é".as_bytes(), "%C3%A9"),
            (b"\r\n\0", "%0D%0A%00"),
            (b"", ""),
        ];
        for (raw, encoded) in cases {
            assert_eq!(path_segment(raw), *encoded, "input {raw:?}");
        }
    }

    #[test]
    fn a_value_spelling_out_arguments_stays_one_segment() {
        let encoded = path_segment(b"a/1000000/1000000");
        assert!(!encoded.contains('/'));
        assert_eq!(encoded, "a%2F1000000%2F1000000");
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
            ("ratelimit:secret", "cmF0ZWxpbWl0OnNlY3JldA=="),
        ];
        for (raw, encoded) in cases {
            assert_eq!(base64(raw.as_bytes()), encoded);
        }
    }
}
