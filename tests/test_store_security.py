"""Refusals of the store and the command line: no run over existing files, no unsafe ids, no symlinks, private modes, strict input, one-line errors."""

import json
import os
import stat
import unittest
from typing import Any, Dict, List, Tuple
from unittest import mock

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

from runner.base.values import MAX_ID_LENGTH
from runner.base.canonical import MAX_DOCUMENT_BYTES
from runner.base.fs import OsFileSystem, SymlinkRefused
from runner.stores.file import scan


class SecurityCase(unittest.TestCase):
    """Shared set-up: a temporary folder with a valid contract, and the one-line error check."""

    def setUp(self) -> None:
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        self.contract = _util.write_contract(os.path.join(self.tmp, "contract.md"))

    def path(self, *parts: str) -> str:
        return os.path.join(self.tmp, *parts)

    def assert_one_line_error(self, result: _util.Result, code: int, json_mode: bool = False, label: str = "") -> Dict[str, Any]:
        """Exit ``code``, exactly one line on stderr, no traceback; with ``--json`` one error object on stdout."""
        where = f"{label}: exit {result.code}, stdout {result.out!r}, stderr {result.err!r}"
        self.assertEqual(result.code, code, where)
        self.assertNotIn("Traceback", result.err, where)
        self.assertNotIn("Traceback", result.out, where)
        self.assertEqual(len(result.err.splitlines()), 1, where)
        self.assertTrue(result.err.endswith("\n"), where)
        if not json_mode:
            return {}
        body = _util.one_json(result)
        self.assertIsInstance(body.get("error"), str, where)
        self.assertEqual(body.get("exit_code"), code, where)
        return body

    def build(self, name: str = "run") -> _util.BuiltRun:
        return _util.build_run(self.path(name), 3, compact_after=(2,))


class InitRefusesExistingState(SecurityCase):
    """``init`` over a run, a damaged run or a folder of unrelated files is refused with exit 2 and changes nothing at all."""

    def refuse(self, folder: str) -> None:
        before = _util.listing(folder)
        result = _util.run_cli("--dir", folder, "--json", "init", "--contract", self.contract)
        body = self.assert_one_line_error(result, 2, json_mode=True)
        self.assertIn("refusing", body["message"])
        self.assertEqual(_util.listing(folder), before, "a refused init changed the folder")

    def test_over_an_existing_run(self) -> None:
        created = _util.in_process_cli(["--dir", self.path("run"), "init", "--contract", self.contract])
        self.assertEqual(created.code, 0, created.err)
        self.refuse(self.path("run"))

    def test_over_a_damaged_run(self) -> None:
        built = self.build()
        with open(os.path.join(built.path, "run.json"), "r+b") as handle:
            handle.seek(20)
            handle.write(b"#")
        self.refuse(built.path)

    def test_over_a_folder_of_unrelated_files(self) -> None:
        folder = self.path("documents")
        os.mkdir(folder)
        os.mkdir(os.path.join(folder, "notes"))
        _util.write_file(os.path.join(folder, "letter.txt"), b"dear reader\n")
        _util.write_file(os.path.join(folder, "notes", "todo.md"), b"- nothing\n")
        self.refuse(folder)


class TaskIds(SecurityCase):
    """A task id that could name a path, hide a control character, be empty or exceed 200 characters is refused with exit 2 and one line."""

    BAD = {
        "slash": "a/b",
        "backslash": "a\\b",
        "dot-dot": "..",
        "parent-path": "../escape",
        "leading-dot": ".hidden",
        "control-character": "a\x01b",
        "newline": "a\nb",
        "escape": "a\x1b[31mb",
        "space": "a b",
        "empty": "",
        "too-long": "a" * (MAX_ID_LENGTH + 1),
    }

    def test_bad_ids_are_refused(self) -> None:
        in_child = ("parent-path", "control-character")
        argvs: Dict[str, List[str]] = {}
        for label, task_id in self.BAD.items():
            block = _util.contract_block(task_id)
            contract = _util.write_contract(self.path(f"{label}.md"), raw_block=json.dumps(block, indent=2))
            argvs[label] = ["--dir", self.path(f"run-{label}"), "init", "--contract", contract]
        results = dict(zip(in_child, _util.in_parallel([lambda a=argvs[label]: _util.run_cli(*a) for label in in_child])))
        results.update({label: _util.in_process_cli(argv) for label, argv in argvs.items() if label not in in_child})
        for label, result in results.items():
            with self.subTest(id=label):
                self.assert_one_line_error(result, 2, label=label)
                self.assertIn("task_id", result.err)
                self.assertFalse(os.path.lexists(self.path(f"run-{label}")), "a refused init created the run folder")

    def test_longest_id_is_accepted(self) -> None:
        task_id = "a" * MAX_ID_LENGTH
        contract = _util.write_contract(self.path("long.md"), _util.contract_block(task_id))
        result = _util.in_process_cli(["--dir", self.path("run"), "--json", "init", "--contract", contract])
        self.assertEqual(result.code, 0, result.err)
        self.assertEqual(_util.one_json(result)["task_id"], task_id)


