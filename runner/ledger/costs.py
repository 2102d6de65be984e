"""Named costs of a run: what each effect's calls cost, what calls in flight hold reserved, and the limits.

Pure functions of the state, used by the effect transitions (:mod:`runner.ledger.effects`) and read by the views.

* **A cost is read from the answer and committed with it.** ``effects.cost`` names each cost as terms read
  from the receipt by JSON pointer, each times a price; without it, a receipt's own field ``cost``
  (``{NAME: AMOUNT}``, what an invoke command prints) is taken. The amount is recorded on the effect
  (``cost``) and added to the run's totals (``counters.cost``) in the transition that records the
  acknowledgement, so no answer is recorded without its cost, nor a cost without its answer.
* **A call's cost is reserved before it starts.** ``started`` holds ``reserved`` (``effects.cost_estimate``,
  or the largest cost of that name seen in an answer once there is one, ``counters.cost_largest``),
  summed in ``counters.reserved``. A call whose reservation does not fit under ``limits.max_cost`` beside
  what is spent and reserved is refused (:class:`~runner.base.errors.LimitExhausted`).
* **A reservation ends when the effect's outcome is recorded.** With an acknowledgement, the cost read
  replaces it; verified by a lookup with no answer (the answer was lost: a kill, a timeout), the
  reservation is recorded as the cost and named in ``cost_estimated``, the only amount known of a call
  whose usage never reached the run; observed absent, refused, or answered "not now", it is let go.
  An unknown outcome keeps it until the effect is settled.
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..base.errors import LimitExhausted
from ..base.pointer import MISSING, parse_pointer, resolve_pointer
from ..base.quoting import number
from ..contract.spec import contract_of
from .envelope import Ops

__all__ = ["cost_limits", "reservation", "check_fits", "read_cost", "priced", "reserve_ops", "charge_ops",
           "release_ops", "spend", "summed", "first_short", "spend_line"]

#: Decimal places kept of a sum of reservations, so that one taken and given back leaves nothing.
PLACES = 12


def cost_limits(state: Dict[str, Any]) -> Dict[str, float]:
    """The limit of each named cost (``budgets.max_cost``: a number bounds ``money``, an object each cost it names)."""
    value = state["budgets"].get("max_cost")
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(name): float(amount) for name, amount in value.items()}
    return {"money": float(value)}


def summed(totals: Mapping[str, float], amounts: Mapping[str, float], sign: int = 1) -> Dict[str, float]:
    """``totals`` with ``amounts`` added (``sign`` 1) or taken away (-1); a sum that comes to nothing is dropped."""
    out = dict(totals)
    for name, amount in amounts.items():
        value = round(float(out.get(name, 0)) + sign * float(amount), PLACES)
        if value > 0:
            out[name] = value
        else:
            out.pop(name, None)
    return out


def reservation(state: Dict[str, Any]) -> Dict[str, float]:
    """What one call is reserved of each named cost: the largest amount seen in an answer, else the estimate."""
    out = {name: amount for name, amount in contract_of(state).effects.cost_estimate}
    out.update(state["counters"].get("cost_largest") or {})
    return {name: float(amount) for name, amount in out.items() if amount > 0}


def first_short(state: Dict[str, Any], amounts: Mapping[str, float],
                pending: Optional[Mapping[str, float]] = None) -> Optional[Tuple[str, float, float, float, float]]:
    """The first limited cost that ``amounts`` (with ``pending``, reservations not yet committed) would take past its
    limit, as ``(name, amount, spent, reserved, limit)``; None when every one fits.

    A cost is spent when nothing more fits: a call with no amount reserved still needs some of the limit left.
    """
    spent_all = state["counters"].get("cost") or {}
    reserved_all = summed(state["counters"].get("reserved") or {}, pending or {})
    for name, limit in sorted(cost_limits(state).items()):
        spent, reserved = float(spent_all.get(name, 0)), float(reserved_all.get(name, 0))
        amount = float(amounts.get(name, 0))
        if spent + reserved + amount > limit + 10 ** -PLACES or (amount == 0 and spent >= limit):
            return name, amount, spent, reserved, limit
    return None


def check_fits(state: Dict[str, Any], key: str, amounts: Mapping[str, float]) -> None:
    """Refuse a call of ``key`` whose reservation ``amounts`` does not fit under the run's cost limits.

    :raises LimitExhausted: naming the cost, what one call is reserved, what is spent and reserved, and the limit.
    """
    short = first_short(state, amounts)
    if short is not None:
        name, amount, spent, reserved, limit = short
        raise LimitExhausted(f"a call of effect {key} would reserve {name} {_amount(amount)}: {_amount(spent)} spent "
                             f"and {_amount(reserved)} reserved of the limit {_amount(limit)}",
                             limit="max_cost", cost=name)


def read_cost(state: Dict[str, Any], receipt: Any, reserved: Mapping[str, float]) -> Tuple[Dict[str, float], List[str]]:
    """The cost of one call read from its receipt, and the names whose amount could not be read from it.

    With ``effects.cost``, each named cost is the sum of its terms (the number at the pointer times the price);
    a term whose pointer leads to no number makes the cost unknown, and the call's reservation stands in for
    it (named in the list returned). Without it, the receipt's field ``cost`` is taken when it is an object
    of amounts; for a name reserved and not read, the reservation stands in.
    """
    spec = contract_of(state).effects.cost
    if spec:
        cost, unread = priced(spec, receipt)
    else:
        field: Any = receipt.get("cost") if isinstance(receipt, dict) else None
        cost = {str(name): float(amount) for name, amount in (field.items() if isinstance(field, dict) else ())
                if isinstance(amount, (int, float)) and not isinstance(amount, bool) and 0 <= amount < float("inf")}
        unread = [name for name in reserved if name not in cost]
    for name in unread:
        if name in reserved:
            cost[name] = float(reserved[name])
    return cost, [name for name in unread if name in reserved]


def priced(spec: Sequence[Tuple[str, Sequence[Tuple[str, float]]]], receipt: Any) -> Tuple[Dict[str, float], List[str]]:
    """Each named cost of ``spec`` (``effects.cost``: terms of a pointer and a price) read from ``receipt``, and the
    names whose terms could not all be read (a pointer that leads to no number of zero or more)."""
    cost: Dict[str, float] = {}
    unread: List[str] = []
    for name, terms in spec:
        total: Optional[float] = 0.0
        for pointer, price in terms:
            found = resolve_pointer(receipt, parse_pointer(pointer))
            if found is MISSING or isinstance(found, bool) or not isinstance(found, (int, float)) or found < 0:
                total = None
                break
            total = (total or 0.0) + float(found) * price
        if total is None:
            unread.append(name)
        elif total > 0:
            cost[name] = round(total, PLACES)
    return cost, unread


def _set(key: str, field: str, value: Any) -> List[Any]:
    return ["set", ["effects", key, field], value]


def reserve_ops(state: Dict[str, Any], amounts: Mapping[str, float]) -> Ops:
    """The run's sum of reservations with ``amounts`` added (a call's, whose record holds them)."""
    if not amounts:
        return []
    return [["set", ["counters", "reserved"], summed(state["counters"].get("reserved") or {}, amounts)]]


def release_ops(state: Dict[str, Any], key: str) -> Ops:
    """``key``'s reservation given back: off its record and the run's sum."""
    held = state["effects"][key].get("reserved")
    if not held:
        return []
    return [["del", ["effects", key, "reserved"]],
            ["set", ["counters", "reserved"], summed(state["counters"].get("reserved") or {}, held, -1)]]


def charge_ops(state: Dict[str, Any], key: str, cost: Mapping[str, float], estimated: List[str]) -> Ops:
    """``cost`` added to ``key``'s record and the run's totals; ``estimated``: the names whose amount was not read
    from an answer; the amounts read raise the largest seen (what later calls are reserved)."""
    if not cost:
        return []
    effect = state["effects"][key]
    counters = state["counters"]
    ops: Ops = [_set(key, "cost", summed(effect.get("cost") or {}, cost)),
                ["set", ["counters", "cost"], _plus(counters.get("cost") or {}, cost)]]
    largest = dict(counters.get("cost_largest") or {})
    read = {name: amount for name, amount in cost.items() if name not in estimated}
    if any(amount > largest.get(name, 0) for name, amount in read.items()):
        ops.append(["set", ["counters", "cost_largest"],
                    dict(largest, **{n: a for n, a in read.items() if a > largest.get(n, 0)})])
    if estimated:
        kept = list(effect.get("cost_estimated") or [])
        ops.append(_set(key, "cost_estimated", kept + [name for name in estimated if name not in kept]))
    return ops


def _plus(totals: Mapping[str, float], amounts: Mapping[str, float]) -> Dict[str, float]:
    """The run's totals with ``amounts`` added, as ``cost --add`` adds them."""
    out = dict(totals)
    for name, amount in amounts.items():
        out[name] = round(out.get(name, 0) + amount, PLACES)
    return out


