"""A handler and a observer factory for ``tests/test_pool.py``, loaded by the pool's worker processes.

``handle`` takes a claimed run through the recovery procedure and then every
step of its plan. ``kill_once`` kills the first worker that reaches
``context["window"]`` (a marker file, created exclusively, makes it the only
one) and prints ``fault WINDOW`` just before. ``hang_once`` makes the first
worker that claims a run take its lease and then not return for
``context["hang"]`` seconds, as a call with no timeout would.
"""

import os
import time
from typing import Any, Dict

from runner.proof.faults import KillAt
from runner.execution.recovery import recover
from runner.execution.run import Run
from runner.base.windows import NO_OBSERVER, Observer


def handle(store: Any, owner: str, ttl: float, context: Dict[str, Any]) -> str:
    run = Run(store)
    decision = recover(run, owner, ttl)
    if decision["decision"] == "stop":
        return str(decision["reason"])
    for spec in run.state["plan"]["steps"]:
        if (run.state["steps"].get(spec["id"]) or {}).get("state") == "done":
            continue
        if run.state["current_step"] != spec["id"]:
            run.step_start(spec["id"])
        run.step_done(spec["id"], {"by": owner})
    run.release()
    # "finished": this call took the run to its end (a worker that finds it complete says "complete").
    return "finished" if run.state["status"] == "complete" else str(run.state["status"])


def hang_once(store: Any, owner: str, ttl: float, context: Dict[str, Any]) -> str:
    try:
        os.close(os.open(context["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return handle(store, owner, ttl, context)  # another worker hung here already
    recover(Run(store), owner, ttl)
    time.sleep(float(context["hang"]))
    return "hung"


class _KillOnce(Observer):
    def __init__(self, window: str, marker: str) -> None:
        self.marker = marker
        self.kill = KillAt(window, on_kill=lambda w: print(f"fault {w}", flush=True))

    def reached(self, window: str, **facts: Any) -> None:
        if window == self.kill.window and self.kill.fatal_next(**facts):
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            except FileExistsError:
                return  # another worker died here already
        self.kill.reached(window, **facts)


def kill_once(context: Dict[str, Any], seed: int) -> Observer:
    return _KillOnce(context["window"], context["marker"]) if context.get("window") else NO_OBSERVER
