"""Recovery claims of the runner, proved with real processes.

An agent here is :class:`Agent`: it knows how to do the work of each step of
the test contract (write an artifact, apply a change at a target through the
effect verbs, run the long test job) and otherwise does only what
``next --json`` names. The agent of the test process calls the command line
in a child process per verb. A worker that is killed is a child process
running the same agent, which calls the command line's ``main`` with the
argument vector a shell would pass; it stops at a named point and the test
sends it SIGKILL. Recovery always happens in another process, which starts
with ``recover --owner NEW --json`` and then follows ``next`` alone.

The test contract is the minute-37 scenario: ``analysis`` -> ``edits`` (an
external effect, ``patch:apply``) -> ``tests`` (a long job under the key
``tests``) -> ``deliver``. The job runs four shards; from shard 2 on it waits
for a gate file, so a test decides whether the job is still running, has
finished or has vanished when recovery begins.

Child programs are this module's :func:`worker_main`.
"""

import contextlib
import copy
import glob
import hashlib
import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import unittest
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

try:
    from . import _util
except ImportError:  # run from inside tests/
    import _util  # type: ignore[no-redef]

from runner.contract import load_contract
from runner.envelope import content_digest, format_time, parse_time
from runner.errors import EXIT_CODES
from runner.jobs import observe_job
from runner.recovery import decide, recover, refresh_jobs
from runner.views import brief as render_brief
from runner.run import Run, submit_job
from runner.stores.file import JOURNAL, RunStore

TASK_ID = "minute-37"
#: Lease time to live of a worker that will be killed; it renews the lease as it works.
WORKER_TTL = 0.5
#: Lease time to live of a worker that takes over.
TAKEOVER_TTL = 60.0
#: Upper bound on any wait for another process.
DEADLINE = 30.0
STEPS = ("analysis", "edits", "tests", "deliver")
PATCH_KEY = "patch:apply"
ALL_CODES = (0, 2, 3, 4, 5, 6, 7, 8, 9, 10)
DECISION_KEYS = ("decision", "action", "reason", "observations", "inferences", "unknowns")

#: The long test job: prints its starting cursor, then one line per shard; shards 2 and 3 wait for the gate.
JOB_SCRIPT = r"""
import os, sys, time
cursor = int(os.environ.get("RUNNER_JOB_CURSOR", "0"))
print("cursor %d" % cursor, flush=True)
gate = sys.argv[1]
deadline = time.monotonic() + 60
for shard in range(cursor, 4):
    while shard >= 2 and not os.path.exists(gate):
        if time.monotonic() > deadline:
            print("the gate never opened", flush=True)
            sys.exit(3)
        time.sleep(0.01)
    print("shard %d ok" % shard, flush=True)
print("tests passed", flush=True)
"""

CHILD_MAIN = "import sys; from tests.test_recovery import worker_main; sys.exit(worker_main(sys.argv[1]))"


def contract_block(rerun_vanished: bool = False, extra_step: bool = False) -> Dict[str, Any]:
    steps = [
        {"id": "analysis", "artifact": "work/analysis.md", "check": "file exists; sha256 recorded", "evidence": ["sha256"], "next": "edits"},
        {"id": "edits", "artifact": "work/change.patch", "check": "the patch is applied at the target", "evidence": ["sha256", "applied"], "next": "tests"},
        {"id": "tests", "artifact": "the log of job tests", "check": "the job exits 0", "evidence": ["exit_code", "log_sha256"], "next": "deliver"},
        {"id": "deliver", "artifact": "work/delivery.md", "check": "file exists; sha256 recorded", "evidence": ["sha256"], "next": "done"},
    ]
    if extra_step:
        steps[2]["next"] = "review"
        steps.insert(3, {"id": "review", "artifact": "review notes", "check": "a person read the diff", "evidence": ["verdict"], "next": "deliver"})
    return {
        "contract": 1,
        "task_id": TASK_ID,
        "goal": "Find the failing test's cause, change the code, run the long test suite, deliver the patch.",
        "steps": steps,
        "effects": {"key_pattern": "[a-z0-9][a-z0-9:._-]*"},
        "retry": {"base_seconds": 0.01, "cap_seconds": 0.02},
        "lease": {"ttl_seconds": 60},
        "jobs": {"rerun_vanished": rerun_vanished},
    }


