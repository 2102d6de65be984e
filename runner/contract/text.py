"""The run contract: the one machine-readable block of a filled ``run-contract.md``.

A contract file is Markdown for people with exactly one fenced block whose
info string is ``json run-contract``. That block is the plan: ``init`` stores
it in the run, and its canonical digest is the run's plan digest, so any
change to it is a change of plan. :func:`check_contract` reports every
problem with the file's line number; :func:`load_contract` returns the block
or raises :class:`~runner.base.errors.InvalidInput` with the first problem.
"""

import json
import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..base.values import MAX_DURATION_SECONDS, check_duration, validate_id
from ..base.canonical import loads_strict, read_document
from .effects import cost_limit_problems, OBSERVE_NONE, effects_problems, flow_problems
from .lookups import shared_lookup
from .steps import effects_field_problems, step_problems
from ..base.errors import InvalidInput

__all__ = [
    "CONTRACT_VERSION", "ContractProblem", "check_contract", "load_contract", "parse_contract_text", "MAX_TTL_SECONDS",
]

CONTRACT_VERSION = 1

_FENCE = re.compile(r"^(```+|~~~+)\s*json\s+run-contract\s*$")

TOP_KEYS = {
    "contract": int,
    "task_id": str,
    "goal": str,
    "non_goals": list,
    "allowed_actions": list,
    "forbidden_actions": list,
    "completion_evidence": list,
    "steps": list,
    "effects": dict,
    "limits": dict,
    "retry": dict,
    "lease": dict,
    "jobs": dict,
    "history": dict,
    "workspace": str,
}
REQUIRED = ("contract", "task_id", "goal", "steps")
STEP_KEYS = {"id": str, "artifact": str, "check": str, "next": str, "approval": bool, "evidence": list,
             "items": object, "key": str, "payload": dict, "checks": dict, "artifacts": list, "timeout_seconds": object}
EFFECT_KEYS = {"key_pattern": str, "approval": list, "adapter": str, "verification": str, "max_attempts": int,
               "several_approvals": bool, "invoke": list, "observe": list, "http": dict, "timeout_seconds": object,
               "settle_seconds": object, "max_rate_limited": int,
               "concurrency": int, "rate": dict, "concurrency_key": dict, "observe_many": object, "git": dict,
               "cost": dict, "cost_estimate": dict, "observe_first": bool, "smtp": dict}
LIMIT_KEYS = ("max_step_attempts", "max_effect_attempts", "max_elapsed_seconds", "max_cost", "max_steps",
              "no_progress_seconds")
RETRY_KEYS = ("base_seconds", "cap_seconds", "deadline_seconds")
LEASE_KEYS = ("ttl_seconds",)
#: The bounds of a run's history folder (the file store's; a database keeps every journal row).
HISTORY_KEYS = ("keep_seconds", "keep_bytes")
#: The longest lease a contract or a caller may ask for (``lease.ttl_seconds``, ``--ttl``): a week.
MAX_TTL_SECONDS = 7 * 24 * 3600
#: The largest value of each field that is a duration; every other number only has to be positive (and finite).
DURATION_BOUNDS = {
    "max_elapsed_seconds": MAX_DURATION_SECONDS,
    "no_progress_seconds": MAX_DURATION_SECONDS,
    "base_seconds": MAX_DURATION_SECONDS,
    "cap_seconds": MAX_DURATION_SECONDS,
    "deadline_seconds": MAX_DURATION_SECONDS,
    "ttl_seconds": MAX_TTL_SECONDS,
    "keep_seconds": MAX_DURATION_SECONDS,
}
JOB_KEYS = {"rerun_vanished": bool}


class ContractProblem(NamedTuple):
    line: int
    message: str

    def format(self, filename: str) -> str:
        return f"{filename}:{self.line}: {self.message}"


def _locate(lines: List[str], first: int, needle: str, after: int = 0) -> int:
    """Line number (1-based, in the file) of the first block line at or after ``after`` holding ``needle``."""
    for index in range(max(after - first, 0), len(lines)):
        if needle in lines[index]:
            return first + index
    return first


#: Where a key of the block is: ``at(key, after=0)`` is the file line of the first block line at or after ``after``
#: that holds ``"key"`` (the block's first line when none does).
_At = Callable[..., int]


