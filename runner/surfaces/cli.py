"""The command line: a thin layer over the library.

``python3 -m runner [--dir DIR] [--json] VERB ...``. ``--dir`` and ``--json``
are accepted before or after the verb. With ``--json`` a verb prints exactly
one JSON object on stdout (an error object on failure); diagnostics go to
stderr as single lines; no verb prompts, and an expected error never prints a
traceback. Exit codes are those of :mod:`runner.base.errors`.
"""

import argparse
import json
import os
import signal
import sys
import time
from typing import AbstractSet, Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import __version__
from . import verbs
from ..ledger.approvals import payload_source
from ..ledger.batch import run_workspace
from ..ledger.effects import attempt_counts
from ..calls.commands import INVOKE_EXITS, OBSERVE_EXITS
from ..contract.templates import PLACEHOLDERS
from ..contract.text import check_contract, load_contract
from ..ledger.states import EFFECT_STATES
from ..base.values import MAX_DURATION_SECONDS
from ..base.canonical import MAX_DOCUMENT_BYTES, loads_strict, read_document
from ..base.output import best_effort
from ..base.paths import PACKAGE_PARENT
from ..base.errors import EXIT_TABLE as EXIT_ROWS
from ..base.errors import InvalidInput, RunnerError, StateUnrecoverable
from ..execution.recovery import decision_exit_code, stop_for_error
from ..execution.run import Run
from ..stores import create_store, open_store, parse_store_url
from ..stores.file import RunStore, check
from ..ledger.costs import spend, spend_line
from .stops import line as stop_line, with_stop
from .views import status_view

__all__ = ["main", "build_parser"]

#: The ``--help`` epilog, generated from :data:`runner.base.errors.EXIT_TABLE`.
EXIT_TABLE = "exit codes: " + ", ".join(f"{row.code} {row.reason}" for row in EXIT_ROWS)

#: What ``effect run`` takes and what its commands' exit codes mean (:mod:`runner.calls.commands`).
EFFECT_RUN_HELP = "\n".join(
    ["effect run KEY [--payload FILE]   the contract's effects.invoke and effects.observe commands",
     "effect run KEY --payload FILE -- INVOKE [ARGS...] --observe -- OBSERVE [ARGS...]   commands given inline",
     "  (placeholders in the arguments: " + " ".join("{" + name + "}" for name in PLACEHOLDERS) + ")",
     "", "invoke command exits:"]
    + [f"  {code:>5}  {meaning}" for code, meaning in INVOKE_EXITS]
    + ["observe command exits:"] + [f"  {code:>5}  {meaning}" for code, meaning in OBSERVE_EXITS])


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so usage errors get exit code 2 and one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        verb = self.prog.partition(" ")[2]  # "runner effect" -> "effect"; the top level names none
        raise InvalidInput(f"{verb}: {message}" if verb else message)

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse makes a formatter for each argument it adds (to check its metavar), and by default the formatter
        # asks shutil for the terminal's width: shutil, with bz2 and lzma, would be imported into every command.
        return self.formatter_class(prog=self.prog, width=_help_width())  # type: ignore[call-arg]


