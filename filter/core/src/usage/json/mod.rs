//! A streaming JSON scanner: validates a document byte by byte (RFC 8259: strings with every
//! escape, UTF-8, numbers, literals, nesting up to [`MAX_DEPTH`]) and extracts the value at a
//! key path from the top-level object. It keeps only the chain of objects on the path (a bit
//! per level), never a key or a value.
//!
//! This file is the state machine; its strings (where keys meet the path) and its numbers
//! (where the value is read) are in `strings` and `numbers`.

mod numbers;
mod strings;

use super::path::Path;
use super::{Unreadable, UsageRead, MAX_DEPTH, MAX_USAGE};
use numbers::Num;

/// What a whole document gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Doc {
    /// Only whitespace (or nothing) was scanned.
    Empty,
    Read(UsageRead),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting a value; `]` too right after `[`.
    Value {
        array_start: bool,
    },
    /// Expecting a key; `}` too right after `{`.
    Key {
        object_start: bool,
    },
    Colon,
    /// After a value: `,`, a closing bracket, or (at the top) whitespace only.
    After,
    Str,
    Escape,
    /// `\u`: hex digits read so far (into `hex`); `low` when it is a surrogate pair's second half.
    Hex {
        read: u8,
        low: bool,
    },
    /// After a high surrogate: its `\` and `u` must follow.
    LowBackslash,
    LowU,
    /// `true`, `false` or `null`: the literal and how much of it was read.
    Literal {
        word: Word,
        read: u8,
    },
    Number(Num),
    /// The top-level value is complete.
    End,
    Failed(Unreadable),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Word {
    True,
    False,
    Null,
}

impl Word {
    fn text(self) -> &'static [u8] {
        match self {
            Word::True => b"true",
            Word::False => b"false",
            Word::Null => b"null",
        }
    }
}

/// What the next value is to the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    None,
    /// The value of an inner segment: the path goes on inside it if it is an object.
    Inner,
    /// The value at the path.
    Target,
}

/// The value seen at the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Absent,
    Null,
    Found(u64),
    /// `true` or `false` (a request's `stream`): not a usage.
    Flag(bool),
    Bad(Unreadable),
}

#[derive(Debug, Clone)]
pub(crate) struct Scanner {
    state: State,
    depth: u8,
    /// Bit `d` set: the container at depth `d + 1` is an object.
    objects: u64,
    /// The depth of the deepest open object on the path (0: none).
    chain: u8,
    /// Bit `i` set: segment `i` was already a key of the path's object at depth `i + 1`.
    seen: u8,
    pending: Pending,
    verdict: Verdict,
    /// Inside a string: it is a key compared with the path's segment, matching so far, and
    /// how many bytes of the segment it matched.
    in_key: bool,
    comparing: bool,
    key_len: u8,
    /// UTF-8 inside a string: continuation bytes still due and the range of the next one.
    utf8_due: u8,
    utf8_lo: u8,
    utf8_hi: u8,
    hex: u16,
    high: u16,
    /// The number being read is the path's value: its digits so far (capped above
    /// [`MAX_USAGE`]), its sign, and whether it has a fraction or an exponent.
    target_number: bool,
    number: u64,
    negative: bool,
    fractional: bool,
    started: bool,
    /// Bytes fed before the current chunk, and the offset of the byte being stepped.
    fed: u64,
    at: u64,
    /// Where the top-level value starts, and where the value at the path starts with its
    /// first byte (a request body is edited there).
    doc_at: Option<u64>,
    target_at: Option<(u64, u8)>,
}

impl Scanner {
    pub(crate) fn new() -> Self {
        Scanner {
            state: State::Value { array_start: false },
            depth: 0,
            objects: 0,
            chain: 0,
            seen: 0,
            pending: Pending::None,
            verdict: Verdict::Absent,
            in_key: false,
            comparing: false,
            key_len: 0,
            utf8_due: 0,
            utf8_lo: 0,
            utf8_hi: 0,
            hex: 0,
            high: 0,
            target_number: false,
            number: 0,
            negative: false,
            fractional: false,
            started: false,
            fed: 0,
            at: 0,
            doc_at: None,
            target_at: None,
        }
    }

    /// The value at the path was `true` or `false`, in a whole valid document.
    pub(crate) fn flag(&self) -> Option<bool> {
        match (self.state, self.verdict) {
            (State::End, Verdict::Flag(flag)) => Some(flag),
            _ => None,
        }
    }

