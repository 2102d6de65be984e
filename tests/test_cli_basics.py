"""The command line's entry points, its groups of verbs, and ``contract check``."""

import argparse
import os
import unittest
from typing import Callable, Dict, List, Tuple

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

from runner.surfaces import cli

TEMPLATE_TASK = "weekly-post-2026-48"


class EntryPoints(unittest.TestCase):
    """``python3 -m runner`` from the repository root and ``python3 path/to/runner`` from another folder both run init, status and doctor."""

    def chain(self, via: str, cwd: str, run_dir: str) -> List[_util.Result]:
        env = _util.child_env(pythonpath=False)
        results = []
        for argv in (["init", "--contract", _util.TEMPLATE], ["status"], ["doctor"]):
            results.append(_util.run_cli("--dir", run_dir, "--json", *argv, via=via, cwd=cwd, env=env, site=True))
        return results

    def test_module_from_the_repository_root_and_folder_from_elsewhere(self) -> None:
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        elsewhere = os.path.join(tmp.name, "elsewhere")
        os.mkdir(elsewhere)
        module_run = os.path.join(tmp.name, "module-run")
        chains = _util.in_parallel(
            [
                lambda: self.chain("module", _util.REPO_ROOT, module_run),
                # A relative --dir is taken from the working folder.
                lambda: self.chain("path", elsewhere, "run"),
            ]
        )
        for (label, where), results in zip((("module", module_run), ("path", os.path.join(elsewhere, "run"))), chains):
            with self.subTest(via=label):
                init, status, doctor = results
                for result in results:
                    self.assertEqual(result.code, 0, result.err)
                    self.assertNotIn("Traceback", result.err)
                body = _util.one_json(init)
                self.assertEqual(body["task_id"], TEMPLATE_TASK)
                self.assertEqual(body["revision"], 0)
                self.assertEqual(os.path.realpath(body["path"]), os.path.realpath(where))
                self.assertTrue(os.path.isfile(os.path.join(where, "run.json")))
                self.assertEqual(_util.one_json(status)["revision"], 0)
                self.assertEqual(_util.one_json(status)["task_id"], TEMPLATE_TASK)
                self.assertTrue(_util.one_json(doctor)["healthy"])


def _read_template() -> List[str]:
    with open(_util.TEMPLATE, encoding="utf-8") as handle:
        return handle.read().splitlines()


def _index(lines: List[str], needle: str, after: int = 0) -> int:
    """Index of the first line at or after ``after`` that contains ``needle``."""
    for index in range(after, len(lines)):
        if needle in lines[index]:
            return index
    raise AssertionError(f"the template has no line with {needle!r}")


def broken_invalid_json(lines: List[str]) -> Tuple[List[str], int, str]:
    i = _index(lines, '"goal":')
    lines[i] = '  "goal": Publish this week\'s post,'
    return lines, i + 1, "invalid JSON"


def broken_unknown_field(lines: List[str]) -> Tuple[List[str], int, str]:
    i = _index(lines, '"goal":')
    lines.insert(i + 1, '  "colour": "blue",')
    return lines, i + 2, "unknown field 'colour'"


def broken_duplicate_step(lines: List[str]) -> Tuple[List[str], int, str]:
    i = _index(lines, '"next": "done"}', _index(lines, '"steps"'))
    lines[i] = lines[i].rstrip() + ","
    lines.insert(i + 1, '    {"id": "draft", "artifact": "a second draft", "check": "none", "next": "done"}')
    return lines, i + 2, "'draft' repeats step 1"


def broken_next(lines: List[str]) -> Tuple[List[str], int, str]:
    i = _index(lines, '"next": "publish"', _index(lines, '"steps"'))
    lines[i] = lines[i].replace('"next": "publish"', '"next": "publsh"')
    return lines, i + 1, "'publsh' is not a step id"


def broken_two_blocks(lines: List[str]) -> Tuple[List[str], int, str]:
    lines += ["", "A second block:", "", "```json run-contract", "{}", "```"]
    return lines, len(lines) - 2, "a second"


BROKEN: Dict[str, Callable[[List[str]], Tuple[List[str], int, str]]] = {
    "invalid-json": broken_invalid_json,
    "unknown-field": broken_unknown_field,
    "duplicate-step": broken_duplicate_step,
    "next-names-no-step": broken_next,
    "two-blocks": broken_two_blocks,
}