def _help_width() -> int:
    """The width help is wrapped to, reckoned as argparse does: $COLUMNS, else the terminal's, else 80; less 2."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        stdout = sys.__stdout__  # None when the process was started without one
        try:
            columns = os.get_terminal_size(stdout.fileno()).columns if stdout is not None else 0
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns if columns > 0 else 80) - 2


def _common(parser: argparse.ArgumentParser, top: bool) -> None:
    # On sub-parsers the defaults are suppressed so a value given before the
    # verb is not overwritten by the sub-parser's default.
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument("--dir", default=default,
                        help="the run's folder (default: $RUNNER_DIR, else the nearest .run/ in this folder or above)")
    parser.add_argument("--store", default=default, metavar="URL",
                        help=("file:DIR, sqlite:PATH or postgresql://... "
                              "(default: $RUNNER_STORE; --dir DIR is file:DIR)"))
    parser.add_argument("--task", default=default, metavar="ID",
                        help="the run's task id in a database store (default: $RUNNER_TASK)")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="print one JSON object on stdout")


class _Unbuilt:
    """Stands in for the parser of a verb the command line does not name: whatever is added to it is dropped."""

    def __getattr__(self, name: str) -> Callable[..., "_Unbuilt"]:
        return lambda *args, **kwargs: self


class _Verbs:
    """Adds the command line's verbs to ``subparsers``, each with its help, handler, epilog and the common options.

    :param only: when given, a verb whose name is not in it gets an :class:`_Unbuilt` and no parser.
    """

    def __init__(self, parser: argparse.ArgumentParser, subparsers: Any, only: Optional[AbstractSet[str]]) -> None:
        self.parser, self.subparsers, self.only = parser, subparsers, only

    def add(self, name: str, help_text: str, handler: Callable[[argparse.Namespace], int],
            epilog: str = "") -> argparse.ArgumentParser:
        """The parser of verb ``name``: its help is its description, and the exit table ends its epilog."""
        if self.only is not None and name not in self.only:
            return _Unbuilt()  # type: ignore[return-value]
        sub = self.subparsers.add_parser(name, help=help_text, description=help_text,
                                         epilog=(epilog + "\n\n" if epilog else "") + EXIT_TABLE,
                                         formatter_class=argparse.RawDescriptionHelpFormatter)
        _common(sub, top=False)
        self.parser.verb_parsers[name] = sub  # type: ignore[attr-defined]
        sub.set_defaults(verb_handler=handler)  # not "handler": a verb's own option may be named so ('work --handler')
        return sub


#: How each group adds its verbs: ``verb(name, help, handler, epilog="")`` returns the verb's parser.
_AddVerb = Callable[..., argparse.ArgumentParser]


def build_parser(extensions: Sequence[Callable[[_AddVerb], None]] = (),
                 only: Optional[AbstractSet[str]] = None) -> argparse.ArgumentParser:
    """The command line's parser; each of ``extensions`` is called with ``verb(name, help, handler)`` to add verbs.

    The verbs are listed in ``--help`` in the order they are added: the groups of :data:`_GROUPS`, then the
    extensions'.

    :param only: when given, the verbs whose names are not in it are left out (a call that names one verb need not
        build the other verbs' parsers, most of a start's cost); their parsers are then :class:`_Unbuilt`.
    """
    parser = _Parser(prog="runner", description="Durable, resumable, fenced runs for long agent tasks.",
                     epilog=EXIT_TABLE)
    parser.add_argument("--version", action="version", version=f"runner {__version__}")
    _common(parser, top=True)
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    subparsers.required = True
    parser.verb_parsers = {}  # type: ignore[attr-defined]
    verbs_of = _Verbs(parser, subparsers, only)
    for group in _GROUPS:
        group(verbs_of.add)
    for extend in extensions:
        extend(verbs_of.add)
    return parser


def _run_verbs(verb: _AddVerb) -> None:
    """The run itself: start one, its state, its files, a contract."""
    sub = verb("init", "start a new run from a filled run contract", cmd_init)
    sub.add_argument("--contract", required=True, metavar="FILE", help="a filled templates/run-contract.md")

    verb("status", "show the run's current state", cmd_status)

    sub = verb("doctor", "check the run's files; --repair makes only repairs that lose nothing", cmd_doctor)
    sub.add_argument("--repair", action="store_true", help="perform lossless repairs and list each")

    sub = verb("contract", "work with run contracts", cmd_contract)
    sub.add_argument("action", choices=("check",), help="check: validate a contract file")
    sub.add_argument("file", metavar="FILE")


def _ledger_verbs(verb: _AddVerb) -> None:
    """What a worker records under its lease: the lease, effects, steps."""
    sub = verb("lease", "acquire, renew, release, break or show the run's lease", cmd_lease)
    sub.add_argument("action", choices=("acquire", "renew", "release", "break", "show"))
    _writer(sub)
    sub.add_argument("--ttl", type=_seconds, default=None, help="seconds the lease lives (acquire, renew)")
    sub.add_argument("--by", metavar="WHO", help="break: the supervisor that saw the holder's process end")
    sub.add_argument("--reason", metavar="TEXT", help="break: the evidence that it ended")

    sub = verb("effect", "record an external effect's lifecycle in the ledger", cmd_effect, EFFECT_RUN_HELP)
    sub.add_argument("action", choices=("begin", "ack", "verify", "absent", "uncertain", "run", "skip", "reopen",
                                        "show", "list"))
    sub.add_argument("key", nargs="?", metavar="KEY")
    sub.add_argument("--payload", metavar="FILE",
                     help="begin/run: the payload as a JSON file, or - for stdin (default: a batch item's template)")
    sub.add_argument("--step", metavar="STEP", help="begin: the step the effect belongs to (default: the current step)")
    sub.add_argument("--receipt", metavar="JSON", help="ack: the target's receipt (inline JSON, @FILE or -)")
    sub.add_argument("--evidence", metavar="JSON",
                     help="verify/absent: what the observation found (inline JSON, @FILE or -)")
    sub.add_argument("--reason", metavar="TEXT",
                     help="uncertain: why the outcome is unknown; skip: why the batch item is left out; reopen: why "
                          "a failed effect may be called again")
    sub.add_argument("--reconciled", action="store_true",
                     help="verify/absent: the outcome was unknown and is settled by this observation")
    sub.add_argument("--by", metavar="WHO", help="verify/absent: the person who looked at the target (kept in the "
                                                 "evidence as observed_by; it settles an unknown outcome); reopen: the "
                                                 "person who gives a failed effect a new budget of attempts (not the "
                                                 "lease's holder)")
    sub.add_argument("--state", choices=EFFECT_STATES, help="list: only effects in this state")
    sub.add_argument("--limit", type=positive, default=None, metavar="N",
                     help=f"list: at most N effects (default {verbs.DEFAULT_LIMIT})")
    _writer(sub)

    sub = verb("skip", "skip many items of a batch step with one reason, all or none: --state STATE or "
                       "--all-remaining; refused if any may have happened", cmd_skip)
    sub.add_argument("step_id", metavar="STEP")
    sub.add_argument("--state", metavar="STATE", help="skip the items in this state (pending: never begun)")
    sub.add_argument("--all-remaining", action="store_true", help="skip every item neither verified nor skipped")
    sub.add_argument("--reason", metavar="TEXT", help="why the items are left out (one line)")
    _writer(sub)

    sub = verb("step", "start, finish or fail a step of the plan", cmd_step)
    sub.add_argument("action", choices=("start", "done", "fail"))
    sub.add_argument("step_id", metavar="STEP")
    sub.add_argument("--evidence", metavar="JSON",
                     help="done: the evidence the contract asks for (inline JSON, @FILE or -)")
    sub.add_argument("--class", dest="error_class", choices=("transient", "permanent"),
                     help="fail: transient (retry after a backoff) or permanent")
    sub.add_argument("--error", metavar="TEXT", help="fail: what went wrong")
    _writer(sub)


def _authority_verbs(verb: _AddVerb) -> None:
    """What people decide and what the run is charged: cancellation, approvals, costs, a change of plan."""
    sub = verb("cancel", "cancel the run: no new step or effect begins; in-flight effects are still reconciled",
               cmd_cancel)
    sub.add_argument("--by", required=True, metavar="WHO")
    sub.add_argument("--reason", required=True, metavar="TEXT")

    sub = verb("approval", "request, grant, deny or list scoped approvals", cmd_approval)
    sub.add_argument("action", choices=("request", "grant", "deny", "list"))
    sub.add_argument("target", nargs="?", metavar="STEP|REQUEST_ID")
    sub.add_argument("--action", dest="requested_action", metavar="TEXT",
                     help="request: effect:KEY, the action to approve")
    sub.add_argument("--payload", metavar="FILE", help="request: the exact payload that will be sent (JSON file or -)")
    sub.add_argument("--ttl", type=_seconds, default=None,
                     help="request: seconds until the request and its grant expire")
    sub.add_argument("--by", metavar="WHO", help="grant/deny: who answers")
    _writer(sub)

    sub = verb("cost", "attribute an attempt's costs to the run (e.g. --add tokens=1200 --add money=0.03)", cmd_cost)
    sub.add_argument("--add", action="append", default=[], metavar="NAME=AMOUNT")
    _writer(sub)

    sub = verb("migrate", "record a change of plan as a new attempt of the same run", cmd_migrate)
    sub.add_argument("--contract", required=True, metavar="FILE")
    sub.add_argument("--reason", required=True, metavar="TEXT")
    _writer(sub)


def _decision_verbs(verb: _AddVerb) -> None:
    """The next action: named, carried out by the runner, recovered to, summarised for a fresh context."""
    sub = verb("next", "name exactly one safe next action, or one stop with its reason", cmd_next)
    _writer(sub)
    sub.add_argument("--contract", metavar="FILE",
                     help="refuse (exit 2) if this contract's plan differs from the run's")

    sub = verb("drive",
               "take the lease and perform every action the runner can establish alone, until a stop or a judgement",
               cmd_drive)
    _writer(sub)
    sub.add_argument("--ttl", type=_seconds, default=None, help="lease time to live (default: the contract's)")
    sub.add_argument("--max-actions", type=positive, default=None, metavar="N", help="return (exit 0) after N actions")
    sub.add_argument("--until-stop", action="store_true",
                     help="also wait out persisted backoffs instead of returning at them")
    sub.add_argument("--parallel", type=_concurrency, default=None, metavar="N",
                     help="effects in flight at once (default: the contract's effects.concurrency, else 1)")

    sub = verb("recover", "take the lease, reconcile, refresh authority and jobs, decide, and persist the intent",
               cmd_recover)
    _writer(sub)
    sub.add_argument("--ttl", type=_seconds, default=None, help="lease time to live (default: the contract's)")
    sub.add_argument("--contract", metavar="FILE",
                     help="refuse (exit 2) if this contract's plan differs from the run's")

    sub = verb("brief", "a bounded Markdown summary of durable facts, for a fresh model context", cmd_brief)
    sub.add_argument("--max-chars", type=positive, default=2000)


def _view_verbs(verb: _AddVerb) -> None:
    """What observers read: the transitions, the whole run's report."""
    sub = verb("events", "transitions after sequence number N (resume an observer where it left off)", cmd_events)
    sub.add_argument("--after", type=_not_negative, default=0, metavar="N")
    sub.add_argument("--limit", type=positive, default=None, metavar="N",
                     help="at most N events per page (default: all)")
    sub.add_argument("--follow", action="store_true", help="keep printing new events until the run stops")
    sub.add_argument("--timeout", type=_seconds, default=None, help="with --follow: stop after this many seconds")
    sub.add_argument("--otlp", metavar="FILE", type=output_file, default=None,
                     help="write the run as an OpenTelemetry trace (OTLP JSON lines)")
    sub.add_argument("--with-content", action="store_true", help="with --otlp: include receipts, evidence and reasons")

    sub = verb("items", "every item of a batch step: its key, state, attempts, deferrals and cost", cmd_items)
    sub.add_argument("step_id", metavar="STEP")
    sub.add_argument("--state", metavar="STATE", help="only the items in this state: pending (never begun), an "
                                                      "effect's state, or skipped")

    sub = verb("report", "recovery metrics of the whole run, across all workers and attempts", cmd_report)
    sub.add_argument("--html", metavar="FILE", type=output_file, default=None,
                     help="also write the run's timeline page (one HTML file)")


