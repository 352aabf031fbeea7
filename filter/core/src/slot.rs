//! Redis Cluster hash slots: which of the 16,384 slots a key lives in. A script may only touch
//! keys of one slot (else `CROSSSLOT`), so on a Redis Cluster the engine groups each call's keys
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

/// For every slot, a number n such that the text `b<n>` hashes to it (`{b<n>}` is then a hash
/// tag on that slot), by slot. Empty when not needed.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct SlotTags(pub Vec<u32>);

impl std::fmt::Debug for SlotTags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SlotTags({} slots)", self.0.len())
    }
}

/// For every slot, a number n such that the text `b<n>` hashes to it: `{b<n>}` is a hash tag
/// on that slot. Key budgets on a Redis Cluster keep one counter per slot this way (a script may
/// only touch the slot of the identity it decides). About 160,000 CRCs, once per worker.
pub fn slot_tags() -> Vec<u32> {
    let mut tags = vec![u32::MAX; usize::from(SLOTS)];
    let mut missing = usize::from(SLOTS);
    let mut text = [0u8; 12];
    let mut n: u32 = 0;
    while missing > 0 && n < u32::MAX {
        let len = tag_text(n, &mut text);
        let slot = usize::from(crc16(&text[..len]) % SLOTS);
        if tags[slot] == u32::MAX {
            tags[slot] = n;
            missing -= 1;
        }
        n += 1;
    }
    tags
}

/// Writes `b<n>` into `out`; returns its length.
fn tag_text(n: u32, out: &mut [u8; 12]) -> usize {
    let digits = n.to_string();
    out[0] = b'b';
    out[1..1 + digits.len()].copy_from_slice(digits.as_bytes());
    1 + digits.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        let tags = slot_tags();
        assert_eq!(tags.len(), usize::from(SLOTS));
        for (slot, n) in tags.iter().enumerate() {
            let key = format!("rl:{{b{n}}}:key_budget:r");
            assert_eq!(usize::from(key_slot(key.as_bytes())), slot);
        }
    }

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
