"""Harness hooks: what Claude Code and Codex are told at SessionStart, Stop, SessionEnd and PreCompact.

Each hook reads the harness's JSON event on stdin and answers on stdout in
the harness's format (``hooks/*.py`` are the thin scripts the plugins call).
The invariants every hook keeps:

* **Silent without a run.** No run folder (``$RUNNER_DIR``, or the first
  ``.run/`` found walking up from the project folder) means no output at all.
* **Read-only on the run's state.** The state is read with
  :func:`runner.stores.file.scan`, which never writes, never locks and never
  quarantines. The only file a hook writes in the run folder is its own
  ``hooks.json`` (the Stop hook's push counter and the compaction record),
  replaced atomically through :func:`runner.fs.replace_durably`. The one
  durable transition a hook makes is SessionEnd releasing the lease held by
  this session's own owner id.
* **Fails open.** Any error of the hook's own, including running past
  its :func:`time_budget`, ends it with exit 0 and no output on stdout
  (one line on stderr), so a broken hook never blocks or wedges a session.
* **Bounded output.** The injected context is the bounded ``brief`` plus a
  few short lines; every reason is one line of at most :data:`MAX_LINE` characters.

The session's owner id is ``<harness>-<session id>``: a session resumed
under the same id runs ``recover`` under the same owner and so continues
under its own lease at a new epoch instead of waiting for itself.

The Stop hook blocks the stop (``{"decision": "block", "reason": ...}``)
while the run names an action this session may take: the lease is this
session's or free to take, and the decision is ``act`` (or an unknown effect
outcome the agent can observe). Every legal stop goes through, with a
one-line ``systemMessage`` saying why. Pushes at one revision are counted in
``hooks.json``; after :data:`MAX_PUSHES_WITHOUT_PROGRESS` of them without a
durable change of the run's revision, the stop goes through, and a restart
does not reset the count. When the count cannot be persisted, a stop that
``stop_hook_active`` marks as already pushed goes through.
"""

import json
import os
import re
import shlex
import signal
import sys
import threading
import time
from typing import IO, Any, Callable, Dict, List, Mapping, Optional, Tuple

from .envelope import canonical_json, format_time
from .errors import RunnerError
from .fs import OsFileSystem, replace_durably
from .jobs import observe_job
from .lease import lease_view
from .recovery import decide
from .run import Run
from .stores.file import scan
from .views import brief

__all__ = ["main", "handle", "owner_for", "locate_run", "time_budget", "HOOK_FILE", "MAX_PUSHES_WITHOUT_PROGRESS", "TIME_BUDGET_SECONDS",
           "CLAMPED_BUDGET_SECONDS", "EVENTS", "HARNESSES"]

HOOK_FILE = "hooks.json"
HOOK_FORMAT = "runner-hooks/1"
EVENTS = ("SessionStart", "Stop", "SessionEnd", "PreCompact")
HARNESSES = ("claude", "codex")
#: Consecutive pushes at one revision before the Stop hook lets the agent stop.
#: Below Claude Code's own cap on consecutive Stop-hook blocks.
MAX_PUSHES_WITHOUT_PROGRESS = 3
#: A hook still running after this long gives up and fails open. Below the 10 s timeout every
#: hook declares in ``hooks/*.json``, with room for Python to start.
TIME_BUDGET_SECONDS = 5.0
#: Shorter budgets where a harness allows a hook less than that: Codex stops a SessionEnd hook after
#: 3 s whatever it declares (its manifest declares 3), so the release must be done in 2.
CLAMPED_BUDGET_SECONDS = {("codex", "SessionEnd"): 2.0}
MAX_LINE = 400
BRIEF_CHARS = 2000

Clock = Callable[[], float]
Output = Optional[Dict[str, Any]]

_RUNNER_DIR_ENV = "RUNNER_DIR"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _OutOfTime(Exception):
    pass


