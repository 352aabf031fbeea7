//! The host calls each kind of request makes, counted through the adapter as shipped: the
//! adapter runs natively over the fake `wasm_host` (`fake_wasm_host.rs`), which records every proxy-wasm ABI
//! call, and the callbacks are driven as Envoy and the SDK's dispatcher drive them. Each host
//! call crosses from the wasm VM into Envoy (and a read also allocates its answer in the
//! module), so these counts are part of what a request costs Envoy's CPU.
//!
//! `cargo test -p ratelimit-filter host_calls -- --nocapture` prints the table.

use std::collections::BTreeMap;
use std::collections::HashMap;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::Action;

use crate::wasm_host::{Envoy, ENVOY};
use crate::{Request, Root};

/// The root context's id; requests get 2, 3, …
const ROOT: u32 = 1;

/// The rule of the bench's `filter-allow-1key`: a token bucket on the API key that never
/// refuses, the shipped bridge and headers.
const ALLOW: &str = r#"{
  "bridge": {"cluster": "webdis", "authority": "webdis", "username": "ratelimit",
             "password": "ratelimit-demo-secret", "timeout": "150ms"},
  "failure_mode": "open", "key_prefix": "rl:", "hash_identities": true,
  "rules": [{"name": "bench-token_bucket", "key": {"from": ["header:x-api-key"]},
             "limits": [{"name": "bench", "algorithm": "token_bucket", "limit": 1000000,
                         "window": "1s", "burst": 1000000000}]}]}"#;

/// The same rule matching no request of the bench (`filter-pass-through`, the floor).
const PASS_THROUGH: &str = r#"{
  "bridge": {"cluster": "webdis", "authority": "webdis", "username": "ratelimit",
             "password": "ratelimit-demo-secret", "timeout": "150ms"},
  "rules": [{"name": "bench-token_bucket", "match": {"path_exact": "/never-requested"},
             "key": {"from": ["header:x-api-key"]},
             "limits": [{"name": "bench", "algorithm": "token_bucket", "limit": 1000000,
                         "window": "1s", "burst": 1000000000}]}]}"#;

/// The host calls of one callback (or of a part of a request's life), by ABI name.
type Calls = BTreeMap<&'static str, u64>;

