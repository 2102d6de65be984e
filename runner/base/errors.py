"""Error classes of the runner, one per exit code of the command line.

Every verb, now and later, exits with the same code for the same outcome.
:data:`EXIT_TABLE` is the one list of codes, reasons and meanings: the
command line's ``--help`` is generated from it, and a test holds README.md and
SKILL.md to it. The library raises these; the command line maps each to its
code and prints its message as one line on stderr, never a traceback.
"""

from typing import Any, Dict, NamedTuple, Tuple

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
    "RetryLater",
    "Failed",
    "ProofFailed",
    "AlreadyVerified",
    "Stopped",
    "ExitCode",
    "EXIT_OK",
    "EXIT_TABLE",
    "EXIT_CODES",
]

EXIT_OK = 0


class RunnerError(Exception):
    """Base of every expected failure; ``exit_code`` and ``reason`` are fixed per class."""

    exit_code = 1
    reason = "error"
    meaning = "the runner itself failed (an error it could not classify, e.g. an I/O error)"

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
    meaning = "the command must be fixed (usage, input, or a request the rules forbid); nothing changed"


class AlreadyRunning(RunnerError):
    """Another owner holds an unexpired lease on the run."""

    exit_code = 3
    reason = "already-running"
    meaning = "another live owner holds the run's lease"


class AwaitingApproval(RunnerError):
    """A gated step or effect has no grant that matches every scope field."""

    exit_code = 4
    reason = "awaiting-approval"
    meaning = "a gated action has no matching, current grant"


class Cancelled(RunnerError):
    """The run carries a cancellation; no new step or effect may begin."""

    exit_code = 5
    reason = "cancelled"
    meaning = "the run was cancelled; no new step or effect may begin"


class LimitExhausted(RunnerError):
    """A persisted attempt, elapsed-time, cost, step or no-progress limit is spent."""

    exit_code = 6
    reason = "limit-exhausted"
    meaning = "an attempt, time, cost, step or progress limit ran out"


class StateUnrecoverable(RunnerError):
    """Durable state is damaged (and quarantined) or of a schema this runner cannot read."""

    exit_code = 7
    reason = "state-unrecoverable"
    meaning = "durable state is damaged (and quarantined) or unreadable"


class NeedsReconciliation(RunnerError):
    """An effect's outcome is unknown; it must be observed before anything is retried."""

    exit_code = 8
    reason = "needs-reconciliation"
    meaning = "an effect's outcome is unknown and must be observed"


class Fenced(RunnerError):
    """The writer's fencing epoch is older than the run's, or its lease has expired."""

    exit_code = 9
    reason = "fenced"
    meaning = "the writer's epoch is stale or its lease was lost"


class RunComplete(RunnerError):
    """The run is complete; a further step or effect is refused."""

    exit_code = 10
    reason = "complete"
    meaning = "the run is complete; there is nothing left to do"


class RetryLater(RunnerError):
    """A persisted backoff or wait has not ended; ``retry_at`` and ``wait_seconds`` say when it does."""

    exit_code = 11
    reason = "retry-later"
    meaning = "a persisted backoff or wait has not ended; try again at retry_at"

    def __init__(self, message: str, retry_at: str, wait_seconds: float, **context: Any) -> None:
        super().__init__(message, retry_at=retry_at, wait_seconds=round(max(0.0, wait_seconds), 3), **context)


class Failed(RunnerError):
    """An effect or step is finished as failed, or the target refused it for good.

    The context names which: ``effect`` (its key) or ``step`` (its id).
    """

    exit_code = 12
    reason = "failed"
    meaning = "the named effect or step failed for good, or the target refused it"


class ProofFailed(RunnerError):
    """A proof (demo, campaign, simulate, crashcheck, conformance, bench) found a violation."""

    exit_code = 13
    reason = "proof-failed"
    meaning = "a proof (demo, campaign, simulate, crashcheck, conformance, bench) found a violation"


class AlreadyVerified(RunnerError):
    """``effect begin`` on an effect already observed at its target: it is done; do not call again."""

    exit_code = 14
    reason = "already-verified"
    meaning = "the effect is already verified: it is done; do not call the target again"


class Stopped(RunnerError):
    """The runner was asked to stop (SIGTERM, SIGINT): no new call began, the calls in flight were recorded."""

    exit_code = 15
    reason = "stopped"
    meaning = ("the runner was asked to stop: calls in flight were recorded and the lease released; "
               "run it again to go on")


class ExitCode(NamedTuple):
    """One row of the exit table."""

    code: int
    reason: str
    meaning: str


#: Every exit code, in order: the single source for ``--help``, README.md and SKILL.md.
EXIT_TABLE: Tuple[ExitCode, ...] = (ExitCode(EXIT_OK, "ok", "the verb did what it was asked"),) + tuple(
    ExitCode(cls.exit_code, cls.reason, cls.meaning)
    for cls in (
        RunnerError,
        InvalidInput,
        AlreadyRunning,
        AwaitingApproval,
        Cancelled,
        LimitExhausted,
        StateUnrecoverable,
        NeedsReconciliation,
        Fenced,
        RunComplete,
        RetryLater,
        Failed,
        ProofFailed,
        AlreadyVerified,
        Stopped,
    )
)

#: reason -> exit code, for documentation and for ``next --json``.
EXIT_CODES: Dict[str, int] = {row.reason: row.code for row in EXIT_TABLE}
