"""An HTTP endpoint that cannot be read back (``effects.http.observe`` is ``"none"``), driven against the chat
webhook stand-in (``tests/support/standins/webhook.py``): a receipt verifies its effect with evidence that says the
target cannot be read; an unknown outcome (a 500 after the message was delivered) stops the run with exit 8 and is
never sent again, by that drive or the next; a person records what the channel showed and the run completes.
``contract check`` accepts the declaration and refuses a lookup of many keys beside it."""

import json
import os
import unittest
from typing import Any, Dict

from runner.adapters.http import HttpAdapter
from runner.contract.spec import read_contract
from runner.execution.lifecycle import UNREADABLE_REASON
from tests.support.cli import RunnerCli
from tests.support.standins.harness import StandIn
from tests.support.util import write_contract

MESSAGES = ["deploy-1", "deploy-2", "deploy-3", "deploy-4"]


def contract(**http: Any) -> Dict[str, Any]:
    section = {"invoke": {"method": "POST", "url": "{file:.webhook-url}"}, "observe": "none"}
    section.update(http)
    return {
        "contract": 1, "task_id": "chat-notes", "goal": "Post one chat message per item, each exactly once.",
        "workspace": ".",
        "steps": [{"id": "post", "items": MESSAGES, "key": "note-{item}",
                   "payload": {"template": {"text": "{item} is live"}}, "next": "done"}],
        "effects": {"http": section, "timeout_seconds": 4, "max_attempts": 3},
        "retry": {"base_seconds": 0.1, "cap_seconds": 0.3},
    }


class HttpObserveNoneContractTest(unittest.TestCase):
    def test_contract_check_accepts_it_and_the_spec_has_no_lookup(self) -> None:
        cli = RunnerCli(self)
        path = write_contract(os.path.join(cli.root, "c.md"), contract())
        self.assertTrue(cli.json("contract", "check", path)["ok"])
        effects = read_contract(contract()).effects
        self.assertFalse(effects.readable)
        assert effects.http is not None
        self.assertIsNone(effects.http.observe)
        lookup = {"command": ["x", "{each}"], "match": "/k", "value": "{slug}"}
        many = dict(contract(), effects=dict(contract()["effects"], observe_many=lookup))
        write_contract(path, many)
        out = cli("contract", "check", path, code=2)
        self.assertIn('effects: observe_many looks keys up: a target with "observe": "none" cannot be read back',
                      out.err)
        first = dict(contract(), effects=dict(contract()["effects"], observe_first=True))
        write_contract(path, first)
        self.assertIn('effects: observe_first looks each item up before its first call: a target with "observe": '
                      '"none" cannot be read back', cli("contract", "check", path, code=2).err)
        write_contract(path, contract(observe="nothing"))
        self.assertIn("effects.http.observe must be an object", cli("contract", "check", path, code=2).err)


class HttpObserveNoneDriveTest(unittest.TestCase):
    def test_receipts_verify_and_an_unknown_stops_for_a_person_and_is_never_sent_again(self) -> None:
        with StandIn("webhook") as hook:
            cli = RunnerCli(self)
            with open(os.path.join(cli.root, ".webhook-url"), "w") as handle:
                handle.write(hook.url + "\n")
            cli.init(contract())
            adapter = HttpAdapter(read_contract(contract()).effects.http,  # type: ignore[arg-type]
                                  values={"item": "deploy-1"}, workspace=cli.root)
            self.assertFalse(adapter.readable)
            self.assertEqual(adapter.observe("note-deploy-1", {}).status, "unknown")
            self.assertEqual(hook.count()["total"], 0, "a lookup of an endpoint that cannot be read back sends nothing")

            hook.faults([{"fault": "500-after", "on": "post"}])
            stop = json.loads(cli.child("drive", "--owner", "agent", "--json", code=8).out)
            self.assertEqual(stop["reason"], "needs-reconciliation", stop)
            effects = cli.json("effect", "list")["effects"]
            stuck = [k for k, e in effects.items() if e["state"] == "uncertain"]
            self.assertEqual(stuck, ["note-deploy-1"])
            for verb in ("next", "brief", "status"):
                self.assertIn("effect verify note-deploy-1 --by NAME --evidence JSON", cli(verb, code=None).out, verb)
            self.assertEqual(cli.json("drive", "--owner", "agent", code=8)["error"], "needs-reconciliation")
            self.assertEqual(hook.count()["by_text"], {"deploy-1 is live": 1}, "never sent again on its own")

            cli("effect", "verify", "note-deploy-1", "--by", "ops-ada", "--evidence", '{"seen": "in #deploys"}')
            self.assertEqual(json.loads(cli.child("drive", "--owner", "agent", "--json", code=10).out)["reason"],
                             "complete")
            self.assertEqual(hook.count()["by_text"], {f"{m} is live": 1 for m in MESSAGES})
            shown = cli.json("effect", "show", "note-deploy-2")
            self.assertEqual(shown["state"], "verified")
            self.assertEqual((shown["evidence"]["observe"], shown["evidence"]["reason"]), ("none", UNREADABLE_REASON))
            self.assertEqual(shown["evidence"]["receipt"]["status"], 200)
            person = cli.json("effect", "show", "note-deploy-1")["evidence"]
            self.assertEqual(person["observed_by"], {"source": "person", "by": "ops-ada"})


if __name__ == "__main__":
    unittest.main()
