"""What each answer of a target means, pinned as tables: one row per thing an adapter can do, for each mapping.

Two mappings turn what an adapter did into what the lifecycle decides from:
the runner's (``runner.calls.answers``: ``call_target`` for a call,
``look_at_target`` for a lookup, ``look_at_many`` for a lookup of several
keys), which the executor uses, and the engines' (``runner.engines.once``:
``_call``, the runner's with an engine's differences, and ``observe_once``).
They differ on purpose in places (an engine lets a failure it cannot classify
escape, so that its own retry observes first; it keeps the receipt unchecked;
it names a refusal in the detail), and each difference is a row here. A change
to either mapping, made on purpose or not, fails the table that holds it.
"""

import unittest
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from runner.engines import once
from runner.calls import answers
from runner.base.errors import InvalidInput, NeedsReconciliation, RunnerError
from runner.execution.lifecycle import Answer, Seen
from runner.calls.target import NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome

KEY = "doc-1:ticket"
PAYLOAD = {"title": "one"}
#: What an engine's clock reads when its call ends: once stamps each answer with it.
ENDED_AT = 1_790_000_042.0
LONG = "x" * 600
#: A dict that is not a JSON document: it holds a value JSON cannot spell.
NOT_JSON = {"when": {1, 2}}


class Raised(NamedTuple):
    """An exception that escaped the mapping, by class and text."""

    kind: type
    text: str


def _raise(exc: BaseException) -> Callable[..., Any]:
    def call(*_args: Any) -> Any:
        raise exc

    return call


def _return(value: Any) -> Callable[..., Any]:
    return lambda *_args: value


class _Adapter:
    """An adapter whose three calls do what the row says, and which records what it was given."""

    name = "scripted"

    def __init__(self, invoke: Optional[Callable[..., Any]] = None, observe: Optional[Callable[..., Any]] = None,
                 many: Optional[Callable[..., Any]] = None) -> None:
        self._invoke, self._observe, self._many = invoke, observe, many
        self.given: List[Tuple[Any, ...]] = []

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Any:
        self.given.append((key, payload, epoch))
        assert self._invoke is not None
        return self._invoke(key, payload, epoch)

    def observe(self, key: str, payload: Dict[str, Any]) -> Any:
        self.given.append((key, payload))
        assert self._observe is not None
        return self._observe(key, payload)

    def observe_many(self, items: List[Tuple[str, Dict[str, Any], Any]]) -> Any:
        self.given.append(tuple(items))
        assert self._many is not None
        return self._many(items)


def _outcome(call: Callable[[], Any]) -> Any:
    """What the mapping returned, or the :class:`Raised` it let escape (a BaseException too)."""
    try:
        return call()
    except BaseException as exc:  # a row may let an interrupt through, and that is what it pins
        return Raised(type(exc), str(exc))


def _executor_invoke(does: Callable[..., Any]) -> Any:
    adapter = _Adapter(invoke=does)
    got = _outcome(lambda: answers.call_target(adapter, KEY, PAYLOAD, 7))
    assert adapter.given == [(KEY, PAYLOAD, 7)], adapter.given
    return got


def _once_call(does: Callable[..., Any]) -> Any:
    adapter = _Adapter(invoke=does)
    got = _outcome(lambda: once._call(adapter, KEY, PAYLOAD, 7, lambda: ENDED_AT))
    assert adapter.given == [(KEY, PAYLOAD, 7)], adapter.given
    return got


