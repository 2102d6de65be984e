"""The test suite, which is also the conformance check of SKILL.md.

``python3 -m unittest`` is the offline suite; the tests against real clients
and servers run only when ``RUNNER_REAL_TESTS`` asks for them
(``tests/support/real.py``). Many tests start Python child processes (workers to
kill, the ticket service, CLI calls). So that each compiles the runner once
rather than on every start, even where the environment forbids writing
bytecode beside the sources, children share one bytecode folder in the temp
folder, removed when the suite ends. Discovery of the whole package shares
the modules out between processes (``tests/support/parallel.py``).

This module is imported by every child that imports a helper of the suite
(``python -m tests.support.scripts.http_drive_child``, the recovery workers), so it imports
next to nothing itself.
"""

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import unittest

if not os.environ.get("RUNNER_TESTS_PYCACHE"):
    import atexit
    import shutil
    import tempfile

    _cache = tempfile.mkdtemp(prefix="runner-tests-pycache-")
    atexit.register(shutil.rmtree, _cache, True)
    os.environ["RUNNER_TESTS_PYCACHE"] = _cache
    os.environ["PYTHONPYCACHEPREFIX"] = _cache
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def load_tests(loader: "unittest.TestLoader", standard_tests: "unittest.TestSuite", pattern: str) -> "unittest.TestSuite":
    """Discovery of the whole package: see :func:`tests.support.parallel.load_tests`."""
    from tests.support.parallel import load_tests as share_out

    return share_out(loader, standard_tests, pattern)
