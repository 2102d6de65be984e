"""Crash claims of the run store, proved by killing a real child process.

A child process runs the store with hooks (``runner.proof.faults.KillAt``)
that send it SIGKILL at a chosen commit window of the write path. The child prints each revision
it is about to attempt (with the digest of the effects it expects) and
acknowledges a revision only after the store call returned. Another process
then loads the run and must find a revision between the last acknowledged
and the last attempted one, with exactly the effects computed for it.

The child program is ``tests/support/scripts/crash_child.py``.
"""

import json
import os
import signal
import sys
import unittest
from typing import Any, Callable, Dict, List, Sequence, Tuple

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

CHILD = os.path.join(_util.SCRIPTS, "crash_child.py")


class Transcript:
    """What a child printed: digests by revision; heads and compactions of acknowledged revisions; operations done."""

    def __init__(self) -> None:
        self.digests: Dict[int, str] = {}
        self.heads: Dict[int, str] = {}
        self.compacted: Dict[int, bool] = {}
        self.acked = -1
        self.attempted = -1
        self.ops: List[Tuple[str, str]] = []
        self.finished = False

    def feed(self, text: str) -> None:
        for line in text.splitlines():
            word, *rest = line.split()
            if word == "attempt":
                rev = int(rest[0])
                self.digests[rev] = rest[1]
                self.attempted = max(self.attempted, rev)
            elif word == "ack":
                rev = int(rest[0])
                if rev in self.digests and self.digests[rev] != rest[1]:
                    raise AssertionError(f"revision {rev} was acknowledged with other effects than attempted")
                self.digests[rev] = rest[1]
                self.heads[rev] = rest[2]
                self.compacted[rev] = rest[3:4] == ["compacted"]
                self.acked = max(self.acked, rev)
                self.attempted = max(self.attempted, rev)
            elif word == "op":
                self.ops.append((rest[1], rest[2]))
            elif word == "finished":
                self.finished = True
            else:
                raise AssertionError(f"unexpected child output {line!r}")


KILLED = [0]


def run_child(run_dir: str, contract: str, args: Sequence[str]) -> _util.Result:
    result = _util.run(_util.python(CHILD, "--child", "--dir", run_dir, "--contract", contract, *args))
    if result.code == -signal.SIGKILL:
        KILLED[0] += 1
    return result


def run_verifier(*args: str) -> Dict[str, Dict[str, Any]]:
    """Load run folders in a fresh process; its report for each folder."""
    result = _util.run(_util.python(CHILD, "--verify", *args))
    if result.code != 0:
        raise AssertionError(f"the verifier failed: {result.err[-3000:]}")
    reports = [json.loads(line) for line in result.out.splitlines()]
    return {report["dir"]: report for report in reports}


class Scenario:
    """One crash: the child runs (each killed at its point) and what loading must find."""

    def __init__(self, runs: Sequence[Sequence[str]], expect: str) -> None:
        self.runs = [list(run) for run in runs]
        self.expect = expect  # "acked": the killed transition is gone; "attempted": it is durable
        self.results: List[_util.Result] = []
        self.transcript = Transcript()
        self.report: Dict[str, Any] = {}


def commit_kill(window: str, occurrence: int = 1, *more: str) -> List[str]:
    return ["--phase", "commit", "--window", window, "--occurrence", str(occurrence), *more]


