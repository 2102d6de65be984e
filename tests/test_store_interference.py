"""The file store under interference from outside it: its files removed, replaced or linked, a full or read-only disk, racing processes.

A lock file "cleaned" while writers run, a disk that fills mid-write, doctor
during constant compaction, a repeated journal line, a file in the way of
the quarantine, racing inits, a read-only file system, a backup from another
run and a symbolically linked folder: each leaves the run either correct or
refused with one line and its exit code, never half-written. Concurrency
claims use several real processes; a full disk is a real tmpfs where the test
may mount one, and a file system that runs out of space on cue everywhere.
"""

import contextlib
import errno
import os
import stat
import subprocess
import time
import unittest
from typing import Any, Dict, Iterator, List, Optional, Tuple

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

from runner.base.fs import FileSystem, OsFileSystem
from runner.stores.file import RunStore, check, scan
from tests.test_authority import CliServer

#: A writer that enters a transaction, says so, and waits for a line on stdin before it commits.
HOLDER = (
    "import sys\n"
    "from runner.stores.file import RunStore\n"
    "store = RunStore.open(sys.argv[1])\n"
    "def decide(state):\n"
    "    print('holding', state['revision'], flush=True)\n"
    "    sys.stdin.readline()\n"
    "    return [['set', ['effects', 'holder'], {'n': state['revision'] + 1}]]\n"
    "store.transact(decide)\n"
    "print('committed', store.revision, flush=True)\n"
)

#: A writer that says it started, then opens the run and commits once.
WRITER = (
    "import sys\n"
    "from runner.stores.file import RunStore\n"
    "print('started', flush=True)\n"
    "store = RunStore.open(sys.argv[1])\n"
    "store.commit([['set', ['effects', 'writer'], {'n': 1}]])\n"
    "print('committed', store.revision, flush=True)\n"
)

#: A writer that adds one to a counter ``argv[2]`` times, each a read-modify-write transaction
#: followed by a compaction, so that writers keep finding the journal renamed under them.
COUNTER = (
    "import sys\n"
    "from runner.stores.file import RunStore\n"
    "store = RunStore.open(sys.argv[1], compact_min_bytes=1)\n"
    "def bump(state):\n"
    "    n = state['effects'].get('counter', {'n': 0})['n']\n"
    "    return [['set', ['effects', 'counter'], {'n': n + 1}]]\n"
    "for _ in range(int(sys.argv[2])):\n"
    "    store.transact(bump)\n"
    "print('done', store.revision, flush=True)\n"
)

#: A writer that compacts on every commit until ``argv[2]`` exists.
COMPACTOR = (
    "import os, sys\n"
    "from runner.stores.file import RunStore\n"
    "store = RunStore.open(sys.argv[1], compact_min_bytes=1, durability='process')\n"
    "print('writing', flush=True)\n"
    "n = 0\n"
    "while not os.path.exists(sys.argv[2]):\n"
    "    n += 1\n"
    "    store.commit([['set', ['observations', 'store', 'pad'], 'y' * (2000 + n % 7)]])\n"
    "print('stopped', n, flush=True)\n"
)


def start(code: str, *args: str, stdin: bool = False) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        _util.python("-c", code, *args), cwd=_util.REPO_ROOT, env=_util.child_env(), text=True,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


class Case(unittest.TestCase):
    def setUp(self) -> None:
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        self.contract = _util.write_contract(os.path.join(self.tmp, "contract.md"))

    def path(self, *parts: str) -> str:
        return os.path.join(self.tmp, *parts)

    def fresh_run(self, name: str, transitions: int = 3, **options: Any) -> _util.BuiltRun:
        return _util.build_run(self.path(name), transitions, plan={}, **options)

    def open(self, path: str, **options: Any) -> RunStore:
        store = RunStore.open(path, **options)
        self.addCleanup(store.fs.close)  # type: ignore[attr-defined]
        return store

    def reap(self, proc: "subprocess.Popen[str]", timeout: float = 60) -> Tuple[int, str, str]:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err


