"""The records other modules read from a run's state, as types: what each holds and which keys it may lack.

Types only: the records stay plain dicts (canonical JSON in the journal, a
``dict`` after a load), and these names say what a signature takes or gives.
Python 3.9 has no ``NotRequired``, so each record's optional keys are a
``total=False`` subclass of a base that holds the keys it always has.
``references/state-envelope.md`` documents every field.
"""

from typing import Any, Dict, List, Optional, TypedDict

from .states import EffectState

__all__ = ["EffectRecord", "Lease"]


class _EffectBase(TypedDict):
    state: EffectState
    payload_digest: str
    attempts: int
    step: Optional[str]
    started_at: str
    updated_at: str
    receipt: Optional[Dict[str, Any]]
    evidence: Optional[Dict[str, Any]]
    reason: Optional[str]
    next_attempt_at: Optional[str]


class EffectRecord(_EffectBase, total=False):
    """One effect of the ledger (``state["effects"][key]``)."""

    deferred: int
    resent: bool
    payload: Dict[str, Any]
    payload_file: str
    flags: List[str]
    begun_by: Dict[str, Any]
    reserved: Dict[str, float]  # what its call in flight or unsettled holds of each named cost
    cost: Dict[str, float]  # what its calls cost, read from their answers (or estimated: cost_estimated)
    cost_estimated: List[str]
    reopened: List[Dict[str, Any]]


class _LeaseBase(TypedDict):
    owner: Optional[str]
    epoch: int
    expires_at: Optional[str]
    acquired_at: Optional[str]


class Lease(_LeaseBase, total=False):
    """The run's lease (``state["lease"]``): its holder, fencing epoch and expiry; ``ttl_seconds`` once taken."""

    ttl_seconds: float

