//! A strict parser for the Structured Field Lists the rate-limit headers use (RFC 8941):
//! items that are Strings, Tokens or Integers, with parameters. Anything else is an error, so
//! a test that parses a header proves it is well-formed.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bare {
    String(String),
    Token(String),
    Integer(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub value: Bare,
    pub params: Vec<(String, Bare)>,
}

impl Item {
    /// The item's String value.
    pub fn name(&self) -> Option<&str> {
        match &self.value {
            Bare::String(s) => Some(s),
            _ => None,
        }
    }

    /// An Integer parameter.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| match v {
                Bare::Integer(i) => Some(*i),
                _ => None,
            })
    }
}

/// Parses a List; `Err` says where it is malformed.
pub fn parse_list(input: &str) -> Result<Vec<Item>, String> {
    let mut p = Parser {
        s: input.as_bytes(),
        i: 0,
    };
    p.skip(b' ');
    let mut items = Vec::new();
    if p.done() {
        return Ok(items);
    }
    loop {
        let value = p.bare()?;
        let mut params = Vec::new();
        while p.peek() == Some(b';') {
            p.i += 1;
            p.skip(b' ');
            let key = p.key()?;
            let value = if p.peek() == Some(b'=') {
                p.i += 1;
                p.bare()?
            } else {
                Bare::Token("?1".into())
            };
            params.push((key, value));
        }
        items.push(Item { value, params });
        p.skip(b' ');
        if p.done() {
            return Ok(items);
        }
        if p.peek() != Some(b',') {
            return Err(format!("expected ',' at byte {}", p.i));
        }
        p.i += 1;
        p.skip(b' ');
        if p.done() {
            return Err("trailing ','".into());
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn done(&self) -> bool {
        self.i >= self.s.len()
    }
    fn skip(&mut self, b: u8) {
        while self.peek() == Some(b) {
            self.i += 1;
        }
    }
    fn key(&mut self) -> Result<String, String> {
        let start = self.i;
        match self.peek() {
            Some(c) if c.is_ascii_lowercase() || c == b'*' => {}
            _ => return Err(format!("expected a key at byte {}", self.i)),
        }
        while let Some(c) = self.peek() {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(&c) {
                self.i += 1;
            } else {
                break;
            }
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }
    fn bare(&mut self) -> Result<Bare, String> {
        match self.peek() {
            Some(b'"') => {
                self.i += 1;
                let mut out = String::new();
                loop {
                    match self.peek() {
                        None => return Err("unterminated string".into()),
                        Some(b'"') => {
                            self.i += 1;
                            return Ok(Bare::String(out));
                        }
                        Some(b'\\') => {
                            self.i += 1;
                            match self.peek() {
                                Some(c @ (b'"' | b'\\')) => out.push(c as char),
                                _ => return Err("bad escape".into()),
                            }
                            self.i += 1;
                        }
                        Some(c) if (0x20..0x7f).contains(&c) => {
                            out.push(c as char);
                            self.i += 1;
                        }
                        Some(_) => return Err("non-printable character in string".into()),
                    }
                }
            }
            Some(c) if c == b'-' || c.is_ascii_digit() => {
                let start = self.i;
                self.i += 1;
                while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    self.i += 1;
                }
                let text =
                    std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?;
                if text.len() > 16 || self.peek() == Some(b'.') {
                    return Err(format!("not an integer at byte {start}"));
                }
                text.parse().map(Bare::Integer).map_err(|e| e.to_string())
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'*' => {
                let start = self.i;
                while self
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c))
                {
                    self.i += 1;
                }
                Ok(Bare::Token(
                    String::from_utf8_lossy(&self.s[start..self.i]).into_owned(),
                ))
            }
            _ => Err(format!("expected an item at byte {}", self.i)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ratelimit_fields() {
        let items = parse_list(r#""api.second";q=20;w=1, "api.day";q=1000;w=86400"#).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].name(), Some("api.day"));
        assert_eq!(items[1].int("w"), Some(86400));
    }

    #[test]
    fn rejects_malformed_lists() {
        for bad in [
            r#""a";q=1,"#,
            r#""a;q=1"#,
            r#""a";Q=1"#,
            r#""a" "b""#,
            r#""a";q=1.5"#,
            "(a)",
        ] {
            assert!(parse_list(bad).is_err(), "{bad}");
        }
    }
}
