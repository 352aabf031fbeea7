//! Who is calling, and the Redis key of their bucket.

use crate::config::Config;
use crate::encode::path_segment;
use crate::sha1::sha1_hex;

/// Where the identity of a request came from; part of the Redis key, so an API key and an IP
/// with the same text never share a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityKind {
    ApiKey,
    ClientIp,
    /// Neither an API key nor a client address: all such requests share one bucket.
    Anonymous,
}

impl IdentityKind {
    pub fn label(self) -> &'static str {
        match self {
            IdentityKind::ApiKey => "key",
            IdentityKind::ClientIp => "ip",
            IdentityKind::Anonymous => "anon",
        }
    }
}

/// The caller: the API key header if present and non-empty, else the client IP.
pub fn identify<'a>(
    api_key: Option<&'a [u8]>,
    source_address: Option<&'a str>,
) -> (IdentityKind, &'a [u8]) {
    if let Some(key) = api_key.filter(|k| !k.is_empty()) {
        return (IdentityKind::ApiKey, key);
    }
    match source_address.map(strip_port).filter(|ip| !ip.is_empty()) {
        Some(ip) => (IdentityKind::ClientIp, ip.as_bytes()),
        None => (IdentityKind::Anonymous, b""),
    }
}

/// `1.2.3.4:5678` → `1.2.3.4`, `[2001:db8::1]:5678` → `2001:db8::1`; a bare address is kept.
/// Without this every connection would get a bucket of its own.
pub fn strip_port(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match address.rsplit_once(':') {
        // One colon: IPv4 with a port. More than one: a bare IPv6 address.
        Some((host, _port)) if !host.contains(':') => host,
        _ => address,
    }
}

/// Identities up to this length stay readable when `hash_identities` is off; longer ones are
/// hashed anyway, so a debugging option cannot be used to make Redis keys and URLs huge.
pub const MAX_READABLE_IDENTITY: usize = 128;

/// The Redis key of the caller's bucket: `prefix + kind + ":" + sha1hex(identity)`, or the
/// identity itself when `hash_identities` is off (short, printable identities only).
pub fn redis_key(config: &Config, kind: IdentityKind, identity: &[u8]) -> String {
    let readable = !config.hash_identities
        && identity.len() <= MAX_READABLE_IDENTITY
        && identity.iter().all(|b| b.is_ascii_graphic());
    let id = if readable {
        String::from_utf8_lossy(identity).into_owned()
    } else {
        sha1_hex(identity)
    };
    format!("{}{}:{}", config.key_prefix, kind.label(), id)
}

/// The key as one encoded Webdis path segment.
pub fn encoded_key(key: &str) -> String {
    path_segment(key.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn config(hash: bool) -> Config {
        let json =
            format!(r#"{{"hash_identities": {hash}, "limit": {{"capacity": 1, "rate": 1}}}}"#);
        Config::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn ports_are_stripped() {
        assert_eq!(strip_port("10.0.0.1:5678"), "10.0.0.1");
        assert_eq!(strip_port("[2001:db8::1]:443"), "2001:db8::1");
        assert_eq!(strip_port("[::1]:1"), "::1");
        assert_eq!(strip_port("2001:db8::1"), "2001:db8::1");
        assert_eq!(strip_port("10.0.0.1"), "10.0.0.1");
        assert_eq!(strip_port("[broken"), "broken");
    }

    #[test]
    fn api_key_wins_then_ip_then_anonymous() {
        assert_eq!(
            identify(Some(b"k1"), Some("1.2.3.4:5")),
            (IdentityKind::ApiKey, &b"k1"[..])
        );
        assert_eq!(
            identify(Some(b""), Some("1.2.3.4:5")),
            (IdentityKind::ClientIp, &b"1.2.3.4"[..])
        );
        assert_eq!(
            identify(None, Some("[::1]:5")),
            (IdentityKind::ClientIp, &b"::1"[..])
        );
        assert_eq!(identify(None, None), (IdentityKind::Anonymous, &b""[..]));
    }

    #[test]
    fn identities_are_hashed_by_default() {
        let c = config(true);
        assert_eq!(
            redis_key(&c, IdentityKind::ApiKey, b"abc"),
            "rl:key:a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            redis_key(&c, IdentityKind::ClientIp, b"abc"),
            "rl:ip:a9993e364706816aba3e25717850c26c9cd0d89d"
        );
    }

    #[test]
    fn readable_keys_only_for_short_printable_identities() {
        let c = config(false);
        assert_eq!(redis_key(&c, IdentityKind::ApiKey, b"abc"), "rl:key:abc");
        assert_eq!(
            redis_key(&c, IdentityKind::ApiKey, b"a b"),
            format!("rl:key:{}", sha1_hex(b"a b"))
        );
        let long = vec![b'x'; MAX_READABLE_IDENTITY + 1];
        assert_eq!(
            redis_key(&c, IdentityKind::ApiKey, &long),
            format!("rl:key:{}", sha1_hex(&long))
        );
    }

    #[test]
    fn hostile_readable_identity_is_one_encoded_segment() {
        let c = config(false);
        let key = redis_key(&c, IdentityKind::ApiKey, b"a/1000000/1000000");
        assert_eq!(encoded_key(&key), "rl%3Akey%3Aa%2F1000000%2F1000000");
    }
}
