"""Install the checkout into the real Claude Code and Codex CLIs and check what they report.

    python3 tools/harness_check.py --clients DIR [--checkout PATH]

``DIR`` holds what ``.ci/harness.sh`` installed: ``npm/node_modules/.bin``
(``claude`` from ``@anthropic-ai/claude-code``, ``codex`` from
``@openai/codex``) and ``venv/bin/agentskills`` (from ``skills-ref``). In a
throwaway ``HOME`` the check runs

* ``claude plugin validate --strict`` on the marketplace and the plugin,
  ``claude plugin marketplace add CHECKOUT``, ``claude plugin install
  long-running-agent-sessions@long-running-agent-sessions``, ``claude plugin
  details``, which must list the skill (at most 5,000 tokens when loaded), the
  four hooks and the MCP server, and
  ``claude mcp list`` in a project without a run, which must show that server
  connected;
* ``codex plugin marketplace add CHECKOUT``, ``codex plugin add ...`` and
  ``codex plugin list --json``, which must show the plugin installed and
  enabled, with ``SKILL.md``, the Codex hooks file and every hook script it
  names in the installed plugin root, ``codex mcp list --json``, which must
  show the plugin's MCP server running the installed runner, and ``codex
  debug prompt-input``, whose list of a session's skills must hold the
  plugin's skill;
* ``agentskills validate`` on the skill folder (under its own name, as the
  specification requires);

and prints one line, ``harness-check: claude=V codex=V skills=N skill_tokens=T hooks=E,...
validate=ok``, exiting 0; any failure prints the reason and exits 1. No
client is given a model or an account: these commands work offline.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

NAME = "long-running-agent-sessions"
PLUGIN = f"{NAME}@{NAME}"
HOOK_EVENTS = ("SessionStart", "Stop", "SessionEnd", "PreCompact")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# What the skill may cost each time it fires: its body goes into the model's context whole.
MAX_SKILL_TOKENS = 5000


class CheckFailed(Exception):
    pass


def skill_tokens(details: str) -> int:
    """The on-invoke token estimate ``claude plugin details`` prints for the skill (``~4.5k`` reads 4500).

    :raises CheckFailed: the per-component table has no row for the skill.
    """
    row = re.search(rf"^\s*{re.escape(NAME)}\s+~?([\d.,]+)(k?)\s+~?([\d.,]+)(k?)\s*$", details, re.M)
    if not row:
        raise CheckFailed(f"claude plugin details gives no token estimate for the skill {NAME}: {details!r}")
    number, thousands = float(row.group(3).replace(",", "")), row.group(4) == "k"
    return int(round(number * 1000)) if thousands else int(number)


class Clients:
    """The installed command-line clients and a throwaway home to run them in."""

    def __init__(self, folder: str, home: str) -> None:
        self.folder = folder
        self.bin = os.path.join(folder, "npm", "node_modules", ".bin")
        self.agentskills = os.path.join(folder, "venv", "bin", "agentskills")
        self.home = home
        for tool in (os.path.join(self.bin, "claude"), os.path.join(self.bin, "codex"), self.agentskills):
            if not os.access(tool, os.X_OK):
                raise CheckFailed(f"{tool} is not installed (run .ci/harness.sh)")

    def run(self, argv: List[str], timeout: float = 180, cwd: Optional[str] = None) -> str:
        env = {"HOME": self.home, "PATH": self.bin + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
               "LANG": "C.UTF-8", "CI": "true", "DISABLE_AUTOUPDATER": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "NO_COLOR": "1"}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd or self.home, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
            raise CheckFailed(f"{' '.join(argv[:4])} exited {done.returncode}: {' | '.join(tail)}")
        return done.stdout


def _version(text: str) -> str:
    match = re.search(r"\d+\.\d+\.\d+[\w.-]*", text)
    if not match:
        raise CheckFailed(f"no version in {text.strip()!r}")
    return match.group(0)


def _show(transcript: Optional[List[str]], argv: List[str], output: str) -> None:
    """Keep a command and what it printed, for the log (bounded: the first 40 lines)."""
    if transcript is not None:
        lines = output.rstrip("\n").splitlines()
        transcript.append("$ " + " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv)))
        transcript.extend("  " + line for line in lines[:40])
        if len(lines) > 40:
            transcript.append(f"  ... {len(lines) - 40} more lines")


def check_claude(clients: Clients, checkout: str, transcript: Optional[List[str]] = None) -> Dict[str, object]:
    claude = os.path.join(clients.bin, "claude")
    version = _version(clients.run([claude, "--version"]))
    clients.run([claude, "plugin", "validate", "--strict", checkout])
    clients.run([claude, "plugin", "validate", "--strict", os.path.join(checkout, ".claude-plugin", "plugin.json")])
    clients.run([claude, "plugin", "marketplace", "add", checkout])
    clients.run([claude, "plugin", "install", PLUGIN])
    details = clients.run([claude, "plugin", "details", PLUGIN])
    _show(transcript, [claude, "plugin", "details", PLUGIN], details)
    skills = re.search(r"^\s*Skills \((\d+)\)\s+(.*)$", details, re.M)
    hooks = re.search(r"^\s*Hooks \((\d+)\)\s+([A-Za-z, ]+?)(?:\s+\(|$)", details, re.M)
    servers = re.search(r"^\s*MCP servers \((\d+)\)\s*(.*)$", details, re.M)
    if not skills or NAME not in skills.group(2).split(", "):
        raise CheckFailed(f"claude plugin details lists no skill {NAME}: {details!r}")
    events = [e.strip() for e in hooks.group(2).split(",")] if hooks else []
    if sorted(events) != sorted(HOOK_EVENTS):
        raise CheckFailed(f"claude plugin details lists hooks {events}, not {list(HOOK_EVENTS)}")
    if not servers or NAME not in servers.group(2):
        raise CheckFailed(f"claude plugin details lists no MCP server {NAME}: {details!r}")
    loaded = skill_tokens(details)
    if loaded > MAX_SKILL_TOKENS:
        raise CheckFailed(f"claude plugin details estimates the skill at {loaded} tokens when loaded, over "
                          f"{MAX_SKILL_TOKENS}")
    # Claude Code starts the plugin's MCP server to report its health: it must start in a project that has no run yet.
    project = os.path.join(clients.home, "mcp-project")
    os.makedirs(project, exist_ok=True)
    health = clients.run([claude, "mcp", "list"], cwd=project)
    _show(transcript, [claude, "mcp", "list"], health)
    if not re.search(rf"^plugin:{re.escape(NAME)}:{re.escape(NAME)}: .*Connected", health, re.M):
        raise CheckFailed(f"claude mcp list does not show the plugin's MCP server connected: {health.strip()!r}")
    return {"version": version, "skills": int(skills.group(1)), "hooks": events, "skill_tokens": loaded}


def check_codex(clients: Clients, checkout: str, transcript: Optional[List[str]] = None) -> Dict[str, object]:
    codex = os.path.join(clients.bin, "codex")
    version = _version(clients.run([codex, "--version"]))
    clients.run([codex, "plugin", "marketplace", "add", checkout])
    added = clients.run([codex, "plugin", "add", PLUGIN])
    root = re.search(r"Installed plugin root: (.+)", added)
    if not root:
        raise CheckFailed(f"codex plugin add named no installed plugin root: {added!r}")
    installed = root.group(1).strip()
    listed = json.loads(clients.run([codex, "plugin", "list", "--json"]))
    entry = [p for p in listed.get("installed", []) if p.get("pluginId") == PLUGIN]
    _show(transcript, [codex, "plugin", "list", "--json"],
          json.dumps(entry, indent=1, sort_keys=True) + f"\n(installed plugin root: {installed})")
    if not entry or not entry[0].get("installed") or not entry[0].get("enabled"):
        raise CheckFailed(f"codex plugin list does not show {PLUGIN} installed and enabled: {listed!r}")
    with open(os.path.join(installed, ".codex-plugin", "plugin.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    hooks_file = os.path.join(installed, manifest["hooks"])
    with open(hooks_file, encoding="utf-8") as handle:
        wired = json.load(handle)["hooks"]
    if sorted(wired) != sorted(HOOK_EVENTS):
        raise CheckFailed(f"the installed Codex hooks wire {sorted(wired)}, not {list(HOOK_EVENTS)}")
    for groups in wired.values():
        for hook in (h for g in groups for h in g["hooks"]):
            script = shlex.split(hook["command"])[1].replace("${CLAUDE_PLUGIN_ROOT}", installed)
            if not os.path.isfile(script):
                raise CheckFailed(f"the installed plugin root lacks the hook script {script}")
    if not os.path.isfile(os.path.join(installed, "SKILL.md")):
        raise CheckFailed(f"the installed plugin root {installed} has no SKILL.md")
    _check_codex_mcp(clients, codex, installed, transcript)
    # The skills a Codex session would see, rendered without a model or an account.
    prompt = clients.run([codex, "debug", "prompt-input", "hello"])
    # Codex's default folder
    listed_at = os.path.normpath(os.path.join(manifest.get("skills", "./skills/"), NAME, "SKILL.md"))
    if f"{NAME}:{NAME}:" not in prompt or listed_at not in prompt:
        raise CheckFailed(f"codex debug prompt-input does not list the skill {NAME}:{NAME} at {listed_at}")
    copied = _copied_skill_entries(clients, codex, checkout)
    if copied != 1:
        raise CheckFailed(f"a copy in .agents/skills/ shows Codex the skill {copied} times, not once")
    return {"version": version, "root": installed, "hooks": sorted(wired)}


def _check_codex_mcp(clients: Clients, codex: str, installed: str, transcript: Optional[List[str]]) -> None:
    """``codex mcp list --json`` shows the plugin's server enabled, running the installed runner from the plugin's
    folder.

    Codex expands no ``${CLAUDE_PLUGIN_ROOT}`` in a server's arguments; it
    resolves a relative ``cwd`` against the installed plugin root.
    """
    servers = json.loads(clients.run([codex, "mcp", "list", "--json"]))
    entry = [s for s in servers if s.get("name") == NAME]
    _show(transcript, [codex, "mcp", "list", "--json"], json.dumps(entry, indent=1, sort_keys=True))
    if not entry or not entry[0].get("enabled"):
        raise CheckFailed(f"codex mcp list does not show the MCP server {NAME} enabled: {servers!r}")
    transport = entry[0].get("transport") or {}
    args = transport.get("args") or []
    cwd = os.path.normpath(transport.get("cwd") or "")
    if transport.get("command") != "python3" or not args or cwd != os.path.normpath(installed):
        raise CheckFailed(f"the Codex MCP server does not run python3 in the installed plugin root {installed}: "
                          f"{transport!r}")
    if not os.path.isfile(os.path.join(cwd, args[0], "__main__.py")):
        raise CheckFailed(f"the Codex MCP server's program {args[0]!r} is not a runner folder in {cwd}")


def _copied_skill_entries(clients: Clients, codex: str, checkout: str) -> int:
    """How often a Codex session in a project lists the skill when the folder is copied to ``.agents/skills/``."""
    home = os.path.join(clients.home, "copy-home")  # no plugin installed here, only the copy
    os.mkdir(home)
    clients = Clients(clients.folder, home)
    project = os.path.join(home, "project")
    shutil.copytree(checkout, os.path.join(project, ".agents", "skills", NAME),
                    ignore=shutil.ignore_patterns(".git", "tests", "bench"))
    os.mkdir(os.path.join(project, ".git"))  # the project root Codex searches up to
    prompt = clients.run([codex, "debug", "prompt-input", "hello"], cwd=project)
    return len(re.findall(rf"- (?:{NAME}:)?{NAME}: ", prompt))


def check_skill(clients: Clients, checkout: str, scratch: str, transcript: Optional[List[str]] = None) -> str:
    """``agentskills validate`` on the skill under its own folder name (a link to the checkout)."""
    named = os.path.join(scratch, NAME)
    os.symlink(os.path.abspath(checkout), named)
    _show(transcript, [clients.agentskills, "validate", NAME],
          clients.run([clients.agentskills, "validate", named]) or "(exit 0)")
    return "ok"


def harness_check(clients_dir: str, checkout: str = ROOT, transcript: Optional[List[str]] = None) -> str:
    """Run every check and return the one summary line; raises :class:`CheckFailed`.

    :param transcript: receives the commands whose output proves the install, and that output.
    """
    scratch = tempfile.mkdtemp(prefix="harness-check-")
    try:
        home = os.path.join(scratch, "home")
        os.mkdir(home)
        clients = Clients(clients_dir, home)
        claude = check_claude(clients, checkout, transcript)
        codex = check_codex(clients, checkout, transcript)
        validate = check_skill(clients, checkout, scratch, transcript)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return (f"harness-check: claude={claude['version']} codex={codex['version']} skills={claude['skills']} "
            f"skill_tokens={claude['skill_tokens']} "
            f"hooks={','.join(claude['hooks'])} validate={validate}")  # type: ignore[arg-type]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", required=True, help="the folder .ci/harness.sh installed the clients into")
    parser.add_argument("--checkout", default=ROOT, help="the plugin's folder (default: this checkout)")
    args = parser.parse_args(argv)
    transcript: List[str] = []
    try:
        line = harness_check(args.clients, args.checkout, transcript)
        print("\n".join(transcript))
        print(line)
    except (CheckFailed, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        print(f"harness-check failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
