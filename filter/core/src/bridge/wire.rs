//! The decision call's protocol, defined once: what a limit does in a call ([`WireMode`]), its
//! name on the wire and the values it adds, how a definition, a limit, a key budget and the
//! call's head are laid out, and one encoder of each over a [`Sink`]: [`Args`] writes the
//! arguments, [`Count`] only counts their bytes as they appear percent-encoded in the Webdis
//! path. [`super::DecideCall`] writes with the first, the size model ([`super::CallSize`]) counts
//! with the second, so the model cannot drift from what is sent. [`decode`] reads a call's path
//! back into its limits, and [`prelude`] renders the same definitions for the Lua side
//! (`lua/wire.lua`).

pub mod decode;
pub mod prelude;

use crate::bounds::FRACTION_DECIMALS;
#[cfg(doc)]
use crate::bounds::MAX_MEMBER_BYTES;
use crate::config::{Algorithm, OverBudget, Window};
use crate::encode::path_segment_len;

/// Joins the fields of a definition, and of a limit, into one argument: the script finds a
/// definition or a limit it has read before by that one text (a function library keeps what it
/// read from call to call), and Redis and Webdis handle one argument instead of several. Not
/// percent-encoded in a path (as `/` between arguments would be), and in no field.
pub const FIELD_SEPARATOR: char = '~';

/// Fields of a definition's argument: algorithm, limit, window, burst, mode, budget index,
/// overflow key index.
pub const DEFINITION_FIELDS: usize = 7;

/// Fields of a limit's argument: key index, definition index, cost.
pub const LIMIT_FIELDS: usize = 3;
/// Fields of a call's head: its numbers of requests, of key budgets and of definitions.
pub const HEAD_FIELDS: usize = 3;

/// Between a limit's key index and its override key's index (`i:j`).
pub const OVERRIDE_INDEX_SEPARATOR: &str = ":";

/// The settle delta that releases a concurrency hold (with the request's id after it).
pub const RELEASE_DELTA: i64 = -1;

/// A limit's outcome in the reply: these bits, plus [`OUTCOME_QUOTA_UNIT`] × the override's
/// quota.
pub const OUTCOME_ALLOWED: u64 = 1;
/// The identity was new while its rule's key budget was used up.
pub const OUTCOME_OVER_BUDGET: u64 = 2;
/// An override applied.
pub const OUTCOME_OVERRIDE: u64 = 4;
/// The override found was malformed and ignored.
pub const OUTCOME_BAD_OVERRIDE: u64 = 8;
/// The outcome over this is the override's quota (its burst for the algorithms with one).
pub const OUTCOME_QUOTA_UNIT: u64 = 16;

/// The head of the longest call: `EVALSHA` (longer than `FCALL`) and a script's SHA-1 in hex
/// (longer than a function's name); `program::tests` checks both.
pub const LONGEST_COMMAND: &str = "EVALSHA";
pub const LONGEST_HANDLE: &str = "ffffffffffffffffffffffffffffffffffffffff";

/// The longest request id a concurrency limit's hold is named by ([`MAX_MEMBER_BYTES`]: 16 hex
/// digits, `-`, a 32-bit stream id), nothing in it percent-encoded: the size model's member
/// when it knows none (the bound on one request's call).
pub const LONGEST_MEMBER: &str = "ffffffffffffffff-4294967295";

/// Digits of the clock and deadline arguments at most: Unix time in ns has 19 digits until the
/// year 2286 (the deadline, in ms, has fewer).
pub const MAX_CLOCK_DIGITS: usize = 20;

