//! Calendar windows of `fixed_window` (a day, an ISO week, a month, at a fixed UTC offset)
//! against a real Redis, driven by the clock argument, with chrono as the reference calendar:
//! the allowance restarts exactly at each boundary and not a millisecond before, the reset the
//! script replies is the boundary, and over thousands of random instants the script's and the
//! Rust twin's window index and end are chrono's.

use chrono::{Datelike, Duration, FixedOffset, NaiveDate, TimeZone, Utc};
use e2e::script::*;
use ratelimit_core::algorithms::{evaluate, Params};
use ratelimit_core::local::unix_ms;
use ratelimit_core::testing::random::Rng;

/// Unix ms of a UTC date and time.
fn utc(y: i32, m: u32, d: u32, h: u32, min: u32) -> i64 {
    Utc.with_ymd_and_hms(y, m, d, h, min, 0)
        .single()
        .unwrap()
        .timestamp_millis()
}

/// A number of ms as the script replies it, for a case table (which holds `&'static str`).
fn ms_text(ms: i64) -> &'static str {
    ms.to_string().leak()
}

fn ns(ms: i64) -> u128 {
    u128::try_from(ms).unwrap() * MS
}

/// chrono's window holding Unix ms `at`: (index, start ms, end ms). The index counts days
/// from 1970-01-01, weeks from Monday 1969-12-29, months as 12 × year + month − 1, all in the
/// offset's local time.
fn reference(unit: CalendarUnit, offset_minutes: i16, at: i64) -> (i64, i64, i64) {
    let offset = FixedOffset::east_opt(i32::from(offset_minutes) * 60).unwrap();
    let local = offset
        .timestamp_millis_opt(at)
        .single()
        .unwrap()
        .date_naive();
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).unwrap();
    let (index, start, end) = match unit {
        CalendarUnit::Day => ((local - epoch).num_days(), local, local + Duration::days(1)),
        CalendarUnit::Week => {
            let monday = local - Duration::days(i64::from(local.weekday().num_days_from_monday()));
            let week0 = NaiveDate::from_ymd_opt(1969, 12, 29).unwrap();
            (
                (monday - week0).num_days().div_euclid(7),
                monday,
                monday + Duration::days(7),
            )
        }
        CalendarUnit::Month => {
            let first = local.with_day(1).unwrap();
            let next = if first.month() == 12 {
                NaiveDate::from_ymd_opt(first.year() + 1, 1, 1)
            } else {
                NaiveDate::from_ymd_opt(first.year(), first.month() + 1, 1)
            }
            .unwrap();
            (
                12 * i64::from(first.year()) + i64::from(first.month0()),
                first,
                next,
            )
        }
    };
    // Local midnight, back in UTC.
    let utc_ms = |d: NaiveDate| {
        d.and_hms_opt(0, 0, 0)
            .unwrap()
            .and_local_timezone(offset)
            .single()
            .unwrap()
            .timestamp_millis()
    };
    (index, utc_ms(start), utc_ms(end))
}

/// A limit of 2 per window on `key` over `unit` at `offset_minutes`.
fn two_per(key: &'static str, unit: CalendarUnit, offset_minutes: i16) -> L {
    limit(key, Algorithm::FixedWindow, 2, 1).calendar(unit, offset_minutes)
}

/// Spends the window of `l` that ends at `boundary` (Unix ms) an hour before it, is refused a
/// millisecond before it (whole again in 1 ms), and allowed again at it, with the reset the
/// end of the window that starts there (by chrono).
fn restarts_exactly_at(s: &mut Script, l: &L, boundary: i64) {
    let Window::Calendar(c) = l.window else {
        panic!("a calendar window")
    };
    let before = boundary - 3_600_000;
    let (_, _, end) = reference(c.unit, c.offset_minutes, before);
    assert_eq!(end, boundary, "chrono ends the window there too");
    run_cases(
        s,
        l,
        &[
            (ns(before), 2, 1, "0", "3600000", "0"),
            (ns(boundary - 1), 1, 0, "0", "1", "1"),
        ],
    );
    let (_, start, next) = reference(c.unit, c.offset_minutes, boundary);
    assert_eq!(start, boundary);
    let reset = ms_text(next - boundary);
    run_cases(s, l, &[(ns(boundary), 1, 1, "1", reset, "0")]);
}

