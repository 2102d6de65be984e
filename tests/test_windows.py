"""The window table of ``runner.base.windows`` against the code: what an observer receives, in order.

A :class:`runner.proof.faults.Recorder` is handed to the store (and through
it to ``Run`` and ``drive_effect``); one transition that compacts, one
effect, init, the repair of a torn record, a step, the lease, a job and a
database transaction each must pass exactly the windows the table lists, in
the table's order, and together they must pass every window of the table.
So a window added to the code but not to the table, or to the table but not
to the code, or moved, fails here.
"""

import os
import sys
import unittest
from typing import Any, Dict, List

from runner.calls.target import Observation
from runner.base.canonical import content_digest
from runner.proof.faults import KillAt, Recorder, kill_point
from runner.execution.run import Run, submit_job
from runner.stores.file import RunStore
from runner.stores.sqlite import SQLiteStore
from runner.base.windows import NO_OBSERVER, WINDOW_NAMES, WINDOWS, Observer

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

NAMES = [name for name, _, _ in WINDOWS]
PLAN = {"contract": 1, "task_id": "windows", "goal": "pass every window", "steps": [{"id": "one"}, {"id": "two"}]}

#: Every window some test of :class:`WindowOrderTest` passed, and the tests that ran; checked against the table at the end.
SEEN: set = set()
RAN: set = set()


def table(first: str, last: str) -> List[str]:
    """The table's names from ``first`` to ``last``, in table order."""
    return NAMES[NAMES.index(first) : NAMES.index(last) + 1]


class SeenRecorder(Recorder):
    def reached(self, window: str, **facts: Any) -> None:
        super().reached(window, **facts)
        SEEN.add(window)


class PresentAdapter:
    """An in-memory target that applies every call and is always observed to hold it."""

    name = "memory"
    key_scope = "this object"
    retention_seconds = None
    conflicting_payload = "refused"
    verification = "dict lookup"
    deduplicates = True

    def __init__(self) -> None:
        self.held: Dict[str, str] = {}

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        self.held[key] = content_digest(payload)
        return {"key": key}

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        return Observation("present" if key in self.held else "absent", {"key": key})


class WindowOrderTest(unittest.TestCase):
    def setUp(self) -> None:
        RAN.add(self._testMethodName)
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        self.root = tmp.name
        self.path = os.path.join(self.root, "run")

    def store(self, **options: Any) -> RunStore:
        if not os.path.exists(self.path):
            RunStore.create(self.path, "windows", PLAN)
        return RunStore.open(self.path, **options)

    def test_one_transition_that_compacts(self) -> None:
        rec = SeenRecorder()
        store = self.store(observer=rec, compact_min_bytes=1)
        store.commit([["set", ["effects", "a"], {"n": 1}]])
        archive = table("store:after-history-mkdir", "store:after-archive-rename-fsync")
        first = [w for w in table("store:before-append", "store:after-journal-create-fsync") if w not in archive]
        self.assertEqual(rec.windows, first)  # no previous journal yet: nothing to copy into the history folder
        journal = os.path.join(self.path, "journal.jsonl")
        self.assertEqual(rec.passes[0][1], {"path": journal})  # the fs and the bytes are facts too, left out by the recorder
        del rec.passes[:]
        store.commit([["set", ["effects", "b"], {"n": 2}]])
        self.assertEqual(rec.windows, table("store:before-append", "store:after-journal-create-fsync"))
        segment = os.path.join(self.path, "history", "000000000001-000000000001.jsonl.gz")
        archived = [facts["path"] for w, facts in rec.passes if w.startswith("store:after-archive")]
        self.assertEqual(archived, [segment] * 4)
        del rec.passes[:]
        store.commit([["set", ["effects", "c"], {"n": 3}]])
        self.assertEqual(rec.windows, [w for w in table("store:before-append", "store:after-journal-create-fsync")
                                       if w != "store:after-history-mkdir"])  # the folder is made once

    def test_a_drop_of_history_the_retention_asks_for(self) -> None:
        RunStore.create(self.path, "windows", dict(PLAN, history={"keep_bytes": 1}))
        store = RunStore.open(self.path, compact_min_bytes=1)
        for n in range(3):
            store.commit([["set", ["effects", f"e{n}"], {"n": n}]])
        rec = SeenRecorder()
        store = RunStore.open(self.path, compact_min_bytes=1, observer=rec)
        store.commit([["set", ["effects", "d"], {"n": 4}]])
        compaction = [w for w in table("store:before-append", "store:after-journal-create-fsync")
                      if w != "store:after-history-mkdir"]
        record = table("store:before-append", "store:after-append-fsync")
        self.assertEqual(rec.windows, compaction + record + ["store:before-history-drop"])
        self.assertEqual(store.state["observations"]["history"]["dropped"]["through"], 2)

    def test_one_transition_that_does_not_compact(self) -> None:
        rec = SeenRecorder()
        self.store(observer=rec).commit([["set", ["effects", "a"], {"n": 1}]])
        self.assertEqual(rec.windows, table("store:before-append", "store:after-append-fsync"))

    def test_one_effect(self) -> None:
        rec = SeenRecorder()
        run = Run(self.store(observer=rec))
        run.acquire("worker", 60)
        self.assertEqual(rec.windows, table("store:before-append", "store:after-append-fsync") + ["lease:after-acquire"])
        self.assertEqual(rec.passes[-1][1], {"owner": "worker", "epoch": 1})
        del rec.passes[:]
        run.drive_effect("k1", {"n": 1}, PresentAdapter())
        effect_windows = [w for w in rec.windows if w.startswith("effect:")]
        self.assertEqual(effect_windows, table("effect:before-started", "effect:before-verify"))
        commit = table("store:before-append", "store:after-append-fsync")
        self.assertEqual(rec.windows, ["effect:before-started", *commit, "effect:after-started", "effect:after-call", *commit,
                                       "effect:after-ack", "effect:before-verify", *commit])
        self.assertTrue(all(facts == {"key": "k1"} for window, facts in rec.passes if window.startswith("effect:")))

    def test_init(self) -> None:
        rec = SeenRecorder()
        RunStore.create(self.path, "windows", PLAN, observer=rec)
        replace = table("store:after-temp-write", "store:after-temp-fsync") + ["store:after-rename", "store:after-rename-fsync"]
        self.assertEqual(rec.windows, table("store:after-mkdir", "store:after-mkdir-fsync") + replace
                         + ["store:after-journal-create", "store:after-journal-create-fsync"] + replace)
        self.assertEqual([os.path.basename(facts["path"]) for w, facts in rec.passes if w == "store:after-rename"], ["snapshot.json", "run.json"])

    def test_repair_of_a_torn_record(self) -> None:
        self.store().commit([["set", ["effects", "a"], {"n": 1}]])
        with open(os.path.join(self.path, "journal.jsonl"), "ab") as journal:
            journal.write(b'{"h":"00')
        rec = SeenRecorder()
        self.store(observer=rec).commit([["set", ["effects", "b"], {"n": 2}]])
        self.assertEqual(rec.windows, ["store:after-truncate"] + table("store:before-append", "store:after-append-fsync"))

    def test_steps_and_a_job(self) -> None:
        rec = SeenRecorder()
        run = Run(self.store(), observer=rec)  # observer of the run alone: no store windows
        run.acquire("worker", 60)
        run.step_start("one")
        run.step_done("one", {})
        submit_job(run, "j", [sys.executable, "-S", "-c", "pass"])
        self.assertEqual(rec.windows, ["lease:after-acquire", "step:after-start", "step:after-done", "job:after-intent", "job:after-spawn"])
        self.assertEqual(rec.passes[-1][1]["key"], "j")
        self.assertIsInstance(rec.passes[-1][1]["pid"], int)

    def test_a_database_transaction(self) -> None:
        rec = SeenRecorder()
        url = "sqlite:" + os.path.join(self.root, "runs.db")
        store = SQLiteStore.create(url, "windows", PLAN, jobs_root=self.root)
        store.close()
        store = SQLiteStore.open(url, "windows", jobs_root=self.root, observer=rec)
        self.addCleanup(store.close)
        store.commit([["set", ["effects", "a"], {"n": 1}]])
        store.commit([])  # nothing to commit: no window
        self.assertEqual(rec.windows, ["store:before-db-commit", "store:after-db-commit"])

    @classmethod
    def tearDownClass(cls) -> None:
        # Together the tests above passed every window the table names, and no other.
        every = {name for name in dir(cls) if name.startswith("test_")}
        if RAN == every and SEEN != set(WINDOW_NAMES):
            missing, unknown = sorted(set(WINDOW_NAMES) - SEEN), sorted(SEEN - set(WINDOW_NAMES))
            raise AssertionError(f"windows never passed: {missing}; passed but not in the table: {unknown}")


