"""The official `openai` Python client against two Envoys running envoy/examples/llm_models.yaml.

Run by tests/tests/llm_models.rs: `models_check.py URL_A URL_B`, each Envoy's base URL (`.../v1`),
the budgets edited down to 3,200 tokens a day of gpt-4o and 20,000 of gpt-4o-mini. Each request
asks the test upstream for a usage (`x-test-usage`). Prints one JSON line of what it saw; the
test compares it with Redis and the upstream's log.
"""

import json
import sys
import threading

import openai

URLS = sys.argv[1:3]


def client(i, key):
    return openai.OpenAI(base_url=URLS[i % 2], api_key=key, max_retries=0)


def chat(c, model, usage, max_tokens, stream=False, include_usage=None):
    """One chat completion: its status (200 or 429) and, when allowed, the usage it reported."""
    kwargs = dict(
        model=model,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=max_tokens,
        extra_headers={"x-test-usage": str(usage)},
    )
    try:
        if stream:
            if include_usage is not None:
                kwargs["stream_options"] = {"include_usage": include_usage}
            chunks = list(c.chat.completions.create(stream=True, **kwargs))
            # With include_usage (the client's, or added by the filter) the last chunk has it;
            # the client never asked for it in the edited streams.
            used = [ch.usage.total_tokens for ch in chunks if ch.usage is not None]
            return 200, used[-1] if used else None
        answer = c.chat.completions.create(**kwargs)
        return 200, answer.usage.total_tokens
    except openai.RateLimitError:
        return 429, None


def check(condition, what):
    if not condition:
        sys.exit(f"models_check: {what}")


seen = {}

# gpt-4o, one request after another over both Envoys: 500 tokens each, each reserving its
# estimate first (the body's 70 to 110 bytes and max_tokens 410: 480 to 520), settled to 500
# once answered. The 6th fits in 3,200 even with the previous answers' settlements still on
# their way (2,500 + 2 x 20 + 520); the 7th finds 3,000 used and its estimate does not fit.
alice = [client(i, "sk-alice") for i in range(2)]
statuses = [chat(alice[i % 2], "gpt-4o", 500, 410) for i in range(8)]
seen["gpt4o"] = [s for s, _ in statuses]
check(seen["gpt4o"] == [200] * 6 + [429] * 2, f"gpt-4o statuses {seen['gpt4o']}")
check(all(u == 500 for s, u in statuses if s == 200), f"gpt-4o usages {statuses}")

# gpt-4o-mini has its own budget: 4 clients at once, 15 requests each, 500 tokens each,
# estimated above that (max_tokens 600), until its 20,000 are spent.
lock = threading.Lock()
mini = []


def mini_client(t):
    c = client(t, "sk-alice")
    for _ in range(15):
        status, used = chat(c, "gpt-4o-mini", 500, 600)
        with lock:
            mini.append((status, used))


threads = [threading.Thread(target=mini_client, args=(t,)) for t in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
seen["mini_allowed"] = sum(1 for s, _ in mini if s == 200)
seen["mini_refused"] = sum(1 for s, _ in mini if s == 429)
check(seen["mini_allowed"] + seen["mini_refused"] == 60, f"mini answers {mini}")
check(seen["mini_allowed"] >= 6, f"gpt-4o-mini allowed only {seen['mini_allowed']}: gpt-4o's budget was shared")
check(seen["mini_refused"] > 0, "gpt-4o-mini never refused")

# A model of no plan: the key's shared budget for every other model.
status, used = chat(alice[0], "gpt-3.5-turbo", 100, 50)
check((status, used) == (200, 100), f"another model {status} {used}")

# Streams and content-length, another key: plain JSON requests keep their length; streams
# without include_usage are edited (and so sent chunked) and report their usage; streams
# that ask for it themselves are not edited.
bob = [client(i, "sk-bob") for i in range(2)]
plain = [chat(bob[i % 2], "gpt-4o-mini", 100, 50) for i in range(3)]
edited = [chat(bob[i % 2], "gpt-4o-mini", 100, 50, stream=True) for i in range(3)]
asked = [chat(bob[i % 2], "gpt-4o-mini", 100, 50, stream=True, include_usage=True) for i in range(2)]
for name, answers in [("plain", plain), ("edited", edited), ("asked", asked)]:
    check(answers == [(200, 100)] * len(answers), f"{name} answers {answers}")

print(json.dumps(seen))
