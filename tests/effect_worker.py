"""A worker process for tests/test_effect_windows.py: drives ticket effects, and can die at one commit window.

    python effect_worker.py --run DIR --url URL --run-id ID --keys K1,K2 [--kill-window N --kill-key K]

It takes the run's lease (owner ``worker`` unless ``--owner``; re-acquiring
under the same owner always takes a higher epoch, which fences any earlier
process that used it), then drives each key to ``verified`` through
``Run.drive_effect`` and a :class:`~runner.proof.ticketservice.TicketAdapter`.
With ``--kill-window`` it SIGKILLs itself at that window of ``--kill-key``:

1. while the journal append that commits ``started`` is half written
2. after ``started`` is committed, before the request is sent
3. after the service committed, when the answer was lost (``drop_after_commit`` armed just before)
4. after the answer was read, before ``invoke`` returns (so before the ack is committed)
5. after the ack is committed, before the verifying observation

stdout: one JSON object per line (``acquired``, then one per key, or an
``error``). The exit code is the runner's for an expected error, else 0.
"""

import argparse
import json
import os
import signal
import sys
import urllib.request
from typing import Any, Dict, List, Optional

from runner.effects import Observation, UnknownOutcome
from runner.errors import RunnerError
from runner.fs import OsFileSystem
from runner.run import Run
from runner.proof.ticketservice import TicketAdapter


def payload_for(key: str) -> Dict[str, Any]:
    """The payload of the ticket for ``key``; its marker is the key, so duplicates show in the stats."""
    return {"marker": key, "title": f"ticket for {key}"}


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def emit(obj: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def arm_drop_after_commit(url: str) -> None:
    """The service will commit the next POST and then close the connection without an answer."""
    request = urllib.request.Request(url + "/faults", data=b'{"drop_after_commit": 1}', method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5) as response:
        response.read()


class TearingFileSystem(OsFileSystem):
    """Window 1: the append that would commit ``started`` for the key writes half its bytes, then the process dies."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.needle = ('["effects",' + json.dumps(key) + "],{").encode("utf-8")

    def append(self, path: str, data: bytes) -> None:
        if path.endswith("journal.jsonl") and self.needle in data and b'"state":"started"' in data:
            super().append(path, data[: len(data) // 2])
            die()
        super().append(path, data)


class WindowAdapter:
    """Delegates to the ticket adapter and dies at windows 2 to 5 for one key."""

    def __init__(self, inner: TicketAdapter, run: Run, window: int, kill_key: str) -> None:
        self.inner = inner
        self.run = run
        self.window = window
        self.kill_key = kill_key

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        hit = key == self.kill_key
        if hit and self.window == 2:
            die()
        if hit and self.window == 3:
            arm_drop_after_commit(self.inner.url)
        try:
            receipt = self.inner.invoke(key, payload, epoch)
        except UnknownOutcome:
            if hit and self.window == 3:
                die()
            raise
        if hit and self.window == 4:
            die()
        return receipt

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        effect = self.run.state["effects"].get(key) or {}
        if key == self.kill_key and self.window == 5 and effect.get("state") == "acknowledged":
            die()
        return self.inner.observe(key, payload)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--keys", required=True)
    parser.add_argument("--owner", default="worker")
    parser.add_argument("--ttl", type=float, default=300.0)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--retention-seconds", type=float, default=None)
    parser.add_argument("--kill-window", type=int, choices=(1, 2, 3, 4, 5), default=None)
    parser.add_argument("--kill-key", default=None)
    args = parser.parse_args(argv)
    options: Dict[str, Any] = {}
    if args.kill_window == 1:
        options["fs"] = TearingFileSystem(args.kill_key)
    run = Run.open(os.path.abspath(args.run), **options)
    try:
        lease = run.acquire(args.owner, args.ttl)
        emit({"event": "acquired", "epoch": lease["epoch"]})
        inner = TicketAdapter(args.url, retention_seconds=args.retention_seconds, timeout=args.timeout, run_id=args.run_id)
        adapter: Any = WindowAdapter(inner, run, args.kill_window, args.kill_key) if args.kill_window in (2, 3, 4, 5) else inner
        for key in args.keys.split(","):
            effect = run.drive_effect(key, payload_for(key), adapter)
            emit({"key": key, "state": effect["state"], "attempts": effect["attempts"]})
        run.release()
    except RunnerError as exc:
        emit({"error": exc.reason, "message": exc.message})
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
