"""The cost of N durable agent steps in three systems, measured in one run on one disk.

Systems and what one "step" is in each:

* **runner** -- one ``RunStore.commit`` (durability ``sync``) that records one new
  effect, so the run's state grows by one entry per step, as an agent's does.
  A step is acknowledged after one fsync'd journal append; compaction runs
  inside whichever commit crosses the threshold and is counted in that step.
* **raw fsync'd append** -- ``write`` + ``fsync`` of one journal-sized line to a
  file beside the system's files. Every system's phase interleaves one such
  append with each of its steps and times it separately, so each system has
  a floor measured on the same disk at the same moments as its own steps:
  its ratio (``x raw``) is its median step over that phase's median append.
  The table's first row is the floor of the runner's phase.
* **LangGraph** -- a ``StateGraph`` compiled with ``SqliteSaver`` whose single node
  loops back to itself; one ``invoke(..., durability="sync")`` runs it N times.
  Each node run appends one entry to a list channel with an ``operator.add``
  reducer (the way an agent's message list grows), and each super-step's
  checkpoint is written before the next one starts. A step's time runs from
  its node's entry to the next node's entry (for the last step, to the return
  of ``invoke``), so it covers the node and the checkpoint of its super-step;
  the node makes that step's raw append, whose time is subtracted.
* **DBOS** -- one ``@DBOS.workflow()`` that calls a ``@DBOS.step()`` N times with
  the SQLite system database (``system_database_url="sqlite:///..."``). The
  step time is the call of the step from the workflow, which returns after
  DBOS has recorded the step's output; the raw append is made between calls.

Every system records the same entry per step (an effect record of about 200
bytes: status, payload digest, attempts, timestamp, receipt). For every
system the script reports the median and p99 step time, the median of steps
1-100 and of the last 100 steps, their ratio (``growth``: how the cost of a
step changes as history accumulates), the bytes its files hold on disk at
the end divided by the steps, and the ratio of its median step to the
median raw fsync'd append of its phase. Before each phase the script calls
``sync`` and pauses, so no phase pays for data an earlier one left unwritten.

LangGraph and DBOS are installed by the script into virtual environments of
their own (``<venv>/langgraph`` and ``<venv>/dbos``, created with this
interpreter's ``venv`` module, pinned to the versions in ``PINS``) and measured
there in subprocesses, so neither is ever a dependency of the runner or its
tests. The runner is measured with the interpreter running this script. A
failed install or a failed measurement is printed with its command and
output, and the remaining systems are still measured.

Reproduce from the repository root (network access to the package index is
needed the first time)::

    python3 bench/compare.py --steps 2000
    python3 bench/compare.py --steps 2000 --json
    python3 bench/compare.py --steps 10000 --keep-venv /tmp/compare-venv

``--keep-venv DIR`` creates the environments in DIR and keeps them, or reuses
them when they already hold the pinned versions. ``--scratch DIR`` chooses the
folder (and so the disk) the measurements write to; it defaults to the system
temporary folder. ``--budget SECONDS`` stops any one system's loop after that
long and reports the steps it completed; ``--langgraph-steps`` runs LangGraph
for fewer steps than the others, since its database grows with the square of
the step count.
"""

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Exact versions installed into the third-party environments.
PINS: Dict[str, List[str]] = {
    "langgraph": ["langgraph==1.2.24", "langgraph-checkpoint-sqlite==3.1.2"],
    "dbos": ["dbos==3.4.0"],
}

