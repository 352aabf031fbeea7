//! Talking to Webdis: the calls the filter sends (`call`), what their replies say (`reply`),
//! and why a call gave no decision (`failure`).

mod call;
mod failure;
mod reply;

pub use call::{
    batch_size, call_bytes, lease_units, BridgeRequest, BudgetShape, CallSize, DecideCall,
    LimitShape, ModeShape, FRACTION_DECIMALS, MAX_CLOCK_DIGITS,
};
pub use failure::{BridgeFailure, FailureCause};
pub use reply::{
    is_answer, parse_batch_reply, parse_eval_reply, parse_script_load_reply, BridgeReply,
    EvalOutcome, RequestShape,
};