def _line(text: str, limit: int = MAX_LINE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def owner_for(harness: str, session_id: Any) -> Optional[str]:
    """The run owner id of a harness session, or None when the event carries no session id."""
    if not isinstance(session_id, str) or not session_id.strip():
        return None
    clean = re.sub(r"[^A-Za-z0-9._:@+=-]", "-", session_id.strip())
    return f"{harness}-{clean}"[:200]


def locate_run(payload: Mapping[str, Any], env: Mapping[str, str]) -> Optional[str]:
    """The run folder this session works on: ``$RUNNER_DIR``, else the nearest ``.run/`` upward.

    A relative ``$RUNNER_DIR`` is taken from the project folder
    (``$CLAUDE_PROJECT_DIR``, else the event's ``cwd``).
    """
    project = env.get("CLAUDE_PROJECT_DIR") or payload.get("cwd") or os.getcwd()
    project = os.path.abspath(str(project))
    configured = env.get(_RUNNER_DIR_ENV)
    if configured:
        return os.path.normpath(os.path.join(project, configured))
    folder = project
    while True:
        candidate = os.path.join(folder, ".run")
        if os.path.isdir(candidate) and not os.path.islink(candidate):
            return candidate
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _runner_command(path: str) -> str:
    return f"python3 {shlex.quote(os.path.join(_ROOT, 'runner'))} --dir {shlex.quote(path)}"


def _read_hook_file(path: str) -> Dict[str, Any]:
    try:
        with open(os.path.join(path, HOOK_FILE), "rb") as handle:
            data = json.loads(handle.read(64 * 1024).decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("format") == HOOK_FORMAT else {}


def _write_hook_file(path: str, record: Dict[str, Any]) -> bool:
    record = dict(record, format=HOOK_FORMAT)
    try:
        fs = OsFileSystem()
        try:
            replace_durably(fs, os.path.join(path, HOOK_FILE), canonical_json(record) + b"\n")
        finally:
            fs.close()
    except OSError:
        return False
    return True


def _describe(action: Dict[str, Any]) -> str:
    target = action.get("step") or action.get("key") or ""
    return _line(f"{action.get('kind')}{' ' + str(target) if target else ''}: {action.get('why', '')}", 300)


class _View:
    """What one hook invocation knows of the run: its path, state (or damage), lease and decision."""

    def __init__(self, path: str, owner: Optional[str], now: float) -> None:
        self.path = path
        self.owner = owner
        found = scan(path)
        self.exists = found.exists
        self.state: Optional[Dict[str, Any]] = found.state if not found.damaged else None
        self.damage = "; ".join(f.message for f in found.findings if f.level == "damage")
        self.decision: Optional[Dict[str, Any]] = None
        self.lease: Dict[str, Any] = {}
        if self.state is None:
            return
        self.lease = lease_view(self.state, now)
        holder = self.lease.get("owner") if self.lease.get("live") else None
        unsettled = ("submitting", "running", "cancel-requested", "vanished")
        jobs = {k: observe_job(path, j) for k, j in self.state["jobs"].items() if j["state"] in unsettled}
        if holder is not None and holder == owner:
            self.decision = decide(self.state, now, owner, self.lease["epoch"], jobs)
        else:
            # Free to take (or held by someone else, which decide reports).
            self.decision = decide(self.state, now, None, None, jobs)

    @property
    def mine(self) -> bool:
        return bool(self.lease.get("live")) and self.owner is not None and self.lease.get("owner") == self.owner

    def other_holder_reason(self) -> Tuple[str, str]:
        """``fenced`` when this owner once held the run at a lower epoch, else ``already-running``."""
        assert self.state is not None
        held_before = any(
            isinstance(a, dict) and a.get("owner") == self.owner and int(a.get("epoch") or 0) < int(self.lease.get("epoch") or 0)
            for a in self.state["observations"].get("authorization", {}).values()
        )
        reason = "fenced" if held_before and self.owner else "already-running"
        return reason, f"{self.lease.get('owner')} holds the lease at epoch {self.lease.get('epoch')} until {self.lease.get('expires_at')}"

    def lease_line(self) -> str:
        if self.mine:
            return (f"you ({self.owner}) hold the lease at epoch {self.lease['epoch']} until {self.lease['expires_at']}; "
                    f"after a resume, '{_runner_command(self.path)} recover --owner {self.owner} --json' re-takes it at a new epoch")
        if self.lease.get("live"):
            return f"{self.lease.get('owner')} holds the lease at epoch {self.lease.get('epoch')}: this session must not write"
        return f"the lease is free: take it with '{_runner_command(self.path)} recover --owner {self.owner or 'ID'} --json'"


# -- the four events ---------------------------------------------------------------------


def _session_start(view: _View) -> Output:
    if view.state is None:
        text = (f"The run in {view.path} is damaged and was not loaded: {_line(view.damage, 300)}. "
                f"Do not start the task over; run '{_runner_command(view.path)} doctor' and report what it says.")
    else:
        parts = [brief(view.state, view.decision, BRIEF_CHARS), "", "## This session",
                 f"- run folder: {view.path}",
                 f"- owner id: {view.owner or 'none (the harness gave no session id)'}; " + view.lease_line(),
                 f"- the skill: {_ROOT}/SKILL.md (read it before acting on the run)",
                 "- the Stop hook keeps this session going while the run names an action for it, and lets it stop at an "
                 "approval, a cancellation, a spent limit, damage, completion, or another owner's lease"]
        text = "\n".join(parts)
    return {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": text}}


def _let_through(reason: str, detail: str, task: str = "") -> Output:
    return {"systemMessage": _line(f"run {task + ' ' if task else ''}stops here: {reason}: {detail}")}


def _stop(view: _View, payload: Mapping[str, Any], now: float) -> Output:
    if view.state is None:
        return _let_through("state-unrecoverable", view.damage or "the run state could not be read")
    state, decision = view.state, view.decision
    assert decision is not None
    task = state["task_id"]
    if view.lease.get("live") and not view.mine:
        reason, detail = view.other_holder_reason()
        return _let_through(reason, detail, task)
    if decision["decision"] == "stop":
        if decision["reason"] == "needs-reconciliation" and decision.get("check"):
            action = {"kind": "reconcile", "key": decision["check"]["key"], "why": decision["detail"]}
        else:
            return _let_through(decision["reason"], decision["detail"], task)
    else:
        action = decision["action"]
        if action.get("kind") == "wait":
            return _let_through("retry-later", f"a persisted backoff ends at {action.get('until')}", task)

    record = _read_hook_file(view.path)
    pushed = record.get("stop") if isinstance(record.get("stop"), dict) else {}
    pushes = int(pushed.get("pushes", 0)) if pushed.get("revision") == state["revision"] else 0
    if pushes >= MAX_PUSHES_WITHOUT_PROGRESS:
        return _let_through("no-progress", f"{pushes} pushes without a durable change since revision {state['revision']}; "
                            f"a person should look at: {_describe(action)}", task)
    record["stop"] = {"revision": state["revision"], "pushes": pushes + 1, "at": format_time(now), "owner": view.owner}
    if not _write_hook_file(view.path, record) and payload.get("stop_hook_active"):
        return _let_through("no-progress", "the push count could not be recorded and this stop was already pushed once", task)
    take = "" if view.mine else f" Take the lease first: {_runner_command(view.path)} recover --owner {view.owner or 'ID'} --json."
    reason = _line(f"Run {task} is not finished (revision {state['revision']}): next action {_describe(action)}.{take}", MAX_LINE + 200)
    return {"decision": "block", "reason": reason}


def _session_end(view: _View, clock: Clock) -> Output:
    if view.state is None or view.owner is None or view.state["lease"].get("owner") != view.owner:
        return None
    try:
        run = Run.open(view.path, owner=view.owner, epoch=int(view.state["lease"]["epoch"]), clock=clock)
        run.release()
    except RunnerError:
        pass  # someone else took the lease since it was read: theirs is not ours to release
    return None


def _pre_compact(view: _View, payload: Mapping[str, Any], now: float) -> Output:
    if view.state is None:
        return None
    record = _read_hook_file(view.path)
    previous = record.get("compactions") if isinstance(record.get("compactions"), dict) else {}
    record["compactions"] = {
        "count": int(previous.get("count", 0)) + 1,
        "last": {"at": format_time(now), "owner": view.owner, "trigger": _line(payload.get("trigger") or "unknown", 20),
                 "revision": view.state["revision"]},
    }
    _write_hook_file(view.path, record)
    return None


def _pre_compact_text(view: _View) -> str:
    """Claude Code adds a PreCompact hook's plain output to the compaction instructions."""
    if view.state is None or view.decision is None:
        return ""
    d = view.decision
    nxt = _describe(d["action"]) if d["decision"] == "act" else f"stopped: {d['reason']}"
    return _line(f"Keep in the summary: the run {view.state['task_id']} in {view.path}, owner id {view.owner}, next action {nxt}. "
                 "Its durable state, not this conversation, says what is done; the brief is injected again after compaction.")


# -- entry point -------------------------------------------------------------------------


def handle(event: str, harness: str, payload: Mapping[str, Any], env: Mapping[str, str], clock: Clock = time.time) -> Tuple[Output, str]:
    """The JSON object to print (or None) and any plain text, for one event. Never writes to stdout."""
    path = locate_run(payload, env)
    if path is None or not os.path.isdir(path):
        return None, ""
    now = clock()
    view = _View(path, owner_for(harness, payload.get("session_id")), now)
    if not view.exists:
        return None, ""
    if event == "SessionStart":
        return _session_start(view), ""
    if event == "Stop":
        return _stop(view, payload, now), ""
    if event == "SessionEnd":
        return _session_end(view, clock), ""
    if event == "PreCompact":
        out = _pre_compact(view, payload, now)
        return out, (_pre_compact_text(view) if harness == "claude" else "")
    return None, ""


def time_budget(harness: str, event: str) -> float:
    """The seconds one hook of ``harness`` at ``event`` may run before it gives up."""
    return min(TIME_BUDGET_SECONDS, CLAMPED_BUDGET_SECONDS.get((harness, event), TIME_BUDGET_SECONDS))


def main(event: str, argv: List[str], stdin: Optional[IO[str]] = None, stdout: Optional[IO[str]] = None, stderr: Optional[IO[str]] = None,
         env: Optional[Mapping[str, str]] = None, clock: Clock = time.time) -> int:
    """Run one hook; always exit 0 (the answer is on stdout), failing open on any error of its own."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    env = os.environ if env is None else env
    harness = "codex" if "--harness" in argv and argv[argv.index("--harness") + 1 :][:1] == ["codex"] else "claude"
    # The timer needs SIGALRM, which only the main thread can handle.
    timed = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    previous = None
    budget = time_budget(harness, event)

    def out_of_time(signum: int, frame: Any) -> None:
        raise _OutOfTime(f"gave up after {budget} s")

    try:
        if timed:
            previous = signal.signal(signal.SIGALRM, out_of_time)
            signal.setitimer(signal.ITIMER_REAL, budget)
        payload = json.loads(stdin.read(1 << 20) or "{}")
        if not isinstance(payload, dict):
            raise ValueError("the hook input is not a JSON object")
        out, text = handle(event, harness, payload, env, clock)
    except Exception as exc:  # fail open: a broken hook must never block a session
        stderr.write(_line(f"long-running-agent-sessions {event} hook: {type(exc).__name__}: {exc}", 300) + "\n")
        return 0
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if previous is not None:
                signal.signal(signal.SIGALRM, previous)
    if out is not None:
        stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
    elif text:
        stdout.write(text + "\n")
    stdout.flush()
    return 0