/// What a limit does in a call: its mode, named on the wire in its definition, and the values
/// it adds after its cost, one argument each.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WireMode<'a> {
    /// Decided per request; a key budget goes only with this or `Shadow`.
    Enforce,
    /// Decided, never refusing the request.
    Shadow,
    /// A usage limit admitted after: allowed while a unit is left, charging nothing.
    After,
    /// Asking for a lease: the units asked for and the fraction of what is left.
    Lease { units: u64, fraction: f64 },
    /// A concurrency limit: the request's id, the member its hold is named by.
    Hold { member: &'a str },
    /// Releasing a concurrency hold: a settle of [`RELEASE_DELTA`] and the request's id.
    Release { member: &'a str },
    /// Giving back a charge: the clock it was charged with (Unix ns) and what it left.
    Refund { charged_at: u128, left: f64 },
    /// Settling a usage limit: the signed delta, and `0` (no hold).
    Settle { delta: i64 },
}

impl WireMode<'_> {
    /// One of each mode, for what is said of every mode (the prelude, the decoder).
    pub const EVERY: [WireMode<'static>; 8] = [
        WireMode::Enforce,
        WireMode::Shadow,
        WireMode::After,
        WireMode::Lease {
            units: 1,
            fraction: 1.0,
        },
        WireMode::Hold { member: "" },
        WireMode::Release { member: "" },
        WireMode::Refund {
            charged_at: 0,
            left: 0.0,
        },
        WireMode::Settle { delta: 0 },
    ];

    /// Its name in a definition.
    pub fn name(&self) -> &'static str {
        match self {
            WireMode::Enforce => "enforce",
            WireMode::Shadow => "shadow",
            WireMode::After => "after",
            WireMode::Lease { .. } => "lease",
            WireMode::Hold { .. } => "hold",
            WireMode::Release { .. } | WireMode::Settle { .. } => "settle",
            WireMode::Refund { .. } => "refund",
        }
    }

    /// Writes the values it adds after a limit's cost, one argument each.
    pub fn values<S: Sink>(&self, out: &mut S) {
        match *self {
            WireMode::Enforce | WireMode::Shadow | WireMode::After => {}
            WireMode::Lease { units, fraction } => {
                out.arg();
                out.number(units.into());
                out.arg();
                out.fraction(fraction);
            }
            WireMode::Hold { member } => {
                out.arg();
                out.text(member);
            }
            WireMode::Release { member } => {
                out.arg();
                out.signed(RELEASE_DELTA);
                out.arg();
                out.text(member);
            }
            WireMode::Refund { charged_at, left } => {
                out.arg();
                out.number(charged_at);
                out.arg();
                out.float(left);
            }
            WireMode::Settle { delta } => {
                out.arg();
                out.signed(delta);
                out.arg();
                out.number(0);
            }
        }
    }

    /// How many values it adds (arguments after the limit's), as [`WireMode::values`] writes.
    pub fn value_count(&self) -> usize {
        let mut count = Count::new(0);
        self.values(&mut count);
        count.args
    }

    /// The number of values a limit adds after its cost in the mode named `name`; None for a
    /// name that is no mode.
    pub fn values_of(name: &str) -> Option<usize> {
        Self::EVERY
            .iter()
            .find(|m| m.name() == name)
            .map(WireMode::value_count)
    }
}

/// Where the encoder writes: the arguments themselves ([`Args`]) or their bytes in the path
/// ([`Count`]).
pub trait Sink {
    /// Begins an argument (`/` before it in the path).
    fn arg(&mut self);
    /// [`FIELD_SEPARATOR`], between two fields of one argument.
    fn separator(&mut self);
    fn number(&mut self, n: u128);
    fn signed(&mut self, n: i64);
    /// An index into the call's keys, definitions or budgets, or a count of them: the size
    /// model counts it at the width of the largest the call can hold.
    fn index(&mut self, i: usize);
    fn text(&mut self, text: &str);
    /// A lease's fraction, with [`FRACTION_DECIMALS`] decimals.
    fn fraction(&mut self, fraction: f64);
    /// A number as Rust writes it in full (a refund's `left`).
    fn float(&mut self, value: f64);
    fn window(&mut self, window: Window);
    /// The clock or the deadline, as sent: the size model counts [`MAX_CLOCK_DIGITS`].
    fn instant(&mut self, text: &str);
}

/// Writes the arguments.
#[derive(Debug, Default)]
pub struct Args {
    pub args: Vec<String>,
    current: Option<String>,
}

impl Args {
    fn current(&mut self) -> &mut String {
        self.current.get_or_insert_with(String::new)
    }

    /// The arguments written.
    pub fn finish(mut self) -> Vec<String> {
        self.args.extend(self.current.take());
        self.args
    }

    /// The one argument written.
    pub fn one(self) -> String {
        self.finish().concat()
    }
}

impl Sink for Args {
    fn arg(&mut self) {
        if let Some(done) = self.current.replace(String::new()) {
            self.args.push(done);
        }
    }
    fn separator(&mut self) {
        self.current().push(FIELD_SEPARATOR);
    }
    fn number(&mut self, n: u128) {
        push_display(self.current(), n);
    }
    fn signed(&mut self, n: i64) {
        push_display(self.current(), n);
    }
    fn index(&mut self, i: usize) {
        push_display(self.current(), i);
    }
    fn text(&mut self, text: &str) {
        self.current().push_str(text);
    }
    fn fraction(&mut self, fraction: f64) {
        self.current()
            .push_str(&format!("{fraction:.FRACTION_DECIMALS$}"));
    }
    fn float(&mut self, value: f64) {
        push_display(self.current(), value);
    }
    fn window(&mut self, window: Window) {
        let text = window_arg(window);
        self.current().push_str(&text);
    }
    fn instant(&mut self, text: &str) {
        self.current().push_str(text);
    }
}

