"""git as a target: the contract's ``effects.git`` section (``runner/contract/git.py``, ``runner/contract/spec.py``).

Each problem of the section is named on its field's line; a payload field the
templates name is checked against the step's payload template; the frozen spec
carries the defaults; the templates fill payload fields in one pass.
"""

import json
import unittest
from typing import Any, Dict, List

from runner.contract import spec as specs
from runner.contract.git import fill, git_problems
from runner.contract.templates import item_values
from runner.contract.text import parse_contract_text
from tests.support.util import contract_markdown

KEY = "api:v2.3.0"


def section(**fields: Any) -> Dict[str, Any]:
    """An ``effects.git`` section: the release of version 2.3.0 with its VERSION file, then ``fields``."""
    made: Dict[str, Any] = {"files": {"VERSION": "{payload.version}\n"}, "message": "Release {payload.version}",
                            "tag": "v{payload.version}", "remote": "origin", "branch": "main"}
    made.update(fields)
    return {k: v for k, v in made.items() if v is not None}


def release_contract(git_section: Dict[str, Any], **effects: Any) -> Dict[str, Any]:
    """A contract that releases 2.3.0 in every folder of ``repos/`` through ``git_section``, ``effects`` beside it."""
    return {"contract": 1, "task_id": "release", "goal": "release 2.3.0 everywhere",
            "steps": [{"id": "release", "items": {"glob": "repos/*/"}, "key": "{slug}:v2.3.0",
                       "payload": {"template": {"version": "2.3.0"}}, "next": "done"}],
            "effects": dict({"git": git_section}, **effects), "retry": {"base_seconds": 0.05, "cap_seconds": 0.2}}


class ContractTest(unittest.TestCase):
    """``contract check`` of the section: each problem on its field's line; the spec carries the defaults."""

    def problems(self, contract: Dict[str, Any]) -> List[str]:
        text = contract_markdown(json.dumps(contract, indent=2))
        return [f"{p.line}: {p.message}" for p in parse_contract_text(text)[1]]

    def test_a_release_reads_as_its_spec_with_the_defaults(self) -> None:
        least = {"message": "Release {payload.version}", "tag": "v{payload.version}", "branch": "main"}
        contract = release_contract(least)
        self.assertEqual(self.problems(contract), [])
        made = specs.read_contract(contract).effects
        self.assertEqual(made.git, specs.GitSpec(**least))
        self.assertEqual((made.git.repository, made.git.remote, made.git.annotated, made.git.not_now, made.git.files,
                          made.git.edit, made.git.author),
                         ("{item}", "origin", True, ("try again later", "temporarily"), (), None, None))
        self.assertTrue(made.performs_effects)
        full = specs.read_contract(release_contract(section(
            repository="src/{stem}", edit=["tool", "{payload_file}"], annotated=False, not_now=["busy"],
            author={"name": "Release Bot", "email": "bot@example.invalid"}))).effects.git
        self.assertEqual((full.repository, full.files, full.edit, full.annotated, full.not_now, full.author),
                         ("src/{stem}", (("VERSION", "{payload.version}\n"),), ("tool", "{payload_file}"), False,
                          ("busy",), ("Release Bot", "bot@example.invalid")))

    def test_each_problem_names_its_field_on_its_line(self) -> None:
        cases = [
            ({"tag": None}, "effects.git needs 'tag'"),
            ({"branch": None}, "effects.git needs 'branch'"),
            ({"message": None}, "effects.git needs 'message'"),
            ({"tagg": "x"}, "effects.git: unknown field 'tagg'"),
            ({"tag": "v {payload.version}"}, "effects.git.tag 'v {payload.version}' holds a space"),
            ({"tag": "-{payload.version}"}, "starts with '-'"),
            ({"tag": "v{payload.version}.lock"}, "ends with '/', '.' or '.lock'"),
            ({"tag": "v{epoch}"}, "effects.git.tag: unknown placeholder {epoch}"),
            ({"branch": "rel..x"}, "effects.git.branch 'rel..x' holds '..'"),
            ({"branch": "{payload.branch}"}, "effects.git.branch: unknown placeholder {payload.branch}"),
            ({"remote": "https://bot:hunter2@git.example/x.git"}, "effects.git.remote holds a password"),
            ({"remote": "https://ghp_0123456789@github.com/o/r.git"}, "effects.git.remote holds a password or a token"),
            ({"remote": "--upload-pack=evil"}, "effects.git.remote must name a remote"),
            ({"repository": "../elsewhere/{stem}"}, "effects.git.repository must be a folder relative to the"),
            ({"files": {".git/hooks/pre-push": "x"}}, "must be a path relative to the repository, without '..' and "
                                                      "outside .git"),
            ({"files": {"../VERSION": "x"}}, "without '..'"),
            ({"files": {"VERSION": 3}}, "the content of 'VERSION' must be a string"),
            ({"files": {}}, "effects.git.files must be an object of paths"),
            ({"edit": "bump.sh"}, "effects.git.edit must be a non-empty list of strings"),
            ({"edit": ["bump", "{payload}"]}, "effects.git.edit: unknown placeholder {payload}"),
            ({"annotated": "yes"}, "effects.git.annotated must be true"),
            ({"not_now": ["busy\nnow"]}, "effects.git.not_now must list the phrases"),
            ({"author": {"name": "Bot"}}, "effects.git.author must be"),
        ]
        for change, expected in cases:
            with self.subTest(change=change):
                contract = release_contract(section(**change))
                found = self.problems(contract)
                self.assertTrue(any(expected in p for p in found), found)
                field, value = next(iter(change.items()))
                if value is not None:
                    # On the field's line; a problem of one file, on that file's line.
                    named = next(iter(value)) if isinstance(value, dict) and field == "files" and value else field
                    text = contract_markdown(json.dumps(contract, indent=2)).splitlines()
                    line = int(next(p for p in found if expected in p).split(":")[0])
                    self.assertIn(f'"{named}"', text[line - 1], "the problem is on its field's line")

    def test_git_excludes_http_and_commands_and_payload_fields_are_checked_against_the_template(self) -> None:
        self.assertIn("effects: git and invoke/observe exclude each other; keep one of them",
                      " ".join(self.problems(release_contract(section(), invoke=["a"], observe=["b"]))))
        self.assertIn("effects: git and http exclude each other",
                      " ".join(git_problems({"git": section(), "http": {}})))
        wrong = release_contract(section(tag="v{payload.verison}"))
        self.assertEqual([p.split(": ", 1)[1] for p in self.problems(wrong)],
                         ["effects.git names {payload.verison}, which the payload of step 'release' does not hold "
                          "(it holds: version)"])
        by_command = release_contract(section(tag="v{payload.verison}"))
        by_command["steps"][0]["payload"] = {"command": ["make-payload", "{key}"]}
        self.assertEqual(self.problems(by_command), [], "a payload made by a command is known when its item begins")

    def test_templates_fill_payload_fields_once_and_leave_unknown_braces(self) -> None:
        values = dict(item_values("repos/api", 3), key=KEY)
        self.assertEqual(fill("{stem}-{index:03d} {payload.version} {payload.n} {payload.notes} {other}", values,
                              {"version": "2.3.0", "n": 7, "notes": "{stem}"}), "api-003 2.3.0 7 {stem} {other}")
        with self.assertRaises(KeyError):
            fill("v{payload.version}", values, {})


if __name__ == "__main__":
    unittest.main()
