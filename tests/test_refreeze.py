"""A changed item list, frozen anew after ``migrate``, never moves a key the ledger holds to another item.

The target here files one ticket per call (it does not deduplicate) and
logs the item of each call, so a key moved to another item shows as a
document filed twice or never. The first test runs every verb as its own
``python -m runner`` process, as an agent would; the others call the
command line in this process.
"""

import json
import os
import unittest
from typing import Any, Dict, List

from runner.base.canonical import content_digest
from tests.support.cli import RunnerCli
from tests.support.util import Result, scratch_dir, write_contract
from tests.test_authority import durable

HOST = "http://127.0.0.1:9"
PAYLOAD = {"template": {"path": "{item}"}}
FILE = "printf '%s\\n' \"$1\" >> filed; echo '{\"ok\": 1}'\n"
FIND = "grep -qx \"$1\" filed 2>/dev/null && { echo '{\"found\": 1}'; exit 0; }; exit 1\n"
REFUSE = "exit 2\n"
STEP = "s1"
GLOB = {"glob": "docs/*.md"}
LATER = "File one ticket per document, new ones too."


def contract(items: Any, key: str = "doc-{index}", goal: str = "File one ticket per document.", invoke: str = "file.sh",
             **effects: Any) -> Dict[str, Any]:
    """A batch contract whose target files ``{item}`` and finds an item by ``{item}``: the item is what is filed."""
    return {
        "contract": 1, "task_id": "refreeze", "goal": goal, "workspace": ".",
        "steps": [{"id": STEP, "items": items, "key": key, "payload": PAYLOAD, "next": "done"}],
        "effects": dict({"invoke": ["sh", invoke, "{item}"], "observe": ["sh", "find.sh", "{item}"],
                         "timeout_seconds": 10}, **effects),
    }


class RefreezeTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = scratch_dir("runner-refreeze-")
        self.addCleanup(self.tmp.cleanup)
        self.root = self.tmp.name
        self.cli = RunnerCli(self, root=self.root)
        self.run_dir = os.path.join(self.root, ".run")
        for name, text in (("file.sh", FILE), ("find.sh", FIND), ("refuse.sh", REFUSE)):
            with open(os.path.join(self.root, name), "w", encoding="utf-8") as handle:
                handle.write(text)

    # -- helpers ---------------------------------------------------------------------------------
    def documents(self, *names: str) -> None:
        for name in names:
            path = os.path.join(self.root, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(f"# {name}\n")

    def write(self, name: str, block: Dict[str, Any]) -> str:
        return write_contract(os.path.join(self.root, name), block)

    def filed(self) -> List[str]:
        path = os.path.join(self.root, "filed")
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as handle:
            return sorted(handle.read().split())

    def via(self, child: bool) -> Any:
        """The command line in a child process, as an agent runs it, or in this process."""
        return self.cli.child if child else self.cli

    def writer(self, child: bool = False) -> List[str]:
        acquired = self.via(child)("lease", "acquire", "--owner", "agent", "--json")
        return ["--owner", "agent", "--epoch", str(acquired.json["epoch"])]

    def migrate(self, block: Dict[str, Any], writer: List[str], child: bool = False) -> None:
        name = f"contract-{content_digest(block)[-8:]}.md"
        self.via(child)("migrate", "--contract", self.write(name, block), "--reason", "a new list", *writer)

    def refused_start(self, writer: List[str], child: bool = False) -> Result:
        """``step start`` refused with exit 2 and the run left as it was."""
        before = durable(self.run_dir)
        started = self.via(child)("step", "start", STEP, "--json", *writer, code=2)
        self.assertEqual(started.json["error"], "invalid-input", started.err)
        self.assertEqual(len([line for line in started.err.splitlines() if line.strip()]), 1, started.err)
        self.assertEqual(durable(self.run_dir), before, "a refused start changes nothing")
        return started

    def drive(self, *extra: str, child: bool = False) -> Result:
        return self.via(child)("drive", "--owner", "agent", "--json", *extra, code=None)

    def init(self, block: Dict[str, Any], child: bool = False) -> None:
        self.via(child)("init", "--contract", self.write("contract.md", block))

    def start_and_file(self, block: Dict[str, Any], actions: str, child: bool = False) -> None:
        """``init`` the run, then ``drive`` for ``actions`` actions (the start, then one item each)."""
        self.init(block, child)
        self.assertEqual(self.drive("--max-actions", actions, child=child).code, 0)

    # -- a new list under {index} keys -----------------------------------------------------------
    def test_a_document_added_in_front_of_index_keys_is_refused_and_nothing_is_filed_twice(self) -> None:
        self.documents("docs/b.md", "docs/c.md", "docs/d.md")
        self.start_and_file(contract(GLOB), "3", child=True)  # the start; b and c filed
        self.assertEqual(self.filed(), ["docs/b.md", "docs/c.md"])
        self.documents("docs/a.md")  # sorts first: every {index} would shift
        writer = self.writer(child=True)
        self.migrate(contract(GLOB, goal=LATER), writer, child=True)
        refused = self.refused_start(writer, child=True)
        message = json.loads(refused.out)["message"]
        for named in ("'doc-0'", "'docs/b.md'", "'docs/a.md'", "verified"):
            self.assertIn(named, message)
        self.cli.child("lease", "release", *writer)
        # The frozen list is still the one used: d is filed and nothing twice; a waits for a list that keeps the keys.
        self.assertEqual(self.drive(child=True).code, 10)
        self.assertEqual(self.filed(), ["docs/b.md", "docs/c.md", "docs/d.md"])

    def test_items_added_after_the_keyed_ones_are_frozen_and_each_filed_once(self) -> None:
        self.documents("docs/b.md", "docs/c.md", "docs/d.md")
        self.start_and_file(contract(GLOB), "3")
        self.documents("docs/e.md")  # sorts last: the keys held stay with their items
        writer = self.writer()
        self.migrate(contract(GLOB, goal=LATER), writer)
        self.cli("step", "start", STEP, *writer)
        self.cli("lease", "release", *writer)
        self.assertEqual(self.drive().code, 10)
        self.assertEqual(self.filed(), ["docs/b.md", "docs/c.md", "docs/d.md", "docs/e.md"])

    def test_a_skip_moves_with_its_item_when_the_keys_shift(self) -> None:
        self.documents("docs/b.md", "docs/c.md", "docs/d.md")
        self.start_and_file(contract(GLOB), "1")  # the start only: no effect yet
        writer = self.writer()
        self.cli("effect", "skip", "doc-2", "--reason", "d is withdrawn", *writer)
        self.documents("docs/a.md")  # no key is held, so the shift is taken; d's skip must stay d's
        self.migrate(contract(GLOB, goal=LATER), writer)
        self.cli("step", "start", STEP, *writer)
        self.cli("lease", "release", *writer)
        self.assertEqual(self.drive().code, 10)
        self.assertEqual(self.filed(), ["docs/a.md", "docs/b.md", "docs/c.md"])

    # -- a changed key template --------------------------------------------------------------------
    def test_a_changed_key_template_is_refused_while_verified_effects_exist(self) -> None:
        self.documents("docs/b.md", "docs/c.md", "docs/d.md")
        self.start_and_file(contract(GLOB), "3")
        writer = self.writer()
        self.migrate(contract(GLOB, key="doc-{slug}"), writer)
        message = json.loads(self.refused_start(writer).out)["message"]
        for named in ("'doc-{index}'", "'doc-{slug}'", "2 effect(s)", "'docs/b.md'", "'doc-b'"):
            self.assertIn(named, message)
        self.cli("lease", "release", *writer)
        self.assertEqual(self.drive().code, 10)
        self.assertEqual(self.filed(), ["docs/b.md", "docs/c.md", "docs/d.md"])

    def test_a_changed_key_template_is_taken_when_no_effect_may_exist(self) -> None:
        self.documents("docs/b.md", "docs/c.md")
        # b's only call is refused by the target (exit 2): failed, nothing created; c is never begun.
        self.init(contract(GLOB, invoke="refuse.sh"))
        self.assertEqual(self.drive().code, 12)
        self.assertEqual(self.cli("effect", "show", "doc-0", "--json", code=None).json["state"], "failed")
        writer = self.writer()
        self.migrate(contract(GLOB, key="doc-{slug}"), writer)
        self.cli("step", "start", STEP, *writer)
        self.cli("lease", "release", *writer)
        self.assertEqual(self.drive().code, 10)
        self.assertEqual(self.filed(), ["docs/b.md", "docs/c.md"])
        self.assertEqual(self.cli("effect", "show", "doc-b", "--json", code=None).json["state"], "verified")

    # -- keys held for items no longer listed, and for other steps ---------------------------------
    def test_a_key_held_for_a_dropped_item_comes_back_only_with_that_item(self) -> None:
        self.start_and_file(contract(["a/x.md", "a/y.md"], key="doc-{slug}"), "2")  # a/x.md filed as doc-x
        writer = self.writer()
        self.migrate(contract(["a/y.md"], key="doc-{slug}"), writer)  # a/x.md dropped: doc-x is kept with it
        self.cli("step", "start", STEP, *writer)
        self.migrate(contract(["b/x.md", "a/y.md"], key="doc-{slug}"), writer)  # another document with the slug x
        message = json.loads(self.refused_start(writer).out)["message"]
        self.assertIn("'doc-x' holds an effect (verified) of item 'a/x.md'", message)
        self.assertIn("'b/x.md'", message)
        self.migrate(contract(["a/x.md", "a/y.md"], key="doc-{slug}"), writer)  # the same document back
        self.cli("step", "start", STEP, *writer)
        self.cli("lease", "release", *writer)
        self.assertEqual(self.drive().code, 10)
        self.assertEqual(self.filed(), ["a/x.md", "a/y.md"])

    def test_a_key_of_another_steps_item_is_refused(self) -> None:
        block = contract(["one/a.md"], key="doc-{stem}")
        block["steps"][0]["next"] = "s2"
        block["steps"].append({"id": "s2", "items": ["two/a.md"], "key": "doc-{stem}", "payload": PAYLOAD})
        self.start_and_file(block, "3")  # s1 started, its item filed, s1 done
        writer = self.writer()
        before = durable(self.run_dir)
        started = self.cli("step", "start", "s2", "--json", *writer, code=2)
        message = json.loads(started.out)["message"]
        for named in ("'two/a.md'", "'one/a.md'", "'doc-a'", "'s1'"):
            self.assertIn(named, message)
        self.assertEqual(durable(self.run_dir), before)
        self.assertEqual(self.filed(), ["one/a.md"])

    # -- a lookup two items share ------------------------------------------------------------------
    def http(self, items: Any, url: str = HOST + "/api/issues?external_ref={slug}", **observe: Any) -> Dict[str, Any]:
        block = contract(items)
        block["effects"] = {"http": {"invoke": {"url": HOST + "/api/issues"}, "observe": dict(observe, url=url)}}
        return block

    def test_two_items_with_one_slug_lookup_are_refused_at_step_start(self) -> None:
        self.documents("a/notes.md", "b/notes.md")
        self.init(self.http({"glob": "**/*.md"}))
        writer = self.writer()
        message = json.loads(self.refused_start(writer).out)["message"]
        for named in ("'a/notes.md'", "'b/notes.md'", "external_ref=notes"):
            self.assertIn(named, message)
        self.assertEqual(self.filed(), [])

    def check(self, block: Dict[str, Any]) -> Result:
        return self.cli("contract", "check", self.write("checked.md", block), code=None)

    def test_two_inline_items_with_one_lookup_are_refused_at_contract_check(self) -> None:
        items = ["a/notes.md", "b/notes.md"]
        shared = [self.http(items), self.http(items, url=HOST + "/api/issues", headers={"X-Ref": "{slug}"}),
                  contract(items, observe=["sh", "find.sh", "{stem}"]),
                  contract(items, observe=["sh", "find.sh", "{key}"],
                           observe_many={"command": ["sh", "many.sh", "{each}"], "match": "/ref", "value": "{slug}"})]
        for block in shared:
            refused = self.check(block)
            self.assertEqual(refused.code, 2, block["effects"])
            self.assertIn("items 'a/notes.md' and 'b/notes.md' of step 's1' are looked up at the target by one value",
                          refused.err)
        told_apart = [self.http(items, url=HOST + "/api/issues?ref={key}"), self.http(items, url=HOST + "/i?p={item}"),
                      contract(items), self.http({"glob": "**/*.md"})]  # a glob is listed, and checked, at step start
        for block in told_apart:
            self.assertEqual(self.check(block).code, 0, block["effects"])


if __name__ == "__main__":
    unittest.main()
