"""A missing or shortened journal is damage, not an empty history: the head witness and what it can and cannot see.

Runs are built for real (``_util.build_run`` and the command line's entry point). Each
loss of acknowledged records must stop the run with exit 7 and a quarantine;
each state the witness may honestly be behind in (a kill between the
journal's fsync and the head's update, a power loss that kept an older head
or tore it) must load exactly, with at most a finding. The one loss no file
in the folder can reveal, a whole folder restored from an older copy, is
shown for what it is.
"""

import json
import os
import shutil
import unittest
from typing import Dict, List

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

from runner.base.errors import StateUnrecoverable
from runner.base.fs import OsFileSystem
from runner.stores import file as file_store
from runner.stores.file import RunStore, scan

HEAD = "head.json"

JOURNAL = "journal.jsonl"


def run_files(path: str) -> Dict[str, bytes]:
    """The run's files at the top of ``path``, the head included."""
    out = {}
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full) and not os.path.islink(full):
            with open(full, "rb") as handle:
                out[name] = handle.read()
    return out


class WitnessCase(unittest.TestCase):
    def setUp(self) -> None:
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name

    def built(self, name: str, transitions: int, **options: object) -> _util.BuiltRun:
        return _util.build_run(os.path.join(self.tmp, name), transitions, plan={}, **options)  # type: ignore[arg-type]

    def copy_with(self, built: _util.BuiltRun, name: str, **changes: object) -> str:
        """A copy of the built run's folder (head included) with ``changes``: bytes to write, or None to delete."""
        path = os.path.join(self.tmp, name)
        shutil.copytree(built.path, path)
        for file_name, data in changes.items():
            full = os.path.join(path, file_name.replace("__", "."))
            if data is None:
                os.unlink(full)
            else:
                _util.write_file(full, data)  # type: ignore[arg-type]
        return path

    def assert_quarantined(self, path: str, label: str) -> None:
        before = run_files(path)
        with self.assertRaises(StateUnrecoverable, msg=label) as caught:
            RunStore.open(path, durability="process")
        self.assertEqual(caught.exception.exit_code, 7)
        folders = _util.quarantine_folders(path)
        self.assertEqual(len(folders), 1, label)
        moved = _util.read_flat(folders[0])
        moved.pop("REASON.txt")
        self.assertEqual(moved, {k: v for k, v in before.items() if k != "lock"}, f"{label}: the quarantine holds other bytes")

    def assert_loads(self, path: str, built: _util.BuiltRun, rev: int, label: str) -> RunStore:
        store = RunStore.open(path, durability="process")
        self.addCleanup(store.fs.close)  # type: ignore[attr-defined]
        self.assertEqual(store.revision, rev, label)
        self.assertEqual(store.state, built.states[rev], label)
        return store