class KillDuringWrites(unittest.TestCase):
    """A kill at any point of a transition or a compaction leaves a run that loads exactly.

    The loaded revision is at least the last acknowledged one and at most the
    last attempted one, with the effects the child computed for it; a torn
    line is dropped and reported; and the run continues: the next write
    performs any repair and leaves the folder healthy, its history (the
    segments compaction copies into the history folder, then the journals)
    holding every record from revision 1. Compaction runs often
    (``compact_min_bytes`` is 1): counting from a fresh run, commit 1
    compacts and commit 8 does not, and there are at least nine compactions
    in the first thirteen commits (checked by ``test_compaction_pattern``).
    """

    SCENARIOS: Dict[str, Scenario] = {}
    pattern: "Transcript"

    @classmethod
    def scenarios(cls) -> Dict[str, Scenario]:
        s: Dict[str, Scenario] = {}
        for occurrence in (1, 9):
            s[f"before-temp-write-{occurrence}"] = Scenario([commit_kill("store:before-compaction", occurrence)], "attempted")
        s["after-temp-write-2"] = Scenario([commit_kill("store:after-temp-write", 2)], "attempted")
        for occurrence in (1, 8):
            s[f"after-temp-fsync-{occurrence}"] = Scenario([commit_kill("store:after-temp-fsync", occurrence)], "attempted")
        for occurrence in (3,):
            s[f"after-snapshot-to-backup-{occurrence}"] = Scenario([commit_kill("store:after-backup-rename", occurrence)], "attempted")
        s["before-temp-to-snapshot-2"] = Scenario([commit_kill("store:after-backup-fsync", 2)], "attempted")
        for occurrence in (1, 5):
            s[f"after-temp-to-snapshot-{occurrence}"] = Scenario([commit_kill("store:after-rename", occurrence)], "attempted")
        s["archive-after-history-mkdir-1"] = Scenario([commit_kill("store:after-history-mkdir", 1)], "attempted")
        for occurrence in (1, 4):
            kill = commit_kill("store:after-archive-write", occurrence)
            s[f"archive-after-write-{occurrence}"] = Scenario([kill], "attempted")
        s["archive-after-fsync-2"] = Scenario([commit_kill("store:after-archive-fsync", 2)], "attempted")
        for occurrence in (1, 3):
            kill = commit_kill("store:after-archive-rename", occurrence)
            s[f"archive-after-rename-{occurrence}"] = Scenario([kill], "attempted")
        s["archive-after-rename-fsync-2"] = Scenario([commit_kill("store:after-archive-rename-fsync", 2)], "attempted")
        s["after-journal-to-prev-2"] = Scenario([commit_kill("store:after-journal-rename", 2)], "attempted")
        s["after-new-journal-3"] = Scenario([commit_kill("store:after-journal-create", 3)], "attempted")
        for occurrence in (1, 8):
            s[f"mid-append-{occurrence}"] = Scenario([commit_kill("store:before-append", occurrence, "--tear")], "acked")
        for occurrence in (1, 8):
            s[f"after-append-fsync-{occurrence}"] = Scenario([commit_kill("store:after-append-fsync", occurrence)], "attempted")
        torn = commit_kill("store:before-append", 8, "--tear")
        s["torn-then-after-truncate"] = Scenario([torn, commit_kill("store:after-truncate", 1, "--open")], "acked")
        s["torn-then-after-repairing-append"] = Scenario([torn, commit_kill("store:after-append-fsync", 1, "--open")], "attempted")
        return s

    @classmethod
    def setUpClass(cls) -> None:
        tmp = _util.scratch_dir()
        cls.addClassCleanup(tmp.cleanup)
        contract = _util.write_contract(os.path.join(tmp.name, "contract.md"))
        cls.SCENARIOS = cls.scenarios()
        dirs = {name: os.path.join(tmp.name, name) for name in cls.SCENARIOS}

        def job(name: str) -> Callable[[], None]:
            def go() -> None:
                scenario = cls.SCENARIOS[name]
                for args in scenario.runs:
                    result = run_child(dirs[name], contract, args)
                    scenario.results.append(result)
                    scenario.transcript.feed(result.out)
                    if result.code != -signal.SIGKILL:
                        return
            return go

        def pattern() -> None:
            cls.pattern = transcript_of(run_child(os.path.join(tmp.name, "no-kill"), contract, ["--phase", "commit"]))

        _util.in_parallel([job(name) for name in cls.SCENARIOS] + [pattern])
        reports = run_verifier(*[dirs[name] for name in cls.SCENARIOS if all(r.code == -signal.SIGKILL for r in cls.SCENARIOS[name].results)])
        for name, scenario in cls.SCENARIOS.items():
            scenario.report = reports.get(dirs[name], {})

    def check(self, name: str) -> Dict[str, Any]:
        scenario = self.SCENARIOS[name]
        for result in scenario.results:
            self.assertEqual(result.code, -signal.SIGKILL, f"{name}: the child was not killed: {result.err[-2000:]}")
            self.assertNotIn("Traceback", result.err)
        transcript, report = scenario.transcript, scenario.report
        self.assertFalse(transcript.finished)
        self.assertGreater(transcript.attempted, transcript.acked, f"{name}: the kill came outside a transition")
        self.assertNotIn("error", report, report.get("error"))
        rev = report["revision"]
        self.assertEqual(report["status_code"], 0)
        self.assertEqual(report["status"]["revision"], rev)
        self.assertGreaterEqual(rev, transcript.acked, f"{name}: an acknowledged revision was lost")
        self.assertLessEqual(rev, transcript.attempted, f"{name}: the run is ahead of anything attempted")
        self.assertEqual(report["digest"], transcript.digests[rev], f"{name}: revision {rev} holds other effects than the child computed")
        if rev in transcript.heads:
            self.assertEqual(report["head"], transcript.heads[rev])
        self.assertEqual(rev, transcript.acked if scenario.expect == "acked" else transcript.attempted)
        self.assertEqual(report["next_revision"], rev + 1, f"{name}: the run does not continue after the crash")
        self.assertEqual(report["next_digest"], report["expected_next"])
        self.assertEqual(report["after"], [], f"{name}: the first write after the crash left problems behind")
        history = report["history"]
        self.assertEqual((history["whole"], history["oldest"], history["findings"]), (True, 1, []),
                         f"{name}: the history lost records: {history}")
        return report

    def check_all(self, prefix: str) -> List[Dict[str, Any]]:
        names = [name for name in self.SCENARIOS if name.startswith(prefix)]
        self.assertTrue(names)
        reports = []
        for name in names:
            with self.subTest(scenario=name):
                reports.append(self.check(name))
        return reports

    def test_compaction_pattern(self) -> None:
        compacted = self.pattern.compacted
        self.assertTrue(self.pattern.finished)
        self.assertTrue(compacted[1])
        self.assertFalse(compacted[8])
        self.assertGreaterEqual(sum(compacted[rev] for rev in range(1, 14)), 9)

    # -- compaction ---------------------------------------------------------------
    def test_before_snapshot_temp_write(self) -> None:
        self.check_all("before-temp-write-")

    def test_after_snapshot_temp_write_before_its_fsync(self) -> None:
        self.check_all("after-temp-write-")

    def test_after_snapshot_temp_fsync(self) -> None:
        self.check_all("after-temp-fsync-")

    def test_after_snapshot_moved_to_backup(self) -> None:
        self.check_all("after-snapshot-to-backup-")

    def test_after_backup_rename_is_durable_before_the_new_snapshot(self) -> None:
        report = self.check("before-temp-to-snapshot-2")
        self.assertIn("snapshot-missing", report["findings"])

    def test_after_rename_over_snapshot_before_directory_fsync(self) -> None:
        self.check_all("after-temp-to-snapshot-")

    # -- the copy of the previous journal into the history folder ---------------------
    def test_a_kill_while_copying_the_previous_journal_loses_no_record(self) -> None:
        for report in self.check_all("archive-"):
            self.assertEqual([f for f in report["findings"] if f != "stray-temp"], [])

    def test_after_journal_moved_to_previous_journal(self) -> None:
        report = self.check("after-journal-to-prev-2")
        self.assertEqual(report["findings"], [])

    def test_after_new_journal_created(self) -> None:
        self.check("after-new-journal-3")

    # -- the append -----------------------------------------------------------------
    def test_mid_append(self) -> None:
        for report in self.check_all("mid-append-"):
            self.assertIn("torn-record", report["findings"])

    def test_after_append_fsync_before_return(self) -> None:
        self.check_all("after-append-fsync-")

    # -- the repair of a torn record --------------------------------------------------
    def test_second_kill_after_truncating_the_torn_record(self) -> None:
        self.check("torn-then-after-truncate")

    def test_second_kill_after_the_repairing_append(self) -> None:
        self.check("torn-then-after-repairing-append")


