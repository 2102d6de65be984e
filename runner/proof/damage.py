"""``campaign --damage N``: copies of real run folders, each damaged at random and loaded in a fresh process.

The promise under test is the store's rule for damaged state: a load gives
exactly the state that was acknowledged (a torn tail of a never-acknowledged
append may be dropped), or it stops with exit 7 after moving the files, byte
for byte, into ``quarantine/``, or it refuses with a clear error. What it
must never do is load some other state and say nothing: a *silent
acceptance*, such as an older revision after the newest journal records were
lost, from which the run would begin its effects again.

The campaign builds three real runs through the library (``Run``): effects
begun, acknowledged, verified, found absent and left uncertain, a step done
and another running, a job's intent, a cost; one run compacted several times
(so all six files exist), one never compacted (its snapshot is still
revision 0 and only the journal and the head know how far it got), and a
third with the same task id, a donor of foreign files. It also keeps older
copies of the first two, taken part way. Then, for each of ``N`` copies, it
picks a run and one damage:

* ``truncate``: a file cut at a random byte;
* ``flip``: one byte of a file XORed with a random non-zero mask;
* ``delete``: a file removed;
* ``swap-other``: a file replaced by the same file of the other run;
* ``swap-older``: a file replaced by the same file of an older copy of this run;
* ``torn-append``: part of one more, never acknowledged, journal line appended.

Each copy is loaded by a real child process (``python3 -S``, one per copy)
that opens it with :meth:`RunStore.open` and prints what it got; the parent
classifies it as ``exact`` (the acknowledged state), ``torn_tail_dropped``
(the acknowledged state, a torn tail dropped), ``quarantined`` (exit 7, every
file moved intact), ``refused`` (exit 2 or 7 with nothing moved),
``silent_acceptance`` (another state, no finding), ``accepted_with_finding``
(another state, a finding but no stop), ``changed_on_load`` (a load that
succeeded but wrote), ``bad_quarantine`` or ``error`` (anything else,
a traceback included). Only the first four keep the rule; the campaign
passes only when every copy is one of them.

A whole folder restored from an older copy is not among the damages drawn:
it is a consistent past state that nothing inside the folder can tell from
the truth (see ``references/state-envelope.md``). :func:`judge_copy` still
classifies it, as a silent acceptance, which is how the tests show the
classifier can fail.
"""

import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..base.canonical import canonical_json, sha256_hex
from ..execution.run import Run
from ..stores.codec import prepare_transition
from ..stores.file import RUN_FILES, RunStore
from . import PACKAGE_PARENT

__all__ = ["DAMAGES", "OUTCOMES", "PASSING", "Source", "build_sources", "damage_copy", "judge_copy",
           "run_damage_campaign"]

#: The damages drawn, one per copy.
DAMAGES = ("truncate", "flip", "delete", "swap-other", "swap-older", "torn-append")

#: Every outcome a copy can have; :data:`PASSING` are those that keep the rule.
OUTCOMES = (
    "exact", "torn_tail_dropped", "quarantined", "refused",
    "silent_acceptance", "accepted_with_finding", "changed_on_load", "bad_quarantine", "error",
)
PASSING = ("exact", "torn_tail_dropped", "quarantined", "refused")

_REPO = PACKAGE_PARENT
#: The child program. The package's ``__init__`` imports the whole library;
#: the child registers the package without it and imports only the store, the
#: same code every verb loads with, so that each of thousands of children starts fast.
_CHILD = (
    "import json, sys, types\n"
    "pkg = types.ModuleType('runner'); pkg.__path__ = [sys.argv[1] + '/runner']; sys.modules['runner'] = pkg\n"
    "from runner.base.errors import RunnerError\n"
    "from runner.stores.file import RunStore\n"
    "from runner.base.canonical import canonical_json, sha256_hex\n"
    "try:\n"
    "    store = RunStore.open(sys.argv[2])\n"
    "except RunnerError as exc:\n"
    "    print(json.dumps({'error': exc.reason, 'exit_code': exc.exit_code, 'message': exc.message, "
    "'quarantine': exc.context.get('quarantine')}))\n"
    "else:\n"
    "    findings = [f.code for f in store.findings if f.level != 'note']\n"
    "    print(json.dumps({'revision': store.revision, 'digest': sha256_hex(canonical_json(store.state)), "
    "'findings': findings}))\n"
)
_TASK = "damage-campaign"
_PLAN = {
    "contract": 1,
    "task_id": _TASK,
    "goal": "A run to damage: effects in every state, a step done and one running.",
    "steps": [{"id": "collect", "artifact": "receipts", "check": "each verified"},
              {"id": "file", "artifact": "tickets", "check": "each verified"}],
    "limits": {"max_effect_attempts": 50, "max_step_attempts": 50},
}


class Source(NamedTuple):
    """One run to copy: its files, the state it acknowledged last, older copies, and a line never acknowledged."""

    name: str
    files: Dict[str, bytes]
    acknowledged: str  # digest of the acknowledged state
    revision: int
    older: List[Dict[str, bytes]]  # the files as they stood part way
    unacknowledged_line: bytes  # the journal line of one more transition, never appended


