"""``effects.observe_first``: every item is looked up before its first call, and one the target holds already (work
done before the run, by a script or by hand) is verified with no call, never made a second time.

The target is a shell program that never deduplicates: each call appends its key to a ledger, and may SIGKILL the
``drive`` that started it right after it did (the target holds the effect, the runner has not recorded the answer).
Killed ``drive`` processes are resumed by others; the audit counts the ledger's lines per key. The GitHub recipe
(``templates/recipes/github-issues.md``) runs the same against the tracker stand-in, whose listing is the lookup.
"""

import json
import os
import signal
import unittest
from typing import Any, Dict, List

from tests.support.batch import batch_contract
from tests.support.cli import RunnerCli
from tests.support.standins.harness import StandIn
from tests.test_recipes_http import CRASHES, GITHUB, TOKEN, _Drive, wait_for
from tests.support.util import write_contract

#: target.sh invoke LEDGER KEY | observe LEDGER KEY | many LEDGER KEY...: a target that never deduplicates. An
#: invoke appends the key, then, at the call number LEDGER.kill holds, SIGKILLs the runner that started it. Every
#: lookup appends how many keys it asked for to LEDGER.looks; a lookup of many keys answers a complete list.
TARGET = r'''
mode=$1 ledger=$2
shift 2
if [ "$mode" = invoke ]; then
    printf '%s\n' "$1" >> "$ledger"
    if [ -f "$ledger.kill" ]; then
        calls=$(wc -l < "$ledger.calls" 2>/dev/null || echo 0)
        printf '1\n' >> "$ledger.calls"
        # The runner: the parent of the shell that keeps the call's answer.
        [ "$((calls + 1))" -eq "$(cat "$ledger.kill")" ] && kill -KILL "$(ps -o ppid= -p "$PPID" | awk '{print $1}')"
    fi
    printf '{"ticket": "%s"}\n' "$1"
    exit 0
fi
nl='
'
rows=
[ -f "$ledger" ] && rows=$(cat "$ledger")
if [ "$mode" = observe ]; then
    printf '1\n' >> "$ledger.looks"
    case "$nl$rows$nl" in *"$nl$1$nl"*) printf '{"found": "%s"}\n' "$1"; exit 0 ;; esac
    exit 1
fi
printf '%d\n' $# >> "$ledger.looks"
found=
for key in "$@"; do
    case "$nl$rows$nl" in *"$nl$key$nl"*) found="$found${found:+, }{\"ref\": \"$key\"}" ;; esac
done
printf '{"tickets": [%s], "complete": true}\n' "$found"
'''

#: What the evidence of an item found before any call says.
FOUND_FIRST = "found at the target before any call of this run"


