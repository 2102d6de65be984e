"""The checks of a contract's ``effects`` section: its commands, bounds and lookups of many keys
(:func:`effects_problems`, with :func:`many_problems`), and its flow control (:func:`flow_problems`).

The ``effects.http``, ``effects.git`` and ``effects.smtp`` subsections have their checks in
:mod:`runner.contract.http`, :mod:`runner.contract.git` and :mod:`runner.contract.smtp`, imported only when
a contract is checked.
"""

import re
from typing import Any, Dict, List, Mapping

from ..base.pointer import pointer_problem
from .lookups import MANY_DEFAULT, MANY_MAX, OBSERVE_NONE
from .steps import _argv_problem
from .templates import PLACEHOLDERS, is_field, placeholders_in

__all__ = ["effects_problems", "many_problems", "cost_problems", "cost_limit_problems", "COST_NAME", "flow_problems",
           "EACH", "MAX_CONCURRENCY", "GROUP_PLACEHOLDERS",
           "GROUP_FIELD", "DEFAULT_CALL_TIMEOUT", "OBSERVE_NONE"]

#: Seconds one call of the target may take unless ``effects.timeout_seconds`` says otherwise. Here, beside the check
#: of that field, so that running a command (every verb imports it) does not load the specs.
DEFAULT_CALL_TIMEOUT = 60.0

#: What the ``observe_many`` section holds, and what its command's arguments and each key's ``value`` may name.
MANY_FIELDS = ("command", "list", "match", "value", "max")
MANY_PLACEHOLDERS = ("run_id", "workspace")
MANY_VALUE_PLACEHOLDERS = ("key", "item", "stem", "slug", "index")
#: The argument of the ``observe_many`` command that becomes one argument per key.
EACH = "{each}"

#: A cost's name (``money``, ``tokens``): what ``cost --add NAME=AMOUNT`` accepts too.
COST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}$")

#: The most calls one executor keeps in flight.
MAX_CONCURRENCY = 256

#: What a ``concurrency_key`` may name: the item's placeholders, the key, and ``payload.FIELD``.
GROUP_PLACEHOLDERS = ("item", "stem", "slug", "index", "key")
GROUP_FIELD = re.compile(r"\{(payload\.[A-Za-z0-9_]+|[a-z_][a-z0-9_]*)\}")


def effects_problems(effects: Dict[str, Any]) -> List[str]:
    """Problems with the effects section's ``invoke``, ``observe``, ``timeout_seconds``, ``settle_seconds`` and
    bounds."""
    out: List[str] = []
    for name in ("invoke", "observe"):
        if name == "observe" and effects.get(name) == OBSERVE_NONE:
            continue  # a target that cannot be read back: the answer is the only evidence
        if name in effects:
            problem = _argv_problem(effects[name], f"effects: {name}", PLACEHOLDERS, fields=True)
            if problem:
                out.append(problem)
    if ("invoke" in effects) != ("observe" in effects) and not ("smtp" in effects and "invoke" not in effects):
        out.append("effects: invoke and observe come together: an effect the runner performs must be one it can "
                   "observe")
    if "observe_many" in effects:
        out.extend(many_problems(effects["observe_many"]))
        if "observe" not in effects:
            out.append("effects: observe_many looks keys up with a command: it comes with the invoke and observe "
                       "commands (effects.http has observe.many)")
        elif effects["observe"] == OBSERVE_NONE:
            out.append('effects: observe_many looks keys up: a target with "observe": "none" cannot be read back')
    http = effects.get("http")
    unreadable = (effects.get("observe") == OBSERVE_NONE or "smtp" in effects
                  or (isinstance(http, dict) and http.get("observe") == OBSERVE_NONE))
    if effects.get("observe_first") is True and unreadable:
        out.append('effects: observe_first looks each item up before its first call: a target with "observe": "none" '
                   "cannot be read back")
    from .git import git_problems  # here: a process that never checks a contract does not import them
    from .http import http_problems
    from .smtp import smtp_section_problems

    out.extend(http_problems(effects))
    out.extend(git_problems(effects))
    out.extend(smtp_section_problems(effects))
    timeout = effects.get("timeout_seconds")
    if ("timeout_seconds" in effects and
        (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400)):
        out.append("effects: timeout_seconds must be a positive number of seconds (at most a day)")
    settle = effects.get("settle_seconds")
    if ("settle_seconds" in effects and
        (isinstance(settle, bool) or not isinstance(settle, (int, float)) or not 0 <= settle <= 86400)):
        out.append("effects: settle_seconds must be a number of seconds from 0 to a day (how long the target may not "
                   "yet show a call)")
    for name in ("max_attempts", "max_rate_limited"):
        value = effects.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value < (1 if name == "max_attempts" else 0):
            out.append(f"effects: {name} must be {'at least 1' if name == 'max_attempts' else 'zero or more'}")
    return out + cost_problems(effects)


