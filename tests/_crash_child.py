"""The child program of ``test_store_crash``: run the store until a chosen point kills it.

``python _crash_child.py --child --dir D --contract C --phase commit --event
before:replace:snapshot.json.tmp --occurrence 2`` starts a run and commits
transitions until the named point is reached for the second time, then sends
itself SIGKILL (without ``--event`` it commits 30 transitions and exits). Each
acknowledgement says whether the commit compacted. ``--verify D...`` loads each run folder in this (other)
process and prints one JSON report per folder. The program imports little,
so that each of the many children starts quickly.
"""

import json
import os
import signal
import sys
from typing import Any, Dict, List, Optional, Tuple

import _util
from runner.contract import load_contract
from runner.fs import OsFileSystem
from runner.stores.file import RunStore, scan

#: Transitions a child commits at most; every kill point is reached well before.
MAX_TRANSITIONS = 30


class KillingFileSystem(OsFileSystem):
    """The real file system, plus SIGKILL of this process at one named point.

    A point is ``when:op:name`` (``before:replace:snapshot.json.tmp``; ``name``
    is the base name of the first path) and its ``occurrence`` counted while
    ``phase`` is the target phase; or, with ``index``, the moment after
    ``index`` durable operations of the target phase have completed.
    ``mid:append:NAME`` writes the first half of the line to the real file
    and dies before the rest.
    """

    def __init__(self, target_phase: str, event: Optional[str], occurrence: int, index: Optional[int]) -> None:
        super().__init__()
        self.phase = ""
        self.target_phase = target_phase
        self.event = event
        self.occurrence = occurrence
        self.index = index
        self.seen = 0
        self.completed = 0
        self.compactions = 0  # snapshot temp files written while committing

    def _die(self) -> None:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def _matches(self, when: str, op: str, path: str) -> bool:
        if self.phase != self.target_phase or self.index is not None:
            return False
        if f"{when}:{op}:{os.path.basename(path)}" != self.event:
            return False
        self.seen += 1
        return self.seen == self.occurrence

    def _at(self, when: str, op: str, path: str) -> None:
        if self.phase == self.target_phase and self.index is not None:
            if when == "before" and self.completed == self.index:
                self._die()
            if when == "after":
                self.completed += 1
                print(f"op {self.completed} {op} {os.path.basename(path)}", flush=True)
            return
        if self._matches(when, op, path):
            self._die()

    def mkdir(self, path: str) -> None:
        self._at("before", "mkdir", path)
        super().mkdir(path)
        self._at("after", "mkdir", path)

    def write_file(self, path: str, data: bytes) -> None:
        if self.phase == "commit" and os.path.basename(path) == "snapshot.json.tmp":
            self.compactions += 1
        self._at("before", "write_file", path)
        super().write_file(path, data)
        self._at("after", "write_file", path)

    def create_exclusive(self, path: str, data: bytes = b"") -> None:
        self._at("before", "create_exclusive", path)
        super().create_exclusive(path, data)
        self._at("after", "create_exclusive", path)

    def append(self, path: str, data: bytes) -> None:
        self._at("before", "append", path)
        if self._matches("mid", "append", path):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            os.write(fd, data[: len(data) // 2])
            self._die()
        super().append(path, data)
        self._at("after", "append", path)

    def fsync(self, path: str) -> None:
        self._at("before", "fsync", path)
        super().fsync(path)
        self._at("after", "fsync", path)

    def replace(self, src: str, dst: str) -> None:
        self._at("before", "replace", src)
        super().replace(src, dst)
        self._at("after", "replace", src)

    def fsync_dir(self, path: str) -> None:
        self._at("before", "fsync_dir", path)
        super().fsync_dir(path)
        self._at("after", "fsync_dir", path)

    def truncate(self, path: str, size: int) -> None:
        self._at("before", "truncate", path)
        super().truncate(path, size)
        self._at("after", "truncate", path)

    def unlink(self, path: str) -> None:
        self._at("before", "unlink", path)
        super().unlink(path)
        self._at("after", "unlink", path)


def _say(*words: Any) -> None:
    print(" ".join(str(w) for w in words), flush=True)


class _Args:
    dir = ""
    contract = ""
    phase = ""
    event: Optional[str] = None
    occurrence = 1
    index: Optional[int] = None
    open = False
    compact_min_bytes = 1


def _parse(argv: List[str]) -> _Args:
    """``--dir D --contract C --phase P [--event E] [--occurrence N] [--index N] [--open] [--compact-min-bytes N]``."""
    args = _Args()
    items = iter(argv)
    for flag in items:
        key = flag.lstrip("-").replace("-", "_")
        if key == "open":
            args.open = True
        elif key in ("occurrence", "index", "compact_min_bytes"):
            setattr(args, key, int(next(items)))
        elif key in ("dir", "contract", "phase", "event"):
            setattr(args, key, next(items))
        else:
            raise SystemExit(f"crash child: unknown argument {flag!r}")
    if not (args.dir and args.contract and args.phase in ("init", "open", "commit")):
        raise SystemExit("crash child: --dir, --contract and --phase init|open|commit are required")
    return args


def child_main(argv: List[str]) -> int:
    """Init (or open) a run and commit transitions until the file system kills this process."""
    args = _parse(argv)
    fs = KillingFileSystem(args.phase, args.event, args.occurrence, args.index)
    options: Dict[str, Any] = {"fs": fs, "compact_min_bytes": args.compact_min_bytes}
    if args.open:
        fs.phase = "open"
        store = RunStore.open(args.dir, **options)
    else:
        plan = load_contract(args.contract)
        fs.phase = "init"
        store = RunStore.create(args.dir, plan["task_id"], plan, **options)
        _say("ack", 0, _util.effects_digest(store.state["effects"]), store.state["head"])
    fs.phase = "commit"
    for rev in range(store.revision + 1, store.revision + 1 + MAX_TRANSITIONS):
        _say("attempt", rev, _util.effects_digest(_util.next_effects(store.state["effects"], rev)))
        before = fs.compactions
        store.commit(_util.transition_ops(rev))
        _say("ack", rev, _util.effects_digest(store.state["effects"]), store.state["head"], "compacted" if fs.compactions > before else "kept")
    _say("finished")
    return 0


def _cli(argv: List[str]) -> Tuple[int, Optional[Dict[str, Any]], str]:
    """Run the command line in this process: exit code, its one JSON object, its stderr."""
    import contextlib
    import io

    from runner.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    lines = out.getvalue().splitlines()
    return code, (json.loads(lines[0]) if len(lines) == 1 else None), err.getvalue()


def _verify_one(path: str) -> Dict[str, Any]:
    report: Dict[str, Any] = {}
    report["status_code"], report["status"], _err = _cli(["--dir", path, "--json", "status"])
    store = RunStore.open(path)
    state = store.state
    report["revision"] = state["revision"]
    report["digest"] = _util.effects_digest(state["effects"])
    report["head"] = state["head"]
    report["findings"] = [f.code for f in store.findings if f.level != "note"]
    rev = state["revision"] + 1
    report["expected_next"] = _util.effects_digest(_util.next_effects(state["effects"], rev))
    store.commit(_util.transition_ops(rev))
    report["next_revision"] = store.revision
    report["next_digest"] = _util.effects_digest(store.state["effects"])
    report["after"] = [f"{f.code}: {f.message}" for f in scan(path, thorough=True).findings if f.level != "note"]
    return report


def _verify_init_one(path: str, contract: str) -> Dict[str, Any]:
    report: Dict[str, Any] = {}
    report["status_code"], report["status"], report["status_err"] = _cli(["--dir", path, "--json", "status"])
    if report["status_code"] == 2:
        report["init_code"], report["init"], report["init_err"] = _cli(["--dir", path, "--json", "init", "--contract", contract])
        report["status_code_after"], report["status_after"], _err = _cli(["--dir", path, "--json", "status"])
    report["doctor_code"], report["doctor"], _err = _cli(["--dir", path, "--json", "doctor"])
    return report


def verify_main(argv: List[str]) -> int:
    """Load each run folder named; print one JSON line per folder (``--init CONTRACT`` for init crashes)."""
    contract = None
    if argv[:1] == ["--init"]:
        contract, argv = argv[1], argv[2:]
    for path in argv:
        try:
            report = _verify_one(path) if contract is None else _verify_init_one(path, contract)
        except Exception:
            import traceback

            report = {"error": traceback.format_exc()}
        report["dir"] = path
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.exit(child_main(sys.argv[2:]))
    if sys.argv[1:2] == ["--verify"]:
        sys.exit(verify_main(sys.argv[2:]))
    sys.exit("usage: _crash_child.py --child ARGS | --verify [--init CONTRACT] DIR...")
