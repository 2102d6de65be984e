"""Zombie workers on the PostgreSQL store: two ``work`` pools, one worker stopped past its lease, then continued.

Two hosts are simulated by two ``work`` pools (two supervisors started with
the command line, each with its own worker processes) on one PostgreSQL
database, which the test creates for itself so that the pools see only its
run. The run's one step files a ticket with the loopback ticket service,
whose adapter sends the lease's epoch and the run id, so the service refuses
an epoch below the highest it has seen for the run.

A worker of pool A is stopped with SIGSTOP at a chosen point (between two
transactions, or inside one, holding the run's row lock), its supervisor with
it (a host paused as a whole: a supervisor that runs on kills a worker that
keeps a lapsed lease), kept stopped past its lease's expiry while a worker of
pool B takes the run over at a higher epoch and finishes it, and then
continued with SIGCONT, its supervisor after it. What the continued worker
does is fixed by ``tests/support/scripts/zombie_worker.py``: it goes on with what it was
doing, and once refused, tries one more store write and one more ticket call
with its old epoch. Every one of those late writes must be refused, by the
store (``Fenced``) and by the service (412, stale epoch); the run must end
complete with one ticket for its key, and the journal must show the takeover
and no record written at the old epoch after it. A real-system test
(``tests/support/real.py``): it runs when ``RUNNER_REAL_TESTS`` asks for it.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest
import urllib.parse
from typing import Any, Callable, Dict, List, Optional, Tuple

from runner.calls import inflight
from runner.base.times import parse_time
from runner.ledger.lease import lease_view
from runner.proof.ticketservice import TicketServiceProcess
from runner.stores import create_store, open_store

try:
    from .support import real as _real, util as _util
    from .support.scripts import zombie_worker
except ImportError:
    from support import real as _real
    from support import util as _util
    from support.scripts import zombie_worker

POSTGRES_ENV = _util.POSTGRES_ENV
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANDLER = "tests.support.scripts.zombie_worker:handle"
OBSERVER = "tests.support.scripts.zombie_worker:observer"
STEP = "file-ticket"
#: Seconds any one condition may take before the test fails (the whole test takes a few seconds).
PATIENCE = 30.0


def _postgres_unavailable() -> Optional[str]:
    """Why these tests cannot run here, or None when they can."""
    if not os.path.isdir("/proc/self"):
        return "the stopped worker is watched through /proc, which this system does not have"
    return _util.postgres_unavailable()



def _process_state(pid: int) -> Optional[str]:
    """The kernel's one-letter state of ``pid`` (``T``: stopped), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@_real.needs("PostgreSQL", why_not=_postgres_unavailable)
