//! Test support shared by the core's unit tests, its examples and the e2e crate's tests
//! (feature `testing`): stand-ins for what the host provides.

pub mod request;