fn push_display(out: &mut String, value: impl std::fmt::Display) {
    use std::fmt::Write;
    // Writing into a String cannot fail.
    let _ = write!(out, "{value}");
}

/// Counts the bytes the arguments take in the Webdis path, percent-encoded, `/` before each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    /// Digits of the largest index or count the call can hold.
    pub index_digits: usize,
    pub bytes: usize,
    /// Arguments begun.
    pub args: usize,
}

impl Count {
    pub fn new(index_digits: usize) -> Self {
        Count {
            index_digits,
            bytes: 0,
            args: 0,
        }
    }
}

/// Before each segment of the path: not percent-encoded (it is what separates them).
const PATH_SEPARATOR: &str = "/";

/// Digits of `n` in decimal.
pub fn digits(n: u128) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

impl Sink for Count {
    fn arg(&mut self) {
        self.bytes += PATH_SEPARATOR.len();
        self.args += 1;
    }
    fn separator(&mut self) {
        let mut buf = [0; 4];
        self.bytes += path_segment_len(FIELD_SEPARATOR.encode_utf8(&mut buf).as_bytes());
    }
    fn number(&mut self, n: u128) {
        self.bytes += digits(n);
    }
    fn signed(&mut self, n: i64) {
        self.bytes += path_segment_len(if n < 0 { b"-" } else { b"" });
        self.bytes += digits(n.unsigned_abs().into());
    }
    fn index(&mut self, _: usize) {
        self.bytes += self.index_digits;
    }
    fn text(&mut self, text: &str) {
        self.bytes += path_segment_len(text.as_bytes());
    }
    fn fraction(&mut self, fraction: f64) {
        // The sign, the whole part's digits, the point, the decimals: as the writer's format.
        let sign = path_segment_len(if fraction.is_sign_negative() {
            b"-"
        } else {
            b""
        });
        let whole = fraction.abs().trunc();
        let whole_digits = if whole < 1e38 {
            digits(whole as u128)
        } else {
            39
        };
        self.bytes += sign + whole_digits + path_segment_len(b".") + FRACTION_DECIMALS;
    }
    fn float(&mut self, value: f64) {
        self.bytes += path_segment_len(format!("{value}").as_bytes());
    }
    fn window(&mut self, window: Window) {
        self.bytes += match window {
            Window::Fixed(d) => digits(d.as_millis()),
            Window::Calendar(c) => c.wire_len(),
        };
    }
    fn instant(&mut self, _: &str) {
        self.bytes += MAX_CLOCK_DIGITS;
    }
}

/// The window argument: its length in ms, digits only; or a calendar window (fixed_window
/// only) as its unit's letter and its UTC offset in signed minutes: `D+330` (a day at
/// +05:30), `W+0` (an ISO week in UTC), `M-300` (a month at -05:00). The script reads it as a
/// calendar only when it is not plain digits.
pub fn window_arg(window: Window) -> String {
    match window {
        Window::Fixed(d) => d.as_millis().to_string(),
        Window::Calendar(c) => c.wire(),
    }
}

/// What a limit's definition holds: everything but its key, cost and mode values. Limits of a
/// call with the same definition share it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Definition {
    pub algorithm: Algorithm,
    pub per_window: u64,
    pub window: Window,
    pub burst: u64,
    pub mode: &'static str,
    /// Its key budget's index in the call and its overflow key's index; None: no budget.
    pub budget: Option<(usize, usize)>,
}

impl Definition {
    /// Writes it as one argument of [`DEFINITION_FIELDS`] fields.
    pub fn encode<S: Sink>(&self, out: &mut S) {
        out.arg();
        out.text(self.algorithm.name());
        out.separator();
        out.number(self.per_window.into());
        out.separator();
        out.window(self.window);
        out.separator();
        out.number(self.burst.into());
        out.separator();
        out.text(self.mode);
        match self.budget {
            Some((budget, overflow)) => {
                out.separator();
                out.index(budget);
                out.separator();
                out.index(overflow);
            }
            None => {
                out.separator();
                out.number(0);
                out.separator();
                out.number(0);
            }
        }
    }
}

/// A limit's key in a call: its index in `KEYS`, and its override key's when it reads one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyIndex {
    pub state: usize,
    pub overrides: Option<usize>,
}

