"""Evidence the runner observes itself, kept apart from evidence it is told.

A contract step may declare ``checks`` (named commands, argument lists run
without a shell in the step's workspace) and ``artifacts`` (paths relative
to it). ``step done`` then runs every check and hashes every artifact
itself, and records exit codes, output digests and file digests with their
source as the step's ``observed`` evidence. A check that exits non-zero, or
an artifact that is missing, refuses the ``done``: nothing is recorded. For
a batch step the observed evidence also counts its items.

What the agent passes with ``--evidence`` is recorded as before, as the
step's ``evidence``, and every view labels it *claimed*: the runner records
it and does not vouch for it.
"""

import os
import time
from typing import Any, Dict, List, Optional

from ..ledger import batch as _batch
from ..calls.commands import run_command
from ..contract.spec import contract_of
from ..contract.templates import expand
from ..base.times import format_time
from ..base.canonical import sha256_stream
from ..base.errors import InvalidInput
from ..base import quoting

__all__ = ["observe_step", "observed_ops", "evidence_view", "evidence_observations"]


def _file_digest(path: str) -> Dict[str, Any]:
    digest = sha256_stream()
    size = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return {"sha256": digest.hexdigest(), "bytes": size}


def observe_step(state: Dict[str, Any], step: str, clock: Any = time.time) -> Optional[Dict[str, Any]]:
    """Run the step's checks and hash its artifacts; the observed evidence, or None if it declares none.

    :raises InvalidInput: a check failed or timed out, or an artifact is missing; the ``done`` is refused.
    """
    spec = contract_of(state).step(step)
    record = state["steps"].get(step) or {}
    if spec is None or not (spec.checks or spec.artifacts or spec.is_batch):
        return None
    if record.get("state") != "running":
        return None  # done_ops refuses this with its own message
    _batch.check_complete(state, step)
    root = record.get("workspace") or _batch.run_workspace(state)
    timeout = spec.timeout_seconds
    observed: Dict[str, Any] = {"source": "runner", "workspace": root}
    checks: Dict[str, Any] = {}
    for name, argv in sorted(spec.checks):
        outcome = run_command(expand(argv, {"workspace": root, "run_id": state["task_id"]}), cwd=root, timeout=timeout)
        if outcome.exit_code != 0:
            why = f"timed out after {timeout:g}s" if outcome.timed_out else f"exited {outcome.exit_code}"
            raise InvalidInput(f"step {step!r}: check {name!r} {why}; the step is not done: {outcome.tail()}",
                               check=name, **{"result": outcome.record()})
        checks[name] = dict(outcome.record(), argv=outcome.argv)
    if checks:
        observed["checks"] = checks
    artifacts: Dict[str, Any] = {}
    for rel in spec.artifacts:
        path = os.path.join(root, rel)
        try:
            artifacts[rel] = _file_digest(path)
        except OSError as exc:
            raise InvalidInput(f"step {step!r}: artifact {rel} cannot be read ({exc.strerror or exc}); the step is not "
                               "done", artifact=rel) from None
    if artifacts:
        observed["artifacts"] = artifacts
    info = _batch.progress(state, step)
    if info is not None:
        observed["items"] = {k: info[k] for k in ("total", "verified", "skipped", "digest")}
    observed["at"] = format_time(clock())
    return observed


def observed_ops(state: Dict[str, Any], step: str, observed: Optional[Dict[str, Any]],
                 done: List[List[Any]]) -> List[List[Any]]:
    """Record ``observed`` with a ``done`` that ``done_ops`` produced (nothing when it produced nothing)."""
    if observed is None or not done:
        return []
    _batch.check_complete(state, step)  # again, under the lock, on the latest state
    return [["set", ["steps", step, "observed"], observed]]


def evidence_view(record: Dict[str, Any]) -> Dict[str, Any]:
    """A step's evidence split by source: ``observed`` by the runner, ``claimed`` by the agent."""
    out: Dict[str, Any] = {}
    if record.get("observed"):
        out["observed"] = record["observed"]
    if record.get("evidence"):
        out["claimed"] = record["evidence"]
    return out


def evidence_observations(state: Dict[str, Any]) -> List[Dict[str, Any]]:
    """``next``'s observations of each done step's evidence, labelled by who established it."""
    from ..base.canonical import content_digest

    out: List[Dict[str, Any]] = []
    for spec in contract_of(state).steps:
        record = state["steps"].get(spec.id) or {}
        if record.get("state") != "done":
            continue
        if record.get("observed"):
            seen = record["observed"]
            parts = [f"{len(seen.get('checks', {}))} check(s) exited 0"] if seen.get("checks") else []
            parts += [f"{len(seen['artifacts'])} artifact(s) hashed"] if seen.get("artifacts") else []
            items = seen.get("items")
            parts += [f"{quoting.number(items.get('verified'))} of {quoting.number(items.get('total'))} items "
                      f"verified, {quoting.number(items.get('skipped'))} skipped"] if items else []
            out.append({"source": f"step {quoting.name(spec.id)}: observed by the runner", "what": "; ".join(parts),
                        "digest": content_digest(seen)})
        if record.get("evidence"):
            out.append({"source": f"step {quoting.name(spec.id)}: claimed by the agent",
                        "what": "recorded as given, not checked by the runner",
                        "digest": content_digest(record["evidence"]), "claimed": record["evidence"]})
    return out
