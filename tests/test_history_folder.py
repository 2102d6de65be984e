"""The file store's history folder: compaction copies every journal it rotates out, and a retention may bound it.

* Segments: each is a gzip file the standard library reads back, holding
  whole journal lines; its name gives its first and last revision; together
  with the journals they chain from ``run.json`` to the snapshot's head.
* Readers: ``records_after`` reads from revision 1 whatever the compactions;
  a segment missing, cut or altered is a finding, never a silent gap; a read
  after a revision opens only the segments it needs.
* Retention (the contract's ``history``): by size and by age, the drop is a
  transition recorded before any segment is deleted; the figures the views
  count stay those of the whole run, and every view says what was dropped.
* A kill between the drop's record and the deletion of its segments (a real
  child process, resumed in another) leaves a run whose history is whole from
  the drop on, and the next compaction finishes the deletion.
* The database stores keep every journal row: their history is whole.
"""

import gzip
import json
import os
import signal
import unittest
from typing import Any, Callable, Dict, List

from tests.support import util as _util
from tests.support.timeline_runs import small_contract

from runner.surfaces import history, otlp, timeline
from runner.base.canonical import sha256_hex
from runner.run import Run
from runner.stores.file import RunStore
from runner.stores.file_history import parse_name, segment_name
from runner.stores.sqlite import SQLiteStore

CHILD = os.path.join(_util.SCRIPTS, "crash_child.py")


def ticking(start: float = _util.CLOCK_START, step: float = 0.25) -> Callable[[], float]:
    now = [start]

    def clock() -> float:
        now[0] += step
        return now[0]

    return clock


def workers(path: str, plan: Dict[str, Any], clock: Callable[[], float], compact: int = 2048,
            holders: int = 6) -> RunStore:
    """``holders`` workers in turn, each filing ten effects; every other one dies holding the lease (broken)."""
    RunStore.create(path, plan["task_id"], plan, clock=clock)
    for n in range(holders):
        run = Run(RunStore.open(path, compact_min_bytes=compact, clock=clock))
        run.acquire(f"worker-{n}", 600)
        if n == 0:
            run.step_start("fetch")
        for m in range(10):
            key = f"doc:{n * 10 + m}:ticket"
            run.effect_begin(key, {"doc": key}, step="fetch")
            run.effect_verify(key, {"seen": key})
        if n % 2:
            run.release()
        else:
            Run(RunStore.open(path, clock=clock)).break_lease("supervisor", f"worker-{n} was killed")
    return RunStore.open(path, clock=clock)


class Segments(unittest.TestCase):
    def setUp(self) -> None:
        scratch = _util.scratch_dir("runner-history-")
        self.addCleanup(scratch.cleanup)
        self.path = os.path.join(scratch.name, "run")
        self.store = workers(self.path, small_contract("history-segments"), ticking())

    def test_every_record_is_kept_and_chained_from_the_identity_to_the_head(self) -> None:
        folder = os.path.join(self.path, "history")
        names = sorted(os.listdir(folder))
        self.assertGreater(len(names), 5)
        chained: List[Dict[str, Any]] = []
        for name in names:
            first, last = parse_name(name)  # type: ignore[misc]
            self.assertEqual(name, segment_name(first, last))
            with gzip.open(os.path.join(folder, name), "rb") as handle:  # what any gzip reader reads back
                lines = handle.read().splitlines()
            records = [json.loads(line) for line in lines]
            self.assertEqual([r["r"]["rev"] for r in records], list(range(first, last + 1)))
            chained += records
        with open(os.path.join(self.path, "run.json"), "rb") as handle:
            previous = sha256_hex(handle.read())
        for record in chained:
            self.assertEqual(record["r"]["prev"], previous)
            previous = record["h"]
        records, oldest = self.store.records_after(0)
        self.assertEqual(([r["rev"] for r in records], oldest), (list(range(1, self.store.revision + 1)), 1))
        self.assertEqual(records[len(chained) - 1]["hash"], previous)
        self.assertEqual(records[-1]["hash"], self.store.state["head"])
        self.assertEqual(self.store.history_findings, ())

    def test_a_read_after_a_revision_opens_only_the_segments_it_needs(self) -> None:
        opened: List[str] = []
        real = self.store.fs.read

        def read(path: str) -> bytes:
            opened.append(os.path.basename(path))
            return real(path)

        self.store.fs.read = read  # type: ignore[method-assign]
        records, _oldest = self.store.records_after(self.store.revision - 3)
        self.assertEqual([r["rev"] for r in records], list(range(self.store.revision - 2, self.store.revision + 1)))
        self.assertFalse([name for name in opened if name.endswith(".jsonl.gz")], opened)

    def test_a_segment_cut_short_is_damage_that_doctor_reports(self) -> None:
        folder = os.path.join(self.path, "history")
        name = sorted(os.listdir(folder))[1]
        with open(os.path.join(folder, name), "r+b") as handle:
            handle.truncate(os.path.getsize(os.path.join(folder, name)) - 7)
        records, _oldest = self.store.records_after(0)
        first, last = parse_name(name)  # type: ignore[misc]
        self.assertNotIn(first, [r["rev"] for r in records])
        self.assertEqual([f.code for f in self.store.history_findings], ["history-altered", "history-missing"])
        doctor = _util.one_json(_util.in_process_cli(["--dir", self.path, "--json", "doctor", "--repair"]))
        self.assertEqual(sorted(f["code"] for f in doctor["findings"]), ["history-altered", "history-missing"])
        self.assertEqual((doctor["ok"], doctor["healthy"], doctor["repaired"]), (True, False, []))
        self.assertEqual(Run(RunStore.open(self.path)).state["revision"], self.store.revision)  # the state loads


