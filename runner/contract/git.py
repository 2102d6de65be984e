"""What the contract's ``effects.git`` section may say: :func:`git_problems`, for ``contract check``, and how its
templates are filled (:func:`fill`).

A git target releases each batch item's repository: it writes the files the
section names (or runs its ``edit`` command), commits once with the effect's
key in a trailer (``Runner-Key: KEY``), tags that commit and pushes the
commit and the tag together. The calls are made by :mod:`runner.adapters.git`;
this module holds only what the checks need, so that every verb may import it.
Each problem is a :class:`~runner.contract.http.FieldProblem`, whose ``path``
names the JSON fields that lead to it, so that ``contract check`` can give its
line.

Where an item is released (``repository``, ``remote``, ``branch``) is made of
the item alone (its name, or a record's ``{field.PATH}``); what is released
(``files``, ``message``, ``tag``) may also name the key and the payload's
top-level fields (``{payload.version}``).
"""

import re
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

from ..base.workspace import item_problem
from .http import FieldProblem
from .steps import _argv_problem
from .templates import FIELD_NAME, expand, is_field

__all__ = ["git_problems", "payload_problems", "fill", "names_in", "ref_problem", "remote_problem", "GIT_FIELDS",
           "KEY_TRAILER", "WHERE_PLACEHOLDERS", "WHAT_PLACEHOLDERS", "EDIT_PLACEHOLDERS", "MAX_FILES"]

#: The fields of ``effects.git``.
GIT_FIELDS = ("repository", "files", "edit", "message", "tag", "annotated", "remote", "branch", "not_now", "author")
#: The trailer of a release commit that carries its effect's key.
KEY_TRAILER = "Runner-Key"
#: Placeholders of the fields that say where an item is released: ``repository``, ``remote``, ``branch``.
WHERE_PLACEHOLDERS = ("item", "stem", "slug", "index", "run_id")
#: Placeholders of the fields that say what is released (``files``, ``message``, ``tag``), with ``{payload.FIELD}``.
WHAT_PLACEHOLDERS = ("key", "item", "stem", "slug", "index", "run_id")
#: Placeholders of the ``edit`` command's arguments.
EDIT_PLACEHOLDERS = ("key", "payload_file", "item", "stem", "slug", "index", "run_id", "workspace", "repository")
#: The most files ``files`` may name.
MAX_FILES = 100
#: The most phrases ``not_now`` may list.
MAX_NOT_NOW = 20

#: A placeholder of a git template: ``payload.`` and a top-level field of the payload (group 1), a name with its
#: width (groups 2 and 3), or a record's ``field.PATH|FILTER...`` (group 4).
_PLACEHOLDER = re.compile(r"\{(?:(payload\.[A-Za-z0-9_]+)|([a-z_][a-z0-9_]*)(?::(0?[1-9][0-9]?)d)?|("
                          + FIELD_NAME + r"))\}")
#: What a ref name may not hold (git-check-ref-format): control characters, space, ~ ^ : ? * [ \ and DEL.
_REF_BAD = re.compile(r"[\x00-\x20~^:?*\[\\\x7f]")
#: A URL that carries a password (``scheme://user:password@host``), or a user in an http(s) URL, often a token.
_PASSWORD = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://[^/@]*:[^/@]*@|https?://[^/@]*@)", re.IGNORECASE)


def names_in(text: str) -> List[str]:
    """The placeholder names ``text`` holds, known or not (``payload.FIELD`` and ``field.PATH`` each as one name), in
    order."""
    return [m.group(1) or m.group(2) or m.group(4) for m in _PLACEHOLDER.finditer(text)]


def fill(template: str, values: Mapping[str, Any], payload: Optional[Mapping[str, Any]] = None) -> str:
    """``template`` with each placeholder of ``values`` (a record's fields among them) and each ``{payload.FIELD}``
    replaced, in one pass.

    A payload field that is a string goes in as it is; any other value as its JSON text. A brace that names no
    value is left as written, so a value never has its own braces filled.

    :raises KeyError: a ``{payload.FIELD}`` names a field the payload does not hold (the field's name).
    """
    import json  # here: a check that fills nothing does not need it

    def one(match: "re.Match[str]") -> str:
        name = match.group(1)
        if name is None:
            return expand([match.group(0)], values)[0]
        field = name[len("payload."):]
        if payload is None or field not in payload:
            raise KeyError(field)
        value = payload[field]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)

    return _PLACEHOLDER.sub(one, template)


