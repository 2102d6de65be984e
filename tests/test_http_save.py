"""``effects.http.invoke.save``: the answer a run keeps, written to the item's file with its hash in the receipt.

Against the OpenAI-compatible stand-in (tests/support/standins/models.py), started as a process: the value at
the pointer (or the whole body) is written atomically inside the workspace, the receipt names the file's size
and SHA-256 in place of the value, and an answer with nothing to keep or a file that cannot be inside is
refused. ``contract check`` refuses a path outside the project. Through ``drive`` at a target that cannot be
read back (``"observe": "none"``), killed by SIGKILL before the temporary file was renamed, after the file was
written and before the acknowledgement, and after it, each time resumed by another process: the file that
stays is the acknowledged answer's, its hash the evidence, no temporary file is left, and only the call in
flight at a kill before its acknowledgement is paid twice.
"""

import hashlib
import json
import os
import signal
import unittest
from typing import Any, Dict, List, Optional

from runner.adapters.http import HttpAdapter, http_spec
from runner.adapters.http_client import ConnectionPool
from runner.base.errors import InvalidInput
from runner.calls.target import Rejected
from runner.contract.effects import effects_problems
from runner.contract.http import http_problems
from runner.contract.spec import read_contract
from runner.execution.run import Run
from runner.stores.file import RunStore
from tests.support.cli import RunnerCli
from tests.support.standins import models
from tests.support.standins.harness import StandIn
from tests.support.util import child_env, python, run, scratch_dir

KEY = "sk-save-test"
CONTENT = "/choices/0/message/content"


