"""``effects.observe_many``: one command run looks many keys up, and ``drive`` files each item once.

What references/batch-and-drive.md (section 9) promises of a lookup command of many keys, held by
real ``drive`` processes over a target kept in files that never deduplicates: ``{each}`` becomes one
argument per key; an answer's list is matched back to each key by the value at ``match``, a key with
a match is present, and one without observed absent only when the answer says ``"complete": true``
(else the key's own observe command decides); exit 75 is "not now", asked again; any other answer (a
non-zero exit, text that is not JSON) says nothing of any key, each then looked up alone, so a key
already filed is never filed again. ``contract check`` refuses a malformed ``observe_many`` section with exit 2, one
line per problem naming its line, and changes nothing.
"""

import json
import os
import sys
import unittest
from typing import Any, Dict, List, Tuple

from tests.support.batch import script
from tests.support.cli import RunnerCli
from tests.support.util import in_process_cli, scratch_dir, write_contract

#: The target: ``invoke``, ``observe`` and ``many`` (the lookup of many keys) over ``filings``, a
#: shell script (a Python target would start an interpreter for each of the suite's hundred calls).
#: It never deduplicates: every invoke that files appends a filing. ``plan`` says how calls behave:
#: a line ``invoke<TAB>ITEM<TAB>WAY...`` (one way per attempt) or ``many<TAB><TAB>WAY...`` (one per
#: run), "ok" past a list's end (a "many" that is "ok" says ``"complete": true``; "page" lists one of the
#: keys found and does not); ``events`` logs every call in the order the target served them (one
#: at a time, under a lock), a line per call, its fields separated by tabs and lists by US (0x1f).
#: Item names here hold no tab or newline.
TARGET = r"""#!/bin/sh
# invoke FOLDER ITEM KEY | observe FOLDER ITEM | many FOLDER RUN_ID ITEM... END
# One call at a time: mkdir is atomic (no test here kills a call while it holds the lock).
until mkdir "$2/lock" 2>/dev/null; do sleep 0.01; done
awk '
function way(ways, n,   w) { return split(ways, w, " ") >= n ? w[n] : "ok" }
function quote(text) { gsub(/[\\"]/, "\\\\&", text); return "\"" text "\"" }
BEGIN {
    FS = "\t"; US = "\037"; mode = ARGV[1]; dir = ARGV[2]; events = dir "/events"; filings = dir "/filings"
    while ((getline line < (dir "/plan")) > 0) { split(line, f, "\t"); plan[f[1] SUBSEP f[2]] = f[3] }
    while ((getline line < filings) > 0) { split(line, f, "\t"); count++; if (!(f[1] in id)) id[f[1]] = count }
    while ((getline line < events) > 0) { split(line, f, "\t"); if (f[1] == "invoke") tries[f[2]]++; else if (f[1] == "many") runs++ }
    if (mode == "invoke") {
        ref = ARGV[3]; attempt = tries[ref] + 1; w = way(plan["invoke" SUBSEP ref], attempt)
        print "invoke" FS ref FS ARGV[4] FS attempt FS w >> events
        if (w == "ok" || w == "lost") print ref FS ARGV[4] >> filings
        if (w != "ok") exit 3
        printf "{\"id\": %d}\n", count + 1; exit 0
    }
    if (mode == "observe") {
        ref = ARGV[3]; print "observe" FS ref FS ((ref in id) ? 1 : 0) >> events
        if (!(ref in id)) exit 1
        printf "{\"id\": %d}\n", id[ref]; exit 0
    }
    n = runs + 1; w = way(plan["many" SUBSEP ""], n); argv = ARGV[1]; found = ""; answer = ""
    for (i = 2; i < ARGC; i++) argv = argv US ARGV[i]
    for (i = 4; i < ARGC - 1; i++) if (ARGV[i] in id) {
        found = found (found == "" ? "" : US) ARGV[i]
        answer = "{\"external_ref\": " quote(ARGV[i]) ", \"id\": " id[ARGV[i]] "}, " answer
    }
    print "many" FS n FS w FS argv FS found >> events
    if (w == "ok") {
        print "{\"complete\": true, \"items\": [" answer "{\"external_ref\": \"not-asked-for\", \"id\": 0}]}"; exit 0
    }
    if (w == "page") { sub(/}, .*/, "}", answer); print "{\"items\": [" answer "]}"; exit 0 }
    if (w == "not-now") { print "{\"retry_after\": 0}"; exit 75 }
    if (w == "fail-with-empty-list") { print "{\"items\": []}"; exit 3 }
    if (w == "not-json") { print "<html>502 Bad Gateway</html>"; exit 0 }
    if (w == "cut-short") { print "{\"items\": ["; exit 0 }
    print "unknown way " w > "/dev/stderr"; exit 4
}' "$@"
code=$?
rmdir "$2/lock"
exit $code
"""