def spend(state: Dict[str, Any]) -> Dict[str, Dict[str, Optional[float]]]:
    """Each named cost of the run: ``spent``, ``reserved`` (calls in flight or unsettled) and ``limit`` (None: none)."""
    counters = state["counters"]
    spent, reserved, limits = counters.get("cost") or {}, counters.get("reserved") or {}, cost_limits(state)
    return {name: {"spent": float(spent.get(name, 0)), "reserved": float(reserved.get(name, 0)),
                   "limit": limits.get(name)} for name in sorted(set(spent) | set(reserved) | set(limits))}


def _amount(value: Optional[float]) -> str:
    """An amount as people write it: a whole number without a fraction or an exponent (2000000, not 2e+06)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return number(int(value))
    return number(value)


def spend_line(state: Dict[str, Any], limited_only: bool = True, per_call: bool = True) -> str:
    """Each named cost spent (and reserved, when calls hold some) against its limit, and what one call is reserved:
    ``money 1.9 spent and 0.2 reserved of 2 (a call is reserved 0.1)``; "" when there is none to show.

    :param limited_only: only the costs ``limits.max_cost`` bounds.
    :param per_call: say what one call is reserved.
    """
    parts = []
    each = reservation(state) if per_call else {}
    for cost, figures in spend(state).items():
        if figures["limit"] is None and limited_only:
            continue
        said = f"{cost} {_amount(figures['spent'])} spent"
        if figures["reserved"]:
            said += f" and {_amount(figures['reserved'])} reserved"
        if figures["limit"] is not None:
            said += f" of {_amount(figures['limit'])}"
        if cost in each:
            said += f" (a call is reserved {_amount(each[cost])})"
        parts.append(said)
    return ", ".join(parts)
