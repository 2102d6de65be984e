"""The file store: one run in one folder, an append-only journal with a snapshot, a backup and a head witness.

This module is where other code takes the file store from; it is written
in five modules, one concern each:

* :mod:`runner.stores.file_layout`: the run folder's file names, their modes
  and the formats of what they hold;
* :mod:`runner.stores.file_witness`: ``head.json``, which says how far the run
  was acknowledged, and when a load believes it;
* :mod:`runner.stores.file_history`: the history folder, where compaction
  keeps every journal it rotates out, and how it is read back and bounded;
* :mod:`runner.stores.file_scan`: reading a run folder without changing it
  (:func:`scan`, and :func:`check` for ``doctor``);
* :mod:`runner.stores.file_writer`: :class:`RunStore`, which changes a run:
  transitions, compaction, repair and quarantine.
"""

from .base import CommitThenRaise, Finding
from .file_layout import HEAD, HEAD_SIZE, IDENTITY, JOURNAL, RUN_FILES, STATE_FILES
from .file_scan import Scan, check, scan
from .file_witness import decode_head, encode_head
from .file_writer import DURABILITY_MODES, RunStore

__all__ = ["RunStore", "Scan", "Finding", "scan", "check", "CommitThenRaise", "DURABILITY_MODES", "STATE_FILES",
           "RUN_FILES", "IDENTITY", "JOURNAL", "HEAD", "HEAD_SIZE", "encode_head", "decode_head"]
