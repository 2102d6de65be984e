"""Loading one crash state with the real loader, and what it gave.

Each distinct state is loaded once, however many crash points can leave it:
``RunStore.open`` and ``scan`` must agree, the run's history (its history
folder and journals) must hold every record from revision 1 to the one
loaded, chained to its head, and for a sample of states the store commits
once more and reloads (or, after "no run", a new ``init`` must succeed).
"""

import hashlib
from typing import Any, Callable, Dict, NamedTuple, Optional

from ..base.canonical import canonical_json
from ..base.errors import InvalidInput, RunnerError
from ..stores.codec import decode_identity
from ..stores.file import HEAD, RunStore, decode_head, scan
from .crash_model import Tree
from .crash_variants import _Variant
from .recording_fs import RecordingFileSystem

#: The run folder of every crash state, on the recording file system.
_RUN = "/run"
#: The one instant every load and its follow-up happen at.
_LOAD_CLOCK = 1_767_312_000.0


class _Outcome(NamedTuple):
    """What loading one crash state gave; shared by every crash point that can leave that state."""

    error: Optional[str]  # class name of the exception open() raised, if any
    message: str
    revision: Optional[int]
    digest: Optional[str]  # SHA-256 of the loaded state's canonical JSON
    scan_problem: Optional[str]
    followup: Optional[str]  # None: not tried; "" passed; else what went wrong
    summary: str
    head: str = ""  # after a load: the witness was "current", "behind", "invalid" or "missing"
    history: str = ""  # after a load: "" when the history holds every record up to the one loaded, else why not


def _tick_clock(start: float) -> Callable[[], float]:
    """A deterministic clock that advances one millisecond per reading."""
    now = [start]

    def clock() -> float:
        now[0] += 0.001
        return now[0]

    return clock


def _digest(state: Dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(state)).hexdigest()


def _tree_key(tree: Tree) -> str:
    h = hashlib.sha256()
    for path in sorted(tree):
        data = tree[path]
        h.update(path.encode() + b"\0" + (b"D" if data is None else b"F%d:" % len(data) + data) + b"\0")
    return h.hexdigest()


def _summary(tree: Tree) -> str:
    """A one-line listing of a crash state: each file under the run folder and its size."""
    parts = []
    prefix = _RUN + "/"
    for path in sorted(tree):
        if not path.startswith(prefix):
            continue
        data = tree[path]
        name = path[len(prefix) :]
        if data is None:
            continue
        parts.append(f"{name}={len(data)}B" + ("" if not data or data.endswith(b"\n") else "(no final newline)"))
    if _RUN not in tree:
        return "no run folder"
    return " ".join(parts) or "empty run folder"


def _load(tree: Tree, variant: _Variant, plan: Dict[str, Any], task_id: str, followup: bool) -> _Outcome:
    """Load ``tree`` with the real loader, compare with ``scan``, and optionally write once more.

    Never raises: anything unexpected is reported in the outcome.
    """
    fs = variant.disk.from_tree(tree)

    def clock() -> float:
        return _LOAD_CLOCK  # loads and their follow-ups all happen at one fixed instant

    options = variant.options(fs, clock)
    summary = _summary(tree)
    scan_problem: Optional[str] = None
    try:
        found = scan(_RUN, fs)
    except Exception as exc:  # the loader must not fail this way; report it
        found = None
        scan_problem = f"scan raised {type(exc).__name__}: {exc}"
    try:
        store = RunStore.open(_RUN, **options)
    except RunnerError as exc:
        if found is not None and found.state is not None:
            scan_problem = f"scan loaded revision {found.state['revision']} but open raised {type(exc).__name__}"
        outcome = _Outcome(type(exc).__name__, exc.message, None, None, scan_problem, None, summary)
        if followup and isinstance(exc, InvalidInput):
            outcome = outcome._replace(followup=_reinit(fs, variant, plan, task_id, clock))
        return outcome
    except Exception as exc:
        return _Outcome(type(exc).__name__, f"unexpected {type(exc).__name__}: {exc}", None, None, scan_problem, None,
                        summary)
    revision = int(store.state["revision"])
    digest = _digest(store.state)
    if found is not None and (found.state is None or _digest(found.state) != digest):
        scan_problem = "scan and open disagree about the state"
    outcome = _Outcome(None, "", revision, digest, scan_problem, None, summary, _head_status(tree, revision),
                       _history_problem(store))
    if followup:
        outcome = outcome._replace(followup=_write_again(store, fs, variant, clock))
    return outcome


def _head_status(tree: Tree, revision: int) -> str:
    """How the witness in ``tree`` stands to the revision that loaded from it."""
    data = tree.get(_RUN + "/" + HEAD)
    if data is None:
        return "missing"
    try:
        head_rev, _ = decode_head(data, decode_identity(tree[_RUN + "/run.json"] or b""))
    except (KeyError, ValueError, InvalidInput):
        return "invalid"
    return "current" if head_rev == revision else "behind" if head_rev < revision else "ahead"


def _history_problem(store: RunStore) -> str:
    """"" when the run's history (history folder and journals) holds revisions 1 to the one loaded, chained to its
    head; else what is missing."""
    try:
        records, _oldest = store.records_after(0)
    except Exception as exc:  # the loader must not fail this way; report it
        return f"reading the history raised {type(exc).__name__}: {exc}"
    if store.history_findings:
        return "; ".join(f.message for f in store.history_findings)
    revisions = [record["rev"] for record in records]
    if revisions != list(range(1, store.revision + 1)):
        held = f"{revisions[0]} to {revisions[-1]}" if revisions else "none"
        return f"the history holds revisions {held} ({len(revisions)} records) of the {store.revision} loaded"
    if records and records[-1]["hash"] != store.state["head"]:
        return "the history's last record is not the loaded state's head"
    return ""


def _write_again(store: RunStore, fs: RecordingFileSystem, variant: _Variant, clock: Callable[[], float]) -> str:
    """Commit once more after a load and reload: "" when revision r+1 reloads identically."""
    before = store.revision
    try:
        store.commit([["set", ["effects", "probe"], {"status": "after-crash"}]])
        after = store.revision
        expected = _digest(store.state)
        again = RunStore.open(_RUN, **variant.options(fs, clock))
    except Exception as exc:
        return f"the next commit after loading revision {before} failed: {type(exc).__name__}: {exc}"
    if after != before + 1:
        return f"the next commit after loading revision {before} gave revision {after}"
    if again.revision != after or _digest(again.state) != expected:
        return f"after committing revision {after}, a reload gave revision {again.revision} with other content"
    return ""


def _reinit(fs: RecordingFileSystem, variant: _Variant, plan: Dict[str, Any], task_id: str,
            clock: Callable[[], float]) -> str:
    """After "no run", a new init must succeed and reload at revision 0: "" when it does."""
    try:
        store = RunStore.create(_RUN, task_id, plan, **variant.options(fs, clock))
        again = RunStore.open(_RUN, fs=fs, clock=clock)
    except Exception as exc:
        return f"a new init after 'no run' failed: {type(exc).__name__}: {exc}"
    if again.revision != 0 or _digest(again.state) != _digest(store.state):
        return f"a new init after 'no run' reloaded at revision {again.revision} with other content"
    return ""

