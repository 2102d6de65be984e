"""The placeholders a contract may use, and the values an item fills them with.

A template is a string (an argument of a command, a key, a URL, a field of a
payload) in which ``{name}`` (or ``{index:05d}``) names a placeholder.
:func:`expand` replaces each one that names a known value inside one
argument and nothing else, so a value always reaches the program as part of
exactly one argument. The tables say which names each part of a contract may
use; :func:`item_values` and :func:`document_values` are what one item
fills them with, and :func:`slug` is the key-safe form of an item's stem.

An item that is a record (a JSON object: a ``.json`` file's, a JSON Lines
line's, a CSV row's, the named groups of a line) also fills ``{field.PATH}``:
PATH is dotted, a list index written as a number (``{field.labels.0}``), and
filters may follow (``{field.stack|lines}``, see :data:`FIELD_FILTERS`). In a
string a field's value is its text: a string as it is, anything else as
canonical JSON (``42``, ``true``, ``["a"]``, keys sorted), so the text is the
same in every process. A payload template's value that is exactly one field
placeholder keeps the field's JSON type (:func:`fill`). A missing field, or a
path into something that is not an object or a list, is refused with
:class:`~runner.base.errors.InvalidInput` naming the item and the field.
"""

import os
import re
import unicodedata
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..base.canonical import canonical_json
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
    "FIELD_FILTERS",
    "FIELD_NAME",
    "RECORD_FILES",
    "placeholders_in",
    "expand",
    "strings_in",
    "item_stem",
    "slug",
    "slug_text",
    "is_field",
    "kind_of",
    "field_problem",
    "field_value",
    "field_text",
    "field_values",
    "effects_templates",
    "step_templates",
    "fields_of",
    "reads_records",
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
#: What may follow a field's path, each applied in turn: ``lines`` (text to a list, one element a line), ``json``
#: (any value to its canonical JSON text), ``slug`` (text to its key-safe form, as :func:`slug_text`) and
#: ``first_line`` (text to its first line).
FIELD_FILTERS = ("lines", "json", "slug", "first_line")
#: The item sources whose items are records read from one file, each item named ``FILE:LINE``.
RECORD_FILES = ("jsonl", "csv", "lines")

#: The name of a record's field placeholder, as a regular expression: ``field``, each part of the path after a dot,
#: each filter after a ``|``. A part holds anything but ``.``, braces, ``|`` and control characters.
FIELD_NAME = r"field(?:\.[^.{}|\x00-\x1f]+)+(?:\|[^{}|\x00-\x1f]*)*"
#: ``{name}`` or ``{name:0Nd}`` (groups 1 and 2), or a record's ``{field.PATH|FILTER...}`` (group 3).
_PLACEHOLDER = re.compile(r"\{(?:([a-z_][a-z0-9_]*)(?::(0?[1-9][0-9]?)d)?|(" + FIELD_NAME + r"))\}")


def placeholders_in(text: str) -> List[str]:
    """The placeholder names ``text`` holds (known or not), in order; a field's name is ``field.PATH|FILTER...``."""
    return [m.group(1) or m.group(3) for m in _PLACEHOLDER.finditer(text)]


def expand(argv: Sequence[str], values: Mapping[str, Any]) -> List[str]:
    """``argv`` with every ``{name}`` (or ``{index:05d}``) of ``values`` replaced, one argument each.

    A brace that names no value is left as it is, so literal JSON in an
    argument survives. The number of arguments never changes.
    """

    def one(match: "re.Match[str]") -> str:
        name, width = match.group(1) or match.group(3), match.group(2)
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
    return slug_text(item_stem(item))


def slug_text(text: str) -> str:
    """The key-safe form of ``text`` that :func:`slug` makes of a stem (and a field's ``|slug`` filter of its text)."""
    folded = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c)).casefold()
    return re.sub(r"[^a-z0-9]+", "-", folded).strip("-")[:MAX_SLUG_CHARS].rstrip("-")


def is_field(name: str) -> bool:
    """True for a placeholder name that reads a record's field (``field.PATH``, filters after it)."""
    return name.startswith("field.")


def _field_parts(name: str) -> Tuple[List[str], List[str]]:
    """The path and the filters of a field placeholder's name (``field.a.0|lines`` gives ``["a", "0"], ["lines"]``)."""
    head, *filters = name.split("|")
    return head.split(".")[1:], filters


def field_problem(name: str) -> Optional[str]:
    """Why the field placeholder ``name`` can never be filled (an unknown filter), or None."""
    for applied in _field_parts(name)[1]:
        if applied not in FIELD_FILTERS:
            return (f"{{{name}}}: unknown filter |{applied} (filters: "
                    + ", ".join("|" + f for f in FIELD_FILTERS) + ")")
    return None


