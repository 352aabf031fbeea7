#!/usr/bin/env python3
"""Fleet model of the rate limiter: P proxies x W workers -> Webdis -> a Redis Cluster of M masters.

Python 3 standard library only. `python3 tests/sim/fleet.py --help` for the options;
docs/scaling.md explains the formulas and shows worked examples.

What it predicts
================
Redis calls/s per node (mean and the hottest node), the mean batch, decisions/s per node, the
utilisation of every node, p50/p99 decision latency, deny-cache answers, the keys and memory
held, and how many nodes keep the hottest node under a utilisation target. Every scenario is
run once per `--shards` value (default `1,8`) so sharding the hot identities can be compared.

How (hybrid: one worker simulated event by event, the nodes solved as queues, iterated)
======================================================================================
All workers see the same traffic mix at the same rate (R / (P x W) requests/s each: Poisson
arrivals, or with `--connections` a closed loop like wrk's), so one worker is simulated in
detail and its per-request figures scaled to the fleet; the nodes see the sum of many
independent workers, so their arrivals are taken as Poisson and each node is an M/G/1 queue
(a single-threaded server):

1. Worker (discrete-event): the engine as in filter/core/src/engine.rs. A request that finds a
   free call slot is sent at once; otherwise it waits, and a call takes the waiting requests in
   arrival order, at most `max_requests` (64). In cluster mode a call takes only requests of the
   oldest waiting request's hash slot, and a worker has at most `max_in_flight` (8) calls out
   (one Redis: 1 call, any keys). Sharded identities use shard `turn % shards`, `turn` counting
   the worker's requests. A deny cache answers a request locally while its key is refused.
   A call's round trip = base RTT (+- jitter) + the node's queueing delay + its service time
   `call_us + per_request_us x limits x batch`.
2. Fleet: the per-request figures of each traffic class (calls, decisions, batch^2) times the
   class's fleet rate, placed on the slots its keys hash to, summed per node (slots 0..16383
   in M contiguous ranges, as `redis-cli --cluster create` assigns them). These are offered
   loads: figures are per request sent, so requests that timed out waiting count as decided.
3. Nodes: utilisation rho = calls/s x call_us + decisions/s x per_request_us x limits, and the
   Pollaczek-Khinchine mean wait Wq = sum over calls of S^2 / (2 (1 - rho)). The worker's next
   simulation samples each call's queueing delay from that node (0 with probability 1 - rho,
   else exponential with mean Wq / rho: the M/M/1 shape with the M/G/1 mean). Busy node ->
   longer round trips -> bigger batches -> fewer calls: steps 1-3 are iterated (damped) until
   they agree. A node whose offered load is >= 100% is first held at the delay it would have
   at the target utilisation; then a bisection on its queueing delay W (up to half the
   timeout) looks for an equilibrium where the bigger batches of a long queue bring it under
   100% with a P-K delay <= W and under 1% of requests past their timeout. Found: reported
   ("balanced only by bigger batches"), with its latency. Not found: SATURATED, the figures
   being the offered load at the target's delay (in reality requests would time out and
   breakers open). Capacity (nodes needed) is always planned on the offered load.
4. Hot identities refused by Redis (`--hot-limit`): a fraction q = 1 - limit / decisions of
   the decisions reaching Redis is refused; a refusal caches the key until the instant sent +
   U(0, shards / limit) (the next token of that shard); q is iterated with the rest.

Traffic and sampling
--------------------
* `--hot H --hot-share F`: H explicit hot identities share F of all requests evenly.
* The other 1 - F follow Zipf(s) over `--identities` I ranks (s = 0: uniform). Sampling is a
  precomputed cumulative table over the top K = min(I, 131072) ranks (exact, bisect), plus
  for ranks > K inversion of the continuous approximation of the tail: rank r covers
  [r - 1/2, r + 1/2), tail mass = integral of x^-s over [K + 1/2, I + 1/2] (the midpoint
  rule: relative error per rank about s(s+1) / (24 r^2), below 1e-10 past K); a uniform u
  above the head's mass is mapped through the inverse of that integral and rounded. Exact
  for I <= K; O(log K) per draw otherwise, no rejection.
* The top `--top-ranks` (64) Zipf identities are separate classes with their own slot; the rest
  is one class whose share of each slot is computed from the ranks' hashes (head) and spread
  evenly over the 16384 slots (tail).
* An identity's slot is a 64-bit mix of its number, its shard and `--seed`, mod 16384: a
  uniform hash standing in for CRC16 of the hash tag; or, with `--api-keys client-{}`, the
  real slot: CRC16 of `header:x-api-key:<SHA-1 hex of the key>[#shard]` (the filter's tag for
  a rule keyed on that header, hashed identities). All of one identity's limits share a slot
  (the `{...}` tag); one request = one identity (requests on several slots, split and refunded
  by the engine, are not modelled: they multiply calls by the slots they touch).
* `--shard-scope`: `hot` (default) shards the explicit hot keys and every Zipf identity with at
  least `--hot-min-share` (0.5%) of the traffic; `explicit` only the --hot keys; `all` every
  identity (as a `shards` on the rule's limit does).

Calibration (`--calibration FILE.json`; flags given on the command line win over it)
-----------------------------------------------------------------------------------
    {
      "rtt_ms": 0.5,          # base round trip filter -> Webdis (-> redis_proxy) -> node and
                              # back, without the node's queueing and service
      "call_us": 3.0,         # node CPU per EVALSHA call, whatever its size (c0)
      "per_request_us": 15.0, # node CPU per request decided in a call, per limit (c1)
      "rtt_jitter": 0.2,      # optional: base RTT uniform in rtt x (1 +- jitter)
      "source": "free text"   # optional: where the figures come from
    }
Defaults (one Redis 7.0.15 on a 2-core VM, no cluster measurement yet): a saturated Redis ran
the bucket script by EVALSHA at batch 1 at about 55,000 calls/s (redis-benchmark, 50 clients),
so call_us + per_request_us = 18 us; a `make bench` run (target/bench/results.json) spent
about 15 us of Redis CPU per decision at a mean batch of 16, so per_request_us ~ 15 and
call_us ~ 3. The other reading, call_us 14 + per_request_us 4 (a cheap script body), predicts
~3x more decisions per node at big batches: measure your nodes and pass the figures
(docs/scaling.md says how). RTT: 0.5 ms (0.3 ms on one host's loopback, 0.5-1 ms across a
network with the redis_proxy hop).

Outputs (`--json` prints the same as one JSON object)
----------------------------------------------------
Per node: calls/s and their fraction of all calls, decisions/s, mean batch, utilisation, mean
queueing delay. Overall: calls per request, mean batch, deny-cache answers, p50/p99 latency of
requests decided by Redis (from arrival at the engine to the reply, a request past its timeout
counted at the timeout), calls without an answer for their whole timeout (what opens a
breaker), Webdis calls/s per proxy,
live keys and memory, and nodes needed for `--target` utilisation with the simulated hash
placement and with slots rebalanced by hand. `--small` is 1 proxy x 2 workers, 3 masters,
the 10,000 API keys `client-1`..`client-10000` of make bench's keys10k.lua used uniformly at
their real slots, no hot keys, 32 connections in a closed loop (wrk -c32), RTT 0.3 ms, at
`--rate` (default 15,000): the shape of the 3-node `make bench` run, whose per-node call
fractions, batch and calls per request `INFO commandstats` per node measures.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import heapq
import itertools
import json
import math
import random
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace

SLOTS = 16384
MASK64 = (1 << 64) - 1
HEAD_RANKS = 1 << 17
# Bytes per key: growth of Redis 7.0.15's used_memory over 100,000 identities (measure yours:
# docs/operations.md, Redis memory).
BYTES_PER_KEY = {
    "token_bucket": 256,
    "gcra": 228,
    "fixed_window": 228,
    "sliding_window_counter": 228,
    "sliding_window_log": 388,  # with 3 entries; about 63 more per entry up to 128
}

# --------------------------------------------------------------------------- calibration


@dataclass
class Calibration:
    rtt_ms: float = 0.5
    call_us: float = 3.0
    per_request_us: float = 15.0
    rtt_jitter: float = 0.2
    source: str = (
        "defaults: one Redis 7.0.15 on a 2-core VM (55k EVALSHA/s at batch 1; make bench "
        "Redis CPU 15.4 us per decision at batch 15.9); RTT assumed"
    )

    @classmethod
    def load(cls, path: str) -> "Calibration":
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        known = {k: raw[k] for k in ("rtt_ms", "call_us", "per_request_us", "rtt_jitter", "source") if k in raw}
        unknown = set(raw) - set(known)
        if unknown:
            raise ValueError(f"{path}: unknown calibration keys {sorted(unknown)}")
        cal = cls(**known)
        if "source" not in raw:
            cal.source = path
        return cal


# --------------------------------------------------------------------------- hashing


def mix64(x: int) -> int:
    """splitmix64's finaliser: a well-mixed 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def key_slot(identity: int, shard: int, seed: int) -> int:
    """The hash slot of an identity's shard (a uniform hash standing in for CRC16 of the tag)."""
    return mix64(mix64(seed) ^ (identity * 64 + shard)) % SLOTS


