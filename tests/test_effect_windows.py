"""Crash windows of one external effect, with real worker processes and a real ticket service.

Each window test drives three keys with worker processes
(tests/support/scripts/effect_worker.py): the first key completes, then a worker is
SIGKILLed at the window for each of the other two. After each kill the test
checks that the ledger and the service are in the state that window
implies; the next worker takes the lease at a higher epoch and resumes. The
service must end with exactly one ticket per key, every key sent to it
exactly once, and every effect verified.

Kills per test: the window tests 2 each (three keys: the first completes,
the other two each lose a worker), the retention test 1, the others 0.
``KILLS`` records them and the class prints the tally.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid
from typing import Any, Dict, List, Optional, Tuple

from runner.calls.target import StaleEpoch
from runner.base.errors import Fenced, NeedsReconciliation
from runner.execution.run import Run
from runner.stores.file import RunStore
from runner.proof.ticketservice import TicketServiceProcess
from tests.support.scripts.effect_worker import payload_for  # the payloads must be exactly the worker's

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "support", "scripts", "effect_worker.py")

KEYS_PER_WINDOW = 3

#: test name -> SIGKILLs it performed.
KILLS: Dict[str, int] = {}


def plan(task_id: str) -> Dict[str, Any]:
    return {
        "contract": 1,
        "task_id": task_id,
        "goal": "one ticket per key, whatever dies when",
        "steps": [{"id": "tickets"}],
        "effects": {"max_attempts": 5},
        # A NotApplied answer schedules a retry; keep that wait in milliseconds.
        "retry": {"base_seconds": 0.01, "cap_seconds": 0.02},
    }


class StallingAdapter:
    """Runs ``before_invoke`` (another worker's takeover) between the ``started`` commit and the request.

    The executor keeps renewing the lease while a call runs, so the stalled
    owner learns it was fenced while its call is still on its way; ``sent``
    is set once the request has gone out and its answer came back.
    """

    def __init__(self, inner: Any, before_invoke: Any) -> None:
        self.inner = inner
        self.before_invoke = before_invoke
        self.sent = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        try:
            self.before_invoke()
            return self.inner.invoke(key, payload, epoch)
        finally:
            self.sent.set()

    def observe(self, key: str, payload: Dict[str, Any]) -> Any:
        return self.inner.observe(key, payload)


class EffectWindowTests(unittest.TestCase):
    tmp = ""
    service: TicketServiceProcess

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="effect-windows-")
        cls.service = TicketServiceProcess(os.path.join(cls.tmp, "tickets.db"))

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            stats = cls.service.stats()
        finally:
            cls.service.stop()
            shutil.rmtree(cls.tmp, ignore_errors=True)
        # Every test used its own keys and markers: the service as a whole holds no duplicate.
        if stats["duplicates"] != 0:
            raise AssertionError(f"the service holds duplicate tickets: {stats}")
        tally = ", ".join(f"{name} {count}" for name, count in sorted(KILLS.items()))
        sys.stderr.write(f"\nkills per test: {tally} (total {sum(KILLS.values())})\n")

    def setUp(self) -> None:
        self.service.reset_faults()
        self.name = self.id().rsplit(".", 1)[-1]
        self.scope = f"{self.name}-{uuid.uuid4().hex[:8]}"
        self.run_dir = os.path.join(self.tmp, self.scope)
        RunStore.create(self.run_dir, self.scope, plan(self.scope))
        self.kills = 0
        self.posts_before = self.requests()["post_tickets"]

    def tearDown(self) -> None:
        KILLS[self.name] = self.kills

    # -- helpers -------------------------------------------------------------------------
    def keys(self, n: int) -> List[str]:
        return [f"{self.scope}.k{i}" for i in range(1, n + 1)]

    def requests(self) -> Dict[str, int]:
        return self.service.stats()["requests"]

    def posts(self) -> int:
        return self.requests()["post_tickets"] - self.posts_before

    def worker(self, keys: List[str], *, window: Optional[int] = None, kill_key: Optional[str] = None, retention: Optional[float] = None) -> Tuple[int, List[Dict[str, Any]]]:
        # -S: the worker needs the standard library only; skipping site-packages saves start-up time per kill.
        command = [sys.executable, "-S", WORKER, "--run", self.run_dir, "--url", self.service.url, "--run-id", self.scope, "--keys", ",".join(keys)]
        if window is not None:
            command += ["--kill-window", str(window), "--kill-key", str(kill_key)]
        if retention is not None:
            command += ["--retention-seconds", repr(retention)]
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        lines = [json.loads(line) for line in done.stdout.decode().splitlines() if line.strip()]
        if done.returncode not in (0, -signal.SIGKILL, 8):
            self.fail(f"worker exited {done.returncode}: {done.stderr.decode()[-2000:]}")
        if done.returncode == -signal.SIGKILL:
            self.kills += 1
        return done.returncode, lines

    def ledger(self) -> Dict[str, Any]:
        return Run.open(self.run_dir).state

    def tickets(self, key: str) -> int:
        return len(self.service.tickets_for_key(key))

    def assert_one_ticket_each(self, keys: List[str]) -> None:
        for key in keys:
            found = self.service.tickets_for_key(key)
            self.assertEqual(len(found), 1, f"{key}: {found}")
            self.assertEqual(found[0]["marker"], key)

    # -- the five windows ---------------------------------------------------------------------
    #: window -> (the effect's state in the ledger after the kill, tickets at the service)
    AFTER_KILL = {
        1: (None, 0),
        2: ("started", 0),
        3: ("started", 1),
        4: ("started", 1),
        5: ("acknowledged", 1),
    }

    def check_window(self, window: int) -> None:
        """Key 1 completes; worker 1 dies at key 2, worker 2 resumes key 2 and dies at key 3; worker 3 finishes."""
        keys = self.keys(KEYS_PER_WINDOW)
        for i, key in enumerate(keys[1:], 1):
            code, out = self.worker(keys[: i + 1], window=window, kill_key=key)
            self.assertEqual(code, -signal.SIGKILL, f"the worker was meant to die at window {window} of {key}: {out}")
            # Each worker took the lease at a higher epoch than the one it replaced.
            self.assertEqual(out[0], {"event": "acquired", "epoch": i})
            effect = self.ledger()["effects"].get(key)
            state, tickets = self.AFTER_KILL[window]
            self.assertEqual(effect["state"] if effect else None, state, f"window {window}, {key}: {effect}")
            self.assertEqual(self.tickets(key), tickets, f"window {window}, {key}")
        code, out = self.worker(keys)
        self.assertEqual(code, 0, out)
        self.assertEqual(out[0], {"event": "acquired", "epoch": len(keys)})
        effects = self.ledger()["effects"]
        for key in keys:
            self.assertEqual(effects[key]["state"], "verified", f"{key}: {effects[key]}")
            self.assertEqual(effects[key]["evidence"]["lookup"], "by-key")
        self.assert_one_ticket_each(keys)
        # Each key reached the service once: resumed effects were settled by lookup, not resent.
        self.assertEqual(self.posts(), len(keys))
        killed_attempts = 2 if window == 2 else 1  # window 2: observed absent, then one more attempt
        self.assertEqual([effects[k]["attempts"] for k in keys], [1] + [killed_attempts] * (len(keys) - 1))

    def test_window_1_before_started_is_committed(self) -> None:
        self.check_window(1)

    def test_window_2_after_started_before_the_request(self) -> None:
        self.check_window(2)

    def test_window_3_after_the_target_committed_before_the_response(self) -> None:
        self.check_window(3)

    def test_window_4_after_the_response_before_the_ack(self) -> None:
        self.check_window(4)

    def test_window_5_after_the_ack_before_verification(self) -> None:
        self.check_window(5)

    # -- the rest of the effect contract ----------------------------------------------------
    def test_completed_run_again_calls_nothing(self) -> None:
        keys = self.keys(3)
        run = Run.open(self.run_dir)
        run.acquire("worker", 60)
        adapter = self.service.adapter(run_id=self.scope)
        for key in keys:
            run.drive_effect(key, payload_for(key), adapter)
        before = self.requests()
        code, out = self.worker(keys)
        self.assertEqual(code, 0, out)
        self.assertEqual([line.get("state") for line in out[1:]], ["verified"] * 3)
        self.assertEqual(self.requests(), before, "a verified effect must not reach the service again, not even a lookup")
        self.assert_one_ticket_each(keys)

    def test_lost_response_is_reconciled_by_lookup_not_retried(self) -> None:
        run = Run.open(self.run_dir)
        run.acquire("in-process", 60)
        adapter = self.service.adapter(run_id=self.scope, timeout=0.25)
        dropped, delayed = self.keys(2)
        self.service.set_faults(drop_after_commit=1)
        effect = run.drive_effect(dropped, payload_for(dropped), adapter)
        self.assertEqual((effect["state"], effect["attempts"]), ("verified", 1))
        self.assertTrue(effect["reason"].startswith("unknown outcome"), effect)
        # An answer slower than the client's timeout is the same kind of loss.
        self.service.set_faults(delay_response_seconds={"value": 1.0, "times": 1})
        effect = run.drive_effect(delayed, payload_for(delayed), adapter)
        self.assertEqual((effect["state"], effect["attempts"]), ("verified", 1))
        self.assertIn("timed out", effect["reason"])
        self.assertEqual(self.posts(), 2)
        self.assert_one_ticket_each([dropped, delayed])
        stats = self.requests()
        self.assertGreaterEqual(stats["dropped"], 1)
        self.assertGreaterEqual(stats["delayed"], 1)

    def test_refused_before_processing_gets_one_more_attempt(self) -> None:
        run = Run.open(self.run_dir)
        run.acquire("in-process", 60)
        key = self.keys(1)[0]
        self.service.set_faults(unavailable=1)
        effect = run.drive_effect(key, payload_for(key), self.service.adapter(run_id=self.scope))
        self.assertEqual((effect["state"], effect["attempts"]), ("verified", 2))
        self.assertEqual(self.posts(), 2)
        self.assert_one_ticket_each([key])

    def test_expired_retention_with_unknown_outcome_stops_for_reconciliation(self) -> None:
        first, second = self.keys(2)
        code, _ = self.worker([first, second], window=3, kill_key=first)
        self.assertEqual(code, -signal.SIGKILL)
        self.assertEqual(self.tickets(first), 1)
        # The service's retention window passes: it forgets the key, so its lookup can prove nothing.
        self.service.set_faults(retention_seconds=0)
        code, out = self.worker([first, second], retention=0)
        self.assertEqual(code, 8, out)
        self.assertEqual(out[-1]["error"], "needs-reconciliation")
        effects = self.ledger()["effects"]
        self.assertEqual(effects[first]["state"], "uncertain")
        self.assertNotIn(second, effects, "nothing after the unknown effect was started")
        # Asking again changes nothing: still no blind retry.
        run = Run.open(self.run_dir)
        run.acquire("worker", 60)
        with self.assertRaises(NeedsReconciliation):
            run.drive_effect(first, payload_for(first), self.service.adapter(run_id=self.scope, retention_seconds=0))
        self.assertEqual(self.ledger()["effects"][first]["state"], "uncertain")
        self.assertEqual(self.posts(), 1, "the only POST is the first worker's")
        self.assertEqual(self.tickets(first), 1)

    def test_late_write_of_the_old_owner_is_refused_by_store_and_service(self) -> None:
        now = [time.time()]

        def clock() -> float:
            return now[0]

        stalled, other, late = self.keys(3)
        old = Run.open(self.run_dir, clock=clock)
        old.acquire("worker-a", 30)
        new_adapter = self.service.adapter(run_id=self.scope)
        box: Dict[str, Run] = {}

        def takeover() -> None:
            now[0] += 60  # the old owner stalls past its lease; another worker takes over
            new = Run.open(self.run_dir, clock=clock)
            new.acquire("worker-b", 30)
            new.drive_effect(other, payload_for(other), new_adapter)
            box["new"] = new

        refused_before = self.requests()["refused_stale"]
        stalling = StallingAdapter(self.service.adapter(run_id=self.scope), takeover)
        with self.assertRaises(Fenced):
            old.drive_effect(stalled, payload_for(stalled), stalling)
        self.assertTrue(stalling.sent.wait(30), "the stalled request went out")
        self.assertEqual(self.requests()["refused_stale"], refused_before + 1, "the stalled request must reach the service and be refused (412)")
        self.assertEqual(self.tickets(stalled), 0)
        # The store refuses the old owner's next write, and the service its next request.
        with self.assertRaises(Fenced):
            old.effect_begin(late, payload_for(late))
        with self.assertRaises(StaleEpoch):
            self.service.adapter(run_id=self.scope).invoke(late, payload_for(late), int(old.epoch or 0))
        self.assertEqual(self.tickets(late), 0)
        # The new owner settles the stalled effect: observed absent, then one attempt at its own epoch.
        new = box["new"]
        effect = new.drive_effect(stalled, payload_for(stalled), new_adapter, sleep=lambda seconds: now.__setitem__(0, now[0] + seconds))
        self.assertEqual((effect["state"], effect["attempts"]), ("verified", 2))
        self.assertEqual(new.state["lease"]["epoch"], 2)
        self.assertEqual(new.state["counters"]["recoveries"], 1)
        self.assert_one_ticket_each([stalled, other])


if __name__ == "__main__":
    unittest.main()
