"""Helpers shared by the store and command-line tests.

Child processes run ``sys.executable -S`` (no ``site``) unless a test asks for
the full interpreter start: the runner needs only the standard library, and
skipping ``site`` keeps each child's start-up short. For the same reason this
module imports ``subprocess``, ``tempfile`` and ``concurrent.futures`` only
where they are used, since the crash test's child program imports it too.
"""

import copy
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

#: tests/support/, the suite's helpers; the programs the tests start by path are in its scripts/.
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
#: Held by an in-process command line call, which changes this process's stdout, stderr and environment.
_IN_PROCESS = threading.RLock()
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
RUNNER_PKG = os.path.join(REPO_ROOT, "runner")
TEMPLATE = os.path.join(REPO_ROOT, "templates", "run-contract.example.md")

if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from runner.ledger.envelope import apply_ops
from runner.base.canonical import content_digest  # noqa: E402
from runner.stores.file import STATE_FILES, RunStore  # noqa: E402

QUARANTINE = "quarantine"
TASK_ID = "store-test"

#: Seconds since the epoch at which the deterministic test clock starts.
CLOCK_START = 1_790_000_000.0

#: ``RUNNER_FULL_TESTS=1``: the proofs' long versions (more documents, kills, copies, rounds, pairings).
FULL_TESTS = os.environ.get("RUNNER_FULL_TESTS") == "1"


class Result(NamedTuple):
    """What one child process did: exit code, stdout and stderr as text."""

    code: int
    out: str
    err: str

    @property
    def json(self) -> Dict[str, Any]:
        """The single JSON object a ``--json`` command printed (see :func:`one_json`)."""
        return one_json(self)


_BYTECODE: Optional[str] = None


def _bytecode_cache() -> str:
    """A temporary folder where children cache compiled modules (never inside the repository).

    It is filled once, here, so that children started together do not each
    compile the runner, and removed when this process exits.
    """
    import atexit
    import compileall
    import shutil
    import tempfile

    global _BYTECODE
    inherited = os.environ.get("RUNNER_TESTS_PYCACHE")
    if _BYTECODE is None and inherited and os.path.isdir(inherited):
        # A child of the test process: the parent made the folder and removes it.
        _BYTECODE = inherited
    if _BYTECODE is None:
        _BYTECODE = tempfile.mkdtemp(prefix="runner-tests-pycache-")
        atexit.register(shutil.rmtree, _BYTECODE, True)
        os.environ["RUNNER_TESTS_PYCACHE"] = _BYTECODE  # children (even killed ones) reuse it
        saved = sys.pycache_prefix
        sys.pycache_prefix = _BYTECODE
        try:
            compileall.compile_dir(RUNNER_PKG, quiet=2)
            # What the crash test's child program imports of the suite.
            for source in (os.path.join(REPO_ROOT, "tests", "__init__.py"), os.path.join(HERE, "__init__.py"), __file__):
                compileall.compile_file(source, quiet=2)
        finally:
            sys.pycache_prefix = saved
    return _BYTECODE


def scratch_dir(prefix: str = "runner-test-") -> Any:
    """A temporary folder, in memory (``/dev/shm``) when the system has one.

    Tests that kill processes make hundreds of fsync calls; the claims they
    check are about the death of a process, which any file system survives,
    so a memory file system keeps them fast without weakening them.
    """
    import tempfile

    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
    return tempfile.TemporaryDirectory(prefix=prefix, dir=where)


def child_env(pythonpath: bool = True, **extra: str) -> Dict[str, str]:
    """The environment of a child: no RUNNER_DIR, the repository importable, bytecode cached in a temp folder."""
    with _IN_PROCESS:  # not while an in-process call has changed this process's environment
        env = dict(os.environ)
    env.pop("RUNNER_DIR", None)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = _bytecode_cache()
    if pythonpath:
        env["PYTHONPATH"] = REPO_ROOT
    env.update(extra)
    return env


def python(*args: str, site: bool = False) -> List[str]:
    return [sys.executable] + ([] if site else ["-S"]) + list(args)


def run(
    argv: Sequence[str],
    *,
    cwd: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    umask: Optional[int] = None,
    timeout: float = 60,
    input: Optional[bytes] = None,
) -> Result:
    """Run ``argv`` to completion and return its exit code and output; ``input`` is its stdin."""
    import subprocess

    kwargs: Dict[str, Any] = {}
    if umask is not None:
        kwargs["umask"] = umask
    if input is not None:
        kwargs["input"] = input
    else:
        kwargs["stdin"] = subprocess.DEVNULL
    proc = subprocess.run(
        list(argv),
        cwd=cwd or REPO_ROOT,
        env=env if env is not None else child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=timeout,
        **kwargs,
    )
    return Result(proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))


