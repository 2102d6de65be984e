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

:class:`CommandAdapter` turns an invoke and an observe command into a
:class:`runner.calls.target.Adapter`, whose calls the executor
(:mod:`runner.executor`) makes like any other target's:

* invoke: exit 0 with a JSON object on stdout is the receipt; 2, refused for
  good; 75 (EX_TEMPFAIL), the target created nothing for now (a 429 or
  503), optionally with ``{"retry_after": SECONDS}`` on stdout; 9, the
  target refused a stale fencing epoch; anything else, or a timeout, is an
  unknown outcome, settled by observing, never by calling again.
* observe: exit 0 with a JSON object is *present* (the object is the
  evidence), exit 1 is *observed absent*, anything else or a timeout is
  *unknown*.
* observe_many (optional): one command looks many keys up at once. Its
  argument ``{each}`` becomes one argument per key (the key's ``value``,
  e.g. ``{slug}``); exit 0 with JSON on stdout is the answer, whose list (at
  the pointer ``list``) is matched back to each key by the value each
  element holds at ``match``: a key with a match is present. One without is
  observed absent only when the answer is a JSON object holding
  ``"complete": true`` (the command vouches that its list holds every asked
  key the target has: it read every page); otherwise it is unseen, and the
  key's own observe command decides. Exit 75 is "not now"; anything else
  says nothing of any key (all unseen). Such a lookup runs in the drive's
  process, unregistered: it creates nothing, so no one need wait for it.
"""

import os
import signal
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..base.canonical import canonical_json, loads_strict, sha256_hex
from ..base.errors import InvalidInput
from ..base.pointer import MISSING, matched, parse_pointer, resolve_pointer, shown
from ..contract.effects import EACH
from ..contract.lookups import MANY_DEFAULT
from ..contract.templates import expand
from .target import NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome

# subprocess, selectors, shutil, tempfile and runner.calls.inflight are imported where a command runs: every verb
# imports this module (for its placeholders and exit tables) and most run no command, so they would only lengthen
# each start.
if TYPE_CHECKING:
    import subprocess

__all__ = [
    "Outcome",
    "run_command",
    "CommandAdapter",
    "DEFAULT_TIMEOUT",
    "OUTPUT_LIMIT",
    "INVOKE_EXITS",
    "OBSERVE_EXITS",
]

#: Seconds a command may take unless the contract says otherwise.
DEFAULT_TIMEOUT = 60.0

#: Bytes of stdout (and of stderr) kept from one command; the rest is read and discarded.
OUTPUT_LIMIT = 256 * 1024

#: Invoke exit codes other than 0 (done: the JSON object on stdout is the receipt) and the rest (unknown).
EXIT_REFUSED = 2        # the target refused the call for good
EXIT_STALE_EPOCH = 9    # the target refused the writer's fencing epoch
EXIT_TEMPFAIL = 75      # EX_TEMPFAIL: the target created nothing for now (429, a 503 naming a delay); {"retry_after": S} optional

#: The longest delay an exit-75 answer may ask for (a day); a longer one is ignored for the contract's backoff.
MAX_RETRY_AFTER = 86400.0

#: What each invoke exit code means, for ``effect run --help`` and the references.
INVOKE_EXITS = (
    ("0", "done: the JSON object on stdout is the receipt"),
    (str(EXIT_REFUSED), "refused for good: never retried"),
    (str(EXIT_STALE_EPOCH), "the target refused a stale fencing epoch: stop, fenced"),
    (str(EXIT_TEMPFAIL), 'created nothing for now (429, a 503 naming a delay): retried after {"retry_after": S} on stdout, or the backoff'),
    ("other", "unknown (also a timeout, or exit 0 without a JSON object): observed, never retried blindly"),
)
OBSERVE_EXITS = (("0", "present: the JSON object on stdout is the evidence"), ("1", "absent"), ("other", "unknown (also a timeout)"))

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


def run_command(argv: Sequence[str], *, cwd: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
                env: Optional[Mapping[str, str]] = None, limit: int = OUTPUT_LIMIT) -> Outcome:
    """Run ``argv`` (never parsed by a shell) in ``cwd``; stop it after ``timeout`` seconds.

    The command gets no stdin and a process group of its own. Of its stdout
    and stderr, the first ``limit`` bytes each are kept and the rest is read
    and discarded as it arrives: nothing of it is written anywhere. When the
    command exits, whatever it left running in its group is killed, so that a
    call that returned has nothing of it still on its way. On a timeout the
    whole group is killed and ``exit_code`` is None: the caller must treat
    that as an unknown outcome. Inside :func:`runner.calls.inflight.calling`, the
    process is registered as the call in flight before the command starts:
    it waits at a gate (``/bin/sh`` reading one line, then ``exec "$@"``)
    until the registration is written, so a runner killed in between leaves
    nothing that can send. Its environment carries the call's token.

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
    if making is not None:
        child_env[inflight.TOKEN_VARIABLE] = making[1].record["token"]
        _check_runnable(argv[0], cwd, child_env.get("PATH", os.defpath))
        started = [GATE_SHELL, "-c", _GATE, "runner-gate"] + argv
    began = time.monotonic()
    try:
        proc = subprocess.Popen(started, cwd=cwd, stdin=subprocess.DEVNULL if making is None else subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env, start_new_session=True)
    except OSError as exc:
        raise InvalidInput(f"cannot run {started[0]!r}: {exc.strerror or exc}") from None
    try:
        if making is not None:
            making[0].spawned(making[1], proc.pid)
            _open_gate(proc)
        kept, timed_out = _collect(proc, began + timeout, limit)
    finally:
        _end_group(proc)
    code: Optional[int] = None if timed_out else proc.returncode
    stdout, stderr = bytes(kept[0]), bytes(kept[1])
    return Outcome(argv, code, timed_out, stdout, stderr, sha256_hex(stdout), sha256_hex(stderr), time.monotonic() - began)