class Retention(unittest.TestCase):
    """The contract's ``history`` bounds the folder; what is dropped is recorded first and counted on every view."""

    def run_with(self, bound: Dict[str, Any], step: float = 0.25) -> RunStore:
        scratch = _util.scratch_dir("runner-retention-")
        self.addCleanup(scratch.cleanup)
        plan = small_contract("history-retention")
        plan = dict(plan, history=bound) if bound else plan
        return workers(os.path.join(scratch.name, "run"), plan, ticking(step=step))

    def test_a_bound_in_bytes_drops_the_oldest_after_recording_it(self) -> None:
        whole, bounded = self.run_with({}), self.run_with({"keep_bytes": 4000})
        dropped = bounded.state["observations"]["history"]["dropped"]
        folder = os.path.join(bounded.path, "history")
        sizes = [os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))]
        self.assertLessEqual(sum(sizes[:-1]), 4000)  # the newest segment always stays
        firsts = [parse_name(name)[0] for name in os.listdir(folder)]  # type: ignore[index]
        self.assertEqual(min(firsts), dropped["through"] + 1)
        self.assertEqual((dropped["first"], dropped["records"], dropped["policy"]),
                         (1, dropped["through"], {"keep_bytes": 4000}))
        records, oldest = bounded.records_after(0)
        self.assertEqual((oldest, records[0]["rev"], bounded.history_findings),
                         (dropped["through"] + 1, dropped["through"] + 1, ()))
        self.assertEqual(records[0]["prev"], dropped["head"])
        # Each drop is a transition of the store's own (epoch 0) that sets the record and nothing else.
        drops = [r for r in records if r["epoch"] == 0 and r["ops"][0][1] == ["observations", "history"]]
        self.assertTrue(drops)
        self.assertTrue(all(len(r["ops"]) == 1 for r in drops))
        # The figures the history gives are those of the whole run.
        full, kept = history.load(whole), history.load(bounded)
        for name in ("lease_holders", "crashes", "recoveries", "effects_verified", "step_attempts", "effect_attempts"):
            self.assertEqual(kept.summary[name], full.summary[name], name)
        self.assertEqual(kept.summary["history_dropped"], dropped["records"])
        self.assertEqual(kept.summary["history_records"] + kept.summary["history_dropped"], bounded.revision)
        self.assertEqual(kept.gaps, [])
        report = _util.one_json(_util.in_process_cli(["--dir", bounded.path, "--json", "report"]))
        self.assertEqual((report["history_dropped"], report["history_dropped_range"]),
                         (dropped["records"], [1, dropped["through"]]))
        page = timeline.render([kept])
        self.assertIn(f"Journal records 1 to {dropped['through']}", page)
        self.assertIn("history retention (keep 4000 bytes): 5 lease holdings, 2 recoveries", page)
        trace = otlp.trace(kept)["resourceSpans"][0]["scopeSpans"][0]["spans"]
        said = [e for e in trace[0]["events"] if e["name"] == "runner.history.dropped"]
        self.assertEqual(len(said), 1)
        doctor = _util.one_json(_util.in_process_cli(["--dir", bounded.path, "--json", "doctor"]))
        self.assertTrue(doctor["healthy"], doctor)

    def test_a_bound_in_time_drops_what_is_older(self) -> None:
        bounded = self.run_with({"keep_seconds": 30}, step=0.5)
        dropped = bounded.state["observations"]["history"]["dropped"]
        records, oldest = bounded.records_after(0)
        self.assertEqual(oldest, dropped["through"] + 1)
        folder = os.path.join(bounded.path, "history")
        for name in sorted(os.listdir(folder))[:-1]:
            with gzip.open(os.path.join(folder, name), "rb") as handle:
                last = json.loads(handle.read().splitlines()[-1])["r"]["at"]
            self.assertGreaterEqual(last, dropped["last_at"])
        self.assertEqual(history.load(bounded).summary["crashes"], 3)

    def test_a_damaged_segment_is_never_dropped_nor_anything_after_it(self) -> None:
        scratch = _util.scratch_dir("runner-retention-damaged-")
        self.addCleanup(scratch.cleanup)
        path = os.path.join(scratch.name, "run")
        plan = dict(small_contract("history-retention"), history={"keep_bytes": 1})
        clock = ticking()
        RunStore.create(path, plan["task_id"], plan, clock=clock)
        store = RunStore.open(path, compact_min_bytes=1, clock=clock)
        folder = os.path.join(path, "history")
        while not os.path.isdir(folder):
            store.commit([["set", ["counters", "cost"], {"n": store.revision}]])
        oldest = os.path.join(folder, sorted(os.listdir(folder))[0])
        with open(oldest, "r+b") as handle:
            handle.truncate(10)
        for _ in range(20):
            store.commit([["set", ["counters", "cost"], {"n": store.revision}]])
        self.assertGreater(len(os.listdir(folder)), 2)  # more segments than the bound keeps, and none dropped
        self.assertTrue(os.path.exists(oldest))
        self.assertNotIn("history", store.state["observations"])


