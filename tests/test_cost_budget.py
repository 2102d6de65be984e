"""A budget that holds with calls in flight, with real processes: ``drive --parallel`` against a target whose answers
name their usage, SIGKILLed between an answer and its record, resumed by another process; and a cost read from an
HTTP target's JSON answer.

Every claim is checked on the target's own bill (one line per call it was paid for): no item paid twice, the run's
recorded cost equal to the bill but for the calls whose answers a kill lost (recorded at their reservation), and
the bill over the limit by no more than the calls in flight could cost beyond what they were reserved.
"""

import json
import os
import sys
import unittest
from typing import Any, Dict, List

from runner.execution.run import Run
from runner.proof.helpdesk import Helpdesk, HelpdeskServer
from runner.stores.file import RunStore
from tests.support.batch import batch_contract
from tests.support.util import in_process_cli, scratch_dir
from tests.test_executor import TargetCase
from tests.test_http_drive import TOKEN, make_workspace, open_run
from tests.test_parallel import KILLER

#: billed.sh invoke|observe BILL KEY: a call of key cN-xM costs N tokens; it writes "KEY N" to the bill and answers
#: its usage; a lookup finds the key on the bill.
BILLED = r'''
mode=$1 bill=$2 key=$3
if [ "$mode" = invoke ]; then
  tokens=${key#c}
  tokens=${tokens%%-*}
  sleep 0.05
  printf '%s %s\n' "$key" "$tokens" >> "$bill"
  printf '{"id": "%s", "usage": {"total_tokens": %s}}\n' "$key" "$tokens"
  exit 0
fi
[ -e "$bill" ] || exit 1
grep -q "^$key " "$bill" || exit 1
printf '{"found": "%s"}\n' "$key"
'''

PRICE = 0.001
LIMIT = 1.0


