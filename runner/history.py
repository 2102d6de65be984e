"""Former name of runner.surfaces.history, kept for harnesses: the same module object."""

import sys

from .surfaces import history as _module

sys.modules[__name__] = _module
