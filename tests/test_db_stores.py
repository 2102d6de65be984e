"""The database stores: rows checked against the journal, errors as one line, bounded lock holding.

* The journal is the state of record. A deleted, edited or rolled-back
  envelope or effect row, or a dropped effects table, is found on open and
  the state rebuilt exactly from the journal (a ``repairable`` finding that
  ``doctor`` reports and the next write, or ``doctor --repair``, makes good);
  a journal that no longer reaches the revision the run row proves is
  unrecoverable (exit 7). Neither ever lets a different payload in under a
  key already begun.
* SQLite errors are one line with the documented code: a folder or a
  missing file is invalid input (exit 2) and creates nothing, a file that is
  not a database is unrecoverable (exit 7), a database locked past the
  store's ``lock_wait`` gives a clear answer instead of a long hang.
* A worker killed (SIGKILL) or stopped (SIGSTOP) inside a PostgreSQL
  transaction delays the next writer by at most the store's ``lock_hold``
  bound (plus the waiter's retry step), proved with real processes; the
  stopped worker's transaction never commits what it decided before it was
  stopped. A real-system test (``tests/support/real.py``): PostgreSQL runs when
  ``RUNNER_REAL_TESTS`` asks for it.
"""

import gc
import json
import os
import signal
import sqlite3
import subprocess
import time
import unittest
import urllib.parse
from typing import Any, List, Optional

from tests.support import real as _real, util as _util
from tests.support.cli import RunnerCli
from runner.base.errors import RetryLater, RunnerError
from runner.stores import create_store, open_store

TASK = "db-damage"
WORKER = os.path.join(_util.SCRIPTS, "db_worker.py")
POSTGRES_ENV = _util.POSTGRES_ENV


def _contract(folder: str) -> str:
    block = _util.contract_block(TASK)
    block["effects"] = {"key_pattern": "[a-z0-9-]+"}
    return _util.write_contract(os.path.join(folder, "contract.md"), block)


