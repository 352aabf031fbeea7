//! About one request: what the limiter may read of it (`view`), who is calling (`identity`),
//! the Redis keys of their state (`keys`), and the limit checks to ask Redis for (`plan`).
//! Each file depends only on those listed before it.

pub mod identity;
pub mod keys;
pub mod plan;
pub mod view;
