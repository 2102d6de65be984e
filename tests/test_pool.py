"""The worker pool (``runner.execution.pool``, the ``work`` verb) with real worker processes.

The handler is called as ``handler(store, owner, ttl, context)``; a observer
factory named by ``module:function`` is loaded in each worker and sees the
commit windows of every store it opens, which is how a worker is killed
here (``tests/support/scripts/pool_worker.py``); the supervisor breaks a dead worker's
leases, starts another in its place and tells ``on_exit``.
"""

import json
import os
import signal
import unittest
from typing import Any, Dict, List, Tuple

from runner.execution.pool import PoolOptions, run_pool
from tests.support import util as _util
from runner.stores import create_store, list_runs, open_store, run_url

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

HANDLER = "tests.support.scripts.pool_worker:handle"
OBSERVER = "tests.support.scripts.pool_worker:kill_once"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plan(task: str) -> Dict[str, Any]:
    return {"contract": 1, "task_id": task, "goal": "two steps", "steps": [{"id": "one", "next": "two"}, {"id": "two", "next": "done"}]}


class PoolTest(unittest.TestCase):
    def setUp(self) -> None:
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        self.root = tmp.name

    def make_runs(self, url: str, n: int) -> List[str]:
        if url.startswith("file:"):
            os.makedirs(url[5:], mode=0o700)
        tasks = [f"pool-r{i}" for i in range(n)]
        for task in tasks:
            store = create_store(run_url(url, task), task, plan(task))
            getattr(store, "close", lambda: None)()
        return tasks

    def pool(self, url: str, **options: Any) -> Tuple[Dict[str, Any], List[Tuple[str, int]], List[str]]:
        exits: List[Tuple[str, int]] = []
        lines: List[str] = []
        tally = run_pool(url, 2, HANDLER, PoolOptions(**dict({"ttl": 60, "seed": 4}, **options)),
                         on_exit=lambda owner, code: exits.append((owner, code)), on_line=lines.append)
        return tally, exits, lines

    def states(self, url: str) -> List[Dict[str, Any]]:
        states = []
        for task in list_runs(url):
            store = open_store(run_url(url, task), task)
            states.append(store.state)
            store.close()
        return states

    def test_every_run_is_finished_by_the_handler(self) -> None:
        url = "file:" + os.path.join(self.root, "runs")
        self.make_runs(url, 3)
        tally, exits, lines = self.pool(url)
        self.assertEqual((tally["workers"], tally["crashes"], tally["errors"]), (2, 0, []))
        self.assertEqual(sorted((owner.rsplit("-", 1)[1], code) for owner, code in exits), [("w1", 0), ("w2", 0)])
        self.assertEqual(len({owner.rsplit("-", 1)[0] for owner, _ in exits}), 1, "one supervisor's prefix, its own")
        self.assertEqual([s["status"] for s in self.states(url)], ["complete"] * 3)
        # Each run was taken to its end by exactly one handler call; a worker that came later found it complete.
        self.assertEqual(sorted(line.split()[1] for line in lines if line.startswith("outcome") and line.split()[2] == "finished"),
                         ["pool-r0", "pool-r1", "pool-r2"])
        self.assertEqual({line.split()[2] for line in lines if line.startswith("outcome")} - {"finished", "complete", "already-running"}, set())

    def test_the_former_name_runs_a_worker(self) -> None:
        # A supervisor of the previous release, running while its checkout is replaced, still starts -m runner.pool.
        url = "file:" + os.path.join(self.root, "runs")
        [task] = self.make_runs(url, 1)
        opts = {"handler": HANDLER, "store": url, "owner": "w1", "ttl": 60, "seed": 4}
        done = _util.run(_util.python("-m", "runner.pool", "--worker", json.dumps(opts)))
        self.assertEqual((done.code, done.out.splitlines()), (0, [f"claim {task}", f"outcome {task} finished"]), done)
        self.assertEqual([s["status"] for s in self.states(url)], ["complete"])

    def check_killed_and_replaced(self, url: str, window: str) -> None:
        self.make_runs(url, 3)
        context = {"window": window, "marker": os.path.join(self.root, "killed")}
        with _util.SQLiteConnections() as connections:
            tally, exits, lines = self.pool(url, observer=OBSERVER, context=context)
        self.assertEqual(connections.left_open(), 0, "the supervisor closes each store it opens")
        self.assertEqual(bool(connections.made), url.startswith("sqlite:"))
        self.assertEqual(tally["errors"], [])
        self.assertEqual((tally["workers"], tally["crashes"]), (3, 1))
        self.assertIn(f"fault {window}\n", lines)
        killed = [owner for owner, code in exits if code == -signal.SIGKILL]
        self.assertEqual(len(killed), 1)
        self.assertEqual(sorted(code for _, code in exits), [-signal.SIGKILL, 0, 0])
        states = self.states(url)
        self.assertEqual([s["status"] for s in states], ["complete"] * 3)
        # The run the dead worker held: its lease was broken by the supervisor, and a new owner finished it at a higher epoch.
        breaks = [o for s in states for o in s["observations"].get("authorization", {}).values() if o.get("source") == "lease break"]
        self.assertEqual([(b["by"], b["owner"]) for b in breaks], [("pool-supervisor", killed[0])])
        taken_over = [s for s in states if int(s["counters"].get("recoveries", 0)) >= 1]
        self.assertEqual(len(taken_over), 1)
        self.assertGreaterEqual(taken_over[0]["lease"]["epoch"], 2)

    def test_a_worker_killed_at_a_window_of_the_file_store_is_replaced(self) -> None:
        self.check_killed_and_replaced("file:" + os.path.join(self.root, "runs"), "step:after-start")

    def test_a_worker_killed_at_a_window_of_the_sqlite_store_is_replaced(self) -> None:
        self.check_killed_and_replaced("sqlite:" + os.path.join(self.root, "runs.db"), "store:after-db-commit")

    def test_a_worker_that_stops_renewing_its_lease_is_killed_and_replaced(self) -> None:
        # Its handler takes the lease and does not return for 20 s: the lease (2 s) expires while the worker lives.
        url = "file:" + os.path.join(self.root, "runs")
        self.make_runs(url, 1)
        exits: List[Tuple[str, int]] = []
        options = PoolOptions(ttl=2, seed=4, context={"marker": os.path.join(self.root, "hung"), "hang": 20})
        tally = run_pool(url, 1, "tests.support.scripts.pool_worker:hang_once", options,
                         on_exit=lambda owner, code: exits.append((owner, code)))
        self.assertEqual((tally["stuck"], tally["crashes"], tally["workers"], tally["errors"]), (1, 1, 2, []))
        self.assertEqual([code for _, code in exits], [-signal.SIGKILL, 0], "killed, then its replacement finished")
        state = self.states(url)[0]
        self.assertEqual(state["status"], "complete")
        breaks = [o for o in state["observations"].get("authorization", {}).values() if o.get("source") == "lease break"]
        self.assertEqual([b["owner"] for b in breaks], [], "its lease had expired: nothing was left to break")
        self.assertEqual(state["lease"]["epoch"], 2, "the replacement took the lapsed lease at the next epoch")

    def test_the_work_verb_runs_the_pool(self) -> None:
        url = "file:" + os.path.join(self.root, "runs")
        self.make_runs(url, 2)
        result = _util.run(_util.python("-m", "runner", "--store", url, "--json", "work", "--workers", "2", "--handler", HANDLER), cwd=REPO)
        self.assertEqual(result.code, 0, result.err)
        out = json.loads(result.out)
        self.assertEqual((out["ok"], out["workers"], out["crashes"], out["errors"]), (True, 2, 0, []))
        self.assertEqual([s["status"] for s in self.states(url)], ["complete"] * 2)

    def test_a_handler_in_the_working_folder_loads_with_the_runner_started_by_its_path(self) -> None:
        project = os.path.join(self.root, "project")
        os.makedirs(os.path.join(project, "my_agent"))
        with open(os.path.join(project, "my_agent", "__init__.py"), "w", encoding="utf-8") as handle:
            handle.write("")
        with open(os.path.join(project, "my_agent", "worker.py"), "w", encoding="utf-8") as handle:
            handle.write("from tests.support.scripts.pool_worker import handle  # noqa: F401\n")
        url = "sqlite:" + os.path.join(project, "runs.db")
        self.make_runs(url, 2)
        # No PYTHONPATH: the handler's module is found in the working folder, as `python3 -m` would find it.
        argv = _util.python(os.path.join(REPO, "runner"), "--store", "sqlite:runs.db", "--json", "work", "--workers", "2",
                            "--handler", "my_agent.worker:handle")
        result = _util.run(argv, cwd=project, env=_util.child_env(pythonpath=False))
        self.assertEqual(result.code, 0, result.err)
        self.assertEqual((json.loads(result.out)["crashes"], [s["status"] for s in self.states(url)]), (0, ["complete"] * 2))

    def test_work_refuses_a_hooks_factory_that_does_not_load(self) -> None:
        url = "file:" + os.path.join(self.root, "runs")
        self.make_runs(url, 1)
        before = self.states(url)
        argv = _util.python("-m", "runner", "--store", url, "work", "--handler", HANDLER, "--observer", "tests.support.scripts.pool_worker:no_such")
        result = _util.run(argv, cwd=REPO)
        self.assertEqual(result.code, 2, result.err)
        self.assertIn("cannot load observer factory", result.err)
        self.assertEqual(len(result.err.strip().splitlines()), 1, result.err)
        self.assertEqual(self.states(url), before, "nothing was claimed or written")


if __name__ == "__main__":
    unittest.main()
