"""Batch steps, contract commands and observed evidence, through the command line.

Commands here are small Python scripts the tests write; the workspace is
given as an absolute path so that the command line can run in this process.
"""

import json
import os
import unittest

from runner.contract.text import parse_contract_text
from tests.support.batch import batch_contract, recorded, recorder_commands, script
from tests.support.cli import RunnerCli
from tests.support.util import contract_markdown, scratch_dir

SLOW = r'''
import os, sys, time
# invoke: never answers in time; observe: cannot tell (exit 3) until the file "seen" appears, then present.
if sys.argv[1] == "invoke":
    time.sleep(30)
if os.path.exists("seen"):
    print("{}")
    sys.exit(0)
sys.exit(3)
'''


class BatchTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = scratch_dir("runner-batch-")
        self.addCleanup(self.tmp.cleanup)
        self.root = self.tmp.name
        self.cli = RunnerCli(self, root=self.root)
        self.out = os.path.join(self.root, "out")
        os.mkdir(self.out)
        self.commands = recorder_commands(self.root)

    def _contract(self, **options):
        options.setdefault("workspace", self.root)
        return batch_contract(self.commands, **options)

    def drive(self, *extra: str):
        return self.cli("drive", "--owner", "agent", "--json", *extra, code=None)

    def test_an_item_with_shell_syntax_reaches_the_command_as_one_argument(self) -> None:
        nasty = "it's a \"quoted\" $(touch PWNED) `touch PWNED2`; rm -rf ./out\nsecond line * ?"
        block = self._contract(items=[nasty, "plain"], payload={"template": {"item": "{item}"}})
        block["steps"][0]["key"] = "t-{index}"
        self.cli.init(block)
        result = self.drive()
        self.assertEqual(result.code, 10, result.err)
        self.assertEqual(recorded(self.out, "t-0"), ["invoke", nasty, "t-0", self.out], "the item is one argument, byte for byte")
        for name in ("PWNED", "PWNED2"):
            self.assertFalse(os.path.exists(os.path.join(self.root, name)), "nothing in the item ran")
        self.assertTrue(os.path.isdir(self.out))

    def test_a_glob_change_after_start_is_observed_and_never_used(self) -> None:
        from tests.support.batch import make_documents

        make_documents(self.root, 3)
        self.cli.init(self._contract())
        self.assertEqual(self.drive("--max-actions", "2").code, 0)  # step start and the first item
        os.unlink(os.path.join(self.root, "docs", "doc-00002.txt"))
        with open(os.path.join(self.root, "docs", "late.txt"), "w") as handle:
            handle.write("Added after the start\n")
        # drive gave the lease back
        epoch = str(self.cli("lease", "acquire", "--owner", "agent", "--json", code=None).json["epoch"])
        decision = self.cli("next", "--json", "--owner", "agent", "--epoch", epoch, code=None).json
        changed = [o for o in decision["observations"] if o["source"].startswith("items of step `file-tickets`")]
        self.assertEqual(len(changed), 1, decision["observations"])
        self.assertEqual((changed[0]["added"], changed[0]["removed"]), (1, 1))
        self.assertTrue(any("migrate" in u for u in decision["unknowns"]), decision["unknowns"])
        self.assertEqual((decision["action"]["kind"], decision["action"]["total"], decision["action"]["key"]), ("effect", 3, "doc-00001:ticket"))
        # The frozen item whose file is gone cannot make its payload: drive stops there instead of using the new list.
        stopped = self.drive()
        self.assertEqual(stopped.code, 2, stopped.err)
        self.assertIn("doc-00002.txt", json.loads(stopped.out)["detail"])
        self.assertEqual((json.loads(stopped.out)["error"], json.loads(stopped.out)["exit_code"]), ("invalid-input", 2))
        self.assertNotIn("late:ticket", self.cli.status()["steps"]["file-tickets"]["batch"]["items"])
        self.assertFalse(os.path.exists(os.path.join(self.out, "late:ticket.args")))
        # A recorded change of plan, then a new start of the step, freezes the list the source holds now.
        block = self._contract()
        block["goal"] = "File one ticket per document, each exactly once, including documents added late."
        from tests.support.util import write_contract

        write_contract(os.path.join(self.root, "contract-2.md"), block)
        taken = self.cli("lease", "acquire", "--owner", "agent", "--json", code=None).json
        writer = ["--owner", "agent", "--epoch", str(taken["epoch"])]
        self.cli("migrate", "--contract", os.path.join(self.root, "contract-2.md"), "--reason", "a late document",
                 *writer)
        self.cli("step", "start", "file-tickets", *writer)
        self.assertEqual(self.cli.status()["steps"]["file-tickets"]["batch"]["items"],
                         ["docs/doc-00000.txt", "docs/doc-00001.txt", "docs/late.txt"])
        self.assertEqual(self.drive().code, 10)
        self.assertEqual(sorted(os.listdir(self.out)), ["doc-00000:ticket.args", "doc-00001:ticket.args", "late:ticket.args"])

    def test_next_names_each_item_and_done_needs_every_item(self) -> None:
        self.cli.init(self._contract(items=["a.md", "b.md", "c.md"], payload={"template": {"name": "{stem}"}}))
        self.cli("lease", "acquire", "--owner", "agent")
        epoch = str(self.cli.status()["lease"]["epoch"])
        writer = ["--owner", "agent", "--epoch", epoch]
        self.cli("step", "start", "file-tickets", *writer)
        action = self.cli("next", "--json", *writer, code=None).json["action"]
        self.assertEqual({k: action[k] for k in ("kind", "step", "item", "key", "index", "remaining")},
                         {"kind": "effect", "step": "file-tickets", "item": "a.md", "key": "a:ticket", "index": 0, "remaining": 3})
        self.cli("effect", "run", "a:ticket", *writer)
        refused = self.cli("step", "done", "file-tickets", *writer, code=2)
        self.assertIn("2 of 3 items", refused.err)
        self.cli("effect", "skip", "b:ticket", "--reason", "withdrawn by its author", *writer)
        action = self.cli("next", "--json", *writer, code=None).json["action"]
        self.assertEqual((action["key"], action["remaining"]), ("c:ticket", 1))
        self.cli("effect", "run", "c:ticket", *writer)
        self.cli("step", "done", "file-tickets", *writer)
        report = self.cli("report", "--json", code=None).json
        self.assertEqual((report["items"], report["items_verified"], report["items_skipped"], report["status"]), (3, 2, 1, "complete"))
        self.assertIn("items 2 verified + 1 skipped of 3", self.cli("brief", "--json", code=None).json["brief"])

    def test_effect_run_with_inline_commands_and_a_payload_file(self) -> None:
        block = self._contract(items=["a.md"], payload={"template": {"name": "{item}"}})
        del block["effects"]["invoke"], block["effects"]["observe"]
        block["steps"].insert(0, {"id": "setup", "next": "file-tickets"})
        self.cli.init(block)
        self.cli("lease", "acquire", "--owner", "agent")
        writer = ["--owner", "agent", "--epoch", str(self.cli.status()["lease"]["epoch"])]
        self.cli("step", "start", "setup", *writer)
        with open(os.path.join(self.root, "p.json"), "w") as handle:
            handle.write('{"title": "release notes"}')
        inline = ["--"] + self.commands["invoke"] + ["--observe", "--"] + self.commands["observe"]
        payload = os.path.join(self.root, "p.json")
        missing = self.cli("effect", "run", "notes:post", "--payload", payload, *writer, code=2)
        self.assertIn("needs an invoke and an observe command", missing.err)
        done = self.cli("effect", "run", "notes:post", "--payload", payload, "--json", *writer, *inline)
        self.assertEqual((json.loads(done.out)["state"], json.loads(done.out)["step"]), ("verified", "setup"))
        self.assertEqual(recorded(self.out, "notes:post")[1], "{item}", "a placeholder with no value is left as written")

    def test_a_key_outside_the_key_pattern_refuses_the_start(self) -> None:
        block = self._contract(items=["a.md", "B.md"], payload={"template": {"name": "{item}"}})
        block["effects"]["key_pattern"] = "[a-z]+:ticket"
        self.cli.init(block)
        before = self.cli.status()["revision"]
        result = self.drive()
        self.assertEqual(result.code, 2, result.err)
        self.assertIn("'B:ticket' of item 1 does not match", json.loads(result.out)["detail"])
        self.assertEqual(self.cli.status()["steps"], {}, "the step did not start")
        self.assertLessEqual(self.cli.status()["revision"], before + 3,
                             "only the lease, taken and given back, and the recovery intent were written")

    def test_a_timeout_is_uncertain_never_failed(self) -> None:
        slow = script(self.root, "slow.py", SLOW)
        self.commands = {"invoke": slow + ["invoke"], "observe": slow + ["observe"]}
        self.cli.init(self._contract(items=["only.md"], payload={"template": {"name": "{item}"}}, timeout=0.5))
        result = self.drive()
        self.assertEqual(result.code, 8, result.err)
        effect = self.cli.status()["effects"]
        self.assertEqual(effect, {"uncertain": 1})
        # Once the target can be seen to hold it, the next drive observes it and is done; it never invokes again.
        open(os.path.join(self.root, "seen"), "w").close()
        again = self.drive()
        self.assertEqual(again.code, 10, again.err)
        self.assertEqual(json.loads(again.out)["drive"]["reconciled"], 1)
        self.assertEqual(self.cli("effect", "show", "only:ticket", "--json", code=None).json["attempts"], 1)


class ObservedEvidenceTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = scratch_dir("runner-evidence-")
        self.addCleanup(self.tmp.cleanup)
        self.root = self.tmp.name
        self.cli = RunnerCli(self, root=self.root)
        check = script(self.root, "check.py", "import os, sys\nsys.exit(0 if os.path.exists('report.txt') else 1)\n")
        block = {"contract": 1, "task_id": "evidence", "goal": "Write a checked report.", "workspace": self.root,
                 "steps": [{"id": "write", "checks": {"report-exists": check}, "artifacts": ["report.txt"], "next": "claim"},
                           {"id": "claim", "evidence": ["file_sha256"], "next": "done"}]}
        self.cli.init(block)
        self.cli("lease", "acquire", "--owner", "agent")
        self.writer = ["--owner", "agent", "--epoch", str(self.cli.status()["lease"]["epoch"])]

    def test_a_failing_check_refuses_done_and_a_claim_is_shown_as_claimed(self) -> None:
        self.cli("step", "start", "write", *self.writer)
        before = self.cli.status()["revision"]
        refused = self.cli("step", "done", "write", *self.writer, "--json", code=2)
        self.assertIn("check 'report-exists' exited 1", json.loads(refused.out)["message"])
        self.assertEqual(self.cli.status()["revision"], before, "a refused done records nothing")
        with open(os.path.join(self.root, "report.txt"), "w") as handle:
            handle.write("all good\n")
        self.cli("step", "done", "write", *self.writer)
        observed = self.cli.status()["evidence"]["write"]["observed"]
        import hashlib

        self.assertEqual(observed["artifacts"]["report.txt"]["sha256"], hashlib.sha256(b"all good\n").hexdigest())
        self.assertEqual(observed["checks"]["report-exists"]["exit_code"], 0)
        self.cli("step", "start", "claim", *self.writer)
        self.cli("step", "done", "claim", *self.writer, "--evidence", '{"file_sha256": "v1"}')
        shown = self.cli.status()["evidence"]["claim"]
        self.assertEqual(shown, {"claimed": {"file_sha256": "v1"}})
        brief = self.cli("brief", "--json", code=None).json["brief"]
        self.assertIn("claimed (not checked)", brief)
        self.assertIn("observed by the runner", brief)
        decision = self.cli("next", "--json", code=None).json
        sources = [o["source"] for o in decision["observations"]]
        self.assertIn("step `claim`: claimed by the agent", sources)
        self.assertIn("step `write`: observed by the runner", sources)
        report = self.cli("report", "--json", code=None).json
        self.assertEqual((report["steps_evidence_observed"], report["steps_evidence_claimed"]), (1, 1))


