"""The words of each lifecycle, held to the code and the schema that use them.

Each vocabulary is a ``Literal`` type (:mod:`runner.ledger.states`,
:mod:`runner.calls.answers`, :mod:`runner.calls.inflight`,
:mod:`runner.execution.lifecycle`): with mypy's strict equality a comparison with a
word outside it is an error, so a misspelt word cannot pass the type check.
What a type checker cannot see, these tests hold: that each type lists the
words the code makes and the schema allows, no fewer and no more.
"""

import ast
import inspect
import json
import os
import tempfile
import shutil
import unittest
from types import ModuleType
from typing import Any, Set, Tuple, get_args

from tests.support.util import REPO_ROOT

from runner.execution import executor, lifecycle
from runner.calls import answers, inflight
from runner.contract.http import INVOKE_WORDS, OBSERVE_WORDS
from runner.engines import once
from runner.ledger import approvals
from runner.ledger.states import APPROVAL_STATES, EFFECT_STATES, UNRESOLVED, ApprovalState, EffectState

SCHEMA = os.path.join(REPO_ROOT, "references", "state-envelope.schema.json")


def _tree(module: ModuleType) -> ast.Module:
    return ast.parse(inspect.getsource(module))


def _made(module: ModuleType, name: str) -> Set[str]:
    """The words ``module`` passes first to ``name(...)`` as a literal, e.g. every ``Move("...")`` kind."""
    return {node.args[0].value for node in ast.walk(_tree(module))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)}


def _tuple_named(module: ModuleType, name: str) -> Tuple[Any, ...]:
    value = getattr(module, name)
    assert isinstance(value, tuple), name
    return value


class EffectStateTest(unittest.TestCase):
    """An effect's states: the type, the ledger's tuple and the state envelope's schema say the same."""

    def test_the_type_the_tuple_and_the_schema_list_the_same_states_in_the_same_order(self) -> None:
        with open(SCHEMA, encoding="utf-8") as handle:
            schema = json.load(handle)
        listed = schema["properties"]["effects"]["additionalProperties"]["properties"]["state"]["enum"]
        self.assertEqual(get_args(EffectState), EFFECT_STATES)
        self.assertEqual(list(EFFECT_STATES), listed)

    def test_the_unresolved_states_are_states(self) -> None:
        self.assertEqual(UNRESOLVED, ("started", "acknowledged", "uncertain"))
        self.assertLess(set(UNRESOLVED), set(EFFECT_STATES))

    def test_no_module_of_the_runner_spells_the_unresolved_states_again(self) -> None:
        spelled = []
        for folder, _, names in os.walk(os.path.join(REPO_ROOT, "runner")):
            for name in sorted(n for n in names if n.endswith(".py")):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as handle:
                    tree = ast.parse(handle.read())
                spelled += [f"{os.path.relpath(path, REPO_ROOT)}:{node.lineno}" for node in ast.walk(tree)
                            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts
                            and all(isinstance(e, ast.Constant) for e in node.elts)
                            and {e.value for e in node.elts} == set(UNRESOLVED)]
        self.assertEqual([place.split(":")[0] for place in spelled], [os.path.join("runner", "ledger", "states.py")])


class ApprovalStateTest(unittest.TestCase):
    """A request's states: the type, the schema and the words the approvals' ops write say the same."""

    def test_the_type_the_schema_and_the_ops_list_the_same_states(self) -> None:
        with open(SCHEMA, encoding="utf-8") as handle:
            schema = json.load(handle)
        listed = schema["properties"]["observations"]["properties"]["approvals"]["additionalProperties"]
        self.assertEqual(get_args(ApprovalState), APPROVAL_STATES)
        self.assertEqual(list(APPROVAL_STATES), listed["properties"]["state"]["enum"])
        written = set()
        for node in ast.walk(_tree(approvals)):
            # ["set", [..., "state"], "WORD"] and {"state": "WORD"}
            if isinstance(node, ast.List) and len(node.elts) == 3 and isinstance(node.elts[1], ast.List) \
                    and node.elts[1].elts and isinstance(node.elts[1].elts[-1], ast.Constant) \
                    and node.elts[1].elts[-1].value == "state":
                value = node.elts[2]
                words = [value] if isinstance(value, ast.Constant) else [v for v in ast.walk(value)
                                                                          if isinstance(v, ast.Constant)]
                written |= {w.value for w in words if isinstance(w.value, str)}
            if isinstance(node, ast.Dict):
                written |= {v.value for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)
                            and k.value == "state" and isinstance(v, ast.Constant)}
        self.assertEqual(written, set(APPROVAL_STATES))