def sha256_file(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


class World:
    """One run with its folders: the run, the agent's work files, the external target, the job's gate."""

    def __init__(self, root: str, rerun_vanished: bool = False) -> None:
        self.root = root
        self.rerun_vanished = rerun_vanished
        self.run = os.path.join(root, "run")
        self.work = os.path.join(root, "work")
        self.target = os.path.join(root, "target")
        self.gate = os.path.join(root, "gate")
        self.contract = os.path.join(root, "contract.md")
        for folder in (self.work, self.target):
            os.makedirs(folder, exist_ok=True)
        if not os.path.exists(self.contract):
            _util.write_contract(self.contract, contract_block(rerun_vanished))

    def spec(self) -> Dict[str, Any]:
        return {"root": self.root, "rerun_vanished": self.rerun_vanished}

    def create_run(self) -> None:
        block = load_contract(self.contract)
        store = RunStore.create(self.run, block["task_id"], block)
        store.fs.close()  # type: ignore[attr-defined]

    def job_command(self) -> List[str]:
        return [sys.executable, "-S", "-c", JOB_SCRIPT, self.gate]

    def open_gate(self) -> None:
        write_text(self.gate, "open\n")

    def state(self) -> Dict[str, Any]:
        store = RunStore.open(self.run)
        try:
            return copy.deepcopy(store.state)
        finally:
            store.fs.close()  # type: ignore[attr-defined]

    def records(self) -> List[Dict[str, Any]]:
        store = RunStore.open(self.run)
        try:
            records, oldest = store.records_after(0)
        finally:
            store.fs.close()  # type: ignore[attr-defined]
        assert oldest == 1, f"the journal no longer starts at revision 1 (oldest {oldest})"
        return records

    def pid_files(self) -> List[str]:
        return sorted(glob.glob(os.path.join(self.run, "jobs", "*", "a*", "pid.json")))

    def job_log(self, attempt: int) -> str:
        logs = glob.glob(os.path.join(self.run, "jobs", "*", f"a{attempt}", "log"))
        if not logs:
            return ""
        with open(logs[0], encoding="utf-8", errors="replace") as handle:
            return handle.read()

    # -- the external target of effect patch:apply -----------------------------------
    def _target_file(self, key: str) -> str:
        return os.path.join(self.target, hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")

    def invoke(self, key: str, payload: Dict[str, Any]) -> Dict[str, Any]:
        digest = content_digest(payload)
        with open(os.path.join(self.target, "invocations.log"), "a", encoding="utf-8") as handle:
            handle.write(f"{key} {digest}\n")
        write_text(self._target_file(key), json.dumps({"key": key, "payload_digest": digest}))
        return {"change_id": os.path.basename(self._target_file(key))[:16]}

    def observe(self, key: str, payload: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        try:
            with open(self._target_file(key), encoding="utf-8") as handle:
                found = json.load(handle)
        except FileNotFoundError:
            return None
        if found.get("payload_digest") != content_digest(payload):
            return None
        return {"change_id": os.path.basename(self._target_file(key))[:16], "payload_digest": found["payload_digest"]}

    def invocations(self) -> List[str]:
        try:
            with open(os.path.join(self.target, "invocations.log"), encoding="utf-8") as handle:
                return handle.read().splitlines()
        except FileNotFoundError:
            return []

    def patch_payload(self) -> Dict[str, Any]:
        return {"patch_sha256": sha256_file(os.path.join(self.work, "change.patch"))}


# -- the command line, called two ways ------------------------------------------------

CLI = Callable[[Sequence[str]], _util.Result]


def subprocess_cli(argv: Sequence[str]) -> _util.Result:
    """One child process per verb: ``python -m runner ARGV``."""
    return _util.run_cli(*argv, timeout=DEADLINE)


def inprocess_cli(argv: Sequence[str]) -> _util.Result:
    """The command line's ``main`` with ``argv``, its stdout and stderr captured."""
    from runner import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return _util.Result(code, out.getvalue(), err.getvalue())


class AgentError(AssertionError):
    pass


class Agent:
    """Does the work of each step of the contract; every other choice comes from ``next --json``."""

    def __init__(
        self,
        world: World,
        cli: CLI,
        owner: str,
        *,
        pause_at: Sequence[str] = (),
        emit: Optional[Callable[[str, Any], None]] = None,
        heartbeat: Optional[float] = None,
        commit_shards: bool = False,
        poll: float = 0.02,
    ) -> None:
        self.world = world
        self.cli = cli
        self.owner = owner
        self.epoch: Optional[int] = None
        self.pause_at = set(pause_at)
        self.emit = emit
        self.heartbeat = heartbeat
        self.commit_shards = commit_shards
        self.poll = poll
        self._renewed = 0.0
        #: Each action taken, as named by ``next``: kind, step, key.
        self.trace: List[Dict[str, Any]] = []

    # -- verbs ---------------------------------------------------------------------------
    def _argv(self, verb: str, rest: Sequence[str], fenced: bool) -> List[str]:
        argv = ["--dir", self.world.run, "--json", verb]
        if fenced:
            argv += ["--owner", self.owner, "--epoch", str(self.epoch)]
        return argv + list(rest)

    def verb(self, verb: str, *rest: str, fenced: bool = True, codes: Sequence[int] = (0,)) -> Tuple[int, Dict[str, Any]]:
        if fenced and self.heartbeat:
            self._beat()
        result = self.cli(self._argv(verb, rest, fenced))
        if result.code == 9 and fenced and self.heartbeat:
            self.acquire(self.heartbeat)  # the lease lapsed between beats; nothing was written
            result = self.cli(self._argv(verb, rest, fenced))
        if result.code not in codes:
            raise AgentError(f"{verb} {' '.join(rest)[:200]} exited {result.code}: {result.out.strip()[:500]} {result.err.strip()[:500]}")
        return result.code, _util.one_json(result)

    def _beat(self) -> None:
        """Renew the lease once a third of its time to live has passed (re-take it if it lapsed)."""
        assert self.heartbeat is not None
        if time.monotonic() - self._renewed < self.heartbeat / 3:
            return
        self._renewed = time.monotonic()
        result = self.cli(self._argv("lease", ["renew", "--ttl", str(self.heartbeat)], True))
        if result.code != 0:
            self.acquire(self.heartbeat)

    def acquire(self, ttl: float) -> int:
        self._renewed = time.monotonic()
        result = self.cli(["--dir", self.world.run, "--json", "lease", "acquire", "--owner", self.owner, "--ttl", str(ttl)])
        if result.code != 0:
            raise AgentError(f"lease acquire exited {result.code}: {result.out} {result.err}")
        self.epoch = int(_util.one_json(result)["epoch"])
        return self.epoch

    def recover(self, ttl: float = TAKEOVER_TTL) -> Tuple[int, Dict[str, Any]]:
        """``recover --owner OWNER --json`` until the dead worker's lease has expired (bounded)."""
        deadline = time.monotonic() + DEADLINE
        while True:
            result = self.cli(["--dir", self.world.run, "--json", "recover", "--owner", self.owner, "--ttl", str(ttl)])
            decision = _util.one_json(result)
            if result.code != 3:
                break
            if time.monotonic() > deadline:
                raise AgentError(f"the lease never expired: {decision}")
            time.sleep(self.poll)
        if "lease" not in decision:
            raise AgentError(f"recover exited {result.code}: {result.out} {result.err}")
        self.epoch = int(decision["lease"]["epoch"])
        return result.code, decision

    def peek(self) -> Dict[str, Any]:
        """``next --json`` without an owner, once the dead worker's lease has expired (bounded)."""
        deadline = time.monotonic() + DEADLINE
        while True:
            code, decision = self.verb("next", fenced=False, codes=ALL_CODES)
            if code != 3:
                return {"code": code, "decision": decision}
            if time.monotonic() > deadline:
                raise AgentError(f"the lease never expired: {decision}")
            time.sleep(self.poll)

    def next(self) -> Tuple[int, Dict[str, Any]]:
        return self.verb("next", codes=ALL_CODES)

    # -- the loop ------------------------------------------------------------------------
    def drive(self, max_actions: int = 60) -> Tuple[int, Dict[str, Any]]:
        """Follow ``next`` until it names a stop; return its exit code and decision."""
        for _ in range(max_actions):
            code, decision = self.next()
            if code != 0:
                return code, decision
            self.act(decision["action"])
        raise AgentError(f"no stop after {max_actions} actions: {self.trace[-5:]}")

    def act(self, action: Dict[str, Any]) -> None:
        kind = action["kind"]
        self.trace.append({"kind": kind, "step": action.get("step"), "key": action.get("key")})
        if kind == "start-step":
            step = action["step"]
            self.verb("step", "start", step)
            self.pause(f"after-step-start:{step}")
            self.finish(step, self.work(step, resumed=False))
        elif kind == "resume-step":
            step = action["step"]
            self.finish(step, self.work(step, resumed=True))
        elif kind == "reconcile":
            self.reconcile(action["key"])
        elif kind == "wait-job":
            self.wait_job(action["key"])
        elif kind == "read-job":
            self.verb("job", "result", action["key"])
        elif kind == "rerun-job":
            self.verb("job", "submit", action["key"], "--", *action["command"])
        elif kind == "check-job":
            self.verb("job", "status", action["key"])
        else:
            raise AgentError(f"the agent cannot perform {action}")

    def pause(self, label: str) -> None:
        """Stop here (announced on stdout) until killed; a closed stdin means the test is gone."""
        if label in self.pause_at and self.emit is not None:
            self.emit("PAUSED", {"label": label})
            sys.stdin.read()
            os._exit(70)

    def finish(self, step: str, evidence: Dict[str, Any]) -> None:
        self.verb("step", "done", step, "--evidence", json.dumps(evidence, sort_keys=True))

    # -- the work of each step -----------------------------------------------------------
    def work(self, step: str, resumed: bool) -> Dict[str, Any]:
        if step == "analysis":
            return {"sha256": self.artifact("analysis.md", "The failing test reads a stale cache entry.\n")}
        if step == "edits":
            digest = self.artifact("change.patch", "--- a/cache.py\n+++ b/cache.py\n@@ -1 +1 @@\n-ttl = None\n+ttl = 60\n")
            return {"sha256": digest, "applied": self.apply_patch(resumed)}
        if step == "tests":
            return self.run_tests(resumed)
        if step == "deliver":
            return {"sha256": self.artifact("delivery.md", "Patch delivered with a passing test log.\n")}
        raise AgentError(f"unknown step {step}")

    def artifact(self, name: str, text: str) -> str:
        """Check the artifact; write it only if it is missing or wrong."""
        path = os.path.join(self.world.work, name)
        want = hashlib.sha256(text.encode()).hexdigest()
        if not os.path.exists(path) or sha256_file(path) != want:
            write_text(path, text)
        return want

    def apply_patch(self, resumed: bool) -> Dict[str, Any]:
        payload = self.world.patch_payload()
        if resumed:
            code, effect = self.verb("effect", "show", PATCH_KEY, codes=(0, 2))
            if code == 0 and effect["state"] == "verified":
                return effect["evidence"]
        payload_file = os.path.join(self.world.work, "patch-payload.json")
        write_text(payload_file, json.dumps(payload))
        self.verb("effect", "begin", PATCH_KEY, "--payload", payload_file)
        receipt = self.world.invoke(PATCH_KEY, payload)
        self.pause(f"after-effect-invoke:{PATCH_KEY}")
        self.verb("effect", "ack", PATCH_KEY, "--receipt", json.dumps(receipt))
        seen = self.world.observe(PATCH_KEY, payload)
        if seen is None:
            raise AgentError("the target does not show the change it acknowledged")
        self.verb("effect", "verify", PATCH_KEY, "--evidence", json.dumps(seen))
        return seen

    def reconcile(self, key: str) -> None:
        seen = self.world.observe(key, self.world.patch_payload())
        if seen is not None:
            self.verb("effect", "verify", key, "--evidence", json.dumps(seen))
        else:
            self.verb("effect", "absent", key, "--evidence", json.dumps({"looked_up": key, "found": False}))

    def run_tests(self, resumed: bool) -> Dict[str, Any]:
        code = 2
        if resumed:
            code, _job = self.verb("job", "status", "tests", codes=(0, 2))
        if code != 0:
            self.verb("job", "submit", "tests", "--", *self.world.job_command())
            self.pause("after-job-submit:tests")
            if self.commit_shards:
                self.await_log("shard 1 ok")
                self.verb("job", "--done", "2", "shard", "tests")
                self.pause("after-shard:tests")
        self.wait_job("tests")
        _code, result = self.verb("job", "result", "tests")
        if result["exit_code"] != 0:
            raise AgentError(f"the test job failed: {result['log_tail']}")
        return {"exit_code": result["exit_code"], "log_sha256": result["log_sha256"]}

    def await_log(self, text: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while text not in self.world.job_log(1):
            if time.monotonic() > deadline:
                raise AgentError(f"the job never printed {text!r}")
            time.sleep(self.poll)

    def wait_job(self, key: str) -> Dict[str, Any]:
        """``job status`` until the job is settled; in between, watch its exit file and its process."""
        deadline = time.monotonic() + DEADLINE
        while True:
            _code, job = self.verb("job", "status", key)
            if job["state"] not in ("submitting", "running"):
                return job
            exit_file = os.path.join(self.world.run, job["dir"], "exit.json")
            while not os.path.exists(exit_file) and not (job["pid"] and process_gone(job["pid"])):
                if time.monotonic() > deadline:
                    raise AgentError(f"job {key} is still running after {DEADLINE}s")
                time.sleep(self.poll)


# -- child programs ------------------------------------------------------------------

def _emit(tag: str, value: Any) -> None:
    sys.stdout.write(f"{tag} {json.dumps(value, sort_keys=True)}\n")
    sys.stdout.flush()


def worker_main(spec_text: str) -> int:
    """A child process: ``work`` (drive from the start), ``recover`` (take over) or ``report-a``."""
    spec = json.loads(spec_text)
    try:
        if spec["mode"] == "report-a":
            return _report_worker(spec)
        world = World(spec["root"], spec["rerun_vanished"])
        if spec["mode"] == "work":
            agent = Agent(world, inprocess_cli, spec["owner"], pause_at=spec.get("pause_at", ()), emit=_emit, heartbeat=WORKER_TTL, commit_shards=spec.get("commit_shards", False))
            agent.acquire(WORKER_TTL)
        else:
            agent = Agent(world, inprocess_cli, spec["owner"], emit=_emit)
            if spec.get("peek"):
                _emit("PEEK", agent.peek())
            code, decision = agent.recover()
            _emit("DECISION", {"code": code, "decision": decision})
            if code != 0:
                _emit("DONE", {"code": code, "decision": decision, "trace": agent.trace, "epoch": agent.epoch})
                return 0
        code, decision = agent.drive()
        _emit("DONE", {"code": code, "decision": decision, "trace": agent.trace, "epoch": agent.epoch})
        return 0
    except BaseException:
        _emit("ERROR", {"traceback": traceback.format_exc()})
        return 1


def _report_worker(spec: Dict[str, Any]) -> int:
    """The first worker of the report scenario, on an injected clock that steps one second per reading."""
    now = [float(spec["t0"])]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    world = World(spec["root"], spec["rerun_vanished"])
    run = Run.open(world.run, clock=clock, rand=lambda: 0.5)
    run.acquire("worker-a", 300)
    run.step_start("analysis")
    run.step_fail("analysis", "transient", "the model call timed out")
    run.step_start("analysis")  # the clock has passed the persisted backoff (at most 0.02 s)
    run.step_done("analysis", {"sha256": "a" * 64})
    run.add_cost({"tokens": 1200, "money": 0.25})
    run.step_start("edits")
    notify = {"channel": "review", "text": "patch ready"}
    run.effect_begin("notify:review", notify)
    run.effect_absent("notify:review", {"looked_up": "notify:review", "found": False})
    run.effect_begin("notify:review", notify)
    run.effect_ack("notify:review", {"message_id": "m-1"})
    run.effect_verify("notify:review", {"message_id": "m-1"})
    run.effect_begin(PATCH_KEY, {"patch_sha256": "b" * 64})
    run.effect_uncertain(PATCH_KEY, "the connection dropped after the request was sent")
    job = submit_job(run, "tests", world.job_command())
    _emit("PAUSED", {"label": "report-a", "pid": job["pid"]})
    sys.stdin.read()
    return 70


# -- the test side of child processes ------------------------------------------------

class Child:
    """A child process whose stdout is read line by line with a deadline."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(list(argv), cwd=_util.REPO_ROOT, env=_util.child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        self.buffer = b""
        self.eof = False

    @classmethod
    def worker(cls, spec: Dict[str, Any]) -> "Child":
        return cls(_util.python("-c", CHILD_MAIN, json.dumps(spec)))

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode("utf-8", "replace")

    def line(self, timeout: float = DEADLINE) -> Optional[str]:
        """The next complete line, or None at end of output."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line from the child within {timeout}s; stderr: {self.stderr()[-2000:]}")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)  # type: ignore[union-attr]
                if chunk:
                    self.buffer += chunk
                else:
                    self.eof = True
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode("utf-8")

    def expect(self, tag: str) -> Dict[str, Any]:
        line = self.line()
        if line is None:
            raise AssertionError(f"the child ended before {tag}; stderr: {self.stderr()[-2000:]}")
        got, _, rest = line.partition(" ")
        if got == "ERROR":
            raise AssertionError(f"the child failed before {tag}:\n{json.loads(rest)['traceback']}")
        if got != tag:
            raise AssertionError(f"expected {tag} from the child, got {line[:500]}")
        return json.loads(rest)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE)

    def wait(self) -> int:
        return self.proc.wait(timeout=DEADLINE)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=DEADLINE)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self.err.close()


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def wait_until(what: str, condition: Callable[[], bool], timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


class RecoveryCase(unittest.TestCase):
    """Shared set-up: temporary worlds whose job processes and children are ended at clean-up."""

    def world(self, rerun_vanished: bool = False, create: bool = True) -> World:
        root = tempfile.mkdtemp(prefix="runner-recovery-")
        self.addCleanup(shutil.rmtree, root, True)
        world = World(root, rerun_vanished)
        self.addCleanup(self._end_jobs, world)
        if create:
            world.create_run()
        return world

    @staticmethod
    def _end_jobs(world: World) -> None:
        for path in world.pid_files():
            try:
                with open(path, encoding="utf-8") as handle:
                    pid = int(json.load(handle)["pid"])
            except (OSError, ValueError, KeyError):
                continue
            if not process_gone(pid):
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)

    def child(self, spec: Dict[str, Any]) -> Child:
        child = Child.worker(spec)
        self.addCleanup(child.close)
        return child

    def open_run(self, world: World, clock: Optional[Callable[[], float]] = None) -> Run:
        run = Run.open(world.run, clock=clock)
        self.addCleanup(run.store.fs.close)  # type: ignore[attr-defined]
        return run

    def cli(self, world: World, *args: str) -> Tuple[int, Dict[str, Any]]:
        result = _util.run_cli("--dir", world.run, "--json", *args, timeout=DEADLINE)
        return result.code, _util.one_json(result)

    # -- checks shared by the scenarios ----------------------------------------------------
    def assert_decision_shape(self, decision: Dict[str, Any]) -> None:
        for key in DECISION_KEYS:
            self.assertIn(key, decision)
        for item in decision["observations"]:
            self.assertIn("source", item)
            self.assertIn("digest", item)
        self.assertIsInstance(decision["inferences"], list)
        self.assertIsInstance(decision["unknowns"], list)

    def assert_nothing_redone(self, world: World) -> Dict[str, Any]:
        """From the journal: no step started after it was done; no effect begun after it was verified."""
        done, verified = set(), set()
        starts: Dict[str, int] = {}
        begins: Dict[str, int] = {}
        for record in world.records():
            for op in record["ops"]:
                if op[0] != "set":
                    continue
                path, value = op[1], op[2]
                if path[0] == "steps" and len(path) == 2:
                    self.assertNotIn(path[1], done, f"step {path[1]} started again at revision {record['rev']} after it was done")
                    starts[path[1]] = starts.get(path[1], 0) + 1
                elif path[0] == "steps" and path[2:] == ["state"] and value == "done":
                    done.add(path[1])
                elif path[0] == "effects" and len(path) == 2 and value.get("state") == "started":
                    self.assertNotIn(path[1], verified, f"effect {path[1]} begun again at revision {record['rev']} after it was verified")
                    begins[path[1]] = begins.get(path[1], 0) + 1
                elif path[0] == "effects" and path[2:] == ["state"] and value == "verified":
                    verified.add(path[1])
        return {"starts": starts, "begins": begins, "done": done, "verified": verified}

    def assert_completed_once(self, world: World, job_attempts: int = 1) -> Dict[str, Any]:
        """The run is complete; every step ran once; the change reached the target once; the job ran as often as allowed."""
        state = world.state()
        self.assertEqual(state["status"], "complete")
        self.assertEqual(state["completed_steps"], list(STEPS))
        for step in STEPS:
            self.assertEqual(state["steps"][step]["attempts"], 1, step)
        seen = self.assert_nothing_redone(world)
        self.assertEqual(seen["starts"], {step: 1 for step in STEPS})
        self.assertEqual(seen["begins"], {PATCH_KEY: 1})
        self.assertEqual(state["effects"][PATCH_KEY]["state"], "verified")
        self.assertEqual(world.invocations(), [f"{PATCH_KEY} {state['effects'][PATCH_KEY]['payload_digest']}"])
        self.assertEqual(state["jobs"]["tests"]["attempt"], job_attempts)
        self.assertEqual(len(world.pid_files()), job_attempts)
        self.assertEqual(state["steps"]["tests"]["evidence"], {"exit_code": 0, "log_sha256": state["jobs"]["tests"]["log_sha256"]})
        return state