class PayloadTemplateTest(unittest.TestCase):
    def test_the_template_fills_the_first_line_and_the_digest_of_the_whole_file(self) -> None:
        import hashlib

        from runner.base.canonical import content_digest
        from runner.execution.payloads import item_payload
        from runner.ledger import batch

        with scratch_dir("runner-payload-") as root:
            data = b"Title line\r\n" + b"x" * (3 << 20)
            with open(os.path.join(root, "big.md"), "wb") as handle:
                handle.write(data)
            plan = {"contract": 1, "task_id": "t", "goal": "g",
                    "steps": [{"id": "s", "items": ["big.md"], "key": "{stem}:t",
                               "payload": {"template": {"title": "{first_line}", "sha256": "{sha256}", "n": "{index:03d}", "k": "{key}"}}}], "workspace": root}
            state = {"plan": plan, "plan_digest": content_digest(plan), "steps": {}, "effects": {}, "task_id": "t"}
            frozen = batch.freeze(state, "s")
            state["steps"]["s"] = {"workspace": frozen["workspace"], "batch": frozen["batch"]}
            payload = item_payload(state, "s", 0)
        self.assertEqual(payload, {"title": "Title line", "sha256": hashlib.sha256(data).hexdigest(), "n": "000", "k": "big:t"})


class BatchContractTest(unittest.TestCase):
    def problems(self, step=None, effects=None):
        block = {"contract": 1, "task_id": "t", "goal": "g", "steps": [step or {"id": "s"}]}
        if effects is not None:
            block["effects"] = effects
        return [p.message for p in parse_contract_text(contract_markdown(json.dumps(block, indent=2)))[1]]

    def test_each_problem_is_named(self) -> None:
        cases = [
            ({"id": "s", "items": ["a"], "key": "fixed"}, None, "every item would share one key"),
            ({"id": "s", "items": ["a"], "key": "{item}-{random}"}, None, "unknown placeholder {random}"),
            ({"id": "s", "items": ["a"]}, None, "needs \"key\""),
            ({"id": "s", "items": {"glob": "../*"}, "key": "{stem}"}, None, "without '..'"),
            ({"id": "s", "checks": {"t": "python3 -m unittest"}}, None, "non-empty list of strings"),
            (None, {"invoke": ["curl", "{key}"]}, "invoke and observe come together"),
            (None, {"invoke": ["x", "{secret}"], "observe": ["y"]}, "unknown placeholder {secret}"),
        ]
        for step, effects, expected in cases:
            with self.subTest(expected=expected):
                found = self.problems(step, effects)
                self.assertTrue(any(expected in p for p in found), found)

    def test_the_filled_batch_example_is_valid(self) -> None:
        from runner.contract.text import check_contract

        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        block, problems = check_contract(os.path.join(here, "templates", "run-contract.batch.example.md"))
        self.assertEqual(problems, [])
        self.assertIn("items", block["steps"][0])


if __name__ == "__main__":
    unittest.main()
