"""Fail when the imports inside ``runner/`` break its layering.

The rules, each reported as ``path:line: what`` (paths relative to the folder
that holds the checked package), every import statement counted whether it
sits at module level or inside a function:

* **proof**: ``runner/proof/`` (fault injection, the conformance kit, the
  crash-state explorer, the ticket service, demo, campaign, bench) may import
  the library; nothing else under ``runner/`` imports ``runner.proof``, except
  ``runner/__main__.py``: the program, which adds the proof verbs to the
  library's command line.
* **engines**: the engine modules (``runner.engines.temporal``,
  ``runner.engines.dbos``) import their engine's SDK; only a harness that
  chose an engine imports them, never a module outside ``runner.engines``.
* **cycles**: no module depends on itself through other modules. An import
  inside a function is a dependency like any other: deferring it only hides
  the cycle from the interpreter's import order, which is how cycles usually
  survive, so it counts. Each strongly connected group of modules is reported
  once, as its shortest cycle (and the group's members when there are more).
* **private names**: a module does not take a name with a leading underscore
  (dunders aside) from a module of another package, neither by
  ``from M import _x`` nor by ``M._x`` on an imported module. Modules of one
  package may share such names among themselves.

* **layers**: the runner's packages are stacked (:data:`LAYERS`): a module
  of one may import a module of its own package or of a package before it,
  never one after it; a subpackage counts as its package. The packages
  beside the stack (:data:`SIDE`) may import what their row names, and no
  module of the stack imports them. Anything may take ``__version__`` from
  ``runner``, and nothing else from the top (:data:`TOP`). Reported as
  ``runner/ledger/effects.py:12: runner.ledger.effects imports
  runner.execution.lifecycle (runner.ledger may import runner.base,
  runner.contract)``.
* **placement**: a module directly under ``runner/`` is one of :data:`TOP`
  or a former name kept for harnesses (:data:`COMPAT`), which imports only
  the module it names and which no module of the runner imports; every other
  module lives in a package of :data:`LAYERS` or :data:`SIDE`. A former name
  whose module is missing is a module outside the packages like any other.
* **package docstrings**: the docstring of each package of :data:`LAYERS`
  and :data:`SIDE` ends with the sentence that says what it may import, as
  :func:`may_import` words it from the tables, so that the two cannot
  disagree.
* **one reader of the plan**: a run's plan (a subscript ``["plan"]`` or a
  ``.get("plan")``) is read in ``runner.contract``, which gives every other
  module its specs (``contract_of(state)``), and besides it only where
  :data:`PLAN_READERS` says: the envelope makes the plan, the stores keep it
  and its digest, the proof package builds plans of its own. Reported as
  ``runner/ledger/steps.py:42: runner.ledger.steps reads the run's plan
  (runner.contract reads it: contract_of)``.

Relative imports are resolved against the importing module's package. An
import names the module it loads (``from P import m`` names ``P.m`` when
``m`` is a module of the tree, else ``P``); the parent packages that Python
loads on the way are not counted as dependencies. The last four rules apply
to the tree of the package that :data:`LAYOUT` names (``runner``); the first
four to any tree.
"""

import ast
import os
import sys
from collections import deque
from typing import Dict, Iterator, List, Mapping, NamedTuple, Optional, Set, Tuple, Union

PROOF = "runner.proof"
#: Modules that pull in a third-party SDK when imported.
ENGINE_MODULES = ("runner.engines.temporal", "runner.engines.dbos")
#: The one composition point allowed to import the proof package.
PROGRAM = os.path.join("runner", "__main__.py")

#: The runner's packages, in layer order: a module of one may import modules of its own package and of those before it.
LAYERS = ("runner.base", "runner.contract", "runner.ledger", "runner.stores", "runner.calls",
          "runner.adapters", "runner.execution", "runner.surfaces")
