"""A file artifact as an external effect: content written once, under the key's name, atomically.

The effect for key ``K`` and payload ``{"content": TEXT, "digest": "sha256:..."}``
is "``ROOT/K`` holds exactly TEXT". ``digest`` is optional; when given it
must be the SHA-256 of the UTF-8 content and is checked before anything is
written.

How ``invoke`` makes it happen, so that a crash at any point leaves either
the old state or the whole new file, never a part of one::

    ROOT/K.<digest>.tmp  written, fsync'd, read back and hashed
    os.replace(tmp, ROOT/K)          the one atomic switch
    fsync(ROOT)                      the new name itself is durable

Invariants:

* ``ROOT/K`` is only ever replaced by a file whose hash was verified after
  its fsync; a partly written file never carries the final name.
* Writing the same content again is the same effect: when ``ROOT/K``
  already holds the payload's digest, ``invoke`` writes nothing and returns
  the same receipt (``deduplicates = True``).
* A key whose file holds other content is refused (:class:`Rejected`);
  the artifact is never overwritten with another payload.
* ``observe`` only reads: ``present`` when the file's hash is the payload's
  digest, ``absent`` when there is no file (or it holds other content),
  ``unknown`` when the file cannot be read.
* Failures before the rename raise :class:`NotApplied` (the final name was
  not touched); a failure of the rename or of the folder fsync raises
  :class:`UnknownOutcome`, and observation settles it.

A plain file system knows nothing of fencing epochs, so this adapter does
not enforce them (``enforces_fencing = False``); the run store's lease is
what stops a stale writer here.
"""

import errno
import os
from typing import Any, Dict, Optional, Tuple

from ..calls.target import NotApplied, Observation, Rejected, UnknownOutcome
from ..base.values import validate_id
from ..base.canonical import sha256_hex
from ..base.errors import InvalidInput
from ..base.fs import OsFileSystem

__all__ = ["ArtifactAdapter", "payload_for"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FILE_MODE = 0o644


def payload_for(content: str) -> Dict[str, Any]:
    """A payload for ``content`` with its digest filled in."""
    return {"content": content, "digest": "sha256:" + sha256_hex(content.encode("utf-8"))}


#: Reads and folder fsyncs go through the store's seam: symlinks refused, F_FULLFSYNC on macOS.
_FS = OsFileSystem()


class ArtifactAdapter:
    """Files under ``root``, one per effect key (see the module docstring for the contract)."""

    name = "file-artifact"
    key_scope = "one artifact folder: the key is the file's name in it"
    retention_seconds: Optional[float] = None  # a file stays until someone removes it
    conflicting_payload = "refused: the key's file already holds other content and is never overwritten"
    verification = "read ROOT/KEY and compare its sha256 with the payload's digest"
    deduplicates = True
    enforces_fencing = False

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        if not os.path.isdir(self.root):
            raise InvalidInput(f"artifact folder {self.root} does not exist")

    # -- helpers ----------------------------------------------------------------------
    def _target(self, key: str) -> str:
        validate_id(key, "artifact key")  # no separators, no leading dot: always a plain name in root
        return os.path.join(self.root, key)

    @staticmethod
    def _content(payload: Dict[str, Any]) -> Tuple[bytes, str]:
        """The bytes to write and their ``sha256:`` digest; a digest that disagrees is refused."""
        content = payload.get("content")
        if not isinstance(content, str):
            raise Rejected("the payload needs a 'content' string")
        data = content.encode("utf-8")
        digest = "sha256:" + sha256_hex(data)
        declared = payload.get("digest")
        if declared is not None and declared != digest:
            raise Rejected(f"the payload's digest {declared} is not the digest of its content ({digest})")
        return data, digest

    def _receipt(self, key: str, digest: str, size: int) -> Dict[str, Any]:
        return {"path": self._target(key), "digest": digest, "size": size}

    # -- the contract ---------------------------------------------------------------------
    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        target = self._target(key)
        data, digest = self._content(payload)
        try:
            existing: Optional[bytes] = _FS.read(target)
        except FileNotFoundError:
            existing = None
        except OSError as exc:
            raise NotApplied(f"cannot read {target} before writing it: {exc}") from None
        if existing is not None:
            found = "sha256:" + sha256_hex(existing)
            if found == digest:
                # An earlier invoke may have died between its rename and its folder fsync.
                try:
                    _FS.fsync_dir(self.root)
                except OSError as exc:
                    raise UnknownOutcome(f"{target} holds the content but the folder fsync failed: {exc}") from None
                return self._receipt(key, digest, len(existing))
            raise Rejected(f"{target} already holds other content ({found})")
        tmp = f"{target}.{digest[7:23]}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | _CLOEXEC, _FILE_MODE)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            # Read back what the disk holds: a temp file that does not hash right never gets the name.
            written = _FS.read(tmp)
        except OSError as exc:
            _discard(tmp)
            raise NotApplied(f"writing {tmp} failed; {target} was not touched: {exc}") from None
        if "sha256:" + sha256_hex(written) != digest:
            _discard(tmp)
            raise NotApplied(f"{tmp} did not read back with digest {digest}; {target} was not touched")
        try:
            os.replace(tmp, target)
        except OSError as exc:
            raise UnknownOutcome(f"renaming {tmp} to {target} failed: {exc}") from None
        try:
            _FS.fsync_dir(self.root)
        except OSError as exc:
            raise UnknownOutcome(f"{target} was renamed but the folder fsync failed: {exc}") from None
        return self._receipt(key, digest, len(data))

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        target = self._target(key)
        try:
            _, digest = self._content(payload)
        except Rejected as exc:
            return Observation("unknown", {"path": target, "reason": str(exc)})
        try:
            data = _FS.read(target)
        except FileNotFoundError:
            return Observation("absent", {"path": target, "exists": False})
        except OSError as exc:
            reason = "a symbolic link is in the target's place" if exc.errno == errno.ELOOP else str(exc)
            return Observation("unknown", {"path": target, "error": reason})
        found = "sha256:" + sha256_hex(data)
        if found != digest:
            return Observation("absent",
                               {"path": target, "exists": True, "found_digest": found, "expected_digest": digest})
        return Observation("present", {"path": target, "digest": digest, "size": len(data)})


def _discard(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
