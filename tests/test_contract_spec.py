"""The contract's specs (runner/contract/spec.py): each default is the value the runner uses today when a contract
leaves the field out, every contract in templates/ reads, each field holds what the block says, and a run's contract
is read once per plan."""

import glob
import inspect
import json
import os
import unittest
from typing import Any, Dict

from runner.contract.http import INVOKE_DEFAULTS, OBSERVE_DEFAULTS
from runner.base.errors import InvalidInput, StateUnrecoverable
from runner.base.pointer import parse_pointer
from runner.contract import spec
from runner.contract.lookups import MANY_DEFAULT
from runner.adapters.commands import CommandAdapter
from runner.contract.text import load_contract, parse_contract_text
from runner.execution import flow, lifecycle
from runner.calls import commands
from runner.ledger import effects, lease, retry
from runner.ledger.envelope import new_envelope
from tests.support.util import contract_markdown

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: A contract that sets every field a spec holds (four steps, commands with a lookup of many keys, flow control).
FULL: Dict[str, Any] = {
    "contract": 1,
    "task_id": "every-field",
    "goal": "fill every field",
    "non_goals": ["nothing else"],
    "allowed_actions": ["file tickets"],
    "forbidden_actions": ["delete"],
    "completion_evidence": ["tickets"],
    "workspace": "work",
    "steps": [
        {
            "id": "file",
            "artifact": "tickets",
            "check": "each filed",
            "items": ["a.md", "b.md"],
            "key": "doc-{slug}:t",
            "payload": {"template": {"doc": "{item}", "sha": "{sha256}"}},
            "next": "index",
        },
        {"id": "more", "items": {"glob": "docs/*.md"}, "key": "more-{slug}", "payload": {"command": ["make", "{key}"]}},
        {"id": "listed", "items": {"file": "list.txt"}, "key": "l-{index:04d}"},
        {
            "id": "index",
            "checks": {"tests": ["python3", "-m", "unittest"]},
            "artifacts": ["index.md"],
            "timeout_seconds": 90,
            "approval": True,
            "evidence": ["url"],
        },
    ],
    "effects": {
        "key_pattern": "[a-z0-9:.-]+",
        "approval": ["doc-x*"],
        "adapter": "commands",
        "verification": "look",
        "max_attempts": 5,
        "several_approvals": True,
        "invoke": ["file", "{key}", "{payload_file}"],
        "observe": ["find", "{key}"],
        "timeout_seconds": 30,
        "settle_seconds": 2,
        "max_rate_limited": 4,
        "observe_first": True,
        "concurrency": 8,
        "rate": {"per_second": 5, "burst": 2},
        "concurrency_key": {"key": "{payload.doc}", "limit": 2},
        "observe_many": {
            "command": ["find-all", "{each}"],
            "list": "/found",
            "match": "/ref",
            "value": "{slug}",
            "max": 20,
        },
    },
    "limits": {
        "max_step_attempts": 4,
        "max_effect_attempts": 6,
        "max_elapsed_seconds": 3600,
        "max_cost": 2.5,
        "max_steps": 9,
        "no_progress_seconds": 600,
    },
    "retry": {"base_seconds": 2, "cap_seconds": 30, "deadline_seconds": 900},
    "lease": {"ttl_seconds": 120},
    "jobs": {"rerun_vanished": True},
}

#: The effects section of a contract over HTTP, with a lookup of many keys that pages.
HTTP: Dict[str, Any] = {
    "idempotency_header": "Idempotency-Key",
    "epoch_header": "X-Epoch",
    "deduplicates": True,
    "retention_seconds": 86400,
    "invoke": {
        "method": "PUT",
        "url": "https://desk.example:8443/tickets/{key}",
        "headers": {"X-Run": "{run_id}"},
        "statuses": {"409": "rejected"},
        "receipt_headers": ["Location", "ETag"],
    },
    "observe": {
        "url": "https://desk.example:8443/tickets/by-key/{key}",
        "pointer": "/ticket",
        "statuses": {"410": "absent"},
        "many": {
            "url": "https://desk.example:8443/tickets?{each:key={key}}",
            "list": "/items",
            "match": "/key",
            "value": "{key}",
            "max": 25,
            "page_size": 100,
            "next": "/next",
        },
    },
}


def _checked(block: Dict[str, Any]) -> Dict[str, Any]:
    """``block`` as the contract's checks give it back; fails the test when they find a problem."""
    checked, problems = parse_contract_text(contract_markdown(json.dumps(block, indent=2)))
    assert checked is not None and not problems, problems
    return checked


