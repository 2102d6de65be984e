"""The words of an effect's lifecycle in the ledger: every state an effect may be in, and those whose outcome at the
target is not known yet."""

from typing import Literal, Tuple, get_args

__all__ = ["EffectState", "EFFECT_STATES", "UNRESOLVED"]

#: An effect's state in the ledger, as a type: one of these words (the state envelope's schema lists the same).
EffectState = Literal["planned", "started", "acknowledged", "verified", "uncertain", "absent", "failed"]

#: Every state an effect may be in, in the order of :data:`EffectState`.
EFFECT_STATES: Tuple[EffectState, ...] = get_args(EffectState)

#: Ledger states of an effect whose outcome at the target is not known.
UNRESOLVED: Tuple[EffectState, ...] = ("started", "acknowledged", "uncertain")