def _worker_verbs(verb: _AddVerb) -> None:
    """Work that outlives a call: re-attachable jobs, a pool of workers, the MCP server."""
    sub = verb("job", "re-attachable long jobs: submit KEY -- COMMAND [ARGS...], status, result, cancel, shard",
               cmd_job)
    sub.add_argument("action", choices=("submit", "status", "result", "cancel", "shard"))
    sub.add_argument("key", metavar="KEY")
    sub.add_argument("--done", type=int, metavar="N", help="shard: the last committed shard")
    _writer(sub)

    sub = verb("work", "a pool of N workers that claim the store's runs with leases and drive them with a handler",
               cmd_work)
    sub.add_argument("--workers", type=positive, default=2, metavar="N")
    sub.add_argument("--handler", dest="handler_spec", required=True, metavar="MODULE:FUNCTION",
                     help="called as f(store, owner, ttl, context) for each claimed run")
    sub.add_argument("--context", default="{}", metavar="JSON",
                     help="passed to the handler (and to the observer factory)")
    sub.add_argument("--observer", metavar="MODULE:FUNCTION",
                     help="called as f(context, seed) once in each worker; returns the observer of its commit windows")
    sub.add_argument("--ttl", type=_seconds, default=60.0)

    sub = verb("mcp", "serve the run to an MCP client over stdio; --allow-control is dangerous (see README)", cmd_mcp)
    _writer(sub)
    sub.add_argument("--ttl", type=_seconds, default=None, help="lease time to live (default: the contract's)")
    sub.add_argument("--read-only", action="store_true", help="list only the tools that read; take no lease")
    sub.add_argument("--allow-control", action="store_true",
                     help="DANGEROUS: let the client grant and deny approvals, cancel and break leases")


#: The groups of verbs, in the order ``--help`` lists them.
_GROUPS: Tuple[Callable[[_AddVerb], None], ...] = (
    _run_verbs, _ledger_verbs, _authority_verbs, _decision_verbs, _view_verbs, _worker_verbs)


def _writer(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--owner", default=os.environ.get("RUNNER_OWNER"), metavar="ID",
                     help="the lease holder writing (default: $RUNNER_OWNER)")
    sub.add_argument("--epoch", type=_not_negative, default=None, metavar="N",
                     help="its fencing epoch from 'lease acquire' (default: $RUNNER_EPOCH)")


def _not_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def _env_epoch() -> Optional[int]:
    """``$RUNNER_EPOCH`` as an epoch; unset or empty is None. :raises InvalidInput: it is set to anything else."""
    value = os.environ.get("RUNNER_EPOCH")
    if not value:
        return None
    try:
        return _not_negative(value)
    except argparse.ArgumentTypeError as exc:
        raise InvalidInput(f"RUNNER_EPOCH {exc}") from None


def _seconds(text: str) -> float:
    """A duration on the command line: above 0 and at most ten years, or a usage error (exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= MAX_DURATION_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds above 0 and at most "
                                         f"{MAX_DURATION_SECONDS:,}")
    return value


def output_file(text: str) -> str:
    """An output file whose folder exists (checked before any work is done)."""
    folder = os.path.dirname(os.path.abspath(text))
    if not text or os.path.isdir(text) or not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file in an existing folder")
    return text


def _concurrency(text: str) -> int:
    from ..contract.effects import MAX_CONCURRENCY

    value = positive(text)
    if value > MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(f"{text!r} is above {MAX_CONCURRENCY}, the most effects one drive keeps in "
                                         "flight")
    return value


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


#: Options every verb takes: where the run is, how to print, and who writes.
_COMMON_OPTIONS = ("-h", "--help", "--dir", "--store", "--task", "--json", "--owner", "--epoch")


def check_verb_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what :data:`runner.surfaces.verbs.VERBS` says the verb does not take, and name what it needs.

    :raises InvalidInput: an option the verb does not take was given, or one it needs was not.
    """
    words = args.verb + (f" {args.action}" if isinstance(getattr(args, "action", None), str) else "")
    verb = verbs.verb_named(words)
    sub = parser.verb_parsers.get(args.verb)  # type: ignore[attr-defined]
    if verb is None or sub is None:
        return  # a verb only the command line has (runner.surfaces.verbs.COMMAND_LINE_ONLY)
    spellings = set(verb.arguments.values())
    for action in sub._actions:
        if not action.option_strings or action.option_strings[0] in _COMMON_OPTIONS:
            continue
        spelling = action.option_strings[-1]
        given = getattr(args, action.dest, action.default) not in (action.default, None, [])
        if given and spelling not in spellings and f"{args.verb} {spelling}" not in verbs.COMMAND_LINE_ONLY:
            raise InvalidInput(f"{words} takes no {spelling}")
    for name in verb.required:
        spelling = verb.arguments[name]
        action = next((a for a in sub._actions if (a.option_strings[-1:] == [spelling]) or
                       (not a.option_strings and not spelling.startswith("--") and a.dest != "action")), None)
        if action is not None and getattr(args, action.dest, None) in (None, []):
            raise InvalidInput(
                f"{words} needs "
                f"{spelling if not spelling.startswith('--') else spelling + ' ' + (action.metavar or name.upper())}")


