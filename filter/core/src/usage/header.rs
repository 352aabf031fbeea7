use super::{Unreadable, UsageRead, MAX_USAGE};

/// A usage response header: a whole number from 0 to [`MAX_USAGE`] in ASCII digits, spaces
/// or tabs around it allowed. Anything else (empty, a sign, a fraction, a list) is unreadable.
pub fn usage_from_header(value: &[u8]) -> UsageRead {
    let digits = value.trim_ascii();
    if digits.is_empty() {
        return UsageRead::Invalid(Unreadable::NotANumber);
    }
    let mut number: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return UsageRead::Invalid(match b {
                b'-' if digits.len() > 1 && digits.first() == Some(&b'-') => {
                    if digits
                        .get(1..)
                        .is_some_and(|rest| rest.iter().all(u8::is_ascii_digit))
                    {
                        Unreadable::Negative
                    } else {
                        Unreadable::NotANumber
                    }
                }
                b'.' | b'e' | b'E' if digits.first().is_some_and(u8::is_ascii_digit) => {
                    Unreadable::NotAnInteger
                }
                _ => Unreadable::NotANumber,
            });
        }
        number = number
            .saturating_mul(10)
            .saturating_add(u64::from(b - b'0'))
            .min(MAX_USAGE + 1);
    }
    if number > MAX_USAGE {
        return UsageRead::Invalid(Unreadable::OutOfRange);
    }
    UsageRead::Found(number)
}