class BudgetWithCallsInFlightTest(TargetCase):
    def begin(self, items: List[str], wrapper: List[str], estimate: float = 0.1, **limits: Any) -> None:
        with open(os.path.join(self.root, "billed.sh"), "w", encoding="utf-8") as handle:
            handle.write(BILLED)
        with open(os.path.join(self.root, "killer.sh"), "w", encoding="utf-8") as handle:
            handle.write(KILLER)
        target = ["sh", os.path.join(self.root, "billed.sh")]
        block = batch_contract({"invoke": wrapper + target + ["invoke", self.ledger, "{key}"],
                                "observe": target + ["observe", self.ledger, "{key}"]},
                               items=items, payload={"template": {"item": "{item}"}}, timeout=20)
        block["steps"][0]["key"] = "{item}"
        block["effects"].update(key_pattern="c[0-9]+-x[0-9]+", cost={"money": [["/usage/total_tokens", PRICE]]},
                                cost_estimate={"money": estimate})
        block["limits"].update(limits)
        self.cli.init(block)

    def bill(self) -> Dict[str, List[float]]:
        out: Dict[str, List[float]] = {}
        with open(self.ledger, encoding="utf-8") as handle:
            for line in handle:
                key, tokens = line.split()
                out.setdefault(key, []).append(int(tokens) * PRICE)
        return out

    def record(self) -> Dict[str, Any]:
        run = Run(RunStore.open(os.path.join(self.root, ".run")))
        try:
            return run.state
        finally:
            run.store.close()

    def test_a_kill_between_answers_and_their_records_leaves_the_budget_held(self) -> None:
        # Costs of 0.05 to 0.12 against an estimate of 0.1: later calls are reserved the largest seen, 0.12.
        items = [f"c{50 + (n * 37) % 71}-x{n}" for n in range(30)]
        kill = ["sh", os.path.join(self.root, "killer.sh"), "invoke", os.path.join(self.root, "kill-count"),
                "after-response", "6", "--"]
        self.begin(items, kill, max_cost=LIMIT)
        first = self.finish(self.cli.spawn("drive", "--owner", "w1", "--parallel", "4", "--json"))
        self.assertEqual(first["code"], -9, first["err"])
        after_kill = self.record()
        lost = [k for k, e in after_kill["effects"].items() if e["state"] == "started"]
        self.assertTrue(1 <= len(lost) <= 4, f"the calls in flight at the kill: {lost}")
        self.assertTrue(all(after_kill["effects"][k].get("reserved") for k in lost), "each holds its reservation")
        self.cli("lease", "break", "--by", "supervisor", "--reason", "w1 was killed")
        second = self.finish(self.cli.spawn("drive", "--owner", "w2", "--parallel", "4", "--json"))
        self.assertEqual((second["code"], second["reason"]), (6, "limit-exhausted"), second["err"])
        self.assertIn("would reserve money", second["detail"])
        self.assertIn("spent and", second["detail"])
        state = self.record()
        bill = self.bill()
        self.assertEqual({k: len(v) for k, v in bill.items()}, {k: 1 for k in bill}, "no item was paid twice")
        verified = {k for k, e in state["effects"].items() if e["state"] == "verified"}
        self.assertEqual(set(bill), verified, "every call paid for is recorded, and only those")
        self.assertEqual(state["counters"].get("reserved", {}), {}, "nothing is left reserved")
        estimated = {k for k, e in state["effects"].items() if e.get("cost_estimated")}
        # The commands in flight at the kill printed their answers, which the second drive read from their files:
        # their costs are the bill's, read from those answers, not their reservations.
        self.assertEqual(estimated, set(), "no answer was lost: each call's own answer was read")
        spent = state["counters"]["cost"]["money"]
        paid = sum(sum(v) for v in bill.values())
        recorded_read = sum(state["effects"][k]["cost"]["money"] for k in verified - estimated)
        self.assertAlmostEqual(recorded_read, sum(bill[k][0] for k in verified - estimated), places=9,
                               msg="a cost read from an answer is the bill's")
        self.assertLessEqual(spent, LIMIT + 1e-9, "the recorded spend never passes the limit")
        # What the bill may pass the limit by: the calls in flight, each at most its cost beyond its reservation.
        error = 4 * (0.12 - 0.05)
        self.assertLessEqual(paid, LIMIT + error)
        self.assertLess(len(verified), len(items), "the budget stopped the run before every item")
        print(f"budget under a kill: {len(lost)} answers lost at the kill, {len(verified)} calls paid; "
              f"bill {paid:.3f}, recorded {spent:.3f}, limit {LIMIT:g}", file=sys.stderr)

    def test_without_a_kill_the_recorded_cost_is_the_bill_and_stays_under_the_limit(self) -> None:
        items = [f"c100-x{n}" for n in range(20)]
        self.begin(items, [], max_cost={"money": LIMIT, "tokens": 100000})
        drive = self.cli.spawn("drive", "--owner", "w1", "--parallel", "4")  # in words: with its progress line
        out, err = drive.communicate(timeout=60)
        self.assertEqual(drive.returncode, 6, err)
        state = self.record()
        paid = sum(sum(v) for v in self.bill().values())
        self.assertAlmostEqual(state["counters"]["cost"]["money"], paid, places=9)
        self.assertAlmostEqual(paid, LIMIT, places=9, msg="ten calls of 0.1 fit in 1.0, and no eleventh began")
        self.assertEqual(len(self.bill()), 10)
        self.assert_spend_in_sight(err.decode())

    def assert_spend_in_sight(self, drive_err: str) -> None:
        """status, brief, next, report, drive's last progress line and the OTLP trace each show spent, reserved and
        limit of every named cost."""
        expected = {"money": {"spent": 1.0, "reserved": 0.0, "limit": 1.0},
                    "tokens": {"spent": 0.0, "reserved": 0.0, "limit": 100000.0}}
        self.assertIn("money 1 spent of 1, tokens 0 spent of 100000", drive_err)
        status = self.cli.status()
        self.assertEqual(status["spend"], expected)
        self.assertIn("spend     money 1 spent of 1 (a call is reserved 0.1), tokens 0 spent of 100000",
                      self.cli("status").out)
        self.assertIn("Spend: money 1 spent of 1 (a call is reserved 0.1)", self.cli("brief").out)
        decided = self.cli.json("next", code=None)
        self.assertEqual(decided["spend"], expected)
        self.assertEqual(decided["stop_code"], "limit-exhausted/cost")
        self.assertIn("money 1 spent of 1 (a call is reserved 0.1)", decided["sentence"])
        self.assertEqual(self.cli.json("report")["spend"], expected)
        trace = os.path.join(self.root, "trace.jsonl")
        self.cli("events", "--otlp", trace)
        with open(trace, encoding="utf-8") as handle:
            spans = [span for line in handle for resource in json.loads(line)["resourceSpans"]
                     for scope in resource["scopeSpans"] for span in scope["spans"]]
        root = next(span for span in spans if "parentSpanId" not in span)
        found = {item["key"]: next(iter(item["value"].values())) for item in root["attributes"]}
        shown = [found[f"runner.cost.{name}"] for name in ("money", "money.reserved", "money.limit", "tokens.limit")]
        self.assertEqual(shown, [1.0, 0.0, 1.0, 100000.0])

    def test_a_call_that_does_not_fit_waits_for_the_calls_in_flight_and_goes_once_they_free_the_budget(self) -> None:
        # Three calls reserved 0.3 each fill 0.9 of 1.0; the fourth waits. Their answers cost 0.1: the calls after
        # them are reserved 0.1, and ten fit in all.
        items = [f"c100-x{n}" for n in range(20)]
        self.begin(items, [], estimate=0.3, max_cost=LIMIT)
        done = self.finish(self.cli.spawn("drive", "--owner", "w1", "--parallel", "4", "--json"))
        self.assertEqual((done["code"], done["reason"]), (6, "limit-exhausted"), done["err"])
        self.assertEqual(len(self.bill()), 10, "no call stopped the run while others in flight could free the budget")
        self.assertAlmostEqual(self.record()["counters"]["cost"]["money"], LIMIT, places=9)


class HttpAnswerCostTest(unittest.TestCase):
    def test_the_cost_of_an_http_call_is_read_from_its_json_answer(self) -> None:
        # The helpdesk answers each POST with the issue it made, {"id": N, ...}: a cost of N units per issue.
        desk = Helpdesk(TOKEN)
        with scratch_dir("runner-http-cost-") as root, HelpdeskServer(desk) as served:
            make_workspace(root, served.url, 3, settle=0, cost={"units": [["/id", 1]]})
            result = in_process_cli(["--dir", os.path.join(root, ".run"), "drive", "--owner", "w", "--json"])
            self.assertEqual(result.code, 10, result.err)
            state = open_run(root).state
        self.assertEqual(state["counters"]["cost"], {"units": 6})
        self.assertEqual(sorted(e["cost"]["units"] for e in state["effects"].values()), [1, 2, 3])
        self.assertEqual(state["counters"]["cost_largest"], {"units": 3})


if __name__ == "__main__":
    unittest.main()
