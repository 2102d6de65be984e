"""How long each harness hook takes on a large run, next to a bare interpreter start.

    python3 bench/hooks.py [--effects 10000] [--rounds 7]

Builds a run of ``--effects`` verified effects (one step running, the lease
held by the session), then runs each hook script (``hooks/*.py``) as Claude
Code would, a separate process fed the event on stdin, ``--rounds`` times,
and prints the median and the slowest wall time of each, with its ratio to
the median of ``python3 -c "import runner.surfaces.hooks"`` measured in the same run.
Standard library only; everything is made in a temporary folder and removed.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from runner.contract.text import load_contract  # noqa: E402
from runner.execution.run import Run  # noqa: E402
from runner.stores.file import RunStore  # noqa: E402

SESSION = "bench-session"
EVENTS = {
    "session_start": {"hook_event_name": "SessionStart", "source": "resume"},
    "stop": {"hook_event_name": "Stop", "stop_hook_active": False},
    "pre_compact": {"hook_event_name": "PreCompact", "trigger": "auto"},
    "session_end": {"hook_event_name": "SessionEnd", "reason": "other"},
}


def build(project: str, effects: int) -> None:
    path = os.path.join(project, ".run")
    plan = load_contract(os.path.join(ROOT, "templates", "run-contract.example.md"))
    RunStore.create(path, plan["task_id"], plan, durability="process")
    run = Run.open(path, durability="process")
    run.acquire(f"claude-{SESSION}", 3600)
    run.step_start("draft")
    run.effect_begin("seed", {"n": 0}, step="draft")
    record = run.effect_verify("seed", {"seen": True})
    for start in range(0, effects, 1000):
        run.store.commit([["set", ["effects", f"doc-{i:06d}"], dict(record)]
                          for i in range(start, min(start + 1000, effects))], epoch=run.epoch or 0)


def timed(argv, stdin: str = "") -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if done.returncode != 0 or done.stderr:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-hooks-")
    try:
        project = os.path.join(tmp, "project")
        os.mkdir(project)
        build(project, args.effects)
        baseline = [sys.executable, "-c", "import runner.surfaces.hooks"]
        base = statistics.median(timed(baseline) for _ in range(args.rounds))
        print(f"run of {args.effects + 1} effects; baseline (start python, import runner.surfaces.hooks): "
              f"{base * 1000:.0f} ms")
        print(f"{'hook':<14} {'median ms':>10} {'max ms':>8} {'x baseline':>11}")
        for name, event in EVENTS.items():
            payload = json.dumps(dict(event, session_id=SESSION, transcript_path=None, cwd=project))
            rounds = 1 if name == "session_end" else args.rounds  # it releases the lease: once
            times = [timed([sys.executable, os.path.join(ROOT, "hooks", f"{name}.py")], payload) for _ in range(rounds)]
            median = statistics.median(times)
            print(f"{name:<14} {median * 1000:>10.0f} {max(times) * 1000:>8.0f} {median / base:>11.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