class LostRecordsAreDamage(WitnessCase):
    """Deleting, emptying, cutting or rolling back the journal of a run is quarantined (exit 7), compacted or not."""

    def runs(self) -> Dict[str, _util.BuiltRun]:
        return {
            "never-compacted": self.built("small", 12),  # the snapshot is still revision 0
            "compacted": self.built("compacted", 12, compact_after=(4, 8)),
        }

    def test_journal_deleted(self) -> None:
        for label, built in self.runs().items():
            with self.subTest(run=label):
                self.assert_quarantined(self.copy_with(built, f"deleted-{label}", journal__jsonl=None), label)

    def test_journal_emptied(self) -> None:
        for label, built in self.runs().items():
            with self.subTest(run=label):
                self.assert_quarantined(self.copy_with(built, f"emptied-{label}", journal__jsonl=b""), label)

    def test_journal_cut_at_every_line_boundary(self) -> None:
        for label, built in self.runs().items():
            data = built.files[JOURNAL]
            for start, _end in _util.journal_records(data):
                with self.subTest(run=label, cut=start):
                    self.assert_quarantined(self.copy_with(built, f"line-{label}-{start}", journal__jsonl=data[:start]), f"{label} cut at {start}")

    def test_journal_cut_at_every_byte_of_the_last_record(self) -> None:
        # The last record was acknowledged (the head names it), so a cut inside
        # it is not a torn append: nothing may drop it as one.
        built = self.runs()["never-compacted"]
        data = built.files[JOURNAL]
        start, end = _util.journal_records(data)[-1]
        for cut in range(start + 1, end):
            with self.subTest(cut=cut):
                self.assert_quarantined(self.copy_with(built, f"byte-{cut}", journal__jsonl=data[:cut]), f"cut at {cut}")

    def test_journal_replaced_by_an_older_copy(self) -> None:
        for label, built in self.runs().items():
            older = built.history[built.latest - 3]
            with self.subTest(run=label):
                self.assert_quarantined(self.copy_with(built, f"older-{label}", journal__jsonl=older[JOURNAL]), label)

    def test_journal_and_snapshot_replaced_by_older_copies(self) -> None:
        built = self.runs()["compacted"]
        older = built.history[6]
        path = self.copy_with(built, "older-pair", journal__jsonl=older[JOURNAL], snapshot__json=older["snapshot.json"],
                              backup__json=older["backup.json"], journal__prev__jsonl=older["journal.prev.jsonl"])
        self.assert_quarantined(path, "every state file from revision 6, the head from the latest")

    def test_journal_missing_without_any_witness(self) -> None:
        # Even with the head gone too, a run that never compacted has no
        # reason to lack the journal init created.
        built = self.runs()["never-compacted"]
        self.assert_quarantined(self.copy_with(built, "no-journal-no-head", journal__jsonl=None, head__json=None), "journal and head deleted")

    def test_the_command_line_stops_and_refuses_another_payload(self) -> None:
        # After the loss, 'effect begin' with another payload under a key
        # already begun must not be accepted.
        contract = _util.write_contract(os.path.join(self.tmp, "contract.md"))
        run = os.path.join(self.tmp, "cli-run")
        payload1, payload2 = os.path.join(self.tmp, "p1.json"), os.path.join(self.tmp, "p2.json")
        _util.write_file(payload1, b'{"x": 1}\n')
        _util.write_file(payload2, b'{"x": 2}\n')
        env = {"RUNNER_OWNER": "w1", "RUNNER_EPOCH": "1"}
        self.assertEqual(_util.in_process_cli(["--dir", run, "init", "--contract", contract]).code, 0)
        self.assertEqual(_util.in_process_cli(["--dir", run, "lease", "acquire", "--owner", "w1", "--ttl", "600"]).code, 0)
        self.assertEqual(_util.in_process_cli(["--dir", run, "step", "start", "only"], env=env).code, 0)
        for key in ("e1", "e2", "e3"):
            self.assertEqual(_util.in_process_cli(["--dir", run, "effect", "begin", key, "--payload", payload1], env=env).code, 0)
        with open(os.path.join(run, JOURNAL), "rb") as handle:
            data = handle.read()
        _util.write_file(os.path.join(run, JOURNAL), data[: data[:-1].rfind(b"\n") + 1])  # the newest record is gone
        status = _util.in_process_cli(["--dir", run, "--json", "status"])
        self.assertEqual(status.code, 7, status.err)
        self.assertIn("acknowledged", _util.one_json(status)["message"])
        begin = _util.in_process_cli(["--dir", run, "effect", "begin", "e3", "--payload", payload2], env=env)
        self.assertEqual(begin.code, 7, begin.err)
        doctor = _util.in_process_cli(["--dir", run, "--json", "doctor"])
        self.assertEqual(doctor.code, 7, doctor.err)


