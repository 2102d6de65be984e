"""Shared set-up of the batch tests: a workspace of documents, a batch contract, the commands it runs.

The command line on such a run is :class:`tests.support.cli.RunnerCli`.
"""

import os
import sys
from typing import Any, Dict, List, Optional

TASK = "batch-tickets"


def make_documents(root: str, count: int, folder: str = "docs") -> List[str]:
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    names = []
    for n in range(count):
        name = f"{folder}/doc-{n:05d}.txt"
        with open(os.path.join(root, name), "w", encoding="utf-8") as handle:
            handle.write(f"Review of document {n}\nquarterly record {n * 7919 % 100003}\n")
        names.append(name)
    return names


def batch_contract(commands: Dict[str, List[str]], *, items: Any = None, payload: Optional[Dict[str, Any]] = None,
                   timeout: float = 20, **extra: Any) -> Dict[str, Any]:
    step = {"id": "file-tickets", "items": items if items is not None else {"glob": "docs/*.txt"}, "key": "{stem}:ticket",
            "payload": payload if payload is not None else {"template": {"doc": "{stem}", "title": "{first_line}"}}, "next": "done"}
    block = {
        "contract": 1,
        "task_id": TASK,
        "goal": "File one ticket per document, each exactly once.",
        "workspace": ".",
        "steps": [step],
        "effects": {"invoke": commands["invoke"], "observe": commands["observe"], "timeout_seconds": timeout},
        "limits": {"max_effect_attempts": 4},
        "lease": {"ttl_seconds": 60},
    }
    block.update(extra)
    return block


def kill_env(root: str, window: str, nth: int = 1) -> Dict[str, str]:
    counter = os.path.join(root, f"kill-count-{window}")
    if os.path.exists(counter):
        os.unlink(counter)
    return {"RUNNER_KILL_AT": window, "RUNNER_KILL_NTH": str(nth), "RUNNER_KILL_COUNT": counter}


def script(root: str, name: str, text: str) -> List[str]:
    """Write ``text`` as ``root/name`` and return the command that runs it: ``sh`` for a ``.sh`` name, else Python without ``site``."""
    path = os.path.join(root, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return ["sh", path] if name.endswith(".sh") else [sys.executable, "-S", path]


def recorder_commands(root: str) -> Dict[str, List[str]]:
    """The contract's ``invoke`` and ``observe`` commands over the recording target (``tests/support/batch_scripts.py``).

    The target keeps its effects as files in ``ROOT/out``, which the caller makes.
    """
    from tests.support.batch_scripts import RECORDER

    recorder = script(root, "recorder.sh", RECORDER)
    out = os.path.join(root, "out")
    return {"invoke": recorder + ["invoke", "{item}", "{key}", out], "observe": recorder + ["observe", "{key}", out]}


def recorded(out: str, key: str) -> List[str]:
    """The arguments the recording target received for ``key``, as it received them."""
    with open(os.path.join(out, key + ".args"), "rb") as handle:
        return [argument.decode("utf-8") for argument in handle.read().split(b"\0")[:-1]]
