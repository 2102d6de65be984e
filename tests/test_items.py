"""Batch items: confined to the workspace, listed within bounds, and turned into keys and documents.

* Items resolve inside the workspace after links are followed: refused at
  ``contract check`` where the contract shows it, at ``step start`` for every
  source, and again when an item's file is read for a payload.
* A glob never enters a directory link (two links to ``.`` and ``..`` once
  made ``next``, ``brief`` and ``drive`` hang) and its listing is bounded;
  for ordinary trees it lists what :func:`glob.glob` lists.
* ``{slug}``, ``{text}``, ``{heading}`` and ``{body}``.
* A relative ``workspace`` resolves against the contract file's folder,
  recorded at ``init`` outside the plan, so ``--contract`` comparisons hold.
* ``effect begin KEY`` of a batch item takes the template's payload.
"""

import glob
import json
import os
import random
import shutil
import unittest
from typing import Any, Dict, List
from unittest import mock

from runner.ledger import batch
from runner.base import workspace
from runner.contract import templates
from runner.base.values import validate_id
from runner.base.canonical import content_digest
from runner.base.errors import InvalidInput
from tests.support.batch import batch_contract, script
from tests.support.cli import RunnerCli
from tests.support.util import Result, child_env, contract_markdown, python, run, scratch_dir, write_contract

#: invoke KEY PAYLOAD_FILE OUT: keeps the payload the target received as OUT/KEY.json; observe KEY OUT: present when kept.
TARGET = r'''#!/bin/sh
if [ "$1" = invoke ]; then
    cp "$3" "$4/$2.json" || exit 3
    printf '{"kept": "%s"}\n' "$2"
    exit 0
fi
[ -e "$3/$2.json" ] && echo "{}"
'''


