"""The checks of a contract's steps: a batch step's items, key and payload, and any step's checks, timeout and
artifacts (:func:`step_problems`), each problem one line that ``contract check`` places on the step's line; and
the fields of records the effects section names (:func:`effects_field_problems`).

A ``{field.PATH}`` placeholder is checked as far as the contract alone
tells: its filters are known, the step's items are records (a ``.json``
glob, or a JSON Lines, CSV or lines file), a lines file's pattern compiles
and names the field as a group, and the key does not make a list. Whether a
record holds the field is checked by ``step start``.
"""

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..base.workspace import item_problem
from .templates import (CHECK_PLACEHOLDERS, FILE_PLACEHOLDERS, KEY_PLACEHOLDERS, PAYLOAD_COMMAND_PLACEHOLDERS,
                        PAYLOAD_PLACEHOLDERS, RECORD_FILES, effects_templates, field_problem, fields_of, is_field,
                        placeholders_in, reads_records, step_templates, strings_in)

__all__ = ["step_problems", "effects_field_problems", "ITEM_SOURCES", "MAX_PATTERN_CHARS"]

#: What an ``items`` object may name: one source, and a lines file's ``pattern``.
ITEM_SOURCES = ("glob", "file") + RECORD_FILES
#: The longest ``pattern`` of a lines file.
MAX_PATTERN_CHARS = 1000
_SOURCES_SHAPE = ('items must be {"glob": PATTERN}, {"file": PATH}, {"jsonl": PATH}, {"csv": PATH} or '
                  '{"lines": PATH, "pattern": REGEX}, relative to the workspace and without \'..\'')
_RECORDS = ('items that are records: {"glob": "*.json"}, {"jsonl": FILE}, {"csv": FILE} or '
            '{"lines": FILE, "pattern": REGEX}')


def _argv_problem(argv: Any, what: str, allowed: Sequence[str], fields: bool = False) -> Optional[str]:
    """Why ``argv`` is not a command whose placeholders are among ``allowed`` (and fields, with ``fields``), or None."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
        return f"{what} must be a non-empty list of strings (a program and its arguments; no shell)"
    unknown = sorted({n for a in argv for n in placeholders_in(a) if n not in allowed and not (fields and is_field(n))})
    if unknown:
        return f"{what}: unknown placeholder {{{unknown[0]}}} (allowed: {', '.join('{' + n + '}' for n in allowed)})"
    return None


def _relative(path: Any) -> bool:
    return isinstance(path, str) and bool(path) and item_problem(path) is None


def _pattern_problem(pattern: Any) -> Optional[str]:
    if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN_CHARS:
        return (f"items: pattern must be a regular expression of at most {MAX_PATTERN_CHARS} characters with named "
                'groups, e.g. "(?P<service>[^:]+): (?P<change>.*)"')
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        return f"items: pattern is not a regular expression: {exc}"
    if not compiled.groupindex:
        return "items: pattern names no group: write (?P<NAME>...) for each field a line holds"
    return None


def _source_problems(items: Dict[str, Any]) -> List[str]:
    """The problems of an ``items`` object: one source, relative, and a lines file's pattern."""
    kinds = [k for k in ITEM_SOURCES if k in items]
    extra = set(items) - set(ITEM_SOURCES) - ({"pattern"} if "lines" in items else set())
    if len(kinds) != 1 or extra or not _relative(items[kinds[0]]):
        return [_SOURCES_SHAPE]
    return [p for p in [_pattern_problem(items.get("pattern"))] if p] if kinds == ["lines"] else []


def _field_problems(step: Dict[str, Any], effects: Mapping[str, Any]) -> List[str]:
    """What the contract alone tells is wrong with the fields a batch step's items fill (see the module docstring)."""
    out = [p for p in {field_problem(n) for t in step_templates(step) for n in placeholders_in(t) if is_field(n)} if p]
    fields = fields_of(step, effects)
    items = step.get("items")
    if fields and not reads_records(step, effects):
        out.append(f"{{{fields[0]}}} is filled from an item's record, and needs {_RECORDS}")
    elif isinstance(items, dict) and "lines" in items and _pattern_problem(items.get("pattern")) is None:
        groups = sorted(re.compile(items["pattern"]).groupindex)
        for name in fields:
            path = name.split("|")[0].split(".")[1:]
            if path[0] not in groups:
                out.append(f"{{{name}}}: the pattern names no group {path[0]!r} (groups: {', '.join(groups)})")
            elif len(path) > 1:
                out.append(f"{{{name}}}: a line's field {path[0]!r} is text, which holds no field {path[1]!r}")
    if isinstance(items, dict) and any(kind in items for kind in RECORD_FILES):
        payload = step.get("payload")
        template = payload.get("template") if isinstance(payload, dict) else None
        read = sorted({n for t in strings_in(template) for n in placeholders_in(t) if n in FILE_PLACEHOLDERS})
        if read:
            out.append(f"payload template: {{{read[0]}}} reads the item's file, and these items are records of one "
                       "file: use {field.PATH}")
    key = step.get("key")
    in_key = placeholders_in(key) if isinstance(key, str) else []
    listed = [n for n in in_key if is_field(n) and "lines" in n.split("|")[1:]]
    if listed:
        out.append(f"key: {{{listed[0]}}} makes a list, and a key is text")
    return sorted(out)