class LockSurvivesRemovingAFile(Case):
    """Someone "cleaning a stale lock" while writers run cannot let two of them in at once."""

    def test_a_second_writer_waits_for_the_holder_whatever_is_removed(self) -> None:
        run = self.fresh_run("held").path
        holder = start(HOLDER, run, stdin=True)
        self.addCleanup(holder.kill)
        line = holder.stdout.readline().split()  # type: ignore[union-attr]
        self.assertEqual(line[0], "holding", holder.stderr.read() if not line else line)  # type: ignore[union-attr]
        held_at = int(line[1])
        for name in ("lock",):  # what an operator would delete as stale, had the store left one
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(run, name))
        writer = start(WRITER, run)
        self.addCleanup(writer.kill)
        self.assertEqual(writer.stdout.readline().strip(), "started")  # type: ignore[union-attr]
        with self.assertRaises(subprocess.TimeoutExpired, msg="the second writer committed while the first held the run"):
            writer.wait(timeout=2)
        holder.stdin.write("\n")  # type: ignore[union-attr]
        holder.stdin.flush()  # type: ignore[union-attr]
        code, out, err = self.reap(holder)
        self.assertEqual((code, out.split()), (0, ["committed", str(held_at + 1)]), err)
        code, out, err = self.reap(writer)
        self.assertEqual((code, out.split()), (0, ["committed", str(held_at + 2)]), err)
        store = self.open(run)
        self.assertEqual(store.revision, held_at + 2)
        self.assertEqual(set(store.state["effects"]) >= {"holder", "writer"}, True)
        self.assertEqual(_util.quarantine_folders(run), [])

    def test_four_writers_and_a_lock_cleaner_lose_no_increment(self) -> None:
        run = self.fresh_run("counted", 0).path
        writers = [start(COUNTER, run, "15") for _ in range(4)]
        for proc in writers:
            self.addCleanup(proc.kill)
        cleaned = 0
        while any(proc.poll() is None for proc in writers):
            for name in ("lock",):
                with open(os.path.join(run, name), "wb"):
                    pass  # a lock file appears ...
                os.unlink(os.path.join(run, name))  # ... and is cleaned away, as a careless operator would
                cleaned += 1
        for proc in writers:
            code, out, err = self.reap(proc)
            self.assertEqual(code, 0, err)
        self.assertGreater(cleaned, 0)
        store = self.open(run)
        self.assertEqual(store.revision, 60)
        self.assertEqual(store.state["effects"]["counter"]["n"], 60, "an increment was lost: two writers ran at once")
        self.assertEqual(_util.quarantine_folders(run), [])


class ThreadsShareOneStore(Case):
    """One store object used from several threads: each transaction is one thread's, none is lost."""

    def test_four_threads_on_one_store_lose_no_increment(self) -> None:
        import threading

        store = self.open(self.fresh_run("threads", 0).path)
        start = threading.Barrier(4)

        def increment(state: Dict[str, Any]) -> List[Any]:
            n = (state["effects"].get("counter") or {}).get("n", 0)
            return [["set", ["effects", "counter"], {"n": n + 1}]]

        def worker() -> None:
            start.wait()
            for _ in range(25):
                store.transact(increment)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        self.assertEqual((store.revision, store.state["effects"]["counter"]["n"]), (100, 100))
        again = self.open(store.path)
        self.assertEqual((again.revision, again.state["effects"]["counter"]["n"]), (100, 100), "the journal holds every record, in order")
        self.assertEqual([f.level for f in check(store.path).findings if f.level != "note"], [])


