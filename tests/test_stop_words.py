"""Clear words on every stop: each has its own code and sentence in ``next``, ``status``, ``brief`` and the Stop hook.

Each case below is a real run brought to one stop through the library (on a
clock the test gives, where the stop is one of time). The lease is given
back, then ``next``, ``status`` and ``brief`` (the command line, in this
process) and the Stop hook (as Claude Code calls it) must each print that
stop as ``CODE: SENTENCE``: the code of :mod:`runner.surfaces.stops`, its
sentence, and never ``unknown:`` (the hook lets every stop through but an
effect whose outcome the agent can observe, which it names as the action). ``next --json`` carries the same code
and sentence. The stops of ownership (another holder, a fenced writer) and
of damage are asked of ``next`` and of the hook from the side they concern.
"""

import io
import json
import os
import time
import unittest
from typing import Any, Callable, Dict, List, Tuple

from tests.support import util as _util

from runner.contract.text import load_contract
from runner.execution.run import Run
from runner.ledger.effects import deferred_ops
from runner.stores.file import RunStore
from runner.surfaces import hooks
from runner.surfaces.stops import STOPS

CONTRACT = load_contract(_util.TEMPLATE)
OWNER = "worker-1"


def started(path: str, plan: Dict[str, Any], clock: Callable[[], float] = time.time) -> Run:
    RunStore.create(path, plan["task_id"], plan, clock=clock)
    run = Run(RunStore.open(path, clock=clock))
    run.acquire(OWNER, 600)
    return run


def with_limits(**limits: Any) -> Dict[str, Any]:
    return dict(CONTRACT, limits=dict(CONTRACT.get("limits") or {}, **limits))


def past(seconds: float) -> Callable[[], float]:
    """A clock that stands ``seconds`` ago: what it writes is that old now."""
    return lambda: time.time() - seconds


# -- the cases: each builds its run in a folder and returns nothing ----------------------------------

def complete(path: str) -> None:
    run = started(path, dict(CONTRACT, steps=[{"id": "only", "artifact": "a", "check": "b", "next": "done"}]))
    run.step_start("only")
    run.step_done("only", {"checked": True})


def cancelled(path: str) -> None:
    started(path, CONTRACT).cancel("operator", "the post is no longer wanted")


def approval_pending(path: str) -> None:
    started(path, CONTRACT).approval_request("draft", "effect:post:weekly-2026-48:publish", {"title": "Weekly"}, 3600)


def approval_denied(path: str) -> None:
    run = started(path, CONTRACT)
    request = run.approval_request("draft", "effect:post:weekly-2026-48:publish", {"title": "Weekly"}, 3600)
    run.approval_deny(request, "carol")


def step_failed(path: str) -> None:
    run = started(path, CONTRACT)
    run.step_start("draft")
    run.step_fail("draft", "permanent", "the source documents are gone")


def cost(path: str) -> None:
    started(path, with_limits(max_cost=1.9)).add_cost({"money": 1.90013})


def cost_recorded(path: str) -> None:
    run = started(path, with_limits(max_cost=1.9))
    run.add_cost({"money": 1.90013})
    try:
        run.step_start("draft")  # refused, and the spent limit recorded: the run is blocked
    except Exception:
        pass


def steps(path: str) -> None:
    run = started(path, with_limits(max_steps=1))
    run.step_start("draft")
    run.step_done("draft", {"file_sha256": "a" * 64})


def elapsed(path: str) -> None:
    started(path, with_limits(max_elapsed_seconds=60), clock=past(600))


def no_progress(path: str) -> None:
    run = started(path, with_limits(no_progress_seconds=60), clock=past(600))
    run.step_start("draft")


def step_attempts(path: str) -> None:
    run = started(path, with_limits(max_step_attempts=1))
    run.step_start("draft")
    try:
        run.step_fail("draft", "transient", "the model timed out")
    except Exception:
        pass


def effect_attempts(path: str) -> None:
    run = started(path, with_limits(max_effect_attempts=1))
    run.step_start("draft")
    run.effect_begin("post:weekly-2026-48:draft", {"title": "Weekly"}, step="draft")
    run.effect_absent("post:weekly-2026-48:draft", {"looked_up": True})
    try:
        run.effect_begin("post:weekly-2026-48:draft", {"title": "Weekly"}, step="draft")
    except Exception:
        pass