def effects_field_problems(steps: Sequence[Any], effects: Mapping[str, Any]) -> List[str]:
    """The fields the effects section names: known filters, and a step with items to fill them (empty when fine)."""
    names = sorted({n for t in effects_templates(effects) for n in placeholders_in(t) if is_field(n)})
    out = [f"effects: {p}" for p in (field_problem(n) for n in names) if p]
    if names and not any(isinstance(step, dict) and "items" in step for step in steps):
        out.append(f"effects: {{{names[0]}}} is filled from an item's record, and no step has items")
    return out


def step_problems(step: Dict[str, Any], effects: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Every problem with a step's batch, check and artifact fields (empty when fine).

    :param effects: the contract's effects section, whose fields the step's items fill too.
    """
    out: List[str] = []
    items = step.get("items")
    if "items" in step:
        if isinstance(items, list):
            if not items or not all(isinstance(i, str) and i for i in items):
                out.append("items must be a non-empty list of non-empty strings, {\"glob\": PATTERN} or {\"file\": "
                           "PATH}")
            elif len(set(items)) != len(items):
                out.append("items repeat an item")
            else:
                for index, item in enumerate(items):
                    problem = item_problem(item)
                    if problem:
                        out.append(f"item {index} {item[:80]!r} {problem}; items are paths inside the workspace")
                        break
        elif isinstance(items, dict):
            out.extend(_source_problems(items))
        else:
            out.append("items must be a list, {\"glob\": PATTERN}, {\"file\": PATH}, {\"jsonl\": PATH}, "
                       "{\"csv\": PATH} or {\"lines\": PATH, \"pattern\": REGEX}")
        key = step.get("key")
        if not isinstance(key, str):
            out.append("a step with items needs \"key\": the effect key template, e.g. \"doc-{stem}:ticket\"")
        else:
            names = placeholders_in(key)
            bad = [n for n in names if n not in KEY_PLACEHOLDERS and not is_field(n)]
            if bad:
                out.append(f"key: unknown placeholder {{{bad[0]}}} (allowed: {{item}}, {{stem}}, {{slug}}, {{index}}; "
                           "nothing random)")
            elif not names:
                out.append("key must hold {item}, {stem}, {slug} or {index}, or every item would share one key")
        out.extend(_field_problems(step, effects or {}))
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
                bad = sorted({n for s in strings_in(payload["template"]) for n in placeholders_in(s)
                              if n not in PAYLOAD_PLACEHOLDERS and not is_field(n)})
                if bad:
                    out.append(f"payload template: unknown placeholder {{{bad[0]}}} (allowed: "
                               f"{', '.join('{' + n + '}' for n in PAYLOAD_PLACEHOLDERS)})")
        else:
            problem = _argv_problem(payload["command"], "payload command", PAYLOAD_COMMAND_PLACEHOLDERS, fields=True)
            if problem:
                out.append(problem)
    checks = step.get("checks")
    if checks is not None:
        if not isinstance(checks, dict) or not checks:
            out.append("checks must be an object naming each check's command: {\"tests\": [\"python3\", \"-m\", "
                       "\"unittest\"]}")
        else:
            for name, argv in checks.items():
                if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
                    out.append(f"check name {name!r} may hold only letters, digits and . _ -")
                problem = _argv_problem(argv, f"check {name!r}", CHECK_PLACEHOLDERS)
                if problem:
                    out.append(problem)
    timeout = step.get("timeout_seconds")
    if ("timeout_seconds" in step and
        (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400)):
        out.append("timeout_seconds (of the step's checks) must be a positive number of seconds, at most a day")
    artifacts = step.get("artifacts")
    if (artifacts is not None and
        (not isinstance(artifacts, list) or not artifacts or not all(_relative(a) for a in artifacts))):
        out.append("artifacts must list paths relative to the workspace, without '..'")
    return out
