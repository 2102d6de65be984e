"""``campaign``: thousands of SIGKILLs at every named commit window, each resumed elsewhere.

Each kill is one forked worker process. The worker opens the run from disk
(nothing is inherited but code), recovers it, and works (effects on the
loopback ticket service, steps, a re-attachable job now and then) until it
reaches its assigned window for the n-th time, where it SIGKILLs itself.
The parent, a different process, then loads the run and checks it; the next
worker resumes it. Windows are taken in turn, so every one is hit; which
occurrence of a window dies is random.

Checked after every kill: the run loads (no state-unrecoverable), its
revision is at least the last one the dead worker saw acknowledged, and the
ticket service holds no duplicate. At the end every run is driven to
completion by a clean worker, and the campaign reports: kills, recovery
success rate, duplicate effects, lost commits, unknown results left,
orphaned jobs and the slowest recovery. Exit is non-zero on any duplicate or loss.
"""

import os
import random
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..calls.target import Adapter
from ..base.errors import RunnerError
from ..surfaces.history import Recorder
from ..ledger.states import UNRESOLVED
from ..execution.recovery import recover
from ..execution.run import Run, submit_job
from ..stores.file import RunStore
from ..surfaces.timeline import write as write_timeline
from ..base.windows import NO_OBSERVER, Observer
from .faults import kill_point, lose_next_answer
from .ticketservice import TicketAdapter, TicketServiceProcess

__all__ = ["KILL_POINTS", "run_campaign"]

#: Where a worker is told to die: a window of :mod:`runner.base.windows`, alone or
#: with the fault that comes with it (``/torn``: half the record is written;
#: ``/answer-lost``: the service commits and drops its answer). Grouped by layer.
KILL_POINTS = (
    # the store's write path
    "store:before-append/torn",
    "store:after-append-fsync",
    "store:before-compaction",
    "store:after-temp-fsync",
    "store:after-backup-rename",
    "store:after-rename",
    "store:after-journal-rename",
    # one effect's lifecycle
    "effect:before-started",
    "effect:after-started",
    "effect:after-call/answer-lost",
    "effect:after-call",
    "effect:after-ack",
    "effect:before-verify",
    # a step, a lease, a job
    "step:after-start",
    "lease:after-acquire",
    "job:after-intent",
    "job:after-spawn",
)

#: Points a worker passes about once per run or per worker: always the first pass.
_ONCE = ("step:after-start", "lease:after-acquire", "job:after-intent", "job:after-spawn")


# -- the work a campaign run does ------------------------------------------------------------

DOCS_PER_RUN = 60
TTL = 120.0


def campaign_contract(task: str) -> Dict[str, Any]:
    return {
        "contract": 1,
        "task_id": task,
        "goal": "File one ticket per document, run a check job, finish.",
        "steps": [
            {"id": "ingest", "artifact": "tickets", "check": "each found by key", "next": "check"},
            {"id": "check", "artifact": "job result", "check": "exit code 0", "next": "done"},
        ],
        "effects": {"key_pattern": "[a-z0-9:.-]+"},
        "limits": {"max_effect_attempts": 50, "max_step_attempts": 10000},
        "retry": {"base_seconds": 0.01, "cap_seconds": 0.1},
        "jobs": {"rerun_vanished": True},
        "lease": {"ttl_seconds": TTL},
    }


def _payload(task: str, n: int) -> Dict[str, Any]:
    return {"doc": f"{task}:d{n}", "marker": f"{task}:d{n}", "title": f"document {n} of {task}"}


def _work(run: Run, task: str, adapter: Adapter, report: Any, budget: int) -> str:
    """Drive ``run`` toward completion, at most ``budget`` effects; ``report(revision)`` after each acknowledged
    call."""
    state = run.state
    if (state["steps"].get("ingest") or {}).get("state") != "done":
        if state["current_step"] != "ingest":
            run.step_start("ingest")
            report(run.state["revision"])
        for n in range(DOCS_PER_RUN):
            key = f"{task}:d{n}:ticket"
            effect = run.state["effects"].get(key)
            if effect is None or effect["state"] != "verified":
                if budget <= 0:
                    return "paused"  # a worker that missed its window makes way for the next
                budget -= 1
                run.drive_effect(key, _payload(task, n), adapter, step="ingest")
                report(run.state["revision"])
        run.step_done("ingest", {"verified": DOCS_PER_RUN})
        report(run.state["revision"])
    if run.state["current_step"] != "check" and (run.state["steps"].get("check") or {}).get("state") != "done":
        run.step_start("check")
        report(run.state["revision"])
    job = submit_job(run, "check", [sys.executable, "-S", "-c", "pass"])
    report(run.state["revision"])
    deadline = time.monotonic() + 30
    while job["state"] in ("submitting", "running") and time.monotonic() < deadline:
        job = run.job_observe("check")
        if job["state"] in ("submitting", "running"):
            time.sleep(0.005)
    if job["state"] == "vanished":
        job = submit_job(run, "check", [sys.executable, "-S", "-c", "pass"])
        return "job-rerun"
    run.step_done("check", {"exit_code": job.get("exit_code")})
    report(run.state["revision"])
    return run.state["status"]