class HelpWidth(unittest.TestCase):
    """Help is wrapped to ``$COLUMNS`` (else the terminal's width, else 80), as argparse wraps it."""

    def help_lines(self, columns: str) -> List[str]:
        result = _util.run_cli("lease", "--help", env=_util.child_env(COLUMNS=columns))
        self.assertEqual(result.code, 0, result.err)
        return result.out.split("\n\nexit codes:")[0].splitlines()  # the exit table below is printed as written

    def test_narrow_and_wide(self) -> None:
        narrow, wide = self.help_lines("60"), self.help_lines("200")
        self.assertLessEqual(max(len(line) for line in narrow), 58, narrow)
        self.assertTrue(wide[0].startswith("usage: runner lease") and wide[0].endswith("{acquire,renew,release,break,show}"), wide[0])
        self.assertLess(len(wide), len(narrow))


class VerbGroups(unittest.TestCase):
    """The command line's verbs come from its groups, in the order ``--help`` lists them.

    A call builds only the verbs it names.
    """

    def test_each_verb_is_added_by_one_group_in_the_order_help_lists_them(self) -> None:
        added: List[Tuple[str, str]] = []

        def verb(name: str, help_text: str, handler: Callable[..., int], epilog: str = "") -> argparse.ArgumentParser:
            added.append((group.__name__, name))
            return argparse.ArgumentParser(prog=name)

        for group in cli._GROUPS:
            group(verb)
        names = [name for _, name in added]
        self.assertEqual(names, list(cli.build_parser().verb_parsers))  # type: ignore[attr-defined]
        self.assertEqual(len(set(names)), len(names))
        self.assertEqual([name for group, name in added if group == "_decision_verbs"],
                         ["next", "drive", "recover", "brief"])

    def test_only_the_verbs_a_call_names_are_built(self) -> None:
        extended: List[str] = []

        def extension(verb: Callable[..., argparse.ArgumentParser]) -> None:
            extended.append("demo")
            verb("demo", "a verb of an extension", lambda args: 0).add_argument("--size", type=int)

        parser = cli.build_parser([extension], only={"drive", "--parallel", "2", "demo"})
        self.assertEqual(sorted(parser.verb_parsers), ["demo", "drive"])  # type: ignore[attr-defined]
        args = parser.parse_args(["drive", "--parallel", "2", "--owner", "w1"])
        self.assertEqual((args.verb, args.parallel, args.owner, args.verb_handler), ("drive", 2, "w1", cli.cmd_drive))
        self.assertEqual(parser.parse_args(["demo", "--size", "3"]).size, 3)
        self.assertEqual(extended, ["demo"])
        self.assertEqual(list(cli.build_parser(only=set()).verb_parsers), [])  # type: ignore[attr-defined]


class ContractCheck(unittest.TestCase):
    """``contract check`` passes the shipped example and fails broken copies with exit 2, naming the line (FILE:LINE: message)."""

    def test_shipped_example_passes(self) -> None:
        text, body = _util.in_parallel(
            [
                lambda: _util.run_cli("contract", "check", _util.TEMPLATE),
                lambda: _util.run_cli("--json", "contract", "check", _util.TEMPLATE),
            ]
        )
        self.assertEqual(text.code, 0, text.err)
        self.assertIn(": ok", text.out)
        self.assertEqual(text.err, "")
        self.assertEqual(body.code, 0, body.err)
        report = _util.one_json(body)
        self.assertTrue(report["ok"])
        self.assertEqual(report["task_id"], TEMPLATE_TASK)
        self.assertEqual(report["steps"], ["draft", "review", "publish"])

    def test_broken_copies_name_the_line(self) -> None:
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        cases = []
        for label, breaker in BROKEN.items():
            lines, line, needle = breaker(_read_template())
            path = os.path.join(tmp.name, f"{label}.md")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")
            cases.append((label, path, line, needle))
        # One copy in a child process; the others through the same entry point in this process.
        results = [_util.run_cli("contract", "check", path) if label == "two-blocks" else _util.in_process_cli(["contract", "check", path]) for label, path, _line, _needle in cases]
        for (label, path, line, needle), result in zip(cases, results):
            with self.subTest(broken=label):
                self.assertEqual(result.code, 2, result.err)
                self.assertNotIn("Traceback", result.err)
                errors = result.err.splitlines()
                self.assertTrue(errors, "no error printed")
                self.assertTrue(all(e.startswith(f"{path}:") for e in errors), errors)
                matching = [e for e in errors if needle in e]
                self.assertEqual(len(matching), 1, errors)
                self.assertTrue(matching[0].startswith(f"{path}:{line}: "), f"expected line {line}: {matching[0]}")


if __name__ == "__main__":
    unittest.main()
