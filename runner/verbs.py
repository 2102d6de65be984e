"""Former name of runner.surfaces.verbs, kept for harnesses: the same module object."""

import sys

from .surfaces import verbs as _module

sys.modules[__name__] = _module