#: Each row: what the adapter's invoke does -> (what the executor's mapping gives, what the engines' gives).
CALLS: List[Tuple[str, Callable[..., Any], Any, Any]] = [
    ("returns a receipt", _return({"ticket": 12}),
     Answer("receipt", receipt={"ticket": 12}),
     Answer("receipt", receipt={"ticket": 12}, ended_at=ENDED_AT)),
    ("returns an empty receipt", _return({}),
     Answer("receipt", receipt={}),
     Answer("receipt", receipt={}, ended_at=ENDED_AT)),
    ("returns a list, not a receipt", _return([1, 2]),
     Answer("unknown", "the call returned, but its receipt is unusable: receipt must be a JSON object"),
     Answer("receipt", receipt=[1, 2], ended_at=ENDED_AT)),
    ("returns None", _return(None),
     Answer("unknown", "the call returned, but its receipt is unusable: receipt must be a JSON object"),
     Answer("receipt", receipt=None, ended_at=ENDED_AT)),
    ("returns a receipt JSON cannot spell", _return(NOT_JSON),
     Answer("unknown", "the call returned, but its receipt is unusable: receipt is not valid JSON: "
                       "Object of type set is not JSON serializable"),
     Answer("receipt", receipt=NOT_JSON, ended_at=ENDED_AT)),
    ("raises NotApplied with a delay", _raise(NotApplied("429: slow down", 3.5)),
     Answer("not-applied", "429: slow down", retry_after=3.5),
     Answer("not-applied", "429: slow down", retry_after=3.5, ended_at=ENDED_AT)),
    ("raises NotApplied without one", _raise(NotApplied("refused")),
     Answer("not-applied", "refused"),
     Answer("not-applied", "refused", ended_at=ENDED_AT)),
    ("raises Rejected", _raise(Rejected("key held with another payload")),
     Answer("rejected", "key held with another payload"),
     Answer("rejected", "Rejected: key held with another payload", ended_at=ENDED_AT)),
    ("raises StaleEpoch", _raise(StaleEpoch("epoch 7 < 9")),
     Answer("stale-epoch", "epoch 7 < 9"),
     Answer("rejected", "StaleEpoch: epoch 7 < 9", ended_at=ENDED_AT)),
    ("raises UnknownOutcome", _raise(UnknownOutcome("timed out after 60 s")),
     Answer("unknown", "timed out after 60 s"),
     Answer("unknown", "timed out after 60 s", ended_at=ENDED_AT)),
    ("raises a long UnknownOutcome", _raise(UnknownOutcome(LONG)),
     Answer("unknown", LONG),
     Answer("unknown", LONG, ended_at=ENDED_AT)),
    ("raises a RunnerError", _raise(InvalidInput("no program 'filer'")),
     Answer("unknown", "invalid-input: no program 'filer'"),
     Raised(InvalidInput, "no program 'filer'")),
    ("raises another RunnerError", _raise(NeedsReconciliation("look first")),
     Answer("unknown", "needs-reconciliation: look first"),
     Raised(NeedsReconciliation, "look first")),
    ("raises another exception", _raise(ValueError("bad byte")),
     Answer("unknown", "ValueError: bad byte"),
     Raised(ValueError, "bad byte")),
    ("raises a long exception", _raise(OSError(LONG)),
     Answer("unknown", "OSError: " + LONG),
     Raised(OSError, LONG)),
    ("is interrupted", _raise(KeyboardInterrupt("stop")),
     Raised(KeyboardInterrupt, "stop"),
     Raised(KeyboardInterrupt, "stop")),
]


def _executor_observe(does: Callable[..., Any]) -> Any:
    adapter = _Adapter(observe=does)
    got = _outcome(lambda: answers.look_at_target(adapter, KEY, PAYLOAD))
    assert adapter.given == [(KEY, PAYLOAD)], adapter.given
    return got


def _once_observe(does: Callable[..., Any]) -> Any:
    adapter = _Adapter(observe=does)
    got = _outcome(lambda: once.observe_once(adapter, KEY, PAYLOAD))
    assert adapter.given == [(KEY, PAYLOAD)], adapter.given
    return got


_NOT_AN_OBSERVATION = "TypeError: observe returned {!r:.100}, not an Observation"

