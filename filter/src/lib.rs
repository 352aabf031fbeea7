//! The proxy-wasm adapter: routes Envoy's callbacks to the worker's `ratelimit_core::Engine`
//! and carries out what it asks. It decides nothing itself. Every host call is in
//! [`wasm_host`]; [`host`] is the engine's view of Envoy built on it.

use std::cell::{OnceCell, RefCell, RefMut};
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use ratelimit_core::config::{BodyPath, MetadataPath};
use ratelimit_core::request::body::BodyValues;
use ratelimit_core::request::plan::request_body_plan;
use ratelimit_core::request::view::{first_header, header_count, BadRequest};
use ratelimit_core::response::{self, Protocol};
use ratelimit_core::usage::{OutputKeys, RequestEstimate};
use usage::{HeldBody, Reading};

mod abi;
mod host;
mod usage;
// The adapter's tests run it over a fake Envoy that counts its host calls.
#[cfg(test)]
mod host_calls;
#[cfg(not(test))]
mod wasm_host;
#[cfg(test)]
#[path = "fake_wasm_host.rs"]
mod wasm_host;

use host::{EnvoyHost, WorkerHost};
use ratelimit_core::{BridgeReply, Config, Engine, Host, RequestView, Verdict};

/// Bridge replies larger than this are cut (and so fail to parse): a batch's reply is small.
const MAX_REPLY_BYTES: usize = 256 * 1024;

proxy_wasm::main! {{
    // Also installs a panic hook that logs at critical before the VM traps.
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> {
        Box::new(Root { id, worker: None })
    });
}}

/// What every request of one worker's VM shares: the configuration, the engine and the host
/// side (metric ids, logs, the wake-up queue).
struct Worker {
    config: Config,
    engine: RefCell<Engine>,
    host: WorkerHost,
}

struct Root {
    id: u32,
    worker: Option<Rc<Worker>>,
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if let Some(worker) = &self.worker {
            worker.on_reply(self.id, None, token_id, body_size);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let json = wasm_host::plugin_configuration();
        let config = match Config::parse(&json) {
            Ok(config) => config,
            Err(error) => {
                // Returning false makes Envoy refuse the whole configuration at start-up.
                log::error!("invalid filter configuration: {error}");
                return false;
            }
        };
        let host = WorkerHost::new(&config);
        let limits: usize = config.rules.iter().map(|r| r.limits.len()).sum();
        log::info!(
            "configured: {} rules, {limits} limits, bridge cluster {}, batches of up to {} requests, {} call(s) in flight{}",
            config.rules.len(),
            config.bridge.cluster,
            config.batch.max_requests,
            config.batch.max_in_flight,
            if host.wake_queue.is_some() { "" } else { " (no wake-up queue: calls start from requests)" }
        );
        self.worker = Some(Rc::new(Worker {
            engine: RefCell::new(Engine::new(&config)),
            config,
            host,
        }));
        true
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        let Some(worker) = &self.worker else {
            return;
        };
        if worker.host.wake_queue != Some(queue_id) {
            return;
        }
        // Empty the queue: one wake-up is as good as many.
        wasm_host::drain_queue(queue_id);
        worker.with_engine(self.id, "a wake-up", |engine, host| {
            engine.on_wakeup(&worker.config, host)
        });
    }

