"""Effect key patterns: a bounded subset of regular expressions, matched in linear time.

A contract's ``effects.key_pattern`` names which keys an agent may use. A
backtracking matcher (Python's ``re``) can take exponential time on patterns
such as ``(a+)+b``, and ``effect begin`` matches while it holds the run's
lock, so one bad pattern would stall every verb of the run. Patterns are
therefore parsed here into a small automaton and matched by simulating all
of its states at once: the time is at most the key's length times the
automaton's size, and both are bounded.

The subset, always matched against the whole key (as ``re.fullmatch``):
literal characters; ``.``; escapes ``\\d \\w \\s \\D \\W \\S`` and an escaped
punctuation character; character classes ``[...]``; groups ``(...)`` and
``(?:...)``; alternation ``|``; the quantifiers ``? * + {m} {m,} {m,n}``
(``m, n <= 100``; a trailing ``?`` for laziness is accepted and changes
nothing for a whole-key match). Refused: anchors, backreferences,
lookarounds, flags, named groups, and a quantifier applied to a group that
already holds one (``(a+)+``): such a pattern is almost always a mistake,
and refusing it keeps the automaton small.
"""

import functools
import re
from typing import List, Optional, Tuple

from .errors import InvalidInput

__all__ = ["MAX_PATTERN_CHARS", "compile_pattern", "KeyPattern"]

#: Longest pattern accepted, and the most states its automaton may have.
MAX_PATTERN_CHARS = 500
MAX_STATES = 2000
MAX_REPEAT = 100

_ESCAPES = {"d", "w", "s", "D", "W", "S"}


class _Node:
    """One node of the parsed pattern: ``kind`` is atom, seq, alt or repeat."""

    __slots__ = ("kind", "atom", "items", "low", "high", "quantified")

    def __init__(self, kind: str, atom: "Optional[re.Pattern[str]]" = None, items: Optional[List["_Node"]] = None,
                 low: int = 0, high: Optional[int] = None) -> None:
        self.kind = kind
        self.atom = atom
        self.items = items or []
        self.low = low
        self.high = high
        # Whether a quantifier occurs anywhere in this node, so a quantifier on top can be refused.
        self.quantified: bool = kind == "repeat" or any(item.quantified for item in self.items)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, message: str) -> InvalidInput:
        return InvalidInput(f"key_pattern {self.text[:60]!r}: {message} (at character {self.pos + 1})")

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def parse(self) -> _Node:
        node = self.alternation()
        if self.pos < len(self.text):
            raise self.fail("unbalanced ')'")
        return node

    def alternation(self) -> _Node:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else _Node("alt", items=branches)

    def sequence(self) -> _Node:
        items: List[_Node] = []
        while self.peek() not in ("", "|", ")"):
            items.append(self.quantifier(self.atom()))
        return _Node("seq", items=items)

    def atom(self) -> _Node:
        char = self.peek()
        if char == "(":
            self.pos += 1
            if self.text.startswith("?:", self.pos):
                self.pos += 2
            elif self.peek() == "?":
                raise self.fail("only plain groups and (?:...) are supported (no lookarounds, flags or named groups)")
            inner = self.alternation()
            if self.peek() != ")":
                raise self.fail("missing ')'")
            self.pos += 1
            return _Node("seq", items=[inner])
        if char == "[":
            return self.char_class()
        if char == "\\":
            escaped = self.text[self.pos + 1 : self.pos + 2]
            if escaped in _ESCAPES or (escaped and not escaped.isalnum()):
                self.pos += 2
                return _Node("atom", atom=re.compile("\\" + escaped))
            raise self.fail(f"the escape \\{escaped} is not supported (backreferences and anchors are refused)")
        if char in ("^", "$"):
            raise self.fail("anchors are not needed: the pattern always matches the whole key")
        if char in ("*", "+", "?", "{"):
            raise self.fail("nothing to repeat")
        if char in ("]", "}"):
            raise self.fail(f"unescaped {char!r}")
        self.pos += 1
        return _Node("atom", atom=re.compile("." if char == "." else re.escape(char)))

    def char_class(self) -> _Node:
        start = self.pos
        self.pos += 1
        if self.peek() == "^":
            self.pos += 1
        if self.peek() == "]":
            self.pos += 1
        while self.peek() not in ("", "]"):
            if self.peek() == "[":
                raise self.fail("a '[' inside a class must be escaped")
            self.pos += 2 if self.peek() == "\\" else 1
        if self.peek() != "]":
            raise self.fail("missing ']'")
        self.pos += 1
        try:
            return _Node("atom", atom=re.compile(self.text[start : self.pos]))
        except re.error as exc:
            raise self.fail(f"bad character class: {exc}") from None

    def quantifier(self, node: _Node) -> _Node:
        char = self.peek()
        if char not in ("*", "+", "?", "{"):
            return node
        if char == "{":
            match = re.compile(r"\{([0-9]{1,3})(,([0-9]{0,3}))?\}").match(self.text, self.pos)
            if match is None:
                raise self.fail("a repetition is written {m}, {m,} or {m,n}")
            low = int(match.group(1))
            high: Optional[int] = low if match.group(2) is None else (int(match.group(3)) if match.group(3) else None)
            if low > MAX_REPEAT or (high is not None and (high > MAX_REPEAT or high < low)):
                raise self.fail(f"a repetition needs m <= n <= {MAX_REPEAT}")
            self.pos = match.end()
        else:
            self.pos += 1
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        if self.peek() == "?":
            self.pos += 1  # lazy: the same set of whole-key matches
        if self.peek() in ("*", "+", "?", "{"):
            raise self.fail("a quantifier cannot follow a quantifier")
        if node.quantified:
            raise self.fail("a quantifier on a group that holds a quantifier (as in (a+)+) is refused")
        return _Node("repeat", items=[node], low=low, high=high)


