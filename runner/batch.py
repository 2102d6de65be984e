"""Batch steps: a step over a list of items, one effect per item, the list frozen at start.

A contract step may declare ``items``: an inline list, ``{"glob": PATTERN}``
relative to the contract's ``workspace`` (default ``.``), or ``{"file":
PATH}`` holding one item per line; and ``key``, the effect key template of
one item, built from ``{item}``, ``{stem}`` (the item's file name without its
extension) and ``{index}`` (its place in the list, ``{index:05d}`` padded),
and nothing random. ``payload`` says what each item's effect sends:
``{"template": {...}}`` (strings may hold ``{item}``, ``{stem}``, ``{index}``,
``{key}``, ``{first_line}`` and ``{sha256}`` of the item's file) or
``{"command": [ARGV]}`` whose stdout is the payload as a JSON object.

Invariants kept here:

* ``step start`` freezes the item list into the run with its digest and the
  absolute workspace root; every later decision uses the frozen list. A
  later change in what the source lists is reported (:func:`items_changed`)
  and never used; a migration to another plan refreezes at the next start.
* Two items never share a key: a list that would is refused at start.
* A batch step is done only when every item's effect is verified or skipped
  with a recorded reason (:func:`check_complete`).

Per-item lookups (key to index) are cached by the frozen digest, so the
loop over 20,000 items does not rebuild them for each item.
"""

import glob
import hashlib
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .commands import PLACEHOLDERS, expand, placeholders_in, run_command
from .lifecycle import UNRESOLVED
from .envelope import MAX_DOCUMENT_BYTES, content_digest, format_time, validate_id
from .errors import InvalidInput, NeedsReconciliation

__all__ = [
    "KEY_PLACEHOLDERS",
    "PAYLOAD_PLACEHOLDERS",
    "step_problems",
    "effects_problems",
    "is_batch",
    "observes_itself",
    "workspace_root",
    "list_items",
    "freeze",
    "freeze_ops",
    "keys_of",
    "owner_of",
    "item_values",
    "item_payload",
    "progress",
    "next_item",
    "next_action",
    "item_context",
    "items_changed",
    "skip_ops",
    "check_complete",
]

KEY_PLACEHOLDERS = ("item", "stem", "index")
PAYLOAD_PLACEHOLDERS = ("item", "stem", "index", "key", "first_line", "sha256")
CHECK_PLACEHOLDERS = ("workspace", "run_id")
MAX_ITEMS = 100000

Ops = List[List[Any]]


# -- the contract's fields ---------------------------------------------------------------

def _argv_problem(argv: Any, what: str, allowed: Sequence[str]) -> Optional[str]:
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
        return f"{what} must be a non-empty list of strings (a program and its arguments; no shell)"
    unknown = sorted({n for a in argv for n in placeholders_in(a) if n not in allowed})
    if unknown:
        return f"{what}: unknown placeholder {{{unknown[0]}}} (allowed: {', '.join('{' + n + '}' for n in allowed)})"
    return None


def _relative(path: Any) -> bool:
    return isinstance(path, str) and bool(path) and not os.path.isabs(path) and ".." not in path.replace("\\", "/").split("/")


