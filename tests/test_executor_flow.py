"""The executor's flow in one process: calls in flight bounded, lookups of many keys made together, records grouped.

An in-process target (a Python adapter) counts the calls it has in flight at
once and records every key it created; the run is a real file store. These
tests hold the executor to its bounds and measure nothing by time.
"""

import os
import threading
import time
import unittest
from typing import Any, Dict, List, Sequence, Tuple

from collections import deque

from runner.execution.executor import Executor, Job, World
from runner.execution.slots import CallSlots
from runner.execution.flow import Flow
from runner.execution.run import Run
from runner.stores.file import RunStore
from runner.calls.target import Observation, Rejected
from tests.support.util import scratch_dir


class CountingTarget:
    """Creates on every invoke (no deduplication); counts the calls it holds at once; can look many keys up in one call."""

    name, key_scope, retention_seconds, conflicting_payload, verification, deduplicates = "counting", "test", None, "-", "lookup", False
    timeout = 10.0

    def __init__(self, latency: float = 0.02, many: bool = False) -> None:
        self.latency, self.many = latency, many
        self.lock = threading.Lock()
        self.created: List[str] = []
        self.now = self.most = self.calls = self.lookups = 0
        self.batch_key = ("counting", id(self)) if many else None
        self.observe_batch = 8

    def _call(self) -> None:
        with self.lock:
            self.now += 1
            self.calls += 1
            self.most = max(self.most, self.now)
        time.sleep(self.latency)
        with self.lock:
            self.now -= 1

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        self._call()
        with self.lock:
            self.created.append(key)
        return {"id": key}

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        self._call()
        with self.lock:
            self.lookups += 1
            return Observation("present" if key in self.created else "absent", {"key": key})

    def observe_many(self, items: Sequence[Tuple[str, Dict[str, Any], Any]]) -> List[Observation]:
        self._call()
        with self.lock:
            self.lookups += 1
            return [Observation("present" if key in self.created else "absent", {"key": key, "matches": self.created.count(key)})
                    for key, _, _ in items]


class OneCallPerWait(World):
    """Calls run when the loop waits for one, one per wait, in the order they started: the same schedule on every run.

    A look without waiting (``timeout`` 0) finds none ended, so the loop decides after each call's end.
    """

    def __init__(self) -> None:
        self.calls: "deque[Tuple[Any, Any]]" = deque()

    def start(self, tag: Any, work: Any) -> None:
        self.calls.append((tag, work))

    def wait(self, timeout: float) -> Any:
        if not self.calls or timeout <= 0:
            return None
        tag, work = self.calls.popleft()
        try:
            return tag, work()
        except Exception as exc:
            return tag, exc


def without_many(target: CountingTarget) -> None:
    """A target that cannot look many keys up: the executor must not ask it to."""
    target.batch_key = None


