"""The package's layers (``tools/check_layers.py``): no import of ``runner.proof`` or an engine from the library, no
import cycle, no private name of another package, no import against the order of the packages, no module outside
them, and package docstrings that say what the tables say."""

import ast
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
    """Copy a module as an empty file, and a package's ``__init__`` as its docstring alone (the check reads it)."""
    text = ""
    if os.path.basename(source) == "__init__.py":
        with open(source, encoding="utf-8") as handle:
            doc = ast.get_docstring(ast.parse(handle.read()), clean=False)
        text = f"{doc!r}\n" if doc else ""
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(text)


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
            ("ledger/effects.py", "\nfrom ..proof.campaign import WINDOWS  # noqa\n",
             "runner/ledger/effects.py:\\d+: runner.ledger.effects imports runner.proof.campaign$"),
            ("stores/file.py", "\n\ndef _late():\n    from ..proof import demo  # noqa\n",
             "runner/stores/file.py:\\d+: runner.stores.file imports runner.proof.demo$"),
            ("adapters/artifact.py", "\nimport runner.proof.ticketservice  # noqa\n",
             "runner/adapters/artifact.py:\\d+: runner.adapters.artifact imports runner.proof.ticketservice$"),
            ("execution/recovery.py", "\n\ndef _engine():\n    from ..engines import temporal  # noqa\n",
             "runner/execution/recovery.py:\\d+: runner.execution.recovery imports runner.engines.temporal "
             "\\(an engine module"),
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
        # fs imports windows at module level; windows importing fs back, inside a function, closes a cycle.
        plant = {"base/windows.py": "\n\ndef _late():\n    from .fs import OsFileSystem  # noqa\n"}
        added = _planted(self, ["base/windows.py", "base/fs.py"], plant)
        self.assertEqual(len(added), 1, added)
        self.assertRegex(added[0], r"^runner/base/fs\.py:\d+: import cycle runner\.base\.fs -> runner\.base\.windows -> "
                                   r"runner\.base\.fs \(runner/base/fs\.py:\d+, runner/base/windows\.py:\d+\)")

    def test_the_command_exits_1_and_prints_what_it_found(self) -> None:
        copy = _part_of_runner(self, ["base/windows.py", "base/fs.py"])
        _append(os.path.join(copy, "base", "windows.py"), "\n\ndef _late():\n    from .fs import OsFileSystem  # noqa\n")
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "check_layers.py"), copy], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.splitlines()[:-1], check_layers.violations(copy))
        self.assertEqual(proc.stdout.splitlines()[-1],
                         f"layer check: 1 violation(s) ({check_layers.RULES})")
        self.assertEqual(check_layers.RULES, "proof or engine imports, import cycles, private names of another "
                                             "package, imports against the layers, modules outside the packages, "
                                             "package docstrings, reads of the plan outside runner.contract")

    def test_the_check_fails_on_a_planted_read_of_the_plan(self) -> None:
        # A module of the ledger that reads the plan itself, by subscript or by get, and not through contract_of.
        for text in ('\n\ndef _goal(state):\n    return state["plan"]["goal"]\n',
                     '\n\ndef _goal(state):\n    return state.get("plan", {}).get("goal")\n'):
            with self.subTest(text=text):
                added = _planted(self, ["ledger/steps.py"], {"ledger/steps.py": text})
                self.assertEqual(len(added), 1, added)
                self.assertRegex(added[0], r"^runner/ledger/steps\.py:\d+: runner\.ledger\.steps reads the run's plan "
                                           r"\(runner\.contract reads it: contract_of\)$")

    def test_the_check_fails_on_a_planted_private_import(self) -> None:
        # Taken by name, and read as an attribute of an imported module: both are another package's private names.
        by_name = _planted(self, ["adapters/artifact.py", "stores/file_scan.py"], {"adapters/artifact.py": "\nfrom ..stores.file_scan import _chain_from  # noqa\n"})
        self.assertEqual(len(by_name), 1, by_name)
        self.assertRegex(by_name[0], r"^runner/adapters/artifact\.py:\d+: runner\.adapters\.artifact imports the private name _chain_from "
                                     r"of runner\.stores\.file_scan \(another package\)$")
        read = _planted(self, ["surfaces/views.py", "stores/file_witness.py"],
                        {"surfaces/views.py": "\n\ndef _seal():\n    from ..stores import file_witness\n\n"
                                              "    return file_witness._head_seal\n"})
        self.assertEqual(len(read), 1, read)
        self.assertRegex(read[0], r"^runner/surfaces/views\.py:\d+: runner\.surfaces\.views imports the private name "
                                  r"_head_seal of runner\.stores\.file_witness ")
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