fn tally(calls: &[&'static str]) -> Calls {
    let mut counted = Calls::new();
    for name in calls {
        *counted.entry(*name).or_default() += 1;
    }
    counted
}

fn total(calls: &Calls) -> u64 {
    calls.values().sum()
}

/// An Envoy worker driving the adapter: its root context and its streams.
struct Worker {
    root: Root,
    streams: HashMap<u32, Request>,
    next_ctx: u32,
}

impl Worker {
    fn start(config: &str) -> Worker {
        ENVOY.with(|e| {
            *e.borrow_mut() = Envoy {
                config: config.as_bytes().to_vec(),
                now_ns: 1_700_000_000_000_000_000,
                ..Envoy::default()
            }
        });
        let mut w = Worker {
            root: Root {
                id: ROOT,
                worker: None,
            },
            streams: HashMap::new(),
            next_ctx: ROOT + 1,
        };
        w.callback(ROOT, |w| assert!(w.root.on_configure(config.len())));
        w
    }

    /// Runs `f` as a callback of context `ctx` (Envoy makes it both the active and the
    /// effective one); the host calls it made.
    fn callback(&mut self, ctx: u32, f: impl FnOnce(&mut Self)) -> Calls {
        ENVOY.with(|e| {
            let mut e = e.borrow_mut();
            e.calls.clear();
            e.active = ctx;
            e.effective = ctx;
            e.now_ns += 10_000;
        });
        f(self);
        let calls = ENVOY.with(|e| std::mem::take(&mut e.borrow_mut().calls));
        tally(&calls)
    }

    /// A GET with `headers` arrives (no body): its context, verdict and host calls.
    fn request(&mut self, path: &str, headers: &[(&str, &str)]) -> (u32, Action, Calls) {
        let ctx = self.next_ctx;
        self.next_ctx += 1;
        let mut all = vec![
            (":method".to_string(), b"GET".to_vec()),
            (":path".to_string(), path.as_bytes().to_vec()),
            (":authority".to_string(), b"127.0.0.1:10000".to_vec()),
            (":scheme".to_string(), b"http".to_vec()),
        ];
        all.extend(
            headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())),
        );
        ENVOY.with(|e| e.borrow_mut().requests.insert(ctx, all));
        // As `create_http_context` makes it (a trait object would link every default
        // method of the SDK's traits, hence every host import).
        let Some(worker) = self.root.worker.clone() else {
            panic!("not configured");
        };
        let mut stream = Request {
            id: ctx,
            worker,
            held: None,
            reading: None,
        };
        let mut action = Action::Continue;
        let calls = self.callback(ctx, |_| {
            action = stream.on_http_request_headers(4 + headers.len(), true);
        });
        self.streams.insert(ctx, stream);
        (ctx, action, calls)
    }

    /// The reply to call `token` arrives with `body`, where the SDK sends it (the context that
    /// made the call), which first makes that context the effective one.
    fn reply(&mut self, token: u32, body: &str) -> Calls {
        let home = ENVOY.with(|e| {
            let mut e = e.borrow_mut();
            e.reply = (Some(200), body.as_bytes().to_vec());
            e.dispatched
                .iter()
                .find(|(t, _, _)| *t == token)
                .map(|(_, ctx, _)| *ctx)
        });
        let Some(home) = home else {
            panic!("no call {token}");
        };
        let size = body.len();
        self.callback(home, |w| {
            // The SDK's dispatcher (proxy-wasm 0.2.5 `on_http_call_response`).
            ENVOY.with(|e| e.borrow_mut().calls.push("proxy_set_effective_context"));
            if home == ROOT {
                w.root.on_http_call_response(token, 1, size, 0);
            } else if let Some(stream) = w.streams.get_mut(&home) {
                stream.on_http_call_response(token, 1, size, 0);
            }
        })
    }

    /// The root's wake-up queue is ready.
    fn wakeup(&mut self) -> Calls {
        self.callback(ROOT, |w| w.root.on_queue_ready(1))
    }

    /// The response headers of `ctx` pass (a whole response, no body), then the stream ends
    /// (`on_log`, then the context is deleted).
    fn respond_and_end(&mut self, ctx: u32) -> (Calls, Calls) {
        let headers = self.callback(ctx, |w| {
            if let Some(s) = w.streams.get_mut(&ctx) {
                let _ = s.on_http_response_headers(3, true);
            }
        });
        let end = self.callback(ctx, |w| {
            if let Some(mut s) = w.streams.remove(&ctx) {
                s.on_log();
                drop(s);
            }
        });
        (headers, end)
    }

    fn last_token(&self) -> u32 {
        ENVOY.with(|e| e.borrow().dispatched.last().map_or(0, |d| d.0))
    }

    fn added(&self, ctx: u32) -> usize {
        ENVOY.with(|e| e.borrow().added.get(&ctx).map_or(0, Vec::len))
    }
}

