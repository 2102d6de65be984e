"""Where runs are kept: one URL names a store, and these functions dispatch on it.

``file:DIR`` is a run's folder (or, for a collection, a folder of run
folders), ``sqlite:PATH`` a SQLite database and ``postgresql://...`` a
PostgreSQL database, each of which holds many runs by task id. A backend's
module is imported only when its URL is used, so the PostgreSQL driver is
never needed unless such a store is opened.
"""

import os
from typing import Any, Dict, List, Optional, Tuple

from ..errors import InvalidInput

__all__ = ["parse_store_url", "open_store", "create_store", "run_url", "list_runs"]


def _db_class(kind: str) -> Any:
    """The backend class of ``sqlite`` or ``postgresql``, its module imported only when asked for."""
    if kind == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore
    from .postgres import PostgresStore

    return PostgresStore


def parse_store_url(url: str) -> Tuple[str, str]:
    """``(kind, location)`` of ``file:DIR``, ``sqlite:PATH`` or ``postgresql://...``."""
    if url.startswith("file:"):
        return "file", url[len("file:"):]
    if url.startswith("sqlite:"):
        return "sqlite", url[len("sqlite:"):]
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql", url
    raise InvalidInput(f"unknown store {url!r}: use file:DIR, sqlite:PATH or postgresql://...")


def open_store(url: str, task_id: Optional[str] = None, **options: Any) -> Any:
    """The store of one run: ``file:DIR`` (the run's folder), or a database and a task id."""
    from .file import RunStore

    kind, location = parse_store_url(url)
    if kind == "file":
        store = RunStore.open(location, **options)
        if task_id and store.state["task_id"] != task_id:
            raise InvalidInput(f"{location} holds run {store.state['task_id']}, not {task_id}")
        return store
    if not task_id:
        raise InvalidInput(f"a {kind} store holds many runs: name one with --task ID")
    return _db_class(kind).open(url, task_id, **options)


def create_store(url: str, task_id: str, plan: Dict[str, Any], workspace_base: Optional[str] = None, **options: Any) -> Any:
    from .file import RunStore

    kind, location = parse_store_url(url)
    if kind == "file":
        return RunStore.create(location, task_id, plan, workspace_base, **options)
    return _db_class(kind).create(url, task_id, plan, workspace_base, **options)


def run_url(url: str, task_id: str) -> str:
    """The URL of one run of a collection: ``file:ROOT`` holds a folder per run; a database holds rows."""
    kind, location = parse_store_url(url)
    return "file:" + os.path.join(location, task_id) if kind == "file" else url


def list_runs(url: str) -> List[str]:
    """Task ids of the runs a store holds (for ``file:ROOT``: the run folders under ROOT)."""
    kind, location = parse_store_url(url)
    if kind == "file":
        if not os.path.isdir(location):
            return []
        return sorted(name for name in os.listdir(location) if os.path.isfile(os.path.join(location, name, "run.json")))
    return _db_class(kind).task_ids(url)