class Symlinks(SecurityCase):
    """A symbolic link where a state file belongs is refused and never followed: nothing is read through it, moved or changed."""

    NAMES = ("snapshot.json", "journal.jsonl", "run.json", "backup.json", "journal.prev.jsonl")

    def plant(self, name: str) -> Tuple[str, str, bytes]:
        """A run whose ``name`` is a link to the real file, moved outside; returns (run, target, bytes)."""
        built = _util.build_run(self.path(f"run-{name}"), 3, compact_after=(2,))
        os.mkdir(self.path(f"outside-{name}"))
        target = self.path(f"outside-{name}", name)
        os.replace(os.path.join(built.path, name), target)
        os.symlink(target, os.path.join(built.path, name))
        return built.path, target, built.files[name]

    def test_links_are_refused(self) -> None:
        planted = {name: self.plant(name) for name in self.NAMES}
        verbs = {
            "status": ["--json", "status"],
            "doctor": ["--json", "doctor"],
            "repair": ["--json", "doctor", "--repair"],
            "init": ["--json", "init", "--contract", self.contract],
        }
        # status in a child process for the three main files; every other case in this process.
        cases = [(name, verb) for name in self.NAMES for verb in verbs if verb == "status" or name in ("snapshot.json", "journal.jsonl", "run.json")]
        in_child = [(n, v) for n, v in cases if v == "status" and n in ("snapshot.json", "journal.jsonl", "run.json")]
        results = dict(zip(in_child, _util.in_parallel([lambda n=n, v=v: _util.run_cli("--dir", planted[n][0], *verbs[v]) for n, v in in_child])))
        results.update({(n, v): _util.in_process_cli(["--dir", planted[n][0], *verbs[v]]) for n, v in cases if (n, v) not in in_child})
        for (name, verb), result in results.items():
            with self.subTest(link=name, verb=verb):
                run_dir, target, data = planted[name]
                self.assert_one_line_error(result, 2 if verb == "init" else 7, json_mode=True, label=f"{verb} with {name} a link")
                self.assertIn("symbolic link", result.err)
                link = os.path.join(run_dir, name)
                self.assertTrue(os.path.islink(link))
                self.assertEqual(os.readlink(link), target)
                with open(target, "rb") as handle:
                    self.assertEqual(handle.read(), data)
                self.assertEqual(_util.quarantine_folders(run_dir), [])

    def test_a_look_at_a_run_with_a_link_reads_no_file(self) -> None:
        # The links are found among the folder's names, before any file is read, through a link or not.
        for name in self.NAMES + ("head.json",):
            with self.subTest(link=name):
                run_dir = self.plant(name)[0] if name != "head.json" else self._planted_head()
                fs = _ReadsRecorded()
                self.addCleanup(fs.close)
                seen = scan(run_dir, fs, thorough=True)
                damage = [f.code for f in seen.findings if f.level == "damage"]
                self.assertEqual((damage, seen.state), (["symlink"], None))
                self.assertEqual(fs.reads, [])

    def _planted_head(self) -> str:
        built = _util.build_run(self.path("run-head"), 3, compact_after=(2,))
        os.mkdir(self.path("outside-head"))
        os.replace(os.path.join(built.path, "head.json"), self.path("outside-head", "head.json"))
        os.symlink(self.path("outside-head", "head.json"), os.path.join(built.path, "head.json"))
        return built.path

    def test_a_look_up_refuses_a_link_with_modules_of_its_own(self) -> None:
        # os.path imports stat for itself; a look-up that borrowed it from there would fail wherever it does not.
        os.mkdir(self.path("looked"))
        real, link = self.path("looked", "journal.jsonl"), self.path("looked", "snapshot.json")
        _util.write_file(real, b"{}\n")
        os.symlink(real, link)
        fs = OsFileSystem()
        self.addCleanup(fs.close)
        with mock.patch("runner.base.fs.os", _OsWithoutStatInPath()):
            self.assertEqual(fs.stat(real), (os.lstat(real).st_ino, 3))
            with self.assertRaises(SymlinkRefused):
                fs.stat(link)
            self.assertIsNone(fs.stat(self.path("looked", "run.json")))

    def test_a_link_to_a_fifo_is_never_opened(self) -> None:
        # Opening a FIFO for reading blocks until a writer appears: following
        # the link would hang the command (and time out the test).
        cases = []
        for name in ("snapshot.json", "journal.jsonl"):
            run_dir, _target, _data = self.plant(name)
            os.unlink(os.path.join(run_dir, name))
            fifo = self.path(f"fifo-{name}")
            os.mkfifo(fifo, 0o600)
            os.symlink(fifo, os.path.join(run_dir, name))
            cases.append(run_dir)
        results = _util.in_parallel([lambda d=d: _util.run_cli("--dir", d, "status", timeout=20) for d in cases])
        for run_dir, result in zip(cases, results):
            with self.subTest(run=run_dir):
                self.assert_one_line_error(result, 7)
                self.assertIn("symbolic link", result.err)


