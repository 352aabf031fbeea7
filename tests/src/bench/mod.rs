//! The parts of `make bench` (the binary is `src/bin/bench.rs`): throughput, added latency,
//! cost per request and global accuracy of the filter, side by side with Envoy alone and
//! Envoy's own `local_ratelimit`, all in one run so that the ratios are comparable.
//!
//! - [`config`]: the Envoy configs of the scenarios, and the one function that knows the
//!   filter's JSON config schema ([`config::filter_json`]).
//! - [`wrk`]: runs wrk (throughput scenarios) and reads its summary.
//! - [`client`]: a keep-alive HTTP client for the accuracy and overload runs, which must count
//!   every response exactly and know when the first request left and the last answer came.
//! - [`measure`]: CPU time from `/proc`, Redis `INFO commandstats`, Envoy `/stats`, the machine.
//! - [`report`]: the results and `report.md`; [`svg`]: the chart.

pub mod client;
pub mod config;
pub mod measure;
pub mod report;
pub mod svg;
pub mod wrk;
