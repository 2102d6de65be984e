"""One conformance suite for every run store: the file store, SQLite and PostgreSQL.

:class:`StoreConformance` holds the claims as test methods; each concrete
class below supplies one store (``file:`` a temporary folder per run,
``sqlite:`` a temporary database file, ``postgresql://`` the server named by
``RUNNER_TEST_POSTGRES_URL``) and the same methods run against it. Every test
uses fresh task ids, so the PostgreSQL class can share one database; it is
a real-system test (``tests/support/real.py``), run when ``RUNNER_REAL_TESTS`` asks.

Claims that need other processes start real ones: this file is also the
worker program (``python test_store_conformance.py count|serve URL TASK
OPTIONS``), which opens the store by its URL and speaks one line at a time on
stdin/stdout.
"""

import copy
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import uuid
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

try:
    from .support import real as _real, util as _util
except ImportError:
    from support import real as _real
    from support import util as _util

from runner.base.canonical import canonical_json, sha256_hex
from runner.base.errors import AlreadyRunning, Fenced, InvalidInput, RunnerError
from runner.execution.run import Run
from runner.stores import create_store, list_runs, open_store
from runner.stores.file import CommitThenRaise

WORKER = os.path.abspath(__file__)
POSTGRES_ENV = _util.POSTGRES_ENV

#: The counter the concurrency workers increment, one transaction at a time.
COUNTER = "conformance"

#: What a concurrency test runs: workers x transactions each.
WORKERS = 4
TRANSACTIONS = 50

Ops = List[List[Any]]


def increment(state: Dict[str, Any]) -> Ops:
    """Read-modify-write inside ``decide``: the counter's next value, computed from the state seen."""
    return [["set", ["counters", COUNTER], int(state["counters"].get(COUNTER, 0)) + 1]]


def close_store(store: Any) -> None:
    if hasattr(store, "close"):
        store.close()
    elif hasattr(getattr(store, "fs", None), "close"):
        store.fs.close()


def record_body(record: Dict[str, Any]) -> Dict[str, Any]:
    return {key: record[key] for key in ("at", "epoch", "ops", "prev", "rev")}


# -- the worker program ------------------------------------------------------------------

def _say(*words: Any) -> None:
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def worker_main(argv: Sequence[str]) -> int:
    """``count URL TASK OPTIONS N``: after ``go`` on stdin, N increments, each acknowledged as ``ack REV VALUE``.

    ``serve URL TASK OPTIONS``: one JSON command per stdin line (``commit``,
    ``transact-increment``, ``refresh``, ``records_after``), one JSON answer
    per stdout line.
    """
    mode, url, task, options = argv[0], argv[1], argv[2], json.loads(argv[3])
    store = open_store(url, task, **options)
    if mode == "count":
        count = int(argv[4])
        _say("ready", store.revision)
        if sys.stdin.readline().strip() != "go":
            return 2
        for _ in range(count):
            state = store.transact(increment)
            _say("ack", state["revision"], state["counters"][COUNTER])
        _say("done")
        return 0
    if mode == "serve":
        _say(json.dumps({"ready": store.revision}))
        for line in sys.stdin:
            command = json.loads(line)
            what = command["do"]
            try:
                if what == "commit":
                    state = store.commit(command["ops"], epoch=command.get("epoch", 0))
                    answer: Dict[str, Any] = {"revision": state["revision"], "head": state["head"]}
                elif what == "transact-increment":
                    state = store.transact(increment)
                    answer = {"revision": state["revision"], "value": state["counters"][COUNTER]}
                elif what == "refresh":
                    answer = {"state": store.refresh()}
                elif what == "records_after":
                    records, oldest = store.records_after(command["after"])
                    answer = {"records": records, "oldest": oldest, "revision": store.revision}
                else:
                    answer = {"error": f"unknown command {what!r}"}
            except RunnerError as exc:
                answer = {"error": exc.reason, "message": exc.message}
            _say(json.dumps(answer))
        return 0
    return 2