def run_cli(
    *args: str,
    cwd: Optional[str] = None,
    via: str = "module",
    site: bool = False,
    env: Optional[Dict[str, str]] = None,
    umask: Optional[int] = None,
    timeout: float = 60,
) -> Result:
    """Run the command line in a child: ``python -m runner ARGS`` or ``python path/to/runner ARGS``.

    ``via="module"`` finds the package through PYTHONPATH (so any ``cwd``
    works); ``via="path"`` runs the package folder by its path, with no
    PYTHONPATH at all.
    """
    if via == "module":
        argv = python("-m", "runner", *args, site=site)
        environment = env if env is not None else child_env()
    elif via == "path":
        argv = python(RUNNER_PKG, *args, site=site)
        environment = env if env is not None else child_env(pythonpath=False)
    else:
        raise ValueError(via)
    return run(argv, cwd=cwd, env=environment, umask=umask, timeout=timeout)


T = TypeVar("T")


def wait_for(what: str, check: Callable[[], Any], seconds: float = 60.0) -> Any:
    """Poll ``check`` every 50 ms until it returns something true, and return that; fail naming ``what`` after
    ``seconds`` (a bound for a machine far past its cores, never a measure)."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds:g} s for {what}")
        time.sleep(0.05)


def in_parallel(jobs: Sequence[Callable[[], T]], workers: int = 4) -> List[T]:
    """Run ``jobs`` (each mostly waiting on a child process) a few at a time; results in order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: job(), jobs))


def in_process_cli(argv: Sequence[str], env: Optional[Dict[str, str]] = None) -> Result:
    """Run ``runner.surfaces.cli.main(argv)`` in this process with RUNNER_DIR unset and ``env`` set, capturing stdout
    and stderr.

    The same entry point as a child process, minus the interpreter start; an
    exception escaping ``main`` fails the calling test. The capture replaces
    the process's stdout and stderr, and ``env`` its environment, so calls
    from several threads take turns; both are restored after the call.
    """
    import contextlib
    import io

    from runner.surfaces.cli import main

    out, err = io.StringIO(), io.StringIO()
    changes: Dict[str, Optional[str]] = {"RUNNER_DIR": None, **(env or {})}
    with _IN_PROCESS:
        saved = {name: os.environ.get(name) for name in changes}
        try:
            _set_environment(changes)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(list(argv))
        finally:
            _set_environment(saved)
    return Result(code, out.getvalue(), err.getvalue())


class SQLiteConnections:
    """Records every SQLite connection this process makes while entered, to check that each was closed.

    ``ResourceWarning`` says the same only on Python 3.13 and later, and only
    when the collector gets to the connection.
    """

    def __enter__(self) -> "SQLiteConnections":
        import sqlite3
        from unittest import mock

        self.made: List[Any] = []
        connect = sqlite3.connect

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.made.append(connect(*args, **kwargs))
            return self.made[-1]

        self._patch = mock.patch("sqlite3.connect", recorded)
        self._patch.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._patch.stop()

    def left_open(self) -> int:
        """How many of the connections made are still open."""
        import sqlite3

        count = 0
        for db in self.made:
            try:
                db.execute("SELECT 1").close()
            except sqlite3.ProgrammingError:  # closed
                continue
            count += 1
        return count


def _set_environment(values: Dict[str, Optional[str]]) -> None:
    """Set each variable of ``values`` in this process's environment; None removes it."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def stderr_lines(result: Result) -> List[str]:
    return result.err.splitlines()


def one_json(result: Result) -> Dict[str, Any]:
    """The single JSON object a ``--json`` command printed; fails loudly otherwise."""
    lines = result.out.splitlines()
    if len(lines) != 1:
        raise AssertionError(f"expected one line on stdout, got {len(lines)}: {result.out!r} (stderr {result.err!r})")
    value = json.loads(lines[0])
    if not isinstance(value, dict):
        raise AssertionError(f"stdout is not a JSON object: {lines[0]!r}")
    return value


# -- contracts ------------------------------------------------------------------

def contract_block(task_id: str = TASK_ID) -> Dict[str, Any]:
    """A small valid contract block."""
    return {
        "contract": 1,
        "task_id": task_id,
        "goal": "Exercise the run store.",
        "steps": [{"id": "only", "artifact": "a file", "check": "it exists", "next": "done"}],
    }


def contract_markdown(block_text: str) -> str:
    return "# Run contract\n\nA contract written by the tests.\n\n```json run-contract\n" + block_text.rstrip("\n") + "\n```\n"


def write_contract(path: str, block: Optional[Dict[str, Any]] = None, raw_block: Optional[str] = None) -> str:
    """Write a contract file holding ``block`` (or the literal ``raw_block`` text); return its path."""
    text = raw_block if raw_block is not None else json.dumps(block if block is not None else contract_block(), indent=2)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(contract_markdown(text))
    return path


# -- transitions and runs ---------------------------------------------------------

def transition_ops(rev: int, pad: int = 0) -> List[List[Any]]:
    """The deterministic operations of the transition to revision ``rev``."""
    ops: List[List[Any]] = [
        ["set", ["effects", f"e{rev:04d}"], {"rev": rev, "state": "verified", "note": "n" * (8 + rev % 5 + pad)}]
    ]
    if rev % 3 == 0:
        ops.append(["del", ["effects", f"e{rev - 2:04d}"]])
    return ops


def next_effects(effects: Dict[str, Any], rev: int, pad: int = 0) -> Dict[str, Any]:
    """The effects after the transition to ``rev`` is applied to ``effects``."""
    state = {"effects": copy.deepcopy(effects)}
    apply_ops(state, transition_ops(rev, pad))
    return state["effects"]


def effects_digest(effects: Dict[str, Any]) -> str:
    return content_digest(effects)


def stepping_clock() -> Callable[[], float]:
    """A clock that advances one second per reading."""
    now = [CLOCK_START]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    return clock


class BuiltRun(NamedTuple):
    """A run built in-process: its folder, every revision's state and its files at the end."""

    path: str
    states: Dict[int, Dict[str, Any]]
    files: Dict[str, bytes]  # state files (top level) after the last transition
    history: Dict[int, Dict[str, bytes]]  # the same, as they stood after each revision

    @property
    def latest(self) -> int:
        return max(self.states)


