"""Tests of the fleet model (tests/sim/fleet.py).

Run from the repository root: python3 -m unittest tests/sim/test_fleet.py
Small simulations only: the whole file takes a few seconds.
"""

import math
import os
import random
import sys
import unittest
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fleet  # noqa: E402


def small(**kw) -> fleet.Params:
    """A quick scenario: few requests, few iterations."""
    base = dict(proxies=10, workers=2, nodes=3, identities=100_000, zipf=0.0, hot=0,
                hot_share=0.0, rate=20_000.0, requests=6_000, iterations=3, seed=7)
    base.update(kw)
    return fleet.Params(**base)


def node_shares(result) -> list:
    return [n["call_fraction"] for n in result["nodes"]]


class ZipfSampler(unittest.TestCase):
    def exact(self, n, s):
        w = [r ** -s for r in range(1, n + 1)]
        z = sum(w)
        return [x / z for x in w]

    def test_frequencies_match_exact_pmf_across_head_and_tail(self):
        n, s = 200_000, 1.1
        z = fleet.Zipf(n, s, head=1_000)  # ranks past 1,000 come from the continuous tail
        exact = self.exact(n, s)
        rng = random.Random(3)
        draws = 200_000
        buckets = [(1, 1), (2, 2), (3, 10), (11, 100), (101, 1_000), (1_001, 10_000), (10_001, n)]
        counts = [0] * len(buckets)
        for _ in range(draws):
            r = z.sample(rng)
            self.assertTrue(1 <= r <= n)
            for i, (a, b) in enumerate(buckets):
                if a <= r <= b:
                    counts[i] += 1
                    break
        for (a, b), c in zip(buckets, counts):
            want = sum(exact[a - 1:b])
            got = c / draws
            sigma = math.sqrt(want * (1 - want) / draws)
            self.assertLess(abs(got - want), 5 * sigma + 0.002, f"ranks {a}-{b}: {got} vs {want}")
            # The analytic mass (used for traffic shares) agrees with the exact sum too.
            self.assertAlmostEqual(z.mass(a, b), want, delta=0.002)

    def test_exact_when_all_ranks_fit_in_the_table(self):
        z = fleet.Zipf(1_000, 1.1)
        exact = self.exact(1_000, 1.1)
        for r in (1, 2, 10, 1_000):
            self.assertAlmostEqual(z.pmf(r), exact[r - 1], places=12)
        self.assertAlmostEqual(z.mass(1, 1_000), 1.0, places=12)

    def test_uniform_when_exponent_is_zero(self):
        z = fleet.Zipf(10, 0.0)
        rng = random.Random(5)
        counts = [0] * 10
        for _ in range(50_000):
            counts[z.sample(rng) - 1] += 1
        for c in counts:
            self.assertLess(abs(c / 50_000 - 0.1), 0.01)

    def test_expected_distinct_is_bounded_by_draws_and_identities(self):
        z = fleet.Zipf(1_000_000, 1.1, head=10_000)
        few = z.expected_distinct(100)
        self.assertTrue(50 < few <= 100)
        many = z.expected_distinct(1e12)
        self.assertAlmostEqual(many, 1_000_000, delta=1_000_000 * 0.01)


