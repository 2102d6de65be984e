"""``demo``: a 2,000-document run whose workers are killed, resumed, and audited.

Each document makes one non-transactional external effect: a ticket on the
loopback ticket service (its own process, its own SQLite ledger). Worker
processes drive the effects through the runner. The orchestrator kills them
with SIGKILL, both at random moments (a timer) and at named commit windows
(the worker kills itself there, including after the ticket service committed
but before the runner recorded it), and starts a fresh worker with a new
owner id, which takes the lease at a higher epoch and resumes.

At the end it audits the result against an uncrashed reference run over the
same documents: every document holds exactly one ticket, each ticket holds
the document's payload, every effect is verified, and no acknowledged
revision was lost. Exit code 0 only when there are no duplicates, no losses
and the output matches the reference.

``--cancel-at N`` cancels the run after N documents and shows it stops
within one step. ``--scenario draft`` replays the three-node experiment
(plan, write_draft, finish) with a crash after the tool committed and
before the checkpoint.
"""

import json
import math
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, IO, List, Optional

from ..base.canonical import content_digest, sha256_hex
from ..base.errors import Cancelled, RunnerError
from ..execution.recovery import recover
from ..execution.run import Run
from ..base.errors import InvalidInput
from ..surfaces.history import load as load_history
from ..ledger.states import UNRESOLVED
from ..surfaces.timeline import write as write_timeline
from ..stores import create_store, list_runs, open_store, parse_store_url, run_url
from ..stores.file import RunStore
from ..base.windows import NO_OBSERVER, Observer
from . import PACKAGE_PARENT
from .campaign import KILL_POINTS
from .faults import KillAfterSeconds, die, kill_point, lose_next_answer
from .ticketservice import TicketAdapter, TicketServiceProcess

__all__ = ["run_demo", "run_draft_scenario", "WINDOWS", "worker_main", "shard_handler", "worker_faults"]

#: Where a worker may be told to die: the kill points one effect passes, in order.
WINDOWS = tuple(p for p in KILL_POINTS if p.startswith("effect:"))

TASK = "demo-documents"
TTL = 60.0


def demo_contract(documents: int) -> Dict[str, Any]:
    return {
        "contract": 1,
        "task_id": TASK,
        "goal": f"File one ticket per document for {documents} documents, each exactly once, then write the index.",
        "completion_evidence": ["every effect verified at the ticket service", "index file hash"],
        "steps": [
            {"id": "ingest", "artifact": "one ticket per document", "check": "each ticket found by key",
             "evidence": ["verified"], "next": "index"},
            {"id": "index", "artifact": "index.json", "check": "sha256 of the index", "evidence": ["sha256"],
             "next": "done"},
        ],
        "effects": {"key_pattern": "doc-[0-9]{5}:ticket", "adapter": "ticket service with Idempotency-Key",
                    "verification": "lookup by key"},
        "limits": {"max_effect_attempts": 6, "max_step_attempts": 1000},
        "retry": {"base_seconds": 0.01, "cap_seconds": 0.1},
        "lease": {"ttl_seconds": TTL},
    }


def document_payload(n: int) -> Dict[str, Any]:
    """The effect payload of document ``n``: derived from the document alone, so reruns agree."""
    body = f"document {n}: quarterly record {n * 7919 % 100003}".encode()
    return {"doc": f"doc-{n:05d}", "marker": f"doc-{n:05d}", "title": f"Review of document {n}",
            "sha256": sha256_hex(body)}


def doc_key(n: int) -> str:
    return f"doc-{n:05d}:ticket"


# -- the worker (a separate process) -------------------------------------------------------

def _ticket_of(effect: Dict[str, Any]) -> Optional[str]:
    """The ticket id an effect was verified with (from its evidence, else its receipt)."""
    for record in (effect.get("evidence") or {}, effect.get("receipt") or {}):
        if record.get("ticket"):
            return str(record["ticket"])
    return None


def _say(*words: Any) -> None:
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def verified_documents(run: Run, docs: range) -> int:
    """How many of ``docs`` the run holds verified: the documents done, whoever verified them (a driver or a
    recovery)."""
    return sum(1 for n in docs if (run.state["effects"].get(doc_key(n)) or {}).get("state") == "verified")


def taken_over(run: Run) -> int:
    """The run's lease takeovers so far: the recoveries the demo's table counts."""
    return int(run.state["counters"].get("recoveries", 0))


