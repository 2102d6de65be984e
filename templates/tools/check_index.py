"""check_index.py INDEX: exit 0 when INDEX names a ticket for every document in docs/, else 1 saying which is missing.

The check of the run's second step; the runner runs it and hashes index.json itself.
"""

import json
import os
import sys


def main(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as handle:
            index = json.load(handle)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"{path}: {exc}\n")
        return 1
    missing = [f"docs/{n}" for n in sorted(os.listdir("docs")) if n.endswith(".md") and not index.get(f"docs/{n}")]
    if missing:
        sys.stderr.write(f"{path} has no ticket for {', '.join(missing[:5])}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