class _Worker:
    """A child running ``tests/support/scripts/db_worker.py``; lines read with a deadline."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(_util.python(WORKER, *args, site=True), cwd=_util.REPO_ROOT, env=_util.child_env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def line(self, timeout: float = 60.0) -> str:
        import select

        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"worker said nothing in {timeout} s")
        return self.proc.stdout.readline().decode("utf-8").strip()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode("utf-8") + b"\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.kill()
        self.proc.wait(30)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


class SQLiteRowDamageTest(unittest.TestCase):
    """Rows damaged under a SQLite store, found on open, through the command line (its entry point in this process)."""

    def setUp(self) -> None:
        scratch = _util.scratch_dir("runner-db-")
        self.addCleanup(scratch.cleanup)
        self.dir = scratch.name
        self.db = os.path.join(self.dir, "runs.db")
        self.cli = RunnerCli(self, root=self.dir, store="sqlite:" + self.db, task=TASK,
                             env={"RUNNER_OWNER": "w1", "RUNNER_EPOCH": "1"})
        for name, payload in (("p1.json", {"n": 1}), ("p2.json", {"n": 2})):
            with open(os.path.join(self.dir, name), "w", encoding="utf-8") as handle:
                json.dump(payload, handle)
        self.cli("init", "--contract", _contract(self.dir))
        self.cli("lease", "acquire", "--owner", "w1", "--ttl", "600")
        self.cli("step", "start", "only")
        self.cli("effect", "begin", "e1", "--payload", self.p("p1.json"))

    def p(self, name: str) -> str:
        return os.path.join(self.dir, name)

    @staticmethod
    def ended() -> None:
        """Close what the verbs run so far left open, as the end of their processes would (SQLite's connections)."""
        gc.collect()

    def sql(self, *statements: str) -> None:
        db = sqlite3.connect(self.db)
        try:
            for statement in statements:
                db.execute(statement)
            db.commit()
        finally:
            db.close()

    def assertNoTraceback(self, result: _util.Result) -> None:
        self.assertNotIn("Traceback", result.err)
        self.assertLessEqual(len([line for line in result.err.splitlines() if line.strip()]), 2, result.err)

    def assertRebuiltAndGuarded(self) -> None:
        """The e1 record is back as the journal has it, and a different payload under e1 is refused."""
        shown = self.cli("--json", "effect", "show", "e1")
        self.assertIn("rows-rebuilt", shown.err)
        self.assertEqual(json.loads(shown.out)["state"], "started")
        other = self.cli("effect", "begin", "e1", "--payload", self.p("p2.json"), code=2)
        self.assertIn("refusing a different payload", other.err)
        self.assertNoTraceback(other)

    def test_a_deleted_effect_row_is_rebuilt_from_the_journal_and_a_second_payload_refused(self) -> None:
        self.sql("DELETE FROM runner_effects WHERE key = 'e1'")
        self.assertRebuiltAndGuarded()

    def test_an_edited_effect_row_is_rebuilt_from_the_journal(self) -> None:
        self.sql("UPDATE runner_effects SET effect = replace(effect, '\"state\":\"started\"', '\"state\":\"verified\"')")
        self.assertRebuiltAndGuarded()

    def test_a_dropped_effects_table_is_rebuilt_from_the_journal(self) -> None:
        self.sql("DROP TABLE runner_effects")
        self.assertRebuiltAndGuarded()

    def test_an_edited_envelope_row_is_rebuilt_from_the_journal(self) -> None:
        self.sql("UPDATE runner_runs SET envelope = replace(envelope, '\"status\":\"active\"', '\"status\":\"complete\"')")
        status = self.cli("--json", "status")
        self.assertEqual(json.loads(status.out)["status"], "active")

    def test_rows_rolled_back_are_rolled_forward_and_a_retried_cost_counts_once(self) -> None:
        db = sqlite3.connect(self.db)
        try:
            old = db.execute("SELECT envelope, revision, head, rows_digest FROM runner_runs").fetchone()
            old_effects = db.execute("SELECT key, effect FROM runner_effects").fetchall()
        finally:
            db.close()
        for key in ("n1", "n2", "n3"):
            self.cli("effect", "begin", key, "--payload", self.p("p1.json"))
        newest = self.cli("--json", "status").json["revision"]
        db = sqlite3.connect(self.db)
        db.execute("UPDATE runner_runs SET envelope = ?, revision = ?, head = ?, rows_digest = ?", old)
        db.execute("DELETE FROM runner_effects")
        db.executemany(f"INSERT INTO runner_effects VALUES ('{TASK}', ?, ?)", old_effects)
        db.commit()
        db.close()
        doctor = self.cli("--json", "doctor")
        report = json.loads(doctor.out)
        self.assertFalse(report["healthy"])
        self.assertEqual(report["revision"], newest)
        self.assertEqual([f["code"] for f in report["findings"]], ["rows-rebuilt"])
        self.cli("cost", "--add", "money=1")
        after = self.cli("--json", "status").json
        self.assertEqual(after["revision"], newest + 1)
        self.assertEqual(sorted(self.cli("--json", "effect", "list").json["effects"]), ["e1", "n1", "n2", "n3"])
        healthy = self.cli("--json", "doctor").json
        self.assertTrue(healthy["healthy"], healthy)

    def test_doctor_repair_rewrites_the_rows_once(self) -> None:
        self.sql("DELETE FROM runner_effects WHERE key = 'e1'")
        repaired = self.cli("--json", "doctor", "--repair").json
        self.assertEqual([r["code"] for r in repaired["repaired"]], ["rows-rebuilt"])
        again = self.cli("--json", "doctor")
        self.assertTrue(json.loads(again.out)["healthy"])
        self.assertEqual(again.err, "")

    def test_a_journal_that_lost_acknowledged_records_is_unrecoverable(self) -> None:
        self.cli("effect", "begin", "n1", "--payload", self.p("p1.json"))
        self.ended()
        before = _util.contents(self.dir)
        self.sql("DELETE FROM runner_journal WHERE rev = (SELECT MAX(rev) FROM runner_journal)",
                 "UPDATE runner_runs SET rows_digest = 'x'")
        for argv in (("status",), ("effect", "begin", "n1", "--payload", self.p("p2.json")), ("doctor",)):
            result = self.cli(*argv, code=None)
            self.assertEqual(result.code, 7, (argv, result.err))
            self.assertIn("journal proves only", result.err)
            self.assertNoTraceback(result)
        self.ended()
        self.assertEqual(set(_util.contents(self.dir)), set(before))

    def test_a_dropped_journal_table_is_unrecoverable(self) -> None:
        self.sql("DROP TABLE runner_journal")
        result = self.cli("status", code=7)
        self.assertNoTraceback(result)


class SQLiteErrorTest(unittest.TestCase):
    """SQLite's errors as one line with the documented code, and read-only verbs that create nothing."""

    def setUp(self) -> None:
        scratch = _util.scratch_dir("runner-db-")
        self.addCleanup(scratch.cleanup)
        self.dir = scratch.name

    def status(self, path: str) -> _util.Result:
        result = _util.in_process_cli(["--store", "sqlite:" + path, "--task", TASK, "status"])
        self.assertNotIn("Traceback", result.err)
        self.assertEqual(len(result.err.strip().splitlines()), 1, result.err)
        return result

    def test_a_mistyped_path_is_invalid_input_and_creates_nothing(self) -> None:
        for path in (os.path.join(self.dir, "typo.db"), os.path.join(self.dir, "missing", "x.db")):
            result = self.status(path)
            self.assertEqual(result.code, 2, result.err)
            self.assertIn("no SQLite database", result.err)
        self.assertEqual(os.listdir(self.dir), [])

    def test_a_folder_as_the_path_is_invalid_input(self) -> None:
        os.mkdir(os.path.join(self.dir, "adir"))
        result = self.status(os.path.join(self.dir, "adir"))
        self.assertEqual(result.code, 2, result.err)
        self.assertIn("is a folder", result.err)

    def test_a_file_that_is_not_a_database_is_unrecoverable(self) -> None:
        path = os.path.join(self.dir, "bad.db")
        with open(path, "wb") as handle:
            handle.write(b"this is not a database" * 100)
        with _util.SQLiteConnections() as connections:
            result = self.status(path)
        self.assertEqual(result.code, 7, result.err)
        self.assertEqual((len(connections.made), connections.left_open()), (1, 0), "the refused store closed its connection")
        with open(path, "rb") as handle:
            self.assertEqual(handle.read(), b"this is not a database" * 100)

    def test_a_database_locked_by_a_stopped_worker_gives_a_bounded_answer(self) -> None:
        url = "sqlite:" + os.path.join(self.dir, "runs.db")
        create_store(url, TASK, _util.contract_block(TASK)).close()
        holder = _Worker("hold", url, TASK, json.dumps({}))
        self.addCleanup(holder.close)
        self.assertEqual(holder.line(), "inside")
        os.kill(holder.proc.pid, signal.SIGSTOP)
        store = open_store(url, TASK, lock_wait=0.5)
        self.addCleanup(store.close)
        started = time.monotonic()
        with self.assertRaises(RetryLater) as caught:
            store.commit([["set", ["counters", "n"], 1]])
        self.assertLess(time.monotonic() - started, 30)
        self.assertIn("stayed locked", caught.exception.message)
        self.assertEqual(caught.exception.exit_code, 11)
        self.assertGreater(caught.exception.context["wait_seconds"], 0)
        os.kill(holder.proc.pid, signal.SIGCONT)
        holder.send("go")
        self.assertEqual(holder.line(), "committed 1")
        self.assertEqual(store.commit([["set", ["counters", "n"], 2]])["revision"], 2)


#: Holds the whole SQLite database locked (as a closing connection does while it checkpoints the log) until killed.
EXCLUSIVE_HOLDER = r'''
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA locking_mode=EXCLUSIVE")
db.execute("BEGIN EXCLUSIVE")
db.execute("UPDATE runner_runs SET revision = revision")
print("held", flush=True)
time.sleep(600)
'''


class SQLiteLockedAtOpenTest(unittest.TestCase):
    def test_a_database_locked_when_a_run_is_opened_is_retry_later_never_damage(self) -> None:
        with _util.scratch_dir("runner-db-") as root:
            path = os.path.join(root, "runs.db")
            create_store("sqlite:" + path, TASK, _util.contract_block(TASK)).close()
            holder = subprocess.Popen(_util.python("-c", EXCLUSIVE_HOLDER, path), env=_util.child_env(), stdout=subprocess.PIPE)
            try:
                self.assertEqual(holder.stdout.readline().strip(), b"held")  # type: ignore[union-attr]
                with self.assertRaises(RetryLater) as caught:
                    open_store("sqlite:" + path, TASK, lock_wait=1.5)
                self.assertIn("stayed locked", caught.exception.message)
                self.assertEqual(caught.exception.exit_code, 11)
            finally:
                holder.kill()  # a crash: the lock goes with the process
                holder.wait()
                holder.stdout.close()  # type: ignore[union-attr]
            store = open_store("sqlite:" + path, TASK)
            self.addCleanup(store.close)
            self.assertEqual(store.revision, 0)


@_real.needs("PostgreSQL", why_not=_util.postgres_unavailable)
class PostgresLockBoundTest(unittest.TestCase):
    """A dead or stopped worker holds a PostgreSQL run's lock for a bounded time; real processes throughout."""

    #: The ``lock_hold`` every process here uses, and the slack allowed for process start and the waiter's retry step.
    HOLD = 1.0
    SLACK = 8.0

    def setUp(self) -> None:
        import uuid

        self.url = os.environ[POSTGRES_ENV]
        self.task = "lock-" + uuid.uuid4().hex[:12]
        self.options = {"lock_hold": self.HOLD}
        create_store(self.url, self.task, _util.contract_block(self.task), **self.options).close()
        self.addCleanup(self._drop)
        self.workers: List[_Worker] = []
        self.addCleanup(lambda: [w.close() for w in self.workers])

    def _drop(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as db:
            for table in ("runner_journal", "runner_effects", "runner_runs"):
                db.execute(f"DELETE FROM {table} WHERE task_id = %s", (self.task,))

    def worker(self, mode: str) -> _Worker:
        worker = _Worker(mode, self.url, self.task, json.dumps(self.options))
        self.workers.append(worker)
        return worker

    def next_writer_delay(self) -> float:
        """Seconds a second writer process takes to commit once (its start-up included)."""
        started = time.monotonic()
        writer = self.worker("count")
        self.assertEqual(writer.line(timeout=self.HOLD + 60), "committed 1")
        return time.monotonic() - started

    def baseline(self) -> float:
        """What a writer process takes with no lock held: start-up and one commit."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as db:
            db.execute("SELECT 1")
        started = time.monotonic()
        probe = _Worker("open", self.url, self.task, json.dumps(self.options))
        self.workers.append(probe)
        self.assertEqual(probe.line().split()[0], "opened")
        return time.monotonic() - started

    def test_a_worker_killed_inside_a_transaction_releases_the_run_at_once(self) -> None:
        bound = self.baseline() + self.HOLD + self.SLACK
        holder = self.worker("hold")
        self.assertEqual(holder.line(), "inside")
        os.kill(holder.proc.pid, signal.SIGKILL)
        holder.proc.wait(30)
        self.assertLess(self.next_writer_delay(), bound)

    def test_a_worker_stopped_inside_a_transaction_delays_the_next_writer_by_at_most_the_bound(self) -> None:
        bound = self.baseline() + self.HOLD + self.SLACK
        holder = self.worker("hold")
        self.assertEqual(holder.line(), "inside")
        os.kill(holder.proc.pid, signal.SIGSTOP)
        self.assertLess(self.next_writer_delay(), bound)
        # Woken, the stopped worker finds its session ended: what it decided before stopping
        # never commits; it tries again on a new connection against the state as it now is.
        os.kill(holder.proc.pid, signal.SIGCONT)
        holder.send("go")
        self.assertEqual(holder.line(), "committed 2")
        store = open_store(self.url, self.task)
        self.addCleanup(store.close)
        records, _ = store.records_after(0)
        self.assertEqual([r["ops"] for r in records], [[["set", ["counters", "n"], 1]], [["set", ["counters", "n"], 2]]])


@_real.needs("PostgreSQL", why_not=_util.postgres_unavailable)
class PostgresRegistryTest(unittest.TestCase):
    """A PostgreSQL run's calls in flight: one folder for every spelling of its URL; another user's effect refused."""

    def setUp(self) -> None:
        import uuid

        self.url = os.environ[POSTGRES_ENV]
        self.task = "calls-" + uuid.uuid4().hex[:12]
        create_store(self.url, self.task, _util.contract_block(self.task)).close()
        self.addCleanup(self._drop)

    def _drop(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as db:
            for table in ("runner_journal", "runner_effects", "runner_runs"):
                db.execute(f"DELETE FROM {table} WHERE task_id = %s", (self.task,))

    def open(self, url: str, task: Optional[str] = None) -> Any:
        store = open_store(url, task or self.task)
        self.addCleanup(store.close)
        return store

    def spellings(self) -> List[str]:
        """The test server's URL as given, with the other name of the loopback host, and with a parameter added."""
        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or ""
        other = {"127.0.0.1": "localhost", "localhost": "127.0.0.1"}.get(host)
        query = parts.query + ("&" if parts.query else "") + "connect_timeout=9"
        out = [self.url, urllib.parse.urlunsplit(parts._replace(query=query))]
        if other:
            out.append(urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.replace(host, other, 1))))
        return out

    def test_every_spelling_of_the_url_finds_the_same_calls(self) -> None:
        from runner.calls import inflight

        registries = [inflight.registry_for(self.open(url)) for url in self.spellings()]
        self.assertEqual(len({r.folder for r in registries}), 1, [r.folder for r in registries])
        self.assertEqual(os.path.dirname(registries[0].folder), os.path.join("/tmp", f"runner-calls-{os.getuid()}"))
        call = registries[0].register("k1", "invoke", 1, 30.0)
        self.addCleanup(registries[0].finish, call)
        for registry in registries[1:]:
            self.assertEqual([found.name for found, _ in registry.calls("k1")], [call.name])
        other = "calls-other-" + self.task[-12:]
        create_store(self.url, other, _util.contract_block(other)).close()
        try:
            folder = inflight.registry_for(self.open(self.url, other)).folder
            self.assertNotEqual(folder, registries[0].folder, "another run, another folder")
        finally:
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as db:
                for table in ("runner_journal", "runner_effects", "runner_runs"):
                    db.execute(f"DELETE FROM {table} WHERE task_id = %s", (other,))

    def test_an_effect_another_user_of_this_machine_began_is_refused_before_anything_is_written(self) -> None:
        from runner.ledger import effects
        from runner.calls import inflight
        from runner.execution.run import Run
        from runner.base.host import local_maker

        me = local_maker()
        run = Run(self.open(self.url))
        run.acquire("someone", 60)
        another = {"host": me["host"], "uid": me["uid"] + 1}
        run._mutate(lambda s, now: effects.begin_ops(s, "k1", "sha256:" + "1" * 64, now, maker=another))
        run.release()
        with self.assertRaises(RunnerError) as caught:
            inflight.registry_for(self.open(self.url))
        self.assertIn(f"effect 'k1' was begun by uid {me['uid'] + 1} on this machine", caught.exception.message)
        revision = self.open(self.url).revision
        done = _util.run_cli("--store", self.url, "--task", self.task, "drive", "--owner", "w", "--json", site=True)
        self.assertEqual(done.code, 2, done.err)
        self.assertIn(f"was begun by uid {me['uid'] + 1} on this machine", done.err)
        self.assertEqual(self.open(self.url).revision, revision, "nothing was written")
        report = json.loads(_util.run_cli("--store", self.url, "--task", self.task, "doctor", "--json", site=True).out)
        self.assertFalse(report["healthy"])
        self.assertEqual([f["code"] for f in report["findings"]], ["calls-refused"])


if __name__ == "__main__":
    unittest.main()