class DefaultsTest(unittest.TestCase):
    """A field left out reads as the value the runner's readers use today."""

    def test_a_plan_that_names_its_effects_alone_reads_with_no_task_goal_or_steps(self) -> None:
        # A harness may begin a run with a plan of its own (the simulation does): what it leaves out reads as empty.
        made = spec.read_contract({"effects": {"timeout_seconds": 5, "rate": {"per_second": 2}}})
        self.assertEqual((made.task_id, made.goal, made.steps), ("", "", ()))
        self.assertEqual((made.effects.timeout_seconds, made.effects.rate), (5.0, spec.Rate(2.0)))
        self.assertEqual(made.lease, spec.LeaseSpec())

    def test_each_default_is_the_one_the_runner_uses(self) -> None:
        made = spec.read_contract(_checked({"contract": 1, "task_id": "t", "goal": "g", "steps": [{"id": "s"}]}))
        effects_spec, step = made.effects, made.steps[0]
        self.assertEqual(effects_spec.max_attempts, effects.DEFAULT_MAX_ATTEMPTS)
        self.assertEqual(effects_spec.max_rate_limited, effects.DEFAULT_MAX_RATE_LIMITED)
        # One default for a call's time, wherever a call is made without the contract's.
        for today in (lifecycle.Caps().timeout, CommandAdapter(["i"], ["o"]).timeout,
                      inspect.signature(commands.run_command).parameters["timeout"].default):
            self.assertEqual(effects_spec.timeout_seconds, today)
        self.assertEqual(spec.DEFAULT_CALL_TIMEOUT, effects_spec.timeout_seconds)
        self.assertEqual(effects_spec.settle_seconds, lifecycle.Caps().settle)
        self.assertEqual(effects_spec.observe_first, lifecycle.Caps().observe_first, "no item is looked up first")
        state = new_envelope("t", {"contract": 1, "task_id": "t", "goal": "g", "steps": [{"id": "s"}]}, "0" * 64,
                             "2026-01-01T00:00:00.000Z")
        self.assertEqual(effects_spec.concurrency, flow.flow_for(state, None, 0.0).limit)
        self.assertEqual(
            (effects_spec.key_pattern, effects_spec.approval, effects_spec.several_approvals), (None, (), False)
        )
        self.assertIsNone(effects_spec.invoke or effects_spec.observe or effects_spec.http or effects_spec.observe_many)
        self.assertEqual(
            (made.retry.base_seconds, made.retry.cap_seconds), (retry.DEFAULT_BASE_SECONDS, retry.DEFAULT_CAP_SECONDS)
        )
        self.assertEqual(made.lease.ttl_seconds, lease.DEFAULT_TTL_SECONDS)
        self.assertFalse(made.jobs.rerun_vanished)
        self.assertEqual(made.limits, spec.Limits())
        self.assertEqual(made.workspace, ".")
        self.assertEqual(step.timeout_seconds, 600.0, "a step's checks may run as long as a test suite")
        self.assertEqual((step.items, step.payload, step.checks, step.artifacts), (None, None, (), ()))
        self.assertEqual(spec.ManyCommand(("c", "{each}"), "/m", "{slug}").max, MANY_DEFAULT)
        self.assertEqual(spec.ManyCommand(("c", "{each}"), "/m", "{slug}").list, "")

    def test_an_http_request_starts_from_the_statuses_of_its_kind(self) -> None:
        section = {"invoke": {"url": "https://x.example/t/{key}"}, "observe": {"url": "https://x.example/t/{key}"}}
        made = spec.read_contract(
            _checked({"contract": 1, "task_id": "t", "goal": "g", "steps": [{"id": "s"}], "effects": {"http": section}})
        )
        http = made.effects.http
        assert http is not None
        self.assertEqual(dict(http.invoke.statuses), INVOKE_DEFAULTS)
        self.assertEqual(dict(http.observe.statuses), OBSERVE_DEFAULTS)
        self.assertEqual((http.invoke.method, http.observe.method), ("POST", "GET"))
        self.assertEqual(http.invoke.receipt_headers, ("Location",))
        self.assertEqual((http.deduplicates, http.retention_seconds, http.idempotency_header), (False, None, None))
        self.assertTrue(made.effects.performs_effects)


