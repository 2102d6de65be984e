"""Reading a timeline page in tests: its elements, and the check that it is inert (no script, no link, nothing fetched)."""

import html.parser
import unittest
from typing import Dict, List, Optional, Tuple

FORBIDDEN = ("http:", "https:", "//", "src=", "<script", "href=", "@import", "url(http")


class Elements(html.parser.HTMLParser):
    """Every start tag with its attributes and the attributes of the ``<g>`` elements around it."""

    VOID = {"meta", "br", "img", "input", "link", "hr", "rect", "line", "circle", "path"}

    def __init__(self) -> None:
        super().__init__()
        self.elements: List[Tuple[str, Dict[str, Optional[str]], List[Dict[str, Optional[str]]]]] = []
        self.stack: List[Tuple[str, Dict[str, Optional[str]]]] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        attributes = dict(attrs)
        self.elements.append((tag, attributes, [a for t, a in self.stack if t == "g"]))
        self.stack.append((tag, attributes))

    def handle_startendtag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        self.elements.append((tag, dict(attrs), [a for t, a in self.stack if t == "g"]))

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def having(self, cls: str) -> List[Dict[str, Optional[str]]]:
        return [a for _, a, _ in self.elements if cls in (a.get("class") or "").split()]


def parse(page: str) -> Elements:
    parser = Elements()
    parser.feed(page)
    return parser


def assert_inert(test: unittest.TestCase, page: str) -> None:
    lowered = page.lower()
    for needle in FORBIDDEN:
        test.assertNotIn(needle, lowered, f"the page holds {needle!r}")