def drive_documents(run: Run, adapter: Any, docs: range, report: Callable[[int, Any, int], None]) -> None:
    """Take ``docs`` of a recovered run through ingest and index.

    ``report(revision, document, verified)`` follows each acknowledged
    revision; ``verified`` counts the ``docs`` verified in the run then (see
    :func:`verified_documents`), so it never decreases from one report to the next.
    """
    verified = verified_documents(run, docs)
    if (run.state["steps"].get("ingest") or {}).get("state") != "done":
        if run.state["current_step"] != "ingest":
            run.step_start("ingest")
        renew_at = time.monotonic() + TTL / 3
        for n in docs:
            key = doc_key(n)
            effect = run.state["effects"].get(key)
            if effect is not None and effect["state"] == "verified":
                continue
            run.drive_effect(key, document_payload(n), adapter, step="ingest")
            verified += 1
            report(run.state["revision"], n, verified)
            if time.monotonic() > renew_at:
                run.renew(TTL)
                renew_at = time.monotonic() + TTL / 3
        run.step_done("ingest", {"verified": len(docs)})
    index = {doc_key(n): _ticket_of(run.state["effects"][doc_key(n)]) for n in docs}
    if run.state["current_step"] != "index":
        run.step_start("index")
    run.step_done("index", {"sha256": content_digest(index)})
    report(run.state["revision"], "index", verified)


def _payload_of(key: str) -> Dict[str, Any]:
    return document_payload(int(key[4:9]))


def worker_main(argv: List[str]) -> int:
    """One worker of the single-run demo: recover, drive every document, finish; report on stdout."""
    opts = json.loads(argv[0])
    nth, point = opts["die_at"] if opts.get("die_at") else (0, None)
    observer = kill_point(point, nth, lose_answer=lambda: lose_next_answer(opts["url"])) if point else NO_OBSERVER
    options = {"compact_min_bytes": opts["compact_min_bytes"]} if opts.get("compact_min_bytes") else {}
    store = RunStore.open(opts["run"], durability=opts.get("durability", "sync"), observer=observer, **options)
    run = Run(store, rand=random.Random(opts["seed"]).random)
    adapter = TicketAdapter(opts["url"], retention_seconds=None, timeout=5.0, run_id=TASK)
    _say("loaded", run.state["revision"])
    decision = recover(run, opts["owner"], TTL, adapter_for=lambda key, effect: adapter, payloads=_payload_of)
    _say("lease", run.epoch, run.state["revision"], taken_over(run), verified_documents(run, range(opts["documents"])))
    if decision["decision"] == "stop":
        _say("stop", decision["reason"])
        return 0 if decision["reason"] == "complete" else 5 if decision["reason"] == "cancelled" else 1
    try:
        def report(rev: int, n: Any, verified: int) -> None:
            _say("ack", rev, n, verified)
            if opts.get("hold_at") is not None and n == opts["hold_at"] - 1:
                _say("held")  # the supervisor cancels now, then lets this worker go on
                sys.stdin.readline()

        drive_documents(run, adapter, range(opts["documents"]), report)
        run.release()
        _say("done", run.state["status"])
        return 0
    except Cancelled as exc:
        _say("cancelled", exc.message.replace("\n", " "))
        return 5
    except RunnerError as exc:
        _say("error", exc.reason, exc.message.replace("\n", " "))
        return exc.exit_code


def shard_handler(store: Any, owner: str, ttl: float, context: Dict[str, Any]) -> str:
    """The pool's handler for one shard run of the demo (``runner work --handler runner.proof.demo:shard_handler``).

    Prints ``lease TASK RECOVERIES VERIFIED`` once recovered, then ``ack TASK
    REVISION DOCUMENT VERIFIED`` after each acknowledged effect, so the demo
    can check that no acknowledged commit is lost and show its progress.
    """
    task = store.state["task_id"]
    run = Run(store)
    adapter = TicketAdapter(context["url"], retention_seconds=None, timeout=5.0, run_id=task)
    size, total = int(context["shard_size"]), int(context["documents"])
    shard = int(task.rsplit("-", 1)[1])
    docs = range(shard * size, min(total, (shard + 1) * size))
    decision = recover(run, owner, ttl, adapter_for=lambda key, effect: adapter, payloads=_payload_of)
    _say("lease", task, taken_over(run), verified_documents(run, docs))
    if decision["decision"] == "stop" and decision["reason"] != "needs-reconciliation":
        return str(decision["reason"])
    try:
        drive_documents(run, adapter, docs, lambda rev, n, verified: _say("ack", task, rev, n, verified))
    except RunnerError as exc:
        return exc.reason
    run.release()
    return str(run.state["status"])


