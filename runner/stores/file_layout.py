"""The file store's run folder: its file names, their modes and the formats of what they hold.

Layout of a run folder (mode :data:`DIR_MODE`, 0700; every file :data:`FILE_MODE`, 0600)::

    run.json             identity: task id, plan, creation time. Written once;
                         the state at revision 0 is derived from it.
    snapshot.json        the envelope at some revision S, with its digest
    journal.jsonl        one line per transition after the snapshot
    journal.prev.jsonl   the transitions that led up to the snapshot
    backup.json          the snapshot before the current one
    head.json            the witness: the last acknowledged revision and its hash
                         (:mod:`runner.stores.file_witness`)
    history/             every earlier journal, one compressed segment per compaction
                         (:mod:`runner.stores.file_history`)
    quarantine/          damaged files, moved aside, never deleted

The run folder itself is the ``flock(2)`` target: there is no lock file that
someone could remove as "stale" while a writer holds it. (A ``lock`` file
left by an older version is ignored.)

A journal line is one hash-chained record (:func:`runner.stores.codec.decode_record`).
A snapshot file is the envelope's canonical JSON framed with its SHA-256
(:func:`encode_snapshot`); both the reader (:mod:`runner.stores.file_scan`)
and the writer (:mod:`runner.stores.file_writer`) use the codec here.
"""

import re
from typing import Any, Dict

from ..ledger.envelope import validate_envelope
from ..base.canonical import canonical_json, loads_trusted, sha256_hex
from ..base.fs import DIR_MODE, FILE_MODE

__all__ = ["IDENTITY", "SNAPSHOT", "BACKUP", "JOURNAL", "PREV_JOURNAL", "HEAD", "LOCK", "HOOKS", "HISTORY",
           "QUARANTINE", "DISPLACED", "TMP_SUFFIX",
           "STATE_FILES", "RUN_FILES", "HEAD_SIZE", "SNAPSHOT_FORMAT", "FILE_MODE", "DIR_MODE", "encode_snapshot",
           "decode_snapshot"]

IDENTITY = "run.json"
SNAPSHOT = "snapshot.json"
BACKUP = "backup.json"
JOURNAL = "journal.jsonl"
PREV_JOURNAL = "journal.prev.jsonl"
HEAD = "head.json"
LOCK = "lock"  # the lock file of older versions: allowed in a folder, never used
HOOKS = "hooks.json"  # the counters of the harness's hooks: neither state nor damage
HISTORY = "history"
QUARANTINE = "quarantine"
DISPLACED = "quarantine.displaced"  # whatever held the name quarantine/ without being a folder
TMP_SUFFIX = ".tmp"

#: Files that hold run state.
STATE_FILES = (IDENTITY, SNAPSHOT, BACKUP, PREV_JOURNAL, JOURNAL)

#: Files a quarantine moves: the state and its witness.
RUN_FILES = STATE_FILES + (HEAD,)

#: The fixed size of ``head.json``, so each overwrite replaces the whole record in place.
HEAD_SIZE = 192

SNAPSHOT_FORMAT = "runner-snapshot/1"

_SNAPSHOT_HEAD = re.compile(rb'\{"digest":"([0-9a-f]{64})","format":"runner-snapshot/1","state":')


def encode_snapshot(state: Dict[str, Any]) -> bytes:
    """The bytes of ``snapshot.json`` holding ``state``: its canonical JSON, framed with its digest."""
    body = canonical_json(state)
    return (b'{"digest":"' + sha256_hex(body).encode() + b'","format":"' + SNAPSHOT_FORMAT.encode() + b'","state":'
            + body + b"}\n")


def decode_snapshot(data: bytes) -> Dict[str, Any]:
    """The envelope a snapshot file holds.

    :raises ValueError: the framing, the digest or the JSON is wrong.
    :raises SchemaMismatch: the envelope is of another schema version.
    """
    match = _SNAPSHOT_HEAD.match(data)
    if not match or not data.endswith(b"}\n"):
        raise ValueError("not a snapshot file (bad framing)")
    body = data[match.end() : -2]
    if sha256_hex(body) != match.group(1).decode():
        raise ValueError("snapshot digest does not match its content")
    try:
        state = loads_trusted(body)
    except ValueError as exc:
        raise ValueError(f"snapshot content is not valid JSON: {exc}") from None
    return validate_envelope(state)
