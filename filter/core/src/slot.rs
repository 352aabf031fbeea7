//! Redis Cluster hash slots: which of the 16,384 slots a key lives in. A script may only touch
//! keys of one slot (else `CROSSSLOT`), so in cluster mode the engine groups each call's keys
//! by slot. Computed as Redis does: CRC16 (XMODEM) of the key's hash tag — the text between the
//! first `{` and the next `}`, when that is not empty — or of the whole key, mod 16,384.

pub const SLOTS: u16 = 16_384;

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The part of `key` that decides its slot.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The hash slot of `key`.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn crc16_is_xmodem() {
        // The check value of CRC-16/XMODEM, also quoted in the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn slots_follow_the_hash_tag_rules() {
        assert_eq!(key_slot(b"123456789"), 0x31C3 % SLOTS);
        // Only the first {...} counts, and only if not empty.
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"no-braces"), b"no-braces");
        assert_eq!(hash_tag(b"open{only"), b"open{only");
        // The limiter's keys: every limit of one identity shares a slot.
        assert_eq!(
            key_slot(b"rl:{client_ip:ab12}:api:second"),
            key_slot(b"rl:{client_ip:ab12}:api:day")
        );
    }
}
