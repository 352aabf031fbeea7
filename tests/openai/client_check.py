"""The official `openai` Python client against Envoy with the filter, `"headers": "openai"`.

Run by tests/tests/openai.rs with Envoy's base URL: `client_check.py http://127.0.0.1:PORT/v1`.
The rule allows 1 request a second and 4000 tokens a minute per `x-api-key`. Checks that the
client sees the rate-limit headers, that its own retry waits the `retry-after-ms` of a 429 and
then succeeds, that a request which can never fit is not retried, and that beside an upstream's
own x-ratelimit-* headers each header still holds one number, from the tighter limit.
"""

import re
import sys
import time

import openai

BASE_URL = sys.argv[1]
# OpenAI's duration format: Go's, e.g. 6m0s, 1s, 120ms, 2h3m4s, 1.5s.
DURATION = re.compile(r"^(0s|\d+ms|(\d+h)?(\d+m)?\d+(\.\d+)?s)$")


def client(api_key, seen):
    """A client that retries once, recording each HTTP response it gets (status, headers, when)."""

    def record(response):
        seen.append((response.status_code, response.headers, time.monotonic()))

    http = openai.DefaultHttpxClient(event_hooks={"response": [record]})
    return openai.OpenAI(
        base_url=BASE_URL,
        api_key="sk-test",
        max_retries=1,
        http_client=http,
        default_headers={"x-api-key": api_key},
    )


def chat(c, max_tokens=16):
    return c.chat.completions.with_raw_response.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=max_tokens,
    )


def check(condition, what):
    if not condition:
        sys.exit(f"client_check: {what}")


seen = []
c = client("key-a", seen)

# Allowed: both header sets, as OpenAI writes them.
raw = chat(c)
h = raw.headers
check(raw.http_request is not None, "no request")
check(h.get("x-ratelimit-limit-requests") == "1", f"limit-requests {h.get('x-ratelimit-limit-requests')}")
check(h.get("x-ratelimit-remaining-requests") == "0", f"remaining-requests {h.get('x-ratelimit-remaining-requests')}")
check(h.get("x-ratelimit-limit-tokens") == "4000", f"limit-tokens {h.get('x-ratelimit-limit-tokens')}")
check(int(h.get("x-ratelimit-remaining-tokens", "-1")) in range(0, 4000), f"remaining-tokens {h.get('x-ratelimit-remaining-tokens')}")
for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"):
    check(DURATION.match(h.get(name, "")), f"{name} {h.get(name)!r} is not a duration")
raw.parse()

# At once again: a 429 with retry-after-ms, which the client waits, then a 200.
seen.clear()
raw = chat(c)
check([s for s, _, _ in seen] == [429, 200], f"statuses {[s for s, _, _ in seen]}, want 429 then 200")
(_, refused, at), (_, _, retried_at) = seen
wait_ms = float(refused.get("retry-after-ms", "0"))
check(0 < wait_ms <= 1000, f"retry-after-ms {refused.get('retry-after-ms')}")
check(refused.get("retry-after") == "1", f"retry-after {refused.get('retry-after')}")
check((retried_at - at) * 1000 >= wait_ms * 0.9, f"retried after {(retried_at - at) * 1000:.0f} ms, told {wait_ms}")
raw.parse()

# A request whose estimate is above what the token limit ever holds: refused without a wait to
# honour, and not retried.
seen.clear()
try:
    chat(client("key-b", seen), max_tokens=5000)
    check(False, "a request that never fits was allowed")
except openai.RateLimitError as e:
    check(len(seen) == 1, f"{len(seen)} responses: a request that never fits was retried")
    headers = e.response.headers
    check("retry-after" not in headers and "retry-after-ms" not in headers, "a retry time for a request that never fits")
    check(headers.get("x-should-retry") == "false", f"x-should-retry {headers.get('x-should-retry')}")
    detail = (e.body or {}).get("detail", "") if isinstance(e.body, dict) else ""
    check("more than the 4000 the limit ever holds" in detail, f"detail {detail!r}")

# An upstream that sends its own OpenAI headers, as OpenAI's API does: a looser request limit and a
# tighter token limit than the filter's. Each header has one value, a number the client reads,
# and each set comes whole from the tighter side.
PROVIDER = {
    "x-ratelimit-limit-requests": "10000",
    "x-ratelimit-remaining-requests": "9999",
    "x-ratelimit-reset-requests": "59s",
    "x-ratelimit-limit-tokens": "3000",
    "x-ratelimit-remaining-tokens": "2500",
    "x-ratelimit-reset-tokens": "6m0s",
}
raw = client("key-c", []).chat.completions.with_raw_response.create(
    model="gpt-test",
    messages=[{"role": "user", "content": "Say hello."}],
    max_tokens=16,
    extra_headers={"x-test-response-headers": ";".join(f"{n}={v}" for n, v in PROVIDER.items())},
)
h = raw.headers
for name in PROVIDER:
    check(len(h.get_list(name)) == 1, f"{name}: {h.get_list(name)}, want one value")
check(h["x-ratelimit-limit-requests"] == "1", f"limit-requests {h['x-ratelimit-limit-requests']}: the filter's is tighter")
check(int(h["x-ratelimit-remaining-requests"]) == 0, f"remaining-requests {h['x-ratelimit-remaining-requests']}")
check(h["x-ratelimit-reset-requests"] != "59s" and DURATION.match(h["x-ratelimit-reset-requests"]), f"reset-requests {h['x-ratelimit-reset-requests']}")
check(int(h["x-ratelimit-limit-tokens"]) == 3000, f"limit-tokens {h['x-ratelimit-limit-tokens']}: the upstream's is tighter")
check(int(h["x-ratelimit-remaining-tokens"]) == 2500, f"remaining-tokens {h['x-ratelimit-remaining-tokens']}")
check(h["x-ratelimit-reset-tokens"] == "6m0s", f"reset-tokens {h['x-ratelimit-reset-tokens']}")
raw.parse()

print("client_check: openai", openai.__version__, "saw the headers, waited retry-after-ms, did not retry a request that never fits, read one number per header beside the upstream's own")
