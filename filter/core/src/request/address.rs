//! The client's address as the limiter counts it: the connection's peer or the trusted
//! X-Forwarded-For entry, grouped by prefix.

use std::net::IpAddr;

use super::view::RequestView;
use crate::config::ClientIpPolicy;

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

/// The client's address as the limiter counts it: the connection's peer, or with
/// `xff_trusted_hops = N` the Nth entry from the right of X-Forwarded-For (the one the
/// outermost trusted proxy saw), grouped into its IPv4 / IPv6 prefix (`2001:db8:1:2::/64`).
/// A client can write anything into X-Forwarded-For, so with N = 0 it is never read.
///
/// With fewer entries than N the request did not come through the proxies: the peer counts.
/// An Nth entry that is not an IP address (optionally with a port) is absent: the trusted
/// chain is broken, and counting the bytes as written would let a client rotate garbage for
/// fresh buckets. The rule's next key alternative, or its `when_missing`, applies then.
pub fn client_ip(view: &dyn RequestView, policy: &ClientIpPolicy) -> Option<String> {
    if policy.xff_trusted_hops > 0 {
        let xff = view.header("x-forwarded-for").unwrap_or_default();
        // Bytes, not text: a lossy conversion would turn different invalid values into one.
        let entries: Vec<&[u8]> = xff
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .filter(|e| !e.is_empty())
            .collect();
        if let Some(i) = entries.len().checked_sub(policy.xff_trusted_hops) {
            return forwarded_address(entries[i]).map(|ip| group(ip, policy));
        }
    }
    let peer = view.source_address()?;
    let peer = strip_port(&peer);
    match peer.parse::<IpAddr>() {
        Ok(ip) => Some(group(ip, policy)),
        // Envoy's peer is not an IP (a Unix socket, say): one bucket for that peer.
        Err(_) => Some(peer.to_string()),
    }
}

/// An X-Forwarded-For entry as an address: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`,
/// `[2001:db8::1]` or `[2001:db8::1]:443`. Anything else (not UTF-8, `[]`, `:80`, a name, a
/// bad port) is `None`.
fn forwarded_address(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?;
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    let port_ok = |port: &str| {
        !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok()
    };
    if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let v6 = inside.parse::<std::net::Ipv6Addr>().ok()?;
        return match after.strip_prefix(':') {
            None if after.is_empty() => Some(IpAddr::V6(v6)),
            Some(port) if port_ok(port) => Some(IpAddr::V6(v6)),
            _ => None,
        };
    }
    let (host, port) = text.rsplit_once(':')?;
    let v4 = host.parse::<std::net::Ipv4Addr>().ok()?;
    port_ok(port).then_some(IpAddr::V4(v4))
}

