"""Leases with fencing: one live owner per run, and stale writers refused.

The lease lives in the envelope (``state["lease"]``: owner, epoch,
expires_at, acquired_at, and ttl_seconds, the time to live of the last
acquire or renewal, from which a holder knows when to renew) and changes only through store transactions, so the
check and the write it guards happen under the same lock.

Semantics:

* ``acquire`` succeeds when there is no holder, the holder released, the
  lease expired, or the caller is the holder; it always takes
  ``epoch + 1``. Re-acquiring under the same owner id therefore fences any
  older process that used that id. A live holder other than the caller gets
  :class:`~runner.base.errors.AlreadyRunning`. Taking the lease from a holder
  that did not release it counts as a recovery, whether the holder's lease
  expired, was broken, or the same owner id takes it again (a restart).
* ``renew`` extends the expiry only while owner and epoch match and the lease
  has not expired; an expired lease is lost even if nobody took it.
* ``release`` clears the holder and keeps the epoch, which only ever grows.
* ``break`` is for a supervisor that has seen the holder's process end: it
  expires the lease now and records who broke it and why, so the next
  worker need not wait out the TTL. Fencing keeps this safe if the holder
  was alive after all.
* :func:`check_fence` is the guard of every fenced write: the writer's owner
  and epoch must equal the lease's, and the lease must be unexpired.

Expiry compares the local wall clock with ``expires_at``. Clocks of the
processes sharing a run must agree to well within the TTL; safety does not
rest on them, since a stale writer is refused by its epoch, not by the time.
"""

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

from .envelope import Ops
from ..base.values import check_duration, one_line, validate_id
from ..base.times import format_time, parse_time
from ..base.errors import AlreadyRunning, Fenced
from ..contract.spec import contract_of
from ..contract.text import MAX_TTL_SECONDS

if TYPE_CHECKING:  # the records are types only: nothing of them is loaded to run
    from .records import Lease

__all__ = ["acquire_ops", "renew_ops", "release_ops", "break_ops", "check_fence", "lease_view", "default_ttl",
           "MAX_TTL_SECONDS", "DEFAULT_TTL_SECONDS"]

#: The lease's time to live when neither the caller nor the contract (``lease.ttl_seconds``) gives one.
DEFAULT_TTL_SECONDS = 300.0


def default_ttl(state: Dict[str, Any], given: Optional[float] = None) -> float:
    """The lease's time to live: ``given``, else the contract's ``lease.ttl_seconds``, else
    :data:`DEFAULT_TTL_SECONDS`."""
    if given:
        return float(given)
    return contract_of(state).lease.ttl_seconds



def _ttl(ttl: float) -> float:
    return check_duration(ttl, "ttl", MAX_TTL_SECONDS)


def _carries_lease(owner: Optional[str], epoch: Optional[int], lease: "Lease", now: float) -> None:
    """Refuse a write that names no owner or no epoch, saying which lease is live and how to take it."""
    if owner is None or epoch is None:
        raise Fenced("this write must carry the lease: pass --owner ID --epoch N (or $RUNNER_OWNER and "
                     f"$RUNNER_EPOCH); {_advice(lease, owner, now)}",
                     owner=lease.get("owner"), epoch=lease.get("epoch"))


def _advice(lease: "Lease", owner: Optional[str], now: float) -> str:
    """Which lease is live, and how ``owner`` comes to write under it, without fencing a holder that still works."""
    epoch: Any  # an int in every lease the runner writes; int() of anything else fails as it would
    holder, epoch, expires = lease.get("owner"), lease.get("epoch"), lease.get("expires_at")
    if holder is None:
        return ("nobody holds the lease: `lease acquire --owner ID` (or `recover --owner ID`) takes it and prints the "
                "epoch")
    if _expired(lease, now):
        return (f"the lease of {holder} at epoch {epoch} expired at {expires}: `lease acquire --owner ID` "
                f"(or `recover --owner ID`) takes it at epoch {int(epoch) + 1}")
    if holder == owner:
        return (f"{holder} holds the live lease at epoch {epoch} until {expires}: if this is that holder, pass --epoch "
                f"{epoch}; an acquire would take a new epoch and fence whatever of {holder} runs under this one")
    return (f"the lease is held by {holder} at epoch {epoch} until {expires}: another owner takes it once it expires, "
            "or at once after a supervisor's `lease break` if that holder is gone")


def _expired(lease: Mapping[str, Any], now: float) -> bool:
    expires = lease.get("expires_at")
    return expires is None or parse_time(expires) <= now


