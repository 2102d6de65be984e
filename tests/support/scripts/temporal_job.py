"""The Temporal side of ``tests/test_engines.py``, run by an interpreter that has ``temporalio``.

``python temporal_job.py COMMAND JSON`` where JSON holds ``address`` and ``queue`` and:

* ``worker``: serve :class:`runner.engines.temporal.TicketJob` against the ticket service at
  ``service`` (``marker`` lookups when the service keeps no idempotency keys), with the helper
  (``mode: helper``) or the engine's plain retry (``mode: plain``); ``kill`` = ``[window, key]``
  SIGKILLs this process the first time that window is reached for that key; ``pause`` =
  ``[window, key, gate]`` waits there until the file ``gate`` exists. Prints ``ready``.
* ``start`` (``workflow_id``, ``job``), ``result``, ``signal`` (``record``), ``cancel``,
  ``waiting``: a client call; prints one JSON line.
"""

import asyncio
import datetime
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from temporalio import activity  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from runner.engines import temporal as engine  # noqa: E402
from runner.proof.ticketservice import MarkerTicketAdapter, TicketAdapter  # noqa: E402


def _adapter(opts: Dict[str, Any]) -> Any:
    if opts.get("marker"):
        return MarkerTicketAdapter(opts["service"], timeout=5.0)
    return TicketAdapter(opts["service"], retention_seconds=None, timeout=5.0)


def _window_hook(opts: Dict[str, Any]) -> Any:
    kill, pause = opts.get("kill"), opts.get("pause")

    def on_window(window: str, key: str) -> None:
        if kill and [window, key] == kill:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if pause and [window, key] == pause[:2]:
            print(f"paused {window} {key}", flush=True)
            while not os.path.exists(pause[2]):
                time.sleep(0.02)

    return on_window


class PlainActivities:
    """The same activity names without the helper: the engine's own retry calls the target again."""

    def __init__(self, opts: Dict[str, Any]) -> None:
        self.adapter = _adapter(opts)
        self.on_window = _window_hook(opts)

    @activity.defn(name=engine.PERFORM)
    def perform(self, request: Dict[str, Any]) -> Dict[str, Any]:
        key, payload = request["key"], request["payload"]
        self.on_window("before-invoke", key)
        receipt = self.adapter.invoke(key, payload, int(request.get("epoch", 0)))
        self.on_window("after-invoke", key)
        self.on_window("after-verify", key)
        return {"key": key, "receipt": receipt, "evidence": None, "invoked": True}

    @activity.defn(name=engine.OBSERVE)
    def observe(self, request: Dict[str, Any]) -> Dict[str, Any]:
        seen = self.adapter.observe(request["key"], request["payload"])
        return {"status": seen.status, "evidence": seen.evidence}


async def main(command: str, opts: Dict[str, Any]) -> int:
    client = await Client.connect(opts["address"])
    if command == "worker":
        if opts.get("mode") == "plain":
            acts: Any = PlainActivities(opts)
        else:
            acts = engine.EffectActivities(lambda: _adapter(opts), on_window=_window_hook(opts))
        with ThreadPoolExecutor(max_workers=4) as pool:
            # A short sticky timeout: a killed worker's workflow moves to a live one within a second.
            worker = Worker(client, task_queue=opts["queue"], workflows=[engine.TicketJob], activities=[acts.perform, acts.observe], activity_executor=pool,
                            sticky_queue_schedule_to_start_timeout=datetime.timedelta(seconds=1))
            async with worker:
                print("ready", flush=True)
                await asyncio.Event().wait()
        return 0
    if command == "start":
        handle = await client.start_workflow(engine.TicketJob.run, opts["job"], id=opts["workflow_id"], task_queue=opts["queue"])
        print(json.dumps({"started": handle.id}), flush=True)
        return 0
    handle = client.get_workflow_handle(opts["workflow_id"])
    if command == "result":
        print(json.dumps({"result": await handle.result()}), flush=True)
    elif command == "signal":
        await handle.signal("grant", opts["record"])
        print(json.dumps({"signalled": True}), flush=True)
    elif command == "cancel":
        await handle.cancel()
        print(json.dumps({"cancelled": True}), flush=True)
    elif command == "waiting":
        print(json.dumps({"waiting": await handle.query("waiting")}), flush=True)
    else:
        raise SystemExit(f"unknown command {command!r}")
    return 0


if __name__ == "__main__":
    code = asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
    sys.stdout.flush()
    os._exit(code)  # the SDK's core threads may not survive interpreter finalization
