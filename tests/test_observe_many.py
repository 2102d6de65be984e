"""``effects.observe_many``: one command looks many keys up at once, and ``drive --parallel`` uses it.

The adapter is held to its protocol with a stand-in for the process runner
(what the command printed and how it exited); the contract's checks refuse
each malformed section with its reason; and a real ``drive --parallel 8``
over a target that never deduplicates files one ticket per item while its
lookups of many keys verify them, far fewer runs than items.
"""

import json
import os
import unittest
from typing import Any, Dict, List

from runner.contract.effects import effects_problems
from runner.adapters.commands import CommandAdapter
from runner.calls.commands import Outcome
from runner.contract.lookups import MANY_DEFAULT
from runner.contract.spec import ManyCommand
from runner.contract.effects import many_problems
from runner.calls.target import NotApplied
from tests.support.batch import batch_contract
from tests.support.cli import RunnerCli

MANY = {"command": ["find-many", "--run", "{run_id}", "{each}"], "match": "/ref", "value": "{slug}"}


def outcome(code: int, stdout: str) -> Outcome:
    return Outcome([], code, False, stdout.encode(), b"", "0" * 64, "0" * 64, 0.01)


class Item:
    """Stands in for one key's adapter: its placeholders."""

    def __init__(self, slug: str) -> None:
        self.values = {"slug": slug, "run_id": "r1"}


class AdapterTest(unittest.TestCase):
    def adapter(self, answer: Outcome, calls: List[List[str]], many: Dict[str, Any] = MANY) -> CommandAdapter:
        def runner(argv: List[str], **_: Any) -> Outcome:
            calls.append(list(argv))
            return answer

        section = ManyCommand(command=tuple(many["command"]), match=many["match"], value=many["value"],
                              list=many.get("list", ""), max=many.get("max", MANY_DEFAULT))
        return CommandAdapter(["invoke"], ["observe"], values={"run_id": "r1"}, runner=runner, many=section)

    def test_each_becomes_one_argument_per_key_and_the_list_is_matched_back(self) -> None:
        calls: List[List[str]] = []
        listed = [{"ref": "b", "id": 2}, {"ref": "a", "id": 1}, {"ref": "b", "id": 3}, {"id": 4}]
        adapter = self.adapter(outcome(0, json.dumps(listed)), calls)
        seen = adapter.observe_many([(f"{s}:t", {}, Item(s)) for s in ("a", "b", "c")])
        self.assertEqual(calls, [["find-many", "--run", "r1", "a", "b", "c"]])
        self.assertEqual([o.status for o in seen], ["present", "present", "unseen"], "a bare list may leave keys out")
        self.assertEqual((seen[0].evidence["found"], seen[1].evidence["matches"]), ({"ref": "a", "id": 1}, 2))
        self.assertEqual(adapter.observe_batch, 50)
        self.assertEqual(adapter.batch_key, self.adapter(outcome(0, "[]"), []).batch_key, "one contract's keys are looked up together")
        self.assertIsNone(CommandAdapter(["i"], ["o"]).batch_key, "without observe_many each key is looked up alone")

    def test_a_key_without_a_match_is_absent_only_in_an_answer_that_says_it_is_complete(self) -> None:
        listed = [{"ref": "a", "id": 1}]
        for complete, expected in ((True, "absent"), (False, "unseen"), ("yes", "unseen"), (None, "unseen")):
            with self.subTest(complete=complete):
                document: Dict[str, Any] = {"items": listed}
                if complete is not None:
                    document["complete"] = complete
                adapter = self.adapter(outcome(0, json.dumps(document)), [], dict(MANY, list="/items"))
                seen = adapter.observe_many([("a:t", {}, Item("a")), ("c:t", {}, Item("c"))])
                self.assertEqual([o.status for o in seen], ["present", expected])

    def test_an_answer_that_is_no_list_says_nothing_of_any_key(self) -> None:
        for answer in (outcome(0, '{"ref": "a"}'), outcome(0, "not json"), outcome(3, "[]"), outcome(1, "[]")):
            with self.subTest(answer=answer.stdout, code=answer.exit_code):
                seen = self.adapter(answer, []).observe_many([("a:t", {}, Item("a")), ("b:t", {}, Item("b"))])
                self.assertEqual([o.status for o in seen], ["unseen", "unseen"], "never absent on an answer not read")

    def test_exit_75_is_not_now_with_the_delay_asked(self) -> None:
        with self.assertRaises(NotApplied) as caught:
            self.adapter(outcome(75, '{"retry_after": 2}'), []).observe_many([("a:t", {}, Item("a"))])
        self.assertEqual(caught.exception.retry_after, 2.0)


