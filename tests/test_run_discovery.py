"""The run found from the workspace: every verb without ``--dir`` uses the nearest ``.run/``, as git finds ``.git``.

With no ``--dir``, ``--store`` or ``$RUNNER_DIR`` the command line looks for
``.run`` in the current folder and its parents, says on stderr which run it
took, and ``init`` starts one in ``./.run``. The plugin's MCP server finds
the same run when a harness starts it: Claude Code starts it in the project
(and sets ``$CLAUDE_PROJECT_DIR`` and ``$CLAUDE_CODE_SESSION_ID``), Codex in
the plugin's own folder with ``$PWD`` passed on. Each test runs the runner as
a separate process, the way an agent or a harness does.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
from typing import Any, Dict, List, Optional

from tests.support.batch import batch_contract, make_documents, recorder_commands
from tests.support.util import REPO_ROOT, TEMPLATE, child_env, in_process_cli, write_contract

from runner.surfaces.mcp.tools import TOOLS

NAME = "long-running-agent-sessions"
RUNNER = os.path.join(REPO_ROOT, "runner")


def runner(*args: str, cwd: str, env: Optional[Dict[str, str]] = None, program: str = RUNNER) -> subprocess.CompletedProcess:
    """``python3 RUNNER ARGS`` in ``cwd``, with no RUNNER_DIR, RUNNER_STORE or PYTHONPATH, and PWD set as a shell sets it."""
    full = child_env(pythonpath=False, PWD=cwd)
    for name in ("RUNNER_STORE", "RUNNER_TASK", "RUNNER_OWNER", "RUNNER_EPOCH", "CLAUDE_PROJECT_DIR", "CLAUDE_CODE_SESSION_ID"):
        full.pop(name, None)
    full.update(env or {})
    return subprocess.run([sys.executable, "-S", program, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=120)


class McpPipe:
    """An MCP server in a child process, spoken to one request at a time over its stdin and stdout."""

    def __init__(self, argv: List[str], cwd: str, env: Dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.watchdog = threading.Timer(120, self.proc.kill)  # a hung server fails the test instead of hanging it
        self.watchdog.start()
        self.ids = 0
        self.ask("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message: Dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def ask(self, method: str, params: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        self.ids += 1
        self.send({"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params or {}})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the server ended: {self.close()}")
        reply = json.loads(line)
        assert reply.get("id") == self.ids, reply
        return reply

    def tool(self, name: str, arguments: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return self.ask("tools/call", {"name": name, "arguments": arguments or {}})["result"]

    def close(self) -> str:
        """Close stdin (the client went away); the server's stderr."""
        _, err = self.proc.communicate(timeout=60)
        self.watchdog.cancel()
        return err


