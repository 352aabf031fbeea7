"""The official gRPC Python client (grpcio) against Envoy with the filter in front of a gRPC
upstream (tests/grpc/upstream.py).

Run by tests/tests/grpc.rs as `client_check.py ENVOY_PORT ADMIN_PORT PHASE`:

- `limits`: each key (metadata `x-api-key`) gets 2 calls per 2 s on `/test.Echo/*`, a call
  costing `x-cost`. Over the limit, unary and server-streaming calls get RESOURCE_EXHAUSTED
  with the limit's values as metadata and the wait as `grpc-retry-pushback-ms` and a
  `google.rpc.RetryInfo` (read with grpcio-status), and a call after that wait passes; a retry
  policy on UNAVAILABLE does not retry it, one on RESOURCE_EXHAUSTED waits the pushback and
  its retry passes; a call that never fits is told not to retry; a bad cost is
  INVALID_ARGUMENT. Prints `served N`, the calls that reached the upstream.
- `outage` (the bridge is down, `/test.Guarded/*` fails closed): UNAVAILABLE saying the
  limiter is unavailable, which a retry policy on UNAVAILABLE retries.

Attempts are counted with Envoy's `http.ingress.downstream_rq_total`, read from the admin
port once a call has returned (every attempt of a call is made before it returns).
"""

import json
import sys
import time
import urllib.request

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

TARGET = f"127.0.0.1:{sys.argv[1]}"
ADMIN = sys.argv[2]
PHASE = sys.argv[3]
ATTEMPTS = "http.ingress.downstream_rq_total"


def check(condition, what):
    if not condition:
        sys.exit(f"client_check: {what}")


