"""Bad input is refused at the door: one line, exit 2, nothing stored; what is stored never crashes a view.

Covers deep JSON in every JSON input, times and durations beyond any sensible
range (given on the command line, in a contract or through the library, and
already stored by an older runner), contracts the runner could not execute
(infinite numbers, evidence names that are not strings, a circle of ``next``
links), key patterns that a backtracking matcher could not finish, and an
unreadable ``RUNNER_EPOCH``, and an effect verb naming a key never begun.
"""

import datetime as _dt
import hashlib
import json
import os
import time
import unittest
from typing import Any, Dict, List

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

from runner.contract.spec import EffectsSpec
from runner.contract.text import parse_contract_text
from runner.base.values import MAX_DURATION_SECONDS, one_line
from runner.base.times import format_time, parse_time
from runner.base.canonical import MAX_JSON_DEPTH, loads_strict
from runner.base.errors import InvalidInput
from runner.base.keypattern import KeyPattern, compile_pattern
from runner.execution.run import Run

BLOCK: Dict[str, Any] = {
    "contract": 1,
    "task_id": "inputs-1",
    "goal": "exercise the input checks",
    "steps": [{"id": "a", "evidence": ["k"]}, {"id": "b"}],
    "limits": {"max_step_attempts": 50, "max_effect_attempts": 50},
    "lease": {"ttl_seconds": 600},
}


def contract_text(block: Dict[str, Any]) -> str:
    return "# contract\n\n```json run-contract\n" + json.dumps(block, indent=1) + "\n```\n"


def folder_digest(path: str) -> str:
    """One digest of every file's name and bytes under ``path``."""
    digest = hashlib.sha256()
    for where, _dirs, files in sorted(os.walk(path)):
        for name in sorted(files):
            full = os.path.join(where, name)
            digest.update(os.path.relpath(full, path).encode() + b"\0")
            with open(full, "rb") as handle:
                digest.update(handle.read())
    return digest.hexdigest()


class CliCase(unittest.TestCase):
    """A temporary folder with a written contract and a started run holding the lease (owner w1, epoch 1)."""

    block = BLOCK

    def setUp(self) -> None:
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        self.contract = self.write("contract.md", contract_text(self.block))
        self.run_dir = os.path.join(self.tmp, "run")
        self.ok("--dir", self.run_dir, "init", "--contract", self.contract)
        self.ok("--dir", self.run_dir, "lease", "acquire", "--owner", "w1", "--ttl", "600")

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        return path

    def cli(self, *argv: str) -> _util.Result:
        return _util.in_process_cli(list(argv))

    def ok(self, *argv: str) -> _util.Result:
        result = self.cli(*argv)
        self.assertEqual(result.code, 0, result.err)
        return result

    def refused(self, *argv: str, code: int = 2, says: str = "") -> _util.Result:
        """Run a command that must be refused with ``code``, one line on stderr, and no byte of the run changed."""
        before = folder_digest(self.run_dir)
        result = self.cli(*argv)
        self.assertEqual(result.code, code, (argv, result))
        lines = _util.stderr_lines(result)
        self.assertEqual(len(lines), 1, lines)
        self.assertNotIn("Traceback", result.err)
        self.assertIn(says, lines[0])
        self.assertEqual(folder_digest(self.run_dir), before, f"{argv} changed the run")
        return result

    def writer(self, *argv: str) -> List[str]:
        return ["--dir", self.run_dir, *argv, "--owner", "w1", "--epoch", "1"]


class UnknownEffectTest(CliCase):
    def test_every_verb_that_settles_an_effect_refuses_a_key_never_begun(self) -> None:
        for verb, *flags in (("ack", "--receipt", "{}"), ("verify", "--evidence", "{}"), ("absent", "--evidence", "{}"),
                             ("uncertain", "--reason", "timeout")):
            with self.subTest(verb=verb):
                self.refused(*self.writer("effect", verb, "never-begun:1", *flags), says="no effect 'never-begun:1' in the ledger")


