"""The adapter a contract names for one effect key, with the key's item placeholders filled. Every kind:

* commands given inline (``effect run KEY -- COMMAND ... --observe -- COMMAND ...``);
* ``effects.http``: :class:`~runner.adapters.http.HttpAdapter` (``"observe": "none"`` in it: an endpoint that cannot
  be read back, such as a chat webhook);
* ``effects.git``: :class:`~runner.adapters.git.GitAdapter`;
* ``effects.smtp``: :class:`~runner.adapters.smtp.SmtpAdapter`, a mail server, which cannot be read back;
* ``effects.invoke`` and ``effects.observe`` commands: :class:`~runner.adapters.commands.CommandAdapter`
  (``"observe": "none"``: a target that cannot be read back).

The HTTP, git and SMTP adapters are imported only when a contract names their section, so a drive of commands
never loads their clients.
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
    """The adapter for ``key``: inline commands, else the contract's ``effects.http``, ``effects.git`` or
    ``effects.smtp``, else its commands; item placeholders filled.

    :raises InvalidInput: nothing says how to call the target, or a header's or the mail login's secret cannot be
        read now.
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
    if not invoke and not observe and effects.smtp is not None:
        from .smtp import SmtpAdapter  # here: a contract without a mail server need not import smtplib's adapter

        return SmtpAdapter(effects.smtp, values=values, workspace=root, timeout=timeout)
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
