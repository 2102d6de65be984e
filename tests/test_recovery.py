"""Recovery claims of the runner, proved with real processes.

A worker driving the minute-37 contract (``tests/support/recovery.py``: its world,
agent and child workers) is killed at named points; recovery always happens
in another process, which starts with ``recover --owner NEW --json`` and then
follows ``next`` alone. Every scenario ends with each step run once and the
change at the target made once. The views a fresh model or an observer reads
(``brief``, ``events``, ``report``) are proved in ``test_views``.
"""

import json
import os
import signal
import sys
import unittest
import warnings
from typing import Any, Callable, Dict, List, Tuple

try:
    from .support import util as _util
    from .support.recovery import (Agent, Child, PATCH_KEY, STEPS, TAKEOVER_TTL, World, contract_block, process_gone,
                                   wait_until)
    from .support.recovery_case import RecoveryCase
except ImportError:  # run from inside tests/
    from support import util as _util  # type: ignore[no-redef]
    from support.recovery import (Agent, Child, PATCH_KEY, STEPS, TAKEOVER_TTL, World,  # type: ignore[no-redef]
                                  contract_block, process_gone, wait_until)
    from support.recovery_case import RecoveryCase  # type: ignore[no-redef]

from runner.contract.text import load_contract
from runner.base.canonical import content_digest
from runner.base.errors import EXIT_CODES
from runner.execution.jobs import observe_job
from runner.execution.run import Run, submit_job
from runner.stores.file import JOURNAL


def _started_or_resumed(trace: List[Dict[str, Any]]) -> List[Tuple[str, str]]:
    return [(t["kind"], t["step"]) for t in trace if t["kind"] in ("start-step", "resume-step")]


class NextDrivenRunTest(RecoveryCase):
    """An agent that follows only ``next --json`` and the step, effect and job verbs completes the run.

    Killed with SIGKILL after ``step start``, after ``effect begin`` (with the
    change already sent, before ``ack``) or after ``job submit``, the worker
    is replaced by a new process that runs ``recover --owner NEW --json`` and
    then follows ``next`` alone: the run completes, no step is started again
    after it was done, the effect is begun once and reaches the target once.
    """

    KILL_POINTS = {
        "after-step-start:edits": ("resume-step", "edits"),
        f"after-effect-invoke:{PATCH_KEY}": ("reconcile", PATCH_KEY),
        "after-job-submit:tests": ("job", "tests"),
    }

    def uninterrupted(self) -> Dict[str, Any]:
        """The agent in this process, from ``lease acquire`` to ``complete``."""
        world = self.world()
        world.open_gate()
        agent = Agent(world, _util.in_process_cli, "agent-1", poll=0.05)
        agent.acquire(TAKEOVER_TTL)
        first_code, first = agent.next()
        self.assertEqual(first_code, 0)
        self.assert_decision_shape(first)
        self.assertEqual((first["decision"], first["action"]["kind"], first["action"]["step"]), ("act", "start-step", "analysis"))
        self.assertEqual(first["action"]["evidence"], ["sha256"])
        agent.act(first["action"])
        code, decision = agent.drive()
        self.assertEqual((code, decision["decision"], decision["reason"]), (10, "stop", "complete"), decision)
        self.assert_decision_shape(decision)
        self.assertEqual(_started_or_resumed(agent.trace), [("start-step", s) for s in STEPS])
        state = self.assert_completed_once(world)
        self.assertEqual(state["counters"]["recoveries"], 0)
        return state

    def killed(self, label: str) -> Dict[str, Any]:
        """A worker child paused at ``label`` and SIGKILLed; a second child recovers and finishes."""
        world = self.world()
        world.open_gate()
        worker = self.child({"mode": "work", "owner": "worker-1", "pause_at": [label], **world.spec()})
        self.assertEqual(worker.expect("PAUSED")["label"], label)
        worker.kill()
        self.assertEqual(worker.proc.returncode, -signal.SIGKILL)
        successor = self.child({"mode": "recover", "owner": "worker-2", **world.spec()})
        first = successor.expect("DECISION")
        done = successor.expect("DONE")
        self.assertEqual(successor.wait(), 0)

        decision = first["decision"]
        self.assertEqual(first["code"], 0, decision)
        self.assert_decision_shape(decision)
        kind, what = self.KILL_POINTS[label]
        action = decision["action"]
        if kind == "job":
            # A job that still runs is re-attached to; one that finished was recorded by recover itself.
            if action["kind"] == "wait-job":
                self.assertEqual(action["key"], what)
            else:
                self.assertEqual((action["kind"], action["step"]), ("resume-step", "tests"))
        else:
            self.assertEqual((action["kind"], action.get("step") or action.get("key")), (kind, what))
        self.assertEqual((done["code"], done["decision"]["reason"]), (10, "complete"))
        steps_named = _started_or_resumed(done["trace"])
        if kind == "job":
            self.assertEqual(steps_named, [("resume-step", "tests"), ("start-step", "deliver")])
        else:
            self.assertEqual(steps_named, [("resume-step", "edits"), ("start-step", "tests"), ("start-step", "deliver")])
        state = self.assert_completed_once(world)
        # Nobody released: every epoch after the first took over (worker-2's, and worker-1's own re-takes if its lease lapsed).
        self.assertEqual(state["counters"]["recoveries"], state["lease"]["epoch"] - 1)
        self.assertGreaterEqual(state["counters"]["recoveries"], 1)
        self.assertEqual(state["lease"]["owner"], "worker-2")
        return state

    def test_next_driven_runs_complete_with_and_without_kills(self) -> None:
        runs: List[Callable[[], Dict[str, Any]]] = [self.uninterrupted] + [lambda point=point: self.killed(point) for point in self.KILL_POINTS]  # type: ignore[misc]
        states = _util.in_parallel(runs, workers=4)
        self.assertEqual([s["status"] for s in states], ["complete"] * 4)


