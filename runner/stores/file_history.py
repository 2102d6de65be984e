"""A file store run's history folder: the journal segments compaction rotates out, compressed and chained.

Compaction moves the journal to ``journal.prev.jsonl`` and so replaces the
previous one; before it does, the previous journal is copied into
``history/`` (mode 0700, beside the journals) as one *segment*::

    history/000000000001-000000000317.jsonl.gz
    history/000000000318-000000000602.jsonl.gz

A segment holds the previous journal's bytes as compaction found them
(whole lines, each a hash-chained journal record) compressed with gzip
through :mod:`zlib`; its name gives the revisions of its first and last
record. Because every record carries the hash of the one before, the
segments chain to one another, the first to ``run.json`` (revision 1
continues the identity's digest), the last to the previous journal, and
through the journals to the snapshot's head. A segment that is missing,
cut or altered breaks that chain where it lay: :func:`walk` reports it as
damage (``history-missing``, ``history-altered``) and never reads past it
as if nothing were there.

A run made by a runner that kept no history folder says nothing of it in
its identity; records compacted away before its first segment are then a
note (``history-before``), not damage. A run that keeps one says so in
``run.json`` (:data:`runner.stores.codec.HISTORY_KEPT`).

The contract's ``history`` section may bound the folder (``keep_seconds``:
segments whose last record is older; ``keep_bytes``: the oldest segments
beyond that size). A drop is first recorded in the envelope, in the
journal record of a transition (``observations.history.dropped``: see
:func:`dropped_record`), and only then are the segments deleted, so the
envelope always covers what is gone: the range, the hash of the last
record dropped (from which the history that is kept continues), the counts,
and the lease, status, step and counters at its end.
"""

import os
import re
import zlib
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..base.fs import FileSystem
from ..ledger.envelope import apply_leniently
from .base import Finding
from .codec import decode_record

__all__ = ["SUFFIX", "Segment", "segment_name", "parse_name", "compress", "decompress", "list_segments", "read_segment",
           "dropped_of", "retention_of", "due_for_drop", "dropped_record", "walk", "Walk"]

#: How a segment's name ends.
SUFFIX = ".jsonl.gz"

_NAME = re.compile(r"([0-9]{12})-([0-9]{12})" + re.escape(SUFFIX) + r"\Z")
_GZIP = 31  # zlib's window bits for the gzip container: what `gzip -d` and `zcat` read

Record = Tuple[str, Dict[str, Any]]


class Segment(NamedTuple):
    """One file of the history folder, by the revisions its name gives."""

    first: int
    last: int
    name: str


def segment_name(first: int, last: int) -> str:
    """The name of the segment that holds revisions ``first`` to ``last``."""
    return f"{first:012d}-{last:012d}{SUFFIX}"


def parse_name(name: str) -> Optional[Tuple[int, int]]:
    """``(first, last)`` of a segment's name; None for any other name."""
    match = _NAME.match(name)
    if not match:
        return None
    first, last = int(match.group(1)), int(match.group(2))
    return (first, last) if 1 <= first <= last else None


def compress(data: bytes) -> bytes:
    """``data`` in the gzip container (the standard library's zlib, level 6)."""
    packer = zlib.compressobj(6, zlib.DEFLATED, _GZIP)
    return packer.compress(data) + packer.flush()


def decompress(data: bytes) -> bytes:
    """What :func:`compress` was given. :raises ValueError: the bytes are not one whole gzip stream."""
    unpacker = zlib.decompressobj(_GZIP)
    try:
        out = unpacker.decompress(data) + unpacker.flush()
    except zlib.error as exc:
        raise ValueError(f"not a whole gzip stream: {exc}") from None
    if not unpacker.eof or unpacker.unused_data:
        raise ValueError("not a whole gzip stream: it is cut short or followed by other bytes")
    return out


def list_segments(fs: FileSystem, folder: str) -> Tuple[List[Segment], List[str]]:
    """The segments in ``folder`` in revision order, and the other names there (sorted); both empty without it."""
    if not fs.exists(folder):
        return [], []
    segments, others = [], []
    for name in fs.listdir(folder):
        found = parse_name(name)
        if found is None:
            others.append(name)
        else:
            segments.append(Segment(found[0], found[1], name))
    return sorted(segments), sorted(others)