class DiscoveryCase(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="runner-discovery-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.project = os.path.join(self.tmp, "project")
        os.makedirs(os.path.join(self.project, "src", "deep"))
        self.contract = os.path.join(self.project, "contract.md")
        shutil.copyfile(TEMPLATE, self.contract)
        self.run_dir = os.path.join(self.project, ".run")
        self.assertEqual(in_process_cli(["--dir", self.run_dir, "init", "--contract", self.contract]).code, 0)

    def server(self, cwd: str, *args: str, env: Optional[Dict[str, str]] = None) -> McpPipe:
        full = child_env(pythonpath=False)
        for name in ("RUNNER_STORE", "RUNNER_OWNER", "CLAUDE_PROJECT_DIR", "CLAUDE_CODE_SESSION_ID", "PWD"):
            full.pop(name, None)
        full.update(env or {})
        return McpPipe([sys.executable, RUNNER, "mcp", *args], cwd, full)


class VerbDiscoveryTest(DiscoveryCase):
    def test_init_without_a_location_starts_the_run_in_the_current_folder(self) -> None:
        # Below a project that has a run, init starts a new one here, as 'git init' does.
        nested = os.path.join(self.project, "src")
        init = runner("init", "--contract", self.contract, cwd=nested)
        self.assertEqual(init.returncode, 0, init.stderr)
        self.assertTrue(os.path.isfile(os.path.join(nested, ".run", "run.json")))
        self.assertIn(os.path.join(nested, ".run"), init.stdout)

    def test_every_verb_uses_the_nearest_run_from_a_subfolder_and_names_it_once_on_stderr(self) -> None:
        deep = os.path.join(self.project, "src", "deep")
        status = runner("status", "--json", cwd=deep)
        self.assertEqual(status.returncode, 0, status.stderr)
        self.assertEqual(json.loads(status.stdout)["path"], self.run_dir)  # stdout stays exactly one JSON object
        self.assertEqual(status.stderr.splitlines(), [f"runner: using the run in {self.run_dir}"])
        recover = runner("recover", "--owner", "agent-1", "--json", cwd=deep)
        self.assertEqual(json.loads(recover.stdout)["lease"]["owner"], "agent-1")
        doctor = runner("doctor", cwd=deep)  # a verb that looks the run up more than once still says it once
        self.assertEqual(doctor.returncode, 0, doctor.stderr)
        self.assertEqual(doctor.stderr.splitlines(), [f"runner: using the run in {self.run_dir}"])

    def test_dir_and_runner_dir_come_before_the_search(self) -> None:
        other = os.path.join(self.tmp, "other")
        os.mkdir(other)
        self.assertEqual(in_process_cli(["--dir", os.path.join(other, ".run"), "init", "--contract", self.contract]).code, 0)
        for extra, env in ((["--dir", os.path.join(other, ".run")], None), ([], {"RUNNER_DIR": os.path.join(other, ".run")})):
            status = runner(*extra, "status", "--json", cwd=self.project, env=env)
            self.assertEqual(status.returncode, 0, status.stderr)
            self.assertEqual(json.loads(status.stdout)["path"], os.path.join(other, ".run"))
            self.assertEqual(status.stderr, "")

    def test_a_symlinked_run_is_refused_not_passed_over(self) -> None:
        inner = os.path.join(self.project, "src")
        os.symlink(self.run_dir, os.path.join(inner, ".run"))
        before = _files(self.run_dir)
        for args in (["status"], ["recover", "--owner", "agent-1", "--json"]):
            result = runner(*args, cwd=inner)
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertIn("is a symbolic link; refusing to use it as a run folder", result.stderr.splitlines()[-1])
        self.assertEqual(_files(self.run_dir), before)

    def test_no_run_here_or_above_is_one_line_and_exit_2(self) -> None:
        empty = os.path.join(self.tmp, "empty")
        os.mkdir(empty)
        result = runner("status", "--json", cwd=empty)
        self.assertEqual(result.returncode, 2)
        self.assertEqual(json.loads(result.stdout)["error"], "invalid-input")
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertIn(f"no run: no .run/ in {empty} or above", lines[0])


class McpDiscoveryTest(DiscoveryCase):
    def test_started_by_claude_code_the_server_finds_the_project_run_and_writes_as_the_session(self) -> None:
        # Claude Code starts a plugin's server in the project and names the project and the session in its environment.
        server = self.server(self.project, env={"CLAUDE_PROJECT_DIR": self.project, "CLAUDE_CODE_SESSION_ID": "5f0c7d2e-1111"})
        listed = [t["name"] for t in server.ask("tools/list")["result"]["tools"]]
        self.assertEqual(sorted(listed), sorted(t.name for t in TOOLS if t.authority != "control"))
        recovered = server.tool("recover")
        self.assertFalse(recovered["isError"], recovered)
        self.assertEqual(recovered["structuredContent"]["lease"]["owner"], "claude-5f0c7d2e-1111")
        err = server.close()
        self.assertIn(f"runner: using the run in {self.run_dir}", err)
        status = runner("status", "--json", cwd=self.project)
        self.assertIsNone(json.loads(status.stdout)["lease"]["owner"], "the server released the lease it took")

    def test_a_server_started_in_the_runner_folder_looks_from_pwd(self) -> None:
        # Codex starts a plugin's server in the plugin's folder (here the checkout) with $PWD, the folder Codex was started in.
        server = self.server(REPO_ROOT, "--read-only", env={"PWD": os.path.join(self.project, "src")})
        listed = [t["name"] for t in server.ask("tools/list")["result"]["tools"]]
        self.assertEqual(sorted(listed), sorted(t.name for t in TOOLS if t.authority == "view"))
        answer = server.tool("next")
        self.assertFalse(answer["isError"], answer)
        self.assertEqual(answer["structuredContent"]["decision"], "act")
        self.assertIn(f"runner: using the run in {self.run_dir}", server.close())

    def test_with_no_run_yet_the_server_starts_and_answers_no_run_until_init(self) -> None:
        fresh = os.path.join(self.tmp, "fresh")
        os.mkdir(fresh)
        server = self.server(fresh, "--read-only")
        before = server.tool("next")
        self.assertTrue(before["isError"])
        self.assertEqual(before["structuredContent"]["reason"], "invalid-input")
        self.assertIn(f"no run in {os.path.join(fresh, '.run')}", before["structuredContent"]["message"])
        self.assertEqual(runner("init", "--contract", self.contract, cwd=fresh).returncode, 0)
        after = server.tool("next")
        self.assertFalse(after["isError"], after)
        self.assertIn("once 'init' starts a run there", server.close())

    def test_the_plugin_manifests_start_the_server_this_way(self) -> None:
        with open(os.path.join(REPO_ROOT, ".mcp.json"), encoding="utf-8") as handle:
            claude = json.load(handle)["mcpServers"][NAME]
        self.assertEqual([claude["command"]] + claude["args"], ["python3", "${CLAUDE_PLUGIN_ROOT}/runner", "mcp"])
        self.assertNotIn("cwd", claude)  # Claude Code starts it in the project
        with open(os.path.join(REPO_ROOT, ".codex-plugin", "plugin.json"), encoding="utf-8") as handle:
            codex_file = json.load(handle)["mcpServers"]
        with open(os.path.join(REPO_ROOT, codex_file), encoding="utf-8") as handle:
            codex = json.load(handle)["mcpServers"][NAME]
        # Codex does not expand ${CLAUDE_PLUGIN_ROOT} in a server's arguments; a relative cwd is the plugin's folder.
        self.assertEqual([codex["command"]] + codex["args"], ["python3", "runner", "mcp", "--read-only"])
        self.assertEqual(codex["cwd"], ".")
        self.assertIn("PWD", codex["env_vars"])
        self.assertTrue(os.path.isfile(os.path.join(REPO_ROOT, codex["cwd"], codex["args"][0], "__main__.py")))


class CopiedSkillTest(unittest.TestCase):
    def test_drive_runs_from_the_workspace_with_no_cd_no_pythonpath_and_no_dir(self) -> None:
        tmp = tempfile.mkdtemp(prefix="runner-discovery-copy-")
        self.addCleanup(shutil.rmtree, tmp, True)
        project = os.path.join(tmp, "workspace")
        skill = os.path.join(".claude", "skills", NAME)
        shutil.copytree(REPO_ROOT, os.path.join(project, skill), ignore=shutil.ignore_patterns(".git", "__pycache__", "tests", "bench", "docs"))
        make_documents(project, 3)
        os.mkdir(os.path.join(project, "out"))
        write_contract(os.path.join(project, "contract.md"), batch_contract(recorder_commands(project)))
        program = os.path.join(skill, "runner")  # relative, as an agent in the workspace types it
        init = runner("init", "--contract", "contract.md", cwd=project, program=program)
        self.assertEqual(init.returncode, 0, init.stderr)
        drive = runner("drive", "--owner", "x", cwd=project, program=program)
        self.assertEqual(drive.returncode, 10, drive.stderr)  # complete
        self.assertEqual(sorted(os.listdir(os.path.join(project, "out"))), [f"doc-{n:05d}:ticket.args" for n in range(3)])
        self.assertIn(f"runner: using the run in {os.path.join(project, '.run')}", drive.stderr)


def _files(folder: str) -> Dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                out[name] = handle.read()
    return out


if __name__ == "__main__":
    unittest.main()