def _child(run_path: str, task: str, url: str, window: Optional[str], nth: int, seed: int, write_fd: int) -> None:
    """The body of a forked worker. Never returns: exits or is killed."""
    code = 0
    try:
        observer: Observer = (kill_point(window, nth, lose_answer=lambda: lose_next_answer(url)) if window
                              else NO_OBSERVER)
        store = RunStore.open(run_path, compact_min_bytes=4096, observer=observer)
        run = Run(store, rand=random.Random(seed).random)
        adapter = TicketAdapter(url, retention_seconds=None, timeout=5.0, run_id=task)

        def report(revision: int) -> None:
            os.write(write_fd, f"ack {revision}\n".encode())

        began = time.monotonic()
        decision = recover(run, f"w{seed}", TTL, adapter_for=lambda key, effect: adapter,
                           payloads=lambda key: _payload(task, int(key.split(":d")[1].split(":")[0])))
        os.write(write_fd, f"recovered {time.monotonic() - began:.6f} {run.state['revision']}\n".encode())
        if decision["decision"] == "stop" and decision["reason"] != "needs-reconciliation":
            os.write(write_fd, f"{decision['reason']}\n".encode())
        else:
            outcome = _work(run, task, adapter, report, 12 if window else DOCS_PER_RUN)
            run.release()  # only after the last durable write
            os.write(write_fd, f"{outcome}\n".encode())
    except RunnerError as exc:
        os.write(write_fd, f"error {exc.reason} {exc.message}\n".replace("\n", " ").encode() + b"\n")
        code = 3
    except BaseException as exc:  # a bug: report it, never hang the campaign
        os.write(write_fd, f"crash {type(exc).__name__}: {exc}\n".replace("\n", " ").encode() + b"\n")
        code = 4
    os._exit(code)


def _fork_worker(run_path: str, task: str, url: str, window: Optional[str], nth: int, seed: int,
                 on_output: Optional[Callable[[], Any]] = None) -> Tuple[int, List[str]]:
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(run_path, task, url, window, nth, seed, write_fd)
    os.close(write_fd)
    chunks = []
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        if on_output is not None:
            on_output()
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    return status, b"".join(chunks).decode("utf-8", "replace").splitlines()


