"""The adapter conformance kit: does an adapter keep the promises the runner relies on?

:func:`drive_effect` trusts an adapter's declared facts and its two calls:
it resends only through an adapter that deduplicates, reads ``absent`` as
permission for one more attempt, and reads a stale-epoch refusal as fencing.
An adapter that lies about any of these turns a crash into a duplicate
effect. The kit exercises each promise against the real target.

``run_conformance(factory)`` returns a report (a dict); ``format_report``
renders it with one PASS / FAIL / SKIP line per check and its reason.
``python3 -m runner.proof.conformance --adapter module:factory`` runs it from
the command line (exit 0 when every check passes or is skipped, 1 when one
fails, 2 when the factory cannot be loaded).

The factory protocol
--------------------

``factory()`` returns an adapter, or a pair ``(adapter, controls)``. The kit
calls it once per run; checks use keys of their own (with a random prefix)
and strictly increasing fencing epochs, so they do not disturb each other,
but a target whose fencing scope already saw higher epochs will refuse
them: give each factory call a fresh scope. ``controls`` may offer any of:

``lose_next_response()``
    The next ``invoke`` performs the effect but its answer is lost, so it
    must raise :class:`~runner.calls.target.UnknownOutcome`. Without it the kit
    simulates the loss by discarding a receipt.
``effect_count(key, payload) -> int``
    How many effects the target holds for this key (or business marker),
    counted without ``observe``. Without it duplicate detection falls back
    to comparing receipts and observations.
``make_payload(key, variant) -> dict``
    A payload the adapter accepts; variants 1 and 2 must differ. The
    default is ``{"marker": ..., "content": ...}``, unique per key and variant.
``close()``
    Release whatever the factory started; called once, at the end.

Declared facts read from the adapter: ``name``, ``key_scope``,
``retention_seconds``, ``conflicting_payload``, ``verification``,
``deduplicates`` and, optionally, ``enforces_fencing`` (absent: False). A
``conflicting_payload`` that starts with "refused" or "rejected" declares
that the adapter raises :class:`~runner.calls.target.Rejected` for a known key
with another payload.

The checks: ``declared_facts``, ``never_invoked_is_absent``,
``invoke_is_observed``, ``same_key_same_payload_dedups`` (adapters that
deduplicate), ``conflicting_payload_refused`` (adapters that declare
refusal), ``lost_response_is_observed``, ``fencing_epoch_enforced``
(adapters that declare ``enforces_fencing = True``).
"""

import argparse
import importlib
import json
import shutil
import sys
import tempfile
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..base.canonical import check_document
from ..calls.target import Observation, Rejected, StaleEpoch, UnknownOutcome
from ..adapters.artifact import ArtifactAdapter
from ..base.errors import InvalidInput

__all__ = ["CHECKS", "run_conformance", "format_report", "load_factory", "ResponseLosingAdapter", "main"]

PASS, FAIL, SKIP = "pass", "fail", "skip"

_REFUSAL_WORDS = ("refused", "rejected")


class _Fail(Exception):
    """A check found a broken promise; the message says which."""


class _Skip(Exception):
    """A check does not apply to what the adapter declares."""


