"""Where runs are kept: one URL names a store, and one table says which backend serves it.

``file:DIR`` is a run's folder (or, for a collection, a folder of run
folders), ``sqlite:PATH`` a SQLite database and ``postgresql://...`` a
PostgreSQL database, each of which holds many runs by task id.

:data:`BACKENDS` has one row per backend: the URL schemes it answers, the
module and the class that serve them. :func:`open_store`, :func:`create_store`,
:func:`list_runs` and :func:`run_url` find the row of a URL and call the
class's methods that :class:`~runner.stores.base.Store` declares. A row's
module is imported only when a URL of its schemes is used, so the PostgreSQL
driver is never needed unless such a store is opened. A new backend is a
:class:`~runner.stores.base.Store` subclass and one more row.

May import: runner.base, runner.contract, runner.ledger.
"""

import importlib
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Type

from ..base.errors import InvalidInput
from .base import Store

__all__ = ["Backend", "BACKENDS", "backend_of", "parse_store_url", "open_store", "create_store", "run_url", "list_runs"]


class Backend(NamedTuple):
    """One row of the backend table."""

    #: The backend's name: the ``kind`` :func:`parse_store_url` gives.
    kind: str
    #: The URL prefixes it serves, the first one the canonical spelling.
    schemes: Tuple[str, ...]
    #: Its module, relative to this package, imported on first use.
    module: str
    #: The :class:`~runner.stores.base.Store` subclass in that module.
    cls: str
    #: How the URL's form reads in messages.
    form: str
    #: Its class methods take the whole URL (a database's address), not what follows the scheme.
    whole_url: bool = False

    def load(self) -> Type[Store]:
        """The backend's class, importing its module now if it was not yet."""
        return getattr(importlib.import_module("." + self.module, __name__), self.cls)


BACKENDS = (
    Backend("file", ("file:",), "file_writer", "RunStore", "file:DIR"),
    Backend("sqlite", ("sqlite:",), "sqlite", "SQLiteStore", "sqlite:PATH"),
    Backend("postgresql", ("postgresql://", "postgres://"), "postgres", "PostgresStore", "postgresql://...",
            whole_url=True),
)


def backend_of(url: str) -> Optional[Tuple[Backend, str, str]]:
    """``(row, scheme, location)`` of ``url``: its row, the scheme it begins with, and what the row's class is given.

    None when no row serves ``url``.
    """
    for backend in BACKENDS:
        for scheme in backend.schemes:
            if url.startswith(scheme):
                return backend, scheme, url if backend.whole_url else url[len(scheme):]
    return None


def _backend(url: str) -> Tuple[Backend, str, str]:
    found = backend_of(url)
    if found is None:
        forms = [backend.form for backend in BACKENDS]
        raise InvalidInput(f"unknown store {url!r}: use {', '.join(forms[:-1])} or {forms[-1]}")
    return found


def parse_store_url(url: str) -> Tuple[str, str]:
    """``(kind, location)`` of a store URL: ``file:DIR``, ``sqlite:PATH`` or ``postgresql://...``.

    :raises InvalidInput: no backend serves the URL.
    """
    backend, _scheme, location = _backend(url)
    return backend.kind, location


def open_store(url: str, task_id: Optional[str] = None, **options: Any) -> Store:
    """The store of one run: ``file:DIR`` (the run's folder), or a database and a task id.

    :param options: the backend's own keywords (see its class).
    :raises InvalidInput: an unknown URL, or what the backend's ``open`` raises.
    """
    backend, _scheme, location = _backend(url)
    return backend.load().open(location, task_id, **options)


def create_store(url: str, task_id: str, plan: Dict[str, Any], workspace_base: Optional[str] = None,
                 **options: Any) -> Store:
    """Start run ``task_id`` at ``url`` (see :meth:`runner.stores.base.Store.create`).

    :raises InvalidInput: an unknown URL, or what the backend's ``create`` raises.
    """
    backend, _scheme, location = _backend(url)
    return backend.load().create(location, task_id, plan, workspace_base, **options)


def run_url(url: str, task_id: str) -> str:
    """The URL of one run of a collection: ``file:ROOT`` holds a folder per run; a database holds rows.

    :raises InvalidInput: an unknown URL.
    """
    backend, scheme, location = _backend(url)
    member = backend.load().run_location(location, task_id)
    return member if backend.whole_url else scheme + member


def list_runs(url: str) -> List[str]:
    """Task ids of the runs a store holds (for ``file:ROOT``: the run folders under ROOT).

    :raises InvalidInput: an unknown URL, or what the backend's ``list_runs`` raises.
    """
    backend, _scheme, location = _backend(url)
    return backend.load().list_runs(location)
