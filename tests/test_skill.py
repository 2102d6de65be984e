"""The skill text is checked against the specification and against the code.

* The frontmatter follows the Agent Skills rules (allowed keys, name pattern
  and length, description length, no XML tags) and the body stays under 500 lines.
* Every item of the verification checklist names a test that exists in the
  default suite and is not skipped, so the checklist cannot drift from the proof.
* Every runner command shown in SKILL.md, the references and the templates is
  accepted by the command line's argument parser.
"""

import os
import re
import shlex
import unittest
from typing import Dict, List, Tuple

from runner.surfaces.cli import build_parser, split_command
from runner.proof.cli import add_proof_verbs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKILL = os.path.join(ROOT, "SKILL.md")
ALLOWED_KEYS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def parse_frontmatter(text: str) -> Tuple[Dict[str, str], str]:
    """Split ``---`` frontmatter from the body; values are top-level scalars (nested keys are kept raw)."""
    if not text.startswith("---\n"):
        raise ValueError("no frontmatter: the file must start with a line of three dashes")
    end = text.find("\n---\n", 4)
    if end < 0:
        raise ValueError("the frontmatter is never closed")
    fields: Dict[str, str] = {}
    key = None
    for line in text[4:end].split("\n"):
        if not line.strip():
            continue
        if line[0] in " \t" and key is not None:
            fields[key] += "\n" + line.strip()
            continue
        match = re.match(r"^([A-Za-z][A-Za-z0-9_-]*):\s*(.*)$", line)
        if not match:
            raise ValueError(f"frontmatter line is not 'key: value': {line!r}")
        key, value = match.group(1), match.group(2).strip()
        if key in fields:
            raise ValueError(f"frontmatter key {key!r} repeats")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        fields[key] = value
    return fields, text[end + 5 :]


def frontmatter_problems(text: str) -> List[str]:
    """Every way ``text`` breaks the Agent Skills frontmatter rules (empty when it follows them)."""
    try:
        fields, _ = parse_frontmatter(text)
    except ValueError as exc:
        return [str(exc)]
    problems = [f"key {k!r} is not allowed (allowed: {', '.join(sorted(ALLOWED_KEYS))})" for k in fields if k not in ALLOWED_KEYS]
    name = fields.get("name", "")
    if not name:
        problems.append("name is missing")
    elif len(name) > 64 or not NAME_RE.match(name):
        problems.append("name must be 1-64 lowercase letters, digits and single hyphens, not starting or ending with one")
    elif any(word in name for word in ("anthropic", "claude")):
        problems.append("name must not contain reserved words")
    description = fields.get("description", "")
    if not description:
        problems.append("description is missing")
    elif len(description) > 1024:
        problems.append(f"description is {len(description)} characters; the limit is 1,024")
    for key in ("name", "description"):
        if re.search(r"<[^>]*>", fields.get(key, "")):
            problems.append(f"{key} must not contain XML tags")
    if "compatibility" in fields and not 1 <= len(fields["compatibility"]) <= 500:
        problems.append("compatibility must be 1-500 characters")
    return problems


def checklist_items(text: str) -> List[Tuple[str, List[str]]]:
    section = text.split("## Verification checklist", 1)[1].split("\n## ", 1)[0]
    items = []
    for line in section.splitlines():
        if line.startswith("- [ ]"):
            items.append((line, re.findall(r"`(tests\.[A-Za-z0-9_.]+)`", line)))
    return items


def shown_commands(text: str) -> List[str]:
    """Runner invocations in the text: ``python3 -m runner ...`` or ``python3 PATH/runner ...``."""
    commands = []
    for match in re.finditer(r"python3 (?:-m runner|\S*/runner)(?![\w.])((?: [^`\n|;&#)]*)?)", text):  # not runner.proof.X
        rest = re.split(r"\s\d?>", match.group(1))[0].strip()
        rest = rest.replace("$RUNNER_OWNER", "agent-1").replace('"$RUNNER_OWNER"', "agent-1")
        commands.append(rest)
    return commands


