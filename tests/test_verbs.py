"""One verb layer: the command line and the MCP tools accept the same things, and each names its own verbs.

:data:`runner.verbs.VERBS` is the table both surfaces are checked against: a
CLI verb or option, or an MCP tool or argument, that one surface gains and the
other lacks fails :func:`surface_problems` unless it is listed as deliberately
one-sided (:data:`runner.verbs.COMMAND_LINE_ONLY`). Planted differences show
the check fails.
"""

import argparse
import copy
import io
import json
import os
import unittest
from typing import Any, Dict, List, Sequence

try:
    from .support import util as _util
    from .support.cli import RunnerCli
except ImportError:
    from support import util as _util
    from support.cli import RunnerCli

from runner.surfaces import verbs
from runner.surfaces.cli import build_parser
from runner.contract.text import load_contract
from runner.surfaces.mcp.server import Session
from runner.surfaces.mcp import jsonrpc
from runner.surfaces.mcp.tools import TOOLS, Tool, in_tool_words
from runner.execution.run import Run
from runner.stores.file import RunStore

COMMON = {"-h", "--help", "--dir", "--store", "--task", "--json", "--owner", "--epoch"}


def _actions(sub: argparse.ArgumentParser) -> List[argparse.Action]:
    return list(sub._actions)


def surface_problems(parser: argparse.ArgumentParser, tools: Sequence[Tool]) -> List[str]:
    """Every difference between the command line, the MCP tools and :data:`runner.verbs.VERBS`."""
    problems: List[str] = []
    one_sided = verbs.COMMAND_LINE_ONLY
    by_tool = {v.tool: v for v in verbs.VERBS}
    # The MCP side: exactly the table's tools, each with exactly its verb's arguments and required ones.
    for tool in tools:
        verb = by_tool.get(tool.name)
        if verb is None:
            problems.append(f"MCP tool {tool.name} has no verb in runner.verbs.VERBS")
            continue
        if set(tool.arguments) != set(verb.arguments):
            problems.append(f"MCP tool {tool.name} takes {sorted(tool.arguments)}; the verb takes {sorted(verb.arguments)}")
        if sorted(tool.required) != sorted(verb.required):
            problems.append(f"MCP tool {tool.name} requires {sorted(tool.required)}; the verb requires {sorted(verb.required)}")
    for verb in verbs.VERBS:
        if verb.tool not in {t.name for t in tools}:
            problems.append(f"verb {verb.words} has no MCP tool {verb.tool}")
    # The command line: every verb and action in the table or listed; every option used by a verb of the table or listed.
    for name, sub in parser.verb_parsers.items():  # type: ignore[attr-defined]
        action = next((a for a in _actions(sub) if a.dest == "action" and not a.option_strings), None)
        words = [f"{name} {choice}" for choice in action.choices] if action is not None and action.choices else [name]
        table = [v for v in verbs.VERBS if v.words in words]
        for word in words:
            if verbs.verb_named(word) is None and word not in one_sided and name not in one_sided:
                problems.append(f"CLI verb {word} is neither an MCP tool nor listed as command-line only")
        spellings = {s for v in table for s in v.arguments.values()}
        for option in _actions(sub):
            if not option.option_strings or option.option_strings[0] in COMMON:
                continue
            spelling = option.option_strings[-1]
            if spelling not in spellings and f"{name} {spelling}" not in one_sided and name not in one_sided:
                problems.append(f"CLI option {name} {spelling} is in no verb of runner.verbs.VERBS and not listed as command-line only")
        positionals = [a for a in _actions(sub) if not a.option_strings and a.dest != "action"]
        for verb in table:
            for arg, spelling in verb.arguments.items():
                if spelling.startswith("--"):
                    if not any(spelling in a.option_strings for a in _actions(sub)):
                        problems.append(f"CLI verb {verb.words} lacks {spelling} (MCP {verb.tool} takes {arg})")
                elif not positionals:
                    problems.append(f"CLI verb {verb.words} lacks the positional {spelling} (MCP {verb.tool} takes {arg})")
    for verb in verbs.VERBS:
        if verb.words.split(" ")[0] not in parser.verb_parsers:  # type: ignore[attr-defined]
            problems.append(f"verb {verb.words} is not on the command line")
    return problems


