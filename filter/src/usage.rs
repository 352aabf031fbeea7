//! Usage limits in the adapter: holding a request until its body has been counted (a usage
//! limit estimated from the request) or read (a `body:` source), and reading the response's
//! usage as it passes. Every
//! decision is the core's (`ratelimit_core::metering`, `Engine::take_meter`,
//! `Engine::settle_usage`); this only moves bytes between Envoy and it.

use ratelimit_core::config::BodyPath;
use ratelimit_core::metering::UsageMeter;
use ratelimit_core::request::body::{BodyFields, BodyValues};
use ratelimit_core::usage::RequestEstimate;

use crate::wasm_host;

/// A request held until its body ends: its bytes counted and scanned as Envoy buffers them.
pub struct HeldBody {
    pub estimate: RequestEstimate,
    pub max_body: u64,
    /// Bytes of the buffered body already fed (Envoy hands the whole buffer each time).
    pub fed: usize,
    /// `stream_options.include_usage` may be added to the body.
    pub include_usage: bool,
    /// The `body:` values keys and conditions read.
    pub fields: BodyFields,
}

impl HeldBody {
    pub fn new(max_body: u64, include_usage: bool, fields: &[BodyPath]) -> Self {
        let estimate = RequestEstimate::new(max_body);
        HeldBody {
            estimate: if include_usage {
                estimate.with_stream_keys()
            } else {
                estimate
            },
            max_body,
            fed: 0,
            include_usage,
            fields: BodyFields::new(fields),
        }
    }

    /// The whole body of `size` bytes is buffered: adds `include_usage` to a streamed
    /// request lacking it (the core says where). The upstream already has the headers,
    /// sent without `content-length` for such requests, so the longer body stays framed.
    pub fn add_include_usage(&mut self, size: usize) {
        if !self.include_usage {
            return;
        }
        let Some(insert) = self.estimate.include_usage() else {
            return;
        };
        let body = wasm_host::request_body(0, size);
        if let Some(edited) = insert.apply(&body) {
            wasm_host::replace_request_body(0, size, &edited);
        }
    }

    /// The `body:` values of the whole body, read where they were found (before any edit).
    pub fn field_values(&mut self) -> BodyValues {
        let size = self.fed as u64;
        self.fields.values(size, &mut |at, len| {
            usize::try_from(at).map_or_else(|_| Vec::new(), |at| wasm_host::request_body(at, len))
        })
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
            self.fields.feed(&chunk);
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