def step_problems(step: Dict[str, Any]) -> List[str]:
    """Every problem with a step's batch, check and artifact fields (empty when fine)."""
    out: List[str] = []
    items = step.get("items")
    if "items" in step:
        if isinstance(items, list):
            if not items or not all(isinstance(i, str) and i for i in items):
                out.append("items must be a non-empty list of non-empty strings, {\"glob\": PATTERN} or {\"file\": PATH}")
            elif len(set(items)) != len(items):
                out.append("items repeat an item")
        elif isinstance(items, dict):
            if len(items) != 1 or next(iter(items)) not in ("glob", "file") or not _relative(next(iter(items.values()))):
                out.append("items must be {\"glob\": PATTERN} or {\"file\": PATH}, relative to the workspace and without '..'")
        else:
            out.append("items must be a list, {\"glob\": PATTERN} or {\"file\": PATH}")
        key = step.get("key")
        if not isinstance(key, str):
            out.append("a step with items needs \"key\": the effect key template, e.g. \"doc-{stem}:ticket\"")
        else:
            names = placeholders_in(key)
            bad = [n for n in names if n not in KEY_PLACEHOLDERS]
            if bad:
                out.append(f"key: unknown placeholder {{{bad[0]}}} (allowed: {{item}}, {{stem}}, {{index}}; nothing random)")
            elif not names:
                out.append("key must hold {item}, {stem} or {index}, or every item would share one key")
    elif "key" in step or "payload" in step:
        out.append("\"key\" and \"payload\" belong to a step with \"items\"")
    payload = step.get("payload")
    if payload is not None:
        if not isinstance(payload, dict) or len(payload) != 1 or next(iter(payload)) not in ("template", "command"):
            out.append("payload must be {\"template\": {...}} or {\"command\": [ARGV]}")
        elif "template" in payload:
            if not isinstance(payload["template"], dict):
                out.append("payload template must be a JSON object")
            else:
                bad = sorted({n for s in _strings(payload["template"]) for n in placeholders_in(s) if n not in PAYLOAD_PLACEHOLDERS})
                if bad:
                    out.append(f"payload template: unknown placeholder {{{bad[0]}}} (allowed: {', '.join('{' + n + '}' for n in PAYLOAD_PLACEHOLDERS)})")
        else:
            problem = _argv_problem(payload["command"], "payload command", PAYLOAD_PLACEHOLDERS + ("workspace", "run_id"))
            if problem:
                out.append(problem)
    checks = step.get("checks")
    if checks is not None:
        if not isinstance(checks, dict) or not checks:
            out.append("checks must be an object naming each check's command: {\"tests\": [\"python3\", \"-m\", \"unittest\"]}")
        else:
            for name, argv in checks.items():
                if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
                    out.append(f"check name {name!r} may hold only letters, digits and . _ -")
                problem = _argv_problem(argv, f"check {name!r}", CHECK_PLACEHOLDERS)
                if problem:
                    out.append(problem)
    timeout = step.get("timeout_seconds")
    if "timeout_seconds" in step and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400):
        out.append("timeout_seconds (of the step's checks) must be a positive number of seconds, at most a day")
    artifacts = step.get("artifacts")
    if artifacts is not None and (not isinstance(artifacts, list) or not artifacts or not all(_relative(a) for a in artifacts)):
        out.append("artifacts must list paths relative to the workspace, without '..'")
    return out


def effects_problems(effects: Dict[str, Any]) -> List[str]:
    """Problems with the effects section's ``invoke``, ``observe`` and ``timeout_seconds``."""
    out: List[str] = []
    for name in ("invoke", "observe"):
        if name in effects:
            problem = _argv_problem(effects[name], f"effects: {name}", PLACEHOLDERS)
            if problem:
                out.append(problem)
    if ("invoke" in effects) != ("observe" in effects):
        out.append("effects: invoke and observe come together: an effect the runner performs must be one it can observe")
    timeout = effects.get("timeout_seconds")
    if "timeout_seconds" in effects and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400):
        out.append("effects: timeout_seconds must be a positive number of seconds (at most a day)")
    return out