#: Packages beside the layers and what each may import ("any": every package). No module of the layers imports
#: them: the engines are imported by harnesses that chose one, the proof package only by the program.
SIDE: Mapping[str, Union[str, Tuple[str, ...]]] = {
    "runner.engines": ("runner.base", "runner.contract", "runner.ledger", "runner.calls", "runner.execution"),
    "runner.proof": "any",
}
#: Former names kept for harnesses, each the module it names: a shim that imports only its target.
COMPAT = {"runner.run": "runner.execution.run", "runner.verbs": "runner.surfaces.verbs",
          "runner.target": "runner.calls.target", "runner.windows": "runner.base.windows",
          "runner.recovery": "runner.execution.recovery", "runner.history": "runner.surfaces.history",
          "runner.jobs": "runner.execution.jobs", "runner.pool": "runner.execution.pool"}
#: The modules at the top: what a harness imports (lazily) and the program.
TOP = ("runner", "runner.__main__")
#: Where a run's plan is read besides runner.contract (a module, or a package and its modules): the envelope makes
#: it, the stores keep it and its digest, and the proof package builds plans of its own and looks into them.
PLAN_READERS = ("runner.contract", "runner.ledger.envelope", "runner.stores", "runner.proof")


class Layout(NamedTuple):
    """The tables the layer, placement and docstring rules read, for the package named first in ``top``."""

    layers: Tuple[str, ...]
    side: Mapping[str, Union[str, Tuple[str, ...]]]
    compat: Mapping[str, str]
    top: Tuple[str, ...]
    plan_readers: Tuple[str, ...]

    @property
    def package(self) -> str:
        return self.top[0]

    def home(self, module: str) -> Optional[str]:
        """The package of LAYERS or SIDE that ``module`` belongs to (subpackages included), or None: unplaced."""
        return next((package for package in (*self.layers, *self.side) if _under(module, package)), None)

    def allowed(self, package: str) -> Union[str, Tuple[str, ...]]:
        """The packages a module of ``package`` may import besides its own, or "any"."""
        if package in self.side:
            return self.side[package]
        return self.layers[: self.layers.index(package)]


LAYOUT = Layout(LAYERS, SIDE, COMPAT, TOP, PLAN_READERS)


def may_import(package: str, layout: Layout = LAYOUT) -> str:
    """The sentence that ends ``package``'s docstring: what its modules may import, and for a side package who
    imports it."""
    allowed = layout.allowed(package)
    if allowed == "any":
        return f"May import: any package; only {PROGRAM.replace(os.sep, '/')} imports it."
    listed = ", ".join(allowed) if allowed else "the standard library only"
    return f"May import: {listed}{'; no module of the runner imports it' if package in layout.side else ''}."


class Use(NamedTuple):
    """One use of another module: the module it names and, for a name taken from it, that name."""

    line: int
    target: str
    name: Optional[str] = None


def module_name(root: str, path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(os.path.abspath(root)))
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str, path: str) -> str:
    """The package a module belongs to: itself for a package's ``__init__``, else its parent."""
    return module if os.path.basename(path) == "__init__.py" else module.rpartition(".")[0]