class Worker:
    """A worker process started with this file as its program; lines read with a deadline."""

    def __init__(self, args: Sequence[str], site: bool) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            _util.python(WORKER, *args, site=site),
            cwd=_util.REPO_ROOT,
            env=_util.child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
        )
        self.buffer = b""
        self.eof = False

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode("utf-8") + b"\n")
        self.proc.stdin.flush()

    def ask(self, command: Dict[str, Any]) -> Dict[str, Any]:
        self.send(json.dumps(command))
        return json.loads(self.line())

    def errors(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")[-3000:]

    def _fill(self, deadline: float) -> bool:
        """Read what the worker wrote; False at end of output."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"worker {self.proc.args[2:]} said nothing in time; stderr: {self.errors()}")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return True
        chunk = os.read(fd, 65536)
        if not chunk:
            self.eof = True
            return False
        self.buffer += chunk
        return True

    def line(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            if not self._fill(deadline):
                raise AssertionError(f"worker ended (exit {self.proc.wait()}) before answering; stderr: {self.errors()}")
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("utf-8")

    def rest(self, timeout: float = 60.0) -> List[str]:
        """Every complete line still to come, up to the end of the worker's output."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            self._fill(deadline)
        lines = self.buffer.split(b"\n")
        self.buffer = lines.pop()  # an unfinished line is no acknowledgement
        return [line.decode("utf-8") for line in lines]

    def finish(self, timeout: float = 60.0) -> int:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"worker did not exit; stderr: {self.errors()}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except BrokenPipeError:
                    pass
        self.stderr.close()


def parse_acks(lines: Sequence[str]) -> List[Tuple[int, int]]:
    """``(revision, value)`` of every ``ack`` line."""
    out = []
    for line in lines:
        words = line.split()
        if words and words[0] == "ack":
            out.append((int(words[1]), int(words[2])))
    return out


# -- the claims -------------------------------------------------------------------------

_Mixin = unittest.TestCase if TYPE_CHECKING else object


class StoreConformance(_Mixin):
    """The claims every run store keeps, mixed into one ``TestCase`` per store.

    Creating a run and opening it give the same state, and creating over an
    existing run is refused with exit 2 and changes nothing. Every
    transition takes the next revision along a hash chain. A ``decide`` that
    raises writes nothing; :class:`CommitThenRaise` commits its operations
    and raises its error; a malformed operation is refused with nothing
    written. Store objects in different processes see each other's commits,
    concurrent read-modify-write transactions lose no update, and a worker
    killed mid-transaction leaves a run that opens at or after its last
    acknowledged revision. Through :class:`Run`, a writer fenced by a
    takeover changes nothing, and an effect's ledger entry commits in the
    same transition as the state around it. ``records_after(n)`` returns
    exactly the records after ``n`` that the store holds.

    A concrete class sets ``kind`` and implements :meth:`url_for` (the URL of
    one run) and :meth:`raw` (the durable bytes or rows of one run, compared
    to prove that a refused write changed nothing).
    """

    kind = ""
    #: Whether worker processes need ``site`` (PostgreSQL: psycopg is installed there).
    worker_site = False
    #: Store options of the processes that share a run in the multi-process tests.
    shared_options: Dict[str, Any] = {}

    # -- hooks and helpers ---------------------------------------------------------------
    def url_for(self, task_id: str) -> str:
        raise NotImplementedError

    def raw(self, task_id: str) -> Any:
        raise NotImplementedError

    def list_url(self) -> str:
        """The URL ``list_runs`` reads."""
        return self.url_for("any")

    def setUp(self) -> None:
        super().setUp()
        self.tasks: List[str] = []
        self.stores: List[Any] = []
        self.workers: List[Worker] = []
        self.addCleanup(self._close_all)

    def _close_all(self) -> None:
        for worker in self.workers:
            worker.close()
        for store in self.stores:
            close_store(store)

    def new_task(self) -> str:
        task = f"conf-{self.kind}-{uuid.uuid4().hex[:12]}"
        self.tasks.append(task)
        return task

    def create(self, task_id: str, plan: Optional[Dict[str, Any]] = None) -> Any:
        store = create_store(self.url_for(task_id), task_id, _util.contract_block(task_id) if plan is None else plan)
        self.stores.append(store)
        return store

    def open(self, task_id: str, **options: Any) -> Any:
        store = open_store(self.url_for(task_id), task_id, **options)
        self.stores.append(store)
        return store

    def fresh(self, task_id: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]], int]:
        """State, every record held and the oldest held, as a newly opened store object sees them."""
        store = open_store(self.url_for(task_id), task_id)
        try:
            self.assertEqual([f for f in store.findings if f.level == "damage"], [])
            records, oldest = store.records_after(-1)
            return copy.deepcopy(store.state), records, oldest
        finally:
            close_store(store)

    def worker(self, mode: str, task_id: str, *args: str) -> Worker:
        worker = Worker([mode, self.url_for(task_id), task_id, json.dumps(self.shared_options), *args], self.worker_site)
        self.workers.append(worker)
        return worker

    def assertUnchanged(self, task_id: str, before: Tuple[Dict[str, Any], List[Dict[str, Any]], int], raw: Any) -> None:
        self.assertEqual(self.fresh(task_id), before)
        self.assertEqual(self.raw(task_id), raw)

    def assertChain(self, records: Sequence[Dict[str, Any]], first_prev: str, head: str) -> None:
        """Consecutive revisions, each record hashing to its ``hash`` and linking to the one before."""
        prev = first_prev
        for index, record in enumerate(records):
            if index:
                self.assertEqual(record["rev"], records[index - 1]["rev"] + 1)
            self.assertEqual(record["prev"], prev, f"record {record['rev']} does not link to the one before")
            self.assertEqual(sha256_hex(canonical_json(record_body(record))), record["hash"], f"record {record['rev']} does not hash to its hash")
            prev = record["hash"]
        self.assertEqual(prev, head)

    # -- creation ------------------------------------------------------------------------
    def test_create_then_open_gives_the_same_state(self) -> None:
        task = self.new_task()
        created = self.create(task)
        self.assertEqual(created.revision, 0)
        self.assertEqual(created.state["task_id"], task)
        self.assertEqual(created.state["plan"], _util.contract_block(task))
        self.assertEqual(self.open(task).state, created.state)
        for rev in range(1, 7):
            created.commit(_util.transition_ops(rev))
        created.commit([["set", ["effects"], {"whole": {"state": "verified", "note": "ledger replaced"}}]])
        created.commit([["del", ["effects", "whole"]], ["set", ["effects", "after"], {"state": "started"}]])
        state, records, _oldest = self.fresh(task)
        self.assertEqual(state, created.state)
        self.assertEqual(state["effects"], {"after": {"state": "started"}})
        self.assertEqual(len(records), 8)

    def test_create_over_an_existing_run_is_refused_and_changes_nothing(self) -> None:
        task = self.new_task()
        store = self.create(task)
        store.commit(_util.transition_ops(1))
        store.commit(_util.transition_ops(2))
        before, raw = self.fresh(task), self.raw(task)
        for plan in (_util.contract_block(task), dict(_util.contract_block(task), goal="Another plan.")):
            with self.assertRaises(InvalidInput) as caught:
                self.create(task, plan)
            self.assertEqual(caught.exception.exit_code, 2)
            self.assertUnchanged(task, before, raw)
        self.assertIn(task, list_runs(self.list_url()))

    def test_run_open_finds_the_store_by_its_url(self) -> None:
        task = self.new_task()
        created = self.create(task)
        created.commit(_util.transition_ops(1))
        run = Run.open(self.url_for(task), task_id=task)
        self.stores.append(run.store)
        self.assertEqual(run.state, created.state)
        lease = run.acquire("conformance-worker", 60)
        self.assertEqual(self.fresh(task)[0]["lease"], run.state["lease"])
        self.assertEqual((lease["owner"], run.store.revision), ("conformance-worker", 2))

    # -- transitions ---------------------------------------------------------------------
    def test_revisions_increase_by_one_along_a_hash_chain(self) -> None:
        task = self.new_task()
        store = self.create(task)
        genesis = store.state["head"]
        heads = [genesis]
        for rev in range(1, 9):
            if rev % 2:
                state = store.commit(_util.transition_ops(rev), epoch=rev)
            else:
                state = store.transact(lambda s, rev=rev: _util.transition_ops(rev) + increment(s), epoch=rev)
            self.assertEqual(state["revision"], rev)
            self.assertNotIn(state["head"], heads)
            heads.append(state["head"])
        self.assertEqual(store.transact(lambda s: []), store.state)  # no operations: no transition
        self.assertEqual(store.revision, 8)
        state, records, oldest = self.fresh(task)
        self.assertEqual(state, store.state)
        self.assertEqual(oldest, 1)
        self.assertEqual([r["rev"] for r in records], list(range(1, 9)))
        self.assertEqual([r["epoch"] for r in records], list(range(1, 9)))
        self.assertEqual([r["hash"] for r in records], heads[1:])
        self.assertChain(records, genesis, state["head"])
        self.assertEqual(state["counters"][COUNTER], 4)

    def test_a_decide_that_raises_writes_nothing(self) -> None:
        task = self.new_task()
        store = self.create(task)
        store.commit(_util.transition_ops(1))
        before, raw = self.fresh(task), self.raw(task)

        class Refusal(Exception):
            pass

        def refuse(state: Dict[str, Any]) -> Ops:
            raise Refusal("no")

        for decide in (refuse, lambda s: [][1], lambda s: int("not a number")):
            with self.assertRaises((Refusal, IndexError, ValueError)):
                store.transact(decide)
            self.assertUnchanged(task, before, raw)
        self.assertEqual(store.revision, 1)
        self.assertEqual(store.commit(_util.transition_ops(2))["revision"], 2)
        self.assertEqual(self.fresh(task)[0], store.state)

    def test_a_decide_that_raises_is_called_once_and_its_error_reaches_the_caller(self) -> None:
        """A decide's own exception is never taken for a busy database and retried, whatever its message."""
        task = self.new_task()
        store = self.create(task)
        calls = []

        def refuse(state: Dict[str, Any]) -> Ops:
            calls.append(state["revision"])
            raise RuntimeError("the ticket service is busy; try later")

        with self.assertRaises(RuntimeError):
            store.transact(refuse)
        self.assertEqual(calls, [0], "a decide that raised was called again")
        self.assertEqual(self.fresh(task)[0]["revision"], 0)

    def test_commit_then_raise_commits_its_ops_and_raises_its_error(self) -> None:
        task = self.new_task()
        store = self.create(task)
        store.commit(_util.transition_ops(1))

        class Refusal(Exception):
            pass

        def refuse(state: Dict[str, Any]) -> Ops:
            raise CommitThenRaise([["set", ["observations", "store", "refusal"], {"why": "recorded"}]], Refusal("refused"))

        with self.assertRaises(Refusal) as caught:
            store.transact(refuse, epoch=3)
        self.assertEqual(str(caught.exception), "refused")
        self.assertEqual(store.revision, 2)
        state, records, _oldest = self.fresh(task)
        self.assertEqual(state, store.state)
        self.assertEqual(state["observations"]["store"]["refusal"], {"why": "recorded"})
        self.assertEqual(records[-1]["ops"], [["set", ["observations", "store", "refusal"], {"why": "recorded"}]])
        self.assertEqual(records[-1]["epoch"], 3)
        def refuse_silently(state: Dict[str, Any]) -> Ops:
            raise CommitThenRaise([], Refusal("nothing to record"))

        with self.assertRaises(Refusal):
            store.transact(refuse_silently)
        self.assertEqual(self.fresh(task)[0]["revision"], 2)

    def test_a_malformed_op_is_refused_and_nothing_is_written(self) -> None:
        task = self.new_task()
        store = self.create(task)
        store.commit(_util.transition_ops(1))
        before, raw = self.fresh(task), self.raw(task)
        malformed: List[Any] = [
            [["bogus", ["counters", "x"], 1]],
            [["set", ["counters", "x"]]],
            [["del", ["counters", "x"], 1]],
            [["set", [], 1]],
            [["set", "counters", 1]],
            [["set", ["counters", 7], 1]],
            [["set", ["no", "such", "parent"], 1]],
            [["set", ["counters", "x"], float("nan")]],
            [["set", ["counters", "x"], {1, 2}]],
            [["set", ["effects", "fine"], {"state": "started"}], ["set", ["effects", "fine", "deeper", "x"], 1]],
            "not a list",
        ]
        for ops in malformed:
            with self.subTest(ops=repr(ops)):
                with self.assertRaises(InvalidInput):
                    store.commit(ops)
                self.assertUnchanged(task, before, raw)
                self.assertEqual(store.state, before[0])
        self.assertEqual(store.commit(_util.transition_ops(2))["revision"], 2)
        self.assertEqual(self.fresh(task)[0], store.state)

    def test_a_transition_that_breaks_the_envelope_is_refused_and_nothing_is_written(self) -> None:
        """The store refuses to write a state its own loader would call damaged."""
        for ops in ([["del", ["lease"]]], [["set", ["status"], "no such status"]], [["del", ["effects"]]], [["set", ["steps"], []]]):
            with self.subTest(ops=ops):
                task = self.new_task()
                store = self.create(task)
                before, raw = self.fresh(task), self.raw(task)
                with self.assertRaises(InvalidInput):
                    store.commit(ops)
                self.assertUnchanged(task, before, raw)

    # -- other processes -----------------------------------------------------------------
    def test_two_processes_see_each_others_commits(self) -> None:
        task = self.new_task()
        store = self.create(task)
        store.commit(_util.transition_ops(1))
        other = self.worker("serve", task)
        self.assertEqual(json.loads(other.line()), {"ready": 1})

        store.commit([["set", ["observations", "store", "from-parent"], 2]])
        self.assertEqual(other.ask({"do": "refresh"})["state"], store.state)

        answer = other.ask({"do": "commit", "ops": [["set", ["observations", "store", "from-worker"], 3]], "epoch": 5})
        self.assertEqual(answer["revision"], 3)
        records, _oldest = store.records_after(2)  # catches up without an explicit refresh
        self.assertEqual([(r["rev"], r["epoch"], r["hash"]) for r in records], [(3, 5, answer["head"])])
        self.assertEqual(store.revision, 3)
        self.assertEqual(store.state["observations"]["store"]["from-worker"], 3)

        store.transact(increment)  # decide sees the worker's commit first
        self.assertEqual(other.ask({"do": "transact-increment"}), {"revision": 5, "value": 2})
        self.assertEqual(store.refresh()["counters"][COUNTER], 2)
        seen = other.ask({"do": "records_after", "after": 0})
        state, records, _oldest = self.fresh(task)
        self.assertEqual(seen["revision"], 5)
        self.assertEqual(seen["records"], records)
        self.assertEqual(state, store.state)
        self.assertEqual(other.finish(), 0)

    def test_concurrent_increments_lose_no_update(self) -> None:
        task = self.new_task()
        self.create(task)
        workers = [self.worker("count", task, str(TRANSACTIONS)) for _ in range(WORKERS)]
        for worker in workers:
            self.assertEqual(worker.line(), "ready 0")
        for worker in workers:
            worker.send("go")
        acks: List[Tuple[int, int]] = []
        for worker in workers:
            lines = worker.rest(timeout=120)
            self.assertEqual(lines[-1:], ["done"], worker.errors())
            self.assertEqual(worker.finish(), 0, worker.errors())
            mine = parse_acks(lines)
            self.assertEqual(len(mine), TRANSACTIONS)
            self.assertEqual(mine, sorted(mine), "one worker's revisions went backwards")
            acks += mine
        total = WORKERS * TRANSACTIONS
        self.assertEqual(sorted(acks), [(n, n) for n in range(1, total + 1)], "two transactions read the same counter")
        state, records, oldest = self.fresh(task)
        self.assertEqual(state["revision"], total)
        self.assertEqual(state["counters"][COUNTER], total)
        self.assertEqual([r["rev"] for r in records], list(range(oldest, total + 1)))
        for record in records:
            self.assertEqual(record["ops"], [["set", ["counters", COUNTER], record["rev"]]])

    def test_a_worker_killed_mid_transaction_leaves_a_store_that_opens_at_its_last_acknowledgement(self) -> None:
        """Every wait here has its own bound: a worker's line (60 s) and exit (30 s), and the store's own.

        The store's reads (``fresh``: open, ``records_after``) no longer take
        the run's row lock, and a writer that finds the lock held gives up after
        ``lock_wait`` (15 s) with ``retry-later``; the server ends a session left
        inside a transaction after ``lock_hold`` (5 s). Before, this process's
        ``records_after`` took ``SELECT ... FOR UPDATE`` with no timeout, so a
        holder the server had not yet seen die kept this test waiting outside
        every deadline the test sets.
        """
        task = self.new_task()
        self.create(task)
        stale = open_store(self.url_for(task), task, **self.shared_options)
        self.stores.append(stale)
        acknowledged = 0
        for _ in range(2):
            worker = self.worker("count", task, "1000000")
            self.assertEqual(worker.line(), f"ready {acknowledged}")
            worker.send("go")
            while True:
                line = worker.line()
                self.assertTrue(line.startswith("ack "), line)
                if int(line.split()[1]) >= acknowledged + 15:
                    break
            os.kill(worker.proc.pid, signal.SIGKILL)
            self.assertEqual(worker.proc.wait(30), -signal.SIGKILL)
            acks = parse_acks([line] + worker.rest())
            last = acks[-1][0]
            state, records, oldest = self.fresh(task)
            self.assertGreaterEqual(state["revision"], last)
            self.assertEqual(state["counters"][COUNTER], state["revision"])
            self.assertEqual([r["rev"] for r in records], list(range(oldest, state["revision"] + 1)))
            for record in records:
                # A kill inside an append (a torn record) or a snapshot's rewrite (a stray temporary file, a
                # snapshot rebuilt from the backup) is repaired by the next writer, which says so in its own record
                # as a store observation next to its op: the store's documented lossless repairs.
                repairs = [op for op in record["ops"] if op[1][:2] == ["observations", "store"]]
                for repair in repairs:
                    self.assertEqual(repair[2]["source"], "store", repair)
                    self.assertTrue(repair[2]["findings"], repair)
                others = [op for op in record["ops"] if op not in repairs]
                self.assertEqual(others, [["set", ["counters", COUNTER], record["rev"]]])
            acknowledged = state["revision"]
        after = stale.transact(increment)  # the object opened before both kills catches up
        self.assertEqual(after["revision"], acknowledged + 1)
        self.assertEqual(after["counters"][COUNTER], acknowledged + 1)
        self.assertEqual(self.fresh(task)[0], after)

    # -- fencing and effects through Run -------------------------------------------------
    def test_a_write_with_an_older_epoch_is_fenced_after_a_takeover(self) -> None:
        task = self.new_task()
        self.create(task)
        now = [time.time()]

        def clock() -> float:
            return now[0]

        old = Run(self.open(task, clock=clock))
        self.assertEqual(old.acquire("worker-a", 600)["epoch"], 1)
        old.step_start("only")

        new = Run(self.open(task, clock=clock))
        now[0] += 1
        with self.assertRaises(AlreadyRunning):
            new.acquire("worker-b", 600)
        new.break_lease("supervisor", "worker-a's process ended")
        now[0] += 1
        self.assertEqual(new.acquire("worker-b", 600)["epoch"], 2)

        before, raw = self.fresh(task), self.raw(task)
        stale_writes = (
            lambda: old.effect_begin("doc-1", {"n": 1}),
            lambda: old.step_done("only", {"file": "out.txt"}),
            lambda: old.step_fail("only", "transient", "timeout"),
            lambda: old.add_cost({"tokens": 10}),
            lambda: old.renew(600),
        )
        for write in stale_writes:
            with self.assertRaises(Fenced) as caught:
                write()
            self.assertEqual(caught.exception.exit_code, 9)
            self.assertUnchanged(task, before, raw)
        state = before[0]
        self.assertEqual((state["lease"]["owner"], state["lease"]["epoch"]), ("worker-b", 2))
        self.assertEqual(state["effects"], {})

        new.effect_begin("doc-1", {"n": 1})
        again = Run(self.open(task, clock=clock))
        self.assertEqual(again.acquire("worker-b", 600)["epoch"], 3)  # the same owner id fences its older process too
        with self.assertRaises(Fenced):
            new.effect_ack("doc-1", {"ticket": "t-1"})
        state, records, _oldest = self.fresh(task)
        self.assertEqual(state["effects"]["doc-1"]["state"], "started")
        self.assertEqual(records[-1]["epoch"], 0)  # acquire is not a fenced write
        self.assertEqual(records[-2]["epoch"], 2)

    def test_an_effect_and_its_state_transition_commit_together(self) -> None:
        task = self.new_task()
        self.create(task)
        run = Run(self.open(task))
        run.acquire("worker", 600)
        run.step_start("only")
        base = run.state["revision"]
        effect = run.effect_begin("doc-1", {"n": 1})
        self.assertEqual(effect["state"], "started")
        state, records, _oldest = self.fresh(task)
        self.assertEqual(state["revision"], base + 1)
        self.assertEqual(state["effects"], {"doc-1": effect})
        self.assertEqual(state["counters"]["effect_attempts"], 1)
        self.assertEqual(records[-1]["rev"], base + 1)
        self.assertEqual(records[-1]["epoch"], 1)
        self.assertEqual({tuple(op[1][:2]) for op in records[-1]["ops"]}, {("effects", "doc-1"), ("counters", "effect_attempts")})

        run.effect_ack("doc-1", {"ticket": "t-1"})
        run.effect_begin("doc-2", {"n": 2})
        state, records, _oldest = self.fresh(task)
        self.assertEqual(state["revision"], base + 3)
        self.assertEqual(state["effects"]["doc-1"]["state"], "acknowledged")
        self.assertEqual(state["effects"]["doc-1"]["receipt"], {"ticket": "t-1"})
        self.assertEqual(state["effects"]["doc-2"]["state"], "started")
        self.assertEqual(state["counters"]["effect_attempts"], 2)
        self.assertEqual(state, run.state)

    # -- the journal as read by observers ------------------------------------------------
    def test_records_after_returns_exactly_the_records_after_n(self) -> None:
        task = self.new_task()
        store = self.create(task)
        self.assertEqual(store.records_after(0), ([], 1))
        genesis = store.state["head"]
        for rev in range(1, 7):
            store.commit(_util.transition_ops(rev))
            if rev in (3, 5):
                store.compact()
        reader = self.open(task)
        everything, oldest = reader.records_after(-1)
        self.assertEqual([r["rev"] for r in everything], list(range(oldest, 7)))
        self.assertChain(everything, genesis if oldest == 1 else everything[0]["prev"], store.state["head"])
        for n in range(-1, 9):
            records, held = reader.records_after(n)
            self.assertEqual(held, oldest)
            self.assertEqual([r["rev"] for r in records], list(range(max(n + 1, oldest), 7)), f"records_after({n})")
            self.assertEqual(records, [r for r in everything if r["rev"] > n])
        store.commit(_util.transition_ops(7))
        records, _held = reader.records_after(6)  # another object's commit is seen
        self.assertEqual([(r["rev"], r["ops"]) for r in records], [(7, _util.transition_ops(7))])
        self.assertEqual(reader.revision, 7)


