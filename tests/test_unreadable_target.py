"""A target that cannot be read back (``"observe": "none"``): its answer is the only evidence, an unknown outcome
is never sent again, and the run stops for a person, who records what they saw with who they are."""

import json
import os
import unittest

from runner.contract.spec import read_contract
from tests.support.batch import batch_contract, script
from tests.support.cli import RunnerCli
from tests.support.util import scratch_dir, write_contract

#: send.py ITEM KEY LOG: appends the key to LOG (the message is sent), then answers; the first call of a key named
#: in LOSE_ANSWER exits 1 after sending (the answer is lost: the outcome is unknown to the runner).
SEND = r'''
import json, os, sys
item, key, log = sys.argv[1:4]
with open(log, "a") as handle:
    handle.write(key + "\n")
lose = os.path.join(os.path.dirname(log), "lose-" + key)
if os.path.exists(lose):
    os.unlink(lose)
    sys.exit(1)
print(json.dumps({"sent": key}))
'''


class UnreadableTargetTest(unittest.TestCase):
    def setUp(self) -> None:
        tmp = scratch_dir("runner-unreadable-")
        self.addCleanup(tmp.cleanup)
        self.root = tmp.name
        os.mkdir(os.path.join(self.root, "docs"))
        for name in ("a", "b", "c"):
            with open(os.path.join(self.root, "docs", f"{name}.txt"), "w") as handle:
                handle.write(f"{name}\n")
        self.log = os.path.join(self.root, "sent.log")
        send = script(self.root, "send.py", SEND)
        self.block = batch_contract({"invoke": send + ["{item}", "{key}", self.log], "observe": []})
        self.block["effects"]["observe"] = "none"
        self.cli = RunnerCli(self, root=self.root)

    def sent(self) -> list:
        with open(self.log) as handle:
            return handle.read().split()

    def lose_answer_of(self, key: str) -> None:
        open(os.path.join(self.root, "lose-" + key), "w").close()

    def test_the_contract_declares_it_and_a_lookup_of_many_keys_is_refused_with_it(self) -> None:
        path = write_contract(os.path.join(self.root, "c.md"), self.block)
        self.assertTrue(self.cli.json("contract", "check", path)["ok"])
        effects = read_contract(self.block).effects
        self.assertFalse(effects.readable)
        self.assertIsNone(effects.observe)
        lookup = {"command": ["x", "{each}"], "match": "/k", "value": "{slug}"}
        many = dict(self.block, effects=dict(self.block["effects"], observe_many=lookup))
        write_contract(path, many)
        out = self.cli("contract", "check", path, code=2)
        refusal = 'effects: observe_many looks keys up: a target with "observe": "none" cannot be read back'
        self.assertIn(refusal, out.err)

    def test_receipts_verify_and_an_unknown_stops_for_a_person_who_records_what_they_saw(self) -> None:
        self.lose_answer_of("b:ticket")
        self.cli.init(self.block)
        stopped = self.cli.json("drive", "--owner", "agent", code=8)
        self.assertEqual(stopped["error"], "needs-reconciliation")
        self.assertEqual(self.sent(), ["a:ticket", "b:ticket"], "b is never sent again on its own")
        effects = self.cli.json("effect", "list")["effects"]
        self.assertEqual({k: e["state"] for k, e in effects.items()}, {"a:ticket": "verified", "b:ticket": "uncertain"})
        shown = self.cli.json("effect", "show", "a:ticket")
        self.assertEqual(shown["evidence"]["observe"], "none")
        self.assertEqual(shown["evidence"]["receipt"], {"sent": "a:ticket"})
        for verb in ("next", "status", "brief"):
            text = self.cli(verb, code=None).out
            self.assertIn("effect verify b:ticket --by NAME --evidence JSON", text, verb)
            self.assertIn("effect absent b:ticket --by NAME --evidence JSON", text, verb)
        self.assertEqual(self.cli.json("drive", "--owner", "agent", code=8)["error"], "needs-reconciliation")
        self.assertEqual(self.sent(), ["a:ticket", "b:ticket"], "a second drive sends nothing either")
        self.cli("effect", "verify", "b:ticket", "--by", "a-person", "--evidence", '{"seen": "in the channel"}')
        shown = self.cli.json("effect", "show", "b:ticket")
        person = {"source": "person", "by": "a-person"}
        self.assertEqual(shown["evidence"], {"seen": "in the channel", "observed_by": person})
        self.cli.json("drive", "--owner", "agent", code=10)
        self.assertEqual(self.sent(), ["a:ticket", "b:ticket", "c:ticket"])

    def test_a_persons_absence_sends_the_item_again(self) -> None:
        self.lose_answer_of("b:ticket")
        self.cli.init(self.block)
        self.cli.json("drive", "--owner", "agent", code=8)
        self.cli("effect", "absent", "b:ticket", "--by", "a-person", "--evidence", '{"seen": "nothing in the channel"}')
        self.cli.json("drive", "--owner", "agent", code=10)
        self.assertEqual(self.sent(), ["a:ticket", "b:ticket", "b:ticket", "c:ticket"])

    def test_a_persons_record_needs_the_lease_while_someone_holds_it_and_one_without_by_always(self) -> None:
        self.lose_answer_of("b:ticket")
        self.cli.init(self.block)
        self.cli.json("drive", "--owner", "agent", code=8)
        evidence = '{"seen": "in the channel"}'
        self.cli("effect", "verify", "b:ticket", "--evidence", evidence, code=9, reason="fenced")
        self.cli("lease", "acquire", "--owner", "other-agent")
        self.cli("effect", "verify", "b:ticket", "--by", "a-person", "--evidence", evidence, code=9, reason="fenced")
        self.assertEqual(self.cli.json("effect", "show", "b:ticket")["state"], "uncertain")


if __name__ == "__main__":
    unittest.main()