class SurfacesAgree(unittest.TestCase):
    """The command line and the MCP tools take the same verbs and arguments, and the check bites."""

    def test_the_surfaces_agree_with_the_table(self) -> None:
        self.assertEqual(surface_problems(build_parser(), TOOLS), [])

    def test_a_tool_gaining_an_argument_is_found(self) -> None:
        tools = list(TOOLS)
        index = next(i for i, t in enumerate(tools) if t.name == "effect_verify")
        tools[index] = tools[index]._replace(arguments=dict(tools[index].arguments, note={"type": "string"}))
        self.assertEqual(surface_problems(build_parser(), tools),
                         ["MCP tool effect_verify takes ['by', 'evidence', 'key', 'note', 'reconciled']; "
                          "the verb takes ['by', 'evidence', 'key', 'reconciled']"])

    def test_a_new_tool_and_a_lost_tool_are_found(self) -> None:
        tools = [t for t in TOOLS if t.name != "cost"] + [TOOLS[0]._replace(name="effect_forget")]
        problems = surface_problems(build_parser(), tools)
        self.assertIn("MCP tool effect_forget has no verb in runner.verbs.VERBS", problems)
        self.assertIn("verb cost has no MCP tool cost", problems)

    def test_a_command_line_option_or_action_the_tools_lack_is_found(self) -> None:
        parser = build_parser()
        parser.verb_parsers["effect"].add_argument("--note")  # type: ignore[attr-defined]
        problems = surface_problems(parser, TOOLS)
        self.assertEqual(problems, ["CLI option effect --note is in no verb of runner.verbs.VERBS and not listed as command-line only"])

        def extend(verb: Any) -> None:
            verb("forget", "a verb only the command line has", lambda args: 0)

        self.assertEqual(surface_problems(build_parser([extend]), TOOLS),
                         ["CLI verb forget is neither an MCP tool nor listed as command-line only"])

    def test_required_arguments_agree(self) -> None:
        tools = [t._replace(required=[]) if t.name == "cancel" else t for t in TOOLS]
        self.assertEqual(surface_problems(build_parser(), tools), ["MCP tool cancel requires []; the verb requires ['by', 'reason']"])


class CommandLineTakesWhatTheVerbTakes(unittest.TestCase):
    """An option the verb does not take, or a missing one it needs: one line, exit 2, nothing written."""

    def setUp(self) -> None:
        self.tmp = _util.scratch_dir()
        self.addCleanup(self.tmp.cleanup)
        self.cli = RunnerCli(self, root=self.tmp.name, run_dir=os.path.join(self.tmp.name, "run"))
        self.cli("init", "--contract", _util.TEMPLATE)
        self.writer = self.cli.writer("w1", self.cli.json("lease", "acquire", "--owner", "w1")["epoch"])

    def revision(self) -> int:
        return int(self.cli.json("status")["revision"])

    def test_refused_and_nothing_changes(self) -> None:
        before = self.revision()
        cases = [
            (["effect", "verify", "k1", "--receipt", "{}", "--evidence", "{}"], "runner: invalid-input: effect verify takes no --receipt"),
            (["effect", "uncertain", "k1"], "runner: invalid-input: effect uncertain needs --reason TEXT"),
            (["effect", "ack"], "runner: invalid-input: effect ack needs KEY"),
            (["lease", "show", "--ttl", "5"], "runner: invalid-input: lease show takes no --ttl"),
            (["step", "fail", "draft", "--class", "transient"], "runner: invalid-input: step fail needs --error TEXT"),
            (["events", "--limit", "3", "--html", "x"], None),
        ]
        for argv, line in cases:
            with self.subTest(argv=argv):
                cli = self.writer if argv[0] in ("effect", "step") else self.cli
                result = cli(*argv, code=2, reason="invalid-input")
                if line is not None:
                    self.assertEqual(result.err.strip(), line)
        self.assertEqual(self.revision(), before)

    def test_reconciled_and_limits_on_the_command_line(self) -> None:
        self.writer("step", "start", "draft")
        for key in ("k1", "k2", "k3"):
            path = os.path.join(self.tmp.name, f"{key}.json")
            with open(path, "w", encoding="utf-8") as handle:
                json.dump({"key": key}, handle)
            self.writer("effect", "begin", key, "--payload", path)
        self.writer.json("effect", "verify", "k1", "--evidence", "{}", "--reconciled")
        listed = self.cli.json("effect", "list", "--limit", "2")
        self.assertEqual((listed["count"], sorted(listed["effects"]), listed["more"]), (3, ["k1", "k2"], True))
        self.assertEqual(self.cli.json("report")["reconciled_effects"], 1)
        events = self.cli.json("events", "--after", "0", "--limit", "2")
        self.assertEqual((len(events["events"]), events["more"], events["last"]), (2, True, events["events"][-1]["seq"]))


def _session(url: str, **options: Any) -> Session:
    return Session(url, owner="agent-1", log=lambda line: None, **options)


