"""How discovery of the whole package runs the suite: in several processes, checked for leaks.

Two things happen here, both for speed, neither changes what a test checks:

* Most tests wait on processes and fsync, not on the processor. When the
  whole package is run on a machine with two or more cores, several
  processes (this one and forked children: twice the cores, at most four, or
  ``RUNNER_TESTS_PROCESSES``) take the modules from one queue, each the next
  module when it finishes one, the largest files first, so the shares
  balance themselves whatever each module takes on this machine and a new
  module needs no list. The children's results (each test's outcome and
  traceback) are reported here as if run here, so the summary counts every
  test and a failure anywhere fails the run; a child that dies without
  reporting is itself an error. A line on stderr gives each process's share.
  ``RUNNER_TESTS_SERIAL=1`` runs everything in one process.
* What discovery loaded (the modules, the tests) lives as long as the run,
  so it is frozen (``gc.freeze``) before the processes fork: no collection
  in any of them walks it again. The tests allocate much and keep little,
  so a collection starts after 20,000 new objects rather than 700.

One thing is checked here rather than in a test: nothing is left for the
garbage collector to close. A file, socket, process or database connection
a test (or the runner under test) leaves open is a ``ResourceWarning`` when
it is collected, at a moment that depends on the collector, possibly inside
a later test that captures stderr. Each process records these warnings with
the test that was running when they were raised instead of printing them,
collects once when its share is done, and reports what it recorded as one
failing test, ``tests.resources_left_open``.
"""

import fnmatch
import gc
import json
import os
import struct
import sys
import time
import traceback
import unittest
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