def stat(name):
    url = f"http://127.0.0.1:{ADMIN}/stats?filter=^{name}$"
    with urllib.request.urlopen(url, timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(f"{name}: "):
                return int(line.split(": ", 1)[1])
    return 0


def channel(retry_on=()):
    """A channel to Envoy; with a retry policy (5 attempts) on the status codes `retry_on`."""
    options = [("grpc.enable_retries", 1)]
    if retry_on:
        policy = {
            "maxAttempts": 5,
            "initialBackoff": "0.05s",
            "maxBackoff": "0.2s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": list(retry_on),
        }
        config = {"methodConfig": [{"name": [{}], "retryPolicy": policy}]}
        options.append(("grpc.service_config", json.dumps(config)))
    return grpc.insecure_channel(TARGET, options=options)


served = 0


def unary(ch, key, cost=None, method="/test.Echo/Call"):
    global served
    metadata = [("x-api-key", key)]
    if cost is not None:
        metadata.append(("x-cost", cost))
    answer = ch.unary_unary(method)(b"hello", metadata=metadata, timeout=20)
    check(answer == b"hello", f"{method} answered {answer!r}")
    served += 1


def streamed(ch, key):
    global served
    answers = list(ch.unary_stream("/test.Echo/Stream")(b"hi", metadata=[("x-api-key", key)], timeout=20))
    check(answers == [b"hi"] * 3, f"the stream answered {answers!r}")
    served += 1


def refused(call, code):
    """The error of `call`, which must fail with `code`."""
    try:
        call()
    except grpc.RpcError as error:
        check(error.code() == code, f"{error.code()} ({error.details()!r}), want {code}")
        return error
    sys.exit(f"client_check: a call was allowed, want {code}")


def metadata(error):
    """The refusal's metadata: Envoy answers in a trailers-only response, read as trailers."""
    return dict(error.trailing_metadata() or ())


def retry_delay_ms(error):
    """The RetryInfo delay in ms, or None without one. grpcio-status checks that the Status in
    grpc-status-details-bin has the call's own code and message."""
    status = rpc_status.from_call(error)
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.seconds * 1000 + info.retry_delay.nanos // 1_000_000
    return None


def over_limit(call):
    """`call` is refused by the 2-per-2 s limit: RESOURCE_EXHAUSTED with the wait; the wait."""
    error = refused(call, grpc.StatusCode.RESOURCE_EXHAUSTED)
    check(error.details() == "rate limit exceeded", f"message {error.details()!r}")
    md = metadata(error)
    check(md.get("x-ratelimit-limit") == "2", f"x-ratelimit-limit {md.get('x-ratelimit-limit')!r}")
    check(md.get("x-ratelimit-remaining") == "0", f"x-ratelimit-remaining {md.get('x-ratelimit-remaining')!r}")
    pushback = int(md.get("grpc-retry-pushback-ms", "0"))
    check(0 < pushback <= 1000, f"grpc-retry-pushback-ms {md.get('grpc-retry-pushback-ms')!r}")
    delay = retry_delay_ms(error)
    check(delay == pushback, f"RetryInfo delay {delay} ms, pushback {pushback} ms")
    return delay


def limits():
    ch = channel()
    # The first call after Redis starts loads the decision script.
    unary(ch, "warm-up")
    unary(ch, "guarded", method="/test.Guarded/Call")

    # Unary calls: refused in gRPC, and a call after the RetryInfo delay passes.
    unary(ch, "unary")
    unary(ch, "unary")
    delay = over_limit(lambda: unary(ch, "unary"))
    time.sleep(delay / 1000)
    unary(ch, "unary")
    print(f"unary: RESOURCE_EXHAUSTED with a RetryInfo delay of {delay} ms; the call after it passed")

    # Server streaming: the same, raised as the stream is read.
    streamed(ch, "stream")
    streamed(ch, "stream")
    delay = over_limit(lambda: streamed(ch, "stream"))
    print(f"server streaming: RESOURCE_EXHAUSTED with a RetryInfo delay of {delay} ms")

    # A retry policy on UNAVAILABLE leaves RESOURCE_EXHAUSTED alone: one attempt.
    retrying = channel(["UNAVAILABLE"])
    unary(retrying, "retry")
    unary(retrying, "retry")
    before = stat(ATTEMPTS)
    over_limit(lambda: unary(retrying, "retry"))
    attempts = stat(ATTEMPTS) - before
    check(attempts == 1, f"a retry policy on UNAVAILABLE made {attempts} attempts of a refused call")
    print("retry policy on UNAVAILABLE: 1 attempt")

    # A retry policy on RESOURCE_EXHAUSTED waits the pushback, and its retry passes.
    # Its own backoff (50 to 200 ms) would spend its attempts before the bucket refills: the
    # retry passes only if it waited, 1 s after the first call took the first unit.
    patient = channel(["RESOURCE_EXHAUSTED"])
    first = time.monotonic()
    unary(patient, "patient")
    unary(patient, "patient")
    before = stat(ATTEMPTS)
    unary(patient, "patient")
    attempts, waited = stat(ATTEMPTS) - before, time.monotonic() - first
    check(attempts == 2, f"a retry policy on RESOURCE_EXHAUSTED made {attempts} attempts, want 2")
    check(waited >= 0.95, f"passed {waited:.3f} s after the first call, before the bucket refilled")
    print(f"retry policy on RESOURCE_EXHAUSTED: 2 attempts, passed {waited:.3f} s after the first call")

    # A call that never fits: why in the message, no RetryInfo, a pushback of -1 that stops even
    # a policy retrying RESOURCE_EXHAUSTED.
    before = stat(ATTEMPTS)
    error = refused(lambda: unary(patient, "huge", cost="5"), grpc.StatusCode.RESOURCE_EXHAUSTED)
    attempts = stat(ATTEMPTS) - before
    check(attempts == 1, f"a call that never fits was tried {attempts} times")
    want = "rate limit exceeded: calls.per_2s: this request costs 5, more than the 2 the limit ever holds"
    check(error.details() == want, f"message {error.details()!r}")
    check(metadata(error).get("grpc-retry-pushback-ms") == "-1", f"metadata {metadata(error)}")
    check(retry_delay_ms(error) is None, "a RetryInfo for a call no wait helps")
    print("never fits: RESOURCE_EXHAUSTED, told not to retry: 1 attempt")

    # A cost the limiter cannot read.
    error = refused(lambda: unary(ch, "bad", cost="lots"), grpc.StatusCode.INVALID_ARGUMENT)
    check(error.details().startswith("x-cost must be"), f"message {error.details()!r}")
    print(f"bad cost: INVALID_ARGUMENT {error.details()!r}")
    print(f"served {served}")


def outage():
    call = lambda ch: unary(ch, "guarded", method="/test.Guarded/Call")
    error = refused(lambda: call(channel()), grpc.StatusCode.UNAVAILABLE)
    check(error.details() == "rate limiter unavailable", f"message {error.details()!r}")
    md = metadata(error)
    check("grpc-retry-pushback-ms" not in md and retry_delay_ms(error) is None, f"metadata {md}")
    # The limiter may be back for a later attempt: a policy on UNAVAILABLE retries it.
    before = stat(ATTEMPTS)
    refused(lambda: call(channel(["UNAVAILABLE"])), grpc.StatusCode.UNAVAILABLE)
    attempts = stat(ATTEMPTS) - before
    check(attempts == 5, f"a retry policy on UNAVAILABLE made {attempts} attempts, want 5")
    print("fail closed: UNAVAILABLE 'rate limiter unavailable'; a retry policy on UNAVAILABLE: 5 attempts")


{"limits": limits, "outage": outage}[PHASE]()