/// One request's part of a decision reply: allowed with `left`, or refused.
fn reply_of(n: usize, allowed: bool) -> String {
    let one = if allowed {
        r#"1,1,1,"999999","1","0""#
    } else {
        r#"0,1,0,"0","1000","1000""#
    };
    let mut items = vec![n.to_string()];
    items.extend(std::iter::repeat_n(one.to_string(), n));
    format!(r#"{{"EVALSHA":[{}]}}"#, items.join(","))
}

/// What a decided request of a batch of `n` costs: each request's own callbacks, and the
/// reply callback of the batch's call (every request of it resumed or answered there).
struct Batch {
    request: Calls,
    response: Calls,
    end: Calls,
    reply: Calls,
}

/// A worker busy with a lone request's call, `n` requests arriving meanwhile (so they wait
/// and go together in one call from the root), then that call's reply, with a request waiting
/// for the next call (as under load).
fn batch(n: usize, allowed: bool) -> Batch {
    let mut w = Worker::start(ALLOW);
    let key = [("x-api-key", "bench-client")];
    let (first, verdict, _) = w.request("/", &key);
    assert_eq!(verdict, Action::Pause);
    let mut waiting = Vec::new();
    let mut requests = Vec::new();
    for _ in 0..n {
        let (ctx, verdict, calls) = w.request("/", &key);
        assert_eq!(verdict, Action::Pause, "a call is out: it waits");
        waiting.push(ctx);
        requests.push(calls);
    }
    assert!(requests.windows(2).all(|p| p[0] == p[1]), "{requests:?}");
    // The lone call's reply (to the first request's context) wakes the root, which sends the
    // batch.
    let lone = w.last_token();
    w.reply(lone, &reply_of(1, true));
    w.wakeup();
    let token = w.last_token();
    assert_ne!(token, lone, "the batch went in a call of its own");
    // Under load the next requests wait meanwhile: the reply's callback sends their call
    // (another key's, which the deny cache cannot answer when this batch is refused).
    let _ = w.request("/", &[("x-api-key", "another-client")]);
    let reply = w.reply(token, &reply_of(n, allowed));
    assert_ne!(
        w.last_token(),
        token,
        "the next call went from the reply's callback"
    );
    let (outcomes, resumed) = ENVOY.with(|e| {
        let e = e.borrow();
        let answered: Vec<u32> = e.answered.iter().map(|a| a.0).collect();
        (answered, e.resumed.clone())
    });
    if allowed {
        assert!(waiting.iter().all(|c| resumed.contains(c)), "{resumed:?}");
    } else {
        assert_eq!(outcomes, waiting, "each refused with a local reply");
    }
    let (response, end) = w.respond_and_end(waiting[0]);
    if allowed {
        assert_eq!(
            w.added(waiting[0]),
            3,
            "X-RateLimit-Limit, -Remaining, -Reset"
        );
    }
    let _ = w.respond_and_end(first);
    Batch {
        request: requests.swap_remove(0),
        response,
        end,
        reply,
    }
}

/// The reply callback of a batch of `n`, split into what each request adds and what the call
/// costs whatever its size (solved from two batch sizes).
fn per_request_and_per_call(allowed: bool) -> (Batch, Calls, Calls) {
    let (small, large) = (7, 15);
    let a = batch(small, allowed);
    let b = batch(large, allowed);
    let names: Vec<&'static str> = a.reply.keys().chain(b.reply.keys()).copied().collect();
    let mut each = Calls::new();
    let mut fixed = Calls::new();
    for name in names {
        let (x, y) = (
            a.reply.get(name).copied().unwrap_or(0),
            b.reply.get(name).copied().unwrap_or(0),
        );
        let per = (y - x) / (large - small) as u64;
        assert_eq!(x, per * small as u64 + (y - per * large as u64), "{name}");
        if per > 0 {
            each.insert(name, per);
        }
        if y > per * large as u64 {
            fixed.insert(name, y - per * large as u64);
        }
    }
    (b, each, fixed)
}

fn show(what: &str, calls: &Calls) {
    let parts: Vec<String> = calls.iter().map(|(n, c)| format!("{n} ×{c}")).collect();
    println!("{what}: {} ({})", total(calls), parts.join(", "));
}

#[test]
fn a_request_no_rule_matches_reads_its_headers_once() {
    let mut w = Worker::start(PASS_THROUGH);
    let (ctx, verdict, request) = w.request("/", &[("x-api-key", "bench-client")]);
    assert_eq!(verdict, Action::Continue);
    let (response, end) = w.respond_and_end(ctx);
    show("floor: request headers", &request);
    assert_eq!(request, tally(&["proxy_get_header_map_pairs"]));
    assert_eq!(total(&response) + total(&end), 0);
}

#[test]
fn a_batched_allowed_request() {
    let (b, each, fixed) = per_request_and_per_call(true);
    show("allowed: request headers", &b.request);
    show("allowed: its part of the batch's reply callback", &each);
    show("allowed: response headers", &b.response);
    show("allowed: end of stream", &b.end);
    show(
        "a batch's call (its reply callback, whatever its size)",
        &fixed,
    );
    assert_eq!(
        b.request,
        tally(&[
            "proxy_get_header_map_pairs",
            "proxy_get_current_time_nanoseconds",
        ])
    );
    assert_eq!(
        each,
        tally(&[
            "proxy_set_effective_context",
            "proxy_continue_stream",
            "proxy_record_metric",
        ])
    );
    assert_eq!(
        b.response,
        tally(&[
            "proxy_get_header_map_pairs",
            "proxy_add_header_map_value",
            "proxy_add_header_map_value",
            "proxy_add_header_map_value",
        ])
    );
    assert_eq!(total(&b.end), 0);
    assert_eq!(
        fixed,
        tally(&[
            // The SDK's, then the reply's status and body.
            "proxy_set_effective_context",
            "proxy_get_header_map_value",
            "proxy_get_buffer_bytes",
            "proxy_get_current_time_nanoseconds",
            // The batch's allowed count and its rule's; the next batch's call and its stats.
            "proxy_increment_metric",
            "proxy_increment_metric",
            "proxy_get_current_time_nanoseconds",
            "proxy_increment_metric",
            "proxy_record_metric",
            "proxy_set_effective_context",
            "proxy_http_call",
        ])
    );
}

#[test]
fn a_batched_refused_request() {
    let (b, each, _) = per_request_and_per_call(false);
    show("refused: request headers", &b.request);
    show("refused: its part of the batch's reply callback", &each);
    show("refused: response headers (its 429)", &b.response);
    assert_eq!(
        each,
        tally(&[
            "proxy_set_effective_context",
            "proxy_send_local_response",
            "proxy_record_metric",
        ])
    );
    assert_eq!(total(&b.response) + total(&b.end), 0);
}

#[test]
fn a_refusal_from_the_deny_cache() {
    let mut w = Worker::start(ALLOW);
    let key = [("x-api-key", "bench-client")];
    let (_, _, _) = w.request("/", &key);
    let token = w.last_token();
    w.reply(token, &reply_of(1, false));
    let (ctx, verdict, request) = w.request("/", &key);
    assert_eq!(verdict, Action::Pause);
    assert_eq!(
        ENVOY.with(|e| e.borrow().answered.last().copied()),
        Some((ctx, 429))
    );
    let (response, end) = w.respond_and_end(ctx);
    show("deny-cache 429: request headers", &request);
    assert_eq!(
        request,
        tally(&[
            "proxy_get_header_map_pairs",
            "proxy_get_current_time_nanoseconds",
            "proxy_send_local_response",
        ])
    );
    assert_eq!(total(&response) + total(&end), 0);
}

/// The rule of `filter-allow-1key-leased`: the same bucket with a lease.
const LEASED: &str = r#"{
  "bridge": {"cluster": "webdis", "authority": "webdis", "username": "ratelimit",
             "password": "ratelimit-demo-secret", "timeout": "150ms", "clock_skew": "10ms"},
  "rules": [{"name": "bench-token_bucket-leased", "key": {"from": ["header:x-api-key"]},
             "limits": [{"name": "bench", "algorithm": "token_bucket", "limit": 1,
                         "window": "1s", "burst": 10000000,
                         "lease": {"max_units": 100, "fraction": 0.1, "max_ms": 1000}}]}]}"#;

