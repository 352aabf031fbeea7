//! Talking to Webdis: what Redis runs and how it is loaded (`program`), the decision call's
//! arguments (`args`), the size model of a call (`size`), the call's protocol and its one
//! encoder, decoder and Lua prelude (`wire`), the
//! HTTP requests (`request`), what their replies say (`reply`), why a call gave no decision
//! (`failure`), and the probe of a live bridge with a configuration's credentials (`probe`).

mod args;
mod failure;
mod probe;
mod program;
mod reply;
mod request;
mod size;
pub mod wire;

pub use args::{lease_units, DecideCall, FRACTION_DECIMALS};
pub use failure::{
    BridgeCall, BridgeFailure, FailureCause, MisconfigCause, Misconfiguration, Refused,
};
pub use probe::{Probe, PROBE_TAG};
pub use program::{CallKind, Program};
pub use reply::{
    is_answer, parse_batch_reply, parse_eval_reply, parse_node_reply, BridgeReply, EvalOutcome,
    RequestShape, SlotMap,
};
pub use request::{BridgeRequest, NODE_CALL_EXTRA_BYTES};
pub use size::{batch_size, call_bytes, BudgetShape, CallSize, LimitShape};
pub use wire::{WireMode, FIELD_SEPARATOR, MAX_CLOCK_DIGITS};