    fn on_tick(&mut self) {
        let Some(worker) = &self.worker else {
            return;
        };
        worker.with_engine(self.id, "a tick", |engine, host| {
            engine.on_tick(&worker.config, host)
        });
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // The SDK panics on None. Without a configuration (Envoy refuses to start then, so
        // this should not happen) requests pass untouched rather than trap the VM.
        let Some(worker) = self.worker.clone() else {
            return Some(Box::new(PassThrough));
        };
        Some(Box::new(Request {
            id: context_id,
            worker,
            held: None,
            reading: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

impl Worker {
    /// Runs `step` (called `what` in the log) on the engine from a callback of context
    /// `home`; None, counted and logged, when the engine is busy (see [`borrow_or_report`]).
    fn with_engine<R>(
        &self,
        home: u32,
        what: &'static str,
        step: impl FnOnce(&mut Engine, &mut EnvoyHost<'_>) -> R,
    ) -> Option<R> {
        let mut host = self.host.during(home);
        let mut engine = borrow_or_report(&self.engine, what, |what| host.report_busy(what))?;
        Some(step(&mut engine, &mut host))
    }

    /// A bridge call's reply, in the root (`at` None) or the request context that made it.
    fn on_reply(&self, home: u32, at: Option<u32>, token: u32, body_size: usize) {
        // On timeout or connection failure Envoy sends no `:status` at all.
        let (status, body) = wasm_host::call_reply(body_size, MAX_REPLY_BYTES);
        let reply = BridgeReply {
            status,
            body: &body,
        };
        self.with_engine(home, "a bridge reply", |engine, host| {
            engine.on_reply(&self.config, host, at, token, reply)
        });
    }
}

/// The engine for one callback's step, or None when another callback of this worker still
/// holds it: a host call that re-entered the filter while the engine ran (Envoy defers such
/// callbacks; nothing else guarantees it). The step is lost then (a request goes on
/// undecided, a reply or a forget is skipped), so `busy(what)` counts and logs it: never
/// silently.
fn borrow_or_report<'c, T>(
    cell: &'c RefCell<T>,
    what: &'static str,
    busy: impl FnOnce(&'static str),
) -> Option<RefMut<'c, T>> {
    match cell.try_borrow_mut() {
        Ok(value) => Some(value),
        Err(_) => {
            busy(what);
            None
        }
    }
}

/// A request context that does nothing (the trait defaults continue every callback).
struct PassThrough;

impl Context for PassThrough {}
impl HttpContext for PassThrough {}

struct Request {
    id: u32,
    worker: Rc<Worker>,
    /// The request is held until its body ends (a usage limit estimated from it, a `body:`
    /// source), with its headers as they came: Envoy lends them to the filter only in their
    /// own callback.
    held: Option<(HeldBody, RequestHeaders)>,
    /// The response's usage being read (usage limits let through).
    reading: Option<Reading>,
}

impl Request {
    /// Asks the engine about this request, seen through `view`.
    fn decide(&mut self, view: RequestHeaders) -> Action {
        let worker = &self.worker;
        let verdict = worker.with_engine(
            self.id,
            "a request (let through undecided)",
            |engine, host| engine.on_request(&worker.config, host, self.id, &view),
        );
        match verdict {
            Some(Verdict::Pause) => Action::Pause,
            Some(Verdict::Continue) | None => Action::Continue,
        }
    }

    /// The held request's body ended: at its last chunk, `size` bytes in all (the body may
    /// then be edited), or when its trailers came (None).
    fn body_ended(&mut self, size: Option<usize>) -> Action {
        match self.held.take() {
            Some((mut held, mut view)) => {
                view.fields = Some(held.field_values());
                if let Some(size) = size {
                    held.add_include_usage(size);
                }
                view.body = Some(RefCell::new(held.estimate));
                self.decide(view)
            }
            None => Action::Continue,
        }
    }

    /// The response ended (`complete`) or the stream did before it: its usage limits are
    /// settled with what was read.
    fn settle(&mut self, complete: bool) {
        let id = self.id;
        let meter = match self.reading.take() {
            Some(reading) => Some(reading.meter),
            None => self
                .worker
                .with_engine(id, "a usage meter", |engine, _| engine.take_meter(id))
                .flatten(),
        };
        if let Some(meter) = meter {
            let outcomes = meter.finish(complete);
            self.worker
                .with_engine(id, "a usage settlement", |engine, host| {
                    engine.settle_usage(host, outcomes)
                });
        }
    }
}

/// The filter's rate-limit headers onto the upstream's response, which may carry its own
/// (`response::upstream`): one value per header.
fn add_rate_limit_headers(ours: ratelimit_core::response::Headers) {
    use ratelimit_core::response::upstream::{writes, Write};
    let upstream = wasm_host::response_headers();
    let has = |name: &str| upstream.iter().any(|(n, _)| n == name);
    let mut first = |name: &str| {
        upstream
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    for write in writes(ours, &mut first) {
        match write {
            Write::Set(name, value) => {
                if has(name) {
                    wasm_host::remove_response_header(name);
                }
                wasm_host::add_response_header(name, &value);
            }
            Write::Append(name, value) => wasm_host::add_response_header(name, &value),
            Write::Remove(name) => {
                if has(name) {
                    wasm_host::remove_response_header(name);
                }
            }
        }
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let view = RequestHeaders::default();
        if !end_of_stream {
            if let Some(plan) = request_body_plan(&self.worker.config, &view) {
                // The body is held (buffered by Envoy) until it ends; the headers go on.
                // Envoy's proxy-wasm host turns a pause of the headers into a pause of the
                // whole stream, and no body callback would come while they are held. The
                // upstream request then has no body before the decision; a refusal resets it.
                view.all();
                if plan.include_usage {
                    // The body may grow once read, after these headers left: its length
                    // is left to the framing (chunked to HTTP/1.1 upstreams).
                    wasm_host::remove_request_header("content-length");
                }
                let fields = &self.worker.config.body_fields;
                let held = HeldBody::new(plan.max_body, plan.include_usage, fields);
                self.held = Some((held, view));
                return Action::Continue;
            }
        }
        self.decide(view)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some((held, view)) = self.held.as_mut() else {
            return Action::Continue;
        };
        if !held.feed_buffered(body_size) {
            let answer = response::body_too_large(Protocol::of(view), held.max_body);
            self.held = None;
            self.worker.host.during(self.id).answer(self.id, answer);
            return Action::Pause;
        }
        if !end_of_stream {
            return Action::Pause; // StopIterationAndBuffer: Envoy keeps the body
        }
        self.body_ended(Some(body_size))
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        // Read, not edited: Envoy 1.40 takes a body edit made at the trailers (the call
        // succeeds) but sends the body unedited (tests/tests/llm_models.rs).
        self.body_ended(None)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let id = self.id;
        let taken = self
            .worker
            .with_engine(id, "a response's rate-limit headers", |engine, _| {
                (engine.take_headers(id), engine.take_meter(id))
            });
        let (headers, meter) = taken.unwrap_or_default();
        if let Some(headers) = headers.filter(|h| !h.is_empty()) {
            add_rate_limit_headers(headers);
        }
        self.reading = meter.map(Reading::start);
        if end_of_stream {
            self.settle(true);
        }
        Action::Continue
    }

    /// Read as it passes, never held: the client is never delayed by the metering.
    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if let Some(reading) = self.reading.as_mut() {
            reading.feed(body_size);
            if end_of_stream {
                self.settle(true);
            }
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        if self.reading.is_some() {
            self.settle(true);
        }
        Action::Continue
    }

    /// The stream is over: a response that did not end (client gone, upstream reset) is
    /// settled with what was read.
    fn on_log(&mut self) {
        if self.worker.config.metered {
            self.settle(false);
        }
    }
}

impl Context for Request {
    /// Only calls started from this request (alone, on an idle worker) reply here.
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        self.worker
            .on_reply(self.id, Some(self.id), token_id, body_size);
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        let worker = &self.worker;
        worker.with_engine(self.id, "forgetting a finished request", |engine, host| {
            engine.forget(&worker.config, host, self.id)
        });
    }
}

/// The request whose callback is running, as the core reads it.
#[derive(Default)]
struct RequestHeaders {
    /// The request headers, read on the first lookup. Envoy's single-value lookup
    /// (`proxy_get_header_map_value`) returns only the first copy of a repeated header, so
    /// repeats can only be counted over the whole map.
    headers: OnceCell<Vec<(String, Vec<u8>)>>,
    /// The request body as counted while it was held (usage limits estimated from it).
    body: Option<RefCell<RequestEstimate>>,
    /// Its `body:` values, once it ended.
    fields: Option<BodyValues>,
    /// Metadata values read for this request: a plan's source is read by each of its plans.
    metadata: RefCell<Vec<(MetadataPath, Option<Vec<u8>>)>>,
}

impl RequestHeaders {
    fn all(&self) -> &[(String, Vec<u8>)] {
        self.headers.get_or_init(wasm_host::request_headers)
    }
}

impl RequestView for RequestHeaders {
    fn header(&self, name: &str) -> Option<&[u8]> {
        first_header(self.all(), name)
    }

    fn header_copies(&self, name: &str) -> usize {
        header_count(self.all(), name)
    }

    fn source_address(&self) -> Option<String> {
        wasm_host::property_text(&["source", "address"])
    }

    fn route_name(&self) -> Option<String> {
        // `xds.route_name` in current Envoy; `route_name` in older releases.
        wasm_host::property_text(&["xds", "route_name"])
            .or_else(|| wasm_host::property_text(&["route_name"]))
    }

    fn metadata(&self, path: &MetadataPath) -> Option<Vec<u8>> {
        if let Ok(read) = self.metadata.try_borrow() {
            if let Some((_, value)) = read.iter().find(|(p, _)| p == path) {
                return value.clone();
            }
        }
        let value = wasm_host::property_bytes(&path.property());
        if let Ok(mut read) = self.metadata.try_borrow_mut() {
            read.push((path.clone(), value.clone()));
        }
        value
    }

    fn body_field(&self, path: &BodyPath) -> Result<Option<&[u8]>, BadRequest> {
        self.fields.as_ref().map_or(Ok(None), |f| f.get(path))
    }

    fn usage_estimate(&self, completion_default: u64, keys: OutputKeys) -> Option<(u64, u64)> {
        let mut body = self.body.as_ref()?.try_borrow_mut().ok()?;
        body.finish_parts(completion_default, keys).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_engine_is_reported_and_a_free_one_is_lent() {
        let cell = RefCell::new(0u32);
        let mut reported = Vec::new();
        let mut held = borrow_or_report(&cell, "a tick", |what| reported.push(what))
            .expect("a free engine is lent");
        *held += 1;
        // A callback re-entering while the first still holds the engine.
        let again = borrow_or_report(&cell, "a bridge reply", |what| reported.push(what));
        assert!(again.is_none());
        drop(held);
        assert_eq!(reported, ["a bridge reply"], "reported once, by name");
        let free = borrow_or_report(&cell, "a tick", |what| reported.push(what));
        assert_eq!(free.as_deref(), Some(&1), "the first step's effect is kept");
        assert_eq!(reported.len(), 1, "a free engine reports nothing");
    }
}