class DeepJsonTest(CliCase):
    """Defect 09: JSON nested about 1,100 deep (far under the size limit) crashed every JSON input."""

    def deep(self, depth: int) -> str:
        return '{"a":' + "[" * depth + "]" * depth + "}"

    def test_the_parser_bounds_nesting_and_numbers(self) -> None:
        value = loads_strict(self.deep(MAX_JSON_DEPTH - 1))  # the object and its arrays: exactly the limit
        for _ in range(MAX_JSON_DEPTH - 1):
            value = value["a"] if isinstance(value, dict) else value[0] if value else value
        self.assertEqual(value, [])
        for text in (self.deep(MAX_JSON_DEPTH), "[" * 100_000 + "]" * 100_000):
            with self.assertRaisesRegex(ValueError, "nested too deeply"):
                loads_strict(text)
        # Brackets inside strings are text, not nesting.
        self.assertEqual(loads_strict('{"a": "' + "[" * 5000 + '\\"{"}'), {"a": "[" * 5000 + '"{'})
        for number in ("1e309", "-1e400"):
            with self.assertRaisesRegex(ValueError, "out of range"):
                loads_strict('{"x": %s}' % number)

    def test_every_json_input_refuses_deep_nesting_with_one_line(self) -> None:
        self.ok(*self.writer("step", "start", "a"))
        self.ok(*self.writer("effect", "begin", "e1", "--payload", self.write("p1.json", '{"x": 1}')))
        deep = self.write("deep.json", "[" * 1100 + "]" * 1100)
        deep_object = self.write("deep-object.json", self.deep(1100))
        self.refused(*self.writer("effect", "begin", "e9", "--payload", deep), says="nested too deeply")
        self.refused(*self.writer("effect", "begin", "e9", "--payload", deep_object), says="nested too deeply")
        self.refused(*self.writer("effect", "ack", "e1", "--receipt", self.deep(1100)), says="nested too deeply")
        self.refused(*self.writer("effect", "ack", "e1", "--receipt", "@" + deep_object), says="nested too deeply")
        self.refused(*self.writer("step", "done", "a", "--evidence", "@" + deep_object), says="nested too deeply")
        block = dict(BLOCK, non_goals=["x"])
        text = contract_text(block).replace('"x"', "[" * 2000 + "]" * 2000)
        deep_contract = self.write("deep-contract.md", text)
        self.refused("contract", "check", deep_contract, says="nested too deeply")
        self.refused(*self.writer("next", "--contract", deep_contract), says="nested too deeply")
        fresh = os.path.join(self.tmp, "fresh")
        result = self.cli("--dir", fresh, "init", "--contract", deep_contract)
        self.assertEqual((result.code, len(_util.stderr_lines(result))), (2, 1), result)
        self.assertFalse(os.path.exists(fresh))

    def test_the_library_refuses_deep_documents_too(self) -> None:
        run = Run.open(self.run_dir, "w1", 1)
        run.step_start("a")
        revision = run.refresh()["revision"]
        deep: Any = []
        for _ in range(1100):
            deep = [deep]
        shallow: Any = []
        for _ in range(MAX_JSON_DEPTH - 2):
            shallow = [shallow]
        for call in (lambda: run.effect_begin("e9", {"a": deep}), lambda: run.step_done("a", {"k": deep}),
                     lambda: run.approval_request("a", "effect:e9", {"a": deep}, 60), lambda: run.effect_begin("e9", {"a": [shallow]})):
            with self.assertRaisesRegex(InvalidInput, "nested too deeply"):
                call()
        self.assertEqual(run.refresh()["revision"], revision)
        self.assertEqual(run.effect_begin("e9", {"a": shallow})["state"], "started")

    def test_deep_json_from_stdin_in_a_child_process(self) -> None:
        self.ok(*self.writer("step", "start", "a"))
        result = _util.run(_util.python("-m", "runner", *self.writer("effect", "begin", "e9", "--payload", "-")),
                           input=("[" * 100_000 + "]" * 100_000).encode())
        self.assertEqual(result.code, 2, result)
        self.assertEqual(len(_util.stderr_lines(result)), 1, result.err)
        self.assertIn("nested too deeply", result.err)


