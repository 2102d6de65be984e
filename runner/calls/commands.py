"""Commands a contract declares: argument lists with placeholders, run without a shell.

A contract names the command that performs an effect, the one that observes
it, the checks of a step and the command that makes a payload, each as a
list of arguments such as ``["python3", "tools/file.py", "{key}",
"{payload_file}"]``. :func:`~runner.contract.templates.expand` replaces each ``{name}`` that names a
known placeholder inside one argument and nothing else, so a value (an item
named ``a "$(rm -rf ~)"\\nb``) always reaches the program as part of exactly
one argument: no shell ever reads it. :func:`run_command` runs the result
with a timeout and bounded output; a timeout is reported as such, never as a
failure of the command.

:class:`runner.adapters.commands.CommandAdapter` makes an effect adapter of a contract's
invoke and observe commands; what each of their exit codes means is :data:`INVOKE_EXITS` and
:data:`OBSERVE_EXITS`, which the command line shows too.
"""

import contextlib
import os
import signal
import time
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..base.canonical import loads_strict, sha256_hex
from ..base.errors import InvalidInput
from ..contract.effects import DEFAULT_CALL_TIMEOUT

# subprocess, selectors, shutil, tempfile and runner.calls.inflight are imported where a command runs: every verb
# imports this module (for its placeholders and exit tables) and most run no command, so they would only lengthen
# each start.
if TYPE_CHECKING:
    import subprocess

    from . import inflight

__all__ = [
    "Outcome",
    "run_command",
    "left_answer",
    "OUTPUT_LIMIT",
    "INVOKE_EXITS",
    "OBSERVE_EXITS",
]

#: Bytes of stdout (and of stderr) kept from one command; the rest is read and discarded.
OUTPUT_LIMIT = 256 * 1024

#: Invoke exit codes other than 0 (done: the JSON object on stdout is the receipt) and the rest (unknown).
EXIT_REFUSED = 2        # the target refused the call for good
EXIT_STALE_EPOCH = 9    # the target refused the writer's fencing epoch
EXIT_TEMPFAIL = 75      # EX_TEMPFAIL: the target created nothing for now (429, a 503 naming a delay);
                        # {"retry_after": S} optional

#: The longest delay an exit-75 answer may ask for (a day); a longer one is ignored for the contract's backoff.
MAX_RETRY_AFTER = 86400.0

#: What each invoke exit code means, for ``effect run --help`` and the references.
INVOKE_EXITS = (
    ("0", "done: the JSON object on stdout is the receipt"),
    (str(EXIT_REFUSED), "refused for good: never retried"),
    (str(EXIT_STALE_EPOCH), "the target refused a stale fencing epoch: stop, fenced"),
    (str(EXIT_TEMPFAIL), 'created nothing for now (429, a 503 naming a delay): retried after {"retry_after": S} on '
                         'stdout, or the backoff'),
    ("other", "unknown (also a timeout, or exit 0 without a JSON object): observed, never retried blindly"),
)
OBSERVE_EXITS = (("0", "present: the JSON object on stdout is the evidence"), ("1", "absent"),
                 ("other", "unknown (also a timeout)"))

