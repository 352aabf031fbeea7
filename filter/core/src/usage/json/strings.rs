//! The strings of the scanner: UTF-8 checked byte by byte, a `\u` escape's code units (a
//! surrogate pair's too) made one character, and a key compared with the path's segment as
//! its bytes pass, never kept. Apart from the state machine as the part that knows text.

use super::{Pending, Scanner, State};
use crate::usage::path::Path;
use crate::usage::Unreadable;

impl Scanner {
    pub(super) fn string_byte(&mut self, b: u8, path: &Path) {
        if self.utf8_due > 0 {
            if b < self.utf8_lo || b > self.utf8_hi {
                return self.fail(Unreadable::NotJson);
            }
            self.utf8_due -= 1;
            self.utf8_lo = 0x80;
            self.utf8_hi = 0xbf;
            return self.key_byte(b, path);
        }
        match b {
            b'"' => self.string_end(path),
            b'\\' => self.state = State::Escape,
            0x00..=0x1f => self.fail(Unreadable::NotJson),
            0x20..=0x7f => self.key_byte(b, path),
            _ => {
                let (due, lo, hi) = match b {
                    0xc2..=0xdf => (1, 0x80, 0xbf),
                    0xe0 => (2, 0xa0, 0xbf),
                    0xed => (2, 0x80, 0x9f),
                    0xe1..=0xef => (2, 0x80, 0xbf),
                    0xf0 => (3, 0x90, 0xbf),
                    0xf1..=0xf3 => (3, 0x80, 0xbf),
                    0xf4 => (3, 0x80, 0x8f),
                    _ => return self.fail(Unreadable::NotJson),
                };
                self.utf8_due = due;
                self.utf8_lo = lo;
                self.utf8_hi = hi;
                self.key_byte(b, path);
            }
        }
    }

    /// A `\u` escape's 16 bits: a whole character, or half of a surrogate pair.
    pub(super) fn code_unit(&mut self, low: bool, path: &Path) {
        let unit = self.hex;
        let code = match (low, unit) {
            (false, 0xd800..=0xdbff) => {
                self.high = unit;
                self.state = State::LowBackslash;
                return;
            }
            (true, 0xdc00..=0xdfff) => {
                0x10000 + ((u32::from(self.high) - 0xd800) << 10) + (u32::from(unit) - 0xdc00)
            }
            (true, _) | (false, 0xdc00..=0xdfff) => return self.fail(Unreadable::NotJson),
            (false, _) => u32::from(unit),
        };
        self.state = State::Str;
        if self.comparing {
            let mut utf8 = [0u8; 4];
            let encoded =
                char::from_u32(code).map_or(&[][..], |c| c.encode_utf8(&mut utf8).as_bytes());
            if encoded.is_empty() {
                self.comparing = false;
            }
            for &byte in encoded {
                self.key_byte(byte, path);
            }
        }
    }

    /// One decoded byte of a key compared with the path's segment at its depth.
    pub(super) fn key_byte(&mut self, b: u8, path: &Path) {
        if !self.comparing {
            return;
        }
        let segment = path.segment(usize::from(self.depth.saturating_sub(1)));
        if segment.get(self.key_len as usize) == Some(&b) {
            self.key_len += 1;
        } else {
            self.comparing = false;
        }
    }

    pub(super) fn string_end(&mut self, path: &Path) {
        if !self.in_key {
            return self.value_done();
        }
        self.in_key = false;
        self.state = State::Colon;
        if !self.comparing {
            return;
        }
        self.comparing = false;
        let index = usize::from(self.depth.saturating_sub(1));
        if self.key_len as usize != path.segment(index).len() {
            return;
        }
        let bit = 1u8 << index;
        if self.seen & bit != 0 {
            return self.fail(Unreadable::DuplicateKey);
        }
        self.seen |= bit;
        self.pending = if index + 1 == path.len() {
            Pending::Target
        } else {
            Pending::Inner
        };
    }
}
