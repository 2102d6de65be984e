"""The DBOS worked example of references/level-c.md, run for real (optional: needs ``pip install dbos``).

The example's code is read from the reference's ``python`` block under the
worked example's heading and written to a temporary module, so the page and
what runs here cannot drift apart. Each DBOS process is a child (DBOS is a
singleton per process), with its system database, the run's ``sqlite:``
store and the ticket service's ledger in one temporary folder:

1. a child runs one workflow normally: one ticket for its key;
2. a child runs a second workflow and is SIGKILLed inside the step right
   after ``invoke`` returned (the service committed the ticket, the ledger
   still says ``started``);
3. a new child calls the example's ``launch``, whose ``DBOS.launch()``
   recovers the pending workflow, and waits for it with
   ``DBOS.retrieve_workflow(...).get_result()``: still one ticket, the
   effect verified by observation, no second ``invoke``.

The children run in a venv that holds DBOS, in the real tests' cache
(``tests/support/engine_venv.py``), so this process needs none; like the other engine
tests, the class runs when ``RUNNER_REAL_TESTS=all`` asks for it
(``tests/support/real.py``).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
from typing import Any, Dict, List

if __name__ == "__main__":  # a child in the DBOS venv, where this folder is the first on sys.path
    from support import real as _real
else:
    from tests.support import real as _real

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
REFERENCE = os.path.join(REPO_ROOT, "references", "level-c.md")
HEADING = "## Worked example: the effect ledger inside a DBOS workflow step"
EXAMPLE_MODULE = "level_c_dbos_example"

TASK_ID = "dbos-example"
CONTRACT: Dict[str, Any] = {
    "contract": 1,
    "task_id": TASK_ID,
    "goal": "Open one ticket per case through a DBOS workflow step, each exactly once.",
    "steps": [{"id": "open-ticket", "artifact": "a ticket per case", "check": "ticket found by key", "next": "done"}],
    "effects": {"key_pattern": "case-[0-9]{5}:ticket", "adapter": "ticket service with Idempotency-Key", "verification": "lookup by key", "max_attempts": 3},
    "lease": {"ttl_seconds": 300},
}
CHILD_TIMEOUT = 60.0


def example_source() -> str:
    """The first ``python`` block after the worked example's heading."""
    with open(REFERENCE, encoding="utf-8") as handle:
        text = handle.read()
    start = text.index(HEADING)
    match = re.compile(r"^```python\n(.*?)^```$", re.S | re.M).search(text, start)
    if match is None:
        raise AssertionError(f"no python block under {HEADING!r} in {REFERENCE}")
    return match.group(1)


def payload_for(key: str) -> Dict[str, Any]:
    return {"marker": key, "title": f"ticket for {key}"}


# -- the child side: python tests/test_level_c_dbos.py ROLE ARGS_JSON ---------------------------

