"""A whole run driven through ``python3 -m runner mcp`` by the official MCP Python SDK.

Run by ``tests.test_mcp`` with the interpreter of a throwaway virtual
environment that has the ``mcp`` package (never the runner's own): ``python
mcp_client_check.py SERVER_PYTHON REPO RUN_DIR TARGET_FILE``. It prints one
JSON object: the client's version, the negotiated revision, how many tool
calls were made and how many did not do what was expected, whether the effect
interrupted by a SIGKILL of the server was reconciled by a new server, the tool
names listed, and the structured result of the ``next`` call that stopped at
awaiting-approval.

The "target" of the gated effect is a file of published posts: the client
appends to it between ``effect_begin`` and ``effect_ack`` (that is, it calls the
target), the server is killed before the ack, and the new server's caller
reconciles by observing the file, as a real harness would observe a real API.
"""

import asyncio
import json
import os
import signal
import sys
from importlib.metadata import version
from typing import Any, Dict, List, Optional

from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SERVER_PYTHON, REPO, RUN_DIR, TARGET = sys.argv[1:5]
GATED_KEY = "publish:post-48"
PAYLOAD = {"slug": "weekly-post-2026-48", "title": "What we learned this week"}


class Tally:
    def __init__(self) -> None:
        self.calls = 0
        self.failures: List[str] = []

    async def call(
        self, session: ClientSession, name: str, arguments: Dict[str, Any], expect: Optional[str] = None, reason: Optional[str] = None
    ) -> Dict[str, Any]:
        """Call a tool; ``expect`` is the refusal reason wanted (None: success), ``reason`` the result reason wanted."""
        self.calls += 1
        result = await session.call_tool(name, arguments)
        out = result.structured_content or {}
        if expect is None and result.is_error:
            self.failures.append(f"{name}: refused: {out.get('reason')}: {out.get('message')}")
        elif expect is not None and (not result.is_error or out.get("reason") != expect):
            self.failures.append(f"{name}: wanted refusal {expect}, got isError={result.is_error} reason={out.get('reason')}")
        elif reason is not None and out.get("reason") != reason:
            self.failures.append(f"{name}: wanted reason {reason}, got {out.get('reason')}: {out.get('detail')}")
        return out

    def check(self, condition: bool, what: str) -> None:
        if not condition:
            self.failures.append(what)


def server(owner: str, *extra: str) -> StdioServerParameters:
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    if os.environ.get("RUNNER_SERVER_PYCACHE"):
        env = {"PYTHONPYCACHEPREFIX": os.environ["RUNNER_SERVER_PYCACHE"]}
    return StdioServerParameters(command=SERVER_PYTHON, args=["-m", "runner", "--dir", RUN_DIR, "mcp", "--owner", owner, *extra], cwd=REPO, env=env)


