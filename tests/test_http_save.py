"""``effects.http.invoke.save``: the answer a run keeps, written to the item's file with its hash in the receipt.

Against the OpenAI-compatible stand-in (tests/support/standins/models.py), started as a process: the value at
the pointer (or the whole body) is written atomically inside the workspace, the receipt names the file's size
and SHA-256 in place of the value, and an answer with nothing to keep or a file that cannot be inside is
refused. ``contract check`` refuses a path outside the project.
"""

import hashlib
import json
import os
import unittest
from typing import Any, Dict, Optional

from runner.adapters.http import HttpAdapter, http_spec
from runner.adapters.http_client import ConnectionPool
from runner.base.errors import InvalidInput
from runner.calls.target import Rejected
from runner.contract.http import http_problems
from tests.support.standins.harness import StandIn
from tests.support.util import scratch_dir

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


if __name__ == "__main__":
    unittest.main()
