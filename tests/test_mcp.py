"""The MCP server (``python3 -m runner mcp``): framing, the tool table, authority, and the official client.

The framing and tool tests drive :class:`runner.surfaces.mcp.server.Session` in this
process over in-memory streams, and once over a real pipe. The last test
installs the official ``mcp`` package from PyPI into a throwaway virtual
environment (cached, shared by every Python that runs the suite) and lets it
drive a whole run, with a SIGKILL of the server inside an effect; it is skipped,
with the reason, only when the package cannot be installed.
"""

import copy
import io
import json
import os
import subprocess
import sys
import time
import unittest
from typing import Any, Dict, List, Optional

from tests.support import real as _real, util as _util

from runner.contract.text import load_contract
from runner.base.errors import InvalidInput
from runner.surfaces.mcp import jsonrpc
from runner.surfaces.mcp.server import Session
from runner.surfaces.mcp.tools import TOOLS, _mismatch, text_form, tool_listing
from runner.execution.run import Run
from runner.stores.file import RunStore

WRITER_TOOLS = [
    "recover",
    "next",
    "brief",
    "status",
    "report",
    "step_start",
    "step_done",
    "step_fail",
    "effect_begin",
    "effect_ack",
    "effect_verify",
    "effect_absent",
    "effect_uncertain",
    "effect_skip",
    "skip",
    "effect_run",
    "effect_show",
    "items",
    "effect_list",
    "approval_request",
    "approval_list",
    "lease_show",
    "lease_renew",
    "lease_release",
    "cost",
    "migrate",
    "events",
]
VIEW_TOOLS = ["next", "brief", "status", "report", "effect_show", "items", "effect_list", "approval_list", "lease_show",
              "events"]
CONTROL_TOOLS = ["approval_grant", "approval_deny", "effect_reopen", "cancel", "lease_break"]
INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": jsonrpc.PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}},
}
PAYLOAD = {"slug": "weekly-post-2026-48"}


class Clock:
    """A test clock: starts at a fixed time and moves only when told."""

    def __init__(self) -> None:
        self.now = _util.CLOCK_START

    def __call__(self) -> float:
        return self.now


def new_run(folder: str, clock: Optional[Clock] = None) -> str:
    path = os.path.join(folder, "run")
    plan = copy.deepcopy(load_contract(_util.TEMPLATE))
    RunStore.create(path, plan["task_id"], plan, clock=clock or time.time)  # a real clock for runs served by another process
    return path


def request(ident: Any, method: str, params: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "method": method, "params": params or {}}


