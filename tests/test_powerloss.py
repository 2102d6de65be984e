"""Power-loss exploration of the run store, and the persistence model it rests on.

The explorer itself is in ``runner/proof/crashcheck.py``. These tests check three
things: the model admits exactly the states its documentation promises; the
real store keeps its invariant at every crash point; and each deliberately
broken write path is caught by the invariant it breaks.
"""

import os
import random
import tempfile
import unittest
from typing import Any, Callable, Dict, List, Optional, Set

from runner.proof.crashcheck import VARIANTS, CrashSpace, RecordingFileSystem, explore
from runner.base.fs import FileSystem, OsFileSystem
from runner.stores.file import RunStore, scan

# Sizes that keep the whole file to a few seconds.
REAL_SIZE = dict(transitions=40, seed=1, max_states_per_point=64)
# Every broken path is caught by the smallest workload the explorer takes: 3 transitions, two compactions.
VARIANT_SIZE = dict(transitions=3, seed=1, max_states_per_point=16)


def contents(states: List[Dict[str, Optional[bytes]]], path: str) -> Set[Optional[bytes]]:
    """The values ``path`` takes across crash states (None where it is absent or a directory)."""
    return {state.get(path) for state in states}


def synced_file(fs: RecordingFileSystem, path: str, data: bytes) -> None:
    """Create ``path`` with ``data`` and make both its bytes and its name durable."""
    fs.write_file(path, data)
    fs.fsync(path)
    fs.fsync_dir(os.path.dirname(path))