#[test]
fn months_restart_on_the_first_and_february_2028_has_29_days() {
    let (_dir, _redis, mut s) = script("lua-calendar-month");
    let month = two_per("rl:t:cal-month", CalendarUnit::Month, 0);
    restarts_exactly_at(&mut s, &month, utc(2028, 2, 1, 0, 0));
    // February 29 is still February: spent on the 28th, refused on the 29th until March.
    let feb28 = ns(utc(2028, 2, 28, 12, 0));
    let to_march = ms_text(utc(2028, 3, 1, 0, 0) - utc(2028, 2, 28, 12, 0));
    run_cases(&mut s, &month, &[(feb28, 1, 1, "0", to_march, "0")]);
    let feb29 = utc(2028, 2, 29, 0, 0);
    let left = ms_text(utc(2028, 3, 1, 0, 0) - feb29);
    run_cases(&mut s, &month, &[(ns(feb29), 1, 0, "0", left, left)]);
    restarts_exactly_at(
        &mut s,
        &two_per("rl:t:cal-march", CalendarUnit::Month, 0),
        utc(2028, 3, 1, 0, 0),
    );
    // December 31 to January 1, into a new year.
    restarts_exactly_at(
        &mut s,
        &two_per("rl:t:cal-year", CalendarUnit::Month, 0),
        utc(2028, 1, 1, 0, 0),
    );
}

#[test]
fn days_turn_at_midnight_through_a_leap_day() {
    let (_dir, _redis, mut s) = script("lua-calendar-day");
    let day = two_per("rl:t:cal-day", CalendarUnit::Day, 0);
    restarts_exactly_at(&mut s, &day, utc(2028, 2, 29, 0, 0));
    let leap_day = two_per("rl:t:cal-leap-day", CalendarUnit::Day, 0);
    restarts_exactly_at(&mut s, &leap_day, utc(2028, 3, 1, 0, 0));
}

#[test]
fn weeks_start_on_monday() {
    let (_dir, _redis, mut s) = script("lua-calendar-week");
    let monday = utc(2028, 1, 10, 0, 0);
    assert_eq!(
        Utc.timestamp_millis_opt(monday).unwrap().weekday(),
        chrono::Weekday::Mon
    );
    let week = two_per("rl:t:cal-week", CalendarUnit::Week, 0);
    restarts_exactly_at(&mut s, &week, monday);
    // A week that spans two months and two years: Monday 2029-12-31 to Monday 2030-01-07.
    restarts_exactly_at(&mut s, &week, utc(2030, 1, 7, 0, 0));
}

#[test]
fn utc_offsets_move_midnight() {
    let (_dir, _redis, mut s) = script("lua-calendar-offset");
    // At +05:30 the day turns at 18:30 UTC.
    let india = two_per("rl:t:cal-india", CalendarUnit::Day, 330);
    restarts_exactly_at(&mut s, &india, utc(2028, 6, 14, 18, 30));
    // At -08:00 a month turns at 08:00 UTC on the 1st; at -03:30 a week at 03:30 UTC Monday.
    let pacific = two_per("rl:t:cal-pacific", CalendarUnit::Month, -480);
    restarts_exactly_at(&mut s, &pacific, utc(2028, 3, 1, 8, 0));
    let newfoundland = two_per("rl:t:cal-nl", CalendarUnit::Week, -210);
    restarts_exactly_at(&mut s, &newfoundland, utc(2028, 1, 10, 3, 30));
    // The widest offsets: +14:00 turns a day at 10:00 UTC the day before, -14:00 at 14:00 UTC.
    let kiribati = two_per("rl:t:cal-kiribati", CalendarUnit::Day, 840);
    restarts_exactly_at(&mut s, &kiribati, utc(2028, 12, 31, 10, 0));
    let west = two_per("rl:t:cal-west", CalendarUnit::Month, -840);
    restarts_exactly_at(&mut s, &west, utc(2029, 1, 1, 14, 0));
}

#[test]
fn a_month_is_kept_until_it_ends_and_debt_is_repaid_month_by_month() {
    let (_dir, redis, mut s) = script("lua-calendar-debt");
    let month = two_per("rl:t:cal-debt", CalendarUnit::Month, 0);
    // Charged on January 1: the state lives the whole of January (31 days) + 60 s.
    let jan1 = utc(2028, 1, 1, 0, 0);
    assert_eq!(s.one(ns(jan1), &month).0, 1);
    let pttl = redis.admin().cmd(&["PTTL", month.key]).unwrap().int();
    let want = 31 * 86_400_000 + 60_000;
    assert!((want - 5_000..=want).contains(&pttl), "PTTL {pttl}");
    // 4 more units of usage settled in January: 5 against 2 a month. February repays 2 (3
    // left: refused), March 2 more (1 left: one request fits), and the state is kept until
    // March ends.
    s.settle(ns(jan1 + 1000), &month, 4);
    let pttl = redis.admin().cmd(&["PTTL", month.key]).unwrap().int();
    let want = utc(2028, 4, 1, 0, 0) - jan1 + 60_000;
    assert!((want - 5_000..=want).contains(&pttl), "PTTL {pttl}");
    let mid_jan = utc(2028, 1, 15, 0, 0);
    let to_april = ms_text(utc(2028, 4, 1, 0, 0) - mid_jan);
    let to_march = ms_text(utc(2028, 3, 1, 0, 0) - mid_jan);
    run_cases(
        &mut s,
        &month,
        &[(ns(mid_jan), 1, 0, "0", to_april, to_march)],
    );
    let march = utc(2028, 3, 1, 0, 0);
    let april_in = ms_text(utc(2028, 4, 1, 0, 0) - march + 1);
    run_cases(&mut s, &month, &[(ns(march - 1), 1, 0, "0", april_in, "1")]);
    let april_in = ms_text(utc(2028, 4, 1, 0, 0) - march);
    run_cases(&mut s, &month, &[(ns(march), 1, 1, "0", april_in, "0")]);
}

