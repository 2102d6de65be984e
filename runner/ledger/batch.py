"""Batch steps: a step over a list of items, one effect per item, the list frozen at start.

A contract step may declare ``items``: an inline list, ``{"glob": PATTERN}``
relative to the contract's ``workspace``, or ``{"file": PATH}`` holding one
item per line; and ``key``, the effect key template of one item, built from
``{item}``, ``{stem}`` (the item's file name without its extension),
``{slug}`` (the stem in a key-safe form, see :func:`~runner.contract.templates.slug`) and ``{index}``
(its place in the list, ``{index:05d}`` padded), and nothing random.
``payload`` says what each item's effect sends: ``{"template": {...}}``, whose
strings may hold ``{item}``, ``{stem}``, ``{slug}``, ``{index}``, ``{key}``,
``{first_line}`` and ``{sha256}`` of the item's file, and the document
placeholders ``{text}`` (the file's text), ``{heading}`` (its first non-blank
line without its leading ``#`` marks and surrounding space) and ``{body}`` (the text
after that line, trimmed); or ``{"command": [ARGV]}`` whose stdout is the
payload as a JSON object (its arguments may hold the key placeholders,
``{key}``, ``{workspace}`` and ``{run_id}``).

Items may be records: ``{"jsonl": PATH}``, ``{"csv": PATH}`` (the header row
names the fields) and ``{"lines": PATH, "pattern": REGEX}`` (the named groups
of each line) give one record a line, its item ``PATH:LINE``; a glob of
``.json`` files gives each file's object when a template names a field. A
record fills ``{field.PATH}`` in every template an item fills (see
:mod:`runner.contract.templates`).

The document placeholders read at most :data:`~runner.contract.templates.MAX_TEXT_BYTES` of the file and
need UTF-8 (a leading byte order mark is dropped): a larger file, or one that
is not UTF-8, is refused with :class:`~runner.base.errors.InvalidInput` naming the
item, never cut short or sent with replacement characters. ``{first_line}``
keeps its older rule (the first line of any file, undecodable bytes replaced).

The workspace is the contract's ``workspace`` (default ``.``); a relative one
resolves against the folder of the contract file given to ``init``, which the
run records as ``workspace_base`` (a run started before that was recorded
resolves it against the current folder, as it always did).

Invariants kept here:

* Every item stays inside the workspace after links are followed. An
  absolute item, a ``..`` component or a NUL is refused at ``contract check``
  (inline lists, the item file's path, the glob pattern); at ``step start``
  every item of every source is resolved to its real path and refused if it
  leads outside; and an item's file is resolved again when it is read for a
  payload, so a link changed after the freeze cannot make a file outside the
  workspace reach a target.
* A glob never follows a directory symbolic link and visits at most
  :data:`~runner.base.workspace.MAX_LISTED_ENTRIES` directory entries and returns at most
  :data:`~runner.base.workspace.MAX_ITEMS` items; past either bound the listing is refused with one
  line. Otherwise it keeps :func:`glob.glob`'s rules: ``*``, ``?`` and
  ``[...]`` within one name, ``**`` as a whole component for any depth, names
  starting with ``.`` matched only by a pattern component that starts with
  ``.``, files only (a link to a file counts), sorted relative paths.
* ``step start`` freezes the item list into the run with its digest and the
  absolute workspace root; every later decision uses the frozen list. A
  later change in what the source lists is reported (:func:`items_changed`,
  through the same bounded listing) and never used; a migration to another
  plan refreezes at the next start.
* A record is frozen with its item (the batch's ``records``, in the
  digest), at most :data:`MAX_RECORDS_BYTES` of them, after every record was
  checked to fill every field the step's templates and the effects section
  name: every payload, command, URL and lookup of an item is made from its
  frozen record, never from the file again, so a record edited after the
  start changes nothing sent, in this process or any that resumes the run.
* Two items never share a key: a list that would (two slugs alike included,
  or an item of another step's frozen list) is refused at start. Nor a file
  their answers are kept in (``effects.http.invoke.save``), names compared
  case-insensitively; a kept answer's path that would leave the workspace is
  refused at start too.
* A key the ledger holds is never given to another item, and an item whose
  effect may exist at the target (verified or unresolved) keeps its key:
  a list frozen anew that would do either, an ``{index}`` shifted by an item
  added in front or a changed key template among them, is refused at start
  with nothing recorded (:func:`freeze_ops`). An item is its string, the
  path in the workspace the key is made from: a file whose content changed
  is the same item. Keys the ledger holds for items a new list no longer
  names stay with those items (the batch's ``unlisted``); skips move with
  their items.
* Two items are never looked up at the target by one value: a list whose
  items would share the observe request or command, or ``observe_many``'s
  ``value``, is refused at start (and an inline list by ``contract check``),
  see :func:`~runner.contract.lookups.shared_lookup`. A lookup built from ``{payload_file}`` is the
  contract's to keep apart: only the items' payloads tell.
* A batch step is done only when every item's effect is verified or skipped
  with a recorded reason (:func:`check_complete`).

Per-item lookups (key to index) are cached by the frozen digest, so the
loop over 20,000 items does not rebuild them for each item.
"""

