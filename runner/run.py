"""Former name of runner.execution.run, kept for harnesses: the same module object."""

import sys

from .execution import run as _module

sys.modules[__name__] = _module
