"""Damaged run files: every load recovers exactly or stops, and never accepts a guess.

The rule every case is held to: loading either gives the latest revision,
exactly as it was committed; or, when the last journal record is torn, exactly
the revision before it with a ``torn-record`` finding; or it raises
StateUnrecoverable (exit code 7) after moving the run's files, byte for byte,
into ``quarantine/``, deleting nothing.
"""

import hashlib
import json
import os
import random
import shutil
import sys
import unittest
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

from runner.base.errors import StateUnrecoverable
from runner.stores.file import STATE_FILES, RunStore
from runner.stores.file_layout import decode_snapshot, encode_snapshot

LATEST, PREVIOUS, QUARANTINED = "latest", "previous", "quarantined"
THIS_FILE = os.path.abspath(__file__)


class Bench:
    """A run folder that holds a built run's files, damaged one file at a time.

    ``current`` is what the folder holds, so a load can be checked against it
    without reading the folder back.
    """

    def __init__(self, root: str, built: _util.BuiltRun, name: str = "work") -> None:
        self.path = os.path.join(root, name)
        self.built = built
        self.current: Dict[str, bytes] = {}
        self.reset()

    def reset(self) -> None:
        if os.path.lexists(self.path):
            shutil.rmtree(self.path)
        os.mkdir(self.path, 0o700)
        self.current = {}
        for name, data in self.built.files.items():
            self.put(name, data)
        if os.path.isdir(os.path.join(self.built.path, "history")):  # the segments compaction kept: not damaged here
            shutil.copytree(os.path.join(self.built.path, "history"), os.path.join(self.path, "history"))
        _util.write_file(os.path.join(self.path, "lock"), b"")

    def put(self, name: str, data: bytes) -> None:
        _util.write_file(os.path.join(self.path, name), data)
        self.current[name] = data

    def restore(self, name: str) -> None:
        self.put(name, self.built.files[name])

    def fingerprint(self) -> Dict[str, Tuple[bool, int]]:
        with os.scandir(self.path) as entries:  # the history folder's segments are copies no load changes
            return {e.name: (e.is_file(follow_symlinks=False), e.stat(follow_symlinks=False).st_size) for e in entries
                    if e.name != "history"}

    def expected_fingerprint(self) -> Dict[str, Tuple[bool, int]]:
        out = {name: (True, len(data)) for name, data in self.current.items()}
        out["lock"] = (True, 0)
        return out

    def unquarantine(self, folder: str) -> None:
        """Move quarantined files back and remove the quarantine folder."""
        for name in self.current:
            os.replace(os.path.join(folder, name), os.path.join(self.path, name))
        shutil.rmtree(os.path.join(self.path, _util.QUARANTINE))


def judge(bench: Bench, label: str) -> Tuple[str, Optional[str], Dict[str, str]]:
    """Load the bench's folder once: ``(outcome, problem or None, findings by code)``.

    After a quarantine the files are moved back; a load that succeeds must
    leave the folder as it found it.
    """
    path, built = bench.path, bench.built
    try:
        store = RunStore.open(path, durability="process")
    except StateUnrecoverable as exc:
        problem = quarantine_problem(path, bench.current, exc)
        if problem is None:
            bench.unquarantine(_util.quarantine_folders(path)[0])
        else:
            bench.reset()
        return QUARANTINED, (f"{label}: {problem}" if problem else None), {}
    except Exception as exc:  # any other failure breaks the rule
        bench.reset()
        return "raised", f"{label}: raised {type(exc).__name__}: {exc}", {}
    try:
        state = store.state
        codes = {f.code: f.message for f in store.findings if f.level != "note"}
    finally:
        store.fs.close()  # type: ignore[attr-defined]
    rev = state["revision"]
    if bench.fingerprint() != bench.expected_fingerprint():
        return LATEST, f"{label}: a load that succeeded changed the folder", codes
    if rev == built.latest:
        if state != built.states[rev]:
            return LATEST, f"{label}: revision {rev} loaded with other content than was committed", codes
        return LATEST, None, codes
    if rev == built.latest - 1 and "torn-record" in codes:
        if state != built.states[rev]:
            return PREVIOUS, f"{label}: revision {rev} loaded with other content than was committed", codes
        return PREVIOUS, None, codes
    return "wrong", f"{label}: loaded revision {rev} of {built.latest} with findings {sorted(codes)}", codes