class PersistenceModelTest(unittest.TestCase):
    def setUp(self) -> None:
        self.fs = RecordingFileSystem()
        self.fs.mkdir("/d")
        self.fs.fsync_dir("/")

    def test_fsynced_data_always_survives(self) -> None:
        synced_file(self.fs, "/d/f", b"one\ntwo\n")
        states = self.fs.crash_states()
        self.assertEqual(states, [{"/d": None, "/d/f": b"one\ntwo\n"}])

    def test_unsynced_append_can_vanish_or_survive_as_a_prefix(self) -> None:
        synced_file(self.fs, "/d/f", b"a\n")
        self.fs.append("/d/f", b"bb\ncccc")
        seen = contents(self.fs.crash_states(random.Random(3)), "/d/f")
        full = b"a\nbb\ncccc"
        self.assertIn(b"a\n", seen)  # the append vanished
        self.assertIn(full, seen)  # it survived whole
        self.assertIn(b"a\nbb\n", seen)  # it survived up to a record boundary
        self.assertTrue(any(c not in (b"a\n", b"a\nbb\n", full) for c in seen), "no cut inside a line was tried")
        for value in seen:
            assert value is not None
            self.assertTrue(full.startswith(value) and value.startswith(b"a\n"), value)

    def test_fsync_fixes_what_was_appended_before_it(self) -> None:
        synced_file(self.fs, "/d/f", b"a\n")
        self.fs.append("/d/f", b"b\n")
        self.fs.fsync("/d/f")
        self.fs.append("/d/f", b"c\n")
        for value in contents(self.fs.crash_states(), "/d/f"):
            assert value is not None
            self.assertTrue(value.startswith(b"a\nb\n"), value)

    def test_truncate_then_append_survives_only_as_a_prefix_of_that_order(self) -> None:
        synced_file(self.fs, "/d/f", b"a\ntorn")
        self.fs.truncate("/d/f", 2)
        self.fs.append("/d/f", b"b\n")
        seen = contents(self.fs.crash_states(), "/d/f")
        self.assertTrue({b"a\ntorn", b"a\n", b"a\nb\n"} <= seen)
        self.assertNotIn(b"a\ntornb\n", seen)  # the append never lands before the truncation

    def test_rename_without_dir_fsync_may_or_may_not_survive(self) -> None:
        synced_file(self.fs, "/d/target", b"old\n")
        synced_file(self.fs, "/d/target.tmp", b"new\n")
        self.fs.replace("/d/target.tmp", "/d/target")
        states = self.fs.crash_states()
        self.assertEqual(len(states), 2)
        self.assertIn({"/d": None, "/d/target": b"old\n", "/d/target.tmp": b"new\n"}, states)
        self.assertIn({"/d": None, "/d/target": b"new\n"}, states)
        self.fs.fsync_dir("/d")
        self.assertEqual(self.fs.crash_states(), [{"/d": None, "/d/target": b"new\n"}])

    def test_renamed_file_carries_unsynced_bytes_that_may_be_lost(self) -> None:
        synced_file(self.fs, "/d/target", b"old\n")
        self.fs.write_file("/d/target.tmp", b"new\n")  # no fsync of the file
        self.fs.replace("/d/target.tmp", "/d/target")
        self.fs.fsync_dir("/d")
        self.assertIn(b"", contents(self.fs.crash_states(), "/d/target"))

    def test_pending_entry_changes_survive_independently(self) -> None:
        self.fs.create_exclusive("/d/a")
        self.fs.create_exclusive("/d/b")
        names = {tuple(sorted(p for p in state if p != "/d")) for state in self.fs.crash_states()}
        self.assertEqual(names, {(), ("/d/a",), ("/d/b",), ("/d/a", "/d/b")})

    def test_directory_creation_needs_its_parent_synced(self) -> None:
        self.fs.mkdir("/d/sub")
        synced_file(self.fs, "/d/sub/f", b"x\n")  # durable inside sub, but sub itself is not
        states = self.fs.crash_states()
        self.assertIn({"/d": None}, states)
        self.assertIn({"/d": None, "/d/sub": None, "/d/sub/f": b"x\n"}, states)

    def test_rename_between_directories_is_two_independent_entry_changes(self) -> None:
        self.fs.mkdir("/d/q")
        self.fs.fsync_dir("/d")
        synced_file(self.fs, "/d/f", b"x\n")
        self.fs.replace("/d/f", "/d/q/f")
        where = {tuple(sorted(p for p in state if p.endswith("/f"))) for state in self.fs.crash_states()}
        self.assertEqual(where, {(), ("/d/f",), ("/d/q/f",), ("/d/f", "/d/q/f")})

    def test_unsynced_unlink_may_be_undone(self) -> None:
        synced_file(self.fs, "/d/f", b"x\n")
        self.fs.unlink("/d/f")
        self.assertEqual(contents(self.fs.crash_states(), "/d/f"), {None, b"x\n"})

    def test_writes_to_different_files_are_not_ordered(self) -> None:
        synced_file(self.fs, "/d/a", b"")
        synced_file(self.fs, "/d/b", b"")
        self.fs.append("/d/a", b"first\n")
        self.fs.append("/d/b", b"second\n")
        pairs = {(s["/d/a"], s["/d/b"]) for s in self.fs.crash_states()}
        self.assertIn((b"", b"second\n"), pairs)  # the later write survived, the earlier did not

    def test_count_matches_enumeration(self) -> None:
        synced_file(self.fs, "/d/j", b"r1\n")
        self.fs.append("/d/j", b"r2\nr3\n")
        self.fs.write_file("/d/s.tmp", b"snap\n")
        self.fs.replace("/d/s.tmp", "/d/s")
        self.fs.create_exclusive("/d/other")
        space = self.fs.crash_space(random.Random(1))
        count, exact = space.count()
        self.assertTrue(exact)
        self.assertEqual(count, len(list(space.enumerate())))
        self.assertGreater(count, 8)

    def test_estimate_when_directory_choices_are_too_many(self) -> None:
        for i in range(14):
            self.fs.create_exclusive(f"/d/f{i}")
        space: CrashSpace = self.fs.crash_space()
        count, exact = space.count(random.Random(0), limit=1 << 10)
        self.assertFalse(exact)
        self.assertEqual(count, 1 << 14)  # each file is empty, so every entry subset is one state
        sample = space.sample(50, random.Random(0))
        self.assertEqual(len(sample), 50)

    def test_damage_is_durable_and_not_an_operation(self) -> None:
        synced_file(self.fs, "/d/f", b"abc\n")
        before = len(self.fs.operations)
        self.fs.damage("/d/f", lambda data: data.upper())
        self.assertEqual(len(self.fs.operations), before)
        self.assertEqual(self.fs.log[-1].name, "damage")
        self.assertEqual(self.fs.crash_states(), [{"/d": None, "/d/f": b"ABC\n"}])

    def test_log_records_operations_and_markers_in_order(self) -> None:
        seen: List[int] = []
        fs = RecordingFileSystem(observer=lambda f: seen.append(len(f.log)))
        fs.mark("attempt", 1)
        fs.mkdir("/r")
        fs.write_file("/r/x", b"1")
        fs.fsync("/r/x")
        fs.mark("ack", 1)
        self.assertEqual([(e.kind, e.name) for e in fs.log], [("mark", "attempt"), ("op", "mkdir"), ("op", "write_file"), ("op", "fsync"), ("mark", "ack")])
        self.assertEqual([e.name for e in fs.operations], ["mkdir", "write_file", "fsync"])
        self.assertEqual(seen, [2, 3, 4])  # the observer runs after each operation, never for a marker

    def test_from_tree_holds_exactly_that_state(self) -> None:
        tree: Dict[str, Optional[bytes]] = {"/a": None, "/a/b": None, "/a/b/c": b"data", "/a/d": b""}
        fs = RecordingFileSystem.from_tree(tree)
        self.assertEqual(fs.tree(), tree)
        self.assertEqual(fs.crash_states(), [tree])
        self.assertEqual(fs.log, [])