class MoveKindTest(unittest.TestCase):
    """The moves: every kind the lifecycle makes is a kind of the type, and the type holds no kind it never makes."""

    def test_the_type_lists_exactly_the_kinds_next_move_makes(self) -> None:
        self.assertEqual(set(get_args(lifecycle.MoveKind)), _made(lifecycle, "Move"))

    def test_the_executor_carries_out_each_kind_through_one_table_or_the_other(self) -> None:
        acts, records = set(executor._ACTS), set(executor._RECORDS)
        self.assertEqual(acts & records, set(), "a move is carried out at once or recorded, never both")
        self.assertEqual(acts | records, set(get_args(lifecycle.MoveKind)))
        self.assertEqual(records, {"invoke", "ack", "verify", "found", "absent", "defer", "uncertain", "fail"})


class AnswerKindTest(unittest.TestCase):
    """What a call may answer: the type, the words of an HTTP request's statuses, and the answers the mappings make."""

    def test_the_type_lists_the_words_an_http_request_maps_statuses_to(self) -> None:
        self.assertEqual(get_args(answers.AnswerKind), INVOKE_WORDS)

    def test_every_kind_is_made_by_the_mapping_and_none_other_elsewhere(self) -> None:
        kinds = set(get_args(answers.AnswerKind))
        self.assertEqual(_made(answers, "Answer"), kinds)
        self.assertLessEqual(_made(executor, "Answer") | _made(once, "Answer"), kinds)
        self.assertEqual(set(once._REFUSALS), {"rejected", "stale-epoch"})


class SeenStatusTest(unittest.TestCase):
    """What a lookup may find: a target's three words, ``later`` and ``unseen``; nothing else reaches the lifecycle."""

    def test_the_type_is_the_target_s_words_then_later_and_unseen(self) -> None:
        self.assertEqual(get_args(answers.SeenStatus), OBSERVE_WORDS + ("later", "unseen"))

    def test_the_lookups_give_exactly_the_words_of_the_type(self) -> None:
        given = (_made(answers, "Seen") | _made(executor, "Seen") | set(_tuple_named(answers, "ONE_STATUSES"))
                 | set(_tuple_named(answers, "MANY_STATUSES")))
        self.assertEqual(given, set(get_args(answers.SeenStatus)))
        self.assertEqual(answers.ONE_STATUSES, OBSERVE_WORDS)

    def test_the_lifecycle_decides_from_the_mapping_s_words(self) -> None:
        self.assertIs(lifecycle.Answer, answers.Answer)
        self.assertIs(lifecycle.Seen, answers.Seen)


class CallKindTest(unittest.TestCase):
    """The kinds of call the registry of calls in flight keeps: each reads back as itself; another word is no call."""

    def test_each_kind_reads_back_and_another_word_is_set_aside(self) -> None:
        folder = tempfile.mkdtemp(prefix="runner-words-")
        self.addCleanup(shutil.rmtree, folder, True)
        registry = inflight.Registry(os.path.join(folder, "calls"))
        for kind in get_args(inflight.CallKind):
            registry.register(f"k-{kind}", kind, 1, 60.0)
            [(_, view)] = registry.calls(f"k-{kind}")
            self.assertEqual(view.kind, kind)
        registry.register("k-other", "lookup", 1, 60.0)
        self.assertEqual(registry.calls("k-other"), [])
        self.assertEqual([aside.why for aside in registry.set_aside()], ["it names no kind of call"])


class ManyLookupStateTest(unittest.TestCase):
    """What an adapter's lookups of many keys came to: the type lists the words the executor keeps."""

    def test_the_type_lists_the_states_the_executor_keeps(self) -> None:
        kept = set()
        for node in ast.walk(_tree(executor)):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                target = node.targets[0]
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute) \
                        and target.value.attr == "_many_lookups":
                    kept.add(node.value.value)
        self.assertEqual(kept, set(get_args(lifecycle.ManyLookupState)))


if __name__ == "__main__":
    unittest.main()
