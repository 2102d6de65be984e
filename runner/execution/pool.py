"""``work``: a pool of worker processes that claim runs of one store with leases.

Each worker lists the store's runs (for ``file:ROOT``, the run folders under ROOT), and for each one that is not
finished takes the lease through the recovery procedure (another live holder means it
moves on), hands the run to a handler, and releases the lease after the
handler's last durable write. Fencing keeps a worker that lost its lease
from writing; the lease keeps two live workers off one run.

The supervisor starts the workers, watches them, and when one dies breaks
the leases it held (it saw the process end) and starts a fresh worker with a
new owner id in its place, until every run is finished or no worker can make
progress. A worker that lives on holding a lease it no longer renews (a call
that never returns, a deadlock) is stuck: fenced already, it could hold its
place for ever, so the supervisor kills it and it is replaced like any other
dead worker. A handler is ``module:function`` called as ``handler(store, owner,
ttl, context)`` for each claimed run and returning an outcome word. A observer
factory (``module:function``, called as ``factory(context, seed)`` once in
each worker) gives the observer every store the worker opens is handed, so it
sees each commit window (:mod:`runner.base.windows`); ``on_line`` sees every line
a worker prints and ``on_exit`` every worker that ended. The pool itself
neither injects faults nor judges the results: that is its caller's business.
"""

import gc
import importlib
import json
import os
import random
import re
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional

from ..base.errors import InvalidInput, RunnerError
from ..ledger.lease import lease_view
from .run import Run
from ..stores import list_runs, open_store, run_url
from ..base.host import local_maker
from ..base.windows import NO_OBSERVER, Observer

# selectors and subprocess are imported where the supervisor uses them: a worker, started once per process the
# pool runs, needs neither.
if TYPE_CHECKING:
    import subprocess

__all__ = ["PoolOptions", "run_pool", "load_handler", "worker_main"]

TERMINAL = ("complete", "cancelled", "blocked", "failed")


def load_handler(spec: str, what: str = "handler") -> Callable[..., Any]:
    """The callable ``module:function`` names; :class:`InvalidInput` when there is none.

    The module is looked for on the path, then in the working folder, as
    ``python3 -m`` would find it there: the runner started by its folder's
    path (``python3 path/to/runner``) has the working folder nowhere on its
    path. Last, so that a file there never stands in for a module the runner imports.
    """
    module_name, _, name = spec.partition(":")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)
    try:
        handler = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidInput(f"cannot load {what} {spec!r}: {exc}") from None
    if not callable(handler):
        raise InvalidInput(f"{what} {spec!r} is not callable")
    return handler


def worker_main(argv: List[str]) -> int:
    """One pool worker: claim runs one after another until none is left for it."""
    opts = json.loads(argv[0])
    handler = load_handler(opts["handler"])
    context = opts.get("context", {})
    observer: Observer = (load_handler(opts["observer"], "observer factory")(context, opts["seed"])
                          if opts.get("observer") else NO_OBSERVER)
    rng = random.Random(opts.get("seed"))
    while True:
        progressed = False
        tasks = list_runs(opts["store"])
        rng.shuffle(tasks)
        for task in tasks:
            try:
                store = open_store(run_url(opts["store"], task), task, observer=observer)
            except RunnerError as exc:
                print(f"error {task} {exc.reason}", flush=True)
                continue
            if store.state["status"] in TERMINAL:
                continue
            print(f"claim {task}", flush=True)  # the supervisor watches this run's lease until the outcome line
            outcome = handler(store, opts["owner"], float(opts["ttl"]), context)
            print(f"outcome {task} {outcome}", flush=True)
            if outcome not in ("already-running",):
                progressed = True
        if not progressed:
            return 0