def parse_contract_text(text: str) -> Tuple[Optional[Dict[str, Any]], List[ContractProblem]]:
    """Find, parse and validate the contract block; return it (or None) and every problem."""
    block, lines, first, problems = _find_block(text)
    if block is None:
        return None, problems

    def at(key: str, after: int = 0) -> int:
        return _locate(lines, first, f'"{key}"', after)

    problems = _top_problems(block, first, at)
    steps, effects = block.get("steps"), block.get("effects")
    if isinstance(steps, list):
        problems.extend(_steps_problems(steps, lines, first, at, effects if isinstance(effects, dict) else {}))
    if isinstance(effects, dict):
        problems.extend(_effects_problems(effects, lines, first, at))
        problems.extend(ContractProblem(at("effects"), message)
                        for message in effects_field_problems(steps if isinstance(steps, list) else [], effects))
    problems.extend(_number_problems(block, at))
    if not problems and isinstance(steps, list) and isinstance(effects, dict):
        problems.extend(_shared_lookup_problem(block, steps, at))
        if "git" in effects:
            from .git import payload_problems  # here: only a contract with a git section needs it

            problems.extend(ContractProblem(at("git"), message) for message in payload_problems(block))
    problems.extend(_jobs_problems(block, at))
    return (block if not problems else None), sorted(problems)


def _find_block(text: str) -> Tuple[Optional[Dict[str, Any]], List[str], int, List[ContractProblem]]:
    """The contract block of a file's ``text``: its JSON object, its lines and the file line of its first line, with no
    problem; or None with the one problem that stops the reading (no block or a second one, a block never closed,
    invalid JSON, a value that is not an object)."""
    all_lines = text.splitlines()
    starts = [i for i, line in enumerate(all_lines) if _FENCE.match(line.strip())]
    if not starts:
        return None, [], 1, [ContractProblem(1, "no ```json run-contract block found")]
    if len(starts) > 1:
        return None, [], 1, [ContractProblem(starts[1] + 1, "a second ```json run-contract block; a contract has "
                                                            "exactly one")]
    start = starts[0]
    fence = _FENCE.match(all_lines[start].strip()).group(1)  # type: ignore[union-attr]
    end = next((i for i in range(start + 1, len(all_lines)) if all_lines[i].strip() == fence), None)
    if end is None:
        return None, [], 1, [ContractProblem(start + 1, "the run-contract block is never closed")]
    lines = all_lines[start + 1 : end]
    first = start + 2  # file line number of the block's first line
    try:
        block = loads_strict("\n".join(lines))
    except json.JSONDecodeError as exc:
        return None, lines, first, [ContractProblem(first + exc.lineno - 1, f"invalid JSON: {exc.msg} (column "
                                                                            f"{exc.colno})")]
    except ValueError as exc:
        out_of_range = re.search(r"number (\S+) is out of range", str(exc))
        at_number = _locate(lines, first, out_of_range.group(1)) if out_of_range else first
        return None, lines, first, [ContractProblem(at_number, f"invalid JSON: {exc}")]
    if not isinstance(block, dict):
        return None, lines, first, [ContractProblem(first, "the block must be a JSON object")]
    return block, lines, first, []


def _top_problems(block: Dict[str, Any], first: int, at: _At) -> List[ContractProblem]:
    """The top level: required and unknown fields and their types, the version, the task id, the goal, the lists."""
    problems: List[ContractProblem] = []
    for key in REQUIRED:
        if key not in block:
            problems.append(ContractProblem(first, f"missing required field {key!r}"))
    for key, value in block.items():
        kind = TOP_KEYS.get(key)
        if kind is None:
            problems.append(ContractProblem(at(key), f"unknown field {key!r} (allowed: {', '.join(sorted(TOP_KEYS))})"))
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            problems.append(ContractProblem(at(key), f"{key!r} must be {_kind(kind)}"))
    if block.get("contract") not in (None, CONTRACT_VERSION) and isinstance(block.get("contract"), int):
        problems.append(ContractProblem(
            at("contract"), f"contract version {block['contract']} is not supported (this runner reads "
                            f"{CONTRACT_VERSION})"))
    if isinstance(block.get("task_id"), str):
        try:
            validate_id(block["task_id"], "task_id")
        except InvalidInput as exc:
            problems.append(ContractProblem(at("task_id"), exc.message))
    if isinstance(block.get("goal"), str) and not block["goal"].strip():
        problems.append(ContractProblem(at("goal"), "goal must not be empty"))
    for key in ("non_goals", "allowed_actions", "forbidden_actions", "completion_evidence"):
        if isinstance(block.get(key), list) and not all(isinstance(item, str) and item.strip() for item in block[key]):
            problems.append(ContractProblem(at(key), f"{key!r} must list non-empty strings"))
    return problems