def acquire_ops(state: Dict[str, Any], owner: str, ttl: float, now: float) -> Ops:
    """Take the lease at a higher epoch, or raise :class:`AlreadyRunning`."""
    validate_id(owner, "owner")
    ttl = _ttl(ttl)
    lease = state["lease"]
    holder = lease.get("owner")
    if holder is not None and holder != owner and not _expired(lease, now):
        raise AlreadyRunning(
            f"run {state['task_id']} is held by {holder} (epoch {lease['epoch']}) until {lease['expires_at']}",
            owner=holder,
            epoch=lease["epoch"],
            expires_at=lease["expires_at"],
        )
    taken = {"owner": owner, "epoch": int(lease["epoch"]) + 1, "expires_at": format_time(now + ttl),
             "acquired_at": format_time(now), "ttl_seconds": ttl}
    ops: Ops = [["set", ["lease"], taken]]
    if holder is not None:
        # The previous holder never released: a takeover after a crash or a stall, or a
        # restart under the same owner id (which fences the earlier process). The wait
        # is measured from the run's last durable write.
        counters = state["counters"]
        waited = max(0.0, now - parse_time(state["updated_at"]))
        ops.append(["set", ["counters", "recoveries"], int(counters.get("recoveries", 0)) + 1])
        total = round(float(counters.get("recovery_wait_seconds", 0.0)) + waited, 3)
        ops.append(["set", ["counters", "recovery_wait_seconds"], total])
    return ops


def check_fence(state: Dict[str, Any], owner: Optional[str], epoch: Optional[int], now: float) -> None:
    """Raise :class:`Fenced` unless ``owner`` holds the run's current, unexpired lease at ``epoch``."""
    lease = state["lease"]
    _carries_lease(owner, epoch, lease, now)
    _holds(lease, owner, epoch, now)  # type: ignore[arg-type]
    if _expired(lease, now):
        raise Fenced(f"the lease of {owner} at epoch {epoch} expired at {lease.get('expires_at')}; acquire it again",
                     epoch=lease.get("epoch"))


def _holds(lease: "Lease", owner: str, epoch: int, now: float) -> None:
    """Raise :class:`Fenced`, saying why, unless ``owner`` at ``epoch`` is the lease's holder (live or not)."""
    current = int(lease.get("epoch", 0))
    if int(epoch) < current:  # whoever holds it now, or nobody: a fenced writer is never told how to write again
        raise Fenced(f"stale writer: {owner} at epoch {epoch}, but the lease is at epoch {current}: a later acquire "
                     "fenced this writer",
                     owner=lease.get("owner"), epoch=current)
    if lease.get("owner") != owner:
        raise Fenced(f"{owner} does not hold the lease: {_advice(lease, owner, now)}", owner=lease.get("owner"),
                     epoch=current)
    if int(epoch) != current:
        raise Fenced(f"{owner} at epoch {epoch}, but the lease is at epoch {current}: no acquire gave epoch {epoch}",
                     owner=owner, epoch=current)


def renew_ops(state: Dict[str, Any], owner: str, epoch: int, ttl: float, now: float) -> Ops:
    """Extend the expiry; only the current, unexpired holder may."""
    ttl = _ttl(ttl)
    check_fence(state, owner, epoch, now)
    ops: Ops = [["set", ["lease", "expires_at"], format_time(now + ttl)]]
    if state["lease"].get("ttl_seconds") != ttl:
        ops.append(["set", ["lease", "ttl_seconds"], ttl])
    return ops


def release_ops(state: Dict[str, Any], owner: Optional[str], epoch: Optional[int], now: float) -> Ops:
    """Give the lease up; the epoch is kept so the next holder's is higher.

    :raises Fenced: ``owner`` and ``epoch`` are missing, or are not the holder's.
    """
    lease = state["lease"]
    _carries_lease(owner, epoch, lease, now)
    _holds(lease, owner, epoch, now)  # type: ignore[arg-type]
    return [["set", ["lease"], {"owner": None, "epoch": int(lease["epoch"]), "expires_at": None, "acquired_at": None}]]


def break_ops(state: Dict[str, Any], by: str, reason: str, now: float) -> Ops:
    """A supervisor that saw the holder die ends its lease now, recording who and why.

    The epoch does not change: the next ``acquire`` takes a higher one, and a
    holder that was not in fact dead is refused by its stale epoch.
    """
    validate_id(by, "supervisor")
    one_line(reason, "reason")
    lease = state["lease"]
    if lease.get("owner") is None or _expired(lease, now):
        return []
    return [
        ["set", ["lease", "expires_at"], format_time(now)],
        ["set", ["observations", "authorization", f"r{state['revision'] + 1}"], {
            "source": "lease break", "by": by, "reason": reason, "at": format_time(now),
            "owner": lease["owner"], "epoch": lease["epoch"],
        }],
    ]


def lease_view(state: Dict[str, Any], now: float) -> Dict[str, Any]:
    """The lease as stored, plus ``live``: held and not expired at ``now``."""
    lease = dict(state["lease"])
    lease["live"] = lease.get("owner") is not None and not _expired(lease, now)
    return lease
