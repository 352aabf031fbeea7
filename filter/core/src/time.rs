//! Time as the core counts it: Unix ns in a `u128` (the clock a call decides with), and the
//! conversions every part shares. At the bottom: it imports nothing of the crate, so any module
//! may use it.

/// Unix ns as ms, computed as the scripts do (whole seconds and the rest apart), so that the
/// Rust twins of the algorithms and the Lua code see the same number: Unix ns do not fit a
/// double exactly.
pub fn unix_ms(ns: u128) -> f64 {
    (ns / 1_000_000_000) as f64 * 1000.0 + (ns % 1_000_000_000) as f64 / 1e6
}