def ref_problem(name: str) -> Optional[str]:
    """Why ``name`` cannot be the last part of a branch or tag ref (git-check-ref-format's rules), or None.

    The name may not start with ``-`` either: it goes on git's command line.
    """
    if not name:
        return "is empty"
    if name.startswith("-"):
        return "starts with '-'"
    if _REF_BAD.search(name):
        return "holds a space, a control character or one of ~ ^ : ? * [ \\"
    if ".." in name or "@{" in name or "//" in name or name == "@":
        return "holds '..', '@{' or '//', or is '@'"
    if name.startswith("/") or name.endswith(("/", ".", ".lock")):
        return "starts with '/' or ends with '/', '.' or '.lock'"
    if any(part.startswith(".") or part.endswith(".lock") for part in name.split("/")):
        return "has a part that starts with '.' or ends with '.lock'"
    return None


def remote_problem(remote: str) -> Optional[str]:
    """Why ``remote`` (a remote's name, a URL or a path) cannot be pushed to as written, or None."""
    if not remote or remote.startswith("-"):
        return "must name a remote (origin), a URL or a path, and may not start with '-'"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in remote):
        return "holds a control character"
    if _PASSWORD.match(remote):
        return ("holds a password or a token, which would be recorded with the run: let a credential helper or an "
                "SSH key sign in")
    return None


def _literal(template: str) -> str:
    """``template`` with every placeholder replaced by ``x``: what its written parts must allow."""
    return _PLACEHOLDER.sub("x", template)


def _template_problems(field: str, value: Any, allowed: Sequence[str], payload: bool,
                       at: Sequence[str]) -> List[FieldProblem]:
    """The problems of one template field: a string on one line whose placeholders ``allowed`` (and
    ``{payload.FIELD}`` where ``payload``) name."""
    if not isinstance(value, str) or not value.strip():
        return [FieldProblem(at, f"effects.git.{field} must be a non-empty string")]
    unknown = [n for n in names_in(value)
               if n not in allowed and not is_field(n) and not (payload and n.startswith("payload."))]
    if unknown:
        named = ", ".join("{" + n + "}" for n in allowed) + (", {payload.FIELD}" if payload else "") + ", {field.PATH}"
        return [FieldProblem(at, f"effects.git.{field}: unknown placeholder {{{unknown[0]}}} (allowed: {named})")]
    return []


def _where_problems(git: Dict[str, Any]) -> List[FieldProblem]:
    """``repository``, ``remote`` and ``branch``: templates of the item, a path, a remote and a branch name."""
    out: List[FieldProblem] = []
    repository = git.get("repository", "{item}")
    found = _template_problems("repository", repository, WHERE_PLACEHOLDERS, False, ("git", "repository"))
    if not found and item_problem(_literal(repository)):
        found = [FieldProblem(("git", "repository"),
                              "effects.git.repository must be a folder relative to the workspace, without '..'")]
    out.extend(found)
    remote = git.get("remote", "origin")
    found = _template_problems("remote", remote, WHERE_PLACEHOLDERS, False, ("git", "remote"))
    problem = None if found else remote_problem(_literal(remote))
    out.extend(found or ([FieldProblem(("git", "remote"), f"effects.git.remote {problem}")] if problem else []))
    if "branch" in git:
        found = _template_problems("branch", git["branch"], WHERE_PLACEHOLDERS, False, ("git", "branch"))
        problem = None if found else ref_problem(_literal(git["branch"]))
        if problem:
            found = [FieldProblem(("git", "branch"),
                                  f"effects.git.branch {git['branch'][:80]!r} {problem}: no branch is named so")]
        out.extend(found)
    return out


def _what_problems(git: Dict[str, Any]) -> List[FieldProblem]:
    """``message``, ``tag``, ``files`` and ``edit``: what each release commit holds and how it is tagged."""
    out: List[FieldProblem] = []
    if "message" in git:
        out.extend(_template_problems("message", git["message"], WHAT_PLACEHOLDERS, True, ("git", "message")))
    if "tag" in git:
        found = _template_problems("tag", git["tag"], WHAT_PLACEHOLDERS, True, ("git", "tag"))
        problem = None if found else ref_problem(_literal(git["tag"]))
        if problem:
            found = [FieldProblem(("git", "tag"), f"effects.git.tag {git['tag'][:80]!r} {problem}: no tag is named so")]
        out.extend(found)
    files = git.get("files")
    if "files" in git:
        if not isinstance(files, dict) or not files or len(files) > MAX_FILES:
            out.append(FieldProblem(("git", "files"), "effects.git.files must be an object of paths (relative to the "
                                                      f"repository) and their contents: 1 to {MAX_FILES} files"))
        else:
            for path, content in files.items():
                at = ("git", "files", path)
                found = _template_problems("files", path, WHAT_PLACEHOLDERS, True, at)
                literal = _literal(path)
                if not found and (item_problem(literal) or ".git" in literal.replace("\\", "/").split("/")):
                    found = [FieldProblem(at, f"effects.git.files: {path[:80]!r} must be a path relative to the "
                                              "repository, without '..' and outside .git")]
                if not found and not isinstance(content, str):
                    found = [FieldProblem(at, f"effects.git.files: the content of {path[:80]!r} must be a string "
                                              "(a template)")]
                out.extend(found)
    if "edit" in git:
        problem = _argv_problem(git["edit"], "effects.git.edit", EDIT_PLACEHOLDERS, fields=True)
        if problem:
            out.append(FieldProblem(("git", "edit"), problem))
    return out


