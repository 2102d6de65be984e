"""The form every source file of the runner and its tools keeps: no line over 120 characters.

CI does not run a linter, so this test is what holds the rule that ``ruff.toml`` states for those who run ruff.
"""
import os
import tempfile
import unittest
from typing import List

from tests.support.util import REPO_ROOT

MAX_LINE = 120
CHECKED = ("runner", "tools", "bench", "hooks", "templates")


def python_files(root: str) -> List[str]:
    """Every ``.py`` file under the checked folders of ``root``, as paths relative to it, sorted."""
    found = []
    for top in CHECKED:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                relative = os.path.relpath(os.path.join(folder, name), root)
                if name.endswith(".py"):
                    found.append(relative)
    return sorted(found)


def long_lines(path: str) -> List[str]:
    """``PATH:LINE: N characters`` for each line of ``path`` longer than :data:`MAX_LINE` characters."""
    out = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            length = len(line.rstrip("\r\n"))
            if length > MAX_LINE:
                out.append(f"{path}:{number}: {length} characters")
    return out


class LineLengthTest(unittest.TestCase):
    def test_no_line_of_the_runner_or_its_tools_is_over_120_characters(self) -> None:
        files = python_files(REPO_ROOT)
        self.assertGreater(len(files), 100, "the walk found the runner's modules")
        found = [line for path in files for line in long_lines(os.path.join(REPO_ROOT, path))]
        self.assertEqual(found, [], f"{len(found)} line(s) over {MAX_LINE} characters")

    def test_the_check_sees_a_long_line(self) -> None:
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "runner", "__pycache__"))
            for relative in (os.path.join("runner", "m.py"), os.path.join("runner", "__pycache__", "m.py"),
                             os.path.join("runner", "notes.txt")):
                with open(os.path.join(root, relative), "w", encoding="utf-8") as handle:
                    handle.write("x = 1\n" + "y = '" + "a" * 120 + "'\n")
            self.assertEqual(python_files(root), [os.path.join("runner", "m.py")])
            self.assertEqual(long_lines(os.path.join(root, "runner", "m.py")),
                             [f"{os.path.join(root, 'runner', 'm.py')}:2: 126 characters"])


if __name__ == "__main__":
    unittest.main()
