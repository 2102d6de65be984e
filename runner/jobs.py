"""Former name of runner.execution.jobs, kept for harnesses: the same module object; run as a program
(``python3 -m runner.jobs``, as the runner of the previous release starts it), the same program."""

import sys

if __name__ == "__main__":
    import runpy

    runpy.run_module("runner.execution.jobs", run_name="__main__", alter_sys=True)
else:
    from .execution import jobs as _module

    sys.modules[__name__] = _module
