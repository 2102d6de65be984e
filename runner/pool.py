"""Former name of runner.execution.pool, kept for harnesses: the same module object; run as a program
(``python3 -m runner.pool``, as the runner of the previous release starts it), the same program."""

import sys

if __name__ == "__main__":
    import runpy

    runpy.run_module("runner.execution.pool", run_name="__main__", alter_sys=True)
else:
    from .execution import pool as _module

    sys.modules[__name__] = _module