def _other_problems(git: Dict[str, Any]) -> List[FieldProblem]:
    """``annotated``, ``not_now`` and ``author``."""
    out: List[FieldProblem] = []
    if "annotated" in git and not isinstance(git["annotated"], bool):
        out.append(FieldProblem(("git", "annotated"),
                                "effects.git.annotated must be true (a tag object, the default) or false"))
    not_now = git.get("not_now")
    if "not_now" in git and (not isinstance(not_now, list) or len(not_now) > MAX_NOT_NOW
                             or not all(isinstance(p, str) and p.strip() and "\n" not in p for p in not_now)):
        out.append(FieldProblem(("git", "not_now"), f"effects.git.not_now must list the phrases (one line each, at "
                                                    f"most {MAX_NOT_NOW}) by which a refusal means \"not now\""))
    author = git.get("author")
    if "author" in git and (not isinstance(author, dict) or set(author) != {"name", "email"} or not all(
            isinstance(v, str) and v.strip() and not any(c in v for c in "\n\r\0<>") for v in author.values())):
        out.append(FieldProblem(("git", "author"), 'effects.git.author must be {"name": NAME, "email": ADDRESS}, '
                                                   "each one line without < or >"))
    return out


def git_problems(effects: Dict[str, Any]) -> List[FieldProblem]:
    """Every problem of the contract's ``effects.git`` (none when it has no such section).

    Each problem is a :class:`FieldProblem`: its text, and the fields leading
    to it so that ``contract check`` can name its line.
    """
    git = effects.get("git")
    if not isinstance(git, dict):
        return []  # absent, or not an object: the effects section's own check says so
    out: List[FieldProblem] = []
    others = [name for name in ("http", "invoke", "observe") if name in effects]
    if others:
        out.append(FieldProblem(("git",), f"effects: git and {'/'.join(others)} exclude each other; keep one of them"))
    out.extend(FieldProblem(("git", name), f"effects.git: unknown field {name!r} (allowed: {', '.join(GIT_FIELDS)})")
               for name in git if name not in GIT_FIELDS)
    for field, what in (("message", "the release commit's message (the trailer Runner-Key: KEY is added to it)"),
                        ("tag", "the tag's name, such as \"v{payload.version}\""),
                        ("branch", "the branch the release commit is made on and pushed to")):
        if field not in git:
            out.append(FieldProblem(("git",), f"effects.git needs {field!r}: {what}"))
    return out + _where_problems(git) + _what_problems(git) + _other_problems(git)


def _what_texts(git: Mapping[str, Any]) -> Iterator[str]:
    """The templates of ``effects.git`` that may name payload fields."""
    for field in ("message", "tag"):
        if isinstance(git.get(field), str):
            yield git[field]
    files = git.get("files")
    if isinstance(files, dict):
        for path, content in files.items():
            yield path
            if isinstance(content, str):
                yield content


def payload_problems(block: Mapping[str, Any]) -> List[str]:
    """The payload fields ``effects.git`` names that the payload template of a batch step does not hold.

    A step whose payload is made by a command is not checked here: its payload is known when an item begins.
    """
    git = (block.get("effects") or {}).get("git")
    if not isinstance(git, dict):
        return []
    named = sorted({n[len("payload."):] for text in _what_texts(git) for n in names_in(text)
                    if n.startswith("payload.")})
    out: List[str] = []
    for step in block.get("steps") or []:
        if not isinstance(step, dict) or "items" not in step:
            continue
        payload = step.get("payload")
        if isinstance(payload, dict) and "command" in payload:
            continue
        template = payload.get("template") if isinstance(payload, dict) else {"item": "{item}", "key": "{key}"}
        held = set(template) if isinstance(template, dict) else set()
        missing = [name for name in named if name not in held]
        if missing:
            out.append(f"effects.git names {{payload.{missing[0]}}}, which the payload of step {step.get('id')!r} "
                       f"does not hold (it holds: {', '.join(sorted(held)) or 'nothing'})")
    return out