# -- output -----------------------------------------------------------------

def emit(args: argparse.Namespace, obj: Dict[str, Any], text: Optional[str] = None) -> None:
    if args.json:
        sys.stdout.write(json.dumps(obj, sort_keys=True, ensure_ascii=False) + "\n")
    elif text is not None:
        sys.stdout.write(text.rstrip("\n") + "\n")


def warn(message: str) -> None:
    # One line, always: a newline inside a path or a message is shown escaped.
    sys.stderr.write("runner: " + message.replace("\r", "\\r").replace("\n", "\\n") + "\n")


#: The run folder a project keeps, found from the current folder as git finds ``.git``.
RUN_FOLDER = ".run"
#: The folder that holds this ``runner/`` package: the skill's (or the installed plugin's) root.
_PROGRAM_ROOT = PACKAGE_PARENT


def search_folders(env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None) -> List[str]:
    """The folders the nearest run is looked for from, in order.

    The current folder first. A process started in this runner's own root by
    a harness that did not say where the project is (Codex starts a plugin's
    MCP server in the plugin's folder) looks from ``$PWD`` instead, the folder
    its launcher was started in. ``$CLAUDE_PROJECT_DIR``, which Claude Code sets
    for its hooks, tools and MCP servers, comes last.
    """
    env = dict(os.environ) if env is None else env
    here = os.path.abspath(cwd or os.getcwd())
    shell = env.get("PWD") or ""
    if shell and os.path.isabs(shell) and os.path.isdir(shell) and _same_folder(here, _PROGRAM_ROOT):
        here = os.path.normpath(shell)
    folders = [here]
    project = env.get("CLAUDE_PROJECT_DIR") or ""
    if project and os.path.isabs(project) and os.path.normpath(project) not in folders:
        folders.append(os.path.normpath(project))
    return folders


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def nearest_run(folder: str) -> Optional[str]:
    """The nearest ``.run`` in ``folder`` or one of its parents, or None.

    The nearest entry of that name is the answer whatever it is: a symbolic
    link or a plain file is returned, for the store to refuse with its own
    error, rather than passed over for a run further up.
    """
    folder = os.path.abspath(folder)
    while True:
        candidate = os.path.join(folder, RUN_FOLDER)
        if os.path.lexists(candidate):
            return candidate
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _store_url(args: argparse.Namespace) -> str:
    """The run's store: ``--store``, else ``--dir`` (a file store), else the environment, else the nearest ``.run/``.

    A run found by search is named on stderr once (the verb's stdout, with
    ``--json`` one JSON object, is untouched) and kept in ``args.dir`` so that
    every later look-up of the same command sees the same folder. ``mcp``
    with no run to find serves the folder ``init`` would create, so that the
    server starts and each tool answers "no run" until there is one.
    """
    url = getattr(args, "store", None) or (f"file:{args.dir}" if args.dir else None) or os.environ.get("RUNNER_STORE")
    if not url and os.environ.get("RUNNER_DIR"):
        url = "file:" + os.environ["RUNNER_DIR"]
    if url:
        return url
    folders = search_folders()
    found = next((run for run in map(nearest_run, folders) if run is not None), None)
    if found is not None:
        warn(f"using the run in {found}")
    elif getattr(args, "verb", None) == "mcp":
        found = os.path.join(folders[0], RUN_FOLDER)
        warn(f"no {RUN_FOLDER}/ in {' or '.join(folders)} or above; serving {found} once 'init' starts a run there")
    else:
        raise InvalidInput(f"no run: no {RUN_FOLDER}/ in {' or '.join(folders)} or above; pass --dir DIR (or --store "
                           "URL --task ID), or set RUNNER_DIR")
    args.dir = found
    return "file:" + found


def _task(args: argparse.Namespace) -> Optional[str]:
    return getattr(args, "task", None) or os.environ.get("RUNNER_TASK")


def _run_dir(args: argparse.Namespace) -> str:
    kind, location = parse_store_url(_store_url(args))
    if kind != "file":
        raise InvalidInput(f"this verb works on a run folder (--dir), not on a {kind} store")
    return location


def _kept(args: argparse.Namespace, store: Any) -> Any:
    """``store``, closed by :func:`main` when the verb returns (a database store holds a connection)."""
    args.stores.append(store)
    return store


def _open(args: argparse.Namespace) -> Any:
    store = _kept(args, open_store(_store_url(args), _task(args)))
    for finding in store.findings:
        if finding.level != "note":
            warn(f"{finding.code}: {finding.message} (repaired on the next write, or by 'doctor --repair')")
    return store


# -- verbs -------------------------------------------------------------------

