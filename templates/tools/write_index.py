"""write_index.py: write index.json, each document of docs/ with its ticket, as the ticket service shows it.

The work of the run's second step (its check is check_index.py): run it once every ticket is
filed. It looks each ticket up by the key the contract gives it (doc-{slug}:ticket).
"""

import json
import os
import re
import subprocess
import sys


def slug(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    return re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    index = {}
    for name in sorted(os.listdir("docs")):
        if name.endswith(".md"):
            key = f"doc-{slug(name)}:ticket"
            found = subprocess.run([sys.executable, os.path.join(here, "find_ticket.py"), key], stdout=subprocess.PIPE)
            if found.returncode != 0:
                sys.stderr.write(f"no ticket found for docs/{name} ({key})\n")
                return 1
            index[f"docs/{name}"] = json.loads(found.stdout)["ticket"]
    with open("index.json", "w", encoding="utf-8") as handle:
        json.dump(index, handle, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