def worker_faults(context: Dict[str, Any], seed: int) -> Observer:
    """The pool's observer factory (``observer="runner.proof.demo:worker_faults"``): how this worker will die.

    With ``context["crash_rate"]`` > 0 the worker's life is geometric in
    effects; four times in five it then dies at one of :data:`WINDOWS`,
    otherwise at a random moment. It prints ``fault POINT`` (or ``fault
    timer``) just before, so the demo can count where workers died.
    """
    rate = float(context.get("crash_rate") or 0.0)
    if rate <= 0:
        return NO_OBSERVER
    rng = random.Random(seed)
    life = int(math.log(1.0 - rng.random()) / math.log(1.0 - rate)) + 1
    if rng.random() < 0.8:
        return kill_point(rng.choice(WINDOWS), life, lose_answer=lambda: lose_next_answer(context["url"]),
                          on_kill=lambda p: _say("fault", p))
    return KillAfterSeconds(rng.uniform(0.2, 0.2 + life * 0.004), on_kill=lambda _p: _say("fault", "timer"))


# -- the orchestrator ----------------------------------------------------------------------

class _Progress:
    """The bar on the stream: documents verified, crashes, recoveries (lease takeovers) and rate.

    While the run goes, the figures are what the workers last reported; the
    final line is drawn from the audited result, so it shows the figures the
    table shows.
    """

    def __init__(self, total: int, stream: IO[str], enabled: bool) -> None:
        self.total, self.stream, self.enabled = total, stream, enabled
        self.tty = enabled and stream.isatty()
        self.start = time.monotonic()
        self.last = 0.0
        self.last_done = -1

    def show(self, done: int, crashes: int, recoveries: int, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        step = max(1, self.total // 10)
        if not final and ((self.tty and now - self.last < 0.1) or
                          (not self.tty and done // step == self.last_done // step)):
            return
        self.last, self.last_done = now, done
        rate = done / max(now - self.start, 1e-9)
        filled = int(30 * done / max(self.total, 1))
        line = (f"[{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} documents | crashes {crashes} | "
                f"recoveries {recoveries} | {rate:.0f} docs/s")
        self.stream.write(("\r" + line + ("\n" if final else "")) if self.tty else line + "\n")
        self.stream.flush()


def _spawn_worker(opts: Dict[str, Any]) -> "subprocess.Popen[str]":
    env = dict(os.environ)
    parent = PACKAGE_PARENT
    env["PYTHONPATH"] = parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    stdin = subprocess.PIPE if opts.get("hold_at") is not None else subprocess.DEVNULL
    # -S: the worker imports only this package (standard library only, found through PYTHONPATH); site would lengthen
    # each start.
    return subprocess.Popen([sys.executable, "-S", "-m", "runner.proof.demo", "--worker", json.dumps(opts)],
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _run_workers(run_path: str, url: str, documents: int, seed: int, crash_rate: float, cancel_at: Optional[int],
                 progress: Optional[_Progress], max_workers: int = 100000, durability: str = "sync",
                 compact_bytes: Optional[int] = None) -> Dict[str, Any]:
    """Start workers one after another until the run stops; kill them as the plan says."""
    rng = random.Random(seed)
    # Counts, the revision of the operator's cancel (or None) and the workers' errors: what the run reports.
    tally: Dict[str, Any] = {"crashes": 0, "window_kills": 0, "timer_kills": 0, "workers": 0, "lost_commits": 0,
                             "crashes_without_lease": 0, "cancel_revision": None, "errors": []}
    last_acked = 0
    done = 0  # documents verified, as the workers last reported
    recoveries = 0  # lease takeovers, as the workers read them once they held the lease
    generation = 0
    while generation < max_workers:
        generation += 1
        die_at = None
        timer = None
        if crash_rate > 0:
            # The worker's life in documents is geometric (a crash_rate chance at
            # each one). Most deaths happen at a named commit window; one in five
            # is a kill from outside at a random moment instead.
            life = int(math.log(1.0 - rng.random()) / math.log(1.0 - crash_rate)) + 1
            if rng.random() < 0.8:
                die_at = (life, rng.choice(WINDOWS))
            else:
                timer = rng.uniform(0.2, 0.2 + life * 0.004)
        opts = {"run": run_path, "url": url, "documents": documents, "owner": f"worker-{generation}",
                "seed": rng.randrange(1 << 30), "die_at": die_at, "durability": durability,
                "compact_min_bytes": compact_bytes,
                # The operator's cancel lands between two documents: the worker waits there for it.
                "hold_at": cancel_at if cancel_at is not None and tally["cancel_revision"] is None else None}
        proc = _spawn_worker(opts)
        tally["workers"] += 1
        started = time.monotonic()
        assert proc.stdout is not None
        outcome = None
        pending = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                wait = None if timer is None else max(0.0, started + timer - time.monotonic())
                if not sel.select(wait):
                    proc.kill()  # the timer: a kill at a random moment
                    tally["timer_kills"] += 1
                    timer = None
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)  # not readline: select must see every line not yet handled
                if not chunk:
                    break
                *complete, pending = (pending + chunk).split(b"\n")
                for raw in complete:
                    word, *rest = raw.decode("utf-8", "replace").split() or [""]
                    if word == "loaded":
                        if int(rest[0]) < last_acked:
                            tally["lost_commits"] += last_acked - int(rest[0])
                    elif word == "lease":
                        recoveries, done = max(recoveries, int(rest[2])), max(done, int(rest[3]))
                    elif word == "ack":
                        last_acked = max(last_acked, int(rest[0]))
                        done = max(done, int(rest[2]))
                    elif word == "held":
                        if tally["cancel_revision"] is None:
                            state = Run(RunStore.open(run_path)).cancel(
                                "demo-operator", f"the job became obsolete after {cancel_at} documents")
                            tally["cancel_revision"] = state["revision"]
                        assert proc.stdin is not None
                        proc.stdin.write("go\n")
                        proc.stdin.flush()
                    elif word in ("done", "stop", "cancelled", "error"):
                        outcome = (word, " ".join(rest))
                        if word == "error":
                            tally["errors"].append(" ".join(rest))
                if progress:
                    progress.show(done, tally["crashes"], recoveries)
        code = proc.wait()
        stderr = proc.stderr.read() if proc.stderr else ""
        for stream in (proc.stdin, proc.stderr, proc.stdout):
            if stream is not None:
                stream.close()
        if code == -signal.SIGKILL:
            tally["crashes"] += 1
            if die_at is not None:
                tally["window_kills"] += 1
            # The supervisor saw the process end: it breaks the lease so the next worker need not wait out the TTL.
            # A worker killed before it took the lease (or after it gave it back) held none: nothing is broken, and no
            # worker takes over from it, so its crash is not a recovery.
            supervisor = Run(RunStore.open(run_path))
            if supervisor.state["lease"].get("owner") != opts["owner"]:
                tally["crashes_without_lease"] += 1
            supervisor.break_lease("demo-supervisor", f"worker-{generation} (pid {proc.pid}) was killed")
            continue
        if outcome is None:
            tally["errors"].append(f"worker-{generation} exited {code}: {stderr.strip()[-500:]}")
            break
        if outcome[0] in ("done", "cancelled") or (outcome[0] == "stop" and outcome[1] in ("complete", "cancelled")):
            break
        if outcome[0] == "error":
            break
    tally["documents_done"] = done
    return tally


def _history_folder(run_path: str) -> Dict[str, int]:
    """The size in bytes and the number of segments of a run folder's history folder."""
    folder = os.path.join(run_path, "history")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    size = sum(os.path.getsize(os.path.join(folder, name)) for name in names)
    return {"history_bytes": size, "history_segments": len(names)}


def _audit(states: List[Dict[str, Any]], service: TicketServiceProcess, documents: int) -> Dict[str, Any]:
    """What the target holds per document, and the runs' merged ledger."""
    stats = service.stats()
    tickets = {}
    for n in range(documents):
        held = service.tickets_for_key(doc_key(n))
        tickets[doc_key(n)] = [t.get("payload_digest") for t in held]
    output = {key: digests[0] for key, digests in tickets.items() if len(digests) == 1}
    effects: Dict[str, Any] = {}
    for state in states:
        effects.update(state["effects"])
    return {"states": states, "effects": effects, "stats": stats, "tickets": tickets, "output": output}


SHARD_SIZE = 100


def _run_sharded(store_url: str, service_url: str, documents: int, seed: int, crash_rate: float, workers: int,
                 progress: Optional[_Progress], shard_size: int = SHARD_SIZE) -> Dict[str, Any]:
    """The documents in runs of ``shard_size`` in one store, driven by a pool of ``workers``."""
    from ..execution.pool import PoolOptions, run_pool

    if list_runs(store_url):
        raise InvalidInput(f"{store_url} already holds runs; the demo needs an empty store")
    kind, location = parse_store_url(store_url)
    if kind == "file":
        os.makedirs(location, mode=0o700, exist_ok=True)  # the folder that holds one folder per run
    for shard in range((documents + shard_size - 1) // shard_size):
        count = min(shard_size, documents - shard * shard_size)
        contract = dict(demo_contract(count), task_id=f"demo-shard-{shard:04d}")
        create_store(run_url(store_url, contract["task_id"]), contract["task_id"], contract).close()
    tally: Dict[str, Any] = {}
    acked: Dict[str, int] = {}  # task -> the highest revision a worker saw acknowledged
    verified: Dict[str, int] = {}  # task -> its documents verified, as the workers last reported
    recoveries: Dict[str, int] = {}  # task -> its lease takeovers, as the workers read them once they held the lease
    audit = {"window_kills": 0, "timer_kills": 0, "lost_commits": 0, "crashes_without_lease": 0}

    def on_line(line: str) -> None:
        words = line.split()
        if words[:1] == ["ack"] and len(words) == 5:
            acked[words[1]] = max(acked.get(words[1], 0), int(words[2]))
            verified[words[1]] = max(verified.get(words[1], 0), int(words[4]))
        elif words[:1] == ["lease"] and len(words) == 4:
            recoveries[words[1]] = max(recoveries.get(words[1], 0), int(words[2]))
            verified[words[1]] = max(verified.get(words[1], 0), int(words[3]))
        elif words[:1] == ["fault"] and len(words) == 2:
            audit["timer_kills" if words[1] == "timer" else "window_kills"] += 1
        if progress and words[:1] in (["ack"], ["lease"]):
            progress.show(sum(verified.values()), tally.get("crashes", 0), sum(recoveries.values()))

    def on_exit(owner: str, code: int) -> None:
        # Checked in this process after each death: nothing a worker saw acknowledged was lost, and whether the dead
        # worker held a lease (the pool's break keeps its name on it), without which its crash is not a recovery.
        held = False
        for task in list_runs(store_url):
            held = held or _read_run(store_url, task, lambda store: store.state["lease"].get("owner") == owner)
            revision = _read_run(store_url, task, lambda store: store.revision)
            if revision < acked.get(task, 0):
                audit["lost_commits"] += acked[task] - revision
                acked[task] = revision  # count each loss once
        if code == -signal.SIGKILL and not held:
            audit["crashes_without_lease"] += 1

    context = {"url": service_url, "shard_size": shard_size, "documents": documents, "crash_rate": crash_rate}
    options = PoolOptions(context=context, ttl=TTL, seed=seed, observer="runner.proof.demo:worker_faults")
    tally = run_pool(store_url, workers, "runner.proof.demo:shard_handler", options, on_line=on_line, on_exit=on_exit,
                     tally=tally)
    tally.update(audit)
    tally["documents_done"] = sum(verified.values())
    return tally


def _read_run(store_url: str, task: str, read: Callable[[Any], Any]) -> Any:
    """What ``read`` takes from run ``task`` of the store at ``store_url``, the store closed again."""
    store = open_store(run_url(store_url, task), task)
    try:
        return read(store)
    finally:
        store.close()


def run_demo(documents: int = 2000, seed: int = 1, crash_rate: float = 0.01, cancel_at: Optional[int] = None,
             progress_stream: Optional[IO[str]] = None, workers: Optional[int] = None,
             store: Optional[str] = None, shard_size: int = SHARD_SIZE, html: Optional[str] = None,
             compact_bytes: Optional[int] = None) -> Dict[str, Any]:
    """Run the demo and return its figures (see the module docstring).

    ``workers``: split the documents into runs of SHARD_SIZE in ``store``
    (default: a fresh SQLite file) and let a pool of that many workers claim
    them, instead of one worker at a time on one run. ``html``: write the
    timeline page of the run(s) there, from their whole history, and time it
    (``html_seconds``: reading the history, the report's figures and the page,
    as ``report --html`` does). ``compact_bytes``: the single run's workers
    compact once the journal holds that many bytes (and a quarter of the
    snapshot), so that compaction comes often; ``history_bytes`` and
    ``history_segments`` then say what its history folder holds.
    """
    if workers is not None and cancel_at is not None:
        raise InvalidInput("--cancel-at works on the single-run demo, without --workers")
    root = tempfile.mkdtemp(prefix="runner-demo-")
    began = time.monotonic()
    try:
        reference: Optional[Dict[str, Any]] = None
        ref_errors: List[str] = []
        if cancel_at is None:
            # The reference: the same documents and code, no crashes, its own ticket
            # service. Nothing is killed there, so its run store skips fsync.
            with TicketServiceProcess(os.path.join(root, "reference.db")) as ref_service:
                ref_run = os.path.join(root, "reference-run")
                RunStore.create(ref_run, TASK, demo_contract(documents), durability="process")
                ref_errors = _run_workers(ref_run, ref_service.url, documents, seed, 0.0, None, None, max_workers=1,
                                          durability="process")["errors"]
                reference = _audit([RunStore.open(ref_run).state], ref_service, documents)
        reference_seconds = time.monotonic() - began
        began = time.monotonic()
        progress = _Progress(documents, progress_stream, True) if progress_stream is not None else None
        with TicketServiceProcess(os.path.join(root, "tickets.db")) as service:
            if workers is None:
                run_path = os.path.join(root, "run")
                RunStore.create(run_path, TASK, demo_contract(documents))
                tally = _run_workers(run_path, service.url, documents, seed, crash_rate, cancel_at, progress,
                                     compact_bytes=compact_bytes)
                states = [RunStore.open(run_path).state]
                store_used = "file:" + run_path
                tally.update(_history_folder(run_path))
            else:
                store_used = store or "sqlite:" + os.path.join(root, "runs.db")
                tally = _run_sharded(store_used, service.url, documents, seed, crash_rate, workers, progress,
                                     shard_size)
                states = [_read_run(store_used, task, lambda store: store.state) for task in list_runs(store_used)]
            audit = _audit(states, service, documents)
        wall = time.monotonic() - began
        stats, effects = audit["stats"], audit["effects"]
        held = sum(len(p) for p in audit["tickets"].values())
        duplicates = sum(len(p) - 1 for p in audit["tickets"].values() if len(p) > 1) + int(stats.get("duplicates", 0))
        verified = sum(1 for e in effects.values() if e["state"] == "verified")
        lost = tally["lost_commits"] + sum(1 for k, e in effects.items()
                                           if e["state"] == "verified" and len(audit["tickets"].get(k, [])) != 1)
        statuses = sorted({state["status"] for state in states})
        result: Dict[str, Any] = {
            "documents": documents,
            "seed": seed,
            "crash_rate": crash_rate,
            "workers_in_parallel": workers or 1,
            "store": store_used.split(":", 1)[0],
            "runs": len(states),
            "crashes": tally["crashes"],
            "crashes_at_windows": tally.get("window_kills", 0),
            "crashes_at_random_moments": tally.get("timer_kills", 0),
            "recoveries": sum(int(state["counters"].get("recoveries", 0)) for state in states),
            "crashes_without_lease": tally.get("crashes_without_lease", 0),
            "workers": tally["workers"],
            "effects_requested": int(stats["requests"].get("post_tickets", 0)),
            "effects_applied": held,
            "effects_verified": verified,
            "duplicate_effects": duplicates,
            "uncertain_reconciled": sum(int(state["counters"].get("reconciled_effects", 0)) for state in states),
            "repeated_steps": sum(max(0, int(st.get("attempts", 0)) - 1) for state in states
                                  for st in state["steps"].values()),
            "retried_effects": sum(1 for e in effects.values() if e.get("attempts", 0) > 1),
            "lost_commits": lost,
            "status": statuses[0] if len(statuses) == 1 else "+".join(statuses),
            "revision": sum(int(state["revision"]) for state in states),
            "matches_reference": None,
            "wall_seconds": round(wall, 2),
            "reference_seconds": round(reference_seconds, 2),
            "total_seconds": round(wall + reference_seconds, 2),
            "errors": tally["errors"] + ref_errors,
        }
        if progress:
            progress.show(verified, result["crashes"], result["recoveries"], final=True)
        if "history_bytes" in tally:
            result.update(history_bytes=tally["history_bytes"], history_segments=tally["history_segments"])
        if html:
            timed = time.monotonic()
            if workers:
                histories = [_read_run(store_used, task, load_history) for task in list_runs(store_used)]
            else:
                histories = [load_history(RunStore.open(store_used[len("file:"):]))]
            html_bytes = write_timeline(html, histories, f"Demo: {documents} documents")
            result.update(html=html, html_bytes=html_bytes, html_seconds=round(time.monotonic() - timed, 2))
        if reference is not None:
            result["matches_reference"] = audit["output"] == reference["output"] and statuses == ["complete"]
        elif cancel_at is not None:  # always, where there is no reference
            result.update(_cancel_audit(states[0], tally, cancel_at))
        result["ok"] = (
            result["duplicate_effects"] == 0
            and result["lost_commits"] == 0
            and not result["errors"]
            and (result["matches_reference"] is True if cancel_at is None else result["stopped_within_one_step"])
        )
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cancel_audit(state: Dict[str, Any], tally: Dict[str, Any], cancel_at: int) -> Dict[str, Any]:
    """After a cancel: nothing new began, what was in flight was reconciled, status is cancelled."""
    cancel_rev = tally["cancel_revision"]
    cancellation = state["observations"].get("cancellation") or {}
    began_after = 0
    started_after: List[str] = []
    for key, effect in state["effects"].items():
        if effect["started_at"] > cancellation.get("at", "9999") and effect["attempts"] >= 1:
            began_after += 1
            started_after.append(key)
    unresolved = sum(1 for e in state["effects"].values() if e["state"] in UNRESOLVED)
    verified = sum(1 for e in state["effects"].values() if e["state"] == "verified")
    return {
        "cancel_at": cancel_at,
        "cancel_revision": cancel_rev,
        "cancelled_by": cancellation.get("by"),
        "effects_begun_after_cancel": began_after,
        "unresolved_after_cancel": unresolved,
        "documents_verified": verified,
        "stopped_within_one_step": (state["status"] == "cancelled" and began_after == 0 and unresolved == 0 and
                                    verified <= cancel_at + 1),
    }


def _why(result: Dict[str, Any]) -> Dict[str, str]:
    """Why each figure of the table that can differ from another does: a few words after the figure.

    A crash is a recovery only when the killed worker held the lease: the
    next worker then takes it over. One killed before it took the lease (or
    after it gave it back) left nothing to take over, and the supervisor's
    break found no lease of its to break.
    """
    why: Dict[str, str] = {}
    unheld = int(result.get("crashes_without_lease") or 0)
    if result["crashes"]:
        why["recoveries"] = "one per crash of a worker that held the lease"
        if unheld:
            were = "s were" if unheld != 1 else " was"
            why["recoveries"] += (f"; {unheld} worker{were} killed holding none (before taking it, or after giving it "
                                  "back): no worker took over from them, so those crashes are not recoveries")
    extra = result["effects_requested"] - result["effects_applied"]
    if extra > 0:
        why["requested"] = (f"{extra} more than the target holds: calls made again under the same key after a kill or "
                            "a lost answer, which the service answered from the key, without a second ticket")
    if result["uncertain_reconciled"]:
        why["reconciled"] = ("effects whose outcome a killed worker never learned, settled by looking them up, "
                             "never by a second call")
    if result["repeated_steps"]:
        why["repeated"] = "step attempts beyond the first: a new worker started the step again after a kill"
    if result["retried_effects"]:
        why["retried"] = "effects called again only after the target was seen not to hold them"
    return why


def format_table(result: Dict[str, Any]) -> str:
    """The demo's table: each figure, and where it can differ from another, why it does (:func:`_why`)."""
    why = _why(result)

    def said(value: Any, key: str) -> str:
        return f"{value}: {why[key]}" if key in why else str(value)

    rows = [
        ("documents", result["documents"]),
        ("workers in parallel / store",
         f"{result['workers_in_parallel']} on {result['store']} ({result['runs']} "
         f"run{'s' if result['runs'] != 1 else ''})"),
        ("crashes (SIGKILL)",
         f"{result['crashes']} ({result['crashes_at_windows']} at commit windows, "
         f"{result['crashes_at_random_moments']} at random moments)"),
        ("recoveries (lease takeovers)", said(result["recoveries"], "recoveries")),
        ("effects requested", said(result["effects_requested"], "requested")),
        ("effects held by the target", result["effects_applied"]),
        ("duplicate effects", f"{result['duplicate_effects']}  (must be 0)"),
        ("uncertain effects reconciled", said(result["uncertain_reconciled"], "reconciled")),
        ("repeated steps", said(result["repeated_steps"], "repeated")),
        ("effects retried after absence", said(result["retried_effects"], "retried")),
        ("lost commits", f"{result['lost_commits']}  (must be 0)"),
    ]
    if result.get("history_segments"):
        rows.append(("history folder", f"{result['history_bytes']} bytes in {result['history_segments']} segments"))
    if result.get("cancel_at") is not None:
        rows += [
            ("cancelled after", f"{result['cancel_at']} documents, by {result['cancelled_by']}"),
            ("effects begun after cancel", f"{result['effects_begun_after_cancel']}  (must be 0)"),
            ("in flight left unresolved", result["unresolved_after_cancel"]),
            ("stopped within one step", result["stopped_within_one_step"]),
        ]
    else:
        rows.append(("matches the uncrashed reference", result["matches_reference"]))
    if result.get("matches_reference") is not None:
        wall = (f"{result['total_seconds']} s: the uncrashed reference run {result['reference_seconds']} s, "
                f"then the crashed run {result['wall_seconds']} s")
    else:
        wall = f"{result['wall_seconds']} s (no reference run: a cancelled run is audited on its own)"
    rows += [("final status", f"{result['status']} at revision {result['revision']}"), ("wall time", wall)]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    for error in result["errors"]:
        lines.append(f"error: {error}")
    lines.append("RESULT: " + ("ok" if result["ok"] else "FAILED"))
    return "\n".join(lines)


# -- the three-node scenario ---------------------------------------------------------------------

def run_draft_scenario(log: IO[str]) -> Dict[str, Any]:
    """plan -> write_draft -> finish, with a crash after the tool committed, before the checkpoint."""
    root = tempfile.mkdtemp(prefix="runner-draft-")
    try:
        with TicketServiceProcess(os.path.join(root, "drafts.db")) as service:
            contract = {
                "contract": 1,
                "task_id": "draft-scenario",
                "goal": "Plan, write one draft through the tool, finish.",
                "steps": [
                    {"id": "plan", "artifact": "plan", "check": "written", "next": "write_draft"},
                    {"id": "write_draft", "artifact": "draft", "check": "draft found by key", "next": "finish"},
                    {"id": "finish", "artifact": "summary", "check": "written", "next": "done"},
                ],
            }
            run_path = os.path.join(root, "run")
            RunStore.create(run_path, "draft-scenario", contract)
            lines: List[str] = []
            for phase in ("first", "recovery"):
                env = dict(os.environ)
                env["PYTHONPATH"] = PACKAGE_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
                proc = subprocess.run([sys.executable, "-S", "-m", "runner.proof.demo", "--draft-worker",
                                       json.dumps({"run": run_path, "url": service.url, "phase": phase})],
                                      capture_output=True, text=True, env=env, timeout=120)
                log.write(f"# {'First process' if phase == 'first' else 'Recovery process'}\n")
                for line in proc.stdout.splitlines():
                    log.write(line + "\n")
                    lines.append(line)
                if phase == "first":
                    if proc.returncode != -signal.SIGKILL:
                        raise RuntimeError(f"the first process was meant to crash; it exited {proc.returncode}: "
                                           f"{proc.stderr[-500:]}")
                    crash = "CRASH after effect commit, before checkpoint (SIGKILL)"
                    log.write(crash + "\n")
                    lines.append(crash)
                    Run(RunStore.open(run_path)).break_lease("demo-supervisor", "the first process was killed")
                elif proc.returncode != 0:
                    raise RuntimeError(f"recovery failed ({proc.returncode}): {proc.stderr[-500:]}")
                log.flush()
            stats = service.stats()
            state = RunStore.open(run_path).state
        receipts = [line.split()[-1] for line in lines if line.startswith("TOOL")]
        return {
            "log": lines,
            "status": state["status"],
            "plan_executions": sum(1 for line in lines if line == "EXECUTE plan"),
            "tickets": int(stats.get("tickets", 0)),
            "same_receipt": len(set(receipts)) == 1 and len(receipts) == 2,
            "ok": state["status"] == "complete" and int(stats.get("tickets", 0)) == 1 and len(set(receipts)) == 1,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def draft_worker_main(argv: List[str]) -> int:
    """One process of the draft scenario: run the plan's steps in order, crashing once if told."""
    opts = json.loads(argv[0])
    run = Run(RunStore.open(opts["run"]))
    recover(run, f"draft-{opts['phase']}", TTL)
    adapter = TicketAdapter(opts["url"], retention_seconds=None, timeout=5.0, run_id="draft-scenario")
    payload = {"title": "Why checkpoints alone do not make a task resumable", "marker": "draft-1"}
    for spec in run.state["plan"]["steps"]:
        step = spec["id"]
        if (run.state["steps"].get(step) or {}).get("state") == "done":
            continue  # committed before the crash: reused, not re-run
        _say("EXECUTE", step)
        if run.state["current_step"] != step:
            run.step_start(step)
        if step == "write_draft":
            effect = run.state["effects"].get("draft:post")
            if effect is None or effect["state"] != "verified":
                # A started effect is resent under the same key: the tool deduplicates it.
                run.effect_begin("draft:post", payload, resend=effect is not None)
                receipt = adapter.invoke("draft:post", payload, run.epoch or 0)
                _say("TOOL", "committed" if receipt.get("created") else "reuse", "receipt", receipt["ticket"])
                if opts["phase"] == "first":
                    die()  # after the tool committed, before the checkpoint
                run.effect_ack("draft:post", receipt)
                seen = adapter.observe("draft:post", payload)
                run.effect_verify("draft:post", seen.evidence)
        run.step_done(step, {})
    run.release()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker_main(sys.argv[2:]))
    if sys.argv[1:2] == ["--draft-worker"]:
        sys.exit(draft_worker_main(sys.argv[2:]))
    sys.exit(2)