class KilledDuringADrop(unittest.TestCase):
    """SIGKILL after the drop is recorded, before its segments are deleted; another process resumes."""

    def test_the_drop_is_finished_by_the_next_compaction(self) -> None:
        with _util.scratch_dir("runner-drop-kill-") as scratch:
            path = os.path.join(scratch, "run")
            contract = _util.write_contract(os.path.join(scratch, "contract.md"))
            child = _util.run(_util.python(CHILD, "--child", "--dir", path, "--contract", contract, "--phase", "commit",
                                           "--window", "store:before-history-drop", "--occurrence", "2",
                                           "--keep-bytes", "1"))
            self.assertEqual(child.code, -signal.SIGKILL, child.err)
            acked = max(int(line.split()[1]) for line in child.out.splitlines() if line.startswith("ack "))
            folder = os.path.join(path, "history")
            store = RunStore.open(path)
            dropped = store.state["observations"]["history"]["dropped"]
            behind = [n for n in os.listdir(folder) if parse_name(n)[1] <= dropped["through"]]  # type: ignore[index]
            verify = _util.run(_util.python(CHILD, "--verify", path))
            report = json.loads(verify.out)
            store = RunStore.open(path, compact_min_bytes=1)
            store.commit([["set", ["counters", "cost"], {"after": 1}]])  # a compaction, whose upkeep finishes the drop
            through = store.state["observations"]["history"]["dropped"]["through"]
            left = sorted(os.listdir(folder))
        self.assertTrue(behind)  # the child died between the drop's record and the deletion of its segments
        self.assertNotIn("error", report, report.get("error"))
        self.assertGreater(report["revision"], acked)  # the drop's record was durable when the child died
        history_seen = report["history"]
        self.assertEqual((history_seen["findings"], history_seen["oldest"]), ([], dropped["through"] + 1))
        self.assertEqual(history_seen["revisions"], [dropped["through"] + 1, report["next_revision"]])
        self.assertEqual(report["after"], [])
        self.assertTrue(all(parse_name(name)[0] > through for name in left), left)  # type: ignore[index]


class DatabaseStores(unittest.TestCase):
    def test_a_database_keeps_every_journal_row(self) -> None:
        with _util.scratch_dir("runner-history-sqlite-") as scratch:
            url = "sqlite:" + os.path.join(scratch, "runs.db")
            store = SQLiteStore.create(url, "history-sql", small_contract("history-sql"), jobs_root=scratch)
            self.addCleanup(store.close)
            for n in range(30):
                store.commit([["set", ["counters", "cost"], {"n": n}]])
            store.compact()  # nothing to fold: the rows are the journal
            records, oldest = store.records_after(0)
            seen = history.load(store)
        self.assertEqual(([r["rev"] for r in records], oldest), (list(range(1, 31)), 1))
        self.assertEqual((seen.gaps, seen.damage, seen.summary["history_records"]), ([], [], 30))


if __name__ == "__main__":
    unittest.main()
