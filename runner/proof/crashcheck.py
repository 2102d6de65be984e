"""Power-loss crash-state explorer for the run store.

A workload drives a real :class:`~runner.stores.file.RunStore` over a
:class:`~runner.proof.recording_fs.RecordingFileSystem`, an in-memory file
system that logs every durable operation and keeps, beside what a process
would read, what the disk is guaranteed to hold. After every operation the explorer asks which on-disk
states a power loss at that moment could leave, loads each one with the real
loader and checks the store's promise: an acknowledged transition is never
lost, and a load never guesses.

The explorer is written in five modules, one part each:
:mod:`runner.proof.crash_model` (the persistence model: what a power loss may
leave), :mod:`runner.proof.recording_fs` (the recording file system),
:mod:`runner.proof.crash_variants` (the deliberately broken write paths),
:mod:`runner.proof.crash_load` (loading one crash state) and this one (the
workload, the crash points and the report).

Invariant checked at each crash point
-------------------------------------

Let A be the last revision acknowledged before the point (a store call
returned) and T the last revision attempted. Once ``init`` has been
acknowledged, ``RunStore.open`` must succeed with a revision r, A <= r <= T,
whose content is exactly the workload's state at revision r, and
``runner.stores.file.scan`` must agree; the run's history (the segments
compaction copied into its history folder, then the journals) must hold
every record from revision 1 to r, each continuing the one before up to
r's head (``history-lost`` otherwise). Under this model a store that keeps its
write protocol loses at most unacknowledged data, so any
:class:`~runner.base.errors.StateUnrecoverable` there is a violation. Before
``init`` is acknowledged a load may report "no run" (and a new ``init`` must
then succeed) or give revision 0. For a sample of states the explorer also
commits once more after the load and reloads, because some write paths break
only on the next write.

The head witness
----------------

``head.json`` is modelled like any file: its in-place overwrites are unsynced
writes that a power loss may keep, lose or cut, so crash states hold older
heads and torn ones. The invariant above is what makes them safe: any
``StateUnrecoverable`` after ``init`` was acknowledged is a violation, so a
head that raised an alarm over an honest power loss would be counted
(``false_alarms``). The report also counts how the head stood in the states
that loaded (``head_states``: ``current``, ``behind``, ``invalid``,
``missing``; ``ahead`` would be a bug), and after each acknowledgement that
leaves records in the journal it loads one more state outside the power-loss
model: the folder as a process sees it with the journal cut at a random byte,
which loses acknowledged records and must stop the run (``losses_probed``,
``losses_caught``; a miss is a ``loss-unnoticed`` violation).
"""

import bisect
import random
import time
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple

from ..base.errors import InvalidInput, StateUnrecoverable
from ..stores.file import RunStore
from ..base.windows import Observer
from .crash_load import _RUN, _digest, _load, _Outcome, _tick_clock, _tree_key
from .crash_model import DIR_COMBO_LIMIT, CrashSpace, Tree
from .crash_variants import VARIANTS, _Variant, _variant
from .faults import Chain
from .recording_fs import LogEntry, RecordingFileSystem

__all__ = [
    "DIR_COMBO_LIMIT",
    "VARIANTS",
    "LogEntry",
    "CrashSpace",
    "RecordingFileSystem",
    "explore",
]

_CLOCK_START = 1_767_225_600.0  # a fixed instant, so every run of a seed is identical
_TORN_TAIL = b'{"h":"' + b"5" * 40  # an append cut short before its newline


class _MarkWindows(Observer):
    """Writes each window the store passes into the disk's log, so a crash point can be named by its window."""

    def __init__(self, disk: RecordingFileSystem) -> None:
        self.disk = disk

    def reached(self, window: str, **facts: Any) -> None:
        self.disk.mark("window", window)


class _Point(NamedTuple):
    log_len: int  # entries in the log when the point was taken
    op: str
    possible: int
    exact: bool
    explored: int
    sampled: bool
    outcomes: Dict[str, int]  # tree key -> how many explored states gave that tree


