"""The proof verbs of the command line: ``bench``, ``crashcheck``, ``conformance``, ``campaign``, ``demo``,
``simulate``.

They exist to prove or demonstrate the runner, so they live apart from the
verbs users run; ``python3 -m runner`` adds them to the parser through
:func:`runner.surfaces.cli.build_parser`'s ``extensions``. Each prints its whole report
and exits with :class:`~runner.base.errors.ProofFailed`'s code when the proof found
a violation, so a failed proof is never confused with the runner failing.
"""

import argparse
import os
import sys
from typing import Any, Callable

from ..surfaces.cli import emit, output_file, positive, warn
from ..base.errors import InvalidInput, ProofFailed

__all__ = ["add_proof_verbs"]


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 0.5:
        raise argparse.ArgumentTypeError("the crash rate is a chance per document between 0 and 0.5")
    return value


def add_proof_verbs(verb: Callable[..., Any]) -> None:
    """Register the proof verbs with ``verb(name, help, handler)``."""
    sub = verb("bench", "measure transition cost against a raw fsync'd append", cmd_bench)
    sub.add_argument("--transitions", type=positive, default=2000)
    sub.add_argument("--scratch", metavar="DIR", default=None,
                     help="folder on the disk to measure (default: the temp folder)")
    sub.add_argument("--stores", action="store_true",
                     help="also compare the file, SQLite (and PostgreSQL, with --postgres URL) stores")
    sub.add_argument("--postgres", metavar="URL", default=None, help="a PostgreSQL database to include in --stores")
    sub.add_argument("--mcp", action="store_true",
                     help="also time one transition through the library, the MCP server and the command line")
    sub.add_argument("--drive", action="store_true",
                     help="instead: drive's items per second on a batch of 1,000 and of 20,000 items")
    sub.add_argument("--drive-sizes", type=positive, nargs=2, default=(1000, 20000), metavar=("SMALL", "LARGE"),
                     help="--drive: the two batch sizes")
    sub.add_argument("--parallel", action="store_true",
                     help="instead: drive with many calls in flight against a loopback target, through the HTTP "
                          "adapter and curl commands")
    sub.add_argument("--items", type=positive, default=2000, help="--parallel: items per form")
    sub.add_argument("--in-flight", type=positive, default=32, help="--parallel: calls in flight (drive --parallel N)")
    sub.add_argument("--latency", type=float, default=0.1,
                     help="--parallel: seconds the target takes to answer each request")
    sub.add_argument("--drive-durability", choices=("process", "sync"), default="process",
                     help="--drive: fsync each transition (sync) or not")

    sub = verb("crashcheck", "explore every crash state a power loss can leave in the store", cmd_crashcheck)
    sub.add_argument("--transitions", type=positive, default=200)
    sub.add_argument("--seed", type=int, default=1)
    sub.add_argument("--max-states", type=positive, default=64, help="states per crash point before sampling")

    sub = verb("conformance", "check an effect adapter against the runner's contract", cmd_conformance)
    sub.add_argument("--adapter", required=True, action="append", metavar="MODULE:FACTORY",
                     help="a factory returning an adapter or (adapter, controls); repeatable")

    sub = verb("campaign", "SIGKILL forked workers at every named commit window, resume each in another process, audit",
               cmd_campaign)
    sub.add_argument("--kills", type=positive, default=200)
    sub.add_argument("--damage", type=positive, default=None, metavar="N",
                     help="instead: damage N copies of real run folders at random and load each in a fresh process")
    sub.add_argument("--seed", type=int, default=1)
    sub.add_argument("--no-progress", action="store_true")
    sub.add_argument("--html", metavar="FILE", type=output_file, default=None,
                     help="write the timeline page of the runs to FILE")

    sub = verb("demo", "the 2,000-document recovery demo: workers killed and resumed, effects audited", cmd_demo)
    sub.add_argument("--documents", type=positive, default=2000)
    sub.add_argument("--seed", type=int, default=1)
    sub.add_argument("--crash-rate", type=_rate, default=0.01,
                     help="chance per document that its worker is killed (default 0.01)")
    sub.add_argument("--cancel-at", type=positive, default=None, metavar="N", help="cancel the run after N documents")
    sub.add_argument("--scenario", choices=("documents", "draft"), default="documents",
                     help="draft: the plan, write_draft, finish experiment")
    sub.add_argument("--workers", type=positive, default=None, metavar="N",
                     help="split the documents into runs of 100 and let N workers claim them")
    sub.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    sub.add_argument("--via-cli", action="store_true",
                     help="a batch contract and 'drive' processes only: no Python drives the job")
    sub.add_argument("--client", choices=("curl", "python", "http"), default=None,
                     help="--via-cli: how the contract calls the service: curl or Python commands, or effects.http "
                          "(default: curl if present)")
    sub.add_argument("--parallel", type=positive, default=1, metavar="N",
                     help="--via-cli: each drive keeps N effects in flight")
    sub.add_argument("--html", metavar="FILE", type=output_file, default=None,
                     help="write the timeline page of the run(s) to FILE")
    sub.add_argument("--compact-bytes", type=positive, default=None, metavar="N",
                     help="the single run compacts once its journal holds N bytes (and a quarter of the snapshot): "
                          "compaction made often")

    sub = verb("simulate", "the executor against a simulated world: seeded schedules of kills, stalls, contention "
                           "and a target that lags, "
                           "drops answers and says 'not now'; invariants checked", cmd_simulate)
    sub.add_argument("--seed", type=int, default=1, help="the first schedule's seed (schedule i is seed + i)")
    sub.add_argument("--schedules", type=positive, default=200)
    sub.add_argument("--variant", default="real", metavar="NAME",
                     help="a deliberately broken lifecycle, ledger, adapter, registry or list, to show the checks "
                          "catch it: no-wait, receipt-blind, receipt-blind-ledger, page-believed, proxy-not-now, "
                          "leader-only, trust-records, split-registry, shared-lookup, refreeze-rebinds, "
                          "listing-cut-believed, unknown-resent, observe-first-ignored (default: real, the code as "
                          "it is)")
    sub.add_argument("--trace", action="store_true",
                     help="print every event of each schedule (with --schedules 1: replay one schedule)")
    sub.add_argument("--stop-at-first", action="store_true", help="end at the first schedule that breaks an invariant")
    sub.add_argument("--no-progress", action="store_true", help="no progress line on stderr")