#: One queue entry: a module's index, as a fixed-size record so that a read takes exactly one.
_ENTRY = struct.Struct("!I")


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
    """Collects each test's outcome as plain data, in the forked half.

    Whether the test was started is kept too: some Pythons report a skipped
    test without starting it (3.12 does not count it as run). Replayed as it
    happened, the summary counts what this Python counts, whichever process
    ran the test.
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: List[Dict[str, Any]] = []
        self._started: Set[str] = set()

    def startTest(self, test: Any) -> None:
        super().startTest(test)
        self._started.add(test.id())

    def stopTest(self, test: Any) -> None:
        super().stopTest(test)
        if not self.records or self.records[-1]["id"] != test.id():
            self._add(test, "subtests")  # started, its outcome told by its failed subtests alone

    def _add(self, test: Any, outcome: str, detail: str = "") -> None:
        self.records.append({"id": test.id(), "str": str(test), "outcome": outcome, "detail": detail,
                             "started": test.id() in self._started})

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


class ModuleQueue:
    """Module indices in a pipe that two processes read, each read taking exactly one.

    Every entry is written before either process reads and both write ends
    are closed, so reads never wait and an empty pipe means the work is done.
    A record is 4 bytes, far below ``PIPE_BUF``, and the kernel serialises
    reads of a pipe, so no entry is taken twice or split.
    """

    def __init__(self, count: int) -> None:
        self.read_fd, write_fd = os.pipe()
        data = b"".join(_ENTRY.pack(i) for i in range(count))
        while data:  # a few hundred bytes: well within the pipe's buffer
            data = data[os.write(write_fd, data):]
        os.close(write_fd)

    def __iter__(self) -> Iterator[int]:
        while True:
            entry = os.read(self.read_fd, _ENTRY.size)
            if not entry:
                return
            if len(entry) != _ENTRY.size:
                raise RuntimeError(f"a torn queue entry ({len(entry)} bytes)")
            yield _ENTRY.unpack(entry)[0]

    def close(self) -> None:
        os.close(self.read_fd)


class _Watched(unittest.TestSuite):
    """Runs ``tests`` and fails, as ``tests.resources_left_open``, if any left a resource for the collector to close.

    Each ``ResourceWarning`` is recorded with the test running when it was
    raised (the test that leaked it when the object is freed at once, a later
    one when only the cyclic collector frees it) and is not printed. Other
    warnings are shown as before.
    """

    _cleanup = False

    def __init__(self, tests: Any) -> None:
        super().__init__()
        self.tests = tests
        self.left_open: List[str] = []
        self._running = "before any test"

    def __iter__(self) -> Iterator[Any]:
        return iter(self.tests)

    def countTestCases(self) -> int:
        return self.tests.countTestCases()

    def run(self, result: Any, debug: bool = False) -> Any:
        start_test = result.startTest

        def started(test: Any) -> None:
            self._running = test.id()
            start_test(test)

        with warnings.catch_warnings():
            warnings.simplefilter("always", ResourceWarning)
            shown = warnings.showwarning

            def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
                if issubclass(category, ResourceWarning):
                    self.left_open.append(f"{self._running}: {message}")
                else:
                    shown(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            result.startTest = started
            try:
                self.tests.run(result)
                self._running = "the collection after the last test"
                gc.collect()
            finally:
                del result.startTest
        if self.left_open:
            test = _Remote("tests.resources_left_open", "resources left for the garbage collector to close")
            result.startTest(test)
            result.addFailure(test, _error(
                f"{len(self.left_open)} resources were left open; to see where each was made, run the test's module alone "
                "with PYTHONTRACEMALLOC=20 python3 -W always::ResourceWarning -m unittest tests.MODULE:\n" + "\n".join(self.left_open[:50])))
            result.stopTest(test)
        return result


class _Pulled(unittest.TestSuite):
    """The modules this process takes from the queue, as they are taken, run as one suite.

    One suite, so that each class and module is set up and torn down once:
    running each module as a suite of its own on one result would tear the
    last class of a module down again when the next module starts.
    """

    _cleanup = False  # its tests are not held in ``_tests``

    def __init__(self, modules: Sequence[Tuple[str, unittest.TestSuite]], queue: ModuleQueue) -> None:
        super().__init__()
        self.modules, self.queue = modules, queue
        self.taken: List[str] = []

    def __iter__(self) -> Iterator[unittest.TestSuite]:
        for index in self.queue:
            name, suite = self.modules[index]
            self.taken.append(name)
            yield suite

    def countTestCases(self) -> int:
        """The tests of the modules taken so far (counting must not take from the queue)."""
        names = set(self.taken)
        return sum(suite.countTestCases() for name, suite in self.modules if name in names)


class _SplitSuite(unittest.TestSuite):
    """Runs ``modules`` in several processes, each pulling the next from a shared :class:`ModuleQueue`; reports all here."""

    def __init__(self, modules: Sequence[Tuple[str, unittest.TestSuite]]) -> None:
        super().__init__([suite for _, suite in modules])  # iteration and counting see every test
        self.modules = list(modules)

    def _work(self, queue: ModuleQueue, result: Any) -> Tuple[List[str], float]:
        began, pulled = time.monotonic(), _Pulled(self.modules, queue)
        _Watched(pulled).run(result)
        return pulled.taken, time.monotonic() - began

    def run(self, result: Any, debug: bool = False) -> Any:
        queue = ModuleQueue(len(self.modules))
        sys.stdout.flush()
        sys.stderr.flush()
        children: List[Tuple[int, int]] = []  # (pid, read end of its report pipe)
        for _ in range(_processes() - 1):
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                for _, other in children:
                    os.close(other)
                recorder = _Recorder()
                code, share = 0, {"modules": [], "seconds": 0.0}
                try:
                    names, seconds = self._work(queue, recorder)
                    share = {"modules": names, "seconds": seconds}
                except BaseException:
                    code = 1
                with os.fdopen(write_fd, "w") as out:
                    json.dump({"records": recorder.records, "share": share}, out)
                os._exit(code)
            os.close(write_fd)
            children.append((pid, read_fd))
        names, seconds = self._work(queue, result)
        queue.close()
        shares = [f"{len(names)} modules in {seconds:.1f} s here"]
        for number, (pid, read_fd) in enumerate(children, 1):
            with os.fdopen(read_fd) as handle:
                text = handle.read()
            _, status = os.waitpid(pid, 0)
            try:
                report = json.loads(text)
                records, share = report["records"], report["share"]
            except (ValueError, KeyError, TypeError):
                records, share = None, None
            if records is None or status != 0:
                test = _Remote(f"tests.forked_part_{number}", f"forked part {number} of the suite")
                result.startTest(test)
                result.addError(test, _error(f"forked part {number} of the suite ended with status {status} and "
                                             f"{'no' if records is None else 'a partial'} report"))
                result.stopTest(test)
                records = records or []
            for record in records:
                _replay(result, record)
            if share:
                shares.append(f"{len(share['modules'])} in {share['seconds']:.1f} s in forked part {number}")
        sys.stderr.write("\nsuite-split: " + ", ".join(shares) + "\n")
        sys.stderr.flush()
        return result


def _replay(result: Any, record: Dict[str, Any]) -> None:
    """Report one test of a forked part here, as if it had run here."""
    test = _Remote(record["id"], record["str"])
    if record["started"]:
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
    elif outcome == "unexpected-success":
        result.addUnexpectedSuccess(test)
    if record["started"]:
        result.stopTest(test)


def _processes() -> int:
    """How many processes take modules from the queue: ``RUNNER_TESTS_PROCESSES``, else twice the cores, at most four
    (the tests mostly wait on child processes and fsync, so more processes than cores keep the cores busy)."""
    wanted = os.environ.get("RUNNER_TESTS_PROCESSES")
    if wanted and wanted.isdigit() and int(wanted) >= 1:
        return int(wanted)
    return max(2, min(4, 2 * (os.cpu_count() or 1)))


def module_names(here: str, pattern: Optional[str] = None) -> List[str]:
    """The suite's test modules (those matching discovery's ``pattern``), the largest files first.

    A long module started last would leave the other process idle.
    """
    files = [f for f in os.listdir(here) if f.startswith("test") and f.endswith(".py") and fnmatch.fnmatch(f, pattern or "test*.py")]
    return [f[:-3] for f in sorted(files, key=lambda f: (-os.path.getsize(os.path.join(here, f)), f))]


def load_tests(loader: unittest.TestLoader, standard_tests: unittest.TestSuite, pattern: str) -> unittest.TestSuite:
    """Discovery of the whole package: the modules shared out between two processes when that helps."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, above this support/ folder
    top = os.path.dirname(here)
    if top not in sys.path:
        sys.path.insert(0, top)
    modules = [(name, loader.loadTestsFromName(f"tests.{name}")) for name in module_names(here, pattern)]
    # What is loaded now lives as long as the run: frozen, no collection in any process walks it again,
    # and the forked processes keep sharing its memory.
    gc.freeze()
    gc.set_threshold(20000, *gc.get_threshold()[1:])
    serial = os.environ.get("RUNNER_TESTS_SERIAL") or not hasattr(os, "fork") or (os.cpu_count() or 1) < 2
    if serial:
        return _Watched(unittest.TestSuite([suite for _, suite in modules]))
    return _SplitSuite(modules)