class Placement(unittest.TestCase):
    def test_one_node_takes_every_call(self):
        r = fleet.run(small(nodes=1, zipf=1.1, hot=2, hot_share=0.1))
        self.assertEqual(len(r["nodes"]), 1)
        self.assertEqual(r["mode"], "single")
        self.assertAlmostEqual(r["nodes"][0]["call_fraction"], 1.0)
        self.assertAlmostEqual(r["calls_per_s_node_max"], r["calls_per_s_total"])

    def test_one_node_cluster_takes_every_call_too(self):
        r = fleet.run(small(nodes=1, redis_mode="cluster"))
        self.assertEqual(r["mode"], "cluster")
        self.assertAlmostEqual(r["nodes"][0]["call_fraction"], 1.0)

    def test_uniform_keys_spread_evenly_over_nodes(self):
        for nodes in (3, 8):
            r = fleet.run(small(nodes=nodes, identities=1_000_000))
            for share in node_shares(r):
                self.assertAlmostEqual(share, 1 / nodes, delta=0.1 / nodes, msg=f"{nodes} nodes")

    def test_shards_reduce_the_hot_nodes_share(self):
        p = small(nodes=8, hot=1, hot_share=0.4, shard_scope="explicit")
        plain = fleet.run(p)
        sharded = fleet.run(replace(p, shards=8))
        self.assertGreater(max(node_shares(plain)), 0.4)
        self.assertLess(max(node_shares(sharded)), max(node_shares(plain)) - 0.15)
        self.assertLess(sharded["hot_node_utilisation"], plain["hot_node_utilisation"])
        # Sharding moves load, it does not add calls.
        self.assertAlmostEqual(sharded["calls_per_s_total"], plain["calls_per_s_total"],
                               delta=0.05 * plain["calls_per_s_total"])

    def test_slot_hash_is_uniform_and_node_ranges_are_contiguous(self):
        counts = [0] * 4
        for i in range(40_000):
            counts[fleet.node_of(fleet.key_slot(i, 0, 1), 4)] += 1
        for c in counts:
            self.assertAlmostEqual(c / 40_000, 0.25, delta=0.02)
        self.assertEqual(fleet.node_of(0, 3), 0)
        self.assertEqual(fleet.node_of(fleet.SLOTS - 1, 3), 2)
        # As redis-cli --cluster create: 0-5460, 5461-10922, 10923-16383.
        self.assertEqual(fleet.slot_ranges(3), [(0, 5460), (5461, 10922), (10923, 16383)])
        self.assertEqual(fleet.node_of(5460, 3), 0)
        self.assertEqual(fleet.node_of(5461, 3), 1)
        self.assertEqual(fleet.slot_ranges(1), [(0, 16383)])

    def test_real_key_slots(self):
        self.assertEqual(fleet.crc16(b"123456789"), 0x31C3)
        self.assertEqual(fleet.crc16(b"foo") % fleet.SLOTS, 12182)  # CLUSTER KEYSLOT foo
        # The example key of docs/design.md: rl:{header:x-api-key:a9993e36...}:api:per_second for "abc".
        tag = b"header:x-api-key:a9993e364706816aba3e25717850c26c9cd0d89d"
        self.assertEqual(fleet.api_key_slot("{}", "abc", 0, 1), fleet.crc16(tag) % fleet.SLOTS)
        self.assertEqual(fleet.api_key_slot("{}", "abc", 2, 3),
                         fleet.crc16(tag + b"#2") % fleet.SLOTS)