class KillDuringInit(unittest.TestCase):
    """An init killed before run.json is in place leaves no run and a fresh init succeeds; once run.json is renamed in, the run exists at revision 0.

    Init passes one store window after each of its durable operations. The
    child is killed at the 1st, 2nd, ... window of init (after that many
    operations) until one child completes; every killed folder is then
    examined in one other process through the command line (status, init
    when there is no run, doctor).
    """

    @classmethod
    def setUpClass(cls) -> None:
        tmp = _util.scratch_dir()
        cls.addClassCleanup(tmp.cleanup)
        cls.contract = _util.write_contract(os.path.join(tmp.name, "contract.md"))
        cls.results: Dict[int, _util.Result] = {}
        batch = 14
        start = 1
        while not any(transcript_of(r).finished for r in cls.results.values()) and start < 64:
            indexes = list(range(start, start + batch))
            outcomes = _util.in_parallel(
                [lambda i=i: run_child(os.path.join(tmp.name, f"init-{i}"), cls.contract, ["--phase", "init", "--index", str(i)]) for i in indexes]
            )
            cls.results.update(zip(indexes, outcomes))
            start += batch
        finished = [i for i, r in cls.results.items() if transcript_of(r).finished]
        cls.steps = min(finished) if finished else -1
        cls.killed_dirs = {i: os.path.join(tmp.name, f"init-{i}") for i in range(1, max(cls.steps, 0))}
        cls.reports = run_verifier("--init", cls.contract, *cls.killed_dirs.values()) if cls.steps > 0 else {}

    def test_init_has_durable_steps(self) -> None:
        self.assertGreaterEqual(len(self.killed_dirs), 8, "init passed fewer windows than its write path has durable steps")
        for index, result in self.results.items():
            if index >= self.steps:
                self.assertEqual(result.code, 0, result.err)

    def test_every_durable_step(self) -> None:
        self.assertTrue(self.killed_dirs)
        for index, path in self.killed_dirs.items():
            result = self.results[index]
            transcript = transcript_of(result)
            with self.subTest(index=index, last=transcript.ops[-1] if transcript.ops else None):
                self.assertEqual(result.code, -signal.SIGKILL, result.err)
                self.assertEqual(len(transcript.ops), index)
                report = self.reports[path]
                self.assertNotIn("error", report, report.get("error"))
                if ("store:after-rename", "run.json") in transcript.ops:
                    self.assertEqual(report["status_code"], 0, report.get("status_err"))
                    self.assertEqual(report["status"]["revision"], 0)
                else:
                    self.assertEqual(report["status_code"], 2)
                    self.assertIn("no run", report["status"]["message"])
                    self.assertEqual(report["init_code"], 0, report.get("init_err"))
                    self.assertEqual(report["init"]["revision"], 0)
                    self.assertEqual(report["status_code_after"], 0)
                    self.assertEqual(report["status_after"]["revision"], 0)
                self.assertEqual(report["doctor_code"], 0)
                self.assertTrue(report["doctor"]["healthy"], report["doctor"])


def transcript_of(result: _util.Result) -> Transcript:
    transcript = Transcript()
    transcript.feed(result.out)
    return transcript


def tearDownModule() -> None:
    if KILLED[0]:
        sys.stderr.write(f"\ntest_store_crash: {KILLED[0]} child processes killed with SIGKILL\n")


if __name__ == "__main__":
    unittest.main()