def kind_of(value: Any) -> str:
    """What a JSON value is, in words for a refusal: text, a number, true or false, null, a list, an object."""
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    if value is None:
        return "null"
    return "a list" if isinstance(value, list) else "an object"


def field_text(value: Any) -> str:
    """The text of a field's value in a string: a string as it is, anything else its canonical JSON."""
    return value if isinstance(value, str) else canonical_json(value).decode("utf-8")


def _filtered(value: Any, applied: str, name: str, what: str) -> Any:
    """``value`` through the filter ``applied``: each but ``json`` takes text (a number or true/false as its text)."""
    if applied == "json":
        return canonical_json(value).decode("utf-8")
    if isinstance(value, (dict, list)) or value is None:
        raise InvalidInput(f"{what}: {{{name}}}: |{applied} needs text, and the value is {kind_of(value)}")
    text = field_text(value)
    if applied == "lines":
        lines = [line.rstrip("\r") for line in text.split("\n")]
        return lines[:-1] if lines[-1] == "" else lines  # a last newline ends the last line; it starts none
    if applied == "slug":
        return slug_text(text)
    return text.split("\n", 1)[0].rstrip("\r")  # first_line


def field_value(record: Any, name: str, what: str) -> Any:
    """The value of the field placeholder ``name`` in ``record``, its filters applied, with its JSON type.

    :param what: names the item in a refusal, e.g. ``item 3 ('crashes.jsonl:4') of step 'file'``.
    :raises InvalidInput: the record has no such field, the path goes into a value that is not an object or a list,
        a list has no such element, or a filter meets a value it cannot take.
    """
    path, filters = _field_parts(name)
    value = record
    for depth, part in enumerate(path):
        where = ".".join(path[:depth]) or "the record"
        if isinstance(value, dict):
            if part not in value:
                raise InvalidInput(f"{what}: {{{name}}}: the record has no field {'.'.join(path[:depth + 1])!r}")
            value = value[part]
        elif isinstance(value, list):
            if not re.fullmatch(r"[0-9]+", part) or int(part) >= len(value):
                raise InvalidInput(f"{what}: {{{name}}}: {where!r} is a list of {len(value)}, with no element {part!r}")
            value = value[int(part)]
        else:
            raise InvalidInput(f"{what}: {{{name}}}: {where!r} is {kind_of(value)}, which holds no field {part!r}")
    for applied in filters:
        value = _filtered(value, applied, name, what)
    return value


def field_values(record: Any, names: Sequence[str], what: str) -> Dict[str, str]:
    """The text of each field placeholder of ``names`` in ``record`` (see :func:`field_value`)."""
    return {name: field_text(field_value(record, name, what)) for name in names}


def effects_templates(effects: Mapping[str, Any]) -> List[str]:
    """The templates of the effects section one item fills: the commands' arguments, the HTTP requests' URLs and header
    values, each lookup's ``value``, the path an answer is saved to, every template of ``git``, and the addresses and
    names of ``smtp``. The section may be unchecked: what is not a string is left out."""
    out: List[Any] = []
    for name in ("invoke", "observe"):
        command = effects.get(name)
        out += command if isinstance(command, list) else []
    many = effects.get("observe_many")
    if isinstance(many, dict):
        out.append(many.get("value"))
    http = effects.get("http")
    for kind in ("invoke", "observe"):
        request = http.get(kind) if isinstance(http, dict) else None
        if isinstance(request, dict):
            out.append(request.get("url"))
            headers = request.get("headers")
            out += list(headers.values()) if isinstance(headers, dict) else []
            many = request.get("many")
            out += [many.get("url"), many.get("value")] if isinstance(many, dict) else []
            listing = request.get("list")
            out += [listing.get("value")] if isinstance(listing, dict) else []
            save = request.get("save")
            out += [save.get("path")] if isinstance(save, dict) else []
    git = effects.get("git")
    if isinstance(git, dict):
        out += [git.get(name) for name in ("repository", "remote", "branch", "message", "tag")]
        files, edit = git.get("files"), git.get("edit")
        out += [part for pair in files.items() for part in pair] if isinstance(files, dict) else []
        out += edit if isinstance(edit, list) else []
    smtp = effects.get("smtp")
    if isinstance(smtp, dict):
        for name in ("host", "helo", "username", "from", "reply_to", "to", "cc", "bcc", "message_id"):
            value = smtp.get(name)
            out += value if isinstance(value, list) else [value]
    return [t for t in out if isinstance(t, str)]


def step_templates(step: Mapping[str, Any]) -> List[str]:
    """The templates of a batch step one item fills: its key, its payload template's strings or command's arguments."""
    payload = step.get("payload")
    how = payload if isinstance(payload, dict) else {}
    command = how.get("command")
    out: List[Any] = [step.get("key"), *strings_in(how.get("template"))]
    out += command if isinstance(command, list) else []
    return [t for t in out if isinstance(t, str)]


