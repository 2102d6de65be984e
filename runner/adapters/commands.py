"""The adapter over the commands a contract declares for its effects.

:class:`CommandAdapter` turns a contract's invoke and observe commands, run by
:func:`runner.calls.commands.run_command`, into a :class:`runner.calls.target.Adapter`,
whose calls the executor (:mod:`runner.execution.executor`) makes like any other target's:

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
* ``"observe": "none"``: the target cannot be read back; there is no observe
  command (``readable`` is False) and the lifecycle never looks.
"""

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..base.canonical import loads_strict
from ..base.errors import InvalidInput
from ..base.pointer import MISSING, matched, parse_pointer, resolve_pointer, shown
from ..calls.commands import EXIT_REFUSED, EXIT_STALE_EPOCH, EXIT_TEMPFAIL, MAX_RETRY_AFTER, Outcome, run_command
from ..calls.target import NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome
from ..contract.effects import DEFAULT_CALL_TIMEOUT, EACH
from ..contract.templates import expand

if TYPE_CHECKING:
    from ..contract.spec import ManyCommand

__all__ = ["CommandAdapter"]


class CommandAdapter:
    """An effect adapter over an invoke and an observe command (see the module docstring).

    ``values`` fills the placeholders other than ``key``, ``payload_file``
    and ``epoch`` (which each call supplies). The payload is written as
    canonical JSON to a private file for each call and removed after it:
    inside a registered call, beside the call's record in the run's folder
    (:meth:`runner.calls.inflight.Registry.payload_path`), so a killed runner's
    payloads are removed by the next; elsewhere, in a private temporary
    folder. Never deduplicates: an unknown outcome is settled by observing.

    An invoke command's answer outlives the process that started it (see
    :func:`runner.calls.commands.run_command`): :meth:`adopt` reads the answer of
    a call whose caller died as that caller would have.
    """

    name = "contract commands"
    key_scope = "as the invoke command's target defines it"
    retention_seconds: Optional[float] = None
    conflicting_payload = "refused by the runner before the command runs (the ledger binds a key to one payload)"
    verification = "the contract's observe command"
    deduplicates = False

    def __init__(self, invoke: Sequence[str], observe: Sequence[str], *, values: Optional[Mapping[str, Any]] = None,
                 cwd: Optional[str] = None, timeout: float = DEFAULT_CALL_TIMEOUT,
                 runner: Optional[Callable[..., Outcome]] = None, many: Optional["ManyCommand"] = None,
                 readable: bool = True) -> None:
        """``runner`` runs one argument list (default :func:`run_command`); a benchmark may pass a stand-in.
        ``many``: the contract's ``observe_many`` section (its spec). ``readable`` False: the target cannot be read
        back (``"observe": "none"``), there is no observe command, and the lifecycle never looks."""
        if not invoke or (not observe and readable):
            raise InvalidInput("an effect run needs both an invoke and an observe command")
        self.readable = readable
        if not readable:
            self.verification = "none: the target cannot be read back; its answer is the only evidence"
        self.invoke_argv, self.observe_argv = list(invoke), list(observe)
        self.many = many
        self.values = dict(values or {})
        self.cwd, self.timeout = cwd, float(timeout)
        self.runner = runner or run_command

    def _call(self, argv: Sequence[str], key: str, payload: Dict[str, Any], epoch: Optional[int]) -> Outcome:
        from ..calls import inflight

        with inflight.payload_file(payload) as path:
            values = dict(self.values, key=key, payload_file=path, epoch="" if epoch is None else int(epoch))
            return self.runner(expand(argv, values), cwd=self.cwd, timeout=self.timeout)

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        """Run the invoke command; its exit code says what happened (see
        :data:`~runner.calls.commands.INVOKE_EXITS`)."""
        from ..calls import inflight

        making = inflight.current()
        if making is not None and making[0].clock() >= float(making[1].record["deadline"]):
            # This process was held up (stopped) between registering the call and starting it: whoever took
            # over may already have counted the call as never made.
            raise NotApplied("the call's deadline passed before its command started; nothing was sent")
        return self.adopt(key, self._call(self.invoke_argv, key, payload, epoch), epoch)

    def adopt(self, key: str, result: Outcome, epoch: Optional[int]) -> Dict[str, Any]:
        """What the invoke command's ``result`` says: the receipt, or the exception that says what else (see
        :data:`~runner.calls.commands.INVOKE_EXITS`). The one reading of an invoke's answer, whether this process
        ran the command or took over from a caller that died while it ran (:func:`runner.calls.commands.left_answer`).
        """
        if result.timed_out:
            raise UnknownOutcome(f"the invoke command timed out after {self.timeout:g}s")
        answer = result.json_object()
        code = result.exit_code
        if code == 0 and answer is not None:
            return answer
        if code == EXIT_REFUSED:
            raise Rejected(f"the invoke command says the target refused it for good: {result.tail()}")
        if code == EXIT_TEMPFAIL:
            raise NotApplied(f"the invoke command says the target created nothing for now: {result.tail()}",
                             _retry_after(answer))
        if code == EXIT_STALE_EPOCH:
            raise StaleEpoch(f"the invoke command says the target refused epoch {epoch}: {result.tail()}")
        what = ("printed no JSON object" if code == 0 else f"exited {code}" if code is not None
                else "ended without an exit status")
        raise UnknownOutcome(f"the invoke command {what}: {result.tail()}")

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        """Run the observe command: 0 with a JSON object is present, 1 absent, anything else unknown (always unknown,
        running nothing, for a target that cannot be read back)."""
        if not self.readable:
            return Observation("unknown", {"source": "observe none", "observe": "none",
                                           "reason": "the target cannot be read back"})
        result = self._call(self.observe_argv, key, payload, None)
        found = result.json_object()
        base = {"source": "observe command", "exit_code": result.exit_code, "stdout_sha256": result.stdout_sha256}
        if result.exit_code == 0 and found is not None:
            return Observation("present", {**found, "observed_by": base})
        if result.exit_code == 1:
            return Observation("absent", {**(found or {}), "observed_by": base})
        reason = (f"timed out after {self.timeout:g}s" if result.timed_out
                  else f"exit {result.exit_code}: {result.tail(200)}")
        return Observation("unknown", {"observed_by": base, "reason": reason})

    @property
    def batch_key(self) -> Optional[Tuple[Any, ...]]:
        """Adapters with one ``batch_key`` may be looked up together by :meth:`observe_many` (None: no
        ``observe_many``)."""
        return None if self.many is None else ("commands", self.many, self.cwd)

    @property
    def observe_batch(self) -> int:
        """The most keys one :meth:`observe_many` asks for."""
        return self.many.max if self.many is not None else 1

    def observe_many(self, items: Sequence[Tuple[str, Dict[str, Any], Any]]) -> List[Observation]:
        """Look the keys of ``items`` (``(key, payload, adapter)``, each adapter holding its key's placeholders) up with
        one run of the ``observe_many`` command (see the module docstring), in the order given.

        A key is absent only when the answer says it is complete; ``unseen`` otherwise, and for every key when the
        command failed or printed no list.

        :raises NotApplied: the command exited 75 (the target refused the lookup for now).
        """
        if self.many is None:
            raise InvalidInput("this contract has no effects.observe_many: keys are looked up one by one")
        wanted = [expand([self.many.value], dict(getattr(adapter, "values", self.values), key=key))[0]
                  for key, _, adapter in items]
        argv: List[str] = []
        for arg in expand(self.many.command, self.values):
            argv.extend(wanted if arg == EACH else [arg])
        result = self.runner(argv, cwd=self.cwd, timeout=self.timeout)
        base = {"source": "observe_many command", "exit_code": result.exit_code, "stdout_sha256": result.stdout_sha256,
                "keys": len(items)}
        if result.exit_code == EXIT_TEMPFAIL:
            raise NotApplied(f"the observe_many command says the target refused the lookup for now: {result.tail()}",
                             _retry_after(result.json_object()))
        try:
            document = loads_strict(result.stdout.decode("utf-8")) if result.exit_code == 0 else MISSING
        except (ValueError, UnicodeDecodeError):
            document = MISSING
        listed = resolve_pointer(document, parse_pointer(self.many.list)) if document is not MISSING else MISSING
        if not isinstance(listed, list):
            reason = (f"timed out after {self.timeout:g}s" if result.timed_out
                      else f"exit {result.exit_code}: {result.tail(200)}"
                      if result.exit_code != 0 else "stdout holds no JSON list at the pointer 'list'")
            return [Observation("unseen", dict(base, reason=reason)) for _ in items]
        complete = isinstance(document, dict) and document.get("complete") is True
        found = matched(listed, parse_pointer(self.many.match))
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