#: Distributions whose installed versions are reported for each environment.
REPORTED: Dict[str, List[str]] = {
    "langgraph": ["langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "langchain-core"],
    "dbos": ["dbos", "sqlalchemy"],
}

EDGE = 100  # steps in the "first" and "last" windows

#: Values of SQLite's ``PRAGMA synchronous``.
SQLITE_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


# -- the entry every system records per step ---------------------------------------


def step_entry(n: int) -> Tuple[str, Dict[str, Any]]:
    """The key and effect record of step ``n``; identical in every system."""
    key = f"doc-{n:06d}:ticket"
    return key, {
        "state": "verified",
        "payload_digest": "sha256:" + hashlib.sha256(key.encode()).hexdigest(),
        "attempts": 1,
        "updated_at": "2026-11-29T07:00:00.000Z",
        "evidence": {"receipt": f"T-{n:06d}"},
    }


def folder_bytes(path: str) -> int:
    """Sum of the sizes of the regular files below ``path``."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


class RawAppender:
    """``write`` + ``fsync`` of one line per call to an append-only file."""

    def __init__(self, path: str, clock: Callable[[], float] = time.perf_counter) -> None:
        self.path = path
        self.clock = clock
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, line: bytes) -> float:
        t0 = self.clock()
        os.write(self.fd, line)
        os.fsync(self.fd)
        return self.clock() - t0

    def close(self) -> None:
        os.close(self.fd)


def journal_sized_line(n: int) -> bytes:
    """A line the size of a runner journal record that sets the effect of step ``n``."""
    key, effect = step_entry(n)
    body = {"at": "2026-11-29T07:00:00.000Z", "epoch": 0, "ops": [["set", ["effects", key], effect]],
            "prev": "0" * 64, "rev": n + 1}
    return b'{"h":"' + b"0" * 64 + b'","r":' + json.dumps(body, separators=(",", ":"), sort_keys=True).encode() + b"}\n"


# -- workers (run inside the third-party environments) -----------------------------


def worker_langgraph(steps: int, folder: str, raw_path: str, budget: float) -> Dict[str, Any]:
    import operator
    from typing import Annotated, TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    class AgentState(TypedDict):
        entries: Annotated[List[Dict[str, Any]], operator.add]
        count: int

    clock = time.perf_counter
    appender = RawAppender(raw_path)
    stamps: List[float] = []
    raw: List[float] = []
    started = [0.0]

    def act(state: AgentState) -> Dict[str, Any]:
        stamps.append(clock())
        n = state["count"]
        raw.append(appender.append(journal_sized_line(n)))
        key, effect = step_entry(n)
        return {"entries": [dict(effect, key=key)], "count": n + 1}

    def route(state: AgentState) -> str:
        if state["count"] >= steps or clock() - started[0] > budget:
            return END
        return "act"

    graph = StateGraph(AgentState)
    graph.add_node("act", act)
    graph.add_edge(START, "act")
    graph.add_conditional_edges("act", route)
    db = os.path.join(folder, "checkpoints.sqlite")
    config = {"configurable": {"thread_id": "agent-run"}, "recursion_limit": steps + 10}
    with SqliteSaver.from_conn_string(db) as saver:
        app = graph.compile(checkpointer=saver)
        started[0] = clock()
        try:
            final = app.invoke({"entries": [], "count": 0}, config, durability="sync")
        finally:
            appender.close()
        finished = clock()
        conn = saver.conn
        pragmas = {
            "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
            "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
        }
        rows = {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("checkpoints", "writes")}
        bytes_open = folder_bytes(folder)
    done = len(stamps)
    assert final["count"] == done and len(final["entries"]) == done
    times = [b - a - r for a, b, r in zip(stamps, stamps[1:] + [finished], raw)]
    return {
        "times": times,
        "raw": raw,
        "wall_s": finished - started[0],
        "bytes_on_disk": folder_bytes(folder),
        "details": {
            "sqlite_journal_mode": pragmas["journal_mode"],
            "sqlite_synchronous": SQLITE_SYNCHRONOUS.get(pragmas["synchronous"], pragmas["synchronous"]),
            "checkpoint_rows": rows["checkpoints"],
            "write_rows": rows["writes"],
            "bytes_before_close_incl_wal": bytes_open,
        },
    }


def worker_dbos(steps: int, folder: str, raw_path: str, budget: float) -> Dict[str, Any]:
    import sqlite3

    from dbos import DBOS, DBOSConfig

    clock = time.perf_counter
    db = os.path.join(folder, "dbos.sqlite")
    config: DBOSConfig = {"name": "compare-bench", "system_database_url": "sqlite:///" + db, "log_level": "WARNING"}
    DBOS(config=config)
    appender = RawAppender(raw_path)
    times: List[float] = []
    raw: List[float] = []

    @DBOS.step()
    def record(n: int) -> Dict[str, Any]:
        key, effect = step_entry(n)
        return dict(effect, key=key)

    @DBOS.workflow()
    def agent_run(count: int, deadline: float) -> int:
        for n in range(count):
            raw.append(appender.append(journal_sized_line(n)))
            t0 = clock()
            record(n)
            times.append(clock() - t0)
            if clock() > deadline:
                break
        return len(times)

    DBOS.launch()
    try:
        t0 = clock()
        done = agent_run(steps, t0 + budget)
        wall = clock() - t0
    finally:
        DBOS.destroy()
        appender.close()
    assert done == len(times)
    conn = sqlite3.connect(db)
    try:
        pragmas = {
            "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
            "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
        }
        outputs = conn.execute("SELECT count(*) FROM operation_outputs").fetchone()[0]
    finally:
        conn.close()
    return {
        "times": times,
        "raw": raw,
        "wall_s": wall,
        "bytes_on_disk": folder_bytes(folder),
        "details": {
            "sqlite_journal_mode": pragmas["journal_mode"],
            "sqlite_synchronous": SQLITE_SYNCHRONOUS.get(pragmas["synchronous"], pragmas["synchronous"]),
            "operation_output_rows": outputs,
        },
    }


WORKERS: Dict[str, Callable[[int, str, str, float], Dict[str, Any]]] = {
    "langgraph": worker_langgraph, "dbos": worker_dbos}


def worker_main(name: str, steps: int, folder: str, raw_path: str, budget: float) -> int:
    result = WORKERS[name](steps, folder, raw_path, budget)
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


# -- the runner, measured in this interpreter ----------------------------------------


def measure_runner(steps: int, folder: str, raw_path: str, budget: float) -> Dict[str, Any]:
    sys.path.insert(0, REPO_ROOT)
    from runner.stores.file import RunStore

    clock = time.perf_counter
    run_path = os.path.join(folder, "run")
    store = RunStore.create(run_path, "compare-bench", {"goal": "compare durable step cost"}, durability="sync")
    appender = RawAppender(raw_path)
    times: List[float] = []
    raw: List[float] = []
    started = clock()
    try:
        for n in range(steps):
            raw.append(appender.append(journal_sized_line(n)))
            key, effect = step_entry(n)
            t0 = clock()
            store.commit([["set", ["effects", key], effect]])
            times.append(clock() - t0)
            if clock() - started > budget:
                break
    finally:
        appender.close()
    wall = clock() - started
    assert len(store.state["effects"]) == len(times)
    files = sorted(os.listdir(run_path))
    return {
        "times": times,
        "raw": raw,
        "wall_s": wall,
        "bytes_on_disk": folder_bytes(run_path),
        "details": {"durability": store.durability, "files": files, "revision": store.revision},
    }


# -- environments ---------------------------------------------------------------------


class Failure(Exception):
    """A step that could not be done; ``detail`` says exactly what ran and what it printed."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(what)
        self.what = what
        self.detail = detail


def _run(cmd: List[str], timeout: float, what: str, env: Optional[Dict[str, str]] = None,
         cwd: Optional[str] = None) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or "") if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        raise Failure(what, f"$ {' '.join(cmd)}\ntimed out after {timeout:.0f} s\n{_tail(out)}") from None
    except OSError as exc:
        raise Failure(what, f"$ {' '.join(cmd)}\n{exc}") from None
    if proc.returncode != 0:
        raise Failure(what, f"$ {' '.join(cmd)}\nexit status {proc.returncode}\n{_tail(proc.stdout + proc.stderr)}")
    return proc.stdout


