"""``bench``: the cost of a durable transition, measured against the disk it runs on.

Every figure is a ratio or a time measured in the same run on the same
folder, so the numbers say how much the store adds to the unavoidable fsync,
not how fast this machine's disk happens to be:

* ``fsync_append_ms``: median of a raw ``write`` + ``fsync`` of one journal-sized
  line to a file in the same folder, interleaved with the transitions below.
* ``transition_ms_median`` / ``transition_ms_p99``: a full store transition
  (lock, catch-up check, record encoding and hashing, append, fsync, apply,
  and the amortised share of compaction) on a run holding 100 effects.
* ``transition_ratio``: median transition / median raw append.
* ``flatness``: median transition on a run holding 10,000 effects / on a run
  holding 100, measured alternately so both see the same disk.
* ``resume_ms_10000``: median time to load and validate the 10,000-effect run
  in a fresh store object (snapshot digest, journal hash chain, replay).
* ``bytes_per_effect``: compacted snapshot bytes / effects;
  ``disk_bytes_per_effect`` counts every file of the run folder.
"""

import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

from ..base.canonical import sha256_hex
from ..stores.file import RunStore

__all__ = ["run_bench", "run_store_bench", "TARGETS"]

#: The issue's targets; the command reports whether each was met.
TARGETS = {"transition_ratio": 2.0, "flatness": 1.2, "resume_ms_10000": 100.0, "bytes_per_effect": 1024.0}


def _effect(key: str, n: int, state: str) -> Dict[str, Any]:
    return {
        "state": state,
        "payload_digest": "sha256:" + sha256_hex(key.encode()),
        "attempts": 1,
        "updated_at": "2026-11-29T07:00:00.000Z",
        "evidence": {"receipt": f"T-{n:06d}"} if state != "started" else None,
    }


def _fill(store: RunStore, count: int, batch: int = 500) -> None:
    for start in range(0, count, batch):
        ops = [["set", ["effects", f"doc-{n:06d}:ticket"], _effect(f"doc-{n:06d}:ticket", n, "verified")]
               for n in range(start, min(count, start + batch))]
        store.commit(ops)


def _percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_bench(transitions: int = 2000, scratch: Optional[str] = None,
              clock: Callable[[], float] = time.perf_counter) -> Dict[str, Any]:
    """Measure and return the figures described in the module docstring."""
    root = tempfile.mkdtemp(prefix="runner-bench-", dir=scratch)
    try:
        small = RunStore.create(os.path.join(root, "small"), "bench-small", {"goal": "bench"})
        large = RunStore.create(os.path.join(root, "large"), "bench-large", {"goal": "bench"})
        _fill(small, 100)
        _fill(large, 10_000)
        large.compact()
        raw_path = os.path.join(root, "raw.jsonl")
        fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        raw: List[float] = []
        small_t: List[float] = []
        large_t: List[float] = []
        try:
            for n in range(transitions):
                key = f"doc-{n % 100:06d}:ticket"
                op = [["set", ["effects", key], _effect(key, n, "acknowledged")]]
                line = b'{"h":"' + b"0" * 64 + b'","r":' + str(op).encode() + b"}\n"
                t0 = clock()
                os.write(fd, line)
                os.fsync(fd)
                raw.append(clock() - t0)
                t0 = clock()
                small.commit(op)
                small_t.append(clock() - t0)
                big_key = f"doc-{(n * 7919) % 10_000:06d}:ticket"
                t0 = clock()
                large.commit([["set", ["effects", big_key], _effect(big_key, n, "acknowledged")]])
                large_t.append(clock() - t0)
        finally:
            os.close(fd)
        resume: List[float] = []
        for _ in range(5):
            t0 = clock()
            loaded = RunStore.open(large.path)
            resume.append(clock() - t0)
            assert loaded.state["revision"] == large.state["revision"]
        large.compact()
        effects = len(large.state["effects"])
        snapshot_bytes = os.path.getsize(os.path.join(large.path, "snapshot.json"))
        disk_bytes = sum(os.path.getsize(os.path.join(large.path, f)) for f in os.listdir(large.path)
                         if os.path.isfile(os.path.join(large.path, f)))
        raw_median = statistics.median(raw)
        small_median = statistics.median(small_t)
        result: Dict[str, Any] = {
            "transitions": transitions,
            "fsync_append_ms": round(raw_median * 1000, 4),
            "transition_ms_median": round(small_median * 1000, 4),
            "transition_ms_p99": round(_percentile(small_t, 0.99) * 1000, 4),
            "transition_ratio": round(small_median / raw_median, 3),
            "transition_ms_median_10000": round(statistics.median(large_t) * 1000, 4),
            "flatness": round(statistics.median(large_t) / small_median, 3),
            "resume_ms_10000": round(statistics.median(resume) * 1000, 2),
            "bytes_per_effect": round(snapshot_bytes / effects, 1),
            "disk_bytes_per_effect": round(disk_bytes / effects, 1),
            "effects": effects,
            "scratch": root,
        }
        result["targets"] = {name: {"target": limit, "met": result[name] <= limit} for name, limit in TARGETS.items()}
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _store_worker(url: str, task: str, transitions: int, queue: Any) -> None:
    """One process committing ``transitions`` effect transitions to its own run; reports the times."""
    from ..stores import open_store

    store = open_store(url, task)
    times: List[float] = []
    for n in range(transitions):
        key = f"doc-{n:06d}:ticket"
        t0 = time.perf_counter()
        store.commit([["set", ["effects", key], _effect(key, n, "verified")]])
        times.append(time.perf_counter() - t0)
    queue.put(times)


def run_store_bench(urls: List[str], transitions: int = 300, processes: int = 4) -> List[Dict[str, Any]]:
    """Per store: the median transition alone, and the throughput of 1 and ``processes`` writers.

    Each writer is its own process with its own run in the same store, so the
    figures show what the store's locking and commit cost allow in parallel.
    """
    import multiprocessing

    from ..stores import create_store, parse_store_url

    out: List[Dict[str, Any]] = []
    context = multiprocessing.get_context("spawn")
    for url in urls:
        kind = parse_store_url(url)[0]
        row: Dict[str, Any] = {"store": kind}
        stamp = f"{os.getpid()}-{int(time.time() * 1000) % 10**9}"
        for writers in (1, processes):
            tasks = []
            for w in range(writers):
                task = f"bench-{kind}-{writers}-{w}-{stamp}"
                where = url if kind != "file" else "file:" + os.path.join(parse_store_url(url)[1], task)
                create_store(where, task, {"goal": "bench"})
                tasks.append((where, task))
            queue = context.Queue()
            procs = [context.Process(target=_store_worker, args=(where, task, transitions, queue))
                     for where, task in tasks]
            began = time.perf_counter()
            for proc in procs:
                proc.start()
            results = [queue.get(timeout=600) for _ in procs]
            for proc in procs:
                proc.join()
            elapsed = time.perf_counter() - began
            flat = [t for times in results for t in times]
            if writers == 1:
                row["transition_ms_median"] = round(statistics.median(flat) * 1000, 3)
                row["transition_ms_p99"] = round(_percentile(flat, 0.99) * 1000, 3)
            # Wall time includes starting the processes: a conservative rate.
            row[f"throughput_{writers}_writers_per_s"] = round(len(flat) / elapsed, 1)
        out.append(row)
    return out