#: Keys per run of the lookup command.
MAX = 5


def item_names(count: int) -> List[str]:
    """Items whose names hold spaces, brackets and a quote: each must reach the lookup as one argument."""
    return [f"docs/report {n:03d} (customer's copy).txt" for n in range(count)]


class ObserveManyCase(unittest.TestCase):
    """A workspace of documents, the target, and a batch contract whose lookups go through ``observe_many``."""

    def setUp(self) -> None:
        self.fresh()

    def fresh(self) -> None:
        """A new, empty workspace with the target's program (cleaned up with the test)."""
        tmp = scratch_dir("runner-observe-many-")
        self.addCleanup(tmp.cleanup)
        self.root = tmp.name
        self.cli = RunnerCli(self, root=self.root)
        self.target = os.path.join(self.root, "target")
        os.makedirs(os.path.join(self.root, "docs"))
        os.makedirs(self.target)
        self.program = script(self.root, "target.sh", TARGET)

    def contract(self, observe_many: Any = None) -> Dict[str, Any]:
        program = self.program
        many = {"command": program + ["many", "{workspace}/target", "{run_id}", "{each}", "END"],
                "list": "/items", "match": "/external_ref", "value": "{item}", "max": MAX}
        return {
            "contract": 1,
            "task_id": "observe-many",
            "goal": "File one ticket per document, each exactly once.",
            "workspace": ".",
            "steps": [{"id": "file-tickets", "items": {"glob": "docs/*.txt"}, "key": "doc-{slug}:ticket",
                       "payload": {"template": {"doc": "{item}"}}, "next": "done"}],
            "effects": {
                "invoke": program + ["invoke", "{workspace}/target", "{item}", "{key}"],
                "observe": program + ["observe", "{workspace}/target", "{item}"],
                "observe_many": many if observe_many is None else observe_many,
                "timeout_seconds": 20,
            },
            "retry": {"base_seconds": 0.05, "cap_seconds": 0.2},
            "limits": {"max_effect_attempts": 3},
            "lease": {"ttl_seconds": 60},
        }

    def start(self, count: int, plan: Dict[str, Any]) -> List[str]:
        """Write ``count`` documents, the target's plan and the contract, and start the run; return the items."""
        items = item_names(count)
        for n, item in enumerate(items):
            with open(os.path.join(self.root, item), "w", encoding="utf-8") as handle:
                handle.write(f"Report {n}\nquarterly figures\n")
        lines = [f"invoke\t{item}\t{' '.join(ways)}\n" for item, ways in plan.get("invoke", {}).items()]
        lines.append(f"many\t\t{' '.join(plan.get('many', []))}\n")
        with open(os.path.join(self.target, "plan"), "w", encoding="utf-8") as handle:
            handle.writelines(lines)
        contract = write_contract(os.path.join(self.root, "contract.md"), self.contract())
        self.cli("init", "--contract", contract)
        return items

    def drive_to_completion(self, runs: int = 6) -> Tuple[List[int], Dict[str, Any]]:
        """``drive --parallel 4`` in a child, again after a stop for an unknown outcome, until the run is complete."""
        codes: List[int] = []
        for _ in range(runs):
            result = self.cli.child("drive", "--owner", "w", "--parallel", "4", "--until-stop", "--json", timeout=60,
                                    code=None)
            codes.append(result.code)
            self.assertIn(result.code, (8, 10), f"drive exits {codes}: {result.err}")
            if result.code == 10:
                return codes, json.loads(result.out.splitlines()[-1])
        self.fail(f"the run did not complete in {runs} runs of drive: exits {codes}")

    def events(self, op: str = "") -> List[Dict[str, Any]]:
        """The target's log of calls, each as a record: what it was asked and how it answered."""
        rows: List[Dict[str, Any]] = []
        with open(os.path.join(self.target, "events"), encoding="utf-8") as handle:
            for line in handle:
                fields = line.rstrip("\n").split("\t")
                if fields[0] == "invoke":
                    rows.append({"op": "invoke", "ref": fields[1], "key": fields[2], "attempt": int(fields[3]), "way": fields[4]})
                elif fields[0] == "observe":
                    rows.append({"op": "observe", "ref": fields[1], "found": fields[2] == "1"})
                else:
                    argv = fields[3].split("\x1f")
                    rows.append({"op": "many", "n": int(fields[1]), "way": fields[2], "argv": argv, "values": argv[3:-1],
                                 "found": fields[4].split("\x1f") if fields[4] else []})
        return [row for row in rows if not op or row["op"] == op]

    def filings(self) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        with open(os.path.join(self.target, "filings"), encoding="utf-8") as handle:
            for line in handle:
                ref = line.split("\t")[0]
                counts[ref] = counts.get(ref, 0) + 1
        return counts

    def invokes(self) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        for event in self.events("invoke"):
            counts[event["ref"]] = counts.get(event["ref"], 0) + 1
        return counts

    def assert_each_filed_once_and_verified(self, items: List[str]) -> None:
        self.assertEqual(self.filings(), {item: 1 for item in items}, "each item filed exactly once")
        state = self.cli.status()
        self.assertEqual((state["status"], state["effects"]), ("complete", {"verified": len(items)}))

    def assert_called_again_only_after_an_absence(self) -> None:
        """Each invoke after an item's first follows a lookup, after the item's previous invoke, that found it absent."""
        events = self.events()
        last_invoke: Dict[str, int] = {}
        for position, event in enumerate(events):
            if event["op"] != "invoke":
                continue
            ref = event["ref"]
            if ref in last_invoke:
                absent = [e for e in events[last_invoke[ref] + 1:position]
                          if (e["op"] == "observe" and e["ref"] == ref and not e["found"])
                          or (e["op"] == "many" and e["way"] == "ok" and ref in e["values"] and ref not in e["found"])]
                self.assertTrue(absent, f"{ref} invoked again (attempt {event['attempt']}) without an observed absence")
            last_invoke[ref] = position

    def assert_each_unseen_key_looked_up_alone(self, refs: List[str]) -> None:
        """Each of ``refs`` that a lookup of many keys could not have shown (it failed, or left it off) is looked up
        next by its own observe command, and never again with other keys."""
        events = self.events()
        for position, event in enumerate(events):
            if event["op"] != "many" or event["way"] == "ok":
                continue
            shown = event["found"][-1:] if event["way"] == "page" else []  # a page lists the last key found
            for ref in set(event["values"]) & set(refs) - set(shown):
                later = [e for e in events[position + 1:] if ref in ([e["ref"]] if e["op"] != "many" else e["values"])]
                self.assertTrue(later, f"{ref} was never looked up after a lookup that could not show it")
                self.assertEqual((later[0]["op"], [e for e in later if e["op"] == "many"]), ("observe", []),
                                 f"{ref}: looked up alone next, and never again with other keys: {later}")

    def assert_lookups_well_formed(self, items: List[str]) -> None:
        """Each run of the lookup command: its other arguments filled in place, then one argument per key, at most ``max``."""
        for event in self.events("many"):
            argv = event["argv"]
            self.assertEqual(argv[:3], ["many", self.target, "observe-many"], argv)
            self.assertEqual(argv[-1], "END", argv)
            self.assertTrue(1 <= len(event["values"]) <= MAX, argv)
            self.assertEqual(len(set(event["values"])), len(event["values"]), argv)
            self.assertLessEqual(set(event["values"]), set(items), argv)


