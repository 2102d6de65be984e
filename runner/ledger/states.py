"""The words of the lifecycles in the ledger: every state an effect may be in, those whose outcome at the target is
not known yet, and the states of a request for approval."""

from typing import Literal, Tuple, get_args

__all__ = ["EffectState", "EFFECT_STATES", "UNRESOLVED", "ApprovalState", "APPROVAL_STATES"]

#: An effect's state in the ledger, as a type: one of these words (the state envelope's schema lists the same).
EffectState = Literal["planned", "started", "acknowledged", "verified", "uncertain", "absent", "failed"]

#: Every state an effect may be in, in the order of :data:`EffectState`.
EFFECT_STATES: Tuple[EffectState, ...] = get_args(EffectState)

#: Ledger states of an effect whose outcome at the target is not known.
UNRESOLVED: Tuple[EffectState, ...] = ("started", "acknowledged", "uncertain")

#: A request for approval's state, as a type (the state envelope's schema lists the same): ``superseded`` is a
#: request a newer one of the same step, action and payload replaced.
ApprovalState = Literal["pending", "granted", "denied", "used", "superseded"]

#: Every state a request for approval may be in, in the order of :data:`ApprovalState`.
APPROVAL_STATES: Tuple[ApprovalState, ...] = get_args(ApprovalState)
