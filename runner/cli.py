"""The command line: a thin layer over the library.

``python3 -m runner [--dir DIR] [--json] VERB ...``. ``--dir`` and ``--json``
are accepted before or after the verb. With ``--json`` a verb prints exactly
one JSON object on stdout (an error object on failure); diagnostics go to
stderr as single lines; no verb prompts, and an expected error never prints a
traceback. Exit codes are those of :mod:`runner.errors`.
"""

import argparse
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import __version__
from .contract import check_contract, load_contract
from .envelope import canonical_json
from .errors import EXIT_CODES, InvalidInput, RunnerError, StateUnrecoverable
from .store import RunStore, scan

__all__ = ["main", "build_parser"]

EXIT_TABLE = "exit codes: 0 ok, 2 invalid input, 3 already-running, 4 awaiting-approval, 5 cancelled, 6 limit-exhausted, 7 state-unrecoverable, 8 needs-reconciliation, 9 fenced, 10 complete"


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so usage errors get exit code 2 and one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise InvalidInput(f"{self.prog}: {message}")


def _common(parser: argparse.ArgumentParser, top: bool) -> None:
    # On sub-parsers the defaults are suppressed so a value given before the
    # verb is not overwritten by the sub-parser's default.
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument("--dir", default=default, help="the run's folder (default: $RUNNER_DIR)")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS, help="print one JSON object on stdout")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="runner", description="Durable, resumable, fenced runs for long agent tasks.", epilog=EXIT_TABLE)
    parser.add_argument("--version", action="version", version=f"runner {__version__}")
    _common(parser, top=True)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    verbs.required = True

    def verb(name: str, help_text: str, handler: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, help=help_text, description=help_text, epilog=EXIT_TABLE)
        _common(sub, top=False)
        sub.set_defaults(handler=handler)
        return sub

    sub = verb("init", "start a new run from a filled run contract", cmd_init)
    sub.add_argument("--contract", required=True, metavar="FILE", help="a filled templates/run-contract.md")
    sub.add_argument("--durability", choices=("sync", "process"), default="sync", help=argparse.SUPPRESS)

    verb("status", "show the run's current state", cmd_status)

    sub = verb("doctor", "check the run's files; --repair makes only repairs that lose nothing", cmd_doctor)
    sub.add_argument("--repair", action="store_true", help="perform lossless repairs and list each")

    sub = verb("contract", "work with run contracts", cmd_contract)
    sub.add_argument("action", choices=("check",), help="check: validate a contract file")
    sub.add_argument("file", metavar="FILE")

    sub = verb("bench", "measure transition cost against a raw fsync'd append", cmd_bench)
    sub.add_argument("--transitions", type=_positive, default=2000)
    sub.add_argument("--scratch", metavar="DIR", default=None, help="folder on the disk to measure (default: the temp folder)")

    sub = verb("crashcheck", "explore every crash state a power loss can leave in the store", cmd_crashcheck)
    sub.add_argument("--transitions", type=_positive, default=200)
    sub.add_argument("--seed", type=int, default=1)
    sub.add_argument("--max-states", type=_positive, default=64, help="states per crash point before sampling")

    verb("demo", "the 2,000-document recovery demo", cmd_demo)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


# -- output -----------------------------------------------------------------

def _emit(args: argparse.Namespace, obj: Dict[str, Any], text: Optional[str] = None) -> None:
    if args.json:
        sys.stdout.write(json.dumps(obj, sort_keys=True, ensure_ascii=False) + "\n")
    elif text is not None:
        sys.stdout.write(text.rstrip("\n") + "\n")


def _warn(message: str) -> None:
    sys.stderr.write(f"runner: {message}\n")


def _run_dir(args: argparse.Namespace) -> str:
    path = args.dir or os.environ.get("RUNNER_DIR")
    if not path:
        raise InvalidInput("no run folder: pass --dir DIR or set RUNNER_DIR")
    return path


def _open(args: argparse.Namespace) -> RunStore:
    store = RunStore.open(_run_dir(args))
    for finding in store.findings:
        if finding.level != "note":
            _warn(f"{finding.code}: {finding.message} (repaired on the next write, or by 'doctor --repair')")
    return store


# -- verbs -------------------------------------------------------------------

def cmd_init(args: argparse.Namespace) -> int:
    plan = load_contract(args.contract)
    store = RunStore.create(_run_dir(args), plan["task_id"], plan, durability=args.durability)
    summary = _summary(store.state)
    _emit(args, {"ok": True, "path": store.path, **summary}, f"started run {summary['task_id']} in {store.path}\nplan {summary['plan_digest']}")
    return 0


def _summary(state: Dict[str, Any]) -> Dict[str, Any]:
    counts: Dict[str, int] = {}
    for effect in state["effects"].values():
        kind = effect.get("state", "unknown") if isinstance(effect, dict) else "unknown"
        counts[kind] = counts.get(kind, 0) + 1
    return {
        "task_id": state["task_id"],
        "schema_version": state["schema_version"],
        "plan_digest": state["plan_digest"],
        "revision": state["revision"],
        "status": state["status"],
        "created_at": state["created_at"],
        "updated_at": state["updated_at"],
        "current_step": state["current_step"],
        "completed_steps": state["completed_steps"],
        "next_action": state["next_action"],
        "effects": counts,
        "lease": state["lease"],
        "cancellation": state["observations"].get("cancellation"),
    }


