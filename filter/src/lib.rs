//! The proxy-wasm adapter: carries out what `ratelimit_core::RequestFlow` asks, through Envoy's
//! host calls. It decides nothing itself. Host calls are used through `proxy_wasm::hostcalls`,
//! whose `Result`s are handled, rather than the trait helpers, which unwrap and would trap the VM.

use std::cell::{OnceCell, RefCell};
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};
use ratelimit_core::config::Bridge;
use ratelimit_core::response::LocalResponse;
use ratelimit_core::{
    BridgeFailure, BridgeReply, BridgeRequest, Config, Counter, Host, LogThrottle, RequestFlow,
    RequestView, Verdict,
};

/// Bridge replies larger than this are cut (and so fail to parse): a decision is tiny.
const MAX_REPLY_BYTES: usize = 64 * 1024;
/// At most one failure log line per worker in this interval; the rest are counted.
const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(10);

proxy_wasm::main! {{
    // Also installs a panic hook that logs at critical before the VM traps.
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// What every request of one worker's VM shares.
struct Shared {
    config: Config,
    metrics: Vec<(Counter, u32)>,
    failure_log: RefCell<LogThrottle>,
}

#[derive(Default)]
struct Root {
    shared: Option<Rc<Shared>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let json = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        let config = match Config::parse(&json) {
            Ok(config) => config,
            Err(error) => {
                // Returning false makes Envoy refuse the whole configuration at start-up.
                log::error!("invalid filter configuration: {error}");
                return false;
            }
        };
        let mut metrics = Vec::with_capacity(Counter::ALL.len());
        for counter in Counter::ALL {
            match hostcalls::define_metric(MetricType::Counter, counter.name()) {
                Ok(id) => metrics.push((counter, id)),
                Err(status) => log::warn!("cannot define metric {}: {status:?}", counter.name()),
            }
        }
        let limits: usize = config.rules.iter().map(|r| r.limits.len()).sum();
        log::info!(
            "configured: {} rules, {limits} limits, bridge cluster {}",
            config.rules.len(),
            config.bridge.cluster
        );
        self.shared = Some(Rc::new(Shared {
            config,
            metrics,
            failure_log: RefCell::new(LogThrottle::new(FAILURE_LOG_INTERVAL)),
        }));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // The SDK panics on None. Without a configuration (Envoy refuses to start then, so
        // this should not happen) requests pass untouched rather than trap the VM.
        let Some(shared) = self.shared.clone() else {
            return Some(Box::new(PassThrough));
        };
        Some(Box::new(Request {
            shared,
            flow: RequestFlow::new(),
            pending_call: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// A request context that does nothing (the trait defaults continue every callback).
struct PassThrough;

impl Context for PassThrough {}
impl HttpContext for PassThrough {}

struct Request {
    shared: Rc<Shared>,
    flow: RequestFlow,
    /// Token of the bridge call in flight, if any.
    pending_call: Option<u32>,
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let mut host = EnvoyHost {
            shared: &self.shared,
            pending_call: &mut self.pending_call,
            request_headers: OnceCell::new(),
        };
        match self.flow.on_request_headers(&self.shared.config, &mut host) {
            Verdict::Continue => Action::Continue,
            Verdict::Pause => Action::Pause,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let mut host = EnvoyHost {
            shared: &self.shared,
            pending_call: &mut self.pending_call,
            request_headers: OnceCell::new(),
        };
        self.flow.on_response_headers(&mut host);
        Action::Continue
    }
}

impl Context for Request {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if self.pending_call != Some(token_id) {
            return;
        }
        self.pending_call = None;
        // On timeout or connection failure Envoy sends no `:status` at all.
        let status = hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|s| s.parse::<u16>().ok());
        let body = hostcalls::get_buffer(
            BufferType::HttpCallResponseBody,
            0,
            body_size.min(MAX_REPLY_BYTES),
        )
        .ok()
        .flatten()
        .unwrap_or_default();
        let mut host = EnvoyHost {
            shared: &self.shared,
            pending_call: &mut self.pending_call,
            request_headers: OnceCell::new(),
        };
        let reply = BridgeReply {
            status,
            body: &body,
        };
        self.flow
            .on_bridge_reply(&self.shared.config, &mut host, reply);
    }
}

/// The core's view of Envoy during one callback.
struct EnvoyHost<'a> {
    shared: &'a Shared,
    pending_call: &'a mut Option<u32>,
    /// The request headers, read on the first lookup. Envoy's single-value lookup
    /// (`proxy_get_header_map_value`) returns only the first copy of a repeated header, so
    /// repeats can only be counted over the whole map.
    request_headers: OnceCell<Vec<(String, Vec<u8>)>>,
}

impl EnvoyHost<'_> {
    fn request_headers(&self) -> &[(String, Vec<u8>)] {
        self.request_headers.get_or_init(|| {
            hostcalls::get_map_bytes(MapType::HttpRequestHeaders).unwrap_or_else(|status| {
                log::warn!("cannot read the request headers: {status:?}");
                Vec::new()
            })
        })
    }

    fn copies<'h>(&'h self, name: &'h str) -> impl Iterator<Item = &'h Vec<u8>> + 'h {
        self.request_headers()
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, value)| value)
    }
}

