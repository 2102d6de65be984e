"""The world, agent and child workers of the recovery tests (``test_recovery``, ``test_views``).

An agent here is :class:`Agent`: it knows how to do the work of each step of
the test contract (write an artifact, apply a change at a target through the
effect verbs, run the long test job) and otherwise does only what
``next --json`` names, calling the command line's ``main`` with the argument
vector a shell would pass. A worker that is killed is a child process running
the agent; it stops at a named point and the test sends it SIGKILL. Recovery always happens in another process, which starts
with ``recover --owner NEW --json`` and then follows ``next`` alone.

The test contract is the minute-37 scenario: ``analysis`` -> ``edits`` (an
external effect, ``patch:apply``) -> ``tests`` (a long job under the key
``tests``) -> ``deliver``. The job runs four shards; from shard 2 on it waits
for a gate file, so a test decides whether the job is still running, has
finished or has vanished when recovery begins.

Child programs are this module's :func:`worker_main`.
"""

import copy
import glob
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

try:
    from . import util as _util
except ImportError:  # run from inside tests/
    import util as _util  # type: ignore[no-redef]

from runner.contract.text import load_contract
from runner.base.canonical import content_digest
from runner.execution.run import Run, submit_job
from runner.stores.file import RunStore

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

CHILD_MAIN = "import sys; from tests.support.recovery import worker_main; sys.exit(worker_main(sys.argv[1]))"


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


# -- the command line ----------------------------------------------------------------------

CLI = Callable[[Sequence[str]], _util.Result]


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
            agent = Agent(world, _util.in_process_cli, spec["owner"], pause_at=spec.get("pause_at", ()), emit=_emit,
                          heartbeat=WORKER_TTL, commit_shards=spec.get("commit_shards", False))
            agent.acquire(WORKER_TTL)
        else:
            agent = Agent(world, _util.in_process_cli, spec["owner"], emit=_emit)
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
