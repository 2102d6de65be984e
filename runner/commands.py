"""Commands a contract declares: argument lists with placeholders, run without a shell.

A contract names the command that performs an effect, the one that observes
it, the checks of a step and the command that makes a payload, each as a
list of arguments such as ``["python3", "tools/file.py", "{key}",
"{payload_file}"]``. :func:`expand` replaces each ``{name}`` that names a
known placeholder inside one argument and nothing else, so a value (an item
named ``a "$(rm -rf ~)"\\nb``) always reaches the program as part of exactly
one argument: no shell ever reads it. :func:`run_command` runs the result
with a timeout and bounded output; a timeout is reported as such, never as a
failure of the command.

:class:`CommandAdapter` turns an invoke and an observe command into a
:class:`runner.effects.Adapter`, so one effect's whole lifecycle is the
ledger's :func:`runner.effects.drive_effect`:

* invoke: exit 0 with a JSON object on stdout is the receipt; exit 2 means
  the target refused the call for good; anything else, or a timeout, is an
  unknown outcome that is reconciled by observing, never by retrying.
* observe: exit 0 with a JSON object is *present* (the object is the
  evidence), exit 1 is *observed absent*, anything else or a timeout is
  *unknown*.
"""

import os
import re
import signal
import subprocess
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence

from .envelope import canonical_json, loads_strict, sha256_hex
from .errors import InvalidInput

__all__ = [
    "PLACEHOLDERS",
    "placeholders_in",
    "expand",
    "Outcome",
    "run_command",
    "CommandAdapter",
    "DEFAULT_TIMEOUT",
    "OUTPUT_LIMIT",
]

#: Every name a command argument may hold in braces.
PLACEHOLDERS = ("key", "payload_file", "epoch", "run_id", "item", "stem", "index", "workspace")

#: Seconds a command may take unless the contract says otherwise.
DEFAULT_TIMEOUT = 60.0

#: Bytes of stdout (and of stderr) kept from one command; the rest is counted, not kept.
OUTPUT_LIMIT = 256 * 1024

_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)(?::(0?[1-9][0-9]?)d)?\}")


def placeholders_in(text: str) -> List[str]:
    """The placeholder names ``text`` holds (known or not), in order."""
    return [m.group(1) for m in _PLACEHOLDER.finditer(text)]


def expand(argv: Sequence[str], values: Mapping[str, Any]) -> List[str]:
    """``argv`` with every ``{name}`` (or ``{index:05d}``) of ``values`` replaced, one argument each.

    A brace that names no value is left as it is, so literal JSON in an
    argument survives. The number of arguments never changes.
    """

    def one(match: "re.Match[str]") -> str:
        name, width = match.group(1), match.group(2)
        if name not in values:
            return match.group(0)
        value = values[name]
        if width and isinstance(value, int):
            return format(value, f"0{int(width)}d")
        return str(value)

    return [_PLACEHOLDER.sub(one, arg) for arg in argv]


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
    """Run ``argv`` (never through a shell) in ``cwd``; stop it after ``timeout`` seconds.

    The command gets no stdin. On a timeout its whole process group is
    killed and ``exit_code`` is None: the caller must treat that as an
    unknown outcome. A program that cannot be started raises
    :class:`InvalidInput` (the contract names something that is not there).
    """
    argv = [str(a) for a in argv]
    if not argv:
        raise InvalidInput("a command must name a program")
    began = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    env=dict(env) if env is not None else None, start_new_session=True)
        except OSError as exc:
            raise InvalidInput(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
        timed_out = False
        try:
            code: Optional[int] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out, code = True, None
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        seconds = time.monotonic() - began
        stdout, stderr = _read(out, limit), _read(err, limit)
    return Outcome(argv, code, timed_out, stdout, stderr, sha256_hex(stdout), sha256_hex(stderr), seconds)


def _read(handle: Any, limit: int) -> bytes:
    handle.seek(0)
    return handle.read(limit)


class CommandAdapter:
    """An effect adapter over an invoke and an observe command (see the module docstring).

    ``values`` fills the placeholders other than ``key``, ``payload_file``
    and ``epoch`` (which each call supplies). The payload is written as
    canonical JSON to a private temporary file for each call and removed
    after it. Never deduplicates: an unknown outcome is settled by observing.
    """

    name = "contract commands"
    key_scope = "as the invoke command's target defines it"
    retention_seconds: Optional[float] = None
    conflicting_payload = "refused by the runner before the command runs (the ledger binds a key to one payload)"
    verification = "the contract's observe command"
    deduplicates = False

    def __init__(self, invoke: Sequence[str], observe: Sequence[str], *, values: Optional[Mapping[str, Any]] = None,
                 cwd: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT, runner: Optional[Callable[..., Outcome]] = None) -> None:
        """``runner`` runs one argument list (default :func:`run_command`); a benchmark may pass a stand-in."""
        if not invoke or not observe:
            raise InvalidInput("an effect run needs both an invoke and an observe command")
        self.invoke_argv, self.observe_argv = list(invoke), list(observe)
        self.values = dict(values or {})
        self.cwd, self.timeout = cwd, float(timeout)
        self.runner = runner or run_command
        self.last: Optional[Outcome] = None

    def _call(self, argv: Sequence[str], key: str, payload: Dict[str, Any], epoch: Optional[int]) -> Outcome:
        folder = tempfile.mkdtemp(prefix="runner-payload-")
        path = os.path.join(folder, "payload.json")
        try:
            with open(path, "wb") as handle:
                handle.write(canonical_json(payload))
            values = dict(self.values, key=key, payload_file=path, epoch="" if epoch is None else int(epoch))
            self.last = self.runner(expand(argv, values), cwd=self.cwd, timeout=self.timeout)
            return self.last
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
            os.rmdir(folder)

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        from .effects import Rejected, UnknownOutcome

        result = self._call(self.invoke_argv, key, payload, epoch)
        if result.timed_out:
            raise UnknownOutcome(f"the invoke command timed out after {self.timeout:g}s")
        receipt = result.json_object()
        if result.exit_code == 0 and receipt is not None:
            return receipt
        if result.exit_code == 2:
            raise Rejected(f"the invoke command says the target refused it for good: {result.tail()}")
        what = "printed no JSON object" if result.exit_code == 0 else f"exited {result.exit_code}"
        raise UnknownOutcome(f"the invoke command {what}: {result.tail()}")

    def observe(self, key: str, payload: Dict[str, Any]) -> Any:
        from .effects import Observation

        result = self._call(self.observe_argv, key, payload, None)
        found = result.json_object()
        base = {"source": "observe command", "exit_code": result.exit_code, "stdout_sha256": result.stdout_sha256}
        if result.exit_code == 0 and found is not None:
            return Observation("present", {**found, "observed_by": base})
        if result.exit_code == 1:
            return Observation("absent", {**(found or {}), "observed_by": base})
        reason = f"timed out after {self.timeout:g}s" if result.timed_out else f"exit {result.exit_code}: {result.tail(200)}"
        return Observation("unknown", {"observed_by": base, "reason": reason})