class FlowInTheExecutorTest(unittest.TestCase):
    def setUp(self) -> None:
        tmp = scratch_dir("runner-executor-flow-")
        self.addCleanup(tmp.cleanup)
        plan = {"contract": 1, "task_id": "flow", "goal": "g", "steps": [{"id": "s", "next": "done"}], "limits": {"max_effect_attempts": 3}}
        RunStore.create(os.path.join(tmp.name, "run"), "flow", plan)
        self.run_ = Run(RunStore.open(os.path.join(tmp.name, "run"), durability="process"))
        self.addCleanup(self.run_.store.fs.close)  # type: ignore[attr-defined]
        self.run_.acquire("w", 600)
        self.run_.step_start("s")

    def perform(self, target: CountingTarget, items: int, parallel: int) -> Executor:
        executor = Executor(self.run_, flow=Flow(parallel))
        executor.perform_all(Job(f"k{n:03d}", {"n": n}, target, "s") for n in range(items))
        return executor

    def test_calls_in_flight_never_pass_the_bound_and_each_item_is_made_once(self) -> None:
        target = CountingTarget()
        executor = self.perform(target, 60, parallel=8)
        self.assertLessEqual(target.most, 8)
        self.assertGreaterEqual(target.most, 4, "the bound is used")
        self.assertEqual(sorted(target.created), [f"k{n:03d}" for n in range(60)])
        self.assertEqual({e["state"] for e in self.run_.state["effects"].values()}, {"verified"})
        self.assertGreater(executor.figures["records"] / executor.figures["commits"], 1.0, "records of items ready together share a commit")

    def test_lookups_of_many_keys_go_together_and_count_as_one_call(self) -> None:
        target = CountingTarget(many=True)
        executor = self.perform(target, 64, parallel=4)
        self.assertLessEqual(target.most, 4)
        self.assertLess(target.lookups, 64, "lookups were made several keys at a time")
        self.assertEqual(executor.figures["calls"], 64 + target.lookups)
        self.assertEqual(len(set(target.created)), 64)
        self.assertEqual({e["state"] for e in self.run_.state["effects"].values()}, {"verified"})

    def test_while_invokes_want_slots_a_lookup_of_many_keys_waits_to_be_full(self) -> None:
        # Calls end one at a time in the order they began, so the schedule is the same on every run. Sent as soon
        # as a slot frees, each lookup carries the one key just acknowledged: 64 lookups. Held while invokes want
        # the slot, it goes out with the keys gathered meanwhile (8 effects are taken on at a time): 40.
        target = CountingTarget(latency=0.0, many=True)
        executor = Executor(self.run_, flow=Flow(4), world=OneCallPerWait())
        executor.perform_all(Job(f"k{n:03d}", {"n": n}, target, "s") for n in range(64))
        self.assertEqual(len(set(target.created)), 64)
        self.assertEqual({e["state"] for e in self.run_.state["effects"].values()}, {"verified"})
        self.assertLessEqual(target.lookups, 48, "lookups went out before keys gathered")

    def test_an_adapter_without_many_is_looked_up_one_key_at_a_time(self) -> None:
        target = CountingTarget(many=True)
        without_many(target)
        self.perform(target, 16, parallel=4)
        self.assertEqual(target.lookups, 16)

    def test_a_key_a_lookup_of_many_could_not_show_is_looked_up_alone(self) -> None:
        looked_alone: List[str] = []

        class Paged(CountingTarget):
            """Answers a lookup of many keys with its first two only: the others are unseen, however present."""

            def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
                looked_alone.append(key)
                return super().observe(key, payload)

            def observe_many(self, items: Sequence[Tuple[str, Dict[str, Any], Any]]) -> List[Observation]:
                seen = super().observe_many(items)
                return seen[:2] + [Observation("unseen", {"page": 1}) for _ in seen[2:]]

        target = Paged(latency=0.0, many=True)
        executor = Executor(self.run_, flow=Flow(4), world=OneCallPerWait())
        executor.perform_all(Job(f"k{n:03d}", {"n": n}, target, "s") for n in range(32))
        self.assertEqual(sorted(target.created), [f"k{n:03d}" for n in range(32)], "each made once")
        self.assertEqual({e["state"] for e in self.run_.state["effects"].values()}, {"verified"})
        self.assertEqual(len(looked_alone), len(set(looked_alone)), "an unseen key is looked up alone, once")
        self.assertLess(target.lookups - len(looked_alone), 32, "lookups of many keys were made")

    def test_a_target_that_lists_is_read_once_per_sweep_one_listing_at_a_time(self) -> None:
        class Listing(CountingTarget):
            """Its lookups read one listing of everything it holds, whatever keys they are for."""

            lists = True
            observe_batch = 1000
            reading = most_reading = 0
            keys_per_listing: List[int] = []

            def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
                raise AssertionError("a key of a target that lists is looked up by a listing, alone too")

            def observe_many(self, items: Sequence[Tuple[str, Dict[str, Any], Any]]) -> List[Observation]:
                with self.lock:
                    self.reading += 1
                    self.most_reading = max(self.most_reading, self.reading)
                    self.keys_per_listing.append(len(items))
                try:
                    return super().observe_many(items)
                finally:
                    with self.lock:
                        self.reading -= 1

        target = Listing(latency=0.01, many=True)
        self.perform(target, 48, parallel=4)
        self.assertEqual(sorted(target.created), [f"k{n:03d}" for n in range(48)], "each made once")
        self.assertEqual({e["state"] for e in self.run_.state["effects"].values()}, {"verified"})
        self.assertEqual(target.most_reading, 1, "one listing at a time")
        self.assertEqual(sum(target.keys_per_listing), 48, "each key found by the first listing it was in")
        self.assertLessEqual(len(target.keys_per_listing), 48 // 4, f"listings, not one per key: {target.keys_per_listing}")

    def test_a_target_that_refuses_lookups_of_many_keys_is_asked_once_then_key_by_key(self) -> None:
        class Refusing(CountingTarget):
            def observe_many(self, items: Sequence[Tuple[str, Dict[str, Any], Any]]) -> List[Observation]:
                self._call()
                with self.lock:
                    self.refused = getattr(self, "refused", 0) + 1
                raise Rejected("414 URI Too Long")

        target = Refusing(latency=0.0, many=True)
        executor = Executor(self.run_, flow=Flow(8), world=OneCallPerWait())
        executor.perform_all(Job(f"k{n:03d}", {"n": n}, target, "s") for n in range(40))
        self.assertEqual(len(set(target.created)), 40)
        self.assertEqual({e["state"] for e in self.run_.state["effects"].values()}, {"verified"})
        self.assertEqual((getattr(target, "refused", 0), target.lookups), (1, 40), "refused once, then every key alone")

    def test_one_call_at_a_time_is_one_effect_at_a_time(self) -> None:
        order: List[str] = []

        class Ordered(CountingTarget):
            def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
                order.append(f"invoke {key}")
                return super().invoke(key, payload, epoch)

            def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
                order.append(f"observe {key}")
                return super().observe(key, payload)

        self.perform(Ordered(latency=0.0), 3, parallel=1)
        self.assertEqual(order, ["invoke k000", "observe k000", "invoke k001", "observe k001", "invoke k002", "observe k002"])


class CallSlotsTest(unittest.TestCase):
    """The calls that count against the flow's limit: started, reserved, and earlier calls still at the target."""

    def test_every_kind_of_call_at_the_target_fills_a_slot(self) -> None:
        slots = CallSlots(Flow(3))
        self.assertTrue(slots.room())
        slots.start()  # a call of this executor
        slots.reserve()  # an invoke whose started is being committed
        slots.waits_on_earlier("k1")  # a call an earlier holder left at the target
        self.assertFalse(slots.room())
        slots.earlier_done("k1")
        self.assertTrue(slots.room())

    def test_an_earlier_call_counts_once_however_often_its_key_waits_for_it(self) -> None:
        slots = CallSlots(Flow(2))
        for _ in range(3):
            slots.waits_on_earlier("k1")
        self.assertTrue(slots.room())
        slots.waits_on_earlier("k2")
        self.assertFalse(slots.room())
        slots.forget_earlier()
        self.assertEqual((slots.started, slots.reserved, slots.earlier), (0, 0, set()))

    def test_a_reserved_slot_passes_to_its_call_or_is_given_back(self) -> None:
        slots = CallSlots(Flow(1))
        slots.reserve()
        self.assertFalse(slots.room())
        slots.unreserve()
        slots.start()  # the call it was reserved for started
        self.assertEqual((slots.started, slots.reserved), (1, 0))
        self.assertFalse(slots.room())
        slots.release()
        slots.reserve()
        slots.unreserve()  # a commit that failed: the call never starts
        self.assertEqual((slots.started, slots.reserved), (0, 0))
        self.assertTrue(slots.room())

    def test_the_room_follows_the_flow_s_limit_as_it_pushes_back(self) -> None:
        flow = Flow(4)
        slots = CallSlots(flow)
        slots.start()
        slots.start()
        self.assertTrue(slots.room())
        flow.answered("not-applied", 1.0)  # halves the calls in use: 2
        self.assertFalse(slots.room())


if __name__ == "__main__":
    unittest.main()
