"""Fail when the library imports what exists only to prove or demonstrate it.

``runner/proof/`` (fault injection, the conformance kit, the crash-state
explorer, the ticket service, demo, campaign, bench) may import the library;
nothing else under ``runner/`` may import ``runner.proof``, at module level or
inside a function, except ``runner/__main__.py``: the program, which adds the
proof verbs to the library's command line. Relative imports are resolved
against the importing module's package.

Likewise the engine modules (``runner.engines.temporal``, ``runner.engines.dbos``),
which import their engine's SDK: only a harness that chose an engine imports
them, never another module of the runner.
"""

import ast
import os
import sys
from typing import Iterator, List, Tuple

PROOF = "runner.proof"
#: Modules that pull in a third-party SDK when imported.
ENGINE_MODULES = ("runner.engines.temporal", "runner.engines.dbos")
#: The one composition point allowed to import the proof package.
PROGRAM = os.path.join("runner", "__main__.py")


def module_name(root: str, path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(os.path.abspath(root)))
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: str, module: str) -> Iterator[Tuple[int, str]]:
    """``(line, absolute module)`` for every import in the file."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # "from . import proof" names the package too
                yield node.lineno, f"{target}.{alias.name}"


def violations(root: str) -> List[str]:
    root = os.path.abspath(root)
    bad = []
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            module = module_name(root, path)
            if module == PROOF or module.startswith(PROOF + "."):
                continue
            if path.endswith(os.sep + PROGRAM):
                continue
            for line, target in imported(path, module):
                if target == PROOF or target.startswith(PROOF + "."):
                    bad.append(f"{os.path.relpath(path)}:{line}: {module} imports {target}")
                elif any(target == e or target.startswith(e + ".") for e in ENGINE_MODULES) and not module.startswith("runner.engines"):
                    bad.append(f"{os.path.relpath(path)}:{line}: {module} imports {target} (an engine module, for harnesses that chose it)")
    return sorted(set(bad))


def main(root: str) -> int:
    bad = violations(root)
    for line in bad:
        print(line)
    print(f"layer check: {len(bad)} import(s) of {PROOF} from outside it")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runner"))
