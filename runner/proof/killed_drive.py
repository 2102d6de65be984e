"""``python3 -m runner.proof.killed_drive RUN_DIR OWNER WINDOW NTH PARALLEL``: a ``drive`` that dies at a commit window.

A run whose contract calls its target in process (``effects.http``) has no
command to wrap with a killer, so this process opens the run with
:class:`runner.proof.faults.KillAt` as the store's observer and runs a
:class:`runner.execution.drive.Driver` (what the ``drive`` verb is a thin
layer over): it dies by SIGKILL at the NTH pass through WINDOW, or prints
drive's result and exits with its code if the window is never reached.
"""

import json
import sys
from typing import List

from ..execution.drive import DriveOptions, Driver
from ..execution.run import Run
from ..stores.file import RunStore
from ..surfaces.verbs import default_ttl
from .faults import KillAt


def main(argv: List[str]) -> int:
    folder, owner, window, nth, parallel = argv
    run = Run(RunStore.open(folder, observer=KillAt(window, int(nth))))
    result = Driver.with_new_executor(run, owner, DriveOptions(default_ttl(run.state)), parallel=int(parallel)).drive()
    print(json.dumps({k: result.get(k) for k in ("decision", "reason", "exit_code", "detail")}))
    return int(result["exit_code"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