class _KillAfterInvoke:
    """The crash DBOS is for: the target commits, then the process dies before the step returns."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        self.inner.invoke(key, payload, epoch)
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


class _Counting:
    """Counts the calls that reach the target, so the parent can see what a re-run did."""

    calls: Dict[str, int] = {"invoke": 0, "observe": 0}

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        _Counting.calls["invoke"] += 1
        return self.inner.invoke(key, payload, epoch)

    def observe(self, key: str, payload: Dict[str, Any]) -> Any:
        _Counting.calls["observe"] += 1
        return self.inner.observe(key, payload)


def child_main(role: str, args: Dict[str, Any]) -> None:
    sys.path[:0] = [REPO_ROOT, args["folder"]]
    import importlib

    example = importlib.import_module(EXAMPLE_MODULE)
    from dbos import DBOS

    plain = example.ticket_adapter
    wrap = _KillAfterInvoke if role == "crash" else _Counting
    example.ticket_adapter = lambda url, task_id: wrap(plain(url, task_id))
    workflow = (args["store_url"], TASK_ID, args["service_url"], args["key"], payload_for(args["key"]))
    example.launch(args["system_db"])
    try:
        out: Dict[str, Any] = {}
        if role == "recover":
            handle = DBOS.retrieve_workflow(args["workflow_id"])
            out["ticket"] = handle.get_result(polling_interval_sec=0.1)
            out["status"] = handle.get_status().status
            out["calls"] = dict(_Counting.calls)
            # The workflow ID is the idempotency key: the recorded result comes back, the step does not run.
            out["again"] = example.open_ticket_once(args["workflow_id"], *workflow)
            out["calls_after_again"] = dict(_Counting.calls)
        else:
            out["ticket"] = example.open_ticket_once(args["workflow_id"], *workflow)
            out["calls"] = dict(_Counting.calls)
        print("RESULT " + json.dumps(out, sort_keys=True), flush=True)
    finally:
        DBOS.destroy()


# -- the parent side ------------------------------------------------------------------------------

@_real.needs("DBOS (the worked example of references/level-c.md)", engines=True)
class DBOSWorkedExampleTest(unittest.TestCase):
    """The reference's DBOS example: a step killed after the target committed is recovered without a second ticket."""

    @classmethod
    def setUpClass(cls) -> None:
        if REPO_ROOT not in sys.path:
            sys.path.insert(0, REPO_ROOT)
        from runner.stores import create_store
        from runner.proof.ticketservice import TicketServiceProcess
        from tests.support import engine_venv as _venv

        cls.python = _venv.tool_python("dbos", _venv.DBOS_REQUIREMENTS, maximum=_venv.DBOS_NEWEST_PYTHON)
        cls.folder = tempfile.mkdtemp(prefix="level-c-dbos-")
        try:
            with open(os.path.join(cls.folder, EXAMPLE_MODULE + ".py"), "w", encoding="utf-8") as handle:
                handle.write(example_source())
            cls.service = TicketServiceProcess(os.path.join(cls.folder, "tickets.db"))
            cls.store_url = "sqlite:" + os.path.join(cls.folder, "runs.db")
            create_store(cls.store_url, TASK_ID, CONTRACT).close()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        service = getattr(cls, "service", None)
        if service is not None:
            service.stop()
        shutil.rmtree(cls.folder, ignore_errors=True)

    def child(self, role: str, workflow_id: str, key: str) -> subprocess.CompletedProcess:
        args = {
            "folder": self.folder,
            "system_db": os.path.join(self.folder, "dbos.sqlite"),
            "store_url": self.store_url,
            "service_url": self.service.url,
            "workflow_id": workflow_id,
            "key": key,
        }
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env.pop("DBOS__VMID", None)
        env.pop("DBOS__APPVERSION", None)
        return subprocess.run(
            [self.python, os.path.abspath(__file__), role, json.dumps(args)],
            cwd=self.folder, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CHILD_TIMEOUT,
        )

    def result(self, proc: subprocess.CompletedProcess) -> Dict[str, Any]:
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        self.assertEqual(proc.returncode, 0, f"child failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        self.assertEqual(len(lines), 1, proc.stdout[-3000:])
        return json.loads(lines[0][len("RESULT "):])

    def ledger(self) -> Dict[str, Any]:
        from runner.stores import open_store

        store = open_store(self.store_url, TASK_ID)
        try:
            return store.state
        finally:
            store.close()

    def tickets(self, key: str) -> List[Dict[str, Any]]:
        return self.service.tickets_for_key(key)

    def test_a_workflow_run_normally_opens_one_ticket(self) -> None:
        key = "case-00001:ticket"
        out = self.result(self.child("run", "tickets-case-00001", key))
        tickets = self.tickets(key)
        self.assertEqual([t["ticket"] for t in tickets], [out["ticket"]])
        self.assertEqual(out["calls"], {"invoke": 1, "observe": 1})
        effect = self.ledger()["effects"][key]
        self.assertEqual((effect["state"], effect["attempts"]), ("verified", 1))
        self.assertEqual(effect["evidence"]["ticket"], out["ticket"])

    def test_a_step_killed_after_the_target_committed_is_recovered_without_a_second_ticket(self) -> None:
        key, workflow_id = "case-00002:ticket", "tickets-case-00002"
        crashed = self.child("crash", workflow_id, key)
        self.assertEqual(crashed.returncode, -signal.SIGKILL, f"{crashed.stdout[-2000:]}\n{crashed.stderr[-2000:]}")
        self.assertNotIn("RESULT ", crashed.stdout)
        self.assertEqual(len(self.tickets(key)), 1, "the service committed the ticket before the kill")
        state = self.ledger()
        self.assertEqual(state["effects"][key]["state"], "started", "the kill came before the ack was committed")
        self.assertEqual(state["lease"]["owner"], workflow_id, "the killed step never released the lease")
        epoch_at_crash = int(state["lease"]["epoch"])
        posts_at_crash = self.service.stats()["requests"]["post_tickets"]

        out = self.result(self.child("recover", workflow_id, key))
        self.assertEqual(self.service.stats()["requests"]["post_tickets"], posts_at_crash, "recovery sent the ticket service no second POST")
        tickets = self.tickets(key)
        self.assertEqual(len(tickets), 1, f"a second ticket for {key}: {tickets}")
        self.assertEqual(out["ticket"], tickets[0]["ticket"])
        self.assertEqual(out["status"], "SUCCESS")
        self.assertEqual(out["calls"], {"invoke": 0, "observe": 1}, "the re-run step observed the ticket and did not post again")
        self.assertEqual(out["again"], out["ticket"])
        self.assertEqual(out["calls_after_again"], out["calls"], "a finished workflow's step is not run again")

        state = self.ledger()
        effect = state["effects"][key]
        self.assertEqual((effect["state"], effect["attempts"]), ("verified", 1))
        self.assertEqual(effect["evidence"]["ticket"], out["ticket"])
        self.assertGreaterEqual(int(state["counters"].get("reconciled_effects", 0)), 1)
        self.assertIsNone(state["lease"]["owner"])
        self.assertGreater(int(state["lease"]["epoch"]), epoch_at_crash)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("run", "crash", "recover"):
        child_main(sys.argv[1], json.loads(sys.argv[2]))
    else:
        unittest.main()