class Minute37Test(RecoveryCase):
    """The worker dies at minute 37, while the long test job runs; recovery neither reruns nor skips work.

    A new process re-attaches to a job that still runs (``wait-job``; the job
    keeps attempt 1 and there is one pid file), reads the result of a job that
    finished (``read-job``), and reruns a vanished job from its committed
    shard cursor only when the contract says ``rerun_vanished`` (otherwise it
    stops with ``needs-reconciliation``, exit 8). The ``tests`` step is done
    only by ``step done tests`` with its evidence, ``deliver`` is never started
    before that, and ``analysis`` and ``edits`` are never started again.
    """

    def _kill_at_minute_37(self, rerun_vanished: bool) -> Tuple[World, int]:
        world = self.world(rerun_vanished)
        worker = self.child({"mode": "work", "owner": "worker-1", "pause_at": ["after-shard:tests"], "commit_shards": True, **world.spec()})
        self.assertEqual(worker.expect("PAUSED")["label"], "after-shard:tests")
        worker.kill()
        job = world.state()["jobs"]["tests"]
        self.assertEqual((job["state"], job["attempt"], job["cursor"]), ("running", 1, 2))
        self.assertFalse(process_gone(job["pid"]))
        return world, int(job["pid"])

    def _recover(self, world: World) -> Tuple[Child, Dict[str, Any], Dict[str, Any]]:
        """A new process: ``next --json`` (read-only) once the lease has lapsed, then ``recover --owner worker-2``."""
        successor = self.child({"mode": "recover", "owner": "worker-2", "peek": True, **world.spec()})
        peek = successor.expect("PEEK")
        first = successor.expect("DECISION")
        self.assert_decision_shape(peek["decision"])
        self.assert_decision_shape(first["decision"])
        return successor, peek, first

    def _finish(self, world: World, successor: Child, job_attempts: int) -> Dict[str, Any]:
        done = successor.expect("DONE")
        self.assertEqual(successor.wait(), 0)
        self.assertEqual((done["code"], done["decision"]["reason"]), (10, "complete"), done)
        steps_named = _started_or_resumed(done["trace"])
        self.assertEqual(steps_named, [("resume-step", "tests"), ("start-step", "deliver")])
        state = self.assert_completed_once(world, job_attempts)
        return {"done": done, "state": state}

    def case_running(self) -> Dict[str, Any]:
        world, pid = self._kill_at_minute_37(False)
        successor, peek, first = self._recover(world)
        for seen in (peek, first):
            action = seen["decision"]["action"]
            self.assertEqual((seen["code"], action["kind"], action["key"], action["pid"]), (0, "wait-job", "tests", pid))
        self.assertFalse(process_gone(pid), "the job was not the one re-attached to")
        self.assertEqual(world.state()["jobs"]["tests"]["attempt"], 1)
        self.assertEqual(len(world.pid_files()), 1)
        world.open_gate()
        out = self._finish(world, successor, job_attempts=1)
        self.assertIn(out["done"]["trace"][0]["kind"], ("wait-job", "read-job"))
        self.assertEqual(world.job_log(1).splitlines(), ["cursor 0", "shard 0 ok", "shard 1 ok", "shard 2 ok", "shard 3 ok", "tests passed"])
        return out

    def case_finished(self) -> Dict[str, Any]:
        world, pid = self._kill_at_minute_37(False)
        world.open_gate()
        wait_until("the orphaned job has written its exit file", lambda: observe_job(world.run, world.state()["jobs"]["tests"])["status"] == "finished")
        successor, peek, first = self._recover(world)
        action = peek["decision"]["action"]
        self.assertEqual((peek["code"], action["kind"], action["key"], action["exit_code"]), (0, "read-job", "tests", 0))
        action = first["decision"]["action"]
        self.assertEqual((first["code"], action["kind"], action["step"]), (0, "resume-step", "tests"))
        job = world.state()["jobs"]["tests"]
        self.assertEqual((job["state"], job["exit_code"], job["attempt"]), ("finished", 0, 1))
        self.assertTrue(job["log_sha256"])
        out = self._finish(world, successor, job_attempts=1)
        self.assertEqual(out["state"]["counters"].get("jobs_orphaned", 0), 0)
        return out

    def case_vanished_rerun(self) -> Dict[str, Any]:
        world, pid = self._kill_at_minute_37(True)
        os.killpg(pid, signal.SIGKILL)
        wait_until("the job's process is gone", lambda: process_gone(pid))
        world.open_gate()
        successor, peek, first = self._recover(world)
        for seen in (peek, first):
            action = seen["decision"]["action"]
            self.assertEqual((seen["code"], action["kind"], action["key"], action["cursor"]), (0, "rerun-job", "tests", 2))
            self.assertEqual(action["command"], world.job_command())
        out = self._finish(world, successor, job_attempts=2)
        self.assertEqual(world.job_log(1).splitlines(), ["cursor 0", "shard 0 ok", "shard 1 ok"])
        self.assertEqual(world.job_log(2).splitlines(), ["cursor 2", "shard 2 ok", "shard 3 ok", "tests passed"])
        self.assertEqual(out["state"]["counters"]["jobs_orphaned"], 1)
        return out

    def case_vanished_no_rerun(self) -> Dict[str, Any]:
        world, pid = self._kill_at_minute_37(False)
        os.killpg(pid, signal.SIGKILL)
        wait_until("the job's process is gone", lambda: process_gone(pid))
        world.open_gate()
        successor, peek, first = self._recover(world)
        for seen in (peek, first):
            decision = seen["decision"]
            self.assertEqual((seen["code"], decision["decision"], decision["reason"]), (8, "stop", "needs-reconciliation"))
            self.assertTrue(any("job `tests` vanished" in u for u in decision["unknowns"]), decision["unknowns"])
        done = successor.expect("DONE")
        self.assertEqual(successor.wait(), 0)
        epoch = str(done["epoch"])
        before = _util.contents(world.run)
        writer = ("--owner", "worker-2", "--epoch", epoch)
        self.assertEqual(self.cli(world).json("next", *writer, code=8)["reason"], "needs-reconciliation")
        (submit_code, refused), (deliver_code, _), (claim_code, _) = [
            (r.code, r.json)
            for r in (
                _util.in_process_cli(["--dir", world.run, "--json", "job", *writer, "submit", "tests", "--",
                                      *world.job_command()]),
                _util.in_process_cli(["--dir", world.run, "--json", "step", *writer, "start", "deliver"]),
                _util.in_process_cli(["--dir", world.run, "--json", "step", *writer, "done", "tests",
                                      "--evidence", json.dumps({"claim": "the tests passed"})]),
            )
        ]
        self.assertEqual((submit_code, refused["error"]), (8, "needs-reconciliation"))
        self.assertEqual((deliver_code, claim_code), (2, 2))
        self.assertEqual(_util.contents(world.run), before)
        state = world.state()
        self.assertEqual(state["steps"]["tests"]["state"], "running")
        self.assertNotIn("deliver", state["steps"])
        self.assertEqual((state["jobs"]["tests"]["state"], state["jobs"]["tests"]["attempt"]), ("vanished", 1))
        self.assertEqual(len(world.pid_files()), 1)
        self.assertEqual({s: state["steps"][s]["attempts"] for s in ("analysis", "edits", "tests")}, {"analysis": 1, "edits": 1, "tests": 1})
        self.assert_nothing_redone(world)
        return {"state": state}

    def test_minute_37(self) -> None:
        cases = {
            "running": self.case_running,
            "finished": self.case_finished,
            "vanished, rerun allowed": self.case_vanished_rerun,
            "vanished, no rerun": self.case_vanished_no_rerun,
        }
        results = _util.in_parallel(list(cases.values()), workers=4)
        self.assertEqual(len(results), len(cases))