import csv
import io
import re
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

from ..base.workspace import MAX_ITEMS, check_inside, glob_files, item_problem, read_bounded, resolve_inside
from ..contract.lookups import run_shared_lookup
from ..contract.spec import EffectsSpec, ItemsSpec, StepSpec, contract_of
from ..contract.templates import (RECORD_FILES, expand, field_value, field_values, is_field, item_keys, item_values,
                                  kind_of, placeholders_in, slug, values_for)
from .states import EFFECT_STATES, UNRESOLVED
from ..base.values import validate_id
from ..base.times import format_time
from ..base.canonical import canonical_json, content_digest, loads_strict
from ..base.errors import InvalidInput, NeedsReconciliation

__all__ = [
    "run_workspace",
    "MAX_RECORDS_BYTES",
    "list_items",
    "freeze",
    "freeze_ops",
    "bindings",
    "keys_of",
    "owner_of",
    "progress",
    "next_item",
    "next_action",
    "item_context",
    "item_values_of",
    "items_changed",
    "skip_ops",
    "skip_many_ops",
    "ITEM_STATES",
    "item_state",
    "batch_of",
    "check_complete",
]

#: The states an item of a batch step may be in: ``pending`` (its effect never begun), its effect's state, or
#: ``skipped`` (settled without its effect, whatever its effect's state).
ITEM_STATES: Tuple[str, ...] = ("pending",) + tuple(EFFECT_STATES) + ("skipped",)

Ops = List[List[Any]]


# -- the contract's fields ---------------------------------------------------------------

# -- resolving and freezing ------------------------------------------------------------------

def run_workspace(state: Dict[str, Any], cwd: Optional[str] = None) -> str:
    """The run's absolute workspace: its plan's ``workspace`` against the contract's folder recorded at ``init``.

    A run started before that folder was recorded (no ``workspace_base``)
    resolves a relative workspace against ``cwd`` (default: the current folder).
    """
    return contract_of(state).workspace_root(state.get("workspace_base"), cwd)


#: The most bytes of records one step reads, and freezes into the run (canonical JSON): a database store writes the
#: run's envelope, records and all, with every transition, so records hold what the payloads need and no more.
MAX_RECORDS_BYTES = 8 * 1024 * 1024
_Records = Optional[List[Dict[str, Any]]]


def list_items(spec: StepSpec, root: str, records: bool = False) -> Tuple[List[str], Dict[str, Any], _Records]:
    """The items the step's source lists now, in a stable order, the source, and the items' records (or None).

    A glob is listed by :func:`~runner.base.workspace.glob_files` (bounded, no directory link
    followed); an item file must itself resolve inside the workspace. The
    items are not checked here: :func:`freeze` resolves each one. A JSON Lines,
    CSV or lines file gives one record a line (a row), its item ``FILE:LINE``;
    with ``records``, each ``.json`` file of a glob gives its object.

    :raises InvalidInput: the source cannot be listed within its bounds, or a record cannot be read (one line naming
        the file and, in a file of records, the line).
    """
    items = cast(ItemsSpec, spec.items)  # only a step that declares items is listed
    if items.inline is not None:
        return list(items.inline), {"inline": len(items.inline)}, None
    if items.glob is not None:
        pattern = items.glob
        listed = glob_files(root, pattern)
        return listed, {"glob": pattern}, (_json_files(root, listed) if records else None)
    kind = next((name for name in RECORD_FILES if getattr(items, name) is not None), "file")
    if kind != "file":
        return _record_file(root, kind, items)
    file = cast(str, items.file)
    what = f"the item file {file[:200]!r}"
    data = read_bounded(resolve_inside(root, file, what), what, 64 * 1024 * 1024)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{what} is not UTF-8") from None
    listed = [line.rstrip("\r") for line in text.split("\n") if line.rstrip("\r")]
    if len(listed) > MAX_ITEMS:
        raise InvalidInput(f"{what} lists {len(listed):,} items; the limit is {MAX_ITEMS:,}")
    return listed, {"file": file}, None