def quarantine_problem(path: str, before: Dict[str, bytes], exc: StateUnrecoverable) -> Optional[str]:
    """What is wrong with a quarantine, or None: every state file moved intact, nothing deleted."""
    if exc.exit_code != 7:
        return f"exit code {exc.exit_code}"
    folders = _util.quarantine_folders(path)
    if len(folders) != 1:
        return f"expected one quarantine folder, found {folders}"
    if exc.context.get("quarantine") != folders[0]:
        return f"the error names {exc.context.get('quarantine')!r}, not {folders[0]!r}"
    moved = _util.read_flat(folders[0])
    reason = moved.pop("REASON.txt", b"")
    if not reason.strip():
        return "REASON.txt is missing or empty"
    if moved != before:
        return f"quarantine holds {sorted(moved)}, expected {sorted(before)} byte for byte"
    left = sorted(set(os.listdir(path)) - {"lock", _util.QUARANTINE})
    if left:
        return f"files left in place: {left}"
    if sum(map(len, before.values())) != sum(map(len, moved.values())):
        return "bytes were lost"
    return None


class Verdict(NamedTuple):
    """The outcome of one damaged load."""

    label: str
    name: str  # the damaged file
    outcome: str  # latest, previous, quarantined, or what broke the rule
    problem: Optional[str]
    findings: Dict[str, str]  # code -> message


#: ``(file name, "flip" or "cut", offset, mask)``: flip ``offset`` by XOR ``mask``, or cut the file at ``offset``.
Case = Tuple[str, str, int, int]


def damaged(data: bytes, kind: str, offset: int, mask: int) -> bytes:
    if kind == "cut":
        return data[:offset]
    out = bytearray(data)
    out[offset] ^= mask
    return bytes(out)


def flip(data: bytes, offset: int, mask: int) -> bytes:
    return damaged(data, "flip", offset, mask)


def case_label(name: str, kind: str, offset: int, mask: int) -> str:
    return f"{name} cut at byte {offset}" if kind == "cut" else f"{name} byte {offset} ^ {mask:#04x}"


def judge_labels(cases: Sequence[Case]) -> List[Verdict]:
    """Placeholder verdicts carrying only each case's file name and label."""
    return [Verdict(case_label(*case), case[0], "", None, {}) for case in cases]


def judge_cases(root: str, built: _util.BuiltRun, cases: Sequence[Case], folder: str) -> List[Verdict]:
    """Load once per case in a bench folder of its own; one verdict per case, in order."""
    bench = Bench(root, built, folder)
    verdicts = []
    try:
        for name, kind, offset, mask in cases:
            label = case_label(name, kind, offset, mask)
            bench.put(name, damaged(built.files[name], kind, offset, mask))
            outcome, problem, findings = judge(bench, label)
            bench.restore(name)
            verdicts.append(Verdict(label, name, outcome, problem, findings))
    finally:
        shutil.rmtree(bench.path, ignore_errors=True)
    return verdicts


def every_offset(built: _util.BuiltRun, names: Iterable[str], kind: str = "flip") -> List[Case]:
    cases: List[Case] = []
    for name in names:
        for offset in range(len(built.files[name])):
            if kind == "cut":
                cases.append((name, "cut", offset, 0))
            else:
                cases += [(name, "flip", offset, 0x01), (name, "flip", offset, 0x80)]
    return cases


def sampled_offsets(built: _util.BuiltRun, per_file: int, seed: int) -> List[Case]:
    rng = random.Random(seed)
    cases: List[Case] = []
    for name, data in sorted(built.files.items()):
        for offset in sorted(rng.sample(range(len(data)), min(per_file, len(data)))):
            cases += [(name, "flip", offset, 0x01), (name, "flip", offset, 0x80)]
    return cases


class Runs:
    """The built runs every damage test starts from, made once per module.

    Their plan is empty, so that the files are as small as a run's files get
    and a sweep over every byte stays short.
    """

    root = ""
    fresh: _util.BuiltRun
    small: _util.BuiltRun
    large: _util.BuiltRun