class ZombieWorkerTest(unittest.TestCase):
    def setUp(self) -> None:
        tmp = _util.scratch_dir("runner-zombie-")
        self.addCleanup(tmp.cleanup)
        self.root = tmp.name
        self.url = self._fresh_database()
        self.task = "zombie-run"
        create_store(self.url, self.task, {"contract": 1, "task_id": self.task, "goal": "file one ticket",
                                           "steps": [{"id": STEP, "next": "done"}]}).close()
        self.addCleanup(self._remove_registry)
        self.service = TicketServiceProcess(os.path.join(self.root, "tickets.db"))
        self.addCleanup(self.service.stop)
        self.context: Dict[str, Any] = {
            "events": os.path.join(self.root, "events.jsonl"),
            "go": os.path.join(self.root, "go"),
            "marker": os.path.join(self.root, "paused"),
            "service": self.service.url,
        }
        self.pools: List["subprocess.Popen[str]"] = []
        self.addCleanup(self._end_pools)

    # -- fixtures ----------------------------------------------------------------------
    def _remove_registry(self) -> None:
        """The run's calls in flight (a killed worker's stay by design) go with its database, which is dropped next."""
        store = open_store(self.url, self.task)
        try:
            folder = inflight.registry_for(store).folder
        finally:
            store.close()
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(folder))  # the machine-wide folder, when no other run's calls are in it

    def _fresh_database(self) -> str:
        """A database of its own on the test server (the pools claim every run of their database), dropped afterwards."""
        import psycopg

        base = os.environ[POSTGRES_ENV]
        name = f"runner_zombie_{os.getpid()}_{int(time.time() * 1000) % 10 ** 8}"
        try:
            with psycopg.connect(base, autocommit=True) as db:
                db.execute(f'CREATE DATABASE "{name}"')
        except psycopg.Error as exc:
            _real.missing(f"the PostgreSQL user of {POSTGRES_ENV} cannot create a database for the pools: {' '.join(str(exc).split())[:200]}")

        def drop() -> None:
            with psycopg.connect(base, autocommit=True) as db:
                db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
                db.execute(f'DROP DATABASE IF EXISTS "{name}"')

        self.addCleanup(drop)
        parts = urllib.parse.urlsplit(base)
        return urllib.parse.urlunsplit(parts._replace(path="/" + name))

    def _end_pools(self) -> None:
        """Let a paused worker go on and every pool end; kill a pool (our child) only if it does not."""
        open(self.context["go"], "a").close()
        for event in zombie_worker.read_events(self.context["events"]):
            if event["event"] == "paused" and _process_state(event["pid"]) == "T":
                os.kill(event["pid"], signal.SIGCONT)
        for proc in self.pools:
            if proc.poll() is None and _process_state(proc.pid) == "T":
                os.kill(proc.pid, signal.SIGCONT)
            try:
                proc.communicate(timeout=PATIENCE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()

    def start_pool(self, ttl: float) -> "subprocess.Popen[str]":
        """A ``work`` pool of one worker, started from the command line: its own supervisor and worker processes."""
        argv = [sys.executable, "-m", "runner", "--store", self.url, "--json", "work", "--workers", "1", "--handler", HANDLER,
                "--observer", OBSERVER, "--context", json.dumps(self.context), "--ttl", str(ttl)]
        env = dict(os.environ, PYTHONPATH=REPO + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
        proc = subprocess.Popen(argv, cwd=self.root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.pools.append(proc)
        return proc

    def finish(self, proc: "subprocess.Popen[str]") -> Dict[str, Any]:
        """Wait for a pool to end; its tally, after checking that it ended well."""
        out, err = proc.communicate(timeout=PATIENCE)
        self.assertEqual(proc.returncode, 0, err)
        tally = json.loads(out)
        self.assertEqual((tally["ok"], tally["workers"], tally["crashes"], tally["errors"]), (True, 1, 0, []), tally)
        return tally

    def wait_for(self, what: str, check: Callable[[], Any], alive: Tuple["subprocess.Popen[str]", ...] = ()) -> Any:
        """Poll ``check`` until it returns something true; fail if that takes too long or a pool that must run ended."""
        deadline = time.monotonic() + PATIENCE
        while True:
            value = check()
            if value:
                return value
            for proc in alive:
                if proc.poll() is not None:
                    self.fail(f"waiting for {what}: a pool ended early: {proc.communicate()}")
            if time.monotonic() > deadline:
                self.fail(f"waited {PATIENCE:g} s for {what}")
            time.sleep(0.02)

    def sessions_idle_in_transaction(self) -> int:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as db:
            row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'").fetchone()
        return int(row[0])

    def events(self, event: Optional[str] = None) -> List[Dict[str, Any]]:
        found = zombie_worker.read_events(self.context["events"])
        return [e for e in found if event is None or e["event"] == event]

    def state(self) -> Dict[str, Any]:
        store = open_store(self.url, self.task)
        try:
            return store.state
        finally:
            store.close()

    def journal(self) -> List[Dict[str, Any]]:
        store = open_store(self.url, self.task)
        try:
            return store.records_after(0)[0]
        finally:
            store.close()

    # -- the scenario ------------------------------------------------------------------------
    def check_zombie(self, pause: Dict[str, Any], stopped: str, expected: Tuple[int, int], started_durable: bool) -> None:
        self.context.update(pause=pause, stop_supervisor=True)
        pool_a = self.start_pool(ttl=2)
        paused = self.wait_for("pool A's worker to reach the pause", lambda: self.events("paused"), alive=(pool_a,))[0]
        zombie, old_epoch = paused["pid"], paused["epoch"]
        # The worker sent its supervisor SIGSTOP as it paused; the kernel stops it a moment later.
        self.wait_for("pool A's supervisor to stop", lambda: _process_state(pool_a.pid) == "T")
        os.kill(zombie, signal.SIGSTOP)
        self.wait_for("the worker to stop", lambda: _process_state(zombie) == "T")
        open(self.context["go"], "x").close()  # seen only once it is continued
        if not started_durable:
            # Stopped inside its transaction: the server ends that session after lock_hold seconds, row lock and all.
            self.assertEqual(self.sessions_idle_in_transaction(), 1)
            self.wait_for("the server to end the stopped worker's session", lambda: self.sessions_idle_in_transaction() == 0)
        expires = parse_time(self.state()["lease"]["expires_at"])
        self.wait_for("the stopped worker's lease to expire", lambda: time.time() > expires and not lease_view(self.state(), time.time())["live"])

        pool_b = self.start_pool(ttl=2)
        self.finish(pool_b)
        taken = self.state()
        self.assertEqual(taken["status"], "complete")
        self.assertGreater(taken["lease"]["epoch"], old_epoch)
        self.assertEqual(_process_state(zombie), "T", "the zombie stayed stopped while the run was taken over and finished")

        os.kill(zombie, signal.SIGCONT)
        os.kill(pool_a.pid, signal.SIGCONT)
        self.assertEqual(self.finish(pool_a)["stuck"], 0, "the lease it kept had passed to pool B before its supervisor looked again")

        events = self.events()
        self.assertEqual([e for e in events if e["event"] == "accepted"], [], "a late write was accepted")
        late = [e for e in events if e["pid"] == zombie and e["event"] == "refused"]
        refused_store = sum(1 for e in late if e["by"] == "store")
        refused_service = sum(1 for e in late if e["by"] == "service")
        self.assertTrue(all(e["epoch"] == old_epoch for e in late), late)
        self.assertEqual((refused_store, refused_service), expected, late)
        self.assertEqual([e for e in events if e["pid"] == zombie and e["event"] == "invoked"], [], "the zombie's call created nothing")
        self.assertEqual([e["event"] for e in events if e["pid"] == zombie][:3], ["claimed", "paused", "resumed"])

        # The service: one ticket for the key, filed at the new epoch; it refused exactly the zombie's calls.
        key = zombie_worker.ticket_key(self.task, STEP)
        tickets = self.service.tickets_for_key(key)
        stats = self.service.stats()
        self.assertEqual([t["epoch"] for t in tickets], [taken["lease"]["epoch"]])
        self.assertEqual((stats["tickets"], stats["duplicates"]), (1, 0))
        self.assertEqual(stats["requests"]["refused_stale"], refused_service)

        # The store: the run finished once, the journal shows the takeover, and nothing at the old epoch after it.
        final = self.state()
        self.assertEqual((final["status"], final["revision"], final["head"]), (taken["status"], taken["revision"], taken["head"]),
                         "the zombie changed nothing")
        self.assertEqual(final["effects"][key]["state"], "verified")
        records = self.journal()
        acquired = [(r["rev"], op[2]["owner"], op[2]["epoch"], any(o[1] == ["counters", "recoveries"] for o in r["ops"]))
                    for r in records for op in r["ops"] if op[1] == ["lease"] and op[2]["owner"] is not None]
        self.assertEqual(len(acquired), 2, acquired)
        (_, first_owner, first_epoch, _), (takeover_rev, second_owner, second_epoch, recovery) = acquired
        self.assertEqual(first_epoch, old_epoch)
        self.assertNotEqual(first_owner, second_owner, "the two pools' workers have distinct owner ids")
        self.assertTrue(recovery and second_epoch > first_epoch, acquired)
        takeovers = sum(1 for *_, counted in acquired if counted)
        self.assertEqual([r["rev"] for r in records if r["rev"] > takeover_rev and r["epoch"] == old_epoch], [])
        started_at_old_epoch = [r["rev"] for r in records if r["epoch"] == old_epoch and any(op[1][:2] == ["effects", key] for op in r["ops"])]
        self.assertEqual(bool(started_at_old_epoch), started_durable, "the zombie's 'started' is durable only if it was stopped after its commit")
        completions = [r["rev"] for r in records for op in r["ops"] if op[1] == ["status"] and op[2] == "complete"]
        self.assertEqual(len(completions), 1, completions)
        self.assertEqual(int(final["counters"]["recoveries"]), 1)
        print(f"\nzombie-check: pools=2 takeovers={takeovers} refused_store={refused_store} refused_service={refused_service} "
              f"duplicates={stats['duplicates']} stopped={stopped}", flush=True)

    def test_a_worker_stopped_between_transactions_is_refused_by_the_store_and_the_service(self) -> None:
        # Stopped with ``started`` durable and the ticket not yet asked for: when continued, it calls the
        # service (412), records the outcome (fenced), then tries step done (fenced) and the call again (412).
        self.check_zombie({"window": "effect:after-started"}, "between-transactions", expected=(2, 2), started_durable=True)

    def test_a_worker_stopped_inside_a_transaction_is_refused_by_the_store_and_the_service(self) -> None:
        # Stopped holding the row lock with ``started`` written but not committed: the server ends its
        # session after lock_hold seconds, so the takeover waits for that; when continued, its commit finds
        # the session gone, the store tries again on a new one and fences it; then step done (fenced) and
        # the ticket call (412).
        self.check_zombie({"window": "store:before-db-commit", "after": ["effect:before-started", {}]}, "inside-a-transaction",
                          expected=(2, 1), started_durable=False)

    def test_two_pools_name_their_workers_apart(self) -> None:
        # A live worker of pool A holds the lease (paused just after taking it, not stopped, long TTL).
        # Pool B's first worker must see the run as already running, not take it as the same owner.
        self.context["pause"] = {"window": "lease:after-acquire"}
        pool_a = self.start_pool(ttl=60)
        paused = self.wait_for("pool A's worker to take the lease", lambda: self.events("paused"), alive=(pool_a,))[0]
        pool_b = self.start_pool(ttl=60)
        self.finish(pool_b)
        lease = self.state()["lease"]
        self.assertEqual((lease["owner"], lease["epoch"]), (paused["owner"], paused["epoch"]), "pool B left pool A's live lease alone")
        claims = [e for e in self.events("claimed") if e["pid"] != paused["pid"]]
        self.assertEqual([e["reason"] for e in claims], ["already-running"])
        self.assertNotEqual(claims[0]["owner"], paused["owner"])
        open(self.context["go"], "x").close()
        self.finish(pool_a)
        final = self.state()
        self.assertEqual((final["status"], final["lease"]["epoch"]), ("complete", paused["epoch"]))


if __name__ == "__main__":
    unittest.main()