def _load(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


class FrontmatterTest(unittest.TestCase):
    """SKILL.md validates under the specification's rules."""

    def test_skill_frontmatter_follows_the_specification(self) -> None:
        text = _load(SKILL)
        self.assertEqual(frontmatter_problems(text), [])
        fields, body = parse_frontmatter(text)
        self.assertEqual(fields["name"], "long-running-agent-sessions")
        self.assertLess(text.count("\n") + 1, 500)
        self.assertIn("Use when", fields["description"])

    def test_validator_rejects_what_the_specification_forbids(self) -> None:
        good = "---\nname: a-skill\ndescription: Does a thing. Use when a thing is needed.\n---\nbody\n"
        self.assertEqual(frontmatter_problems(good), [])
        cases = {
            "no frontmatter": "name: x\n",
            "not allowed": good.replace("name: a-skill", "name: a-skill\nversion: 2"),
            "lowercase": good.replace("a-skill", "A_Skill"),
            "hyphen": good.replace("a-skill", "a--skill"),
            "1-64": good.replace("a-skill", "a" * 65),
            "1,024": good.replace("Does a thing.", "x" * 1100),
            "XML": good.replace("Does a thing.", "Does <b>a</b> thing."),
            "description is missing": "---\nname: a-skill\n---\n",
            "repeats": good.replace("name: a-skill", "name: a-skill\nname: b"),
        }
        for expected, text in cases.items():
            with self.subTest(expected):
                problems = frontmatter_problems(text)
                self.assertTrue(problems, text)
                self.assertTrue(any(expected in p for p in problems), problems)


class LoadedSizeTest(unittest.TestCase):
    """The skill stays near 5,000 tokens when loaded; the real client's estimate is checked by tools/harness_check.py."""

    # ``claude plugin details`` (2.1.197) estimated a 25,209-character SKILL.md at ~6.1k tokens: about 4.1 characters a
    # token. 20,500 characters keeps the body under 5,000 by that rate, so a change that would fail the real check
    # fails here first, offline.
    MAX_CHARACTERS = 20500

    def test_the_skill_is_small_enough_to_load_whole(self) -> None:
        self.assertLessEqual(len(_load(SKILL)), self.MAX_CHARACTERS)

    def test_the_token_estimate_is_read_from_the_clients_table(self) -> None:
        from tools.harness_check import CheckFailed, skill_tokens

        table = "Per-component (rounded)\n  component  always-on  on-invoke\n  long-running-agent-sessions       ~190      {}\n"
        self.assertEqual(skill_tokens(table.format("~6.1k")), 6100)
        self.assertEqual(skill_tokens(table.format("~4,460")), 4460)
        self.assertEqual(skill_tokens(table.format("~980")), 980)
        with self.assertRaises(CheckFailed):
            skill_tokens("Per-component (rounded)\n  another-skill  ~190  ~6.1k\n")


class ChecklistTraceabilityTest(unittest.TestCase):
    """Every checklist item names tests that exist in the default suite and are not skipped."""

    def test_every_checklist_item_names_a_real_test(self) -> None:
        items = checklist_items(_load(SKILL))
        self.assertGreaterEqual(len(items), 8)
        discovered = set()
        stack = [unittest.defaultTestLoader.discover(os.path.join(ROOT, "tests"), top_level_dir=ROOT)]
        while stack:
            suite = stack.pop()
            for test in suite:
                if isinstance(test, unittest.TestSuite):
                    stack.append(test)
                else:
                    discovered.add(test.id())
        for line, names in items:
            with self.subTest(line):
                self.assertTrue(names, "the item names no test")
                for name in names:
                    self.assertTrue(name in discovered, f"{name} is not a test of the default suite")
                    module, cls, method = name.rsplit(".", 2)
                    test_class = getattr(__import__(module, fromlist=[cls]), cls)
                    self.assertFalse(getattr(test_class, "__unittest_skip__", False), f"{cls} is skipped")
                    self.assertFalse(getattr(getattr(test_class, method), "__unittest_skip__", False), f"{name} is skipped")


class ShownCommandsTest(unittest.TestCase):
    """Every runner command shown in the skill's text is accepted by the argument parser."""

    def test_every_shown_command_parses(self) -> None:
        parser = build_parser((add_proof_verbs,))
        files = [SKILL, os.path.join(ROOT, "README.md")]
        for folder in ("references", "templates", os.path.join("templates", "recipes")):
            for name in sorted(os.listdir(os.path.join(ROOT, folder))):
                if name.endswith((".md", ".py")):
                    files.append(os.path.join(ROOT, folder, name))
        seen = 0
        for path in files:
            for command in shown_commands(_load(path)):
                with self.subTest(path=os.path.relpath(path, ROOT), command=command):
                    own, _ = split_command(shlex.split(command))
                    parser.parse_args(own)
                    seen += 1
        self.assertGreater(seen, 25)

    def test_a_wrong_command_is_caught(self) -> None:
        from runner.base.errors import InvalidInput

        with self.assertRaises(InvalidInput):
            build_parser().parse_args(shlex.split("effect begn KEY --payload p.json"))


class TemplatesTest(unittest.TestCase):
    """The templates and references the skill points to exist, and the example contract is accepted."""

    def test_referenced_files_exist(self) -> None:
        text = _load(SKILL)
        for ref in sorted(set(re.findall(r"`((?:references|templates)/[A-Za-z0-9_.-]+)`", text))):
            with self.subTest(ref):
                self.assertTrue(os.path.isfile(os.path.join(ROOT, ref)), ref)

    def test_long_references_start_with_contents(self) -> None:
        for name in sorted(os.listdir(os.path.join(ROOT, "references"))):
            if name.endswith(".md"):
                text = _load(os.path.join(ROOT, "references", name))
                if text.count("\n") > 300:
                    with self.subTest(name):
                        self.assertRegex(text[:2000], r"(?im)^#+ (table of )?contents")

    def test_example_contract_is_accepted_and_blank_template_is_well_formed(self) -> None:
        from runner.contract.text import check_contract

        block, problems = check_contract(os.path.join(ROOT, "templates", "run-contract.example.md"))
        self.assertEqual(problems, [])
        self.assertTrue(any(step.get("approval") for step in block["steps"] if step["id"] == "publish"))
        block, problems = check_contract(os.path.join(ROOT, "templates", "run-contract.md"))
        self.assertEqual(problems, [])


if __name__ == "__main__":
    unittest.main()