def _crc16_table() -> list:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_CRC16 = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), as Redis Cluster hashes keys: poly 0x1021, init 0, no reflection."""
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ b) & 0xFF]
    return crc


def api_key_slot(pattern: str, identity: int, shard: int, shards: int) -> int:
    """The real slot of the filter's key for API key pattern.format(identity), a rule keyed on
    `header:x-api-key` with hashed identities: CRC16 of the hash tag
    `header:x-api-key:<hex SHA-1 of the key>`, plus `#<shard>` when the limit is sharded."""
    tag = "header:x-api-key:" + hashlib.sha1(pattern.format(identity).encode()).hexdigest()
    if shards > 1:
        tag += f"#{shard}"
    return crc16(tag.encode()) % SLOTS


def slot_ranges(nodes: int) -> list:
    """(first, last) slot of each master, as `redis-cli --cluster create` assigns them: node i
    ends at round((i + 1) x 16384 / nodes - 1), the last node at 16383 (3 masters: 0-5460,
    5461-10922, 10923-16383)."""
    per = SLOTS / nodes
    ranges, first = [], 0
    for i in range(nodes):
        last = SLOTS - 1 if i == nodes - 1 else min(SLOTS - 1, int(math.floor((i + 1) * per - 1 + 0.5)))
        ranges.append((first, last))
        first = last + 1
    return ranges


_NODE_TABLES: dict = {}


def node_table(nodes: int) -> list:
    """Slot -> node, for `nodes` masters (cached)."""
    t = _NODE_TABLES.get(nodes)
    if t is None:
        t = [0] * SLOTS
        for n, (a, b) in enumerate(slot_ranges(nodes)):
            for sl in range(a, b + 1):
                t[sl] = n
        _NODE_TABLES[nodes] = t
    return t


def node_of(slot: int, nodes: int) -> int:
    return node_table(nodes)[slot]


# --------------------------------------------------------------------------- Zipf


class Zipf:
    """Zipf(s) over ranks 1..n: exact table for the top `head` ranks, continuous tail beyond.

    P(r) = r^-s / Z. Ranks <= K are drawn from their cumulative weights by bisection; a draw
    landing in the tail's mass is mapped through the inverse of the integral of x^-s from
    K + 1/2 (rank r stands for [r - 1/2, r + 1/2)) and rounded to a rank.
    """

    def __init__(self, n: int, s: float, head: int = HEAD_RANKS):
        if n < 1:
            raise ValueError("Zipf needs at least one rank")
        if s < 0:
            raise ValueError("Zipf exponent must be >= 0")
        self.n, self.s = n, s
        self.k = min(n, head)
        self.cum = list(itertools.accumulate(r ** -s for r in range(1, self.k + 1)))
        self.head_w = self.cum[-1]
        self.tail_w = self._big_f(n + 0.5) - self._big_f(self.k + 0.5) if n > self.k else 0.0
        self.total = self.head_w + self.tail_w

    def _big_f(self, x: float) -> float:
        """An antiderivative of x^-s."""
        if abs(self.s - 1.0) < 1e-12:
            return math.log(x)
        return x ** (1.0 - self.s) / (1.0 - self.s)

    def _big_f_inv(self, y: float) -> float:
        if abs(self.s - 1.0) < 1e-12:
            return math.exp(y)
        return (y * (1.0 - self.s)) ** (1.0 / (1.0 - self.s))

    def weight(self, r: int) -> float:
        """Unnormalised weight of rank r (the tail's continuous density for r > K)."""
        if r <= self.k:
            return r ** -self.s
        return self._big_f(r + 0.5) - self._big_f(r - 0.5)

    def pmf(self, r: int) -> float:
        return self.weight(r) / self.total

    def mass(self, a: int, b: int) -> float:
        """P(a <= rank <= b)."""
        a, b = max(1, a), min(self.n, b)
        if a > b:
            return 0.0
        w = 0.0
        if a <= self.k:
            hi = min(b, self.k)
            w += self.cum[hi - 1] - (self.cum[a - 2] if a >= 2 else 0.0)
        if b > self.k:
            lo = max(a, self.k + 1)
            w += self._big_f(b + 0.5) - self._big_f(lo - 0.5)
        return w / self.total

    def sample(self, rng: random.Random) -> int:
        u = rng.random() * self.total
        if u < self.head_w:
            return min(bisect.bisect_right(self.cum, u) + 1, self.k)
        x = self._big_f_inv(self._big_f(self.k + 0.5) + (u - self.head_w))
        return min(self.n, max(self.k + 1, int(x + 0.5)))

    def expected_distinct(self, draws: float, first: int = 1, shards: int = 1) -> float:
        """Expected distinct (rank, shard) pairs among `draws` Poisson draws, ranks >= first.

        Each rank r is drawn Poisson(draws x P(r)) times, each draw on one of `shards` shards
        (uniformly): sum over r of shards x (1 - exp(-draws P(r) / shards)).
        """
        c = draws / self.total / shards
        total = 0.0
        for r in range(max(1, first), self.k + 1):
            total += -math.expm1(-c * r ** -self.s)
        if self.n > self.k:
            lo, hi = math.log(max(first, self.k + 1) - 0.5), math.log(self.n + 0.5)
            if hi > lo:
                steps = 400
                h = (hi - lo) / steps
                acc = 0.0
                for i in range(steps + 1):
                    x = math.exp(lo + i * h)
                    f = -math.expm1(-c * x ** -self.s) * x
                    acc += f * (0.5 if i in (0, steps) else 1.0)
                total += acc * h
        return total * shards


# --------------------------------------------------------------------------- parameters


@dataclass
class Params:
    proxies: int = 1000
    workers: int = 2
    nodes: int = 3
    identities: int = 10_000_000
    zipf: float = 1.1
    hot: int = 3
    hot_share: float = 0.05
    rate: float = 1_000_000.0
    shards: int = 1
    shard_scope: str = "hot"
    hot_min_share: float = 0.005
    hot_limit: float = 0.0
    limits: int = 1
    algorithm: str = "token_bucket"
    ttl_s: float = 120.0
    redis_mode: str = "auto"
    max_in_flight: int = 0  # 0: 1 with one Redis, 8 in cluster mode
    max_requests: int = 64
    timeout_ms: float = 150.0
    connections: int = 0  # per proxy; 0: open loop (Poisson arrivals)
    deny_cache: bool = True
    target: float = 0.7
    requests: int = 100_000
    iterations: int = 5
    top_ranks: int = 64
    api_keys: str = ""  # e.g. "client-{}": real CRC16 slots of these API keys (else a uniform hash)
    seed: int = 1
    cal: Calibration = field(default_factory=Calibration)

    @property
    def cluster(self) -> bool:
        if self.redis_mode == "auto":
            return self.nodes > 1
        return self.redis_mode == "cluster"

    @property
    def in_flight(self) -> int:
        if self.max_in_flight > 0:
            return self.max_in_flight
        return 8 if self.cluster else 1

    @property
    def worker_rate(self) -> float:
        return self.rate / (self.proxies * self.workers)

    @property
    def worker_connections(self) -> int:
        return max(1, round(self.connections / self.workers)) if self.connections > 0 else 0

    def worker_bound(self, batch: float) -> float:
        """Decisions/s one worker can keep in flight with calls of `batch` requests and no
        node queueing: max_in_flight x batch / (rtt + call + batch x per request)."""
        c = self.cal
        batch = max(1.0, min(batch, self.max_requests))
        call_s = c.rtt_ms / 1000 + (c.call_us + c.per_request_us * self.limits * batch) * 1e-6
        return self.in_flight * batch / call_s


# --------------------------------------------------------------------------- traffic


@dataclass
class TrafficClass:
    name: str
    share: float  # of all requests
    identity: int  # hashing number; -1 for the rest class (many identities)
    shards: int
    slots: list  # one per shard (explicit classes only)
    limited: bool  # refused by Redis above --hot-limit


class Traffic:
    """The classes of requests and where their keys live."""

    def __init__(self, p: Params):
        self.p = p
        self._slot_cache: dict = {}
        self.zipf = Zipf(p.identities, p.zipf)
        z = self.zipf
        hot = p.hot if p.hot_share > 0 else 0
        hot_share = p.hot_share if hot else 0.0
        self.hot_share = hot_share
        self.zipf_share = 1.0 - hot_share
        self.classes: list[TrafficClass] = []

        def shards_for(share: float, explicit: bool) -> int:
            if p.shards <= 1:
                return 1
            if p.shard_scope == "all":
                return p.shards
            if p.shard_scope == "explicit":
                return p.shards if explicit else 1
            return p.shards if (explicit or share >= p.hot_min_share) else 1

        for k in range(hot):
            ident = p.identities + 1 + k
            n = shards_for(hot_share / hot, True)
            self.classes.append(TrafficClass(
                f"hot{k}", hot_share / hot, ident, n,
                [self.slot(ident, j, n) for j in range(n)], p.hot_limit > 0))
        self.first_top = len(self.classes)
        self.top = min(p.top_ranks, p.identities)
        for r in range(1, self.top + 1):
            share = self.zipf_share * z.pmf(r)
            n = shards_for(share, False)
            self.classes.append(TrafficClass(
                f"zipf#{r}", share, r, n, [self.slot(r, j, n) for j in range(n)], False))
        self.rest = len(self.classes)
        rest_share = self.zipf_share * z.mass(self.top + 1, p.identities)
        self.rest_shards = shards_for(0.0, False)
        self.classes.append(TrafficClass("rest", rest_share, -1, self.rest_shards, [], False))
        self.rest_slot_mass = self._rest_slot_mass()

    def slot(self, identity: int, shard: int, shards: int) -> int:
        """The slot of an identity's shard: the real one for --api-keys, else a uniform hash."""
        if not self.p.api_keys:
            return key_slot(identity, shard, self.p.seed)
        k = (identity, shard, shards)
        sl = self._slot_cache.get(k)
        if sl is None:
            if len(self._slot_cache) > 1_000_000:
                self._slot_cache.clear()
            sl = self._slot_cache[k] = api_key_slot(self.p.api_keys, identity, shard, shards)
        return sl

    def _rest_slot_mass(self) -> list:
        """Fraction of the rest class's requests on each slot: head ranks by their hash, the
        tail (and ranks past the hashed ones) spread evenly."""
        p, z = self.p, self.zipf
        mass = [0.0] * SLOTS
        if self.top >= p.identities:
            return mass
        n = self.rest_shards
        last = min(z.k, max(self.top, HEAD_RANKS // n))
        total = z.mass(self.top + 1, p.identities)
        if total <= 0:
            return mass
        placed = 0.0
        for r in range(self.top + 1, last + 1):
            w = z.pmf(r) / total / n
            for j in range(n):
                mass[self.slot(r, j, n)] += w
            placed += w * n
        even = max(0.0, 1.0 - placed) / SLOTS
        return [m + even for m in mass]

    def draw(self, rng: random.Random, turn: int):
        """(class index, identity number, shard, slot) of the next request."""
        u = rng.random()
        if u < self.hot_share:
            c = min(int(u / self.hot_share * (self.first_top)), self.first_top - 1)
        else:
            r = self.zipf.sample(rng)
            if r <= self.top:
                c = self.first_top + r - 1
            else:
                shard = turn % self.rest_shards
                return self.rest, r, shard, self.slot(r, shard, self.rest_shards)
        cls = self.classes[c]
        shard = turn % cls.shards
        return c, cls.identity, shard, cls.slots[shard]


# --------------------------------------------------------------------------- one worker


@dataclass
class ClassStats:
    n: int = 0  # requests (recorded)
    hits: int = 0  # answered by the deny cache
    calls: float = 0.0  # sum over its requests of 1 / batch
    decisions: int = 0  # requests decided by Redis
    batch_sum: float = 0.0  # sum over its requests of batch (-> sum of batch^2 over calls)
    expired: int = 0  # answered by the failure policy: timed out waiting or in its call
    dropped: int = 0  # of which timed out waiting: never sent


@dataclass
class WorkerRun:
    stats: list
    latencies: list  # of requests decided by Redis or past their timeout (s)
    calls: int
    slow_calls: int
    completion_sum: float  # sum of every recorded request's time to its answer (s)
    duration: float  # simulated seconds
    arrivals: int


def simulate_worker(p: Params, traffic: Traffic, node_wait: list, refuse: list,
                    n_requests: int, rng: random.Random, think_s: float = 0.0) -> WorkerRun:
    """One worker's engine, event by event, for n_requests arrivals (first 10% warm-up).

    node_wait[n] = (rho, mean queueing delay s) of node n; refuse[c] = (probability a decision
    of class c is refused, longest retry s). Arrivals are Poisson at the worker's rate, or with
    `p.connections` a closed loop: each of the worker's connections sends its next request an
    exponential think time (mean think_s) after its last answer.
    """
    cal = p.cal
    lam = p.worker_rate
    cluster = p.cluster
    nodes = p.nodes
    max_if, max_b = p.in_flight, p.max_requests
    timeout = p.timeout_ms / 1000.0
    c0 = cal.call_us * 1e-6
    c1 = cal.per_request_us * 1e-6 * p.limits
    rtt, jit = cal.rtt_ms / 1000.0, cal.rtt_jitter
    stats = [ClassStats() for _ in traffic.classes]
    latencies: list[float] = []
    cache: dict[int, float] = {}
    heap: list = []  # calls in flight: (reply time, seq, sent, members)
    seq = itertools.count()
    order: deque = deque()  # waiting requests, arrival order (lazy: taken ones skipped)
    by_slot: dict[int, deque] = {}
    waiting = 0
    in_flight = 0
    calls = slow_calls = 0
    completion_sum = 0.0
    warm = n_requests // 10
    arrivals = 0
    turn = 0
    t = 0.0
    expo, rand = rng.expovariate, rng.random
    use_cache = p.deny_cache
    closed = p.worker_connections > 0
    clients: list = []  # closed loop: next send time of each connection
    if closed:
        mean = max(think_s, 1e-9)
        clients = sorted(rand() * mean for _ in range(p.worker_connections))
        next_arrival = clients[0]
    else:
        next_arrival = expo(lam)

    def done(at: float) -> None:
        """A closed-loop connection got its answer at `at`: it sends again after thinking."""
        if closed:
            heapq.heappush(clients, at + (expo(1.0 / think_s) if think_s > 0 else 0.0))

    def next_batch(now: float) -> list:
        nonlocal waiting, completion_sum
        members = []
        if cluster:
            while order and order[0][5]:
                order.popleft()
            if not order:
                return members
            slot = order[0][3]
            q = by_slot[slot]
        else:
            q = order
        while q and len(members) < max_b:
            req = q.popleft()
            req[5] = True
            waiting -= 1
            st = stats[req[1]] if req[6] else None
            if now - req[0] >= timeout:
                if st:
                    st.expired += 1
                    st.dropped += 1
                    latencies.append(timeout)
                    completion_sum += timeout
                done(req[0] + timeout)
                continue
            if use_cache:
                e = cache.get(req[2])
                if e is not None and e > now:
                    if st:
                        st.hits += 1
                        completion_sum += now - req[0]
                    done(now)
                    continue
            members.append(req)
        if cluster and not q:
            del by_slot[slot]
        return members

    def dispatch(now: float) -> None:
        nonlocal in_flight, calls, slow_calls
        while in_flight < max_if and waiting > 0:
            members = next_batch(now)
            if not members:
                continue
            b = len(members)
            node = members[0][4]
            rho, wq = node_wait[node]
            delay = expo(rho / wq) if (rho > 0 and wq > 0 and rand() < rho) else 0.0
            latency = rtt * (1.0 + jit * (2.0 * rand() - 1.0)) + delay + c0 + c1 * b
            heapq.heappush(heap, (now + latency, next(seq), now, members))
            in_flight += 1
            recorded = False
            inv = 1.0 / b
            for req in members:
                if req[6]:
                    recorded = True
                    st = stats[req[1]]
                    st.calls += inv
                    st.decisions += 1
                    st.batch_sum += b
            if recorded:
                calls += 1
                # The breaker's hang signal: a call without an answer for its whole timeout.
                if latency >= timeout:
                    slow_calls += 1

    while True:
        if closed:
            next_arrival = clients[0] if clients else math.inf
        if heap and (heap[0][0] <= next_arrival or arrivals >= n_requests):
            t, _, sent, members = heapq.heappop(heap)
            in_flight -= 1
            for req in members:
                lat = t - req[0]
                if req[6]:
                    if lat >= timeout:
                        stats[req[1]].expired += 1
                        latencies.append(timeout)
                        completion_sum += timeout
                    else:
                        latencies.append(lat)
                        completion_sum += lat
                done(min(t, req[0] + timeout))
                q, retry = refuse[req[1]]
                if q > 0 and use_cache and rand() < q:
                    until = sent + rand() * retry
                    if until > cache.get(req[2], 0.0):
                        cache[req[2]] = until
            dispatch(t)
        elif arrivals < n_requests and next_arrival < math.inf:
            t = next_arrival
            if closed:
                heapq.heappop(clients)
            else:
                next_arrival = t + expo(lam)
            arrivals += 1
            turn += 1
            c, ident, shard, slot = traffic.draw(rng, turn)
            key = ident * 64 + shard
            rec = arrivals > warm
            if rec:
                stats[c].n += 1
            if use_cache:
                e = cache.get(key)
                if e is not None and e > t:
                    if rec:
                        stats[c].hits += 1
                    done(t)
                    continue
            node = node_of(slot, nodes) if cluster else 0
            req = [t, c, key, slot, node, False, rec]
            order.append(req)
            if cluster:
                q = by_slot.get(slot)
                if q is None:
                    by_slot[slot] = q = deque()
                q.append(req)
            waiting += 1
            dispatch(t)
        else:
            break
    return WorkerRun(stats, latencies, calls, slow_calls, completion_sum, t, arrivals)


# --------------------------------------------------------------------------- fleet


def slot_loads(p: Params, traffic: Traffic, stats: list):
    """Fleet-wide calls/s, decisions/s and sum of batch^2 per call per slot (lists of 16384).

    Offered load: per-request figures are taken over the requests that were sent (a request
    that timed out waiting would have been decided like the others had the worker kept up).
    One Redis (not cluster): everything is put on slot 0.
    """
    calls = [0.0] * SLOTS
    dec = [0.0] * SLOTS
    b2 = [0.0] * SLOTS
    for c, cls in enumerate(traffic.classes):
        st = stats[c]
        sent = st.n - st.dropped
        if sent > 0:
            cpr, dpr, bpr = st.calls / sent, st.decisions / sent, st.batch_sum / sent
        else:
            cpr = dpr = bpr = 1.0  # never drawn: batch of one
        rate = p.rate * cls.share
        if rate <= 0:
            continue
        if not p.cluster:
            calls[0] += rate * cpr
            dec[0] += rate * dpr
            b2[0] += rate * bpr
        elif c == traffic.rest:
            for s, m in enumerate(traffic.rest_slot_mass):
                if m:
                    calls[s] += rate * m * cpr
                    dec[s] += rate * m * dpr
                    b2[s] += rate * m * bpr
        else:
            part = rate / len(cls.slots)
            for s in cls.slots:
                calls[s] += part * cpr
                dec[s] += part * dpr
                b2[s] += part * bpr
    return calls, dec, b2


def node_figures(p: Params, calls: list, dec: list, b2: list, nodes: int):
    """Per node: calls/s, decisions/s, utilisation, mean queueing delay (s), saturated."""
    c0 = p.cal.call_us * 1e-6
    c1 = p.cal.per_request_us * 1e-6 * p.limits
    out = []
    ranges = slot_ranges(nodes) if p.cluster else [(0, SLOTS - 1)]
    for lo, last in ranges:
        hi = last + 1
        lam = sum(calls[lo:hi])
        d = sum(dec[lo:hi])
        bb = sum(b2[lo:hi])
        rho = lam * c0 + d * c1
        second = c0 * c0 * lam + 2 * c0 * c1 * d + c1 * c1 * bb  # sum over calls/s of S^2
        wq = second / (2 * (1 - rho)) if rho < 1 else math.inf
        out.append({"calls": lam, "decisions": d, "rho": rho, "wq": wq, "second": second,
                    "saturated": rho >= 1})
    return out


def slot_utilisation(p: Params, calls: list, dec: list) -> list:
    c0 = p.cal.call_us * 1e-6
    c1 = p.cal.per_request_us * 1e-6 * p.limits
    return [a * c0 + d * c1 for a, d in zip(calls, dec)]


def nodes_needed(util: list, target: float, max_nodes: int = 4096) -> dict:
    """Smallest node count keeping every node at or under `target` utilisation.

    `hash`: slots in equal contiguous ranges (what the simulation assumes); `rebalanced`:
    slots moved by hand, the heavy ones packed largest first onto the least loaded node and
    the many light ones filling the rest evenly. Neither exists when one slot alone is above
    the target: then only `shards` (or a higher target) helps.
    """
    total = sum(util)
    hottest = max(util) if util else 0.0
    result = {"total_node_equivalents": total, "hottest_slot": hottest,
              "hash": None, "rebalanced": None, "shards_needed_for_hottest": None}
    if hottest > target:
        result["shards_needed_for_hottest"] = math.ceil(hottest / target)
        return result
    prefix = [0.0]
    for u in util:
        prefix.append(prefix[-1] + u)
    start = max(1, math.ceil(total / target - 1e-9))
    for m in range(start, max_nodes + 1):
        worst = max(prefix[b + 1] - prefix[a] for a, b in slot_ranges(m))
        if worst <= target:
            result["hash"] = m
            break
    heavy = sorted((u for u in util if u > total / SLOTS * 20), reverse=True)[:256]
    light = total - sum(heavy)
    for m in range(start, max_nodes + 1):
        loads = [0.0] * m
        for u in heavy:
            i = loads.index(min(loads))
            loads[i] += u
        # Water-filling the light slots: the level h with sum(max(0, h - load)) = light.
        srt = sorted(loads)
        rest, level = light, srt[0]
        for i in range(m):
            nxt = srt[i + 1] if i + 1 < m else math.inf
            room = (nxt - srt[i]) * (i + 1)
            if room >= rest:
                level = srt[i] + rest / (i + 1)
                break
            rest -= room
        if max(max(loads), level) <= target:
            result["rebalanced"] = m
            break
    return result


def percentile(sorted_values: list, q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, int(math.ceil(q * len(sorted_values))) - 1))
    return sorted_values[i]


def memory(p: Params, traffic: Traffic) -> dict:
    """Live keys (identities active within the state TTL x limits x shards touched) and bytes."""
    z = traffic.zipf
    draws = p.rate * traffic.zipf_share * p.ttl_s
    keys = 0.0
    for cls in traffic.classes:
        if cls.identity < 0:
            continue
        n = cls.shards
        lam = p.rate * cls.share * p.ttl_s
        keys += n * -math.expm1(-lam / n)
    keys += z.expected_distinct(draws, first=traffic.top + 1, shards=traffic.rest_shards)
    keys *= p.limits
    per_key = BYTES_PER_KEY[p.algorithm]
    nodes = p.nodes if p.cluster else 1
    return {"live_keys": keys, "bytes": keys * per_key, "bytes_per_node": keys * per_key / nodes,
            "bytes_per_key": per_key}


def run(p: Params) -> dict:
    """Model one scenario to the fixed point; returns a JSON-ready dict.

    Phase 1: worker simulation and node queues iterated until they agree; a node above 100%
    is held at the queueing delay it would have at the target utilisation (its offered load).
    Phase 2, if a node is still above 100%: is there a queueing delay W, at most half the
    timeout, at which the batches it makes bring the node under 100% with a P-K delay of at
    most W? (The delay the node's load implies falls as W grows, so there is one crossing.)
    If so it is found by bisection on log W and that state is reported (an equilibrium at high
    latency); if not the phase-1 state is reported as SATURATED.
    """
    t0 = time.time()
    traffic = Traffic(p)
    rng = random.Random(p.seed)
    node_count = p.nodes if p.cluster else 1
    timeout = p.timeout_ms / 1000.0
    cycle = p.worker_connections / p.worker_rate if p.worker_connections else 0.0
    history = []
    state = {
        "wait": [(0.0, 0.0)] * node_count,
        "refuse": [(0.0, 0.0)] * len(traffic.classes),
        "think": max(0.0, cycle - p.cal.rtt_ms / 1000),
        "rate": p.rate,
    }

    def step(state: dict, fixed: dict) -> tuple:
        """One simulation and the node figures it implies; returns (run, figures, next state).
        `fixed`: node -> queueing delay assumed for it (phase 2) instead of the state's."""
        wait_in = list(state["wait"])
        for n, wq in fixed.items():
            wait_in[n] = (0.99, wq)
        w = simulate_worker(p, traffic, wait_in, state["refuse"], p.requests, rng, state["think"])
        rate, think = state["rate"], state["think"]
        if p.worker_connections:
            # Closed loop: think so that a connection's cycle (answer + think) gives the rate.
            answered = sum(st.n for st in w.stats)
            think = max(0.0, cycle - (w.completion_sum / answered if answered else 0.0))
            if w.duration:
                rate = min(p.rate, w.arrivals / w.duration * p.proxies * p.workers)
        calls, dec, b2 = slot_loads(replace(p, rate=rate), traffic, w.stats)
        figs = node_figures(p, calls, dec, b2, node_count)
        wait = []
        for (_, wq_old), f in zip(state["wait"], figs):
            if f["saturated"]:
                # No finite queue balances this node: its calls get the delay of the same
                # node run at the target utilisation (its offered load).
                rho = p.target
                wq = f["second"] * (p.target / f["rho"]) / (2 * (1 - p.target))
            else:
                rho, wq = f["rho"], min(f["wq"], timeout / 2)
                if wq_old > 0 and wq > 0:
                    wq = math.sqrt(wq * wq_old)  # damped: geometric mean with the last guess
            wait.append((rho, wq))
        refuse = []
        for c, cls in enumerate(traffic.classes):
            st = w.stats[c]
            if cls.limited and st.n > 0:
                decided = rate * cls.share * st.decisions / st.n
                q = max(0.0, 1.0 - p.hot_limit / decided) if decided > 0 else 0.0
                if state["refuse"][c][0] > 0:
                    q = 0.5 * (q + state["refuse"][c][0])
                refuse.append((q, cls.shards / p.hot_limit))
            else:
                refuse.append((0.0, 0.0))
        history.append({"iteration": len(history), "phase": 2 if fixed else 1,
                        "max_rho": max(f["rho"] for f in figs),
                        "calls_per_s": sum(f["calls"] for f in figs)})
        nxt = {"wait": wait, "refuse": refuse, "think": think, "rate": rate}
        return (w, rate, calls, dec, figs), nxt

    def converged() -> bool:
        if len(history) < 3 or history[-1]["phase"] != 1 or history[-2]["phase"] != 1:
            return False
        a, b = history[-2], history[-1]
        return (abs(a["max_rho"] - b["max_rho"]) <= 0.01 * max(b["max_rho"], 1e-9)
                and abs(a["calls_per_s"] - b["calls_per_s"]) <= 0.01 * max(b["calls_per_s"], 1e-9))

    out = None
    for _ in range(max(1, p.iterations)):
        out, state = step(state, {})
        if converged():
            break
    offered = out  # capacity is planned on this: every node at a normal round trip

    def healthy(run: WorkerRun) -> bool:
        n = sum(st.n for st in run.stats)
        return n > 0 and sum(st.expired for st in run.stats) / n <= 0.01

    rescued = []
    saturated = [i for i, f in enumerate(out[4]) if f["saturated"]]
    if saturated and p.iterations > 1:
        lo = {n: max(state["wait"][n][1], 1e-6) for n in saturated}
        hi = {n: timeout / 2 for n in saturated}
        probe, probe_state = step(state, dict(hi))
        if not any(probe[4][n]["saturated"] for n in saturated):
            best = probe
            for _ in range(8):
                mid = {n: math.sqrt(lo[n] * hi[n]) for n in saturated}
                probe, probe_state = step(probe_state, mid)
                ok = True
                for n in saturated:
                    f = probe[4][n]
                    if f["saturated"] or f["wq"] > mid[n]:
                        lo[n] = mid[n]
                        ok = False
                    else:
                        hi[n] = mid[n]
                if ok and not any(f["saturated"] for f in probe[4]):
                    best = probe
            if healthy(best[0]):
                out = best
                rescued = saturated
    w, rate, calls, dec, figs = out
    stats = w.stats
    n = sum(s.n for s in stats)
    hits = sum(s.hits for s in stats)
    expired = sum(s.expired for s in stats)
    req_calls = sum(s.calls for s in stats)
    decisions = sum(s.decisions for s in stats)
    lat = sorted(w.latencies)
    total_calls = sum(f["calls"] for f in figs)
    util = slot_utilisation(p, offered[2], offered[3])
    cap_nodes = nodes_needed(util, p.target) if p.cluster else None
    hot = max(range(node_count), key=lambda i: figs[i]["rho"])
    placement = []
    for cls in traffic.classes:
        if cls.identity < 0 or (cls.share < p.hot_min_share and not cls.name.startswith("hot")):
            continue
        placement.append({"class": cls.name, "share": cls.share, "shards": cls.shards,
                          "nodes": sorted({node_of(s, node_count) for s in cls.slots})
                          if p.cluster else [0]})
    per_node = []
    for i, f in enumerate(figs):
        per_node.append({
            "node": i,
            "calls_per_s": f["calls"],
            "call_fraction": f["calls"] / total_calls if total_calls else 0.0,
            "decisions_per_s": f["decisions"],
            "mean_batch": f["decisions"] / f["calls"] if f["calls"] else 0.0,
            "utilisation": f["rho"],
            "queue_ms": (f["wq"] * 1000.0) if f["wq"] != math.inf else None,
            "saturated": f["saturated"],
        })
    calls_list = [f["calls"] for f in figs]
    return {
        "params": {k: v for k, v in asdict(p).items() if k != "cal"},
        "calibration": asdict(p.cal),
        "mode": "cluster" if p.cluster else "single",
        "max_in_flight": p.in_flight,
        "worker_rate": p.worker_rate,
        "worker_bound": p.worker_bound(decisions / req_calls if req_calls else 1.0),
        "worker_bound_full_batches": p.worker_bound(p.max_requests),
        "achieved_rate": rate,
        "think_ms": state["think"] * 1000 if p.worker_connections else None,
        "requests_simulated": n,
        "iterations": len(history),
        "rescued_by_batching": rescued,
        "convergence": history,
        "nodes": per_node,
        "calls_per_s_total": total_calls,
        "calls_per_s_node_mean": sum(calls_list) / len(calls_list),
        "calls_per_s_node_max": max(calls_list),
        "decisions_per_s_total": sum(f["decisions"] for f in figs),
        "hot_node": hot,
        "hot_node_utilisation": figs[hot]["rho"],
        "saturated_nodes": [i for i, f in enumerate(figs) if f["saturated"]],
        "calls_per_request": req_calls / n if n else 0.0,
        "mean_batch": decisions / req_calls if req_calls else 0.0,
        "deny_cache_fraction": hits / n if n else 0.0,
        "expired_fraction": expired / n if n else 0.0,
        "slow_call_fraction": w.slow_calls / w.calls if w.calls else 0.0,
        "latency_ms": {"p50": percentile(lat, 0.50) * 1000, "p99": percentile(lat, 0.99) * 1000,
                       "mean": (sum(lat) / len(lat) * 1000) if lat else float("nan")},
        "webdis_calls_per_s_per_proxy": total_calls / p.proxies,
        "worker_saturated": expired / n > 0.01 if n else False,
        "hot_identities": placement,
        "capacity": cap_nodes,
        "memory": memory(p, traffic),
        "seconds": time.time() - t0,
    }


# --------------------------------------------------------------------------- output


def fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def report(r: dict) -> str:
    p = r["params"]
    cal = r["calibration"]
    lines = []
    w = lines.append
    w(f"== shards {p['shards']} ({p['shard_scope']}): {p['proxies']} proxies x {p['workers']} workers, "
      f"{p['nodes']} node(s) [{r['mode']}, max_in_flight {r['max_in_flight']}], "
      f"{p['identities']:,} identities zipf {p['zipf']}, "
      + (f"{p['hot']} hot x {p['hot_share'] / p['hot']:.2%}" if p['hot'] and p['hot_share'] else "no hot keys")
      + f", {fmt_rate(p['rate'])} req/s")
    w(f"   calibration: rtt {cal['rtt_ms']} ms, call {cal['call_us']} us + "
      f"{cal['per_request_us']} us/request x {p['limits']} limit(s); "
      f"{r['worker_rate']:,.0f} req/s per worker; {r['requests_simulated']:,} requests simulated, "
      f"{r['iterations']} iteration(s)")
    if r["think_ms"] is not None:
        w(f"   closed loop: {p['connections']} connections per proxy, think {r['think_ms']:.3f} ms, "
          f"achieved {fmt_rate(r['achieved_rate'])} req/s")
    w("   node  calls/s  share   decisions/s  batch  util    queue ms")
    shown = r["nodes"]
    if len(shown) > 12:
        shown = sorted(shown, key=lambda nd: -nd["utilisation"])[:8]
        utils = sorted(nd["utilisation"] for nd in r["nodes"])
        w(f"   ({len(r['nodes'])} nodes: the 8 busiest; utilisation min {utils[0]:.1%}, "
          f"median {utils[len(utils) // 2]:.1%}; --json lists all)")
    for nd in shown:
        q = "inf" if nd["queue_ms"] is None else f"{nd['queue_ms']:.3f}"
        flag = "  SATURATED" if nd["saturated"] else ""
        w(f"   {nd['node']:>4}  {fmt_rate(nd['calls_per_s']):>7}  {nd['call_fraction']:>5.1%}  "
          f"{fmt_rate(nd['decisions_per_s']):>11}  {nd['mean_batch']:>5.2f}  {nd['utilisation']:>6.1%}  "
          f"{q:>8}{flag}")
    w(f"   calls/s per node: mean {fmt_rate(r['calls_per_s_node_mean'])}, max {fmt_rate(r['calls_per_s_node_max'])} "
      f"(node {r['hot_node']}, utilisation {r['hot_node_utilisation']:.1%})")
    w(f"   calls per request {r['calls_per_request']:.3f}, mean batch {r['mean_batch']:.2f}, "
      f"deny-cache answers {r['deny_cache_fraction']:.1%}, past timeout {r['expired_fraction']:.2%}, "
      f"calls unanswered for their timeout {r['slow_call_fraction']:.2%}")
    lm = r["latency_ms"]
    if r["rescued_by_batching"]:
        w(f"   node(s) {','.join(map(str, r['rescued_by_batching']))}: above 100% at a normal round trip, "
          f"balanced only by the bigger batches a long queue makes (latency below)")
    if r["saturated_nodes"]:
        w(f"   decision latency: UNBOUNDED on node(s) {','.join(map(str, r['saturated_nodes']))} "
          f"(offered load above 100%: requests time out, breakers open); with those nodes held at "
          f"{p['target']:.0%}: p50 {lm['p50']:.3f} ms, p99 {lm['p99']:.3f} ms")
    else:
        w(f"   decision latency (Redis-decided): p50 {lm['p50']:.3f} ms, p99 {lm['p99']:.3f} ms")
    w(f"   Webdis calls/s per proxy {fmt_rate(r['webdis_calls_per_s_per_proxy'])}; "
      f"per worker {r['worker_rate']:,.0f} req/s -> {r['worker_rate'] * r['calls_per_request']:,.0f} calls/s "
      f"(a worker decides at most ~{fmt_rate(r['worker_bound'])}/s at this batch, "
      f"{fmt_rate(r['worker_bound_full_batches'])}/s with full ones)")
    if r["worker_saturated"]:
        w("   WORKER SATURATED: requests wait past their timeout for a call slot "
          "(raise batch.max_in_flight, add workers, or cut the round trip)")
    if r["hot_identities"]:
        parts = [f"{h['class']} {h['share']:.2%} -> node(s) {','.join(map(str, h['nodes']))}"
                 for h in r["hot_identities"][:8]]
        more = len(r["hot_identities"]) - 8
        w("   hot identities: " + "; ".join(parts) + (f"; +{more} more" if more > 0 else ""))
    c = r["capacity"]
    if c is not None:
        if c["hash"] is None and c["rebalanced"] is None:
            w(f"   capacity at {p['target']:.0%}: NO node count suffices: the hottest slot alone needs "
              f"{c['hottest_slot']:.0%} of a node -> shards >= {c['shards_needed_for_hottest']} on it "
              f"(total work {c['total_node_equivalents']:.2f} node-equivalents)")
        else:
            w(f"   capacity at {p['target']:.0%}: {c['hash']} nodes (hash placement), "
              f"{c['rebalanced']} with slots rebalanced; total work {c['total_node_equivalents']:.2f} "
              f"node-equivalents, hottest slot {c['hottest_slot']:.1%}")
    m = r["memory"]
    w(f"   memory ({p['algorithm']}, TTL {p['ttl_s']:.0f} s): {m['live_keys']:,.0f} live keys, "
      f"{m['bytes'] / 2**20:,.1f} MiB ({m['bytes_per_node'] / 2**20:,.1f} MiB per node)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI

SMALL_RTT_MS = 0.3  # --small: one host's loopback (a calibration file or --rtt-ms wins)
PRESETS = {
    "small": {"proxies": 1, "workers": 2, "nodes": 3, "identities": 10_000, "zipf": 0.0,
              "hot": 0, "hot_share": 0.0, "rate": 15_000.0, "shards": "1", "connections": 32,
              "api_keys": "client-{}"},
}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true",
                    help="preset: the 3-node make bench run: 1 proxy x 2 workers, 3 masters, API keys "
                         "client-1..client-10000 used uniformly at their real slots, no hot keys, "
                         "32 connections (closed loop), rtt 0.3 ms; other flags override")
    ap.add_argument("--proxies", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2, help="Envoy workers per proxy")
    ap.add_argument("--nodes", type=int, default=3, help="Redis masters (1: one Redis, not a cluster)")
    ap.add_argument("--identities", type=int, default=10_000_000)
    ap.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent s (0: uniform)")
    ap.add_argument("--hot", type=int, default=3, help="explicit hot identities")
    ap.add_argument("--hot-share", type=float, default=0.05, help="share of all traffic on the hot identities")
    ap.add_argument("--rate", type=float, default=1_000_000.0, help="requests/s, whole fleet")
    ap.add_argument("--shards", default="1,8", help="shards on hot identities; a list compares scenarios")
    ap.add_argument("--shard-scope", choices=["hot", "explicit", "all"], default="hot")
    ap.add_argument("--hot-min-share", type=float, default=0.005,
                    help="with --shard-scope hot: Zipf identities with at least this share are sharded too")
    ap.add_argument("--hot-limit", type=float, default=0.0,
                    help="allowed req/s of each explicit hot identity (0: never refused)")
    ap.add_argument("--limits", type=int, default=1, help="limits (keys) per identity")
    ap.add_argument("--algorithm", choices=sorted(BYTES_PER_KEY), default="token_bucket")
    ap.add_argument("--ttl-s", type=float, default=120.0, help="state TTL (refill time + 60 s)")
    ap.add_argument("--redis-mode", choices=["auto", "single", "cluster"], default="auto")
    ap.add_argument("--max-in-flight", type=int, default=0, help="0: 1 (one Redis) or 8 (cluster)")
    ap.add_argument("--max-requests", type=int, default=64)
    ap.add_argument("--timeout-ms", type=float, default=150.0)
    ap.add_argument("--connections", type=int, default=0,
                    help="closed loop: connections per proxy (like wrk -c), think time set to give --rate; "
                         "0: open loop, Poisson arrivals")
    ap.add_argument("--no-deny-cache", action="store_true")
    ap.add_argument("--target", type=float, default=0.7, help="utilisation target of the hottest node")
    ap.add_argument("--requests", type=int, default=100_000, help="requests simulated per iteration")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--top-ranks", type=int, default=64, help="Zipf ranks modelled one by one")
    ap.add_argument("--api-keys", default="",
                    help="place identity i by the real slot of API key FORMAT.format(i), e.g. "
                         "client-{} (as make bench's keys10k.lua); default: a uniform hash")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--calibration", help="JSON file: rtt_ms, call_us, per_request_us[, rtt_jitter, source]")
    ap.add_argument("--rtt-ms", type=float)
    ap.add_argument("--call-us", type=float)
    ap.add_argument("--per-request-us", type=float)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    pre = ap.parse_known_args(argv)[0]
    if pre.small:
        ap.set_defaults(**PRESETS["small"])
    return ap.parse_args(argv)


def params_from_args(a) -> list:
    cal = Calibration.load(a.calibration) if a.calibration else Calibration()
    if a.small and not a.calibration:
        cal.rtt_ms = SMALL_RTT_MS
    if a.rtt_ms is not None:
        cal.rtt_ms = a.rtt_ms
    if a.call_us is not None:
        cal.call_us = a.call_us
    if a.per_request_us is not None:
        cal.per_request_us = a.per_request_us
    base = Params(proxies=a.proxies, workers=a.workers, nodes=a.nodes, identities=a.identities,
                  zipf=a.zipf, hot=a.hot, hot_share=a.hot_share, rate=a.rate,
                  shard_scope=a.shard_scope, hot_min_share=a.hot_min_share, hot_limit=a.hot_limit,
                  limits=a.limits, algorithm=a.algorithm, ttl_s=a.ttl_s, redis_mode=a.redis_mode,
                  max_in_flight=a.max_in_flight, max_requests=a.max_requests,
                  timeout_ms=a.timeout_ms, connections=a.connections, deny_cache=not a.no_deny_cache, target=a.target,
                  requests=a.requests, iterations=a.iterations, top_ranks=a.top_ranks,
                  api_keys=a.api_keys,
                  seed=a.seed, cal=cal)
    shards = [int(x) for x in str(a.shards).split(",") if x.strip()]
    for s in shards:
        if not 1 <= s <= 64:
            raise SystemExit("--shards: each value must be 1..64")
    return [replace(base, shards=s) for s in shards]


def _clean(x):
    """JSON has no NaN or infinity: null instead."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    results = [run(p) for p in params_from_args(a)]
    if a.json:
        print(json.dumps({"scenarios": _clean(results)}, indent=1, allow_nan=False))
    else:
        print("\n\n".join(report(r) for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