def _script(fs: FileSystem, root: str) -> List[Any]:
    """Run one fixed sequence of calls; return each result or exception type, for comparison."""

    def p(name: str) -> str:
        return root + name

    calls: List[Callable[[], Any]] = [
        lambda: fs.mkdir(p("/t")),
        lambda: fs.mkdir(p("/t")),
        lambda: fs.mkdir(p("/missing/t")),
        lambda: fs.listdir(p("/t")),
        lambda: fs.read(p("/t/nothing")),
        lambda: fs.stat(p("/t/nothing")),
        lambda: fs.exists(p("/t/nothing")),
        lambda: fs.write_file(p("/t/a"), b"hello\n"),
        lambda: fs.create_exclusive(p("/t/a")),
        lambda: fs.create_exclusive(p("/t/b"), b"bee"),
        lambda: fs.append(p("/t/a"), b"more"),
        lambda: fs.append(p("/t/nothing"), b"x"),
        lambda: fs.read(p("/t/a")),
        lambda: fs.read_from(p("/t/a"), 3),
        lambda: fs.read_from(p("/t/a"), 100),
        lambda: fs.stat(p("/t/a"))[1],
        lambda: fs.fsync(p("/t/a")),
        lambda: fs.fsync(p("/t/nothing")),
        lambda: fs.fsync_dir(p("/t")),
        lambda: fs.fsync_dir(p("/t/a")),
        lambda: fs.truncate(p("/t/a"), 2),
        lambda: fs.truncate(p("/t/a"), 4),
        lambda: fs.read(p("/t/a")),
        lambda: fs.truncate(p("/t/nothing"), 0),
        lambda: fs.stat(p("/t/a"))[0] == fs.stat(p("/t/b"))[0],  # type: ignore[index]
        lambda: fs.replace(p("/t/b"), p("/t/a")),
        lambda: fs.read(p("/t/a")),
        lambda: fs.exists(p("/t/b")),
        lambda: fs.replace(p("/t/b"), p("/t/c")),
        lambda: fs.mkdir(p("/t/sub")),
        lambda: fs.replace(p("/t/a"), p("/t/sub")),
        lambda: fs.read(p("/t/sub")),
        lambda: fs.listdir(p("/t/a")),
        lambda: fs.read(p("/t/a/x")),
        lambda: fs.stat(p("/t/a/x")),
        lambda: fs.exists(p("/t/a/x")),
        lambda: fs.write_file(p("/t/sub"), b"x"),
        lambda: fs.write_file(p("/t/nodir/x"), b"x"),
        lambda: fs.replace(p("/t/a"), p("/t/sub/a")),
        lambda: fs.listdir(p("/t/sub")),
        lambda: fs.unlink(p("/t/sub")),
        lambda: fs.unlink(p("/t/sub/a")),
        lambda: fs.unlink(p("/t/sub/a")),
        lambda: fs.listdir(p("/t")),
        lambda: fs.is_symlink(p("/t")),
    ]
    out: List[Any] = []
    for call in calls:
        try:
            with fs.lock(p("/lockfile")):
                out.append(call())
        except OSError as exc:
            out.append(type(exc).__name__)
    return out