def section(base: str, save: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """An ``effects.http`` section that asks the stand-in for a completion and saves what ``save`` says."""
    invoke: Dict[str, Any] = {"url": base + "/chat/completions",
                              "headers": {"Authorization": "Bearer {env:MODEL_KEY}"}}
    if save is not None:
        invoke["save"] = save
    return {"invoke": invoke, "observe": {"url": base + "/models"}}


def payload(text: str) -> Dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


class SaveChecksTest(unittest.TestCase):
    def problems(self, save: Any) -> list:
        return [str(p) for p in http_problems({"http": section("http://127.0.0.1:9/v1", save)})]

    def test_a_path_inside_the_project_with_the_items_placeholders_and_a_pointer_passes(self) -> None:
        self.assertEqual(self.problems({"path": "summaries/{stem}.md", "pointer": CONTENT}), [])
        self.assertEqual(self.problems({"path": "answers/{key}.json"}), [])
        self.assertEqual(self.problems({"path": "out/{field.id}-{index}.txt"}), [])

    def test_a_path_outside_the_project_and_other_mistakes_are_refused(self) -> None:
        outside = "effects.http.invoke.save.path must be a file's path relative to the workspace, without '..': " \
                  "the answer is kept inside the project"
        for path in ("/tmp/{stem}.md", "../{stem}.md", "a/../../{stem}.md", "", "summaries/"):
            self.assertEqual(self.problems({"path": path}), [outside], path)
        self.assertEqual(self.problems({"path": "s/{epoch}.md"}),
                         ["effects.http.invoke.save.path: unknown placeholder {epoch} (allowed: {key}, {item}, "
                          "{stem}, {slug}, {index}, {run_id})"])
        self.assertEqual(self.problems({"path": "summary.md"}),
                         ["effects.http.invoke.save.path must name the item (such as {stem} or {key}): each item's "
                          "answer is a file of its own"])
        self.assertEqual(self.problems({"path": "s/{key}", "pointer": "choices"}),
                         ['effects.http.invoke.save.pointer must be a JSON pointer (RFC 6901): "" or a path such as '
                          '"/0/id"'])
        self.assertEqual(self.problems({"path": "s/{key}", "mode": "0644"}),
                         ["effects.http.invoke.save: unknown field 'mode' (allowed: path, pointer)"])
        self.assertEqual(len(self.problems("summaries/{stem}.md")), 1)


class SaveTest(unittest.TestCase):
    server: StandIn

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = StandIn("models", ["--key", KEY])

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def setUp(self) -> None:
        self.server.faults([])
        self.pool = ConnectionPool()
        self.addCleanup(self.pool.clear)
        made = scratch_dir("runner-save-")
        self.root = made.__enter__()
        self.addCleanup(made.__exit__, None, None, None)

    def adapter(self, save: Dict[str, Any], **values: Any) -> HttpAdapter:
        return HttpAdapter(http_spec(section(self.server.url, save)), values=dict({"stem": "notes"}, **values),
                           workspace=self.root, pool=self.pool, environ={"MODEL_KEY": KEY})

    def read(self, path: str) -> bytes:
        with open(os.path.join(self.root, path), "rb") as handle:
            return handle.read()

    def test_the_value_at_the_pointer_is_saved_and_the_receipt_holds_its_hash_in_its_place(self) -> None:
        adapter = self.adapter({"path": "summaries/{stem}.md", "pointer": CONTENT})
        receipt = adapter.invoke("notes", payload("# Notes"), 1)
        data = self.read("summaries/notes.md")
        self.assertTrue(data.startswith(b"Summary of 'Notes'"), data)
        digest = hashlib.sha256(data).hexdigest()
        self.assertEqual(receipt["saved"], {"path": "summaries/notes.md", "bytes": len(data), "sha256": digest})
        self.assertEqual(receipt["choices"][0]["message"]["content"], f"sha256:{digest}",
                         "the answer is in the file, not in the ledger too")
        self.assertEqual(receipt["usage"]["total_tokens"],
                         receipt["usage"]["prompt_tokens"] + receipt["usage"]["completion_tokens"])
        self.assertEqual([n for n in os.listdir(os.path.join(self.root, "summaries"))], ["notes.md"], "no temp left")
        self.assertNotIn(KEY, json.dumps(receipt))

    def test_without_a_pointer_the_whole_answer_is_saved(self) -> None:
        receipt = self.adapter({"path": "answers/{key}.json"}).invoke("notes-1", payload("# Whole"), 1)
        data = self.read("answers/notes-1.json")
        self.assertEqual(json.loads(data)["choices"][0]["message"]["content"],
                         receipt["choices"][0]["message"]["content"], "the receipt is the answer as before")
        self.assertEqual(receipt["saved"]["sha256"], hashlib.sha256(data).hexdigest())

    def test_a_file_saved_again_replaces_the_earlier_answer_and_a_stale_temp_file(self) -> None:
        adapter = self.adapter({"path": "s/{stem}.md", "pointer": CONTENT})
        first = adapter.invoke("notes", payload("# Again"), 1)
        with open(os.path.join(self.root, "s", "notes.md.tmp"), "wb") as handle:
            handle.write(b"half an answer")  # what a kill between the temp file's write and its rename leaves
        second = adapter.invoke("notes", payload("# Again"), 2)
        self.assertNotEqual(first["saved"]["sha256"], second["saved"]["sha256"])
        self.assertEqual(hashlib.sha256(self.read("s/notes.md")).hexdigest(), second["saved"]["sha256"])
        self.assertEqual(os.listdir(os.path.join(self.root, "s")), ["notes.md"])

    def test_an_answer_with_nothing_at_the_pointer_is_refused_and_nothing_is_written(self) -> None:
        with self.assertRaises(Rejected) as caught:
            self.adapter({"path": "s/{stem}.md", "pointer": "/choices/0/message/refusal"}).invoke(
                "notes", payload("# Refused"), 1)
        self.assertIn("nothing at /choices/0/message/refusal to save", str(caught.exception))
        self.assertFalse(os.path.exists(os.path.join(self.root, "s")))

    def test_a_file_a_link_would_lead_outside_the_workspace_is_refused_before_any_call(self) -> None:
        outside = scratch_dir("runner-save-outside-")
        elsewhere = outside.__enter__()
        self.addCleanup(outside.__exit__, None, None, None)
        os.symlink(elsewhere, os.path.join(self.root, "s"))
        before = self.server.count()["billed"]
        with self.assertRaises(InvalidInput) as caught:
            self.adapter({"path": "s/{stem}.md", "pointer": CONTENT})
        self.assertIn("leads outside the workspace", caught.exception.message)
        with self.assertRaises(InvalidInput):
            self.adapter({"path": "{stem}/x.md", "pointer": CONTENT}, stem="..")
        self.assertEqual(self.server.count()["billed"], before)
        self.assertEqual(os.listdir(elsewhere), [])


def model_contract(base: str, observe: Any = "none") -> Dict[str, Any]:
    """One summary per Markdown file of ``docs/``, asked of the model API at ``base`` and kept in ``summaries/``."""
    http = section(base, {"path": "summaries/{stem}.md", "pointer": CONTENT})
    http.update(observe=observe, idempotency_header="Idempotency-Key")
    return {
        "contract": 1, "task_id": "summaries", "goal": "One summary per document.", "workspace": ".",
        "steps": [{"id": "summarise", "items": {"glob": "docs/*.md"}, "key": "{stem}",
                   "payload": {"template": {"model": "m", "messages": [{"role": "user", "content": "{text}"}]}},
                   "next": "done"}],
        "effects": {"http": http, "timeout_seconds": 20},
        "limits": {"max_effect_attempts": 4}, "lease": {"ttl_seconds": 60}}


class SavedAnswerAfterKillsTest(unittest.TestCase):
    """One stand-in for the class; each test counts the bill's entries made since it began."""

    server: StandIn

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = StandIn("models", ["--key", KEY])

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def setUp(self) -> None:
        self.first = len(models.bill(self.server.state))
        self.cli = RunnerCli(self, env={"MODEL_KEY": KEY})
        self.root = self.cli.root
        os.mkdir(os.path.join(self.root, "docs"))
        for name in ("a", "b", "c"):
            with open(os.path.join(self.root, "docs", f"{name}.md"), "w") as handle:
                handle.write(f"# Document {name}\n\nIts text.\n")

    def effects(self) -> Dict[str, Any]:
        return dict(Run(RunStore.open(self.cli.run_dir)).state["effects"])

    def saved(self, stem: str) -> Optional[str]:
        try:
            with open(os.path.join(self.root, "summaries", f"{stem}.md"), "rb") as handle:
                return hashlib.sha256(handle.read()).hexdigest()
        except FileNotFoundError:
            return None

    def billed(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for entry in models.bill(self.server.state)[self.first:]:
            out[entry["key"]] = out.get(entry["key"], 0) + 1
        return out

    def killed_at(self, window: str, owner: str) -> None:
        killed = run(python("-m", "tests.support.scripts.http_drive_child", self.cli.run_dir, owner, window),
                     cwd=self.root, env=child_env(MODEL_KEY=KEY), timeout=120)
        self.assertEqual(killed.code, -signal.SIGKILL, f"not killed at {window}: {killed.out} {killed.err[-800:]}")
        Run(RunStore.open(self.cli.run_dir)).break_lease("supervisor", f"{owner} was killed at {window}")

    def test_a_temporary_file_left_by_a_kill_before_its_rename_is_no_evidence_and_is_replaced(self) -> None:
        self.cli.init(model_contract(self.server.url))
        killed = run(python("-m", "tests.support.scripts.save_killed_child", self.cli.run_dir, "driver-1"),
                     cwd=self.root, env=child_env(MODEL_KEY=KEY), timeout=120)
        self.assertEqual(killed.code, -signal.SIGKILL, f"not killed at the rename: {killed.out} {killed.err[-800:]}")
        Run(RunStore.open(self.cli.run_dir)).break_lease("supervisor", "driver-1 was killed before a rename")
        (first, record), = self.effects().items()
        self.assertEqual(record["state"], "started")
        self.assertEqual(os.listdir(os.path.join(self.root, "summaries")), [f"{first}.md.tmp"])
        self.assertEqual(self.cli.json("drive", "--owner", "driver-2", code=8)["error"], "needs-reconciliation")
        self.cli("effect", "absent", first, "--by", "a-person", "--evidence", '{"seen": "no summary file"}')
        self.assertEqual(self.cli.json("drive", "--owner", "driver-3", code=10)["reason"], "complete")
        self.assertEqual(sorted(os.listdir(os.path.join(self.root, "summaries"))), ["a.md", "b.md", "c.md"],
                         "the temporary file the kill left was replaced, then renamed")
        for key, effect in self.effects().items():
            self.assertEqual(effect["evidence"]["receipt"]["saved"]["sha256"], self.saved(key))
        self.assertEqual(self.billed(), {k: 2 if k == first else 1 for k in ("a", "b", "c")})

    def test_items_that_would_keep_their_answers_in_one_file_are_refused_at_start(self) -> None:
        block = model_contract(self.server.url)
        block["steps"][0].update(items={"glob": "docs/**/*.md"}, key="k{index}")
        os.mkdir(os.path.join(self.root, "docs", "sub"))
        with open(os.path.join(self.root, "docs", "sub", "A.md"), "w") as handle:
            handle.write("# Another a\n")
        self.cli.init(block)
        refused = self.cli("drive", "--owner", "d", code=2)
        self.assertIn("items 'docs/a.md' and 'docs/sub/A.md' of step 'summarise' would keep their answers in one "
                      "file 'summaries/A.md'", refused.err)
        self.assertEqual(self.billed(), {}, "nothing was asked")
        self.assertEqual(self.effects(), {})

    def test_the_contract_declares_a_model_api_that_cannot_be_read_back(self) -> None:
        block = model_contract(self.server.url)
        block["effects"]["observe_first"] = True
        self.assertIn('effects: observe_first looks each item up before its first call: a target with "observe": '
                      '"none" cannot be read back', effects_problems(block["effects"]))
        effects = read_contract(model_contract(self.server.url)).effects
        self.assertFalse(effects.readable)
        self.assertIsNone(effects.http.observe if effects.http is not None else "no http")
        adapter = HttpAdapter(effects.http, environ={"MODEL_KEY": KEY})  # type: ignore[arg-type]
        self.assertFalse(adapter.readable)
        self.assertRegex(adapter.verification, r"^none: the \w+ cannot be read back; its answer is the only evidence$")

    def test_a_file_written_before_the_ack_is_no_evidence_and_one_acknowledged_is(self) -> None:
        self.cli.init(model_contract(self.server.url))
        self.killed_at("effect:after-call", "driver-1")
        (first, record), = self.effects().items()
        self.assertEqual(record["state"], "started")
        stale = self.saved(first)
        self.assertIsNotNone(stale, "the killed call had written its answer")
        self.assertEqual(self.billed(), {first: 1})
        stopped = self.cli.json("drive", "--owner", "driver-2", code=8)
        self.assertEqual(stopped["error"], "needs-reconciliation")
        self.assertEqual(self.effects()[first]["state"], "uncertain", "the file on disk is no evidence")
        self.assertEqual(self.billed(), {first: 1}, "never called again on its own")
        self.cli("effect", "absent", first, "--by", "a-person", "--evidence", '{"seen": "the answer was lost"}')
        self.killed_at("effect:after-ack", "driver-3")
        record = self.effects()[first]
        self.assertEqual(record["state"], "acknowledged")
        self.assertEqual(record["receipt"]["saved"]["sha256"], self.saved(first), "the ack names the file on disk")
        self.assertNotEqual(self.saved(first), stale, "the acknowledged answer replaced the stale one")
        done = self.cli.json("drive", "--owner", "driver-4", code=10)
        self.assertEqual(done["reason"], "complete")
        effects = self.effects()
        self.assertEqual({k: e["state"] for k, e in effects.items()}, {s: "verified" for s in ("a", "b", "c")})
        for key, effect in effects.items():
            evidence = effect["evidence"]
            self.assertEqual(evidence["observe"], "none")
            self.assertEqual(evidence["receipt"]["saved"], {"path": f"summaries/{key}.md", "bytes": os.path.getsize(
                os.path.join(self.root, "summaries", f"{key}.md")), "sha256": self.saved(key)})
        self.assertEqual(self.billed(), {k: 2 if k == first else 1 for k in ("a", "b", "c")},
                         "paid twice: the one call in flight at the kill before its ack; none after its ack")
        leftovers: List[str] = [n for n in os.listdir(os.path.join(self.root, "summaries")) if n.endswith(".tmp")]
        self.assertEqual(leftovers, [])


if __name__ == "__main__":
    unittest.main()
