"""Flow control as a function of time: the token bucket, yielding to "not now", groups, and the contract's fields."""

import unittest

from runner.contract.text import parse_contract_text
from runner.execution.flow import Flow, TokenBucket
from runner.contract.effects import flow_problems

from tests.support.util import contract_block, contract_markdown

import json


class TokenBucketTest(unittest.TestCase):
    def test_a_burst_then_one_token_per_interval(self) -> None:
        bucket = TokenBucket(per_second=10, burst=3, now=0.0)
        self.assertEqual([bucket.take(0.0) for _ in range(3)], [None, None, None])
        self.assertAlmostEqual(bucket.take(0.0), 0.1)
        self.assertIsNone(bucket.take(0.1))
        self.assertAlmostEqual(bucket.take(0.1), 0.2)
        self.assertIsNone(bucket.take(10.0))  # saved up again, at most the burst
        self.assertEqual(sum(bucket.take(10.0) is None for _ in range(5)), 2)


class FlowTest(unittest.TestCase):
    def test_not_now_pauses_every_call_and_halves_the_calls_in_flight(self) -> None:
        flow = Flow(limit=32, now=0.0)
        self.assertTrue(flow.call_room(31))
        self.assertFalse(flow.call_room(32))
        self.assertTrue(flow.room(127), "four times as many effects as calls: answered ones wait to be looked up together")
        self.assertFalse(flow.room(128))
        self.assertFalse(Flow(limit=1).room(1), "one call at a time: one effect at a time")
        flow.answered("not-applied", now=5.0, retry_after=2.0)
        self.assertEqual((flow.in_use, flow.ready(5.5), flow.ready(7.0)), (16.0, 7.0, None))
        self.assertFalse(flow.call_room(16))
        flow.answered("not-applied", now=5.1, retry_after=0.5)
        self.assertEqual((flow.paused_until, flow.in_use), (7.0, 16.0), "the later of the times given; not halved again within the pause")
        flow.answered("not-applied", now=7.5, retry_after=0.5)
        self.assertEqual((flow.paused_until, flow.in_use), (8.0, 8.0), "a push back after the pause halves again")
        for _ in range(8):
            flow.answered("receipt", now=8.0)
        self.assertAlmostEqual(flow.in_use, 9.0, delta=0.1)  # one more per round of successful calls
        for _ in range(1000):
            flow.answered("receipt", now=8.0)
        self.assertEqual(flow.in_use, 32.0, "climbs back while calls succeed, up to the limit")
        for n in range(10):
            flow.answered("not-applied", now=9.0 + n)
        self.assertTrue(flow.call_room(0) and not flow.call_room(1), "never below one")

    def test_groups_bound_effects_in_flight_per_key(self) -> None:
        flow = Flow(limit=8, group={"key": "{payload.customer}", "limit": 2})
        acme = flow.group_of({"key": "k1", "slug": "a", "payload": {"customer": "acme"}})
        self.assertEqual(acme, "acme")
        flow.take_group(acme, +1)
        flow.take_group(acme, +1)
        self.assertFalse(flow.group_room(acme))
        self.assertTrue(flow.group_room(flow.group_of({"payload": {"customer": "globex"}})))
        flow.take_group(acme, -1)
        self.assertTrue(flow.group_room(acme))
        self.assertIsNone(Flow(limit=2).group_of({"payload": {}}))

    def test_the_contract_fields_are_checked(self) -> None:
        good = {"concurrency": 16, "rate": {"per_second": 50, "burst": 10}, "concurrency_key": {"key": "{payload.host}-{slug}", "limit": 2}}
        self.assertEqual(flow_problems(good), [])
        bad = {
            "concurrency": 0,
            "rate": {"per_second": -1},
            "concurrency_key": {"key": "{nope}", "limit": 1},
        }
        problems = flow_problems(bad)
        self.assertEqual(len(problems), 3, problems)
        self.assertIn("{nope}", problems[2])
        block = contract_block()
        block["effects"] = dict(block.get("effects", {}), concurrency=1000)
        _, found = parse_contract_text(contract_markdown(json.dumps(block, indent=2)))
        self.assertTrue(any("concurrency" in p.message for p in found), found)



class TokenBucketRoundingTest(unittest.TestCase):
    def test_a_token_due_now_is_taken_and_every_wait_moves_the_clock(self) -> None:
        # On a clock near 1.7e9 seconds, a token due exactly now is often 0.99999... of a token after the float
        # arithmetic; a wait for that sliver would end at the same representable instant, again and again.
        from runner.execution.flow import TokenBucket

        slivers = 0
        for per_second in (0.5, 2.0, 3.0, 10.0, 7.0):
            start = 1_764_633_600.123
            bucket = TokenBucket(per_second, 1, start)
            now = start
            for _ in range(500):
                due = bucket.take(now)
                if due is None:
                    now += 1.0 / per_second  # the next token is due exactly then
                    continue
                self.assertGreater(due, now, "a wait that ends where it began would never end")
                slivers += (due - now) < 1e-3
                now = due
        self.assertEqual(slivers, 0)


if __name__ == "__main__":
    unittest.main()
