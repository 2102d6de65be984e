"""Re-attachable long jobs: submit, status, result, cancel, and a shard cursor.

A job is a detached process started under a stable key. Its facts are
recorded durably so that a new runner, after the one that submitted it died,
re-attaches instead of starting a second copy:

1. ``submit`` first commits the intent (key, command, attempt, and the folder
   where the pid, exit code and log will land), then starts a small wrapper
   process in its own session, then commits the wrapper's pid and start time.
   The wrapper writes its pid file before anything else, and its exit file
   (atomically) after the command ends, so a crash between any two of those
   steps leaves files a new runner can read.
2. ``status`` observes: a live process whose start time matches the
   recorded one means running (a recycled pid does not match); else an exit
   file written by this attempt's wrapper means finished; else vanished.
   Each observed change is committed.
3. A vanished job is run again only when the contract says
   ``"jobs": {"rerun_vanished": true}``; a rerun gets the committed shard
   cursor in ``RUNNER_JOB_CURSOR`` so it continues after the last committed shard.
4. ``cancel`` records "cancel requested" and signals the job's process group;
   "stopped" is a separate fact, recorded only when a later observation sees
   the process gone, and only then is the job's slot released.

Job folders are named by a digest of the key, never by the key itself.

The job's files are read as untrusted input (the job itself can write into
its folder): only regular files, opened without following a symbolic link
and without blocking, at most :data:`MAX_JOB_FILE_BYTES`, of a known schema,
and bound to the attempt: each names the wrapper's pid and start time and a
nonce committed with the intent before the wrapper started. A file that fails
any of this is reported as ``damage`` in the observation and not believed.
The nonce tells this attempt's files from stale or hand-made ones; it is not
a secret from the job, which runs as the same user as the runner.
"""

import gc
import os
import signal
import stat
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..ledger.envelope import Ops
from ..base.values import validate_id
from ..base.times import format_time, parse_time
from ..base.canonical import canonical_json, loads_strict, sha256_hex, sha256_stream
from ..base.errors import InvalidInput, NeedsReconciliation
from ..base.fs import OsFileSystem, replace_durably

# subprocess is imported where a job is started: every verb imports this module (recovery reads the jobs) and most
# start none, so it would only lengthen each start.

__all__ = [
    "UNSETTLED", "job_dir", "submit_intent_ops", "started_ops", "observe_job", "observation_ops", "cancel_ops",
    "shard_ops",
    "spawn", "signal_job", "read_result", "wrap_main",
]

JOBS = "jobs"
MAX_COMMAND_ARGS = 256

#: Job states an observation can still change: the job's process may exist, or its files may yet tell how it ended.
UNSETTLED = ("submitting", "running", "cancel-requested", "vanished")

#: Largest ``pid.json`` or ``exit.json`` read; the wrapper writes about 150 bytes.
MAX_JOB_FILE_BYTES = 4096

_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_CHUNK = 1 << 20


def job_dir(run_path: str, key: str, attempt: int) -> str:
    return os.path.join(run_path, JOBS, "j" + sha256_hex(key.encode("utf-8"))[:20], f"a{attempt}")


