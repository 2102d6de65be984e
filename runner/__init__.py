"""Reference runner for long-running agent sessions: durable, resumable, fenced.

Standard library only. The command line (``python3 -m runner``) and the MCP
server are thin layers over :mod:`runner.surfaces.verbs`; a Python harness can use the
same API directly. What is exported here is what a harness needs: a
:class:`Run` opened on a store, the decisions (:func:`decide`,
:func:`recover`), the adapter protocol a target implements, and one error
class per exit code. The store backends, their file layouts and the proof
tools are reached by their own modules.
"""

import importlib
from typing import Any

from .base.lazy import lazy_exports

#: Where each exported name lives. A name is imported on first use (PEP 562), so a process that needs one
#: module of the runner (a job's launcher, a hook, a worker) does not pay for importing all of them.
_HOMES = {
    **dict.fromkeys(("SCHEMA_VERSION",), "ledger.envelope"),
    **dict.fromkeys(("canonical_json", "content_digest"), "base.canonical"),
    **dict.fromkeys(("EXIT_CODES", "RunnerError", "InvalidInput", "AlreadyRunning", "AwaitingApproval", "Cancelled",
                     "LimitExhausted", "StateUnrecoverable", "NeedsReconciliation", "Fenced", "RunComplete",
                     "RetryLater", "Failed", "ProofFailed", "AlreadyVerified"), "base.errors"),
    **dict.fromkeys(("Adapter", "Observation", "UnknownOutcome", "NotApplied", "Rejected", "StaleEpoch"),
                    "calls.target"),
    **dict.fromkeys(("FileSystem", "OsFileSystem"), "base.fs"),
    **dict.fromkeys(("decide", "recover"), "execution.recovery"),
    **dict.fromkeys(("Run", "submit_job"), "execution.run"),
    **dict.fromkeys(("create_store", "open_store"), "stores"),
}


_exported = lazy_exports(__name__, _HOMES)


def __getattr__(name: str) -> Any:
    if name == "verbs":
        return importlib.import_module(".surfaces.verbs", __name__)
    return _exported(name)


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
