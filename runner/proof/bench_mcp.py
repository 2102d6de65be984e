"""``bench --mcp``: one transition through the library, the MCP server and the command line, on one run.

The transition is ``effect begin`` of a fresh key (one fenced, fsync'd journal
append), made by the same owner at the same epoch in three ways, interleaved
so that all three meet the same disk:

* ``library``: :meth:`runner.execution.run.Run.effect_begin` in this process;
* ``mcp``: a ``tools/call`` of ``effect_begin`` to one ``python3 -m runner mcp``
  process started once, timed from writing the request to reading its answer;
* ``cli``: ``python3 -m runner effect begin`` in a new process each time, as a
  shell-driven agent calls it (interpreter start-up included).

Reported: the median of each in milliseconds and the ratios ``library : mcp :
cli``, measured in the same run; never a fixed target.
"""

import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

from ..contract.text import load_contract
from ..surfaces.mcp import jsonrpc
from ..execution.run import Run
from ..stores.file import RunStore
from . import PACKAGE_PARENT

__all__ = ["run_mcp_bench"]

_ROOT = PACKAGE_PARENT
_CONTRACT = os.path.join(_ROOT, "templates", "run-contract.example.md")


def run_mcp_bench(
    transitions: int = 200, cli_transitions: int = 20, scratch: Optional[str] = None,
    clock: Callable[[], float] = time.perf_counter
) -> Dict[str, Any]:
    """Time ``transitions`` library and MCP transitions and ``cli_transitions`` CLI ones; return medians and ratios."""
    root = tempfile.mkdtemp(prefix="runner-bench-mcp-", dir=scratch)
    server = None
    try:
        path = os.path.join(root, "run")
        plan = copy.deepcopy(load_contract(_CONTRACT))
        RunStore.create(path, plan["task_id"], plan)
        run = Run.open(path)
        epoch = run.acquire("bench", 3600)["epoch"]
        run.step_start("draft")
        payload_file = os.path.join(root, "payload.json")
        payload = {"document": "bench", "size": 1}
        with open(payload_file, "w") as handle:
            json.dump(payload, handle)
        env = dict(os.environ, PYTHONPATH=_ROOT)
        env.pop("RUNNER_DIR", None)
        server = subprocess.Popen(
            [sys.executable, "-m", "runner", "--dir", path, "mcp", "--owner", "bench", "--epoch", str(epoch)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=_ROOT,
        )
        ident = [0]

        def ask(method: str, params: Dict[str, Any]) -> Dict[str, Any]:
            ident[0] += 1
            server.stdin.write(  # type: ignore[union-attr]
                jsonrpc.encode({"jsonrpc": "2.0", "id": ident[0], "method": method, "params": params}))
            server.stdin.flush()  # type: ignore[union-attr]
            reply = json.loads(server.stdout.readline())  # type: ignore[union-attr]
            if "error" in reply or reply["result"].get("isError"):
                raise RuntimeError(f"mcp {method} failed: {reply}")
            return reply["result"]

        ask("initialize",
            {"protocolVersion": jsonrpc.PROTOCOL_VERSION, "capabilities": {},
             "clientInfo": {"name": "bench", "version": "1"}})
        times: Dict[str, List[float]] = {"library": [], "mcp": [], "cli": []}
        every = max(1, transitions // max(1, cli_transitions))
        for n in range(transitions):
            t0 = clock()
            run.effect_begin(f"bench-lib-{n}", payload)
            times["library"].append(clock() - t0)
            t0 = clock()
            ask("tools/call", {"name": "effect_begin", "arguments": {"key": f"bench-mcp-{n}", "payload": payload}})
            times["mcp"].append(clock() - t0)
            if n % every == 0 and len(times["cli"]) < cli_transitions:
                t0 = clock()
                done = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "runner",
                        "--dir",
                        path,
                        "effect",
                        "begin",
                        f"bench-cli-{n}",
                        "--payload",
                        payload_file,
                        "--owner",
                        "bench",
                        "--epoch",
                        str(epoch),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    env=env,
                    cwd=_ROOT,
                )
                times["cli"].append(clock() - t0)
                if done.returncode != 0:
                    raise RuntimeError(f"cli effect begin failed: {done.stderr.decode('utf-8', 'replace').strip()}")
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(timeout=60)
        effects = RunStore.open(path).state["effects"]
        medians = {name: statistics.median(values) for name, values in times.items()}
        return {
            "transitions": {name: len(values) for name, values in times.items()},
            "recorded_effects": len(effects),
            "library_ms": round(medians["library"] * 1000, 3),
            "mcp_ms": round(medians["mcp"] * 1000, 3),
            "cli_ms": round(medians["cli"] * 1000, 3),
            "mcp_over_library": round(medians["mcp"] / medians["library"], 2),
            "cli_over_library": round(medians["cli"] / medians["library"], 2),
            "cli_over_mcp": round(medians["cli"] / medians["mcp"], 2),
            "ratio": f"1 : {medians['mcp'] / medians['library']:.2f} : {medians['cli'] / medians['library']:.2f}",
        }
    finally:
        if server is not None:
            if server.poll() is None:
                server.kill()
                server.wait()
            for stream in (server.stdin, server.stdout):
                if stream is not None and not stream.closed:
                    stream.close()
        shutil.rmtree(root, ignore_errors=True)