class StopReasonTest(RecoveryCase):
    """``next --json`` names each kind of stop with its reason and exit code, and the full decision shape."""

    def test_each_stop(self) -> None:
        payload = {"patch_sha256": "c" * 64}
        cases: Dict[str, Tuple[World, List[str]]] = {}

        def holder(world: World) -> Run:
            run = self.open_run(world)
            run.acquire("worker-1", 300)
            return run

        world = self.world()
        holder(world)
        cases["already-running"] = (world, ["--owner", "worker-2", "--epoch", "1"])

        world = self.world()
        holder(world).approval_request("edits", f"effect:{PATCH_KEY}", payload, 300)
        cases["awaiting-approval"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        world = self.world()
        holder(world).cancel("reviewer", "the change is no longer wanted")
        cases["cancelled"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        world = self.world()
        run = holder(world)
        run.step_start("analysis")
        run.step_fail("analysis", "permanent", "the repository was deleted")
        self.assertEqual(run.state["status"], "blocked")
        cases["failed"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        world = self.world()
        run = holder(world)
        run.step_start("analysis")
        run.step_done("analysis", {"sha256": "d" * 64})
        limited = _util.write_contract(os.path.join(world.root, "limited.md"), {**contract_block(), "limits": {"max_steps": 1}})
        with open(limited, encoding="utf-8") as handle:
            run.migrate(handle.read(), "one step is all the budget allows")
        cases["limit-exhausted"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        world = self.world()
        run = holder(world)
        run.step_start("analysis")
        run.step_done("analysis", {"sha256": "d" * 64})
        run.step_start("edits")
        journal = os.path.join(world.run, JOURNAL)
        with open(journal, "rb") as handle:
            lines = handle.read().split(b"\n")
        self.assertGreaterEqual(len([line for line in lines if line]), 4)
        damaged = lines[1].replace(b'"epoch":1', b'"epoch":7', 1)
        self.assertNotEqual(damaged, lines[1])
        lines[1] = damaged
        _util.write_file(journal, b"\n".join(lines))
        cases["state-unrecoverable"] = (world, [])

        world = self.world()
        run = holder(world)
        run.step_start("analysis")
        run.effect_begin(PATCH_KEY, payload)
        run.effect_uncertain(PATCH_KEY, "the connection dropped after the request was sent")
        cases["needs-reconciliation"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        world = self.world()
        run = holder(world)
        run.acquire("worker-1", 300)
        cases["fenced"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        world = self.world()
        run = holder(world)
        for step in STEPS:
            run.step_start(step)
            run.step_done(step, {"sha256": "e" * 64, "applied": {}, "exit_code": 0, "log_sha256": "f" * 64})
        cases["complete"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        expected = {"already-running": 3, "awaiting-approval": 4, "cancelled": 5, "limit-exhausted": 6, "state-unrecoverable": 7, "needs-reconciliation": 8, "fenced": 9, "complete": 10,
                    "failed": 12}
        self.assertEqual(set(cases), set(expected))
        calls = [lambda w=w, a=a: self.cli(w)("next", *a, "--json", code=None) for w, a in cases.values()]
        results = _util.in_parallel(calls, workers=4)  # type: ignore[misc]
        for (reason, (world, _args)), result in zip(cases.items(), results):
            decision = result.json
            with self.subTest(reason=reason):
                self.assertEqual(result.code, expected[reason], decision)
                self.assertEqual(EXIT_CODES[reason], expected[reason])
                self.assert_decision_shape(decision)
                self.assertEqual((decision["decision"], decision["action"], decision["reason"]), ("stop", None, reason))
                if reason != "state-unrecoverable":
                    self.assertTrue({"state", "plan", "lease"} <= {o["source"] for o in decision["observations"]}, decision["observations"])
                if reason == "needs-reconciliation":
                    digest = content_digest(payload)
                    self.assertTrue(any(PATCH_KEY in u and digest in u for u in decision["unknowns"]), decision["unknowns"])
                    self.assertEqual((decision["check"]["key"], decision["check"]["payload_digest"]), (PATCH_KEY, digest))
                if reason == "failed":
                    self.assertEqual(decision["step"], "analysis")
                if reason == "limit-exhausted":
                    self.assertEqual(decision["limit"], "max_steps")
                if reason == "state-unrecoverable":
                    # What the store found is an observation of it, and nothing is left unsettled: never an "unknown".
                    self.assertEqual(decision["unknowns"], [])
                    self.assertEqual([o["source"] for o in decision["observations"]], ["store"])
                    self.assertIn(decision["detail"], decision["observations"][0]["what"])
                    self.assertEqual(decision["stop_code"], "state-unrecoverable")
                    self.assertTrue(os.listdir(os.path.join(world.run, "quarantine")))


class PlanChangeTest(RecoveryCase):
    """A changed plan is refused by ``next`` and ``recover`` (exit 2, nothing written) until ``migrate`` records it."""

    def test_changed_contract_needs_a_migration(self) -> None:
        world = self.world()
        changed = _util.write_contract(os.path.join(world.root, "changed.md"), contract_block(extra_step=True))
        run = self.open_run(world)
        run.acquire("worker-1", 300)
        run.step_start("analysis")
        writer = ("--owner", "worker-1", "--epoch", "1")
        before = _util.contents(world.run)
        cli = self.cli(world)
        _, recover_out = _util.in_parallel([
            lambda: cli.json("next", *writer, "--contract", changed, code=2, reason="invalid-input"),
            lambda: cli.json("recover", "--owner", "worker-2", "--contract", changed, code=2, reason="invalid-input"),
        ])
        self.assertIn("migrate", recover_out["message"])
        self.assertEqual(_util.contents(world.run), before)

        migrated = cli.json("migrate", *writer, "--contract", changed,
                            "--reason", "a person must review the diff before delivery")
        new_digest = content_digest(load_contract(changed))
        self.assertEqual(migrated["plan_digest"], new_digest)
        decision, _ = _util.in_parallel([
            lambda: cli.json("next", *writer, "--contract", changed),
            lambda: cli.json("next", *writer, "--contract", world.contract, code=2, reason="invalid-input"),
        ])
        # worker-1 started analysis under the lease it still holds: it is told to finish it.
        self.assertEqual((decision["action"]["kind"], decision["action"]["step"]), ("finish-step", "analysis"))
        recovered = cli.json("recover", "--owner", "worker-1", "--contract", changed)
        self.assertEqual((recovered["action"]["kind"], recovered["lease"]["epoch"]), ("resume-step", 2))
        state = world.state()
        self.assertEqual(state["plan_digest"], new_digest)
        migrations = [o for o in state["observations"]["authorization"].values() if o.get("source") == "migrate"]
        self.assertEqual(len(migrations), 1)
        self.assertEqual(migrations[0]["to"], new_digest)
        self.assertEqual(migrations[0]["from"], content_digest(load_contract(world.contract)))
        self.assertEqual(migrations[0]["reason"], "a person must review the diff before delivery")
        self.assertEqual(state["steps"]["analysis"]["attempts"], 1)
        self.assertIn("review", [s["id"] for s in state["plan"]["steps"]])


class CompletionTest(RecoveryCase):
    """A run whose last unresolved effect is verified after its last step is done reaches ``complete`` (exit 10)."""

    def test_verifying_the_last_effect_completes_the_run(self) -> None:
        world = self.world()
        run = self.open_run(world)
        run.acquire("worker-1", 300)
        run.effect_begin("notify:start", {"text": "work begins"})
        for step in STEPS:
            run.step_start(step)
            run.step_done(step, {"sha256": "e" * 64, "applied": {}, "exit_code": 0, "log_sha256": "f" * 64})
        run.effect_verify("notify:start", {"message_id": "m-1"})
        decision = self.cli(world).json("next", "--owner", "worker-1", "--epoch", "1", code=10)
        self.assertEqual(decision["reason"], "complete", decision)


class JobOptionsTest(RecoveryCase):
    """Options written after a job verb's KEY are the runner's options, not part of the job's command."""

    def setUp(self) -> None:
        self.w = self.world()
        self.run_ = self.open_run(self.w)
        self.run_.acquire("worker-1", 300)
        self.command = [sys.executable, "-S", "-c", "print('ok')"]

    def test_submit_with_options_after_the_key(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # the runner detaches the job's wrapper on purpose
            result = self.cli(self.w)("job", "submit", "tests", "--owner", "worker-1", "--epoch", "1", "--json",
                                      "--", *self.command)
        self.assertEqual(result.json["command"], self.command)

    def test_shard_with_done_after_the_key(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # the runner detaches the job's wrapper on purpose
            submit_job(self.run_, "tests", self.command)
        shard = self.cli(self.w).json("job", "shard", "tests", "--done", "2", "--owner", "worker-1", "--epoch", "1")
        self.assertEqual(shard["cursor"], 2)


if __name__ == "__main__":
    unittest.main()