def _parse(path: str) -> List[ast.AST]:
    """The file's import statements, attribute reads, subscripts and calls, in ``ast.walk``'s order: all that the
    readers below look at, found in one walk of the tree."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    wanted = (ast.Import, ast.ImportFrom, ast.Attribute, ast.Subscript, ast.Call)
    return [node for node in ast.walk(tree) if isinstance(node, wanted)]


def _names_plan(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == "plan"


def plan_reads(nodes: List[ast.AST]) -> List[int]:
    """The lines of ``nodes`` (as :func:`_parse` gives them) that read a plan: ``x["plan"]`` or ``x.get("plan")``."""
    lines = set()
    for node in nodes:
        if isinstance(node, ast.Subscript) and _names_plan(node.slice):
            lines.add(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and _names_plan(node.args[0])):
            lines.add(node.lineno)
    return sorted(lines)


def _from_target(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported(path: str, module: str, nodes: Optional[List[ast.AST]] = None) -> Iterator[Tuple[int, str]]:
    """``(line, absolute module)`` for every import in the file, and ``target.name`` for each name of a from-import.

    :param nodes: the file's nodes as :func:`_parse` gives them, when already read.
    """
    package = package_of(module, path)
    for node in _parse(path) if nodes is None else nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            yield node.lineno, target
            for alias in node.names:  # "from . import proof" names the package too
                yield node.lineno, f"{target}.{alias.name}"


def _dotted(node: ast.AST) -> Optional[List[str]]:
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def uses(path: str, module: str, known: Set[str], nodes: Optional[List[ast.AST]] = None) -> List[Use]:
    """Every module of ``known`` the file names, and every name it takes from one.

    ``from P import n`` is a use of module ``P.n`` when that is in ``known``,
    else of the name ``n`` of ``P``. An attribute read on a module bound by an
    import (``import a.b as m; m._x`` or ``a.b._x``) is a use of that name.
    """
    package = package_of(module, path)
    found: List[Use] = []
    bound: Dict[str, str] = {}  # a local name -> the module it stands for
    attributes: List[ast.Attribute] = []
    for node in _parse(path) if nodes is None else nodes:
        if isinstance(node, ast.Attribute):
            attributes.append(node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Use(node.lineno, alias.name))
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    bound[head] = head
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            for alias in node.names:
                whole = f"{target}.{alias.name}"
                if whole in known:
                    found.append(Use(node.lineno, whole))
                    bound[alias.asname or alias.name] = whole
                else:
                    found.append(Use(node.lineno, target, alias.name))
    for node in attributes:
        parts = _dotted(node.value)
        if parts and parts[0] in bound:
            owner = ".".join([bound[parts[0]], *parts[1:]])
            if owner in known:
                found.append(Use(node.lineno, owner, node.attr))
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _modules(root: str) -> Dict[str, str]:
    found = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                found[module_name(root, path)] = path
    return found


def _components(graph: Dict[str, Dict[str, int]]) -> List[List[str]]:
    """Tarjan's strongly connected components of more than one module (each sorted), iteratively."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    groups: List[List[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def _cycle_through(graph: Dict[str, Dict[str, int]], members: Set[str], start: str) -> List[str]:
    """The shortest path from ``start`` back to itself that stays inside ``members``."""
    came: Dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node]):
            if child not in members:
                continue
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return [start, *path[::-1][1:], start]
            if child not in came:
                came[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is on no cycle inside {sorted(members)}")


def _shortest_cycle(graph: Dict[str, Dict[str, int]], group: List[str]) -> List[str]:
    """The group's shortest cycle; of equal ones, the first by the names along it."""
    members = set(group)
    return min((_cycle_through(graph, members, start) for start in group), key=lambda cycle: (len(cycle), cycle))


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _has_own_rule(target: str) -> bool:
    """An import the proof and engines rules already judge, wherever it is made from."""
    return _under(target, PROOF) or any(_under(target, e) for e in ENGINE_MODULES)


def _placement(modules: Dict[str, str], top: str, layout: Layout) -> List[str]:
    """Each module outside the packages of the layout, and each shim of a former name that imports
    anything of the runner but the module it names."""
    bad = []
    for module, path in modules.items():
        rel = os.path.relpath(path, top)
        shim = layout.compat.get(module)
        if shim is not None and shim in modules:
            for use in uses(path, module, set(modules)):
                if _under(use.target, layout.package) and use.target != shim:
                    bad.append(f"{rel}:{use.line}: {module} imports {use.target} (a former name imports only {shim})")
        elif module in layout.top or layout.home(module) is not None:
            continue
        elif module.count(".") == 1 and os.path.basename(path) != "__init__.py":
            bad.append(f"{rel}: a module of the runner belongs to one of its packages")
        else:
            bad.append(f"{rel}: {module} is in no package of the layers ({', '.join((*layout.layers, *layout.side))})")
    return bad


def _direction(module: str, rel: str, use: Use, layout: Layout, modules: Dict[str, str]) -> Optional[str]:
    """What is wrong with ``module`` using ``use``, by the layers and the former names, or None."""
    target = use.target
    shim = layout.compat.get(target)
    if shim is not None and shim in modules:
        return f"{rel}:{use.line}: {module} imports {target}, a former name kept for harnesses (import {shim})"
    mine, theirs = layout.home(module), layout.home(target)
    if mine is None or _has_own_rule(target):
        return None  # at the top, outside the packages (placement reports it), or judged by the proof and engines rules
    if target in layout.top:
        if target == layout.package and use.name == "__version__":
            return None
        what = f"{target}.{use.name}" if use.name else target
        return (f"{rel}:{use.line}: {module} imports {what} "
                f"(a package's module may take only __version__ from {layout.package})")
    if theirs is None or theirs == mine:
        return None
    allowed = layout.allowed(mine)
    if allowed == "any" or theirs in allowed:
        return None
    said = ", ".join(allowed) if allowed else "the standard library only"
    return f"{rel}:{use.line}: {module} imports {target} ({mine} may import {said})"


def _docstrings(modules: Dict[str, str], top: str, layout: Layout) -> List[str]:
    """Each package of the layout whose docstring does not end with what :func:`may_import` says of it."""
    bad = []
    for package in (*layout.layers, *layout.side):
        path = modules.get(package)
        if path is None or os.path.basename(path) != "__init__.py":
            continue
        with open(path, encoding="utf-8") as handle:
            doc = ast.get_docstring(ast.parse(handle.read(), path)) or ""
        words, sentence = " ".join(doc.split()), may_import(package, layout)
        if words != sentence and not words.endswith(" " + sentence):
            bad.append(f"{os.path.relpath(path, top)}:1: the docstring of {package} does not end with {sentence!r}")
    return bad


def violations(root: str, layout: Layout = LAYOUT) -> List[str]:
    """Every violation of the rules in ``root``'s tree, sorted; the layout's rules only when it is the layout's
    package."""
    root = os.path.abspath(root)
    top = os.path.dirname(root)
    modules = _modules(root)
    known = set(modules)
    laid_out = os.path.basename(root) == layout.package
    graph: Dict[str, Dict[str, int]] = {name: {} for name in modules}
    bad = []
    for module, path in modules.items():
        rel = os.path.relpath(path, top)
        nodes = _parse(path)
        in_proof = module == PROOF or module.startswith(PROOF + ".")
        for line, target in imported(path, module, nodes):
            if in_proof or path.endswith(os.sep + PROGRAM):
                break
            if target == PROOF or target.startswith(PROOF + "."):
                bad.append(f"{rel}:{line}: {module} imports {target}")
            elif (any(target == e or target.startswith(e + ".") for e in ENGINE_MODULES) and
                  not module.startswith("runner.engines")):
                bad.append(f"{rel}:{line}: {module} imports {target} (an engine module, for harnesses that chose it)")
        for use in uses(path, module, known, nodes):
            if use.target not in known:
                continue
            if use.target != module:
                graph[module].setdefault(use.target, use.line)
            if (use.name is not None and _private(use.name) and
                    package_of(use.target, modules[use.target]) != package_of(module, path)):
                bad.append(f"{rel}:{use.line}: {module} imports the private name {use.name} of {use.target} (another "
                           "package)")
            wrong = _direction(module, rel, use, layout, modules) if laid_out and use.target != module else None
            if wrong is not None:
                bad.append(wrong)
        if laid_out and not any(_under(module, reader) for reader in layout.plan_readers):
            bad.extend(f"{rel}:{line}: {module} reads the run's plan (runner.contract reads it: contract_of)"
                       for line in plan_reads(nodes))
    if laid_out:
        bad.extend(_placement(modules, top, layout))
        bad.extend(_docstrings(modules, top, layout))
    for group in _components(graph):
        cycle = _shortest_cycle(graph, group)
        first = cycle[0]
        hops = ", ".join(f"{os.path.relpath(modules[a], top)}:{graph[a][b]}" for a, b in zip(cycle, cycle[1:]))
        more = "" if len(group) == len(cycle) - 1 else f"; all of {', '.join(group)} depend on each other"
        line = graph[first][cycle[1]]
        bad.append(f"{os.path.relpath(modules[first], top)}:{line}: import cycle {' -> '.join(cycle)} ({hops}){more}")
    return sorted(set(bad))


#: The rules, as the summary line names them.
RULES = ("proof or engine imports, import cycles, private names of another package, imports against the layers, "
         "modules outside the packages, package docstrings, reads of the plan outside runner.contract")


def main(root: str) -> int:
    bad = violations(root)
    for line in bad:
        print(line)
    print(f"layer check: {len(bad)} violation(s) ({RULES})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runner"))