#[test]
fn a_request_served_from_a_lease() {
    let mut w = Worker::start(LEASED);
    let key = [("x-api-key", "bench-client")];
    // Plain decisions until the key earns a lease, then the call that asks for one.
    let mut asked = false;
    for _ in 0..10 {
        let (ctx, _, _) = w.request("/", &key);
        let token = w.last_token();
        let leasing = ENVOY.with(|e| {
            e.borrow()
                .dispatched
                .last()
                .is_some_and(|d| d.2.contains("~lease~"))
        });
        // Granted 4 requests' worth (this one and 3 held), whole again in 30 s.
        let body = if leasing {
            r#"{"EVALSHA":[1,4,1,1,"9000000","30000","0"]}"#.to_string()
        } else {
            reply_of(1, true)
        };
        w.reply(token, &body);
        let _ = w.respond_and_end(ctx);
        if leasing {
            asked = true;
            break;
        }
    }
    assert!(asked, "the key earned a lease");
    let calls = ENVOY.with(|e| e.borrow().dispatched.len());
    let (ctx, verdict, request) = w.request("/", &key);
    assert_eq!(verdict, Action::Continue, "allowed from the lease at once");
    let (response, end) = w.respond_and_end(ctx);
    assert_eq!(
        ENVOY.with(|e| e.borrow().dispatched.len()),
        calls,
        "no call"
    );
    show("lease hit: request headers", &request);
    show("lease hit: response headers", &response);
    assert_eq!(
        request,
        tally(&[
            "proxy_get_header_map_pairs",
            "proxy_get_current_time_nanoseconds",
        ])
    );
    assert_eq!(
        response,
        tally(&[
            "proxy_get_header_map_pairs",
            "proxy_add_header_map_value",
            "proxy_add_header_map_value",
            "proxy_add_header_map_value",
        ])
    );
    assert_eq!(total(&end), 0);
}