class Workspace(unittest.TestCase):
    """A scratch folder ``root`` holding the workspace ``root/ws``, a secret outside it and a target that keeps payloads."""

    def setUp(self) -> None:
        self.tmp = scratch_dir("runner-items-")
        self.addCleanup(self.tmp.cleanup)
        self.root = self.tmp.name
        self.ws = os.path.join(self.root, "ws")
        self.cli = RunnerCli(self, root=self.ws)
        self.out = os.path.join(self.root, "out")
        os.makedirs(os.path.join(self.ws, "docs"))
        os.mkdir(self.out)
        self.secret = os.path.join(self.root, "secret.txt")
        self.write(self.secret, "SECRET-LINE outside the workspace\n")
        target = script(self.root, "target.sh", TARGET)
        self.commands = {"invoke": target + ["invoke", "{key}", "{payload_file}", self.out], "observe": target + ["observe", "{key}", self.out]}

    def write(self, path: str, text: str) -> str:
        full = path if os.path.isabs(path) else os.path.join(self.ws, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as handle:
            handle.write(text)
        return full

    def contract(self, **options: Any) -> Dict[str, Any]:
        options.setdefault("payload", {"template": {"doc": "{item}", "title": "{first_line}"}})
        return batch_contract(self.commands, **options)

    def init(self, block: Dict[str, Any]) -> None:
        """The contract in the workspace (its ``workspace`` is ``.``), the run in ``ws/.run``."""
        self.cli.init(block)

    def writer(self) -> List[str]:
        if self.cli.status()["lease"]["owner"] is None:
            self.cli("lease", "acquire", "--owner", "agent")
        return ["--owner", "agent", "--epoch", str(self.cli.status()["lease"]["epoch"])]

    def sent(self) -> str:
        """Every payload the target received, as one text."""
        texts = []
        for name in sorted(os.listdir(self.out)):
            with open(os.path.join(self.out, name), encoding="utf-8") as handle:
                texts.append(handle.read())
        return "\n".join(texts)

    def assert_refused_start(self, *needles: str) -> None:
        """``step start`` exits 2 with one line naming ``needles``, and the step is not started."""
        writer = self.writer()
        before = self.cli.status()
        result = self.cli("step", "start", "file-tickets", *writer, code=2)
        self.assertEqual(len(result.err.splitlines()), 1, result.err)
        for needle in needles:
            self.assertIn(needle, result.err)
        after = self.cli.status()
        self.assertEqual((after["revision"], after["steps"]), (before["revision"], {}), "a refused start records nothing")


class ContractCheckTest(unittest.TestCase):
    def problems(self, step: Dict[str, Any]) -> List[str]:
        block = {"contract": 1, "task_id": "t", "goal": "g", "steps": [dict({"id": "s", "key": "{stem}"}, **step)]}
        from runner.contract.text import parse_contract_text

        return [p.message for p in parse_contract_text(contract_markdown(json.dumps(block, indent=2)))[1]]

    def test_items_that_name_a_place_outside_are_refused_where_the_contract_shows_them(self) -> None:
        cases = [
            ({"items": ["docs/a.md", "/etc/passwd"]}, "item 1 '/etc/passwd' is an absolute path"),
            ({"items": ["docs/a.md", "../../../etc/passwd"]}, "holds a '..' component"),
            ({"items": ["docs/../../x"]}, "holds a '..' component"),
            ({"items": ["docs\\..\\..\\x"]}, "holds a '..' component"),
            ({"items": ["a\u0000b"]}, "holds a NUL character"),
            ({"items": {"file": "/etc/passwd"}}, "relative to the workspace and without '..'"),
            ({"items": {"file": "../list.txt"}}, "relative to the workspace and without '..'"),
            ({"items": {"glob": "/etc/*"}}, "relative to the workspace and without '..'"),
        ]
        for step, expected in cases:
            with self.subTest(step=step):
                found = self.problems(step)
                self.assertTrue(any(expected in p for p in found), found)

    def test_ordinary_items_and_the_new_placeholders_pass(self) -> None:
        fine = [
            {"items": ["docs/a.md", "it's a \"quoted\" name.md", "a..b.md", ".hidden"], "key": "{slug}:t"},
            {"items": {"glob": "inbox/**/*.md"}, "key": "{slug}:issue",
             "payload": {"template": {"external_ref": "{slug}", "title": "{heading}", "body": "{body}", "text": "{text}"}}},
            {"items": {"file": "lists/items.txt"}, "key": "{index:04d}-{slug}", "payload": {"command": ["python3", "make.py", "{slug}", "{workspace}"]}},
        ]
        for step in fine:
            with self.subTest(step=step):
                self.assertEqual(self.problems(step), [])

    def test_a_payload_command_cannot_name_a_placeholder_only_a_template_fills(self) -> None:
        found = self.problems({"items": ["a.md"], "payload": {"command": ["python3", "make.py", "{text}"]}})
        self.assertTrue(any("unknown placeholder {text}" in p for p in found), found)


class StartConfinementTest(Workspace):
    def test_a_glob_hit_that_links_outside_refuses_the_start(self) -> None:
        self.write("docs/a.md", "# a\n")
        os.symlink(self.secret, os.path.join(self.ws, "docs", "b.md"))
        self.init(self.contract(items={"glob": "docs/*.md"}))
        self.assert_refused_start("item 1 'docs/b.md'", "leads outside the workspace")

    def test_item_file_lines_are_checked_like_inline_items(self) -> None:
        self.write("docs/a.md", "# a\n")
        os.symlink(self.secret, os.path.join(self.ws, "docs", "link.md"))
        os.symlink(self.root, os.path.join(self.ws, "up"))
        for line, needle in (("/etc/passwd", "is an absolute path"), ("docs/../../secret.txt", "holds a '..' component"),
                             ("docs/link.md", "leads outside the workspace"), ("up/secret.txt", "leads outside the workspace")):
            with self.subTest(line=line):
                shutil.rmtree(os.path.join(self.ws, ".run"), ignore_errors=True)
                self.write("list.txt", f"docs/a.md\n{line}\n")
                self.init(self.contract(items={"file": "list.txt"}))
                self.assert_refused_start(f"item 1 {line!r}", needle)

    def test_an_inline_item_through_a_folder_link_and_an_item_file_that_is_a_link_are_refused(self) -> None:
        os.symlink(self.root, os.path.join(self.ws, "up"))
        self.init(self.contract(items=["docs/a.md", "up/secret.txt"]))
        self.assert_refused_start("item 1 'up/secret.txt'", "leads outside the workspace")

    def test_an_item_file_that_links_outside_is_refused(self) -> None:
        self.write(os.path.join(self.root, "list.txt"), "docs/a.md\n")
        os.symlink(os.path.join(self.root, "list.txt"), os.path.join(self.ws, "list.txt"))
        self.init(self.contract(items={"file": "list.txt"}))
        self.assert_refused_start("the item file 'list.txt'", "leads outside the workspace")

    def test_links_that_stay_inside_are_items_like_any_other(self) -> None:
        self.write("real/a.md", "# First\n")
        self.write("docs/b.md", "# Second\n")
        os.symlink(os.path.join(self.ws, "real", "a.md"), os.path.join(self.ws, "docs", "a.md"))
        self.init(self.contract(items={"glob": "docs/*.md"}))
        self.cli("drive", "--owner", "agent", "--json", code=10)
        self.assertEqual(self.cli.status()["steps"]["file-tickets"]["batch"]["items"], ["docs/a.md", "docs/b.md"])
        self.assertIn('"title":"# First"', self.sent())


class ReadTimeTest(Workspace):
    def test_a_link_changed_after_the_freeze_does_not_send_a_file_outside(self) -> None:
        for name in ("a", "b", "c"):
            self.write(f"docs/{name}.md", f"# {name}\n")
        self.init(self.contract(items={"glob": "docs/*.md"}))
        self.cli("drive", "--owner", "agent", "--max-actions", "2")  # the start and item a
        os.unlink(os.path.join(self.ws, "docs", "b.md"))
        os.symlink(self.secret, os.path.join(self.ws, "docs", "b.md"))
        stopped = self.cli("drive", "--owner", "agent", "--json", code=2)
        self.assertIn("leads outside the workspace", json.loads(stopped.out)["detail"])
        self.assertNotIn("SECRET", self.sent())
        self.assertEqual(sorted(os.listdir(self.out)), ["a:ticket.json"])
        writer = self.writer()
        for verb in (("effect", "run", "b:ticket"), ("effect", "begin", "b:ticket")):
            with self.subTest(verb=verb):
                refused = self.cli(*verb, *writer, code=2)
                self.assertIn("leads outside the workspace", refused.err)
        self.assertNotIn("b:ticket", self.cli("effect", "list", "--json", code=None).json["effects"])
        self.assertNotIn("SECRET", self.sent())

    def test_an_item_that_is_a_fifo_is_refused_rather_than_waited_on(self) -> None:
        if not hasattr(os, "mkfifo"):
            self.skipTest("no named pipes here")
        os.mkfifo(os.path.join(self.ws, "docs", "pipe.md"))
        self.init(self.contract(items=["docs/pipe.md"]))
        result = run(python("-m", "runner", "--dir", os.path.join(self.ws, ".run"), "drive", "--owner", "agent", "--json"),
                     cwd=self.ws, env=child_env(), timeout=30)
        self.assertEqual(result.code, 2, result)
        self.assertIn("is not a regular file", json.loads(result.out)["detail"])


class GlobTest(Workspace):
    def test_links_to_dot_and_dot_dot_do_not_make_the_verbs_hang(self) -> None:
        """The reproduction of 04: every verb answers, and the listing does not change with the links."""
        self.write("docs/a.md", "# a\n")
        self.write("docs/sub/b.md", "# b\n")
        block = self.contract(items={"glob": "docs/**/*.md"})
        self.init(block)
        self.cli("drive", "--owner", "agent", "--max-actions", "1")  # started, frozen
        os.symlink(".", os.path.join(self.ws, "docs", "x"))
        os.symlink("..", os.path.join(self.ws, "docs", "y"))
        os.symlink(self.root, os.path.join(self.ws, "docs", "z"))
        self.assertEqual(workspace.glob_files(self.ws, "docs/**/*.md"), ["docs/a.md", "docs/sub/b.md"])
        # drive gave the lease back
        epoch = str(self.cli("lease", "acquire", "--owner", "agent", "--json", code=None).json["epoch"])
        for verb in (("brief",), ("next", "--owner", "agent", "--epoch", epoch), ("drive", "--owner", "agent")):
            with self.subTest(verb=verb[0]):
                result = self.cli.child(*verb, "--json", timeout=30, code=None)  # a hang fails here after 30 s
                decision = json.loads(result.out)
                self.assertNotIn("cannot be listed", result.out)
                if verb[0] == "next":
                    self.assertEqual(decision["action"]["total"], 2)
                    self.assertFalse([o for o in decision["observations"] if str(o.get("source", "")).startswith("items of step")])
        self.assertEqual(self.cli.status()["status"], "complete")

    def test_the_listing_matches_glob_for_trees_without_links(self) -> None:
        rnd = random.Random(20240521)
        names = ["a", "b.md", ".h", ".h.md", "c.txt", "d", "x[1].md", "sp ace.md", "Upper.MD"]

        def build(path: str, depth: int) -> None:
            os.makedirs(path, exist_ok=True)
            for name in rnd.sample(names, 5):
                if depth < 3 and rnd.random() < 0.45:
                    build(os.path.join(path, name), depth + 1)
                else:
                    open(os.path.join(path, name), "w").close()

        tree = os.path.join(self.root, "tree")
        for name in ("a/b.md", "a/c.txt", "a/x/b.md", "a/x/.h.md", "a/.hd/b.md", "a/a/z.md", "b.md", ".h.md", ".h/b.md", ".h/c.txt",
                     "d/e/f.md", "d/.g.md", "x[1].md", "sp ace.md", "Upper.MD", "c.txt", "e.md"):
            os.makedirs(os.path.dirname(os.path.join(tree, name)), exist_ok=True)
            open(os.path.join(tree, name), "w").close()
        os.makedirs(os.path.join(tree, "empty", "deeper"))
        build(os.path.join(tree, "r"), 0)
        patterns = ["*", "*.md", "**", "**/*.md", "*/*.md", "**/.h*", ".h*/**", "a/**/*.txt", "**/**/*.md", "a/*", "d/**",
                    "b.md", ".h.md", "*/.h", "**/a/*.md", "x[[]1].md", "?.md", "[ab]*", "./*.md", "a//*.md", "**/*",
                    "*/**/*.md", "a/b.md", "a/**", "*.MD", "d/", "**/[!.]*", "r/**/*.md", "r/*/*", "**/x[[]1].md/**",
                    "empty/**", "*/", "**/", "a/*/", "r/**/", ".h/", "*/.h*/", "empty/*/", "r/*/*/", "b.md/", "./"]
        compared = 0
        for pattern in patterns:
            with self.subTest(pattern=pattern):
                hits = glob.glob(os.path.join(glob.escape(tree), pattern), recursive=True)
                # A pattern that ends with '/' lists folders (never the workspace itself), any other lists files.
                wanted = os.path.isdir if pattern.endswith("/") else os.path.isfile
                expected = sorted({os.path.relpath(p, tree) for p in hits if wanted(p)} - {"."})
                self.assertEqual(workspace.glob_files(tree, pattern), expected)
                compared += bool(expected)
        self.assertGreater(compared, 30, "most patterns matched something")

    def test_the_listing_is_bounded_in_entries_and_items(self) -> None:
        for n in range(30):
            self.write(f"docs/d{n % 3}/f{n:02d}.md", "x\n")
        self.assertEqual(len(workspace.glob_files(self.ws, "docs/**/*.md")), 30)
        with self.assertRaises(InvalidInput) as caught:
            workspace.glob_files(self.ws, "docs/**/*.md", max_entries=20)
        self.assertIn("visits more than 20 entries", caught.exception.message)
        with self.assertRaises(InvalidInput) as caught:
            workspace.glob_files(self.ws, "docs/**/*.md", max_items=29)
        self.assertIn("lists more than 29 items", caught.exception.message)
        # Through the command line: one line, exit 2, nothing started; and a view reports it instead of failing.
        self.init(self.contract(items={"glob": "docs/**/*.md"}))
        with mock.patch.object(workspace, "MAX_LISTED_ENTRIES", 20):
            self.assert_refused_start("visits more than 20 entries")
        writer = self.writer()
        self.cli("step", "start", "file-tickets", *writer)
        with mock.patch.object(workspace, "MAX_ITEMS", 10):
            decision = self.cli("next", "--json", *writer, code=None).json
        changed = [o for o in decision["observations"] if str(o.get("source", "")).startswith("items of step")]
        self.assertEqual(len(changed), 1, decision["observations"])
        self.assertIn("lists more than 10 items", changed[0]["what"])
        self.assertEqual(decision["action"]["total"], 30, "the frozen list is still the one used")


class SlugTest(Workspace):
    def test_slug_rules(self) -> None:
        cases = {
            "inbox/report 013 (customer's copy).md": "report-013-customer-s-copy",
            "Café Déjà-Vu.txt": "cafe-deja-vu",
            "--Straße__Nr.7--.md": "strasse-nr-7",
            "docs/README": "readme",
            "x" * 300 + ".md": "x" * templates.MAX_SLUG_CHARS,
            "日本語.md": "",
            "###.md": "",
        }
        for item, expected in cases.items():
            with self.subTest(item=item):
                self.assertEqual(templates.slug(item), expected)
                if expected:
                    validate_id(templates.slug(item) + ":issue")
        long = "a-" * 60 + ".md"
        self.assertFalse(templates.slug(long).endswith("-"), "a cut never leaves a trailing '-'")

    def test_a_file_name_with_spaces_and_quotes_gives_a_valid_key(self) -> None:
        self.write("inbox/report 013 (customer's copy).md", "# Printer on fire\n\nIt is on fire again.\n")
        self.write("inbox/Report 014.md", "# Second\n")
        block = self.contract(items={"glob": "inbox/*.md"}, payload={"template": {"external_ref": "{slug}", "title": "{heading}"}})
        block["steps"][0]["key"] = "{slug}:issue"
        block["effects"]["key_pattern"] = "[a-z0-9-]+:issue"
        self.init(block)
        self.cli("drive", "--owner", "agent", "--json", code=10)
        self.assertEqual(sorted(os.listdir(self.out)), ["report-013-customer-s-copy:issue.json", "report-014:issue.json"])
        with open(os.path.join(self.out, "report-013-customer-s-copy:issue.json"), encoding="utf-8") as handle:
            self.assertEqual(json.load(handle), {"external_ref": "report-013-customer-s-copy", "title": "Printer on fire"})

    def test_two_items_with_one_slug_are_refused_at_start(self) -> None:
        self.write("docs/a b.md", "x\n")
        self.write("docs/A-B.md", "y\n")
        block = self.contract(items={"glob": "docs/*.md"})
        block["steps"][0]["key"] = "{slug}:t"
        self.init(block)
        self.assert_refused_start("give the same key 'a-b:t'")

    def test_an_item_without_a_letter_or_digit_for_its_slug_is_refused_at_start(self) -> None:
        self.write("docs/日本語.md", "x\n")
        block = self.contract(items={"glob": "docs/*.md"})
        block["steps"][0]["key"] = "{slug}:t"
        self.init(block)
        self.assert_refused_start("has no letter or digit to make {slug} of", "{index}")


class DocumentTest(Workspace):
    def test_text_heading_and_body(self) -> None:
        cases = [
            (b"# Printer on fire\n\nIt is on fire again.\nPlease help.\n\n",
             {"heading": "Printer on fire", "body": "It is on fire again.\nPlease help."}),
            (b"\xef\xbb\xbf\r\n\r\n## \tTitle with CRLF  \r\nline one\r\nline two\r\n", {"heading": "Title with CRLF", "body": "line one\r\nline two"}),
            (b"No mark at all", {"heading": "No mark at all", "body": ""}),
            (b"", {"heading": "", "body": ""}),
            ("# Überschrift ✓\nKörper\n".encode("utf-8"), {"heading": "Überschrift ✓", "body": "Körper"}),
        ]
        for data, expected in cases:
            with self.subTest(data=data[:20]):
                values = templates.document_values(data)
                self.assertEqual({k: values[k] for k in ("heading", "body")}, expected)
                self.assertEqual(values["text"], data.decode("utf-8-sig"))

    def test_a_document_payload_reaches_the_target(self) -> None:
        self.write("inbox/one.md", "# Printer on fire\n\nIt is on fire again.\n\"Quoted\" and \\ backslash.\n")
        self.init(self.contract(items={"glob": "inbox/*.md"}, payload={"template": {"title": "{heading}", "body": "{body}", "text": "{text}"}}))
        self.cli("drive", "--owner", "agent", "--json", code=10)
        with open(os.path.join(self.out, "one:ticket.json"), encoding="utf-8") as handle:
            sent = json.load(handle)
        self.assertEqual(sent, {"title": "Printer on fire", "body": "It is on fire again.\n\"Quoted\" and \\ backslash.",
                                "text": "# Printer on fire\n\nIt is on fire again.\n\"Quoted\" and \\ backslash.\n"})

    def test_a_file_too_large_or_not_utf8_is_refused_naming_the_item(self) -> None:
        self.write("inbox/a.md", "# fine\n")
        with open(os.path.join(self.ws, "inbox", "b.md"), "wb") as handle:
            handle.write(b"# Latin-1 caf\xe9\n")
        self.write("inbox/c.md", "# big\n" + "x" * templates.MAX_TEXT_BYTES)
        self.init(self.contract(items={"glob": "inbox/*.md"}, payload={"template": {"title": "{heading}"}}))
        stopped = self.cli("drive", "--owner", "agent", "--json", code=2)
        detail = json.loads(stopped.out)["detail"]
        self.assertIn("'inbox/b.md'", detail)
        self.assertIn("is not UTF-8 (byte 13)", detail)
        writer = self.writer()
        self.cli("effect", "skip", "b:ticket", "--reason", "not UTF-8", *writer)
        stopped = self.cli("drive", "--owner", "agent", "--json", code=2)
        self.assertIn(f"larger than {templates.MAX_TEXT_BYTES:,} bytes", json.loads(stopped.out)["detail"])
        self.assertEqual(sorted(os.listdir(self.out)), ["a:ticket.json"], "nothing cut short or garbled was sent")


class WorkspaceBaseTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = scratch_dir("runner-workspace-")
        self.addCleanup(self.tmp.cleanup)
        self.root = self.tmp.name
        self.project = os.path.join(self.root, "project")
        self.elsewhere = os.path.join(self.root, "elsewhere")
        for folder in ("project/docs", "elsewhere/docs", "out"):
            os.makedirs(os.path.join(self.root, folder))
        for name in ("one", "two"):
            with open(os.path.join(self.project, "docs", f"{name}.txt"), "w") as handle:
                handle.write(f"{name}\n")
        with open(os.path.join(self.elsewhere, "docs", "decoy.txt"), "w") as handle:
            handle.write("decoy\n")
        target = script(self.root, "target.sh", TARGET)
        out = os.path.join(self.root, "out")
        self.block = batch_contract({"invoke": target + ["invoke", "{key}", "{payload_file}", out], "observe": target + ["observe", "{key}", out]})
        self.contract = write_contract(os.path.join(self.project, "contract.md"), self.block)
        self.run_dir = os.path.join(self.root, "run")

    def runner(self, cwd: str, *args: str) -> Result:
        return run(python("-m", "runner", "--dir", self.run_dir, *args), cwd=cwd, env=child_env(), timeout=120)

    def test_a_relative_workspace_is_the_contract_folder_whatever_folder_the_verbs_run_in(self) -> None:
        started = self.runner(self.elsewhere, "init", "--contract", os.path.relpath(self.contract, self.elsewhere), "--json")
        self.assertEqual(started.code, 0, started)
        self.assertEqual(json.loads(started.out)["workspace"], self.project)
        self.assertEqual(status_of(self.run_dir)["workspace_base"], self.project)
        done = self.runner(self.root, "drive", "--owner", "agent", "--json")
        self.assertEqual(done.code, 10, done)
        state = status_of(self.run_dir)
        self.assertEqual(state["steps"]["file-tickets"]["workspace"], self.project)
        self.assertEqual(state["steps"]["file-tickets"]["batch"]["items"], ["docs/one.txt", "docs/two.txt"])
        # The plan is the contract as written: the same file still passes --contract.
        for verb in (("next", "--owner", "agent", "--epoch", str(state["lease"]["epoch"])), ("recover", "--owner", "agent")):
            with self.subTest(verb=verb[0]):
                checked = self.runner(self.elsewhere, *verb, "--contract", self.contract, "--json")
                self.assertEqual(checked.code, 10, checked)
        self.assertEqual(state["plan_digest"], content_digest(self.block))

    def test_a_run_without_a_recorded_folder_resolves_against_the_current_one_as_before(self) -> None:
        from runner.stores import create_store

        create_store("file:" + self.run_dir, self.block["task_id"], self.block).close()
        self.assertNotIn("workspace_base", status_of(self.run_dir))
        done = self.runner(self.elsewhere, "drive", "--owner", "agent", "--json")
        self.assertEqual(done.code, 10, done)
        state = status_of(self.run_dir)
        self.assertEqual(state["steps"]["file-tickets"]["workspace"], self.elsewhere)
        self.assertEqual(state["steps"]["file-tickets"]["batch"]["items"], ["docs/decoy.txt"])

    def test_the_folder_is_kept_by_a_database_store_too(self) -> None:
        url = "sqlite:" + os.path.join(self.root, "runs.db")
        started = run(python("-m", "runner", "--store", url, "init", "--contract", self.contract, "--json"), cwd=self.root, env=child_env())
        self.assertEqual(started.code, 0, started)
        from runner.stores import open_store

        store = open_store(url, self.block["task_id"])
        try:
            self.assertEqual(store.state["workspace_base"], self.project)
            self.assertEqual(batch.run_workspace(store.state, cwd=self.elsewhere), self.project)
        finally:
            store.close()


def status_of(run_dir: str) -> Dict[str, Any]:
    from runner.stores.file import RunStore

    return RunStore.open(run_dir).state


class BeginPayloadTest(Workspace):
    def setUp(self) -> None:
        super().setUp()
        self.write("docs/a.md", "# Alpha\nbody\n")
        self.write("docs/b.md", "# Beta\n")
        block = self.contract(items={"glob": "docs/*.md"}, payload={"template": {"title": "{heading}", "key": "{key}"}})
        del block["effects"]["invoke"], block["effects"]["observe"]
        self.init(block)
        self.writer_args = self.writer()
        self.cli("step", "start", "file-tickets", *self.writer_args)

    def test_begin_without_a_payload_records_the_templates(self) -> None:
        action = self.cli("next", "--json", *self.writer_args, code=None).json["action"]
        self.assertNotIn("--payload", action["why"])
        begun = self.cli("effect", "begin", "a:ticket", "--json", *self.writer_args)
        self.assertEqual(json.loads(begun.out)["payload_digest"], content_digest({"title": "Alpha", "key": "a:ticket"}))
        self.assertEqual(json.loads(begun.out)["payload"], {"title": "Alpha", "key": "a:ticket"}, "shown, so the caller sends exactly it")

    def test_begin_with_another_payload_is_refused_with_both_digests(self) -> None:
        other = self.write(os.path.join(self.root, "other.json"), json.dumps({"title": "Something else", "key": "b:ticket"}))
        same = self.write(os.path.join(self.root, "same.json"), json.dumps({"key": "b:ticket", "title": "Beta"}))
        before = self.cli.status()["revision"]
        refused = self.cli("effect", "begin", "b:ticket", "--payload", other, "--json", *self.writer_args, code=2)
        body = json.loads(refused.out)
        want, got = content_digest({"title": "Beta", "key": "b:ticket"}), content_digest({"title": "Something else", "key": "b:ticket"})
        self.assertIn(want, body["message"])
        self.assertIn(got, body["message"])
        self.assertEqual(len(refused.err.splitlines()), 1)
        self.assertEqual(self.cli.status()["revision"], before, "nothing recorded")
        accepted = self.cli("effect", "begin", "b:ticket", "--payload", same, "--json", *self.writer_args)
        self.assertEqual(json.loads(accepted.out)["payload_digest"], want)

    def test_a_key_that_is_no_item_still_needs_a_payload(self) -> None:
        refused = self.cli("effect", "begin", "notes:post", *self.writer_args, code=2)
        self.assertIn("--payload FILE is required", refused.err)


if __name__ == "__main__":
    unittest.main()
