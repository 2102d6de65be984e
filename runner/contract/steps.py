"""The checks of a contract's steps: a batch step's items, key and payload, and any step's checks, timeout and
artifacts (:func:`step_problems`), each problem one line that ``contract check`` places on the step's line."""

import re
from typing import Any, Dict, List, Optional, Sequence

from ..base.workspace import item_problem
from .templates import (CHECK_PLACEHOLDERS, KEY_PLACEHOLDERS, PAYLOAD_COMMAND_PLACEHOLDERS, PAYLOAD_PLACEHOLDERS,
                        placeholders_in, strings_in)

__all__ = ["step_problems"]


def _argv_problem(argv: Any, what: str, allowed: Sequence[str]) -> Optional[str]:
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
        return f"{what} must be a non-empty list of strings (a program and its arguments; no shell)"
    unknown = sorted({n for a in argv for n in placeholders_in(a) if n not in allowed})
    if unknown:
        return f"{what}: unknown placeholder {{{unknown[0]}}} (allowed: {', '.join('{' + n + '}' for n in allowed)})"
    return None


def _relative(path: Any) -> bool:
    return isinstance(path, str) and bool(path) and item_problem(path) is None


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
            else:
                for index, item in enumerate(items):
                    problem = item_problem(item)
                    if problem:
                        out.append(f"item {index} {item[:80]!r} {problem}; items are paths inside the workspace")
                        break
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
                out.append(f"key: unknown placeholder {{{bad[0]}}} (allowed: {{item}}, {{stem}}, {{slug}}, {{index}}; nothing random)")
            elif not names:
                out.append("key must hold {item}, {stem}, {slug} or {index}, or every item would share one key")
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
                bad = sorted({n for s in strings_in(payload["template"]) for n in placeholders_in(s) if n not in PAYLOAD_PLACEHOLDERS})
                if bad:
                    out.append(f"payload template: unknown placeholder {{{bad[0]}}} (allowed: {', '.join('{' + n + '}' for n in PAYLOAD_PLACEHOLDERS)})")
        else:
            problem = _argv_problem(payload["command"], "payload command", PAYLOAD_COMMAND_PLACEHOLDERS)
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