class ObserveFirstTest(unittest.TestCase):
    def setUp(self) -> None:
        self.cli = RunnerCli(self)
        self.root = self.cli.root
        path = os.path.join(self.root, "target.sh")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(TARGET)
        self.ledger = os.path.join(self.root, "ledger")
        self.items = [f"i{n:02d}" for n in range(12)]
        self.before = [f"{item}:ticket" for item in self.items[1::3]]  # made before the run, by a script
        with open(self.ledger, "w", encoding="utf-8") as handle:
            handle.write("".join(key + "\n" for key in self.before))

    def contract(self, observe_first: bool = True, many: bool = False, **effects: Any) -> Dict[str, Any]:
        target = ["sh", os.path.join(self.root, "target.sh")]
        block = batch_contract({"invoke": target + ["invoke", self.ledger, "{key}"],
                                "observe": target + ["observe", self.ledger, "{key}"]},
                               items=self.items, payload={"template": {"item": "{item}"}})
        block["steps"][0]["key"] = "{item}:ticket"
        if observe_first:
            block["effects"]["observe_first"] = True
        if many:
            block["effects"]["observe_many"] = {"command": target + ["many", self.ledger, "{each}"], "list": "/tickets",
                                                "match": "/ref", "value": "{key}", "max": 6}
        block["effects"].update(effects)
        return block

    def calls_per_key(self) -> Dict[str, int]:
        with open(self.ledger, encoding="utf-8") as handle:
            keys = handle.read().split()
        return {key: keys.count(key) for key in keys}

    def lookups(self) -> List[int]:
        with open(self.ledger + ".looks", encoding="utf-8") as handle:
            return [int(n) for n in handle.read().split()]

    def effects(self) -> Dict[str, Dict[str, Any]]:
        listed: Dict[str, Dict[str, Any]] = self.cli.json("effect", "list", "--limit", "100")["effects"]
        return listed

    def assert_each_made_once_and_the_earlier_ones_found(self) -> None:
        self.assertEqual(self.calls_per_key(), {f"{item}:ticket": 1 for item in self.items}, "no duplicate")
        effects = self.effects()
        self.assertEqual({e["state"] for e in effects.values()}, {"verified"})
        for key in self.before:
            shown = self.cli.json("effect", "show", key)
            self.assertEqual((shown["attempts"], shown["evidence"]["observe_first"]), (0, FOUND_FIRST), key)
        self.assertTrue(all(effects[key]["attempts"] >= 1 for key in effects if key not in self.before))

    def test_the_contract_refuses_it_where_there_is_nothing_to_look_in(self) -> None:
        path = os.path.join(self.root, "c.md")
        write_contract(path, self.contract())
        self.assertTrue(self.cli.json("contract", "check", path)["ok"])
        unreadable = self.contract()
        unreadable["effects"]["observe"] = "none"
        write_contract(path, unreadable)
        out = self.cli("contract", "check", path, code=2)
        refusal = ('effects: observe_first looks each item up before its first call: a target with "observe": "none" '
                   "cannot be read back")
        self.assertIn(refusal, out.err)
        self.assertEqual(out.err.count("observe_first"), 1, out.err)
        wrong = self.contract()
        wrong["effects"]["observe_first"] = "yes"
        write_contract(path, wrong)
        self.assertIn("'observe_first' must be", self.cli("contract", "check", path, code=2).err)

    def test_work_done_before_the_run_is_verified_with_no_call_and_the_rest_made_once(self) -> None:
        self.cli.init(self.contract())
        out = self.cli.child("drive", "--owner", "w1", "--json", code=10).json
        self.assert_each_made_once_and_the_earlier_ones_found()
        self.assertEqual((out["drive"]["found_first"], out["drive"]["effects"]), (len(self.before), len(self.items)))
        report = self.cli.json("report")
        self.assertEqual((report["effect_attempts"], report["items_verified"], report["possible_duplicates"]),
                         (len(self.items) - len(self.before), len(self.items), 0))

    def test_without_it_the_work_done_before_the_run_is_made_again(self) -> None:
        self.cli.init(self.contract(observe_first=False))
        self.cli.child("drive", "--owner", "w1", "--json", code=10)
        self.assertEqual({k for k, n in self.calls_per_key().items() if n == 2}, set(self.before))

    def test_drive_killed_after_the_target_made_an_item_is_resumed_by_another_with_no_duplicate(self) -> None:
        self.cli.init(self.contract())
        for turn, call in enumerate((3, 6)):  # the third call of the first drive, the third of the second
            with open(self.ledger + ".kill", "w", encoding="utf-8") as handle:
                handle.write(str(call))
            killed = self.cli.child("drive", "--owner", f"w{turn}", "--json", code=None)
            self.assertEqual(killed.code, -signal.SIGKILL, killed.err[-500:])
            self.cli("lease", "break", "--by", "supervisor", "--reason", f"w{turn} was killed")
        os.unlink(self.ledger + ".kill")
        out = self.cli.child("drive", "--owner", "w-last", "--json", code=10).json
        self.assertGreaterEqual(out["drive"]["reconciled"], 1, "the item made when its drive died was found, not made")
        self.assert_each_made_once_and_the_earlier_ones_found()
        report = self.cli.json("report")
        self.assertEqual((report["recoveries"], report["possible_duplicates"]), (2, 0))

    def test_lookups_of_many_keys_are_shared_by_the_items_of_a_sweep(self) -> None:
        self.cli.init(self.contract(many=True))
        self.cli.child("drive", "--owner", "w1", "--parallel", "4", "--json", code=10)
        self.assert_each_made_once_and_the_earlier_ones_found()
        sizes = self.lookups()
        self.assertGreater(max(sizes), 1, f"items looked up together: {sizes}")
        self.assertLess(len(sizes), len(self.items), f"fewer lookups than items, each looked up first: {sizes}")


