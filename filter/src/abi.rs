//! The proxy-wasm ABI's encoding of a header map, for the host call the adapter makes without
//! the SDK's wrapper (`wasm_host::send_response`): the SDK keeps its own encoder private.

/// A header map as `proxy_send_local_response` takes it: the number of pairs, each pair's
/// name and value lengths, then each name and value followed by a NUL (lengths as u32, little
/// endian).
pub fn header_map(pairs: &[(&str, &str)]) -> Vec<u8> {
    let size = 4 + pairs
        .iter()
        .map(|(n, v)| n.len() + v.len() + 10)
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&length(pairs.len()));
    for (name, value) in pairs {
        out.extend_from_slice(&length(name.len()));
        out.extend_from_slice(&length(value.len()));
    }
    for (name, value) in pairs {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(value.as_bytes());
        out.push(0);
    }
    out
}

/// A length as the ABI writes it. Headers are far below 4 GiB (Envoy's own limits are KiBs).
fn length(n: usize) -> [u8; 4] {
    u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes()
}

/// The host's reading of [`header_map`] (proxy-wasm-cpp-host's `deserializeMap`), for the fake
/// Envoy: the pairs back, or None if the bytes do not hold what their lengths say.
#[cfg(test)]
pub fn read_header_map(bytes: &[u8]) -> Option<Vec<(String, String)>> {
    let word = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let count = word(0)?;
    let mut text = 4 + 8 * count;
    let mut pairs = Vec::with_capacity(count);
    for i in 0..count {
        let (name_len, value_len) = (word(4 + 8 * i)?, word(8 + 8 * i)?);
        let name = bytes.get(text..text + name_len)?;
        text += name_len;
        (bytes.get(text) == Some(&0)).then_some(())?;
        let value = bytes.get(text + 1..text + 1 + value_len)?;
        text += 1 + value_len;
        (bytes.get(text) == Some(&0)).then_some(())?;
        text += 1;
        pairs.push((
            String::from_utf8(name.to_vec()).ok()?,
            String::from_utf8(value.to_vec()).ok()?,
        ));
    }
    (text == bytes.len()).then_some(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_map_is_laid_out_as_the_abi_says() {
        assert_eq!(header_map(&[]), [0, 0, 0, 0]);
        let bytes = header_map(&[("a", "xy"), ("grpc-retry-pushback-ms", "-1")]);
        let mut want = vec![2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 22, 0, 0, 0, 2, 0, 0, 0];
        want.extend_from_slice(b"a\0xy\0grpc-retry-pushback-ms\0-1\0");
        assert_eq!(bytes, want);
    }

    #[test]
    fn the_host_reads_back_what_was_written() {
        let pairs = [("x-ratelimit-limit", "10"), ("empty", ""), ("", "v")];
        let read = read_header_map(&header_map(&pairs)).unwrap();
        let want: Vec<(String, String)> = pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(read, want);
        let mut cut = header_map(&pairs);
        cut.pop();
        assert_eq!(read_header_map(&cut), None);
    }
}
