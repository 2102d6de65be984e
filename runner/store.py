"""Former home of the file store, kept so that harness code importing ``runner.store`` still works.

The file store is :mod:`runner.stores.file`.
"""

from .stores.file import *  # noqa: F401,F403
from .stores.file import __all__  # noqa: F401
