"""Paths kept inside a workspace: what an item, an item file, a glob or an artifact may name.

An item is a path relative to the contract's workspace, and it must stay
inside it whatever the file system holds: :func:`item_problem` refuses what
can never be inside (an absolute path, a ``..`` component, a NUL).
"""

import os
from typing import Optional

__all__ = ["item_problem"]


def item_problem(item: str) -> Optional[str]:
    """Why ``item`` cannot name a path inside the workspace whatever the file system holds, or None.

    An absolute path, a ``..`` component (``/`` or ``\\`` separated) or a NUL
    character is refused; everything else is checked against the file
    system by :func:`runner.ledger.batch.resolve_inside`.
    """
    if "\0" in item:
        return "holds a NUL character"
    if os.path.isabs(item) or item.startswith(("/", "\\")):
        return "is an absolute path"
    if ".." in item.replace("\\", "/").split("/"):
        return "holds a '..' component"
    return None
