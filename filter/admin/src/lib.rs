//! `ratelimit-admin`: an operator's command over the rate limiter's state in Redis. It reads
//! the filter's config to name keys exactly as the filter does (`target`), reads states into
//! the Rust twins of the scripts' algorithms (`state`), writes and reads overrides in the
//! script's format (`overrides`), and records every change in a bounded audit stream
//! (`audit`). Redis is reached with the `redis` crate (`store`).

pub mod audit;
pub mod cli;
pub mod error;
pub mod operator;
pub mod overrides;
pub mod state;
pub mod store;
pub mod target;
pub mod when;

mod commands;

pub use cli::{parse, Cli, Command, USAGE};
pub use commands::{run, Report};
pub use error::{Error, Kind};
pub use store::{CLUSTER_COMMANDS, COMMANDS};