/// A gRPC request is refused in gRPC (a status for Envoy's trailers-only answer, the wait as
/// metadata) with the host calls of an HTTP refusal: its content type is read from the
/// headers already fetched.
#[test]
fn a_grpc_request_is_refused_in_grpc_at_the_cost_of_an_http_one() {
    let mut w = Worker::start(ALLOW);
    let grpc = [
        ("x-api-key", "bench-client"),
        ("content-type", "application/grpc"),
    ];
    // Refused by a bridge reply (1 s to wait), then from the deny cache.
    let (first, _, _) = w.request("/pkg.Service/Call", &grpc);
    let token = w.last_token();
    w.reply(token, &reply_of(1, false));
    let (cached, verdict, request) = w.request("/pkg.Service/Call", &grpc);
    assert_eq!(verdict, Action::Pause);
    assert_eq!(
        request,
        tally(&[
            "proxy_get_header_map_pairs",
            "proxy_get_current_time_nanoseconds",
            "proxy_send_local_response",
        ])
    );
    let replies = ENVOY.with(|e| e.borrow().local_replies.clone());
    assert_eq!(replies.len(), 2);
    for (reply, ctx) in replies.iter().zip([first, cached]) {
        assert_eq!(reply.ctx, ctx);
        assert_eq!((reply.status, reply.grpc_status), (429, Some(8)));
        assert_eq!(reply.body, "rate limit exceeded");
        let header = |name: &str| {
            reply
                .headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(header("grpc-retry-pushback-ms"), Some("1000"), "{reply:?}");
        assert!(header("grpc-status-details-bin").is_some_and(|v| !v.is_empty()));
        assert_eq!(header("x-ratelimit-remaining"), Some("0"));
        assert_eq!(header("retry-after"), None);
    }
    // An HTTP request of the same key is still answered in HTTP.
    let (http, _, _) = w.request("/", &[("x-api-key", "bench-client")]);
    let last = ENVOY.with(|e| e.borrow().local_replies.last().cloned());
    let Some(last) = last else {
        panic!("no reply");
    };
    assert_eq!((last.ctx, last.status, last.grpc_status), (http, 429, None));
    assert!(last
        .headers
        .iter()
        .any(|(n, v)| n == "retry-after" && v == "1"));
}

/// Plans from a verified claim, keyed on the verified subject, as the jwt_authn recipe.
const JWT_PLANS: &str = r#"{
  "bridge": {"cluster": "webdis", "authority": "webdis", "username": "ratelimit",
             "password": "ratelimit-demo-secret", "timeout": "150ms"},
  "rules": [{"name": "api",
             "key": {"from": ["metadata:envoy.filters.http.jwt_authn:jwt_payload:sub", "client_ip"]},
             "plan_from": "metadata:envoy.filters.http.jwt_authn:jwt_payload:plan",
             "plans": [
               {"name": "pro", "values": ["pro"], "limits": [{"name": "l", "limit": 20, "window": "1m"}]},
               {"name": "free", "values": ["free"], "limits": [{"name": "l", "limit": 5, "window": "1m"}]},
               {"name": "other", "default": true, "limits": [{"name": "l", "limit": 2, "window": "1m"}]}]}]}"#;

