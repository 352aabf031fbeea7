//! SHA-1 (FIPS 180-4), small and dependency-free.
//!
//! Two uses, neither a security boundary: Redis names scripts by the SHA-1 of their text
//! (`EVALSHA`), and identities are stored as a digest so Redis never holds API keys or IPs in
//! clear. A collision would let a caller share a bucket with a chosen other caller only if it
//! could find a second preimage of that caller's identity, which SHA-1 still resists.

/// SHA-1 digest of `data`.
pub fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let bit_len = (data.len() as u64).wrapping_mul(8);
    let mut message = data.to_vec();
    message.push(0x80);
    while message.len() % 64 != 56 {
        message.push(0);
    }
    message.extend_from_slice(&bit_len.to_be_bytes());

    for block in message.chunks_exact(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        // Four rounds of 20, each with its own function: no branch inside the rounds.
        let mut round = |range: std::ops::Range<usize>, k: u32, f: fn(u32, u32, u32) -> u32| {
            for &wi in &w[range] {
                let temp = a
                    .rotate_left(5)
                    .wrapping_add(f(b, c, d))
                    .wrapping_add(e)
                    .wrapping_add(k)
                    .wrapping_add(wi);
                e = d;
                d = c;
                c = b.rotate_left(30);
                b = a;
                a = temp;
            }
        };
        round(0..20, 0x5A82_7999, |b, c, d| (b & c) | (!b & d));
        round(20..40, 0x6ED9_EBA1, |b, c, d| b ^ c ^ d);
        round(40..60, 0x8F1B_BCDC, |b, c, d| (b & c) | (b & d) | (c & d));
        round(60..80, 0xCA62_C1D6, |b, c, d| b ^ c ^ d);
        for (state, v) in h.iter_mut().zip([a, b, c, d, e]) {
            *state = state.wrapping_add(v);
        }
    }

    let mut out = [0u8; 20];
    for (chunk, word) in out.chunks_exact_mut(4).zip(h) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
    s
}

/// Lower-case hex SHA-1 of `data`, the form Redis uses for script names.
pub fn sha1_hex(data: &[u8]) -> String {
    hex(&sha1(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn known_vectors() {
        assert_eq!(sha1_hex(b""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(sha1_hex(b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(
            sha1_hex(&[b'a'; 55]),
            "c1c8bbdc22796e28c0e15163d20899b65621d65a"
        );
        assert_eq!(
            sha1_hex(&[b'a'; 56]),
            "c2db330f6083854c99d4b5bfb6e8f29f201be699"
        );
        assert_eq!(
            sha1_hex(&[b'a'; 64]),
            "0098ba824b5c16427bd7a1122a5a442a25ec644d"
        );
        assert_eq!(
            sha1_hex(b"The quick brown fox jumps over the lazy dog"),
            "2fd4e1c67a2d28fced849ee1bb76e7391b93eb12"
        );
    }
}
