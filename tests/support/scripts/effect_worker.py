"""A worker process for tests/test_effect_windows.py: drives ticket effects, and can die at one commit window.

    python effect_worker.py --run DIR --url URL --run-id ID --keys K1,K2 [--kill-window N --kill-key K]

It takes the run's lease (owner ``worker`` unless ``--owner``; re-acquiring
under the same owner always takes a higher epoch, which fences any earlier
process that used it), then drives each key to ``verified`` through
``Run.drive_effect`` and a :class:`~runner.proof.ticketservice.TicketAdapter`.
With ``--kill-window`` it SIGKILLs itself at that window of ``--kill-key``,
through observer from :mod:`runner.proof.faults` (:data:`KILLS`):

1. while the journal append that commits ``started`` is half written
2. after ``started`` is committed, before the request is sent
3. after the service committed, when the answer was lost (``drop_after_commit`` armed just before)
4. after the answer was read, before the ack is committed
5. after the ack is committed, before the verifying observation

stdout: one JSON object per line (``acquired``, then one per key, or an
``error``). The exit code is the runner's for an expected error, else 0.
"""

import argparse
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional

from runner.base.errors import RunnerError
from runner.proof.faults import KillAt, LoseAnswerThenKill, lose_next_answer
from runner.proof.ticketservice import TicketAdapter
from runner.execution.run import Run
from runner.base.windows import Observer


def payload_for(key: str) -> Dict[str, Any]:
    """The payload of the ticket for ``key``; its marker is the key, so duplicates show in the stats."""
    return {"marker": key, "title": f"ticket for {key}"}


def emit(obj: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


#: Window number -> the observer that kill the worker there, given the key and the service's URL.
KILLS: Dict[int, Callable[[str, str], Observer]] = {
    1: lambda key, url: KillAt("store:before-append", after=("effect:before-started", 1, {"key": key}), tear=True),
    2: lambda key, url: KillAt("effect:after-started", where={"key": key}),
    3: lambda key, url: LoseAnswerThenKill(KillAt("effect:after-call", where={"key": key}), lambda: lose_next_answer(url)),
    4: lambda key, url: KillAt("effect:after-call", where={"key": key}),
    5: lambda key, url: KillAt("effect:after-ack", where={"key": key}),
}


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
    if args.kill_window is not None:
        options["observer"] = KILLS[args.kill_window](args.kill_key, args.url)
    run = Run.open(os.path.abspath(args.run), **options)
    try:
        lease = run.acquire(args.owner, args.ttl)
        emit({"event": "acquired", "epoch": lease["epoch"]})
        inner = TicketAdapter(args.url, retention_seconds=args.retention_seconds, timeout=args.timeout, run_id=args.run_id)
        for key in args.keys.split(","):
            effect = run.drive_effect(key, payload_for(key), inner)
            emit({"key": key, "state": effect["state"], "attempts": effect["attempts"]})
        run.release()
    except RunnerError as exc:
        emit({"error": exc.reason, "message": exc.message})
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