class FarTimeTest(CliCase):
    """Defect 05: far-future times were stored and then crashed next, recover, brief and approval for good."""

    def test_time_text_is_total_over_finite_times(self) -> None:
        for seconds in (0.0, 1_790_000_000.123, 253402300799.999, 253402300800.0, time.time() + 1e12, 1e20, -62135596800.0):
            text = format_time(seconds)
            self.assertAlmostEqual(parse_time(text), seconds, delta=max(1e-3, abs(seconds) * 1e-15))
        for seconds in (1_790_000_000.5, 0.0, 951782400.25, 4107542399.999):  # ordinary and leap days agree with datetime
            stamp = _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)
            self.assertEqual(format_time(seconds), stamp.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (stamp.microsecond // 1000))
        self.assertEqual(format_time(253402300800.0), "10000-01-01T00:00:00.000Z")
        for bad in ("yesterday", "2026-13-01T00:00:00.000Z", "2026-01-01 00:00:00", None):
            with self.assertRaises(ValueError):
                parse_time(bad)  # type: ignore[arg-type]

    def test_durations_beyond_the_bound_are_refused_before_anything_is_written(self) -> None:
        self.ok(*self.writer("step", "start", "a"))
        payload = self.write("p1.json", '{"x": 1}')
        for ttl in ("1e12", "1e20", "9223372036854775808", "inf", "nan", "0", "-5"):
            self.refused(*self.writer("approval", "request", "a", "--action", "effect:e9", "--payload", payload, "--ttl", ttl),
                         says="--ttl")
        self.refused(*self.writer("lease", "renew", "--ttl", "1e12"), says="ttl")
        self.refused(*self.writer("recover", "--ttl", "1e20"), says="ttl")
        self.refused("--dir", self.run_dir, "events", "--follow", "--timeout", "1e20", says="timeout")
        self.ok(*self.writer("approval", "request", "a", "--action", "effect:e9", "--payload", payload, "--ttl", str(MAX_DURATION_SECONDS)))

    def test_the_library_refuses_them_too(self) -> None:
        run = Run.open(self.run_dir, "w1", 1)
        run.step_start("a")
        revision = run.refresh()["revision"]
        for ttl in (1e12, float("inf"), MAX_DURATION_SECONDS + 1):
            with self.assertRaises(InvalidInput):
                run.approval_request("a", "effect:e9", {"x": 1}, ttl)
        with self.assertRaises(InvalidInput):
            run.renew(1e12)
        self.assertEqual(run.refresh()["revision"], revision)

    def test_a_contract_with_far_durations_is_refused_at_check_and_init(self) -> None:
        for section, field, value in (("retry", "base_seconds", 1e12), ("retry", "cap_seconds", 1e12), ("lease", "ttl_seconds", 1e9),
                                      ("limits", "max_elapsed_seconds", 1e15), ("limits", "no_progress_seconds", 1e12)):
            with self.subTest(field=field):
                block = dict(BLOCK, **{section: {field: value}})
                _block, problems = parse_contract_text(contract_text(block))
                self.assertEqual(len(problems), 1, problems)
                self.assertIn(field, problems[0].message)
                self.assertGreater(problems[0].line, 3)
                path = self.write(f"far-{field}.md", contract_text(block))
                self.refused("contract", "check", path, says=field)
                fresh = os.path.join(self.tmp, f"fresh-{field}")
                self.assertEqual(self.cli("--dir", fresh, "init", "--contract", path).code, 2)
                self.assertFalse(os.path.exists(fresh))

    def test_far_times_already_stored_are_shown_not_crashed_on(self) -> None:
        # A writer whose clock ran 1e12 s ahead stored times past the year 9999, as an older runner would
        # have for '--ttl 1e12' or a 1e12 s backoff.
        far = time.time() + 1e12
        ahead = Run.open(self.run_dir, clock=lambda: far)
        ahead.acquire("w1", 600)
        ahead.step_start("a")
        request = ahead.approval_request("a", "effect:e9", {"x": 1}, 600)
        ahead.step_fail("a", "transient", "boom")
        stored = ahead.refresh()
        self.assertTrue(stored["observations"]["approvals"][request]["expires_at"].startswith("33"), stored["observations"])
        for argv in (["next"], ["brief"], ["status"], ["report"], ["approval", "list"], ["lease", "show"], ["effect", "list"]):
            with self.subTest(argv=argv):
                result = self.cli("--dir", self.run_dir, *argv)
                self.assertIn(result.code, (0, 3, 4, 9, 11), result)
                self.assertNotIn("Traceback", result.err)
        result = self.cli("--dir", self.run_dir, "approval", "grant", request, "--by", "alice")
        self.assertEqual(result.code, 0, result)
        result = self.cli("--dir", self.run_dir, "--json", "lease", "show")
        self.assertTrue(_util.one_json(result)["expires_at"].startswith("33"))


class ContractGapTest(CliCase):
    """Defect 12: contracts that 'contract check' accepted and the runner then failed on."""

    def check_refused(self, name: str, block: Dict[str, Any], says: str) -> None:
        path = self.write(name + ".md", contract_text(block))
        result = self.refused("contract", "check", path, says=says)
        self.assertRegex(result.err, r"\.md:[0-9]+: ")
        fresh = os.path.join(self.tmp, "fresh-" + name)
        result = self.cli("--dir", fresh, "init", "--contract", path)
        self.assertEqual((result.code, len(_util.stderr_lines(result))), (2, 1), result)
        self.assertIn(says, result.err)
        self.assertFalse(os.path.exists(fresh))

    def test_an_infinite_number(self) -> None:
        text = contract_text(dict(BLOCK, limits={"max_cost": 1.5})).replace("1.5", "1e309")
        path = self.write("inf.md", text)
        result = self.refused("contract", "check", path, says="1e309 is out of range")
        line = next(n for n, body in enumerate(text.splitlines(), 1) if "1e309" in body)
        self.assertIn(f"inf.md:{line}:", result.err)
        fresh = os.path.join(self.tmp, "fresh-inf")
        self.assertEqual(self.cli("--dir", fresh, "init", "--contract", path).code, 2)
        self.assertFalse(os.path.exists(fresh))

    def test_evidence_names_that_are_not_strings(self) -> None:
        for number, evidence in enumerate(([1], [""], [None], [["k"]])):
            self.check_refused(f"evidence-{number}", dict(BLOCK, steps=[{"id": "a", "evidence": evidence}]), says="evidence")

    def test_a_circle_of_next_links(self) -> None:
        self.check_refused("two", dict(BLOCK, steps=[{"id": "a", "next": "b"}, {"id": "b", "next": "a"}]), says="a -> b -> a")
        self.check_refused("self", dict(BLOCK, steps=[{"id": "a", "next": "a"}, {"id": "b"}]), says="a -> a")
        self.check_refused("three", dict(BLOCK, steps=[{"id": "a"}, {"id": "b", "next": "c"}, {"id": "c", "next": "b"}]), says="b -> c -> b")
        # Forward links and an early 'done' are fine.
        _block, problems = parse_contract_text(contract_text(dict(BLOCK, steps=[{"id": "a", "next": "c"}, {"id": "b"}, {"id": "c", "next": "done"}])))
        self.assertEqual(problems, [])


class KeyPatternTest(CliCase):
    """Defect 13: a catastrophic key_pattern made 'effect begin' spin while holding the run's lock."""

    def test_the_pathological_pattern_is_refused_at_check_and_init(self) -> None:
        block = dict(BLOCK, effects={"key_pattern": "(a+)+b"})
        path = self.write("redos.md", contract_text(block))
        self.refused("contract", "check", path, says="quantifier on a group that holds a quantifier")
        fresh = os.path.join(self.tmp, "fresh")
        self.assertEqual(self.cli("--dir", fresh, "init", "--contract", path).code, 2)
        self.assertFalse(os.path.exists(fresh))

    def test_the_subset(self) -> None:
        for pattern in ("(a*)*", "(a|b+)*", "(x{2})+", "\\1", "(a)\\1", "^a", "a$", "a(?=b)", "(?i)a", "(?P<n>a)", "a{1000}", "a**", "[a", "(a", "a)",
                        "x" * 501):
            with self.subTest(pattern=pattern), self.assertRaises(InvalidInput):
                KeyPattern(pattern)
        for pattern, key, expected in (("[a-z0-9][a-z0-9:._-]*", "post:weekly-2026-48:publish", True),
                                       ("doc-[0-9]{5}:ticket", "doc-00042:ticket", True), ("doc-[0-9]{5}:ticket", "doc-0042:ticket", False),
                                       ("(?:ab|c)+\\.x?", "abcab.", True), ("a|b", "ab", False)):
            with self.subTest(pattern=pattern, key=key):
                self.assertEqual(KeyPattern(pattern).fullmatch(key), expected)
        with self.assertRaisesRegex(InvalidInput, "migrate"):
            EffectsSpec(key_pattern="(a+)+b").key_allowed("aaa")
        self.assertFalse(EffectsSpec(key_pattern="a*").key_allowed("a" * 201))

    def test_matching_agrees_with_re_and_its_automaton_stays_small(self) -> None:
        import random
        import re

        rng = random.Random(7)
        atoms = ["a", "b", "\\d", ".", "[ab]", "[^a]", "(a|b)", "(?:ab|a)", "(a|)", ":", "\\."]
        quantifiers = ["", "", "*", "+", "?", "{2}", "{1,3}", "{0,}"]
        compared = 0
        for _ in range(600):
            pattern = "".join(rng.choice(atoms) + rng.choice(quantifiers) for _ in range(rng.randint(1, 5)))
            compiled = compile_pattern(pattern)
            self.assertLessEqual(len(compiled.edges), 8 * len(pattern) + 2, pattern)
            for _ in range(10):
                key = "".join(rng.choice("ab1:.") for _ in range(rng.randint(0, 8)))
                self.assertEqual(compiled.fullmatch(key), re.fullmatch(pattern, key) is not None, (pattern, key))
                compared += 1
        self.assertEqual(compared, 6000)

    def test_patterns_that_backtracking_cannot_finish_are_matched_at_once_under_the_lock(self) -> None:
        # Accepted by the subset (no quantifier inside a quantified group), yet exponential for re:
        # (a|aa)* splits a run of n letters in Fibonacci(n) ways before the final 'b' fails.
        block = dict(BLOCK, task_id="inputs-2", effects={"key_pattern": "(a|aa)*b"})
        run_dir = os.path.join(self.tmp, "run2")
        self.ok("--dir", run_dir, "init", "--contract", self.write("fib.md", contract_text(block)))
        self.ok("--dir", run_dir, "lease", "acquire", "--owner", "w1", "--ttl", "600")
        self.ok("--dir", run_dir, "step", "start", "a", "--owner", "w1", "--epoch", "1")
        payload = self.write("p.json", '{"x": 1}')
        key = "a" * 190
        # A child process with a bound: before the fix this begin ran for longer than the universe's age.
        result = _util.run(_util.python("-m", "runner", "--dir", run_dir, "effect", "begin", key, "--payload", payload,
                                        "--owner", "w1", "--epoch", "1"), timeout=60)
        self.assertEqual(result.code, 2, result)
        self.assertIn("does not match the contract's key_pattern", result.err)
        result = _util.run(_util.python("-m", "runner", "--dir", run_dir, "effect", "begin", key + "b", "--payload", payload,
                                        "--owner", "w1", "--epoch", "1"), timeout=60)
        self.assertEqual(result.code, 0, result)


class EpochEnvironmentTest(CliCase):
    """Defect 19: RUNNER_EPOCH=one was ignored, and the write then failed as 'fenced' (exit 9)."""

    def test_an_unreadable_epoch_in_the_environment_is_invalid_input(self) -> None:
        for value in ("one", "-1", "1.5"):
            with self.subTest(value=value):
                result = _util.run(_util.python("-m", "runner", "--dir", self.run_dir, "step", "start", "a", "--owner", "w1"),
                                   env=_util.child_env(RUNNER_EPOCH=value))
                self.assertEqual(result.code, 2, result)
                self.assertEqual(_util.stderr_lines(result), [f"runner: invalid-input: RUNNER_EPOCH {value!r} " +
                                                              ("must not be negative" if value == "-1" else "is not a whole number")])
        result = _util.run(_util.python("-m", "runner", "--dir", self.run_dir, "step", "start", "a", "--owner", "w1"),
                           env=_util.child_env(RUNNER_EPOCH="1"))
        self.assertEqual(result.code, 0, result)

    def test_one_line_is_the_reason_check(self) -> None:
        self.assertEqual(one_line("disk full", "reason"), "disk full")
        for bad in ("", "   ", None, 5, "x" * 2001):
            with self.assertRaisesRegex(InvalidInput, "reason must be a non-empty line"):
                one_line(bad, "reason")


if __name__ == "__main__":
    unittest.main()
