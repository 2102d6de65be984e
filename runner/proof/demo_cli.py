"""``demo --via-cli``: the document job from a contract and the command line alone.

The same job as :mod:`runner.proof.demo` (one ticket per document on the
loopback ticket service), but no Python drives it: a contract with a batch
step over ``docs/*.txt`` names how a ticket is filed and looked up (curl in
shell scripts, the standalone Python client, or ``effects.http``: the
runner's own HTTP adapter, no process per call), and the work is done by
``python3 -m runner drive`` processes. They are SIGKILLed at the effect
windows and at random moments (a timer); after each kill the supervisor
breaks the lease with ``lease break`` and a new ``drive`` process resumes.
With commands, the commands' wrapper kills the runner that started them at
five windows; with ``effects.http`` the driver chosen to die at a window is
:mod:`runner.proof.killed_drive`, the same ``drive`` with a killing observer.

The audit is the demo's: every document holds exactly one ticket, every
effect is verified, no acknowledged revision was lost, and the tickets'
payloads match an uncrashed reference run over the same documents.
"""

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any, Dict, List, Optional

from ..stores.file import RunStore
from . import PACKAGE_PARENT
from .ticketcommands import WINDOWS, have_curl, write_commands
from .ticketservice import TicketServiceProcess

__all__ = ["run_demo_cli", "format_cli_table", "demo_contract", "http_contract", "CLIENTS"]

#: How the contract calls the service.
CLIENTS = ("curl", "python", "http")
#: The windows an in-process call passes (runner.base.windows), where ``effects.http`` drivers are killed.
HTTP_WINDOWS = ("effect:before-started", "effect:after-started", "effect:after-call", "effect:after-ack",
                "effect:before-verify")

TASK = "demo-documents-cli"
_PACKAGE_PARENT = PACKAGE_PARENT


def demo_contract(commands: Dict[str, List[str]]) -> Dict[str, Any]:
    return {
        "contract": 1,
        "task_id": TASK,
        "goal": "File one ticket per document in docs/, each exactly once.",
        "completion_evidence": ["every document's ticket found by key at the ticket service"],
        "workspace": ".",
        "steps": [{"id": "ingest", "items": {"glob": "docs/*.txt"}, "key": "{stem}:ticket",
                   "payload": {"command": commands["payload"]}, "next": "done"}],
        "effects": {"key_pattern": "doc-[0-9]{5}:ticket", "invoke": commands["invoke"], "observe": commands["observe"],
                    "timeout_seconds": 30},
        "limits": {"max_effect_attempts": 6},
        "retry": {"base_seconds": 0.01, "cap_seconds": 0.1},
        "lease": {"ttl_seconds": 60},
    }


def http_contract(url: str) -> Dict[str, Any]:
    """The demo's contract with ``effects.http``: the payload is the body the service reads, looked up by key."""
    contract = demo_contract({"payload": [], "invoke": [], "observe": []})
    contract["steps"][0]["payload"] = {"template": {"payload": {"document": "{stem}", "title": "{heading}"}}}
    effects = contract["effects"]
    del effects["invoke"], effects["observe"]
    effects["http"] = {
        "invoke": {"method": "POST", "url": url + "/tickets", "headers": {"X-Run-Id": "{run_id}"}},
        "observe": {"url": url + "/tickets/by-key/{key}", "pointer": "/ticket"},
        "idempotency_header": "Idempotency-Key",
        "epoch_header": "X-Fencing-Epoch",
    }
    return contract


def _documents(folder: str, count: int) -> None:
    os.makedirs(os.path.join(folder, "docs"))
    for n in range(count):
        with open(os.path.join(folder, "docs", f"doc-{n:05d}.txt"), "w", encoding="utf-8") as handle:
            handle.write(f"Review of document {n}\nquarterly record {n * 7919 % 100003}\n")