class ExplorerWindowsTest(unittest.TestCase):
    def test_each_example_of_the_explorer_names_its_window(self) -> None:
        from runner.proof.crashcheck import explore

        report = explore(transitions=6, seed=2, variant="no-file-fsync", max_states_per_point=16)
        self.assertTrue(report["examples"])
        windows = [example["window"] for example in report["examples"]]
        self.assertTrue(set(windows) - {None} <= set(WINDOW_NAMES), windows)
        # The temp file is renamed into place unsynced: the first bad state lies just after that rename.
        self.assertEqual(windows[0], "store:after-rename")


class TableTest(unittest.TestCase):
    def test_names_are_unique_and_layered(self) -> None:
        self.assertEqual(len(NAMES), len(set(NAMES)))
        for name, _facts, durable in WINDOWS:
            self.assertIn(name.split(":")[0], ("store", "effect", "step", "lease", "job"))
            self.assertTrue(durable)

    def test_the_default_hooks_do_nothing(self) -> None:
        self.assertIsInstance(NO_OBSERVER, Observer)
        self.assertIsNone(NO_OBSERVER.reached("store:before-append", path="x"))

    def test_a_misspelt_window_or_fault_is_refused(self) -> None:
        with self.assertRaises(ValueError):
            KillAt("store:mid-append")
        with self.assertRaises(ValueError):
            KillAt("store:after-rename", tear=True)
        with self.assertRaises(ValueError):
            kill_point("effect:after-call/sideways", 1)
        with self.assertRaises(ValueError):
            kill_point("effect:after-call/answer-lost", 1)  # no way to lose the answer given

    def test_a_kill_counts_only_matching_passes(self) -> None:
        kill = KillAt("effect:after-call", 2, where={"key": "b"}, after=("step:after-start", 1))
        kill.reached("effect:after-call", key="b")  # before the step started: not counted
        kill.reached("step:after-start", step="one")
        kill.reached("effect:after-call", key="a")  # another key: not counted
        self.assertFalse(kill.fatal_next(key="a"))
        kill.reached("effect:after-call", key="b")
        self.assertTrue(kill.fatal_next(key="b"))
        self.assertEqual(kill.target.seen, 1)


if __name__ == "__main__":
    unittest.main()