/// Writes one limit of a request: one argument of [`LIMIT_FIELDS`] fields (its key index,
/// `i:j` with its override's, its definition's index, its cost), then what its mode adds.
pub fn encode_limit<S: Sink>(
    out: &mut S,
    key: KeyIndex,
    definition: usize,
    cost: u64,
    mode: &WireMode,
) {
    out.arg();
    out.index(key.state);
    if let Some(j) = key.overrides {
        out.text(OVERRIDE_INDEX_SEPARATOR);
        out.index(j);
    }
    out.separator();
    out.index(definition);
    out.separator();
    out.number(cost.into());
    mode.values(out);
}

/// A key budget as a call sends it once, before the definitions: four arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Its counter key's index.
    pub counter: usize,
    pub new_keys: u64,
    pub window_ms: u64,
    pub over_budget: OverBudget,
}

impl Budget {
    pub fn encode<S: Sink>(&self, out: &mut S) {
        out.arg();
        out.index(self.counter);
        out.arg();
        out.number(self.new_keys.into());
        out.arg();
        out.number(self.window_ms.into());
        out.arg();
        out.text(self.over_budget.name());
    }
}

/// Writes a key, one argument (the keys go in the command before `ARGV`).
pub fn encode_key<S: Sink>(out: &mut S, key: &str) {
    out.arg();
    out.text(key);
}

/// Writes the head of a call's `ARGV` before its budgets: clock, deadline, then one argument of
/// the numbers of requests, of key budgets and of limit definitions (three fields: the code
/// finds a head it has read before by its text).
pub fn encode_head<S: Sink>(
    out: &mut S,
    clock: &str,
    deadline_ms: &str,
    requests: usize,
    budgets: usize,
    definitions: usize,
) {
    out.arg();
    out.instant(clock);
    out.arg();
    out.instant(deadline_ms);
    out.arg();
    out.number(requests as u128);
    out.separator();
    out.number(budgets as u128);
    out.separator();
    out.index(definitions);
}

/// Writes a count of keys or definitions (an index's width in the size model), or of a
/// request's limits (`exact`).
pub fn encode_count<S: Sink>(out: &mut S, n: usize, exact: bool) {
    out.arg();
    if exact {
        out.number(n as u128);
    } else {
        out.index(n);
    }
}

/// Writes the command before the keys: its name, what it calls, the number of keys.
pub fn encode_command<S: Sink>(out: &mut S, command: &str, handle: &str, keys: usize) {
    out.arg();
    out.text(command);
    out.arg();
    out.text(handle);
    encode_count(out, keys, false);
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Each mode adds as many values as it says, a name means one count, and what the writer
    /// writes is what the counter counts.
    #[test]
    fn every_mode_writes_what_it_counts() {
        for mode in WireMode::EVERY {
            let mut args = Args::default();
            args.arg();
            mode.values(&mut args);
            let written = args.finish();
            assert_eq!(written.len(), 1 + mode.value_count(), "{mode:?}");
            assert_eq!(WireMode::values_of(mode.name()), Some(mode.value_count()));
            let mut count = Count::new(1);
            mode.values(&mut count);
            let path: usize = written[1..]
                .iter()
                .map(|a| 1 + path_segment_len(a.as_bytes()))
                .sum();
            assert_eq!(count.bytes, path, "{mode:?}");
        }
        assert_eq!(WireMode::values_of("settle"), Some(2));
        assert_eq!(WireMode::values_of("nothing"), None);
    }

    #[test]
    fn the_longest_head_is_the_script_s() {
        use crate::program::{CallKind, Program};
        let script = Program::new(CallKind::Script);
        let function = Program::new(CallKind::Function);
        assert_eq!(
            (script.command(), script.handle.len()),
            (LONGEST_COMMAND, LONGEST_HANDLE.len())
        );
        assert!(function.command().len() + function.handle.len() < LONGEST_COMMAND.len() + 40);
    }

    #[test]
    fn the_longest_member_is_as_long_as_the_bound() {
        assert_eq!(LONGEST_MEMBER.len(), crate::bounds::MAX_MEMBER_BYTES);
        assert_eq!(
            path_segment_len(LONGEST_MEMBER.as_bytes()),
            LONGEST_MEMBER.len()
        );
    }

    #[test]
    fn a_definition_has_its_fields() {
        let mut args = Args::default();
        Definition {
            algorithm: Algorithm::Gcra,
            per_window: 10,
            window: Window::ms(60_000),
            burst: 20,
            mode: WireMode::Shadow.name(),
            budget: Some((1, 3)),
        }
        .encode(&mut args);
        let text = args.one();
        assert_eq!(text, "gcra~10~60000~20~shadow~1~3");
        assert_eq!(text.split(FIELD_SEPARATOR).count(), DEFINITION_FIELDS);
    }
}
