"""Former name of runner.calls.target, kept for harnesses: the same module object."""

import sys

from .calls import target as _module

sys.modules[__name__] = _module
