"""The gates an agent meets at the command line, each answered with its own exit code.

The command line's entry point (``runner.surfaces.cli.main``) runs in this process,
exit code, stdout and stderr captured; where the claim is about a process, a
real one runs: a shell's ``effect begin ... && call`` and the failed proof.

* An effect belongs to the running step: ``effect begin --step OTHER`` (a finished step, a step
  not in the plan, any step while none runs) and a begin before a gated step starts are refused
  with exit 2 and nothing written, so the approval gate cannot be skipped.
* After a denial, a newer request that is granted is what ``next`` sees.
* ``effect begin`` on a verified effect answers 14 (already-verified) with the effect, on an
  active, cancelled or complete run alike, so ``begin && call`` never calls twice.
* ``migrate`` to a plan without the running step is refused until that step is done or failed.
* ``approval list`` names the step, action, payload digest, payload file and its first bytes; a
  new payload supersedes the older request unless the contract lets several stand.
* A backoff answers 11 (retry-later), a failed effect or step 12 (failed), a failed proof 13.
"""

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from typing import Any, Dict, Optional

from runner.contract.text import load_contract
from runner.base.canonical import content_digest
from runner.execution.run import Run
from runner.stores.file import RunStore

from .support import util as _util
from .support.cli import RunnerCli

POST = {"title": "Week 48", "body": "first draft"}
SECOND = {"title": "Week 48", "body": "second draft"}
ACTION = "effect:post:weekly-48:publish"
KEY = "post:weekly-48:publish"


