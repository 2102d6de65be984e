"""``drive`` over ``effects.http`` against the loopback helpdesk: killed at each window, a target that is down, secrets kept out.

The contract is ``templates/run-contract.http.example.md`` with the helpdesk's
address and a settle time for its lag; the helpdesk creates an issue on every
POST (no idempotency), answers 429, drops answers after creating and lists a
new issue only after a lag. ``drive`` runs in child processes: killed by
SIGKILL at each effect window (through the core's hooks, or by the test while
the helpdesk holds the answer of an issue it created), and resumed each time
by another process after a supervisor broke the lease. One issue per report.
"""

import json
import os
import signal
import subprocess
import unittest
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

from runner.contract.templates import slug
from runner.contract.text import load_contract
from runner.surfaces.mcp import jsonrpc
from runner.proof.helpdesk import Faults, Helpdesk, HelpdeskServer
from runner.execution.run import Run
from runner.stores.file import RunStore
from tests.support.cli import RunnerCli
from tests.support.fake_http import free_port, wait_until
from tests.support.util import REPO_ROOT, child_env, in_process_cli, python, run, scratch_dir, write_contract

TEMPLATE = os.path.join(REPO_ROOT, "templates", "run-contract.http.example.md")
HOOKS = os.path.join(REPO_ROOT, "hooks")
TOKEN = "hd-7c2e9f1a0b5d4c38"
#: The effect windows ``drive`` is killed at through the core's hooks, in the order one item passes them.
WINDOWS = ("effect:before-started", "effect:after-started", "effect:after-call", "effect:after-ack", "effect:before-verify")
NAMES = ("report 001 (customer's copy)", "Café menu", "Q3 outage - summary", "printer on FIRE", "report 005", "report #6",
         "notes.v2", "último aviso")


def make_workspace(root: str, url: str, reports: int, settle: float, **effects: Any) -> Dict[str, Any]:
    """Reports in ``root/inbox``, the token file, and the template's contract aimed at ``url``; return the contract block."""
    os.makedirs(os.path.join(root, "inbox"))
    for n in range(reports):
        name = NAMES[n] if n < len(NAMES) else f"report {n:03d}"
        with open(os.path.join(root, "inbox", name + ".md"), "w", encoding="utf-8") as handle:
            handle.write(f"# {name.title()}\n\nSeen on floor {n}.\nPlease look.\n")
    with open(os.path.join(root, ".helpdesk-token"), "w") as handle:
        handle.write(TOKEN + "\n")
    block = load_contract(TEMPLATE)
    http = json.loads(json.dumps(block["effects"]["http"]).replace("http://127.0.0.1:8765", url))
    block["effects"] = dict(block["effects"], http=http, settle_seconds=settle, **effects)
    block["retry"] = {"base_seconds": 0.2, "cap_seconds": 0.4}
    contract = write_contract(os.path.join(root, "contract.md"), block)
    result = in_process_cli(["--dir", os.path.join(root, ".run"), "init", "--contract", contract])
    if result.code != 0:
        raise AssertionError(result.err)
    return block


def open_run(root: str) -> Run:
    return Run(RunStore.open(os.path.join(root, ".run")))


def unresolved(root: str) -> List[Tuple[str, str]]:
    effects = open_run(root).state["effects"]
    return sorted((k, e["state"]) for k, e in effects.items() if e["state"] in ("started", "acknowledged", "uncertain"))


def audit(test: unittest.TestCase, root: str, desk: Helpdesk, reports: int) -> None:
    slugs = sorted(slug(name) for name in os.listdir(os.path.join(root, "inbox")))
    test.assertEqual(desk.by_ref(), {s: 1 for s in slugs}, "one issue per report, no duplicate")
    effects = open_run(root).state["effects"]
    test.assertEqual(sorted(effects), [f"{s}:issue" for s in slugs])
    test.assertEqual({e["state"] for e in effects.values()}, {"verified"})
    test.assertEqual(len(slugs), reports)