def run_campaign(kills: int = 100, seed: int = 1, progress: Optional[Any] = None,
                 html: Optional[str] = None) -> Dict[str, Any]:
    """Run the campaign until ``kills`` workers were killed at a window; return the figures.

    ``html``: write the timeline page of the runs there; each run's journal is
    read whenever a worker reports progress and after it ends, so that compaction drops as little as possible unseen.
    """
    if not hasattr(os, "fork"):
        raise RunnerError("the campaign forks its workers; this platform has no fork()")
    rng = random.Random(seed)
    root = tempfile.mkdtemp(prefix="runner-campaign-")
    began = time.monotonic()
    result: Dict[str, Any] = {"kills": 0, "kills_by_window": {w: 0 for w in KILL_POINTS}, "workers": 0, "runs": 0,
                              "recoveries": 0, "recovered": 0, "lost_commits": 0, "unrecoverable": 0,
                              "duplicate_effects": 0, "errors": [], "slowest_recovery_ms": 0.0,
                              "unknown_results_left": 0, "orphaned_jobs": 0, "jobs_vanished": 0}
    try:
        with TicketServiceProcess(os.path.join(root, "tickets.db")) as service:
            runs: List[Tuple[str, str]] = []
            recorders: Dict[str, Recorder] = {}

            def new_run() -> Tuple[str, str]:
                task = f"c{seed}-r{len(runs)}"
                path = os.path.join(root, task)
                RunStore.create(path, task, campaign_contract(task))
                if html:
                    recorders[path] = Recorder(lambda: RunStore.open(path))
                runs.append((path, task))
                result["runs"] += 1
                return path, task

            run_path, task = new_run()
            turn = 0
            misses = 0  # workers in a row that did not reach the chosen window
            while result["kills"] < kills:
                if misses > 200:
                    result["errors"].append(f"window {KILL_POINTS[turn % len(KILL_POINTS)]} was not reached by 200 "
                                            "workers in a row")
                    break
                # Windows are taken in turn, and a window stays chosen until a
                # worker dies there, so rarely reached windows are not skipped.
                window = KILL_POINTS[turn % len(KILL_POINTS)]
                nth = 1 if window in _ONCE else 1 + int(rng.expovariate(1 / 4))
                status, lines = _fork_worker(run_path, task, service.url, window, nth, rng.randrange(1 << 30),
                                             recorders[run_path].try_poll if html else None)
                if html:
                    recorders[run_path].try_poll()
                result["workers"] += 1
                acked = max([int(line.split()[1]) for line in lines if line.startswith("ack ")] or [0])
                for line in lines:
                    if line.startswith("recovered "):
                        result["slowest_recovery_ms"] = max(result["slowest_recovery_ms"],
                                                            float(line.split()[1]) * 1000)
                    elif line.startswith(("error", "crash")) or line in ("already-running", "fenced"):
                        result["errors"].append(f"{task} {window}#{nth}: {line}")
                killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
                # The check runs here, in a process other than the one that died.
                try:
                    state = RunStore.open(run_path).state
                except RunnerError as exc:
                    result["unrecoverable"] += 1
                    result["errors"].append(f"{task} after {window}#{nth}: {exc.reason}: {exc.message}")
                    run_path, task = new_run()
                    continue
                if state["revision"] < acked:
                    result["lost_commits"] += acked - state["revision"]
                misses = 0 if killed else misses + 1
                if killed:
                    turn += 1
                    result["kills"] += 1
                    result["kills_by_window"][window] += 1
                    result["recovered"] += 1
                    if state["lease"]["owner"] is not None:
                        Run(RunStore.open(run_path)).break_lease("campaign", f"worker killed at {window}")
                if state["status"] == "complete":
                    run_path, task = new_run()
                if progress is not None and result["workers"] % 50 == 0:
                    progress.write(f"\rcampaign: {result['kills']}/{kills} kills, {result['runs']} runs, "
                                   f"{time.monotonic() - began:.0f}s")
                    progress.flush()
                if result["errors"] and len(result["errors"]) > 20:
                    break
            # Finish every run with a clean worker, then audit the target and the ledgers.
            for path, name in runs:
                for _ in range(5):
                    state = RunStore.open(path).state
                    if state["status"] == "complete":
                        break
                    status, lines = _fork_worker(path, name, service.url, None, 0, rng.randrange(1 << 30),
                                                 recorders[path].try_poll if html else None)
                    if html:
                        recorders[path].try_poll()
                    result["errors"] += [f"{name} final: {line}" for line in lines
                                         if line.startswith(("error", "crash"))]
                    state = RunStore.open(path).state
                    if state["lease"]["owner"] is not None and state["status"] != "complete":
                        Run(RunStore.open(path)).break_lease("campaign", "final worker ended")
                result["unknown_results_left"] += sum(1 for e in state["effects"].values() if e["state"] in UNRESOLVED)
                # A job whose worker died before it started vanished and was run again;
                # an orphan is one still without a result when the run is finished.
                result["jobs_vanished"] += int(state["counters"].get("jobs_orphaned", 0))
                result["orphaned_jobs"] += sum(1 for j in state["jobs"].values()
                                               if j["state"] not in ("finished", "stopped"))
                result["recoveries"] += int(state["counters"].get("recoveries", 0))
                if state["status"] != "complete":
                    result["errors"].append(f"{name} ended {state['status']}")
            stats = service.stats()
            result["duplicate_effects"] = int(stats["duplicates"])
            result["tickets"] = int(stats["tickets"])
            expected = sum(DOCS_PER_RUN for _ in runs)
            result["tickets_expected"] = expected
            result["missing_effects"] = max(0, expected - int(stats["tickets"]))
            if html:
                result["html_bytes"] = write_timeline(html, [recorders[path].history() for path, _ in runs],
                                                      f"Campaign: {kills} kills, seed {seed}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if progress is not None:
        progress.write("\n")
    result["seconds"] = round(time.monotonic() - began, 2)
    result["slowest_recovery_ms"] = round(result["slowest_recovery_ms"], 2)
    result["recovery_success_rate"] = round(result["recovered"] / result["kills"], 4) if result["kills"] else None
    result["ok"] = (result["duplicate_effects"] == 0 and result["lost_commits"] == 0 and result["unrecoverable"] == 0
                    and result["missing_effects"] == 0 and result["unknown_results_left"] == 0
                    and result["orphaned_jobs"] == 0
                    and not result["errors"])
    return result
