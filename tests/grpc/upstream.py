"""A gRPC upstream for tests/tests/grpc.rs, on the official grpcio server.

Run as `upstream.py PORT`; serves on 127.0.0.1:PORT until killed. Methods take and return raw
bytes (generic handlers, no generated code): `/test.Echo/Call` (unary) and
`/test.Guarded/Call` answer the request's bytes, `/test.Echo/Stream` (server streaming)
answers them three times. Exits 1 with "Address already in use" if the port is taken, so the
harness starts it again on another.
"""

import sys
from concurrent import futures

import grpc


def echo(request, context):
    return request


def stream(request, context):
    for _ in range(3):
        yield request


def main():
    port = int(sys.argv[1])
    handlers = grpc.method_handlers_generic_handler("test.Echo", {
        "Call": grpc.unary_unary_rpc_method_handler(echo),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
    })
    guarded = grpc.method_handlers_generic_handler("test.Guarded", {
        "Call": grpc.unary_unary_rpc_method_handler(echo),
    })
    # Without SO_REUSEPORT (grpcio sets it by default): two servers that drew the same port
    # must not share it silently.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handlers, guarded))
    try:
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
    except RuntimeError:
        bound = 0
    if bound != port:
        sys.exit(f"upstream: cannot bind 127.0.0.1:{port}: Address already in use")
    server.start()
    print(f"serving on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