def _amount(value: Any) -> bool:
    """A finite number of zero or more (not a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")


def cost_problems(effects: Mapping[str, Any]) -> List[str]:
    """Problems of ``effects.cost`` (each named cost a list of ``[POINTER, PRICE]`` terms read from a receipt) and
    ``effects.cost_estimate`` (each named cost an amount reserved for one call)."""
    out: List[str] = []
    shape = 'effects: cost must name each cost with its terms, e.g. {"money": [["/usage/total_tokens", 0.00002]]}'
    terms = effects.get("cost")
    if "cost" in effects and isinstance(terms, dict):
        for name, listed in terms.items():
            if not COST_NAME.match(name):
                out.append(f"effects: cost: {name!r} is not a cost's name (letters, digits and ._:@+=-)")
            elif not isinstance(listed, list) or not listed or not all(
                    isinstance(t, list) and len(t) == 2 and _amount(t[1]) for t in listed):
                out.append(shape + f": {name!r} must be a list of [POINTER, PRICE] (a price of zero or more)")
            else:
                out.extend(p for p in (pointer_problem(t[0], f"effects: cost.{name}") for t in listed) if p)
    estimate = effects.get("cost_estimate")
    if "cost_estimate" in effects and isinstance(estimate, dict):
        for name, amount in estimate.items():
            if not COST_NAME.match(name) or not _amount(amount):
                out.append(f"effects: cost_estimate.{name} must be a cost's name with an amount of zero or more "
                           "(what one call is reserved)")
    return out


def cost_limit_problems(limits: Mapping[str, Any]) -> List[str]:
    """Problems of ``limits.max_cost`` given as an object: each cost's name with a positive limit."""
    if not limits:
        return ["limits: 'max_cost' must be a positive number (money) or name each cost's limit, "
                'e.g. {"money": 2.0}']
    return [f"limits: max_cost.{name} must be a positive number" for name, value in limits.items()
            if not COST_NAME.match(name) or not _amount(value) or value <= 0]


def many_problems(many: Any) -> List[str]:
    """Problems of the effects section's ``observe_many`` (empty when fine)."""
    shape = ('effects: observe_many must be {"command": [..., "{each}"], "match": "/external_ref", "value": "{slug}"} '
             '(optional: "list", a pointer to the answer\'s list; "max", keys per lookup)')
    if not isinstance(many, dict) or not {"command", "match", "value"} <= set(many):
        return [shape]
    out = [f"effects: observe_many: unknown field {name!r} (allowed: {', '.join(MANY_FIELDS)})" for name in many
           if name not in MANY_FIELDS]
    command = many["command"]
    if (not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command)
            or command.count(EACH) != 1 or command[0] == EACH):
        out.append('effects: observe_many.command must be a list of arguments holding "{each}" once, as an argument of '
                   "its own (it becomes one argument per key)")
    else:
        unknown = sorted({n for a in command if a != EACH for n in placeholders_in(a) if n not in MANY_PLACEHOLDERS})
        if unknown:
            out.append(f"effects: observe_many.command may name {{run_id}} and {{workspace}}, not {{{unknown[0]}}} "
                       "(a key's own values go in through {each})")
    for name in ("list", "match"):
        if name in many:
            problem = pointer_problem(many[name], f"effects: observe_many.{name}")
            if problem:
                out.append(problem)
    value = many["value"]
    names = placeholders_in(value) if isinstance(value, str) else []
    if not names or any(n not in MANY_VALUE_PLACEHOLDERS and not is_field(n) for n in names):
        out.append('effects: observe_many.value must be a template of the key, such as "{slug}" (names: '
                   + ", ".join("{" + n + "}" for n in MANY_VALUE_PLACEHOLDERS) + ")")
    limit = many.get("max", MANY_DEFAULT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 2 <= limit <= MANY_MAX:
        out.append(f"effects: observe_many.max must be a whole number from 2 to {MANY_MAX}")
    return out


def flow_problems(effects: Mapping[str, Any]) -> List[str]:
    """Problems with the effects section's ``concurrency``, ``rate`` and ``concurrency_key`` (empty when fine)."""
    out: List[str] = []
    limit = effects.get("concurrency")
    if ("concurrency" in effects and
        (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CONCURRENCY)):
        out.append(f"effects: concurrency must be a whole number from 1 to {MAX_CONCURRENCY} (effects in flight at "
                   "once)")
    rate: Any = effects.get("rate")  # a dict once ``numbers`` holds
    if "rate" in effects:
        numbers = isinstance(rate, dict) and all(isinstance(rate.get(k, 1), (int, float)) and
                                                 not isinstance(rate.get(k, 1), bool)
                                                 for k in ("per_second", "burst"))
        if (not numbers or set(rate) - {"per_second", "burst"} or not 0 < rate.get("per_second", 0) <= 100000 or
            not 1 <= rate.get("burst", 1) <= 100000):
            out.append('effects: rate must be {"per_second": R, "burst": B}: R above 0 calls a second, B at least 1 '
                       '(calls saved up)')
    group = effects.get("concurrency_key")
    if "concurrency_key" in effects:
        if (not isinstance(group, dict) or set(group) != {"key", "limit"} or not isinstance(group.get("key"), str)
                or isinstance(group.get("limit"), bool) or not isinstance(group.get("limit"), int)
                or group["limit"] < 1):
            out.append('effects: concurrency_key must be {"key": TEMPLATE, "limit": N}, e.g. {"key": '
                       '"{payload.customer}", "limit": 1}')
        else:
            unknown = sorted({m.group(1) for m in GROUP_FIELD.finditer(group["key"])
                              if not m.group(1).startswith("payload.") and m.group(1) not in GROUP_PLACEHOLDERS})
            if unknown or not GROUP_FIELD.search(group["key"]):
                out.append("effects: concurrency_key's key must name {item}, {stem}, {slug}, {index}, {key} or "
                           "{payload.FIELD}"
                           + (f", not {{{unknown[0]}}}" if unknown else ""))
    return out