#: Each row: what the adapter's observe does -> (what the executor's lookup gives, what the engines' gives).
LOOKUPS: List[Tuple[str, Callable[..., Any], Any, Any]] = [
    ("finds the key", _return(Observation("present", {"ticket": 12})),
     Seen("present", {"ticket": 12}, 0.0),
     Observation("present", {"ticket": 12})),
    ("finds no key", _return(Observation("absent", {"searched": "all"})),
     Seen("absent", {"searched": "all"}, 0.0),
     Observation("absent", {"searched": "all"})),
    ("cannot tell", _return(Observation("unknown", {"why": "index rebuilding"})),
     Seen("unknown", {"why": "index rebuilding"}, 0.0),
     Observation("unknown", {"why": "index rebuilding"})),
    ("says unseen, a word of lookups of many keys", _return(Observation("unseen", {})),
     Seen("unknown", {"error": _NOT_AN_OBSERVATION.format(Observation("unseen", {}))}, 0.0),
     Observation("unseen", {})),
    ("says a word of its own", _return(Observation("maybe", {})),
     Seen("unknown", {"error": _NOT_AN_OBSERVATION.format(Observation("maybe", {}))}, 0.0),
     Observation("maybe", {})),
    ("returns a dict, not an Observation", _return({"status": "absent"}),
     Seen("unknown", {"error": _NOT_AN_OBSERVATION.format({"status": "absent"})}, 0.0),
     {"status": "absent"}),
    ("returns None", _return(None),
     Seen("unknown", {"error": "TypeError: observe returned None, not an Observation"}, 0.0),
     None),
    ("returns evidence that is not an object", _return(Observation("absent", ["none"])),
     Seen("unknown", {"error": "InvalidInput: evidence must be a JSON object"}, 0.0),
     Observation("absent", ["none"])),
    ("returns evidence JSON cannot spell", _return(Observation("present", NOT_JSON)),
     Seen("unknown", {"error": "InvalidInput: evidence is not valid JSON: "
                               "Object of type set is not JSON serializable"}, 0.0),
     Observation("present", NOT_JSON)),
    ("raises NotApplied with a delay", _raise(NotApplied("503: busy", 2.0)),
     Seen("later", {"not_now": "503: busy", "retry_after": 2.0}, 0.0),
     Observation("unknown", {"error": "NotApplied: 503: busy"})),
    ("raises a long NotApplied", _raise(NotApplied(LONG)),
     Seen("later", {"not_now": LONG[:500], "retry_after": None}, 0.0),
     Observation("unknown", {"error": "NotApplied: " + LONG})),
    ("raises Rejected", _raise(Rejected("403: lookups refused")),
     Seen("unknown", {"error": "Rejected: 403: lookups refused"}, 0.0),
     Observation("unknown", {"error": "Rejected: 403: lookups refused"})),
    ("raises StaleEpoch", _raise(StaleEpoch("old epoch")),
     Seen("unknown", {"error": "StaleEpoch: old epoch"}, 0.0),
     Observation("unknown", {"error": "StaleEpoch: old epoch"})),
    ("raises UnknownOutcome", _raise(UnknownOutcome("reset")),
     Seen("unknown", {"error": "UnknownOutcome: reset"}, 0.0),
     Observation("unknown", {"error": "UnknownOutcome: reset"})),
    ("raises a RunnerError", _raise(InvalidInput("no program 'lookup'")),
     Seen("unknown", {"error": "InvalidInput: no program 'lookup'"}, 0.0),
     Observation("unknown", {"error": "InvalidInput: no program 'lookup'"})),
    ("raises a long exception", _raise(OSError(LONG)),
     Seen("unknown", {"error": ("OSError: " + LONG)[:500]}, 0.0),
     Observation("unknown", {"error": "OSError: " + LONG})),
    ("is interrupted", _raise(KeyboardInterrupt("stop")),
     Raised(KeyboardInterrupt, "stop"),
     Raised(KeyboardInterrupt, "stop")),
]

ITEMS = [("a:ticket", {"n": 1}, None), ("b:ticket", {"n": 2}, None)]


def _executor_many(does: Callable[..., Any]) -> Any:
    adapter = _Adapter(many=does)
    got = _outcome(lambda: answers.look_at_many(adapter, ITEMS))
    assert adapter.given == [tuple(ITEMS)], adapter.given
    return got


def _each(seen: Seen) -> List[Seen]:
    return [seen] * len(ITEMS)


_NOT_MANY = "TypeError: observe_many returned {!r:.100}, not an Observation"

#: Each row: what the adapter's observe_many does -> (what the executor's lookup of many keys gives: a Seen for each
#: key, and whether the target refused such lookups). The engines look keys up one at a time.
MANY: List[Tuple[str, Callable[..., Any], Any]] = [
    ("answers for each key", _return([Observation("present", {"t": 1}), Observation("absent", {"page": "whole"})]),
     ([Seen("present", {"t": 1}, 0.0), Seen("absent", {"page": "whole"}, 0.0)], False)),
    ("cannot tell one, could not have shown the other",
     _return([Observation("unknown", {}), Observation("unseen", {"page": 1})]),
     ([Seen("unknown", {}, 0.0), Seen("unseen", {"page": 1}, 0.0)], False)),
    ("answers for fewer keys", _return([Observation("present", {})]),
     (_each(Seen("unseen", {"error": "TypeError: observe_many returned 1 answers for 2 keys"}, 0.0)), False)),
    ("returns a dict", _return({"a:ticket": "present"}),
     (_each(Seen("unseen", {"error": "TypeError: observe_many returned dict answers for 2 keys"}, 0.0)), False)),
    ("says a word of its own", _return([Observation("later", {}), Observation("absent", {})]),
     (_each(Seen("unseen", {"error": _NOT_MANY.format(Observation("later", {}))}, 0.0)), False)),
    ("returns a dict for one key", _return([Observation("absent", {}), {"status": "absent"}]),
     (_each(Seen("unseen", {"error": _NOT_MANY.format({"status": "absent"})}, 0.0)), False)),
    ("returns evidence that is not an object", _return([Observation("absent", {}), Observation("absent", [])]),
     (_each(Seen("unseen", {"error": "InvalidInput: evidence must be a JSON object"}, 0.0)), False)),
    ("raises NotApplied", _raise(NotApplied("429", 4.0)),
     (_each(Seen("later", {"not_now": "429", "retry_after": 4.0}, 0.0)), False)),
    ("raises a long NotApplied", _raise(NotApplied(LONG)),
     (_each(Seen("later", {"not_now": LONG[:500], "retry_after": None}, 0.0)), False)),
    ("raises Rejected", _raise(Rejected("400: one key at a time")),
     (_each(Seen("unseen", {"refused": "400: one key at a time"}, 0.0)), True)),
    ("raises a long Rejected", _raise(Rejected(LONG)),
     (_each(Seen("unseen", {"refused": LONG[:500]}, 0.0)), True)),
    ("raises StaleEpoch", _raise(StaleEpoch("old")),
     (_each(Seen("unseen", {"error": "StaleEpoch: old"}, 0.0)), False)),
    ("raises UnknownOutcome", _raise(UnknownOutcome("reset")),
     (_each(Seen("unseen", {"error": "UnknownOutcome: reset"}, 0.0)), False)),
    ("raises a RunnerError", _raise(RunnerError("disk")),
     (_each(Seen("unseen", {"error": "RunnerError: disk"}, 0.0)), False)),
    ("raises a long exception", _raise(OSError(LONG)),
     (_each(Seen("unseen", {"error": ("OSError: " + LONG)[:500]}, 0.0)), False)),
    ("is interrupted", _raise(KeyboardInterrupt("stop")), Raised(KeyboardInterrupt, "stop")),
]