    /// The offset and first byte of the value at the path, in a whole valid document.
    pub(crate) fn target_at(&self) -> Option<(u64, u8)> {
        match self.state {
            State::End => self.target_at,
            _ => None,
        }
    }

    /// The offset of the top-level value's first byte, in a whole valid document.
    pub(crate) fn doc_at(&self) -> Option<u64> {
        match self.state {
            State::End => self.doc_at,
            _ => None,
        }
    }

    pub(crate) fn failed(&self) -> bool {
        matches!(self.state, State::Failed(_))
    }

    pub(crate) fn feed(&mut self, chunk: &[u8], path: &Path) {
        let mut i = 0;
        while let Some(&byte) = chunk.get(i) {
            if self.state == State::Str && !self.comparing && self.utf8_due == 0 {
                // Skip plain ASCII of a string in one go: most of a body is string content.
                let rest = chunk.get(i..).unwrap_or_default();
                let plain = rest
                    .iter()
                    .position(|&b| !(0x20..0x80).contains(&b) || b == b'"' || b == b'\\')
                    .unwrap_or(rest.len());
                i += plain;
                if plain > 0 {
                    continue;
                }
            }
            if let State::Failed(_) = self.state {
                break;
            }
            self.at = self.fed.saturating_add(i as u64);
            self.step(byte, path);
            i += 1;
        }
        self.fed = self.fed.saturating_add(chunk.len() as u64);
    }

    /// The document's verdict once its bytes ended.
    pub(crate) fn end(&mut self) -> Doc {
        if let State::Number(num) = self.state {
            if self.depth == 0 && num.can_end() {
                self.value_done();
            }
        }
        match self.state {
            State::Failed(reason) => Doc::Read(UsageRead::Invalid(reason)),
            State::End => Doc::Read(match self.verdict {
                Verdict::Absent | Verdict::Null => UsageRead::Missing,
                Verdict::Found(n) => UsageRead::Found(n),
                Verdict::Flag(_) => UsageRead::Invalid(Unreadable::NotANumber),
                Verdict::Bad(reason) => UsageRead::Invalid(reason),
            }),
            _ if !self.started => Doc::Empty,
            _ => Doc::Read(UsageRead::Invalid(Unreadable::Truncated)),
        }
    }

    fn fail(&mut self, reason: Unreadable) {
        self.state = State::Failed(reason);
    }

    fn step(&mut self, b: u8, path: &Path) {
        match self.state {
            State::Value { array_start } => self.value_start(b, array_start),
            State::Key { object_start } => match b {
                b' ' | b'\t' | b'\n' | b'\r' => {}
                b'"' => {
                    self.in_key = true;
                    self.comparing =
                        self.depth == self.chain && (self.depth as usize) <= path.len();
                    self.key_len = 0;
                    self.state = State::Str;
                }
                b'}' if object_start => self.close(true),
                _ => self.fail(Unreadable::NotJson),
            },
            State::Colon => match b {
                b' ' | b'\t' | b'\n' | b'\r' => {}
                b':' => self.state = State::Value { array_start: false },
                _ => self.fail(Unreadable::NotJson),
            },
            State::After => match b {
                b' ' | b'\t' | b'\n' | b'\r' => {}
                b',' if self.depth > 0 => {
                    self.state = if self.top_is_object() {
                        State::Key {
                            object_start: false,
                        }
                    } else {
                        State::Value { array_start: false }
                    }
                }
                b'}' if self.depth > 0 && self.top_is_object() => self.close(true),
                b']' if self.depth > 0 && !self.top_is_object() => self.close(false),
                _ => self.fail(Unreadable::NotJson),
            },
            State::End => match b {
                b' ' | b'\t' | b'\n' | b'\r' => {}
                _ => self.fail(Unreadable::NotJson),
            },
            State::Str => self.string_byte(b, path),
            State::Escape => {
                let decoded = match b {
                    b'"' => b'"',
                    b'\\' => b'\\',
                    b'/' => b'/',
                    b'b' => 0x08,
                    b'f' => 0x0c,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => {
                        self.hex = 0;
                        self.state = State::Hex {
                            read: 0,
                            low: false,
                        };
                        return;
                    }
                    _ => return self.fail(Unreadable::NotJson),
                };
                self.key_byte(decoded, path);
                self.state = State::Str;
            }
            State::Hex { read, low } => {
                let digit = match b {
                    b'0'..=b'9' => b - b'0',
                    b'a'..=b'f' => b - b'a' + 10,
                    b'A'..=b'F' => b - b'A' + 10,
                    _ => return self.fail(Unreadable::NotJson),
                };
                self.hex = (self.hex << 4) | u16::from(digit);
                if read < 3 {
                    self.state = State::Hex {
                        read: read + 1,
                        low,
                    };
                    return;
                }
                self.code_unit(low, path);
            }
            State::LowBackslash => match b {
                b'\\' => self.state = State::LowU,
                _ => self.fail(Unreadable::NotJson),
            },
            State::LowU => match b {
                b'u' => {
                    self.hex = 0;
                    self.state = State::Hex { read: 0, low: true };
                }
                _ => self.fail(Unreadable::NotJson),
            },
            State::Literal { word, read } => {
                let text = word.text();
                if text.get(read as usize) != Some(&b) {
                    return self.fail(Unreadable::NotJson);
                }
                if read as usize + 1 == text.len() {
                    self.value_done();
                } else {
                    self.state = State::Literal {
                        word,
                        read: read + 1,
                    };
                }
            }
            State::Number(num) => self.number_byte(num, b, path),
            State::Failed(_) => {}
        }
    }