#[test]
fn a_request_keyed_and_planned_by_claims_reads_each_claim_once() {
    let mut w = Worker::start(JWT_PLANS);
    ENVOY.with(|e| {
        let mut e = e.borrow_mut();
        let claim = |name: &str| {
            format!("metadata.filter_metadata.envoy.filters.http.jwt_authn.jwt_payload.{name}")
        };
        e.properties.insert(claim("sub"), b"alice".to_vec());
        e.properties.insert(claim("plan"), b"free".to_vec());
    });
    let (_, verdict, calls) = w.request("/", &[]);
    assert_eq!(verdict, Action::Pause);
    show("a request keyed and planned by claims", &calls);
    // The plan's claim is read once for all three plans, the subject once.
    assert_eq!(calls.get("proxy_get_property"), Some(&2), "{calls:?}");
    let path = ENVOY.with(|e| e.borrow().dispatched.last().map(|d| d.2.clone()));
    let path = path.unwrap_or_default();
    assert!(
        path.contains("jwt_authn%3Ajwt_payload%3Asub%3A"),
        "keyed on the claim: {path}"
    );
    assert!(
        path.contains("/token_bucket~5~60000~"),
        "the free plan's numbers: {path}"
    );
}

/// An upstream that sends its own `x-ratelimit-*` headers: the client gets one value of each,
/// from the side with fewer left, and the filter's replace the upstream's with a remove each.
#[test]
fn the_upstreams_own_rate_limit_headers_are_replaced_or_kept_whole() {
    let upstream = |remaining: &str| {
        vec![
            ("x-ratelimit-limit".to_string(), b"10".to_vec()),
            (
                "x-ratelimit-remaining".to_string(),
                remaining.as_bytes().to_vec(),
            ),
            ("x-ratelimit-reset".to_string(), b"30".to_vec()),
        ]
    };
    for (theirs, ours_shown) in [("5", false), ("99999999999", true)] {
        let mut w = Worker::start(ALLOW);
        let (ctx, verdict, _) = w.request("/", &[("x-api-key", "bench-client")]);
        assert_eq!(verdict, Action::Pause);
        let token = w.last_token();
        w.reply(token, &reply_of(1, true));
        ENVOY.with(|e| e.borrow_mut().upstream.insert(ctx, upstream(theirs)));
        let (response, _) = w.respond_and_end(ctx);
        let (added, left) = ENVOY.with(|e| {
            let e = e.borrow();
            let added: Vec<String> = e
                .added
                .get(&ctx)
                .into_iter()
                .flatten()
                .map(|(n, _)| n.clone())
                .collect();
            (added, e.upstream.get(&ctx).map_or(0, Vec::len))
        });
        if ours_shown {
            assert_eq!(
                added,
                [
                    "x-ratelimit-limit",
                    "x-ratelimit-remaining",
                    "x-ratelimit-reset"
                ]
            );
            assert_eq!(left, 0, "the upstream's three removed");
            let mut calls = vec!["proxy_get_header_map_pairs"];
            calls.extend(
                [
                    "proxy_remove_header_map_value",
                    "proxy_add_header_map_value",
                ]
                .repeat(3),
            );
            assert_eq!(response, tally(&calls));
        } else {
            assert!(
                added.is_empty(),
                "the upstream's tighter limit stands: {added:?}"
            );
            assert_eq!(left, 3);
            assert_eq!(response, tally(&["proxy_get_header_map_pairs"]));
        }
    }
}