class AnswerMappingTest(unittest.TestCase):
    """A call: what the executor records and what an engine decides from, for each thing an adapter does."""

    maxDiff = None

    def test_the_executor_maps_each_answer_as_the_table_says(self) -> None:
        for does, adapter, expected, _ in CALLS:
            with self.subTest(adapter=does):
                self.assertEqual(_executor_invoke(adapter), expected)

    def test_an_engine_maps_each_answer_as_the_table_says(self) -> None:
        for does, adapter, _, expected in CALLS:
            with self.subTest(adapter=does):
                self.assertEqual(_once_call(adapter), expected)

    def test_the_two_mappings_differ_only_in_the_rows_that_say_so(self) -> None:
        # The same answer kind and detail, besides the engine's end stamp: everything else is a named difference.
        same = []
        for does, adapter, _, _ in CALLS:
            mine, theirs = _executor_invoke(adapter), _once_call(adapter)
            if isinstance(mine, Answer) and isinstance(theirs, Answer) and mine == theirs._replace(ended_at=0.0):
                same.append(does)
        self.assertEqual(same, ["returns a receipt", "returns an empty receipt", "raises NotApplied with a delay",
                                "raises NotApplied without one", "raises UnknownOutcome",
                                "raises a long UnknownOutcome"])


class LookupMappingTest(unittest.TestCase):
    """A lookup: what the executor's lookups and an engine's give, for each thing an adapter does."""

    maxDiff = None

    def test_the_executor_maps_each_lookup_as_the_table_says(self) -> None:
        for does, adapter, expected, _ in LOOKUPS:
            with self.subTest(adapter=does):
                self.assertEqual(_executor_observe(adapter), expected)

    def test_an_engine_maps_each_lookup_as_the_table_says(self) -> None:
        for does, adapter, _, expected in LOOKUPS:
            with self.subTest(adapter=does):
                got = _once_observe(adapter)
                self.assertEqual(got, expected)
                self.assertIs(type(got), type(expected))

    def test_the_executor_maps_each_lookup_of_many_keys_as_the_table_says(self) -> None:
        for does, adapter, expected in MANY:
            with self.subTest(adapter=does):
                self.assertEqual(_executor_many(adapter), expected)

    def test_the_executor_takes_an_absence_only_from_an_answer_that_says_absent(self) -> None:
        # The rule the tables serve: a failure, a refusal or nonsense is never an absence.
        one = [does for does, adapter, _, _ in LOOKUPS if _statuses(_executor_observe(adapter)) == ["absent"]]
        self.assertEqual(one, ["finds no key"])
        many = [does for does, adapter, _ in MANY if "absent" in _statuses(_executor_many(adapter))]
        self.assertEqual(many, ["answers for each key"])


def _statuses(got: Any) -> List[str]:
    """The status of each Seen a lookup gave (one, or a list with the refusal flag); none when it raised."""
    if isinstance(got, Seen):
        return [got.status]
    if isinstance(got, Raised):
        return []
    return [seen.status for seen in got[0]]

if __name__ == "__main__":
    unittest.main()