def _text(data: bytes, what: str) -> str:
    """UTF-8 text of a record source (a leading byte order mark dropped); refused naming the line of a bad byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InvalidInput(f"{what}, line {line}: not UTF-8 (byte {exc.start}); records are UTF-8 text") from None
    return text[1:] if text.startswith("\ufeff") else text


def _json_files(root: str, listed: List[str]) -> List[Dict[str, Any]]:
    """The object of each ``.json`` file of a glob: its record."""
    out, total = [], 0
    for item in listed:
        what = f"item {item[:80]!r}"
        data = read_bounded(resolve_inside(root, item, what), what, MAX_RECORDS_BYTES)
        total += len(data)
        if total > MAX_RECORDS_BYTES:
            raise InvalidInput(f"the .json items up to {item[:80]!r} hold more than {MAX_RECORDS_BYTES:,} bytes, "
                               "the most a step reads as records; keep in each file what the payload needs, or split "
                               "the items over steps")
        try:
            value = loads_strict(_text(data, what))
        except ValueError as exc:
            raise InvalidInput(f"{what} is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise InvalidInput(f"{what} holds {kind_of(value)}, not a JSON object: a .json item's object is its record")
        out.append(value)
    return out


def _record_file(root: str, kind: str, items: ItemsSpec) -> Tuple[List[str], Dict[str, Any], _Records]:
    """The records of a JSON Lines, CSV or lines file, each with its item ``FILE:LINE``; blank lines hold none."""
    path: str = getattr(items, kind)
    what = f"the {kind} file {path[:200]!r}"
    text = _text(read_bounded(resolve_inside(root, path, what), what, MAX_RECORDS_BYTES), what)
    if kind == "csv":
        found = _csv_rows(text, what)
    else:
        pattern = re.compile(cast(str, items.pattern)) if kind == "lines" else None
        found = []
        for number, line in enumerate(text.split("\n"), 1):
            line = line.rstrip("\r")
            if not line.strip():
                continue
            if pattern is None:
                found.append((number, _json_line(line, number, what)))
                continue
            match = pattern.fullmatch(line)
            if match is None:
                raise InvalidInput(f"{what}, line {number}: {line[:80]!r} does not match the pattern "
                                   f"{pattern.pattern[:200]!r}")
            found.append((number, match.groupdict()))
    if len(found) > MAX_ITEMS:
        raise InvalidInput(f"{what} holds {len(found):,} records; the limit is {MAX_ITEMS:,}")
    return [f"{path}:{number}" for number, _ in found], {kind: path}, [record for _, record in found]


def _json_line(line: str, number: int, what: str) -> Dict[str, Any]:
    try:
        value = loads_strict(line)
    except ValueError as exc:
        raise InvalidInput(f"{what}, line {number}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{what}, line {number}: {kind_of(value)}, not a JSON object: each line's object is its "
                           "record")
    return value


def _csv_rows(text: str, what: str) -> List[Tuple[int, Dict[str, Any]]]:
    """The rows of a CSV text after its header row, each an object of the header's names, named by its first line."""
    reader = csv.reader(io.StringIO(text, newline=""))
    header: Optional[List[str]] = None
    rows: List[Tuple[int, Dict[str, Any]]] = []
    last = 0
    try:
        for row in reader:
            start, last = last + 1, reader.line_num
            if not row:
                continue
            if header is None:
                empty = next((n for n, name in enumerate(row, 1) if not name.strip()), None)
                if empty is not None:
                    raise InvalidInput(f"{what}, line {start}: the header's cell {empty} is empty; the header row "
                                       "names each column")
                twice = next((name for n, name in enumerate(row) if name in row[:n]), None)
                if twice is not None:
                    raise InvalidInput(f"{what}, line {start}: the header names {twice!r} twice")
                header = row
            elif len(row) != len(header):
                raise InvalidInput(f"{what}, line {start}: {len(row)} cells where the header names {len(header)}")
            else:
                rows.append((start, dict(zip(header, row))))
    except csv.Error as exc:
        raise InvalidInput(f"{what}, line {reader.line_num}: not CSV: {exc}") from None
    return rows


def _digest(items: List[str], records: _Records, step: str) -> str:
    """The frozen list's digest: of its items, and of their records too when it has them.

    :raises InvalidInput: the records are larger, as canonical JSON, than :data:`MAX_RECORDS_BYTES`, or hold text that
        is not Unicode (a lone surrogate such as ``\\ud800`` in a JSON string).
    """
    if records is None:
        return content_digest(items)
    try:
        size = len(canonical_json(records))
    except ValueError:
        raise InvalidInput(f"the records of step {step!r} hold a string that is not Unicode text "
                           "(a lone surrogate such as \\ud800)") from None
    if size > MAX_RECORDS_BYTES:
        raise InvalidInput(f"the records of step {step!r} come to {size:,} bytes; the most a step freezes is "
                           f"{MAX_RECORDS_BYTES:,}: keep in the records what the payload needs, or split the items "
                           "over steps")
    return content_digest({"items": items, "records": records})