def cmd_status(args: argparse.Namespace) -> int:
    store = _open(args)
    summary = _summary(store.state)
    lines = [
        f"task      {summary['task_id']}  ({summary['status']}, revision {summary['revision']})",
        f"plan      {summary['plan_digest']}",
        f"step      {summary['current_step'] or '-'}; done: {', '.join(summary['completed_steps']) or '-'}",
        f"effects   {', '.join(f'{k} {v}' for k, v in sorted(summary['effects'].items())) or 'none'}",
        f"lease     {summary['lease']['owner'] or '-'} (epoch {summary['lease']['epoch']}, expires {summary['lease']['expires_at'] or '-'})",
        f"next      {json.dumps(summary['next_action']) if summary['next_action'] else '-'}",
    ]
    _emit(args, {"ok": True, "path": store.path, **summary, "findings": [f._asdict() for f in store.findings]}, "\n".join(lines))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    path = _run_dir(args)
    found = scan(path, thorough=True)
    if not found.exists:
        raise InvalidInput(f"no run in {path}")
    repaired: List[Dict[str, str]] = []
    if args.repair:
        store = RunStore.open(path)  # quarantines unrecoverable state, as every verb does
        repaired = [f._asdict() for f in store.repair()]
        found = scan(path, thorough=True)
    problems = [f for f in found.findings if f.level != "note"]
    healthy = found.state is not None and not problems
    result = {
        "ok": found.state is not None,
        "healthy": healthy,
        "path": path,
        "revision": found.state["revision"] if found.state else None,
        "base": found.base,
        "findings": [f._asdict() for f in found.findings],
        "repaired": repaired,
    }
    text = [f"{f.level:10} {f.code}: {f.message}" for f in found.findings]
    text += [f"repaired   {r['code']}: {r['message']}" for r in repaired]
    if found.state is None:
        detail = "; ".join(f.message for f in found.findings if f.level == "damage")
        _emit(args, {**result, "error": "state-unrecoverable", "exit_code": 7}, "\n".join(text))
        _warn(f"state-unrecoverable: {detail}")
        return StateUnrecoverable.exit_code
    text.append(f"{'healthy' if healthy else 'loadable'}: revision {result['revision']} from {found.base}" + ("" if healthy else "; run 'doctor --repair' for lossless repairs"))
    _emit(args, result, "\n".join(text))
    return 0


def cmd_contract(args: argparse.Namespace) -> int:
    block, problems = check_contract(args.file)
    if problems:
        _emit(args, {"ok": False, "file": args.file, "errors": problems})
        for problem in problems:
            sys.stderr.write(problem + "\n")
        return InvalidInput.exit_code
    from .envelope import content_digest

    assert block is not None
    _emit(args, {"ok": True, "file": args.file, "task_id": block["task_id"], "plan_digest": content_digest(block), "steps": [s["id"] for s in block["steps"]]},
          f"{args.file}: ok (task {block['task_id']}, {len(block['steps'])} steps, plan {content_digest(block)})")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    result = run_bench(args.transitions, args.scratch)
    lines = [f"{key:28} {value}" for key, value in result.items() if key != "targets"]
    lines += [f"target {name:21} <= {t['target']}: {'met' if t['met'] else 'NOT met'}" for name, t in result["targets"].items()]
    _emit(args, result, "\n".join(lines))
    return 0


def cmd_crashcheck(args: argparse.Namespace) -> int:
    from .crashcheck import explore

    report = explore(transitions=args.transitions, seed=args.seed, max_states_per_point=args.max_states)
    lines = [f"{key:18} {value}" for key, value in report.items() if key != "examples"]
    lines += [f"violation: {example}" for example in report.get("examples", [])]
    _emit(args, report, "\n".join(lines))
    return 0 if report["violations"] == 0 else 1


def cmd_demo(args: argparse.Namespace) -> int:
    raise InvalidInput("the demo is not there yet: it arrives with the effect ledger and recovery (see README)")


# -- entry point ---------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    wants_json = "--json" in (argv if argv is not None else sys.argv[1:])
    try:
        args = parser.parse_args(argv)
        return int(args.handler(args))
    except RunnerError as exc:
        if wants_json:
            sys.stdout.write(json.dumps(exc.to_json(), sort_keys=True, ensure_ascii=False) + "\n")
        _warn(f"{exc.reason}: {exc.message}")
        return exc.exit_code
    except OSError as exc:
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        if wants_json:
            sys.stdout.write(json.dumps({"error": "io-error", "exit_code": 1, "message": f"{exc.strerror or exc}{where}"}) + "\n")
        _warn(f"i/o error: {exc.strerror or exc}{where}")
        return 1
    except KeyboardInterrupt:
        _warn("interrupted")
        return 130
