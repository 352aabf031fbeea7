//! The numbers of the scanner: a JSON number's grammar byte by byte, and the digits of the one
//! at the path, capped just above [`MAX_USAGE`] (its verdict is made where every value ends,
//! `value_done`). A small grammar of its own, apart from the state machine that calls it.

use super::{Scanner, State};
use crate::usage::path::Path;
use crate::usage::{Unreadable, MAX_USAGE};

/// Where in a number: after `-`, after a leading `0`, in the integer digits, after `.`, in
/// the fraction, after `e`, after the exponent's sign, in the exponent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

impl Num {
    pub(super) fn can_end(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits)
    }
}

impl Scanner {
    pub(super) fn add_digit(&mut self, b: u8) {
        if self.target_number && !self.fractional && b.is_ascii_digit() {
            // Capped just above the bound: only "over" matters past it.
            self.number = self
                .number
                .saturating_mul(10)
                .saturating_add(u64::from(b - b'0'))
                .min(MAX_USAGE + 1);
        }
    }

    pub(super) fn number_byte(&mut self, num: Num, b: u8, path: &Path) {
        let next = match (num, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, b'1'..=b'9') => Num::Int,
            (Num::Int, b'0'..=b'9') => Num::Int,
            (Num::Zero | Num::Int, b'.') => Num::Dot,
            (Num::Dot | Num::Frac, b'0'..=b'9') => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::Exp,
            (Num::Exp, b'+' | b'-') => Num::ExpSign,
            (Num::Exp | Num::ExpSign | Num::ExpDigits, b'0'..=b'9') => Num::ExpDigits,
            _ if num.can_end() => {
                self.value_done();
                return self.step(b, path);
            }
            _ => return self.fail(Unreadable::NotJson),
        };
        if matches!(next, Num::Dot | Num::Exp) {
            self.fractional = true;
        }
        self.add_digit(b);
        self.state = State::Number(next);
    }
}
