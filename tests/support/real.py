"""The gate of the real suite: tests against real clients and servers run only when asked for.

``python3 -m unittest`` is the offline conformance check: standard library
only, no network, nothing written outside the temp folder. The tests that
meet a real system (the Claude Code and Codex CLIs, the MCP SDK,
OpenTelemetry's protobuf package, Chromium, PostgreSQL, Temporal, DBOS) run
when ``RUNNER_REAL_TESTS`` asks for them:

* unset, empty or ``0``: they are skipped, the reason saying how to run them;
* ``1``: every real test but the engines' (Temporal and DBOS take minutes);
* ``all``: every real test, the engines' included.

Once asked for, a real test never skips: a part that cannot be had (a
package that will not install, a server that does not answer) fails the test
with the reason, so a run that asked for the real suite cannot pass without
it. Any other value fails every real test, saying which values there are.

A module gates a class or a test method with :func:`needs`, and says what is
missing, from anywhere inside it, with :func:`missing`::

    @_real.needs("the Claude Code CLI")
    class SessionTest(unittest.TestCase):
        @classmethod
        def setUpClass(cls) -> None:
            cls.claude = shutil.which("claude") or _real.missing("no claude on the PATH")

What the real tests download is kept under :func:`cache_root`.
"""

import functools
import os
import unittest
from typing import Any, Callable, NoReturn, Optional, TypeVar

#: The one variable that asks for the real suite.
ENV = "RUNNER_REAL_TESTS"
#: Its values: the real tests without the engines, and all of them.
REAL, ALL = "1", "all"

T = TypeVar("T")


class RealPartMissing(AssertionError):
    """A real test was asked for (``RUNNER_REAL_TESTS``) and what it needs cannot be had."""


def _value() -> str:
    return os.environ.get(ENV, "").strip()


def _bad_value() -> Optional[str]:
    value = _value()
    if value in ("", "0", REAL, ALL):
        return None
    return f"{ENV}={value!r} asks for nothing known: use {ENV}={REAL} (the real tests but the engines') or {ENV}={ALL} (all of them)"


def wanted(engines: bool = False) -> bool:
    """True when ``RUNNER_REAL_TESTS`` asks for the real tests (for the engines' with ``engines``)."""
    value = _value()
    return value == ALL if engines else value in (REAL, ALL)


def cache_root() -> str:
    """Where the real tests keep what they download: ``$RUNNER_TEST_CACHE``, else ``~/.cache/runner-tests``."""
    root = os.environ.get("RUNNER_TEST_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "runner-tests")
    os.makedirs(root, exist_ok=True)
    return root


def missing(reason: str) -> NoReturn:
    """Say that a real part cannot be had: a failure when the real tests were asked for, else a skip.

    :raises RealPartMissing: ``RUNNER_REAL_TESTS`` is set.
    :raises unittest.SkipTest: it is not.
    """
    if _value() not in ("", "0"):
        raise RealPartMissing(f"{reason} ({ENV}={_value()} asked for this real test; it fails rather than skips)")
    raise unittest.SkipTest(reason)


def _strict(function: Callable[..., T], what: str, why_not: Optional[Callable[[], Optional[str]]]) -> Callable[..., T]:
    """``function``, first checking ``why_not`` and turning any skip inside it into a failure."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> T:
        bad = _bad_value()
        if bad:
            raise RealPartMissing(bad)
        reason = why_not() if why_not is not None else None
        if reason:
            missing(f"{what}: {reason}")
        try:
            return function(*args, **kwargs)
        except unittest.SkipTest as skip:
            raise RealPartMissing(f"{what}: {skip} ({ENV}={_value()} asked for this real test; it fails rather than skips)") from None

    for mark in ("__unittest_skip__", "__unittest_skip_why__"):  # a skip decorator under the gate fails too, when called
        run.__dict__.pop(mark, None)
    return run


def needs(what: str, engines: bool = False, why_not: Optional[Callable[[], Optional[str]]] = None) -> Callable[[T], T]:
    """Gate a test class or method that meets a real system.

    Not asked for, it is skipped, the reason naming ``what`` and the value of
    ``RUNNER_REAL_TESTS`` that runs it. Asked for, ``why_not()`` (None when
    the part is there, else why not) is called before the class's first test
    (or before the method), never at import, and a reason fails the test, as
    does any skip raised inside it (``setUpClass``, ``setUp``, the tests).

    :param what: the real system, as a person would name it ("PostgreSQL").
    :param engines: the test runs the engines (minutes): only ``RUNNER_REAL_TESTS=all`` asks for it.
    """

    def gate(item: T) -> T:
        if _bad_value() is None and not wanted(engines):
            value = ALL if engines else REAL
            return unittest.skip(f"{what}: a real-system test; {ENV}={value} runs it")(item)  # type: ignore[no-any-return]
        if not isinstance(item, type):
            return _strict(item, what, why_not)  # type: ignore[return-value,arg-type]
        setup_class = item.setUpClass  # type: ignore[attr-defined]
        skipped = getattr(item, "__unittest_skip__", False) and getattr(item, "__unittest_skip_why__", "skipped")
        item.__unittest_skip__ = False  # type: ignore[attr-defined]

        @classmethod  # type: ignore[misc]
        @functools.wraps(setup_class)
        def checked_setup_class(cls: type) -> None:
            if skipped:
                missing(f"{what}: {skipped}")
            _strict(setup_class.__func__, what, why_not)(cls)

        item.setUpClass = checked_setup_class  # type: ignore[attr-defined]
        for name in dir(item):
            if name == "setUp" or name.startswith(unittest.TestLoader.testMethodPrefix):
                method = getattr(item, name)
                if callable(method):
                    setattr(item, name, _strict(method, what, None))
        return item

    return gate
