"""The harness hooks (``hooks/*.py``, ``runner/surfaces/hooks.py``) against each harness's documented input.

Every hook is fed the JSON event Claude Code or Codex sends (the fields
their documentation and published schemas list), in a project whose run is
in each state a session can meet: no run, fresh, acting, awaiting approval,
cancelled, complete, fenced and damaged. The tests assert the JSON each
harness reads back, exit 0 always, the bound on pushes without progress, and
that the run's files are byte-for-byte unchanged except the hook's own
``hooks.json`` (and, for SessionEnd, the one lease release).
"""

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Any, Dict, List, Optional, Tuple

from tests.support.util import REPO_ROOT, TEMPLATE, child_env, contract_block, write_contract

from runner.surfaces import hooks
from runner.contract.text import load_contract
from runner.base.errors import AlreadyRunning
from runner.execution.recovery import recover
from runner.execution.run import Run
from runner.stores.file import RunStore

HOOKS_DIR = os.path.join(REPO_ROOT, "hooks")
T0 = 1_790_000_000.0
SESSION = "5f0c7d2e-8a61-4c1b-9b7e-2d4f3a1c9e10"
OTHER = "worker-elsewhere"

#: The events as each harness sends them. Claude Code: the hooks reference
#: (common fields session_id, transcript_path, cwd, permission_mode,
#: hook_event_name, plus each event's own). Codex: the command input schemas
#: its hooks engine publishes (codex-rs/hooks/schema/generated/*.input.schema.json).
EVENTS: Dict[str, Dict[str, Dict[str, Any]]] = {
    "claude": {
        "SessionStart": {"session_id": SESSION, "transcript_path": "/tmp/t.jsonl", "cwd": "", "hook_event_name": "SessionStart",
                         "source": "startup", "model": "claude-sonnet-4-6"},
        "Stop": {"session_id": SESSION, "transcript_path": "/tmp/t.jsonl", "cwd": "", "permission_mode": "default", "hook_event_name": "Stop",
                 "stop_hook_active": False, "last_assistant_message": "Done for now."},
        "SessionEnd": {"session_id": SESSION, "transcript_path": "/tmp/t.jsonl", "cwd": "", "hook_event_name": "SessionEnd",
                       "reason": "prompt_input_exit"},
        "PreCompact": {"session_id": SESSION, "transcript_path": "/tmp/t.jsonl", "cwd": "", "hook_event_name": "PreCompact", "trigger": "auto",
                       "custom_instructions": ""},
    },
    "codex": {
        "SessionStart": {"session_id": SESSION, "transcript_path": None, "cwd": "", "hook_event_name": "SessionStart", "model": "gpt-5.5",
                         "permission_mode": "default", "source": "startup"},
        "Stop": {"session_id": SESSION, "transcript_path": None, "cwd": "", "hook_event_name": "Stop", "model": "gpt-5.5",
                 "permission_mode": "default",
                 "stop_hook_active": False, "last_assistant_message": None, "turn_id": "turn-1"},
        "SessionEnd": {"session_id": SESSION, "transcript_path": None, "cwd": "", "hook_event_name": "SessionEnd", "reason": "other"},
        "PreCompact": {"session_id": SESSION, "transcript_path": None, "cwd": "", "hook_event_name": "PreCompact", "model": "gpt-5.5",
                       "trigger": "auto", "turn_id": "turn-1"},
    },
}

#: Top-level keys each harness accepts in a hook's JSON answer (Codex refuses
#: any other: its output schemas set additionalProperties false).
ALLOWED = {
    "SessionStart": {"continue", "hookSpecificOutput", "stopReason", "suppressOutput", "systemMessage"},
    "Stop": {"continue", "decision", "reason", "stopReason", "suppressOutput", "systemMessage"},
    "PreCompact": {"continue", "stopReason", "suppressOutput", "systemMessage"},
    "SessionEnd": set(),
}

STATES = ("none", "fresh", "acting", "approval", "cancelled", "complete", "fenced", "damaged")


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def owner(harness: str) -> str:
    return f"{harness}-{SESSION}"


