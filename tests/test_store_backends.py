"""The backend table (:mod:`runner.stores`): one row per backend, its module imported only when its URL is used.

``open_store``, ``create_store``, ``list_runs``, ``run_url`` and ``Run.open``
all find a URL's backend through the table; what each backend does with a run
is the conformance suite's (``test_store_conformance.py``).
"""

import json
import os
import subprocess
import unittest

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

from runner.base.errors import InvalidInput
from runner.execution.run import Run
from runner.stores import BACKENDS, backend_of, create_store, list_runs, open_store, parse_store_url, run_url
from runner.stores.base import Store


class BackendTableTest(unittest.TestCase):
    def setUp(self) -> None:
        scratch = _util.scratch_dir("runner-backends-")
        self.root = scratch.name
        self.addCleanup(scratch.cleanup)

    def test_every_row_names_a_store_class_that_serves_its_schemes(self) -> None:
        schemes = [scheme for backend in BACKENDS for scheme in backend.schemes]
        self.assertEqual(len(schemes), len(set(schemes)), "two rows claim one scheme")
        self.assertEqual(len({b.kind for b in BACKENDS}), len(BACKENDS))
        for backend in BACKENDS:
            with self.subTest(backend=backend.kind):
                cls = backend.load()
                self.assertTrue(issubclass(cls, Store), cls)
                self.assertEqual(cls.__name__, backend.cls)
                for name in ("open", "create", "list_runs"):
                    self.assertNotIn(name, getattr(cls, "__abstractmethods__", ()), f"{cls.__name__} leaves {name} to the base")
                for scheme in backend.schemes:
                    found = backend_of(scheme + "x")
                    self.assertIsNotNone(found)
                    self.assertEqual(found[:2], (backend, scheme))  # type: ignore[index]
                    self.assertEqual(parse_store_url(scheme + "x")[0], backend.kind)

    def test_a_url_no_row_serves_is_invalid_input_naming_every_form(self) -> None:
        for url in ("runs.db", "mysql://db", "File:runs", ""):
            with self.subTest(url=url):
                self.assertIsNone(backend_of(url))
                calls = (lambda u: open_store(u, "t"), lambda u: create_store(u, "t", {}), list_runs, lambda u: run_url(u, "t"))
                for call in calls:
                    with self.assertRaises(InvalidInput) as caught:
                        call(url)
                    self.assertEqual(caught.exception.message, f"unknown store {url!r}: use file:DIR, sqlite:PATH or postgresql://...")

    def test_the_location_a_class_gets_is_the_rest_of_the_url_except_for_postgresql(self) -> None:
        self.assertEqual(parse_store_url("file:/a/b"), ("file", "/a/b"))
        self.assertEqual(parse_store_url("sqlite:runs.db"), ("sqlite", "runs.db"))
        self.assertEqual(parse_store_url("postgres://u@h/db"), ("postgresql", "postgres://u@h/db"))
        self.assertEqual(parse_store_url("postgresql://u@h/db"), ("postgresql", "postgresql://u@h/db"))

    def test_a_collections_run_is_a_folder_of_a_file_root_and_the_database_itself(self) -> None:
        self.assertEqual(run_url("file:" + self.root, "t1"), "file:" + os.path.join(self.root, "t1"))
        self.assertEqual(run_url("sqlite:runs.db", "t1"), "sqlite:runs.db")
        self.assertEqual(run_url("postgres://u@h/db", "t1"), "postgres://u@h/db")

    def test_create_list_and_open_go_to_the_backend_the_url_names(self) -> None:
        database = os.path.join(self.root, "runs.db")
        folders = os.path.join(self.root, "runs")
        for url in ("sqlite:" + database, "file:" + folders):
            with self.subTest(url=url):
                self.assertEqual(list_runs(url), [])  # a collection that does not exist holds no runs
                if url.startswith("file:"):
                    os.mkdir(folders)  # a file collection's folder is made by whoever keeps runs there
                for task in ("b-run", "a-run"):
                    created = create_store(run_url(url, task), task, _util.contract_block(task))
                    created.commit(_util.transition_ops(1))
                    created.close()
                self.assertEqual(list_runs(url), ["a-run", "b-run"])
                opened = open_store(run_url(url, "b-run"), "b-run")
                self.addCleanup(opened.close)
                self.assertEqual(type(opened).__name__, "SQLiteStore" if url.startswith("sqlite:") else "RunStore")
                self.assertEqual((opened.state["task_id"], opened.revision), ("b-run", 1))

    def test_a_database_url_without_a_task_id_is_refused_before_the_database_is_touched(self) -> None:
        database = os.path.join(self.root, "runs.db")
        for task in (None, ""):
            with self.assertRaises(InvalidInput) as caught:
                open_store("sqlite:" + database, task)
            self.assertEqual(caught.exception.message, "a sqlite store holds many runs: name one with --task ID")
        self.assertFalse(os.path.exists(database))

    def test_a_run_folder_holding_another_run_than_the_task_named_is_refused(self) -> None:
        folder = os.path.join(self.root, "run")
        create_store("file:" + folder, "the-run", _util.contract_block("the-run"))
        self.assertEqual(open_store("file:" + folder, "the-run").state["task_id"], "the-run")
        with self.assertRaises(InvalidInput) as caught:
            open_store("file:" + folder, "other-run")
        self.assertEqual(caught.exception.message, f"{folder} holds run the-run, not other-run")

    def test_run_open_takes_a_store_url_or_a_plain_folder(self) -> None:
        folder = os.path.join(self.root, "run")
        database = os.path.join(self.root, "runs.db")
        create_store("file:" + folder, "folder-run", _util.contract_block("folder-run"))
        create_store("sqlite:" + database, "db-run", _util.contract_block("db-run")).close()
        for where, task, kind in ((folder, None, "RunStore"), ("file:" + folder, None, "RunStore"), ("sqlite:" + database, "db-run", "SQLiteStore")):
            with self.subTest(where=where):
                run = Run.open(where, task_id=task)
                self.addCleanup(run.store.close)
                self.assertEqual(type(run.store).__name__, kind)
                lease = run.acquire("worker-1", 60)
                self.assertEqual(lease["owner"], "worker-1")
                again = Run.open(where, task_id=task)
                self.addCleanup(again.store.close)
                self.assertEqual(again.state["lease"]["epoch"], lease["epoch"])
        with self.assertRaises(InvalidInput):
            Run.open("sqlite:" + database)

    def test_a_backend_module_is_imported_only_when_its_url_is_used(self) -> None:
        # A fresh interpreter: what importing the library and using one backend loads.
        program = (
            "import json, sys\n"
            "from runner.stores import create_store, list_runs\n"
            "loaded = lambda: sorted(m for m in ('runner.stores.sqlite', 'runner.stores.postgres', 'runner.stores.sql') if m in sys.modules)\n"
            "out = {'import': loaded()}\n"
            "list_runs('file:' + sys.argv[1])\n"
            "out['file'] = loaded()\n"
            "create_store('sqlite:' + sys.argv[1] + '/runs.db', 't', {'goal': 'g', 'steps': [{'id': 's'}]}).close()\n"
            "out['sqlite'] = loaded()\n"
            "print(json.dumps(out))\n"
        )
        proc = subprocess.run(_util.python("-c", program, self.root), capture_output=True, text=True, env=_util.child_env(), timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(json.loads(proc.stdout), {"import": [], "file": [], "sqlite": ["runner.stores.sql", "runner.stores.sqlite"]})


if __name__ == "__main__":
    unittest.main()
