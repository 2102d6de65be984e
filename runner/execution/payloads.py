"""The payload an effect sends: an item's, made from its step's template or command, or the one given.

An item's payload is the same on every rerun: made from the frozen item,
its key, its record as frozen with the list (never read again) and the file
it names (read again, and refused if it now leads outside the workspace), or
printed by the step's payload command, which runs here
(:func:`runner.calls.commands.run_command`).
"""

import os
from typing import Any, Dict, Optional, cast

from ..base.canonical import MAX_DOCUMENT_BYTES, content_digest, sha256_stream
from ..base.errors import InvalidInput
from ..base.workspace import open_regular, resolve_inside
from ..calls.commands import run_command
from ..contract.spec import DEFAULT_PAYLOAD_TEMPLATE, StepSpec, contract_of
from ..contract.templates import (DOCUMENT_PLACEHOLDERS, FILE_PLACEHOLDERS, document_values, expand, fill,
                                  placeholders_in, strings_in)
from ..ledger.batch import item_values_of, keys_of, owner_of

__all__ = ["item_payload", "begin_payload"]


def item_payload(state: Dict[str, Any], step: str, index: int) -> Dict[str, Any]:
    """The payload of item ``index`` of ``step``: from its template or command; the same on every rerun."""
    spec = cast(StepSpec, contract_of(state).step(step))  # a step whose items were frozen
    record = state["steps"][step]
    batch, root = record["batch"], record["workspace"]
    item = batch["items"][index]
    key = keys_of(batch)[0][index]
    values: Dict[str, Any] = dict(item_values_of(state, step, index), key=key)
    how = spec.payload
    if how is not None and how.command is not None:
        outcome = run_command(expand(how.command, dict(values, workspace=root, run_id=state["task_id"])), cwd=root)
        payload = outcome.json_object()
        if outcome.exit_code != 0 or payload is None:
            raise InvalidInput(f"the payload command for {key} did not print a JSON object (exit {outcome.exit_code}): "
                               f"{outcome.tail()}")
        return payload
    template = how.template if how is not None else DEFAULT_PAYLOAD_TEMPLATE
    wanted = {n for s in strings_in(template) for n in placeholders_in(s)}
    if wanted & set(FILE_PLACEHOLDERS):
        values.update(_file_values(root, item, f"item {item[:80]!r} of step {step!r}", wanted))
    records = batch.get("records")
    return fill(template, values, records[index] if records is not None else None)


def _file_values(root: str, item: str, what: str, wanted: Any) -> Dict[str, str]:
    """The file placeholders ``wanted`` of one item, read from its file after checking where it leads now."""
    real = resolve_inside(root, item, what)
    out: Dict[str, str] = {}
    with os.fdopen(open_regular(real, what), "rb") as handle:
        head = handle.read(1 << 20)
        if "sha256" in wanted:
            digest = sha256_stream()
            digest.update(head)
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
            out["sha256"] = digest.hexdigest()
    out["first_line"] = head.split(b"\n", 1)[0][:MAX_DOCUMENT_BYTES // 4].decode("utf-8", "replace").rstrip("\r")
    if wanted & set(DOCUMENT_PLACEHOLDERS):
        out.update(document_values(head, what))
    return out


def begin_payload(state: Dict[str, Any], key: str, given: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The payload ``effect begin KEY`` records: for an item of a started batch step, the one its template makes;
    for another key, the one given, else the one the run kept when the effect was first begun.

    :param given: the payload passed (``--payload``), or None.
    :raises InvalidInput: no payload is given for a key that is not such an
        item, or the one given differs from the item's (both digests named).
    """
    found = owner_of(state, key)
    if found is None:
        kept = (state["effects"].get(key) or {}).get("payload")
        if given is None and kept is not None:
            return kept  # begun before, by this session or another: the run kept what it sent
        if given is None:
            raise InvalidInput(f"--payload FILE is required (a JSON file, or - for stdin): {key!r} is not the key of "
                               "an item of a started batch step and the run keeps no payload for it")
        return given
    step, index = found
    expected = item_payload(state, step, index)
    if given is not None:
        want, got = content_digest(expected), content_digest(given)
        if want != got:
            raise InvalidInput(f"{key!r} is item {index} of step {step!r}, whose template makes the payload {want}; "
                               f"the payload given is {got}. Leave out --payload to send the template's", key=key,
                               expected=want, given=got)
    return expected
