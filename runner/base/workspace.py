"""Paths kept inside a workspace: what an item, an item file, a glob or an artifact may name.

An item is a path relative to the contract's workspace, and it must stay
inside it whatever the file system holds: :func:`item_problem` refuses what
can never be inside (an absolute path, a ``..`` component, a NUL), and
:func:`resolve_inside` and :func:`check_inside` follow every link and refuse
what leads outside. A glob (:func:`glob_files`) never follows a directory
link and visits a bounded number of entries; a file is read only when it is
a regular file (:func:`open_regular`, :func:`read_bounded`).
"""

import fnmatch
import os
import re
import stat
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import InvalidInput

__all__ = ["MAX_ITEMS", "MAX_LISTED_ENTRIES", "item_problem", "resolve_inside", "check_inside", "open_regular",
           "read_bounded", "glob_files"]

#: The most items a step's source may list.
MAX_ITEMS = 100000
#: The most directory entries one glob listing may visit (a bound on its time, whatever the tree holds).
MAX_LISTED_ENTRIES = 1000000


def item_problem(item: str) -> Optional[str]:
    """Why ``item`` cannot name a path inside the workspace whatever the file system holds, or None.

    An absolute path, a ``..`` component (``/`` or ``\\`` separated) or a NUL
    character is refused; everything else is checked against the file
    system by :func:`resolve_inside`.
    """
    if "\0" in item:
        return "holds a NUL character"
    if os.path.isabs(item) or item.startswith(("/", "\\")):
        return "is an absolute path"
    if ".." in item.replace("\\", "/").split("/"):
        return "holds a '..' component"
    return None


def _inside(root_real: str, real: str) -> bool:
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def resolve_inside(root: str, item: str, what: Optional[str] = None) -> str:
    """The real path of ``item`` under the workspace ``root``, every link followed; it must stay inside.

    :raises InvalidInput: the item is absolute, holds ``..`` or a NUL, or
        leads outside the workspace through a symbolic link.
    """
    what = what or f"item {item[:80]!r}"
    problem = item_problem(item)
    if problem:
        raise InvalidInput(f"{what} {problem}; items are paths inside the workspace {root}")
    root_real = os.path.realpath(root)
    real = os.path.realpath(os.path.join(root_real, item))
    if not _inside(root_real, real):
        raise InvalidInput(f"{what} leads outside the workspace {root} (to {real[:200]}) through a symbolic link; "
                           "items must stay inside it after links are followed")
    return real


