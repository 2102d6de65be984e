"""Fail when a module under the given folder imports anything outside the standard library.

Every import is checked, at module level or inside a function. The runner's
own package is allowed, and so are the optional extras below, but only inside
a function (imported when that feature is selected, never on the default
path). An engine module (``runner/engines/temporal.py``, ``dbos.py``) is
itself the selection: it may import its engine at module level, and no other
module may import it. Needs Python 3.10+ (``sys.stdlib_module_names``).
"""

import ast
import os
import sys

ALLOWED = {"runner"}
#: Standard-library modules of the other supported Pythons: 3.12 renamed the built-in SHA-256 module.
OTHER_PYTHONS = {"_sha256", "_sha2"}
#: Optional extras: the PostgreSQL store's driver.
OPTIONAL = {"psycopg"}
#: Engine modules and the one engine each may import: imported only by a harness that chose it.
ENGINES = {os.path.join("engines", "temporal.py"): "temporalio", os.path.join("engines", "dbos.py"): "dbos"}
ENGINE_MODULES = {"runner.engines.temporal", "runner.engines.dbos"}


def imports(path: str):
    """``(line, module, at_module_level)`` for every absolute import in the file."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Try):
            top.update(id(n) for part in (node.body, node.orelse, node.finalbody) for n in part)
            top.update(id(n) for handler in node.handlers for n in handler.body)
        top.add(id(node))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, id(node) in top
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, id(node) in top


def main(folder: str) -> int:
    stdlib = set(sys.stdlib_module_names) | ALLOWED | OTHER_PYTHONS
    bad = []
    for dirpath, _, files in os.walk(folder):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                engine = next((e for suffix, e in ENGINES.items() if path.endswith(os.sep + suffix)), None)
                for line, module, module_level in imports(path):
                    name = module.split(".")[0]
                    if module in ENGINE_MODULES or any(module.startswith(m + ".") for m in ENGINE_MODULES):
                        bad.append(f"{path}:{line}: imports {module} (an engine module is imported only by the harness "
                                   "that chose it)")
                        continue
                    if name in stdlib or (name in OPTIONAL and not module_level) or name == engine:
                        continue
                    bad.append(f"{path}:{line}: imports {module}"
                               + (" at module level (an optional extra is imported only when selected)"
                                  if name in OPTIONAL else ""))
    for line in bad:
        print(line)
    print(f"standard-library check: {len(bad)} non-standard import(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runner"))
