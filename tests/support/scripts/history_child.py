"""One worker process of the scripted history of ``test_history_figures``, on a clock the test gives it.

``python history_child.py --run DIR --target FILE --clock T --compact N --phase P [--kill WINDOW KEY]``
opens the run (compacting once its journal holds N bytes and a quarter of
the snapshot), plays phase P of the script, and dies by SIGKILL at the first
pass of WINDOW for effect KEY when told. The target is a dictionary kept in
FILE, written after every call, so a call that committed is there for the
next process whatever happens to this one. The clock starts at T and moves a
quarter second at each reading; a wait moves it by the time waited. Phases:

* ``first``: worker-1 starts the step and files documents 1 to 6;
* ``second``: worker-2 recovers (its holder was killed and its lease broken)
  and files documents up to 8, document 6 answered "not now" once;
* ``third``: worker-3 recovers after worker-2's lease expired, finishes the
  step, asks for the publication's approval and releases;
* ``fourth``: worker-4 publishes under the approval, starts the archive's
  effect and stops without releasing;
* ``fifth``: worker-4 again, after a cancellation: it recovers (fencing its
  earlier self), settles what was in flight and releases.
"""

import json
import os
import sys
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from runner.base.windows import NO_OBSERVER  # noqa: E402
from runner.calls.target import NotApplied, Observation  # noqa: E402
from runner.proof.faults import KillAt  # noqa: E402
from runner.recovery import recover  # noqa: E402
from runner.run import Run  # noqa: E402
from runner.stores.file import RunStore  # noqa: E402

TTL = 30.0
DOCS = 8


class FileTarget:
    """A target whose effects are kept in a JSON file; ``faults`` say how a key's first call goes."""

    name = "file target"
    key_scope = "this file"
    retention_seconds = None
    conflicting_payload = "refused"
    verification = "lookup by key"
    deduplicates = True

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, encoding="utf-8") as handle:
            kept = json.load(handle)
        self.held: Dict[str, Any] = kept["held"]
        self.faults: Dict[str, str] = kept["faults"]

    def _save(self) -> None:
        with open(self.path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump({"held": self.held, "faults": self.faults}, handle)
        os.replace(self.path + ".tmp", self.path)

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        fault = self.faults.pop(key, None)
        if fault == "not-applied":
            self._save()
            raise NotApplied("the target was busy and applied nothing", retry_after=3.0)
        self.held[key] = payload
        self._save()
        return {"ticket": "t-" + key}

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        if key in self.held:
            return Observation("present", {"ticket": "t-" + key})
        return Observation("absent", {"looked_up": key})


def payload_of(key: str) -> Dict[str, Any]:
    return {"doc": key}


def main(argv: List[str]) -> int:
    args = dict(zip(argv[0::2], argv[1::2]))
    now = [float(args["--clock"])]

    def clock() -> float:
        now[0] += 0.25
        return now[0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    kill: Optional[List[str]] = args["--kill"].split(",") if "--kill" in args else None
    observer = KillAt(kill[0], 1, where={"key": kill[1]}) if kill else NO_OBSERVER
    store = RunStore.open(args["--run"], clock=clock, compact_min_bytes=int(args["--compact"]), observer=observer)
    run = Run(store, rand=lambda: 0.5)
    target = FileTarget(args["--target"])
    phase = args["--phase"]

    def recovered(owner: str) -> None:
        recover(run, owner, TTL, adapter_for=lambda key, effect: target, payloads=payload_of)

    def documents(upto: int) -> None:
        for n in range(1, upto + 1):
            key = f"doc:{n}:ticket"
            if (run.state["effects"].get(key) or {}).get("state") != "verified":
                run.drive_effect(key, payload_of(key), target, step="fetch", sleep=sleep)

    if phase == "first":
        run.acquire("worker-1", TTL)
        run.step_start("fetch")
        documents(6)
    elif phase == "second":
        recovered("worker-2")
        documents(DOCS)
    elif phase == "third":
        recovered("worker-3")
        documents(DOCS)
        run.step_done("fetch", {})
        run.approval_request("publish", "effect:publish:weekly", {"post": "weekly"}, 3600)
        run.release()
    elif phase == "fourth":
        run.acquire("worker-4", TTL)
        run.step_start("publish")
        run.drive_effect("publish:weekly", {"post": "weekly"}, target, step="publish", sleep=sleep)
        run.step_done("publish", {})
        run.step_start("archive")
        run.effect_begin("archive:1", payload_of("archive:1"), step="archive")
    elif phase == "fifth":
        recovered("worker-4")
        run.release()
    print(json.dumps({"revision": run.state["revision"], "status": run.state["status"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
