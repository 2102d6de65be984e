"""Fail when the imports inside ``runner/`` break its layering.

Four rules, each reported as ``path:line: what`` (paths relative to the folder
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

Relative imports are resolved against the importing module's package. An
import names the module it loads (``from P import m`` names ``P.m`` when
``m`` is a module of the tree, else ``P``); the parent packages that Python
loads on the way are not counted as dependencies.
"""

import ast
import os
import sys
from collections import deque
from typing import Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

PROOF = "runner.proof"
#: Modules that pull in a third-party SDK when imported.
ENGINE_MODULES = ("runner.engines.temporal", "runner.engines.dbos")
#: The one composition point allowed to import the proof package.
PROGRAM = os.path.join("runner", "__main__.py")


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
    """The file's import statements and attribute reads, in ``ast.walk``'s order: all that the readers below look at,
    found in one walk of the tree."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom, ast.Attribute))]


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


def violations(root: str) -> List[str]:
    root = os.path.abspath(root)
    top = os.path.dirname(root)
    modules = _modules(root)
    known = set(modules)
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
            elif any(target == e or target.startswith(e + ".") for e in ENGINE_MODULES) and not module.startswith("runner.engines"):
                bad.append(f"{rel}:{line}: {module} imports {target} (an engine module, for harnesses that chose it)")
        for use in uses(path, module, known, nodes):
            if use.target not in known:
                continue
            if use.target != module:
                graph[module].setdefault(use.target, use.line)
            if use.name is not None and _private(use.name) and package_of(use.target, modules[use.target]) != package_of(module, path):
                bad.append(f"{rel}:{use.line}: {module} imports the private name {use.name} of {use.target} (another package)")
    for group in _components(graph):
        cycle = _shortest_cycle(graph, group)
        first = cycle[0]
        hops = ", ".join(f"{os.path.relpath(modules[a], top)}:{graph[a][b]}" for a, b in zip(cycle, cycle[1:]))
        more = "" if len(group) == len(cycle) - 1 else f"; all of {', '.join(group)} depend on each other"
        line = graph[first][cycle[1]]
        bad.append(f"{os.path.relpath(modules[first], top)}:{line}: import cycle {' -> '.join(cycle)} ({hops}){more}")
    return sorted(set(bad))


def main(root: str) -> int:
    bad = violations(root)
    for line in bad:
        print(line)
    print(f"layer check: {len(bad)} violation(s) (proof or engine imports, import cycles, private names of another package)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runner"))