def run_files(project: str) -> Dict[str, bytes]:
    """Every file of the run folder except the hooks' own record."""
    out = {}
    root = os.path.join(project, ".run")
    for base, _dirs, files in os.walk(root):
        for name in files:
            full = os.path.join(base, name)
            rel = os.path.relpath(full, root)
            if rel != hooks.HOOK_FILE:
                with open(full, "rb") as handle:
                    out[rel] = handle.read()
    return out


def make_project(tmp: str, state: str, harness: str, clock: Clock) -> str:
    """A project folder whose ``.run/`` holds a run in ``state`` (or no run at all)."""
    project = os.path.join(tmp, f"{state}-{harness}")
    os.makedirs(project)
    if state == "none":
        return project
    path = os.path.join(project, ".run")
    me = owner(harness)
    if state == "complete":
        plan = load_contract(write_contract(os.path.join(tmp, f"c-{state}-{harness}.md"), contract_block("small-run")))
    else:
        plan = load_contract(TEMPLATE)
    RunStore.create(path, plan["task_id"], plan, clock=clock)
    run = Run.open(path, clock=clock)
    if state == "fresh":
        return project
    if state == "fenced":
        recover(run, me, 60)
        clock.now += 120
        Run.open(path, clock=clock).acquire(OTHER, 600)
        return project
    run.acquire(me, 600)
    if state == "cancelled":
        run.cancel("person", "no longer needed")
    elif state == "acting":
        run.step_start("draft")
    elif state == "approval":
        run.approval_request("draft", "effect:post:weekly-2026-48:publish", {"title": "Weekly"}, 3600)
    elif state == "complete":
        run.step_start("only")
        run.step_done("only", {"note": "made"})
    elif state == "damaged":
        run.step_start("draft")
        run.step_done("draft", {"file_sha256": "0" * 64})
        journal = os.path.join(path, "journal.jsonl")
        with open(journal, "rb") as handle:
            lines = handle.read().splitlines(keepends=True)
        lines[1] = lines[1].replace(b'"rev":2', b'"rev":7')
        with open(journal, "wb") as handle:
            handle.write(b"".join(lines))
    return project


def call(event: str, harness: str, project: str, clock: Clock, env: Optional[Dict[str, str]] = None,
         **fields: Any) -> Tuple[int, Optional[Dict[str, Any]], str, str]:
    """Run one hook in-process as the harness would: JSON on stdin, the answer on stdout."""
    payload = dict(EVENTS[harness][event], cwd=project, **fields)
    out, err = io.StringIO(), io.StringIO()
    argv = ["--harness", "codex"] if harness == "codex" else []
    code = hooks.main(event, argv, stdin=io.StringIO(json.dumps(payload)), stdout=out, stderr=err, env=env or {}, clock=clock)
    text = out.getvalue()
    parsed = None
    if text.strip().startswith("{"):
        lines = text.splitlines()
        assert len(lines) == 1, f"more than one line of JSON: {text!r}"
        parsed = json.loads(lines[0])
        unknown = set(parsed) - ALLOWED[event]
        assert not unknown, f"{harness} {event} answer has keys the harness refuses: {unknown}"
        if "hookSpecificOutput" in parsed:
            assert set(parsed["hookSpecificOutput"]) <= {"hookEventName", "additionalContext"}
            assert parsed["hookSpecificOutput"]["hookEventName"] == event
    return code, parsed, text, err.getvalue()