class DriveTest(ObserveManyCase):
    def test_drive_parallel_files_each_item_once_and_looks_several_keys_up_in_one_run(self) -> None:
        items = self.start(8, {})
        codes, report = self.drive_to_completion(runs=1)
        self.assertEqual(codes, [10])
        self.assert_each_filed_once_and_verified(items)
        self.assertEqual(self.invokes(), {item: 1 for item in items})
        self.assert_lookups_well_formed(items)
        lookups = [event["values"] for event in self.events("many")]
        self.assertTrue(any(len(values) >= 2 for values in lookups), f"no lookup held several keys: {lookups}")
        # One call per command run, however many keys a lookup held: fewer than one lookup per item.
        self.assertEqual(report["drive"]["calls"], len(self.events()))
        self.assertLess(len(self.events()), 2 * len(items))

    def test_not_now_from_the_lookup_is_asked_again_and_nothing_is_filed_twice(self) -> None:
        items = self.start(8, {"many": ["not-now", "not-now", "not-now"]})
        self.drive_to_completion()
        self.assert_each_filed_once_and_verified(items)
        self.assertEqual(self.invokes(), {item: 1 for item in items}, "'not now' from a lookup is no absence")
        self.assertEqual([event["way"] for event in self.events("many")][:3], ["not-now"] * 3)
        self.assert_lookups_well_formed(items)

    def test_lost_answers_then_failed_lookups_never_file_an_item_twice(self) -> None:
        """Invokes that filed but whose answer was lost, then lookups that fail, before one answers."""
        for failure in ("fail-with-empty-list", "not-json", "cut-short"):
            with self.subTest(failure=failure):
                self.fresh()
                lost = item_names(5)
                items = self.start(8, {"invoke": {item: ["lost"] for item in lost}, "many": [failure, failure]})
                self.drive_to_completion()
                self.assert_each_filed_once_and_verified(items)
                self.assertEqual(self.invokes(), {item: 1 for item in items},
                                 "an item whose filing landed is never invoked again, whatever the lookups answered")
                failed = [event for event in self.events("many") if event["way"] != "ok"]
                self.assertTrue(any(set(event["values"]) & set(lost) for event in failed),
                                f"no failing lookup was asked about an item whose answer was lost: {self.events('many')}")
                self.assert_each_unseen_key_looked_up_alone(lost)
                self.assert_called_again_only_after_an_absence()
                self.assert_lookups_well_formed(items)

    def test_keys_left_off_an_answer_that_is_not_complete_are_looked_up_alone(self) -> None:
        """Answers that list one of the keys found (a page) and do not say they are complete: no key is filed again."""
        lost = item_names(6)
        items = self.start(8, {"invoke": {item: ["lost"] for item in lost}, "many": ["page"] * 50})
        codes, _ = self.drive_to_completion()
        self.assertEqual(codes, [10])
        self.assert_each_filed_once_and_verified(items)
        self.assertEqual(self.invokes(), {item: 1 for item in items}, "a key left off a page is never filed again")
        self.assertTrue([event for event in self.events("many") if len(set(event["values"]) & set(lost)) >= 2],
                        f"no lookup of many keys held two items whose answer was lost: {self.events('many')}")
        self.assert_each_unseen_key_looked_up_alone(lost)
        self.assert_lookups_well_formed(items)

    def test_a_key_missing_from_the_answer_is_absent_and_only_then_invoked_again(self) -> None:
        unfiled = item_names(4)
        items = self.start(8, {"invoke": {item: ["fail-before"] for item in unfiled}})
        self.drive_to_completion()
        self.assert_each_filed_once_and_verified(items)
        self.assertEqual(self.invokes(), {item: 2 if item in unfiled else 1 for item in items})
        self.assert_called_again_only_after_an_absence()
        events = self.events()
        by_lookup = []  # unfiled items found absent by a lookup of many keys (a lookup of one key is the observe command)
        for ref in unfiled:
            first, second = [n for n, event in enumerate(events) if event["op"] == "invoke" and event["ref"] == ref]
            by_lookup += [ref for event in events[first + 1:second] if event["op"] == "many" and event["way"] == "ok"
                          and ref in event["values"] and ref not in event["found"]]
        self.assertTrue(by_lookup, "no item was found absent by a lookup of many keys that answered without it")
        self.assert_lookups_well_formed(items)


