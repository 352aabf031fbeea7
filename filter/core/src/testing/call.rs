//! A decision call's path read back into its limits, for tests that check what was sent: the
//! bridge's own decoder (`bridge::wire::decode`), named here for the tests that use it.

pub use crate::bridge::wire::decode::{sent_in_mode, sent_limits, SentLimit};
