"""Error classes of the runner, one per exit code of the command line.

Every verb, now and later, exits with the same code for the same outcome:

====  =======================  ==================================================
code  reason                   meaning
====  =======================  ==================================================
0     (none)                   ok
2     invalid-input            usage error or invalid input; nothing was changed
3     already-running          another live owner holds the run's lease
4     awaiting-approval        a gated action has no matching, current grant
5     cancelled                the run was cancelled; no new work may begin
6     limit-exhausted          an attempt, time, cost, step or progress limit ran out
7     state-unrecoverable      durable state is damaged beyond exact recovery
8     needs-reconciliation     an effect's outcome is unknown and must be observed
9     fenced                   the writer's epoch is stale or its lease was lost
10    complete                 the run is complete; there is nothing left to do
====  =======================  ==================================================

The library raises these; the command line maps each to its code and prints
its message as one line on stderr, never a traceback.
"""

from typing import Any, Dict

__all__ = [
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
    "EXIT_OK",
    "EXIT_CODES",
]

EXIT_OK = 0


class RunnerError(Exception):
    """Base of every expected failure; ``exit_code`` and ``reason`` are fixed per class."""

    exit_code = 1
    reason = "error"

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        #: Machine-readable facts about the failure (paths, keys, revisions).
        self.context: Dict[str, Any] = context

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"error": self.reason, "exit_code": self.exit_code, "message": self.message}
        if self.context:
            out["context"] = self.context
        return out


class InvalidInput(RunnerError):
    """Usage error, malformed input, or a request the run's rules forbid."""

    exit_code = 2
    reason = "invalid-input"


class AlreadyRunning(RunnerError):
    """Another owner holds an unexpired lease on the run."""

    exit_code = 3
    reason = "already-running"


class AwaitingApproval(RunnerError):
    """A gated step or effect has no grant that matches every scope field."""

    exit_code = 4
    reason = "awaiting-approval"


class Cancelled(RunnerError):
    """The run carries a cancellation; no new step or effect may begin."""

    exit_code = 5
    reason = "cancelled"


class LimitExhausted(RunnerError):
    """A persisted attempt, elapsed-time, cost, step or no-progress limit is spent."""

    exit_code = 6
    reason = "limit-exhausted"


class StateUnrecoverable(RunnerError):
    """Durable state is damaged (and quarantined) or of a schema this runner cannot read."""

    exit_code = 7
    reason = "state-unrecoverable"


class NeedsReconciliation(RunnerError):
    """An effect's outcome is unknown; it must be observed before anything is retried."""

    exit_code = 8
    reason = "needs-reconciliation"


class Fenced(RunnerError):
    """The writer's fencing epoch is older than the run's, or its lease has expired."""

    exit_code = 9
    reason = "fenced"


class RunComplete(RunnerError):
    """The run is complete; a further step or effect is refused."""

    exit_code = 10
    reason = "complete"


#: reason -> exit code, for documentation and for ``next --json``.
EXIT_CODES: Dict[str, int] = {
    cls.reason: cls.exit_code
    for cls in (
        InvalidInput,
        AlreadyRunning,
        AwaitingApproval,
        Cancelled,
        LimitExhausted,
        StateUnrecoverable,
        NeedsReconciliation,
        Fenced,
        RunComplete,
    )
}
