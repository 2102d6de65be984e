"""One exit table: ``runner.base.errors.EXIT_TABLE`` is the single source of codes and reasons.

``--help`` is generated from it; README.md's exit table must repeat it row for row (code,
reason, meaning) and SKILL.md's must list the same codes and reasons, each with what the agent
does. The check is a function of the text, so it is also shown to fail on tampered copies.
"""

import inspect
import os
import re
import unittest
from typing import List, Tuple

from runner.base import errors
from runner.base.errors import EXIT_CODES, EXIT_TABLE, RunnerError

from .support import util as _util

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_HEADER = ("exit", "reason", "meaning")
SKILL_HEADER = ("exit", "reason", "what you do")


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
        return handle.read()


def table_rows(text: str, header: Tuple[str, ...]) -> List[Tuple[str, ...]]:
    """The body rows of the first Markdown table whose header row is ``header``, as cell tuples."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if _cells(line) == header:
            rows = []
            for body in lines[index + 2:]:
                if not body.startswith("|"):
                    break
                rows.append(_cells(body))
            return rows
    return []


def _cells(line: str) -> Tuple[str, ...]:
    line = line.strip()
    if not (line.startswith("|") and line.endswith("|")):
        return ()
    return tuple(cell.strip() for cell in line[1:-1].split("|"))


def readme_problems(text: str) -> List[str]:
    """Every way README.md's exit table differs from :data:`EXIT_TABLE`."""
    rows = table_rows(text, README_HEADER)
    if not rows:
        return ["no exit table (| exit | reason | meaning |)"]
    want = [(str(r.code), r.reason, r.meaning) for r in EXIT_TABLE]
    problems = [f"row {i + 1}: {got} differs from {exp}" for i, (got, exp) in enumerate(zip(rows, want)) if got != exp]
    if len(rows) != len(want):
        problems.append(f"{len(rows)} rows, the exit table has {len(want)}")
    return problems


def skill_problems(text: str) -> List[str]:
    """Every way SKILL.md's exit/what-to-do table differs from :data:`EXIT_TABLE`."""
    rows = table_rows(text, SKILL_HEADER)
    if not rows:
        return ["no exit table (| exit | reason | what you do |)"]
    want = [(str(r.code), r.reason) for r in EXIT_TABLE]
    problems = [f"row {i + 1}: {got[:2]} differs from {exp}" for i, (got, exp) in enumerate(zip(rows, want)) if got[:2] != exp]
    problems += [f"row {i + 1} ({row[0]}): says nothing about what to do" for i, row in enumerate(rows) if len(row) != 3 or not row[2]]
    if len(rows) != len(want):
        problems.append(f"{len(rows)} rows, the exit table has {len(want)}")
    return problems


class ExitTableTest(unittest.TestCase):
    def test_one_class_per_code_and_every_class_in_the_table(self) -> None:
        classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, RunnerError)]
        self.assertEqual(sorted((c.exit_code, c.reason) for c in classes), [(r.code, r.reason) for r in EXIT_TABLE[1:]])
        self.assertEqual([r.code for r in EXIT_TABLE], list(range(16)))
        self.assertEqual(len({r.reason for r in EXIT_TABLE}), len(EXIT_TABLE))
        self.assertEqual(EXIT_CODES, {r.reason: r.code for r in EXIT_TABLE})
        self.assertEqual((EXIT_CODES["retry-later"], EXIT_CODES["failed"], EXIT_CODES["proof-failed"], EXIT_CODES["already-verified"]), (11, 12, 13, 14))
        for row in EXIT_TABLE:
            self.assertNotIn("|", row.meaning, "a meaning must fit a Markdown table cell")

    def test_help_is_generated_from_the_table(self) -> None:
        result = _util.run_cli("--help")
        self.assertEqual(result.code, 0, result.err)
        flat = re.sub(r"-\n", "-", result.out)  # argparse wraps after a hyphen
        flat = re.sub(r"\s+", " ", flat)
        expected = "exit codes: " + ", ".join(f"{r.code} {r.reason}" for r in EXIT_TABLE)
        self.assertIn(expected, flat)

    def test_readme_table_matches(self) -> None:
        self.assertEqual(readme_problems(read("README.md")), [])

    def test_skill_table_matches(self) -> None:
        self.assertEqual(skill_problems(read("SKILL.md")), [])

    def test_the_check_fails_on_tampered_copies(self) -> None:
        readme, skill = read("README.md"), read("SKILL.md")
        retry = next(r for r in EXIT_TABLE if r.code == 11)
        tampered = {
            "README reason changed": (readme_problems, readme.replace(f"| 11 | {retry.reason} |", "| 11 | try-again |")),
            "README meaning changed": (readme_problems, readme.replace(retry.meaning, "wait a bit")),
            "README row dropped": (readme_problems, readme.replace(f"| 14 | already-verified | {EXIT_TABLE[14].meaning} |\n", "")),
            "README codes swapped": (readme_problems, readme.replace("| 12 | failed |", "| 13 | failed |")),
            "SKILL reason changed": (skill_problems, skill.replace("| 12 | failed |", "| 12 | failure |")),
            "SKILL row dropped": (skill_problems, re.sub(r"\| 13 \| proof-failed \|[^\n]*\n", "", skill)),
            "SKILL advice emptied": (skill_problems, re.sub(r"(\| 11 \| retry-later \|)[^\n]*\|", r"\1 |", skill)),
            "SKILL table gone": (skill_problems, skill.replace("| exit | reason | what you do |", "| code | why | do |")),
        }
        for name, (check, text) in tampered.items():
            with self.subTest(name):
                self.assertNotEqual(text, readme if check is readme_problems else skill, "the tampering changed nothing")
                self.assertTrue(check(text), f"{name}: the check did not notice")


if __name__ == "__main__":
    unittest.main()