def _spawn(opts: Dict[str, Any]) -> "subprocess.Popen[str]":
    import subprocess

    from ..base.paths import PACKAGE_PARENT as parent

    env = dict(os.environ)
    env["PYTHONPATH"] = parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.Popen([sys.executable, "-m", "runner.execution.pool", "--worker", json.dumps(opts)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


class PoolOptions(NamedTuple):
    """How a pool's workers are started. Each field is passed to every worker or read by the supervisor."""

    context: Optional[Dict[str, Any]] = None  # given to the handler of every run, as ``context``
    ttl: float = 60.0  # the lease's time to live of each worker; the supervisor looks every ttl / 2
    seed: int = 1  # draws each worker's own seed, so a pool's run is replayable
    observer: Optional[str] = None  # a ``module:function`` observer factory for each worker (see the module docs)
    max_generations: int = 10000  # the most workers started in all, replacements included


def run_pool(store_url: str, workers: int, handler: str, options: PoolOptions = PoolOptions(), *,
             on_line: Optional[Callable[[str], None]] = None, on_exit: Optional[Callable[[str, int], None]] = None,
             tally: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run ``workers`` processes over the store's runs, replacing any that are killed; return the tally.

    ``on_line`` gets each line a worker prints. ``on_exit(owner, exit code)`` is called after each worker
    ended, once the leases of a killed one are broken. The tally counts
    ``workers`` started, ``crashes`` (workers ended by SIGKILL, each
    replaced), ``stuck`` (those of them the supervisor killed: every
    ``ttl / 2`` seconds it reads the lease of the run each worker is in the
    handler for, between its ``claim`` and ``outcome`` lines, and kills a
    worker whose lease there is no longer live) and lists ``errors``
    (workers that failed otherwise).
    """
    import selectors

    context, ttl, observer, max_generations = options.context, options.ttl, options.observer, options.max_generations
    rng = random.Random(options.seed)
    tally = tally if tally is not None else {}
    tally.update({"workers": 0, "crashes": 0, "stuck": 0, "errors": []})
    generation = 0
    # Owner ids unique across supervisors: pools on several hosts share one database, and a lease is
    # granted at once to a caller whose id is the holder's, so two pools' "w1" would share every run.
    supervisor = f"pool-{re.sub(r'[^A-Za-z0-9.-]', '-', local_maker()['host'])[:60]}-{os.getpid()}"
    live: Dict[int, Dict[str, Any]] = {}
    sel = selectors.DefaultSelector()

    def start() -> None:
        nonlocal generation
        generation += 1
        opts: Dict[str, Any] = {"store": store_url, "handler": handler, "observer": observer,
                                "owner": f"{supervisor}-w{generation}", "ttl": ttl,
                                "context": context or {}, "seed": rng.randrange(1 << 30)}
        proc = _spawn(opts)
        tally["workers"] += 1
        live[proc.pid] = {"proc": proc, "owner": opts["owner"]}
        assert proc.stdout is not None
        sel.register(proc.stdout, selectors.EVENT_READ, proc.pid)

    for _ in range(workers):
        start()
    check_at = time.monotonic() + ttl / 2
    while live and generation <= max_generations:
        if time.monotonic() >= check_at:
            for watched in live.values():
                if watched.get("claim") and not watched.get("stuck") \
                        and _stuck(watched, _lease(store_url, watched["claim"], time.time())):
                    watched["stuck"] = True
                    watched["proc"].kill()  # its end is read below, as any killed worker's is
            # after the reads: a slow store never makes the checks run back to back
            check_at = time.monotonic() + ttl / 2
        for key, _ in sel.select(timeout=max(0.0, check_at - time.monotonic())):
            worker = live.get(key.data)
            if worker is None:
                continue
            line = worker["proc"].stdout.readline()
            if line:
                words = line.split()
                if words[:1] in (["claim"], ["outcome"]) and len(words) >= 2:
                    worker["claim"], worker["held"] = (words[1] if words[0] == "claim" else None), None
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
                tally["stuck"] += bool(worker.get("stuck"))
                _break_leases(store_url, worker["owner"])
            elif code != 0:
                tally["errors"].append(f"{worker['owner']} exited {code}: {stderr.strip()[-400:]}")
            if on_exit is not None:
                on_exit(worker["owner"], code)
            if code == -signal.SIGKILL:
                start()
    sel.close()
    return tally


def _lease(store_url: str, task: str, now: float) -> Optional[Dict[str, Any]]:
    """The lease of ``task`` as :func:`~runner.ledger.lease.lease_view` gives it, or None if the run cannot be read
    now."""
    try:
        store = open_store(run_url(store_url, task), task)
    except (RunnerError, OSError, ValueError):
        return None  # being created, removed or damaged: looked at again ttl / 2 later
    try:
        return lease_view(store.state, now)
    except (KeyError, TypeError, ValueError):
        return None
    finally:
        store.close()


def _stuck(worker: Dict[str, Any], lease: Optional[Dict[str, Any]]) -> bool:
    """Whether ``worker``, in the handler for the run whose ``lease`` this is, has stopped keeping it.

    Only a lease the supervisor saw it hold, live, since its ``claim`` counts:
    stuck once that lease expired in its hands or a later acquire passed its
    epoch (fenced, and it did not return). Checks every ``ttl / 2`` see each
    lease live at least once. A lease given back, or one it held before this
    claim, says nothing.
    """
    if lease is None:
        return False
    if lease["owner"] == worker["owner"] and lease["live"]:
        worker["held"] = int(lease["epoch"])
        return False
    held = worker.get("held")
    return held is not None and (lease["owner"] == worker["owner"] or int(lease["epoch"]) > held)


def _break_leases(store_url: str, owner: str) -> None:
    """End every lease the dead worker held: the supervisor saw its process end."""
    for task in list_runs(store_url):
        store = open_store(run_url(store_url, task), task)
        try:
            if store.state["lease"]["owner"] == owner:
                Run(store).break_lease("pool-supervisor", f"{owner} was killed")
        finally:
            store.close()


if __name__ == "__main__":
    if sys.argv[1:2] != ["--worker"]:
        sys.exit(2)
    code = worker_main(sys.argv[2:])
    gc.freeze()  # as the command line does (runner/__main__.py): no last walk of every object on the way out
    sys.exit(code)
