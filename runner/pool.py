"""``work``: a pool of worker processes that claim runs of one store with leases.

Each worker lists the store's runs (for ``file:ROOT``, the run folders under ROOT), and for each one that is not finished
takes the lease through the recovery procedure (another live holder means it
moves on), hands the run to a handler, and releases the lease after the
handler's last durable write. Fencing keeps a worker that lost its lease
from writing; the lease keeps two live workers off one run.

The supervisor starts the workers, watches them, and when one dies breaks
the leases it held (it saw the process end) and starts a fresh worker with a
new owner id in its place, until every run is finished or no worker can make
progress. A handler is ``module:function`` taking ``(store, owner, ttl,
context, switch)`` and returning an outcome word; it prints ``ack TASK REV``
lines for each revision it saw acknowledged, so the supervisor can check
that no acknowledged commit is ever lost.
"""

import importlib
import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

from .proof.campaign import KillSwitch
from .errors import InvalidInput, RunnerError
from .run import Run
from .stores import list_runs, open_store, run_url

__all__ = ["run_pool", "load_handler", "worker_main"]

TERMINAL = ("complete", "cancelled", "blocked", "failed")


def load_handler(spec: str) -> Callable[..., str]:
    module_name, _, name = spec.partition(":")
    try:
        handler = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise InvalidInput(f"cannot load handler {spec!r}: {exc}") from None
    if not callable(handler):
        raise InvalidInput(f"handler {spec!r} is not callable")
    return handler  # type: ignore[no-any-return]


def worker_main(argv: List[str]) -> int:
    """One pool worker: claim runs one after another until none is left for it."""
    opts = json.loads(argv[0])
    handler = load_handler(opts["handler"])
    switch = KillSwitch(opts.get("window"), int(opts.get("nth") or 0))
    rng = random.Random(opts.get("seed"))
    while True:
        progressed = False
        tasks = list_runs(opts["store"])
        rng.shuffle(tasks)
        for task in tasks:
            try:
                store = open_store(run_url(opts["store"], task), task)
            except RunnerError as exc:
                print(f"error {task} {exc.reason}", flush=True)
                continue
            if store.state["status"] in TERMINAL:
                continue
            outcome = handler(store, opts["owner"], float(opts["ttl"]), opts.get("context", {}), switch)
            print(f"outcome {task} {outcome}", flush=True)
            if outcome not in ("already-running",):
                progressed = True
        if not progressed:
            return 0


def _spawn(opts: Dict[str, Any]) -> "subprocess.Popen[str]":
    env = dict(os.environ)
    parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.Popen([sys.executable, "-m", "runner.pool", "--worker", json.dumps(opts)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def run_pool(store_url: str, workers: int, handler: str, *, context: Optional[Dict[str, Any]] = None, ttl: float = 60.0, seed: int = 1,
             crash_rate: float = 0.0, windows: Optional[List[str]] = None, on_line: Optional[Callable[[str], None]] = None,
             max_generations: int = 10000, tally: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run ``workers`` processes over the store's runs, replacing any that die; return the tally.

    With ``crash_rate`` > 0 each worker is given a life (geometric, in effects)
    after which it kills itself at one of ``windows``; one in five is killed
    from outside at a random moment instead.
    """
    import math

    rng = random.Random(seed)
    tally = tally if tally is not None else {}
    tally.update({"workers": 0, "crashes": 0, "timer_kills": 0, "lost_commits": 0, "errors": []})
    acked: Dict[str, int] = {}
    generation = 0
    live: Dict[int, Dict[str, Any]] = {}
    sel = selectors.DefaultSelector()

    def start() -> None:
        nonlocal generation
        generation += 1
        opts: Dict[str, Any] = {"store": store_url, "handler": handler, "owner": f"pool-w{generation}", "ttl": ttl, "context": context or {}, "seed": rng.randrange(1 << 30)}
        deadline = None
        if crash_rate > 0 and windows:
            life = int(math.log(1.0 - rng.random()) / math.log(1.0 - crash_rate)) + 1
            if rng.random() < 0.8:
                opts["window"], opts["nth"] = rng.choice(windows), life
            else:
                deadline = time.monotonic() + rng.uniform(0.2, 0.2 + life * 0.004)
        proc = _spawn(opts)
        tally["workers"] += 1
        live[proc.pid] = {"proc": proc, "owner": opts["owner"], "deadline": deadline, "window": opts.get("window")}
        assert proc.stdout is not None
        sel.register(proc.stdout, selectors.EVENT_READ, proc.pid)

    for _ in range(workers):
        start()
    while live and generation <= max_generations:
        deadlines = [w["deadline"] for w in live.values() if w["deadline"] is not None]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        events = sel.select(timeout)
        now = time.monotonic()
        for worker in list(live.values()):
            if worker["deadline"] is not None and now >= worker["deadline"]:
                worker["deadline"] = None
                worker["proc"].kill()  # a kill from outside, at a random moment
                tally["timer_kills"] += 1
        for key, _ in events:
            worker = live.get(key.data)
            if worker is None:
                continue
            line = worker["proc"].stdout.readline()
            if line:
                words = line.split()
                if words[:1] == ["ack"] and len(words) >= 3:
                    acked[words[1]] = max(acked.get(words[1], 0), int(words[2]))
                if on_line is not None:
                    on_line(line)
                continue
            sel.unregister(worker["proc"].stdout)
            code = worker["proc"].wait()
            worker["proc"].stdout.close()
            stderr = worker["proc"].stderr.read() if worker["proc"].stderr else ""
            if worker["proc"].stderr:
                worker["proc"].stderr.close()
            del live[key.data]
            if code == -signal.SIGKILL:
                tally["crashes"] += 1
                _after_death(store_url, worker["owner"], acked, tally)
                start()
            elif code != 0:
                tally["errors"].append(f"{worker['owner']} exited {code}: {stderr.strip()[-400:]}")
    sel.close()
    return tally


def _after_death(store_url: str, owner: str, acked: Dict[str, int], tally: Dict[str, Any]) -> None:
    """Break the dead worker's leases and check that nothing it saw acknowledged was lost."""
    for task in list_runs(store_url):
        store = open_store(run_url(store_url, task), task)
        if store.revision < acked.get(task, 0):
            tally["lost_commits"] += acked[task] - store.revision
        if store.state["lease"]["owner"] == owner:
            Run(store).break_lease("pool-supervisor", f"{owner} was killed")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit(2)
