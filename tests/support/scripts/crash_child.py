"""The child program of ``test_store_crash``: run the store until a chosen commit window kills it.

``python crash_child.py --child --dir D --contract C --phase commit --window
store:after-rename --occurrence 2`` starts a run and commits transitions until
the store passes that window for the second time, then dies by SIGKILL
(without ``--window`` it commits 30 transitions and exits). ``--tear`` (with
``store:before-append``) writes half the record first; ``--index N`` instead
dies at the N-th window of the phase, whatever its name, after printing each
window it passes. Each acknowledgement says whether the commit compacted. ``--keep-bytes N`` gives the run a
history retention, so that compactions drop the oldest segments.
``--verify D...`` loads each run folder in this (other) process and prints one
JSON report per folder. The program imports little, so that each of the many
children starts quickly.
"""

import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from runner.contract.text import load_contract  # noqa: E402
from runner.proof.faults import KillAt, die  # noqa: E402
from runner.stores.file import RunStore, scan  # noqa: E402
from runner.base.windows import Observer  # noqa: E402
from tests.support import util as _util  # noqa: E402

#: Transitions a child commits at most; every kill point is reached well before.
MAX_TRANSITIONS = 30


class PhaseHooks(Observer):
    """Passes the store's windows of the target phase (``init``, ``open``, ``commit``) to a kill, and counts compactions."""

    def __init__(self, target_phase: str, kill: Optional[KillAt], index: Optional[int]) -> None:
        self.phase = ""
        self.target_phase = target_phase
        self.kill = kill
        self.index = index
        self.passed = 0
        self.compactions = 0

    def reached(self, window: str, **facts: Any) -> None:
        if self.phase == "commit" and window == "store:before-compaction":
            self.compactions += 1
        if self.phase != self.target_phase:
            return
        if self.index is not None:
            self.passed += 1
            print(f"op {self.passed} {window} {os.path.basename(facts.get('path') or '-')}", flush=True)
            if self.passed == self.index:
                die()
        elif self.kill is not None:
            self.kill.reached(window, **facts)


def _say(*words: Any) -> None:
    print(" ".join(str(w) for w in words), flush=True)


class _Args:
    dir = ""
    contract = ""
    phase = ""
    window: Optional[str] = None
    occurrence = 1
    tear = False
    index: Optional[int] = None
    open = False
    compact_min_bytes = 1
    keep_bytes: Optional[int] = None


def _parse(argv: List[str]) -> _Args:
    """``--dir D --contract C --phase P [--window W [--occurrence N] [--tear]] [--index N] [--open]
    [--compact-min-bytes N] [--keep-bytes N]`` (the last: the contract's history retention)."""
    args = _Args()
    items = iter(argv)
    for flag in items:
        key = flag.lstrip("-").replace("-", "_")
        if key in ("open", "tear"):
            setattr(args, key, True)
        elif key in ("occurrence", "index", "compact_min_bytes", "keep_bytes"):
            setattr(args, key, int(next(items)))
        elif key in ("dir", "contract", "phase", "window"):
            setattr(args, key, next(items))
        else:
            raise SystemExit(f"crash child: unknown argument {flag!r}")
    if not (args.dir and args.contract and args.phase in ("init", "open", "commit")):
        raise SystemExit("crash child: --dir, --contract and --phase init|open|commit are required")
    return args


def child_main(argv: List[str]) -> int:
    """Init (or open) a run and commit transitions until a window kills this process."""
    args = _parse(argv)
    kill = KillAt(args.window, args.occurrence, tear=args.tear) if args.window else None
    observer = PhaseHooks(args.phase, kill, args.index)
    options: Dict[str, Any] = {"observer": observer, "compact_min_bytes": args.compact_min_bytes}
    if args.open:
        observer.phase = "open"
        store = RunStore.open(args.dir, **options)
    else:
        plan = load_contract(args.contract)
        if args.keep_bytes is not None:
            plan["history"] = {"keep_bytes": args.keep_bytes}
        observer.phase = "init"
        store = RunStore.create(args.dir, plan["task_id"], plan, **options)
        _say("ack", 0, _util.effects_digest(store.state["effects"]), store.state["head"])
    observer.phase = "commit"
    for _ in range(MAX_TRANSITIONS):
        rev = store.revision + 1  # a drop of history the retention asks for is a revision of its own
        _say("attempt", rev, _util.effects_digest(_util.next_effects(store.state["effects"], rev)))
        before = observer.compactions
        store.commit(_util.transition_ops(rev))
        _say("ack", rev, _util.effects_digest(store.state["effects"]), store.state["head"], "compacted" if observer.compactions > before else "kept")
    _say("finished")
    return 0


def _cli(argv: List[str]) -> Tuple[int, Optional[Dict[str, Any]], str]:
    """Run the command line in this process: exit code, its one JSON object, its stderr."""
    import contextlib
    import io

    from runner.surfaces.cli import main

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
    records, oldest = store.records_after(0)
    whole = [r["rev"] for r in records] == list(range(1, store.revision + 1))
    whole = whole and records[-1]["hash"] == store.state["head"]
    dropped = (store.state["observations"].get("history") or {}).get("dropped") or {}
    report["history"] = {"whole": whole, "oldest": oldest, "findings": [f.message for f in store.history_findings],
                         "dropped": dropped.get("through", 0),
                         "revisions": [records[0]["rev"], records[-1]["rev"]] if records else []}
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
    sys.exit("usage: crash_child.py --child ARGS | --verify [--init CONTRACT] DIR...")