def _verdict(passed: bool, what: str) -> int:
    """0, or ProofFailed's exit code with one line on stderr (the report is already printed)."""
    if passed:
        return 0
    warn(f"{ProofFailed.reason}: {what}")
    return ProofFailed.exit_code


def cmd_bench(args: argparse.Namespace) -> int:
    if args.parallel:
        from .parallelbench import run_parallel_bench

        result = run_parallel_bench(items=args.items, in_flight=args.in_flight, latency=args.latency)
        lines = [f"ideal {result['ideal_seconds']} s ({result['items']} items x {result['latency_seconds']} s / "
                 f"{result['in_flight']} in flight)"]
        for form in ("http", "commands", "rate_limited"):
            if form in result:
                lines.append(f"{form:13} " + ", ".join(f"{k} {v}" for k, v in result[form].items() if k != "form"))
        if "cpu_commands_over_http" in result:
            lines.append(f"CPU per item, commands over http: {result['cpu_commands_over_http']}")
        lines += [f"target {name:26} {t['target']}: {'met' if t['met'] else 'NOT met'}"
                  for name, t in result["targets"].items()]
        emit(args, result, "\n".join(lines))
        if not result["ok"]:
            raise ProofFailed("a target holds other than one issue per item")
        return 0
    if args.drive:
        from .drivebench import run_drive_bench

        small, large = args.drive_sizes
        result = run_drive_bench(large=large, small=small, scratch=args.scratch, durability=args.drive_durability)
        emit(args, result, "\n".join(f"{key:24} {value}" for key, value in result.items()))
        return 0
    from .bench import run_bench

    result = run_bench(args.transitions, args.scratch)
    if args.stores:
        import tempfile

        from .bench import run_store_bench

        scratch = tempfile.mkdtemp(prefix="runner-bench-stores-", dir=args.scratch)
        try:
            urls = (["file:" + scratch, "sqlite:" + os.path.join(scratch, "runs.db")]
                    + ([args.postgres] if args.postgres else []))
            result["stores"] = run_store_bench(urls)
        finally:
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)
    if args.mcp:
        from .bench_mcp import run_mcp_bench

        count = min(500, max(20, args.transitions // 10))
        result["mcp"] = run_mcp_bench(count, max(5, count // 10), args.scratch)
    lines = [f"{key:28} {value}" for key, value in result.items() if key not in ("targets", "stores", "mcp")]
    lines += [f"store {row['store']:10} " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "store")
              for row in result.get("stores", [])]
    lines += [f"mcp {key:24} {value}" for key, value in result.get("mcp", {}).items()]
    lines += [f"target {name:21} <= {t['target']}: {'met' if t['met'] else 'NOT met'}"
              for name, t in result["targets"].items()]
    emit(args, result, "\n".join(lines))
    return 0


def cmd_crashcheck(args: argparse.Namespace) -> int:
    from .crashcheck import explore

    report = explore(transitions=args.transitions, seed=args.seed, max_states_per_point=args.max_states)
    lines = [f"{key:18} {value}" for key, value in report.items() if key != "examples"]
    lines += [f"violation: {example}" for example in report.get("examples", [])]
    emit(args, report, "\n".join(lines))
    return _verdict(report["violations"] == 0, f"the crash-state explorer found {report['violations']} violation(s)")


def cmd_conformance(args: argparse.Namespace) -> int:
    from .conformance import format_report, load_factory, run_conformance

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the user's adapter module is found from where they stand
    factories = [(spec, load_factory(spec)) for spec in args.adapter]
    reports = [run_conformance(factory, spec) for spec, factory in factories]
    passed = all(r["passed"] for r in reports)
    emit(args, {"ok": passed, "passed": passed, "reports": reports}, "\n\n".join(format_report(r) for r in reports))
    return _verdict(passed, "the adapter failed the conformance checks")


def cmd_campaign(args: argparse.Namespace) -> int:
    if args.damage is not None:
        if args.html:
            raise InvalidInput("campaign: --html draws the runs of a kill campaign; a damage campaign (--damage) has "
                               "none to draw")
        return cmd_damage_campaign(args)
    from .campaign import run_campaign

    result = run_campaign(args.kills, args.seed, None if args.no_progress or args.json else sys.stderr, html=args.html)
    lines = [f"{key:22} {value}" for key, value in result.items() if key not in ("kills_by_window", "errors")]
    lines += [f"  {window:36} {count}" for window, count in result["kills_by_window"].items()]
    lines += [f"error: {e}" for e in result["errors"][:20]]
    lines.append("RESULT: " + ("ok" if result["ok"] else "FAILED"))
    emit(args, result, "\n".join(lines))
    return _verdict(result["ok"], "the campaign found a violation")


def cmd_damage_campaign(args: argparse.Namespace) -> int:
    from .damage import OUTCOMES, run_damage_campaign

    result = run_damage_campaign(args.damage, args.seed, None if args.no_progress or args.json else sys.stderr)
    lines = [f"{key:22} {result[key]}" for key in ("copies", "seed") + OUTCOMES + ("seconds",)]
    lines += [f"  {damage:36} " + ", ".join(f"{k} {v}" for k, v in sorted(row.items()))
              for damage, row in result["by_damage"].items()]
    lines += [f"failure: {example}" for example in result["examples"]]
    lines.append("RESULT: " + ("ok" if result["ok"] else "FAILED"))
    emit(args, result, "\n".join(lines))
    return _verdict(result["ok"], "the damage campaign found a load that did not hold")


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import format_table, run_demo, run_draft_scenario

    if args.via_cli:
        from .demo_cli import format_cli_table, run_demo_cli

        result = run_demo_cli(args.documents, args.seed, args.crash_rate,
                              None if args.no_progress or args.json else sys.stderr, args.client,
                              args.parallel, html=args.html)
        page = f"\ntimeline page: {args.html} ({result['html_bytes']} bytes)" if args.html else ""
        emit(args, result, format_cli_table(result) + page)
        return _verdict(result["ok"], "the CLI-only demo's audit found a violation")
    if args.scenario == "draft":
        result = run_draft_scenario(sys.stderr if args.json else sys.stdout)
        emit(args, result, f"plan executed {result['plan_executions']} time(s); tickets held {result['tickets']}; "
                            f"same receipt reused: {result['same_receipt']}; status {result['status']}")
        return _verdict(result["ok"], "the draft scenario did not hold")
    if args.cancel_at is not None and args.cancel_at >= args.documents:
        raise InvalidInput("--cancel-at must be below --documents")
    store = getattr(args, "store", None) if args.workers else None
    result = run_demo(args.documents, args.seed, args.crash_rate, args.cancel_at,
                      None if args.no_progress else sys.stderr, workers=args.workers, store=store,
                      html=args.html, compact_bytes=args.compact_bytes)
    emit(args, result,
         format_table(result) + (f"\ntimeline page: {args.html} ({result['html_bytes']} bytes)" if args.html else ""))
    return _verdict(result["ok"], "the demo's audit found a violation")


def cmd_simulate(args: argparse.Namespace) -> int:
    from .simulation import VARIANTS, format_report, simulate

    if args.variant not in VARIANTS:
        raise InvalidInput(f"unknown variant {args.variant!r}; the variants are {', '.join(VARIANTS)}")
    progress = None if args.no_progress or args.json or args.schedules < 1000 else sys.stderr
    result = simulate(args.seed, args.schedules, args.variant, args.trace, progress, args.stop_at_first)
    emit(args, result, format_report(result))
    return _verdict(result["violations"] == 0, f"the simulation found {result['violations']} violation(s); "
                                               f"first failing seed {result['first_failing_seed']}: {result['replay']}")
