//! Usage limits in the adapter: holding a request until its body has been counted (a usage
//! limit estimated from the request), and reading the response's usage as it passes. Every
//! decision is the core's (`ratelimit_core::metering`, `Engine::take_meter`,
//! `Engine::settle_usage`); this only moves bytes between Envoy and it.

use ratelimit_core::metering::UsageMeter;
use ratelimit_core::usage::RequestEstimate;

use crate::wasm_host;

/// A request held until its body ends: its bytes counted and scanned as Envoy buffers them.
pub struct HeldBody {
    pub estimate: RequestEstimate,
    pub max_body: u64,
    /// Bytes of the buffered body already fed (Envoy hands the whole buffer each time).
    pub fed: usize,
}

impl HeldBody {
    pub fn new(max_body: u64) -> Self {
        HeldBody {
            estimate: RequestEstimate::new(max_body),
            max_body,
            fed: 0,
        }
    }

    /// The request body buffered so far is `size` bytes: feeds what is new. False once it
    /// is over `max_body` (the request is then answered 413).
    pub fn feed_buffered(&mut self, size: usize) -> bool {
        if size as u64 > self.max_body {
            return false;
        }
        if size > self.fed {
            let chunk = wasm_host::request_body(self.fed, size - self.fed);
            self.estimate.feed(&chunk);
            self.fed = size;
        }
        true
    }
}

/// The response's usage being read (a stream let through on usage limits).
pub struct Reading {
    pub meter: UsageMeter,
}

impl Reading {
    /// The response headers are here: header sources read, body readers started.
    pub fn start(mut meter: UsageMeter) -> Self {
        meter.on_headers(&wasm_host::response_header);
        Reading { meter }
    }

    /// A response body chunk of `size` bytes passes (never held: the filter continues it).
    pub fn feed(&mut self, size: usize) {
        if size == 0 || !self.meter.wants_body() {
            return;
        }
        let chunk = wasm_host::response_body(size);
        self.meter.feed(&chunk);
    }
}
