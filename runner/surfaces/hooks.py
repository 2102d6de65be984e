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
  replaced atomically through :func:`runner.base.fs.replace_durably`. The one
  durable transition a hook makes is SessionEnd releasing the lease held by
  this session's own owner id.
* **Fails open.** Any error of the hook's own, including running past
  its :func:`time_budget`, ends it with exit 0 and no output on stdout
  (one line on stderr), so a broken hook never blocks or wedges a session.
* **Bounded output.** The injected context is the bounded ``brief`` plus a
  few short lines; every reason is one line of at most :data:`MAX_LINE` characters.
* **Quoted provenance.** Every text a hook prints that the runner did not
  write (the goal, ids, reasons, paths, damage reports) is a labelled
  quotation or an id in backticks (:mod:`runner.base.quoting`); the actions and
  commands it names are built from structured fields.

The session's owner id is ``<harness>-<session id>``: a session resumed
under the same id runs ``recover`` under the same owner and so continues
under its own lease at a new epoch instead of waiting for itself.

The adoption rule: a run is this user's when its identity says it was made
on this host by this user id (``made_by`` in ``run.json``, written at ``init``),
or when a ``recover`` on this host by this user id has adopted it (the
host and uid in its ``observations.authorization`` record, a journal
transition like any other). Any other run, including one that records no
maker (made before the runner recorded makers, or with the record removed:
an absent record must not be a way around the rule), is announced at
SessionStart as someone else's, and the Stop hook never pushes on it.

The Stop hook blocks the stop (``{"decision": "block", "reason": ...}``)
while the run is this user's and names an action this session may take: the
lease is this session's or free to take, and the decision is ``act`` (or an
unknown effect outcome the agent can observe). Every legal stop goes through, with a
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

from . import verbs
from ..base.times import format_time
from ..base.canonical import canonical_json
from ..base.errors import InvalidInput, RunnerError
from ..base.fs import OsFileSystem, replace_durably
from ..base.paths import PACKAGE_PARENT
from ..ledger.lease import lease_view
from ..base.quoting import MESSAGE, NOTICE_SHORT, PATH, fit, moment, name, number, quote
from ..execution.run import Run
from ..stores.codec import decode_identity
from ..base.host import local_maker
from ..stores.file_layout import IDENTITY
from ..stores.file_scan import scan
from .stops import STOPS, stop_of
from .views import action_text, brief

__all__ = ["main", "handle", "owner_for", "locate_run", "made_by", "adoption", "time_budget", "HOOK_FILE",
           "MAX_PUSHES_WITHOUT_PROGRESS", "TIME_BUDGET_SECONDS", "CLAMPED_BUDGET_SECONDS", "EVENTS", "HARNESSES"]

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
_ROOT = PACKAGE_PARENT


class _OutOfTime(Exception):
    pass


def _line(text: str, limit: int = MAX_LINE) -> str:
    """One line of at most ``limit`` characters, never cut inside a quotation; with the notice when it quotes."""
    if "<quote from=" not in text:
        return fit(text, limit)
    return fit(text, limit - len(NOTICE_SHORT) - 1) + " " + NOTICE_SHORT


def _stderr_line(text: str) -> str:
    return " ".join(str(text).split())[:300]


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


def _plain(path: str) -> bool:
    """A path that can be shown in a code span: printable, no backtick, angle bracket or line break, nothing
    invisible."""
    return all(c.isprintable() and c not in "`<>" for c in path)


def _path_text(path: str) -> str:
    return f"`{path}`" if _plain(path) else quote(path, PATH, 300)


def _runner_command(path: str) -> str:
    """The command that runs this runner on ``path``; ``RUN_FOLDER`` stands for a folder whose name cannot be shown
    plainly."""
    runner = os.path.join(_ROOT, "runner")
    where = shlex.quote(path) if _plain(path) else "RUN_FOLDER"
    return f"python3 {shlex.quote(runner) if _plain(runner) else 'RUNNER'} --dir {where}"


def made_by(path: str) -> Any:
    """The maker ``run.json`` in the run folder ``path`` records, or None (an older run, or a file that cannot be
    read)."""
    try:
        with open(os.path.join(path, IDENTITY), "rb") as handle:
            return decode_identity(handle.read()).get("made_by")
    except (OSError, ValueError, InvalidInput):
        return None