class HookStateMatrixTests(unittest.TestCase):
    """Each hook, each harness, each run state: the answer, exit 0, and the run's bytes."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="runner-hooks-")

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def project(self, state: str, harness: str) -> Tuple[str, Clock]:
        clock = Clock()
        sub = tempfile.mkdtemp(dir=self.tmp)
        return make_project(sub, state, harness, clock), clock

    def test_session_start_in_every_state(self) -> None:
        for harness in ("claude", "codex"):
            for state in STATES:
                with self.subTest(harness=harness, state=state):
                    project, clock = self.project(state, harness)
                    before = run_files(project)
                    code, answer, text, _ = call("SessionStart", harness, project, clock, source="resume" if state == "acting" else "startup")
                    self.assertEqual(code, 0)
                    self.assertEqual(run_files(project), before)
                    self.assertFalse(os.path.exists(os.path.join(project, ".run", hooks.HOOK_FILE)))
                    if state == "none":
                        self.assertEqual(text, "")
                        continue
                    context = answer["hookSpecificOutput"]["additionalContext"]
                    self.assertLessEqual(len(context), 3000)
                    if state == "damaged":
                        self.assertIn("damaged", context)
                        self.assertIn("doctor", context)
                        continue
                    self.assertIn(f"owner id: `{owner(harness)}`", context)
                    self.assertIn("SKILL.md", context)
                    expected = {"fresh": "Next action: start-step `draft`", "acting": "Next action: finish-step `draft`",
                                "approval": "Stopped: awaiting-approval", "cancelled": "Stopped: cancelled", "complete": "Stopped: complete",
                                "fenced": "Stopped: already-running"}[state]
                    self.assertIn(expected, context)
                    if state == "acting":
                        self.assertIn(f"you (`{owner(harness)}`) hold the lease at epoch 1", context)

    def test_stop_in_every_state(self) -> None:
        legal = {"approval": "awaiting-approval", "cancelled": "cancelled", "complete": "complete", "fenced": "fenced",
                 "damaged": "state-unrecoverable"}
        for harness in ("claude", "codex"):
            for state in STATES:
                with self.subTest(harness=harness, state=state):
                    project, clock = self.project(state, harness)
                    before = run_files(project)
                    code, answer, text, err = call("Stop", harness, project, clock)
                    self.assertEqual(code, 0, err)
                    self.assertEqual(run_files(project), before)
                    if state == "none":
                        self.assertEqual(text, "")
                    elif state in legal:
                        self.assertNotIn("decision", answer)
                        self.assertIn(f"stops here: {legal[state]}", answer["systemMessage"])
                        self.assertFalse(os.path.exists(os.path.join(project, ".run", hooks.HOOK_FILE)))
                    else:
                        self.assertEqual(answer["decision"], "block")
                        self.assertEqual(len(answer["reason"].splitlines()), 1)
                        if state == "fresh":
                            self.assertIn("next action start-step `draft`", answer["reason"])
                            self.assertIn(f"recover --owner {owner(harness)} --json", answer["reason"])
                        else:
                            self.assertIn("next action finish-step `draft`", answer["reason"])
                            self.assertNotIn("Take the lease first", answer["reason"])

    def test_session_end_releases_only_this_sessions_lease(self) -> None:
        for harness in ("claude", "codex"):
            for state in STATES:
                with self.subTest(harness=harness, state=state):
                    project, clock = self.project(state, harness)
                    before = run_files(project)
                    code, _answer, text, err = call("SessionEnd", harness, project, clock)
                    self.assertEqual((code, text), (0, ""), err)
                    after = run_files(project)
                    if state in ("acting", "approval", "cancelled", "complete"):
                        state_after = Run.open(os.path.join(project, ".run"), clock=clock).state
                        self.assertIsNone(state_after["lease"]["owner"])
                        self.assertEqual(state_after["lease"]["epoch"], 1)
                        self.assertGreater(len(after["journal.jsonl"]), len(before["journal.jsonl"]))
                        # One transition: a journal line, and the store's witness of it (head.json).
                        written = ("journal.jsonl", "head.json")
                        others = {k: v for k, v in before.items() if k not in written}
                        self.assertEqual({k: v for k, v in after.items() if k not in written}, others)
                        self.assertTrue(after["journal.jsonl"].startswith(before["journal.jsonl"]))
                    else:
                        # No run, nobody's lease, someone else's lease, or damage: nothing changes.
                        self.assertEqual(after, before)

    def test_pre_compact_records_the_compaction_and_nothing_else(self) -> None:
        for harness in ("claude", "codex"):
            for state in STATES:
                with self.subTest(harness=harness, state=state):
                    project, clock = self.project(state, harness)
                    before = run_files(project)
                    code, answer, text, err = call("PreCompact", harness, project, clock)
                    self.assertEqual(code, 0, err)
                    self.assertIsNone(answer)
                    self.assertEqual(run_files(project), before)
                    record = os.path.join(project, ".run", hooks.HOOK_FILE)
                    if state in ("none", "damaged"):
                        self.assertEqual(text, "")
                        self.assertFalse(os.path.exists(record))
                        continue
                    with open(record, encoding="utf-8") as handle:
                        saved = json.load(handle)
                    self.assertEqual(saved["compactions"]["count"], 1)
                    self.assertEqual(saved["compactions"]["last"]["owner"], owner(harness))
                    if harness == "claude":
                        # Claude Code adds a PreCompact hook's plain output to the compaction instructions.
                        self.assertEqual(len(text.splitlines()), 1)
                        self.assertIn("Keep in the summary", text)
                    else:
                        self.assertEqual(text, "")


class StopBoundTests(unittest.TestCase):
    """The push count: bounded, persisted across restarts, reset only by durable progress."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="runner-hooks-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_pushes_without_progress_are_bounded_and_survive_a_restart(self) -> None:
        clock = Clock()
        project = make_project(self.tmp, "acting", "claude", clock)
        before = run_files(project)
        answers = []
        for attempt in range(hooks.MAX_PUSHES_WITHOUT_PROGRESS + 2):
            # stop_hook_active is false on the first stop of each "session", as after a restart.
            _code, answer, _t, _e = call("Stop", "claude", project, clock, stop_hook_active=attempt % 2 == 1)
            answers.append(answer)
        blocked = [a for a in answers if a.get("decision") == "block"]
        self.assertEqual(len(blocked), hooks.MAX_PUSHES_WITHOUT_PROGRESS)
        self.assertTrue(all("decision" not in a and "no-progress" in a["systemMessage"] for a in answers[len(blocked):]))
        self.assertEqual(run_files(project), before)
        with open(os.path.join(project, ".run", hooks.HOOK_FILE), encoding="utf-8") as handle:
            self.assertEqual(json.load(handle)["stop"]["pushes"], hooks.MAX_PUSHES_WITHOUT_PROGRESS)

    def test_durable_progress_resets_the_count(self) -> None:
        clock = Clock()
        project = make_project(self.tmp, "acting", "codex", clock)
        for _ in range(hooks.MAX_PUSHES_WITHOUT_PROGRESS):
            self.assertEqual(call("Stop", "codex", project, clock, stop_hook_active=True)[1]["decision"], "block")
        self.assertNotIn("decision", call("Stop", "codex", project, clock, stop_hook_active=True)[1])
        run = Run.open(os.path.join(project, ".run"), owner=owner("codex"), epoch=1, clock=clock)
        run.step_done("draft", {"file_sha256": "a" * 64})
        answer = call("Stop", "codex", project, clock, stop_hook_active=True)[1]
        self.assertEqual(answer["decision"], "block")
        self.assertIn("start-step `review`", answer["reason"])

    def test_an_unwritable_count_lets_an_already_pushed_stop_through(self) -> None:
        clock = Clock()
        project = make_project(self.tmp, "acting", "claude", clock)
        run_dir = os.path.join(project, ".run")
        os.mkdir(os.path.join(run_dir, hooks.HOOK_FILE + ".tmp"))  # the atomic replace cannot write its temporary file
        self.assertEqual(call("Stop", "claude", project, clock, stop_hook_active=False)[1]["decision"], "block")
        answer = call("Stop", "claude", project, clock, stop_hook_active=True)[1]
        self.assertNotIn("decision", answer)
        self.assertIn("could not be recorded", answer["systemMessage"])