def _env(**extra: str) -> Dict[str, str]:
    env = dict(os.environ)
    for name in ("RUNNER_DIR", "RUNNER_STORE", "RUNNER_TASK", "RUNNER_OWNER", "RUNNER_EPOCH", "RUNNER_KILL_AT"):
        env.pop(name, None)
    env["PYTHONPATH"] = _PACKAGE_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def _cli(workspace: str, *args: str, env: Optional[Dict[str, str]] = None) -> "subprocess.Popen[str]":
    # -S: the runner needs no site-packages (its folder is on PYTHONPATH); site would lengthen every driver's start.
    command = [sys.executable, "-S", "-m", "runner", "--dir", os.path.join(workspace, ".run"), *args]
    return subprocess.Popen(command, cwd=workspace, env=env or _env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _job(root: str, name: str, service: TicketServiceProcess, documents: int, client: str) -> str:
    workspace = os.path.join(root, name)
    os.makedirs(workspace)
    _documents(workspace, documents)
    contract = (http_contract(service.url) if client == "http"
                else demo_contract(write_commands(workspace, service.url, client, killable=True)))
    with open(os.path.join(workspace, "contract.md"), "w", encoding="utf-8") as handle:
        handle.write("# Run contract: the demo's documents\n\n```json run-contract\n" + json.dumps(contract, indent=2)
                     + "\n```\n")
    proc = _cli(workspace, "init", "--contract", "contract.md")
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"init failed: {err.strip()}")
    return workspace