class NoFalseAlarm(WitnessCase):
    """Every state the witness may honestly be in loads exactly: behind, torn, missing, foreign, or the compaction window."""

    def test_head_one_record_behind_as_a_killed_writer_leaves_it(self) -> None:
        # Killed after the journal's fsync, before the head's update: the
        # record is durable, the head names the one before.
        built = self.built("behind", 6)
        path = self.copy_with(built, "behind-one", head__json=self.head_at(built, built.latest - 1))
        store = self.assert_loads(path, built, built.latest, "head one behind")
        self.assertEqual([f.code for f in store.findings if f.level != "note"], [])

    def test_head_far_behind_as_a_power_loss_leaves_it(self) -> None:
        built = self.built("far", 9, compact_after=(3,))
        path = self.copy_with(built, "behind-far", head__json=self.head_at(built, 1))
        self.assert_loads(path, built, built.latest, "head at revision 1 of 9")

    def test_torn_append_beyond_the_head_is_dropped(self) -> None:
        built = self.built("torn", 5)
        path = self.copy_with(built, "torn-tail", journal__jsonl=built.files[JOURNAL] + b'{"h":"' + b"1" * 30)
        store = self.assert_loads(path, built, built.latest, "torn tail after the last acknowledged record")
        self.assertIn("torn-record", [f.code for f in store.findings])

    def test_torn_head_is_ignored_reported_and_rewritten(self) -> None:
        built = self.built("torn-head", 5)
        old, new = self.head_at(built, 3), self.head_at(built, 5)
        self.assertEqual(len(new), file_store.HEAD_SIZE)
        for cut in (10, 80, 150):  # the padding after the record is the same in both
            with self.subTest(cut=cut):
                path = self.copy_with(built, f"torn-head-{cut}", head__json=new[:cut] + old[cut:])
                store = self.assert_loads(path, built, built.latest, f"a head torn at byte {cut}")
                self.assertIn("head-invalid", [f.code for f in store.findings])
                store.commit([["set", ["effects", "after"], {"n": 1}]])
                self.assertEqual([f.code for f in file_store.check(path).findings if f.level != "note"], [])

    def test_missing_head_is_reported_and_recreated(self) -> None:
        built = self.built("headless", 4)
        path = self.copy_with(built, "headless-copy", head__json=None)
        store = self.assert_loads(path, built, built.latest, "no head")
        self.assertIn("head-missing", [f.code for f in store.findings])
        self.assertEqual(file_store.check(path).state, built.states[built.latest])
        store.repair()
        self.assertTrue(os.path.isfile(os.path.join(path, HEAD)))
        self.assertEqual([f.code for f in file_store.check(path).findings if f.level != "note"], [])

    def test_head_of_another_run_with_the_same_task_id_is_ignored(self) -> None:
        built = self.built("mine", 5)
        other = RunStore.create(os.path.join(self.tmp, "theirs"), _util.TASK_ID, {}, clock=lambda: _util.CLOCK_START + 7200, durability="process")
        for n in range(9):
            other.commit([["set", ["effects", f"o{n}"], {"n": n}]])
        other.fs.close()  # type: ignore[attr-defined]
        self.assertNotEqual(built.states[0]["created_at"], other.state["created_at"])
        path = self.copy_with(built, "foreign-head", head__json=run_files(other.path)[HEAD])
        store = self.assert_loads(path, built, built.latest, "a head sealed for another run")
        self.assertIn("head-invalid", [f.code for f in store.findings])

    def test_journal_missing_in_the_compaction_window(self) -> None:
        # Between moving the journal to journal.prev.jsonl and creating the
        # next one, a compaction leaves no journal; the previous journal ends
        # at the snapshot, and nothing is lost.
        built = self.built("window", 5, compact_after=(2,))
        path = self.copy_with(built, "window-copy")
        store = RunStore.open(path, durability="process")
        store.compact()
        store.fs.close()  # type: ignore[attr-defined]
        self.assertEqual(os.path.getsize(os.path.join(path, JOURNAL)), 0)
        os.unlink(os.path.join(path, JOURNAL))  # undo step 4, the creation of the next journal
        again = self.assert_loads(path, built, built.latest, "no journal after step 3 of a compaction")
        self.assertEqual([f.code for f in again.findings if f.level != "note"], [])
        again.commit([["set", ["effects", "next"], {"n": 1}]])
        self.assertEqual(RunStore.open(path, durability="process").revision, built.latest + 1)

    def test_a_folder_of_an_older_version_without_a_head_loads(self) -> None:
        built = self.built("old-format", 4)
        path = self.copy_with(built, "old-format-copy", head__json=None)
        self.assert_loads(path, built, built.latest, "no head.json at all")

    def head_at(self, built: _util.BuiltRun, rev: int) -> bytes:
        return file_store.encode_head(built.states[rev])