class StopReasonTests(unittest.TestCase):
    """A spent limit lets the session stop; an unknown effect outcome the agent can observe does not."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="runner-hooks-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_a_spent_limit_lets_the_stop_through(self) -> None:
        clock = Clock()
        project = make_project(self.tmp, "acting", "claude", clock)
        Run.open(os.path.join(project, ".run"), owner=owner("claude"), epoch=1, clock=clock).add_cost({"money": 6})
        answer = call("Stop", "claude", project, clock)[1]
        self.assertNotIn("decision", answer)
        self.assertIn("stops here: limit-exhausted", answer["systemMessage"])

    def test_an_uncertain_effect_is_pushed_as_a_reconciliation(self) -> None:
        clock = Clock()
        project = make_project(self.tmp, "acting", "codex", clock)
        run = Run.open(os.path.join(project, ".run"), owner=owner("codex"), epoch=1, clock=clock)
        run.effect_begin("draft:file", {"path": "drafts/post.md"}, step="draft")
        run.effect_uncertain("draft:file", "the write timed out")
        before = run_files(project)
        answer = call("Stop", "codex", project, clock)[1]
        self.assertEqual(answer["decision"], "block")
        self.assertIn("next action reconcile `draft:file`: observe the target for effect `draft:file`", answer["reason"])
        self.assertEqual(run_files(project), before)


class SessionOwnerTests(unittest.TestCase):
    """The owner id follows the harness session, so a resumed session re-takes its own lease."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="runner-hooks-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_a_resumed_session_continues_under_its_own_lease_at_a_new_epoch(self) -> None:
        clock = Clock()
        project = make_project(self.tmp, "acting", "claude", clock)
        path = os.path.join(project, ".run")
        context = call("SessionStart", "claude", project, clock, source="resume")[1]["hookSpecificOutput"]["additionalContext"]
        self.assertIn(f"you (`{owner('claude')}`) hold the lease at epoch 1", context)
        again = Run.open(path, clock=clock)
        self.assertEqual(again.acquire(owner("claude"), 600)["epoch"], 2)  # no wait for itself
        with self.assertRaises(AlreadyRunning):
            Run.open(path, clock=clock).acquire("claude-another-session", 600)

    def test_session_end_then_a_new_session_takes_the_lease_without_waiting(self) -> None:
        clock = Clock()
        project = make_project(self.tmp, "acting", "codex", clock)
        path = os.path.join(project, ".run")
        call("SessionEnd", "codex", project, clock)
        lease = Run.open(path, clock=clock).acquire("codex-next-session", 600)
        self.assertEqual(lease["epoch"], 2)
        # The old session's end, replayed late, must not release the new holder's lease.
        call("SessionEnd", "codex", project, clock)
        self.assertEqual(Run.open(path, clock=clock).state["lease"]["owner"], "codex-next-session")

    def test_run_dir_environment_and_upward_search(self) -> None:
        clock = Clock()
        project = make_project(self.tmp, "fresh", "claude", clock)
        nested = os.path.join(project, "src", "deep")
        os.makedirs(nested)
        self.assertEqual(hooks.locate_run({"cwd": nested}, {}), os.path.join(project, ".run"))
        self.assertEqual(hooks.locate_run({"cwd": nested}, {"RUNNER_DIR": "../x"}), os.path.join(project, "src", "x"))
        self.assertEqual(hooks.locate_run({"cwd": "/"}, {"CLAUDE_PROJECT_DIR": project}), os.path.join(project, ".run"))
        empty = os.path.join(self.tmp, "elsewhere")
        os.makedirs(empty)
        code, answer, text, _ = call("SessionStart", "claude", empty, clock, env={"RUNNER_DIR": "no-such-run"})
        self.assertEqual((code, answer, text), (0, None, ""))


