//! Every call into Envoy, in one place: each `proxy_wasm::hostcalls` function the adapter uses,
//! with its `Result` handled here (the trait helpers unwrap, which would trap the VM). The rest
//! of the adapter calls these and never `hostcalls` itself. A failed read is told apart from
//! an absent value where the caller acts on it (`Err` against `Ok(None)`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType, Status};

/// The filter's JSON configuration as Envoy hands it to `on_configure` (empty if unreadable).
pub fn plugin_configuration() -> Vec<u8> {
    hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Defines a metric; None (logged) if Envoy refuses.
pub fn define_metric(kind: MetricType, name: &str) -> Option<u32> {
    match hostcalls::define_metric(kind, name) {
        Ok(id) => Some(id),
        Err(status) => {
            log::warn!("cannot define metric {name}: {status:?}");
            None
        }
    }
}

/// Adds `delta` to a counter or gauge. A failure loses counts; nothing to do about it on the
/// request path.
pub fn increment_metric(id: u32, delta: i64) {
    let _ = hostcalls::increment_metric(id, delta);
}

pub fn record_metric(id: u32, value: u64) {
    let _ = hostcalls::record_metric(id, value);
}

/// Sets the worker's timer: `on_tick` of the root context every `period`, or none for
/// `Duration::ZERO`; false (logged) if Envoy refuses.
///
/// Relied on, as Envoy implements `proxy_set_tick_period_milliseconds` (proxy-wasm-cpp-host's
/// `ContextBase::setTimerPeriod`, Envoy's `Wasm::setTimerPeriod` and `tickHandler`): the
/// timer is the root context's of whichever context calls (a request's callback sets the
/// root's timer); a new period replaces the running timer, first firing one period later; a
/// period of 0 disables it, also from inside `on_tick` (the handler re-arms only a period
/// above 0). Envoy answers every call Ok.
pub fn set_tick_period(period: Duration) -> bool {
    match hostcalls::set_tick_period(period) {
        Ok(()) => true,
        Err(status) => {
            log::warn!("cannot set the worker's timer to {period:?}: {status:?}");
            false
        }
    }
}

/// Registers a shared queue under `name`; None (logged) if Envoy refuses.
pub fn register_queue(name: &str) -> Option<u32> {
    hostcalls::register_shared_queue(name)
        .map_err(|status| log::warn!("cannot register a wake-up queue: {status:?}"))
        .ok()
}

/// Posts a message to a queue; false if Envoy refuses.
pub fn enqueue(queue: u32) -> bool {
    hostcalls::enqueue_shared_queue(queue, Some(b"w")).is_ok()
}

/// Empties a queue.
pub fn drain_queue(queue: u32) {
    while let Ok(Some(_)) = hostcalls::dequeue_shared_queue(queue) {}
}

/// A number in shared data (every worker of this Envoy), after adding `add` to it
/// (compare-and-swap, retried when another worker wrote in between); None if it cannot be
/// read or written.
pub fn shared_counter(key: &str, add: u64) -> Option<u64> {
    for _ in 0..100 {
        let (value, cas) = hostcalls::get_shared_data(key).ok()?;
        let n: u64 = value
            .and_then(|v| String::from_utf8(v).ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if add == 0 {
            return Some(n);
        }
        let next = n.saturating_add(add);
        match hostcalls::set_shared_data(key, Some(next.to_string().as_bytes()), cas) {
            Ok(()) => return Some(next),
            Err(Status::CasMismatch) => continue,
            Err(status) => {
                log::warn!("cannot update shared data {key}: {status:?}");
                return None;
            }
        }
    }
    None
}

/// Unix time in nanoseconds, None if the host cannot tell it.
pub fn now_unix_ns() -> Option<u128> {
    let now: SystemTime = hostcalls::get_current_time().ok()?;
    Some(now.duration_since(UNIX_EPOCH).ok()?.as_nanos())
}

/// Makes `ctx` the context the next calls act on; false if it is gone.
pub fn act_on(ctx: u32) -> bool {
    hostcalls::set_effective_context(ctx).is_ok()
}

/// Starts an HTTP call to `cluster`; its token, or why Envoy refused.
pub fn dispatch(
    cluster: &str,
    headers: Vec<(&str, &str)>,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<u32, String> {
    hostcalls::dispatch_http_call(cluster, headers, body, vec![], timeout)
        .map_err(|status| format!("dispatch_http_call to cluster {cluster}: {status:?}"))
}

/// The reply of the HTTP call whose callback runs: its status (None on a timeout or a failed
/// connection, when Envoy sends none) and at most `max` bytes of its body.
pub fn call_reply(body_size: usize, max: usize) -> (Option<u16>, Vec<u8>) {
    let status = hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
        .ok()
        .flatten()
        .and_then(|s| s.parse::<u16>().ok());
    let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size.min(max))
        .ok()
        .flatten()
        .unwrap_or_default();
    (status, body)
}

/// Lets the effective context's request go on.
pub fn resume_request() -> bool {
    hostcalls::resume_http_request().is_ok()
}

#[link(wasm_import_module = "env")]
extern "C" {
    // As the SDK declares it (proxy-wasm 0.2.5 `hostcalls.rs`).
    fn proxy_send_local_response(
        status_code: u32,
        status_code_details_data: *const u8,
        status_code_details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> Status;
}

/// Answers the effective context's request locally: `status`, or for a gRPC request
/// `grpc_status` if given (Envoy then sends a trailers-only gRPC response and maps the HTTP
/// status only without one); false (logged) if Envoy refuses. Made without the SDK's
/// wrappers: `send_http_response` sends no gRPC status, `send_grpc_response` no HTTP status
/// (a request Envoy does not take for gRPC would get a 200), and both panic on an error.
pub fn send_response(
    status: u16,
    grpc_status: Option<u32>,
    headers: Vec<(&str, &str)>,
    body: &[u8],
) -> bool {
    let headers = crate::abi::header_map(&headers);
    // -1: none (Envoy takes only 0 to 16 as a gRPC status).
    let grpc = grpc_status
        .and_then(|s| i32::try_from(s).ok())
        .unwrap_or(-1);
    // SAFETY: each pointer and length describes a slice that lives through the call (no
    // details: a null pointer of length 0, as the SDK passes); Envoy copies what it keeps.
    let result = unsafe {
        proxy_send_local_response(
            u32::from(status),
            std::ptr::null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            grpc,
        )
    };
    match result {
        Status::Ok => true,
        why => {
            log::warn!("cannot send the local {status} reply: {why:?}");
            false
        }
    }
}

/// Every request header of the callback's request (empty, logged, if unreadable).
pub fn request_headers() -> Vec<(String, Vec<u8>)> {
    hostcalls::get_map_bytes(MapType::HttpRequestHeaders).unwrap_or_else(|status| {
        log::warn!("cannot read the request headers: {status:?}");
        Vec::new()
    })
}

/// A response header of the callback's response.
pub fn response_header(name: &str) -> Option<Vec<u8>> {
    hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name)
        .ok()
        .flatten()
}

/// Every response header of the callback's response (empty, logged, if unreadable).
pub fn response_headers() -> Vec<(String, Vec<u8>)> {
    hostcalls::get_map_bytes(MapType::HttpResponseHeaders).unwrap_or_else(|status| {
        log::warn!("cannot read the response headers: {status:?}");
        Vec::new()
    })
}

/// Removes every value of a response header (logged if Envoy refuses).
pub fn remove_response_header(name: &str) {
    if let Err(status) = hostcalls::remove_map_value(MapType::HttpResponseHeaders, name) {
        log::warn!("cannot remove response header {name}: {status:?}");
    }
}

/// Adds a response header (logged if Envoy refuses).
pub fn add_response_header(name: &str, value: &str) {
    if let Err(status) = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value) {
        log::warn!("cannot add response header {name}: {status:?}");
    }
}

/// `len` bytes from `start` of the request body Envoy buffered so far.
pub fn request_body(start: usize, len: usize) -> Vec<u8> {
    hostcalls::get_buffer(BufferType::HttpRequestBody, start, len)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Replaces the `len` bytes from `start` of the buffered request body with `value`; false
/// (logged) if Envoy refuses.
pub fn replace_request_body(start: usize, len: usize, value: &[u8]) -> bool {
    match hostcalls::set_buffer(BufferType::HttpRequestBody, start, len, value) {
        Ok(()) => true,
        Err(status) => {
            log::warn!("cannot replace the request body: {status:?}");
            false
        }
    }
}

/// Removes a request header of the callback's request (logged if Envoy refuses).
pub fn remove_request_header(name: &str) {
    if let Err(status) = hostcalls::remove_map_value(MapType::HttpRequestHeaders, name) {
        log::warn!("cannot remove request header {name}: {status:?}");
    }
}

/// The response body chunk of `len` bytes passing now.
pub fn response_body(len: usize) -> Vec<u8> {
    hostcalls::get_buffer(BufferType::HttpResponseBody, 0, len)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// A property of the stream as text (`source.address`, `xds.route_name`).
pub fn property_text(path: &[&str]) -> Option<String> {
    let bytes = hostcalls::get_property(path.to_vec()).ok().flatten()?;
    String::from_utf8(bytes).ok()
}

/// A property of the stream as the host serializes it (dynamic metadata: a string's bytes,
/// a number or a bool in binary, a list or a struct as pairs); None when absent, empty, or
/// when Envoy cannot serialize it (a null).
pub fn property_bytes(path: &[&str]) -> Option<Vec<u8>> {
    hostcalls::get_property(path.to_vec()).ok().flatten()
}
