"""Names a package exports, each imported from its own module on first use (PEP 562).

A process that needs one module of a package (a job's launcher, a hook, a
service, a worker) then pays for importing that module only, not for every
module the package's ``__init__`` names.
"""

import importlib
import sys
from typing import Any, Callable, Dict

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: Dict[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: each name of ``homes`` comes from its module, relative to the package.

    The value is kept in the package once imported, so later uses do not come
    back here; any other name is an :class:`AttributeError`, as for a module
    without the hook.

    :param package: the package's ``__name__``.
    :param homes: exported name -> the module that defines it (``"errors"`` for ``package.errors``).
    """
    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module("." + home, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