def _proc_stat(pid: int) -> Tuple[Optional[bytes], Optional[str]]:
    """The process's state letter and start time in clock ticks since boot (Linux); Nones where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return fields[0], fields[19].decode()
    except (OSError, IndexError):
        return None, None


def _proc_start(pid: int) -> Optional[str]:
    """The start time of a live process (not a zombie), or None where unknown."""
    state, start = _proc_stat(pid)
    return None if state == b"Z" else start


def _alive(pid: int, start: Optional[str]) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # reap our own child, if it is one
        if done == pid:
            return False
    except ChildProcessError:
        pass
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if os.path.isdir("/proc"):
        current = _proc_start(pid)
        return current is not None and (start is None or current == start)
    return True


def submit_intent_ops(
    state: Dict[str, Any], run_path: str, key: str, command: Sequence[str], now: float, nonce: Optional[str] = None
) -> Tuple[str, Ops]:
    """Decide what ``submit`` does: ``("existing", [])``, or ``("start", ops)`` committing the intent.

    :param nonce: the attempt's identity its wrapper writes into its files (default: 128 random bits).
    """
    validate_id(key, "job key")
    if not command or len(command) > MAX_COMMAND_ARGS or not all(isinstance(a, str) and "\0" not in a for a in command):
        raise InvalidInput("a job needs a command: job submit KEY -- COMMAND [ARGS...]")
    job = state["jobs"].get(key)
    if job is not None:
        if list(job["command"]) != list(command):
            raise InvalidInput(f"job {key!r} was submitted with another command; refusing to reuse its key")
        if job["state"] in ("submitting", "running", "finished"):
            return "existing", []
        from ..contract.spec import contract_of  # here: the job's launcher and wrapper, this module run, never load it

        if job["state"] == "vanished" and not contract_of(state).jobs.rerun_vanished:
            raise NeedsReconciliation(
                f"job {key!r} vanished without an exit code and the contract does not allow a rerun; check what it "
                "left behind", key=key)
        if job["state"] in ("cancel-requested", "stopped"):
            raise InvalidInput(f"job {key!r} was cancelled")
    attempt = (job["attempt"] + 1) if job else 1
    folder = job_dir(run_path, key, attempt)
    record = {
        "state": "submitting",
        "command": list(command),
        "attempt": attempt,
        "dir": os.path.relpath(folder, run_path),
        "submitted_at": format_time(now),
        "pid": None,
        "pid_start": None,
        "exit_code": None,
        "finished_at": None,
        "log_sha256": None,
        "cursor": job.get("cursor", 0) if job else 0,
        "cancel_requested_at": None,
        "stopped_at": None,
        "nonce": nonce or os.urandom(16).hex(),
    }
    return "start", [["set", ["jobs", key], record]]


def spawn(run_path: str, key: str, job: Dict[str, Any]) -> Tuple[int, Optional[str]]:
    """Start the wrapper, detached in its own session; return its pid and start time.

    A short-lived launcher starts the wrapper and exits, so the wrapper is
    nobody's child: a long-lived submitter leaves no zombie behind, and the
    job outlives whoever submitted it.
    """
    import subprocess

    from ..base.paths import PACKAGE_PARENT

    folder = os.path.join(run_path, job["dir"])
    os.makedirs(folder, mode=0o700, exist_ok=True)
    env = dict(os.environ, RUNNER_JOB_KEY=key, RUNNER_JOB_CURSOR=str(job.get("cursor", 0)))
    env["PYTHONPATH"] = PACKAGE_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    launcher = subprocess.run(
        # -S: the launcher and the wrapper import only this package (standard library only, found through PYTHONPATH),
        # and site's start-up can cost more than all the rest of theirs.
        [sys.executable, "-S", "-m", "runner.execution.jobs", "--launch", folder, job.get("nonce") or "", "--"]
        + list(job["command"]),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        env=env,
        timeout=60,
    )
    words = launcher.stdout.split()
    try:
        pid = int(words[0])
    except (IndexError, ValueError):
        raise OSError(f"the job launcher failed (exit {launcher.returncode})") from None
    start = words[1].decode() if len(words) > 1 and words[1] != b"-" else None
    return pid, start


def launch_main(argv: Sequence[str]) -> int:
    """The launcher: start the wrapper in a new session, print its pid and start time, exit at once.

    The start time is read here, by the wrapper's parent, because only until
    the parent exits is it certain to be readable: a job that ends at once
    leaves a zombie that keeps its start time, where a later reader would
    find the pid gone (and the wrapper's files would then look foreign).
    """
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", "runner.execution.jobs"] + list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    sys.stdout.write(f"{proc.pid} {_proc_stat(proc.pid)[1] or '-'}\n")
    sys.stdout.flush()
    proc.returncode = 0  # not waited for on purpose: the wrapper outlives the launcher
    return 0


def started_ops(key: str, pid: int, start: Optional[str]) -> Ops:
    return [["set", ["jobs", key, "state"], "running"], ["set", ["jobs", key, "pid"], pid],
            ["set", ["jobs", key, "pid_start"], start]]


def _open_regular(path: str) -> Optional[int]:
    """A descriptor of the regular file at ``path``, or None if there is none.

    :raises ValueError: something else is there (a link, a FIFO, a folder) or it cannot be opened.
    """
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot be opened ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("is not a regular file")
    return fd


def _read_job_file(path: str) -> Optional[Dict[str, Any]]:
    """The JSON object in the job file at ``path``, or None if there is none.

    :raises ValueError: the file is not a regular file, too large, or not a JSON object.
    """
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        data = os.read(fd, MAX_JOB_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_JOB_FILE_BYTES:
        raise ValueError(f"is larger than {MAX_JOB_FILE_BYTES} bytes")
    try:
        value = loads_strict(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"is not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(value, dict):
        raise ValueError("is not a JSON object")
    return value


def _belongs(job: Dict[str, Any], record: Dict[str, Any], pid: Any, start: Any) -> bool:
    """True when a wrapper's file names this attempt: its nonce, and the wrapper's pid and start time.

    A record from before nonces existed has none to compare, and its files carry no identity either.
    """
    if job.get("nonce") is None:
        return True
    return record.get("nonce") == job["nonce"] and record.get("pid") == pid and record.get("start") == start


def _started(folder: str, job: Dict[str, Any]) -> Tuple[Any, Any]:
    """The wrapper's pid and start time: as committed, else from its ``pid.json``.

    :raises ValueError: the ``pid.json`` found is damaged or not this attempt's.
    """
    if job.get("pid") is not None:
        return job["pid"], job.get("pid_start")
    started = _read_job_file(os.path.join(folder, "pid.json"))
    if started is None:
        return None, None
    pid = started.get("pid")
    if (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0 or
        not _belongs(job, started, pid, started.get("start"))):
        raise ValueError("does not name this attempt's wrapper")
    return pid, started.get("start")


def _exit_record(folder: str, job: Dict[str, Any], pid: Any, start: Any) -> Optional[Dict[str, Any]]:
    """The exit code and end time this attempt's wrapper wrote, or None if it wrote none.

    :raises ValueError: the ``exit.json`` found is damaged or not this attempt's.
    """
    done = _read_job_file(os.path.join(folder, "exit.json"))
    if done is None:
        return None
    code, finished = done.get("exit_code"), done.get("finished_at")
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
        raise ValueError("has no exit code from 0 to 255")
    try:
        parse_time(finished)
    except ValueError:
        raise ValueError("has no valid finished_at time") from None
    if not _belongs(job, done, pid, start):
        raise ValueError("does not belong to this attempt's wrapper (its pid, start time or nonce differ)")
    return {"exit_code": code, "finished_at": finished}


def _log_digest(path: str) -> Optional[str]:
    """SHA-256 of the job's log, read in chunks (a log may be far larger than memory); None if there is none."""
    try:
        fd = _open_regular(path)
    except ValueError:
        return None
    if fd is None:
        return None
    digest = sha256_stream()
    with os.fdopen(fd, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def observe_job(run_path: str, job: Dict[str, Any]) -> Dict[str, Any]:
    """What the job's files and the process table say now: ``running``, ``finished`` or ``vanished``.

    ``finished`` needs both that this attempt's wrapper is gone and that it left
    an exit file bound to it; a file that fails the checks adds ``damage``
    (what is wrong with which file) and is not believed. The process table is
    read before the exit file: the wrapper writes that file before it ends, so
    a wrapper seen gone has left it, while a file read first could be missing
    only because the wrapper wrote it a moment later (a finished job taken
    for a vanished one, and run again where the contract allows reruns).
    """
    folder = os.path.join(run_path, job["dir"])
    damage: List[str] = []
    try:
        pid, start = _started(folder, job)
    except ValueError as exc:
        pid, start = None, None
        damage.append(f"pid.json {exc}")
    alive = pid is not None and _alive(int(pid), start)
    try:
        done = _exit_record(folder, job, pid, start)
    except ValueError as exc:
        done = None
        damage.append(f"exit.json {exc}")
    seen: Dict[str, Any]
    if alive:
        seen = {"status": "running", "pid": pid, "pid_start": start}
    elif done is not None:
        digest = job.get("log_sha256") or _log_digest(os.path.join(folder, "log"))
        seen = {"status": "finished", "exit_code": done["exit_code"], "finished_at": done["finished_at"],
                "log_sha256": digest}
    else:
        seen = {"status": "vanished", "pid": pid}
    if damage:
        seen["damage"] = "; ".join(damage)
    return seen


def observation_ops(state: Dict[str, Any], key: str, seen: Dict[str, Any], now: float) -> Ops:
    """Commit what an observation established, if it changes the record.

    A settled job (finished or stopped) is never changed: an observation
    after the fact (a ``job status`` of a stopped job, whose process is gone)
    must not turn it into a vanished one.
    """
    job = state["jobs"][key]
    if job["state"] not in UNSETTLED:
        return []
    ops: Ops = []
    status = seen["status"]
    if status == "running" and job["state"] == "submitting":
        ops += started_ops(key, seen["pid"], seen.get("pid_start"))
    elif status in ("finished", "vanished"):
        stopped = job["state"] == "cancel-requested"
        target = "stopped" if stopped else status
        if job["state"] not in (target, "finished"):
            ops.append(["set", ["jobs", key, "state"], target])
            if stopped:
                ops.append(["set", ["jobs", key, "stopped_at"], format_time(now)])
            if status == "vanished" and not stopped:
                ops.append(["set", ["counters", "jobs_orphaned"], int(state["counters"].get("jobs_orphaned", 0)) + 1])
        if status == "finished" and job.get("exit_code") is None:
            ops += [
                ["set", ["jobs", key, "exit_code"], seen["exit_code"]],
                ["set", ["jobs", key, "finished_at"], seen.get("finished_at") or format_time(now)],
                ["set", ["jobs", key, "log_sha256"], seen.get("log_sha256")],
                ["set", ["counters", "last_progress_at"], format_time(now)],
            ]
    return ops


def cancel_ops(state: Dict[str, Any], key: str, now: float) -> Ops:
    job = state["jobs"].get(key)
    if job is None:
        raise InvalidInput(f"no job {key!r}")
    if job["state"] in ("finished", "vanished", "stopped", "cancel-requested"):
        return []
    return [["set", ["jobs", key, "state"], "cancel-requested"],
            ["set", ["jobs", key, "cancel_requested_at"], format_time(now)]]


def signal_job(job: Dict[str, Any]) -> bool:
    """Ask the job's process group to stop; True if a signal was delivered."""
    pid = job.get("pid")
    if pid is None or not _alive(int(pid), job.get("pid_start")):
        return False
    try:
        os.killpg(int(pid), signal.SIGTERM)
        return True
    except OSError:
        return False


def shard_ops(state: Dict[str, Any], key: str, shard: int) -> Ops:
    """Advance the job's committed-shard cursor; it never moves back."""
    job = state["jobs"].get(key)
    if job is None:
        raise InvalidInput(f"no job {key!r}")
    if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
        raise InvalidInput("a shard cursor is a non-negative whole number")
    if shard <= int(job.get("cursor", 0)):
        return []
    return [["set", ["jobs", key, "cursor"], shard]]


def read_result(run_path: str, job: Dict[str, Any], tail_bytes: int = 4000) -> Dict[str, Any]:
    """The job's exit code, its log's path and digest, and the last ``tail_bytes`` of the log.

    The log is streamed for the digest and only its tail is held, so memory
    stays bounded however much the job wrote.
    """
    log = os.path.join(run_path, job["dir"], "log")
    digest, tail = sha256_stream(), b""
    try:
        fd = _open_regular(log)
    except ValueError:
        fd = None
    if fd is not None:
        with os.fdopen(fd, "rb") as handle:
            for chunk in iter(lambda: handle.read(_CHUNK), b""):
                digest.update(chunk)
                tail = (tail + chunk)[-tail_bytes:]
            size = handle.tell()
    else:
        size = 0
    return {"exit_code": job.get("exit_code"), "log": log, "log_sha256": digest.hexdigest() if size else None,
            "log_tail": tail.decode("utf-8", "replace")}


def wrap_main(argv: Sequence[str]) -> int:
    """The wrapper: record pid, run the command with its output in ``log``, record the exit code.

    ``argv`` is ``FOLDER NONCE -- COMMAND...``; both files the wrapper writes
    carry its pid, start time and the nonce, which bind them to this attempt.
    """
    import subprocess

    folder, nonce, command = argv[0], argv[1], list(argv[3:])
    os.umask(0o077)  # the log and exit files live in the run folder: owner-only, like the rest
    identity = {"pid": os.getpid(), "start": _proc_start(os.getpid()), "nonce": nonce}
    replace_durably(OsFileSystem(), os.path.join(folder, "pid.json"), canonical_json(identity) + b"\n")
    with open(os.path.join(folder, "log"), "ab") as log:
        try:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        except OSError as exc:
            log.write(f"cannot start {command[0]!r}: {exc}\n".encode())
            code = 127
        else:
            def forward(signum: int, _frame: Any) -> None:
                proc.send_signal(signum)

            signal.signal(signal.SIGTERM, forward)
            code = proc.wait()
            code = code if code >= 0 else 128 - code
    ended = dict(identity, exit_code=code, finished_at=format_time(time.time()))
    replace_durably(OsFileSystem(), os.path.join(folder, "exit.json"), canonical_json(ended) + b"\n")
    return 0


if __name__ == "__main__":
    code = launch_main(sys.argv[2:]) if sys.argv[1:2] == ["--launch"] else wrap_main(sys.argv[1:])
    gc.freeze()  # as the command line does (runner/__main__.py): no last walk of every object on the way out
    sys.exit(code)