class KeyPattern:
    """A compiled pattern: an automaton of character edges and empty (epsilon) edges."""

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or len(text) > MAX_PATTERN_CHARS:
            raise InvalidInput(f"key_pattern must be a string of at most {MAX_PATTERN_CHARS} characters")
        self.text = text
        self.edges: List[Optional[Tuple["re.Pattern[str]", int]]] = []
        self.empty: List[List[int]] = []
        tree = _Parser(text).parse()
        self.start = self._state()
        self.end = self._build(tree, self.start)

    def _state(self) -> int:
        if len(self.edges) >= MAX_STATES:
            raise InvalidInput(f"key_pattern {self.text[:60]!r} is too large (more than {MAX_STATES} states)")
        self.edges.append(None)
        self.empty.append([])
        return len(self.edges) - 1

    def _build(self, node: _Node, start: int) -> int:
        """Add ``node`` from state ``start``; return the state where it ends.

        ``start`` has no character edge yet, and the state returned is one no
        character edge leaves, so each state keeps at most one.
        """
        if node.kind == "atom":
            end = self._state()
            self.edges[start] = (node.atom, end)  # type: ignore[assignment]
            return end
        if node.kind == "seq":
            for item in node.items:
                start = self._build(item, start)
            return start
        if node.kind == "alt":
            end = self._state()
            for item in node.items:
                branch = self._state()
                self.empty[start].append(branch)
                self.empty[self._build(item, branch)].append(end)
            return end
        item = node.items[0]
        for _ in range(node.low):
            start = self._build(item, start)
        if node.high is None:
            loop, end = self._state(), self._state()
            self.empty[start].append(loop)
            self.empty[loop].append(end)
            self.empty[self._build(item, loop)].append(loop)
            return end
        end = self._state()
        for _ in range(node.high - node.low):
            self.empty[start].append(end)
            start = self._build(item, start)
        self.empty[start].append(end)
        return end

    def _closure(self, states: List[int]) -> List[int]:
        seen = set(states)
        stack = list(states)
        while stack:
            for target in self.empty[stack.pop()]:
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        return list(seen)

    def fullmatch(self, key: str) -> bool:
        """True when the pattern matches the whole of ``key``; time linear in ``len(key)``."""
        current = self._closure([self.start])
        for char in key:
            moved = []
            for state in current:
                edge = self.edges[state]
                if edge is not None and edge[0].fullmatch(char):
                    moved.append(edge[1])
            if not moved:
                return False
            current = self._closure(moved)
        return self.end in current


@functools.lru_cache(maxsize=64)
def compile_pattern(text: str) -> KeyPattern:
    """The automaton of ``text``; :raises InvalidInput: the pattern is outside the subset or too large."""
    return KeyPattern(text)
