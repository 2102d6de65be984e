"""The suite's own machinery: the gate of the real tests and the queue that shares modules between two processes.

* ``tests/support/real.py``: without ``RUNNER_REAL_TESTS`` a real test is skipped,
  saying how to run it, and its check of the real part is never made; with
  ``1`` it runs, and a part that cannot be had, or any skip inside it, fails
  it; the engines' tests need ``all``; an unknown value fails every real test.
* ``tests/support/parallel.py``: two real processes reading the queue take every
  module exactly once between them, and every test file is in the queue.
* The package itself: a child that imports a helper of the suite (the
  recovery workers, ``python -m tests.support.scripts.http_drive_child``) loads none of
  ``unittest``.
* ``tests/support/cli.py``: the command-line fixture fails a test whose call ends with another code or
  reason than it says, and puts the options it adds before a ``--``.
"""

import json
import os
import subprocess
import tempfile
import unittest
from typing import Callable, Dict, List, Optional, Tuple
from unittest import mock

from tests.support import real as _real, util as _util
from tests.support.cli import RunnerCli
from tests.support.parallel import ModuleQueue, _Recorder, _replay, _SplitSuite, module_names

HERE = os.path.dirname(os.path.abspath(__file__))


def _outcome(make: Callable[[], type], value: Optional[str]) -> Dict[str, List[str]]:
    """Run the class ``make`` builds, under ``RUNNER_REAL_TESTS=value``; what happened, as lists of messages."""
    env = {k: v for k, v in os.environ.items() if k != _real.ENV}
    if value is not None:
        env[_real.ENV] = value
    with mock.patch.dict(os.environ, env, clear=True):
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(make())
        result = unittest.TestResult()
        suite.run(result)
    return {
        "skipped": [reason for _, reason in result.skipped],
        "failed": [text.strip().splitlines()[-1] for _, text in result.failures + result.errors],
    }


class RealGateTest(unittest.TestCase):
    def setUp(self) -> None:
        self.checks: List[str] = []

    def _part(self, reason: Optional[str]) -> Callable[[], Optional[str]]:
        def why_not() -> Optional[str]:
            self.checks.append("checked")
            return reason
        return why_not

    def _server_test(self, reason: Optional[str], engines: bool = False) -> Callable[[], type]:
        why_not = self._part(reason)

        def make() -> type:
            @_real.needs("a test server", engines=engines, why_not=why_not)
            class ServerTest(unittest.TestCase):
                def test_talks_to_it(self) -> None:
                    self.assertTrue(True)
            return ServerTest
        return make

    def test_unset_skips_with_the_way_to_run_it_and_checks_nothing(self) -> None:
        for value in (None, "", "0"):
            with self.subTest(value=value):
                out = _outcome(self._server_test("no server here"), value)
                self.assertEqual(out["failed"], [])
                self.assertEqual(out["skipped"], ["a test server: a real-system test; RUNNER_REAL_TESTS=1 runs it"])
        self.assertEqual(self.checks, [])

    def test_asked_for_it_runs_when_the_part_is_there(self) -> None:
        for value in ("1", "all"):
            with self.subTest(value=value):
                out = _outcome(self._server_test(None), value)
                self.assertEqual((out["skipped"], out["failed"]), ([], []))
        self.assertEqual(self.checks, ["checked", "checked"])

    def test_asked_for_it_fails_rather_than_skips_when_the_part_is_missing(self) -> None:
        out = _outcome(self._server_test("the server does not answer"), "1")
        self.assertEqual(out["skipped"], [])
        self.assertEqual(len(out["failed"]), 1, out)
        self.assertIn("RealPartMissing: a test server: the server does not answer (RUNNER_REAL_TESTS=1 asked", out["failed"][0])

    def test_the_engines_need_all(self) -> None:
        out = _outcome(self._server_test(None, engines=True), "1")
        self.assertEqual(out["skipped"], ["a test server: a real-system test; RUNNER_REAL_TESTS=all runs it"])
        self.assertEqual(self.checks, [])
        out = _outcome(self._server_test(None, engines=True), "all")
        self.assertEqual((out["skipped"], out["failed"]), ([], []))
        out = _outcome(self._server_test("no engine", engines=True), "all")
        self.assertEqual(len(out["failed"]), 1, out)

    def test_an_unknown_value_fails_every_real_test(self) -> None:
        out = _outcome(self._server_test(None), "yes")
        self.assertEqual(out["skipped"], [])
        self.assertEqual(len(out["failed"]), 1, out)
        self.assertIn("RUNNER_REAL_TESTS='yes' asks for nothing known", out["failed"][0])

    def test_a_skip_anywhere_inside_a_real_test_is_a_failure_when_asked_for(self) -> None:
        def make() -> type:
            @_real.needs("a test client")
            class ClientTest(unittest.TestCase):
                @classmethod
                def setUpClass(cls) -> None:
                    cls.ready = True

                def setUp(self) -> None:
                    if self._testMethodName == "test_skips_in_set_up":
                        self.skipTest("set-up found no client")

                def test_skips_in_set_up(self) -> None:
                    self.fail("not reached")

                def test_skips_itself(self) -> None:
                    self.skipTest("no client binary")

                @unittest.skip("decorated away")
                def test_skipped_by_a_decorator(self) -> None:
                    self.fail("not reached")

                def test_calls_missing(self) -> None:
                    _real.missing("the client would not install")

                def test_runs(self) -> None:
                    self.assertTrue(self.ready)
            return ClientTest

        asked = _outcome(make, "1")
        self.assertEqual(asked["skipped"], [])
        self.assertEqual(len(asked["failed"]), 4, asked)
        for reason in ("set-up found no client", "no client binary", "decorated away", "the client would not install"):
            self.assertTrue(any(reason in f and f.startswith("tests.support.real.RealPartMissing") for f in asked["failed"]), (reason, asked))
        unasked = _outcome(make, None)
        self.assertEqual((len(unasked["skipped"]), unasked["failed"]), (5, []))

    def test_a_real_test_method_in_an_offline_class(self) -> None:
        def make() -> type:
            class TraceTest(unittest.TestCase):
                def test_offline(self) -> None:
                    self.assertTrue(True)

                @_real.needs("a parser package")
                def test_parsed_by_the_package(self) -> None:
                    _real.missing("pip could not install it")
            return TraceTest

        unasked = _outcome(make, None)
        self.assertEqual((unasked["skipped"], unasked["failed"]), (["a parser package: a real-system test; RUNNER_REAL_TESTS=1 runs it"], []))
        asked = _outcome(make, "1")
        self.assertEqual(asked["skipped"], [])
        self.assertEqual(len(asked["failed"]), 1)
        self.assertIn("pip could not install it", asked["failed"][0])

    def test_the_cache_is_where_the_variable_says(self) -> None:
        with tempfile.TemporaryDirectory(prefix="runner-real-cache-") as scratch:
            wanted = os.path.join(scratch, "cache")
            with mock.patch.dict(os.environ, {"RUNNER_TEST_CACHE": wanted}):
                self.assertEqual(_real.cache_root(), wanted)
            self.assertTrue(os.path.isdir(wanted))


