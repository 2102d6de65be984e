"""The test case the recovery and view tests share: worlds of the minute-37 contract, removed at clean-up.

Apart from ``tests/support/recovery.py`` because the recovery workers import that module in child
processes, which need none of ``unittest``.
"""

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
import unittest
from typing import Any, Callable, Dict, Optional

from runner.execution.run import Run

try:
    from .cli import RunnerCli
    from .recovery import DEADLINE, DECISION_KEYS, PATCH_KEY, STEPS, Child, World, process_gone
except ImportError:  # run from inside tests/
    from cli import RunnerCli  # type: ignore[no-redef]
    from recovery import DEADLINE, DECISION_KEYS, PATCH_KEY, STEPS, Child, World, process_gone  # type: ignore[no-redef]


class RecoveryCase(unittest.TestCase):
    """Shared set-up: temporary worlds whose job processes and children are ended at clean-up."""

    def world(self, rerun_vanished: bool = False, create: bool = True) -> World:
        world = World(tempfile.mkdtemp(prefix="runner-recovery-"), rerun_vanished)
        self.addCleanup(self._remove, world)
        if create:
            world.create_run()
        return world

    @classmethod
    def _remove(cls, world: World) -> None:
        """End the world's jobs and remove it; again while a process that was on its way (a job a launcher was
        starting, a killed one finishing its last write) still adds to it, so that nothing is left behind."""
        deadline = time.monotonic() + DEADLINE
        while True:
            cls._end_jobs(world)
            shutil.rmtree(world.root, ignore_errors=True)
            if not os.path.exists(world.root):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{world.root} is still written to: {sorted(os.listdir(world.root))}")
            time.sleep(0.05)

    @staticmethod
    def _end_jobs(world: World) -> None:
        for path in world.pid_files():
            try:
                with open(path, encoding="utf-8") as handle:
                    pid = int(json.load(handle)["pid"])
            except (OSError, ValueError, KeyError):
                continue
            if not process_gone(pid):
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)

    def child(self, spec: Dict[str, Any]) -> Child:
        child = Child.worker(spec)
        self.addCleanup(child.close)
        return child

    def open_run(self, world: World, clock: Optional[Callable[[], float]] = None) -> Run:
        run = Run.open(world.run, clock=clock)
        self.addCleanup(run.store.fs.close)  # type: ignore[attr-defined]
        return run

    def cli(self, world: World) -> RunnerCli:
        """The command line on ``world``'s run."""
        return RunnerCli(self, root=world.root, run_dir=world.run)

    # -- checks shared by the scenarios ----------------------------------------------------
    def assert_decision_shape(self, decision: Dict[str, Any]) -> None:
        for key in DECISION_KEYS:
            self.assertIn(key, decision)
        for item in decision["observations"]:
            self.assertIn("source", item)
            self.assertIn("digest", item)
        self.assertIsInstance(decision["inferences"], list)
        self.assertIsInstance(decision["unknowns"], list)

    def assert_nothing_redone(self, world: World) -> Dict[str, Any]:
        """From the journal: no step started after it was done; no effect begun after it was verified."""
        done, verified = set(), set()
        starts: Dict[str, int] = {}
        begins: Dict[str, int] = {}
        for record in world.records():
            for op in record["ops"]:
                if op[0] != "set":
                    continue
                path, value = op[1], op[2]
                if path[0] == "steps" and len(path) == 2:
                    self.assertNotIn(path[1], done, f"step {path[1]} started again at revision {record['rev']} after it was done")
                    starts[path[1]] = starts.get(path[1], 0) + 1
                elif path[0] == "steps" and path[2:] == ["state"] and value == "done":
                    done.add(path[1])
                elif path[0] == "effects" and len(path) == 2 and value.get("state") == "started":
                    self.assertNotIn(path[1], verified, f"effect {path[1]} begun again at revision {record['rev']} after it was verified")
                    begins[path[1]] = begins.get(path[1], 0) + 1
                elif path[0] == "effects" and path[2:] == ["state"] and value == "verified":
                    verified.add(path[1])
        return {"starts": starts, "begins": begins, "done": done, "verified": verified}

    def assert_completed_once(self, world: World, job_attempts: int = 1) -> Dict[str, Any]:
        """The run is complete; every step ran once; the change reached the target once; the job ran as often as allowed."""
        state = world.state()
        self.assertEqual(state["status"], "complete")
        self.assertEqual(state["completed_steps"], list(STEPS))
        for step in STEPS:
            self.assertEqual(state["steps"][step]["attempts"], 1, step)
        seen = self.assert_nothing_redone(world)
        self.assertEqual(seen["starts"], {step: 1 for step in STEPS})
        self.assertEqual(seen["begins"], {PATCH_KEY: 1})
        self.assertEqual(state["effects"][PATCH_KEY]["state"], "verified")
        self.assertEqual(world.invocations(), [f"{PATCH_KEY} {state['effects'][PATCH_KEY]['payload_digest']}"])
        self.assertEqual(state["jobs"]["tests"]["attempt"], job_attempts)
        self.assertEqual(len(world.pid_files()), job_attempts)
        self.assertEqual(state["steps"]["tests"]["evidence"], {"exit_code": 0, "log_sha256": state["jobs"]["tests"]["log_sha256"]})
        return state