def _started_or_resumed(trace: List[Dict[str, Any]]) -> List[Tuple[str, str]]:
    return [(t["kind"], t["step"]) for t in trace if t["kind"] in ("start-step", "resume-step")]


class NextDrivenRunTest(RecoveryCase):
    """An agent that follows only ``next --json`` and the step, effect and job verbs completes the run.

    Killed with SIGKILL after ``step start``, after ``effect begin`` (with the
    change already sent, before ``ack``) or after ``job submit``, the worker
    is replaced by a new process that runs ``recover --owner NEW --json`` and
    then follows ``next`` alone: the run completes, no step is started again
    after it was done, the effect is begun once and reaches the target once.
    """

    KILL_POINTS = {
        "after-step-start:edits": ("resume-step", "edits"),
        f"after-effect-invoke:{PATCH_KEY}": ("reconcile", PATCH_KEY),
        "after-job-submit:tests": ("job", "tests"),
    }

    def uninterrupted(self) -> Dict[str, Any]:
        """The agent in this process, one child process per verb, from ``lease acquire`` to ``complete``."""
        world = self.world()
        world.open_gate()
        agent = Agent(world, subprocess_cli, "agent-1", poll=0.05)
        agent.acquire(TAKEOVER_TTL)
        first_code, first = agent.next()
        self.assertEqual(first_code, 0)
        self.assert_decision_shape(first)
        self.assertEqual((first["decision"], first["action"]["kind"], first["action"]["step"]), ("act", "start-step", "analysis"))
        self.assertEqual(first["action"]["evidence"], ["sha256"])
        agent.act(first["action"])
        code, decision = agent.drive()
        self.assertEqual((code, decision["decision"], decision["reason"]), (10, "stop", "complete"), decision)
        self.assert_decision_shape(decision)
        self.assertEqual(_started_or_resumed(agent.trace), [("start-step", s) for s in STEPS])
        state = self.assert_completed_once(world)
        self.assertEqual(state["counters"]["recoveries"], 0)
        return state

    def killed(self, label: str) -> Dict[str, Any]:
        """A worker child paused at ``label`` and SIGKILLed; a second child recovers and finishes."""
        world = self.world()
        world.open_gate()
        worker = self.child({"mode": "work", "owner": "worker-1", "pause_at": [label], **world.spec()})
        self.assertEqual(worker.expect("PAUSED")["label"], label)
        worker.kill()
        self.assertEqual(worker.proc.returncode, -signal.SIGKILL)
        successor = self.child({"mode": "recover", "owner": "worker-2", **world.spec()})
        first = successor.expect("DECISION")
        done = successor.expect("DONE")
        self.assertEqual(successor.wait(), 0)

        decision = first["decision"]
        self.assertEqual(first["code"], 0, decision)
        self.assert_decision_shape(decision)
        kind, what = self.KILL_POINTS[label]
        action = decision["action"]
        if kind == "job":
            # A job that still runs is re-attached to; one that finished was recorded by recover itself.
            if action["kind"] == "wait-job":
                self.assertEqual(action["key"], what)
            else:
                self.assertEqual((action["kind"], action["step"]), ("resume-step", "tests"))
        else:
            self.assertEqual((action["kind"], action.get("step") or action.get("key")), (kind, what))
        self.assertEqual((done["code"], done["decision"]["reason"]), (10, "complete"))
        steps_named = _started_or_resumed(done["trace"])
        if kind == "job":
            self.assertEqual(steps_named, [("resume-step", "tests"), ("start-step", "deliver")])
        else:
            self.assertEqual(steps_named, [("resume-step", "edits"), ("start-step", "tests"), ("start-step", "deliver")])
        state = self.assert_completed_once(world)
        self.assertEqual(state["counters"]["recoveries"], 1)
        self.assertEqual(state["lease"]["owner"], "worker-2")
        return state

    def test_next_driven_runs_complete_with_and_without_kills(self) -> None:
        runs: List[Callable[[], Dict[str, Any]]] = [self.uninterrupted] + [lambda point=point: self.killed(point) for point in self.KILL_POINTS]  # type: ignore[misc]
        states = _util.in_parallel(runs, workers=4)
        self.assertEqual([s["status"] for s in states], ["complete"] * 4)


