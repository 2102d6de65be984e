"""How the runner finds an item's effect at the target, and the check that no two items share one lookup.

A lookup is the observe request or command an item's effect is found by, and
``observe_many``'s ``value`` (``effects.http.observe.many``'s): filled from
two items, it must give two values, or each item would find the other's
effect and one would be recorded verified without ever being sent
(:func:`shared_lookup`, at ``contract check`` for inline lists and at
``step start`` for every list).
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .templates import KEY_PLACEHOLDERS, expand, is_field, placeholders_in, values_for

__all__ = ["MANY_MAX", "MANY_DEFAULT", "OBSERVE_NONE", "lookups", "shared_lookup", "run_shared_lookup"]

#: ``observe`` for a target that cannot be read back (a chat webhook, a mail server): there is no lookup, the answer
#: is the only evidence, and an unknown outcome stops for a person. Said by ``effects.observe`` (commands),
#: ``effects.http.observe`` and ``effects.smtp.observe``.
OBSERVE_NONE = "none"

#: Keys one lookup of many keys asks for at most (``max``), and by default: ``observe_many`` here,
#: ``effects.http.observe.many``.
MANY_MAX, MANY_DEFAULT = 200, 50


def lookups(effects: Dict[str, Any]) -> List[Tuple[str, List[str]]]:
    """The lookups by which the runner finds an item's effect at the target, each named, with its templates.

    The HTTP observe request's URL and headers, ``observe.many``'s ``value``
    (``observe.list``'s ``value`` alone: the listing is one for every item);
    or the observe command's arguments and ``observe_many``'s ``value``. A
    lookup holding ``{key}`` is left out, as keys are told apart already; so
    is one holding ``{payload_file}``, which only the items' payloads tell
    apart (the contract's author must see to it). Secrets (``{env:..}``,
    ``{file:..}``) stay as written.
    """
    out: List[Tuple[str, List[str]]] = []
    http = effects.get("http")
    if isinstance(http, dict) and http.get("observe") == OBSERVE_NONE:
        pass  # an endpoint that cannot be read back looks nothing up
    elif isinstance(http, dict):
        observe = http.get("observe") or {}
        headers = observe.get("headers") or {}
        fields = [f"{name}: {headers[name]}" for name in sorted(headers, key=str.lower)]
        if isinstance(observe.get("list"), dict):  # one listing for every item: only its value tells them apart
            out.append(("effects.http.observe.list.value", [observe["list"].get("value", "")]))
        else:
            out.append(("effects.http.observe", [observe.get("url", "")] + fields))
        if isinstance(observe.get("many"), dict):
            out.append(("effects.http.observe.many.value", [observe["many"]["value"]]))
    elif isinstance(effects.get("observe"), list):  # "observe": "none" looks nothing up
        out.append(("effects.observe", list(effects["observe"])))
        if isinstance(effects.get("observe_many"), dict):
            out.append(("effects.observe_many.value", [effects["observe_many"]["value"]]))
    told_apart = {"key", "payload_file"}
    return [(name, parts) for name, parts in out if not told_apart & {n for p in parts for n in placeholders_in(p)}]


def shared_lookup(plan: Dict[str, Any], lists: Sequence[Tuple[str, Sequence[str]]], run_id: str,
                  records: Optional[Mapping[str, Sequence[Any]]] = None) -> Optional[str]:
    """Why two items of ``lists`` (each a step id and its items) cannot be told apart at the target, or None.

    Each lookup of :func:`lookups` is filled with every item's placeholders
    (a record's fields from ``records``, by step id); two items with one value
    would each find the other's effect, so one would be recorded verified
    without ever being sent. One pass and one dict per lookup: O(items).
    """
    # A part that names no item placeholder is the same for every item: only the others can tell items apart.
    found = [(name, [p for p in parts if any(n in KEY_PLACEHOLDERS or is_field(n) for n in placeholders_in(p))]
              or parts) for name, parts in lookups(plan.get("effects") or {})]
    if not found:
        return None
    values = values_for([p for _, parts in found for p in parts])
    seen: List[Dict[str, Tuple[str, str]]] = [{} for _ in found]
    for step, items in lists:
        kept = (records or {}).get(step)
        for index, item in enumerate(items):
            filled = dict(values(item, index, kept[index] if kept is not None else None), run_id=run_id)
            for (name, parts), earlier in zip(found, seen):
                value = "\n".join(expand(parts, filled))
                first = earlier.setdefault(value, (step, item))
                if first != (step, item):
                    where = f"step {step!r}" if first[0] == step else f"steps {first[0]!r} and {step!r}"
                    shown = value.replace(chr(10), " ")[:200]
                    return (f"items {first[1][:60]!r} and {item[:60]!r} of {where} are looked up at the target by one "
                            f"value ({name}: {shown}), so each would find the other's effect: a lookup must tell items "
                            "apart; build it from {key}, or from a placeholder the two items differ in")
    return None


def run_shared_lookup(state: Mapping[str, Any], lists: Sequence[Tuple[str, Sequence[str]]],
                      records: Optional[Mapping[str, Sequence[Any]]] = None) -> Optional[str]:
    """:func:`shared_lookup` for a run: its lookups are those of its plan, as the run holds it, filled with its id."""
    return shared_lookup(state["plan"], lists, state["task_id"], records)