def read_segment(fs: FileSystem, folder: str, segment: Segment) -> Tuple[List[Record], int]:
    """The records of ``segment`` and its size in bytes.

    :raises ValueError: it cannot be read, is not whole, holds a record whose
        hash does not match, does not continue itself, or holds other
        revisions than its name says.
    """
    try:
        data = fs.read(os.path.join(folder, segment.name))
    except OSError as exc:
        raise ValueError(f"it cannot be read: {exc.strerror or exc}") from None
    lines = decompress(data).split(b"\n")
    if lines[-1]:
        raise ValueError("its last line is not whole")
    records = []
    for number, line in enumerate(lines[:-1], 1):
        try:
            records.append(decode_record(line))
        except ValueError as exc:
            raise ValueError(f"it is damaged at line {number}: {exc}") from None
    if not records or records[0][1]["rev"] != segment.first or records[-1][1]["rev"] != segment.last:
        held = f"{records[0][1]['rev']} to {records[-1][1]['rev']}" if records else "none"
        raise ValueError(f"it holds revisions {held}, not the {segment.first} to {segment.last} its name gives")
    for (digest, before), (_, after) in zip(records, records[1:]):
        if after["rev"] != before["rev"] + 1 or after["prev"] != digest:
            raise ValueError(f"its revision {after['rev']} does not continue revision {before['rev']}")
    return records, len(data)


# -- retention -----------------------------------------------------------------------------