class ContractTest(unittest.TestCase):
    def test_each_malformed_section_is_refused_with_its_reason(self) -> None:
        cases = {
            "no each": (dict(MANY, command=["find-many"]), "holding \"{each}\" once"),
            "each twice": (dict(MANY, command=["find", "{each}", "{each}"]), "holding \"{each}\" once"),
            "each as the program": (dict(MANY, command=["{each}"]), "holding \"{each}\" once"),
            "a key's value in the command": (dict(MANY, command=["find", "{slug}", "{each}"]), "not {slug}"),
            "a bad pointer": (dict(MANY, match="ref"), "JSON pointer"),
            "a value naming nothing": (dict(MANY, value="slug"), "template of the key"),
            "max too large": (dict(MANY, max=500), "from 2 to 200"),
            "an unknown field": (dict(MANY, url="x"), "unknown field 'url'"),
            "not an object": ("find-many", "must be"),
        }
        self.assertEqual(many_problems(MANY), [])
        for name, (section, reason) in cases.items():
            with self.subTest(name):
                problems = many_problems(section)
                self.assertTrue(any(reason in p for p in problems), problems)
        self.assertTrue(any("comes with the invoke and observe commands" in p for p in effects_problems({"observe_many": MANY})))


#: target.sh invoke LEDGER KEY | observe LEDGER KEY | many LEDGER KEY...: a target that never deduplicates.
#: A POSIX shell program (a Python one costs ten times the processor time per call); each line is one append.
TARGET = r'''
mode=$1 ledger=$2
shift 2
if [ "$mode" = invoke ]; then
    printf '%s\n' "$1" >> "$ledger"
    printf '{"ticket": "%s"}\n' "$1"
    exit 0
fi
nl='
'
rows=
[ -f "$ledger" ] && rows=$(cat "$ledger")
case $mode in
observe)
    printf '1\n' >> "$ledger.many"
    case "$nl$rows$nl" in *"$nl$1$nl"*) printf '{"found": "%s"}\n' "$1"; exit 0 ;; esac
    exit 1 ;;
many)
    printf '%d\n' $# >> "$ledger.many"
    found=
    for key in "$@"; do
        case "$nl$rows$nl" in *"$nl$key$nl"*) found="$found${found:+, }{\"ref\": \"$key\"}" ;; esac
    done
    printf '{"tickets": [%s]}\n' "$found" ;;
esac
'''


class DriveTest(unittest.TestCase):
    def test_drive_parallel_verifies_by_lookups_of_many_keys_and_files_each_item_once(self) -> None:
        cli = RunnerCli(self)
        root = cli.root
        with open(os.path.join(root, "target.sh"), "w", encoding="utf-8") as handle:
            handle.write(TARGET)
        ledger = os.path.join(root, "ledger")
        target = ["sh", os.path.join(root, "target.sh")]
        items = [f"i{n:02d}" for n in range(24)]
        block = batch_contract({"invoke": target + ["invoke", ledger, "{key}"], "observe": target + ["observe", ledger, "{key}"]},
                               items=items, payload={"template": {"item": "{item}"}})
        block["steps"][0]["key"] = "{item}:ticket"
        block["effects"]["key_pattern"] = "[a-z0-9]+:ticket"
        block["effects"]["observe_many"] = {"command": target + ["many", ledger, "{each}"], "list": "/tickets", "match": "/ref",
                                            "value": "{key}", "max": 6}
        cli.init(block)
        cli.child("drive", "--owner", "w1", "--parallel", "8", "--json", code=10)
        with open(ledger) as handle:
            filed = handle.read().split()
        self.assertEqual(sorted(filed), sorted(f"{i}:ticket" for i in items), "one ticket per item, none twice")
        listed = cli.child("effect", "list", "--limit", "100", "--json", code=None).json
        states: Dict[str, int] = {}
        for effect in listed["effects"].values():
            states[effect["state"]] = states.get(effect["state"], 0) + 1
        self.assertEqual(states, {"verified": len(items)})
        with open(ledger + ".many") as handle:
            sizes = [int(n) for n in handle.read().split()]
        self.assertEqual(sum(sizes), len(items), "each key was looked up once (a lookup of one key is the observe command)")
        self.assertLessEqual(max(sizes), 6, "at most max keys per lookup")
        self.assertLess(len(sizes), len(items) // 2, f"lookups of many keys at once, not one per key: {sizes}")


if __name__ == "__main__":
    unittest.main()
