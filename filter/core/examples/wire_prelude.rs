//! Prints `lua/wire.lua`, the decision call's protocol for the Lua side, from its Rust
//! definition: `cargo run -p ratelimit-core --example wire_prelude > lua/wire.lua`.

fn main() {
    print!("{}", ratelimit_core::bridge::wire::prelude::lua_prelude());
}
