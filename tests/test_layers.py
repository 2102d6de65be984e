"""The package's direction: nothing outside ``runner/proof/`` imports it; ``runner/`` imports only the standard library."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import check_layers  # noqa: E402


class LayerCheckTest(unittest.TestCase):
    def test_the_library_imports_nothing_from_the_proof_package(self) -> None:
        self.assertEqual(check_layers.violations(os.path.join(ROOT, "runner")), [])

    def test_the_check_fails_on_a_deliberate_upward_import(self) -> None:
        scratch = tempfile.mkdtemp(prefix="runner-layers-")
        self.addCleanup(shutil.rmtree, scratch, True)
        copy = os.path.join(scratch, "runner")
        shutil.copytree(os.path.join(ROOT, "runner"), copy, ignore=shutil.ignore_patterns("__pycache__"))
        cases = {
            os.path.join(copy, "effects.py"): "\nfrom .proof.campaign import WINDOWS  # noqa\n",
            os.path.join(copy, "stores", "file.py"): "\n\ndef _late():\n    from ..proof import demo  # noqa\n",
            os.path.join(copy, "adapters", "artifact.py"): "\nimport runner.proof.ticketservice  # noqa\n",
            os.path.join(copy, "recovery.py"): "\n\ndef _engine():\n    from .engines import temporal  # noqa\n",
        }
        for path, line in cases.items():
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(line)
        found = check_layers.violations(copy)
        for where in ("runner/effects.py", "runner/stores/file.py", "runner/adapters/artifact.py", "runner/recovery.py"):
            self.assertTrue(any(where in v for v in found), (where, found))
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "check_layers.py"), copy], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 1, proc.stdout)
        self.assertIn("runner.effects imports runner.proof.campaign", proc.stdout)

    def test_the_program_entry_is_the_one_place_allowed_to_add_the_proof_verbs(self) -> None:
        module = "runner.__main__"
        targets = [t for _, t in check_layers.imported(os.path.join(ROOT, "runner", "__main__.py"), module)]
        self.assertTrue(any(t.startswith("runner.proof") for t in targets), targets)
        self.assertEqual(check_layers.violations(os.path.join(ROOT, "runner")), [])


class OldImportPathsTest(unittest.TestCase):
    """Harness code written against the flat layout still imports what it used."""

    def test_the_old_module_paths_still_name_the_same_objects(self) -> None:
        import runner.effects
        import runner.recovery
        import runner.run
        import runner.sqlstore
        import runner.store
        from runner.stores import create_store, open_store
        from runner.stores.file import RunStore, scan

        self.assertIs(runner.store.RunStore, RunStore)
        self.assertIs(runner.store.scan, scan)
        self.assertIs(runner.sqlstore.open_store, open_store)
        self.assertIs(runner.sqlstore.create_store, create_store)
        for name in ("Run", "submit_job"):
            self.assertTrue(callable(getattr(runner.run, name)))
        self.assertTrue(callable(runner.recovery.recover))
        self.assertTrue(callable(runner.effects.drive_effect))


class EngineModulesTest(unittest.TestCase):
    """An engine module is the one place its SDK is imported; without the SDK it says what to install."""

    def test_importing_an_engine_module_without_its_sdk_names_the_package(self) -> None:
        import importlib
        import importlib.util

        for module, sdk in (("runner.engines.temporal", "temporalio"), ("runner.engines.dbos", "dbos")):
            with self.subTest(module=module):
                if importlib.util.find_spec(sdk) is not None:
                    self.skipTest(f"{sdk} is installed in this interpreter")
                with self.assertRaises(ImportError) as caught:
                    importlib.import_module(module)
                self.assertIn(f"pip install {sdk}", str(caught.exception))
                self.assertNotIn(module, sys.modules)


if __name__ == "__main__":
    unittest.main()
