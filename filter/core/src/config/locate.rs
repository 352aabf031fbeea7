//! Where in the text a serde error happened, as a field path (`rules[0].limits[1].window`).

use super::{invalid, ConfigError};

/// Turns a serde_json error into one that names the field, found from the error's position.
pub(super) fn serde_error(json: &[u8], error: &serde_json::Error) -> ConfigError {
    let full = error.to_string();
    let message = match full.rfind(" at line ") {
        Some(i) => full[..i].to_string(),
        None => full,
    };
    let offset = byte_offset(json, error.line(), error.column());
    let path = json_path_at(&json[..offset.min(json.len())]);
    // serde reports a missing field at the end of its object: name the field itself.
    if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.trim_end_matches('`');
        let field = if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        };
        return invalid(&field, "is required");
    }
    ConfigError {
        field: path,
        message,
    }
}

/// Byte offset of serde_json's 1-based line and column (the column counts bytes).
pub(super) fn byte_offset(json: &[u8], line: usize, column: usize) -> usize {
    let mut line_start = 0;
    for _ in 1..line {
        match json[line_start..].iter().position(|&b| b == b'\n') {
            Some(i) => line_start += i + 1,
            None => break,
        }
    }
    line_start + column
}

/// The JSON path (`limit.rate`, `rules[2].name`) of the innermost value open at the end of
/// `prefix`, a prefix of a JSON document.
pub(super) fn json_path_at(prefix: &[u8]) -> String {
    enum Frame {
        Object { key: Option<String>, want_key: bool },
        Array { index: usize },
    }
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while i < prefix.len() {
        match prefix[i] {
            b'"' => {
                let mut text = Vec::new();
                i += 1;
                while i < prefix.len() && prefix[i] != b'"' {
                    if prefix[i] == b'\\' {
                        i += 1;
                    }
                    if let Some(&b) = prefix.get(i) {
                        text.push(b);
                    }
                    i += 1;
                }
                if let Some(Frame::Object { key, want_key }) = stack.last_mut() {
                    if *want_key {
                        *key = Some(String::from_utf8_lossy(&text).into_owned());
                        *want_key = false;
                    }
                }
            }
            b'{' => stack.push(Frame::Object {
                key: None,
                want_key: true,
            }),
            b'[' => stack.push(Frame::Array { index: 0 }),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Object { want_key, .. }) => *want_key = true,
                Some(Frame::Array { index }) => *index += 1,
                None => {}
            },
            _ => {}
        }
        i += 1;
    }
    let mut path = String::new();
    for frame in &stack {
        match frame {
            Frame::Object { key: Some(k), .. } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
            }
            Frame::Object { key: None, .. } => {}
            Frame::Array { index } => path.push_str(&format!("[{index}]")),
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn json_path_tracks_objects_and_arrays() {
        assert_eq!(json_path_at(br#"{"a": {"b": [1, {"c": "#), "a.b[1].c");
        assert_eq!(json_path_at(br#"{"a": {"b": 1}, "d": "x\"y"#), "d");
        assert_eq!(json_path_at(br#"{"a\"b": 1"#), "a\"b");
    }
}
