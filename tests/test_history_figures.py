"""Figures that do not change with compaction: one scripted history, compacted often and never.

The script (``tests/support/scripts/history_child.py``, each phase its own
process on a clock the test gives it): a worker SIGKILLed at
``effect:after-call`` once the target committed, its lease broken by a
supervisor; the next one recovers (the effect settled by observation), is
told "not now" once and is SIGKILLed at ``effect:after-started``; its lease
expires and a third takes over, finishes the step and asks for an approval,
which a person grants; a fourth publishes under it, starts an effect and
stops holding the lease; an operator cancels with that effect in flight; the
same owner recovers (fencing its earlier self) and releases.

It is played twice from the same clock, once with a store that compacts
every few transitions (each journal rotated out is kept in the history
folder) and once with one that never compacts. The journals are the same
record for record, and so must be what is read back from them: ``report``'s
figures, the timeline's lanes and crash marks, the OTLP trace.
"""

import json
import os
import re
import signal
import unittest
from typing import Any, Dict, List, Tuple

from tests.support import util as _util
from tests.support.page import parse
from tests.support.timeline_runs import small_contract

from runner.surfaces import otlp
from runner.surfaces.history import load
from runner.run import Run
from runner.stores.file import RunStore

CHILD = os.path.join(_util.SCRIPTS, "history_child.py")
#: The script: (phase, the kill it dies at or None, seconds after the start it begins at).
SCRIPT: Tuple[Tuple[str, Any, float], ...] = (
    ("first", "effect:after-call,doc:4:ticket", 0.0),
    ("second", "effect:after-started,doc:8:ticket", 100.0),
    ("third", None, 200.0),
    ("fourth", None, 300.0),
    ("fifth", None, 400.0),
)


def play(root: str, compact: int) -> Tuple[str, List[int]]:
    """The scripted history in a fresh run under ``root``; returns the run's folder and each phase's exit code."""
    path, target = os.path.join(root, "run"), os.path.join(root, "target.json")
    with open(target, "w", encoding="utf-8") as handle:
        json.dump({"held": {}, "faults": {"doc:6:ticket": "not-applied"}}, handle)
    start = _util.CLOCK_START

    def at(offset: float) -> Any:
        return lambda: start + offset

    RunStore.create(path, "history-figures", small_contract("history-figures"), clock=at(0.0))
    codes = []
    for phase, kill, offset in SCRIPT:
        argv = ["--run", path, "--target", target, "--clock", str(start + offset), "--compact", str(compact),
                "--phase", phase]
        result = _util.run(_util.python(CHILD, *argv, *(["--kill", kill] if kill else [])))
        codes.append(result.code)
        if result.code not in (0, -signal.SIGKILL):
            raise AssertionError(f"phase {phase} failed: {result.err[-2000:]}")
        if phase == "first":
            supervisor = Run(RunStore.open(path, clock=at(50.0), compact_min_bytes=compact))
            supervisor.break_lease("supervisor", "worker-1 was killed")
        elif phase == "third":
            requests = RunStore.open(path).state["observations"]["approvals"]
            person = Run(RunStore.open(path, clock=at(250.0), compact_min_bytes=compact))
            person.approval_grant(sorted(requests)[0], "carol")
        elif phase == "fourth":
            operator = Run(RunStore.open(path, clock=at(350.0), compact_min_bytes=compact))
            operator.cancel("operator", "the archive is not needed")
    return path, codes


def crash_marks(page: str) -> List[Tuple[str, str, str]]:
    """The lanes (owner, epoch, how they ended) and the title of each crash mark, in page order."""
    elements = parse(page)
    lanes = [(a["data-owner"], a["data-epoch"], a["data-ended"]) for a in elements.having("lane")]
    crashes = re.findall(r'<g class="crash" data-epoch="([0-9]+)">.*?<title>(.*?)</title>', page)
    return lanes + [("crash", epoch, title) for epoch, title in crashes]


class FiguresAcrossCompaction(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        scratch = _util.scratch_dir("runner-history-figures-")
        cls.addClassCleanup(scratch.cleanup)
        cls.views: Dict[str, Dict[str, Any]] = {}
        for name, compact in (("compacted", 1), ("whole", 1 << 40)):
            root = os.path.join(scratch.name, name)
            os.mkdir(root)
            path, codes = play(root, compact)
            page = os.path.join(root, "page.html")
            report = _util.one_json(_util.in_process_cli(["--dir", path, "--json", "report", "--html", page]))
            with open(page, encoding="utf-8") as handle:
                html = handle.read()
            store = RunStore.open(path)
            records, _oldest = store.records_after(0)
            folder = os.path.join(path, "history")
            segments = len(os.listdir(folder)) if os.path.isdir(folder) else 0
            cls.views[name] = {"codes": codes, "report": report, "page": html, "records": [r["hash"] for r in records],
                               "segments": segments, "state": store.state, "trace": otlp.trace(load(store))}

    def test_the_script_ran_as_written_in_both(self) -> None:
        for name, view in self.views.items():
            with self.subTest(store=name):
                self.assertEqual(view["codes"], [-signal.SIGKILL, -signal.SIGKILL, 0, 0, 0])
                state = view["state"]
                self.assertEqual(state["status"], "cancelled")
                self.assertEqual(state["effects"]["doc:4:ticket"]["state"], "verified")
                self.assertEqual(state["effects"]["doc:6:ticket"].get("deferred"), 1)
                self.assertEqual([a["state"] for a in state["observations"]["approvals"].values()], ["used"])
        self.assertGreater(self.views["compacted"]["segments"], 10)  # compaction came every few transitions
        self.assertEqual(self.views["whole"]["segments"], 0)
        # The same journal, record for record.
        self.assertEqual(self.views["compacted"]["records"], self.views["whole"]["records"])

    def test_reports_figures_are_the_same(self) -> None:
        compacted, whole = (dict(self.views[name]["report"]) for name in ("compacted", "whole"))
        for report in (compacted, whole):
            report.pop("html_bytes")
        self.assertEqual(compacted, whole)
        self.assertEqual((whole["lease_holders"], whole["crashes"], whole["recoveries"]), (5, 3, 3))
        self.assertEqual((whole["reconciled_effects"], whole["history_missing"], whole["history_dropped"]), (3, 0, 0))
        self.assertEqual(whole["history_records"], whole["revision"])

    def test_the_timelines_crash_marks_are_the_same(self) -> None:
        compacted, whole = (crash_marks(self.views[name]["page"]) for name in ("compacted", "whole"))
        self.assertEqual(compacted, whole)
        ended = [mark[2] for mark in whole if mark[0] != "crash"]
        self.assertEqual(ended, ["broken", "expired", "released", "superseded", "released"])
        self.assertEqual(len([mark for mark in whole if mark[0] == "crash"]), 3)
        self.assertNotIn("compacted away", self.views["compacted"]["page"])

    def test_the_traces_are_the_same(self) -> None:
        self.assertEqual(self.views["compacted"]["trace"], self.views["whole"]["trace"])


if __name__ == "__main__":
    unittest.main()