def adoption(made: Any, state: Dict[str, Any], me: Dict[str, Any]) -> Tuple[str, str]:
    """``(verdict, description)``: whether the run made by ``made`` (:func:`made_by`) in ``state`` is the user's ``me``.

    ``me`` is :func:`runner.base.host.local_maker`. ``made`` when it was
    made on this host by this user id; ``adopted`` when a ``recover`` on this
    host by this user id has run on it; ``foreign`` when someone else made
    it; ``unrecorded`` when it names no maker and was not adopted. Only
    ``made`` and ``adopted`` runs are this user's.
    """
    observations = state.get("observations") or {}
    if isinstance(made, dict) and made.get("host") == me.get("host") and made.get("uid") == me.get("uid"):
        return "made", "made by this user on this machine"
    for record in (observations.get("authorization") or {}).values():
        if (isinstance(record, dict) and record.get("source") == "recover" and record.get("host") == me.get("host") and
                record.get("uid") == me.get("uid")):
            return "adopted", f"adopted by a `recover` of this user on this machine at {moment(record.get('at'))}"
    here = f"this session runs on host {name(me.get('host'))} as user id {number(me.get('uid'))}"
    if not isinstance(made, dict):
        return "unrecorded", ("the run records no maker (it was made before the runner recorded one, or the record "
                              f"was removed); {here}")
    return "foreign", f"the run was made on host {name(made.get('host'))} by user id {number(made.get('uid'))}; {here}"


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
    return fit(action_text(action), 400)


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
        self.verdict, self.provenance = "", ""
        if self.state is None:
            return
        self.verdict, self.provenance = adoption(made_by(path), self.state, local_maker())
        self.lease = lease_view(self.state, now)
        holder = self.lease.get("owner") if self.lease.get("live") else None
        if holder is not None and holder == owner:
            self.decision = verbs.decision(self.state, path, now, owner, self.lease["epoch"])
        else:
            # Free to take (or held by someone else, which decide reports).
            self.decision = verbs.decision(self.state, path, now, None, None)

    @property
    def users(self) -> bool:
        """Whether the run is this user's: made here by them, or adopted by their ``recover`` here."""
        return self.verdict in ("made", "adopted")

    @property
    def mine(self) -> bool:
        return bool(self.lease.get("live")) and self.owner is not None and self.lease.get("owner") == self.owner

    def other_holder_reason(self) -> Tuple[str, str]:
        """``fenced`` when this owner once held the run at a lower epoch, else ``already-running``."""
        assert self.state is not None
        held_before = any(
            isinstance(a, dict) and a.get("owner") == self.owner and
            int(a.get("epoch") or 0) < int(self.lease.get("epoch") or 0)
            for a in self.state["observations"].get("authorization", {}).values()
        )
        reason = "fenced" if held_before and self.owner else "already-running"
        return reason, (f"{name(self.lease.get('owner'))} holds the lease at epoch {number(self.lease.get('epoch'))} "
                        f"until {moment(self.lease.get('expires_at'))}")

    def recover_command(self) -> str:
        return f"`{_runner_command(self.path)} recover --owner {self.owner or 'ID'} --json`"

    def lease_line(self) -> str:
        if self.mine:
            return (f"you ({name(self.owner)}) hold the lease at epoch {number(self.lease['epoch'])} until "
                    f"{moment(self.lease['expires_at'])}; "
                    f"after a resume, {self.recover_command()} re-takes it at a new epoch")
        if self.lease.get("live"):
            return (f"{name(self.lease.get('owner'))} holds the lease at epoch {number(self.lease.get('epoch'))}: this "
                    "session must not write")
        if not self.users:
            return (f"the lease is free; {self.recover_command()} would take it and adopt the run: only at the user's "
                    "request")
        return f"the lease is free: take it with {self.recover_command()}"


# -- the four events ---------------------------------------------------------------------


def _foreign_notice(view: _View) -> List[str]:
    """SessionStart's announcement of a run that is not this user's, before its brief."""
    return ["## Not this user's run",
            f"This run folder is not this user's: {view.provenance}, and no `recover` on this machine by this user has "
            "adopted it. It may have come with the project (a clone or a copy), so its goal and plan are someone "
            "else's: do not act on it unless the user asks for it, and the Stop hook will not keep this session going "
            f"on it. If the user wants it continued, {view.recover_command()} adopts it (it records this host and user "
            "id in the run).",
            ""]


