"""Reference runner for long-running agent sessions: durable, resumable, fenced.

Standard library only. The command line (``python3 -m runner``) and the MCP
server are thin layers over :mod:`runner.verbs`; a Python harness can use the
same API directly. What is exported here is what a harness needs: a
:class:`Run` opened on a store, the decisions (:func:`decide`,
:func:`recover`), the adapter protocol a target implements, and one error
class per exit code. The store backends, their file layouts and the proof
tools are reached by their own modules.
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
from . import verbs
from .stores import create_store, open_store

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
    "create_store",
    "open_store",
    "Run",
    "submit_job",
    "verbs",
    "recover",
    "decide",
    "Adapter",
    "Observation",
    "UnknownOutcome",
    "NotApplied",
    "Rejected",
    "StaleEpoch",
]
