"""The words of an effect's lifecycle in the ledger: every state an effect may be in, and those whose outcome at the
target is not known yet."""

__all__ = ["EFFECT_STATES", "UNRESOLVED"]

EFFECT_STATES = ("planned", "started", "acknowledged", "verified", "uncertain", "absent", "failed")

#: Ledger states of an effect whose outcome at the target is not known.
UNRESOLVED = ("started", "acknowledged", "uncertain")
