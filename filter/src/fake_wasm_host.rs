//! The adapter's tests' stand-in for [`crate::wasm_host`]: the same functions, each recording
//! the proxy-wasm ABI call(s) the real one makes (`proxy_…`, as the SDK 0.2.5 makes them) and
//! answering from a fake Envoy the test drives. So a test counts exactly the host calls each
//! kind of request makes through the adapter as shipped.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use proxy_wasm::types::MetricType;

/// What the fake Envoy holds and what it was asked.
#[derive(Default)]
pub struct Envoy {
    /// Every ABI call made, in order.
    pub calls: Vec<&'static str>,
    pub config: Vec<u8>,
    pub now_ns: u128,
    /// The context whose callback runs (the SDK's `active_id`) and the one host calls act on.
    pub active: u32,
    pub effective: u32,
    /// Request headers by context.
    pub requests: HashMap<u32, Vec<(String, Vec<u8>)>>,
    /// Response headers added, by context.
    pub added: HashMap<u32, Vec<(String, String)>>,
    /// The upstream's own response headers, by context (what is left of them).
    pub upstream: HashMap<u32, Vec<(String, Vec<u8>)>>,
    /// Calls dispatched: token, the context the SDK maps the reply to, the path.
    pub dispatched: Vec<(u32, u32, String)>,
    /// The reply of the call whose callback runs.
    pub reply: (Option<u16>, Vec<u8>),
    pub resumed: Vec<u32>,
    pub answered: Vec<(u32, u16)>,
    /// Every local reply as the adapter sent it.
    pub local_replies: Vec<LocalReply>,
    /// Messages in the wake-up queue.
    pub queued: usize,
    pub metrics: Vec<(MetricType, String)>,
    pub counters: HashMap<u32, i64>,
    /// Properties beside `source.address`, by their path joined with `.`.
    pub properties: HashMap<String, Vec<u8>>,
}

/// A local reply: `proxy_send_local_response`'s arguments (the details left empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub ctx: u32,
    pub status: u16,
    pub grpc_status: Option<u32>,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

thread_local! {
    pub static ENVOY: RefCell<Envoy> = RefCell::new(Envoy::default());
}

fn with<R>(f: impl FnOnce(&mut Envoy) -> R) -> R {
    ENVOY.with(|e| f(&mut e.borrow_mut()))
}

fn call(name: &'static str) {
    with(|e| e.calls.push(name));
}

pub fn plugin_configuration() -> Vec<u8> {
    call("proxy_get_buffer_bytes");
    with(|e| e.config.clone())
}

pub fn define_metric(kind: MetricType, name: &str) -> Option<u32> {
    call("proxy_define_metric");
    with(|e| {
        e.metrics.push((kind, name.to_string()));
        u32::try_from(e.metrics.len()).ok()
    })
}

pub fn increment_metric(id: u32, delta: i64) {
    call("proxy_increment_metric");
    with(|e| *e.counters.entry(id).or_default() += delta);
}

pub fn record_metric(_id: u32, _value: u64) {
    call("proxy_record_metric");
}

pub fn set_tick_period(_period: Duration) -> bool {
    call("proxy_set_tick_period_milliseconds");
    true
}

pub fn register_queue(_name: &str) -> Option<u32> {
    call("proxy_register_shared_queue");
    Some(1)
}

pub fn enqueue(_queue: u32) -> bool {
    call("proxy_enqueue_shared_queue");
    with(|e| e.queued += 1);
    true
}

pub fn drain_queue(_queue: u32) {
    // One dequeue per message, and the one that finds the queue empty.
    let messages = with(|e| std::mem::take(&mut e.queued));
    for _ in 0..=messages {
        call("proxy_dequeue_shared_queue");
    }
}

pub fn shared_counter(_key: &str, add: u64) -> Option<u64> {
    call("proxy_get_shared_data");
    if add > 0 {
        call("proxy_set_shared_data");
    }
    Some(add)
}

