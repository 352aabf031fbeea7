//! gRPC clients answered in gRPC, with the official gRPC Python client and server (grpcio and
//! grpcio-status, installed into .venv by `make setup-grpc`): real Envoy, Webdis and Redis in
//! front of a gRPC upstream (`e2e::grpc`). The client's side is tests/grpc/client_check.py.

use e2e::grpc::{python, upstream_edits, GrpcUpstream};
use e2e::python::run_script;
use e2e::{Envoy, Redis, Webdis, WorkDir};

/// 2 calls per 2 s per `x-api-key` on `/test.Echo/`, a call costing `x-cost` (1 to 10);
/// `/test.Guarded/` fails closed.
const FILTER: &str = r#"{
  "bridge": {"cluster": "webdis", "authority": "webdis", "username": "ratelimit",
             "password": "ratelimit-demo-secret", "timeout": "150ms"},
  "rules": [
    {"name": "calls", "match": {"path_prefix": "/test.Echo/"},
     "key": {"from": ["header:x-api-key"]},
     "cost": {"header": "x-cost", "min": 1, "max": 10},
     "limits": [{"name": "per_2s", "limit": 2, "window": "2s"}]},
    {"name": "guarded", "match": {"path_prefix": "/test.Guarded/"},
     "key": {"from": ["header:x-api-key"]}, "failure_mode": "closed",
     "limits": [{"name": "per_2s", "limit": 100, "window": "2s"}]}]
}"#;

/// Runs client_check.py's `phase` against `envoy`; its output.
fn client_check(envoy: &Envoy, phase: &str) -> String {
    let args = [
        envoy.port.to_string(),
        envoy.admin_port.to_string(),
        phase.to_string(),
    ];
    let text = run_script(&python(), "tests/grpc/client_check.py", &args);
    println!("{text}");
    text
}

#[test]
fn grpc_calls_over_the_limit_get_resource_exhausted_and_an_outage_unavailable() {
    let dir = WorkDir::new("grpc");
    let redis = Redis::start(&dir);
    let mut webdis = Webdis::start(&dir, redis.port);
    let upstream = GrpcUpstream::start(&dir);
    let owned = upstream_edits(FILTER, upstream.port);
    let edits: Vec<(&str, &str)> = owned
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let envoy = Envoy::start(&dir, webdis.port, &edits);

    let text = client_check(&envoy, "limits");
    let served: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("served "))
        .and_then(|n| n.trim().parse().ok())
        .expect("client_check prints `served N`");
    // Refused calls reached no upstream; the filter refused one attempt each of the unary, the
    // streaming, the two retry-policy calls and the one that never fits.
    envoy.wait_stat("cluster.upstream.upstream_rq_total", served);
    envoy.wait_counter("ratelimit_rule.calls.per_2s.denied", 5);
    envoy.wait_counter("ratelimit_rule.calls.per_2s.never_fits", 1);
    envoy.wait_counter("ratelimit_bad_requests", 1);

    // Webdis down: the guarded route fails closed, once alone and five times under a retry
    // policy on UNAVAILABLE.
    webdis.process.stop();
    client_check(&envoy, "outage");
    envoy.wait_counter("ratelimit_rule.guarded.per_2s.failed_closed", 6);
    envoy.wait_stat("cluster.upstream.upstream_rq_total", served);
    drop(upstream);
}
