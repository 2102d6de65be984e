"""A worker process for tests/test_smtp_adapter.py: sends one key's message through the SMTP adapter, as a drive does.

    python -m tests.support.scripts.smtp_worker --run DIR --host H --port P --key K [--timeout S] [--owner O]

It takes the run's lease (a higher epoch than any before it) and takes the
key's effect as far as it goes through ``Run.drive_effect`` and a
:class:`~runner.adapters.smtp.SmtpAdapter` (no TLS, no login, to a stand-in
on loopback), with the run's id for the Message-ID. stdout: one JSON object
per line, ``acquired`` then the key's state, or the ``error`` that stopped it;
the exit code is the runner's for that error, else 0.
"""

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

from runner.adapters.smtp import SmtpAdapter
from runner.base.errors import RunnerError
from runner.execution.run import Run


def payload_for(key: str) -> Dict[str, Any]:
    """The message of ``key``: the test makes the same one."""
    return {"subject": f"released: {key}", "text": f"The release {key} is out.\n"}


def spec_for(host: str, port: int) -> Dict[str, Any]:
    return {"host": host, "port": port, "security": "none", "from": "Releases <releases@example.test>",
            "to": ["team@example.test"], "not_now_seconds": 0.05}


def emit(obj: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--owner", default="worker")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    run = Run.open(os.path.abspath(args.run))
    try:
        lease = run.acquire(args.owner, 300.0)
        emit({"event": "acquired", "epoch": lease["epoch"]})
        adapter = SmtpAdapter(spec_for(args.host, args.port), values={"run_id": run.state["task_id"]},
                              timeout=args.timeout)
        effect = run.drive_effect(args.key, payload_for(args.key), adapter)
        emit({"key": args.key, "state": effect["state"]})
        run.release()
    except RunnerError as exc:
        emit({"error": exc.reason, "message": exc.message})
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
