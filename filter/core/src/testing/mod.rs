//! What the core's tests and the cost examples share (built for tests, or with the `testing`
//! feature; never in the filter).

pub mod host;
pub mod random;