class ModuleQueueTest(unittest.TestCase):
    def test_two_processes_take_every_module_exactly_once(self) -> None:
        count = 500
        queue = ModuleQueue(count)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            code = 1
            try:
                os.close(read_fd)
                taken = list(queue)
                with os.fdopen(write_fd, "w") as out:
                    json.dump(taken, out)
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)
        here = list(queue)
        queue.close()
        with os.fdopen(read_fd) as handle:
            there = json.load(handle)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(status, 0)
        self.assertEqual(sorted(here + there), list(range(count)))
        self.assertEqual(here, sorted(here))
        self.assertEqual(there, sorted(there))

    def test_each_class_is_set_up_and_torn_down_once_in_a_process_that_takes_several_modules(self) -> None:
        calls: List[str] = []

        def module(name: str) -> unittest.TestSuite:
            class Case(unittest.TestCase):
                @classmethod
                def setUpClass(cls) -> None:
                    calls.append(f"set up {name}")

                @classmethod
                def tearDownClass(cls) -> None:
                    calls.append(f"tear down {name}")

                def test_one(self) -> None:
                    calls.append(f"test {name}")

                def test_two(self) -> None:
                    calls.append(f"test {name}")
            Case.__qualname__ = Case.__name__ = f"Case_{name}"
            return unittest.defaultTestLoader.loadTestsFromTestCase(Case)

        modules = [(name, module(name)) for name in ("a", "b", "c")]
        queue = ModuleQueue(len(modules))
        result = unittest.TestResult()  # a fresh result, as in the forked child: the run is the top level
        taken, _ = _SplitSuite(modules)._work(queue, result)
        queue.close()
        self.assertEqual((result.testsRun, result.errors, result.failures), (6, [], []))
        self.assertEqual(taken, ["a", "b", "c"])
        expected: List[str] = []
        for name in ("a", "b", "c"):
            expected += [f"set up {name}", f"test {name}", f"test {name}", f"tear down {name}"]
        self.assertEqual(calls, expected)

    def test_a_resource_a_test_leaves_open_fails_the_run_naming_the_test(self) -> None:
        class Case(unittest.TestCase):
            def test_closes(self) -> None:
                with open(__file__, "rb"):
                    pass

            def test_leaves_a_file_open(self) -> None:
                open(__file__, "rb")  # left for the collector on purpose

        for names, left in ((["test_closes"], 0), (["test_closes", "test_leaves_a_file_open"], 1)):
            suite = unittest.TestSuite(Case(name) for name in names)
            queue = ModuleQueue(1)
            result = unittest.TestResult()
            _SplitSuite([("leaky", suite)])._work(queue, result)
            queue.close()
            self.assertEqual(result.errors, [])
            self.assertEqual(len(result.failures), left, result.failures)
            if left:
                test, text = result.failures[0]
                self.assertEqual(test.id(), "tests.resources_left_open")
                self.assertIn("test_leaves_a_file_open: unclosed file", text)
                self.assertNotIn("test_closes", text)

    def test_a_forked_parts_outcomes_are_counted_here_as_this_python_counts_them(self) -> None:
        # Skips are counted as run or not depending on the Python (3.12 starts no skipped test) and on where the
        # skip comes from; a failed subtest is a failure of a test that ran once. Replayed, each counts as natively.
        def module() -> unittest.TestSuite:
            class Plain(unittest.TestCase):
                def test_passes(self) -> None:
                    pass

                @unittest.skip("by a decorator")
                def test_skipped(self) -> None:
                    pass

                def test_skips_itself(self) -> None:
                    self.skipTest("by itself")

                def test_with_subtests(self) -> None:
                    for n in range(3):
                        with self.subTest(n=n):
                            self.assertNotEqual(n, 1)

            @unittest.skip("the whole class")
            class Skipped(unittest.TestCase):
                def test_a(self) -> None:
                    pass

            class SkippedInSetUp(unittest.TestCase):
                @classmethod
                def setUpClass(cls) -> None:
                    raise unittest.SkipTest("in setUpClass")

                def test_b(self) -> None:
                    pass

            load = unittest.defaultTestLoader.loadTestsFromTestCase
            return unittest.TestSuite([load(Plain), load(Skipped), load(SkippedInSetUp)])

        def counts(result: unittest.TestResult) -> Tuple[int, int, int, int]:
            return result.testsRun, len(result.skipped), len(result.failures), len(result.errors)

        native, recorder, replayed = unittest.TestResult(), _Recorder(), unittest.TestResult()
        for result in (native, recorder):
            queue = ModuleQueue(1)
            _SplitSuite([("m", module())])._work(queue, result)
            queue.close()
        for record in recorder.records:
            _replay(replayed, record)
        self.assertEqual(counts(replayed), counts(native))
        self.assertEqual(counts(native)[2:], (1, 0))  # the failed subtest

    def test_every_test_file_is_queued_the_largest_first(self) -> None:
        names = module_names(HERE)
        files = sorted(f[:-3] for f in os.listdir(HERE) if f.startswith("test") and f.endswith(".py"))
        self.assertEqual(sorted(names), files)
        self.assertIn("test_suites", names)
        sizes = [os.path.getsize(os.path.join(HERE, name + ".py")) for name in names]
        self.assertEqual(sizes, sorted(sizes, reverse=True))