class TemplatesTest(unittest.TestCase):
    def test_every_contract_in_templates_reads(self) -> None:
        read = 0
        for path in sorted(glob.glob(os.path.join(ROOT, "templates", "*.md"))):
            with open(path, encoding="utf-8") as handle:
                block, _ = parse_contract_text(handle.read())
            if block is None:
                continue  # not a contract, or the blank form with its fields still to fill
            with self.subTest(template=os.path.basename(path)):
                made = spec.read_contract(load_contract(path))
                self.assertEqual(made.task_id, block["task_id"])
                self.assertEqual([s.id for s in made.steps], [s["id"] for s in block["steps"]])
                effects_block = block.get("effects", {})
                self.assertEqual(made.effects.performs_effects, "invoke" in effects_block or "http" in effects_block)
                # A step observes itself when it lists items, runs checks or hashes artifacts, and asks for
                # neither claimed evidence nor approval.
                self.assertEqual([s.observes_itself for s in made.steps],
                                 [("items" in s or bool(s.get("checks")) or bool(s.get("artifacts")))
                                  and not s.get("evidence") and not s.get("approval") for s in block["steps"]])
                self.assertEqual([s.is_batch for s in made.steps], ["items" in s for s in block["steps"]])
                read += 1
        self.assertGreaterEqual(read, 3)


class FieldsTest(unittest.TestCase):
    """Each field of a spec holds what the block says, in the spec's own types."""

    maxDiff = None

    def test_a_contract_that_sets_every_field(self) -> None:
        made = spec.read_contract(_checked(FULL))
        self.assertEqual(
            (made.version, made.task_id, made.goal, made.workspace), (1, "every-field", "fill every field", "work")
        )
        self.assertEqual(
            (made.non_goals, made.allowed_actions, made.forbidden_actions, made.completion_evidence),
            (("nothing else",), ("file tickets",), ("delete",), ("tickets",)),
        )
        first, more, listed, index = made.steps
        self.assertEqual(
            first,
            spec.StepSpec(
                id="file",
                artifact="tickets",
                check="each filed",
                next="index",
                items=spec.ItemsSpec(inline=("a.md", "b.md")),
                key="doc-{slug}:t",
                payload=spec.PayloadSpec(template={"doc": "{item}", "sha": "{sha256}"}),
            ),
        )
        self.assertEqual(
            (more.items, more.payload), (spec.ItemsSpec(glob="docs/*.md"), spec.PayloadSpec(command=("make", "{key}")))
        )
        self.assertEqual(
            (listed.items, listed.key, listed.payload), (spec.ItemsSpec(file="list.txt"), "l-{index:04d}", None)
        )
        self.assertEqual(
            index,
            spec.StepSpec(
                id="index",
                checks=(("tests", ("python3", "-m", "unittest")),),
                artifacts=("index.md",),
                timeout_seconds=90.0,
                approval=True,
                evidence=("url",),
            ),
        )
        self.assertEqual(made.step("more"), more)
        self.assertIsNone(made.step("nope"))
        self.assertEqual(
            made.effects,
            spec.EffectsSpec(
                key_pattern="[a-z0-9:.-]+",
                approval=("doc-x*",),
                adapter="commands",
                verification="look",
                max_attempts=5,
                several_approvals=True,
                invoke=("file", "{key}", "{payload_file}"),
                observe=("find", "{key}"),
                timeout_seconds=30.0,
                settle_seconds=2.0,
                max_rate_limited=4,
                concurrency=8,
                rate=spec.Rate(5.0, 2.0),
                concurrency_key=spec.ConcurrencyKey("{payload.doc}", 2),
                observe_many=spec.ManyCommand(("find-all", "{each}"), "/ref", "{slug}", list="/found", max=20),
                observe_first=True,
            ),
        )
        self.assertEqual(made.limits, spec.Limits(4, 6, 3600, 2.5, 9, 600, cost_limits=(("money", 2.5),)))
        self.assertEqual(made.retry, spec.RetryPolicy(2.0, 30.0, 900))
        self.assertEqual((made.lease, made.jobs), (spec.LeaseSpec(120.0), spec.JobsSpec(True)))
        self.assertEqual(made.workspace_root(base="/project"), os.path.abspath("/project/work"))
        self.assertEqual(made.workspace_root(cwd="/elsewhere"), os.path.abspath("/elsewhere/work"))

    def test_the_http_section(self) -> None:
        block = dict(FULL, effects={"http": HTTP})
        made = spec.read_contract(_checked(block)).effects.http
        assert made is not None
        self.assertEqual(
            made.invoke,
            spec.HttpRequest(
                kind="invoke",
                method="PUT",
                url=HTTP["invoke"]["url"],
                scheme="https",
                host="desk.example",
                port=8443,
                rest="/tickets/{key}",
                headers=(("X-Run", "{run_id}"),),
                statuses=tuple({**INVOKE_DEFAULTS, "409": "rejected"}.items()),
                receipt_headers=("Location", "ETag"),
            ),
        )
        many = made.observe.many
        assert many is not None
        self.assertEqual(
            many,
            spec.HttpMany(
                request=spec.HttpRequest(
                    kind="observe",
                    method="GET",
                    url="https://desk.example:8443/tickets?{each}",
                    scheme="https",
                    host="desk.example",
                    port=8443,
                    rest="/tickets?{each}",
                    statuses=tuple(OBSERVE_DEFAULTS.items()),
                ),
                each="key={key}",
                list=parse_pointer("/items"),
                match=parse_pointer("/key"),
                value="{key}",
                most=25,
                page_size=100,
                next=parse_pointer("/next"),
            ),
        )
        self.assertEqual(
            (made.observe.pointer, dict(made.observe.statuses)),
            (parse_pointer("/ticket"), {**OBSERVE_DEFAULTS, "410": "absent"}),
        )
        self.assertEqual(
            (made.idempotency_header, made.epoch_header, made.deduplicates, made.retention_seconds, made.ca_file),
            ("Idempotency-Key", "X-Epoch", True, 86400, None),
        )

    def test_key_rules_match_the_whole_key_and_the_approval_globs(self) -> None:
        made = spec.read_contract(_checked(FULL)).effects  # key_pattern [a-z0-9:.-]+, approval doc-x*
        for key, allowed, gated in (("doc-xa:t", True, True), ("doc-b:t", True, False), ("Doc-B", False, False),
                                    ("x" * 300, False, False), ("more-a", True, False)):
            with self.subTest(key=key):
                self.assertEqual((made.key_allowed(key), made.needs_approval(key)), (allowed, gated))
        unsafe = spec.EffectsSpec(key_pattern="(a+)+")
        with self.assertRaises(InvalidInput) as raised:
            unsafe.key_allowed("aaa")
        self.assertRegex(raised.exception.message,
                         "^the run's contract has an unsafe .+; migrate to a contract that passes `contract check FILE`$")

    def test_the_timeout_of_a_call_is_the_adapter_s_else_the_contract_s(self) -> None:
        class Adapter:
            timeout = None

        made = spec.EffectsSpec(timeout_seconds=30.0)
        self.assertEqual(made.timeout_for(Adapter()), 30.0)
        Adapter.timeout = 5  # type: ignore[assignment]
        self.assertEqual(made.timeout_for(Adapter()), 5.0)
        self.assertEqual(spec.EffectsSpec().timeout_for(object()), spec.DEFAULT_CALL_TIMEOUT)

    def test_a_spec_is_frozen(self) -> None:
        made = spec.read_contract(_checked(FULL))
        with self.assertRaises(AttributeError):
            made.task_id = "other"  # type: ignore[misc]
        with self.assertRaises(AttributeError):
            made.effects.concurrency = 2  # type: ignore[misc]


