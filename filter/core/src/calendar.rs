//! Calendar windows of `fixed_window` limits: a day, an ISO week (from Monday 00:00) or a
//! month (from the 1st, 00:00), in UTC or a fixed UTC offset. No time-zone database: an
//! offset is what the config says, all year. The arithmetic is the script's
//! (`lua/fixed_window.lua`) step for step, on whole numbers that a double holds exactly, so
//! the Rust twin and Redis agree on every window's index and end.
//!
//! A window's index counts windows of its unit: days since 1970-01-01, weeks since Monday
//! 1969-12-29, months since year 0 (`12 × year + month − 1`); consecutive windows have
//! consecutive indexes, which is what a fixed window's debt repayment counts.

pub const DAY_MS: f64 = 86_400_000.0;
const MINUTE_MS: f64 = 60_000.0;
/// The widest offset there is (UTC−12:00 to UTC+14:00 in use), in minutes either way.
pub const MAX_OFFSET_MINUTES: i16 = 14 * 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Day,
    /// ISO week: Monday 00:00 to Monday 00:00.
    Week,
    /// The 1st, 00:00, to the next 1st.
    Month,
}

impl Unit {
    pub fn name(self) -> &'static str {
        match self {
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
        }
    }

    /// The unit a limit's `window` names, if it names one.
    pub fn from_name(name: &str) -> Option<Unit> {
        match name {
            "day" => Some(Unit::Day),
            "week" => Some(Unit::Week),
            "month" => Some(Unit::Month),
            _ => None,
        }
    }

    /// Its letter in the script's window argument.
    fn letter(self) -> char {
        match self {
            Unit::Day => 'D',
            Unit::Week => 'W',
            Unit::Month => 'M',
        }
    }
}

/// A calendar window: its unit, starting at midnight `offset_minutes` east of UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calendar {
    pub unit: Unit,
    pub offset_minutes: i16,
}

impl Calendar {
    fn offset_ms(self) -> f64 {
        f64::from(self.offset_minutes) * MINUTE_MS
    }

    /// The index of the window holding Unix ms `now`.
    pub fn index(self, now: f64) -> f64 {
        let day = ((now + self.offset_ms()) / DAY_MS).floor();
        match self.unit {
            Unit::Day => day,
            // Day 0 is a Thursday: day −3 is the Monday week 0 starts on.
            Unit::Week => ((day + 3.0) / 7.0).floor(),
            Unit::Month => {
                let (year, month) = civil_from_days(day as i64);
                (12 * year + month - 1) as f64
            }
        }
    }

    /// The Unix ms at which window `index` ends (and the next begins).
    pub fn end(self, index: f64) -> f64 {
        let next = index + 1.0;
        let day = match self.unit {
            Unit::Day => next,
            Unit::Week => 7.0 * next - 3.0,
            Unit::Month => {
                let next = next as i64;
                let year = next.div_euclid(12);
                days_from_civil(year, next - 12 * year + 1) as f64
            }
        };
        day * DAY_MS - self.offset_ms()
    }

    /// The length (ms) of the window holding Unix ms `now`.
    pub fn length_at(self, now: f64) -> f64 {
        let index = self.index(now);
        self.end(index) - self.end(index - 1.0)
    }

    /// The longest window of its unit (ms): a month of 31 days.
    pub fn longest_ms(self) -> u64 {
        let days = match self.unit {
            Unit::Day => 1,
            Unit::Week => 7,
            Unit::Month => 31,
        };
        days * 86_400_000
    }

    /// The script's window argument: the unit's letter and the signed offset in minutes
    /// (`M+330`, `D-300`, `W+0`); never plain digits, which are a window in ms.
    pub fn wire(self) -> String {
        let sign = if self.offset_minutes < 0 { '-' } else { '+' };
        format!(
            "{}{sign}{}",
            self.unit.letter(),
            self.offset_minutes.unsigned_abs()
        )
    }

    /// Bytes of [`Calendar::wire`] once percent-encoded (`+` is `%2B`, `-` stays).
    pub fn wire_len(self) -> usize {
        let sign = if self.offset_minutes < 0 { 1 } else { 3 };
        let minutes = self.offset_minutes.unsigned_abs();
        let digits = minutes.checked_ilog10().map_or(1, |d| d as usize + 1);
        1 + sign + digits
    }

    /// The offset as the config writes it: `+05:30`.
    pub fn show_offset(self) -> String {
        let sign = if self.offset_minutes < 0 { '-' } else { '+' };
        let minutes = self.offset_minutes.unsigned_abs();
        format!("{sign}{:02}:{:02}", minutes / 60, minutes % 60)
    }
}

/// An offset written `±HH:MM` (`+05:30`, `-08:00`), in minutes east of UTC, within
/// ±[`MAX_OFFSET_MINUTES`].
pub fn parse_offset(text: &str) -> Option<i16> {
    let bytes = text.as_bytes();
    let [sign, h1, h2, b':', m1, m2] = *bytes else {
        return None;
    };
    let digit = |b: u8| b.is_ascii_digit().then(|| i16::from(b - b'0'));
    let hours = digit(h1)? * 10 + digit(h2)?;
    let minutes = digit(m1)? * 10 + digit(m2)?;
    if minutes > 59 {
        return None;
    }
    let total = hours * 60 + minutes;
    if total > MAX_OFFSET_MINUTES {
        return None;
    }
    match sign {
        b'+' => Some(total),
        b'-' => Some(-total),
        _ => None,
    }
}

// Civil dates from day numbers and back, in the proleptic Gregorian calendar: years are
// counted from March (so a leap day ends its year), in eras of 400 years (146,097 days), so
// every step is a whole-number division that needs no table of month lengths.

