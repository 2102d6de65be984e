"""Former home of the database stores, kept so that harness code importing ``runner.sqlstore`` still works.

The dispatch on a store URL is :mod:`runner.stores`; the backends are its modules.
"""

from .stores import create_store, list_runs, open_store, parse_store_url, run_url  # noqa: F401
from .stores.postgres import PostgresStore  # noqa: F401  (imports psycopg only when a store is opened)
from .stores.sql import SQLStore  # noqa: F401
from .stores.sqlite import SQLiteStore  # noqa: F401

__all__ = ["create_store", "list_runs", "open_store", "parse_store_url", "run_url", "SQLStore", "SQLiteStore", "PostgresStore"]