class Minute37Test(RecoveryCase):
    """The worker dies at minute 37, while the long test job runs; recovery neither reruns nor skips work.

    A new process re-attaches to a job that still runs (``wait-job``; the job
    keeps attempt 1 and there is one pid file), reads the result of a job that
    finished (``read-job``), and reruns a vanished job from its committed
    shard cursor only when the contract says ``rerun_vanished`` (otherwise it
    stops with ``needs-reconciliation``, exit 8). The ``tests`` step is done
    only by ``step done tests`` with its evidence, ``deliver`` is never started
    before that, and ``analysis`` and ``edits`` are never started again.
    """

    def _kill_at_minute_37(self, rerun_vanished: bool) -> Tuple[World, int]:
        world = self.world(rerun_vanished)
        worker = self.child({"mode": "work", "owner": "worker-1", "pause_at": ["after-shard:tests"], "commit_shards": True, **world.spec()})
        self.assertEqual(worker.expect("PAUSED")["label"], "after-shard:tests")
        worker.kill()
        job = world.state()["jobs"]["tests"]
        self.assertEqual((job["state"], job["attempt"], job["cursor"]), ("running", 1, 2))
        self.assertFalse(process_gone(job["pid"]))
        return world, int(job["pid"])

    def _recover(self, world: World) -> Tuple[Child, Dict[str, Any], Dict[str, Any]]:
        """A new process: ``next --json`` (read-only) once the lease has lapsed, then ``recover --owner worker-2``."""
        successor = self.child({"mode": "recover", "owner": "worker-2", "peek": True, **world.spec()})
        peek = successor.expect("PEEK")
        first = successor.expect("DECISION")
        self.assert_decision_shape(peek["decision"])
        self.assert_decision_shape(first["decision"])
        return successor, peek, first

    def _finish(self, world: World, successor: Child, job_attempts: int) -> Dict[str, Any]:
        done = successor.expect("DONE")
        self.assertEqual(successor.wait(), 0)
        self.assertEqual((done["code"], done["decision"]["reason"]), (10, "complete"), done)
        steps_named = _started_or_resumed(done["trace"])
        self.assertEqual(steps_named, [("resume-step", "tests"), ("start-step", "deliver")])
        state = self.assert_completed_once(world, job_attempts)
        return {"done": done, "state": state}

    def case_running(self) -> Dict[str, Any]:
        world, pid = self._kill_at_minute_37(False)
        successor, peek, first = self._recover(world)
        for seen in (peek, first):
            action = seen["decision"]["action"]
            self.assertEqual((seen["code"], action["kind"], action["key"], action["pid"]), (0, "wait-job", "tests", pid))
        self.assertFalse(process_gone(pid), "the job was not the one re-attached to")
        self.assertEqual(world.state()["jobs"]["tests"]["attempt"], 1)
        self.assertEqual(len(world.pid_files()), 1)
        world.open_gate()
        out = self._finish(world, successor, job_attempts=1)
        self.assertIn(out["done"]["trace"][0]["kind"], ("wait-job", "read-job"))
        self.assertEqual(world.job_log(1).splitlines(), ["cursor 0", "shard 0 ok", "shard 1 ok", "shard 2 ok", "shard 3 ok", "tests passed"])
        return out

    def case_finished(self) -> Dict[str, Any]:
        world, pid = self._kill_at_minute_37(False)
        world.open_gate()
        wait_until("the orphaned job has written its exit file", lambda: observe_job(world.run, world.state()["jobs"]["tests"])["status"] == "finished")
        successor, peek, first = self._recover(world)
        action = peek["decision"]["action"]
        self.assertEqual((peek["code"], action["kind"], action["key"], action["exit_code"]), (0, "read-job", "tests", 0))
        action = first["decision"]["action"]
        self.assertEqual((first["code"], action["kind"], action["step"]), (0, "resume-step", "tests"))
        job = world.state()["jobs"]["tests"]
        self.assertEqual((job["state"], job["exit_code"], job["attempt"]), ("finished", 0, 1))
        self.assertTrue(job["log_sha256"])
        out = self._finish(world, successor, job_attempts=1)
        self.assertEqual(out["state"]["counters"].get("jobs_orphaned", 0), 0)
        return out

    def case_vanished_rerun(self) -> Dict[str, Any]:
        world, pid = self._kill_at_minute_37(True)
        os.killpg(pid, signal.SIGKILL)
        wait_until("the job's process is gone", lambda: process_gone(pid))
        world.open_gate()
        successor, peek, first = self._recover(world)
        for seen in (peek, first):
            action = seen["decision"]["action"]
            self.assertEqual((seen["code"], action["kind"], action["key"], action["cursor"]), (0, "rerun-job", "tests", 2))
            self.assertEqual(action["command"], world.job_command())
        out = self._finish(world, successor, job_attempts=2)
        self.assertEqual(world.job_log(1).splitlines(), ["cursor 0", "shard 0 ok", "shard 1 ok"])
        self.assertEqual(world.job_log(2).splitlines(), ["cursor 2", "shard 2 ok", "shard 3 ok", "tests passed"])
        self.assertEqual(out["state"]["counters"]["jobs_orphaned"], 1)
        return out

    def case_vanished_no_rerun(self) -> Dict[str, Any]:
        world, pid = self._kill_at_minute_37(False)
        os.killpg(pid, signal.SIGKILL)
        wait_until("the job's process is gone", lambda: process_gone(pid))
        world.open_gate()
        successor, peek, first = self._recover(world)
        for seen in (peek, first):
            decision = seen["decision"]
            self.assertEqual((seen["code"], decision["decision"], decision["reason"]), (8, "stop", "needs-reconciliation"))
            self.assertTrue(any("job `tests` vanished" in u for u in decision["unknowns"]), decision["unknowns"])
        done = successor.expect("DONE")
        self.assertEqual(successor.wait(), 0)
        epoch = str(done["epoch"])
        before = _util.contents(world.run)
        writer = ("--owner", "worker-2", "--epoch", epoch)
        next_code, again = self.cli(world, "next", *writer)
        self.assertEqual((next_code, again["reason"]), (8, "needs-reconciliation"))
        (submit_code, refused), (deliver_code, _), (claim_code, _) = [
            (r.code, _util.one_json(r))
            for r in (
                inprocess_cli(["--dir", world.run, "--json", "job", *writer, "submit", "tests", "--", *world.job_command()]),
                inprocess_cli(["--dir", world.run, "--json", "step", *writer, "start", "deliver"]),
                inprocess_cli(["--dir", world.run, "--json", "step", *writer, "done", "tests", "--evidence", json.dumps({"claim": "the tests passed"})]),
            )
        ]
        self.assertEqual((submit_code, refused["error"]), (8, "needs-reconciliation"))
        self.assertEqual((deliver_code, claim_code), (2, 2))
        self.assertEqual(_util.contents(world.run), before)
        state = world.state()
        self.assertEqual(state["steps"]["tests"]["state"], "running")
        self.assertNotIn("deliver", state["steps"])
        self.assertEqual((state["jobs"]["tests"]["state"], state["jobs"]["tests"]["attempt"]), ("vanished", 1))
        self.assertEqual(len(world.pid_files()), 1)
        self.assertEqual({s: state["steps"][s]["attempts"] for s in ("analysis", "edits", "tests")}, {"analysis": 1, "edits": 1, "tests": 1})
        self.assert_nothing_redone(world)
        return {"state": state}

    def test_minute_37(self) -> None:
        cases = {
            "running": self.case_running,
            "finished": self.case_finished,
            "vanished, rerun allowed": self.case_vanished_rerun,
            "vanished, no rerun": self.case_vanished_no_rerun,
        }
        results = _util.in_parallel(list(cases.values()), workers=4)
        self.assertEqual(len(results), len(cases))