def fields_of(step: Mapping[str, Any], effects: Mapping[str, Any]) -> List[str]:
    """Every field placeholder an item of ``step`` fills, in its own templates and the effects section's, sorted."""
    templates = step_templates(step) + effects_templates(effects)
    return sorted({n for t in templates for n in placeholders_in(t) if is_field(n)})


def reads_records(step: Mapping[str, Any], effects: Mapping[str, Any]) -> bool:
    """True when the items of ``step`` are records: read from a JSON Lines, CSV or lines file, or ``.json`` files
    of a glob when a template names a field (without one, a ``.json`` file is an item like any other)."""
    items = step.get("items")
    if not isinstance(items, dict):
        return False
    if any(kind in items for kind in RECORD_FILES):
        return True
    pattern = items.get("glob")
    return isinstance(pattern, str) and pattern.endswith(".json") and bool(fields_of(step, effects))


def item_values(item: str, index: int, record: Any = None, fields: Sequence[str] = ()) -> Dict[str, Any]:
    """The key placeholders of one item: ``item``, ``stem``, ``slug`` and ``index``; and the text of each field of
    ``fields`` in its ``record``.

    :raises InvalidInput: a field cannot be read from the record (see :func:`field_value`), or there is no record.
    """
    out: Dict[str, Any] = {"item": item, "stem": item_stem(item), "slug": slug(item), "index": index}
    if fields:
        out.update(_fields(item, index, record, fields))
    return out


def _fields(item: str, index: int, record: Any, fields: Sequence[str]) -> Dict[str, str]:
    what = f"item {index} ({item[:60]!r})"
    if record is None:
        raise InvalidInput(f"{what} is not a record: {{{fields[0]}}} is filled only from a record's fields")
    return field_values(record, fields, what)


def values_for(templates: Sequence[str]) -> Callable[..., Dict[str, Any]]:
    """:func:`item_values` of only the names ``templates`` hold: ``{slug}`` is the costly one, made only when named.

    The function made takes ``(item, index, record=None)``; a field named is read from the record.
    """
    names = {n for t in templates for n in placeholders_in(t)}
    want_stem, want_slug = "stem" in names, "slug" in names
    fields = sorted(n for n in names if is_field(n))

    def values(item: str, index: int, record: Any = None) -> Dict[str, Any]:
        out: Dict[str, Any] = {"item": item, "index": index}
        if want_stem:
            out["stem"] = item_stem(item)
        if want_slug:
            out["slug"] = slug(item)
        if fields:
            out.update(_fields(item, index, record, fields))
        return out

    return values


def item_keys(template: str, items: Sequence[str], records: Optional[Sequence[Any]] = None) -> List[str]:
    """The key of each item (of each record, when ``records`` holds the items' records), in order."""
    values = values_for([template])
    if records is None:
        return [expand([template], values(item, i))[0] for i, item in enumerate(items)]
    return [expand([template], values(item, i, records[i]))[0] for i, item in enumerate(items)]


def document_values(data: bytes, what: str = "the item's file") -> Dict[str, str]:
    """``text``, ``heading`` and ``body`` of a document's bytes (see the module docstring).

    :raises InvalidInput: ``data`` is longer than :data:`MAX_TEXT_BYTES` or is not UTF-8.
    """
    if len(data) > MAX_TEXT_BYTES:
        raise InvalidInput(f"{what}: the file is larger than {MAX_TEXT_BYTES:,} bytes, the most {{text}}, {{heading}} "
                           f"and {{body}} read; skip the item (`effect skip KEY --reason TEXT`) or send {{item}} for "
                           "the target to read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{what}: the file is not UTF-8 (byte {exc.start}); {{text}}, {{heading}} and {{body}} need "
                           "UTF-8 text") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    first = next((n for n, line in enumerate(lines) if line.strip()), len(lines))
    heading = lines[first].strip().lstrip("#").strip() if first < len(lines) else ""
    return {"text": text, "heading": heading, "body": "\n".join(lines[first + 1:]).strip()}


def fill(value: Any, values: Dict[str, Any], record: Any = None) -> Any:
    """A payload template with its placeholders filled: every string of it, in objects and lists (keys stay).

    With the item's ``record``, a string that is exactly one field placeholder becomes the field's value with its
    JSON type (``"{field.labels}"`` a list, ``"{field.count}"`` a number); every other string stays a string.
    """
    if isinstance(value, str):
        whole = _PLACEHOLDER.fullmatch(value) if record is not None else None
        if whole is not None and whole.group(3):
            return field_value(record, whole.group(3), "the payload template")
        return expand([value], values)[0]
    if isinstance(value, dict):
        return {k: fill(v, values, record) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, values, record) for v in value]
    return value