def _frozen_batches(state: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
    """``(step, batch)`` of every plan step with a frozen item list."""
    out = []
    for spec in contract_of(state).steps:
        batch = (state["steps"].get(spec.id) or {}).get("batch")
        if batch:
            out.append((spec.id, batch))
    return out


def freeze(state: Dict[str, Any], step: str, cwd: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """What ``step start`` freezes for ``step`` (outside any lock; reads the file system), or None.

    A step that was frozen under the run's present plan keeps its frozen
    list; only the workspace root is returned for it. A new list gives each
    item a key no other item has, in this step or in another step's frozen
    list, and a lookup at the target no other item shares (:func:`~runner.contract.lookups.run_shared_lookup`).
    What the ledger already holds is checked under the run's lock, by :func:`freeze_ops`.

    :raises InvalidInput: the list cannot be made, or two items share a key or a lookup (both named).
    """
    contract = contract_of(state)
    spec = contract.step(step)
    if spec is None or not (spec.is_batch or spec.checks or spec.artifacts):
        return None
    record = state["steps"].get(step) or {}
    old = record.get("batch")
    if old and old.get("plan_digest") == state["plan_digest"]:
        return {"workspace": record.get("workspace") or run_workspace(state, cwd)}
    root = run_workspace(state, cwd)
    frozen: Dict[str, Any] = {"workspace": root}
    if spec.is_batch:
        template = cast(str, spec.key)  # a step that declares items has a key template (contract check)
        items, source, records = list_items(spec, root, spec.reads_records)
        if not items:
            raise InvalidInput(f"step {step!r} lists no items ({source}) under {root}")
        if len(items) > MAX_ITEMS:
            raise InvalidInput(f"step {step!r} lists {len(items)} items; the limit is {MAX_ITEMS}")
        if cast(ItemsSpec, spec.items).records_file is None:  # the items of a file of records are FILE:LINE
            check_inside(root, items, f"step {step!r}")
        if "slug" in placeholders_in(template):
            for index, item in enumerate(items):
                if not slug(item):
                    raise InvalidInput(f"item {index} {item[:60]!r} of step {step!r} has no letter or digit to make "
                                       f"{{slug}} of; put {{index}} in the key as well")
        digest = _digest(items, records, step)
        if records is not None:
            _check_records(spec, contract.effects, step, items, records)
        keys = item_keys(template, items, records)
        seen: Dict[str, int] = {}
        pattern = contract.effects.key_pattern
        others = [(other, batch) for other, batch in _frozen_batches(state) if other != step]
        for index, key in enumerate(keys):
            validate_id(key, f"the key of item {index} ({items[index][:60]!r})")
            if pattern is not None and re.fullmatch(pattern, key) is None:
                raise InvalidInput(f"the key {key!r} of item {index} does not match the contract's key_pattern "
                                   f"{pattern!r}")
            if key in seen:
                raise InvalidInput(f"items {items[seen[key]][:60]!r} and {items[index][:60]!r} give the same key "
                                   f"{key!r}: the key template must tell items apart")
            seen[key] = index
            for other, batch in others:
                at = keys_of(batch)[1].get(key)
                if at is not None:
                    raise InvalidInput(f"item {items[index][:60]!r} of step {step!r} would have the key {key!r} of "
                                       f"item {batch['items'][at][:60]!r} of step {other!r}: a key names one item; "
                                       "give this step a key template of its own (a prefix of its own)")
        _check_saved_files(contract.effects, step, items, records, keys, state["task_id"])
        kept = {o: b["records"] for o, b in others if "records" in b}
        if records is not None:
            kept[step] = records
        lists = [(o, b["items"]) for o, b in others] + [(step, items)]
        shared = run_shared_lookup(state, lists, kept)
        if shared:
            raise InvalidInput(shared)
        frozen["batch"] = {"items": items, "digest": digest, "count": len(items), "source": source,
                           "key": template, "plan_digest": state["plan_digest"], "skipped": {}}
        if records is not None:
            frozen["batch"]["records"] = records
        _remember_keys(frozen["batch"], keys, seen)
    return frozen


def _check_saved_files(effects: EffectsSpec, step: str, items: List[str], records: Optional[List[Dict[str, Any]]],
                       keys: List[str], run_id: str) -> None:
    """Refuse a step whose items would keep their answers (``effects.http.invoke.save``) in one file, or in a file
    outside the workspace: each item's answer is a file of its own (compared case-insensitively, as some file
    systems compare names).

    :raises InvalidInput: naming the two items and the file, or the item and its path.
    """
    save = effects.http.invoke.save if effects.http is not None else None
    if save is None:
        return
    values = values_for([save.path])
    seen: Dict[str, int] = {}
    for index, item in enumerate(items):
        path = expand([save.path], dict(values(item, index, records[index] if records is not None else None),
                                         key=keys[index], run_id=run_id))[0]
        problem = item_problem(path)
        if problem:
            raise InvalidInput(f"item {item[:60]!r} of step {step!r} would keep its answer in {path[:120]!r}, which "
                               f"{problem}: effects.http.invoke.save.path keeps answers inside the workspace")
        folded = path.casefold()
        if folded in seen:
            raise InvalidInput(f"items {items[seen[folded]][:60]!r} and {item[:60]!r} of step {step!r} would keep "
                               f"their answers in one file {path[:120]!r}: effects.http.invoke.save.path must tell "
                               "items apart")
        seen[folded] = index


def _check_records(spec: StepSpec, effects: EffectsSpec, step: str, items: List[str],
                   records: List[Dict[str, Any]]) -> None:
    """Refuse records that cannot fill every field the step's templates and the effects section name.

    So a record missing a field, or a path into a value that is not an object,
    stops ``step start`` with nothing recorded, never an item halfway through
    ``drive``; a field of the key must be text or a number, and a header
    value made from fields must be one HTTP can carry.

    :raises InvalidInput: naming the item (``FILE:LINE`` or its path), the field and why.
    """
    names = spec.fields
    in_key = [n for n in placeholders_in(cast(str, spec.key)) if is_field(n)]
    headers = _field_headers(effects)
    for index, (item, record) in enumerate(zip(items, records)):
        what = f"item {index} ({item[:60]!r}) of step {step!r}"
        values = field_values(record, names, what)
        for name in in_key:
            value = field_value(record, name, what)
            if value is None or isinstance(value, (dict, list)):
                raise InvalidInput(f"{what}: {{{name}}} in the key is {kind_of(value)}; a key is made of text and "
                                   "numbers")
        for header, template, unsendable in headers:
            problem = unsendable(expand([template], values)[0])
            if problem:
                raise InvalidInput(f"{what}: the header {header} would hold {problem} from the record's fields, "
                                   "which an HTTP header cannot carry")


def _field_headers(effects: EffectsSpec) -> List[Tuple[str, str, Callable[[str], Optional[str]]]]:
    """The HTTP headers whose values name a field: name, value without secrets, and the test of what HTTP carries."""
    http = effects.http
    if http is None:
        return []
    found = []
    for request in (http.invoke, http.observe):
        for name, value in request.headers if request is not None else ():
            if any(is_field(n) for n in placeholders_in(value)):
                found.append((name, value))
    if not found:
        return []
    from ..contract.http import SECRET, unsendable  # here: only a header made from fields needs the HTTP checks

    return [(name, SECRET.sub("", value), unsendable) for name, value in found]


def freeze_ops(state: Dict[str, Any], step: str, frozen: Optional[Dict[str, Any]], now: float) -> Ops:
    """Ops that keep the step's frozen facts across the start that ``start_ops`` just recorded.

    A list frozen anew (the first start, or the first after a migration) is
    checked against the ledger first (:func:`_check_bindings`); skips move with
    their items, and the keys the ledger holds for items the new list no longer
    names are kept with those items (``unlisted``), so a later list is checked
    against them too.

    :raises InvalidInput: the new list would give a key the ledger holds to another item, or a new key to an
        item whose effect may exist at the target; nothing is recorded.
    """
    if frozen is None:
        return []
    record = state["steps"].get(step) or {}
    ops: Ops = [["set", ["steps", step, "workspace"], record.get("workspace") or frozen["workspace"]]]
    old = record.get("batch")
    if old and old.get("plan_digest") == state["plan_digest"]:
        batch = old  # frozen under this plan already: a new attempt keeps the list it had
    elif "batch" in frozen and frozen["batch"]["plan_digest"] == state["plan_digest"]:
        new = frozen["batch"]
        keys, index_of = keys_of(new)
        key_of_item = dict(zip(new["items"], keys))
        before = bindings(old) if old else {}
        _check_bindings(state["effects"], step, before, new, key_of_item, old["key"] if old else None)
        unlisted = {k: item for k, item in before.items() if k in state["effects"] and k not in index_of}
        skipped = {}
        for key, skip in ((old or {}).get("skipped") or {}).items():
            moved = key_of_item.get(before.get(key, ""))
            if moved is not None:
                skipped[moved] = dict(skip, index=index_of[moved])  # a skip is about its item, whatever its key now
        batch = dict(new, frozen_at=format_time(now), skipped=skipped)
        if unlisted:
            batch["unlisted"] = unlisted
    elif "batch" in frozen or old:
        raise InvalidInput(f"the plan of step {step!r} changed while it was starting; start it again")
    else:
        return ops
    ops.append(["set", ["steps", step, "batch"], batch])
    return ops


#: Effect states whose call may have created something at the target. An item with such an effect keeps its key.
MAY_EXIST = ("verified",) + tuple(UNRESOLVED)


def bindings(batch: Dict[str, Any]) -> Dict[str, str]:
    """Key -> item of a frozen batch: its listed items, and the items no longer listed whose keys the ledger holds."""
    keys = keys_of(batch)[0]
    out = dict(batch.get("unlisted") or {})
    out.update(zip(keys, batch["items"]))
    return out


def _check_bindings(effects: Dict[str, Any], step: str, before: Dict[str, str], new: Dict[str, Any],
                    key_of_item: Dict[str, str], old_template: Optional[str]) -> None:
    """Refuse a new list that moves a key the ledger holds, or an item whose effect may exist, away from its partner.

    Two rules, one pass each over the new list and the old bindings (O(items)):

    * a key of the new list that the ledger holds (in any state) names the
      item it named before (``before``); a held key no item of this step
      ever had (begun by hand, or by another step) is refused too;
    * an item whose effect under its old key is verified or unresolved keeps
      that key, so it is never sent again under a new one (a changed key
      template is refused while such effects exist; absent and failed effects
      created nothing and do not hold their item back).

    Items are the same when their strings are: the path in the workspace,
    which the key is made from. A file whose content changed is the same item.

    :param effects: the ledger. :param before: key -> item before (:func:`bindings` of the old batch).
    :param key_of_item: item -> key of the new list.
    :raises InvalidInput: one line naming the key and both items, and what to do instead.
    """
    for item, key in key_of_item.items():
        effect = effects.get(key)
        if effect is None:
            continue
        held = before.get(key)
        if held == item:
            continue
        begun = f"in step {effect['step']!r}" if effect.get("step") else "outside any step"
        was = f"of item {held[:60]!r}" if held is not None else f"begun {begun}, by no item of step {step!r}"
        raise InvalidInput(f"step {step!r}: the key {key!r} holds an effect ({effect.get('state')}) {was}; the new "
                           f"list would give it to item {item[:60]!r}, which would be taken as done or refused. A key "
                           "the ledger holds stays with its item: keep the keyed items where they were (with {index} "
                           "keys, add new items after them, e.g. at the end of an item file), put new items in a step "
                           "of their own, or migrate back to the plan the list was frozen under", key=key)
    moved = [(key, item) for key, item in before.items()
             if key_of_item.get(item, key) != key and (effects.get(key) or {}).get("state") in MAY_EXIST]
    if not moved:
        return
    key, item = moved[0]
    first = (f"item {item[:60]!r} under {key!r} ({effects[key]['state']}) would get the key {key_of_item[item]!r} "
             "and be sent again")
    if old_template is not None and old_template != new["key"]:
        raise InvalidInput(f"step {step!r}: the key template changed from {old_template!r} to {new['key']!r} while "
                           f"{len(moved)} effect(s) of the old keys may exist at the target ({first}); keep the old "
                           "key template: it may change only while no effect of its keys is verified or unresolved",
                           key=key)
    raise InvalidInput(f"step {step!r}: {first}; an item whose effect may exist keeps its key: keep it where it was in "
                       "the list", key=key)


_KEY_CACHE: Dict[Tuple[str, str], Tuple[List[str], Dict[str, int]]] = {}


def _remember_keys(batch: Dict[str, Any], keys: List[str], index_of: Dict[str, int]) -> None:
    """Seed :func:`keys_of`'s cache with keys just made for ``batch``, so the start does not make them twice."""
    if len(_KEY_CACHE) > 8:
        _KEY_CACHE.clear()
    _KEY_CACHE[(batch["digest"], batch["key"])] = (keys, index_of)


def keys_of(batch: Dict[str, Any]) -> Tuple[List[str], Dict[str, int]]:
    """The keys of a frozen batch, in item order, and key -> index; cached by the frozen digest."""
    cache_key = (batch["digest"], batch["key"])
    found = _KEY_CACHE.get(cache_key)
    if found is None:
        keys = item_keys(batch["key"], batch["items"], batch.get("records"))
        found = (keys, {k: i for i, k in enumerate(keys)})
        _remember_keys(batch, *found)
    return found


def owner_of(state: Dict[str, Any], key: str) -> Optional[Tuple[str, int]]:
    """``(step, index)`` of the frozen batch item whose key is ``key``, or None."""
    for spec in contract_of(state).steps:
        batch = (state["steps"].get(spec.id) or {}).get("batch")
        if batch:
            index = keys_of(batch)[1].get(key)
            if index is not None:
                return spec.id, index
    return None


# -- progress and the next item ----------------------------------------------------------------

def progress(state: Dict[str, Any], step: str) -> Optional[Dict[str, Any]]:
    """Items done of total for a frozen batch step (None for other steps). O(items)."""
    batch = (state["steps"].get(step) or {}).get("batch")
    if not batch:
        return None
    keys = keys_of(batch)[0]
    effects, skipped = state["effects"], batch.get("skipped", {})
    verified = unresolved = failed = 0
    for key in keys:
        current = (effects.get(key) or {}).get("state")
        if current == "verified":
            verified += 1
        elif current in UNRESOLVED:
            unresolved += 1
        elif current == "failed" and key not in skipped:
            failed += 1
    return {"step": step, "total": len(keys), "verified": verified, "skipped": len(skipped), "unresolved": unresolved,
            "failed": failed, "remaining": len(keys) - verified - len(skipped), "digest": batch["digest"]}


def next_item(state: Dict[str, Any], step: str, start: int = 0) -> Optional[int]:
    """Index of the first item at or after ``start`` that is neither verified nor skipped."""
    batch = state["steps"][step]["batch"]
    keys = keys_of(batch)[0]
    effects, skipped = state["effects"], batch.get("skipped", {})
    for index in range(start, len(keys)):
        key = keys[index]
        if key not in skipped and (effects.get(key) or {}).get("state") != "verified":
            return index
    return None


def next_action(state: Dict[str, Any], step: str) -> Optional[Dict[str, Any]]:
    """``next``'s action for a running batch step: the next item's effect, or finishing the step."""
    batch = (state["steps"].get(step) or {}).get("batch")
    if not batch:
        return None
    index = next_item(state, step)
    if index is None:
        return {"kind": "finish-step", "step": step, "observed": True, "items": batch["count"]}
    keys = keys_of(batch)[0]
    info = progress(state, step) or {}
    key = keys[index]
    current = (state["effects"].get(key) or {}).get("state")
    action = {"kind": "effect", "step": step, "item": batch["items"][index], "key": key, "index": index,
              "remaining": info.get("remaining"), "total": batch["count"]}
    if current is not None:
        action["state"] = current
    return action


def item_context(state: Dict[str, Any], key: str) -> Dict[str, Any]:
    """For ``next``: the batch item an effect key belongs to (its step, item and index); {} for other keys."""
    found = owner_of(state, key)
    if found is None:
        return {}
    step, index = found
    return {"step": step, "item": state["steps"][step]["batch"]["items"][index], "index": index}


def item_values_of(state: Dict[str, Any], step: str, index: int) -> Dict[str, Any]:
    """The placeholders item ``index`` of the frozen batch of ``step`` fills: ``item``, ``stem``, ``slug``,
    ``index`` and, for a record, the text of every field its step's templates and the effects section name.

    :raises InvalidInput: the record lacks a field a template names (its step was frozen under another plan).
    """
    batch = state["steps"][step]["batch"]
    item, records = batch["items"][index], batch.get("records")
    if records is None:
        return item_values(item, index)
    names = cast(StepSpec, contract_of(state).step(step)).fields  # a step whose items were frozen
    return item_values(item, index, records[index], names)


def items_changed(state: Dict[str, Any], step: str) -> Optional[Dict[str, Any]]:
    """An observation when the step's source now lists other items than the frozen ones, else None."""
    spec = contract_of(state).step(step)
    record = state["steps"].get(step) or {}
    batch = record.get("batch")
    if spec is None or not batch or spec.items is None or spec.items.inline is not None:
        return None
    try:
        now_items, source, now_records = list_items(spec, record["workspace"], "records" in batch)
        digest = _digest(now_items, now_records, step)
    except InvalidInput as exc:
        return {"source": f"items of step {step}", "what": f"cannot be listed again: {exc.message}", "digest": None}
    if digest == batch["digest"]:
        return None
    frozen = set(batch["items"])
    added = [i for i in now_items if i not in frozen]
    listed = set(now_items)
    removed = [i for i in batch["items"] if i not in listed]
    changes = f"{len(added)} added, {len(removed)} removed"
    out = {"source": f"items of step {step} ({source})", "digest": digest, "frozen_digest": batch["digest"],
           "added": len(added), "removed": len(removed)}
    if now_records is not None:
        was = dict(zip(batch["items"], batch["records"]))
        out["changed"] = sum(1 for item, now in zip(now_items, now_records) if item in was and was[item] != now)
        changes += f", {out['changed']} with another record"
    out["what"] = (f"the source now lists {len(now_items)} items ({changes}) "
                   f"where {batch['count']} were frozen at start; "
                   "the frozen list is used; to use the new one, record a plan change with "
                   "`migrate --contract FILE --reason TEXT` and start the step again")
    return out


def skip_ops(state: Dict[str, Any], key: str, reason: str, now: float) -> Ops:
    """Record an explicit skip of one batch item, with its reason; it then counts as settled."""
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 2000:
        raise InvalidInput("a skip needs --reason: a non-empty line of at most 2,000 characters")
    found = owner_of(state, key)
    if found is None:
        raise InvalidInput(f"{key!r} is not the key of an item of a started batch step")
    step, index = found
    batch = state["steps"][step]["batch"]
    if key in batch.get("skipped", {}):
        return []
    effect = state["effects"].get(key) or {}
    if effect.get("state") == "verified":
        raise InvalidInput(f"effect {key!r} is verified; a done item is not skipped")
    if effect.get("state") in UNRESOLVED:
        raise NeedsReconciliation(f"effect {key!r} is {effect['state']}: observe it first; an item that may have "
                                  "happened is not skipped", key=key)
    return [["set", ["steps", step, "batch", "skipped", key],
             {"index": index, "reason": reason, "at": format_time(now)}]]


def batch_of(state: Dict[str, Any], step: str) -> Dict[str, Any]:
    """The frozen batch of ``step``.

    :raises InvalidInput: no step ``step`` in the plan, it is no batch step, or it has not been started.
    """
    spec = contract_of(state).step(step)
    if spec is None:
        steps = ", ".join(s.id for s in contract_of(state).steps)
        raise InvalidInput(f"no step {step!r} in the plan (its steps: {steps})", step=step)
    batch = (state["steps"].get(step) or {}).get("batch")
    if batch:
        return cast(Dict[str, Any], batch)
    if not spec.is_batch:
        raise InvalidInput(f"step {step!r} is not a batch step: it has no items", step=step)
    raise InvalidInput(f"step {step!r} has no frozen items: start it first", step=step)


def item_state(state: Dict[str, Any], batch: Dict[str, Any], key: str) -> str:
    """One item's state (one of :data:`ITEM_STATES`): skipped, else its effect's state, else pending."""
    if key in batch.get("skipped", {}):
        return "skipped"
    return str((state["effects"].get(key) or {}).get("state") or "pending")


def skip_many_ops(state: Dict[str, Any], step: str, reason: str, now: float,
                  states: Optional[Tuple[str, ...]] = None) -> Ops:
    """Skip, in one transition, every item of ``step`` in one of ``states`` (None: every item neither verified
    nor skipped), with one reason; all or none.

    :raises InvalidInput: a bad step, state or reason, or no item to skip.
    :raises NeedsReconciliation: a chosen item's effect is unresolved (a call may be in flight, or its outcome is
        not known): nothing is skipped, and the context names each such item.
    """
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 2000:
        raise InvalidInput("a skip needs --reason: a non-empty line of at most 2,000 characters")
    batch = batch_of(state, step)
    for name in states or ():
        if name not in ITEM_STATES:
            raise InvalidInput(f"no item state {name!r} (one of: {', '.join(ITEM_STATES)})")
    wanted = states if states is not None else tuple(s for s in ITEM_STATES if s not in ("verified", "skipped"))
    if "verified" in wanted:
        raise InvalidInput(f"step {step!r}: a verified item is done; it is not skipped")
    chosen = [(index, key, now_in) for index, key in enumerate(keys_of(batch)[0])
              for now_in in (item_state(state, batch, key),) if now_in in wanted and now_in != "skipped"]
    # A started, acknowledged or uncertain effect may have happened, and only such an effect can have a call in
    # flight: a call is made once its effect is started, and an effect is recorded absent or failed only from that
    # call's own answer or once no call of it is alive.
    held = [key for _, key, now_in in chosen if now_in in UNRESOLVED]
    if held:
        shown = ", ".join(held[:10]) + (f" and {len(held) - 10} more" if len(held) > 10 else "")
        raise NeedsReconciliation(f"step {step!r}: nothing skipped; {len(held)} of the {len(chosen)} items chosen "
                                  f"may have happened (a call in flight or an unknown outcome): {shown}; observe them "
                                  "first", step=step, keys=held[:100])
    if not chosen:
        which = ", ".join(states) if states is not None else "neither verified nor skipped"
        raise InvalidInput(f"step {step!r} has no item to skip ({which})", step=step)
    stamp = format_time(now)
    return [["set", ["steps", step, "batch", "skipped", key], {"index": index, "reason": reason, "at": stamp}]
            for index, key, _ in chosen]


def check_complete(state: Dict[str, Any], step: str) -> None:
    """Raise unless every item of a batch ``step`` is verified or skipped."""
    if not (state["steps"].get(step) or {}).get("batch"):
        spec = contract_of(state).step(step)
        if spec is not None and spec.is_batch:
            raise InvalidInput(f"step {step!r} has no frozen items: start it first")
        return
    index = next_item(state, step)
    if index is None:
        return
    info = progress(state, step) or {}
    key = keys_of(state["steps"][step]["batch"])[0][index]
    raise InvalidInput(f"step {step!r} has {info.get('remaining')} of {info.get('total')} items not verified or "
                       f"skipped; next is {key}",
                       key=key, remaining=info.get("remaining"))