class Outcome(NamedTuple):
    """What one command did: its exit code (None on a timeout), bounded output and digests."""

    argv: List[str]
    exit_code: Optional[int]
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_sha256: str
    stderr_sha256: str
    seconds: float

    def json_object(self) -> Optional[Dict[str, Any]]:
        """stdout as a JSON object, or None when it is not one."""
        try:
            value = loads_strict(self.stdout.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return None
        return value if isinstance(value, dict) else None

    def record(self) -> Dict[str, Any]:
        """The evidence form: exit code, output digests and sizes, time taken."""
        return {
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "stdout_sha256": self.stdout_sha256,
            "stderr_sha256": self.stderr_sha256,
            "stdout_bytes": len(self.stdout),
            "seconds": round(self.seconds, 3),
        }

    def tail(self, limit: int = 300) -> str:
        text = (self.stderr or self.stdout).decode("utf-8", "replace").strip()
        return text[-limit:].replace("\n", " | ")


def run_command(argv: Sequence[str], *, cwd: Optional[str] = None, timeout: float = DEFAULT_CALL_TIMEOUT,
                env: Optional[Mapping[str, str]] = None, limit: int = OUTPUT_LIMIT) -> Outcome:
    """Run ``argv`` (never parsed by a shell) in ``cwd``; stop it after ``timeout`` seconds.

    The command gets no stdin and a process group of its own. Of its stdout
    and stderr, the first ``limit`` bytes each are kept. When the command
    exits, whatever it left running in its group is killed, so that a call
    that returned has nothing of it still on its way. On a timeout the whole
    group is killed and ``exit_code`` is None: the caller must treat that as
    an unknown outcome. Inside :func:`runner.calls.inflight.calling`, the
    process is registered as the call in flight before the command starts:
    it waits at a gate (``/bin/sh`` reading one line, then the command)
    until the registration is written, so a runner killed in between leaves
    nothing that can send. Its environment carries the call's token.

    Where its output goes: outside a call, and for a lookup, into pipes this
    process reads, the rest read and discarded as it arrives. For an invoke
    call, into the call's answer files beside its record
    (:meth:`runner.calls.inflight.Registry.answer_files`), and the shell at the
    gate, in the command's process group, writes its exit status there when it
    ends, with the call's token and its own pid: so the answer outlives this
    process, and whoever takes over from it reads it (:func:`left_answer`).
    This process waits for that shell and reads the files as it would have
    read the pipes.

    :raises InvalidInput: the program cannot be started (the contract names something that is not there).
    """
    import subprocess

    from . import inflight

    argv = [str(a) for a in argv]
    if not argv:
        raise InvalidInput("a command must name a program")
    making = inflight.current()
    child_env = dict(os.environ if env is None else env)
    started = argv
    files: Optional[inflight.AnswerFiles] = None
    if making is not None:
        child_env[inflight.TOKEN_VARIABLE] = making[1].record["token"]
        _check_runnable(argv[0], cwd, child_env.get("PATH", os.defpath))
        if making[1].record.get("kind") == "invoke":
            files = making[0].answer_files(making[1])
            for path in files:  # an earlier command of the same call (a git release) left its own
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            started = [GATE_SHELL, "-c", _KEEP, "runner-gate", *files] + argv
        else:
            started = [GATE_SHELL, "-c", _GATE, "runner-gate"] + argv
    into = subprocess.DEVNULL if files is not None else subprocess.PIPE
    began = time.monotonic()
    try:
        proc = subprocess.Popen(started, cwd=cwd, stdin=subprocess.DEVNULL if making is None else subprocess.PIPE,
                                stdout=into, stderr=into, env=child_env, start_new_session=True)
    except OSError as exc:
        raise InvalidInput(f"cannot run {started[0]!r}: {exc.strerror or exc}") from None
    try:
        if making is not None:
            making[0].spawned(making[1], proc.pid)
            _open_gate(proc)
        if files is None:
            kept, timed_out = _collect(proc, began + timeout, limit)
        else:
            timed_out = _wait_exit(proc, began + timeout)
    finally:
        _end_group(proc)
    code: Optional[int] = None if timed_out else proc.returncode
    if files is not None and making is not None:
        read = [making[0].read_kept(path, limit) or b"" for path in files[:2]]
        kept = [bytearray(read[0]), bytearray(read[1])]
        if not timed_out:
            status = making[0].read_kept(files.status, _STATUS_BYTES)
            code = _exit_status(status, making[1].record["token"], proc.pid)
    stdout, stderr = bytes(kept[0]), bytes(kept[1])
    return Outcome(argv, code, timed_out, stdout, stderr, sha256_hex(stdout), sha256_hex(stderr),
                   time.monotonic() - began)


def left_answer(registry: "inflight.Registry", call: "inflight.Registered",
                limit: int = OUTPUT_LIMIT) -> Optional[Outcome]:
    """What the invoke command of ``call``, a call whose caller died, answered: its exit status and output, as
    :func:`run_command` would have returned them to that caller; None unless they are all there and its own.

    Believed only from a record the registry believes (:meth:`runner.calls.inflight.Registry.calls`) of an invoke
    whose command was started (its ``child``), once no process of the call runs, and only from an exit status
    written whole, holding the call's token and the pid of the shell that ran its command. Anything else (no
    status: the shell was killed too; a status of another call or another command) says nothing: the outcome is
    unknown, as it was before.
    """
    child = call.record.get("child")
    if call.record.get("kind") != "invoke" or not child:
        return None
    files = registry.answer_files(call)
    code = _exit_status(registry.read_kept(files.status, _STATUS_BYTES), call.record["token"], int(child[0]))
    if code is None:
        return None
    stdout, stderr = (registry.read_kept(path, limit) for path in files[:2])
    if stdout is None or stderr is None:
        return None
    return Outcome([], code, False, stdout, stderr, sha256_hex(stdout), sha256_hex(stderr), 0.0)


def _exit_status(data: Optional[bytes], token: str, pid: int) -> Optional[int]:
    """The exit code a status file holds, if it is whole (one line) and names ``token`` and ``pid``; else None."""
    if not data or not data.endswith(b"\n"):
        return None
    fields = data[:-1].split(b" ")
    if len(fields) != 4 or fields[0] != _STATUS_WORD or fields[1] != token.encode() or fields[2] != str(pid).encode():
        return None
    return int(fields[3]) if fields[3].isdigit() and len(fields[3]) <= 3 else None


def _wait_exit(proc: "subprocess.Popen[bytes]", deadline: float) -> bool:
    """Wait until ``proc`` exits or ``deadline`` passes; return whether it passed."""
    import select

    try:
        # Where the system can (Linux), its exit wakes the wait itself; elsewhere it is polled.
        exited: Optional[int] = os.pidfd_open(proc.pid) if hasattr(os, "pidfd_open") else None
    except OSError:
        exited = None
    try:
        while proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            if exited is not None:
                select.select([exited], [], [], left)
            else:
                time.sleep(min(left, 0.02))
    finally:
        if exited is not None:
            os.close(exited)
    return False


#: The shell that holds a call's command at its gate.
GATE_SHELL = "/bin/sh"
# A call's command waits here until its runner has registered its process: a runner killed in between
# closes the pipe, the read meets its end, and the command never starts. No machine needs to be
# searched for a command that cannot have sent anything.
_GATE = 'IFS= read -r go && [ "$go" = go ] || exit 125; exec "$@" </dev/null'
# The same gate for an invoke, whose answer must outlive its runner: the shell stays, in the command's group,
# sends its output to the call's answer files ($1, $2) and, once it exits, writes its status ($3) in one line
# naming the call (its token) and itself (its pid).
_KEEP = ('IFS= read -r go && [ "$go" = go ] || exit 125; o=$1 e=$2 s=$3; shift 3; '
         '"$@" </dev/null >"$o" 2>"$e"; c=$?; '
         'printf "runner-exit %s %s %s\\n" "$RUNNER_CALL" "$$" "$c" >"$s"; exit "$c"')
_STATUS_WORD = b"runner-exit"
#: The most bytes a status file is read for (one line of about 60).
_STATUS_BYTES = 256


def _check_runnable(program: str, cwd: Optional[str], path: str) -> None:
    """Refuse a program that cannot be started, as starting it directly would (the gate starts it later)."""
    import shutil

    if os.sep in program:
        found = os.path.join(cwd or ".", program)
        if not (os.path.isfile(found) and os.access(found, os.X_OK)):
            raise InvalidInput(f"cannot run {program!r}: "
                               f"{'Permission denied' if os.path.exists(found) else 'No such file or directory'}")
    elif shutil.which(program, path=path) is None:
        raise InvalidInput(f"cannot run {program!r}: No such file or directory")


def _open_gate(proc: "subprocess.Popen[bytes]") -> None:
    """Let the registered command start."""
    try:
        proc.stdin.write(b"go\n")  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
    except OSError:
        pass  # it is already gone: its exit code says so


def _collect(proc: "subprocess.Popen[bytes]", deadline: float, limit: int) -> Tuple[List[bytearray], bool]:
    """Read both pipes until the command exits (or ``deadline``), keeping ``limit`` bytes of each."""
    import selectors
    import subprocess

    kept = [bytearray(), bytearray()]
    streams = {proc.stdout: 0, proc.stderr: 1}
    # Where the system can (Linux), the command's exit wakes the loop itself; elsewhere it is polled.
    exited = os.pidfd_open(proc.pid) if hasattr(os, "pidfd_open") else None
    try:
        with selectors.DefaultSelector() as selector:
            for stream in streams:
                selector.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
            if exited is not None:
                selector.register(exited, selectors.EVENT_READ)
            while len(selector.get_map()) > (exited is not None):
                left = deadline - time.monotonic()
                if left <= 0:
                    return kept, True
                for handle, _ in selector.select(min(left, 0.5 if exited is not None else 0.02)):
                    if handle.fileobj is exited:
                        continue
                    data = os.read(handle.fd, 65536)
                    if not data:
                        selector.unregister(handle.fileobj)
                        continue
                    into = kept[streams[handle.fileobj]]  # type: ignore[index]
                    if len(into) < limit:
                        into += data[: limit - len(into)]
                if proc.poll() is not None and not any(key.fileobj is not exited for key, _ in selector.select(0)):
                    break  # the command exited and nothing is left to read: a straggler may hold a pipe open
    finally:
        if exited is not None:
            os.close(exited)
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return kept, True
    return kept, False


def _end_group(proc: "subprocess.Popen[bytes]") -> None:
    """Kill whatever is left of the command's process group, reap the leader, close the pipes."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
