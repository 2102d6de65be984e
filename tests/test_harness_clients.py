"""The plugin installed into the real Claude Code and Codex CLIs (``tools/harness_check.py``).

A real-system test (``tests/support/real.py``): it runs when ``RUNNER_REAL_TESTS``
asks for it and then fails, saying why, when the clients cannot be had. They
come from ``$RUNNER_TEST_HARNESS_CLIENTS`` (``.ci/harness.sh`` installs them
once per CI run); without it, from ``harness-clients`` in the real tests'
cache, which ``.ci/harness.sh --install`` fills on first use (with ``npm``).
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from tests.support import real as _real
from tests.support.util import REPO_ROOT

from tools.harness_check import CheckFailed, Clients, check_claude, check_codex, harness_check

LINE = re.compile(r"^harness-check: claude=\d+\.\d+\.\d+\S* codex=\d+\.\d+\.\d+\S* skills=[1-9]\d* skill_tokens=\d+ "
                  r"hooks=SessionStart,Stop,SessionEnd,PreCompact validate=ok$")


def _clients() -> str:
    given = os.environ.get("RUNNER_TEST_HARNESS_CLIENTS")
    if given:
        return given
    if os.environ.get("RUNNER_TEST_HARNESS_SKIP"):
        _real.missing(f"the real clients could not be installed: {os.environ['RUNNER_TEST_HARNESS_SKIP']}")
    cache = os.path.join(_real.cache_root(), "harness-clients")
    if not os.path.isfile(os.path.join(cache, "complete")):
        if shutil.which("npm") is None and shutil.which("apt-get") is None:
            _real.missing("no npm to install @anthropic-ai/claude-code and @openai/codex with, and no apt-get to install npm")
        install = ["bash", os.path.join(REPO_ROOT, ".ci", "harness.sh"), "--install", cache]
        done = subprocess.run(install, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            _real.missing(f"the real clients could not be installed: {done.stderr.strip()[-300:]}")
    return cache


@_real.needs("the Claude Code and Codex CLIs")
class RealClientTests(unittest.TestCase):
    def test_claude_and_codex_install_the_plugin_and_the_skill_validates(self) -> None:
        clients = _clients()
        line = harness_check(clients, REPO_ROOT)
        self.assertRegex(line, LINE)

    def test_a_broken_plugin_fails_the_check(self) -> None:
        clients = _clients()
        broken = os.path.join(self._scratch(), "long-running-agent-sessions")
        shutil.copytree(REPO_ROOT, broken, ignore=shutil.ignore_patterns(".git", "__pycache__", "tests", "bench"))
        hooks_file = os.path.join(broken, "hooks", "claude-code.json")
        with open(hooks_file, encoding="utf-8") as handle:
            wired = json.load(handle)
        del wired["hooks"]["PreCompact"]
        with open(hooks_file, "w", encoding="utf-8") as handle:
            json.dump(wired, handle)
        manifest = os.path.join(broken, ".codex-plugin", "plugin.json")
        with open(manifest, encoding="utf-8") as handle:
            codex = json.load(handle)
        del codex["skills"]
        with open(manifest, "w", encoding="utf-8") as handle:
            json.dump(codex, handle)
        home = os.path.join(self._scratch(), "home")
        os.mkdir(home)
        with self.assertRaisesRegex(CheckFailed, "PreCompact"):
            check_claude(Clients(clients, home), broken)
        with self.assertRaisesRegex(CheckFailed, "does not list the skill"):
            check_codex(Clients(clients, home), broken)

    def test_a_visible_codex_entry_would_list_a_copied_skill_twice(self) -> None:
        clients = _clients()
        visible = os.path.join(self._scratch(), "long-running-agent-sessions")
        shutil.copytree(REPO_ROOT, visible, ignore=shutil.ignore_patterns(".git", "__pycache__", "tests", "bench"))
        os.rename(os.path.join(visible, ".codex-skills"), os.path.join(visible, "codex-skills"))
        manifest = os.path.join(visible, ".codex-plugin", "plugin.json")
        with open(manifest, encoding="utf-8") as handle:
            codex = json.load(handle)
        codex["skills"] = "./codex-skills/"
        with open(manifest, "w", encoding="utf-8") as handle:
            json.dump(codex, handle)
        home = os.path.join(self._scratch(), "home")
        os.mkdir(home)
        with self.assertRaisesRegex(CheckFailed, "shows Codex the skill 2 times"):
            check_codex(Clients(clients, home), visible)

    def _scratch(self) -> str:
        folder = tempfile.mkdtemp(prefix="harness-broken-")
        self.addCleanup(shutil.rmtree, folder, True)
        return folder


if __name__ == "__main__":
    unittest.main()