class KillAtEachWindowTest(unittest.TestCase):
    def test_drive_killed_at_each_window_files_one_issue_per_report(self) -> None:
        reports = 8
        desk = Helpdesk(TOKEN, Faults(lag=0.1, schedule={2: "dropped", 4: "rate-limited", 6: "dropped"}))
        with scratch_dir("runner-http-kills-") as root, HelpdeskServer(desk) as served:
            make_workspace(root, served.url, reports, settle=0.3)
            for turn, window in enumerate(WINDOWS):
                killed = run(python("-m", "tests.support.scripts.http_drive_child", os.path.join(root, ".run"), f"driver-{turn}", window),
                             cwd=root, env=child_env(), timeout=120)
                self.assertEqual(killed.code, -signal.SIGKILL, f"not killed at {window}: {killed.out} {killed.err[-800:]}")
                left = unresolved(root)
                issues = [desk.by_ref().get(key.split(":")[0], 0) for key, _ in left]
                if window == "effect:before-started":
                    self.assertEqual(left, [])
                elif window == "effect:after-started":
                    self.assertEqual(([s for _, s in left], issues), (["started"], [0]), window)
                elif window == "effect:after-call":
                    self.assertEqual([s for _, s in left], ["started"], window)
                elif window == "effect:after-ack":
                    self.assertEqual(([s for _, s in left], issues), (["acknowledged"], [1]), window)
                else:
                    self.assertEqual((len(left), issues), (1, [1]), window)
                open_run(root).break_lease("supervisor", f"driver-{turn} was killed at {window}")
            # After the helpdesk created the issue and before its answer left: the test kills drive there.
            desk.schedule_next("held")
            proc = subprocess.Popen(python("-m", "runner", "--dir", os.path.join(root, ".run"), "drive", "--owner", "driver-held"),
                                    cwd=root, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                self.assertTrue(desk.wait_for("held", timeout=60), "the helpdesk never held an answer")
            finally:
                proc.kill()
                proc.wait(30)
            desk.release()
            left = unresolved(root)
            self.assertEqual(([s for _, s in left], [desk.by_ref().get(k.split(":")[0]) for k, _ in left]), (["started"], [1]))
            open_run(root).break_lease("supervisor", "driver-held was killed")
            final = RunnerCli(self, root=root).child("drive", "--owner", "driver-last", "--json", code=10)
            self.assertEqual(final.json["reason"], "complete")
            audit(self, root, desk, reports)
            self.assertGreaterEqual(desk.count("rate-limited"), 1, desk.log)
            self.assertGreaterEqual(desk.count("dropped"), 1)


class TargetDownTest(unittest.TestCase):
    def test_a_target_that_is_down_is_called_again_once_it_is_up(self) -> None:
        port = free_port()
        desk = Helpdesk(TOKEN, Faults(lag=0.05))
        with scratch_dir("runner-http-down-") as root:
            make_workspace(root, f"http://127.0.0.1:{port}", 3, settle=0.1)
            proc = subprocess.Popen(python("-m", "runner", "--dir", os.path.join(root, ".run"), "drive", "--owner", "d", "--json"),
                                    cwd=root, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                def deferred() -> int:
                    effects = open_run(root).state["effects"]
                    return max((e.get("deferred", 0) for e in effects.values()), default=0)

                self.assertTrue(wait_until(lambda: deferred() >= 1, timeout=60), "drive never met the refused connection")
                with HelpdeskServer(desk, port=port):
                    out, err = proc.communicate(timeout=120)
                    self.assertEqual(proc.returncode, 10, err[-2000:])
                    audit(self, root, desk, 3)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
            effects = open_run(root).state["effects"]
            self.assertEqual([e["attempts"] - e.get("deferred", 0) for e in effects.values()], [1, 1, 1],
                             "a refused connection is counted apart from the attempts")
            self.assertGreaterEqual(max(e.get("deferred", 0) for e in effects.values()), 1)
            self.assertIn("nothing was sent", json.dumps(open_run(root).state["effects"]) + _history(root))


class MissingSecretTest(unittest.TestCase):
    def test_a_token_file_that_is_missing_stops_drive_before_anything_is_begun(self) -> None:
        desk = Helpdesk(TOKEN)
        with scratch_dir("runner-http-nosecret-") as root, HelpdeskServer(desk) as served:
            make_workspace(root, served.url, 2, settle=0.1)
            os.unlink(os.path.join(root, ".helpdesk-token"))
            result = RunnerCli(self, root=root)("drive", "--owner", "d", code=2)
            self.assertIn("header Authorization cannot be made: cannot open .helpdesk-token", result.err)
            self.assertEqual((open_run(root).state["effects"], desk.log), ({}, []))


def _history(root: str) -> str:
    with open(os.path.join(root, ".run", "journal.jsonl"), encoding="utf-8") as handle:
        return handle.read()


class SecretsNeverInTheRunTest(unittest.TestCase):
    """Every byte the runner writes, after a run with a token from a file and one from the environment: neither secret."""

    ENV_SECRET = "envsecret-93b1d7c4e2"

    def test_no_byte_the_runner_writes_holds_a_secret(self) -> None:
        desk = Helpdesk(TOKEN, Faults(lag=0.05, schedule={2: "dropped", 3: "rate-limited"}, retry_after_seconds=0))
        written: List[Tuple[str, bytes]] = []
        env = child_env(DESK_SECRET=self.ENV_SECRET)
        with scratch_dir("runner-http-secrets-") as root, HelpdeskServer(desk) as served:
            block = make_workspace(root, served.url, 4, settle=0.1)
            # Add a second secret header from the environment, on both requests, and start again from that contract.
            for kind in ("invoke", "observe"):
                block["effects"]["http"][kind]["headers"]["X-Desk-Token"] = "{env:DESK_SECRET}"
            write_contract(os.path.join(root, "contract.md"), block)
            os.rename(os.path.join(root, ".run"), os.path.join(root, "old-run"))
            folder = os.path.join(root, ".run")

            cli = RunnerCli(self, root=root)

            def runner(*args: str, expect: Optional[int] = 0, here: bool = False) -> None:
                """The command line in a child (or, for a verb that calls no target, in this process); its output is kept."""
                env_secret = {"DESK_SECRET": self.ENV_SECRET}
                result = cli(*args, code=None) if here else cli.child(*args, env=env_secret, code=None)
                written.append((" ".join(args), result.out.encode() + result.err.encode()))
                if expect is not None:
                    self.assertEqual(result.code, expect, f"{args}: {result.err[-1500:]}")

            runner("init", "--contract", "contract.md")
            killed = run(python("-m", "tests.support.scripts.http_drive_child", folder, "first", "effect:after-call"), cwd=root, env=env, timeout=120)
            self.assertEqual(killed.code, -signal.SIGKILL, killed.err[-800:])
            written.append(("killed drive", killed.out.encode() + killed.err.encode()))
            written.extend(_files(folder, "run folder at the kill"))
            self.assertTrue(os.listdir(os.path.join(folder, "calls")), "the killed call left its record")
            runner("lease", "break", "--by", "supervisor", "--reason", "first was killed")
            runner("drive", "--owner", "second", "--max-actions", "2")
            runner("drive", "--owner", "second", "--json", expect=10)
            for args in (("status", "--json"), ("brief",), ("next", "--json"), ("report", "--json"), ("events", "--json"),
                         ("effect", "list", "--json"), ("effect", "show", f"{slug(NAMES[1])}:issue", "--json"), ("status",)):
                runner(*args, expect=None, here=True)
            runner("report", "--html", os.path.join(root, "out-report.html"), here=True)
            runner("events", "--otlp", os.path.join(root, "out-plain.jsonl"), here=True)
            runner("events", "--otlp", os.path.join(root, "out-content.jsonl"), "--with-content", here=True)
            for name in ("out-report.html", "out-plain.jsonl", "out-content.jsonl"):
                with open(os.path.join(root, name), "rb") as handle:
                    written.append((name, handle.read()))
            written.append(("mcp", _mcp(root, folder, env)))
            written.extend(_hooks(root, env))
            written.extend(_files(folder, "run folder"))
            audit(self, root, desk, 4)
            self.assertTrue(desk.count("created") >= 4 and desk.count("unauthorized") == 0, "the secrets were sent")
        everything = b"".join(data for _, data in written)
        self.assertIn(b"X-Desk-Token", everything, "header names are recorded, so the search reads what records them")
        self.assertIn(b"Authorization", everything)
        for what, data in written:
            for secret in (TOKEN, self.ENV_SECRET):
                self.assertNotIn(secret.encode(), data, f"{secret} written by {what}")


def _files(folder: str, what: str) -> List[Tuple[str, bytes]]:
    out = []
    for base, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(base, name), "rb") as handle:
                out.append((f"{what}: {os.path.relpath(os.path.join(base, name), folder)}", handle.read()))
    return out


def _mcp(root: str, folder: str, env: Dict[str, str]) -> bytes:
    """The MCP server's answers to every reading tool."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": jsonrpc.PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
    key = f"{slug(NAMES[1])}:issue"
    calls = [("next", {}), ("brief", {}), ("status", {}), ("effect_list", {}), ("effect_show", {"key": key}), ("events", {})]
    data = jsonrpc.encode(init) + jsonrpc.encode({"jsonrpc": "2.0", "method": "notifications/initialized"})
    data += jsonrpc.encode({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    for n, (name, arguments) in enumerate(calls, 2):
        data += jsonrpc.encode({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
    done = subprocess.run(python("-m", "runner", "--dir", folder, "mcp", "--read-only"), input=data, capture_output=True, cwd=root,
                          env=env, timeout=120)
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == len(calls) + 2 and all("result" in a for a in answers), done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout + done.stderr


def _hooks(root: str, env: Dict[str, str]) -> List[Tuple[str, bytes]]:
    """What each harness hook prints for the run's project."""
    events = {"session_start": {"hook_event_name": "SessionStart", "source": "resume"},
              "stop": {"hook_event_name": "Stop", "stop_hook_active": False},
              "pre_compact": {"hook_event_name": "PreCompact", "trigger": "auto"},
              "session_end": {"hook_event_name": "SessionEnd", "reason": "other"}}
    out = []
    for name, event in events.items():
        payload = dict(event, session_id="s-1", transcript_path=os.path.join(root, "t.jsonl"), cwd=root)
        done = subprocess.run(python(os.path.join(HOOKS, f"{name}.py")), input=json.dumps(payload).encode(), capture_output=True,
                              cwd=root, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        out.append((f"hook {name}", done.stdout + done.stderr))
    return out


class TryItTest(unittest.TestCase):
    def test_the_http_examples_block_runs_as_written(self) -> None:
        from tests.test_templates import a_free_port, try_it

        port = a_free_port()

        def issues(root: str) -> Dict[str, Any]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/issues", timeout=10) as answer:  # every issue created
                return json.loads(answer.read())

        code, out, report, found = try_it("run-contract.http.example.md", "inbox", ["a.md", "b.md"], issues, port)
        self.assertEqual(code, 10, out)
        self.assertEqual((found["issues"], sorted(found["by_ref"].values())), (2, [1, 1]), out)
        self.assertEqual((report["status"], report["items_verified"], report["possible_duplicates"], report["crashes_drawn"]),
                         ("complete", 2, 0, 0), out)


if __name__ == "__main__":
    unittest.main()