/// The address's prefix in CIDR form; a full-length prefix is the bare address.
fn group(ip: IpAddr, policy: &ClientIpPolicy) -> String {
    let ip = match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(policy.ipv4_prefix.min(32));
            if bits == 32 {
                return v4.to_string();
            }
            let masked = u32::from(v4) & (u32::MAX << (32 - bits));
            format!("{}/{bits}", std::net::Ipv4Addr::from(masked))
        }
        IpAddr::V6(v6) => {
            let bits = u32::from(policy.ipv6_prefix.min(128));
            if bits == 128 {
                return v6.to_string();
            }
            let masked = u128::from(v6) & (u128::MAX << (128 - bits));
            format!("{}/{bits}", std::net::Ipv6Addr::from(masked))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::request::identity::resolve;
    use crate::testing::request::FakeRequest;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn policy(hops: usize) -> ClientIpPolicy {
        ClientIpPolicy {
            xff_trusted_hops: hops,
            ipv4_prefix: 32,
            ipv6_prefix: 64,
        }
    }

    fn config(extra: &str, key: &str) -> Config {
        let json = format!(
            r#"{{{extra} "rules": [{{"name": "r", "key": {key}, "limits": [{{"name": "l", "limit": 1, "window": "1s"}}]}}]}}"#
        );
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
    fn forged_xff_is_ignored_without_trusted_hops() {
        let r = FakeRequest::new("GET", "/").with("x-forwarded-for", b"6.6.6.6");
        assert_eq!(client_ip(&r, &policy(0)).as_deref(), Some("10.1.2.3"));
    }

    #[test]
    fn xff_is_read_from_the_right() {
        let r = FakeRequest::new("GET", "/").with("x-forwarded-for", b"6.6.6.6, 1.1.1.1, 2.2.2.2");
        assert_eq!(client_ip(&r, &policy(1)).as_deref(), Some("2.2.2.2"));
        assert_eq!(client_ip(&r, &policy(2)).as_deref(), Some("1.1.1.1"));
        assert_eq!(client_ip(&r, &policy(3)).as_deref(), Some("6.6.6.6"));
        // More trusted hops than entries: the peer, not the client's own first entry.
        assert_eq!(client_ip(&r, &policy(4)).as_deref(), Some("10.1.2.3"));
        let none = FakeRequest::new("GET", "/");
        assert_eq!(client_ip(&none, &policy(1)).as_deref(), Some("10.1.2.3"));
    }

    #[test]
    fn xff_entries_are_addresses_with_an_optional_port() {
        let via = |xff: &[u8]| {
            let r = FakeRequest::new("GET", "/").with("x-forwarded-for", xff);
            client_ip(&r, &policy(1))
        };
        for (xff, want) in [
            (&b"1.2.3.4"[..], "1.2.3.4"),
            (b"1.2.3.4:80", "1.2.3.4"),
            (b" 6.6.6.6 ,1.2.3.4:65535 ", "1.2.3.4"),
            (b"2001:db8::1", "2001:db8::/64"),
            (b"[2001:db8::1]", "2001:db8::/64"),
            (b"[2001:db8::1]:443", "2001:db8::/64"),
            (b"::ffff:1.2.3.4", "1.2.3.4"),
        ] {
            assert_eq!(via(xff).as_deref(), Some(want), "{xff:?}");
        }
    }

    #[test]
    fn an_invalid_chosen_xff_entry_is_absent() {
        let via = |xff: &[u8]| {
            let r = FakeRequest::new("GET", "/").with("x-forwarded-for", xff);
            client_ip(&r, &policy(1))
        };
        for xff in [
            &b"[]"[..],
            b":80",
            b"\xff\xfe",
            b"\xfe\xff",
            b"1.2.3.4:abc",
            b"1.2.3.4:",
            b"1.2.3.4:99999",
            b"1.2.3.4:80:90",
            b"[2001:db8::1]443",
            b"[1.2.3.4]:80",
            b"unknown",
            b"client.example",
            b"1.2.3.4, garbage",
        ] {
            assert_eq!(via(xff), None, "{xff:?}");
        }
        // Only the chosen entry must be valid: garbage further left is never read.
        assert_eq!(via(b"garbage, 1.2.3.4").as_deref(), Some("1.2.3.4"));
        // Absent, the rule's next alternative applies.
        let c = config(
            r#""xff_trusted_hops": 1,"#,
            r#"{"from": ["client_ip", "header:x-api-key"], "when_missing": "skip"}"#,
        );
        let r = |xff: &[u8]| FakeRequest::new("GET", "/").with("x-forwarded-for", xff);
        assert_eq!(
            resolve(
                &r(b"\xff\xfe").with("x-api-key", b"k"),
                &c.rules[0].key,
                &c.client_ip
            ),
            Ok(Some(("header:x-api-key".into(), b"k".to_vec())))
        );
        assert_eq!(resolve(&r(b"[]"), &c.rules[0].key, &c.client_ip), Ok(None));
    }

    #[test]
    fn addresses_are_grouped_by_prefix() {
        let v6 = |addr: &str| FakeRequest {
            source: Some(format!("[{addr}]:443")),
            ..FakeRequest::new("GET", "/")
        };
        assert_eq!(
            client_ip(&v6("2001:db8:1:2:aaaa::1"), &policy(0)).as_deref(),
            Some("2001:db8:1:2::/64")
        );
        assert_eq!(
            client_ip(&v6("2001:db8:1:2:bbbb::9"), &policy(0)),
            client_ip(&v6("2001:db8:1:2:aaaa::1"), &policy(0))
        );
        assert_eq!(
            client_ip(&v6("::ffff:10.9.8.7"), &policy(0)).as_deref(),
            Some("10.9.8.7")
        );
        let p24 = ClientIpPolicy {
            ipv4_prefix: 24,
            ..policy(0)
        };
        assert_eq!(
            client_ip(&FakeRequest::new("GET", "/"), &p24).as_deref(),
            Some("10.1.2.0/24")
        );
        let full = ClientIpPolicy {
            ipv6_prefix: 128,
            ..policy(0)
        };
        assert_eq!(
            client_ip(&v6("2001:db8::1"), &full).as_deref(),
            Some("2001:db8::1")
        );
    }
}