# -- the stores ---------------------------------------------------------------------------

class FileStoreConformance(StoreConformance, unittest.TestCase):
    """The file store (``file:DIR``, one folder per run) keeps every claim of :class:`StoreConformance`."""

    kind = "file"
    #: Small enough that the processes sharing a run compact its journal under each other.
    shared_options = {"compact_min_bytes": 2048}

    def setUp(self) -> None:
        scratch = _util.scratch_dir("runner-conformance-")
        self.root = scratch.name
        self.addCleanup(scratch.cleanup)
        super().setUp()

    def url_for(self, task_id: str) -> str:
        return "file:" + os.path.join(self.root, task_id)

    def list_url(self) -> str:
        return "file:" + self.root

    def raw(self, task_id: str) -> Any:
        path = os.path.join(self.root, task_id)
        return {name: data for name, data in _util.contents(path).items() if name != "lock"}


#: Every row of one run, in key order: what ``raw`` returns for the database stores.
_ROW_QUERIES = (
    "SELECT task_id, identity, envelope, revision, head FROM runner_runs WHERE task_id = {m}",
    "SELECT key, effect FROM runner_effects WHERE task_id = {m} ORDER BY key",
    "SELECT rev, line FROM runner_journal WHERE task_id = {m} ORDER BY rev",
)