class NoSpaceLeft(OsFileSystem):
    """The real file system, out of space on cue: writes of ``full`` kinds put half their bytes down and fail."""

    def __init__(self) -> None:
        super().__init__()
        self.full: Tuple[str, ...] = ()

    def _enospc(self, path: str) -> OSError:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    def write_file(self, path: str, data: bytes) -> None:
        if "write_file" in self.full:
            super().write_file(path, data[: len(data) // 2])
            raise self._enospc(path)
        super().write_file(path, data)

    def append(self, path: str, data: bytes) -> None:
        if "append" in self.full:
            super().append(path, data[: len(data) // 2])
            raise self._enospc(path)
        super().append(path, data)


class FullDisk(Case):
    """A transition either commits and reports success, or commits nothing."""

    def test_a_compaction_that_finds_no_space_does_not_fail_the_committed_transition(self) -> None:
        run = self.fresh_run("full", 3).path
        fs = NoSpaceLeft()
        store = RunStore.open(run, fs=fs, compact_min_bytes=1)  # every commit compacts
        self.addCleanup(fs.close)
        before = store.revision
        fs.full = ("write_file",)
        state = store.commit([["set", ["counters", "cost", "money"], 1.0]])  # returns: committed
        self.assertEqual(state["revision"], before + 1)
        self.assertIn("upkeep-failed", [f.code for f in store.findings])
        self.assertFalse(any(name.endswith(".tmp") for name in os.listdir(run)), "the half-written snapshot was left behind")
        again = self.open(run)
        self.assertEqual(again.revision, before + 1)
        self.assertEqual(again.state["counters"]["cost"]["money"], 1.0)
        self.assertEqual([f.code for f in again.findings if f.level != "note"], [])
        fs.full = ()
        store.commit([["set", ["effects", "later"], {"n": 1}]])  # space is back: the due compaction happens
        self.assertEqual(scan(run).base, "snapshot.json")
        self.assertEqual(self.open(run).revision, before + 2)

    def test_an_append_that_finds_no_space_commits_nothing(self) -> None:
        run = self.fresh_run("full-append", 3).path
        fs = NoSpaceLeft()
        store = RunStore.open(run, fs=fs)
        self.addCleanup(fs.close)
        with open(os.path.join(run, "journal.jsonl"), "rb") as handle:
            journal = handle.read()
        fs.full = ("append",)
        with self.assertRaises(OSError):
            store.commit([["set", ["counters", "cost", "money"], 1.0]])
        with open(os.path.join(run, "journal.jsonl"), "rb") as handle:
            self.assertEqual(handle.read(), journal, "half a record was left for the next reader")
        again = self.open(run)
        self.assertEqual(again.revision, 3)
        self.assertEqual([f.code for f in again.findings if f.level != "note"], [])
        fs.full = ()
        self.assertEqual(store.commit([["set", ["effects", "later"], {"n": 1}]])["revision"], 4)

    def test_cost_on_a_full_tmpfs_counts_once_and_exits_0(self) -> None:
        mount = self.path("mnt")
        os.mkdir(mount)
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            self.skipTest("mounting a small tmpfs needs root")
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", mount], capture_output=True)
        if mounted.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
        self.addCleanup(subprocess.run, ["umount", mount], capture_output=True)
        run = os.path.join(mount, "run")
        env = _util.child_env(RUNNER_OWNER="w1", RUNNER_EPOCH="1")
        self.assertEqual(_util.run_cli("--dir", run, "init", "--contract", self.contract).code, 0)
        self.assertEqual(_util.run_cli("--dir", run, "lease", "acquire", "--owner", "w1", "--ttl", "600").code, 0)
        store = RunStore.open(run)
        threshold = 256 * 1024  # the store's compaction threshold while the snapshot is small
        while threshold - os.path.getsize(os.path.join(run, "journal.jsonl")) >= 2500:  # end just under it
            room = threshold - os.path.getsize(os.path.join(run, "journal.jsonl"))
            store.commit([["set", ["observations", "store", f"pad{store.revision}"], "q" * min(40_000, room - 600)]])
        self.assertEqual(scan(run).base, "snapshot.json")
        self.assertFalse(os.path.exists(os.path.join(run, "backup.json")), "a compaction happened while filling")
        store.fs.close()  # type: ignore[attr-defined]
        filler = os.path.join(mount, "filler")
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
        os.truncate(filler, os.path.getsize(filler) - 16 * 1024)  # about 16 KB left: the record fits, a snapshot does not
        revision = self.open(run).revision
        cost = _util.run_cli("--dir", run, "cost", "--add", "money=1", env=env)
        after = self.open(run)
        self.assertFalse(os.path.exists(os.path.join(run, "backup.json")), "the compaction found room after all")
        # The append fits, so the transition commits, and the call says so.
        self.assertEqual(after.revision, revision + 1)
        self.assertEqual(after.state["counters"]["cost"]["money"], 1.0)
        self.assertEqual(cost.code, 0, f"the transition committed but the call failed: {cost.err}")


class DoctorReadsUnderTheLock(Case):
    """Doctor on a healthy run that a writer compacts all the time is always healthy, never a traceback."""

    def test_doctor_while_a_writer_compacts(self) -> None:
        run = self.fresh_run("busy", 2).path
        stop = self.path("stop")
        writer = start(COMPACTOR, run, stop)
        self.addCleanup(writer.kill)
        self.assertEqual(writer.stdout.readline().strip(), "writing")  # type: ignore[union-attr]
        results = []
        try:
            for n in range(40):
                args = ["--dir", run, "--json", "doctor"] + (["--repair"] if n % 4 == 3 else [])
                results.append(_util.in_process_cli(args))
        finally:
            _util.write_file(stop, b"")
        code, out, err = self.reap(writer)
        self.assertEqual(code, 0, err)
        self.assertGreater(int(out.split()[-1]), 10, "the writer barely wrote: the check did not overlap compactions")
        for n, result in enumerate(results):
            self.assertEqual(result.code, 0, f"doctor run {n}: {result.err}")
            self.assertNotIn("Traceback", result.err)
            report = _util.one_json(result)
            self.assertTrue(report["healthy"], f"doctor run {n}: {report['findings']}")


class PreviousJournalRepeatedLine(Case):
    """A repeated last line in journal.prev.jsonl gets one verdict: repairable, and --repair repairs it."""

    def test_one_verdict_and_a_repair(self) -> None:
        built = self.fresh_run("dup", 8, compact_after=(2, 6))
        prev = os.path.join(built.path, "journal.prev.jsonl")
        data = built.files["journal.prev.jsonl"]
        self.assertGreaterEqual(len(_util.journal_records(data)), 2)
        _util.write_file(prev, data + data[data[:-1].rfind(b"\n") + 1 :])
        status = _util.in_process_cli(["--dir", built.path, "--json", "status"])
        self.assertEqual(status.code, 0, status.err)
        self.assertEqual(_util.one_json(status)["revision"], 8)
        doctor = _util.in_process_cli(["--dir", built.path, "--json", "doctor"])
        self.assertEqual(doctor.code, 0, doctor.err)
        report = _util.one_json(doctor)
        self.assertFalse(report["healthy"])
        self.assertIn("prev-journal", [f["code"] for f in report["findings"] if f["level"] == "repairable"])
        repair = _util.in_process_cli(["--dir", built.path, "--json", "doctor", "--repair"])
        self.assertEqual(repair.code, 0, repair.err)
        repaired = _util.one_json(repair)
        self.assertIn("prev-journal", [r["code"] for r in repaired["repaired"]])
        self.assertTrue(repaired["healthy"], repaired["findings"])
        store = self.open(built.path)
        self.assertEqual(store.revision, 9)
        for key in ("effects", "steps", "lease"):
            self.assertEqual(store.state[key], built.states[8][key])
        folders = _util.quarantine_folders(built.path)
        self.assertEqual(len(folders), 1)
        with open(os.path.join(folders[0], "journal.prev.jsonl"), "rb") as handle:
            self.assertEqual(handle.read(), data + data[data[:-1].rfind(b"\n") + 1 :])


class QuarantineInTheWay(Case):
    """A file or a symbolic link named quarantine neither blocks the quarantine nor carries state out of the run."""

    def damaged(self, name: str) -> str:
        built = self.fresh_run(name, 3)
        with open(os.path.join(built.path, "journal.jsonl"), "r+b") as handle:
            handle.seek(20)
            handle.write(b"X")
        return built.path

    def test_a_regular_file(self) -> None:
        run = self.damaged("file-in-the-way")
        _util.write_file(os.path.join(run, "quarantine"), b"junk\n")
        result = _util.run_cli("--dir", run, "status")
        self.assertEqual(result.code, 7, result.err)
        folders = _util.quarantine_folders(run)
        self.assertEqual(len(folders), 1)
        moved = _util.read_flat(folders[0])
        self.assertEqual(moved.pop("quarantine"), b"junk\n")
        self.assertLessEqual({"run.json", "journal.jsonl", "snapshot.json", "head.json", "REASON.txt"}, set(moved))

    def test_a_symbolic_link(self) -> None:
        run = self.damaged("link-in-the-way")
        elsewhere = self.path("elsewhere")
        os.mkdir(elsewhere)
        os.symlink(elsewhere, os.path.join(run, "quarantine"))
        result = _util.run_cli("--dir", run, "status")
        self.assertEqual(result.code, 7, result.err)
        self.assertEqual(os.listdir(elsewhere), [], "state was moved out of the run folder")
        self.assertFalse(os.path.islink(os.path.join(run, "quarantine")))
        folders = _util.quarantine_folders(run)
        self.assertEqual(len(folders), 1)
        self.assertTrue(os.path.islink(os.path.join(folders[0], "quarantine")))
        self.assertLessEqual({"run.json", "journal.jsonl", "snapshot.json"}, set(os.listdir(folders[0])))


class ConcurrentInit(Case):
    """Of inits racing into one new folder, one starts the run and the others are refused (exit 2), never an I/O error.

    The three contenders are long-lived processes (``tests.test_authority.CliServer``), each running one ``init``
    per round at the same wall-clock instant, so that six rounds cost three interpreter starts, not eighteen.
    """

    def test_rounds_of_three(self) -> None:
        servers = [CliServer() for _ in range(3)]
        for server in servers:
            self.addCleanup(server.close)
        for round_no in range(6):
            folder = self.path(f"race-{round_no}")
            start_at = time.time() + 0.01
            for server in servers:
                server.send(["--dir", folder, "init", "--contract", self.contract], start_at=start_at)
            outcomes = [server.receive() for server in servers]  # an exception escaping main fails here
            codes = sorted(result.code for result in outcomes)
            self.assertEqual(codes, [0, 2, 2], [result.err for result in outcomes])
            for result in outcomes:
                if result.code == 2:
                    self.assertIn("refusing to start a new run", result.err)
                    self.assertEqual(len(result.err.splitlines()), 1, result.err)
            self.assertEqual(self.open(folder).revision, 0)


class Seam(FileSystem):
    """Delegates every call to the real file system, recording listings and whether the lock was held."""

    def __init__(self) -> None:
        self.inner = OsFileSystem()
        self.held = 0
        self.listings: List[Tuple[str, int]] = []
        self.privatised: List[str] = []

    def listdir(self, path: str) -> List[str]:
        self.listings.append((path, self.held))
        return self.inner.listdir(path)

    def make_private(self, path: str) -> None:
        self.privatised.append(path)
        self.inner.make_private(path)

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        with self.inner.lock(path):
            self.held += 1
            try:
                yield
            finally:
                self.held -= 1

    def close(self) -> None:
        self.inner.close()


for _name in ("read", "read_from", "stat", "exists", "is_symlink", "mkdir", "write_file", "create_exclusive", "append", "overwrite",
              "fsync", "replace", "fsync_dir", "truncate", "unlink"):
    setattr(Seam, _name, lambda self, *args, _name=_name: getattr(self.inner, _name)(*args))


class LosesTheMkdirRace(Seam):
    """Another init makes the folder (and, with ``then``, finishes its run there) just before this one's mkdir."""

    def __init__(self, then: Optional[str] = None) -> None:
        super().__init__()
        self.then = then

    def mkdir(self, path: str) -> None:
        self.inner.mkdir(path)
        if self.then:
            RunStore.create(path, _util.TASK_ID, {"winner": True}, durability="process").fs.close()  # type: ignore[attr-defined]
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)


class InitRace(Case):
    """The window behind the race above, made certain: an init whose mkdir finds the folder made meanwhile."""

    def test_the_folder_appeared_empty(self) -> None:
        folder = self.path("appeared")
        fs = LosesTheMkdirRace()
        self.addCleanup(fs.close)
        store = RunStore.create(folder, _util.TASK_ID, {}, fs=fs)
        self.assertEqual(store.revision, 0)
        self.assertEqual(self.open(folder).state["plan"], {})

    def test_the_other_init_finished_first(self) -> None:
        folder = self.path("taken")
        fs = LosesTheMkdirRace(then="finish")
        self.addCleanup(fs.close)
        with self.assertRaises(Exception) as caught:
            RunStore.create(folder, _util.TASK_ID, {}, fs=fs)
        self.assertEqual(getattr(caught.exception, "exit_code", None), 2, caught.exception)
        self.assertIn("refusing to start a new run", str(caught.exception))
        self.assertEqual(self.open(folder).state["plan"], {"winner": True})


class ReadOnlyFileSystem(Case):
    """A run on a read-only file system can be read (status, doctor); a write fails with one line, exit 1."""

    def test_reads_work_read_only(self) -> None:
        mount = self.path("ro")
        os.mkdir(mount)
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            self.skipTest("mounting a read-only file system needs root")
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mount], capture_output=True)
        if mounted.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
        self.addCleanup(subprocess.run, ["umount", mount], capture_output=True)
        run = os.path.join(mount, "run")
        self.assertEqual(_util.run_cli("--dir", run, "init", "--contract", self.contract).code, 0)
        self.assertEqual(_util.run_cli("--dir", run, "lease", "acquire", "--owner", "w1", "--ttl", "600").code, 0)
        remount = subprocess.run(["mount", "-o", "remount,ro", mount], capture_output=True)
        if remount.returncode != 0:
            self.skipTest(f"cannot remount read-only: {remount.stderr.decode().strip()}")
        for verb in (["status"], ["doctor"], ["lease", "show"], ["brief"]):
            with self.subTest(verb=verb):
                result = _util.run_cli("--dir", run, *verb)
                self.assertEqual(result.code, 0, result.err)
        write = _util.run_cli("--dir", run, "cost", "--add", "money=1", env=_util.child_env(RUNNER_OWNER="w1", RUNNER_EPOCH="1"))
        self.assertEqual(write.code, 1, write.err)
        self.assertEqual(len(write.err.splitlines()), 1, write.err)
        self.assertNotIn("Traceback", write.err)


class ForeignBackup(Case):
    """Doctor flags a backup.json copied from another run with the same task id, and --repair sets it aside."""

    def test_same_task_id_other_run(self) -> None:
        mine = self.fresh_run("mine", 6, compact_after=(2, 4))
        theirs = RunStore.create(self.path("theirs"), _util.TASK_ID, {}, clock=lambda: _util.CLOCK_START + 3600, durability="process")
        for n in range(1, 7):
            theirs.commit(_util.transition_ops(n))
            if n in (2, 4):
                theirs.compact()
        theirs.fs.close()  # type: ignore[attr-defined]
        with open(self.path("theirs", "backup.json"), "rb") as handle:
            foreign = handle.read()
        _util.write_file(os.path.join(mine.path, "backup.json"), foreign)
        doctor = _util.in_process_cli(["--dir", mine.path, "--json", "doctor"])
        self.assertEqual(doctor.code, 0, doctor.err)
        report = _util.one_json(doctor)
        self.assertFalse(report["healthy"])
        self.assertIn("backup.json-invalid", [f["code"] for f in report["findings"]])
        repair = _util.in_process_cli(["--dir", mine.path, "--json", "doctor", "--repair"])
        self.assertEqual(repair.code, 0, repair.err)
        self.assertTrue(_util.one_json(repair)["healthy"])
        folders = _util.quarantine_folders(mine.path)
        self.assertEqual(len(folders), 1)
        with open(os.path.join(folders[0], "backup.json"), "rb") as handle:
            self.assertEqual(handle.read(), foreign)


class SymlinkedRunFolder(Case):
    """Every verb refuses a run folder that is a symbolic link, as init does, and changes nothing behind it."""

    def test_verbs_refuse_it(self) -> None:
        built = self.fresh_run("real", 3)
        link = self.path("link")
        os.symlink(built.path, link)
        before = _util.contents(built.path)
        env = _util.child_env(RUNNER_OWNER="w1", RUNNER_EPOCH="1")
        for verb in (["status"], ["doctor"], ["doctor", "--repair"], ["cost", "--add", "money=1"], ["init", "--contract", self.contract]):
            with self.subTest(verb=verb):
                result = _util.in_process_cli(["--dir", link, *verb]) if verb[0] != "cost" else _util.run_cli("--dir", link, *verb, env=env)
                self.assertEqual(result.code, 2, result.err)
                self.assertIn("symbolic link", result.err)
                self.assertEqual(len(result.err.splitlines()), 1, result.err)
        self.assertEqual(_util.contents(built.path), before)


class AppendDescriptorCache(Case):
    """The real file system reuses an append's descriptor only while the name names the same file."""

    def test_a_file_renamed_over_the_journal_between_two_holds_gets_the_next_append(self) -> None:
        folder, name = self.tmp, self.path("journal")
        _util.write_file(name, b"")
        fs = OsFileSystem()
        self.addCleanup(fs.close)
        for looked_up in (True, False):
            with self.subTest(looked_up_first=looked_up):
                with fs.lock(folder):
                    if looked_up:
                        fs.stat(name)
                    fs.append(name, b"old\n")
                    fs.fsync(name)
                replacement = self.path("replacement")
                _util.write_file(replacement, b"")
                os.replace(replacement, name)  # another process rotated it while no lock was held here
                with fs.lock(folder):
                    if looked_up:
                        fs.stat(name)
                    fs.append(name, b"new\n")
                    fs.fsync(name)
                with open(name, "rb") as handle:
                    self.assertEqual(handle.read(), b"new\n")
                _util.write_file(name, b"")


class InitThroughTheSeam(Case):
    """Init decides its refusal once, under the lock, and narrows the folder through the file-system seam."""

    def test_every_look_at_the_folder_is_under_the_lock(self) -> None:
        for existing in (False, True):
            with self.subTest(existing=existing):
                folder = self.path(f"seam-{existing}")
                if existing:
                    os.mkdir(folder)
                fs = Seam()
                self.addCleanup(fs.close)
                RunStore.create(folder, _util.TASK_ID, {}, fs=fs)
                looks = [held for path, held in fs.listings if path == folder]
                self.assertTrue(looks)
                self.assertEqual(looks, [1] * len(looks), "the folder was examined outside the lock")

    def test_an_existing_folder_is_narrowed_through_the_seam(self) -> None:
        folder = self.path("wide")
        os.mkdir(folder)
        os.chmod(folder, 0o755)
        fs = Seam()
        self.addCleanup(fs.close)
        RunStore.create(folder, _util.TASK_ID, {}, fs=fs)
        self.assertEqual(fs.privatised, [folder])
        self.assertEqual(stat.S_IMODE(os.stat(folder).st_mode), 0o700)

    def test_a_refused_init_changes_nothing(self) -> None:
        folder = self.path("occupied")
        os.mkdir(folder)
        os.chmod(folder, 0o755)
        _util.write_file(os.path.join(folder, "notes.txt"), b"mine\n")
        before = _util.listing(folder)
        fs = Seam()
        self.addCleanup(fs.close)
        with self.assertRaises(Exception) as caught:
            RunStore.create(folder, _util.TASK_ID, {}, fs=fs)
        self.assertEqual(getattr(caught.exception, "exit_code", None), 2)
        self.assertEqual(_util.listing(folder), before)
        self.assertEqual(fs.privatised, [])


if __name__ == "__main__":
    unittest.main()