class RecordingFileSystemBehavesLikeTheOsTest(unittest.TestCase):
    def test_same_results_and_errors_as_the_real_file_system(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            real = OsFileSystem()
            try:
                expected = _script(real, tmp)
            finally:
                real.close()
        actual = _script(RecordingFileSystem(), "")
        self.assertEqual(actual, expected)

    def test_the_store_runs_on_it(self) -> None:
        fs = RecordingFileSystem()
        store = RunStore.create("/run", "t1", {"goal": "g"}, fs=fs, clock=lambda: 1e9, compact_min_bytes=1)
        for i in range(5):
            store.commit([["set", ["effects", f"e{i}"], {"n": i}]])
        again = RunStore.open("/run", fs=fs, clock=lambda: 1e9)
        self.assertEqual(again.state, store.state)
        self.assertEqual(scan("/run", fs).state, store.state)
        self.assertIn("journal.prev.jsonl", fs.listdir("/run"))


class ExplorerTest(unittest.TestCase):
    reports: Dict[str, Dict[str, Any]] = {}

    @classmethod
    def report(cls, variant: Optional[str]) -> Dict[str, Any]:
        key = variant or "none"
        if key not in cls.reports:
            cls.reports[key] = explore(variant=variant, **(REAL_SIZE if variant is None else VARIANT_SIZE))  # type: ignore[arg-type]
        return cls.reports[key]

    def test_real_store_keeps_the_invariant_at_every_crash_point(self) -> None:
        report = self.report(None)
        self.assertEqual(report["violations"], 0, report["examples"])
        self.assertEqual(report["violation_kinds"], {})
        self.assertFalse(report["sampled"])
        self.assertEqual(report["states_explored"], report["states_possible"])
        self.assertGreater(report["crash_points"], 200)
        self.assertGreater(report["followups"], 0)
        work = report["workload"]
        self.assertEqual(work["revisions"], REAL_SIZE["transitions"])
        self.assertGreaterEqual(work["compactions"], 3)
        self.assertGreaterEqual(work["archived"], 2)  # previous journals copied into the history folder
        self.assertGreaterEqual(work["quarantines"], 1)  # the damaged snapshot was moved aside
        self.assertGreaterEqual(work["torn_repairs"], 1)  # the torn record was cut off

    def assertCaught(self, variant: str, kind: str) -> Dict[str, Any]:
        report = self.report(variant)
        self.assertGreater(report["violations"], 0)
        self.assertIn(kind, report["violation_kinds"], report["violation_kinds"])
        example = next(e for e in report["examples"] if e["invariant"] == kind)
        for field in ("crash_point", "after", "state", "problem"):
            self.assertIn(field, example)
        return example

    def test_missing_file_fsync_before_rename_is_caught(self) -> None:
        # run.json (and later every snapshot) is renamed into place with its
        # bytes never synced: a crash leaves it empty or cut, unreadable.
        example = self.assertCaught("no-file-fsync", "unrecoverable")
        self.assertIsNotNone(example["acknowledged"])

    def test_missing_directory_fsync_is_caught(self) -> None:
        # The rename of run.json can be lost after init returned, and a new
        # journal's name can be lost after records in it were acknowledged.
        self.assertCaught("no-dir-fsync", "no-run")
        self.assertCaught("no-dir-fsync", "lost-ack")

    def test_snapshot_written_before_the_journal_record_is_caught(self) -> None:
        # The compacted snapshot reaches the disk ahead of its journal record.
        # A crash between the two leaves a snapshot that no journal continues;
        # the loader must refuse it, so a run that lost only unacknowledged
        # data stops as unrecoverable: a violation of the invariant.
        example = self.assertCaught("snapshot-before-journal", "unrecoverable")
        self.assertIsNotNone(example["acknowledged"])

    def test_skipped_journal_fsync_is_caught(self) -> None:
        self.assertCaught("no-journal-fsync", "lost-ack")

    def test_the_head_witness_raises_no_false_alarm_and_exposes_cut_journals(self) -> None:
        report = self.report(None)
        self.assertEqual(report["false_alarms"], 0, report["examples"])
        heads = report["head_states"]
        self.assertGreater(heads.get("behind", 0), 0, heads)  # a power loss kept an older head, and the run loaded
        self.assertGreater(heads.get("invalid", 0), 0, heads)  # or tore it, and the run loaded
        self.assertGreater(heads.get("current", 0), 0, heads)
        self.assertEqual(heads.get("ahead", 0), 0, heads)
        self.assertGreater(report["losses_probed"], 5)
        self.assertEqual(report["losses_caught"], report["losses_probed"])

    def test_a_head_written_before_its_record_is_caught(self) -> None:
        # The witness reaches the disk ahead of the record it names; a crash
        # between keeps a head the journal never reaches: a false alarm.
        example = self.assertCaught("head-before-append", "unrecoverable")
        self.assertIsNotNone(example["acknowledged"])

    def test_a_segment_named_before_its_bytes_are_synced_is_caught(self) -> None:
        # The previous journal's copy gets its segment's name unsynced, and the rotation then replaces the
        # previous journal: a power loss leaves a segment cut short, and records of the history are lost.
        example = self.assertCaught("no-archive-fsync", "history-lost")
        self.assertIn("history/", example["state"])

    def test_every_variant_is_known(self) -> None:
        self.assertEqual(set(VARIANTS), {"no-file-fsync", "no-dir-fsync", "snapshot-before-journal", "no-journal-fsync",
                                         "head-before-append", "no-archive-fsync"})
        with self.assertRaises(ValueError):
            explore(transitions=3, variant="no-such-variant")

    def test_sampling_reports_what_it_covered(self) -> None:
        full = explore(transitions=6, seed=2, max_states_per_point=10**6)  # 88 crash points, four compactions
        capped = explore(transitions=6, seed=2, max_states_per_point=1)
        self.assertFalse(full["sampled"])
        self.assertEqual(full["states_explored"], full["states_possible"])
        self.assertTrue(capped["sampled"])
        self.assertGreater(capped["points_sampled"], 0)
        self.assertEqual(capped["states_possible"], full["states_possible"])  # the count does not depend on the cap
        self.assertEqual(capped["crash_points"], full["crash_points"])
        self.assertLessEqual(capped["states_explored"], capped["crash_points"])
        self.assertLess(capped["states_explored"], capped["states_possible"])
        self.assertTrue(full["possible_exact"] and capped["possible_exact"])

    def test_an_estimated_count_is_flagged(self) -> None:
        report = self.report("no-dir-fsync")
        self.assertTrue(report["sampled"])
        self.assertFalse(report["possible_exact"])
        self.assertGreater(report["states_possible"], report["states_explored"])

    def test_the_run_is_deterministic(self) -> None:
        one = explore(transitions=4, seed=5)
        two = explore(transitions=4, seed=5)
        one.pop("seconds")
        two.pop("seconds")
        self.assertEqual(one, two)


if __name__ == "__main__":
    unittest.main()