class StopReasonTest(RecoveryCase):
    """``next --json`` names each kind of stop with its reason and exit code, and the full decision shape."""

    def test_each_stop(self) -> None:
        payload = {"patch_sha256": "c" * 64}
        cases: Dict[str, Tuple[World, List[str]]] = {}

        def holder(world: World) -> Run:
            run = self.open_run(world)
            run.acquire("worker-1", 300)
            return run

        world = self.world()
        holder(world)
        cases["already-running"] = (world, ["--owner", "worker-2", "--epoch", "1"])

        world = self.world()
        holder(world).approval_request("edits", f"effect:{PATCH_KEY}", payload, 300)
        cases["awaiting-approval"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        world = self.world()
        holder(world).cancel("reviewer", "the change is no longer wanted")
        cases["cancelled"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        world = self.world()
        run = holder(world)
        run.step_start("analysis")
        run.step_fail("analysis", "permanent", "the repository was deleted")
        self.assertEqual(run.state["status"], "blocked")
        cases["failed"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        world = self.world()
        run = holder(world)
        run.step_start("analysis")
        run.step_done("analysis", {"sha256": "d" * 64})
        limited = _util.write_contract(os.path.join(world.root, "limited.md"), {**contract_block(), "limits": {"max_steps": 1}})
        with open(limited, encoding="utf-8") as handle:
            run.migrate(handle.read(), "one step is all the budget allows")
        cases["limit-exhausted"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        world = self.world()
        run = holder(world)
        run.step_start("analysis")
        run.step_done("analysis", {"sha256": "d" * 64})
        run.step_start("edits")
        journal = os.path.join(world.run, JOURNAL)
        with open(journal, "rb") as handle:
            lines = handle.read().split(b"\n")
        self.assertGreaterEqual(len([line for line in lines if line]), 4)
        damaged = lines[1].replace(b'"epoch":1', b'"epoch":7', 1)
        self.assertNotEqual(damaged, lines[1])
        lines[1] = damaged
        _util.write_file(journal, b"\n".join(lines))
        cases["state-unrecoverable"] = (world, [])

        world = self.world()
        run = holder(world)
        run.step_start("analysis")
        run.effect_begin(PATCH_KEY, payload)
        run.effect_uncertain(PATCH_KEY, "the connection dropped after the request was sent")
        cases["needs-reconciliation"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        world = self.world()
        run = holder(world)
        run.acquire("worker-1", 300)
        cases["fenced"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        world = self.world()
        run = holder(world)
        for step in STEPS:
            run.step_start(step)
            run.step_done(step, {"sha256": "e" * 64, "applied": {}, "exit_code": 0, "log_sha256": "f" * 64})
        cases["complete"] = (world, ["--owner", "worker-1", "--epoch", "1"])

        expected = {"already-running": 3, "awaiting-approval": 4, "cancelled": 5, "limit-exhausted": 6, "state-unrecoverable": 7, "needs-reconciliation": 8, "fenced": 9, "complete": 10,
                    "failed": 12}
        self.assertEqual(set(cases), set(expected))
        results = _util.in_parallel([lambda w=w, a=a: self.cli(w, "next", *a) for w, a in cases.values()], workers=4)  # type: ignore[misc]
        for (reason, (world, _args)), (code, decision) in zip(cases.items(), results):
            with self.subTest(reason=reason):
                self.assertEqual(code, expected[reason], decision)
                self.assertEqual(EXIT_CODES[reason], expected[reason])
                self.assert_decision_shape(decision)
                self.assertEqual((decision["decision"], decision["action"], decision["reason"]), ("stop", None, reason))
                if reason != "state-unrecoverable":
                    self.assertTrue({"state", "plan", "lease"} <= {o["source"] for o in decision["observations"]}, decision["observations"])
                if reason == "needs-reconciliation":
                    digest = content_digest(payload)
                    self.assertTrue(any(PATCH_KEY in u and digest in u for u in decision["unknowns"]), decision["unknowns"])
                    self.assertEqual((decision["check"]["key"], decision["check"]["payload_digest"]), (PATCH_KEY, digest))
                if reason == "failed":
                    self.assertEqual(decision["step"], "analysis")
                if reason == "limit-exhausted":
                    self.assertEqual(decision["limit"], "max_steps")
                if reason == "state-unrecoverable":
                    self.assertTrue(decision["unknowns"])
                    self.assertTrue(os.listdir(os.path.join(world.run, "quarantine")))


class PlanChangeTest(RecoveryCase):
    """A changed plan is refused by ``next`` and ``recover`` (exit 2, nothing written) until ``migrate`` records it."""

    def test_changed_contract_needs_a_migration(self) -> None:
        world = self.world()
        changed = _util.write_contract(os.path.join(world.root, "changed.md"), contract_block(extra_step=True))
        run = self.open_run(world)
        run.acquire("worker-1", 300)
        run.step_start("analysis")
        writer = ("--owner", "worker-1", "--epoch", "1")
        before = _util.contents(world.run)
        (next_code, next_out), (recover_code, recover_out) = _util.in_parallel([
            lambda: self.cli(world, "next", *writer, "--contract", changed),
            lambda: self.cli(world, "recover", "--owner", "worker-2", "--contract", changed),
        ])
        self.assertEqual((next_code, next_out["error"]), (2, "invalid-input"))
        self.assertEqual((recover_code, recover_out["error"]), (2, "invalid-input"))
        self.assertIn("migrate", recover_out["message"])
        self.assertEqual(_util.contents(world.run), before)

        code, migrated = self.cli(world, "migrate", *writer, "--contract", changed, "--reason", "a person must review the diff before delivery")
        self.assertEqual(code, 0, migrated)
        new_digest = content_digest(load_contract(changed))
        self.assertEqual(migrated["plan_digest"], new_digest)
        (next_code, decision), (old_code, old_out) = _util.in_parallel([
            lambda: self.cli(world, "next", *writer, "--contract", changed),
            lambda: self.cli(world, "next", *writer, "--contract", world.contract),
        ])
        # worker-1 started analysis under the lease it still holds: it is told to finish it.
        self.assertEqual((next_code, decision["action"]["kind"], decision["action"]["step"]), (0, "finish-step", "analysis"))
        self.assertEqual((old_code, old_out["error"]), (2, "invalid-input"))
        recover_code, recovered = self.cli(world, "recover", "--owner", "worker-1", "--contract", changed)
        self.assertEqual((recover_code, recovered["action"]["kind"], recovered["lease"]["epoch"]), (0, "resume-step", 2))
        state = world.state()
        self.assertEqual(state["plan_digest"], new_digest)
        migrations = [o for o in state["observations"]["authorization"].values() if o.get("source") == "migrate"]
        self.assertEqual(len(migrations), 1)
        self.assertEqual(migrations[0]["to"], new_digest)
        self.assertEqual(migrations[0]["from"], content_digest(load_contract(world.contract)))
        self.assertEqual(migrations[0]["reason"], "a person must review the diff before delivery")
        self.assertEqual(state["steps"]["analysis"]["attempts"], 1)
        self.assertIn("review", [s["id"] for s in state["plan"]["steps"]])


class BriefTest(RecoveryCase):
    """``brief`` stays within its bound on a run of 10,000 effects and names the unresolved effects and the next action."""

    UNRESOLVED = {
        "patch:shard-0042": "started",
        "patch:shard-1337": "acknowledged",
        "patch:shard-2718": "acknowledged",
        "patch:shard-6021": "acknowledged",
        "patch:shard-7777": "started",
        "patch:shard-8080": "acknowledged",
        "patch:shard-9001": "started",
    }

    path = ""
    state: Dict[str, Any] = {}

    @classmethod
    def setUpClass(cls) -> None:
        root = tempfile.mkdtemp(prefix="runner-recovery-")
        cls.addClassCleanup(shutil.rmtree, root, True)
        world = World(root)
        goal = "Find why the nightly suite fails on the cache layer, patch every shard of the cache configuration, run the long suite, and deliver the patch with its evidence. "
        plan = dict(load_contract(world.contract), goal=goal * 4)
        earlier = [{"id": name, "artifact": f"work/{name}.md", "check": "file exists", "evidence": ["sha256"], "next": "analysis"} for name in ("reproduce", "bisect")]
        plan["steps"] = earlier + plan["steps"]
        store = RunStore.create(world.run, TASK_ID, plan, durability="process")
        cls.addClassCleanup(store.fs.close)  # type: ignore[attr-defined]
        cls.path = store.path
        stamp = store.now()
        record = {"attempts": 1, "started_at": stamp, "error": None, "class": None, "next_attempt_at": None, "approval": False}
        ops: List[List[Any]] = [
            ["set", ["lease"], {"owner": "worker-2", "epoch": 2, "expires_at": format_time(time.time() + 3600), "acquired_at": stamp}],
            ["set", ["steps", "reproduce"], dict(record, state="done", finished_at=stamp, evidence={"sha256": "1" * 64, "notes": "fails in 3 of 10 nightly runs " * 4})],
            ["set", ["steps", "bisect"], dict(record, state="done", finished_at=stamp, evidence={"sha256": "2" * 64, "notes": "first bad commit changes the cache ttl " * 4})],
            ["set", ["steps", "analysis"], dict(record, state="done", finished_at=stamp, evidence={"sha256": "a" * 64, "notes": "the cache entry outlives its source " * 4})],
            ["set", ["steps", "edits"], dict(record, state="running", finished_at=None, evidence=None)],
            ["set", ["completed_steps"], ["reproduce", "bisect", "analysis"]],
            ["set", ["current_step"], "edits"],
        ]
        for n in range(6):
            ops.append(["set", ["jobs", f"lint-{n}"], {
                "state": "finished", "command": ["lint", str(n)], "attempt": 1, "dir": f"jobs/lint-{n}/a1", "submitted_at": stamp, "pid": None,
                "pid_start": None, "exit_code": 0, "finished_at": stamp, "log_sha256": None, "cursor": 12, "cancel_requested_at": None, "stopped_at": None}])
        store.commit(ops)
        for batch in range(20):
            ops = []
            for i in range(batch * 500, batch * 500 + 500):
                key = f"patch:shard-{i:04d}"
                state = cls.UNRESOLVED.get(key, "verified")
                ops.append(["set", ["effects", key], {
                    "state": state, "payload_digest": content_digest({"shard": i}), "attempts": 1, "step": "edits",
                    "started_at": stamp, "updated_at": stamp,
                    "receipt": {"id": i, "queue": "cache-config-rollout", "accepted_by": "config-service eu-west-1 replica 3"} if state != "started" else None,
                    "evidence": {"seen": i} if state == "verified" else None, "reason": None, "next_attempt_at": None,
                }])
            store.commit(ops)
        assert len(store.state["effects"]) == 10000
        cls.state = copy.deepcopy(store.state)

    def brief(self, *args: str) -> Dict[str, Any]:
        result = _util.run_cli("--dir", self.path, "--json", "brief", *args, timeout=DEADLINE)
        self.assertEqual(result.code, 0, result.err)
        return _util.one_json(result)

    def test_brief_of_ten_thousand_effects(self) -> None:
        full = render_brief(self.state, decide(self.state, time.time(), "worker-2", 2, {}), 10 ** 6)
        self.assertGreater(len(full), 2000)
        default, custom = _util.in_parallel([lambda: self.brief(), lambda: self.brief("--max-chars", "900")])
        text = default["brief"]
        self.assertLessEqual(len(text), 2000)
        self.assertEqual(default["chars"], len(text))
        first = sorted(self.UNRESOLVED)[0]
        self.assertIn("Next action:", text)
        self.assertIn(f"Next action: reconcile `{first}`", text)
        for key, state in sorted(self.UNRESOLVED.items())[:5]:
            self.assertIn(f"UNRESOLVED `{key}`: {state}", text)
        self.assertIn("… and 2 more unresolved", text)
        self.assertIn("4 acknowledged, 3 started, 9993 verified", text)
        self.assertIn("- `edits`: running", text)
        self.assertLessEqual(len(custom["brief"]), 900)
        self.assertIn("Next action:", custom["brief"])
        self.assertIn(first, custom["brief"])

    def test_brief_is_within_any_custom_bound(self) -> None:
        full = render_brief(self.state, decide(self.state, time.time(), "worker-2", 2, {}), 10 ** 6)
        newlines = [i for i, c in enumerate(full) if c == "\n" and 400 < i < len(full) - 100]
        limits = [newlines[len(newlines) // 2] + 41, 30]
        results = _util.in_parallel([lambda n=n: self.brief("--max-chars", str(n)) for n in limits])  # type: ignore[misc]
        for limit, out in zip(limits, results):
            with self.subTest(max_chars=limit):
                self.assertLessEqual(len(out["brief"]), limit)


class EventsTest(RecoveryCase):
    """Every transition has a sequence number; an observer resumes after its last one, missing and repeating nothing.

    An observer that follows the run and is SIGKILLed changes nothing in it;
    after compaction beyond the retained journals, ``truncated`` says so.
    """

    def test_observer_resumes_and_its_death_does_not_touch_the_run(self) -> None:
        world = self.world()
        run = self.open_run(world)
        run.acquire("worker-1", 300)
        run.step_start("analysis")
        run.step_done("analysis", {"sha256": "a" * 64})
        follower = Child(_util.python("-m", "runner", "--dir", world.run, "events", "--follow", "--after", "0", "--timeout", str(DEADLINE)))
        self.addCleanup(follower.close)
        seen: List[Dict[str, Any]] = []

        def read_until(seq: int) -> None:
            while not seen or seen[-1]["seq"] < seq:
                line = follower.line()
                self.assertIsNotNone(line, follower.stderr())
                seen.append(json.loads(line))  # type: ignore[arg-type]

        read_until(run.store.revision)
        payload = {"patch_sha256": "b" * 64}
        run.step_start("edits")
        run.effect_begin(PATCH_KEY, payload)
        read_until(run.store.revision)
        follower.kill()
        self.assertEqual(follower.proc.returncode, -signal.SIGKILL)
        last = seen[-1]["seq"]
        self.assertEqual([e["seq"] for e in seen], list(range(1, last + 1)))

        run.effect_ack(PATCH_KEY, {"change_id": "c-1"})
        run.effect_verify(PATCH_KEY, {"change_id": "c-1"})
        for step in STEPS[1:]:
            if step != "edits":
                run.step_start(step)
            run.step_done(step, {"sha256": "e" * 64, "applied": {"change_id": "c-1"}, "exit_code": 0, "log_sha256": "f" * 64})
        self.assertEqual(run.store.state["status"], "complete")
        final = run.store.revision

        middle = last // 2
        (c1, resumed), (c2, everything), (c3, tail), (c4, empty) = _util.in_parallel([
            lambda: self.cli(world, "events", "--after", str(last)),
            lambda: self.cli(world, "events", "--after", "0"),
            lambda: self.cli(world, "events", "--after", str(middle)),
            lambda: self.cli(world, "events", "--after", str(final)),
        ])
        self.assertEqual((c1, c2, c3, c4), (0, 0, 0, 0))
        all_seqs = [e["seq"] for e in everything["events"]]
        self.assertEqual(all_seqs, list(range(1, final + 1)))
        self.assertFalse(everything["truncated"])
        self.assertEqual(everything["last"], final)
        self.assertEqual([e["seq"] for e in tail["events"]], list(range(middle + 1, final + 1)))
        self.assertEqual(tail["events"], everything["events"][middle:])
        self.assertEqual(empty["events"], [])
        self.assertEqual([e["seq"] for e in resumed["events"]], list(range(last + 1, final + 1)))
        self.assertEqual(seen + resumed["events"], everything["events"])

        store = RunStore.open(world.run)
        self.addCleanup(store.fs.close)  # type: ignore[attr-defined]
        self.assertEqual([f for f in store.findings if f.level != "note"], [])
        self.assertEqual((store.state["status"], store.revision), ("complete", final))
        done = _util.run_cli("--dir", world.run, "events", "--follow", "--after", str(final), "--timeout", str(DEADLINE), timeout=DEADLINE)
        self.assertEqual((done.code, done.out), (0, ""))

    def test_compaction_beyond_the_retained_journals_is_reported(self) -> None:
        world = self.world(create=False)
        store = RunStore.create(world.run, TASK_ID, load_contract(world.contract), compact_min_bytes=1 << 40, durability="process")
        self.addCleanup(store.fs.close)  # type: ignore[attr-defined]
        for rev in range(1, 14):
            store.commit([["set", ["counters", "cost"], {"tokens": rev}]])
            if rev in (5, 10):
                store.compact()
        (c1, gap), (c2, kept), gap_text = _util.in_parallel([
            lambda: self.cli(world, "events", "--after", "0"),
            lambda: self.cli(world, "events", "--after", "5"),
            lambda: _util.run_cli("--dir", world.run, "events", "--after", "2", timeout=DEADLINE),
        ])
        self.assertEqual((c1, c2), (0, 0))
        self.assertEqual((gap["truncated"], gap["oldest"]), (True, 6))
        self.assertEqual([e["seq"] for e in gap["events"]], list(range(6, 14)))
        self.assertEqual((kept["truncated"], [e["seq"] for e in kept["events"]]), (False, list(range(6, 14))))
        lines = [json.loads(line) for line in gap_text.out.splitlines()]
        self.assertEqual((lines[0]["gap"], lines[0]["oldest"]), (True, 6))
        self.assertEqual([e["seq"] for e in lines[1:]], list(range(6, 14)))


class ReportTest(RecoveryCase):
    """``report --json`` counts the whole run across workers and attempts.

    The run: a first worker (a child process on an injected clock) repeats a
    step after a transient failure, retries an effect observed absent, leaves
    an effect uncertain and a job running, adds costs and is SIGKILLed; its
    job is then killed too. A second worker (this process, on an injected
    clock) takes over at a known time, reconciles, reruns the vanished job
    and completes; a command-line process adds costs under its lease.
    """

    def test_report_across_attempts(self) -> None:
        world = self.world(rerun_vanished=True)
        t0 = float(int(time.time()) - 1000)
        first = self.child({"mode": "report-a", "t0": t0, **world.spec()})
        pid = first.expect("PAUSED")["pid"]
        first.kill()
        os.killpg(pid, signal.SIGKILL)  # the gate is shut: the job cannot have finished first
        wait_until("the first worker's job is gone", lambda: process_gone(pid))
        world.open_gate()  # for the rerun
        last_write = parse_time(world.state()["updated_at"])

        takeover_at = float(int(time.time()))
        run = self.open_run(world, clock=lambda: takeover_at)
        decision = recover(run, "worker-b", 3600)
        self.assertEqual((decision["decision"], decision["reason"], decision["check"]["key"]), ("stop", "needs-reconciliation", PATCH_KEY))
        run.effect_verify(PATCH_KEY, {"change_id": "seen-at-target"})
        decision = recover(run, "worker-b", 3600)
        self.assertEqual((decision["action"]["kind"], decision["action"]["key"]), ("rerun-job", "tests"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # the runner detaches the job's wrapper on purpose
            submit_job(run, "tests", decision["action"]["command"])
        wait_until("the rerun finishes", lambda: observe_job(world.run, run.state["jobs"]["tests"])["status"] == "finished")
        refresh_jobs(run)
        run.step_done("edits", {"sha256": "b" * 64, "applied": {"change_id": "seen-at-target"}})
        for step in ("tests", "deliver"):
            run.step_start(step)
            run.step_done(step, {"sha256": "c" * 64, "exit_code": 0, "log_sha256": run.state["jobs"]["tests"]["log_sha256"]})
        self.assertEqual(run.state["status"], "complete")
        epoch = str(run.epoch)

        cost = _util.run_cli("--dir", world.run, "cost", "--owner", "worker-b", "--epoch", epoch, "--add", "tokens=800", "--add", "money=0.5", timeout=DEADLINE)
        self.assertEqual(cost.code, 0, cost.err)
        code, report = self.cli(world, "report")
        self.assertEqual(code, 0, report)
        self.assertEqual(report["status"], "complete")
        self.assertEqual(report["recoveries"], 1)
        self.assertEqual(report["recovery_wait_seconds"], round(takeover_at - last_write, 3))
        self.assertGreater(report["recovery_wait_seconds"], 0)
        self.assertEqual(report["repeated_steps"], 1)
        self.assertEqual(report["unknown_results"], 1)
        self.assertEqual(report["retries"], 1)
        self.assertEqual(report["orphaned_jobs"], 1)
        self.assertEqual(report["cost"], {"tokens": 2000, "money": 0.75})
        self.assertEqual((report["effects"], report["effects_verified"], report["unresolved_effects"]), (2, 2, 0))
        state = world.state()
        self.assertEqual(state["steps"]["analysis"]["attempts"], 2)
        self.assertEqual(state["jobs"]["tests"]["attempt"], 2)


class CompletionTest(RecoveryCase):
    """A run whose last unresolved effect is verified after its last step is done reaches ``complete`` (exit 10)."""

    def test_verifying_the_last_effect_completes_the_run(self) -> None:
        world = self.world()
        run = self.open_run(world)
        run.acquire("worker-1", 300)
        run.effect_begin("notify:start", {"text": "work begins"})
        for step in STEPS:
            run.step_start(step)
            run.step_done(step, {"sha256": "e" * 64, "applied": {}, "exit_code": 0, "log_sha256": "f" * 64})
        run.effect_verify("notify:start", {"message_id": "m-1"})
        code, decision = self.cli(world, "next", "--owner", "worker-1", "--epoch", "1")
        self.assertEqual((code, decision["reason"]), (10, "complete"), decision)


class JobOptionsTest(RecoveryCase):
    """Options written after a job verb's KEY are the runner's options, not part of the job's command."""

    def setUp(self) -> None:
        self.w = self.world()
        self.run_ = self.open_run(self.w)
        self.run_.acquire("worker-1", 300)
        self.command = [sys.executable, "-S", "-c", "print('ok')"]

    def test_submit_with_options_after_the_key(self) -> None:
        result = _util.run_cli("--dir", self.w.run, "job", "submit", "tests", "--owner", "worker-1", "--epoch", "1", "--json", "--", *self.command, timeout=DEADLINE)
        self.assertEqual(result.code, 0, result.out + result.err)
        self.assertEqual(_util.one_json(result)["command"], self.command)

    def test_shard_with_done_after_the_key(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # the runner detaches the job's wrapper on purpose
            submit_job(self.run_, "tests", self.command)
        result = _util.run_cli("--dir", self.w.run, "--json", "job", "shard", "tests", "--done", "2", "--owner", "worker-1", "--epoch", "1", timeout=DEADLINE)
        self.assertEqual(result.code, 0, result.out + result.err)
        self.assertEqual(_util.one_json(result)["cursor"], 2)


if __name__ == "__main__":
    unittest.main()
