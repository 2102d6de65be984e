"""Runs for the timeline and trace tests: a small run that passes through every kind of fact, and a crashed one.

:func:`small_run` drives one run through the library with an injected
clock and an in-memory target: effects verified, one uncertain and then
verified by observation, one absent and retried after its backoff, one
refused for good; a transient step failure and its backoff; an approval
request superseded by a second one, a denial, a grant; a cancellation with
an effect in flight. :func:`crashed_run` kills a real worker process that
holds the lease with an effect started, and lets other processes break the
lease, take over, settle the effect and release.
"""

import json
import signal
import subprocess
from typing import Any, Dict, List

from tests.support.util import CLOCK_START, child_env, python, run_cli

from runner.calls.target import NotApplied, Observation, Rejected, UnknownOutcome
from runner.base.errors import Failed
from runner.execution.run import Run
from runner.stores.file import RunStore

#: Free text carrying what a page must never hold as markup or a reference.
HOSTILE = "see https://example.invalid/x?a=1 <script>alert(1)</script> <img src=x> //"

SMALL_KEYS = ["doc:1:ticket", "doc:2:ticket", "doc:3:ticket", "doc:4:ticket", "doc:5:ticket", "publish:weekly", "archive:1"]
UNCERTAIN_KEY = "doc:3:ticket"


def small_contract(task: str = "timeline-small") -> Dict[str, Any]:
    return {
        "contract": 1,
        "task_id": task,
        "goal": "Exercise every fact the timeline draws.",
        "steps": [
            {"id": "fetch", "artifact": "tickets", "check": "found by key", "next": "publish"},
            {"id": "publish", "artifact": "post", "check": "found by key", "approval": True, "next": "archive"},
            {"id": "archive", "artifact": "archive", "check": "found", "next": "done"},
        ],
        "limits": {"max_effect_attempts": 5, "max_step_attempts": 5},
        "retry": {"base_seconds": 2, "cap_seconds": 4},
    }


class MemoryTarget:
    """A target that keeps effects in a dict; ``faults`` say how a key's first call goes."""

    name = "memory"
    key_scope = "this object"
    retention_seconds = None
    conflicting_payload = "refused"
    verification = "lookup by key"
    deduplicates = True

    def __init__(self, faults: Dict[str, str]) -> None:
        self.held: Dict[str, Dict[str, Any]] = {}
        self.faults = dict(faults)

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        fault = self.faults.pop(key, None)
        if fault == "reject":
            raise Rejected("the target refuses this key")
        if fault == "not-applied":
            raise NotApplied("the target was busy and applied nothing")
        self.held[key] = payload
        if fault == "unknown":
            raise UnknownOutcome("the connection dropped after the target committed")
        return {"ticket": "t-" + key}

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        if key in self.held:
            return Observation("present", {"ticket": "t-" + key})
        return Observation("absent", {"looked_up": key})


def small_run(path: str, task: str = "timeline-small") -> Dict[str, Any]:
    """Drive the small run in ``path`` (see the module docstring); return its final state."""
    now = [CLOCK_START]

    def clock() -> float:
        now[0] += 0.25
        return now[0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    RunStore.create(path, task, small_contract(task), clock=clock)
    run = Run(RunStore.open(path, clock=clock), rand=lambda: 0.5)
    target = MemoryTarget({UNCERTAIN_KEY: "unknown", "doc:4:ticket": "not-applied", "doc:5:ticket": "reject"})
    run.acquire("worker-a", 600)
    run.step_start("fetch")
    for n in (1, 2, 3, 4, 5):
        try:
            run.drive_effect(f"doc:{n}:ticket", {"doc": n}, target, step="fetch", sleep=sleep)
        except Failed:
            pass  # doc 5 is refused for good (exit 12)
    run.step_fail("fetch", "transient", "the index was briefly unavailable")
    sleep(5)
    run.step_start("fetch")
    run.step_done("fetch", {})
    first = run.approval_request("publish", "effect:publish:weekly", {"post": "draft"}, 600)
    Run(RunStore.open(path, clock=clock)).approval_deny(first, "carol")
    second = run.approval_request("publish", "effect:publish:weekly", {"post": "v1"}, 600)
    third = run.approval_request("publish", "effect:publish:weekly", {"post": "v2"}, 600)
    Run(RunStore.open(path, clock=clock)).approval_grant(third, "carol")
    assert second != third
    run.step_start("publish")
    run.drive_effect("publish:weekly", {"post": "v2"}, target, step="publish", sleep=sleep)
    run.step_done("publish", {})
    run.step_start("archive")
    run.effect_begin("archive:1", {"archive": 1}, step="archive")
    Run(RunStore.open(path, clock=clock)).cancel("operator", HOSTILE)
    run.effect_verify("archive:1", {"found": True})
    run.refresh()
    return run.state


_HOLDER = """
import sys
sys.path.insert(0, sys.argv[2])
from runner.execution.run import Run
run = Run.open(sys.argv[1])
run.acquire("worker-doomed", 600)
run.step_start("fetch")
run.effect_begin("doc:1:ticket", {"doc": 1}, step="fetch")
print("ready", flush=True)
sys.stdin.read()
"""


def crashed_run(path: str, repo: str) -> List[str]:
    """A worker holding the lease with ``doc:1:ticket`` started is SIGKILLed; other processes take over.

    Returns the CLI outputs of the takeover, for the test's diagnostics.
    """
    RunStore.create(path, "timeline-crash", small_contract("timeline-crash"))
    proc = subprocess.Popen(python("-c", _HOLDER, path, repo), env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != b"ready":
        proc.kill()
        raise AssertionError(f"the holder did not get ready: {line!r}")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    proc.stdout.close()
    outputs = []

    def cli(*args: str) -> Dict[str, Any]:
        result = run_cli("--dir", path, "--json", *args)
        outputs.append(f"{' '.join(args)} -> {result.code}: {result.out.strip()} {result.err.strip()}")
        return json.loads(result.out.splitlines()[-1]) if result.out.strip() else {}

    cli("lease", "break", "--by", "supervisor", "--reason", f"worker pid {proc.pid} was killed")
    lease = cli("lease", "acquire", "--owner", "worker-next", "--ttl", "600")
    epoch = str(lease.get("epoch"))
    writer = ("--owner", "worker-next", "--epoch", epoch)
    cli("effect", "verify", "doc:1:ticket", "--evidence", json.dumps({"ticket": "t-1", "observed": "after the crash"}), *writer)
    cli("lease", "release", *writer)
    return outputs