def build_run(
    path: str,
    transitions: int,
    *,
    compact_after: Sequence[int] = (),
    compact_min_bytes: int = 1 << 40,
    pad: int = 0,
    task_id: str = TASK_ID,
    plan: Optional[Dict[str, Any]] = None,
) -> BuiltRun:
    """Create a run in ``path`` and commit ``transitions`` transitions.

    With the default ``compact_min_bytes`` the store never compacts on its
    own; ``compact_after`` lists revisions after which :meth:`RunStore.compact`
    is called, so the layout of the files is fixed by the caller. ``plan``
    defaults to :func:`contract_block`.
    """
    plan = contract_block(task_id) if plan is None else plan
    store = RunStore.create(path, task_id, plan, clock=stepping_clock(), compact_min_bytes=compact_min_bytes, durability="process")
    try:
        states = {0: copy.deepcopy(store.state)}
        history = {0: read_state_files(path)}
        for rev in range(1, transitions + 1):
            store.commit(transition_ops(rev, pad))
            if rev in compact_after:
                store.compact()
            states[rev] = copy.deepcopy(store.state)
            history[rev] = read_state_files(path)
    finally:
        store.fs.close()  # type: ignore[attr-defined]
    return BuiltRun(path, states, history[transitions], history)


def read_state_files(path: str) -> Dict[str, bytes]:
    """The run's state files at the top of ``path`` (not the lock, not quarantine)."""
    out = {}
    for name in STATE_FILES:
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as handle:
                out[name] = handle.read()
    return out


def write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def read_flat(path: str) -> Dict[str, bytes]:
    """The bytes of each regular file directly in ``path``."""
    out = {}
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                fd = os.open(entry.path, os.O_RDONLY)
                try:
                    out[entry.name] = os.read(fd, entry.stat(follow_symlinks=False).st_size + 1)
                finally:
                    os.close(fd)
    return out


def journal_records(data: bytes) -> List[Tuple[int, int]]:
    """``(start, end)`` byte offsets of each newline-terminated line."""
    spans = []
    start = 0
    while True:
        nl = data.find(b"\n", start)
        if nl < 0:
            return spans
        spans.append((start, nl + 1))
        start = nl + 1


# -- folder listings ----------------------------------------------------------------

def listing(path: str) -> Dict[str, Tuple[str, int, int, int]]:
    """Every entry under ``path`` (itself included as ``.``): kind, size, mtime (ns) and mode."""
    out: Dict[str, Tuple[str, int, int, int]] = {}

    def entry(full: str, rel: str) -> None:
        st = os.lstat(full)
        kind = "link" if os.path.islink(full) else "dir" if os.path.isdir(full) else "file"
        out[rel] = (kind, st.st_size if kind != "dir" else 0, st.st_mtime_ns, st.st_mode)

    entry(path, ".")
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            entry(full, os.path.relpath(full, path))
    return out


def contents(path: str) -> Dict[str, bytes]:
    """The bytes of every regular file under ``path``, by relative path."""
    out: Dict[str, bytes] = {}
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if os.path.isfile(full) and not os.path.islink(full):
                with open(full, "rb") as handle:
                    out[os.path.relpath(full, path)] = handle.read()
    return out


def quarantine_folders(path: str) -> List[str]:
    root = os.path.join(path, QUARANTINE)
    if not os.path.isdir(root):
        return []
    return sorted(os.path.join(root, name) for name in os.listdir(root))


# -- PostgreSQL ---------------------------------------------------------------------

POSTGRES_ENV = "RUNNER_TEST_POSTGRES_URL"


def postgres_unavailable() -> Optional[str]:
    """Why the PostgreSQL tests cannot run here (the reason a skip gives), or None when they can."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        return f"PostgreSQL not reachable: set {POSTGRES_ENV} (CI sets it)"
    try:
        import psycopg
    except ImportError as exc:
        return f"PostgreSQL not reachable: psycopg 3 is not importable by {sys.executable} ({exc}); {POSTGRES_ENV} is set (CI sets it)"
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except Exception as exc:
        detail = " ".join(str(exc).split())[:200]
        return f"PostgreSQL not reachable: the server at {POSTGRES_ENV} does not answer ({type(exc).__name__}: {detail}) (CI sets it)"
    return None