if __name__ == "__main__":
    unittest.main()


class ListingTest(_Drive):
    """The GitHub recipe with ``observe_first``: issues a script filed before the run are found in the listing that
    every item waiting for a lookup shares, and verified with no call; ``drive`` killed mid-call makes no second."""

    def start(self, hub: StandIn, before: List[str]) -> RunnerCli:
        """The recipe's run over :data:`CRASHES`, the issues of ``before`` filed by a script first and listed."""
        cli = self.project(GITHUB, hub.base, "https://api.github.com", concurrency=4, observe_first=True)
        os.makedirs(os.path.join(cli.root, "crashes"))
        for crash in CRASHES:
            record = {"id": crash, "title": f"Crash {crash}", "summary": "Seen.", "labels": ["crash"], "count": 1}
            with open(os.path.join(cli.root, "crashes", f"{crash}.json"), "w", encoding="utf-8") as handle:
                json.dump(record, handle)
        with open(os.path.join(cli.root, ".github-token"), "w") as handle:
            handle.write(TOKEN + "\n")
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for crash in before:  # the recipe's first line in the body: how the listing finds an item's issue
            status, _, _ = hub.request("POST", "/repos/OWNER/REPO/issues",
                                       {"title": crash, "body": f"crash-group: {crash}\n\nfiled by a script"}, auth)
            self.assertEqual(status, 201)
        path = "/repos/OWNER/REPO/issues?state=all&per_page=100"
        wait_for("the listing to show them", lambda: len(json.loads(hub.request("GET", path, None, auth)[2]))
                 == len(before))
        cli.init(self.block)
        return cli

    def assert_found_first(self, cli: RunnerCli, before: List[str]) -> None:
        for crash in before:
            shown = cli.json("effect", "show", f"crash-{crash}")
            self.assertEqual((shown["attempts"], shown["evidence"]["observe_first"]), (0, FOUND_FIRST), crash)

    def test_issues_filed_before_the_run_are_found_and_drive_killed_mid_call_files_none_twice(self) -> None:
        with StandIn("tracker", ["--token", TOKEN, "--lag", "0.4"]) as hub:
            before = CRASHES[::3]
            cli = self.start(hub, before)
            self.kill_mid_call(cli, hub, "create", kills=1)
            self.finish(cli, [f"crash-{c}" for c in CRASHES])
            counted = hub.count()
            self.assertEqual((counted["total"], counted["duplicates"]), (len(CRASHES), {}))
            self.assert_found_first(cli, before)

    def test_one_listing_finds_every_item_a_sweep_holds(self) -> None:
        with StandIn("tracker", ["--token", TOKEN]) as hub:
            cli = self.start(hub, CRASHES)
            listed = sum(hub.requests()["list"].values())
            done = cli.child("drive", "--owner", "agent-1", "--json", code=10).json
            self.assertEqual((done["drive"]["found_first"], hub.count()["total"]), (len(CRASHES), len(CRASHES)))
            self.assert_found_first(cli, CRASHES)
            self.assertEqual(sum(hub.requests()["list"].values()) - listed, 1, "one listing, not one per item")