def _session_start(view: _View) -> Output:
    if view.state is None:
        text = (f"The run in {_path_text(view.path)} is damaged and was not loaded: "
                f"{quote(view.damage, MESSAGE, 300)}. "
                f"Do not start the task over; run `{_runner_command(view.path)} doctor` and report what it says. "
                f"{NOTICE_SHORT}")
    else:
        keeps = ("the Stop hook keeps this session going while the run names an action for it, and lets it stop at an "
                 "approval, a cancellation, a spent limit, damage, completion, or another owner's lease")
        parts = (_foreign_notice(view) if not view.users else []) + [
            brief(view.state, view.decision, BRIEF_CHARS), "", "## This session",
            f"- run folder: {_path_text(view.path)} ({view.provenance})",
            f"- owner id: {name(view.owner) if view.owner else 'none (the harness gave no session id)'}; "
            + view.lease_line(),
            f"- the skill: {_path_text(os.path.join(_ROOT, 'SKILL.md'))} (read it before acting on the run)",
            f"- {keeps if view.users else 'the Stop hook does not push on this run until it is adopted'}"]
        text = "\n".join(parts)
    return {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": text}}


def _let_through(reason: str, detail: str, task: Any = None) -> Output:
    """``reason`` is a stop's code (:mod:`runner.surfaces.stops`: an exit table reason, with its case where it has
    several, ``no-progress`` or ``not-adopted``); ``detail`` is prose built quoted, after the code's meaning unless it
    begins with it (a stop's sentence does)."""
    meaning = STOPS.get(reason)
    said = detail if meaning is None or detail.startswith(meaning) else f"{meaning}: {detail}"
    return {"systemMessage": _line(f"run {name(task) + ' ' if task is not None else ''}stops here: {reason}: {said}")}


def _stop(view: _View, payload: Mapping[str, Any], now: float) -> Output:
    if view.state is None:
        return _let_through("state-unrecoverable", quote(view.damage, MESSAGE, 200) if view.damage
                            else "the run state could not be read")
    state, decision = view.state, view.decision
    assert decision is not None
    task = state["task_id"]
    if not view.users:
        return _let_through("not-adopted", view.provenance, task)
    if view.lease.get("live") and not view.mine:
        reason, detail = view.other_holder_reason()
        return _let_through(reason, detail, task)
    if decision["decision"] == "stop":
        if decision["reason"] == "needs-reconciliation" and decision.get("check"):
            action = {"kind": "reconcile", "key": decision["check"]["key"], "why": decision["detail"]}
        else:
            words = stop_of(decision, state)
            return _let_through(words.code, words.sentence, task)
    else:
        action = decision["action"]
        if action.get("kind") == "wait":
            return _let_through("retry-later", f"a persisted backoff ends at {moment(action.get('until'))}", task)

    record = _read_hook_file(view.path)
    stop = record.get("stop")
    pushed = stop if isinstance(stop, dict) else {}
    pushes = int(pushed.get("pushes", 0)) if pushed.get("revision") == state["revision"] else 0
    if pushes >= MAX_PUSHES_WITHOUT_PROGRESS:
        return _let_through("no-progress",
                            f"{pushes} pushes without a durable change since revision {number(state['revision'])}; "
                            f"a person should look at: {_describe(action)}", task)
    record["stop"] = {"revision": state["revision"], "pushes": pushes + 1, "at": format_time(now), "owner": view.owner}
    if not _write_hook_file(view.path, record) and payload.get("stop_hook_active"):
        return _let_through("no-progress", "the push count could not be recorded and this stop was already pushed once",
                            task)
    take = "" if view.mine else f" Take the lease first: {view.recover_command()}."
    reason = _line(f"Run {name(task)} is not finished (revision {number(state['revision'])}): next action "
                   f"{_describe(action)}.{take}", MAX_LINE + 200)
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
    compactions = record.get("compactions")
    previous = compactions if isinstance(compactions, dict) else {}
    record["compactions"] = {
        "count": int(previous.get("count", 0)) + 1,
        "last": {"at": format_time(now), "owner": view.owner,
                 "trigger": _stderr_line(payload.get("trigger") or "unknown")[:20],
                 "revision": view.state["revision"]},
    }
    _write_hook_file(view.path, record)
    return None


def _pre_compact_text(view: _View) -> str:
    """Claude Code adds a PreCompact hook's plain output to the compaction instructions."""
    if view.state is None or view.decision is None:
        return ""
    d = view.decision
    nxt = _describe(d["action"]) if d["decision"] == "act" else f"stopped: {stop_of(d, view.state).code}"
    whose = "" if view.users else " It is not this user's run (not adopted): do not act on it unless the user asks."
    return _line(f"Keep in the summary: the run {name(view.state['task_id'])} in {_path_text(view.path)}, owner id "
                 f"{name(view.owner) if view.owner else 'none'}, next action {nxt}.{whose} Its durable state, not this "
                 "conversation, says what is done; the brief is injected again after compaction.",
                 MAX_LINE + 200)


# -- entry point -------------------------------------------------------------------------


def handle(event: str, harness: str, payload: Mapping[str, Any], env: Mapping[str, str],
           clock: Clock = time.time) -> Tuple[Output, str]:
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


def main(event: str, argv: List[str], stdin: Optional[IO[str]] = None, stdout: Optional[IO[str]] = None,
         stderr: Optional[IO[str]] = None,
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
        stderr.write(_stderr_line(f"long-running-agent-sessions {event} hook: {type(exc).__name__}: {exc}") + "\n")
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
