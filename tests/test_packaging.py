"""The plugin manifests: they parse, agree on one version, and name files that exist.

The version lives in ``runner.__version__``; every manifest must carry the
same string. Each path a manifest names (skills, hooks files, the MCP
server's command, each hook's script) must exist in the checkout, with
``${CLAUDE_PLUGIN_ROOT}`` standing for the plugin root. A copy of the folder
dropped into ``.agents/skills/`` (or ``.claude/skills/``) still works: its
runner and its hooks run from the copy.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest
from typing import Any, Dict, List

from tests.support.util import REPO_ROOT, TEMPLATE, child_env

import runner
from runner.surfaces import hooks

NAME = "long-running-agent-sessions"
CLAUDE_PLUGIN = os.path.join(REPO_ROOT, ".claude-plugin", "plugin.json")
CLAUDE_MARKETPLACE = os.path.join(REPO_ROOT, ".claude-plugin", "marketplace.json")
CODEX_PLUGIN = os.path.join(REPO_ROOT, ".codex-plugin", "plugin.json")
ROOT_VAR = "${CLAUDE_PLUGIN_ROOT}"


def load(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        value = json.load(handle)
    assert isinstance(value, dict), path
    return value


def in_root(path: str) -> str:
    """A manifest path (``./x`` or ``${CLAUDE_PLUGIN_ROOT}/x``) as a path in the checkout."""
    path = path.replace(ROOT_VAR, ".")
    return os.path.normpath(os.path.join(REPO_ROOT, path))


def hook_commands(hooks_file: str) -> Dict[str, List[List[str]]]:
    """Event -> the argument vectors of its command hooks."""
    out: Dict[str, List[List[str]]] = {}
    for event, groups in load(hooks_file)["hooks"].items():
        for group in groups:
            for hook in group["hooks"]:
                assert hook["type"] == "command" and 0 < hook["timeout"] <= 30, hook
                out.setdefault(event, []).append(shlex.split(hook["command"]))
    return out


def version_mismatches(claude: Dict[str, Any], market: Dict[str, Any], codex: Dict[str, Any]) -> Dict[str, Any]:
    """Each manifest version that differs from ``runner.__version__``, by where it is."""
    versions = {"claude plugin": claude.get("version"), "codex plugin": codex.get("version")}
    versions.update({f"marketplace entry {p.get('name')}": p.get("version") for p in market["plugins"]})
    return {where: version for where, version in versions.items() if version != runner.__version__}


class ManifestTests(unittest.TestCase):
    def test_every_manifest_carries_the_one_version_and_the_skill_name(self) -> None:
        claude, market, codex = load(CLAUDE_PLUGIN), load(CLAUDE_MARKETPLACE), load(CODEX_PLUGIN)
        self.assertRegex(runner.__version__, r"^\d+\.\d+\.\d+$")
        self.assertEqual(version_mismatches(claude, market, codex), {})
        self.assertEqual({claude["name"], codex["name"], market["name"]} | {p["name"] for p in market["plugins"]}, {NAME})
        with open(os.path.join(REPO_ROOT, "SKILL.md"), encoding="utf-8") as handle:
            self.assertIn(f"\nname: {NAME}\n", handle.read(400))
        with open(os.path.join(REPO_ROOT, "LICENSE"), encoding="utf-8") as handle:
            self.assertTrue(handle.readline().startswith(claude["license"]))
        self.assertEqual(codex["license"], claude["license"])

    def test_the_version_check_names_a_manifest_that_differs(self) -> None:
        claude, market, codex = load(CLAUDE_PLUGIN), load(CLAUDE_MARKETPLACE), load(CODEX_PLUGIN)
        market["plugins"][0]["version"] = "9.9.9"
        del codex["version"]
        self.assertEqual(version_mismatches(claude, market, codex), {f"marketplace entry {NAME}": "9.9.9", "codex plugin": None})

    def test_claude_manifest_names_files_that_exist(self) -> None:
        claude = load(CLAUDE_PLUGIN)
        self.assertEqual(claude["skills"], ["./"])
        for folder in claude["skills"]:
            self.assertTrue(os.path.isfile(os.path.join(in_root(folder), "SKILL.md")))
        self.assertTrue(os.path.isfile(in_root(claude["hooks"])))
        self.assertTrue(os.path.isfile(in_root(claude["mcpServers"])))
        self.assertEqual(load(CLAUDE_MARKETPLACE)["plugins"][0]["source"], "./")

    def test_codex_manifest_names_files_that_exist(self) -> None:
        codex = load(CODEX_PLUGIN)
        # Codex lists skills only from folders below the plugin root: one entry, pointing at the root skill.
        entries = os.listdir(in_root(codex["skills"]))
        self.assertEqual(entries, [NAME])
        entry = os.path.join(in_root(codex["skills"]), NAME, "SKILL.md")
        with open(entry, encoding="utf-8") as handle:
            text = handle.read()
        with open(os.path.join(REPO_ROOT, "SKILL.md"), encoding="utf-8") as handle:
            root_skill = handle.read()
        self.assertEqual(text.split("\n---\n", 1)[0], root_skill.split("\n---\n", 1)[0])
        pointer = re.search(r"`((?:\.\./)+SKILL\.md)`", text).group(1)
        self.assertEqual(os.path.normpath(os.path.join(os.path.dirname(entry), pointer)), os.path.join(REPO_ROOT, "SKILL.md"))
        self.assertTrue(os.path.isfile(in_root(codex["hooks"])))
        self.assertTrue(os.path.isfile(in_root(codex["mcpServers"])))
        self.assertEqual(os.listdir(os.path.dirname(CODEX_PLUGIN)), ["plugin.json"])

    def test_mcp_server_command_names_the_runner(self) -> None:
        servers = load(in_root(load(CLAUDE_PLUGIN)["mcpServers"]))["mcpServers"]
        self.assertEqual(list(servers), [NAME])
        server = servers[NAME]
        self.assertEqual(server["command"], "python3")
        self.assertEqual(server["args"][1:], ["mcp"])
        # The runner folder is the program (python3 FOLDER runs its __main__.py).
        self.assertTrue(os.path.isfile(os.path.join(in_root(server["args"][0]), "__main__.py")))

    def test_both_hook_files_wire_the_four_events_to_scripts_that_exist(self) -> None:
        wanted = {"SessionStart": "session_start.py", "Stop": "stop.py", "SessionEnd": "session_end.py", "PreCompact": "pre_compact.py"}
        for manifest, flag in ((CLAUDE_PLUGIN, []), (CODEX_PLUGIN, ["--harness", "codex"])):
            commands = hook_commands(in_root(load(manifest)["hooks"]))
            with self.subTest(manifest=os.path.relpath(manifest, REPO_ROOT)):
                self.assertEqual(set(commands), set(hooks.EVENTS))
                for event, argvs in commands.items():
                    self.assertEqual(len(argvs), 1)
                    python, script, *rest = argvs[0]
                    self.assertEqual(python, "python3")
                    self.assertEqual(os.path.basename(script), wanted[event])
                    self.assertTrue(os.path.isfile(in_root(script)), script)
                    self.assertEqual(rest, flag)
        matchers = {g.get("matcher") for g in load(in_root(load(CLAUDE_PLUGIN)["hooks"]))["hooks"]["SessionStart"]}
        self.assertEqual(matchers, {"startup|resume|clear|compact"})


class CopiedSkillTests(unittest.TestCase):
    """Copying the folder into a project's skills folder still gives a working runner and hooks."""

    def test_a_copy_in_agents_skills_runs_its_runner_and_hooks(self) -> None:
        tmp = tempfile.mkdtemp(prefix="runner-copy-")
        self.addCleanup(shutil.rmtree, tmp, True)
        project = os.path.join(tmp, "project")
        copy = os.path.join(project, ".agents", "skills", NAME)
        shutil.copytree(REPO_ROOT, copy, ignore=shutil.ignore_patterns(".git", "__pycache__", "tests", "bench"))
        env = child_env(pythonpath=False)
        env.pop("RUNNER_DIR", None)
        init = subprocess.run([sys.executable, os.path.join(copy, "runner"), "--dir", os.path.join(project, ".run"), "init", "--contract", TEMPLATE],
                              capture_output=True, text=True, env=env, cwd=tmp, timeout=60)
        self.assertEqual(init.returncode, 0, init.stderr)
        event = {"session_id": "s-1", "transcript_path": None, "cwd": project, "hook_event_name": "Stop", "stop_hook_active": False}
        stop = subprocess.run([sys.executable, os.path.join(copy, "hooks", "stop.py")], input=json.dumps(event), capture_output=True, text=True,
                              env=env, cwd=tmp, timeout=60)
        self.assertEqual(stop.returncode, 0, stop.stderr)
        answer = json.loads(stop.stdout)
        self.assertEqual(answer["decision"], "block")
        self.assertIn(os.path.join(copy, "runner"), answer["reason"])


if __name__ == "__main__":
    unittest.main()