impl RequestView for EnvoyHost<'_> {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.copies(name).next().cloned()
    }

    fn header_copies(&self, name: &str) -> usize {
        self.copies(name).count()
    }

    fn source_address(&self) -> Option<String> {
        property_text(&["source", "address"])
    }

    fn route_name(&self) -> Option<String> {
        // `xds.route_name` in current Envoy; `route_name` in older releases.
        property_text(&["xds", "route_name"]).or_else(|| property_text(&["route_name"]))
    }
}

fn property_text(path: &[&str]) -> Option<String> {
    let bytes = hostcalls::get_property(path.to_vec()).ok().flatten()?;
    String::from_utf8(bytes).ok()
}

impl Host for EnvoyHost<'_> {
    fn now_unix_ns(&self) -> Option<u128> {
        let now = hostcalls::get_current_time().ok()?;
        Some(now.duration_since(UNIX_EPOCH).ok()?.as_nanos())
    }

    fn dispatch(
        &mut self,
        bridge: &Bridge,
        request: &BridgeRequest,
        timeout: Duration,
    ) -> Result<(), String> {
        let headers = request.headers(bridge);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let token = hostcalls::dispatch_http_call(
            &bridge.cluster,
            headers,
            request.body.as_deref(),
            vec![],
            timeout,
        )
        .map_err(|status| {
            format!(
                "dispatch_http_call to cluster {}: {status:?}",
                bridge.cluster
            )
        })?;
        *self.pending_call = Some(token);
        Ok(())
    }

    fn send_response(&mut self, response: LocalResponse) {
        let headers: Vec<(&str, &str)> = response
            .headers
            .iter()
            .map(|(n, v)| (*n, v.as_str()))
            .collect();
        if let Err(status) = hostcalls::send_http_response(
            u32::from(response.status),
            headers,
            Some(response.body.as_bytes()),
        ) {
            log::error!(
                "cannot send the local {} reply: {status:?}",
                response.status
            );
        }
    }

    fn resume(&mut self) {
        if let Err(status) = hostcalls::resume_http_request() {
            log::error!("cannot resume the request: {status:?}");
        }
    }

    fn add_response_header(&mut self, name: &str, value: &str) {
        if let Err(status) = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value) {
            log::warn!("cannot add response header {name}: {status:?}");
        }
    }

    fn count(&mut self, counter: Counter) {
        if let Some((_, id)) = self.shared.metrics.iter().find(|(c, _)| *c == counter) {
            // A failed increment loses one count; nothing to do about it on the request path.
            let _ = hostcalls::increment_metric(*id, 1);
        }
    }

    fn report_failure(&mut self, failure: &BridgeFailure) {
        let now = self.now_unix_ns().unwrap_or(0);
        if let Some(suppressed) = self.shared.failure_log.borrow_mut().admit(now) {
            log::warn!(
                "bridge failure, failure policy applied: {failure} ({suppressed} similar lines suppressed)"
            );
        }
    }
}