def _tail(text: str, lines: int = 25) -> str:
    kept = [line for line in text.splitlines()
            if line.strip() and "is ignored: it is neither a file nor a directory" not in line]
    return "\n".join(kept[-lines:])


def venv_python(env_dir: str) -> str:
    return os.path.join(env_dir, "bin", "python")


def installed_versions(python: str, names: Sequence[str]) -> Dict[str, Optional[str]]:
    code = (
        "import json, sys, importlib.metadata as m\n"
        "out = {}\n"
        "for n in sys.argv[1:]:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: out[n] = None\n"
        "print(json.dumps(out))\n"
    )
    return json.loads(_run([python, "-c", code, *names], 120, "read installed versions"))


def ensure_env(name: str, env_dir: str, log: Callable[[str], None]) -> Dict[str, Optional[str]]:
    """Create (or reuse) the environment for ``name`` with ``PINS[name]``; return reported versions."""
    python = venv_python(env_dir)
    pins = dict(p.split("==", 1) for p in PINS[name])
    if os.path.exists(python):
        try:
            have = installed_versions(python, list(pins))
            if all(have.get(dist) == version for dist, version in pins.items()):
                log(f"{name}: reusing {env_dir}")
                return installed_versions(python, REPORTED[name])
        except Failure:
            pass
    else:
        log(f"{name}: creating a virtual environment in {env_dir}")
        _run([sys.executable, "-m", "venv", env_dir], 300, f"create the {name} virtual environment")
    log(f"{name}: pip install {' '.join(PINS[name])}")
    _run([python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *PINS[name]], 1800,
         f"install {name}")
    return installed_versions(python, REPORTED[name])