class GateCase(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="runner-gates-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.post = self.write("post.json", POST)
        self.second = self.write("second.json", SECOND)
        self.path = self.make_run(load_contract(_util.TEMPLATE))

    def write(self, name: str, obj: Dict[str, Any]) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(obj, handle)
        return path

    def make_run(self, block: Dict[str, Any], name: str = "run") -> str:
        """A run of ``block`` in ``TMP/NAME`` whose lease w1 holds at epoch 1; ``cli`` writes to it as w1, ``control``
        as the operator, each with ``--json``."""
        path = os.path.join(self.tmp, name)
        RunStore.create(path, block["task_id"], block).fs.close()  # type: ignore[attr-defined]
        run = self.library(path)
        run.acquire("w1", 3600)
        self.runner = RunnerCli(self, root=self.tmp, run_dir=path)
        self.control, self.cli = self.runner.json, self.runner.writer("w1", 1).json
        return path

    def library(self, path: Optional[str] = None) -> Run:
        run = Run.open(path or self.path, "w1", 1)
        self.addCleanup(run.store.fs.close)  # type: ignore[attr-defined]
        return run

    def to(self, *step_ids: str, running: Optional[str] = None) -> None:
        evidence = {"draft": {"file_sha256": "a" * 64}, "review": {"exit_code": 0}}
        run = self.library()
        for step in step_ids:
            run.step_start(step)
            run.step_done(step, evidence[step])
        if running:
            run.step_start(running)

    def request(self, payload: str) -> str:
        return self.cli("approval", "request", "publish", "--action", ACTION, "--payload", payload, "--ttl", "3600", code=0)["request_id"]


class ApprovalGateTest(GateCase):
    def test_an_effect_cannot_begin_outside_the_running_step(self) -> None:
        self.to("draft", "review")
        before = _util.contents(self.path)
        body = self.cli("effect", "begin", "blog-48", "--payload", self.post, code=2, reason="invalid-input")
        self.assertEqual(body["context"], {"key": "blog-48", "step": "publish"})
        self.cli("effect", "begin", "blog-48", "--payload", self.post, "--step", "publish", code=2, reason="invalid-input")
        self.assertEqual(_util.contents(self.path), before, "a refused begin writes nothing")
        self.to(running="publish")
        before = _util.contents(self.path)
        self.cli("effect", "begin", "blog-49", "--payload", self.post, code=4, reason="awaiting-approval")
        for step in ("draft", "no-such-step", "review"):
            with self.subTest(step=step):
                body = self.cli("effect", "begin", "blog-50", "--payload", self.post, "--step", step, code=2, reason="invalid-input")
                self.assertEqual(body["context"], {"key": "blog-50", "step": step})
                self.assertIn("'publish'", body["message"])
        self.assertEqual(_util.contents(self.path), before)
        self.control("approval", "grant", self.request(self.post), "--by", "carol")
        effect = self.cli("effect", "begin", KEY, "--payload", self.post, "--step", "publish", code=0)
        self.assertEqual((effect["state"], effect["step"]), ("started", "publish"))

    def test_after_a_denial_the_newer_grant_is_what_next_sees(self) -> None:
        self.to("draft", "review", running="publish")
        first = self.request(self.post)
        self.control("approval", "deny", first, "--by", "alice")
        self.assertEqual(self.cli("next", code=4)["request_id"], first)
        second = self.request(self.post)
        self.assertNotEqual(second, first)
        self.control("approval", "grant", second, "--by", "alice")
        decision = self.cli("next", code=0)
        self.assertEqual((decision["action"]["kind"], decision["action"]["grant"]["request_id"]), ("finish-step", second))
        self.assertEqual(decision["action"]["grant"]["payload_digest"], content_digest(POST))
        self.assertEqual(self.cli("effect", "begin", KEY, "--payload", self.post, code=0)["state"], "started")


class AlreadyVerifiedTest(GateCase):
    def setUp(self) -> None:
        super().setUp()
        self.to(running="draft")
        self.cli("effect", "begin", "draft:upload", "--payload", self.post, code=0)
        self.cli("effect", "ack", "draft:upload", "--receipt", '{"id": 1}', code=0)
        self.cli("effect", "verify", "draft:upload", "--evidence", '{"seen": 1}', code=0)

    def begin_and_call(self) -> subprocess.CompletedProcess:
        env = _util.child_env(RUNNER_DIR=self.path, RUNNER_OWNER="w1", RUNNER_EPOCH="1")
        script = '"$0" -m runner effect begin draft:upload --payload "$1" 2>/dev/null && echo CALLED'
        return subprocess.run(["sh", "-c", script, sys.executable, self.post], env=env, capture_output=True, text=True, timeout=60)

    def test_begin_on_a_verified_effect_answers_14_and_changes_nothing(self) -> None:
        before = _util.contents(self.path)
        body = self.cli("effect", "begin", "draft:upload", "--payload", self.post, code=14, reason="already-verified")
        self.assertEqual(body["context"]["effect"], "draft:upload")
        self.assertEqual((body["context"]["record"]["state"], body["context"]["record"]["receipt"]), ("verified", {"id": 1}))
        self.assertEqual(_util.contents(self.path), before)
        called = self.begin_and_call()
        self.assertEqual((called.returncode, called.stdout), (14, ""), "begin && call must not call")
        self.control("cancel", "--by", "ops", "--reason", "no longer wanted")
        self.cli("effect", "begin", "draft:upload", "--payload", self.post, code=14, reason="already-verified")
        self.cli("effect", "begin", "draft:other", "--payload", self.post, code=5, reason="cancelled")
        self.assertEqual(self.begin_and_call().stdout, "")

    def test_also_on_a_complete_run(self) -> None:
        run = self.library()
        run.step_done("draft", {"file_sha256": "a" * 64})
        run.step_start("review")
        run.step_done("review", {"exit_code": 0})
        run._mutate(lambda s, now: [["set", ["status"], "complete"]])
        self.cli("effect", "begin", "draft:upload", "--payload", self.post, code=14, reason="already-verified")
        self.cli("effect", "begin", "draft:new", "--payload", self.post, code=10, reason="complete")
        self.assertEqual(self.control("cancel", "--by", "ops", "--reason", "too late", code=10)["error"], "complete")


class MigrateRunningStepTest(GateCase):
    def test_a_plan_without_the_running_step_is_refused_until_it_ends(self) -> None:
        self.to(running="draft")
        block = copy.deepcopy(load_contract(_util.TEMPLATE))
        block["steps"] = block["steps"][1:]
        without = _util.write_contract(os.path.join(self.tmp, "without-draft.md"), block)
        before = _util.contents(self.path)
        body = self.cli("migrate", "--contract", without, "--reason", "drop the draft", code=2, reason="invalid-input")
        self.assertEqual(body["context"], {"step": "draft"})
        self.assertEqual(_util.contents(self.path), before)
        self.assertEqual(self.cli("next", code=0)["action"]["step"], "draft")
        self.cli("step", "fail", "draft", "--class", "transient", "--error", "dropped from the plan", code=0)
        self.assertEqual(self.cli("migrate", "--contract", without, "--reason", "drop the draft", code=0)["plan_digest"], content_digest(block))
        action = self.cli("next", code=0)["action"]
        self.assertEqual((action["kind"], action["step"]), ("start-step", "review"))
        self.assertEqual(self.cli("step", "start", "review", code=0)["state"], "running")


class ApprovalListTest(GateCase):
    def test_list_shows_what_each_request_covers_and_a_new_payload_supersedes(self) -> None:
        self.to("draft", "review", running="publish")
        first = self.request(self.post)
        self.control("approval", "grant", first, "--by", "carol")
        second = self.request(self.second)
        listed = {a["request_id"]: a for a in self.control("approval", "list")["approvals"]}
        with open(self.post, encoding="utf-8") as handle:
            head = handle.read()
        self.assertEqual({k: listed[first][k] for k in ("step", "action", "payload_digest", "payload_file", "payload_head", "state", "superseded_by", "current")},
                         {"step": "publish", "action": ACTION, "payload_digest": content_digest(POST), "payload_file": self.post, "payload_head": head,
                          "state": "superseded", "superseded_by": second, "current": False})
        self.assertEqual((listed[second]["state"], listed[second]["payload_file"], listed[second]["current"]), ("pending", self.second, True))
        lines = self.runner("approval", "list").out.splitlines()
        self.assertEqual(len(lines), 2)
        self.assertIn(f"{first}  superseded by {second}  step publish  {ACTION}  {content_digest(POST)}  from {self.post} {json.dumps(head)}", lines[0])
        body = self.cli("effect", "begin", KEY, "--payload", self.post, code=4, reason="awaiting-approval")
        self.assertIn(f"superseded by {second}", body["message"])
        self.control("approval", "grant", first, "--by", "carol", code=2)
        self.control("approval", "grant", second, "--by", "carol")
        self.assertEqual(self.cli("effect", "begin", KEY, "--payload", self.second, code=0)["payload_digest"], content_digest(SECOND))

    def test_a_contract_may_let_several_stand(self) -> None:
        block = copy.deepcopy(load_contract(_util.TEMPLATE))
        block["effects"]["several_approvals"] = True
        contract = _util.write_contract(os.path.join(self.tmp, "several.md"), block)
        checked = _util.in_process_cli(["contract", "check", contract])
        self.assertEqual(checked.code, 0, checked.err)
        self.path = self.make_run(block, name="several")
        self.to("draft", "review", running="publish")
        first, second = self.request(self.post), self.request(self.second)
        states = {a["request_id"]: a["state"] for a in self.control("approval", "list")["approvals"]}
        self.assertEqual(states, {first: "pending", second: "pending"})


class SituationCodesTest(GateCase):
    def test_retry_later_failed_and_proof_failed(self) -> None:
        block = copy.deepcopy(load_contract(_util.TEMPLATE))
        block["retry"] = {"base_seconds": 600, "cap_seconds": 600}
        self.path = self.make_run(block, name="slow-backoff")
        self.to(running="draft")
        run = Run.open(self.path, "w1", 1, rand=lambda: 1.0)
        self.addCleanup(run.store.fs.close)  # type: ignore[attr-defined]
        run.effect_begin("draft:upload", POST)
        run.effect_failed("draft:upload", "the target refused the key for good")
        body = self.cli("effect", "begin", "draft:upload", "--payload", self.post, code=12, reason="failed")
        self.assertEqual(body["context"], {"effect": "draft:upload"})
        run.effect_begin("draft:notes", POST)
        run.effect_absent("draft:notes", {"found": False})  # an observed absence schedules the backoff itself
        body = self.cli("effect", "begin", "draft:notes", "--payload", self.post, code=11, reason="retry-later")
        self.assertEqual(body["context"]["retry_at"], run.state["effects"]["draft:notes"]["next_attempt_at"])
        self.assertGreater(body["context"]["wait_seconds"], 500)
        self.assertLessEqual(body["context"]["wait_seconds"], 600)
        self.cli("step", "fail", "draft", "--class", "permanent", "--error", "the repository is gone", code=0)
        self.assertEqual(self.cli("next", code=12)["step"], "draft")
        self.assertEqual(self.cli("step", "start", "draft", code=12, reason="failed")["context"], {"step": "draft"})
        proof = _util.run_cli("--json", "conformance", "--adapter", "tests.test_conformance:BlindEpochAdapter", cwd=_util.REPO_ROOT)
        self.assertEqual(proof.code, 13, proof.err)
        self.assertEqual(_util.one_json(proof)["passed"], False)
        self.assertIn("proof-failed", proof.err)


if __name__ == "__main__":
    unittest.main()
