"""The handler and observer factory of ``tests/test_zombie.py``, loaded by the ``work`` pools' worker processes.

``handle`` takes a claimed run through the recovery procedure and each step
of its plan, the step's one effect being a ticket filed through the ticket
service (:class:`runner.proof.ticketservice.TicketAdapter`, which sends the
lease's epoch and the run id, so the service fences stale epochs).

``observer`` gives each worker a :class:`PauseOnce`: the first worker (of any
pool) that reaches ``context["pause"]`` stops its pool's supervisor if
``context["stop_supervisor"]`` (SIGSTOP: the host pauses as a whole),
announces it in the events file and waits there until the test creates
``context["go"]``; the test stops it with SIGSTOP meanwhile and continues both
with SIGCONT once the run was taken over. That worker is then a zombie: what
it does next is fixed, so the test can count its refusals. It goes on with the
operation it was stopped in (its call to the service or its commit), and once
the store has fenced it, it tries one more write of each kind with its old
epoch, as a zombie that ignores the refusal would: ``step done`` in the store,
and the ticket call.

Every write a worker tries and every refusal it meets is appended to
``context["events"]`` as one JSON line (one ``write`` call on a file opened
for appending, so lines of concurrent workers never interleave).
"""

import json
import os
import signal
import time
from typing import Any, Dict, List, Optional

from runner.calls.target import StaleEpoch
from runner.base.errors import Fenced
from runner.proof.ticketservice import TicketAdapter
from runner.execution.recovery import recover
from runner.execution.run import Run
from runner.base.windows import Observer, check_window

#: Seconds a paused worker waits for the go file before it gives up (the test failed meanwhile).
PAUSE_LIMIT = 120.0

_PAUSED: List["PauseOnce"] = []  # the observer of this worker process, when they paused it


def record(context: Dict[str, Any], event: str, **facts: Any) -> None:
    """Append one event line, with this process's pid, to the events file."""
    line = json.dumps({"event": event, "pid": os.getpid(), **facts}, sort_keys=True) + "\n"
    fd = os.open(context["events"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def read_events(path: str) -> List[Dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def ticket_key(task: str, step: str) -> str:
    return f"{task}.ticket.{step}"


class _FencingRun(Run):
    """A :class:`Run` that records every write the store refused for its stale lease."""

    def __init__(self, store: Any, context: Dict[str, Any]) -> None:
        super().__init__(store)
        self.context = context

    def _mutate(self, decide: Any, fenced: bool = True) -> Dict[str, Any]:
        try:
            return super()._mutate(decide, fenced)
        except Fenced as exc:
            self._refused(exc)
            raise

    def transact_many(self, changes: Any) -> Any:
        """The executor's commits (one transition for several effects) are writes too."""
        try:
            return super().transact_many(changes)
        except Fenced as exc:
            self._refused(exc)
            raise

    def _refused(self, exc: Fenced) -> None:
        record(self.context, "refused", by="store", task=self.store.task_id, owner=self.owner, epoch=self.epoch, detail=exc.message)


class _RecordingAdapter(TicketAdapter):
    """The ticket adapter, recording each call's epoch and whether the service refused it as stale."""

    def __init__(self, context: Dict[str, Any], task: str) -> None:
        super().__init__(context["service"], retention_seconds=None, run_id=task)
        self.context = context

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        try:
            receipt = super().invoke(key, payload, epoch)
        except StaleEpoch as exc:
            record(self.context, "refused", by="service", task=self.run_id, epoch=epoch, detail=str(exc))
            raise
        record(self.context, "invoked", task=self.run_id, key=key, epoch=epoch, ticket=receipt.get("ticket"), created=receipt.get("created"))
        return receipt


def handle(store: Any, owner: str, ttl: float, context: Dict[str, Any]) -> str:
    """Recover the run, file each step's ticket, finish the steps, release; a fenced zombie tries its late writes."""
    run = _FencingRun(store, context)
    adapter = _RecordingAdapter(context, store.task_id)
    step: Optional[str] = None
    try:
        decision = recover(run, owner, ttl)
        record(context, "claimed", task=store.task_id, owner=owner, epoch=run.epoch, decision=decision["decision"], reason=decision["reason"])
        if decision["decision"] == "stop":
            return str(decision["reason"])
        for spec in run.state["plan"]["steps"]:
            step = spec["id"]
            if (run.state["steps"].get(step) or {}).get("state") == "done":
                continue
            if run.state["current_step"] != step:
                run.step_start(step)
            run.drive_effect(ticket_key(store.task_id, step), {"title": f"ticket for {step}"}, adapter, step=step)
            run.step_done(step, {"by": owner})
        run.release()
        record(context, "finished", task=store.task_id, owner=owner, epoch=run.epoch, status=run.state["status"])
        return str(run.state["status"])
    except Fenced:
        if _PAUSED and step is not None:
            _late_writes(run, adapter, step)
        return "fenced"


def _late_writes(run: Run, adapter: TicketAdapter, step: str) -> None:
    """What a zombie that ignores the store's refusal would still try, with its old epoch: each must be refused."""
    context = run.context  # type: ignore[attr-defined]
    task = run.store.task_id
    try:
        run.step_done(step, {"by": run.owner, "late": True})
        record(context, "accepted", by="store", task=task, epoch=run.epoch)
    except Fenced:
        pass  # refused and recorded by the run
    try:
        adapter.invoke(ticket_key(task, step), {"title": f"ticket for {step}"}, int(run.epoch or 0))
        record(context, "accepted", by="service", task=task, epoch=run.epoch)
    except StaleEpoch:
        pass  # refused and recorded by the adapter


class PauseOnce(Observer):
    """Pauses the first worker that reaches ``pause["window"]`` (once ``pause["after"]`` was passed, if given).

    :param context: ``pause`` = ``{"window": W, "after": [W0, {facts}] or None}``,
        ``marker`` (created exclusively: only one worker pauses), ``go`` (the file
        that ends the pause), ``events``.
    """

    def __init__(self, context: Dict[str, Any]) -> None:
        self.context = context
        pause = context.get("pause") or {}
        self.window = check_window(pause["window"]) if pause else None
        after = pause.get("after")
        self.after = (check_window(after[0]), dict(after[1])) if after else None
        self.armed = self.after is None
        self.lease: Dict[str, Any] = {}

    def reached(self, window: str, **facts: Any) -> None:
        if window == "lease:after-acquire":
            self.lease = {"owner": facts["owner"], "epoch": facts["epoch"]}
        if self.window is None:
            return
        if not self.armed:
            name, where = self.after  # type: ignore[misc]
            self.armed = window == name and all(facts.get(k) == v for k, v in where.items())
            return
        if window != self.window:
            return
        window_name, self.window = self.window, None  # one pause at most per worker
        try:
            os.close(os.open(self.context["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return  # another worker paused already
        _PAUSED.append(self)
        if self.context.get("stop_supervisor"):
            os.kill(os.getppid(), signal.SIGSTOP)  # the host pauses as a whole: its supervisor first, before the lease can lapse
        record(self.context, "paused", window=window_name, **self.lease)
        deadline = time.monotonic() + PAUSE_LIMIT
        while not os.path.exists(self.context["go"]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"paused at {window_name} and never told to go on")
            time.sleep(0.01)
        record(self.context, "resumed", window=window_name, **self.lease)


def observer(context: Dict[str, Any], seed: int) -> Observer:
    return PauseOnce(context)
