"""Fail when a module under the given folder imports anything outside the standard library.

Every import is checked, at module level or inside a function. The runner's
own package is allowed. Needs Python 3.10+ (``sys.stdlib_module_names``).
"""

import ast
import os
import sys

ALLOWED = {"runner"}


def imports(path: str):
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def main(folder: str) -> int:
    stdlib = set(sys.stdlib_module_names) | ALLOWED
    bad = []
    for dirpath, _, files in os.walk(folder):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                for line, module in imports(path):
                    if module.split(".")[0] not in stdlib:
                        bad.append(f"{path}:{line}: imports {module}")
    for line in bad:
        print(line)
    print(f"standard-library check: {len(bad)} non-standard import(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runner"))