class WhatTheWitnessCannotSee(WitnessCase):
    """A whole run folder restored from an older copy is a consistent past: it loads, as documented."""

    def test_a_whole_folder_rolled_back_loads_its_older_revision(self) -> None:
        built = self.built("rollback", 8, compact_after=(3,))
        older = built.history[5]
        path = os.path.join(self.tmp, "rolled-back")
        os.mkdir(path, 0o700)
        for name, data in older.items():
            _util.write_file(os.path.join(path, name), data)
        head = run_files(built.path)[HEAD]
        _util.write_file(os.path.join(path, HEAD), self.head_of(built, 5))
        store = self.assert_loads(path, built, 5, "every file from revision 5")
        self.assertEqual([f.code for f in store.findings if f.level != "note"], [])
        # Only a witness outside the folder tells: here, the head kept from the latest copy.
        _util.write_file(os.path.join(path, HEAD), head)
        with self.assertRaises(StateUnrecoverable):
            RunStore.open(path, durability="process")

    def head_of(self, built: _util.BuiltRun, rev: int) -> bytes:
        return file_store.encode_head(built.states[rev])


class IdentityVersion(WitnessCase):
    """A run.json whose schema version was changed (one flipped digit still parses) is damage, even where the snapshot serves the load."""

    def test_schema_version_digit_flipped(self) -> None:
        built = self.built("identity", 4, compact_after=(2,))
        data = built.files["run.json"]
        at = data.index(b'"schema_version":1') + len(b'"schema_version":')
        self.assert_quarantined(self.copy_with(built, "identity-flipped", run__json=data[:at] + b"3" + data[at + 1 :]), "schema_version 1 -> 3")


class HooksFileIsNotDamage(WitnessCase):
    """A harness's ``hooks.json`` counter file in the run folder is neither state nor damage."""

    def test_load_and_doctor_ignore_it(self) -> None:
        built = self.built("hooks", 3)
        path = self.copy_with(built, "with-hooks", hooks__json=json.dumps({"store:after-append-fsync": 2}).encode())
        self.assert_loads(path, built, built.latest, "hooks.json beside the run")
        self.assertEqual([f for f in file_store.check(path).findings if f.level != "note"], [])
        self.assertEqual(scan(path).state, built.states[built.latest])

    def test_init_beside_it(self) -> None:
        folder = os.path.join(self.tmp, "hooks-first")
        os.mkdir(folder, 0o700)
        _util.write_file(os.path.join(folder, "hooks.json"), b'{"init": 1}\n')
        store = RunStore.create(folder, _util.TASK_ID, {}, durability="process")
        store.fs.close()  # type: ignore[attr-defined]
        self.assertEqual(RunStore.open(folder, durability="process").revision, 0)


class _ReadsRecorded(OsFileSystem):
    """The real file system, with the name of each file read, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: List[str] = []

    def read(self, path: str) -> bytes:
        self.reads.append(os.path.basename(path))
        return super().read(path)


class ReadingOrder(WitnessCase):
    """A look reads the identity, then the head, then the journals, then a base: the head never after the journal."""

    def test_the_head_is_read_before_the_journals_and_the_snapshot_last(self) -> None:
        built = self.built("ordered", 6, compact_after=(3,))
        quick = ["run.json", HEAD, "journal.prev.jsonl", JOURNAL, "snapshot.json"]
        for thorough, reads in ((False, quick), (True, quick + ["backup.json"])):
            with self.subTest(thorough=thorough):
                fs = _ReadsRecorded()
                self.addCleanup(fs.close)
                seen = scan(built.path, fs, thorough=thorough)
                self.assertEqual((seen.base, seen.state), ("snapshot.json", built.states[6]))
                self.assertEqual(fs.reads, reads)

    def test_a_look_that_ends_at_the_identity_reads_nothing_after_it(self) -> None:
        path = self.copy_with(self.built("unreadable", 3), "unreadable-copy", run__json=b"{")
        fs = _ReadsRecorded()
        self.addCleanup(fs.close)
        seen = scan(path, fs, thorough=True)  # one look: a quick one that ends without a snapshot is made again
        self.assertEqual(([f.code for f in seen.findings], seen.state), (["identity"], None))
        self.assertEqual(fs.reads, ["run.json"])


if __name__ == "__main__":
    unittest.main()
