"""The DBOS side of ``tests/test_engines.py``, run by an interpreter that has ``dbos``.

``python dbos_job.py COMMAND JSON`` where JSON holds ``system_db`` (a ``sqlite:///`` or
``postgresql://`` URL) and ``workflow_id``:

* ``run``: launch DBOS (which also recovers this executor's unfinished workflows), start
  ``job`` under ``workflow_id`` unless it exists, wait for its result and print it. The steps
  call the ticket service at ``service`` with the helper (``mode: helper``) or plainly
  (``mode: plain``); ``kill`` = ``[window, key]`` SIGKILLs this process the first time that
  window is reached for that key; ``pause`` = ``[window, key, gate]`` waits there until the
  file ``gate`` exists.
* ``send`` (``record``), ``cancel``, ``waiting``, ``status``: a client call; prints one JSON line.
"""

import json
import os
import signal
import sys
import time
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from dbos import DBOS, DBOSClient, SetWorkflowID  # noqa: E402

from runner.engines import dbos as engine  # noqa: E402
from runner.engines.once import effect_key  # noqa: E402
from runner.proof.ticketservice import MarkerTicketAdapter, TicketAdapter  # noqa: E402

OPTS: Dict[str, Any] = {}


def _adapter() -> Any:
    if OPTS.get("marker"):
        return MarkerTicketAdapter(OPTS["service"], timeout=5.0)
    return TicketAdapter(OPTS["service"], retention_seconds=None, timeout=5.0)


def on_window(window: str, key: str) -> None:
    kill, pause = OPTS.get("kill"), OPTS.get("pause")
    if kill and [window, key] == kill:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if pause and [window, key] == pause[:2]:
        print(f"paused {window} {key}", flush=True)
        while not os.path.exists(pause[2]):
            time.sleep(0.02)


@DBOS.step(name="tests.plain_perform", retries_allowed=False)
def plain_perform(key: str, payload: Dict[str, Any]) -> Dict[str, Any]:
    """The step without the helper: what DBOS re-runs on recovery calls the target again."""
    adapter = _adapter()
    on_window("before-invoke", key)
    receipt = adapter.invoke(key, payload, 0)
    on_window("after-invoke", key)
    on_window("after-verify", key)
    return {"key": key, "receipt": receipt, "invoked": True}


@DBOS.workflow(name="tests.plain_job")
def plain_job(job: Dict[str, Any]) -> Dict[str, Any]:
    task = DBOS.workflow_id or ""
    filed = [plain_perform(effect_key(task, f"doc-{d}:ticket"), engine.ticket_payload(d))["key"] for d in job["documents"]]
    return {"filed": filed, "reused": []}


def main(command: str, opts: Dict[str, Any]) -> int:
    OPTS.update(opts)
    if command == "run":
        engine.use_adapter(_adapter, on_window=on_window)
        DBOS(config={"name": "runner-engine-tests", "system_database_url": opts["system_db"], "application_version": "engine-tests-1"})
        DBOS.launch()
        try:
            status = DBOS.get_workflow_status(opts["workflow_id"])
            if status is None:
                workflow = plain_job if opts.get("mode") == "plain" else engine.ticket_job
                with SetWorkflowID(opts["workflow_id"]):
                    handle = DBOS.start_workflow(workflow, opts["job"])
            else:
                handle = DBOS.retrieve_workflow(opts["workflow_id"])
            print(json.dumps({"result": handle.get_result(polling_interval_sec=0.05)}), flush=True)
        except Exception as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        finally:
            DBOS.destroy()
        return 0
    client = DBOSClient(system_database_url=opts["system_db"])
    try:
        if command == "send":
            client.send(opts["workflow_id"], opts["record"], topic=engine.GRANT_TOPIC)
            print(json.dumps({"sent": True}), flush=True)
        elif command == "cancel":
            client.cancel_workflow(opts["workflow_id"])
            print(json.dumps({"cancelled": True}), flush=True)
        elif command == "waiting":
            try:
                waiting = client.get_event(opts["workflow_id"], "waiting", timeout_seconds=0)
            except Exception:  # the run's process has not made the system database yet
                waiting = None
            print(json.dumps({"waiting": waiting}), flush=True)
        elif command == "status":
            status = client.retrieve_workflow(opts["workflow_id"]).get_status()
            print(json.dumps({"status": status.status}), flush=True)
        else:
            raise SystemExit(f"unknown command {command!r}")
    finally:
        client.destroy()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1], json.loads(sys.argv[2]))
    sys.stdout.flush()
    os._exit(code)
