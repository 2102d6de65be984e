"""The child of ``tests/test_http_drive.py``: ``drive`` a run until one named effect window kills this process.

``python -m tests.support.scripts.http_drive_child RUN_DIR OWNER WINDOW`` opens the run with
:class:`runner.proof.faults.KillAt` on WINDOW (its first pass) as the observer
of the store, so a :class:`runner.execution.drive.Driver` (what the ``drive`` verb is a
thin layer over) dies by SIGKILL there. It prints drive's result if it ever
returns (the test then fails: the window was never reached).
"""

import json
import sys

from runner.execution.drive import DriveOptions, Driver
from runner.proof.faults import KillAt
from runner.execution.run import Run
from runner.stores.file import RunStore


def main(argv: list) -> int:
    folder, owner, window = argv
    run = Run(RunStore.open(folder, observer=KillAt(window)))
    result = Driver.with_new_executor(run, owner, DriveOptions(60)).drive()
    print(json.dumps({k: result.get(k) for k in ("decision", "reason", "exit_code", "detail")}))
    return int(result["exit_code"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
