//! A gRPC upstream for the tests: tests/grpc/upstream.py on the official grpcio server (in
//! .venv, installed by `make setup-grpc`), on a free loopback port until dropped, and the
//! shipped envoy.yaml edited to route to it over HTTP/2.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::procs::{filter_config_edit, Process, WorkDir, PORT_ATTEMPTS};
use crate::{free_port, root, wait_for};

/// The Python of .venv, once it can import grpcio and grpcio-status.
pub fn python() -> PathBuf {
    crate::python::venv_python("grpc, grpc_status", "setup-grpc")
}

/// tests/grpc/upstream.py on 127.0.0.1:`port`, stopped (by PID) when dropped.
pub struct GrpcUpstream {
    pub port: u16,
    pub process: Process,
}

impl GrpcUpstream {
    /// Starts the upstream on a free port (another one if a process took it first) and waits
    /// until it holds its listening socket.
    pub fn start(dir: &WorkDir) -> GrpcUpstream {
        let python = python();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            let mut process = Process::spawn(
                "grpc upstream",
                Command::new(&python)
                    .arg(root().join("tests/grpc/upstream.py"))
                    .arg(port.to_string()),
                dir.file(&format!("grpc-upstream-{port}.log")),
            );
            let listening = wait_for(
                "the gRPC upstream to listen",
                Duration::from_secs(60),
                || {
                    if process.exited().is_some() {
                        return Some(false);
                    }
                    process.listens_on(port).then_some(true)
                },
            );
            if listening {
                return GrpcUpstream { port, process };
            }
            if !process.log_text().contains("Address already in use") {
                process.fail_exited();
            }
        }
        panic!("the gRPC upstream found no free port in {PORT_ATTEMPTS} attempts");
    }
}

/// Edits of the shipped envoy.yaml: `filter_json` as the filter's configuration, every request
/// routed to a cluster `upstream` on 127.0.0.1:`upstream_port` that speaks HTTP/2 (gRPC). The
/// listener's codec (AUTO) takes the clients' HTTP/2 without TLS.
pub fn upstream_edits(filter_json: &str, upstream_port: u16) -> Vec<(String, String)> {
    let (from, to) = filter_config_edit(filter_json);
    let route = (
        "                direct_response:\n                  status: 200\n                  body: { inline_string: \"hello from behind the rate limiter\\n\" }\n".to_string(),
        "                route: { cluster: upstream, timeout: 30s }\n".to_string(),
    );
    let cluster = format!(
        "  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {{}}
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{ address: 127.0.0.1, port_value: {upstream_port} }}
"
    );
    vec![(from, to), route, ("  clusters:\n".to_string(), cluster)]
}