def _strings(value: Any) -> List[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


# -- resolving and freezing ------------------------------------------------------------------

def is_batch(spec: Dict[str, Any]) -> bool:
    return "items" in spec


def observes_itself(spec: Dict[str, Any]) -> bool:
    """True when the runner can establish the step's completion alone (no claimed evidence needed)."""
    return (is_batch(spec) or bool(spec.get("checks")) or bool(spec.get("artifacts"))) and not spec.get("evidence") and not spec.get("approval")


def workspace_root(plan: Dict[str, Any], cwd: Optional[str] = None) -> str:
    """The absolute workspace: the contract's ``workspace`` against ``cwd`` (default: the current folder)."""
    return os.path.abspath(os.path.join(cwd or os.getcwd(), plan.get("workspace", ".")))


def list_items(spec: Dict[str, Any], root: str) -> Tuple[List[str], Dict[str, Any]]:
    """The items the step's source lists now, in a stable order, and the source."""
    items = spec["items"]
    if isinstance(items, list):
        return list(items), {"inline": len(items)}
    if "glob" in items:
        pattern = items["glob"]
        found = glob.glob(os.path.join(glob.escape(root), pattern), recursive=True)
        listed = sorted(os.path.relpath(p, root) for p in found if os.path.isfile(p))
        return listed, {"glob": pattern}
    path = os.path.join(root, items["file"])
    try:
        with open(path, "rb") as handle:
            data = handle.read(64 * 1024 * 1024)
    except OSError as exc:
        raise InvalidInput(f"cannot read the item file {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"the item file {path} is not UTF-8") from None
    return [line.rstrip("\r") for line in text.split("\n") if line.rstrip("\r")], {"file": items["file"]}


def freeze(state: Dict[str, Any], step: str, cwd: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """What ``step start`` freezes for ``step`` (outside any lock; reads the file system), or None.

    A step that was frozen under the run's present plan keeps its frozen
    list; only the workspace root is returned for it.
    """
    spec = next((s for s in state["plan"].get("steps", []) if s.get("id") == step), None)
    if spec is None or not (is_batch(spec) or spec.get("checks") or spec.get("artifacts")):
        return None
    record = state["steps"].get(step) or {}
    old = record.get("batch")
    if old and old.get("plan_digest") == state["plan_digest"]:
        return {"workspace": record.get("workspace") or workspace_root(state["plan"], cwd)}
    root = workspace_root(state["plan"], cwd)
    frozen: Dict[str, Any] = {"workspace": root}
    if is_batch(spec):
        items, source = list_items(spec, root)
        if not items:
            raise InvalidInput(f"step {step!r} lists no items ({source}) under {root}")
        if len(items) > MAX_ITEMS:
            raise InvalidInput(f"step {step!r} lists {len(items)} items; the limit is {MAX_ITEMS}")
        keys = _keys(spec["key"], items)
        seen: Dict[str, int] = {}
        pattern = state["plan"].get("effects", {}).get("key_pattern")
        for index, key in enumerate(keys):
            validate_id(key, f"the key of item {index} ({items[index][:60]!r})")
            if pattern is not None and re.fullmatch(pattern, key) is None:
                raise InvalidInput(f"the key {key!r} of item {index} does not match the contract's key_pattern {pattern!r}")
            if key in seen:
                raise InvalidInput(f"items {items[seen[key]][:60]!r} and {items[index][:60]!r} give the same key {key!r}: "
                                   "the key template must tell items apart")
            seen[key] = index
        frozen["batch"] = {"items": items, "digest": content_digest(items), "count": len(items), "source": source,
                           "key": spec["key"], "plan_digest": state["plan_digest"], "skipped": {}}
    return frozen


def freeze_ops(state: Dict[str, Any], step: str, frozen: Optional[Dict[str, Any]], now: float) -> Ops:
    """Ops that keep the step's frozen facts across the start that ``start_ops`` just recorded."""
    if frozen is None:
        return []
    record = state["steps"].get(step) or {}
    ops: Ops = [["set", ["steps", step, "workspace"], record.get("workspace") or frozen["workspace"]]]
    old = record.get("batch")
    if old and old.get("plan_digest") == state["plan_digest"]:
        batch = old  # frozen under this plan already: a new attempt keeps the list it had
    elif "batch" in frozen and frozen["batch"]["plan_digest"] == state["plan_digest"]:
        # Frozen anew (first start, or after a migration): skips of items still listed stay recorded.
        keys = set(keys_of(frozen["batch"])[0])
        kept = {k: v for k, v in ((old or {}).get("skipped") or {}).items() if k in keys}
        batch = dict(frozen["batch"], frozen_at=format_time(now), skipped=kept)
    elif "batch" in frozen or old:
        raise InvalidInput(f"the plan of step {step!r} changed while it was starting; start it again")
    else:
        return ops
    ops.append(["set", ["steps", step, "batch"], batch])
    return ops


_KEY_CACHE: Dict[Tuple[str, str], Tuple[List[str], Dict[str, int]]] = {}


def _stem(item: str) -> str:
    base = os.path.basename(item.rstrip("/")) or item
    stem, _ = os.path.splitext(base)
    return stem or base


def item_values(item: str, index: int) -> Dict[str, Any]:
    return {"item": item, "stem": _stem(item), "index": index}


def _keys(template: str, items: Sequence[str]) -> List[str]:
    return [expand([template], item_values(item, i))[0] for i, item in enumerate(items)]


def keys_of(batch: Dict[str, Any]) -> Tuple[List[str], Dict[str, int]]:
    """The keys of a frozen batch, in item order, and key -> index; cached by the frozen digest."""
    cache_key = (batch["digest"], batch["key"])
    found = _KEY_CACHE.get(cache_key)
    if found is None:
        keys = _keys(batch["key"], batch["items"])
        found = (keys, {k: i for i, k in enumerate(keys)})
        if len(_KEY_CACHE) > 8:
            _KEY_CACHE.clear()
        _KEY_CACHE[cache_key] = found
    return found


def owner_of(state: Dict[str, Any], key: str) -> Optional[Tuple[str, int]]:
    """``(step, index)`` of the frozen batch item whose key is ``key``, or None."""
    for spec in state["plan"].get("steps", []):
        batch = (state["steps"].get(spec["id"]) or {}).get("batch")
        if batch:
            index = keys_of(batch)[1].get(key)
            if index is not None:
                return spec["id"], index
    return None


def item_payload(state: Dict[str, Any], step: str, index: int) -> Dict[str, Any]:
    """The payload of item ``index`` of ``step``: from its template or command; the same on every rerun."""
    spec = next(s for s in state["plan"]["steps"] if s["id"] == step)
    record = state["steps"][step]
    batch, root = record["batch"], record["workspace"]
    item = batch["items"][index]
    key = keys_of(batch)[0][index]
    values: Dict[str, Any] = dict(item_values(item, index), key=key)
    how = spec.get("payload") or {"template": {"item": "{item}", "key": "{key}"}}
    if "command" in how:
        outcome = run_command(expand(how["command"], dict(values, workspace=root, run_id=state["task_id"])), cwd=root)
        payload = outcome.json_object()
        if outcome.exit_code != 0 or payload is None:
            raise InvalidInput(f"the payload command for {key} did not print a JSON object (exit {outcome.exit_code}): {outcome.tail()}")
        return payload
    template = how["template"]
    wanted = {n for s in _strings(template) for n in placeholders_in(s)}
    if wanted & {"first_line", "sha256"}:
        path = os.path.join(root, item)
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as handle:
                head = handle.read(1 << 20)
                digest.update(head)
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        except OSError as exc:
            raise InvalidInput(f"item {item[:80]!r} of step {step!r}: cannot read {path}: {exc.strerror or exc}") from None
        values["first_line"] = head.split(b"\n", 1)[0][:MAX_DOCUMENT_BYTES // 4].decode("utf-8", "replace").rstrip("\r")
        values["sha256"] = digest.hexdigest()
    return _fill(template, values)


def _fill(value: Any, values: Dict[str, Any]) -> Any:
    if isinstance(value, str):
        return expand([value], values)[0]
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, values) for v in value]
    return value


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
    return {"step": step, "total": len(keys), "verified": verified, "skipped": len(skipped), "unresolved": unresolved, "failed": failed,
            "remaining": len(keys) - verified - len(skipped), "digest": batch["digest"]}


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
        return {"kind": "finish-step", "step": step, "observed": True, "items": batch["count"],
                "why": f"every item of {step} is verified or skipped: 'step done {step}' (the runner observes the evidence)"}
    keys = keys_of(batch)[0]
    info = progress(state, step) or {}
    key = keys[index]
    current = (state["effects"].get(key) or {}).get("state")
    commands = "invoke" in state["plan"].get("effects", {})
    how = f"'effect run {key}'" if commands else f"'effect begin {key} --payload FILE', the call, 'effect ack', 'effect verify'"
    action = {"kind": "effect", "step": step, "item": batch["items"][index], "key": key, "index": index, "remaining": info.get("remaining"),
              "total": batch["count"], "why": f"perform item {index} of {step}: {how}"}
    if current is not None:
        action["state"] = current
    if current == "failed":
        reason = (state["effects"][key].get("reason") or "")[:200]
        action["why"] = f"item {index} of {step} failed for good ({reason}): decide whether to 'effect skip {key} --reason TEXT'"
    return action


def item_context(state: Dict[str, Any], key: str) -> Dict[str, Any]:
    """For ``next``: the batch item an effect key belongs to, and how the runner settles it; {} for other keys."""
    found = owner_of(state, key)
    if found is None:
        return {}
    step, index = found
    out: Dict[str, Any] = {"step": step, "item": state["steps"][step]["batch"]["items"][index], "index": index}
    if "observe" in state["plan"].get("effects", {}):
        out["why"] = (f"'effect run {key}' (or 'drive') observes the target first and records what it sees; "
                      "it calls the target again only after an observed absence")
    return out


def items_changed(state: Dict[str, Any], step: str) -> Optional[Dict[str, Any]]:
    """An observation when the step's source now lists other items than the frozen ones, else None."""
    spec = next((s for s in state["plan"].get("steps", []) if s.get("id") == step), None)
    record = state["steps"].get(step) or {}
    batch = record.get("batch")
    if spec is None or not batch or not is_batch(spec) or isinstance(spec["items"], list):
        return None
    try:
        now_items, source = list_items(spec, record["workspace"])
    except InvalidInput as exc:
        return {"source": f"items of step {step}", "what": f"cannot be listed again: {exc.message}", "digest": None}
    digest = content_digest(now_items)
    if digest == batch["digest"]:
        return None
    frozen = set(batch["items"])
    added = [i for i in now_items if i not in frozen]
    listed = set(now_items)
    removed = [i for i in batch["items"] if i not in listed]
    return {"source": f"items of step {step} ({source})", "digest": digest, "frozen_digest": batch["digest"], "added": len(added), "removed": len(removed),
            "what": f"the source now lists {len(now_items)} items ({len(added)} added, {len(removed)} removed) "
                    f"where {batch['count']} were frozen at start; "
                    "the frozen list is used; to use the new one, record a plan change with 'migrate' and start the step again"}


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
        raise NeedsReconciliation(f"effect {key!r} is {effect['state']}: observe it first; an item that may have happened is not skipped", key=key)
    return [["set", ["steps", step, "batch", "skipped", key], {"index": index, "reason": reason, "at": format_time(now)}]]


def check_complete(state: Dict[str, Any], step: str) -> None:
    """Raise unless every item of a batch ``step`` is verified or skipped."""
    if not (state["steps"].get(step) or {}).get("batch"):
        spec = next((s for s in state["plan"].get("steps", []) if s.get("id") == step), {})
        if is_batch(spec):
            raise InvalidInput(f"step {step!r} has no frozen items: start it first")
        return
    index = next_item(state, step)
    if index is None:
        return
    info = progress(state, step) or {}
    key = keys_of(state["steps"][step]["batch"])[0][index]
    raise InvalidInput(f"step {step!r} has {info.get('remaining')} of {info.get('total')} items not verified or skipped; next is {key}",
                       key=key, remaining=info.get("remaining"))
