//! Time as the core counts it: an instant on the Unix clock in ns ([`UnixNs`], the clock a call
//! decides with), and the conversions every part shares. At the bottom: it imports nothing of
//! the crate, so any module may use it.

use std::time::Duration;

/// An instant on the Unix clock, in ns since the epoch (the host's clock, and what goes to
/// Redis as the decision code's clock). A `u128` inside: Unix ns pass `u64` in 2554, and the
/// clock is text on the wire, so no width is imposed. Arithmetic saturates, so a clock at
/// either end of the range never panics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct UnixNs(u128);

impl UnixNs {
    /// The instant `ns` ns after the Unix epoch.
    pub const fn from_ns(ns: u128) -> Self {
        UnixNs(ns)
    }

    /// Ns since the Unix epoch (as the clock goes to Redis).
    pub const fn as_ns(self) -> u128 {
        self.0
    }

    /// Whole ms since the Unix epoch (rounded down, as a call's deadline goes to Redis).
    pub const fn as_ms(self) -> u128 {
        self.0 / 1_000_000
    }

    /// Ms since the Unix epoch as the scripts compute them (see [`unix_ms`]).
    pub fn unix_ms(self) -> f64 {
        unix_ms(self.0)
    }

    /// `ns` ns later (saturating).
    pub const fn plus_ns(self, ns: u128) -> Self {
        UnixNs(self.0.saturating_add(ns))
    }

    /// `d` later (saturating).
    pub const fn plus(self, d: Duration) -> Self {
        self.plus_ns(d.as_nanos())
    }

    /// `ns` ns earlier (saturating at the epoch).
    pub const fn minus_ns(self, ns: u128) -> Self {
        UnixNs(self.0.saturating_sub(ns))
    }

    /// Ns from `earlier` to `self`: 0 if `earlier` is not before (a clock that went back
    /// counts no time).
    pub const fn since(self, earlier: UnixNs) -> u128 {
        self.0.saturating_sub(earlier.0)
    }
}

/// Unix ns as ms, computed as the scripts do (whole seconds and the rest apart), so that the
/// Rust twins of the algorithms and the Lua code see the same number: Unix ns do not fit a
/// double exactly.
pub fn unix_ms(ns: u128) -> f64 {
    (ns / 1_000_000_000) as f64 * 1000.0 + (ns % 1_000_000_000) as f64 / 1e6
}
