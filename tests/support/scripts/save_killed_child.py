"""The child of ``tests/test_http_save.py``: ``drive`` a run until a saved answer's temporary file is written.

``python -m tests.support.scripts.save_killed_child RUN_DIR OWNER`` runs a
:class:`runner.execution.drive.Driver` whose HTTP adapter writes saved answers
through a file system that SIGKILLs this process when it is asked to rename the
first temporary file over its target: the answer is in ``PATH.tmp``, synced, and
``PATH`` was never written. It prints drive's result if it ever returns (the
test then fails: no answer was saved).
"""

import json
import os
import signal
import sys

from runner.adapters import http
from runner.base.fs import OsFileSystem
from runner.execution.drive import DriveOptions, Driver
from runner.execution.run import Run
from runner.stores.file import RunStore


class KilledAtRename(OsFileSystem):
    def replace(self, src: str, dst: str) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list) -> int:
    folder, owner = argv
    http._FS = KilledAtRename()  # type: ignore[attr-defined]
    run = Run(RunStore.open(folder))
    result = Driver.with_new_executor(run, owner, DriveOptions(60)).drive()
    print(json.dumps({k: result.get(k) for k in ("decision", "reason", "exit_code", "detail")}))
    return int(result["exit_code"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