#: The shell that holds a call's command at its gate.
GATE_SHELL = "/bin/sh"
# A call's command waits here until its runner has registered its process: a runner killed in between
# closes the pipe, the read meets its end, and the command never starts. No machine needs to be
# searched for a command that cannot have sent anything.
_GATE = 'IFS= read -r go && [ "$go" = go ] || exit 125; exec "$@" </dev/null'


def _check_runnable(program: str, cwd: Optional[str], path: str) -> None:
    """Refuse a program that cannot be started, as starting it directly would (the gate starts it later)."""
    import shutil

    if os.sep in program:
        found = os.path.join(cwd or ".", program)
        if not (os.path.isfile(found) and os.access(found, os.X_OK)):
            raise InvalidInput(f"cannot run {program!r}: {'Permission denied' if os.path.exists(found) else 'No such file or directory'}")
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


class CommandAdapter:
    """An effect adapter over an invoke and an observe command (see the module docstring).

    ``values`` fills the placeholders other than ``key``, ``payload_file``
    and ``epoch`` (which each call supplies). The payload is written as
    canonical JSON to a private file for each call and removed after it:
    inside a registered call, beside the call's record in the run's folder
    (:meth:`runner.calls.inflight.Registry.payload_path`), so a killed runner's
    payloads are removed by the next; elsewhere, in a private temporary
    folder. Never deduplicates: an unknown outcome is settled by observing.
    """

    name = "contract commands"
    key_scope = "as the invoke command's target defines it"
    retention_seconds: Optional[float] = None
    conflicting_payload = "refused by the runner before the command runs (the ledger binds a key to one payload)"
    verification = "the contract's observe command"
    deduplicates = False

    def __init__(self, invoke: Sequence[str], observe: Sequence[str], *, values: Optional[Mapping[str, Any]] = None,
                 cwd: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT, runner: Optional[Callable[..., Outcome]] = None,
                 many: Optional[Mapping[str, Any]] = None) -> None:
        """``runner`` runs one argument list (default :func:`run_command`); a benchmark may pass a stand-in.
        ``many``: the contract's ``observe_many`` section, checked by :func:`~runner.contract.effects.many_problems`."""
        if not invoke or not observe:
            raise InvalidInput("an effect run needs both an invoke and an observe command")
        self.invoke_argv, self.observe_argv = list(invoke), list(observe)
        self.many = dict(many) if many else None
        self.values = dict(values or {})
        self.cwd, self.timeout = cwd, float(timeout)
        self.runner = runner or run_command

    def _call(self, argv: Sequence[str], key: str, payload: Dict[str, Any], epoch: Optional[int]) -> Outcome:
        import shutil
        import tempfile

        from . import inflight

        making = inflight.current()
        folder = None if making is not None else tempfile.mkdtemp(prefix="runner-payload-")
        path = making[0].payload_path(making[1]) if making is not None else os.path.join(folder, "payload.json")  # type: ignore[arg-type]
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
            try:
                os.write(fd, canonical_json(payload))
            finally:
                os.close(fd)
            values = dict(self.values, key=key, payload_file=path, epoch="" if epoch is None else int(epoch))
            return self.runner(expand(argv, values), cwd=self.cwd, timeout=self.timeout)
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        """Run the invoke command; its exit code says what happened (see :data:`INVOKE_EXITS`)."""
        from . import inflight

        making = inflight.current()
        if making is not None and making[0].clock() >= float(making[1].record["deadline"]):
            # This process was held up (stopped) between registering the call and starting it: whoever took
            # over may already have counted the call as never made.
            raise NotApplied("the call's deadline passed before its command started; nothing was sent")
        result = self._call(self.invoke_argv, key, payload, epoch)
        if result.timed_out:
            raise UnknownOutcome(f"the invoke command timed out after {self.timeout:g}s")
        answer = result.json_object()
        code = result.exit_code
        if code == 0 and answer is not None:
            return answer
        if code == EXIT_REFUSED:
            raise Rejected(f"the invoke command says the target refused it for good: {result.tail()}")
        if code == EXIT_TEMPFAIL:
            raise NotApplied(f"the invoke command says the target created nothing for now: {result.tail()}", _retry_after(answer))
        if code == EXIT_STALE_EPOCH:
            raise StaleEpoch(f"the invoke command says the target refused epoch {epoch}: {result.tail()}")
        what = "printed no JSON object" if code == 0 else f"exited {code}"
        raise UnknownOutcome(f"the invoke command {what}: {result.tail()}")

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        """Run the observe command: 0 with a JSON object is present, 1 absent, anything else unknown."""
        result = self._call(self.observe_argv, key, payload, None)
        found = result.json_object()
        base = {"source": "observe command", "exit_code": result.exit_code, "stdout_sha256": result.stdout_sha256}
        if result.exit_code == 0 and found is not None:
            return Observation("present", {**found, "observed_by": base})
        if result.exit_code == 1:
            return Observation("absent", {**(found or {}), "observed_by": base})
        reason = f"timed out after {self.timeout:g}s" if result.timed_out else f"exit {result.exit_code}: {result.tail(200)}"
        return Observation("unknown", {"observed_by": base, "reason": reason})

    @property
    def batch_key(self) -> Optional[Tuple[Any, ...]]:
        """Adapters with one ``batch_key`` may be looked up together by :meth:`observe_many` (None: no ``observe_many``)."""
        return None if self.many is None else ("commands", canonical_json(self.many), self.cwd)

    @property
    def observe_batch(self) -> int:
        """The most keys one :meth:`observe_many` asks for."""
        return int(self.many.get("max", MANY_DEFAULT)) if self.many is not None else 1

    def observe_many(self, items: Sequence[Tuple[str, Dict[str, Any], Any]]) -> List[Observation]:
        """Look the keys of ``items`` (``(key, payload, adapter)``, each adapter holding its key's placeholders) up with
        one run of the ``observe_many`` command (see the module docstring), in the order given.

        A key is absent only when the answer says it is complete; ``unseen`` otherwise, and for every key when the
        command failed or printed no list.

        :raises NotApplied: the command exited 75 (the target refused the lookup for now).
        """
        if self.many is None:
            raise InvalidInput("this contract has no effects.observe_many: keys are looked up one by one")
        wanted = [expand([self.many["value"]], dict(getattr(adapter, "values", self.values), key=key))[0] for key, _, adapter in items]
        argv: List[str] = []
        for arg in expand(self.many["command"], self.values):
            argv.extend(wanted if arg == EACH else [arg])
        result = self.runner(argv, cwd=self.cwd, timeout=self.timeout)
        base = {"source": "observe_many command", "exit_code": result.exit_code, "stdout_sha256": result.stdout_sha256, "keys": len(items)}
        if result.exit_code == EXIT_TEMPFAIL:
            raise NotApplied(f"the observe_many command says the target refused the lookup for now: {result.tail()}",
                             _retry_after(result.json_object()))
        try:
            document = loads_strict(result.stdout.decode("utf-8")) if result.exit_code == 0 else MISSING
        except (ValueError, UnicodeDecodeError):
            document = MISSING
        listed = resolve_pointer(document, parse_pointer(self.many.get("list", ""))) if document is not MISSING else MISSING
        if not isinstance(listed, list):
            reason = (f"timed out after {self.timeout:g}s" if result.timed_out else f"exit {result.exit_code}: {result.tail(200)}"
                      if result.exit_code != 0 else "stdout holds no JSON list at the pointer 'list'")
            return [Observation("unseen", dict(base, reason=reason)) for _ in items]
        complete = isinstance(document, dict) and document.get("complete") is True
        found = matched(listed, parse_pointer(self.many["match"]))
        out = []
        for want in wanted:
            matches = found.get(want, [])
            seen = dict(base, matches=len(matches))
            if matches:
                seen["found"] = shown(matches[0])
            elif not complete:
                seen["reason"] = 'the answer does not say "complete": true, so it may leave keys out'
            out.append(Observation("present" if matches else "absent" if complete else "unseen", seen))
        return out


def _retry_after(answer: Optional[Dict[str, Any]]) -> Optional[float]:
    """``retry_after`` seconds from an exit-75 answer's JSON, if it gave a sane one."""
    value = (answer or {}).get("retry_after")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_RETRY_AFTER:
        return None
    return float(value)