class _ReadsRecorded(OsFileSystem):
    """The real file system, with the path of each file read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: List[str] = []

    def read(self, path: str) -> bytes:
        self.reads.append(path)
        return super().read(path)


class _PathWithoutStat:
    """``os.path`` without the ``stat`` module it imports for its own use."""

    def __getattr__(self, name: str) -> Any:
        if name == "stat":
            raise AttributeError(name)
        return getattr(os.path, name)


class _OsWithoutStatInPath:
    """``os``, whose ``path`` lacks the ``stat`` module."""

    path = _PathWithoutStat()

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


class Modes(SecurityCase):
    """The run folder and every folder in it are 0700 and every file 0600, whatever the umask."""

    #: Run in a child under the umask: init, transitions with compactions, then damage and a status that quarantines.
    CHILD = (
        "import json, os, sys\n"
        "from runner.surfaces.cli import main\n"
        "from runner.stores.file import RunStore\n"
        "run, contract = sys.argv[1], sys.argv[2]\n"
        "codes = [main(['--dir', run, 'init', '--contract', contract])]\n"
        "store = RunStore.open(run, compact_min_bytes=1)\n"
        "for n in range(1, 5):\n"
        "    store.commit([['set', ['effects', 'e%d' % n], {'n': n}]])\n"
        "names = sorted(os.listdir(run))\n"
        "with open(os.path.join(run, 'journal.jsonl'), 'ab') as handle:\n"
        "    handle.write(b'garbage\\n')\n"
        "codes.append(main(['--dir', run, 'status']))\n"
        "print(json.dumps({'codes': codes, 'names': names}))\n"
    )

    def test_modes_under_umask(self) -> None:
        umasks = (0o000, 0o077)
        runs = {umask: self.path(f"run-{umask:o}") for umask in umasks}
        results = _util.in_parallel([lambda u=u: _util.run(_util.python("-c", self.CHILD, runs[u], self.contract), umask=u) for u in umasks])
        for umask, result in zip(umasks, results):
            with self.subTest(umask=f"{umask:03o}"):
                self.assertEqual(result.code, 0, result.err)
                report = json.loads(result.out.splitlines()[-1])
                self.assertEqual(report["codes"], [0, 7], result.err)
                self.assertLessEqual({"run.json", "snapshot.json", "backup.json", "journal.jsonl", "journal.prev.jsonl", "head.json"}, set(report["names"]))
                folders = _util.quarantine_folders(runs[umask])
                self.assertEqual(len(folders), 1)
                self.assertLessEqual({"run.json", "snapshot.json", "backup.json", "journal.jsonl", "journal.prev.jsonl", "REASON.txt"}, set(os.listdir(folders[0])))
                for rel, (kind, _size, _mtime, mode) in _util.listing(runs[umask]).items():
                    self.assertEqual(stat.S_IMODE(mode), 0o700 if kind == "dir" else 0o600, f"{rel} is a {kind} with mode {stat.S_IMODE(mode):o}")


class StrictContracts(SecurityCase):
    """A contract with NaN, infinities or duplicate keys, or over 256 KiB, is refused with exit 2 by init and by contract check."""

    def check_refused(self, contract: str, needle: str) -> None:
        run_dir = self.path("run-" + os.path.basename(contract))
        init = _util.in_process_cli(["--dir", run_dir, "init", "--contract", contract])
        check = _util.in_process_cli(["contract", "check", contract])
        for result in (init, check):
            self.assert_one_line_error(result, 2)
            self.assertIn(needle, result.err)
        self.assertFalse(os.path.lexists(run_dir))

    def test_nan(self) -> None:
        block = json.dumps(_util.contract_block(), indent=2).replace('"contract": 1,', '"contract": 1,\n  "limits": {"max_cost": NaN},')
        self.check_refused(_util.write_contract(self.path("nan.md"), raw_block=block), "NaN")

    def test_infinity(self) -> None:
        block = json.dumps(_util.contract_block(), indent=2).replace('"contract": 1,', '"contract": 1,\n  "limits": {"max_cost": Infinity},')
        self.check_refused(_util.write_contract(self.path("inf.md"), raw_block=block), "Infinity")

    def test_duplicate_keys(self) -> None:
        block = json.dumps(_util.contract_block(), indent=2).replace('"contract": 1,', '"contract": 1,\n  "goal": "another goal",')
        self.check_refused(_util.write_contract(self.path("dup.md"), raw_block=block), "duplicate key 'goal'")

    def test_over_256_kib(self) -> None:
        path = _util.write_contract(self.path("big.md"), _util.contract_block())
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(("Notes that make the file too big.\n" * 8000)[: MAX_DOCUMENT_BYTES])
        self.assertGreater(os.path.getsize(path), MAX_DOCUMENT_BYTES)
        self.check_refused(path, str(MAX_DOCUMENT_BYTES))

    def test_exactly_256_kib_is_read(self) -> None:
        path = _util.write_contract(self.path("edge.md"), _util.contract_block())
        with open(path, "ab") as handle:
            handle.write(b"x" * (MAX_DOCUMENT_BYTES - os.path.getsize(path) - 1) + b"\n")
        self.assertEqual(os.path.getsize(path), MAX_DOCUMENT_BYTES)
        result = _util.in_process_cli(["contract", "check", path])
        self.assertEqual(result.code, 0, result.err)


class ErrorPaths(SecurityCase):
    """Every error path of init, status, doctor and contract prints one line on stderr and no traceback; with --json, one error object on stdout."""

    def cases(self) -> List[Tuple[str, List[str], int]]:
        """``(label, argv without --json, exit code)``; folders are prepared here."""
        run = self.build("run").path
        os.mkdir(self.path("empty"))
        _util.write_file(self.path("plain-file"), b"not a folder\n")
        missing = self.path("missing")
        return [
            ("no verb", [], 2),
            ("unknown verb", ["frobnicate"], 2),
            ("unknown option", ["--frobnicate", "status"], 2),
            ("unknown option after the verb", ["--dir", run, "status", "--frobnicate"], 2),
            ("no run folder given", ["status"], 2),
            ("status, no such folder", ["--dir", missing, "status"], 2),
            ("status, empty folder", ["--dir", self.path("empty"), "status"], 2),
            ("status, damaged run", ["--dir", "{damaged}", "status"], 7),
            ("status, quarantined run", ["--dir", "{quarantined}", "status"], 7),
            ("status, a file not a folder", ["--dir", self.path("plain-file"), "status"], 1),
            ("init, no contract option", ["--dir", self.path("new"), "init"], 2),
            ("init, no such contract", ["--dir", self.path("new"), "init", "--contract", self.path("nope.md")], 2),
            ("init, contract is a folder", ["--dir", self.path("new"), "init", "--contract", self.path("empty")], 2),
            ("init, over a run", ["--dir", run, "init", "--contract", self.contract], 2),
            ("init, bad durability", ["--dir", self.path("new"), "init", "--contract", self.contract, "--durability", "maybe"], 2),
            ("doctor, no such folder", ["--dir", missing, "doctor"], 2),
            ("doctor, damaged run", ["--dir", "{damaged}", "doctor"], 7),
            ("doctor --repair, damaged run", ["--dir", "{damaged}", "doctor", "--repair"], 7),
            ("contract, unknown action", ["contract", "frobnicate", self.contract], 2),
            ("contract check, no file", ["contract", "check"], 2),
            ("contract check, no such file", ["contract", "check", self.path("nope.md")], 2),
            ("bench, bad count", ["bench", "--transitions", "0"], 2),
        ]

    def damaged_run(self, name: str) -> str:
        built = self.build(name)
        with open(os.path.join(built.path, "journal.jsonl"), "r+b") as handle:
            handle.seek(5)
            handle.write(b"#")
        return built.path

    def prepared(self, argv: List[str], tag: str) -> List[str]:
        out = []
        for arg in argv:
            if arg == "{damaged}":
                arg = self.damaged_run(f"damaged-{tag}")
            elif arg == "{quarantined}":
                arg = self.damaged_run(f"quarantined-{tag}")
                self.assertEqual(_util.in_process_cli(["--dir", arg, "status"]).code, 7)
                self.assertEqual(len(_util.quarantine_folders(arg)), 1)
            out.append(arg)
        return out

    def test_every_error_path_in_process(self) -> None:
        for n, (label, argv, code) in enumerate(self.cases()):
            for json_mode in (False, True):
                with self.subTest(case=label, json=json_mode):
                    args = self.prepared(argv, f"{n}-{json_mode}") + (["--json"] if json_mode else [])
                    result = _util.in_process_cli(args)
                    self.assert_one_line_error(result, code, json_mode, label)
                    if not json_mode and code != 7:
                        self.assertEqual(result.out, "", label)

    def test_error_paths_in_a_child_process(self) -> None:
        chosen = {
            ("no verb", False),
            ("status, damaged run", True),
            ("init, over a run", True),
            ("doctor, damaged run", False),
        }
        jobs, labels = [], []
        for n, (label, argv, code) in enumerate(self.cases()):
            for json_mode in (False, True):
                if (label, json_mode) in chosen:
                    args = self.prepared(argv, f"child-{n}-{json_mode}") + (["--json"] if json_mode else [])
                    jobs.append(lambda a=args: _util.run_cli(*a))
                    labels.append((label, code, json_mode))
        self.assertEqual(len(jobs), len(chosen))
        for (label, code, json_mode), result in zip(labels, _util.in_parallel(jobs)):
            with self.subTest(case=label, json=json_mode):
                self.assert_one_line_error(result, code, json_mode, label)

    def test_contract_check_failure_with_json_is_an_error_object(self) -> None:
        block = json.dumps(_util.contract_block(), indent=2).replace('"contract": 1,', '"contract": 1,\n  "colour": "blue",')
        contract = _util.write_contract(self.path("unknown-field.md"), raw_block=block)
        result = _util.in_process_cli(["--json", "contract", "check", contract])
        self.assert_one_line_error(result, 2, json_mode=True, label="contract check --json")


class OptionPlacement(SecurityCase):
    """``--dir`` and ``--json`` work before and after the verb, with the same result."""

    def test_before_and_after_the_verb(self) -> None:
        run = self.build().path
        placements = [
            ["--dir", run, "--json", "status"],
            ["status", "--dir", run, "--json"],
            ["--json", "status", "--dir", run],
            ["--dir", run, "status", "--json"],
            ["--dir", run, "--json", "doctor"],
            ["doctor", "--json", "--dir", run],
        ]
        # One placement in a child process, the rest through the same entry point in this process.
        results = [_util.run_cli(*placements[0])] + [_util.in_process_cli(a) for a in placements[1:]]
        bodies = []
        for argv, result in zip(placements, results):
            with self.subTest(argv=argv):
                self.assertEqual(result.code, 0, result.err)
                body = _util.one_json(result)
                self.assertEqual(body["revision"], 3)
                bodies.append(body)
        self.assertEqual(bodies[0], bodies[1])
        self.assertEqual(bodies[0], bodies[2])
        self.assertEqual(bodies[0], bodies[3])
        self.assertEqual(bodies[4], bodies[5])
        self.assertTrue(bodies[4]["healthy"])


if __name__ == "__main__":
    unittest.main()