def dropped_of(state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """What the run's retention dropped, as its envelope records it (``observations.history.dropped``), or None."""
    history = state["observations"].get("history")
    dropped = history.get("dropped") if isinstance(history, dict) else None
    return dropped if isinstance(dropped, dict) and isinstance(dropped.get("through"), int) else None


def retention_of(plan: Dict[str, Any]) -> Tuple[Optional[float], Optional[int]]:
    """``(keep_seconds, keep_bytes)`` of the contract's ``history`` section; None where it sets no bound."""
    section = plan.get("history") if isinstance(plan, dict) else None
    if not isinstance(section, dict):
        return None, None
    seconds, size = section.get("keep_seconds"), section.get("keep_bytes")
    return (float(seconds) if isinstance(seconds, (int, float)) else None,
            int(size) if isinstance(size, (int, float)) else None)


def due_for_drop(total: int, last_at: float, keep_seconds: Optional[float], keep_bytes: Optional[int],
                 now: float) -> bool:
    """Whether the oldest segment kept goes: the kept ones weigh ``total`` bytes; its last record is from ``last_at``.

    ``keep_bytes`` drops the oldest while the segments kept are larger;
    ``keep_seconds`` drops those whose last record is older. The caller
    never asks of the newest segment, which always stays: the history that
    is kept must still reach the previous journal.
    """
    too_big = keep_bytes is not None and total > keep_bytes
    return too_big or (keep_seconds is not None and last_at < now - keep_seconds)


_BOUNDARY_KEYS = ("lease", "counters", "status", "current_step")


def _lenient(shadow: Dict[str, Any], ops: Sequence[Any]) -> None:
    """Apply the operations on the lease, the counters, the status and the current step; a missing parent is made."""
    apply_leniently(shadow, ops, only=_BOUNDARY_KEYS)


def dropped_record(before: Optional[Dict[str, Any]], genesis: Dict[str, Any],
                   segments: Sequence[Tuple[Segment, List[Record], int]], policy: Dict[str, Any],
                   at: str) -> Dict[str, Any]:
    """The envelope's record of a drop: ``before`` (the last drop, or None) extended by ``segments`` (oldest first).

    ``genesis`` is the run at revision 0, whose lease, counters, status and
    step the first drop continues. Its fields: ``first`` and ``through``
    (the revisions dropped), ``head`` (the hash of record ``through``, which
    the kept history continues), ``records``, ``segments`` and ``bytes``
    (counts), ``first_at`` and ``last_at`` (the times of the first and last
    record dropped), ``lease``, ``counters``, ``status`` and
    ``current_step`` (as they stood after record ``through``), ``policy``
    (the contract's bounds) and ``at`` (when it was dropped).
    """
    shadow: Dict[str, Any] = {key: (before or genesis).get(key) for key in _BOUNDARY_KEYS}
    shadow = {key: dict(value) if isinstance(value, dict) else value for key, value in shadow.items()}
    records = int((before or {}).get("records", 0))
    first = (before or {}).get("first")
    first_at = (before or {}).get("first_at")
    head, through, last_at = (before or {}).get("head"), (before or {}).get("through", 0), (before or {}).get("last_at")
    size = int((before or {}).get("bytes", 0))
    for _segment, held, nbytes in segments:
        for digest, body in held:
            _lenient(shadow, body.get("ops") or [])
            head, through, last_at = digest, body["rev"], body["at"]
            first = first if first is not None else body["rev"]
            first_at = first_at if first_at is not None else body["at"]
            records += 1
        size += nbytes
    return {"first": first, "through": through, "head": head, "records": records,
            "segments": int((before or {}).get("segments", 0)) + len(segments), "bytes": size, "first_at": first_at,
            "last_at": last_at, **shadow, "policy": policy, "at": at}


# -- reading the chain -----------------------------------------------------------------------

class Walk(NamedTuple):
    """The history read back: its records in revision order, and what breaks its chain."""

    records: List[Record]
    findings: List[Finding]
    #: The lowest revision held; the revision after ``through`` of a drop, or 1, when the history is whole.
    oldest: int
    #: Bytes of the segments read.
    bytes: int


def walk(fs: FileSystem, folder: str, tail: Sequence[Record], genesis_head: str, kept: bool,
         dropped: Optional[Dict[str, Any]], after: int = 0) -> Walk:
    """Read the history that follows ``after``: the segments of ``folder``, then ``tail`` (the journals' records).

    From its start (the end of a drop, else the identity's digest before
    revision 1) each part must continue the one before, record by record
    and hash by hash. Where one does not, the records that are missing or
    do not chain are a finding (``damage``, unless the run keeps no history
    folder and the gap lies before its first segment, which is a ``note``),
    and the reading goes on from what follows. A segment and the previous
    journal may hold the same records (a compaction stopped between copying
    the one and rotating the other): they are read once, and must agree.

    :param kept: the run's identity says it keeps its history.
    :param after: read only what follows this revision; the link into the
        first part read is then not checked.
    """
    findings: List[Finding] = []
    through = int(dropped["through"]) if dropped else 0
    head: Optional[str] = str(dropped["head"]) if dropped else genesis_head
    start = max(after, through)
    if start > through:
        head = None  # the record before the first one read is not read: its link is not checked
    last = start
    records: List[Record] = []
    size = 0
    segments, _others = list_segments(fs, folder) if fs.exists(folder) and not fs.is_symlink(folder) else ([], [])
    if fs.is_symlink(folder):
        findings.append(Finding("damage", "history-symlink", f"{folder} is a symbolic link; refusing to follow it"))
    parts: List[Tuple[str, List[Record]]] = []
    for segment in segments:
        if segment.last <= start:
            continue
        try:
            held, nbytes = read_segment(fs, folder, segment)
        except ValueError as exc:
            findings.append(Finding("damage", "history-altered", f"history segment {segment.name}: {exc}"))
            continue
        size += nbytes
        parts.append((f"history segment {segment.name}", held))
    parts.append(("the journal files", [r for r in tail if r[1]["rev"] > start]))
    seen: Dict[int, str] = {}
    for label, held in parts:
        for digest, body in held:
            rev = body["rev"]
            if rev <= last:
                if rev in seen and seen[rev] != digest:
                    said = f"{label} holds revision {rev} with another hash than the history before it"
                    findings.append(Finding("damage", "history-altered", said))
                continue
            if rev > last + 1:
                _missing(findings, last + 1, rev - 1, label, kept or bool(records) or through > 0)
                head = None
            elif head is not None and body["prev"] != head:
                said = f"{label}: revision {rev} does not continue revision {last} of the history before it"
                findings.append(Finding("damage", "history-altered", said))
            records.append((digest, body))
            seen[rev] = digest
            last, head = rev, digest
    # The lowest revision held, read or not: from the names of the segments, else the journals' first record.
    firsts = [max(s.first, through + 1) for s in segments if s.last > through]
    firsts += [r[1]["rev"] for r in tail[:1] if r[1]["rev"] > through]
    oldest = min(firsts) if firsts else last + 1
    return Walk(records, findings, oldest, size)


def _missing(findings: List[Finding], first: int, last: int, before: str, damage: bool) -> None:
    span = f"revision {first}" if first == last else f"revisions {first} to {last}"
    if damage:
        findings.append(Finding("damage", "history-missing", f"the run's history lacks {span}, before {before}"))
    else:
        said = f"{span} were compacted away before the run kept a history folder"
        findings.append(Finding("note", "history-before", said))