class FailOpenTests(unittest.TestCase):
    """A hook's own failure never blocks: exit 0, nothing on stdout, one line on stderr."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="runner-hooks-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_bad_input_and_internal_errors_fail_open(self) -> None:
        clock = Clock()
        project = make_project(self.tmp, "acting", "claude", clock)
        for event in hooks.EVENTS:
            for stdin in ("not json", "[1, 2]"):
                out, err = io.StringIO(), io.StringIO()
                code = hooks.main(event, [], stdin=io.StringIO(stdin), stdout=out, stderr=err, env={"CLAUDE_PROJECT_DIR": project}, clock=clock)
                self.assertEqual((code, out.getvalue()), (0, ""))
                self.assertEqual(len(err.getvalue().splitlines()), 1)

        def broken() -> float:
            raise OSError("clock unavailable")

        for event in hooks.EVENTS:
            out, err = io.StringIO(), io.StringIO()
            payload = json.dumps(dict(EVENTS["claude"][event], cwd=project))
            self.assertEqual(hooks.main(event, [], stdin=io.StringIO(payload), stdout=out, stderr=err, env={}, clock=broken), 0)
            self.assertEqual(out.getvalue(), "")
            self.assertIn("clock unavailable", err.getvalue())


    def test_a_hook_that_hangs_gives_up_within_its_budget(self) -> None:
        clock = Clock()
        project = make_project(self.tmp, "acting", "claude", clock)

        def hung() -> float:
            time.sleep(30)  # stands for a stuck file system; the hook's own timer must end it
            return T0

        budget = hooks.TIME_BUDGET_SECONDS
        hooks.TIME_BUDGET_SECONDS = 0.2
        self.addCleanup(setattr, hooks, "TIME_BUDGET_SECONDS", budget)
        out, err = io.StringIO(), io.StringIO()
        payload = json.dumps(dict(EVENTS["claude"]["Stop"], cwd=project))
        started = time.monotonic()
        self.assertEqual(hooks.main("Stop", [], stdin=io.StringIO(payload), stdout=out, stderr=err, env={}, clock=hung), 0)
        self.assertLess(time.monotonic() - started, 10)
        self.assertEqual(out.getvalue(), "")
        self.assertIn("gave up after 0.2 s", err.getvalue())


class HookScriptTests(unittest.TestCase):
    """The scripts the plugins run, as separate processes, on a run of 10,000 effects."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="runner-hooks-")
        cls.project = os.path.join(cls.tmp, "big")
        os.mkdir(cls.project)
        path = os.path.join(cls.project, ".run")
        plan = load_contract(TEMPLATE)
        RunStore.create(path, plan["task_id"], plan, durability="process")
        run = Run.open(path, durability="process")
        run.acquire(owner("claude"), 3600)
        run.step_start("draft")
        template = run.effect_begin("seed", {"n": 0}, step="draft")
        template = run.effect_verify("seed", {"seen": True})
        for batch in range(10):
            ops = [["set", ["effects", f"doc-{batch * 1000 + i:05d}"], dict(template)] for i in range(1000)]
            run.store.commit(ops, epoch=1)
        cls.files = run_files(cls.project)

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def script(self, event: str, harness: str, **fields: Any) -> Tuple[subprocess.CompletedProcess, float]:
        name = {"SessionStart": "session_start", "Stop": "stop", "SessionEnd": "session_end", "PreCompact": "pre_compact"}[event]
        payload = dict(EVENTS[harness][event], cwd=self.project, **fields)
        argv = [sys.executable, os.path.join(HOOKS_DIR, f"{name}.py")] + (["--harness", "codex"] if harness == "codex" else [])
        env = child_env(pythonpath=False)
        env.pop("RUNNER_DIR", None)
        start = time.perf_counter()
        done = subprocess.run(argv, input=json.dumps(payload), capture_output=True, text=True, env=env, timeout=60, cwd=self.tmp)
        return done, time.perf_counter() - start

    def test_each_script_answers_on_a_ten_thousand_effect_run(self) -> None:
        self.assertEqual(sum(1 for k in Run.open(os.path.join(self.project, ".run")).state["effects"]), 10_001)
        for harness in ("claude", "codex"):
            with self.subTest(harness=harness):
                done, _ = self.script("SessionStart", harness, source="resume")
                self.assertEqual(done.returncode, 0, done.stderr)
                context = json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]
                self.assertIn("10001 verified", context)
                done, _ = self.script("Stop", harness)
                self.assertEqual(done.returncode, 0, done.stderr)
                answer = json.loads(done.stdout)
                if harness == "claude":
                    self.assertEqual(answer["decision"], "block")
                else:  # the Claude Code session holds the lease: the Codex session may stop
                    self.assertIn("stops here: already-running", answer["systemMessage"])
                done, _ = self.script("PreCompact", harness)
                self.assertEqual((done.returncode, done.stderr), (0, ""))
        self.assertEqual(run_files(self.project), self.files)