def cmd_init(args: argparse.Namespace) -> int:
    """Start a run; a relative ``workspace`` resolves against the contract file's folder, which the run keeps."""
    plan = load_contract(args.contract)
    if not (getattr(args, "store", None) or args.dir or os.environ.get("RUNNER_STORE") or os.environ.get("RUNNER_DIR")):
        args.dir = os.path.abspath(RUN_FOLDER)  # a new run belongs to the folder it is started in, as 'git init' does
    url = _store_url(args)
    if _task(args) not in (None, plan["task_id"]):
        raise InvalidInput(f"--task {_task(args)} differs from the contract's task_id {plan['task_id']}")
    store = _kept(args, create_store(url, plan["task_id"], plan,
                                     workspace_base=os.path.dirname(os.path.abspath(args.contract))))
    summary = status_view(store.state)
    workspace = run_workspace(store.state)
    where = getattr(store, "url", store.path)
    emit(args, {"ok": True, "path": store.path, "store": url, **summary, "workspace": workspace},
          f"started run {summary['task_id']} in {where}\nplan {summary['plan_digest']}\nworkspace {workspace}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    run = Run(_open(args))
    store = run.store
    summary = verbs.status(run)
    lines = [
        f"task      {summary['task_id']}  ({summary['status']}, revision {summary['revision']})",
        f"plan      {summary['plan_digest']}",
        f"step      {summary['current_step'] or '-'}; done: {', '.join(summary['completed_steps']) or '-'}",
        f"effects   {', '.join(f'{k} {v}' for k, v in sorted(summary['effects'].items())) or 'none'}",
    ]
    lines += [f"items     {step}: {p['verified']} verified + {p['skipped']} skipped of {p['total']}"
              for step, p in summary["items"].items()]
    for step, ev in summary["evidence"].items():
        lines.append(f"evidence  {step}: "
                     + ", ".join(f"{source} {json.dumps(value, sort_keys=True)[:100]}" for source, value in ev.items()))
    spent = spend_line(run.state, limited_only=False)
    lines += [f"spend     {spent}"] if spent else []
    lines += [
        f"lease     {summary['lease']['owner'] or '-'} (epoch {summary['lease']['epoch']}, expires "
        f"{summary['lease']['expires_at'] or '-'})",
        f"next      {summary['next']['text']}",
    ]
    emit(args, {"ok": True, "path": store.path, **summary, "findings": [f._asdict() for f in store.findings]},
         "\n".join(lines))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..calls import inflight

    if parse_store_url(_store_url(args))[0] != "file":
        # A database store checks its rows against the journal on open; what it rebuilt is a finding.
        store = _kept(args, open_store(_store_url(args), _task(args)))
        calls = [f._asdict() for f in inflight.findings(store)]
        findings = [f._asdict() for f in store.findings] + calls
        rebuilt = [f._asdict() for f in store.repair()] if args.repair else []
        healthy = (len(findings) == len(calls) or bool(rebuilt)) and not calls
        text = ([f"{f['level']:10} {f['code']}: {f['message']}" for f in findings]
                + [f"repaired   {r['code']}: {r['message']}" for r in rebuilt])
        text.append(f"{'healthy' if healthy else 'loadable'}: revision {store.revision}"
                    + ("" if healthy else _not_healthy(findings)))
        emit(args, {"ok": True, "healthy": healthy, "revision": store.revision, "findings": findings,
                    "repaired": rebuilt}, "\n".join(text))
        return 0
    path = _run_dir(args)
    found = check(path)  # under the run's lock: a writer compacting meanwhile cannot make it look damaged
    if not found.exists:
        raise InvalidInput(f"no run in {path}")
    repaired: List[Dict[str, str]] = []
    if args.repair:
        store = RunStore.open(path)  # quarantines unrecoverable state, as every verb does
        repaired = [f._asdict() for f in store.repair()]
        found = check(path)
    calls = inflight.Registry(os.path.join(path, inflight.CALLS)).findings()
    problems = [f for f in found.findings if f.level != "note"] + calls
    healthy = found.state is not None and not problems
    result: Dict[str, Any] = {
        "ok": found.state is not None,
        "healthy": healthy,
        "path": path,
        "revision": found.state["revision"] if found.state else None,
        "base": found.base,
        "findings": [f._asdict() for f in found.findings + calls],
        "repaired": repaired,
    }
    text = [f"{f.level:10} {f.code}: {f.message}" for f in found.findings + calls]
    text += [f"repaired   {r['code']}: {r['message']}" for r in repaired]
    if found.state is None:
        detail = "; ".join(f.message for f in found.findings if f.level == "damage")
        emit(args, {**result, "error": "state-unrecoverable", "exit_code": 7}, "\n".join(text))
        warn(f"state-unrecoverable: {detail}")
        return StateUnrecoverable.exit_code
    text.append(f"{'healthy' if healthy else 'loadable'}: revision {result['revision']} from {found.base}"
                + ("" if healthy else _not_healthy(result["findings"])))
    emit(args, result, "\n".join(text))
    return 0


def _not_healthy(findings: List[Dict[str, str]]) -> str:
    """What to do about the findings that keep a run from being healthy, as the end of doctor's last line."""
    said = []
    if any(f["level"] not in ("note", "foreign") and not f["code"].startswith("history-") for f in findings):
        said.append("run 'doctor --repair' for lossless repairs")
    if any(f["level"] == "damage" and f["code"].startswith("history-") for f in findings):
        said.append("the run's history lacks records no repair brings back (a copy of the run folder may hold its "
                    "segments); the state itself loads")
    if any(f["code"] == "calls-refused" for f in findings):
        said.append("nothing is called until the calls folder is as said above")
    elif any(f["level"] == "foreign" for f in findings):
        said.append("what is in the calls folder that is not the runner's is for a person to look at and remove")
    return "; " + "; ".join(said) if said else ""


def cmd_contract(args: argparse.Namespace) -> int:
    block, problems = check_contract(args.file)
    if problems:
        emit(args, {"ok": False, "error": "invalid-input", "exit_code": InvalidInput.exit_code, "message": problems[0],
                    "file": args.file, "errors": problems})
        for problem in problems:
            sys.stderr.write(problem + "\n")
        return InvalidInput.exit_code
    from ..base.canonical import content_digest

    assert block is not None
    emit(args, {"ok": True, "file": args.file, "task_id": block["task_id"], "plan_digest": content_digest(block),
                "steps": [s["id"] for s in block["steps"]]},
          f"{args.file}: ok (task {block['task_id']}, {len(block['steps'])} steps, plan {content_digest(block)})")
    return 0


def _json_arg(value: Optional[str], what: str) -> Dict[str, Any]:
    """Inline JSON, ``@FILE`` or ``-`` (stdin): a JSON object within the size limit."""
    if value is None:
        raise InvalidInput(f"{what} is required")
    if value == "-":
        text = sys.stdin.read(MAX_DOCUMENT_BYTES + 1)
    elif value.startswith("@"):
        text = read_document(value[1:], what)
    else:
        text = value
    return _json_object(text, what)


def _json_object(text: str, what: str) -> Dict[str, Any]:
    if len(text.encode("utf-8", "replace")) > MAX_DOCUMENT_BYTES:
        raise InvalidInput(f"{what} is larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        obj = loads_strict(text)
    except ValueError as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    return obj


def _payload_arg(value: Optional[str]) -> Dict[str, Any]:
    if value is None:
        raise InvalidInput("--payload FILE is required (a JSON file, or - for stdin)")
    return _json_arg(value if value == "-" else "@" + value, "payload")


def _worker(args: argparse.Namespace) -> Run:
    return Run(_open(args), args.owner, args.epoch)


def _counted(effect: Dict[str, Any]) -> str:
    """An effect's attempts, and its deferrals apart when it has any: ``attempts 2, deferrals 3``."""
    made = attempt_counts(effect)
    return f"attempts {made['attempts']}" + (f", deferrals {made['deferrals']}" if made["deferrals"] else "")


def _effect_out(args: argparse.Namespace, result: Dict[str, Any]) -> int:
    effect, extra = result["effect"], {"counts": result["counts"]} if "counts" in result else {}
    text = f"{result['key']}: {effect['state']} ({_counted(effect)})"
    if "counts" in result:
        counts = result["counts"]
        text = (f"{result['key']}: {effect['state']} (attempts {counts['attempts']} of {counts['max_attempts']}, "
                f"deferrals {counts['deferrals']} of {counts['max_deferrals']})")
    for entry in effect.get("reopened") or []:
        text += f"\nreopened at {entry.get('at')} by {entry.get('by')}: {entry.get('reason')}"
    emit(args, {"ok": True, "key": result["key"], **effect, **extra}, text)
    return 0


def cmd_lease(args: argparse.Namespace) -> int:
    run = _worker(args)
    if args.action == "show":
        view = verbs.lease_show(run)["lease"]
        emit(args, {"ok": True, **view},
             f"{view['owner'] or 'nobody'} (epoch {view['epoch']}, expires {view['expires_at'] or '-'}, "
             f"{'live' if view['live'] else 'not live'})")
        return 0
    if args.action == "break":
        view = verbs.lease_break(run, args.by, args.reason)["lease"]
        emit(args, {"ok": True, **view},
             f"lease of {view['owner'] or 'nobody'} (epoch {view['epoch']}) ended at {view['expires_at'] or '-'}: "
             "its holder's writes are refused from now on, and the next drive or recover takes the lease at a "
             "higher epoch")
        return 0
    if not args.owner:
        raise InvalidInput(f"lease {args.action} needs --owner ID")
    if args.action == "acquire":
        view = verbs.lease_acquire(run, args.owner, args.ttl)["lease"]
    elif args.action == "renew":
        view = verbs.lease_renew(run, args.ttl)["lease"]
    else:
        view = verbs.lease_release(run)["lease"]
    emit(args, {"ok": True, **view},
         f"{args.action}: {view['owner'] or 'nobody'} at epoch {view['epoch']}, expires {view['expires_at'] or '-'}")
    return 0


def cmd_effect(args: argparse.Namespace) -> int:
    run = _worker(args)
    key = args.key
    if args.action == "list":
        found = verbs.effect_list(run, args.state, args.limit)
        lines = [f"{k}  {e['state']}  {_counted(e)}" for k, e in found["effects"].items()]
        if found["more"]:
            lines.append(f"... {found['count'] - len(found['effects'])} more (--limit N)")
        emit(args, {"ok": True, **found}, "\n".join(lines) or "no effects")
        return 0
    if args.action == "show":
        return _effect_out(args, verbs.effect_show(run, key))
    if args.action == "begin":
        # A batch item's payload is the one its step's template makes; another one is refused with both digests.
        # It is printed, since the caller sends exactly it to the target.
        source = os.path.abspath(args.payload) if args.payload and args.payload != "-" else None
        began = verbs.effect_begin(run, key, _payload_arg(args.payload) if args.payload else None, step=args.step,
                                   source=source)
        effect, payload = began["effect"], began["payload"]
        emit(args, {"ok": True, "key": key, **effect, "payload": payload},
              f"{key}: {effect['state']} ({_counted(effect)})\npayload "
              f"{json.dumps(payload, sort_keys=True, ensure_ascii=False)}")
        return 0
    if args.action == "run":
        invoke, observe = _effect_commands(args.command)
        return _effect_out(args, verbs.effect_run(run, key, _payload_arg(args.payload) if args.payload else None,
                                                  invoke, observe))
    if args.action == "skip":
        skipped = verbs.effect_skip(run, key, args.reason)["effect"]
        emit(args, {"ok": True, **skipped}, f"{key}: skipped in step {skipped['step']}: {skipped['reason']}")
        return 0
    if args.action == "reopen":
        return _effect_out(args, verbs.effect_reopen(run, key, args.by, args.reason))
    if args.action == "ack":
        return _effect_out(args, verbs.effect_ack(run, key, _json_arg(args.receipt, "--receipt")))
    if args.action in ("verify", "absent"):
        record = verbs.effect_verify if args.action == "verify" else verbs.effect_absent
        return _effect_out(args, record(run, key, _json_arg(args.evidence, "--evidence"), args.reconciled, by=args.by))
    return _effect_out(args, verbs.effect_uncertain(run, key, args.reason))


def _effect_commands(tail: List[str]) -> Tuple[Optional[List[str]], Optional[List[str]]]:
    """``INVOKE... --observe -- OBSERVE...`` after ``effect run KEY --``: the two inline commands, or none."""
    if not tail:
        return None, None
    for cut in range(len(tail) - 1):
        if tail[cut] == "--observe" and tail[cut + 1] == "--":
            invoke, observe = tail[:cut], tail[cut + 2 :]
            if invoke and observe:
                return invoke, observe
    raise InvalidInput("effect run takes both commands inline: -- INVOKE [ARGS...] --observe -- OBSERVE [ARGS...]")


def cmd_drive(args: argparse.Namespace) -> int:
    from ..execution.drive import DriveOptions, Driver

    if not args.owner:
        raise InvalidInput("drive needs --owner ID (the worker taking the lease)")
    run = Run(_open(args))
    options = DriveOptions(verbs.default_ttl(run.state, args.ttl), max_actions=args.max_actions,
                           until_stop=args.until_stop, progress=None if args.json else sys.stderr)
    driver = Driver.with_new_executor(run, args.owner, options, parallel=args.parallel)
    executor = driver.executor

    def stop(signum: int, _frame: Any) -> None:
        # The first SIGTERM or SIGINT: begin no new call, let the calls in flight settle and be recorded,
        # release the lease, exit 15. A second one: stop at once (what is in flight is reconciled later).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        executor.stop_requested = True
        executor.world.interrupt()
        warn(f"drive: stopping on {signal.Signals(signum).name}: nothing new begins; what is in hand finishes and is "
             "recorded, then the lease is released; a second signal stops at once")

    previous = [signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)]
    try:
        result = driver.drive()
    finally:
        for sig, handler in zip((signal.SIGTERM, signal.SIGINT), previous):
            signal.signal(sig, handler)
    tally = result.pop("tally")
    code = result["exit_code"]
    result["drive"] = dict(tally, handed_over=result.pop("handed_over"), **executor.figures)
    result["lease"] = dict(run.state["lease"])
    if result["decision"] == "stop" and result["reason"] not in ("complete",) and not args.json:
        warn(stop_line(result, run.state))
    _print_decision(args, result, run.state)
    return code


def cmd_step(args: argparse.Namespace) -> int:
    run = _worker(args)
    evidence = _json_arg(args.evidence, "--evidence") if args.evidence is not None else None
    result = verbs.step(run, args.action, args.step_id, evidence, args.error_class, args.error)
    record, decided = result.pop("record"), result["next"]
    emit(args, {"ok": True, **record, **result},
          f"{args.step_id}: {record['state']} (attempt {record['attempts']}); run {result['status']}; next "
          f"{decided['text']}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    result = verbs.cancel(Run(_open(args)), args.by, args.reason)
    emit(args, {"ok": True, **result},
          f"cancellation recorded; run {result['status']}"
          + ("" if result["status"] == "cancelled" else "; in-flight effects are reconciled first"))
    return 0


def cmd_approval(args: argparse.Namespace) -> int:
    run = _worker(args)
    if args.action == "list":
        items = verbs.approval_list(run)["approvals"]
        emit(args, {"ok": True, "approvals": items}, "\n".join(_approval_line(a) for a in items) or
             "no approval requests")
        return 0
    if args.action == "request":
        text = sys.stdin.read(MAX_DOCUMENT_BYTES + 1) if args.payload == "-" else read_document(args.payload, "payload")
        source = payload_source(None if args.payload == "-" else os.path.abspath(args.payload),
                                text.encode("utf-8", "replace"))
        result = verbs.approval_request(run, args.target, args.requested_action, _json_object(text, "payload"),
                                        args.ttl, source)
        rid, req = result["request_id"], result["request"]
        emit(args, {"ok": True, "request_id": rid, **req},
             f"{rid}: {req['state']}; ask a person to run: approval grant {rid} --by NAME")
        return 0
    answer = verbs.approval_answer(run, args.target, args.by, args.action == "grant")["request"]
    emit(args, {"ok": True, "request_id": args.target, **answer}, f"{args.target}: {answer['state']} by {answer['by']}")
    return 0


def _approval_line(item: Dict[str, Any]) -> str:
    """One request on one line: what it covers, the payload it was computed from, and its state."""
    state = (item["state"] + (f" by {item['superseded_by']}" if item.get("superseded_by") else "")
             + (" (expired)" if item["expired"] else ""))
    source = (f"from {item['payload_file'] or '(not a file)'}"
              + (f" {json.dumps(item['payload_head'], ensure_ascii=False)}" if item.get("payload_head") else ""))
    return (f"{item['request_id']}  {state}  step {item['step']}  {item['action']}  {item['payload_digest']}  "
            f"{source}  expires {item['expires_at']}")


def cmd_cost(args: argparse.Namespace) -> int:
    totals = verbs.cost(_worker(args), args.add)["cost"]
    emit(args, {"ok": True, "cost": totals}, "run cost: " + ", ".join(f"{k} {v:g}" for k, v in sorted(totals.items())))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    result = verbs.migrate(_worker(args), args.contract, args.reason)
    emit(args, {"ok": True, **result}, f"plan is now {result['plan_digest']}")
    return 0


#: How each list of a decision's evidence is labelled, line by line, in the text form.
_EVIDENCE_LABELS = (("observations", "observation"), ("inferences", "inference"), ("unknowns", "not settled"))


def _print_decision(args: argparse.Namespace, decision: Dict[str, Any], state: Optional[Dict[str, Any]] = None) -> int:
    """Print a decision (its text form, or JSON with a stop's code and sentence); its exit code.

    :param state: the run it was made on, from which a stop's sentence reads its specifics.
    """
    if decision["decision"] == "act":
        text = f"act: {json.dumps(decision['action'], sort_keys=True)}"
    else:
        decision = with_stop(decision, state)
        text = f"stop: {decision['stop_code']}: {decision['sentence']}"
    spent = spend(state) if state is not None else {}
    if spent:  # each named cost's spent, reserved and limit, beside what is decided
        decision = dict(decision, spend=spent)
    if not args.json:
        for field, label in _EVIDENCE_LABELS:
            for item in decision[field]:
                text += f"\n  {label}: {item if isinstance(item, str) else json.dumps(item, sort_keys=True)}"
    emit(args, decision, text)
    return decision_exit_code(decision)


def cmd_next(args: argparse.Namespace) -> int:
    try:
        run = Run(_open(args), args.owner, args.epoch)
    except StateUnrecoverable as exc:
        warn(f"{exc.reason}: {exc.message}")
        return _print_decision(args, stop_for_error(exc))
    _warn_job_damage(run)
    return _print_decision(args, verbs.next_decision(run, args.owner, args.epoch, args.contract), run.state)


def _warn_job_damage(run: Run) -> None:
    """Name each job file that will not be believed (the verbs observe the jobs themselves)."""
    for key, seen in sorted(verbs.observed_jobs(run.store.path, run.state).items()):
        if seen.get("damage"):
            warn(f"job {key}: {seen['damage']} (not believed)")


def cmd_recover(args: argparse.Namespace) -> int:
    if not args.owner:
        raise InvalidInput("recover needs --owner ID (the worker taking over)")
    try:
        run = Run(_open(args))
    except StateUnrecoverable as exc:
        warn(f"{exc.reason}: {exc.message}")
        return _print_decision(args, stop_for_error(exc))
    _warn_job_damage(run)
    return _print_decision(args, verbs.recover(run, args.owner, args.ttl, args.contract), run.state)


def cmd_brief(args: argparse.Namespace) -> int:
    result = verbs.brief(Run(_open(args)), args.max_chars)
    emit(args, {"ok": True, **result}, result["brief"])
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    store = _open(args)
    if args.otlp:
        if args.follow or args.after:
            raise InvalidInput("events: --otlp writes the whole run; it takes no --after or --follow")
        from .history import load
        from .otlp import write

        spans = write(args.otlp, [load(store)], args.with_content)
        emit(args, {"ok": True, "otlp": args.otlp, "spans": spans}, f"wrote {spans} spans to {args.otlp}")
        return 0
    if args.with_content:
        raise InvalidInput("events: --with-content goes with --otlp FILE")
    after = args.after
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        batch = verbs.events(store, after, args.limit)
        if args.json and not args.follow:
            emit(args, {"ok": True, **batch})
            return 0
        if batch["truncated"]:
            hint = ("events before 'oldest' were dropped by the run's history retention ('dropped' says what they "
                    "held); re-read 'status'" if batch.get("dropped") else
                    "events before 'oldest' are not in the run's history ('damage' says why); re-read 'status'")
            gap = {"gap": True, "after": after, "oldest": batch["oldest"], "hint": hint,
                   "dropped": batch.get("dropped"), "damage": batch.get("damage")}
            sys.stdout.write(json.dumps(gap) + "\n")
        for event in batch["events"]:
            sys.stdout.write(json.dumps(event, sort_keys=True, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        after = batch["last"] if batch["events"] or batch["truncated"] else after
        if batch["more"]:
            continue  # the next page at once
        if (not args.follow or store.state["status"] in ("complete", "cancelled") or
                (deadline is not None and time.monotonic() >= deadline)):
            return 0
        time.sleep(0.2)
        store.refresh()


def cmd_items(args: argparse.Namespace) -> int:
    found = verbs.items(Run(_open(args)), args.step_id, args.state)
    lines = []
    for row in found["items"]:
        line = f"{row['key']}  {row['state']}  attempts {row['attempts']}  deferrals {row['deferrals']}"
        if row["cost"]:
            line += "  cost " + ", ".join(f"{k} {v:g}" for k, v in sorted(row["cost"].items()))
        if row.get("reopened"):
            line += f"  reopened {row['reopened']}"
        lines.append(line)
    said = ", ".join(f"{k} {v}" for k, v in found["states"].items())
    lines.append(f"{found['count']} of {found['total']} items of step {found['step']}" + (f" ({said})" if said else ""))
    emit(args, {"ok": True, **found}, "\n".join(lines))
    return 0


def cmd_skip(args: argparse.Namespace) -> int:
    found = verbs.skip(_worker(args), args.step_id, args.reason, args.state, args.all_remaining)
    emit(args, {"ok": True, **found}, f"skipped {found['skipped']} items of step {found['step']}: {found['reason']}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .history import load

    store = _open(args)
    history = load(store)
    result = verbs.report(Run(store), history)
    if args.html:
        from .timeline import write

        result["html_bytes"] = write(args.html, [history])
    emit(args, {"ok": True, **result}, "\n".join(f"{k:22} {v}" for k, v in result.items()))
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    key = args.key
    result = verbs.job(_worker(args), args.action, key, args.command, args.done)
    if args.action == "submit":
        emit(args, {"ok": True, **result},
             f"job {key}: {result['state']} (pid {result['pid']}, attempt {result['attempt']})")
        return 0
    if result.get("damage"):
        warn(f"job {key}: {result['damage']} (not believed)")
    text = f"job {key}: {result['state']}" + (f", exit {result['exit_code']}"
                                              if result.get("exit_code") is not None else "")
    emit(args, {"ok": True, **result}, text + (f"\n{result['log_tail']}" if "log_tail" in result else ""))
    return 0


def cmd_work(args: argparse.Namespace) -> int:
    from ..execution.pool import PoolOptions, load_handler, run_pool

    url = _store_url(args)
    load_handler(args.handler_spec)  # fail here, once, rather than in every worker
    if args.observer:
        load_handler(args.observer, "observer factory")
    context = _json_arg(args.context, "--context")
    tally = run_pool(url, args.workers, args.handler_spec, PoolOptions(context=context, ttl=args.ttl,
                                                                        observer=args.observer))
    emit(args, {"ok": not tally["errors"], **tally}, "\n".join(f"{k:14} {v}" for k, v in tally.items()))
    return 0 if not tally["errors"] else 1


def cmd_mcp(args: argparse.Namespace) -> int:
    from .mcp.server import serve

    return serve(_store_url(args), _task(args), args.owner, args.epoch, args.ttl, args.read_only, args.allow_control)


# -- entry point ---------------------------------------------------------------

def split_command(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """The runner's own arguments, and a job's command line after the first ``--``."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def main(argv: Optional[Sequence[str]] = None,
         extensions: Sequence[Callable[[Callable[..., argparse.ArgumentParser]], None]] = ()) -> int:
    """Run one verb; return its exit code. What it prints is best effort (:mod:`runner.base.output`): a stream
    nobody reads never ends a verb, nor changes its code."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = best_effort(sys.stdout), best_effort(sys.stderr)
    try:
        return _main(argv, extensions)
    finally:
        sys.stdout.flush()
        sys.stdout, sys.stderr = streams


def _main(argv: Optional[Sequence[str]],
          extensions: Sequence[Callable[[Callable[..., argparse.ArgumentParser]], None]]) -> int:
    own, command = split_command(sys.argv[1:] if argv is None else argv)
    # Only the verbs a word of the call could name are built; help, the version or a call that names no verb
    # (an error that lists them all) gets the whole parser.
    parser = None if {"-h", "--help", "--version"} & set(own) else build_parser(extensions, only=set(own))
    if parser is None or not parser.verb_parsers:  # type: ignore[attr-defined]
        parser = build_parser(extensions)
    wants_json = "--json" in own
    stores: List[Any] = []
    try:
        args = parser.parse_args(own)
        args.stores = stores
        if (command and not (args.verb == "job" and args.action == "submit") and
                not (args.verb == "effect" and args.action == "run")):
            raise InvalidInput("only 'job submit KEY -- COMMAND' and 'effect run KEY -- COMMAND ...' "
                               "take arguments after --")
        args.command = command
        check_verb_arguments(parser, args)
        if hasattr(args, "epoch") and args.epoch is None:
            args.epoch = _env_epoch()
        return int(args.verb_handler(args))
    except RunnerError as exc:
        if wants_json:
            sys.stdout.write(json.dumps(exc.to_json(), sort_keys=True, ensure_ascii=False) + "\n")
        warn(f"{exc.reason}: {exc.message}")
        return exc.exit_code
    except OSError as exc:
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        if wants_json:
            sys.stdout.write(json.dumps({"error": "io-error", "exit_code": 1,
                                         "message": f"{exc.strerror or exc}{where}"}) + "\n")
        warn(f"i/o error: {exc.strerror or exc}{where}")
        return 1
    except KeyboardInterrupt:
        warn("interrupted")
        return 130
    finally:
        for store in stores:
            store.close()