class RunnerCliTest(unittest.TestCase):
    """The fixture's own checks: each can fail."""

    def setUp(self) -> None:
        self.cli = RunnerCli(self, _util.contract_block())

    def test_a_call_that_ends_otherwise_than_it_says_fails_the_test(self) -> None:
        self.assertEqual(self.cli("status").code, 0)
        self.assertEqual(self.cli("step", "start", "only", code=9, reason="fenced").code, 9)  # no lease is held
        with self.assertRaises(self.failureException):
            self.cli("step", "start", "only")
        with self.assertRaises(self.failureException):
            self.cli("step", "start", "only", code=9, reason="invalid-input")
        with self.assertRaises(self.failureException):
            self.cli.json("status", code=3)
        with self.assertRaises(self.failureException):
            self.cli.json("step", "start", "only", code=9, reason="fenced-not")
        with self.assertRaises(self.failureException):
            self.cli.child("step", "start", "only")
        self.assertEqual(self.cli.json("step", "start", "only", code=9, reason="fenced")["exit_code"], 9)
        self.assertEqual(self.cli("step", "start", "only", code=None).code, 9)

    def test_a_writer_adds_its_owner_and_epoch_and_json_comes_before_a_double_dash(self) -> None:
        epoch = self.cli.json("lease", "acquire", "--owner", "w1")["epoch"]
        writer = self.cli.writer("w1", epoch)
        self.assertEqual(writer.argv(["job", "submit", "j1", "--", "true", "--json"]),
                         ["--dir", self.cli.run_dir, "job", "submit", "j1", "--owner", "w1", "--epoch", str(epoch),
                          "--", "true", "--json"])
        self.assertEqual(writer.json("step", "start", "only")["state"], "running")
        self.assertEqual(self.cli.child("--json", "status").json["steps"]["only"]["state"], "running")


class PackageImportTest(unittest.TestCase):
    def test_a_child_that_imports_a_helper_of_the_suite_loads_no_unittest(self) -> None:
        """The suite starts hundreds of children; ``unittest`` would add tens of milliseconds to each that imports a helper."""
        code = "import sys, tests.support.recovery, tests.support.scripts.http_drive_child; print(sorted(m for m in sys.modules if m.split('.')[0] == 'unittest'))"
        done = subprocess.run(_util.python("-c", code), cwd=_util.REPO_ROOT, env=_util.child_env(), capture_output=True, text=True, timeout=60)
        self.assertEqual((done.returncode, done.stdout.strip()), (0, "[]"), done.stderr)


if __name__ == "__main__":
    unittest.main()
