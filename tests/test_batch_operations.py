"""The batch operations: a step's items listed, a failed effect reopened by a person, many items skipped at once,
and attempts counted apart from deferrals.

* ``items STEP`` lists every item with its key, state (pending, an effect's state, or skipped), attempts,
  deferrals and cost; ``--state`` keeps one state; an unknown step or state is one line and exit 2.
* ``effect reopen KEY --by NAME --reason TEXT`` gives a failed effect a new budget of attempts, recorded with who
  and why; the next drive calls it again, and the journal, the report and the timeline say so. It is refused for an
  effect that is not failed and to the lease's live holder, with nothing changed.
* ``skip STEP --state S`` and ``--all-remaining`` skip many items in one transition, or none: an item that may have
  happened (a call in flight, an unknown outcome) refuses the lot and is named.
* A "not now" (exit 75) is a deferral: ``effect show``, ``items`` and ``report`` count it apart from attempts, an
  attempt count never exceeds its limit, and a run journaled before deferrals were counted apart reads as it did.
"""

import copy
import os
import unittest
from typing import Any, Dict, List, Sequence

from runner.base.errors import InvalidInput
from runner.execution.run import Run
from runner.surfaces.mcp import jsonrpc
from runner.surfaces.mcp.server import Session
from runner.ledger.effects import attempt_counts
from runner.surfaces import views
from tests.support.batch import script
from tests.support.cli import RunnerCli

#: invoke KEY OUT | observe KEY OUT. An item whose key is listed in OUT/refuse is refused for good (exit 2) until
#: OUT/fixed exists; one listed in OUT/later is answered "not now" (exit 75) as many times as it is listed.
TARGET = r'''#!/bin/sh
out="$3"
if [ "$1" = invoke ]; then
    if grep -qx "$2" "$out/refuse" 2>/dev/null && [ ! -e "$out/fixed" ]; then exit 2; fi
    if [ -e "$out/later" ] && grep -qx "$2" "$out/later"; then
        awk -v k="$2" '$0 == k && !gone { gone = 1; next } { print }' "$out/later" > "$out/later.new"
        mv "$out/later.new" "$out/later"
        exit 75
    fi
    echo "$2" >> "$out/calls"
    touch "$out/$2.made"
    printf '{"made": "%s"}\n' "$2"
    exit 0
fi
[ -e "$out/$2.made" ] && { printf '{"made": "%s"}\n' "$2"; exit 0; }
exit 1
'''


def contract(root: str, **limits: Any) -> Dict[str, Any]:
    target = script(root, "target.sh", TARGET)
    out = os.path.join(root, "out")
    return {
        "contract": 1, "task_id": "batch-operations", "goal": "Make one thing per document.", "workspace": ".",
        "steps": [{"id": "make", "items": {"glob": "docs/*.txt"}, "key": "{stem}",
                   "payload": {"template": {"doc": "{stem}"}}, "next": "done"}],
        "effects": {"invoke": target + ["invoke", "{key}", out], "observe": target + ["observe", "{key}", out],
                    "timeout_seconds": 20},
        "retry": {"base_seconds": 0.01, "cap_seconds": 0.02},
        "limits": dict(limits),
        "lease": {"ttl_seconds": 60},
    }