    fn top_is_object(&self) -> bool {
        self.depth > 0 && self.objects & (1 << (self.depth - 1)) != 0
    }

    fn value_start(&mut self, b: u8, array_start: bool) {
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return;
        }
        if !self.started {
            self.doc_at = Some(self.at);
        }
        self.started = true;
        let pending = std::mem::replace(&mut self.pending, Pending::None);
        if pending == Pending::Target {
            self.target_at = Some((self.at, b));
            self.verdict = match b {
                b't' => Verdict::Flag(true),
                b'f' => Verdict::Flag(false),
                b'-' | b'0'..=b'9' | b'n' => self.verdict,
                _ => Verdict::Bad(Unreadable::NotANumber),
            };
        }
        match b {
            b'{' | b'[' => {
                if self.depth >= MAX_DEPTH {
                    return self.fail(Unreadable::TooDeep);
                }
                let object = b == b'{';
                self.depth += 1;
                let bit = 1u64 << (self.depth - 1);
                if object {
                    self.objects |= bit;
                    if self.depth == 1 || pending == Pending::Inner {
                        self.chain = self.depth;
                        if let Some(seen_bit) = 1u8.checked_shl(u32::from(self.depth - 1)) {
                            self.seen &= !seen_bit;
                        }
                    }
                    self.state = State::Key { object_start: true };
                } else {
                    self.objects &= !bit;
                    self.state = State::Value { array_start: true };
                }
            }
            b']' if array_start => self.close(false),
            b'"' => {
                self.in_key = false;
                self.comparing = false;
                self.state = State::Str;
            }
            b't' => {
                self.state = State::Literal {
                    word: Word::True,
                    read: 1,
                }
            }
            b'f' => {
                self.state = State::Literal {
                    word: Word::False,
                    read: 1,
                }
            }
            b'n' => {
                if pending == Pending::Target {
                    self.verdict = Verdict::Null;
                }
                self.state = State::Literal {
                    word: Word::Null,
                    read: 1,
                }
            }
            b'-' | b'0'..=b'9' => {
                self.target_number = pending == Pending::Target;
                self.number = 0;
                self.negative = b == b'-';
                self.fractional = false;
                let num = match b {
                    b'-' => Num::Minus,
                    b'0' => Num::Zero,
                    _ => Num::Int,
                };
                self.add_digit(b);
                self.state = State::Number(num);
            }
            _ => self.fail(Unreadable::NotJson),
        }
    }

    fn close(&mut self, object: bool) {
        if object && self.chain == self.depth {
            self.chain = self.chain.saturating_sub(1);
        }
        self.depth = self.depth.saturating_sub(1);
        self.value_done();
    }

    /// A value ended: record it if it is the path's number, then expect what follows it.
    fn value_done(&mut self) {
        if let State::Number(_) = self.state {
            if self.target_number {
                self.target_number = false;
                self.verdict = if self.negative {
                    Verdict::Bad(Unreadable::Negative)
                } else if self.fractional {
                    Verdict::Bad(Unreadable::NotAnInteger)
                } else if self.number > MAX_USAGE {
                    Verdict::Bad(Unreadable::OutOfRange)
                } else {
                    Verdict::Found(self.number)
                };
            }
        }
        self.state = if self.depth == 0 {
            State::End
        } else {
            State::After
        };
    }
}
