//! Carrying out a conclusion for a stream: returned as the verdict if the request's own
//! callback is running, else resumed or answered through the host; the rate-limit headers of
//! an allowed request are kept until its response headers pass, and which requests are
//! answered in gRPC until their stream ends.

use std::collections::{HashMap, HashSet};

use super::host::{Host, Verdict};
use super::policy::Conclusion;
use crate::metrics::Histogram;
use crate::response::{Headers, Protocol};
use crate::time::UnixNs;

/// The request whose own callback is running: its verdict is returned, not resumed.
#[derive(Debug, Clone, Copy)]
struct Current {
    ctx: u32,
    verdict: Option<Verdict>,
}

#[derive(Debug, Default)]
pub struct Delivery {
    /// Rate-limit headers for allowed requests, until their response headers pass.
    headers: HashMap<u32, Headers>,
    /// The requests answered in gRPC should they be refused: the refusal may come from a
    /// bridge reply, once their headers are gone.
    grpc: HashSet<u32>,
    current: Option<Current>,
}

impl Delivery {
    /// The callback of request `ctx` starts.
    pub fn begin(&mut self, ctx: u32) {
        self.current = Some(Current { ctx, verdict: None });
    }

    /// The callback ends: its verdict (paused unless it was concluded).
    pub fn end(&mut self) -> Verdict {
        let verdict = self.current.take().and_then(|c| c.verdict);
        verdict.unwrap_or(Verdict::Pause)
    }

    /// Carries out `conclusion` for `ctx`. `waited` (arrived, now) gives the decision latency
    /// of a request that waited (the clock is read once per callback by the caller, not once
    /// per request); None: it did not wait.
    pub fn deliver(
        &mut self,
        host: &mut impl Host,
        ctx: u32,
        conclusion: Conclusion,
        waited: Option<(UnixNs, UnixNs)>,
    ) {
        let own = self.current.is_some_and(|c| c.ctx == ctx);
        let verdict = match conclusion {
            Conclusion::Answer(response) => {
                host.answer(ctx, response);
                Verdict::Pause
            }
            Conclusion::Resume(headers) => {
                if !headers.is_empty() {
                    self.headers.insert(ctx, headers);
                }
                Verdict::Continue
            }
        };
        if own {
            self.current = Some(Current {
                ctx,
                verdict: Some(verdict),
            });
            return;
        }
        if verdict == Verdict::Continue && !host.resume(ctx) {
            self.headers.remove(&ctx);
        }
        if let Some((arrived_ns, now)) = waited.filter(|(arrived, now)| now >= arrived) {
            let ms = now.since(arrived_ns).div_ceil(1_000_000);
            host.record(Histogram::DecisionMs, u64::try_from(ms).unwrap_or(u64::MAX));
        }
    }

    /// Request `ctx` is answered in `protocol` until its stream ends (a stream whose end was
    /// not seen, its engine busy then, does not pass its protocol on to its id's next use).
    pub fn answer_in(&mut self, ctx: u32, protocol: Protocol) {
        match protocol {
            Protocol::Grpc => {
                self.grpc.insert(ctx);
            }
            Protocol::Http if !self.grpc.is_empty() => {
                self.grpc.remove(&ctx);
            }
            Protocol::Http => {}
        }
    }

    /// What request `ctx` is answered in.
    pub fn protocol(&self, ctx: u32) -> Protocol {
        match !self.grpc.is_empty() && self.grpc.contains(&ctx) {
            true => Protocol::Grpc,
            false => Protocol::Http,
        }
    }

    /// The rate-limit headers `ctx` was allowed with, taken.
    pub fn take_headers(&mut self, ctx: u32) -> Option<Headers> {
        self.headers.remove(&ctx)
    }

    /// The stream of `ctx` ended.
    pub fn forget(&mut self, ctx: u32) {
        self.headers.remove(&ctx);
        self.grpc.remove(&ctx);
    }
}