def run_worker(name: str, python: str, steps: int, folder: str, raw_path: str, budget: float) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cmd = [python, os.path.abspath(__file__), "--worker", name, "--steps", str(steps), "--folder", folder,
           "--raw-file", raw_path, "--budget", str(budget)]
    out = _run(cmd, budget * 3 + 600, f"measure {name}", env=env, cwd=os.path.dirname(folder))
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise Failure(f"measure {name}", f"$ {' '.join(cmd)}\nno result line in its output\n{_tail(out)}")


# -- statistics and reporting -----------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(times: Sequence[float], raw: Sequence[float], bytes_on_disk: Optional[int]) -> Dict[str, Any]:
    steps = len(times)
    raw_median = statistics.median(raw)
    median = statistics.median(times)
    first = statistics.median(times[:EDGE])
    last = statistics.median(times[-EDGE:])
    return {
        "steps": steps,
        "median_ms": median * 1000,
        "p99_ms": percentile(times, 0.99) * 1000,
        "first100_median_ms": first * 1000,
        "last100_median_ms": last * 1000,
        "growth": last / first,
        "raw_fsync_median_ms": raw_median * 1000,
        "ratio_to_raw": median / raw_median,
        "bytes_on_disk": bytes_on_disk,
        "bytes_per_step": None if bytes_on_disk is None else bytes_on_disk / steps,
    }


def settle(seconds: float = 2.0) -> None:
    """Flush dirty pages left by earlier work (an install, a previous system) before a phase.

    On a journaling file system an ``fsync`` waits for the journal commit that
    carries it, and that commit also writes back other files' pending data, so
    a phase started right after a large write would be charged for it.
    """
    os.sync()
    time.sleep(seconds)


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def langgraph_step_cap(free: int) -> int:
    """The most LangGraph steps whose checkpoints fit in half of ``free``.

    Every checkpoint holds the whole entry list, so the database grows as
    steps**2 / 2 entries; the serialised entry is taken as 400 bytes to leave
    room for the write-ahead log and the pending-writes table.
    """
    return int(math.sqrt(free * 0.5 / (400 / 2)))


def filesystem_of(path: str) -> str:
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if (len(fields) >= 3 and (path == fields[1] or path.startswith(fields[1].rstrip("/") + "/"))
                        and len(fields[1]) >= len(best)):
                    best, kind = fields[1], f"{fields[2]} on {fields[0]}"
    except OSError:
        pass
    return f"{kind} (mounted at {best or '?'})"