pub fn now_unix_ns() -> Option<u128> {
    call("proxy_get_current_time_nanoseconds");
    Some(with(|e| e.now_ns))
}

pub fn act_on(ctx: u32) -> bool {
    call("proxy_set_effective_context");
    with(|e| e.effective = ctx);
    true
}

pub fn dispatch(
    _cluster: &str,
    headers: Vec<(&str, &str)>,
    _body: Option<&[u8]>,
    _timeout: Duration,
) -> Result<u32, String> {
    call("proxy_http_call");
    let path = headers
        .iter()
        .find(|(n, _)| *n == ":path")
        .map(|(_, v)| v.to_string())
        .unwrap_or_default();
    Ok(with(|e| {
        let token = u32::try_from(e.dispatched.len() + 1).unwrap_or(u32::MAX);
        // The SDK maps the reply to the context whose callback made the call.
        e.dispatched.push((token, e.active, path));
        token
    }))
}

pub fn call_reply(_body_size: usize, _max: usize) -> (Option<u16>, Vec<u8>) {
    call("proxy_get_header_map_value");
    call("proxy_get_buffer_bytes");
    with(|e| e.reply.clone())
}

pub fn resume_request() -> bool {
    call("proxy_continue_stream");
    with(|e| {
        let ctx = e.effective;
        e.resumed.push(ctx);
    });
    true
}

pub fn send_response(
    status: u16,
    grpc_status: Option<u32>,
    headers: Vec<(&str, &str)>,
    body: &[u8],
) -> bool {
    call("proxy_send_local_response");
    // The headers as Envoy reads them from the bytes the real call hands over.
    let headers = crate::abi::read_header_map(&crate::abi::header_map(&headers));
    with(|e| {
        let ctx = e.effective;
        e.answered.push((ctx, status));
        e.local_replies.push(LocalReply {
            ctx,
            status,
            grpc_status,
            headers: headers.unwrap_or_default(),
            body: String::from_utf8_lossy(body).into_owned(),
        });
    });
    true
}

pub fn request_headers() -> Vec<(String, Vec<u8>)> {
    call("proxy_get_header_map_pairs");
    with(|e| e.requests.get(&e.effective).cloned().unwrap_or_default())
}

pub fn response_headers() -> Vec<(String, Vec<u8>)> {
    call("proxy_get_header_map_pairs");
    with(|e| {
        let ctx = e.effective;
        e.upstream.get(&ctx).cloned().unwrap_or_default()
    })
}

pub fn remove_response_header(name: &str) {
    call("proxy_remove_header_map_value");
    with(|e| {
        let ctx = e.effective;
        if let Some(headers) = e.upstream.get_mut(&ctx) {
            headers.retain(|(n, _)| n != name);
        }
    });
}

pub fn response_header(_name: &str) -> Option<Vec<u8>> {
    call("proxy_get_header_map_value");
    None
}

pub fn add_response_header(name: &str, value: &str) {
    call("proxy_add_header_map_value");
    with(|e| {
        let ctx = e.effective;
        e.added
            .entry(ctx)
            .or_default()
            .push((name.to_string(), value.to_string()));
    });
}

pub fn request_body(_start: usize, _len: usize) -> Vec<u8> {
    call("proxy_get_buffer_bytes");
    Vec::new()
}

pub fn replace_request_body(_start: usize, _len: usize, _value: &[u8]) -> bool {
    call("proxy_set_buffer_bytes");
    true
}

pub fn remove_request_header(_name: &str) {
    call("proxy_remove_header_map_value");
}

pub fn response_body(_len: usize) -> Vec<u8> {
    call("proxy_get_buffer_bytes");
    Vec::new()
}

pub fn property_text(path: &[&str]) -> Option<String> {
    call("proxy_get_property");
    (path == ["source", "address"]).then(|| "203.0.113.7:40000".to_string())
}

pub fn property_bytes(path: &[&str]) -> Option<Vec<u8>> {
    call("proxy_get_property");
    with(|e| e.properties.get(&path.join(".")).cloned())
}
