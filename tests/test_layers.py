"""The package's layers (``tools/check_layers.py``): no import of ``runner.proof`` or an engine from the library, no import cycle, no private name of another package."""

import contextlib
import io
import os
import shutil
import subprocess
import sys
import re
import tempfile
import unittest
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import check_layers  # noqa: E402


def _part_of_runner(test: unittest.TestCase, files: Sequence[str]) -> str:
    """A copy of ``runner/`` where the named files (paths relative to it) keep their text and every other module is empty.

    A planted defect is judged on the real modules it touches and names;
    the others stay as empty files so that every import resolves to the same
    module as in the real tree, and the real tree passing the check is its
    own test.
    """
    scratch = tempfile.mkdtemp(prefix="runner-layers-")
    test.addCleanup(shutil.rmtree, scratch, True)
    source = os.path.join(ROOT, "runner")
    copy = os.path.join(scratch, "runner")
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), copy_function=_empty)
    for name in files:
        shutil.copyfile(os.path.join(source, *name.split("/")), os.path.join(copy, *name.split("/")))
    return copy


def _empty(source: str, target: str) -> None:
    open(target, "w", encoding="utf-8").close()


def _append(path: str, text: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)


def _reported(test: unittest.TestCase, copy: str) -> List[str]:
    """What the check's command prints for ``copy`` above its summary line, asserting the exit status says so."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = check_layers.main(copy)
    lines = out.getvalue().splitlines()
    test.assertTrue(lines and lines[-1].startswith(f"layer check: {len(lines) - 1} violation(s)"), lines)
    test.assertEqual(status, 1 if len(lines) > 1 else 0, lines)
    return lines[:-1]


def _planted(test: unittest.TestCase, files: Sequence[str], plants: Dict[str, str]) -> List[str]:
    """What the check reports for a copy of ``files`` once ``plants`` (file -> text) are appended; the copy alone passes."""
    copy = _part_of_runner(test, files)
    test.assertEqual(_reported(test, copy), [])
    for name, text in plants.items():
        _append(os.path.join(copy, *name.split("/")), text)
    return _reported(test, copy)


class LayerCheckTest(unittest.TestCase):
    maxDiff = None
    _tree: Optional[List[str]] = None

    @classmethod
    def tree(cls) -> List[str]:
        """What the check reports for the real ``runner/``, computed once."""
        if cls._tree is None:
            cls._tree = check_layers.violations(os.path.join(ROOT, "runner"))
        return cls._tree

    def test_the_runner_tree_passes_the_layer_check(self) -> None:
        self.assertEqual(self.tree(), [])

    def test_the_check_fails_on_a_deliberate_upward_import(self) -> None:
        # Each planted import alone fails the check, at module level or inside a function.
        for file, text, what in (
            ("effects.py", "\nfrom .proof.campaign import WINDOWS  # noqa\n",
             "runner/effects.py:\\d+: runner.effects imports runner.proof.campaign$"),
            ("stores/file.py", "\n\ndef _late():\n    from ..proof import demo  # noqa\n",
             "runner/stores/file.py:\\d+: runner.stores.file imports runner.proof.demo$"),
            ("adapters/artifact.py", "\nimport runner.proof.ticketservice  # noqa\n",
             "runner/adapters/artifact.py:\\d+: runner.adapters.artifact imports runner.proof.ticketservice$"),
            ("recovery.py", "\n\ndef _engine():\n    from .engines import temporal  # noqa\n",
             "runner/recovery.py:\\d+: runner.recovery imports runner.engines.temporal \\(an engine module"),
        ):
            with self.subTest(file=file):
                added = _planted(self, [file], {file: text})
                self.assertTrue(any(re.match(what, line) for line in added), (what, added))

    def test_the_program_entry_is_the_one_place_allowed_to_add_the_proof_verbs(self) -> None:
        module = "runner.__main__"
        targets = [t for _, t in check_layers.imported(os.path.join(ROOT, "runner", "__main__.py"), module)]
        self.assertTrue(any(t.startswith("runner.proof") for t in targets), targets)
        self.assertFalse([v for v in self.tree() if v.startswith("runner/__main__.py:")])

    def test_the_check_fails_on_a_planted_import_cycle(self) -> None:
        # lease imports errors at module level; errors importing lease back, inside a function, closes a cycle.
        plant = {"errors.py": "\n\ndef _late():\n    from .lease import lease_view  # noqa\n"}
        added = _planted(self, ["errors.py", "lease.py"], plant)
        self.assertEqual(len(added), 1, added)
        self.assertRegex(added[0], r"^runner/errors\.py:\d+: import cycle runner\.errors -> runner\.lease -> runner\.errors "
                                   r"\(runner/errors\.py:\d+, runner/lease\.py:\d+\)")

    def test_the_command_exits_1_and_prints_what_it_found(self) -> None:
        copy = _part_of_runner(self, ["errors.py", "lease.py"])
        _append(os.path.join(copy, "errors.py"), "\n\ndef _late():\n    from .lease import lease_view  # noqa\n")
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "check_layers.py"), copy], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.splitlines()[:-1], check_layers.violations(copy))
        self.assertEqual(proc.stdout.splitlines()[-1],
                         "layer check: 1 violation(s) (proof or engine imports, import cycles, private names of another package)")

    def test_the_check_fails_on_a_planted_private_import(self) -> None:
        # Taken by name, and read as an attribute of an imported module: both are another package's private names.
        by_name = _planted(self, ["adapters/artifact.py", "stores/file_scan.py"], {"adapters/artifact.py": "\nfrom ..stores.file_scan import _chain_from  # noqa\n"})
        self.assertEqual(len(by_name), 1, by_name)
        self.assertRegex(by_name[0], r"^runner/adapters/artifact\.py:\d+: runner\.adapters\.artifact imports the private name _chain_from "
                                     r"of runner\.stores\.file_scan \(another package\)$")
        read = _planted(self, ["steps.py", "stores/file_witness.py"], {"steps.py": "\n\ndef _seal():\n    from .stores import file_witness\n\n    return file_witness._head_seal\n"})
        self.assertEqual(len(read), 1, read)
        self.assertRegex(read[0], r"^runner/steps\.py:\d+: runner\.steps imports the private name _head_seal of runner\.stores\.file_witness ")
        # Modules of one package may share their private names: not reported.
        self.assertEqual(_planted(self, ["stores/sql.py", "stores/file_scan.py"], {"stores/sql.py": "\nfrom .file_scan import _chain_from as _shared  # noqa\n"}), [])


class CycleFindingTest(unittest.TestCase):
    """The cycle search on a small package of its own, where every edge is known."""

    def _package(self, files: Dict[str, str]) -> str:
        scratch = tempfile.mkdtemp(prefix="runner-layers-pkg-")
        self.addCleanup(shutil.rmtree, scratch, True)
        root = os.path.join(scratch, "pkg")
        for name, text in files.items():
            path = os.path.join(root, *name.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
        return root

    def test_a_chain_without_a_way_back_is_no_cycle(self) -> None:
        root = self._package({"__init__.py": "", "a.py": "from . import b\n", "b.py": "from .c import X\n", "c.py": "X = 1\n"})
        self.assertEqual(check_layers.violations(root), [])

    def test_each_group_is_reported_once_with_its_shortest_cycle(self) -> None:
        root = self._package({
            "__init__.py": "",
            "a.py": "from . import b\nfrom .sub import d\n",
            "b.py": "import pkg.c\n",
            "c.py": "def f():\n    from .a import g\n",
            "sub/__init__.py": "",
            "sub/d.py": "from ..a import h\n",
        })
        found = check_layers.violations(root)
        self.assertEqual(found, ["pkg/a.py:2: import cycle pkg.a -> pkg.sub.d -> pkg.a (pkg/a.py:2, pkg/sub/d.py:1); "
                                 "all of pkg.a, pkg.b, pkg.c, pkg.sub.d depend on each other"])


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