def _call(session: Session, name: str, arguments: Dict[str, Any]) -> Dict[str, Any]:
    out = io.BytesIO()
    messages = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize",
         "params": {"protocolVersion": jsonrpc.PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}},
    ]
    session.state = "new"
    session.serve(io.BytesIO(b"".join(jsonrpc.encode(m) for m in messages)), out)
    reply = json.loads(out.getvalue().splitlines()[-1])
    return dict(reply["result"]["structuredContent"], _text=reply["result"]["content"][0]["text"])


class EachSurfaceNamesItsOwnVerbs(unittest.TestCase):
    """The library's prose names command-line verbs; the MCP server names its tools instead."""

    def setUp(self) -> None:
        self.tmp = _util.scratch_dir()
        self.addCleanup(self.tmp.cleanup)
        self.path = os.path.join(self.tmp.name, "run")
        plan = copy.deepcopy(load_contract(_util.TEMPLATE))
        RunStore.create(self.path, plan["task_id"], plan)
        run = Run.open(self.path)
        run.acquire("agent-1", 600)
        run.step_start("draft")
        run.effect_begin("post-1", {"slug": "a"})  # started and never acknowledged: the outcome is unknown

    def test_the_same_decision_in_each_surface_s_words(self) -> None:
        cli = _util.in_process_cli(["--dir", self.path, "--json", "next", "--owner", "agent-1", "--epoch", "1"])
        told = json.loads(cli.out)
        self.assertEqual((told["decision"], told["action"]["kind"]), ("act", "reconcile"))
        self.assertIn("record what you see with `effect verify` or `effect absent`", told["detail"])
        session = _session("file:" + self.path, epoch=1)
        tool = _call(session, "next", {})
        self.assertEqual((tool["decision"], tool["action"]["kind"], tool["exit_code"]), ("act", "reconcile", told["exit_code"]))
        self.assertIn("record what you see with `effect_verify` or `effect_absent`", tool["detail"])
        self.assertIn("record what you see with `effect_verify` or `effect_absent`", tool["action"]["why"])
        for text in (tool["detail"], tool["action"]["why"], tool["_text"]):
            self.assertNotIn("effect verify", text)
            self.assertNotIn("effect absent", text)

    def test_a_refusal_names_the_tool(self) -> None:
        other = _util.write_contract(os.path.join(self.tmp.name, "other.md"), _util.contract_block(Run.open(self.path).state["task_id"]))
        cli = _util.in_process_cli(["--dir", self.path, "migrate", "--contract", other, "--reason", "a new plan",
                                    "--owner", "agent-1", "--epoch", "1"])
        self.assertEqual(cli.code, 2, cli.err)
        self.assertIn("finish it (`step done draft`) or fail it (`step fail draft`) first", cli.err)
        refused = _call(_session("file:" + self.path, epoch=1), "migrate", {"contract": other, "reason": "a new plan"})
        self.assertEqual((refused["ok"], refused["reason"], refused["exit_code"]), (False, "invalid-input", 2))
        self.assertIn("finish it (`step_done` (step `draft`)) or fail it (`step_fail` (step `draft`)) first", refused["message"])

    def test_quoted_text_and_single_names_are_left_alone(self) -> None:
        prose = {"detail": 'step `report`: `effect skip k --reason TEXT`; <quote from="a worker">`effect ack k`</quote>',
                 "reason": "`effect ack k`"}
        self.assertEqual(in_tool_words(prose), {
            "detail": 'step `report`: `effect_skip` (key `k`, reason TEXT); <quote from="a worker">`effect ack k`</quote>',
            "reason": "`effect ack k`"})

    def test_one_write_through_either_surface_records_the_same(self) -> None:
        session = _session("file:" + self.path, epoch=1)
        by_tool = _call(session, "effect_verify", {"key": "post-1", "evidence": {"seen": True}, "reconciled": True})
        self.assertTrue(by_tool["ok"], by_tool)
        Run.open(self.path).refresh()
        run = Run.open(self.path, "agent-1", 1)
        run.effect_begin("post-2", {"slug": "b"})
        cli = _util.in_process_cli(["--dir", self.path, "--json", "effect", "verify", "post-2", "--evidence", '{"seen": true}',
                                    "--reconciled", "--owner", "agent-1", "--epoch", "1"])
        self.assertEqual(cli.code, 0, cli.err)
        effects = Run.open(self.path).state["effects"]
        shape = lambda e: {k: v for k, v in e.items() if k not in ("at", "updated_at", "started_at", "verified_at", "payload", "payload_digest", "history")}  # noqa: E731
        self.assertEqual(shape(effects["post-1"]), shape(effects["post-2"]))
        self.assertEqual(Run.open(self.path).state["counters"]["reconciled_effects"], 2)


if __name__ == "__main__":
    unittest.main()