def open_regular(real: str, what: str) -> int:
    """A read-only descriptor of the regular file at ``real`` (no link at its last component, never a FIFO's wait)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        raise InvalidInput(f"{what}: cannot read {real}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput(f"{what}: {real} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def glob_files(root: str, pattern: str, max_entries: Optional[int] = None,
               max_items: Optional[int] = None) -> List[str]:
    """The files under ``root`` that ``pattern`` matches, as sorted relative paths; no directory link is followed.

    The rules are :func:`glob.glob`'s with ``recursive=True`` (see the module
    docstring), except that a symbolic link to a directory is never entered,
    so a link to ``.`` or ``..`` cannot make the listing endless. A pattern
    that ends with ``/`` lists folders instead of files (``repos/*/``: each
    folder of ``repos``, named without the ``/``), never the workspace itself.

    :raises InvalidInput: the listing would visit more than ``max_entries``
        directory entries (default :data:`MAX_LISTED_ENTRIES`) or return more
        than ``max_items`` files (default :data:`MAX_ITEMS`).
    """
    max_entries = MAX_LISTED_ENTRIES if max_entries is None else max_entries
    max_items = MAX_ITEMS if max_items is None else max_items
    folders = pattern.endswith(("/", os.sep))
    parts: List[str] = []
    for part in pattern.replace(os.sep, "/").split("/"):
        if part in ("", ".") or (part == "**" and parts and parts[-1] == "**"):
            continue
        parts.append(part)
    if not parts:
        return []
    fold = os.path.normcase if os.path.normcase("A") != "A" else None
    matchers = [None if p == "**" or not any(c in p for c in "*?[")
                else re.compile(fnmatch.translate(os.path.normcase(p))).match for p in parts]
    found: set = set()
    visited = 0
    seen: set = set()
    stack: List[Tuple[str, int]] = [("", 0)]

    def too_many() -> InvalidInput:
        return InvalidInput(f"the glob {pattern!r} visits more than {max_entries:,} entries under {root}; narrow the "
                            "pattern or list the items in a file")

    def add(rel: str) -> None:
        found.add(rel)
        if len(found) > max_items:
            raise InvalidInput(f"the glob {pattern!r} lists more than {max_items:,} items under {root}; the limit is "
                               f"{max_items:,}")

    while stack:
        rel, index = stack.pop()
        if (rel, index) in seen:
            continue
        seen.add((rel, index))
        part, last = parts[index], index == len(parts) - 1
        here = os.path.join(root, rel) if rel else root
        prefix = rel + os.sep if rel else ""
        if matchers[index] is None and part != "**":
            visited += 1
            if visited > max_entries:
                raise too_many()
            path = os.path.join(here, part)
            try:
                mode = os.lstat(path).st_mode
            except (OSError, ValueError):
                continue
            if last:
                kind, linked = (stat.S_ISDIR, os.path.isdir) if folders else (stat.S_ISREG, os.path.isfile)
                if kind(mode) or (stat.S_ISLNK(mode) and linked(path)):
                    add(prefix + part)
            elif stat.S_ISDIR(mode):
                stack.append((prefix + part, index + 1))
            continue
        if part == "**" and not last:
            stack.append((rel, index + 1))  # '**' matches no folder at all, too
        elif part == "**" and folders and rel:
            add(rel)  # 'a/**/' lists a itself, as glob.glob does
        match, hidden_ok, recurse = matchers[index], part.startswith("."), part == "**"
        try:
            with os.scandir(here) as entries:
                for entry in entries:
                    visited += 1
                    if visited > max_entries:
                        raise too_many()
                    name = entry.name
                    # As glob.glob: a wildcard does not match a name starting with '.' unless the pattern
                    # component does.
                    if ((name[0] == "." and not hidden_ok) or
                        (match is not None and not match(fold(name) if fold else name))):
                        continue
                    inner = entry.is_dir(follow_symlinks=False)
                    if inner and recurse:
                        stack.append((prefix + name, index))
                    elif inner and not last:
                        stack.append((prefix + name, index + 1))
                    if last and (entry.is_dir() if folders else not inner and entry.is_file()):
                        add(prefix + name)
        except OSError:
            continue  # an unreadable folder lists nothing, as with glob.glob
    return sorted(found)


def read_bounded(real: str, what: str, limit: int) -> bytes:
    fd = open_regular(real, what)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InvalidInput(f"{what}: {real} is larger than {limit:,} bytes")
    return data


def check_inside(root: str, items: Sequence[str], what: str) -> None:
    """Refuse unless every item resolves inside the workspace ``root`` with every link followed.

    The same test as :func:`resolve_inside`, with each item's folder resolved
    once, so a list of 100,000 items costs about one ``lstat`` per item.

    :raises InvalidInput: naming the first item that is absolute, holds ``..``
        or a NUL, or leads outside.
    """
    root_real = os.path.realpath(root)
    folders: Dict[str, str] = {}
    for index, item in enumerate(items):
        problem = item_problem(item)
        if problem:
            raise InvalidInput(f"item {index} {item[:80]!r} of {what} {problem}; items are paths inside the workspace "
                               f"{root}")
        head, name = os.path.split(item)
        folder = folders.get(head)
        if folder is None:
            folder = folders[head] = os.path.realpath(os.path.join(root_real, head))
        real = folder if name in ("", ".") else os.path.join(folder, name)
        if real != folder and os.path.islink(real):
            real = os.path.realpath(real)
        if not _inside(root_real, real):
            raise InvalidInput(f"item {index} {item[:80]!r} of {what} leads outside the workspace {root} (to "
                               f"{real[:200]}) through a symbolic link; items must stay inside it after links are "
                               "followed")