def call(ident: Any, name: str, arguments: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return request(ident, "tools/call", {"name": name, "arguments": arguments or {}})


def converse(session: Session, *messages: Any) -> List[Dict[str, Any]]:
    """Feed ``messages`` (dicts, or raw bytes lines) to the session until end of input; its replies in order."""
    data = b"".join(m if isinstance(m, bytes) else jsonrpc.encode(m) for m in messages)
    out = io.BytesIO()
    session.serve(io.BytesIO(data), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def structured(reply: Dict[str, Any]) -> Dict[str, Any]:
    return reply["result"]["structuredContent"]


def journal_bytes(path: str) -> bytes:
    with open(os.path.join(path, "journal.jsonl"), "rb") as handle:
        return handle.read()


class McpFramingTest(unittest.TestCase):
    """JSON-RPC 2.0 over newline-delimited stdio: every malformed input answered, the session going on."""

    def setUp(self) -> None:
        self.tmp = _util.scratch_dir()
        self.path = new_run(self.tmp.name)
        self.url = "file:" + self.path

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def session(self, **options: Any) -> Session:
        return Session(self.url, owner="agent-1", log=lambda line: None, **options)

    def test_malformed_json_is_a_parse_error_and_the_session_goes_on(self) -> None:
        replies = converse(
            self.session(),
            INIT,
            b"not json\n",
            b'{"jsonrpc": "2.0", "id": 1,\n',
            b"\xff\xfe\n",
            b'{"jsonrpc":"2.0","id":2,"id":3,"method":"ping"}\n',
            b"\n",
            request(9, "ping"),
        )
        self.assertEqual([r.get("id") for r in replies], [0, None, None, None, None, 9])
        self.assertEqual([r["error"]["code"] for r in replies[1:5]], [jsonrpc.PARSE_ERROR] * 4)
        self.assertEqual(replies[5]["result"], {})

    def test_invalid_messages_are_invalid_requests(self) -> None:
        replies = converse(
            self.session(),
            INIT,
            [request(1, "ping")],
            b"7\n",
            {"id": 2, "method": "ping"},
            {"jsonrpc": "2.0", "id": True, "method": "ping"},
            {"jsonrpc": "2.0", "id": 3},
            {"jsonrpc": "2.0", "id": 4, "method": "ping", "params": [1]},
        )
        self.assertEqual(
            [(r.get("id"), r["error"]["code"]) for r in replies[1:]],
            [
                (None, jsonrpc.INVALID_REQUEST),
                (None, jsonrpc.INVALID_REQUEST),
                (2, jsonrpc.INVALID_REQUEST),
                (None, jsonrpc.INVALID_REQUEST),
                (3, jsonrpc.INVALID_REQUEST),
                (4, jsonrpc.INVALID_PARAMS),
            ],
        )
        self.assertIn("batch", replies[1]["error"]["message"])

    def test_unknown_methods_and_tools(self) -> None:
        replies = converse(
            self.session(),
            INIT,
            request(1, "prompts/list"),
            {"jsonrpc": "2.0", "method": "no/such/notification"},
            call(2, "no_such_tool"),
            request(3, "resources/read", {"uri": "runner://nothing"}),
            request(4, "ping"),
        )
        self.assertEqual(
            [(r["id"], r.get("error", {}).get("code")) for r in replies[1:]],
            [(1, jsonrpc.METHOD_NOT_FOUND), (2, jsonrpc.INVALID_PARAMS), (3, jsonrpc.RESOURCE_NOT_FOUND), (4, None)],
        )

    def test_oversized_message_is_refused_whole_and_the_next_one_read(self) -> None:
        big = jsonrpc.encode(call(1, "step_done", {"step": "draft", "evidence": {"x": "y" * 5000}}))
        replies = converse(self.session(max_message_bytes=1000), INIT, big, request(2, "ping"))
        self.assertEqual(replies[1]["error"]["code"], jsonrpc.INVALID_REQUEST)
        self.assertIn("larger than 1000 bytes", replies[1]["error"]["message"])
        self.assertEqual(replies[2], {"jsonrpc": "2.0", "id": 2, "result": {}})

    def test_notifications_are_never_answered_nor_acted_on(self) -> None:
        before = journal_bytes(self.path)
        replies = converse(
            self.session(),
            INIT,
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
            {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "recover", "arguments": {}}},
            request(5, "ping"),
        )
        self.assertEqual([r["id"] for r in replies], [0, 5])
        self.assertEqual(journal_bytes(self.path), before)

    def test_requests_before_initialize_are_refused(self) -> None:
        replies = converse(self.session(), request(1, "tools/list"), request(2, "ping"), INIT, request(3, "tools/list"), dict(INIT, id=4))
        self.assertEqual(replies[0]["error"]["code"], jsonrpc.INVALID_REQUEST)
        self.assertEqual(replies[1]["result"], {})
        self.assertEqual([t["name"] for t in replies[3]["result"]["tools"]], WRITER_TOOLS)
        self.assertEqual(replies[4]["error"]["code"], jsonrpc.INVALID_REQUEST)

    def test_protocol_versions(self) -> None:
        older = dict(INIT, params=dict(INIT["params"], protocolVersion="2024-11-05"))
        replies = converse(self.session(), older)
        self.assertEqual(replies[0]["result"]["protocolVersion"], jsonrpc.PROTOCOL_VERSION)  # the lifecycle's answer: the one it speaks
        missing = dict(INIT, params={"capabilities": {}})
        self.assertEqual(converse(self.session(), missing)[0]["error"]["code"], jsonrpc.INVALID_PARAMS)
        modern = {"_meta": {jsonrpc.PROTOCOL_VERSION_META_KEY: "2026-07-28"}}
        replies = converse(
            self.session(), request(1, "server/discover", modern), INIT, request(2, "tools/list", modern), request(3, "server/discover")
        )
        for reply in (replies[0], replies[2]):
            self.assertEqual(reply["error"]["code"], jsonrpc.UNSUPPORTED_PROTOCOL_VERSION)
            self.assertEqual(reply["error"]["data"], {"supported": [jsonrpc.PROTOCOL_VERSION], "requested": "2026-07-28"})
        self.assertEqual(replies[3]["error"]["code"], jsonrpc.METHOD_NOT_FOUND)

    def test_pipelined_requests_over_a_real_pipe(self) -> None:
        """Many requests written at once, before any answer is read: each answered once, in order, with its id."""
        messages = [INIT, {"jsonrpc": "2.0", "method": "notifications/initialized"}, call("r", "recover")]
        idents: List[Any] = ["r"]
        for n in range(40):
            ident = n if n % 2 else f"s-{n}"
            messages.append(call(ident, "next" if n % 3 else "status"))
            idents.append(ident)
        messages.append(b"x" * (jsonrpc.MAX_MESSAGE_BYTES + 10) + b"\n")
        messages.append(call("last", "step_start", {"step": "draft"}))
        idents += [None, "last"]
        data = b"".join(m if isinstance(m, bytes) else jsonrpc.encode(m) for m in messages)
        proc = subprocess.run(
            _util.python("-m", "runner", "--dir", self.path, "mcp", "--owner", "agent-1"),
            input=data,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_util.child_env(),
            cwd=_util.REPO_ROOT,
            timeout=120,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        replies = [json.loads(line) for line in proc.stdout.splitlines()]
        self.assertEqual([r["id"] for r in replies], [0] + idents)
        self.assertEqual(replies[-2]["error"]["code"], jsonrpc.INVALID_REQUEST)
        self.assertFalse(replies[-1]["result"]["isError"], replies[-1])
        lease = RunStore.open(self.path).state["lease"]
        self.assertIsNone(lease["owner"], "the lease the server took is released when the client closes stdin")


    def test_servers_of_several_owners_at_once_one_holds_the_lease(self) -> None:
        """Four server processes recover the same run at the same moment: one acts, the others are told already-running."""
        data = jsonrpc.encode(INIT) + jsonrpc.encode(call(1, "recover")) + jsonrpc.encode(call(2, "step_start", {"step": "draft"}))
        procs = [
            subprocess.Popen(_util.python("-m", "runner", "--dir", self.path, "mcp", "--owner", f"agent-{n}"), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_util.child_env(), cwd=_util.REPO_ROOT)
            for n in range(4)
        ]
        for proc in procs:  # every request is written before any answer is read
            proc.stdin.write(data)  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
        # Every server keeps its connection (and a winner its lease) until all have answered.
        replies = [[json.loads(proc.stdout.readline()) for _ in range(3)] for proc in procs]  # type: ignore[union-attr]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            self.assertEqual(proc.returncode, 0, err)
        decisions = sorted(structured(r[1])["reason"] or "act" for r in replies)
        self.assertEqual(decisions, ["act", "already-running", "already-running", "already-running"])
        started = sorted(structured(r[2])["reason"] or "ok" for r in replies)
        self.assertEqual(started, ["fenced", "fenced", "fenced", "ok"])
        state = RunStore.open(self.path).state
        self.assertEqual(state["steps"]["draft"]["attempts"], 1)


class McpToolsTest(unittest.TestCase):
    """The tool table: schemas, annotations, authority, refusals as tool errors, the lease, damage."""

    def setUp(self) -> None:
        self.tmp = _util.scratch_dir()
        self.clock = Clock()
        self.path = new_run(self.tmp.name, self.clock)
        self.url = "file:" + self.path

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def session(self, **options: Any) -> Session:
        options.setdefault("owner", "agent-1")
        return Session(self.url, clock=self.clock, log=lambda line: None, **options)

    def open(self, session: Session) -> Session:
        self.assertIn("result", session.handle(jsonrpc.classify(INIT)))
        return session

    def tool(self, session: Session, name: str, arguments: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        reply = session.handle(jsonrpc.classify(call(1, name, arguments)))
        result = reply["result"]  # type: ignore[index]
        # The text block is the quoted text form of the structured content, not its JSON
        # (see runner.surfaces.mcp.tools.text_form).
        self.assertEqual(result["content"][0]["text"], text_form(name, result["structuredContent"]))
        out = result["structuredContent"]
        self.assertEqual(result["isError"], not out["ok"])
        self.check_output(name, out)
        return out

    def check_output(self, name: str, out: Dict[str, Any]) -> None:
        schema = tool_listing(next(t for t in TOOLS if t.name == name))["outputSchema"]
        for key in schema["required"]:
            self.assertIn(key, out)
        for key, value in out.items():
            if key in schema["properties"]:
                self.assertIsNone(_mismatch(schema["properties"][key], value), f"{name}.{key} = {value!r}")

    def test_tool_table_and_modes(self) -> None:
        self.assertEqual(list(self.session().tools), WRITER_TOOLS)
        self.assertEqual(list(self.session(read_only=True, owner=None).tools), VIEW_TOOLS)
        self.assertEqual(list(self.session(allow_control=True).tools), WRITER_TOOLS + CONTROL_TOOLS)
        with self.assertRaises(InvalidInput):
            self.session(read_only=True, allow_control=True)
        with self.assertRaises(InvalidInput):
            self.session(owner=None)
        destructive = {t.name for t in TOOLS if tool_listing(t)["annotations"]["destructiveHint"]}
        self.assertEqual(destructive, {"step_fail", "effect_skip", "skip", "approval_deny", "cancel", "lease_break"})
        for tool in TOOLS:
            listing = tool_listing(tool)
            self.assertEqual(listing["annotations"]["readOnlyHint"], tool.name in VIEW_TOOLS, tool.name)
            self.assertEqual(listing["inputSchema"]["type"], "object")
            self.assertFalse(listing["inputSchema"]["additionalProperties"])
            self.assertEqual(listing["outputSchema"]["required"], ["ok", "reason", "exit_code"])

    def test_refusals_are_tool_errors_with_the_reason(self) -> None:
        session = self.open(self.session())
        refused = self.tool(session, "step_start", {"step": "draft"})
        self.assertEqual((refused["reason"], refused["exit_code"]), ("fenced", 9))
        told = self.tool(session, "next")
        self.assertEqual((told["ok"], told["reason"]), (True, "fenced"))
        self.assertIn("call recover", told["detail"])
        self.assertEqual(self.tool(session, "recover")["action"]["kind"], "start-step")
        for step, evidence in (("draft", {"file_sha256": "sha256:" + "a" * 64}), ("review", {"exit_code": 0}), ("publish", None)):
            self.assertTrue(self.tool(session, "step_start", {"step": step})["ok"])
            if evidence:
                self.assertTrue(self.tool(session, "step_done", {"step": step, "evidence": evidence})["ok"])
        gated = self.tool(session, "effect_begin", {"key": "publish:post-48", "payload": PAYLOAD})
        self.assertEqual((gated["reason"], gated["exit_code"]), ("awaiting-approval", 4))
        rid = self.tool(session, "approval_request", {"step": "publish", "action": "effect:publish:post-48", "payload": PAYLOAD, "ttl": 600})[
            "request_id"
        ]
        stop = self.tool(session, "next")
        self.assertEqual(
            (stop["ok"], stop["decision"], stop["reason"], stop["exit_code"], stop["request_id"]), (True, "stop", "awaiting-approval", 4, rid)
        )
        not_here = self.tool(session, "approval_grant", {"request_id": rid, "by": "agent-1"})
        self.assertEqual(not_here["reason"], "invalid-input")
        self.assertIn("--allow-control", not_here["message"])
        self.assertEqual(self.tool(session, "approval_list")["approvals"][0]["state"], "pending")
        control = self.open(self.session(owner="person-1", allow_control=True))
        self.assertEqual(self.tool(control, "approval_grant", {"request_id": rid, "by": "person-1"})["request"]["state"], "granted")
        begun = self.tool(session, "effect_begin", {"key": "publish:post-48", "payload": PAYLOAD})
        self.assertEqual(begun.get("effect", {}).get("state"), "started", begun)
        self.tool(control, "cancel", {"by": "person-1", "reason": "stop here"})
        self.assertEqual(self.tool(session, "effect_begin", {"key": "publish:other", "payload": PAYLOAD})["reason"], "cancelled")

    def test_a_second_owner_is_told_already_running_and_writes_nothing(self) -> None:
        first, second = self.open(self.session()), self.open(self.session(owner="agent-2"))
        self.assertEqual(self.tool(first, "recover")["decision"], "act")
        before = journal_bytes(self.path)
        stop = self.tool(second, "recover")
        self.assertEqual((stop["ok"], stop["decision"], stop["reason"], stop["exit_code"]), (True, "stop", "already-running", 3))
        self.assertEqual(self.tool(second, "step_start", {"step": "draft"})["reason"], "fenced")
        self.assertEqual(journal_bytes(self.path), before)
        self.assertTrue(self.tool(first, "step_start", {"step": "draft"})["ok"])

    def test_bad_arguments_change_nothing(self) -> None:
        session = self.open(self.session())
        self.tool(session, "recover")
        self.tool(session, "step_start", {"step": "draft"})
        before = journal_bytes(self.path)
        bad = [
            ("step_done", {"step": "draft"}),
            ("step_done", {"step": "draft", "evidence": "sha"}),
            ("step_done", {"step": "draft", "evidence": {}, "force": True}),
            ("step_fail", {"step": "draft", "class": "fatal", "error": "x"}),
            ("step_start", {"step": 3}),
            ("effect_begin", {"key": "../etc", "payload": PAYLOAD}),
            ("effect_begin", {"key": "k", "payload": [1]}),
            ("effect_uncertain", {"key": "k", "reason": ""}),
            ("lease_renew", {"ttl": -1}),
            ("lease_renew", {"ttl": True}),
            ("events", {"after": -1}),
            ("brief", {"max_chars": 10}),
            ("step_done", {"step": "no-such-step", "evidence": {}}),
            ("effect_ack", {"key": "never-begun", "receipt": {}}),
            ("effect_verify", {"key": "never-begun", "evidence": {}}),
            ("effect_absent", {"key": "never-begun", "evidence": {}}),
            ("effect_uncertain", {"key": "never-begun", "reason": "timeout"}),
        ]
        for name, arguments in bad:
            with self.subTest(tool=name, arguments=arguments):
                out = self.tool(session, name, arguments)
                self.assertEqual((out["ok"], out["reason"], out["exit_code"]), (False, "invalid-input", 2), out)
                self.assertTrue(out["message"])
        self.assertEqual(journal_bytes(self.path), before)
        self.assertEqual(
            session.handle(jsonrpc.classify(request(2, "tools/call", {"name": "status", "arguments": [1]})))["result"]["isError"], True
        )  # type: ignore[index]

    def test_read_only_server_lists_views_and_takes_no_lease(self) -> None:
        session = self.open(self.session(read_only=True, owner=None))
        before = journal_bytes(self.path)
        self.assertEqual(self.tool(session, "recover")["reason"], "invalid-input")
        self.assertEqual(self.tool(session, "status")["task_id"], "weekly-post-2026-48")
        self.assertEqual(journal_bytes(self.path), before)

    def test_lease_is_renewed_while_calls_arrive(self) -> None:
        session = self.open(self.session(ttl=30))
        taken = self.tool(session, "recover", {"ttl": 30})["lease"]
        self.clock.now += 5
        self.assertEqual(self.tool(session, "status")["lease"]["expires_at"], taken["expires_at"], "no renewal before a third of the ttl")
        self.clock.now += 6
        self.tool(session, "next")
        renewed = RunStore.open(self.path).state["lease"]
        self.assertGreater(renewed["expires_at"], taken["expires_at"])
        self.assertEqual(renewed["epoch"], taken["epoch"])
        self.clock.now += 31  # no call for longer than the ttl: the lease is lost, and the server says so
        self.assertEqual(self.tool(session, "step_start", {"step": "draft"})["reason"], "fenced")

    def test_exit_releases_only_the_lease_the_server_took(self) -> None:
        took = self.session()
        converse(took, INIT, call(1, "recover"))
        self.assertIsNone(RunStore.open(self.path).state["lease"]["owner"])
        worker = Run.open(self.path, clock=self.clock)
        lease = worker.acquire("agent-1", 300)
        given = self.session(epoch=lease["epoch"])
        self.clock.now += 10
        replies = converse(given, INIT, call(1, "step_start", {"step": "draft"}))
        self.assertFalse(replies[1]["result"]["isError"], replies[1])
        kept = RunStore.open(self.path).state["lease"]
        self.assertEqual((kept["owner"], kept["epoch"]), ("agent-1", lease["epoch"]), "a lease given with --epoch stays with its taker")
        self.assertGreater(kept["expires_at"], lease["expires_at"], "and is renewed by the first call")
        fenced = self.session()
        self.open(fenced)
        self.tool(fenced, "recover")
        newer = Run.open(self.path, clock=self.clock).acquire("agent-1", 300)  # the same owner id elsewhere, at a higher epoch
        self.assertEqual(self.tool(fenced, "step_done", {"step": "draft", "evidence": {}})["reason"], "fenced")
        fenced.close()
        self.assertEqual(RunStore.open(self.path).state["lease"], newer)

    def test_resources(self) -> None:
        session = self.open(self.session())
        listed = session.handle(jsonrpc.classify(request(1, "resources/list")))["result"]["resources"]  # type: ignore[index]
        self.assertEqual([r["uri"] for r in listed], ["runner://brief", "runner://status"])
        status = session.handle(jsonrpc.classify(request(2, "resources/read", {"uri": "runner://status"})))["result"]["contents"][0]  # type: ignore[index]
        self.assertEqual(status["mimeType"], "text/markdown")
        self.assertTrue(status["text"].startswith("# Status of run `weekly-post-2026-48`"), status["text"])
        self.assertIn("- status: active", status["text"])
        brief = session.handle(jsonrpc.classify(request(3, "resources/read", {"uri": "runner://brief"})))["result"]["contents"][0]  # type: ignore[index]
        self.assertTrue(brief["text"].startswith("# Run `weekly-post-2026-48`"))

    def test_damaged_run_is_state_unrecoverable_with_the_quarantine(self) -> None:
        worker = Run.open(self.path, clock=self.clock)
        worker.acquire("agent-1", 300)
        worker.step_start("draft")
        with open(os.path.join(self.path, "journal.jsonl"), "r+b") as handle:
            handle.seek(5)
            handle.write(b"#")
        session = self.open(self.session())
        for name in ("status", "recover", "next"):
            out = self.tool(session, name)
            self.assertEqual((out["reason"], out["exit_code"]), ("state-unrecoverable", 7))
            self.assertTrue(out["quarantine"] and os.path.isdir(out["quarantine"]), out)
            self.assertEqual(os.path.dirname(out["quarantine"]), os.path.join(self.path, "quarantine"))
        later = self.open(self.session())  # a server started after the quarantine names it too
        self.assertEqual(self.tool(later, "status")["quarantine"], out["quarantine"])
        self.assertFalse(os.path.exists(os.path.join(self.path, "run.json")), "the damaged run is not replaced")

    def test_damage_found_by_a_write_stays_reported(self) -> None:
        session = self.open(self.session())
        self.tool(session, "recover")
        with open(os.path.join(self.path, "journal.jsonl"), "r+b") as handle:
            handle.seek(5)
            handle.write(b"#")
        with open(os.path.join(self.path, "journal.jsonl"), "ab") as handle:
            handle.write(b'{"not": "a record"}\n')  # the journal grew: the next transaction reads it again
        out = self.tool(session, "step_start", {"step": "draft"})
        self.assertEqual(out["reason"], "state-unrecoverable", out)
        self.assertTrue(out["quarantine"] and os.path.isdir(out["quarantine"]), out)
        self.assertEqual(self.tool(session, "status")["quarantine"], out["quarantine"])


class McpBenchTest(unittest.TestCase):
    """``bench --mcp``: the same transition timed three ways on one run, every one of them recorded."""

    def test_bench_times_library_mcp_and_cli_on_one_run(self) -> None:
        from runner.proof.bench_mcp import run_mcp_bench

        result = run_mcp_bench(transitions=6, cli_transitions=2)
        self.assertEqual(result["transitions"], {"library": 6, "mcp": 6, "cli": 2})
        self.assertEqual(result["recorded_effects"], 14)
        for name in ("library_ms", "mcp_ms", "cli_ms", "mcp_over_library", "cli_over_library", "cli_over_mcp"):
            self.assertGreater(result[name], 0, name)
        self.assertRegex(result["ratio"], r"^1 : [0-9.]+ : [0-9.]+$")


def _python_for_client() -> Optional[str]:
    """One interpreter of 3.10 or newer for the official client, the same whichever Python runs the suite.

    The newest of pyenv's, else the newest on the PATH, else this one: so the
    suites of every Python share one cached environment.
    """
    import glob
    import shutil

    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = glob.glob(os.path.join(root, "versions", "3.*", "bin", "python"))
    candidates = sorted(found, key=lambda p: [int(x) if x.isdigit() else 0 for x in p.split(os.sep)[-3].split(".")], reverse=True)
    candidates += [p for p in (shutil.which(f"python3.{minor}") for minor in range(20, 9, -1)) if p]
    candidates += [sys.executable]
    for candidate in candidates:
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info >= (3, 10))"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if out.strip() == b"True":
            return candidate
    return None


def official_client() -> str:
    """The python of a virtual environment with the ``mcp`` package, made once and cached (:func:`_real.missing` when it cannot be had).

    The cache (:func:`_real.cache_root`) is keyed by
    the environment's Python version, so every Python that runs the suite shares
    it; a lock keeps two suites from building it at once.
    """
    import fcntl
    import shutil

    base = _python_for_client()
    if base is None:
        _real.missing("no Python 3.10 or newer to run the official mcp client")
    version = (
        subprocess.run([base, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], stdout=subprocess.PIPE, check=True)
        .stdout.decode()
        .strip()
    )
    cache = _real.cache_root()
    venv = os.path.join(cache, f"mcp-venv-py{version}")
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, "installed")
    with open(os.path.join(cache, "mcp-venv.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(marker) and os.path.exists(python):
            return python
        shutil.rmtree(venv, ignore_errors=True)
        steps = [[base, "-m", "venv", venv], [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "mcp"]]
        for step in steps:
            try:
                done = subprocess.run(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
            except (OSError, subprocess.SubprocessError) as exc:
                shutil.rmtree(venv, ignore_errors=True)
                _real.missing(f"the mcp package cannot be installed: {exc}")
            if done.returncode != 0:
                lines = [line for line in done.stdout.decode("utf-8", "replace").splitlines() if line.strip() and not line.startswith("WARNING")]
                shutil.rmtree(venv, ignore_errors=True)
                _real.missing(f"the mcp package cannot be installed: {lines[-1] if lines else 'exit ' + str(done.returncode)}")
        with open(marker, "w") as handle:
            handle.write("mcp\n")
    return python


@_real.needs("the official MCP Python SDK")
class McpOfficialClientTest(unittest.TestCase):
    """The official MCP Python SDK drives a whole run through our server over stdio, including a SIGKILL mid-effect."""

    def test_official_client_drives_a_whole_run(self) -> None:
        client_python = official_client()
        with _util.scratch_dir() as tmp:
            path = new_run(tmp)
            target = os.path.join(tmp, "published.jsonl")
            env = _util.child_env(pythonpath=False)
            # The client's own packages keep their installed bytecode; the server shares the suite's folder.
            env["RUNNER_SERVER_PYCACHE"] = env.pop("PYTHONPYCACHEPREFIX")
            proc = subprocess.run(
                [client_python, os.path.join(_util.SCRIPTS, "mcp_client_check.py"), sys.executable, _util.REPO_ROOT, path, target],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=tmp,
                timeout=300,
            )
            self.assertEqual(proc.returncode, 0, proc.stderr.decode("utf-8", "replace")[-3000:])
            report = json.loads(proc.stdout.decode().strip().splitlines()[-1])
        line = "mcp-check: client={client} protocol={protocol} calls={calls} failures={failures} kill_recovered={kr}".format(
            kr="yes" if report["kill_recovered"] else "no", **report
        )
        sys.stderr.write("\n" + line + "\n")
        sys.stderr.flush()
        self.assertEqual(report["failures"], 0, report["failure_list"])
        self.assertEqual(report["protocol"], jsonrpc.PROTOCOL_VERSION)
        self.assertEqual(report["auto_protocol"], jsonrpc.PROTOCOL_VERSION, "the SDK's default mode falls back to the handshake")
        self.assertEqual(report["tools"], WRITER_TOOLS)
        self.assertEqual(report["awaiting_next"]["reason"], "awaiting-approval")
        self.assertTrue(report["kill_recovered"])
        self.assertGreater(report["calls"], 20)


if __name__ == "__main__":
    unittest.main()