class Batching(unittest.TestCase):
    def test_batch_grows_with_rate_per_worker(self):
        batches = []
        for rate in (500.0, 5_000.0, 30_000.0):
            r = fleet.run(small(nodes=1, proxies=1, workers=1, rate=rate))
            batches.append(r["mean_batch"])
            self.assertAlmostEqual(r["calls_per_request"] * r["mean_batch"], 1.0, delta=0.02)
        self.assertLess(batches[0], 1.5)
        self.assertLess(batches[0], batches[1])
        self.assertLess(batches[1], batches[2])

    def test_cluster_batches_only_share_a_slot(self):
        # Many slots, light per-slot traffic: calls are ~one per request whatever the rate,
        # while one hot slot batches.
        spread = fleet.run(small(nodes=3, proxies=1, workers=1, rate=20_000.0))
        self.assertLess(spread["mean_batch"], 1.1)
        hot = fleet.run(small(nodes=3, proxies=1, workers=1, rate=20_000.0, hot=1, hot_share=0.9))
        self.assertGreater(hot["mean_batch"], spread["mean_batch"] + 0.3)

    def test_a_busy_node_grows_batches(self):
        # The same traffic against a slower node: longer round trips, bigger batches.
        p = small(nodes=1, proxies=1, workers=1, rate=20_000.0)
        fast = fleet.run(p)
        slow = fleet.run(replace(p, cal=fleet.Calibration(call_us=3.0, per_request_us=40.0)))
        self.assertGreater(slow["mean_batch"], fast["mean_batch"])

    def test_closed_loop_reaches_the_rate_and_caps_the_batch(self):
        p = small(nodes=1, proxies=1, workers=1, rate=10_000.0, connections=16, iterations=4)
        r = fleet.run(p)
        self.assertAlmostEqual(r["achieved_rate"], 10_000.0, delta=1_000.0)
        self.assertLessEqual(r["mean_batch"], 16.0)
        # Fewer connections than the rate needs: the loop runs as fast as answers come.
        r = fleet.run(replace(p, connections=2))
        self.assertLess(r["achieved_rate"], 5_000.0)
        self.assertLessEqual(r["mean_batch"], 2.0)

    def test_deny_cache_answers_refused_hot_keys(self):
        p = small(nodes=1, proxies=1, workers=1, rate=5_000.0, hot=1, hot_share=0.5,
                  hot_limit=10.0, iterations=4)
        r = fleet.run(p)
        self.assertGreater(r["deny_cache_fraction"], 0.3)
        off = fleet.run(replace(p, deny_cache=False))
        self.assertEqual(off["deny_cache_fraction"], 0.0)
        self.assertGreater(off["decisions_per_s_total"], r["decisions_per_s_total"])


class Capacity(unittest.TestCase):
    def test_more_rate_needs_more_nodes(self):
        p = small(proxies=200, nodes=4, zipf=0.8, hot=2, hot_share=0.02)
        low = fleet.run(replace(p, rate=200_000.0))["capacity"]
        high = fleet.run(replace(p, rate=800_000.0))["capacity"]
        self.assertIsNotNone(low["hash"])
        self.assertIsNotNone(high["hash"])
        self.assertGreater(high["hash"], low["hash"])
        self.assertGreater(high["rebalanced"], low["rebalanced"])
        self.assertLessEqual(low["rebalanced"], low["hash"])

    def test_nodes_needed_on_even_load(self):
        util = [4.0 / fleet.SLOTS] * fleet.SLOTS  # 4 node-equivalents spread evenly
        c = fleet.nodes_needed(util, 0.5)
        self.assertEqual(c["hash"], 8)
        self.assertEqual(c["rebalanced"], 8)

    def test_a_slot_above_the_target_needs_shards_not_nodes(self):
        util = [0.0] * fleet.SLOTS
        util[100] = 1.5
        c = fleet.nodes_needed(util, 0.7)
        self.assertIsNone(c["hash"])
        self.assertIsNone(c["rebalanced"])
        self.assertEqual(c["shards_needed_for_hottest"], 3)


class Cli(unittest.TestCase):
    def test_small_preset_and_calibration_file(self):
        import json
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"rtt_ms": 0.4, "call_us": 10, "per_request_us": 5, "source": "test"}, f)
        try:
            a = fleet.parse_args(["--small", "--rate", "8000", "--calibration", f.name,
                                  "--requests", "3000", "--iterations", "2"])
            ps = fleet.params_from_args(a)
        finally:
            os.unlink(f.name)
        self.assertEqual(len(ps), 1)
        p = ps[0]
        self.assertEqual((p.proxies, p.workers, p.nodes, p.identities), (1, 2, 3, 10_000))
        self.assertEqual(p.rate, 8000)
        self.assertEqual((p.cal.rtt_ms, p.cal.call_us, p.cal.per_request_us), (0.4, 10, 5))
        r = fleet.run(p)
        self.assertEqual(len(r["nodes"]), 3)
        self.assertAlmostEqual(sum(node_shares(r)), 1.0, places=6)
        self.assertIn("calls_per_request", r)

    def test_shards_list_gives_one_scenario_each(self):
        a = fleet.parse_args(["--shards", "1,4,8"])
        self.assertEqual([p.shards for p in fleet.params_from_args(a)], [1, 4, 8])


if __name__ == "__main__":
    unittest.main()
