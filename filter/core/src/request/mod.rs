//! About one request: what the limiter may read of it (`view`), the values of its JSON body
//! that sources read (`body`), the client's address (`address`), the value of a key, match or
//! plan source (`source`), who is calling
//! (`identity`), the Redis keys of their state (`keys`), a worker's memo of recent identities'
//! keys (`memo`), and the limit checks to ask Redis for (`plan`). Each file depends only on
//! those listed before it.

pub mod address;
pub mod body;
pub mod identity;
pub mod keys;
pub mod memo;
pub mod plan;
pub mod source;
pub mod view;