class _Explorer:
    """Collects, after every operation, the crash states of that moment and their load outcomes."""

    def __init__(self, variant: _Variant, seed: int, cap: int, followup_rate: float, plan: Dict[str, Any],
                 task_id: str) -> None:
        self.variant = variant
        # Separate streams, so the states counted do not depend on the cap or
        # on which states were sampled.
        self.cuts = random.Random(f"cuts/{seed}")
        self.estimates = random.Random(f"estimates/{seed}")
        self.sampling = random.Random(f"sampling/{seed}")
        self.followup_draws = random.Random(f"followups/{seed}")
        self.cap = cap
        self.followup_rate = followup_rate
        self.plan = plan
        self.task_id = task_id
        self.points: List[_Point] = []
        self.outcomes: Dict[str, _Outcome] = {}
        self.followups = 0

    def observe(self, fs: RecordingFileSystem) -> None:
        space = fs.crash_space(self.cuts)
        possible, exact = space.count(self.estimates)
        sampled = possible > self.cap
        trees = space.sample(self.cap, self.sampling) if sampled else list(space.enumerate())
        counts: Dict[str, int] = {}
        for tree in trees:
            key = _tree_key(tree)
            if key not in self.outcomes:
                followup = self.followup_draws.random() < self.followup_rate
                self.followups += followup
                self.outcomes[key] = _load(tree, self.variant, self.plan, self.task_id, followup)
            counts[key] = counts.get(key, 0) + 1
        last = fs.log[-1].describe() if fs.log else "(before the first operation)"
        self.points.append(_Point(len(fs.log), last, possible, exact, len(trees), sampled, counts))


def _judge(outcome: _Outcome, acked: Optional[int], attempted: Optional[int],
           refs: Dict[int, str]) -> List[Tuple[str, str]]:
    """The invariants ``outcome`` breaks at a crash point with acknowledged ``acked`` and attempted ``attempted``."""
    problems: List[Tuple[str, str]] = []
    if outcome.scan_problem:
        problems.append(("scan-disagrees", outcome.scan_problem))
    if outcome.history:
        problems.append(("history-lost", outcome.history))
    if outcome.error is not None and outcome.error not in (InvalidInput.__name__, StateUnrecoverable.__name__):
        problems.append(("unexpected-error", outcome.message))
        return problems
    if acked is None:
        if outcome.error == StateUnrecoverable.__name__:
            problems.append(("bad-init-state", f"StateUnrecoverable before init was acknowledged: {outcome.message}"))
        elif outcome.error is None and outcome.revision != 0:
            problems.append(("bad-init-state", f"loaded revision {outcome.revision} before init was acknowledged"))
        elif outcome.error is None and outcome.digest != refs.get(0):
            problems.append(("content", "revision 0 differs from the state init created"))
    elif outcome.error == StateUnrecoverable.__name__:
        problems.append(("unrecoverable",
                         f"StateUnrecoverable although revision {acked} was acknowledged: {outcome.message}"))
    elif outcome.error == InvalidInput.__name__:
        problems.append(("no-run", f"'no run' although init was acknowledged: {outcome.message}"))
    else:
        r = outcome.revision
        assert r is not None and attempted is not None
        if r < acked:
            problems.append(("lost-ack", f"loaded revision {r}, but revision {acked} was acknowledged"))
        elif r > attempted:
            problems.append(("phantom", f"loaded revision {r}, but only {attempted} was ever attempted"))
        elif outcome.digest != refs.get(r):
            problems.append(("content", f"revision {r} differs from the workload's state at revision {r}"))
    if outcome.followup and not problems:
        problems.append(("reinit-refused" if outcome.error == InvalidInput.__name__ else "next-write",
                         outcome.followup))
    return problems