class ResponseLosingAdapter:
    """Wraps an adapter so that, after :meth:`lose_next_response`, an invoke happens but its answer is lost.

    For targets that cannot drop an answer themselves (a file system). Facts
    and ``observe`` are the wrapped adapter's.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._pending = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def lose_next_response(self) -> None:
        self._pending += 1

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        receipt = self.inner.invoke(key, payload, epoch)
        if self._pending:
            self._pending -= 1
            raise UnknownOutcome("the answer was lost after the effect was performed (simulated)")
        return receipt

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        return self.inner.observe(key, payload)


class _Context:
    """What a check works with: the adapter, its optional controls, fresh keys and epochs."""

    def __init__(self, adapter: Any, controls: Any) -> None:
        self.adapter = adapter
        self.controls = controls
        self.token = uuid.uuid4().hex[:10]
        self._epoch = 0

    def key(self, label: str) -> str:
        return f"conformance-{self.token}-{label}"

    def payload(self, key: str, variant: int = 1) -> Dict[str, Any]:
        make = getattr(self.controls, "make_payload", None)
        if callable(make):
            return make(key, variant)
        return {"marker": f"{key}.v{variant}", "content": f"conformance payload for {key}, variant {variant}\n"}

    def epoch(self) -> int:
        """A fencing epoch above every one handed out before (steps of 10 leave room for +1)."""
        self._epoch += 10
        return self._epoch

    @property
    def dedups(self) -> bool:
        return getattr(self.adapter, "deduplicates", False) is True

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        receipt = self.adapter.invoke(key, payload, epoch)
        try:
            check_document(receipt, "receipt")
        except InvalidInput as exc:
            raise _Fail(f"invoke returned an unusable receipt: {exc.message}") from None
        return receipt

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        seen = self.adapter.observe(key, payload)
        status = getattr(seen, "status", None)
        evidence = getattr(seen, "evidence", None)
        if status not in ("present", "absent", "unknown"):
            raise _Fail(f"observe returned {seen!r}, not an Observation with status present, absent or unknown")
        try:
            checked = check_document(evidence, "evidence")
        except InvalidInput as exc:
            raise _Fail(f"observe returned unusable evidence: {exc.message}") from None
        return Observation(status, checked)

    def count(self, key: str, payload: Dict[str, Any]) -> Optional[int]:
        counter = getattr(self.controls, "effect_count", None)
        return int(counter(key, payload)) if callable(counter) else None


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=repr) if isinstance(value, (dict, list)) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the checks -----------------------------------------------------------------------------

def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _retention_ok(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0)


_FACTS: Tuple[Tuple[str, Callable[[Any], bool], str], ...] = (
    ("name", _is_text, "a non-empty string"),
    ("key_scope", _is_text, "a non-empty string"),
    ("retention_seconds", _retention_ok, "None or a number of seconds >= 0"),
    ("conflicting_payload", _is_text, "a non-empty string"),
    ("verification", _is_text, "a non-empty string"),
    ("deduplicates", lambda v: isinstance(v, bool), "True or False"),
)


def check_declared_facts(ctx: _Context) -> str:
    adapter = ctx.adapter
    problems: List[str] = []
    shown: List[str] = []
    for fact, valid, expected in _FACTS:
        if not hasattr(adapter, fact):
            problems.append(f"{fact} is not declared")
            continue
        value = getattr(adapter, fact)
        if not valid(value):
            problems.append(f"{fact}={value!r} is not {expected}")
        elif fact != "name":
            shown.append(f"{fact}={value!r}")
    fencing = getattr(adapter, "enforces_fencing", None)
    if fencing is None:
        shown.append("enforces_fencing not declared (taken as False)")
    elif not isinstance(fencing, bool):
        problems.append(f"enforces_fencing={fencing!r} is not True or False")
    else:
        shown.append(f"enforces_fencing={fencing!r}")
    for call in ("invoke", "observe"):
        if not callable(getattr(adapter, call, None)):
            problems.append(f"{call}() is missing")
    if problems:
        raise _Fail("; ".join(problems))
    return ", ".join(shown)


def check_never_invoked_is_absent(ctx: _Context) -> str:
    key = ctx.key("never")
    payload = ctx.payload(key)
    first = ctx.observe(key, payload)
    if first.status != "absent":
        raise _Fail(f"observe of a key never invoked said {first.status} ({_short(first.evidence)}); the runner could "
                    "never retry a lost request")
    second = ctx.observe(key, payload)
    if second.status != "absent":
        raise _Fail(f"a second observe said {second.status}: observing must not perform the effect")
    count = ctx.count(key, payload)
    if count:
        raise _Fail(f"the target holds {count} effect(s) for a key that was only observed")
    return f"absent twice, evidence {_short(first.evidence)}"


def check_invoke_is_observed(ctx: _Context) -> str:
    key = ctx.key("invoke")
    payload = ctx.payload(key)
    receipt = ctx.invoke(key, payload, ctx.epoch())
    seen = ctx.observe(key, payload)
    if seen.status != "present":
        raise _Fail(f"invoke returned {_short(receipt)} but observe said {seen.status} ({_short(seen.evidence)}); an "
                    "acknowledged effect could never be verified")
    return f"receipt {_short(receipt, 100)}; observe said present"


def check_same_key_same_payload_dedups(ctx: _Context) -> str:
    if not ctx.dedups:
        raise _Skip("declares deduplicates = False: the runner never resends through it; an unresolved effect is "
                    "settled by observe alone")
    key = ctx.key("dedup")
    payload = ctx.payload(key)
    epoch = ctx.epoch()
    first = ctx.invoke(key, payload, epoch)
    before = ctx.observe(key, payload)
    try:
        second = ctx.invoke(key, payload, epoch)
    except Exception as exc:
        raise _Fail(f"a second invoke with the same key and payload raised {type(exc).__name__}: {exc}") from None
    after = ctx.observe(key, payload)
    count = ctx.count(key, payload)
    if count is not None:
        if count != 1:
            raise _Fail(f"two invokes with one key and payload left {count} effects at the target (receipts "
                        f"{_short(first, 80)} and {_short(second, 80)})")
        return f"one effect after two invokes (effect_count); receipts {_short(first, 70)} and {_short(second, 70)}"
    if first == second:
        return "the second invoke returned the same receipt"
    if before.status == after.status == "present" and before.evidence == after.evidence:
        return "receipts differ but the observation is unchanged"
    raise _Fail(f"receipts differ ({_short(first, 80)} / {_short(second, 80)}) and the observation changed; nothing "
                "shows the second invoke was a dedup")


def check_conflicting_payload_refused(ctx: _Context) -> str:
    declared = getattr(ctx.adapter, "conflicting_payload", "")
    if not (isinstance(declared, str) and declared.strip().lower().startswith(_REFUSAL_WORDS)):
        raise _Skip(f"declares conflicting_payload = {declared!r}, not a refusal")
    key = ctx.key("conflict")
    original, other = ctx.payload(key, 1), ctx.payload(key, 2)
    epoch = ctx.epoch()
    ctx.invoke(key, original, epoch)
    try:
        receipt = ctx.adapter.invoke(key, other, epoch)
    except Rejected as exc:
        refusal = str(exc)
    except Exception as exc:
        raise _Fail(f"another payload under a known key raised {type(exc).__name__} ({exc}), not Rejected") from None
    else:
        raise _Fail(f"another payload under a known key was accepted (receipt {_short(receipt)}), though refusal is "
                    "declared")
    seen = ctx.observe(key, original)
    if seen.status != "present":
        raise _Fail(f"after the refusal the original effect is observed {seen.status}")
    count = ctx.count(key, original)
    if count is not None and count != 1:
        raise _Fail(f"after the refusal the target holds {count} effects for the key")
    return f"Rejected ({_short(refusal, 90)}); the original is still observed"


def check_lost_response_is_observed(ctx: _Context) -> str:
    key = ctx.key("lost")
    payload = ctx.payload(key)
    epoch = ctx.epoch()
    lose = getattr(ctx.controls, "lose_next_response", None)
    if callable(lose):
        lose()
        try:
            receipt = ctx.adapter.invoke(key, payload, epoch)
        except UnknownOutcome as exc:
            how = f"invoke raised UnknownOutcome ({_short(str(exc), 80)})"
        else:
            raise _Fail(f"the response was lost but invoke returned {_short(receipt)}; it must raise UnknownOutcome")
    else:
        ctx.invoke(key, payload, epoch)  # the receipt is dropped: the caller learns nothing from the call
        how = "simulated by discarding the receipt (no lose_next_response control)"
    seen = ctx.observe(key, payload)
    if seen.status != "present":
        raise _Fail(f"{how}, then observe said {seen.status} ({_short(seen.evidence)}); the runner would stop, or "
                    "retry into a duplicate")
    if ctx.dedups:
        ctx.invoke(key, payload, epoch)  # what the runner does within retention: resend the same key and payload
        count = ctx.count(key, payload)
        if count is not None and count != 1:
            raise _Fail(f"{how}; resending the same key and payload left {count} effects")
        how += "; the resend made no second effect" if count is not None else "; the resend was accepted"
    return f"{how}; observe said present"


def check_fencing_epoch_enforced(ctx: _Context) -> str:
    if getattr(ctx.adapter, "enforces_fencing", None) is not True:
        raise _Skip("does not declare enforces_fencing = True: only the run store's lease stops a stale writer at this "
                    "target")
    epoch = ctx.epoch()
    newer, stale = ctx.key("fence-new"), ctx.key("fence-stale")
    ctx.invoke(newer, ctx.payload(newer), epoch + 1)
    stale_payload = ctx.payload(stale)
    try:
        receipt = ctx.adapter.invoke(stale, stale_payload, epoch)
    except StaleEpoch as exc:
        refusal = str(exc)
    except Exception as exc:
        raise _Fail(f"epoch {epoch} after epoch {epoch + 1} raised {type(exc).__name__} ({exc}), "
                    "not StaleEpoch") from None
    else:
        raise _Fail(f"epoch {epoch} after epoch {epoch + 1} was accepted (receipt {_short(receipt)}): the epoch does "
                    "not reach the target")
    seen = ctx.observe(stale, stale_payload)
    if seen.status != "absent":
        raise _Fail(f"the refused stale invoke left the effect {seen.status}")
    ctx.invoke(stale, stale_payload, epoch + 1)
    return (f"epoch {epoch} after {epoch + 1}: StaleEpoch ({_short(refusal, 80)}); nothing written; "
            f"epoch {epoch + 1} still accepted")


#: Check name -> function, in the order they run.
CHECKS: Dict[str, Callable[[_Context], str]] = {
    "declared_facts": check_declared_facts,
    "never_invoked_is_absent": check_never_invoked_is_absent,
    "invoke_is_observed": check_invoke_is_observed,
    "same_key_same_payload_dedups": check_same_key_same_payload_dedups,
    "conflicting_payload_refused": check_conflicting_payload_refused,
    "lost_response_is_observed": check_lost_response_is_observed,
    "fencing_epoch_enforced": check_fencing_epoch_enforced,
}


# -- running and reporting ----------------------------------------------------------------------

def _result(check: str, status: str, reason: str) -> Dict[str, str]:
    return {"check": check, "status": status, "reason": reason}


def _summarise(adapter_name: str, label: str, results: List[Dict[str, str]]) -> Dict[str, Any]:
    counts = {status: sum(1 for r in results if r["status"] == status) for status in (PASS, FAIL, SKIP)}
    return {"adapter": adapter_name, "factory": label, "passed": counts[FAIL] == 0 and bool(results), "counts": counts,
            "checks": results}


def run_conformance(factory: Callable[[], Any], label: Optional[str] = None) -> Dict[str, Any]:
    """Run every check against what ``factory()`` returns; never raises for a failing adapter.

    The report: ``adapter`` (its name), ``factory``, ``passed`` (no check
    failed), ``counts`` per status and ``checks``, a list of ``{"check",
    "status", "reason"}`` in the order of :data:`CHECKS`.
    """
    shown: str = label if label else getattr(factory, "__qualname__", repr(factory))
    try:
        made = factory()
    except Exception as exc:
        return _summarise("?", shown, [_result("factory", FAIL, f"the factory raised {type(exc).__name__}: {exc}")])
    adapter, controls = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    ctx = _Context(adapter, controls)
    results: List[Dict[str, str]] = []
    try:
        for name, check in CHECKS.items():
            try:
                results.append(_result(name, PASS, check(ctx)))
            except _Skip as exc:
                results.append(_result(name, SKIP, str(exc)))
            except _Fail as exc:
                results.append(_result(name, FAIL, str(exc)))
            except Exception as exc:  # an adapter bug is a failed check, not a crashed kit
                results.append(_result(name, FAIL, f"raised {type(exc).__name__}: {exc}"))
    finally:
        close = getattr(controls, "close", None)
        if callable(close):
            close()
    named = getattr(adapter, "name", None)
    return _summarise(named if isinstance(named, str) else type(adapter).__name__, shown, results)


def format_report(report: Dict[str, Any]) -> str:
    """One line per check (``PASS``, ``FAIL`` or ``SKIP``, its name, the reason) and a result line."""
    lines = [f"conformance of adapter {report['adapter']!r} ({report['factory']})"]
    width = max((len(r["check"]) for r in report["checks"]), default=0)
    for result in report["checks"]:
        lines.append(f"  {result['status'].upper():4}  {result['check']:<{width}}  {result['reason']}")
    counts = report["counts"]
    verdict = "PASS" if report["passed"] else "FAIL"
    lines.append(f"result: {verdict} ({counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped)")
    return "\n".join(lines)


def load_factory(spec: str) -> Callable[[], Any]:
    """``module:callable`` -> the callable; :class:`InvalidInput` when it cannot be found."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidInput(f"--adapter must be module:factory, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(f"cannot import {module_name}: {exc}") from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise InvalidInput(f"{spec} is not a callable factory")
    return target


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m runner.proof.conformance",
                                     description="Check an effect adapter against the runner's contract.")
    parser.add_argument("--adapter", required=True, action="append", metavar="MODULE:FACTORY",
                        help="a factory returning an adapter or (adapter, controls); repeatable")
    parser.add_argument("--json", action="store_true", help="print the reports as one JSON object")
    args = parser.parse_args(argv)
    try:
        factories = [(spec, load_factory(spec)) for spec in args.adapter]
    except InvalidInput as exc:
        sys.stderr.write(f"conformance: {exc.message}\n")
        return 2
    reports = [run_conformance(factory, spec) for spec, factory in factories]
    if args.json:
        sys.stdout.write(json.dumps({"passed": all(r["passed"] for r in reports), "reports": reports}, sort_keys=True)
                         + "\n")
    else:
        sys.stdout.write("\n\n".join(format_report(r) for r in reports) + "\n")
    return 0 if all(r["passed"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())


# -- the artifact adapter under the kit -------------------------------------------

class _ArtifactControls:
    """Conformance hooks: a simulated lost response, and cleanup of the temp folder."""

    def __init__(self, adapter: Any, folder: str) -> None:
        self.adapter = adapter
        self.folder = folder

    def lose_next_response(self) -> None:
        self.adapter.lose_next_response()

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def artifact_factory() -> Tuple[Any, _ArtifactControls]:
    """An :class:`ArtifactAdapter` over a fresh temp folder, wrapped to lose a response on demand."""
    folder = tempfile.mkdtemp(prefix="artifacts-")
    adapter = ResponseLosingAdapter(ArtifactAdapter(folder))
    return adapter, _ArtifactControls(adapter, folder)
