"""Former name of runner.execution.recovery, kept for harnesses: the same module object."""

import sys

from .execution import recovery as _module

sys.modules[__name__] = _module