#: How each run is built; a worker process rebuilds the same bytes from the same recipe.
BUILDERS: Dict[str, Callable[[str], _util.BuiltRun]] = {
    # Before any compaction: the snapshot at revision 0; the journal holds 1..3.
    "fresh": lambda root: _util.build_run(os.path.join(root, "fresh"), 3, plan={}),
    # After compactions, all five files: backup at 1, snapshot at 2,
    # journal.prev holds 2, the journal 3.
    "small": lambda root: _util.build_run(os.path.join(root, "small"), 3, compact_after=(1, 2), plan={}),
    # The same layout with bigger files: backup at 20, snapshot at 45,
    # journal.prev holds 21..45, the journal 46..60.
    "large": lambda root: _util.build_run(os.path.join(root, "large"), 60, compact_after=(20, 45), pad=300, plan={}),
}


def setUpModule() -> None:
    tmp = _util.scratch_dir()
    unittest.addModuleCleanup(tmp.cleanup)
    Runs.root = tmp.name
    Runs.fresh, Runs.small, Runs.large = (BUILDERS[name](tmp.name) for name in ("fresh", "small", "large"))


def files_digest(built: _util.BuiltRun) -> str:
    return hashlib.sha256(json.dumps({name: data.hex() for name, data in sorted(built.files.items())}).encode()).hexdigest()


def worker_main(argv: List[str]) -> int:
    """``--judge RUN ROOT``: rebuild run RUN under ROOT, judge the cases read from stdin, print the verdicts."""
    name, root = argv
    built = BUILDERS[name](root)
    cases = [tuple(case) for case in json.load(sys.stdin)]
    verdicts = judge_cases(root, built, cases, "bench")  # type: ignore[arg-type]
    print(json.dumps({"files": files_digest(built), "verdicts": [v._asdict() for v in verdicts]}))
    return 0


