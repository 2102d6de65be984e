"""The test suite, which is also the conformance check of SKILL.md.

Two things happen here, both for speed, neither changes what a test checks:

* Many tests start Python child processes (workers to kill, the ticket
  service, CLI calls). So that each compiles the runner once rather than on
  every start, even where the environment forbids writing bytecode beside
  the sources, children share one bytecode folder outside the repository,
  removed when the suite ends.
* Most tests wait on processes and fsync, not on the processor. When the
  whole package is run (``python3 -m unittest``) on a machine with two or
  more cores, the modules are split in two halves: one runs here, the other
  in a forked child process, and the child's results (each test's outcome and
  traceback) are reported here as if run here, so the summary counts every
  test and a failure anywhere fails the run. A child that dies without
  reporting is itself an error. ``RUNNER_TESTS_SERIAL=1`` runs everything
  in one process.
"""

import atexit
import json
import os
import shutil
import sys
import tempfile
import traceback
import unittest
from typing import Any, Dict, List

if not os.environ.get("RUNNER_TESTS_PYCACHE"):
    _cache = tempfile.mkdtemp(prefix="runner-tests-pycache-")
    atexit.register(shutil.rmtree, _cache, True)
    os.environ["RUNNER_TESTS_PYCACHE"] = _cache
    os.environ["PYTHONPYCACHEPREFIX"] = _cache
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

#: Modules run in the forked half: about half of the suite's time, as measured module by module
#: with PostgreSQL, Chromium and the harness clients present (the slowest first, each to the lighter half).
FORKED = (
    "test_timeline", "test_harness_clients", "test_recovery", "test_powerloss", "test_store_defects", "test_effect_run",
    "test_damage_campaign", "test_store_damage", "test_effect_windows", "test_mcp", "test_conformance", "test_store_security",
    "test_store_witness", "test_ticketservice", "test_otlp", "test_cli_basics", "test_skill", "test_exit_codes",
    "test_ops_recovery", "test_ops_steps",
)


class _Remote:
    """A test that ran in the forked half, standing in for it in this process's result.

    Not a TestCase, so that discovery never tries to run it.
    """

    failureException = AssertionError

    def __init__(self, test_id: str, description: str) -> None:
        self._id, self._description = test_id, description

    def id(self) -> str:
        return self._id

    def __str__(self) -> str:
        return self._description

    def shortDescription(self) -> None:
        return None


def _error(text: str) -> Any:
    try:
        raise AssertionError(text)
    except AssertionError:
        return sys.exc_info()


class _Recorder(unittest.TestResult):
    """Collects each test's outcome as plain data, in the forked half."""

    def __init__(self) -> None:
        super().__init__()
        self.records: List[Dict[str, str]] = []

    def _add(self, test: Any, outcome: str, detail: str = "") -> None:
        self.records.append({"id": test.id(), "str": str(test), "outcome": outcome, "detail": detail})

    def addSuccess(self, test: Any) -> None:
        self._add(test, "success")

    def addFailure(self, test: Any, err: Any) -> None:
        self._add(test, "failure", "".join(traceback.format_exception(*err)))

    def addError(self, test: Any, err: Any) -> None:
        self._add(test, "error", "".join(traceback.format_exception(*err)))

    def addSkip(self, test: Any, reason: str) -> None:
        self._add(test, "skip", reason)

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        self._add(test, "expected-failure")

    def addUnexpectedSuccess(self, test: Any) -> None:
        self._add(test, "unexpected-success")

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        if err is not None:
            kind = "failure" if issubclass(err[0], test.failureException) else "error"
            self._add(subtest, kind, "".join(traceback.format_exception(*err)))


class _SplitSuite(unittest.TestSuite):
    """Runs ``forked`` in a child process and ``local`` here; reports both here."""

    def __init__(self, local: unittest.TestSuite, forked: unittest.TestSuite) -> None:
        super().__init__([local, forked])  # iteration and counting see every test
        self.local, self.forked = local, forked

    def run(self, result: Any, debug: bool = False) -> Any:
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            recorder = _Recorder()
            code = 0
            try:
                self.forked.run(recorder)
            except BaseException:
                code = 1
            with os.fdopen(write_fd, "w") as out:
                json.dump(recorder.records, out)
            os._exit(code)
        os.close(write_fd)
        self.local.run(result, debug)
        with os.fdopen(read_fd) as handle:
            text = handle.read()
        _, status = os.waitpid(pid, 0)
        try:
            records = json.loads(text)
        except ValueError:
            records = None
        if records is None or status != 0:
            test = _Remote("tests.forked_half", "the forked half of the suite")
            result.startTest(test)
            result.addError(test, _error(f"the forked half of the suite ended with status {status} and {'no' if records is None else 'a partial'} report"))
            result.stopTest(test)
            records = records or []
        for record in records:
            test = _Remote(record["id"], record["str"])
            result.startTest(test)
            outcome = record["outcome"]
            if outcome == "success":
                result.addSuccess(test)
            elif outcome == "failure":
                result.addFailure(test, _error(record["detail"]))
            elif outcome == "error":
                result.addError(test, _error(record["detail"]))
            elif outcome == "skip":
                result.addSkip(test, record["detail"])
            elif outcome == "expected-failure":
                result.addExpectedFailure(test, _error("expected failure"))
            else:
                result.addUnexpectedSuccess(test)
            result.stopTest(test)
        return result


def load_tests(loader: unittest.TestLoader, standard_tests: unittest.TestSuite, pattern: str) -> unittest.TestSuite:
    """Discovery of the whole package: split the modules across two processes when that helps."""
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(here)
    names = sorted(f[:-3] for f in os.listdir(here) if f.startswith("test") and f.endswith(".py"))
    local, forked = unittest.TestSuite(), unittest.TestSuite()
    for name in names:
        suite = loader.loadTestsFromName(f"tests.{name}")
        (forked if name in FORKED else local).addTest(suite)
    if top not in sys.path:
        sys.path.insert(0, top)
    serial = os.environ.get("RUNNER_TESTS_SERIAL") or not hasattr(os, "fork") or (os.cpu_count() or 1) < 2
    if serial:
        return unittest.TestSuite([local, forked])
    return _SplitSuite(local, forked)
