"""Former name of runner.base.windows, kept for harnesses: the same module object."""

import sys

from .base import windows as _module

sys.modules[__name__] = _module