def _small_runner(test: unittest.TestCase, files: Dict[str, str]) -> str:
    """A small package named ``runner`` of its own: every package of the tables, each with the docstring the tables
    give it, a few modules that import down the layers, and ``files`` (path -> text) besides."""
    scratch = tempfile.mkdtemp(prefix="runner-layers-small-")
    test.addCleanup(shutil.rmtree, scratch, True)
    root = os.path.join(scratch, "runner")
    tree = {"__init__.py": '"""A small runner."""\n__version__ = "0"\n',
            "__main__.py": "from .surfaces import cli\nfrom .proof import demo\n",
            "base/errors.py": "import os\n",
            "ledger/effects.py": "from ..base import errors\n",
            "execution/lifecycle.py": "from ..ledger import effects\nfrom ..base.errors import os\n",
            "surfaces/cli.py": "from ..execution import lifecycle\nfrom .. import __version__\n",
            "engines/once.py": "from ..execution import lifecycle\n",
            "proof/demo.py": "from ..surfaces import cli\nfrom ..engines import once\n"}
    for package in (*check_layers.LAYERS, *check_layers.SIDE):
        sentence = check_layers.may_import(package)
        tree[package.split(".", 1)[1] + "/__init__.py"] = f'"""One package of a small runner.\n\n{sentence}\n"""\n'
    tree.update(files)
    for name, text in tree.items():
        path = os.path.join(root, *name.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    return root


class LayoutTest(unittest.TestCase):
    """The tables' rules (directions, placement, docstrings) on a small package named ``runner`` of its own."""

    maxDiff = None

    def test_a_package_that_follows_the_tables_passes(self) -> None:
        self.assertEqual(check_layers.violations(_small_runner(self, {})), [])

    def test_an_import_of_a_later_layer_is_reported_with_what_the_package_may_import(self) -> None:
        root = _small_runner(self, {
            "contract/text.py": "import json\n\n\ndef _late():\n    from ..execution import lifecycle  # noqa\n",
            "base/fs.py": "from ..ledger.effects import errors\n",
        })
        self.assertEqual(check_layers.violations(root), [
            "runner/base/fs.py:1: runner.base.fs imports runner.ledger.effects "
            "(runner.base may import the standard library only)",
            "runner/contract/text.py:5: runner.contract.text imports runner.execution.lifecycle "
            "(runner.contract may import runner.base)",
        ])

    def test_the_plan_is_read_by_the_contract_package_and_those_it_names(self) -> None:
        read = "def read(state):\n    return state[\"plan\"]\n"
        root = _small_runner(self, {
            "ledger/steps.py": "def steps(state):\n    return state[\"plan\"][\"steps\"]\n",
            "surfaces/views.py": "def goal(state):\n    return state.get(\"plan\", {}).get(\"goal\")\n",
            "contract/spec.py": read, "ledger/envelope.py": read, "stores/codec.py": read, "proof/sim.py": read,
            # Naming the plan's path in an op, or reading its digest, is no read of the plan.
            "ledger/migrate.py": ("def ops(state, block):\n"
                                  "    return [[\"set\", [\"plan\"], block]], state[\"plan_digest\"]\n"),
        })
        self.assertEqual(check_layers.violations(root), [
            "runner/ledger/steps.py:2: runner.ledger.steps reads the run's plan "
            "(runner.contract reads it: contract_of)",
            "runner/surfaces/views.py:2: runner.surfaces.views reads the run's plan "
            "(runner.contract reads it: contract_of)",
        ])

    def test_a_subpackage_counts_as_its_package(self) -> None:
        server = "from ..cli import lifecycle\nfrom ...execution import lifecycle as same\nfrom ...base import errors\n"
        ok = _small_runner(self, {"surfaces/mcp/__init__.py": "", "surfaces/mcp/server.py": server})
        self.assertEqual(check_layers.violations(ok), [])
        up = _small_runner(self, {"execution/world/__init__.py": "",
                                  "execution/world/threads.py": "from ...surfaces import cli\n"})
        self.assertEqual(check_layers.violations(up), [
            "runner/execution/world/threads.py:1: runner.execution.world.threads imports runner.surfaces.cli "
            "(runner.execution may import runner.base, runner.contract, runner.ledger, runner.stores, runner.calls, "
            "runner.adapters)"])

    def test_the_side_packages_import_what_their_row_names_and_no_layer_imports_them(self) -> None:
        root = _small_runner(self, {
            "engines/dbos_like.py": "from ..surfaces import cli\nfrom ..ledger import effects\n",
            "execution/flow.py": "from ..engines import once\n",
            "base/text.py": "\n\ndef _late():\n    from ..proof import demo  # noqa\n",
        })
        self.assertEqual(check_layers.violations(root), [
            # The proof rule's own words, for the package and its module: the layers' rule adds nothing.
            "runner/base/text.py:4: runner.base.text imports runner.proof",
            "runner/base/text.py:4: runner.base.text imports runner.proof.demo",
            "runner/engines/dbos_like.py:1: runner.engines.dbos_like imports runner.surfaces.cli "
            "(runner.engines may import runner.base, runner.contract, runner.ledger, runner.calls, runner.execution)",
            "runner/execution/flow.py:1: runner.execution.flow imports runner.engines.once "
            "(runner.execution may import runner.base, runner.contract, runner.ledger, runner.stores, runner.calls, "
            "runner.adapters)",
        ])

    def test_a_module_of_a_package_takes_only_the_version_from_the_top(self) -> None:
        root = _small_runner(self, {"ledger/steps.py": "from .. import __version__\nfrom .. import Run  # noqa\n",
                                    "surfaces/views.py": "import runner\n"})
        self.assertEqual(check_layers.violations(root), [
            "runner/ledger/steps.py:2: runner.ledger.steps imports runner.Run "
            "(a package's module may take only __version__ from runner)",
            "runner/surfaces/views.py:1: runner.surfaces.views imports runner "
            "(a package's module may take only __version__ from runner)",
        ])

    def test_a_module_outside_the_packages_is_reported(self) -> None:
        # Unplaced: a module at the top that is neither the program nor a former name, and a package of no layer.
        files = {"effects.py": "from .surfaces import cli\n", "mcp/__init__.py": "",
                 "mcp/server.py": "from ..effects import cli\n",
                 "ledger/approvals.py": "from .. import effects\nfrom ..mcp import server\n"}
        root = _small_runner(self, files)
        # Each module outside the packages is reported once; the imports of it and by it need not be.
        self.assertEqual(check_layers.violations(root), [
            "runner/effects.py: a module of the runner belongs to one of its packages",
            "runner/mcp/__init__.py: runner.mcp is in no package of the layers (runner.base, runner.contract, "
            "runner.ledger, runner.stores, runner.calls, runner.adapters, runner.execution, runner.surfaces, "
            "runner.engines, runner.proof)",
            "runner/mcp/server.py: runner.mcp.server is in no package of the layers (runner.base, runner.contract, "
            "runner.ledger, runner.stores, runner.calls, runner.adapters, runner.execution, runner.surfaces, "
            "runner.engines, runner.proof)",
        ])

    def test_a_former_name_becomes_a_shim_once_its_module_exists(self) -> None:
        shim = ('"""Former name of runner.execution.run."""\nimport sys\nfrom .execution import run as _module\n\n'
                'sys.modules[__name__] = _module\n')
        # Without the module it names, runner/run.py is a module outside the packages like any other.
        before = _small_runner(self, {"run.py": "from .surfaces import cli\n",
                                      "ledger/lease.py": "from .. import run\n"})
        self.assertEqual(check_layers.violations(before),
                         ["runner/run.py: a module of the runner belongs to one of its packages"])
        after = _small_runner(self, {"execution/run.py": "from ..ledger import effects\n", "run.py": shim})
        self.assertEqual(check_layers.violations(after), [], "a shim is placed: it is at the top by right")
        wrong = _small_runner(self, {"execution/run.py": "", "run.py": shim + "from .ledger import effects  # noqa\n",
                                     "surfaces/verbs.py": "from ..run import Run  # noqa\n",
                                     "ledger/lease.py": "\n\ndef _late():\n    import runner.run  # noqa\n"})
        self.assertEqual(check_layers.violations(wrong), [
            "runner/ledger/lease.py:4: runner.ledger.lease imports runner.run, a former name kept for harnesses "
            "(import runner.execution.run)",
            "runner/run.py:6: runner.run imports runner.ledger.effects "
            "(a former name imports only runner.execution.run)",
            "runner/surfaces/verbs.py:1: runner.surfaces.verbs imports runner.run, a former name kept for harnesses "
            "(import runner.execution.run)",
        ])

    def test_each_package_docstring_ends_with_what_the_tables_say_it_may_import(self) -> None:
        root = _small_runner(self, {
            "ledger/__init__.py": '"""The ledger.\n\nMay import: runner.base."""\n',
            "execution/__init__.py": "",
            "proof/__init__.py": '"""What proves.\n\nMay import: any package; only runner/__main__.py imports it.\n\n'
                                 'More."""\n',
        })
        self.assertEqual(check_layers.violations(root), [
            "runner/execution/__init__.py:1: the docstring of runner.execution does not end with "
            "'May import: runner.base, runner.contract, runner.ledger, runner.stores, runner.calls, runner.adapters.'",
            "runner/ledger/__init__.py:1: the docstring of runner.ledger does not end with 'May import: runner.base, "
            "runner.contract.'",
            "runner/proof/__init__.py:1: the docstring of runner.proof does not end with "
            "'May import: any package; only runner/__main__.py imports it.'",
        ])
        # A sentence wrapped over two lines reads the same.
        wrapped = _small_runner(self, {"ledger/__init__.py":
                                       '"""The ledger.\n\nMay import: runner.base,\n    runner.contract.\n"""\n'})
        self.assertEqual(check_layers.violations(wrapped), [])

    def test_the_sentences_say_the_tables(self) -> None:
        self.assertEqual(check_layers.may_import("runner.base"), "May import: the standard library only.")
        self.assertEqual(check_layers.may_import("runner.contract"), "May import: runner.base.")
        self.assertEqual(check_layers.may_import("runner.surfaces"),
                         "May import: runner.base, runner.contract, runner.ledger, runner.stores, runner.calls, "
                         "runner.adapters, runner.execution.")
        self.assertEqual(check_layers.may_import("runner.engines"),
                         "May import: runner.base, runner.contract, runner.ledger, runner.calls, runner.execution; "
                         "no module of the runner imports it.")
        self.assertEqual(check_layers.may_import("runner.proof"),
                         "May import: any package; only runner/__main__.py imports it.")

    def test_a_tree_of_another_name_is_judged_by_the_first_four_rules_only(self) -> None:
        root = _small_runner(self, {"base/fs.py": "from ..ledger.effects import errors\n", "effects.py": ""})
        other = os.path.join(os.path.dirname(root), "pkg")
        os.rename(root, other)
        self.assertEqual(check_layers.violations(other), [])


class FormerNamesTest(unittest.TestCase):
    """A former name kept for harnesses is the module it names, not a copy: patching either patches both."""

    def test_each_former_name_is_its_module(self) -> None:
        import importlib

        for former, module in check_layers.COMPAT.items():
            with self.subTest(former=former):
                self.assertTrue(os.path.exists(os.path.join(ROOT, *former.split(".")) + ".py"), f"{former} has no shim")
                self.assertIs(importlib.import_module(former), importlib.import_module(module))
                parent, _, name = former.rpartition(".")
                self.assertIs(getattr(importlib.import_module(parent), name), importlib.import_module(module))


class ReadmeMapTest(unittest.TestCase):
    """README.md's map of runner/ names every package and every file at the top, and where it says a thing is, it is."""

    def setUp(self) -> None:
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
            text = handle.read()
        found = re.search(r"```text\n( *runner/ .*?)```", text, re.S)
        self.assertIsNotNone(found, "README.md has no map of runner/")
        assert found is not None
        self.map = found.group(1)
        self.where = re.split(r"\n(?:\n|- )", text[found.end():].strip(), maxsplit=1)[0]

    def test_every_package_and_file_at_the_top_is_on_the_map(self) -> None:
        named = set(re.findall(r"^ +(\w+/) ", self.map, re.M)) | set(re.findall(r"(\w+\.py)\b", self.map))
        packages = {name.rpartition(".")[2] + "/" for name in (*check_layers.LAYERS, *check_layers.SIDE)}
        files = {name for name in os.listdir(os.path.join(ROOT, "runner")) if name.endswith(".py")}
        self.assertEqual(packages - named, set())
        self.assertEqual(files - named, set())

    def test_each_thing_is_where_the_map_says(self) -> None:
        self.assertTrue(self.where.startswith("Where is"), self.where)
        places = re.findall(r"`([\w/]+\.py)`([^.]*)", self.where)
        self.assertGreater(len(places), 4)
        for path, rest in places:
            with self.subTest(path=path):
                with open(os.path.join(ROOT, "runner", *path.split("/")), encoding="utf-8") as handle:
                    source = handle.read()
                for name in re.findall(r"`(\w+)`", rest):
                    defined = re.search(rf"(?m)^(?:def |class )?{name}\b", source)
                    self.assertIsNotNone(defined, f"{name} is not defined at the top of {path}")


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
