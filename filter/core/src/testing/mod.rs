//! What the core's tests, its cost examples and the e2e crate's tests share (built for tests,
//! or with the `testing` feature; never in the filter): stand-ins for what the host provides.

pub mod call;
pub mod cases;
pub mod host;
pub mod plan;
pub mod random;
pub mod request;