class DamageCase(unittest.TestCase):
    """Shared helpers: a bench per test, and judging many damaged loads at once."""

    def setUp(self) -> None:
        self.root = Runs.root
        self.fresh, self.small, self.large = Runs.fresh, Runs.small, Runs.large

    def bench(self, built: _util.BuiltRun, tag: str = "") -> Bench:
        bench = Bench(self.root, built, f"work-{self.id().rsplit('.', 1)[-1]}-{os.path.basename(built.path)}{tag}")
        self.addCleanup(shutil.rmtree, bench.path, True)
        return bench

    def judge_all(self, built: _util.BuiltRun, cases: Sequence[Case]) -> List[Verdict]:
        """Judge every case; fail, listing the first few, if any broke the rule.

        A long list is split with a worker process (this file, run with
        ``--judge``) on a machine with more than one core.
        """
        tag = self.id().rsplit(".", 1)[-1]
        if len(cases) < 2000 or (os.cpu_count() or 1) < 2:
            verdicts = judge_cases(self.root, built, cases, f"bench-{tag}")
        else:
            verdicts = self.judge_split(built, cases, tag)
        self.assertEqual(len(verdicts), len(cases))
        self.assertEqual(len(verdicts), len(cases))
        problems = [v.problem for v in verdicts if v.problem]
        self.assertEqual(problems[:6], [], f"{len(problems)} of {len(cases)} damaged loads broke the rule")
        return verdicts

    def judge_split(self, built: _util.BuiltRun, cases: Sequence[Case], tag: str) -> List[Verdict]:
        name = os.path.basename(built.path)
        root = os.path.join(self.root, f"worker-{tag}")
        os.mkdir(root)
        self.addCleanup(shutil.rmtree, root, True)
        remote = list(cases[1::2])
        worker, local = _util.in_parallel(
            [
                lambda: _util.run(_util.python(THIS_FILE, "--judge", name, root), input=json.dumps(remote).encode()),
                lambda: judge_cases(self.root, built, cases[0::2], f"bench-{tag}"),
            ],
            workers=2,
        )
        self.assertEqual(worker.code, 0, worker.err[-3000:])
        report = json.loads(worker.out)
        self.assertEqual(report["files"], files_digest(built), "the worker built other files")
        far = [Verdict(**v) for v in report["verdicts"]]
        self.assertEqual([(v.name, v.label) for v in far], [(v.name, v.label) for v in judge_labels(remote)])
        verdicts: List[Verdict] = []
        for i in range(len(cases)):
            verdicts.append(local[i // 2] if i % 2 == 0 else far[i // 2])
        return verdicts

    def assert_layout(self, built: _util.BuiltRun, names: Iterable[str]) -> None:
        self.assertEqual(sorted(built.files), sorted(names), "the built run does not have the layout this test needs")


class TruncatedFiles(DamageCase):
    """A journal cut inside its last record loads the previous revision with a torn-record finding; a cut snapshot is rebuilt exactly from the other base."""

    def cut_last_record(self, built: _util.BuiltRun, name: str, expect: str, finding: str) -> None:
        start, end = _util.journal_records(built.files[name])[-1]
        verdicts = self.judge_all(built, [(name, "cut", offset, 0) for offset in range(start + 1, end)])
        for verdict in verdicts:
            self.assertEqual(verdict.outcome, expect, verdict.label)
            self.assertIn(finding, verdict.findings, verdict.label)

    def test_journal_cut_inside_last_record_fresh(self) -> None:
        self.assert_layout(self.fresh, ("run.json", "snapshot.json", "journal.jsonl"))
        self.cut_last_record(self.fresh, "journal.jsonl", PREVIOUS, "torn-record")

    def test_journal_cut_inside_last_record_after_compactions(self) -> None:
        self.assert_layout(self.small, STATE_FILES)
        self.cut_last_record(self.small, "journal.jsonl", PREVIOUS, "torn-record")

    def test_previous_journal_cut_inside_last_record(self) -> None:
        # The snapshot is at the previous journal's last revision, so nothing is lost.
        self.cut_last_record(self.small, "journal.prev.jsonl", LATEST, "prev-journal")

    def test_journal_cut_at_record_boundary_is_the_previous_run(self) -> None:
        # A cut exactly before the last record leaves the bytes the run had
        # one revision earlier: no reader can tell them apart, and none needs to.
        for built in (self.fresh, self.small):
            with self.subTest(run=os.path.basename(built.path)):
                data = built.files["journal.jsonl"]
                start, _end = _util.journal_records(data)[-1]
                self.assertEqual(data[:start], built.history[built.latest - 1]["journal.jsonl"])
                bench = self.bench(built)
                bench.put("journal.jsonl", data[:start])
                store = RunStore.open(bench.path, durability="process")
                self.addCleanup(store.fs.close)
                self.assertEqual(store.state, built.states[built.latest - 1])

    def cut_snapshot(self, built: _util.BuiltRun, base: str) -> None:
        verdicts = self.judge_all(built, every_offset(built, ["snapshot.json"], kind="cut"))
        self.assertEqual(len(verdicts), len(built.files["snapshot.json"]))
        for verdict in verdicts:
            self.assertEqual(verdict.outcome, LATEST, verdict.label)
            self.assertIn("snapshot.json-invalid", verdict.findings, verdict.label)
            self.assertIn(f"from {base}", verdict.findings.get("rebuilt", ""), verdict.label)

    def test_snapshot_cut_at_every_byte_before_any_compaction(self) -> None:
        self.cut_snapshot(self.fresh, "run.json")

    def test_snapshot_cut_at_every_byte_after_compactions(self) -> None:
        self.cut_snapshot(self.small, "backup.json")


class FlippedBytes(DamageCase):
    """One flipped bit (XOR 0x01 or 0x80) in any state file is rebuilt exactly from redundancy or stops the run; nothing else.

    Where redundancy exists the outcome is fixed: a damaged snapshot, backup or
    previous journal loses nothing; the current journal has no copy, so its
    damage always stops the run.
    """

    def check_expected(self, verdicts: Sequence[Verdict]) -> Dict[str, Set[str]]:
        outcomes: Dict[str, Set[str]] = {}
        for verdict in verdicts:
            outcomes.setdefault(verdict.name, set()).add(verdict.outcome)
        for name in ("snapshot.json", "backup.json", "journal.prev.jsonl"):
            if name in outcomes:
                self.assertEqual(outcomes[name], {LATEST}, name)
        self.assertEqual(outcomes["journal.jsonl"], {QUARANTINED})
        self.assertLessEqual(outcomes["run.json"], {LATEST, QUARANTINED})
        return outcomes

    def test_every_byte_of_a_small_run(self) -> None:
        self.assert_layout(self.small, STATE_FILES)
        verdicts = self.judge_all(self.small, every_offset(self.small, sorted(self.small.files)))
        self.assertEqual(len(verdicts), 2 * sum(map(len, self.small.files.values())))
        self.assertEqual(sorted(self.check_expected(verdicts)), sorted(STATE_FILES))

    def test_sampled_bytes_of_a_fresh_run(self) -> None:
        self.check_expected(self.judge_all(self.fresh, sampled_offsets(self.fresh, 32, seed=4)))

    def test_sampled_bytes_of_a_larger_run(self) -> None:
        self.assert_layout(self.large, STATE_FILES)
        self.assertGreater(len(self.large.files["snapshot.json"]), 8000)
        self.assertGreater(len(self.large.files["journal.jsonl"]), 4000)
        self.check_expected(self.judge_all(self.large, sampled_offsets(self.large, 32, seed=20261129)))


class TwoDamagedFiles(DamageCase):
    """With the snapshot damaged, a damaged previous journal must not let the backup pass for the latest revision.

    Right after a compaction the current journal is empty, the previous
    journal holds the records between backup and snapshot, and only those two
    files together prove the latest revision. Losing both may stop the run, but
    may not roll back acknowledged transitions.
    """

    def test_damaged_snapshot_and_previous_journal(self) -> None:
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        built = _util.build_run(os.path.join(tmp.name, "run"), 5, compact_after=(2, 5), plan={})
        self.assertEqual(built.files["journal.jsonl"], b"")
        bench = Bench(tmp.name, built)
        bench.put("snapshot.json", flip(built.files["snapshot.json"], 40, 0x01))
        bench.put("journal.prev.jsonl", flip(built.files["journal.prev.jsonl"], 40, 0x01))
        outcome, problem, findings = judge(bench, "snapshot.json and journal.prev.jsonl damaged")
        self.assertIn(outcome, (LATEST, QUARANTINED), f"{problem}; findings: {findings}")
        self.assertIsNone(problem)


class DamagedIdentity(DamageCase):
    """A run.json damaged into different but well-formed JSON stops the run (exit 7, quarantine), not an input error."""

    def test_task_id_damaged_in_run_json(self) -> None:
        bench = self.bench(self.small)
        data = self.small.files["run.json"]
        offset = data.rindex(b'"task_id":"store-test"') + len(b'"task_id":"store')
        self.assertEqual(data[offset:offset + 1], b"-")
        bench.put("run.json", flip(data, offset, 0x01))  # store-test -> store,test
        result = _util.run_cli("--dir", bench.path, "--json", "status")
        self.assertEqual(result.code, 7, f"{result.err.strip()}")
        self.assertEqual(_util.one_json(result)["error"], "state-unrecoverable")
        self.assertEqual(len(_util.quarantine_folders(bench.path)), 1)


class CommandLineAfterDamage(DamageCase):
    """After a quarantine the run stays stopped; doctor only reads; doctor --repair repairs a damaged snapshot without loss."""

    def damaged_copy(self, built: _util.BuiltRun, name: str, offset: int) -> Bench:
        bench = self.bench(built, f"-{name}")
        bench.put(name, flip(built.files[name], offset, 0x01))
        return bench

    def test_quarantined_run_stays_stopped(self) -> None:
        bench = self.damaged_copy(self.small, "journal.jsonl", 30)
        first = _util.run_cli("--dir", bench.path, "--json", "status")
        self.assertEqual(first.code, 7, first.err)
        self.assertEqual(len(_util.quarantine_folders(bench.path)), 1)
        before = _util.listing(bench.path)
        contract = _util.write_contract(os.path.join(self.root, f"{self.id()}.md"))
        # The first stop in a child process; the commands after it in this process.
        again = _util.in_process_cli(["--dir", bench.path, "--json", "status"])
        init = _util.in_process_cli(["--dir", bench.path, "--json", "init", "--contract", contract])
        doctor = _util.in_process_cli(["--dir", bench.path, "--json", "doctor"])
        self.assertEqual(again.code, 7, again.err)
        self.assertEqual(_util.one_json(again)["exit_code"], 7)
        self.assertEqual(init.code, 2, init.err)
        self.assertIn("refusing", _util.one_json(init)["message"])
        self.assertEqual(doctor.code, 7, doctor.err)
        self.assertEqual(_util.listing(bench.path), before, "a command changed the quarantined folder")
        self.assertEqual(len(_util.quarantine_folders(bench.path)), 1)

    def test_doctor_reads_only(self) -> None:
        benches = {name: self.damaged_copy(self.small, name, offset) for name, offset in (("journal.jsonl", 30), ("run.json", 12))}
        before = {name: (_util.contents(b.path), _util.listing(b.path)) for name, b in benches.items()}
        results = dict(zip(benches, _util.in_parallel([lambda b=b: _util.run_cli("--dir", b.path, "--json", "doctor") for b in benches.values()])))
        for name, bench in benches.items():
            with self.subTest(damaged=name):
                result = results[name]
                self.assertEqual(result.code, 7, result.err)
                report = _util.one_json(result)
                self.assertFalse(report["ok"])
                self.assertEqual(report["exit_code"], 7)
                self.assertEqual((_util.contents(bench.path), _util.listing(bench.path)), before[name])
                self.assertEqual(_util.quarantine_folders(bench.path), [])

    def test_doctor_repair_of_a_damaged_snapshot_loses_nothing(self) -> None:
        built = self.small
        bench = self.damaged_copy(built, "snapshot.json", 100)
        damaged = _util.contents(bench.path)["snapshot.json"]
        doctor = _util.in_process_cli(["--dir", bench.path, "--json", "doctor"])
        self.assertEqual(doctor.code, 0, doctor.err)
        report = _util.one_json(doctor)
        self.assertFalse(report["healthy"])
        self.assertEqual(report["revision"], built.latest)
        self.assertEqual(report["base"], "backup.json")

        repair = _util.run_cli("--dir", bench.path, "--json", "doctor", "--repair")
        self.assertEqual(repair.code, 0, repair.err)
        repaired = _util.one_json(repair)
        self.assertIn("snapshot.json-invalid", [r["code"] for r in repaired["repaired"]])
        self.assertTrue(repaired["healthy"], repaired)
        folders = _util.quarantine_folders(bench.path)
        self.assertEqual(len(folders), 1)
        self.assertEqual(sorted(os.listdir(folders[0])), ["REASON.txt", "snapshot.json"])
        with open(os.path.join(folders[0], "snapshot.json"), "rb") as handle:
            self.assertEqual(handle.read(), damaged)

        second = _util.in_process_cli(["--dir", bench.path, "--json", "doctor"])
        self.assertEqual(second.code, 0, second.err)
        self.assertTrue(_util.one_json(second)["healthy"])

        # The repair is itself recorded: one transition that adds a store
        # observation naming what was repaired, and changes nothing else.
        store = RunStore.open(bench.path, durability="process")
        self.addCleanup(store.fs.close)
        state, old = store.state, built.states[built.latest]
        self.assertEqual(state["revision"], built.latest + 1)
        self.assertEqual(repaired["revision"], state["revision"])
        for key in old:
            if key not in ("revision", "head", "updated_at", "observations"):
                self.assertEqual(state[key], old[key], key)
        added = {k: v for k, v in state["observations"]["store"].items() if k not in old["observations"]["store"]}
        self.assertEqual(list(added), [f"r{built.latest + 1}"])
        self.assertTrue(any("snapshot.json" in line for line in added[f"r{built.latest + 1}"]["findings"]))


class SchemaVersion(DamageCase):
    """A snapshot of another schema version stops the run with exit 7 and a message naming both versions, and is not quarantined."""

    def test_snapshot_of_schema_version_2(self) -> None:
        for built in (self.fresh, self.small):
            with self.subTest(run=os.path.basename(built.path)):
                bench = self.bench(built)
                state = decode_snapshot(built.files["snapshot.json"])
                state["schema_version"] = 2
                bench.put("snapshot.json", encode_snapshot(state))
                before = _util.contents(bench.path)
                status = _util.run_cli("--dir", bench.path, "status")
                doctor = _util.in_process_cli(["--dir", bench.path, "--json", "doctor"])
                repair = _util.in_process_cli(["--dir", bench.path, "--json", "doctor", "--repair"])
                for result in (status, doctor, repair):
                    self.assertEqual(result.code, 7, result.err)
                    self.assertEqual(len(_util.stderr_lines(result)), 1, result.err)
                    self.assertIn("schema version 2", result.err)
                    self.assertIn("version 1", result.err)
                self.assertEqual(_util.contents(bench.path), before)
                self.assertEqual(_util.quarantine_folders(bench.path), [])
                with self.assertRaises(StateUnrecoverable) as caught:
                    RunStore.open(bench.path, durability="process")
                self.assertIn("schema version 2", str(caught.exception))
                self.assertEqual(_util.quarantine_folders(bench.path), [])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--judge"]:
        sys.exit(worker_main(sys.argv[2:]))
    unittest.main()