class BatchOperationsTest(unittest.TestCase):

    def make(self, count: int = 4, refuse: Sequence[str] = (), later: Sequence[str] = (), **limits: Any) -> RunnerCli:
        cli = RunnerCli(self)
        os.makedirs(os.path.join(cli.root, "docs"))
        os.makedirs(os.path.join(cli.root, "out"))
        for n in range(count):
            with open(os.path.join(cli.root, "docs", f"d{n}.txt"), "w", encoding="utf-8") as handle:
                handle.write(f"document {n}\n")
        for name, keys in (("refuse", refuse), ("later", later)):
            with open(os.path.join(cli.root, "out", name), "w", encoding="utf-8") as handle:
                handle.write("".join(k + "\n" for k in keys))
        cli.init(contract(cli.root, **limits))
        return cli

    def calls(self, cli: RunnerCli) -> List[str]:
        path = os.path.join(cli.root, "out", "calls")
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as handle:
            return handle.read().split()

    def revision(self, cli: RunnerCli) -> int:
        return int(cli.status()["revision"])

    # -- items ----------------------------------------------------------------------------------

    def test_items_lists_every_item_with_its_key_state_attempts_and_deferrals(self) -> None:
        cli = self.make(refuse=["d1"])
        cli("drive", "--owner", "w1", code=12)  # d0 made, d1 refused for good: the drive stops there
        found = cli.json("items", "make")
        self.assertEqual(found["total"], 4)
        self.assertEqual([(i["key"], i["state"], i["attempts"], i["deferrals"]) for i in found["items"]],
                         [("d0", "verified", 1, 0), ("d1", "failed", 1, 0), ("d2", "pending", 0, 0),
                          ("d3", "pending", 0, 0)])
        self.assertEqual(found["items"][1]["item"], "docs/d1.txt")
        self.assertIn("refused it for good", found["items"][1]["reason"])
        self.assertEqual(found["states"], {"pending": 2, "verified": 1, "failed": 1})
        pending = cli.json("items", "make", "--state", "pending")
        self.assertEqual([i["key"] for i in pending["items"]], ["d2", "d3"])
        self.assertEqual(pending["count"], 2)
        text = cli("items", "make").out
        self.assertIn("d1  failed  attempts 1  deferrals 0", text)
        self.assertIn("4 of 4 items of step make", text)
        cli("items", "nope", code=2, reason="invalid-input")
        cli("items", "make", "--state", "done", code=2, reason="invalid-input")

    def test_items_of_a_step_not_started_is_one_line(self) -> None:
        cli = self.make()
        err = cli("items", "make", code=2, reason="invalid-input").err
        self.assertIn("start it first", err)

    def test_items_show_the_cost_an_effect_records(self) -> None:
        cli = self.make()
        cli("drive", "--owner", "w1", code=10)
        state = copy.deepcopy(Run.open(cli.run_dir).state)
        state["effects"]["d2"]["cost"] = {"money": 0.002, "tokens": 310}
        rows = {row["key"]: row for row in views.items(state, "make")["items"]}
        self.assertEqual(rows["d2"]["cost"], {"money": 0.002, "tokens": 310})
        self.assertEqual(rows["d1"]["cost"], {})
        with self.assertRaises(InvalidInput):
            views.items(state, "make", "waiting")

    # -- attempts and deferrals -------------------------------------------------------------------

    def test_a_not_now_is_a_deferral_counted_apart_and_attempts_stay_within_their_limit(self) -> None:
        cli = self.make(count=2, later=["d0", "d0", "d0"], max_effect_attempts=1)
        cli("drive", "--owner", "w1", "--until-stop", code=10)
        self.assertEqual(self.calls(cli), ["d0", "d1"])
        shown = cli.json("effect", "show", "d0")
        self.assertEqual(shown["counts"]["attempts"], 1)
        self.assertEqual(shown["counts"]["deferrals"], 3)
        self.assertLessEqual(shown["counts"]["attempts"], shown["counts"]["max_attempts"])
        self.assertIn("d0: verified (attempts 1 of 1, deferrals 3 of 10)", cli("effect", "show", "d0").out)
        rows = cli.json("items", "make")["items"]
        self.assertEqual([(r["attempts"], r["deferrals"]) for r in rows], [(1, 3), (1, 0)])
        report = cli.json("report")
        self.assertEqual((report["effect_attempts"], report["effect_deferrals"], report["retries"]), (2, 3, 0))
        page = os.path.join(cli.root, "page.html")
        cli("report", "--html", page)
        with open(page, encoding="utf-8") as handle:
            html = handle.read()
        self.assertEqual(html.count("d0 answered &#x27;not now&#x27;"), 3)
        self.assertNotIn("Effects that were uncertain, absent, failed", html)  # a deferral is no absence

    def test_a_record_journaled_before_deferrals_were_counted_apart_counts_every_call(self) -> None:
        older = {"state": "verified", "attempts": 2}
        self.assertEqual(attempt_counts(older)["attempts"], 2)
        self.assertEqual(attempt_counts(older)["deferrals"], 0)
        self.assertEqual(attempt_counts(None)["attempts"], 0)
        now = {"state": "absent", "attempts": 3, "deferred": 2,
               "reopened": [{"by": "ana", "reason": "r", "at": "x", "attempts": 3, "deferrals": 1}]}
        self.assertEqual(attempt_counts(now), {"attempts": 1, "deferrals": 2, "attempts_total": 4,
                                               "deferrals_total": 3, "reopened": 1})

    # -- reopen -----------------------------------------------------------------------------------

    def test_a_person_reopens_a_failed_effect_and_the_next_drive_calls_it_again(self) -> None:
        cli = self.make(count=3, refuse=["d1"])
        cli("drive", "--owner", "w1", code=12)
        self.assertIn("effect reopen d1 --by NAME --reason TEXT", cli.json("next", code=None)["action"]["why"])
        cli("effect", "reopen", "d0", "--by", "ana", "--reason", "again", code=2, reason="invalid-input")
        open(os.path.join(cli.root, "out", "fixed"), "w").close()
        reopened = cli.json("effect", "reopen", "d1", "--by", "ana", "--reason", "the API key is fixed")
        self.assertEqual(reopened["state"], "absent")
        self.assertEqual(reopened["attempts"], 0)
        entry = reopened["reopened"][0]
        self.assertEqual((entry["by"], entry["reason"], entry["attempts"]), ("ana", "the API key is fixed", 1))
        self.assertIn("refused it for good", entry["failure"])
        cli("drive", "--owner", "w1", code=10)
        self.assertEqual(self.calls(cli), ["d0", "d1", "d2"])
        shown = cli.json("effect", "show", "d1")
        self.assertEqual((shown["state"], shown["counts"]["attempts"], shown["counts"]["attempts_total"]),
                         ("verified", 1, 2))
        self.assertIn("reopened at", cli("effect", "show", "d1").out)
        report = cli.json("report")
        self.assertEqual((report["effects_reopened"], report["retries"]), (1, 1))
        journal = cli.json("events")["events"]
        self.assertTrue(any("reopened" in str(e) and "ana" in str(e) for e in journal))
        page = os.path.join(cli.root, "page.html")
        cli("report", "--html", page)
        with open(page, encoding="utf-8") as handle:
            html = handle.read()
        self.assertIn("Failed effects reopened by a person (1)", html)
        self.assertIn("reopened by a person at", html)

    def test_the_lease_holder_does_not_reopen_what_failed_under_its_lease(self) -> None:
        cli = self.make(count=2, refuse=["d1"])
        cli("drive", "--owner", "w1", code=12)
        epoch = cli.json("lease", "acquire", "--owner", "agent-1")["epoch"]
        before = self.revision(cli)
        cli("effect", "reopen", "d1", "--by", "agent-1", "--reason", "r", code=2, reason="invalid-input")
        cli.writer("agent-1", epoch)("effect", "reopen", "d1", "--by", "ana", "--reason", "r", code=2,
                                     reason="invalid-input")
        self.assertEqual(self.revision(cli), before)
        self.assertEqual(cli.json("effect", "show", "d1")["state"], "failed")
        # a person, while the agent holds the lease
        cli("effect", "reopen", "d1", "--by", "ana", "--reason", "the key is fixed")
        self.assertEqual(cli.json("effect", "show", "d1")["state"], "absent")

    # -- bulk skip ----------------------------------------------------------------------------------

    def test_skip_state_pending_skips_those_items_in_one_transition(self) -> None:
        cli = self.make(count=5, refuse=["d1"])
        cli("drive", "--owner", "w1", code=12)
        epoch = cli.json("lease", "acquire", "--owner", "w2")["epoch"]
        writer = cli.writer("w2", epoch)
        before = self.revision(cli)
        done = writer.json("skip", "make", "--state", "pending", "--reason", "the budget is spent")
        self.assertEqual((done["skipped"], done["keys"]), (3, ["d2", "d3", "d4"]))
        self.assertEqual(self.revision(cli), before + 1)
        states = {r["key"]: r["state"] for r in cli.json("items", "make")["items"]}
        self.assertEqual(states, {"d0": "verified", "d1": "failed", "d2": "skipped", "d3": "skipped", "d4": "skipped"})
        writer("skip", "make", "--state", "pending", "--reason", "again", code=2, reason="invalid-input")
        writer("skip", "make", "--all-remaining", "--reason", "the rest")
        self.assertEqual(cli.json("items", "make", "--state", "skipped")["count"], 4)
        err = cli("effect", "reopen", "d1", "--by", "ana", "--reason", "fixed", code=2, reason="invalid-input").err
        self.assertIn("skipped item is not called again", err)
        self.assertEqual(cli.json("report")["items_skipped"], 4)

    def test_skip_is_refused_whole_when_a_chosen_item_may_have_happened(self) -> None:
        cli = self.make(count=4, refuse=["d1"])
        cli("drive", "--owner", "w1", code=12)
        epoch = cli.json("lease", "acquire", "--owner", "w2")["epoch"]
        writer = cli.writer("w2", epoch)
        writer("effect", "begin", "d3")  # the call is about to be made: its outcome is not known
        before = self.revision(cli)
        err = writer("skip", "make", "--all-remaining", "--reason", "stop here", code=8,
                     reason="needs-reconciliation").err
        self.assertIn("d3", err)
        self.assertIn("nothing skipped", err)
        self.assertEqual(self.revision(cli), before)
        self.assertEqual(cli.json("items", "make", "--state", "skipped")["count"], 0)
        writer("skip", "make", "--reason", "r", code=2, reason="invalid-input")
        writer("skip", "make", "--state", "pending", "--all-remaining", "--reason", "r", code=2, reason="invalid-input")
        writer("skip", "make", "--state", "waiting", "--reason", "r", code=2, reason="invalid-input")
        writer("skip", "make", "--state", "pending", code=2, reason="invalid-input")
        self.assertEqual(self.revision(cli), before)
        writer("skip", "make", "--state", "pending", "--reason", "leave d2")
        self.assertEqual([r["key"] for r in cli.json("items", "make", "--state", "skipped")["items"]], ["d2"])


    # -- the MCP tools ----------------------------------------------------------------------------------

    def test_the_mcp_server_lists_items_skips_many_and_reopens_only_with_control(self) -> None:
        cli = self.make(count=4, refuse=["d1"])
        cli("drive", "--owner", "w1", code=12)

        def tool(session: Session, name: str, arguments: Dict[str, Any]) -> Dict[str, Any]:
            message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": name, "arguments": arguments}}
            return session.handle(jsonrpc.classify(message))["result"]["structuredContent"]  # type: ignore[index]

        def opened(**options: Any) -> Session:
            session = Session("file:" + cli.run_dir, owner="agent-1", log=lambda line: None, **options)
            hello = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                     "params": {"protocolVersion": jsonrpc.PROTOCOL_VERSION, "capabilities": {},
                                "clientInfo": {"name": "test", "version": "1"}}}
            self.assertIn("result", session.handle(jsonrpc.classify(hello)))
            return session

        agent = opened()
        found = tool(agent, "items", {"step": "make", "state": "pending"})
        self.assertEqual([i["key"] for i in found["items"]], ["d2", "d3"])
        self.assertNotIn("effect_reopen", agent.tools)  # a person's act: listed only with --allow-control
        tool(agent, "recover", {})  # the lease, for the skip
        self.assertEqual(cli.json("lease", "show")["owner"], "agent-1")
        skipped = tool(agent, "skip", {"step": "make", "state": "pending", "reason": "budget spent"})
        self.assertEqual(skipped["keys"], ["d2", "d3"])
        # The server's owner holds the lease live: even with control, it does not reopen, whoever it names.
        for by in ("agent-1", "ana"):
            refused = tool(opened(allow_control=True), "effect_reopen", {"key": "d1", "by": by, "reason": "r"})
            self.assertEqual((refused["ok"], refused["reason"]), (False, "invalid-input"))
        self.assertEqual(cli.json("effect", "show", "d1")["state"], "failed")
        tool(agent, "lease_release", {})
        reopened = tool(opened(allow_control=True), "effect_reopen", {"key": "d1", "by": "ana", "reason": "fixed"})
        self.assertTrue(reopened["ok"], reopened)
        self.assertEqual(reopened["effect"]["reopened"][0]["by"], "ana")


if __name__ == "__main__":
    unittest.main()