/// Days from 1970-01-01 to the 1st of `month` (1 to 12) of `year`.
pub fn days_from_civil(year: i64, month: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    // Months from March: March 0, ..., February 11.
    let from_march = (month + 9) % 12;
    let day_of_year = (153 * from_march + 2) / 5;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    // 719,468 days from 0000-03-01 to 1970-01-01.
    era * 146_097 + day_of_era - 719_468
}

/// The (year, month 1 to 12) of day `days` after 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let from_march = (5 * day_of_year + 2) / 153;
    let month = if from_march < 10 {
        from_march + 3
    } else {
        from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Unix ms of a UTC date and time.
    fn utc(year: i64, month: i64, day: i64, hour: i64, minute: i64) -> f64 {
        ((days_from_civil(year, month) + day - 1) * 86_400_000 + (hour * 60 + minute) * 60_000)
            as f64
    }

    const UTC_MONTH: Calendar = Calendar {
        unit: Unit::Month,
        offset_minutes: 0,
    };

    #[test]
    fn known_days() {
        assert_eq!(days_from_civil(1970, 1), 0);
        // 2000-03-01 (a leap century), 2028-03-01, 1900-03-01 (no leap day).
        assert_eq!(days_from_civil(2000, 3), 11_017);
        assert_eq!(days_from_civil(2028, 3) - days_from_civil(2028, 2), 29);
        assert_eq!(days_from_civil(2027, 3) - days_from_civil(2027, 2), 28);
        assert_eq!(days_from_civil(1900, 3) - days_from_civil(1900, 2), 28);
        assert_eq!(days_from_civil(1969, 12), -31);
        assert_eq!(civil_from_days(-1), (1969, 12));
        assert_eq!(civil_from_days(11_017), (2000, 3));
        assert_eq!(civil_from_days(11_016), (2000, 2));
    }

    #[test]
    fn every_first_of_the_month_round_trips() {
        for year in 1600..2500 {
            for month in 1..=12 {
                let day = days_from_civil(year, month);
                assert_eq!(civil_from_days(day), (year, month));
                assert_eq!(
                    civil_from_days(day - 1).1,
                    if month == 1 { 12 } else { month - 1 }
                );
            }
        }
    }

    #[test]
    fn months_end_on_the_first_of_the_next() {
        let jan = UTC_MONTH.index(utc(2028, 1, 31, 23, 59));
        assert_eq!(UTC_MONTH.end(jan), utc(2028, 2, 1, 0, 0));
        assert_eq!(UTC_MONTH.index(utc(2028, 2, 1, 0, 0)), jan + 1.0);
        assert_eq!(UTC_MONTH.end(jan + 1.0), utc(2028, 3, 1, 0, 0));
        assert_eq!(UTC_MONTH.length_at(utc(2028, 2, 29, 12, 0)), 29.0 * DAY_MS);
        let dec = UTC_MONTH.index(utc(2027, 12, 31, 23, 59));
        assert_eq!(UTC_MONTH.end(dec), utc(2028, 1, 1, 0, 0));
        assert_eq!(dec + 1.0, jan);
    }

    #[test]
    fn weeks_start_on_monday_and_offsets_move_midnight() {
        let week = Calendar {
            unit: Unit::Week,
            offset_minutes: 0,
        };
        // 2028-01-03 is a Monday.
        let i = week.index(utc(2028, 1, 2, 23, 59));
        assert_eq!(week.end(i), utc(2028, 1, 3, 0, 0));
        assert_eq!(week.length_at(utc(2028, 1, 3, 0, 0)), 7.0 * DAY_MS);
        // At +05:30 the day turns at 18:30 UTC; at -05:00 at 05:00 UTC.
        let india = Calendar {
            unit: Unit::Day,
            offset_minutes: 330,
        };
        let d = india.index(utc(2028, 1, 1, 18, 29));
        assert_eq!(india.end(d), utc(2028, 1, 1, 18, 30));
        let east_us = Calendar {
            unit: Unit::Month,
            offset_minutes: -300,
        };
        let m = east_us.index(utc(2028, 3, 1, 4, 59));
        assert_eq!(east_us.end(m), utc(2028, 3, 1, 5, 0));
        assert_eq!(east_us.index(utc(2028, 3, 1, 5, 0)), m + 1.0);
    }

    #[test]
    fn offsets_parse_as_written() {
        assert_eq!(parse_offset("+05:30"), Some(330));
        assert_eq!(parse_offset("-08:00"), Some(-480));
        assert_eq!(parse_offset("+14:00"), Some(840));
        assert_eq!(parse_offset("-14:00"), Some(-840));
        assert_eq!(parse_offset("+00:00"), Some(0));
        for bad in [
            "+14:01", "05:30", "+5:30", "+05:60", "+0530", "+05:3", "", "Z", "+05:30 ",
        ] {
            assert_eq!(parse_offset(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_wire_text_and_its_encoded_length() {
        let cases = [
            (Unit::Month, 330, "M+330", 7),
            (Unit::Day, -300, "D-300", 5),
            (Unit::Week, 0, "W+0", 5),
            (Unit::Day, -5, "D-5", 3),
        ];
        for (unit, offset_minutes, text, len) in cases {
            let c = Calendar {
                unit,
                offset_minutes,
            };
            assert_eq!(c.wire(), text);
            assert_eq!(c.wire_len(), len);
            assert_eq!(
                crate::encode::path_segment_len(c.wire().as_bytes()),
                c.wire_len()
            );
        }
    }
}