#[test]
fn a_refund_gives_back_only_in_the_month_it_was_charged() {
    let (_dir, redis, mut s) = script("lua-calendar-refund");
    let month = two_per("rl:t:cal-refund", CalendarUnit::Month, 330);
    // 23:59 on January 31 at +05:30 is 18:29 UTC; February starts at 18:30 UTC.
    let charged = ns(utc(2028, 1, 31, 18, 29));
    assert_eq!(s.one(charged, &month).0, 1);
    s.refund(charged + MS, &month, charged, 1.0);
    assert_eq!(redis.hash_field(month.key, "n"), "0", "the same month");
    assert_eq!(s.one(charged, &month).0, 1);
    // February at +05:30 has started: the January charge is no longer held back.
    assert_eq!(s.one(ns(utc(2028, 1, 31, 18, 30)), &month).0, 1);
    s.refund(ns(utc(2028, 1, 31, 18, 31)), &month, charged, 1.0);
    assert_eq!(redis.hash_field(month.key, "n"), "1", "nothing given back");
}

/// The script and the twin against chrono at random instants from 1970 to 2170, a third of them
/// within a second of a boundary: a fresh key charged at each holds chrono's index (`w`) and
/// replies chrono's end (reset); the twin's index, end and reset are the same.
#[test]
fn the_script_and_the_twin_find_chronos_windows_at_random_instants() {
    let (_dir, redis, mut s) = script("lua-calendar-random");
    let mut rng = Rng::new(2028);
    let units = [CalendarUnit::Day, CalendarUnit::Week, CalendarUnit::Month];
    let span = utc(2170, 1, 1, 0, 0) as u64;
    let instants = 3000;
    for i in 0..instants {
        let unit = units[rng.below(3) as usize];
        let offset_minutes = rng.below(1681) as i16 - 840;
        let mut at = (86_400_000 + rng.below(span)) as i64;
        if rng.one_in(3) {
            let (_, _, end) = reference(unit, offset_minutes, at);
            at = end + rng.below(2000) as i64 - 1000;
        }
        let (index, start, end) = reference(unit, offset_minutes, at);
        let calendar = Calendar {
            unit,
            offset_minutes,
        };
        let ms = at as f64;
        let twin = (calendar.index(ms), calendar.end(calendar.index(ms)));
        assert_eq!(
            twin,
            (index as f64, end as f64),
            "twin at {at}: {calendar:?}"
        );
        assert_eq!(calendar.end(twin.0 - 1.0), start as f64, "twin's start");
        let l = limit("", Algorithm::FixedWindow, 1, 1).calendar(unit, offset_minutes);
        let e = evaluate(
            Algorithm::FixedWindow,
            None,
            Params::new(1, l.window, 1, 1),
            unix_ms(ns(at)),
        );
        assert_eq!(e.reply(true).1, (end - at) as f64, "twin's reset at {at}");

        let key = format!("rl:t:cal-random:{i}");
        let check = LimitCheck {
            key: key.as_str().into(),
            ..l.check()
        };
        let command = DecideCall::new(&ns(at).to_string(), 0, [std::slice::from_ref(&check)])
            .command(s.program.command(), &s.program.handle);
        let items = s.conn.cmd(&command).unwrap().items();
        assert_eq!(
            (items[3].int(), items[5].text()),
            (1, (end - at).to_string()),
            "script's reset at {at}: {calendar:?}"
        );
        assert_eq!(
            redis.hash_field(&key, "w"),
            index.to_string(),
            "script's index at {at}: {calendar:?}"
        );
    }
    println!("calendar: {instants} random instants, the script and the twin agree with chrono");
}
