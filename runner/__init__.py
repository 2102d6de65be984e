"""Reference runner for long-running agent sessions: durable, resumable, fenced.

Standard library only. The command line (``python3 -m runner``) is a thin layer
over this package; a Python harness can use the same API directly.
"""

from .envelope import SCHEMA_VERSION, canonical_json, content_digest
from .errors import (
    EXIT_CODES,
    AlreadyRunning,
    AlreadyVerified,
    Failed,
    ProofFailed,
    RetryLater,
    AwaitingApproval,
    Cancelled,
    Fenced,
    InvalidInput,
    LimitExhausted,
    NeedsReconciliation,
    RunComplete,
    RunnerError,
    StateUnrecoverable,
)
from .target import Adapter, NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome
from .fs import FileSystem, OsFileSystem
from .recovery import decide, recover
from .run import Run, submit_job
from .stores import create_store, open_store
from .stores.file import RunStore, scan

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "canonical_json",
    "content_digest",
    "EXIT_CODES",
    "RunnerError",
    "InvalidInput",
    "AlreadyRunning",
    "AwaitingApproval",
    "Cancelled",
    "LimitExhausted",
    "StateUnrecoverable",
    "NeedsReconciliation",
    "Fenced",
    "RunComplete",
    "RetryLater",
    "Failed",
    "ProofFailed",
    "AlreadyVerified",
    "FileSystem",
    "OsFileSystem",
    "RunStore",
    "scan",
    "create_store",
    "open_store",
    "Run",
    "submit_job",
    "recover",
    "decide",
    "Adapter",
    "Observation",
    "UnknownOutcome",
    "NotApplied",
    "Rejected",
    "StaleEpoch",
]
