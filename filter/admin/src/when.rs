//! Instants as an operator writes them (`--expires 2h`, `2026-01-31T18:00:00Z`, a Unix time)
//! and as the tool shows them. Civil dates are converted by hand (days from 1970-01-01 in the
//! proleptic Gregorian calendar) rather than with a date crate: only UTC and fixed offsets
//! are needed.

use ratelimit_core::config::parse_duration;

/// The Unix ms an `--expires` value names, given Redis's time `now_ms`: a duration from now
/// (`90m`, `2h`, `7d`, as in the filter's config), a Unix time in seconds (digits only), or an
/// RFC 3339 date and time with `Z` or an offset. It must lie in the future.
pub fn expiry(text: &str, now_ms: u64) -> Result<u64, String> {
    let at = if let Some(d) = parse_duration(text) {
        if d.is_zero() {
            return Err(format!("--expires {text}: a duration must be more than 0"));
        }
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        now_ms.saturating_add(ms)
    } else if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let seconds: u64 = text
            .parse()
            .map_err(|_| format!("--expires {text}: not a Unix time"))?;
        seconds.saturating_mul(1000)
    } else {
        rfc3339(text).ok_or_else(|| {
            format!(
                "--expires {text}: neither a duration (90m, 2h, 7d), a Unix time in seconds, nor an RFC 3339 time (2026-01-31T18:00:00Z)"
            )
        })?
    };
    if at <= now_ms {
        return Err(format!(
            "--expires {text}: {} is not in the future (Redis's time is {})",
            show_instant(at),
            show_instant(now_ms)
        ));
    }
    // Far beyond any use, and keeps PEXPIREAT's argument an exact integer in every client.
    const LATEST: u64 = 253_402_300_799_999; // 9999-12-31T23:59:59.999Z
    if at > LATEST {
        return Err(format!("--expires {text}: later than the year 9999"));
    }
    Ok(at)
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` as Unix ms (the fraction cut to ms); None if it
/// is not that or names no real instant at or after 1970.
pub fn rfc3339(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let part = text.get(from..to)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let first3: String = fraction[..digits]
            .chars()
            .chain("000".chars())
            .take(3)
            .collect();
        millis = first3.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let o = rest.as_bytes();
            if o.len() != 6 || o[3] != b':' {
                return None;
            }
            let (h, m) = (
                rest.get(1..3)?.parse::<i64>().ok()?,
                rest.get(4..6)?.parse::<i64>().ok()?,
            );
            if h > 23 || m > 59 {
                return None;
            }
            sign * (h * 60 + m)
        }
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    u64::try_from(seconds * 1000 + millis).ok()
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a civil date: whole years from 1970, then the months of its year.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let mut days = 0;
    if year >= 1970 {
        for y in 1970..year {
            days += if is_leap(y) { 366 } else { 365 };
        }
    } else {
        for y in year..1970 {
            days -= if is_leap(y) { 366 } else { 365 };
        }
    }
    for m in 1..month {
        days += days_in_month(year, m);
    }
    days + day - 1
}

/// Unix ms as RFC 3339 in UTC, to the second (`2026-01-31T18:00:00Z`), or with ms when it has
/// some.
pub fn show_instant(ms: u64) -> String {
    let seconds = ms / 1000;
    let mut days = i64::try_from(seconds / 86_400).unwrap_or(i64::MAX);
    let of_day = seconds % 86_400;
    let mut year = 1970;
    loop {
        let length = if is_leap(year) { 366 } else { 365 };
        if days < length {
            break;
        }
        days -= length;
        year += 1;
    }
    let mut month = 1;
    while days >= days_in_month(year, month) {
        days -= days_in_month(year, month);
        month += 1;
    }
    let fraction = match ms % 1000 {
        0 => String::new(),
        n => format!(".{n:03}"),
    };
    format!(
        "{year:04}-{month:02}-{:02}T{:02}:{:02}:{:02}{fraction}Z",
        days + 1,
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// A span of ms for people: `850ms`, `12.5s`, `3m 20s`, `2h 5m`, `3d 4h`.
pub fn show_span(ms: f64) -> String {
    if !ms.is_finite() || ms < 0.0 {
        return "0ms".to_string();
    }
    if ms < 1000.0 {
        return format!("{}ms", ms.ceil());
    }
    let s = ms / 1000.0;
    if s < 60.0 {
        let tenths = (s * 10.0).ceil() / 10.0;
        return format!("{tenths}s");
    }
    let total = s.ceil() as u64;
    let (d, h, m, sec) = (
        total / 86_400,
        total % 86_400 / 3600,
        total % 3600 / 60,
        total % 60,
    );
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else {
        format!("{m}m {sec}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_489_600_000; // 2025-11-30T08:00:00Z

    #[test]
    fn instants_round_trip_through_rfc3339() {
        assert_eq!(show_instant(NOW), "2025-11-30T08:00:00Z");
        assert_eq!(rfc3339("2025-11-30T08:00:00Z"), Some(NOW));
        assert_eq!(rfc3339("2025-11-30T09:30:00.250+01:30"), Some(NOW + 250));
        assert_eq!(
            rfc3339("2024-02-29T00:00:00Z").map(show_instant).as_deref(),
            Some("2024-02-29T00:00:00Z")
        );
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(show_instant(NOW + 7), "2025-11-30T08:00:00.007Z");
    }

    #[test]
    fn bad_dates_are_refused() {
        for text in [
            "2025-02-29T00:00:00Z",
            "2025-13-01T00:00:00Z",
            "2025-11-30T24:00:00Z",
            "2025-11-30T08:00:00",
            "2025-11-30T08:00:00+0100",
            "2025-11-30",
            "1969-12-31T23:59:59Z",
        ] {
            assert_eq!(rfc3339(text), None, "{text}");
        }
    }

    #[test]
    fn an_expiry_is_a_duration_a_unix_time_or_a_date_in_the_future() {
        assert_eq!(expiry("2h", NOW), Ok(NOW + 7_200_000));
        assert_eq!(expiry("1764493200", NOW), Ok(NOW + 3_600_000));
        assert_eq!(expiry("2025-11-30T09:00:00Z", NOW), Ok(NOW + 3_600_000));
        assert!(expiry("0s", NOW).is_err());
        assert!(expiry("1764489600", NOW)
            .unwrap_err()
            .contains("not in the future"));
        assert!(expiry("tomorrow", NOW)
            .unwrap_err()
            .contains("neither a duration"));
    }

    #[test]
    fn spans_read_as_people_say_them() {
        assert_eq!(show_span(850.0), "850ms");
        assert_eq!(show_span(12_450.0), "12.5s");
        assert_eq!(show_span(200_000.0), "3m 20s");
        assert_eq!(show_span(7_500_000.0), "2h 5m");
        assert_eq!(show_span(277_200_000.0), "3d 5h");
    }
}