def state_digest(state: Dict[str, Any]) -> str:
    """SHA-256 of the state's canonical JSON, as the child computes it."""
    return sha256_hex(canonical_json(state))


def _read_files(path: str) -> Dict[str, bytes]:
    out = {}
    for name in RUN_FILES:
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as handle:
                out[name] = handle.read()
    return out


def _clock(start: float) -> Callable[[], float]:
    now = [start]

    def clock() -> float:
        now[0] += 0.25
        return now[0]

    return clock


def _build(path: str, name: str, effects: int, compact_min_bytes: int, clock_start: float,
           rng: random.Random) -> Source:
    """Drive a real run through effects in every state; keep two older copies on the way."""
    store = RunStore.create(path, _TASK, copy.deepcopy(_PLAN), clock=_clock(clock_start),
                            compact_min_bytes=compact_min_bytes, durability="process")
    run = Run(store)
    run.acquire("campaign-worker", ttl=86400)
    run.step_start("collect")
    for n in range(3):
        key = f"fetch-{n}"
        run.effect_begin(key, {"fetch": n})
        run.effect_verify(key, {"fetched": True})
    run.step_done("collect", {"receipts": "3 fetched"})
    run.add_cost({"money": 1.5, "tokens": 1200})
    run.step_start("file")
    older: List[Dict[str, bytes]] = []
    for n in range(effects):
        key = f"doc-{n:03d}"
        run.effect_begin(key, {"doc": n, "text": "x" * rng.randrange(10, 200)})
        fate = n % 6  # started, acknowledged, verified twice, uncertain, found absent
        if fate in (1, 2, 3):
            run.effect_ack(key, {"receipt": f"T-{n:05d}"})
        if fate in (2, 3):
            run.effect_verify(key, {"ticket": f"T-{n:05d}", "seen": True})
        if fate == 4:
            run.effect_uncertain(key, "the target timed out")
        if fate == 5:
            run.effect_absent(key, {"searched": "no ticket"})
        if n in (effects // 3, (2 * effects) // 3):
            older.append(_read_files(path))
    state = copy.deepcopy(store.state)
    files = _read_files(path)
    probe = copy.deepcopy(state)
    line = prepare_transition(probe, [["set", ["effects", "never-acknowledged"], {"state": "started"}]], 1,
                              store.now()).line
    store.fs.close()  # type: ignore[attr-defined]
    return Source(name, files, state_digest(state), int(state["revision"]), older, line)


def build_sources(root: str, seed: int) -> Dict[str, Source]:
    """The runs a campaign damages (``compacted``, ``never-compacted``) and the donor (``other``), built under
    ``root``."""
    rng = random.Random(f"damage-sources/{seed}")
    os.makedirs(root, 0o700, exist_ok=True)
    sources = {
        "compacted": _build(os.path.join(root, "compacted"), "compacted", 40, 3000, 1_790_000_000.0, rng),
        "never-compacted": _build(os.path.join(root, "never-compacted"), "never-compacted", 12, 1 << 40,
                                  1_790_100_000.0, rng),
        "other": _build(os.path.join(root, "other"), "other", 40, 3000, 1_790_200_000.0, rng),
    }
    if (not {"backup.json", "journal.prev.jsonl"} <= set(sources["compacted"].files) or
            "backup.json" in sources["never-compacted"].files):
        raise AssertionError("the campaign's runs do not have the layouts it needs")
    return sources


class Damage(NamedTuple):
    source: str
    kind: str
    file: str
    detail: str


def damage_copy(source: Source, other: Source, rng: random.Random) -> Tuple[Dict[str, bytes], Damage]:
    """One damaged copy of ``source``'s files and what was done to them."""
    files = dict(source.files)
    kind = rng.choice(DAMAGES)
    if kind == "torn-append":
        cut = rng.randrange(1, len(source.unacknowledged_line) - 1)  # never the newline: that would be a whole record
        files["journal.jsonl"] = files["journal.jsonl"] + source.unacknowledged_line[:cut]
        return files, Damage(source.name, kind, "journal.jsonl", f"{cut} bytes of an unacknowledged record appended")
    if kind in ("truncate", "flip"):
        name = rng.choice(sorted(n for n, data in files.items() if data))
        data = files[name]
        at = rng.randrange(len(data))
        if kind == "truncate":
            files[name] = data[:at]
            return files, Damage(source.name, kind, name, f"cut at byte {at} of {len(data)}")
        mask = rng.randrange(1, 256)
        files[name] = data[:at] + bytes([data[at] ^ mask]) + data[at + 1 :]
        return files, Damage(source.name, kind, name, f"byte {at} ^ {mask:#04x}")
    if kind == "delete":
        name = rng.choice(sorted(files))
        del files[name]
        return files, Damage(source.name, kind, name, "deleted")
    donor = other.files if kind == "swap-other" else rng.choice(source.older)
    name = rng.choice(sorted(set(files) & set(donor)))
    files[name] = donor[name]
    return files, Damage(source.name, kind, name,
                         "identical bytes" if donor[name] == source.files[name]
                         else f"{len(donor[name])} bytes swapped in")


def _write_folder(path: str, files: Dict[str, bytes]) -> None:
    os.mkdir(path, 0o700)
    for name, data in files.items():
        fd = os.open(os.path.join(path, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def _child_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RUNNER_") and k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def judge_copy(path: str, files: Dict[str, bytes], source: Source, env: Optional[Dict[str, str]] = None,
               timeout: float = 120) -> Tuple[str, str]:
    """Write ``files`` as a run folder at ``path``, load it in a fresh child process and classify the load.

    Returns ``(outcome, what the child said)``; ``outcome`` is one of :data:`OUTCOMES`.
    """
    _write_folder(path, files)
    proc = subprocess.run(
        [sys.executable, "-S", "-c", _CHILD, _REPO, path],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or _child_env(),
        timeout=timeout,
    )
    said = proc.stdout.decode("utf-8", "replace").strip()
    if proc.returncode != 0 or proc.stderr.strip() or "\n" in said:
        return "error", (f"exit {proc.returncode}: "
                         f"{proc.stderr.decode('utf-8', 'replace').strip()[-400:] or said[-400:]}")
    try:
        report = json.loads(said)
    except ValueError:
        return "error", f"not one JSON line: {said[-400:]}"
    if "error" not in report:
        if _read_files(path) != files or sorted(os.listdir(path)) != sorted(files):
            return "changed_on_load", said
        if report["digest"] == source.acknowledged:
            return ("torn_tail_dropped" if "torn-record" in report["findings"] else "exact"), said
        return ("accepted_with_finding" if report["findings"] else "silent_acceptance"), said
    if report["exit_code"] == 7 and report.get("quarantine"):
        moved = _read_files(report["quarantine"])
        left = [n for n in os.listdir(path) if n != "quarantine"]
        if moved != files or left:
            return "bad_quarantine", f"{said}; moved {sorted(moved)}, left {left}"
        return "quarantined", said
    if report["exit_code"] in (2, 7):
        return ("refused" if _read_files(path) == files else "bad_quarantine"), said
    return "error", said


def run_damage_campaign(copies: int, seed: int = 1, progress: Optional[IO[str]] = None,
                        workers: Optional[int] = None) -> Dict[str, Any]:
    """Damage ``copies`` copies at random (deterministic from ``seed``), load each in a child, and count outcomes."""
    if copies < 1:
        raise ValueError("the campaign needs at least one copy")
    started = time.perf_counter()
    shm = "/dev/shm"
    scratch = tempfile.mkdtemp(prefix="runner-damage-",
                               dir=shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None)
    counts = {outcome: 0 for outcome in OUTCOMES}
    by_damage: Dict[str, Dict[str, int]] = {}
    examples: List[Dict[str, Any]] = []
    sources: Dict[str, Source] = {}
    try:
        sources = build_sources(os.path.join(scratch, "sources"), seed)
        targets = [sources["compacted"], sources["never-compacted"]]
        rng = random.Random(f"damage/{seed}")
        plans = []
        for n in range(copies):
            source = rng.choice(targets)
            files, damage = damage_copy(source, sources["other"], rng)
            plans.append((n, source, files, damage))
        env = _child_env()

        def one(plan: Tuple[int, Source, Dict[str, bytes], Damage]) -> Tuple[Damage, str, str]:
            n, source, files, damage = plan
            path = os.path.join(scratch, f"copy-{n}")
            try:
                outcome, said = judge_copy(path, files, source, env)
            finally:
                shutil.rmtree(path, ignore_errors=True)
            return damage, outcome, said

        done = 0
        with ThreadPoolExecutor(max_workers=workers or max(1, min(4, os.cpu_count() or 1))) as pool:
            for damage, outcome, said in pool.map(one, plans):
                done += 1
                counts[outcome] += 1
                row = by_damage.setdefault(f"{damage.kind} {damage.file}", {})
                row[outcome] = row.get(outcome, 0) + 1
                if outcome not in PASSING and len(examples) < 10:
                    examples.append({"damage": damage._asdict(), "outcome": outcome, "load": said})
                if progress is not None and (done % 100 == 0 or done == copies):
                    progress.write(f"\rdamage campaign: {done}/{copies} copies, {counts['silent_acceptance']} silent "
                                   "acceptances")
                    progress.flush()
        if progress is not None:
            progress.write("\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    failures = sum(counts[o] for o in OUTCOMES if o not in PASSING)
    return {
        "copies": copies,
        "seed": seed,
        **counts,
        "ok": failures == 0,
        "by_damage": dict(sorted(by_damage.items())),
        "sources": {name: {"revision": s.revision, "files": sorted(s.files)} for name, s in sources.items()},
        "examples": examples,
        "seconds": round(time.perf_counter() - started, 2),
    }