class SQLiteStoreConformance(StoreConformance, unittest.TestCase):
    """The SQLite store (``sqlite:PATH``, many runs in one file) keeps every claim of :class:`StoreConformance`."""

    kind = "sqlite"

    def setUp(self) -> None:
        scratch = _util.scratch_dir("runner-conformance-")
        self.database = os.path.join(scratch.name, "runs.db")
        self.addCleanup(scratch.cleanup)
        super().setUp()

    def url_for(self, task_id: str) -> str:
        return "sqlite:" + self.database

    def raw(self, task_id: str) -> Any:
        import sqlite3

        db = sqlite3.connect(self.database)
        try:
            return [[tuple(r) for r in db.execute(q.replace("{m}", "?"), (task_id,)).fetchall()] for q in _ROW_QUERIES]
        finally:
            db.close()


@_real.needs("PostgreSQL", why_not=_util.postgres_unavailable)
class PostgresStoreConformance(StoreConformance, unittest.TestCase):
    """The PostgreSQL store (``postgresql://``, many runs in one database) keeps every claim of :class:`StoreConformance`."""

    kind = "postgresql"
    worker_site = True

    def setUp(self) -> None:
        self.url = os.environ[POSTGRES_ENV]
        self.addCleanup(self._drop_runs)  # after every store and worker is closed
        super().setUp()

    def url_for(self, task_id: str) -> str:
        return self.url

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.url, autocommit=True)

    def raw(self, task_id: str) -> Any:
        with self._connect() as db:
            return [[tuple(r) for r in db.execute(q.replace("{m}", "%s"), (task_id,)).fetchall()] for q in _ROW_QUERIES]

    def _drop_runs(self) -> None:
        if not self.tasks:
            return
        with self._connect() as db:
            for table in ("runner_journal", "runner_effects", "runner_runs"):
                db.execute(f"DELETE FROM {table} WHERE task_id = ANY(%s)", (self.tasks,))


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