if __name__ == "__main__":
    unittest.main()


REFERENCE = os.path.join(REPO_ROOT, "references", "harness-integration.md")


def reference_blocks(heading: str, fence: str) -> List[str]:
    """The fenced ``fence`` blocks of the reference's section ``heading``."""
    with open(REFERENCE, encoding="utf-8") as handle:
        section = handle.read().split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]
    return [block.split("\n```", 1)[0] for block in section.split(f"```{fence}\n")[1:]]


class DocumentedOutputTests(unittest.TestCase):
    """The Stop answers shown in references/harness-integration.md are what the hook prints."""

    def test_the_shown_stop_answers_are_real(self) -> None:
        shown = [json.loads(block) for block in reference_blocks("What the hooks do, event by event", "json")]
        self.assertEqual(len(shown), 2)
        tmp = tempfile.mkdtemp(prefix="runner-hooks-")
        self.addCleanup(shutil.rmtree, tmp, True)
        clock = Clock()
        got = []
        for name in ("acting", "approval"):
            project = os.path.join(tmp, name)
            path = os.path.join(project, ".run")
            os.makedirs(project)
            plan = load_contract(TEMPLATE)
            RunStore.create(path, plan["task_id"], plan, clock=clock)
            run = Run.open(path, clock=clock)
            recover(run, owner("claude"), 300)
            if name == "acting":
                run.step_start("draft")
            else:
                run.approval_request("draft", "effect:post:weekly-2026-48:publish", {"title": "Weekly"}, 3600)
            got.append(call("Stop", "claude", project, clock)[1])
        self.assertEqual(got, shown)