def runner_revision() -> str:
    try:
        head = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO_ROOT, "status", "--porcelain", "--", "runner"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" with uncommitted changes under runner/" if dirty else "")


LABELS = {
    "raw": "raw fsync'd append",
    "runner": "runner RunStore.commit",
    "langgraph": "LangGraph SqliteSaver",
    "dbos": "DBOS (SQLite)",
}


def _fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(report: Dict[str, Any]) -> str:
    lines: List[str] = []
    lines.append(f"Durable steps: {report['steps']} requested per system; "
                 f"scratch {report['scratch']} on {report['filesystem']}")
    lines.append(f"Python {report['python']}, SQLite {report['sqlite']}, runner at {report['runner_revision']}")
    for name, versions in report["versions"].items():
        lines.append(f"{name} environment: " + ", ".join(f"{k}=={v}" for k, v in versions.items()))
    lines.append("")
    header = ("system", "steps", "median ms", "p99 ms", "1-100 ms", "last100 ms", "growth", "raw ms", "x raw",
              "x raw(1)", "bytes/step", "total s")
    rows = [header]
    for name in ("raw", "runner", "langgraph", "dbos"):
        result = report["systems"].get(name)
        if result is None:
            continue
        steps = str(result["steps"]) + ("*" if result.get("stopped_by_budget") else "")
        rows.append((
            LABELS[name],
            steps,
            _fmt(result["median_ms"], ".3f"),
            _fmt(result["p99_ms"], ".3f"),
            _fmt(result["first100_median_ms"], ".3f"),
            _fmt(result["last100_median_ms"], ".3f"),
            _fmt(result["growth"], ".2f"),
            _fmt(result["raw_fsync_median_ms"], ".3f"),
            _fmt(result["ratio_to_raw"], ".2f"),
            _fmt(result.get("ratio_to_runner_phase_raw"), ".2f"),
            _fmt(result["bytes_per_step"], ",.0f"),
            _fmt(result.get("wall_s"), ".1f"),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [cell.rjust(widths[j]) for j, cell in enumerate(row) if j > 0]
        lines.append("  ".join(cells))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("growth = median of the last 100 steps / median of steps 1-100; raw ms = median of the raw fsync'd")
    lines.append("appends interleaved with that system's steps (same folder, same moments); "
                 "x raw = median ms / raw ms;")
    lines.append("x raw(1) = median ms / the raw median of the first row (the runner's phase).")
    if any(r.get("stopped_by_budget") for r in report["systems"].values()):
        lines.append(f"* stopped by the {report['budget_s']:.0f} s budget before the requested step count.")
    for name in ("runner", "langgraph", "dbos"):
        result = report["systems"].get(name)
        if result:
            details = ", ".join(f"{k}={v}" for k, v in result["details"].items() if k != "files")
            size = result["bytes_on_disk"]
            load = result.get("load_average")
            lines.append(f"{LABELS[name]}: {size:,} bytes on disk at the end; {details}; "
                         f"1-min load average {load[0]} -> {load[1]}")
    for note in report["notes"]:
        lines.append(note)
    for failure in report["failures"]:
        lines.append("")
        lines.append(f"FAILED: {failure['what']}")
        lines.append(failure["detail"])
    lines.append(f"Run took {report['elapsed_s']:.1f} s (installs included).")
    return "\n".join(lines)


# -- orchestration ------------------------------------------------------------------------


def compare(steps: int, langgraph_steps: int, budget: float, scratch: Optional[str], keep_venv: Optional[str],
            log: Callable[[str], None]) -> Dict[str, Any]:
    import sqlite3

    began = time.perf_counter()
    root = tempfile.mkdtemp(prefix="compare-", dir=scratch)
    venv_root = os.path.abspath(keep_venv) if keep_venv else tempfile.mkdtemp(prefix="compare-venv-")
    report: Dict[str, Any] = {
        "steps": steps,
        "budget_s": budget,
        "scratch": root,
        "filesystem": filesystem_of(os.path.realpath(root)),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "runner_revision": runner_revision(),
        "pins": PINS,
        "versions": {},
        "systems": {},
        "failures": [],
        "notes": [],
    }
    try:
        pythons: Dict[str, str] = {}
        for name in PINS:
            try:
                report["versions"][name] = ensure_env(name, os.path.join(venv_root, name), log)
                pythons[name] = venv_python(os.path.join(venv_root, name))
            except Failure as failure:
                log(f"{name}: install failed")
                report["failures"].append({"what": failure.what, "detail": failure.detail})

        for name, count in (("runner", steps), ("langgraph", langgraph_steps), ("dbos", steps)):
            if name != "runner" and name not in pythons:
                continue
            folder = os.path.join(root, name)
            data = os.path.join(folder, "data")
            raw_path = os.path.join(folder, "raw-append.jsonl")
            os.makedirs(data)
            if name == "langgraph":
                cap = langgraph_step_cap(free_bytes(root))
                if count > cap:
                    report["notes"].append(f"LangGraph capped at {cap} steps (of {count}) so that its checkpoints "
                                           "fit in half the free disk space.")
                    count = cap
            log(f"{name}: {count} steps")
            settle()
            load_before = os.getloadavg()[0]
            try:
                if name == "runner":
                    measured = measure_runner(count, data, raw_path, budget)
                else:
                    measured = run_worker(name, pythons[name], count, data, raw_path, budget)
            except Failure as failure:
                log(f"{name}: measurement failed")
                report["failures"].append({"what": failure.what, "detail": failure.detail})
                continue
            except Exception:  # a failure of one system must not hide the others' figures
                log(f"{name}: measurement failed")
                report["failures"].append({"what": f"measure {name}", "detail": traceback.format_exc()})
                continue
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            if name == "runner":
                raw = measured["raw"]
                report["systems"]["raw"] = dict(summarise(raw, raw, None), wall_s=sum(raw), details={},
                                                steps_requested=count)
            report["systems"][name] = dict(
                summarise(measured["times"], measured["raw"], measured["bytes_on_disk"]),
                load_average=[round(load_before, 2), round(os.getloadavg()[0], 2)],
                wall_s=measured["wall_s"],
                details=measured["details"],
                steps_requested=count,
                stopped_by_budget=len(measured["times"]) < count,
            )
        floor = report["systems"].get("raw")
        for result in report["systems"].values():
            result["ratio_to_runner_phase_raw"] = None if floor is None else result["median_ms"] / floor["median_ms"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if not keep_venv:
            shutil.rmtree(venv_root, ignore_errors=True)
    report["elapsed_s"] = time.perf_counter() - began
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Compare the cost of durable agent steps: this runner, "
                                                 "LangGraph (SqliteSaver) and DBOS (SQLite).")
    parser.add_argument("--steps", type=int, default=2000, help="durable steps per system (default 2000)")
    parser.add_argument("--langgraph-steps", type=int, default=None, help="steps for LangGraph only (default: --steps)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--keep-venv", metavar="DIR",
                        help="create the environments in DIR and keep them, or reuse them")
    parser.add_argument("--scratch", metavar="DIR",
                        help="folder the measurements write to (default: the system temporary folder)")
    parser.add_argument("--budget", type=float, default=600.0,
                        help="seconds after which a system's loop stops early (default 600)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--raw-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or (args.langgraph_steps is not None and args.langgraph_steps < 1):
        parser.error("step counts must be at least 1")
    if args.worker:
        return worker_main(args.worker, args.steps, args.folder, args.raw_file, args.budget)

    def log(message: str) -> None:
        print(f"[compare] {message}", file=sys.stderr, flush=True)

    report = compare(args.steps, args.langgraph_steps or args.steps, args.budget, args.scratch, args.keep_venv, log)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