def not_now(path: str) -> None:
    plan = dict(CONTRACT, effects=dict(CONTRACT["effects"], max_rate_limited=1))
    run = started(path, plan)
    run.step_start("draft")
    key = "post:weekly-2026-48:draft"
    for _ in range(2):
        try:
            run.effect_begin(key, {"title": "Weekly"}, step="draft")
        except Exception:
            break
        ops = deferred_ops(run.state, key, {"status": 429}, time.time(), "2000-01-01T00:00:00.000Z")
        run.store.commit(ops, epoch=run.epoch or 0)


def outcome_unknown(path: str) -> None:
    run = started(path, CONTRACT)
    run.step_start("draft")
    run.effect_begin("post:weekly-2026-48:draft", {"title": "Weekly"}, step="draft")
    run.effect_uncertain("post:weekly-2026-48:draft", "the connection dropped")


def job_vanished(path: str) -> None:
    run = started(path, CONTRACT)
    # A job whose process ended without an exit record: what a job's observation records as vanished.
    job = {"state": "vanished", "command": ["sleep", "1"], "attempt": 1, "dir": "jobs/jrender/a1",
           "submitted_at": "2026-01-01T00:00:00.000Z", "pid": None, "pid_start": None, "exit_code": None,
           "finished_at": None, "log_sha256": None, "cursor": 0, "cancel_requested_at": None, "stopped_at": None,
           "nonce": "0" * 32}
    run.store.commit([["set", ["jobs", "render"], job]], epoch=run.epoch or 0)


CASES: Dict[str, Callable[[str], None]] = {
    "complete": complete,
    "cancelled": cancelled,
    "awaiting-approval/pending": approval_pending,
    "awaiting-approval/denied": approval_denied,
    "failed/step": step_failed,
    "limit-exhausted/cost": cost,
    "limit-exhausted/steps": steps,
    "limit-exhausted/elapsed-time": elapsed,
    "limit-exhausted/no-progress": no_progress,
    "limit-exhausted/step-attempts": step_attempts,
    "limit-exhausted/effect-attempts": effect_attempts,
    "limit-exhausted/not-now": not_now,
    "needs-reconciliation/effect": outcome_unknown,
    "needs-reconciliation/job": job_vanished,
}


def stop_hook(path: str) -> Dict[str, Any]:
    payload = {"session_id": "s-1", "cwd": os.path.dirname(path), "hook_event_name": "Stop", "stop_hook_active": False}
    out = io.StringIO()
    hooks.main("Stop", [], stdin=io.StringIO(json.dumps(payload)), stdout=out, stderr=io.StringIO(),
               env={"RUNNER_DIR": path})
    return json.loads(out.getvalue()) if out.getvalue().strip() else {}