class AgentsSnippetTests(unittest.TestCase):
    """The AGENTS.md lines and the recover command in the reference run on a real run."""

    def test_the_snippet_commands_work_from_a_copied_skill(self) -> None:
        tmp = tempfile.mkdtemp(prefix="runner-agents-")
        self.addCleanup(shutil.rmtree, tmp, True)
        shutil.copytree(REPO_ROOT, os.path.join(tmp, ".agents", "skills", "long-running-agent-sessions"),
                        ignore=shutil.ignore_patterns(".git", "__pycache__", "tests", "bench"))
        env = child_env(pythonpath=False)
        for name in ("RUNNER_DIR", "RUNNER_OWNER", "RUNNER_EPOCH"):
            env.pop(name, None)
        init = subprocess.run([sys.executable, ".agents/skills/long-running-agent-sessions/runner", "--dir", ".run", "init", "--contract", TEMPLATE],
                              cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(init.returncode, 0, init.stderr)
        text = "\n".join(reference_blocks("Harnesses without hooks: `AGENTS.md`", "markdown")
                         + reference_blocks("The run folder, the session's owner id and the lease", "sh"))
        commands = re.findall(r"python3 (\.agents/skills/long-running-agent-sessions/runner [^`\n]+)", text)
        self.assertEqual(len(commands), 3)
        for command in commands:
            argv = shlex.split(command.replace("YOUR-SESSION-ID", "claude-5f0c7d2e"))
            done = subprocess.run([sys.executable] + argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
            with self.subTest(command=command):
                self.assertEqual(done.returncode, 0, done.stderr)
                self.assertTrue(done.stdout.strip())
        # The same owner twice: the second recover re-takes its own lease at a new epoch.
        self.assertEqual(Run.open(os.path.join(tmp, ".run")).state["lease"]["epoch"], 2)