def _steps_problems(steps: List[Any], lines: List[str], first: int, at: _At,
                    effects: Dict[str, Any]) -> List[ContractProblem]:
    """The steps: each one's id (valid, not repeated), fields and evidence names, its batch fields (with the fields of
    records they and ``effects`` name), where each ``next`` leads, and a circle of ``next`` links; each problem on its
    step's line."""
    problems: List[ContractProblem] = []
    if not steps:
        problems.append(ContractProblem(at("steps"), "steps must not be empty"))
    seen: Dict[str, int] = {}
    steps_line = at("steps")
    cursor = steps_line  # each step's id is looked for after the previous step's
    for number, step in enumerate(steps, 1):
        if not isinstance(step, dict):
            problems.append(ContractProblem(steps_line, f"step {number} must be an object"))
            continue
        sid = step.get("id")
        line = _locate(lines, first, f'"{sid}"', cursor) if isinstance(sid, str) else cursor
        cursor = line + 1
        try:
            step_id = validate_id(sid, f"step {number} id")
        except InvalidInput as exc:
            problems.append(ContractProblem(line, exc.message))
        else:
            if step_id in seen:
                problems.append(ContractProblem(line, f"step id {step_id!r} repeats step {seen[step_id]}"))
            seen[step_id] = number
        for key, value in step.items():
            kind = STEP_KEYS.get(key)
            if kind is None:
                problems.append(ContractProblem(line, f"step {sid!r}: unknown field {key!r} (allowed: "
                                                      f"{', '.join(sorted(STEP_KEYS))})"))
            elif not isinstance(value, kind):
                problems.append(ContractProblem(line, f"step {sid!r}: {key!r} must be {_kind(kind)}"))
        evidence = step.get("evidence")
        if isinstance(evidence, list) and not all(isinstance(name, str) and name.strip() for name in evidence):
            problems.append(ContractProblem(line, f"step {sid!r}: 'evidence' must list the names of the evidence "
                                                  "(non-empty strings)"))
        problems.extend(ContractProblem(line, f"step {sid!r}: {message}") for message in step_problems(step, effects))
    for step in steps:
        if (isinstance(step, dict) and isinstance(step.get("next"), str) and step["next"] not in seen and
            step["next"] != "done"):
            line = _locate(lines, first, f'"{step["next"]}"', steps_line)
            problems.append(ContractProblem(line, f"step {step.get('id')!r}: next step {step['next']!r} is not a step "
                                                  "id (or 'done')"))
    cycle = _next_cycle(steps)
    if cycle:
        line = _locate(lines, first, f'"{cycle[0]}"', steps_line)
        problems.append(ContractProblem(line, f"steps: 'next' runs in a circle ({' -> '.join(cycle)}), so the run "
                                              "could never finish"))
    return problems


def _effects_problems(effects: Dict[str, Any], lines: List[str], first: int, at: _At) -> List[ContractProblem]:
    """The effects section: its fields and their types, the key pattern, the approval globs, and the checks of
    :mod:`runner.contract.effects` (a problem of ``effects.http`` on the line of the field it names)."""
    problems: List[ContractProblem] = []
    for key, value in effects.items():
        kind = EFFECT_KEYS.get(key)
        if kind is None:
            problems.append(ContractProblem(at(key), f"effects: unknown field {key!r} (allowed: "
                                                     f"{', '.join(sorted(EFFECT_KEYS))})"))
        elif key == "observe" and value == OBSERVE_NONE:
            continue  # a target that cannot be read back
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            problems.append(ContractProblem(at(key), f"effects: {key!r} must be {_kind(kind)}"))
    pattern = effects.get("key_pattern")
    if isinstance(pattern, str):
        try:
            from ..base.keypattern import compile_pattern  # here: most runs have no key pattern

            compile_pattern(pattern)
        except InvalidInput as exc:
            problems.append(ContractProblem(at("key_pattern"), f"effects: {exc.message}"))
    if isinstance(effects.get("approval"), list) and not all(isinstance(p, str) and p for p in effects["approval"]):
        problems.append(ContractProblem(at("approval"), "effects: approval must list key patterns (globs)"))
    for message in effects_problems(effects):
        line = at("effects")
        for field in getattr(message, "path", ()):  # a problem of effects.http names the fields that lead to it
            found = _locate(lines, first, f'"{field}"', line)
            line = found if found >= line and f'"{field}"' in lines[found - first] else line
        problems.append(ContractProblem(line, message))
    problems.extend(ContractProblem(at("effects"), message) for message in flow_problems(effects))
    return problems