class ContractCheckTest(ObserveManyCase):
    """``contract check`` refuses a malformed ``observe_many`` with exit 2 and one line per problem, changing nothing."""

    def check(self, observe_many: Any) -> Tuple[int, str, List[str], Tuple[int, int]]:
        """Check a contract holding ``observe_many``; return the exit, stdout, stderr's lines and the effects section's lines."""
        path = write_contract(os.path.join(self.root, "contract.md"), self.contract(observe_many))
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
        first = next(n for n, line in enumerate(lines, 1) if line.strip().startswith('"effects"'))
        last = next(n for n, line in enumerate(lines, 1) if n > first and line.strip().startswith('"timeout_seconds"'))
        before = self.snapshot()
        result = in_process_cli(["contract", "check", path])
        self.assertEqual(self.snapshot(), before, "contract check changed nothing")
        return result.code, result.out, result.err.splitlines(), (first, last)

    def snapshot(self) -> Dict[str, bytes]:
        files = {}
        for folder, _, names in os.walk(self.root):
            for name in names:
                path = os.path.join(folder, name)
                with open(path, "rb") as handle:
                    files[os.path.relpath(path, self.root)] = handle.read()
        return files

    def assert_refused(self, observe_many: Any, problems: int) -> None:
        code, out, lines, (first, last) = self.check(observe_many)
        self.assertEqual(code, 2, lines)
        self.assertEqual(out, "")
        self.assertEqual(len(lines), problems, lines)
        for line in lines:
            place, _, reason = line.partition(": ")
            name, _, number = place.rpartition(":")
            self.assertEqual(name, os.path.join(self.root, "contract.md"), line)
            self.assertTrue(number.isdigit() and first <= int(number) <= last, f"not a line of the effects section: {line}")
            self.assertIn("observe_many", reason, line)

    def test_a_well_formed_lookup_of_many_keys_passes(self) -> None:
        code, _, lines, _ = self.check(None)
        self.assertEqual((code, len(lines)), (0, 0), lines)

    def test_each_malformed_section_is_refused_with_its_line(self) -> None:
        program = [sys.executable, "-S", "find-many.py"]
        good = {"command": program + ["{each}"], "list": "/items", "match": "/external_ref", "value": "{item}"}
        cases = {
            "not an object": ["find-many.py", "{each}"],
            "command as one string": dict(good, command="find-many.py {each}"),
            "empty command": dict(good, command=[]),
            "command without {each}": dict(good, command=program + ["--all"]),
            "{key} in another argument": dict(good, command=program + ["--key={key}", "{each}"]),
            "{slug} in another argument": dict(good, command=program + ["{slug}", "{each}"]),
            "no match": {name: value for name, value in good.items() if name != "match"},
            "match not a pointer": dict(good, match="external_ref"),
            "list not a pointer": dict(good, list="items"),
            "value that names no key placeholder": dict(good, value="ticket"),
            "max zero": dict(good, max=0),
            "max not a number": dict(good, max="fifty"),
        }
        for case, section in cases.items():
            with self.subTest(case=case):
                self.assert_refused(section, 1)

    def test_several_problems_give_one_line_each(self) -> None:
        section = {"command": ["find-many.py", "{key}", "{each}"], "list": "items", "match": "/external_ref",
                   "value": "ticket", "max": 0}
        self.assert_refused(section, 4)


if __name__ == "__main__":
    unittest.main()
