"""The placeholders a contract may use, and the values an item fills them with.

A template is a string (an argument of a command, a key, a URL, a field of a
payload) in which ``{name}`` (or ``{index:05d}``) names a placeholder.
:func:`expand` replaces each one that names a known value inside one
argument and nothing else, so a value always reaches the program as part of
exactly one argument. The tables say which names each part of a contract may
use; :func:`item_values` and :func:`document_values` are what one item
fills them with, and :func:`slug` is the key-safe form of an item's stem.
"""

import os
import re
import unicodedata
from typing import Any, Callable, Dict, List, Mapping, Sequence

from ..base.errors import InvalidInput

__all__ = [
    "PLACEHOLDERS",
    "KEY_PLACEHOLDERS",
    "FILE_PLACEHOLDERS",
    "DOCUMENT_PLACEHOLDERS",
    "PAYLOAD_PLACEHOLDERS",
    "PAYLOAD_COMMAND_PLACEHOLDERS",
    "CHECK_PLACEHOLDERS",
    "MAX_TEXT_BYTES",
    "MAX_SLUG_CHARS",
    "placeholders_in",
    "expand",
    "strings_in",
    "item_stem",
    "slug",
    "item_values",
    "values_for",
    "item_keys",
    "document_values",
    "fill",
]

#: Every name a command argument may hold in braces.
PLACEHOLDERS = ("key", "payload_file", "epoch", "run_id", "item", "stem", "slug", "index", "workspace")
KEY_PLACEHOLDERS = ("item", "stem", "slug", "index")
#: Placeholders filled from the item's file when a payload template names them.
FILE_PLACEHOLDERS = ("first_line", "sha256", "text", "heading", "body")
DOCUMENT_PLACEHOLDERS = ("text", "heading", "body")
PAYLOAD_PLACEHOLDERS = KEY_PLACEHOLDERS + ("key",) + FILE_PLACEHOLDERS
PAYLOAD_COMMAND_PLACEHOLDERS = KEY_PLACEHOLDERS + ("key", "workspace", "run_id")
CHECK_PLACEHOLDERS = ("workspace", "run_id")
#: The most bytes of an item's file that ``{text}``, ``{heading}`` and ``{body}`` read.
MAX_TEXT_BYTES = 64 * 1024
#: The longest ``{slug}``, so that a key built from it stays within the id limit.
MAX_SLUG_CHARS = 100


_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)(?::(0?[1-9][0-9]?)d)?\}")


def placeholders_in(text: str) -> List[str]:
    """The placeholder names ``text`` holds (known or not), in order."""
    return [m.group(1) for m in _PLACEHOLDER.finditer(text)]


def expand(argv: Sequence[str], values: Mapping[str, Any]) -> List[str]:
    """``argv`` with every ``{name}`` (or ``{index:05d}``) of ``values`` replaced, one argument each.

    A brace that names no value is left as it is, so literal JSON in an
    argument survives. The number of arguments never changes.
    """

    def one(match: "re.Match[str]") -> str:
        name, width = match.group(1), match.group(2)
        if name not in values:
            return match.group(0)
        value = values[name]
        if width and isinstance(value, int):
            return format(value, f"0{int(width)}d")
        return str(value)

    return [_PLACEHOLDER.sub(one, arg) for arg in argv]


def strings_in(value: Any) -> List[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


def item_stem(item: str) -> str:
    base = os.path.basename(item.rstrip("/")) or item
    stem, _ = os.path.splitext(base)
    return stem or base


def slug(item: str) -> str:
    """A key-safe form of the item's stem: lower case ASCII letters and digits, each run of anything else one ``-``.

    Accents are dropped (``Café`` gives ``cafe``), no ``-`` leads or ends, and
    at most :data:`MAX_SLUG_CHARS` characters are kept, so a non-empty slug
    always passes :func:`runner.base.values.validate_id`. It is empty when the
    stem has no letter or digit that folds to ASCII; ``step start`` refuses
    a key built from such a slug. Two stems may give one slug (``a b`` and
    ``a-b``); the start refuses their equal keys.
    """
    folded = "".join(c for c in unicodedata.normalize("NFKD", item_stem(item)) if not unicodedata.combining(c)).casefold()
    return re.sub(r"[^a-z0-9]+", "-", folded).strip("-")[:MAX_SLUG_CHARS].rstrip("-")


def item_values(item: str, index: int) -> Dict[str, Any]:
    """The key placeholders of one item: ``item``, ``stem``, ``slug`` and ``index``."""
    return {"item": item, "stem": item_stem(item), "slug": slug(item), "index": index}


def values_for(templates: Sequence[str]) -> Callable[[str, int], Dict[str, Any]]:
    """:func:`item_values` of only the names ``templates`` hold: ``{slug}`` is the costly one, made only when named."""
    names = {n for t in templates for n in placeholders_in(t)}
    want_stem, want_slug = "stem" in names, "slug" in names

    def values(item: str, index: int) -> Dict[str, Any]:
        out: Dict[str, Any] = {"item": item, "index": index}
        if want_stem:
            out["stem"] = item_stem(item)
        if want_slug:
            out["slug"] = slug(item)
        return out

    return values


def item_keys(template: str, items: Sequence[str]) -> List[str]:
    values = values_for([template])
    return [expand([template], values(item, i))[0] for i, item in enumerate(items)]


def document_values(data: bytes, what: str = "the item's file") -> Dict[str, str]:
    """``text``, ``heading`` and ``body`` of a document's bytes (see the module docstring).

    :raises InvalidInput: ``data`` is longer than :data:`MAX_TEXT_BYTES` or is not UTF-8.
    """
    if len(data) > MAX_TEXT_BYTES:
        raise InvalidInput(f"{what}: the file is larger than {MAX_TEXT_BYTES:,} bytes, the most {{text}}, {{heading}} and {{body}} read; "
                           "skip the item (`effect skip KEY --reason TEXT`) or send {item} for the target to read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{what}: the file is not UTF-8 (byte {exc.start}); {{text}}, {{heading}} and {{body}} need UTF-8 text") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    first = next((n for n, line in enumerate(lines) if line.strip()), len(lines))
    heading = lines[first].strip().lstrip("#").strip() if first < len(lines) else ""
    return {"text": text, "heading": heading, "body": "\n".join(lines[first + 1:]).strip()}


def fill(value: Any, values: Dict[str, Any]) -> Any:
    if isinstance(value, str):
        return expand([value], values)[0]
    if isinstance(value, dict):
        return {k: fill(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, values) for v in value]
    return value