def _number_problems(block: Dict[str, Any], at: _At) -> List[ContractProblem]:
    """The numbers of ``limits``, ``retry``, ``lease`` and ``history``: known fields, positive, a duration within its
    bound."""
    problems: List[ContractProblem] = []
    sections = (("limits", LIMIT_KEYS), ("retry", RETRY_KEYS), ("lease", LEASE_KEYS), ("history", HISTORY_KEYS))
    for section, keys in sections:
        value = block.get(section)
        if isinstance(value, dict):
            for key, number in value.items():
                if key not in keys:
                    problems.append(ContractProblem(at(key), f"{section}: unknown field {key!r} (allowed: "
                                                             f"{', '.join(keys)})"))
                elif key == "max_cost" and isinstance(number, dict):
                    problems.extend(ContractProblem(at(key), message) for message in cost_limit_problems(number))
                elif isinstance(number, bool) or not isinstance(number, (int, float)) or number <= 0:
                    problems.append(ContractProblem(at(key), f"{section}: {key!r} must be a positive number"))
                elif key in DURATION_BOUNDS:
                    try:
                        check_duration(number, f"{section}: {key!r}", DURATION_BOUNDS[key])
                    except InvalidInput as exc:
                        problems.append(ContractProblem(at(key), exc.message))
    return problems


def _shared_lookup_problem(block: Dict[str, Any], steps: List[Any], at: _At) -> List[ContractProblem]:
    """Two inline items looked up at the target by one value (checked once everything else passed)."""
    # Inline items are known now; a glob or an item file is listed, and checked alike, by `step start`.
    inline = [(s["id"], s["items"]) for s in steps if isinstance(s.get("items"), list)]
    shared = shared_lookup(block, inline, block["task_id"]) if inline else None
    return [ContractProblem(at("observe"), shared)] if shared else []


def _jobs_problems(block: Dict[str, Any], at: _At) -> List[ContractProblem]:
    """The ``jobs`` section: known fields, each a boolean."""
    problems: List[ContractProblem] = []
    jobs = block.get("jobs")
    if isinstance(jobs, dict):
        for key, value in jobs.items():
            if key not in JOB_KEYS:
                problems.append(ContractProblem(at(key), f"jobs: unknown field {key!r} (allowed: "
                                                         f"{', '.join(JOB_KEYS)})"))
            elif not isinstance(value, JOB_KEYS[key]):
                problems.append(ContractProblem(at(key), f"jobs: {key!r} must be a boolean"))
    return problems


def _next_cycle(steps: List[Any]) -> List[str]:
    """The first circle of explicit ``next`` links (e.g. ``["a", "b", "a"]``), or ``[]``.

    A step without ``next`` goes on to the first step not yet done, which can
    never return to a done one; only explicit links can close a circle.
    """
    links = {s["id"]: s["next"] for s in steps if isinstance(s, dict) and isinstance(s.get("id"), str) and
             isinstance(s.get("next"), str)}
    for origin in links:
        path = [origin]
        while path[-1] in links:
            following = links[path[-1]]
            if following in path:
                return path[path.index(following):] + [following]
            path.append(following)
    return []


def _kind(kind: type) -> str:
    return {str: "a string", int: "a whole number", list: "a list", dict: "an object", bool: "a boolean"}[kind]


def check_contract(path: str) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    """Validate the contract file at ``path``; return the block and ``FILE:LINE: message`` lines."""
    text = read_document(path, "contract")
    block, problems = parse_contract_text(text)
    return block, [p.format(path) for p in problems]


def load_contract(path: str) -> Dict[str, Any]:
    """The validated contract block of ``path``; raises :class:`InvalidInput` naming the first problem."""
    block, problems = check_contract(path)
    if problems or block is None:
        more = f" (and {len(problems) - 1} more; run `contract check FILE`)" if len(problems) > 1 else ""
        raise InvalidInput(problems[0] + more)
    return block

