//! Loading a configuration: its JSON parsed and each field validated (`config`), then the
//! bound on what one request can carry (`call_bound`), which counts the keys the filter names
//! (`request::keys`) with the bridge's size model of a call (`bridge`). Kept apart so that
//! `config` depends on neither.

mod call_bound;

use crate::config::{parse_fields, Config, ConfigError};

impl Config {
    /// Parses and validates the filter's JSON configuration: every field, then what one
    /// request can carry (with a Redis Cluster's key names).
    pub fn parse(json: &[u8]) -> Result<Config, ConfigError> {
        let config = parse_fields(json)?;
        call_bound::check_request_bounds(&config)?;
        Ok(config)
    }
}