def _workload(
    rec: RecordingFileSystem,
    variant: _Variant,
    transitions: int,
    rng: random.Random,
    plan: Dict[str, Any],
    task_id: str,
    probes: Optional[List[Tree]] = None,
    probe_rng: Optional[random.Random] = None,
) -> Dict[int, str]:
    """Drive the store through init, ``transitions`` commits, compactions and two repairs.

    Returns the digest of the reference state at every revision. A third of
    the way in, the snapshot is damaged behind the store's back and a fresh
    store opened (its next commit quarantines and rewrites it); two thirds of
    the way, a torn record is left at the journal's end (the next commit
    truncates it). Each window the store passes is marked in the log.
    After each acknowledgement that leaves records in the journal,
    ``probes`` gets a copy of the folder as a process sees it with the
    journal cut at a random byte (from ``probe_rng``): outside damage that
    loses acknowledged records, which the head witness must expose.
    """
    clock = _tick_clock(_CLOCK_START)
    options = variant.options(rec, clock)
    options["observer"] = Chain(_MarkWindows(rec), options["observer"])
    refs: Dict[int, str] = {}
    rec.mark("attempt", 0)
    store = RunStore.create(_RUN, task_id, plan, **options)
    refs[0] = _digest(store.state)
    rec.mark("ack", 0)
    damage = {max(1, transitions // 3): "snapshot", max(2, (2 * transitions) // 3): "torn"}
    # Large records: in pairs, and right after the snapshot repair (whose
    # compaction leaves an empty journal), so that a compaction falls due
    # with nothing appended since the last one.
    large = {i for i in range(1, transitions + 1) if i % 10 in (4, 5)} | {min(damage) + 1}
    live: List[str] = []
    for i in range(1, transitions + 1):
        event = damage.get(i)
        if event == "snapshot":
            def flip(data: bytes) -> bytes:
                mid = len(data) // 2
                return data[:mid] + bytes([data[mid] ^ 0x01]) + data[mid + 1 :]
            rec.damage(_RUN + "/snapshot.json", flip)
            store = RunStore.open(_RUN, **options)
        elif event == "torn":
            rec.damage(_RUN + "/journal.jsonl", lambda data: data + _TORN_TAIL)
            store = RunStore.open(_RUN, **options)
        if i in large:
            ops = [["set", ["effects", "blob"], {"data": "%x" % rng.getrandbits(4800), "n": i}]]
        elif i % 10 == 7 and "blob" in store.state["effects"]:
            ops = [["del", ["effects", "blob"]]]
        else:
            roll = rng.random()
            if live and roll < 0.2:
                ops = [["del", ["effects", live.pop(rng.randrange(len(live)))]]]
            elif live and roll < 0.55:
                key = rng.choice(live)
                ops = [["set", ["effects", key], {"status": "done", "n": i, "note": "%x" % rng.getrandbits(64)}]]
            else:
                key = f"e{i}"
                live.append(key)
                ops = [["set", ["effects", key], {"status": "pending", "n": i, "note": "x" * rng.randrange(8, 60)}]]
        revision = store.revision + 1
        rec.mark("attempt", revision)
        store.commit(ops)
        if store.revision != revision:
            raise AssertionError(f"the workload expected revision {revision}, the store reports {store.revision}")
        refs[revision] = _digest(store.state)
        rec.mark("ack", revision)
        if probes is not None and probe_rng is not None:
            tree = rec.tree()
            journal = tree.get(_RUN + "/journal.jsonl")
            if journal:
                tree[_RUN + "/journal.jsonl"] = journal[: probe_rng.randrange(len(journal))]
                probes.append(tree)
    return refs


def explore(
    transitions: int = 40,
    seed: int = 1,
    max_states_per_point: int = 64,
    variant: Optional[str] = None,
    followup_rate: float = 0.5,
) -> Dict[str, Any]:
    """Run the workload over a recording file system and check every crash state it could leave.

    ``variant`` selects a deliberately broken write path (one of
    :data:`VARIANTS`) to show the check bites. Everything is deterministic
    from ``seed``. The report's counts: ``crash_points`` (one after every
    operation or damage event, plus the empty start), ``states_possible``
    (exact only when ``possible_exact``), ``states_explored`` (equal to it
    unless ``sampled``), ``violations`` (explored states that broke the
    invariant; ``violation_kinds`` counts them by invariant), the witness's
    figures (``false_alarms``, ``head_states``, ``losses_probed``,
    ``losses_caught``; see the module docs) and ``examples``, each naming the
    operation and the store window (:mod:`runner.base.windows`) its crash point follows.
    """
    if transitions < 3:
        raise ValueError("the workload needs at least 3 transitions")
    if max_states_per_point < 1 or not 0.0 <= followup_rate <= 1.0:
        raise ValueError("max_states_per_point must be at least 1 and followup_rate within [0, 1]")
    started = time.perf_counter()
    config = _variant(variant)
    plan = {"goal": "power-loss exploration", "steps": [{"id": "work"}]}
    task_id = f"powerloss-{seed}"
    explorer = _Explorer(config, seed, max_states_per_point, followup_rate, plan, task_id)
    rec = config.disk()
    explorer.observe(rec)  # the empty disk before anything happened
    rec.observer = explorer.observe
    probes: List[Tree] = []
    workload_rng, probe_rng = random.Random(f"workload/{seed}"), random.Random(f"probes/{seed}")
    refs = _workload(rec, config, transitions, workload_rng, plan, task_id, probes, probe_rng)
    rec.observer = None

    # A point sees the markers written before the next change of the disk:
    # a crash right after an fsync, once the call has returned, must keep it.
    log = rec.log
    acked: List[Optional[int]] = []
    attempted: List[Optional[int]] = []
    a: Optional[int] = None
    t: Optional[int] = None
    for entry in log:
        acked.append(a)
        attempted.append(t)
        if entry.kind == "mark" and entry.name == "ack":
            a = entry.detail
        elif entry.kind == "mark" and entry.name == "attempt":
            t = entry.detail
    acked.append(a)
    attempted.append(t)
    changes = [i for i, entry in enumerate(log) if entry.kind == "op" or entry.name == "damage"]
    # The window a point lies in: the first window marked after its operation, before the next change.
    window_at: List[Optional[str]] = [None] * (len(log) + 1)
    for i in range(len(log) - 1, -1, -1):
        entry = log[i]
        if entry.kind == "mark" and entry.name == "window":
            window_at[i] = entry.detail
        elif entry.kind == "mark" and entry.name != "damage":
            window_at[i] = window_at[i + 1]

    violations = 0
    kinds: Dict[str, int] = {}
    examples: List[Dict[str, Any]] = []
    seen_kinds: Set[str] = set()
    for index, point in enumerate(explorer.points):
        at = bisect.bisect_left(changes, point.log_len)
        upto = changes[at] if at < len(changes) else len(log)
        point_acked, point_attempted = acked[upto], attempted[upto]
        for key, count in point.outcomes.items():
            outcome = explorer.outcomes[key]
            problems = _judge(outcome, point_acked, point_attempted, refs)
            if not problems:
                continue
            violations += count
            for kind, _ in problems:
                kinds[kind] = kinds.get(kind, 0) + count
            fresh = [kind for kind, _ in problems if kind not in seen_kinds]
            if fresh or len(examples) < 3:
                if len(examples) < 8:
                    examples.append(
                        {
                            "crash_point": index,
                            "after": point.op,
                            "window": window_at[point.log_len],
                            "acknowledged": point_acked,
                            "attempted": point_attempted,
                            "state": outcome.summary,
                            "loaded": outcome.revision if outcome.error is None else outcome.error,
                            "invariant": problems[0][0],
                            "problem": "; ".join(message for _, message in problems),
                        }
                    )
                seen_kinds.update(kind for kind, _ in problems)

    heads: Dict[str, int] = {}
    for point in explorer.points:
        for key, count in point.outcomes.items():
            status = explorer.outcomes[key].head
            if status:
                heads[status] = heads.get(status, 0) + count
    caught = 0
    for probe in probes:
        outcome = _load(probe, config, plan, task_id, followup=False)
        if outcome.error == StateUnrecoverable.__name__:
            caught += 1
            continue
        violations += 1
        kinds["loss-unnoticed"] = kinds.get("loss-unnoticed", 0) + 1
        if len(examples) < 8:
            loaded = outcome.revision if outcome.error is None else outcome.error
            examples.append({"crash_point": None, "after": "outside damage: the journal cut at a random byte",
                             "acknowledged": max(refs), "attempted": max(refs), "state": outcome.summary,
                             "loaded": loaded, "invariant": "loss-unnoticed",
                             "problem": f"acknowledged records were cut off and the load gave {loaded!r}"})

    ops = rec.operations
    return {
        "variant": variant or "none",
        "seed": seed,
        "transitions": transitions,
        "crash_points": len(explorer.points),
        "states_possible": sum(p.possible for p in explorer.points),
        "possible_exact": all(p.exact for p in explorer.points),
        "states_explored": sum(p.explored for p in explorer.points),
        "sampled": any(p.sampled for p in explorer.points),
        "points_sampled": sum(1 for p in explorer.points if p.sampled),
        "distinct_states": len(explorer.outcomes),
        "followups": explorer.followups,
        "violations": violations,
        "violation_kinds": dict(sorted(kinds.items())),
        "false_alarms": kinds.get("unrecoverable", 0),
        "head_states": dict(sorted(heads.items())),
        "losses_probed": len(probes),
        "losses_caught": caught,
        "examples": examples,
        "workload": {
            "operations": len(ops),
            "revisions": max(refs),
            "compactions": sum(1 for e in ops if e.name == "replace" and e.path.endswith("/journal.jsonl")),
            "archived": sum(1 for e in ops if e.name == "replace" and e.path.endswith(".jsonl.gz.tmp")),
            "quarantines": sum(1 for e in ops if e.name == "mkdir" and "/quarantine/" in e.path),
            "torn_repairs": sum(1 for e in ops if e.name == "truncate"),
        },
        "seconds": round(time.perf_counter() - started, 3),
    }