class ContractOfTest(unittest.TestCase):
    def test_a_run_s_contract_is_read_once_per_plan(self) -> None:
        state = new_envelope("every-field", _checked(FULL), "", "2026-01-01T00:00:00.000Z")
        first = spec.contract_of(state)
        self.assertEqual(first, spec.read_contract(state["plan"]))
        self.assertIs(spec.contract_of(dict(state)), first)
        other = new_envelope(
            "t", _checked({"contract": 1, "task_id": "t", "goal": "g", "steps": [{"id": "s"}]}), "", "x"
        )
        self.assertEqual(spec.contract_of(other).task_id, "t")
        for n in range(40):  # many plans: the cache stays bounded
            plan = _checked({"contract": 1, "task_id": f"t{n}", "goal": "g", "steps": [{"id": "s"}]})
            spec.contract_of(new_envelope(f"t{n}", plan, "", "x"))
        self.assertLessEqual(len(spec._READ), 16)

    def test_a_plan_this_runner_cannot_read_stops_as_unreadable_state(self) -> None:
        plan = {"contract": 1, "task_id": "t", "goal": "g", "steps": [{"id": "s"}], "retry": {"base_seconds": "soon"}}
        with self.assertRaises(StateUnrecoverable) as raised:
            spec.contract_of(new_envelope("t", plan, "", "x"))
        self.assertIn("the run's plan cannot be read by this runner (ValueError: ", raised.exception.message)
        self.assertIn("`migrate --contract FILE`", raised.exception.message)


if __name__ == "__main__":
    unittest.main()
