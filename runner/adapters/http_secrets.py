"""The secrets of an HTTP target's headers and URLs: read at each call, never kept, scrubbed from what its answers say.

A header value or a URL of ``effects.http`` may hold ``{env:NAME}`` or
``{file:PATH}`` (PATH relative to the workspace, one trailing newline
dropped): :func:`fill_secrets` and :func:`fill_url` read them now and collect
each value, :func:`shown_url` is a URL as the run may record it (each secret
``[secret]``), and :func:`scrub` replaces every collected value found in a
text of the target's answer by ``[secret]``.

Invariant: **secrets never reach the run.** The messages raised here name
the variable, the file or the header, never a value, and a text scrubbed
holds no collected value of :data:`SCRUB_MIN` characters or more.
"""

import os
import re
import stat
from typing import Any, List, Mapping, Sequence

from ..contract.http import SECRET

__all__ = ["SECRET_FILE_LIMIT", "REDACTED", "SCRUB_MIN", "read_secret", "fill_secrets", "fill_url", "shown_url",
           "scrub_text", "scrub"]

#: The largest file a ``{file:PATH}`` header value reads.
SECRET_FILE_LIMIT = 16 * 1024
#: What a secret value found in an answer is replaced by.
REDACTED = "[secret]"
#: Secret values shorter than this are not searched for in answers (replacing them would garble receipts).
SCRUB_MIN = 6


def read_secret(kind: str, name: str, workspace: str, environ: Mapping[str, str]) -> str:
    """The value of ``{env:NAME}`` or ``{file:PATH}``; raises ValueError with a message that holds no value."""
    if kind == "env":
        value = environ.get(name)
        if value is None:
            raise ValueError(f"the environment variable {name} is not set")
    else:
        path = os.path.join(workspace, name)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError as exc:
            raise ValueError(f"cannot open {name}: {exc.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{name} is not a regular file")
            data = os.read(fd, SECRET_FILE_LIMIT + 1)
        finally:
            os.close(fd)
        if len(data) > SECRET_FILE_LIMIT:
            raise ValueError(f"{name} is larger than {SECRET_FILE_LIMIT} bytes")
        try:
            value = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{name} is not UTF-8 text") from None
        value = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value
    if not value:
        raise ValueError(f"{'$' + name if kind == 'env' else name} is empty")
    if any(c in value for c in "\r\n\0"):
        raise ValueError(f"{'$' + name if kind == 'env' else name} holds a line break or a NUL")
    return value


def fill_secrets(header: str, value: str, workspace: str, environ: Mapping[str, str], secrets: List[str]) -> str:
    """``value`` (the header ``header``'s, placeholders filled) with each ``{env:...}`` and ``{file:...}`` read now;
    ``secrets`` gets each value read.

    :raises ValueError: a secret cannot be read (the message names the header and the secret, never a value).
    """

    return _read_into(value, f"the value of header {header}", workspace, environ, secrets)


def fill_url(url: str, workspace: str, environ: Mapping[str, str], secrets: List[str]) -> str:
    """``url`` (placeholders filled) with each ``{env:...}`` and ``{file:...}`` read now, as it is (a value is written
    into the URL unchanged: percent-encoded already where it must be); ``secrets`` gets each value read.

    :raises ValueError: a secret cannot be read (the message names the secret, never a value).
    """

    return _read_into(url, "the URL", workspace, environ, secrets)


def _read_into(text: str, what: str, workspace: str, environ: Mapping[str, str], secrets: List[str]) -> str:
    """``text`` with each secret placeholder replaced by the value read now, appended to ``secrets``.

    :raises ValueError: ``WHAT cannot be made: WHY`` for the first secret that cannot be read.
    """

    def secret(match: "re.Match[str]") -> str:
        try:
            found = read_secret(match.group(1), match.group(2), workspace, environ)
        except ValueError as exc:
            raise ValueError(f"{what} cannot be made: {exc}") from None
        secrets.append(found)
        return found

    return SECRET.sub(secret, text)


def shown_url(url: str) -> str:
    """``url`` as the run may record it: each ``{env:...}`` and ``{file:...}`` shown as ``[secret]``."""
    return SECRET.sub(REDACTED, url)


def scrub_text(text: str, secrets: Sequence[str]) -> str:
    """``text`` with each secret value of :data:`SCRUB_MIN` characters or more replaced by ``[secret]``, in the order
    given (a caller sorts the longer first, so a secret inside another is replaced whole)."""
    for secret in secrets:
        if len(secret) >= SCRUB_MIN and secret in text:
            text = text.replace(secret, REDACTED)
    return text


def scrub(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` with every secret value in its strings (keys included) replaced by ``[secret]``."""
    if not secrets:
        return value
    if isinstance(value, str):
        return scrub_text(value, secrets)
    if isinstance(value, dict):
        return {scrub_text(k, secrets): scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    return value
