"""The adapter a contract names for one effect key: commands given inline, else its ``effects.http``, else its
``effects.invoke`` and ``effects.observe`` commands (``"observe": "none"``: a target that cannot be read back), with
the key's item placeholders filled.

The HTTP adapter is imported only when a contract names ``effects.http``, so a drive of commands never loads the
HTTP client.
"""

from typing import Any, Callable, Dict, Optional, Sequence

from ..base.errors import InvalidInput
from ..calls.target import Adapter
from ..contract.spec import contract_of
from ..ledger import batch as _batch
from .commands import CommandAdapter

__all__ = ["adapter_for"]


def adapter_for(state: Dict[str, Any], key: str, invoke: Optional[Sequence[str]] = None,
                observe: Optional[Sequence[str]] = None, runner: Optional[Callable[..., Any]] = None) -> Adapter:
    """The adapter for ``key``: inline commands, else the contract's ``effects.http``, else its commands; item
    placeholders filled.

    :raises InvalidInput: nothing says how to call the target, or a header's secret cannot be read now.
    """
    effects = contract_of(state).effects  # read once per plan: every item's adapter shares it
    values: Dict[str, Any] = {"run_id": state["task_id"]}
    root = _batch.run_workspace(state)
    found = _batch.owner_of(state, key)
    if found is not None:
        step, index = found
        record = state["steps"][step]
        root = record.get("workspace") or root
        values.update(_batch.item_values_of(state, step, index))
    timeout = effects.timeout_seconds
    if not invoke and not observe and effects.http is not None:
        from .http import HttpAdapter  # here: a contract with commands need not import the HTTP client

        receipt = (state.get("effects", {}).get(key) or {}).get("receipt")  # its id is looked for in a listing
        return HttpAdapter(effects.http, values=values, workspace=root, timeout=timeout, receipt=receipt)
    if not invoke and not observe and effects.git is not None:
        from .git import GitAdapter  # here: a contract without git need not import it
        return GitAdapter(effects.git, values=values, workspace=root, timeout=timeout, runner=runner)
    inline = bool(invoke or observe)
    invoke = list(invoke) if invoke else effects.invoke
    observe = list(observe) if observe else effects.observe
    readable = inline or effects.readable
    if not invoke or (not observe and readable):
        raise InvalidInput("effect run needs an invoke and an observe command: the contract's effects.invoke and "
                           "effects.observe, or '-- COMMAND ... --observe -- COMMAND ...'")
    values["workspace"] = root
    return CommandAdapter(invoke, observe or (), values=values, cwd=root, timeout=timeout, runner=runner,
                          many=None if inline else effects.observe_many, readable=readable)