def _drivers(workspace: str, documents: int, seed: int, crash_rate: float, progress: Optional[IO[str]],
             max_drivers: int = 100000, parallel: int = 1, in_process: bool = False) -> Dict[str, Any]:
    """Start ``drive`` processes one after another until one reports complete; kill them as chosen.

    :param in_process: the contract calls the target in the driver (``effects.http``): a driver chosen
        to die at a window is :mod:`runner.proof.killed_drive`.
    """
    rng = random.Random(seed)
    windows = HTTP_WINDOWS if in_process else WINDOWS
    tally: Dict[str, Any] = {"crashes": 0, "crashes_holding": 0, "window_kills": 0, "timer_kills": 0, "drivers": 0,
                             "lost_commits": 0, "errors": [],
                             "drive_seconds": 0.0, "kills_by_window": {w: 0 for w in windows}}
    run_path = os.path.join(workspace, ".run")
    counter = os.path.join(workspace, ".kill-count")
    last_revision = 0
    for generation in range(1, max_drivers + 1):
        extra: Dict[str, str] = {}
        timer: Optional[float] = None
        window = None
        if crash_rate > 0:
            life = int(math.log(1.0 - rng.random()) / math.log(1.0 - crash_rate)) + 1
            if rng.random() < 0.8:
                window = rng.choice(windows)
                if os.path.exists(counter):
                    os.unlink(counter)
                extra = {"RUNNER_KILL_AT": window, "RUNNER_KILL_NTH": str(life), "RUNNER_KILL_COUNT": counter}
            else:
                timer = rng.uniform(0.3, 0.3 + life * 0.02)
        began = time.monotonic()
        owner = f"driver-{generation}"
        if in_process and window is not None:
            command = [sys.executable, "-S", "-m", "runner.proof.killed_drive", run_path, owner, window,
                       extra["RUNNER_KILL_NTH"], str(parallel)]
            proc = subprocess.Popen(command, cwd=workspace, env=_env(), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        else:
            proc = _cli(workspace, "drive", "--owner", owner, "--parallel", str(parallel), "--json", env=_env(**extra))
        tally["drivers"] += 1
        try:
            out, err = proc.communicate(timeout=timer)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            tally["timer_kills"] += 1
            timer = -1.0
        finally:
            if proc.poll() is None:  # the demo itself is being stopped: leave no driver behind
                proc.kill()
                proc.wait()
        tally["drive_seconds"] += time.monotonic() - began
        state = RunStore.open(run_path).state
        if state["revision"] < last_revision:
            tally["lost_commits"] += last_revision - state["revision"]
        last_revision = max(last_revision, state["revision"])
        if progress is not None:
            done = sum(1 for e in state["effects"].values() if e["state"] == "verified")
            rate = state["revision"] / max(tally["drive_seconds"], 1e-9)
            progress.write(f"demo --via-cli: {done}/{documents} documents | crashes {tally['crashes']}"
                           f" | drivers {tally['drivers']}"
                           f" | {rate:.0f} transitions/s\n")
            progress.flush()
        if proc.returncode == -signal.SIGKILL:
            tally["crashes"] += 1
            if (state.get("lease") or {}).get("owner") == owner:
                tally["crashes_holding"] += 1  # a driver killed before it took the lease leaves nothing to recover
            if timer is None and window is not None:
                tally["window_kills"] += 1
                tally["kills_by_window"][window] += 1
            broke = _cli(workspace, "lease", "break", "--by", "demo-supervisor", "--reason",
                         f"driver-{generation} (pid {proc.pid}) was killed")
            _, berr = broke.communicate()
            if broke.returncode != 0:
                tally["errors"].append(f"lease break: {berr.strip()}")
                break
            continue
        if proc.returncode == 10:
            break
        tally["errors"].append(f"driver-{generation} exited {proc.returncode}: {(err.strip() or out.strip())[-400:]}")
        break
    tally["revision"] = last_revision
    return tally


def _audit(workspace: str, service: TicketServiceProcess, documents: int) -> Dict[str, Any]:
    state = RunStore.open(os.path.join(workspace, ".run")).state
    tickets = {f"doc-{n:05d}:ticket": [t.get("payload_digest") for t in service.tickets_for_key(f"doc-{n:05d}:ticket")]
               for n in range(documents)}
    return {"state": state, "tickets": tickets, "output": {k: v[0] for k, v in tickets.items() if len(v) == 1},
            "stats": service.stats()}


def run_demo_cli(documents: int = 2000, seed: int = 1, crash_rate: float = 0.01, progress: Optional[IO[str]] = None,
                 client: Optional[str] = None, parallel: int = 1, html: Optional[str] = None) -> Dict[str, Any]:
    """Run the CLI-only demo; its figures, with ``ok`` only for 0 duplicates, 0 lost commits and a matching output.

    :param html: write the batch run's timeline page there, from its whole history, as ``report --html`` does.
    """
    client = client or ("curl" if have_curl() else "python")
    root = tempfile.mkdtemp(prefix="runner-demo-cli-")
    # A SIGTERM to the demo unwinds it like an error, so its services and drivers are stopped.
    previous = (signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread()
                else None)
    try:
        began = time.monotonic()
        with TicketServiceProcess(os.path.join(root, "reference.db")) as ref_service:
            ref = _job(root, "reference", ref_service, documents, client)
            ref_tally = _drivers(ref, documents, seed, 0.0, None, max_drivers=1, in_process=client == "http")
            reference = _audit(ref, ref_service, documents)
        reference_seconds = time.monotonic() - began
        began = time.monotonic()
        with TicketServiceProcess(os.path.join(root, "tickets.db")) as service:
            workspace = _job(root, "job", service, documents, client)
            tally = _drivers(workspace, documents, seed, crash_rate, progress, parallel=parallel,
                             in_process=client == "http")
            audit = _audit(workspace, service, documents)
        wall = time.monotonic() - began
        state, stats = audit["state"], audit["stats"]
        effects = state["effects"]
        duplicates = sum(len(v) - 1 for v in audit["tickets"].values() if len(v) > 1) + int(stats.get("duplicates", 0))
        lost = tally["lost_commits"] + sum(1 for k, e in effects.items()
                                           if e["state"] == "verified" and len(audit["tickets"].get(k, [])) != 1)
        result: Dict[str, Any] = {
            "documents": documents,
            "seed": seed,
            "crash_rate": crash_rate,
            "client": client,
            "parallel": parallel,
            "drivers": tally["drivers"],
            "crashes": tally["crashes"],
            "crashes_holding_the_lease": tally["crashes_holding"],
            "crashes_at_windows": tally["window_kills"],
            "crashes_at_random_moments": tally["timer_kills"],
            "kills_by_window": tally["kills_by_window"],
            "recoveries": int(state["counters"].get("recoveries", 0)),
            "effects_requested": int(stats["requests"].get("post_tickets", 0)),
            "effects_held": sum(len(v) for v in audit["tickets"].values()),
            "effects_verified": sum(1 for e in effects.values() if e["state"] == "verified"),
            "duplicate_effects": duplicates,
            "uncertain_reconciled": int(state["counters"].get("reconciled_effects", 0)),
            "lost_commits": lost,
            "status": state["status"],
            "revision": state["revision"],
            "matches_reference": (audit["output"] == reference["output"] and state["status"] == "complete" and
                                  len(audit["output"]) == documents),
            "wall_seconds": round(wall, 2),
            "drive_seconds": round(tally["drive_seconds"], 2),
            "transitions_per_second": round(state["revision"] / max(tally["drive_seconds"], 1e-9), 1),
            "reference_seconds": round(reference_seconds, 2),
            "total_seconds": round(wall + reference_seconds, 2),
            "errors": tally["errors"] + ref_tally["errors"],
        }
        if html:
            from ..surfaces.history import load
            from ..surfaces.timeline import write

            result["html_bytes"] = write(html, [load(RunStore.open(os.path.join(workspace, ".run")))],
                                         f"Demo through the command line: {documents} items")
            result["html"] = html
        result["ok"] = duplicates == 0 and lost == 0 and not result["errors"] and result["matches_reference"]
        return result
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(root, ignore_errors=True)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _recoveries(result: Dict[str, Any]) -> str:
    """The recoveries, and why they are fewer than the crashes: a drive killed holding no lease left none to take."""
    unheld = result["crashes"] - result["crashes_holding_the_lease"]
    said = f"{result['recoveries']}"
    if result["crashes"]:
        said += ": one per crash of a drive that held the lease"
    if unheld > 0:
        were = "s were" if unheld != 1 else " was"
        said += (f"; {unheld} drive{were} killed holding none (before taking it, or after giving it back): no drive "
                 "took over from them, so those crashes are not recoveries")
    return said


def format_cli_table(result: Dict[str, Any]) -> str:
    """The CLI-only demo's table: each figure, why the recoveries are fewer than the crashes, the whole wall time."""
    rows = [
        ("documents", result["documents"]),
        ("driven by", f"'drive --parallel {result.get('parallel', 1)}' processes over a batch contract; "
                      + ("the runner's HTTP adapter (effects.http)" if result["client"] == "http"
                         else f"commands via {result['client']}")),
        ("crashes (SIGKILL)", f"{result['crashes']} ({result['crashes_at_windows']} at effect windows, "
                              f"{result['crashes_at_random_moments']} at random moments; "
                              f"{result['crashes_holding_the_lease']} while holding the lease)"),
        ("  by window", ", ".join(f"{w} {n}" for w, n in result["kills_by_window"].items())),
        ("drive processes", result["drivers"]),
        ("recoveries (lease takeovers)", _recoveries(result)),
        ("effects requested", result["effects_requested"]),
        ("effects held by the target", result["effects_held"]),
        ("duplicate effects", f"{result['duplicate_effects']}  (must be 0)"),
        ("uncertain effects reconciled", result["uncertain_reconciled"]),
        ("lost commits", f"{result['lost_commits']}  (must be 0)"),
        ("matches the uncrashed reference", result["matches_reference"]),
        ("final status", f"{result['status']} at revision {result['revision']}"),
        ("transitions per second", f"{result['transitions_per_second']} (through drive, kills and restarts included)"),
        ("wall time", f"{result['total_seconds']} s: the uncrashed reference run {result['reference_seconds']} s, "
                      f"then the crashed run {result['wall_seconds']} s"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines += [f"error: {error}" for error in result["errors"]]
    lines.append("RESULT: " + ("ok" if result["ok"] else "FAILED"))
    return "\n".join(lines)