def server_pids() -> List[int]:
    """This process's children that run the MCP server (read from /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"mcp" in argv and b"runner" in argv:
            found.append(int(name))
    return found


def target_lines() -> List[Dict[str, Any]]:
    if not os.path.exists(TARGET):
        return []
    with open(TARGET) as handle:
        return [json.loads(line) for line in handle if line.strip()]


async def first_server(tally: Tally, report: Dict[str, Any]) -> None:
    """Recover, two steps, an effect through begin/ack/verify, an approval stop; then a kill inside the gated effect."""
    async with stdio_client(server("agent-1")) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            report["protocol"] = init.protocol_version
            listed = await session.list_tools()
            report["tools"] = [t.name for t in listed.tools]
            annotations = {t.name: t.annotations for t in listed.tools}
            tally.check(all(t.output_schema for t in listed.tools), "every tool declares an outputSchema")
            tally.check(annotations["next"].read_only_hint is True and annotations["step_start"].read_only_hint is False, "read-only hints")
            tally.check("approval_grant" not in report["tools"] and "cancel" not in report["tools"], "no control tools by default")
            resources = await session.list_resources()
            tally.check({str(r.uri) for r in resources.resources} == {"runner://brief", "runner://status"}, "resources listed")

            await tally.call(session, "step_start", {"step": "draft"}, expect="fenced")  # no lease yet
            decision = await tally.call(session, "recover", {})
            tally.check((decision.get("action") or {}).get("kind") == "start-step", f"recover: {decision.get('action')}")
            await tally.call(session, "step_start", {"step": "draft"})
            await tally.call(session, "step_done", {"step": "draft", "evidence": {"file_sha256": "sha256:" + "a" * 64}})
            await tally.call(session, "step_start", {"step": "review"})
            await tally.call(session, "effect_begin", {"key": "review:checks", "payload": {"checks": ["spelling", "links"]}})
            await tally.call(session, "effect_ack", {"key": "review:checks", "receipt": {"run": 1}})
            verified = await tally.call(session, "effect_verify", {"key": "review:checks", "evidence": {"exit_code": 0}})
            tally.check((verified.get("effect") or {}).get("state") == "verified", "effect verified")
            before = (await tally.call(session, "status", {}))["revision"]
            await tally.call(session, "effect_ack", {"key": "review:checks", "receipt": "not an object"}, expect="invalid-input")
            await tally.call(session, "step_done", {"step": "review", "evidence": {"exit_code": 0}, "extra": 1}, expect="invalid-input")
            tally.check((await tally.call(session, "status", {}))["revision"] == before, "bad arguments changed nothing")
            await tally.call(session, "step_done", {"step": "review", "evidence": {"exit_code": 0}})
            await tally.call(session, "step_start", {"step": "publish"})
            await tally.call(session, "effect_begin", {"key": GATED_KEY, "payload": PAYLOAD}, expect="awaiting-approval")
            request = await tally.call(
                session, "approval_request", {"step": "publish", "action": "effect:" + GATED_KEY, "payload": PAYLOAD, "ttl": 3600}
            )
            report["awaiting_next"] = await tally.call(session, "next", {}, reason="awaiting-approval")
            await tally.call(session, "approval_grant", {"request_id": request.get("request_id", "x"), "by": "agent-1"}, expect="invalid-input")

            # A person grants it through a server started with --allow-control.
            async with stdio_client(server("person-1", "--allow-control")) as (read2, write2):
                async with ClientSession(read2, write2) as control:
                    await control.initialize()
                    names = [t.name for t in (await control.list_tools()).tools]
                    tally.check("approval_grant" in names and "lease_break" in names, "control tools with --allow-control")
                    await tally.call(control, "approval_grant", {"request_id": request["request_id"], "by": "person-1"})

            await tally.call(session, "next", {}, reason=None)
            begun = await tally.call(session, "effect_begin", {"key": GATED_KEY, "payload": PAYLOAD})
            tally.check((begun.get("effect") or {}).get("state") == "started", "gated effect started")
            with open(TARGET, "a") as handle:  # the call to the target: it commits the post
                handle.write(json.dumps({"key": GATED_KEY, "post_id": 48}) + "\n")
            pids = server_pids()
            tally.check(len(pids) == 1, f"one server to kill, found {pids}")
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            report["killed"] = bool(pids)
            try:
                await asyncio.wait_for(session.call_tool("status", {}), 5)
                tally.check(False, "the killed server still answered")
            except Exception:
                pass  # the connection is gone, as it should be
            raise _Killed()


class _Killed(Exception):
    pass


async def second_server(tally: Tally, report: Dict[str, Any]) -> None:
    """A new server for the same owner: recover names the interrupted effect; observe the target; finish."""
    async with stdio_client(server("agent-1")) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            decision = await tally.call(session, "recover", {})
            action = decision.get("action") or {}
            tally.check(action.get("kind") == "reconcile" and action.get("key") == GATED_KEY, f"recover after the kill: {action}")
            seen = [line for line in target_lines() if line["key"] == GATED_KEY]
            if seen:
                await tally.call(
                    session, "effect_verify", {"key": GATED_KEY, "evidence": {"found": True, "post_id": seen[0]["post_id"]}, "reconciled": True}
                )
            await tally.call(session, "step_done", {"step": "publish", "evidence": {"receipt": {"post_id": 48}, "url_check": "title found"}})
            final = await tally.call(session, "next", {}, reason="complete")
            effect = (await tally.call(session, "effect_show", {"key": GATED_KEY})).get("effect") or {}
            brief = await session.read_resource("runner://brief")
            tally.check("complete" in brief.contents[0].text, "brief resource shows the finished run")
            report["kill_recovered"] = bool(
                report.get("killed")
                and len(seen) == 1
                and effect.get("state") == "verified"
                and effect.get("attempts") == 1
                and final.get("reason") == "complete"
            )


async def observer(tally: Tally, report: Dict[str, Any]) -> None:
    """The SDK's high-level client in its default mode: it probes the 2026-07-28 revision, is refused, and falls back."""
    async with Client(server("observer-1", "--read-only")) as client:
        report["auto_protocol"] = client.protocol_version
        names = [t.name for t in (await client.list_tools()).tools]
        tally.check(set(names) == {"next", "brief", "status", "report", "effect_show", "items", "effect_list",
                                   "approval_list", "lease_show", "events"},
                    f"read-only tools: {names}")
        tally.calls += 1
        refused = await client.call_tool("step_start", {"step": "draft"})
        tally.check(
            refused.is_error and (refused.structured_content or {}).get("reason") == "invalid-input", "a write refused on a read-only server"
        )


async def main() -> None:
    tally = Tally()
    report: Dict[str, Any] = {"client": "mcp-" + version("mcp"), "protocol": None, "kill_recovered": False}
    try:
        await first_server(tally, report)
    except BaseException as exc:  # the kill ends the first connection; anything else is a failure
        if not _is_killed(exc):
            tally.failures.append(f"first server: {_describe(exc)}")
    for part in (second_server, observer):
        try:
            await part(tally, report)
        except BaseException as exc:
            tally.failures.append(f"{part.__name__}: {_describe(exc)}")
    report.update(calls=tally.calls, failures=len(tally.failures), failure_list=tally.failures[:20])
    print(json.dumps(report, sort_keys=True, default=str))


def _describe(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", None)
    if inner:
        return "; ".join(_describe(e) for e in inner)
    return f"{type(exc).__name__}: {exc}"


def _is_killed(exc: BaseException) -> bool:
    if isinstance(exc, _Killed):
        return True
    inner = getattr(exc, "exceptions", None)
    return bool(inner) and all(_is_killed(e) for e in inner)


if __name__ == "__main__":
    asyncio.run(main())