class EveryStop(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        scratch = _util.scratch_dir("runner-stop-words-")
        cls.addClassCleanup(scratch.cleanup)
        cls.seen: Dict[str, Dict[str, Any]] = {}
        for code, build in CASES.items():
            path = os.path.join(scratch.name, code.replace("/", "-"), ".run")
            os.makedirs(os.path.dirname(path))
            build(path)
            store = RunStore.open(path)
            if store.state["lease"].get("owner"):
                Run(store, store.state["lease"]["owner"], store.state["lease"]["epoch"]).release()

            def cli(*argv: str) -> _util.Result:
                return _util.in_process_cli(["--dir", path, *argv])

            cls.seen[code] = {
                "next": cli("next").out.splitlines()[0],
                "next --json": json.loads(cli("next", "--json").out),
                "status": [line for line in cli("status").out.splitlines() if line.startswith("next ")][0],
                "brief": [line for line in cli("brief").out.splitlines() if line.startswith("Stopped:")],
                "hook": stop_hook(path),
            }

    def test_each_stop_has_its_own_code_and_sentence_in_every_view(self) -> None:
        for code, seen in self.seen.items():
            with self.subTest(stop=code):
                decided = seen["next --json"]
                self.assertEqual(decided["stop_code"], code, decided)
                sentence = decided["sentence"]
                self.assertTrue(sentence.startswith(STOPS[code]), sentence)
                said = f"{code}: {sentence}"
                self.assertEqual(seen["next"], f"stop: {said}")
                self.assertEqual(seen["status"], f"next      stop: {said}")
                self.assertEqual(len(seen["brief"]), 1, seen["brief"])
                self.assertTrue(seen["brief"][0].startswith(f"Stopped: {code}: "), seen["brief"])
                if code == "needs-reconciliation/effect":
                    # The one stop the hook does not let through: an outcome the agent can observe is its next action.
                    self.assertEqual(seen["hook"]["decision"], "block")
                    self.assertIn("next action reconcile", seen["hook"]["reason"])
                else:
                    self.assertIn(f"stops here: {code}: ", seen["hook"]["systemMessage"])
                for view in ("next", "status", "brief", "hook"):
                    self.assertNotIn("unknown:", json.dumps(seen[view]))
        self.assertEqual(set(self.seen), set(CASES))

    def test_a_spent_limit_says_what_was_spent_against_what(self) -> None:
        sentence = self.seen["limit-exhausted/cost"]["next --json"]["sentence"]
        self.assertIn("money 1.90013 spent of 1.9", sentence)
        self.assertIn("migrate --contract FILE", sentence)
        self.assertIn("1 steps started of 1", self.seen["limit-exhausted/steps"]["next --json"]["sentence"])
        self.assertIn("s taken of 60 s", self.seen["limit-exhausted/elapsed-time"]["next --json"]["sentence"])

    def test_the_recorded_stop_of_a_blocked_run_reads_the_same(self) -> None:
        with _util.scratch_dir("runner-stop-blocked-") as scratch:
            path = os.path.join(scratch, ".run")
            cost_recorded(path)
            store = RunStore.open(path)
            self.assertEqual(store.state["status"], "blocked")
            Run(store, OWNER, store.state["lease"]["epoch"]).release()
            decided = json.loads(_util.in_process_cli(["--dir", path, "next", "--json"]).out)
        self.assertEqual(decided["stop_code"], "limit-exhausted/cost")
        self.assertIn("money 1.90013 spent of 1.9", decided["sentence"])


class StopsOfOwnershipAndDamage(unittest.TestCase):
    def test_another_holder_a_fenced_writer_and_damage(self) -> None:
        with _util.scratch_dir("runner-stop-owners-") as scratch:
            path = os.path.join(scratch, ".run")
            started(path, CONTRACT)
            held = json.loads(_util.in_process_cli(["--dir", path, "next", "--owner", "worker-2", "--json"]).out)
            fenced = _util.in_process_cli(["--dir", path, "next", "--owner", OWNER, "--epoch", "0", "--json"])
            fenced = json.loads(fenced.out)
            hook = stop_hook(path)
            with open(os.path.join(path, "journal.jsonl"), "r+b") as handle:
                handle.seek(30)
                handle.write(b"X")
            damaged = _util.in_process_cli(["--dir", path, "next"])
        self.assertEqual((held["stop_code"], fenced["stop_code"]), ("already-running", "fenced"))
        self.assertTrue(held["sentence"].startswith(STOPS["already-running"]))
        self.assertTrue(held["sentence"].endswith("and the next drive takes over"), "what moves the run on")
        self.assertIn("`lease break --by NAME --reason TEXT`", held["sentence"])
        self.assertIn("`recover --owner ID`", fenced["sentence"])
        self.assertIn("stops here: already-running: ", hook["systemMessage"])
        first = damaged.out.splitlines()[0]
        self.assertTrue(first.startswith(f"stop: state-unrecoverable: {STOPS['state-unrecoverable']}: "), first)
        self.assertNotIn("unknown:", damaged.out)
        self.assertIn("  observation: ", damaged.out)

    def test_every_code_the_views_print_is_in_the_table(self) -> None:
        reasons: List[Tuple[str, str]] = [(code, code.split("/")[0]) for code in STOPS]
        for code, reason in reasons:
            self.assertTrue(STOPS[code])
            self.assertIn(reason, set(CASES_AND_OTHERS))


#: Every reason a stop may carry: the exit table's that stop a run, and the hooks' own.
CASES_AND_OTHERS = {"complete", "cancelled", "awaiting-approval", "failed", "limit-exhausted", "needs-reconciliation",
                    "already-running", "fenced", "state-unrecoverable", "retry-later", "stopped", "no-progress",
                    "not-adopted"}


if __name__ == "__main__":
    unittest.main()
