"""``simulate``: the executor run against a simulated world, seeded and replayable.

In the manner of FoundationDB's simulation tests and TigerBeetle's VOPR: the
real lifecycle (:func:`runner.execution.lifecycle.next_move`), executor
(:class:`runner.execution.executor.Executor`), in-flight registry logic
(:class:`runner.calls.inflight.Registry`), :class:`runner.execution.run.Run` and ledger rules
(:mod:`runner.ledger.effects`, :mod:`runner.ledger.lease`), unchanged, with a simulated
clock, process table, registry storage, store and target around them
(:mod:`runner.proof.simworld`). Everything a schedule does is drawn from its
seed, so a schedule that breaks an invariant is replayed exactly by
``python3 -m runner simulate --seed SEED --schedules 1 --trace``.

One schedule:

* **the run**: 1 to 6 keys, each one effect, performed by workers that take
  the lease and call :meth:`~runner.execution.executor.Executor.perform_all` with 1 to 8
  calls in flight; a contract with a lease time to live, a call timeout
  (often longer than the lease), a settle time, attempt and "not now" bounds;
* **the target**: deduplicates (for a retention time, or for ever) or
  (mostly) not; a lookup shows a call up to
  the contract's ``settle_seconds`` after it was applied (in one schedule of
  ten, longer: a target lagging past what its contract declares, where the
  runner promises no more than that a receipt is never contradicted by a
  second call); answers dropped after the target applied the call; "not now"
  answers (429/503) with or without a delay, and storms of them; unknown
  outcomes where nothing was applied; lookups that fail; keys rejected for
  good; calls slower than the lease; in some schedules, a refusal of stale
  fencing epochs;
* **calls**: in-process (they die with their worker, are not sent while it
  is stopped, and are not sent past the registered deadline, which the
  adapter checks right before sending as a real HTTP adapter does) or
  command-like (a process of their own, with the call's token in its
  environment, registered as the call's child an instant after it starts; it
  survives its worker and sends unless a process-group kill ends it first);
* **faults**: a kill at one window per schedule (the windows taken in turn
  by seed, the pass through it drawn), more kills at random passes and at
  random times, a stall (SIGSTOP) of up to three lease times, then SIGCONT;
  two or three workers contending; restarts as ``work``'s supervisor does
  them (the dead worker's lease broken, a new owner started at once), by the
  same owner id re-acquiring, or by a new owner waiting out the lease; a
  second worker started with the owner id of a live one;
* **what broke the runner once**, each in some schedules only, drawn from
  streams of their own (:func:`_draw_shapes`: the draws above stay as they
  were, and a seed that draws none of these runs exactly as before):

  - lookups of many keys (``observe_many``, 2 to 8 keys a call): the target
    lists a page of its matches at most and links to the next page when there
    are more; the contract may say how a page is marked, or not; the target
    may refuse (414) a lookup of more than so many keys. A key an answer does
    not list is absent only in an answer that cannot be one page of several,
    and otherwise unseen, then looked up alone;
  - a proxy in front of the target answering 502, 503 or 504 after the target
    applied the call (an unknown outcome: settled by a lookup); and, apart, a
    target that answers "not now" (a 429, a 503 naming a delay) after it
    applied the call, which lies: the runner believes a "not now" and sends
    again, so what that key breaks is counted apart (``beyond_promise``);
  - commands that send through a helper process of their group, whose leader
    exits while the helper still sends (its runner was killed and its output
    pipe broke, or it does not wait for its helper);
  - records the runner never wrote, put into the registry's storage at random
    times (:data:`GARBAGE`): naming a process of this user's or another
    user's, a pid another call's command has now, a null start time, a
    deadline days away; text that is no JSON; a FIFO; a name the runner never
    gives;
  - two spellings of one database's location: each worker is given one, and
    finds the registry the runner names from what the database says the run is
    (:func:`runner.proof.simworld.registry_room`);
  - lookups that read one listing of the target (``observe.list``): every
    effect the target shows (and entries that are no key's), newest first, a
    page of one to five entries at a time, at most so many pages; a listing
    cut short there, or at a page that cannot be read, or answered "not now".
    A key the listing did not find is absent only when it was read to its end,
    and unknown otherwise;
  - the keys as the items of a batch step, each looked up at the target by its
    stem, ``step start`` freezing the list (:meth:`runner.execution.run.Run.step_start`):
    a list two of whose items one lookup value finds; a list changed by
    ``migrate`` (an item in front of ``{index}`` keys, one at the end, or keys
    made from another template) and frozen anew;
  - a target that cannot be read back (``"observe": "none"``: a chat webhook,
    a mail server): a receipt verifies, an unknown outcome stops the run for a
    person, who later looks at what the target holds, records it (``effect
    verify`` or ``effect absent``, ``--by``) and starts a worker again;
  - work done before the run (``effects.observe_first``): the target holds
    some keys' effects from the start, and every key is looked up before its
    first call.

Checked during and at the end of every schedule (:data:`INVARIANTS`):

* ``duplicate``: the target holds at most one effect per key, or per item
  where the keys are a list's (a deduplicating target too: it forgets a key
  after its retention, and the runner resends only within it), in the
  schedules whose target keeps its declared settle time;
* ``call-after-receipt``: no call of a key reaches the target after a receipt
  for that key was recorded in the ledger (all schedules);
* ``receipt-lost``: a receipt once recorded stays in the ledger, unchanged;
* ``absence-over-receipt``: the ledger never records ``absent`` for an
  effect that holds a receipt;
* ``lost-acknowledgement``: at the end, every key the target holds is
  verified in the ledger, or still unresolved (started, acknowledged,
  uncertain: the ledger says it may have happened); never absent, failed or
  missing;
* ``phantom``: a verified key is held by the target (its item, where the keys
  are a list's: a key is never verified by another item's effect, nor left
  verified once it names another item);
* ``unfenced-write``: every effect transition is committed by the writer that
  holds the unexpired lease at that epoch;
* ``contradiction``: a receipt is never contradicted by an observed absence
  where the target keeps its settle time;
* ``unsettled``: every schedule ends with every key verified, or with a stop
  the runner names whose cause the schedule injected: a limit spent (some
  key had an attempt without a recorded receipt, and no key recorded absent
  is held by a target that keeps its settle time), a key the target
  rejected, a lookup that could not tell, a receipt contradicted by a
  target lagging past its declared settle time, or a list refused at its
  start because two of its items share a lookup value or because freezing it
  anew had to give a key the ledger holds to another item (a list that could
  be taken and was refused is a violation); a run hangs neither (a runner
  that goes on killing a call past its deadline for :data:`KILL_PATIENCE`
  seconds ends the schedule as ``hung``);
* ``record-set-aside``: the in-flight registry never takes a record of its
  own for one it cannot believe and moves it aside (what the world put there
  is counted when it is moved aside);
* ``wrong-kill``: a runner kills only processes that carry the token of the
  call it kills;
* ``unknown-resent``: at a target that cannot be read back, nothing is
  looked up, and a key whose outcome is unknown (recorded ``uncertain``, or
  left ``started`` by a worker that died) is never begun again; only a
  person's ``effect absent`` lets it be sent again;
* ``done-before-resent``: no call of a key reaches the target when its item's
  effect was there before the run began (``observe_first``), a deduplicating
  target too;
* ``crash``: no exception other than the runner's own errors leaves the
  executor; ``simulation``: the simulated world itself ran into no error.

A key whose contract the world broke is outside the runner's promise from
then on, and what it breaks of ``duplicate``, ``call-after-receipt``,
``lost-acknowledgement``, ``contradiction`` and ``unsettled`` is counted
apart (``beyond_promise``), as the duplicates of a target lagging past its
settle time are: a target that answered "not now" after applying a call;
and, on a machine whose processes cannot be read, a command whose own pid
ran past its call's deadline and sent then (the runner waits for such a
command until its deadline and never kills it there:
``references/batch-and-drive.md``, section 7).

Each schedule also records *signs*, moments that known flaws of the runner
need (a call reaching the target after its registered deadline; a "not now"
answer to a resend; a decision taken while a live call sits behind an expired
one in the registry's list; a resend reaching a deduplicating target after its
retention; a helper that sent after its leader exited, on a machine whose
processes cannot be read), so that a campaign can say which failing schedules
none of them explains.

Broken variants (:data:`VARIANTS`) show that the checks bite: ``no-wait``
hides the calls in flight from the lifecycle; ``receipt-blind-ledger`` hides
recorded receipts from the lifecycle and from the ledger's rules.
``receipt-blind`` hides them from the lifecycle only: the ledger's own rules
(:func:`runner.ledger.effects.absent_ops`, :func:`runner.ledger.effects.begin_ops`) refuse
the second call, and the simulation counts those refusals. The others do what
the runner did before a fix: ``page-believed`` (a lookup of many keys is
believed of every key its answer does not list), ``proxy-not-now`` (a proxy's
502, 503 or 504 after delivery is taken as nothing created), ``leader-only``
(a command's call lives only while its leader does), ``trust-records`` (a
record's process is believed by its pid and start time, and its group killed
past the deadline), ``split-registry`` (a worker's registry is named from the
database's location as spelled), ``shared-lookup`` (a list whose items share
a lookup value is started), ``refreeze-rebinds`` (a list frozen anew gives
the keys the ledger holds to other items) and ``listing-cut-believed`` (a
listing cut short says absent of every key it did not find). Two break what
the runner promises of two kinds of target: ``unknown-resent`` (an unknown
outcome at a target that cannot be read back is sent again) and
``observe-first-ignored`` (``effects.observe_first`` is ignored: work done
before the run is made again).
"""

import json
import random
import time
from typing import IO, Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple

from ..ledger import batch
from ..calls import inflight
from ..ledger import steps
from ..contract.templates import expand, item_values
from ..base.times import parse_time
from ..base.canonical import sha256_hex
from ..base.errors import AlreadyRunning, RunnerError
from ..execution.executor import Executor, Job
from ..execution.lifecycle import Facts, Move, next_move
from ..ledger.states import UNRESOLVED
from ..execution.run import Run
from ..calls.target import NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome
from ..execution.flow import Flow
from ..surfaces import verbs
from ..base.windows import Observer
from .simworld import (FIFO, CallIntroduced, LeaderOnlyProcesses, Ledger, MemoryRegistry, MemoryStore, Proc,
                       ProcessTable, Scheduler, SimProcesses, SimWorld, TrustingProcesses, Worker, WorkerKilled,
                       registry_room)

__all__ = ["KILL_WINDOWS", "INVARIANTS", "VARIANTS", "Params", "draw_params", "Schedule", "run_schedule", "simulate",
           "format_report", "replay_command"]

#: Where a worker may be killed: the executor's and the lease's windows (:mod:`runner.base.windows`), the store's commit
#: windows, and the simulation's own points: before a transaction takes the lock, at every ``World.wait``, between a
#: command's spawn and its registration as the call's child, and at a random instant while a call is on its way.
KILL_WINDOWS = (
    "lease:after-acquire",
    "effect:before-started",
    "effect:after-started",
    "effect:after-call",
    "effect:after-ack",
    "effect:before-verify",
    "store:before-db-commit",
    "store:after-db-commit",
    "sim:lock",
    "sim:wait",
    "sim:spawned",
    "sim:in-flight",
)

#: Windows inside a transaction: a worker may die there, but does not give up the baton (the lock is held).
_INSIDE = ("store:before-db-commit", "store:after-db-commit")

#: How many passes of each window the per-schedule kill may fall on.
_PASSES = {"lease:after-acquire": 2, "store:before-db-commit": 12, "store:after-db-commit": 12, "sim:lock": 12,
           "sim:wait": 8}

INVARIANTS = ("duplicate", "call-after-receipt", "receipt-lost", "absence-over-receipt", "lost-acknowledgement",
              "phantom",
              "unfenced-write", "contradiction", "unsettled", "record-set-aside", "wrong-kill", "unknown-resent",
              "done-before-resent", "crash", "simulation")

#: What a key may break once the world broke its contract with the runner for that key (:meth:`Schedule.beyond`):
#: counted apart, as the duplicates of a target lagging past its settle time are.
_BEYOND_KINDS = ("duplicate", "call-after-receipt", "lost-acknowledgement", "contradiction", "unsettled")

#: The batch step of the schedules whose keys are a list's items, and the template of their keys.
STEP, KEY_TEMPLATE = "s1", "k{index}"
#: How a re-frozen list differs from the one before: an item in front, one at the end, keys made from the stem.
MIGRATIONS = ("insert", "append", "template")
#: Records put in the registry's storage that the runner never wrote (see :meth:`Schedule._plant`).
GARBAGE = ("foreign", "another-user", "null-start", "reused-pid", "far-deadline", "not-json", "fifo", "stray-name")
#: Two spellings of one database's location.
SPELLINGS = ("postgresql://sim@localhost/runs", "postgresql://sim@127.0.0.1:5432/runs?sslmode=disable")

T0 = 1_790_000_000.0
MAX_SIM_SECONDS = 6 * 3600.0
MAX_WORKERS = 30
#: Consecutive needs-reconciliation exits after which the run is left for a person.
MAX_RECONCILIATION_EXITS = 6
#: Simulated seconds a runner may go on killing one call past its deadline before the schedule counts as hung: a
#: kill the runner makes ends the call (it kills only a group it found a member of), so it never needs a second.
KILL_PATIENCE = 60.0


# -- the broken variants ----------------------------------------------------------------------------

def _no_wait(facts: Facts) -> Move:
    """Broken: the lifecycle never sees an earlier call of the key in flight."""
    return next_move(facts._replace(calls=()))


def _receipt_blind(facts: Facts) -> Move:
    """Broken: the lifecycle never sees a recorded receipt, so an absence after an acknowledgement reads as an
    absence."""
    if facts.effect is not None and facts.effect.get("receipt") is not None:
        facts = facts._replace(effect=dict(facts.effect, receipt=None))
    return next_move(facts)


class _ReceiptBlindRun(Run):
    """Broken: every ledger change is computed as if no receipt had been recorded."""

    def transact_many(self, changes: Any) -> Any:
        def blind(change: Callable[[Dict[str, Any], float], Any]) -> Callable[[Dict[str, Any], float], Any]:
            def hidden(state: Dict[str, Any], now: float) -> Any:
                kept = [(effect, effect["receipt"]) for effect in state["effects"].values()
                        if effect.get("receipt") is not None]
                for effect, _ in kept:
                    effect["receipt"] = None
                try:
                    return change(state, now)
                finally:
                    for effect, receipt in kept:
                        effect["receipt"] = receipt
            return hidden

        return super().transact_many([blind(change) for change in changes])


class _ListRun(Run):
    """Broken at ``step start``, as the runner was before it checked a list's lookups (``sees_lookups`` False: two
    items looked up by one value are taken) or, when freezing a list anew, the ledger (``sees_ledger`` False: a key
    the ledger holds may be given to another item). What is checked is :func:`runner.ledger.batch.freeze` and
    :func:`runner.ledger.batch.freeze_ops` themselves, each shown less of the run."""

    sees_lookups = True
    sees_ledger = True

    def step_start(self, step: str) -> Dict[str, Any]:
        state = self.refresh()
        if not self.sees_lookups:
            hidden = ("observe", "observe_many", "http")
            effects = {k: v for k, v in state["plan"]["effects"].items() if k not in hidden}
            state = dict(state, plan=dict(state["plan"], effects=effects))
        frozen = batch.freeze(state, step)

        def start(s: Dict[str, Any], now: float) -> List[Any]:
            seen = s if self.sees_ledger else dict(s, effects={})
            return steps.start_ops(s, step, now) + batch.freeze_ops(seen, step, frozen, now)

        out = self._mutate(start)["steps"][step]
        self.observer.reached("step:after-start", step=step)
        return out  # type: ignore[no-any-return]


def _unknown_resent(facts: Facts) -> Move:
    """Broken: an unknown outcome at a target that cannot be read back is sent again, as at one that deduplicates."""
    state = (facts.effect or {}).get("state")
    unknown = state == "uncertain" or (state == "started" and facts.answer is None)
    if not facts.caps.readable and unknown and not any(call.alive for call in facts.calls):
        return Move("invoke", resend=True)
    return next_move(facts)


def _observe_first_ignored(facts: Facts) -> Move:
    """Broken: ``effects.observe_first`` is ignored; an effect with no record is called without a look."""
    return next_move(facts._replace(caps=facts.caps._replace(observe_first=False)))


class _LookupsUnchecked(_ListRun):
    sees_lookups = False


class _LedgerUnchecked(_ListRun):
    sees_ledger = False


class Variant(NamedTuple):
    """A way of running the schedules: the lifecycle, the ``Run`` class, and ``flaw``, what the world's stand-ins for
    the adapter, the processes or the registry's storage do as the runner's did before a fix ("" for none)."""

    decide: Callable[[Facts], Move]
    run: type
    flaw: str
    about: str


#: Every variant by name: ``real`` is the code as it is; each other is broken on purpose, to show that a check bites.
VARIANTS: Dict[str, Variant] = {
    "real": Variant(next_move, Run, "", "the code as it is"),
    "no-wait": Variant(_no_wait, Run, "", "the lifecycle never sees calls in flight"),
    "receipt-blind": Variant(_receipt_blind, Run, "", "the lifecycle alone never sees a receipt"),
    "receipt-blind-ledger": Variant(_receipt_blind, _ReceiptBlindRun, "", "lifecycle and ledger never see a receipt"),
    "page-believed": Variant(next_move, Run, "page-believed", "a lookup of many keys says absent of every key its "
                             "answer does not list, one page of several too"),
    "proxy-not-now": Variant(next_move, Run, "proxy-not-now",
                             "a proxy's 502, 503 or 504 after delivery is taken as nothing created"),
    "leader-only": Variant(next_move, Run, "leader-only", "a command's call lives only while its group's leader lives"),
    "trust-records": Variant(next_move, Run, "trust-records", "a call record's process is believed by pid and start "
                             "time alone, and its group killed past the deadline"),
    "split-registry": Variant(next_move, Run, "split-registry",
                              "a worker's registry is named from the database's location as spelled"),
    "shared-lookup": Variant(next_move, _LookupsUnchecked, "", "a list whose items share a lookup value is started"),
    "refreeze-rebinds": Variant(next_move, _LedgerUnchecked, "",
                                "a list frozen anew gives the keys the ledger holds to other items"),
    "listing-cut-believed": Variant(next_move, Run, "listing-cut-believed",
                                    "a listing cut short says absent of every key it did not find"),
    "unknown-resent": Variant(_unknown_resent, Run, "",
                              "an unknown outcome at a target that cannot be read back is sent again"),
    "observe-first-ignored": Variant(_observe_first_ignored, Run, "",
                                     "effects.observe_first is ignored: work done before the run is made again"),
}


# -- a schedule's parameters --------------------------------------------------------------------------

class Params(NamedTuple):
    """Everything a schedule's world is made of, drawn from its seed (see :func:`draw_params`)."""

    keys: int
    parallel: int
    workers: int
    ttl: float
    timeout: float
    settle: float
    over_lag: bool
    deduplicates: bool
    retention: Optional[float]  # how long a deduplicating target remembers a key (None: forever)
    fences: bool
    commands: float  # the share of keys whose calls are commands
    can_find: bool
    slow: float  # the chance that a call is slow (before sending, or in answering)
    slow_commands: float  # the chance that a command takes long before it sends (a CLI that authenticates first)
    drop: float
    not_now: float
    retry_after: bool
    storms: Tuple[Tuple[float, float], ...]
    unknown: float
    lookup_fail: float
    rejected: Tuple[str, ...]
    max_attempts: int
    max_rate_limited: int
    backoff: Tuple[float, float]
    restart: str  # break | same-owner | expire
    restart_delay: float
    kill_window: Optional[str]
    kill_pass: int
    kill_chance: float  # at each pass through a window
    kill_in_flight: float  # at a random instant while a call is on its way, for each call
    kill_slow: float  # the same, for a call that will take longer than its timeout to send (the issue's "CLI that
                      # authenticates first")
    timed_kills: Tuple[float, ...]
    stall: Optional[Tuple[str, int, float]]  # (window or "time", pass or second, seconds stopped)
    same_owner_at: Optional[float]
    preempt: float
    rate: Optional[Dict[str, float]] = None  # the contract's effects.rate: calls a second and a burst (None: no bound)
    # What broke the runner once, each drawn from a stream of its own (see _draw_shapes); each is off by default.
    many: int = 0  # the most keys one lookup of many keys asks for (observe_batch); 0: keys are looked up one by one
    page: Optional[int] = None  # the target lists at most this many matches in one answer, and links to the next page
    page_marked: bool = False  # the contract says how a page is marked: a key missing from a whole answer is absent
    many_limit: Optional[int] = None  # the target refuses (414) a lookup of more keys than this
    proxy: float = 0.0  # the chance that a proxy answers 502, 503 or 504 after the target applied the call
    lies: float = 0.0  # the chance that the target answers "not now" after it applied the call (outside the promise)
    helpers: float = 0.0  # the share of commands that send through a helper process of their group
    garbage: Tuple[Tuple[float, str], ...] = ()  # records none of the runner's put in its registry: (second, kind)
    spellings: int = 1  # how many spellings of the database's location the workers use
    listed: bool = False  # the keys are a batch step's items, frozen at its start
    shared: bool = False  # two items of the list are looked up at the target by one value
    migration: Optional[Tuple[float, str]] = None  # (second, one of MIGRATIONS): the list changes and is frozen anew
    listing: bool = False  # a lookup reads one listing of every effect the target shows, page by page (observe.list)
    list_page: int = 1  # the entries one page of the listing holds
    list_pages: int = 1  # the most pages one listing reads (max_pages)
    list_others: int = 0  # entries of the listing that are no key's (the target's other issues)
    list_cut: float = 0.0  # the chance that a page of a listing cannot be read: the listing is cut short there
    unreadable: bool = False  # the target cannot be read back ("observe": "none"): a person records what it holds
    observe_first: bool = False  # effects.observe_first: every key is looked up before its first call
    done_before: Tuple[int, ...] = ()  # the keys (their places in the list) whose effects the target holds at the start


#: The fields of :class:`Params` that :func:`_draw_shapes` draws.
SHAPES = ("many", "page", "page_marked", "many_limit", "proxy", "lies", "helpers", "garbage", "spellings", "listed",
          "shared", "migration", "listing", "list_page", "list_pages", "list_others", "list_cut", "unreadable",
          "observe_first", "done_before")


def draw_params(seed: int) -> Params:
    """The world of schedule ``seed``: the same seed gives the same world, in any process."""
    rng = random.Random(f"params:{seed}")
    keys = rng.choice((1, 2, 3, 3, 4, 6))
    ttl = round(rng.uniform(2.0, 20.0), 3)
    timeout = round(rng.uniform(0.5, 2.0) * ttl if rng.random() < 0.5 else rng.uniform(0.2, 0.9) * ttl, 3)
    settle = rng.choice((0.0, 0.0, round(rng.uniform(0.2, 8.0), 3)))
    window = KILL_WINDOWS[seed % len(KILL_WINDOWS)] if rng.random() < 0.8 else None
    storms = tuple(sorted((round(rng.uniform(0, 20), 3), round(rng.uniform(2, 25), 3))
                          for _ in range(rng.choice((0, 0, 0, 1, 2)))))
    stall: Optional[Tuple[str, int, float]] = None
    if rng.random() < 0.3:
        where = rng.choice(("effect:before-started", "effect:after-started", "effect:after-call", "effect:after-ack",
                            "sim:wait", "sim:lock", "sim:spawned", "time"))
        stall = (where, rng.randint(1, 4) if where != "time" else rng.randint(0, 20),
                 round(rng.uniform(0.2, 3.0) * ttl, 3))
    params = Params(
        keys=keys,
        parallel=rng.choice((1, 1, 2, 3, 4, 8)),
        workers=rng.choice((1, 1, 2, 3)),
        ttl=ttl,
        timeout=timeout,
        settle=settle,
        over_lag=rng.random() < 0.1,
        deduplicates=rng.random() < 0.2,
        retention=round(rng.uniform(5.0, 90.0), 3) if rng.random() < 0.5 else None,
        fences=rng.random() < 0.3,
        commands=rng.choice((0.0, 0.5, 1.0)),
        can_find=rng.random() < 0.9,
        slow=rng.choice((0.0, 0.1, 0.25)),
        slow_commands=rng.choice((0.1, 0.3, 0.5)),
        drop=rng.choice((0.0, 0.1, 0.3)),
        not_now=rng.choice((0.0, 0.0, 0.1, 0.3)),
        retry_after=rng.random() < 0.5,
        storms=storms,
        unknown=rng.choice((0.0, 0.05)),
        lookup_fail=rng.choice((0.0, 0.05, 0.2)),
        rejected=tuple(f"k{i + 1}" for i in range(keys) if rng.random() < 0.03),
        max_attempts=rng.choice((2, 3, 3, 5)),
        max_rate_limited=rng.choice((3, 10, 10)),
        backoff=(round(rng.uniform(0.05, 2.0), 3), round(rng.uniform(1.0, 30.0), 3)),
        restart=rng.choice(("break", "break", "same-owner", "expire")),
        restart_delay=rng.choice((0.0, round(rng.uniform(0.0, 2.0), 3))),
        kill_window=window,
        kill_pass=rng.randint(1, _PASSES.get(window or "", 4)),
        kill_chance=rng.choice((0.0, 0.0, 0.01, 0.03)),
        kill_in_flight=rng.choice((0.0, 0.02, 0.05)),
        kill_slow=rng.choice((0.0, 0.3, 0.6)),
        timed_kills=tuple(round(rng.uniform(0, 30), 3) for _ in range(rng.choice((0, 0, 1, 2)))),
        stall=stall,
        same_owner_at=round(rng.uniform(0, 10), 3) if rng.random() < 0.1 else None,
        preempt=rng.choice((0.1, 0.5)),
        rate=_draw_rate(seed),
    )
    return params._replace(**_draw_shapes(seed, params))


def _draw_rate(seed: int) -> Optional[Dict[str, float]]:
    """The contract's ``effects.rate`` of schedule ``seed``, from a stream of its own (the other draws stay as they
    were)."""
    rng = random.Random(f"rate:{seed}")
    if rng.random() < 0.7:
        return None
    return {"per_second": rng.choice((0.5, 2.0, 10.0)), "burst": float(rng.choice((1, 2, 8)))}


def _draw_shapes(seed: int, p: Params) -> Dict[str, Any]:
    """What broke the runner once, in the world of schedule ``seed``: each shape from a stream of its own, so that
    the parameters drawn before stay as they were for every seed, and a seed that draws none runs as before."""
    shapes: Dict[str, Any] = {}
    rng = random.Random(f"many:{seed}")
    if p.keys > 1 and rng.random() < 0.35:
        shapes["many"] = rng.choice((2, 3, 4, 8))
        shapes["page"] = rng.choice((None, 1, 2, 3))
        shapes["page_marked"] = rng.random() < 0.6
        shapes["many_limit"] = rng.randint(1, shapes["many"] - 1) if rng.random() < 0.25 else None
    rng = random.Random(f"proxy:{seed}")
    if rng.random() < 0.25:
        shapes["proxy"] = rng.choice((0.1, 0.3))
    if rng.random() < 0.08:
        shapes["lies"] = rng.choice((0.1, 0.3))
    rng = random.Random(f"helpers:{seed}")
    if p.commands and rng.random() < 0.3:
        shapes["helpers"] = rng.choice((0.5, 1.0))
    rng = random.Random(f"garbage:{seed}")
    if rng.random() < 0.2:
        planted = [(round(rng.uniform(0, 20), 3), rng.choice(GARBAGE)) for _ in range(rng.randint(1, 4))]
        shapes["garbage"] = tuple(sorted(planted))
    rng = random.Random(f"spellings:{seed}")
    if rng.random() < 0.2:
        shapes["spellings"] = 2
    rng = random.Random(f"list:{seed}")
    if rng.random() < 0.25:
        shapes["listed"] = True
        if p.keys > 1 and rng.random() < 0.2:
            shapes["shared"] = True
        elif rng.random() < 0.4:
            shapes["migration"] = (round(rng.uniform(0, 25), 3), rng.choice(MIGRATIONS))
    rng = random.Random(f"listing:{seed}")
    if "many" not in shapes and rng.random() < 0.25:
        shapes["listing"] = True
        shapes["list_page"] = rng.choice((1, 2, 3, 5))
        shapes["list_pages"] = rng.choice((1, 2, 3, 10))
        shapes["list_others"] = rng.choice((0, 0, 2, 6))
        shapes["list_cut"] = rng.choice((0.0, 0.1, 0.3))
    rng = random.Random(f"unreadable:{seed}")
    if "many" not in shapes and "listing" not in shapes and rng.random() < 0.15:  # nothing to look up many keys in
        shapes["unreadable"] = True
    rng = random.Random(f"first:{seed}")
    if "unreadable" not in shapes and rng.random() < 0.2:  # contract check refuses observe_first with "observe": "none"
        shapes["observe_first"] = True
        shapes["done_before"] = tuple(i for i in range(p.keys) if rng.random() < 0.4)
    return shapes


def replay_command(seed: int, variant: str = "real") -> str:
    """The one line that replays schedule ``seed`` with its trace."""
    extra = f" --variant {variant}" if variant != "real" else ""
    return f"python3 -m runner simulate --seed {seed} --schedules 1 --trace{extra}"


# -- the target and its calls ---------------------------------------------------------------------------

class SimCall:
    """One call the executor started, as the world carries it out.

    A lookup of many keys (kind ``many``) is not registered in flight, as the executor makes it: it has no
    ``registered`` record and no deadline; ``items`` are its keys and payloads. ``helper``: the process of a
    command's group that sends, when the command started one.
    """

    __slots__ = ("id", "worker", "kind", "key", "items", "payload", "epoch", "registry", "registered", "deadline",
                 "adapter", "tag", "work", "began", "outcome", "delivered", "proc", "helper", "gate_open", "acts_at")

    def __init__(self, number: int, worker: Worker, introduced: CallIntroduced, tag: Any, work: Callable[[], Any],
                 began: float) -> None:
        current = introduced.current
        if current is None and introduced.kind != "many":
            raise RuntimeError("a call started outside inflight.calling")
        self.id = f"c{number}"
        self.worker, self.kind, self.key, self.epoch = worker, introduced.kind, introduced.key, introduced.epoch
        self.items, self.payload = introduced.items, introduced.payload
        self.registry, self.registered = current if current is not None else (None, None)
        self.deadline: Optional[float] = None if self.registered is None else float(self.registered.record["deadline"])
        self.adapter, self.tag, self.work, self.began = introduced.adapter, tag, work, began
        self.outcome: Optional[Tuple[Any, ...]] = None
        self.delivered = False
        self.proc: Any = None
        self.helper: Optional[Proc] = None
        self.gate_open = False
        self.acts_at = 0.0

    def past_deadline(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


class SimAdapter:
    """A target adapter whose calls are the simulation's: the first run of a call introduces it, the second answers.

    What the target sent back becomes what the adapter returns or raises here, as the runner's adapters read it:
    a proxy's 502, 503 or 504 after delivery is an unknown outcome; a key a lookup of many keys did not list is
    absent only in an answer that cannot be one page of several, and unseen otherwise; a refused lookup of many
    keys (414) raises :class:`~runner.calls.target.Rejected`; a key a listing did not find is absent only when the
    listing was read to its end, and unknown otherwise. ``flaw`` reads them as the adapters did before their
    fixes.
    """

    name = "simulated target"
    key_scope = "the simulated target"
    retention_seconds: Optional[float] = None
    conflicting_payload = "refused"
    verification = "lookup by key"

    def __init__(self, world: SimWorld, p: Params, command: bool, flaw: str = "") -> None:
        self.world, self.p, self.command, self.flaw = world, p, command, flaw
        self.deduplicates, self.retention_seconds, self.timeout = p.deduplicates, p.retention, p.timeout
        self.batch_key = ("simulated target",) if p.many or p.listing else None
        self.observe_batch = 1000 if p.listing else max(1, p.many)
        self.lists = p.listing
        self.readable = not p.unreadable

    def _call(self, kind: str, key: str, payload: Dict[str, Any], epoch: Optional[int],
              items: Optional[List[Tuple[str, Dict[str, Any]]]] = None) -> Any:
        call = self.world.delivering
        if call is None:
            raise CallIntroduced(kind, key, payload, epoch, inflight.current(), self, items)
        return self._answer(call)

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        return self._call("invoke", key, payload, epoch)  # type: ignore[no-any-return]

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        return self._call("observe", key, payload, None)  # type: ignore[no-any-return]

    def observe_many(self, items: List[Tuple[str, Dict[str, Any], Any]]) -> List[Observation]:
        pairs = [(key, payload) for key, payload, _ in items]
        return self._call("many", pairs[0][0], pairs[0][1], None, pairs)  # type: ignore[no-any-return]

    def _answer(self, call: SimCall) -> Any:
        """What the adapter returns (or raises) for ``call``, now that the target's answer reached the worker."""
        kind, detail = call.outcome  # type: ignore[misc]
        if kind == "receipt":
            return detail
        if kind in ("present", "absent"):
            return Observation(kind, detail)
        if kind == "page":
            return self._page(call, detail)
        if kind == "listing":
            found = self._listed(call.items or [(call.key, call.payload)], detail)
            return found if call.kind == "many" else found[0]
        if kind == "not-applied":
            raise NotApplied("429 Too Many Requests", retry_after=detail)
        if kind == "proxied":
            if self.flaw == "proxy-not-now":
                raise NotApplied(detail)
            raise UnknownOutcome(detail)
        if kind == "stale":
            raise StaleEpoch(detail)
        if kind in ("rejected", "refused"):
            raise Rejected(detail)
        if kind == "lookup-failed":
            raise RuntimeError(detail)
        raise UnknownOutcome(detail)

    def _page(self, call: SimCall, answer: Dict[str, Any]) -> List[Observation]:
        """Each key of a lookup of many keys: present if listed; else absent only if the answer is whole."""
        p = self.p
        whole = p.page_marked and not answer["more"] and (p.page is None or answer["entries"] < p.page)
        out = []
        for key, _ in call.items:
            ticket = answer["listed"].get(key)
            if ticket is not None:
                out.append(Observation("present", {"ticket": ticket}))
            elif whole or self.flaw == "page-believed":
                out.append(Observation("absent", {"searched": key, "entries": answer["entries"]}))
            else:
                shown = {"searched": key, "entries": answer["entries"], "more": answer["more"]}
                out.append(Observation("unseen", shown))
        return out


    def _listed(self, items: List[Tuple[str, Dict[str, Any]]], answer: Dict[str, Any]) -> List[Observation]:
        """Each key of a listing: present if it found the key; else absent only if it was read to its end."""
        out = []
        for key, _ in items:
            ticket = answer["listed"].get(key)
            seen = {"pages": answer["pages"], "matches": answer["matches"].get(key, 0)}
            if ticket is not None:
                out.append(Observation("present", dict(seen, ticket=ticket)))
            elif not answer["cut"] or self.flaw == "listing-cut-believed":
                out.append(Observation("absent", dict(seen, whole=not answer["cut"])))
            else:
                out.append(Observation("unknown", dict(seen, reason="the listing was cut short")))
        return out


class _Observer(Observer):
    """The commit windows of one worker, reported to its schedule."""

    def __init__(self, schedule: "Schedule", worker: Worker) -> None:
        self.schedule, self.worker = schedule, worker

    def reached(self, window: str, **facts: Any) -> None:
        self.schedule.window(self.worker, window, facts.get("key"))


class SimWorker(Worker):
    """A worker of the simulation: its process, random source and what it saw."""

    def __init__(self, name: str, owner: str, program: Callable[[Worker], str], rand: random.Random) -> None:
        super().__init__(name, owner, program)
        self.rand = rand
        self.proc: Any = None
        self.stalled = False
        self.detail = ""
        self.calls: List["SimCall"] = []  # its calls not yet answered: its process lives until they are


# -- one schedule ---------------------------------------------------------------------------------------

class Schedule:
    """One seeded schedule: its world, its workers and faults, and the invariants checked over it."""

    def __init__(self, seed: int, variant: str = "real", trace: bool = False, params: Optional[Params] = None) -> None:
        self.seed, self.variant = seed, variant
        self.p = params if params is not None else draw_params(seed)
        self.decide_fn, self.run_class, self.flaw, _ = VARIANTS[variant]
        self.trace: Optional[List[str]] = [] if trace else None
        self.world_rng = random.Random(f"world:{seed}")
        self.fault_rng = random.Random(f"faults:{seed}")
        self.shape_rng = random.Random(f"shapes:{seed}")  # what _draw_shapes's shapes do, apart from the draws before
        self.keys = [f"k{i + 1}" for i in range(self.p.keys)]
        key_rng = random.Random(f"keys:{seed}")
        self.command_keys = {k for k in self.keys if key_rng.random() < self.p.commands}
        self.items: List[str] = []  # the list's items, when the keys are a batch step's (see _list)
        self.value_of: Dict[str, str] = {}  # item -> the value the target looks it up by (the key itself when unlisted)
        self.rejected_items: Set[str] = set(self.p.rejected)
        self.command_items = set(self.command_keys)  # the items whose calls are commands
        if self.p.listed:
            self._list(key_rng)
        self.violations: List[Tuple[str, str]] = []
        self.counts: Dict[str, int] = {}
        self.kills: Dict[str, int] = {}
        self.exits: Dict[str, int] = {}
        self.moves: Dict[str, int] = {}
        self.workers: List[SimWorker] = []
        self.passes: Dict[str, int] = {}
        self.effects: Dict[str, List[Tuple[float, float, int, str]]] = {}  # key -> (applied, visible, ticket, call)
        self.by_item: Dict[str, List[Tuple[float, float, int, str]]] = {}  # item -> its effects at the target
        self.by_value: Dict[str, List[Tuple[float, float, int, str]]] = {}  # lookup value -> the effects it finds
        self.receipted: Dict[str, Any] = {}  # key -> the first receipt the ledger recorded for it
        self.last_lookup: Dict[str, str] = {}  # key -> what its last lookup told a worker
        self.final: Optional[str] = None
        self.final_detail = ""
        self.final_lookups: Dict[str, Any] = {}  # each key's last lookup when the run was left for a person
        self.reconciliation_exits = 0
        self.verified_seen = 0
        self.calls = 0
        self.tickets = 0
        self.max_epoch = 0
        self.rooms: Dict[str, Dict[str, str]] = {}  # each registry's storage, by the name its workers give it
        self.set_aside: Dict[str, str] = {}  # records the registry refused to believe (name: why): never one of its own
        self.planted: Set[str] = set()  # names of the records put in the registry that the runner never wrote
        self.foreign: List[Proc] = []  # processes that are none of the run's: this user's, another user's
        self.resent: Set[str] = set()  # keys whose latest attempt is a resend (uncertain -> started)
        self.signs: Set[str] = set()  # what this schedule did that the known findings need
        self.outside: Dict[str, str] = {}  # key -> how the world broke its contract with the runner for that key
        self.refreeze: Optional[str] = None  # the migration applied, and whether a re-freeze must refuse it
        self.killing: Dict[Tuple[str, int, float], float] = {}  # (key, pid, deadline) of a call being killed: since
        self.hung = False
        self.before_items: Set[str] = set()  # the items whose effects the target held before the run began
        self.person_due = False  # a person will look at a target that cannot be read back, and record what it holds

    # -- bookkeeping --------------------------------------------------------------------------------
    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def log(self, text: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.sched.now - T0:10.3f} {text}")

    def violation(self, kind: str, detail: str, key: Optional[str] = None) -> None:
        """Record a broken invariant; of a ``key`` (or item) outside the runner's promise (:meth:`beyond`), only count
        it."""
        why = self.outside.get(key) if key is not None else None
        if why is not None and kind in _BEYOND_KINDS:
            self.count("beyond_promise")
            self.log(f"BEYOND THE PROMISE {kind} ({why}): {detail}")
            return
        self.violations.append((kind, detail))
        self.log(f"VIOLATION {kind}: {detail}")

    def beyond(self, key: str, item: str, why: str, sign: str) -> None:
        """The world broke its contract with the runner for ``key`` and its ``item`` (whatever key the item has later):
        what follows is counted, not a violation."""
        if key not in self.outside:
            self.count(f"outside:{sign}")
            self.log(f"{key} is outside the runner's promise from now: {why}")
        self.outside.setdefault(key, why)
        self.outside.setdefault(item, why)
        self.signs.add(sign)

    # -- the list, when the keys are a batch step's items ---------------------------------------------
    def _list(self, key_rng: random.Random) -> None:
        """The step's items: one file per key, looked up at the target by its stem; two share one with ``shared``.
        The items a migration may add (one in front, one at the end) are drawn here too."""
        n = self.p.keys
        self.items = [f"d{i + 1}.md" for i in range(n)]
        if self.p.shared:
            self.items[-1] = f"d{n - 1}.txt"
        self.keys = [KEY_TEMPLATE.format(index=i) for i in range(n)]
        self.command_items = {self.items[int(k[1:]) - 1] for k in self.command_keys}
        self.command_keys = {KEY_TEMPLATE.format(index=int(k[1:]) - 1) for k in self.command_keys}
        self.rejected_items = {self.items[int(k[1:]) - 1] for k in self.p.rejected}
        added = ["d0.md", f"d{n + 1}.md"]
        self.command_items |= {item for item in added if key_rng.random() < self.p.commands}
        for item in self.items + added:
            self.value_of[item] = item_values(item, 0)["stem"]

    def _migrated_plan(self) -> Dict[str, Any]:
        """The plan after the schedule's migration: an item in front, one at the end, or keys from the stem."""
        kind = self.p.migration[1]  # type: ignore[index]
        items = list(self.items)
        if kind == "insert":
            items.insert(0, "d0.md")
        elif kind == "append":
            items.append(f"d{len(items) + 1}.md")
        return self._plan(items, "k-{stem}" if kind == "template" else KEY_TEMPLATE)

    def _migration_pending(self) -> bool:
        """The migration's time has come and the ledger does not hold its plan yet."""
        p = self.p
        if p.migration is None or self.sched.now < T0 + p.migration[0]:
            return False
        return self.ledger.truth["plan"] != self._migrated_plan()

    def _operator_migrates(self) -> None:
        """The list changed: an operator migrates and runs ``drive``, unless a worker is there to do it."""
        if self._migration_pending() and not self._live():
            self._start_worker(None, "the list changed: migrate, then drive")

    def _migrate(self, worker: Worker, run: Run) -> None:
        """The lease holder records the changed list's plan (``migrate``) once its time has come, as an operator does
        before ``step start``; whether freezing it anew must be refused is judged from the ledger then."""
        if not self._migration_pending():
            return
        kind = self.p.migration[1]  # type: ignore[index]
        if self.refreeze is None:
            # A key the ledger holds stays with its item: an item in front moves every held key to another item;
            # a new template moves every item whose effect may exist; an item at the end moves none.
            truth = self.ledger.truth
            held = [truth["effects"][k]["state"] for k in self._keys_now(truth) if k in truth["effects"]]
            may_exist = any(state in batch.MAY_EXIST for state in held)
            must = bool(held) if kind == "insert" else may_exist if kind == "template" else False
            self.refreeze = f"{kind}: {'must be refused' if must else 'may be taken'}"
            self.count(f"refreeze:{self.refreeze.split(': ')[1]}")
        plan = self._migrated_plan()
        run.migrate("```json run-contract\n" + json.dumps(plan) + "\n```\n", f"the list changed ({kind})")
        self.count("migrations")
        self.log(f"{worker.name} migrates: {kind}, items {plan['steps'][0]['items']}; "
                 f"a re-freeze {self.refreeze.split(': ')[1]}")

    def _plan(self, items: List[str], template: str) -> Dict[str, Any]:
        """The run's plan: the contract's block, its step listing ``items`` keyed by ``template`` when the keys are a
        list's (looked up by ``{stem}``), else the effects' caps alone; a target that cannot be read back and
        ``observe_first`` as the contract declares them."""
        p = self.p
        effects = {"settle_seconds": p.settle, "timeout_seconds": p.timeout, "max_attempts": p.max_attempts,
                   "max_rate_limited": p.max_rate_limited, **({"rate": p.rate} if p.rate else {}),
                   **({"observe": "none"} if p.unreadable else {}),
                   **({"observe_first": True} if p.observe_first else {})}
        plan = {"effects": effects, "retry": {"base_seconds": p.backoff[0], "cap_seconds": p.backoff[1]},
                "lease": {"ttl_seconds": p.ttl}}
        if not p.listed:
            return plan
        return dict(plan, contract=1, task_id=f"sim-{self.seed}", goal="file one ticket per item", workspace=".",
                    steps=[{"id": STEP, "items": items, "key": template, "next": "done"}],
                    effects=dict(effects, invoke=["file", "{payload_file}"],
                                 observe="none" if p.unreadable else ["find", "{stem}"]))

    def _keys_now(self, state: Dict[str, Any]) -> List[str]:
        """The keys the run must settle: the step's frozen list while it is the plan's, else the plan's own list (what
        the next ``step start`` freezes); the keys themselves when they are no list's."""
        if not self.p.listed:
            return self.keys
        frozen = (state["steps"].get(STEP) or {}).get("batch")
        if frozen and frozen["plan_digest"] == state["plan_digest"]:
            return batch.keys_of(frozen)[0]
        spec = state["plan"]["steps"][0]
        return [expand([spec["key"]], item_values(item, index))[0] for index, item in enumerate(spec["items"])]

    def _item_of(self, state: Dict[str, Any], key: str) -> str:
        """The item ``key`` names in ``state``: as the step's frozen list (or the items it no longer lists) binds it,
        else as the plan's list would; the key itself when the keys are no list's."""
        if not self.p.listed:
            return key
        frozen = (state["steps"].get(STEP) or {}).get("batch")
        if frozen:
            at = batch.keys_of(frozen)[1].get(key)
            if at is not None:
                return frozen["items"][at]  # type: ignore[no-any-return]
            if key in (frozen.get("unlisted") or {}):
                return frozen["unlisted"][key]  # type: ignore[no-any-return]
        spec = state["plan"]["steps"][0]
        keys = self._keys_now(dict(state, steps={}))
        return spec["items"][keys.index(key)] if key in keys else key

    # -- running ------------------------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        p = self.p
        self.sched = Scheduler(random.Random(f"scheduler:{self.seed}"), T0, MAX_SIM_SECONDS, self._exited)
        clock = self.sched.clock
        self.table = ProcessTable(clock, p.can_find, self._killed)
        self.ledger = Ledger(f"sim-{self.seed}", self._plan(self.items, KEY_TEMPLATE), clock, observer=self._committed)
        # The run as the database names it (runner.stores.postgres.PostgresStore.identity): the same for every spelling.
        self.database = "\n".join(("postgresql", "runs", self.ledger.head0, f"sim-{self.seed}"))
        self.supervisor = Run(MemoryStore(self.ledger, clock, writer="supervisor"))
        person = random.Random(f"person:{self.seed}")
        self.person = Run(MemoryStore(self.ledger, clock, writer="person"), rand=person.random)
        fields = p._asdict()
        self.log(f"params { {k: fields[k] for k in Params._fields if k not in Params._field_defaults or k == 'rate'} } "
                 f"commands {sorted(self.command_keys)}")
        shapes = {k: fields[k] for k in SHAPES if fields[k] != Params._field_defaults[k]}
        if shapes:
            self.log(f"shapes {shapes}" + (f" items {self.items}" if self.items else ""))
        for spelling in SPELLINGS[:p.spellings]:
            self.rooms.setdefault(self._room_name(spelling), {})
        for index in p.done_before:
            self._done_before(index)
        if p.migration is not None:
            self.sched.at(T0 + p.migration[0], self._operator_migrates)
        if p.garbage:
            self.foreign = [self.table.new_foreign(mine=True), self.table.new_foreign(mine=False)]
            for at, kind in p.garbage:
                self.sched.at(T0 + at, self._plant, kind)
        for index in range(p.workers):
            self.sched.at(T0 + (0.0 if index == 0 else self.fault_rng.uniform(0, 3)), self._start_worker, None, "start")
        for at in p.timed_kills:
            self.sched.at(T0 + at, self._timed_kill)
        if p.stall is not None and p.stall[0] == "time":
            self.sched.at(T0 + p.stall[1], self._timed_stall, p.stall[2])
        if p.same_owner_at is not None:
            self.sched.at(T0 + p.same_owner_at, self._same_owner)
        began = time.perf_counter()
        self.sched.run()
        self.count("cpu_ms", int((time.perf_counter() - began) * 1000))
        for error in self.sched.errors:
            self.violation("simulation", error)
        return self._finish()

    def _done_before(self, index: int) -> None:
        """The target holds the effect of the key at ``index`` (its item's, where the keys are a list's) from before
        the run: made by a script or by hand, a minute before it began, and shown since."""
        key = self.keys[index]
        item = self.items[index] if self.p.listed else key
        self.tickets += 1
        effect = (T0 - 60.0, T0 - 60.0, self.tickets, "before")
        self.effects.setdefault(key, []).append(effect)
        self.by_value.setdefault(self.value_of.get(item, key), []).append(effect)
        self.by_item.setdefault(item, []).append(effect)
        self.before_items.add(item)
        self.count("done_before")
        self.log(f"the target holds {item}'s effect from before the run: ticket {self.tickets}")

    def _start_worker(self, owner: Optional[str], why: str) -> None:
        if self.final is not None or len(self.workers) >= MAX_WORKERS or \
                (self._all_verified(self.ledger.truth) and not self._migration_pending()):
            return
        index = len(self.workers) + 1
        worker = SimWorker(f"w{index}", owner or f"worker-{index}", self._program,
                           random.Random(f"worker:{self.seed}:{index}"))
        worker.proc = self.table.new_worker()
        worker.pid, worker.start = worker.proc.pid, worker.proc.start
        self.workers.append(worker)
        self.count("workers")
        self.log(f"{worker.name} starts as {worker.owner} (pid {worker.pid}; {why})")
        self.sched.spawn(worker)

    def _room_name(self, spelling: str) -> str:
        """The registry a worker that reached the database at ``spelling`` uses: named, as the runner names a database
        run's, from what the database says the run is."""
        if self.flaw == "split-registry":  # named from the location as typed, as before the fix
            return sha256_hex(f"{spelling}\n{self.ledger.truth['task_id']}".encode())[:24]
        return registry_room(spelling, self.database)

    def _room(self, worker: SimWorker) -> Dict[str, str]:
        """The registry's storage ``worker`` finds, whichever spelling of the database's location it was given."""
        spelling = SPELLINGS[self.shape_rng.randrange(self.p.spellings)] if self.p.spellings > 1 else SPELLINGS[0]
        name = self._room_name(spelling)
        if self.p.spellings > 1:
            self.log(f"{worker.name} reaches the run at {spelling}: calls in flight in {name}")
        return self.rooms[name]

    def _all_verified(self, state: Dict[str, Any]) -> bool:
        return all((state["effects"].get(k) or {}).get("state") == "verified" for k in self._keys_now(state))

    # -- a worker's program ---------------------------------------------------------------------------
    def _program(self, worker: Worker) -> str:
        assert isinstance(worker, SimWorker)
        p = self.p
        observer = _Observer(self, worker)

        def alive() -> bool:
            return not worker.dead

        store = MemoryStore(self.ledger, self.sched.clock, observer=observer, writer=worker.owner,
                            pause=lambda window: self.window(worker, window), writable=alive)
        run = self.run_class(store, rand=worker.rand.random, observer=observer)
        flawed = {"leader-only": LeaderOnlyProcesses, "trust-records": TrustingProcesses}
        processes = flawed.get(self.flaw, SimProcesses)
        registry = MemoryRegistry(self._room(worker), processes(self.table, worker.proc), self.sched.clock, alive,
                                  self.set_aside)
        world = SimWorld(self.sched, worker, self._begin_call, lambda w, window: self.window(w, window))
        worker.world = world
        while True:
            run.refresh()
            if self._all_verified(run.state) and not self._migration_pending():
                return "nothing-left"
            try:
                run.acquire(worker.owner, p.ttl)
                break
            except AlreadyRunning:
                expires = parse_time(run.state["lease"]["expires_at"])
                self.sched.pause(worker, until=min(expires, self.sched.now + worker.rand.uniform(0.5, 3.0)))
        self.log(f"{worker.name} holds the lease at epoch {run.epoch}")

        def decide(facts: Facts) -> Move:
            move = self.decide_fn(facts)
            self.moves[move.kind] = self.moves.get(move.kind, 0) + 1
            if move.kind == "kill-call" and move.call is not None:
                since = self.killing.setdefault((facts.key, move.call.pid, move.call.deadline), facts.now)
                if facts.now - since > KILL_PATIENCE and not self.hung:
                    self.hung = True
                    self.violation("unsettled", f"{worker.name} has killed the call of {facts.key} "
                                   f"(pid {move.call.pid}) past its deadline for {KILL_PATIENCE:g} s, and it never "
                                   "ends: the run hangs")
                    self.sched.abort()
            live = [c for c in facts.calls if c.alive]
            if len(live) > 1 and move.kind in ("observe", "invoke", "absent", "verify") and \
                    any(facts.now < c.deadline or c.killable for c in live[1:]):
                self.count("decisions_past_a_live_call")
                self.signs.add("a-live-call-behind-an-expired-one")
            if self.trace is not None:
                state = (facts.effect or {}).get("state")
                calls = ",".join(f"{'alive' if c.alive else 'ended'}/{c.kind}" for c in facts.calls)
                self.log(f"{worker.name} {facts.key} {state} calls[{calls}] "
                         f"seen={facts.seen.status if facts.seen else None} "
                         f"answer={facts.answer.kind if facts.answer else None} -> {move.kind}"
                         + (f" until {move.until - T0:.3f}" if move.until is not None else ""))
            return move

        executor = Executor(run, registry=registry, world=world, decide=decide, ttl=p.ttl,
                            flow=Flow(p.parallel, p.rate, now=self.sched.clock()), observer=observer,
                            rand=worker.rand.random)
        if p.listed:
            try:
                self._migrate(worker, run)
                run.step_start(STEP)
            except RunnerError as exc:
                worker.detail = exc.message
                return exc.reason
            frozen = run.state["steps"][STEP]["batch"]
            jobs = [Job(key, {"item": item}, SimAdapter(world, p, item in self.command_items, self.flaw), STEP)
                    for key, item in zip(batch.keys_of(frozen)[0], frozen["items"])
                    if (run.state["effects"].get(key) or {}).get("state") != "verified"]
        else:
            jobs = [Job(key, {"title": f"ticket for {key}"}, SimAdapter(world, p, key in self.command_keys, self.flaw))
                    for key in self.keys if (run.state["effects"].get(key) or {}).get("state") != "verified"]
        try:
            executor.perform_all(jobs)
        except RunnerError as exc:
            worker.detail = exc.message
            if exc.reason == "needs-reconciliation":
                kind = ("unreadable" if exc.context.get("readable") is False
                        else "receipt-contradiction" if "observed" in exc.context
                        else "ledger-refusal" if "state" in exc.context
                        else "unverifiable-command" if "process_group" in exc.context else "unknown-outcome")
                self.count(f"needs-reconciliation:{kind}")
                if kind == "receipt-contradiction" and not p.over_lag:
                    self.violation("contradiction", f"{worker.name}: {exc.message[:300]}", exc.context.get("key"))
                return f"needs-reconciliation:{kind}"
            return exc.reason
        if self._all_verified(run.state):
            try:
                run.release()
            except RunnerError:
                pass
        return "done"

    # -- windows and faults ----------------------------------------------------------------------------
    def window(self, worker: Worker, window: str, key: Optional[str] = None) -> None:
        """``worker`` reached ``window``: count the pass; kill, stall or let another worker run there, as the schedule
        says."""
        if worker.unwinding:
            raise WorkerKilled()
        p = self.p
        passes = self.passes[window] = self.passes.get(window, 0) + 1
        planned = window == p.kill_window and passes == p.kill_pass
        if planned or (p.kill_chance and self.count_kills() < 3 and self.fault_rng.random() < p.kill_chance):
            self.kill(worker, window, key)
            raise WorkerKilled()
        if window in _INSIDE:
            return
        stall = p.stall
        if stall is not None and stall[0] == window and passes == stall[1] and isinstance(worker, SimWorker):
            self.stall(worker, stall[2], window, in_its_thread=True)
        if self.fault_rng.random() < p.preempt:
            self.sched.pause(worker)

    def count_kills(self) -> int:
        return sum(self.kills.values())

    def kill(self, worker: Worker, where: str, key: Optional[str] = None) -> None:
        """SIGKILL ``worker`` (at ``where``); the supervisor reacts as the schedule's policy says."""
        if worker.dead:
            return
        assert isinstance(worker, SimWorker)
        self.sched.kill(worker)
        worker.proc.state = "dead"
        self.kills[where] = self.kills.get(where, 0) + 1
        self.log(f"KILL {worker.name} at {where}" + (f" ({key})" if key else ""))
        for call in worker.calls:
            if call.helper is not None and call.proc.alive:
                # The leader reports on its output, whose reader is gone: SIGPIPE at its next line. Its helper goes on.
                self.sched.at(self.sched.now + self.shape_rng.uniform(0, 0.3), self._leader_exits, call,
                              "its runner is gone (SIGPIPE)")
        p = self.p
        if p.restart == "same-owner":
            self.sched.at(self.sched.now + p.restart_delay, self._start_worker, worker.owner,
                          f"restart of {worker.name}, same owner")
        elif p.restart == "break":
            self.sched.at(self.sched.now + p.restart_delay, self._break_and_start, worker)
        else:
            self.sched.at(self.sched.now + p.restart_delay, self._start_worker, None, f"restart of {worker.name}")

    def _break_and_start(self, dead: Worker) -> None:
        """What ``work``'s supervisor does when a worker dies: break the leases it held, start another."""
        state = self.supervisor.refresh()
        if state["lease"].get("owner") == dead.owner:
            self.supervisor.break_lease("supervisor", f"{dead.owner} was killed")
            self.count("lease_breaks")
            self.log(f"supervisor breaks {dead.owner}'s lease")
        self._start_worker(None, f"restart of {dead.name}")

    def stall(self, worker: SimWorker, seconds: float, where: str, in_its_thread: bool = False) -> None:
        """SIGSTOP ``worker`` for ``seconds``, then SIGCONT (``in_its_thread``: it stops here, at a window it
        reached)."""
        if worker.dead or worker.stopped:
            return
        self.sched.stop(worker)
        worker.proc.state = "stopped"
        worker.stalled = True
        self.count("stalls")
        self.log(f"STOP {worker.name} at {where} for {seconds:.3f}s")
        self.sched.at(self.sched.now + seconds, self._continue, worker)
        if in_its_thread:
            self.sched.pause(worker)

    def _continue(self, worker: SimWorker) -> None:
        if worker.dead:
            return
        worker.proc.state = "running"
        self.sched.cont(worker)
        self.log(f"CONT {worker.name}")

    @staticmethod
    def _lease_live(lease: Dict[str, Any], now: float) -> bool:
        """Whether someone holds ``lease`` unexpired at ``now`` (a person's record then needs it)."""
        return lease.get("owner") is not None and lease.get("expires_at") is not None \
            and parse_time(lease["expires_at"]) > now

    def _person_looks(self) -> None:
        """A person looks at a target that cannot be read back: for each key recorded ``uncertain``, what the target
        holds of its item, recorded with ``effect verify`` or ``effect absent`` and ``--by``; then the run goes on (a
        worker starts). They wait while a worker lives: its lease would refuse their record."""
        if self.final is not None:
            return
        if self._live():
            self.sched.at(self.sched.now + 1.0, self._person_looks)
            return
        state = self.person.refresh()
        if self._lease_live(state["lease"], self.sched.now):  # held by a worker that died: it lapses
            self.sched.at(parse_time(state["lease"]["expires_at"]) + 0.1, self._person_looks)
            return
        self.person_due = False
        for key in self._keys_now(state):
            if (state["effects"].get(key) or {}).get("state") != "uncertain":
                continue
            item = self._item_of(state, key)
            held = [e for e in self.by_item.get(item, []) if e[0] <= self.sched.now]
            try:
                if held:
                    verbs.effect_verify(self.person, key, {"seen": f"ticket {held[0][2]}"}, by="a-person")
                else:
                    verbs.effect_absent(self.person, key, {"seen": "nothing"}, by="a-person")
            except RunnerError as exc:
                self.log(f"a person's record of {key} is refused: {exc.message[:200]}")
                continue
            self.count("person_records")
            self.log(f"a person records {key} {'verified' if held else 'absent'}: the target holds "
                     f"{len(held)} of {item}")
        self._start_worker(None, "a person recorded what the target holds")

    def _live(self) -> List[SimWorker]:
        return [w for w in self.workers if not w.dead and w.outcome is None]

    def _timed_kill(self) -> None:
        live = self._live()
        if live and self.count_kills() < 4:
            self.kill(live[self.fault_rng.randrange(len(live))], "sim:time")

    def _timed_stall(self, seconds: float) -> None:
        live = [w for w in self._live() if not w.stopped]
        if live:
            self.stall(live[self.fault_rng.randrange(len(live))], seconds, "time")

    def _same_owner(self) -> None:
        live = self._live()
        if live:
            twin = live[self.fault_rng.randrange(len(live))]
            self.count("same_owner_twins")
            self._start_worker(twin.owner, f"a second process with {twin.name}'s owner id")

    def _exited(self, worker: Worker) -> None:
        """A worker's thread ended: record why; the supervisor starts another unless the run is settled or stopped for
        good."""
        assert isinstance(worker, SimWorker)
        outcome = worker.outcome or "?"
        named = "crashed" if outcome.startswith("crashed") else outcome
        self.exits[named] = self.exits.get(named, 0) + 1
        self.log(f"{worker.name} exits: {outcome}" + (f" ({worker.detail[:200]})" if worker.detail else ""))
        if outcome == "killed":
            return
        if not worker.calls:
            worker.proc.state = "dead"  # its program returned; the threads of calls still on their way keep it alive
        if outcome.startswith("crashed"):
            self.violation("crash", f"{worker.name}: {outcome}")
        if outcome == "fenced" and worker.stalled:
            self.count("stalled_workers_fenced")
        if outcome == "needs-reconciliation:unreadable":
            # The run stopped for a person, who looks at the target some time later (and starts the next worker).
            if not self.person_due:
                self.person_due = True
                self.sched.at(self.sched.now + self.shape_rng.uniform(0.5, 5.0), self._person_looks)
            return
        if outcome.startswith("needs-reconciliation"):
            self.reconciliation_exits += 1
            if self.reconciliation_exits >= MAX_RECONCILIATION_EXITS:
                self.final, self.final_detail = outcome, worker.detail
                self.final_lookups = dict(self.last_lookup)  # a worker still running may look again; the stop was
                                                             # decided on these
                return
        if outcome in ("limit-exhausted", "failed", "invalid-input"):
            self.final, self.final_detail = outcome, worker.detail
            return
        if outcome in ("done", "nothing-left"):
            if self._migration_pending():
                self.sched.at(self.sched.now, self._operator_migrates)
            return
        if not self._live():
            self.sched.at(self.sched.now + self.fault_rng.uniform(0.1, 3.0), self._start_worker, None,
                          f"after {worker.name}: {outcome}")

    # -- calls -----------------------------------------------------------------------------------------
    def _begin_call(self, worker: Worker, introduced: CallIntroduced, tag: Any, work: Callable[[], Any]) -> None:
        self.calls += 1
        call = SimCall(self.calls, worker, introduced, tag, work, self.sched.now)
        self.count(f"calls_{call.kind}")
        worker.calls.append(call)  # type: ignore[attr-defined]
        if call.past_deadline(self.sched.now):
            self.count("calls_started_past_deadline")
        if call.kind != "invoke" and not call.adapter.readable:
            self.violation("unknown-resent", f"{worker.name} {call.id} looks {call.key} up at a target that cannot be "
                           "read back")
        command = bool(call.adapter.command) and call.kind != "many"  # a lookup of many keys: in the drive's process
        if call.kind == "many":
            keys = [key for key, _ in call.items]
            self.log(f"{worker.name} {call.id} lookup of {keys} starts (in-process, unregistered)")
        else:
            self.log(f"{worker.name} {call.id} {call.kind} {call.key} starts "
                     f"({'command' if command else 'in-process'}, "
                     f"deadline +{call.deadline - self.sched.now:.3f})")  # type: ignore[operator]
        sched, rng = self.sched, self.world_rng
        if command and rng.random() < self.p.slow_commands:
            before = rng.uniform(0, 3 * self.p.timeout)
        else:
            before = self._delay()
        passes = self.passes["sim:in-flight"] = self.passes.get("sim:in-flight", 0) + 1
        planned = self.p.kill_window == "sim:in-flight" and passes == self.p.kill_pass
        chance = self.p.kill_slow if before > call.adapter.timeout else self.p.kill_in_flight
        if planned or (chance and self.count_kills() < 3 and self.fault_rng.random() < chance):
            sched.at(sched.now + rng.uniform(0, before), self._kill_in_flight, worker)
        if command:
            sched.bound(worker, sched.now + rng.uniform(0, 0.02), self._spawn, call, before)
        else:
            sched.bound(worker, sched.now + before, self._send, call)
        sched.bound(worker, sched.now + call.adapter.timeout, self._timed_out, call)

    def _kill_in_flight(self, worker: Worker) -> None:
        if not worker.dead:
            self.kill(worker, "sim:in-flight")

    def _delay(self) -> float:
        """How long a phase of a call takes: mostly short, sometimes longer than the call may take."""
        rng = self.world_rng
        if rng.random() < self.p.slow:
            return rng.uniform(0, 2.5 * self.p.timeout)
        return rng.uniform(0, min(0.5, self.p.timeout / 2))

    def _deliver(self, call: SimCall, outcome: Tuple[Any, ...]) -> None:
        """The call's answer reaches its worker (a bound event: not if it is dead; later if it is stopped)."""
        if call.delivered:
            return
        call.delivered, call.outcome = True, outcome
        if call.kind == "observe":
            self.last_lookup[call.key] = outcome[0]
        elif outcome[0] == "page":
            for key, _ in call.items:  # a key the answer did not list is looked up alone next: that lookup is its last
                if key in outcome[1]["listed"]:
                    self.last_lookup[key] = "present"
        if outcome[0] == "listing":
            for key, _ in call.items or [(call.key, call.payload)]:
                found = key in outcome[1]["listed"]
                self.last_lookup[key] = "present" if found else "unknown" if outcome[1]["cut"] else "absent"
        worker = call.worker
        worker.results.append(call)
        self.log(f"{worker.name} {call.id} answered: {outcome[0]}"
                 + (f" {outcome[1]}" if outcome[0] in ("page", "listing") else ""))
        if call in worker.calls:
            worker.calls.remove(call)
        if worker.outcome is not None and not worker.dead:
            # Its program returned while this call was on its way: the call's thread ends now, as the
            # executor's ``finally`` would, and the process with its last such thread.
            if call.registry is not None:
                call.registry.returned(call.registered)
            if not worker.calls:
                worker.proc.state = "dead"

    def _timed_out(self, call: SimCall) -> None:
        """The call's own timeout: the client gives up (and a command's process group is killed, helpers with it)."""
        if call.delivered:
            return
        if call.proc is not None and self.table.members(call.proc.group):
            self.table.kill_group(call.proc.group)
            self.log(f"{call.id} command killed at its timeout")
        self._deliver(call, ("unknown", f"timed out after {call.adapter.timeout:.3f}s"))

    def _send(self, call: SimCall) -> None:
        """An in-process call reaches the moment it sends (its worker is alive and running)."""
        if call.delivered:
            return  # the client gave up before sending
        if call.past_deadline(self.sched.now):
            self.count("sends_past_deadline_refused")
            self._deliver(call, ("unknown", "the call's deadline passed before it was sent"))
            return
        outcome = self._act(call)
        if outcome is None:
            return  # the answer was dropped: the client times out
        self.sched.bound(call.worker, self.sched.now + self._delay(), self._deliver, call, outcome)

    def _spawn(self, call: SimCall, before: float) -> None:
        """A command-like call's process starts, the call's token in its environment; an instant later it is
        registered."""
        if call.delivered:
            return  # its worker was stopped past the call's timeout: the call ended before its process began
        if call.kind == "invoke" and call.past_deadline(self.sched.now):
            # runner.adapters.commands.CommandAdapter.invoke checks the deadline before it starts the command.
            self.count("sends_past_deadline_refused")
            self._deliver(call, ("not-applied", None))
            return
        token = call.registered.record["token"]  # type: ignore[union-attr]
        call.proc = self.table.new_command(f"{inflight.TOKEN_VARIABLE}={token}")
        call.acts_at = self.sched.now + before
        self.log(f"{call.worker.name} {call.id} spawned pid {call.proc.pid}")
        if self.p.kill_window == "sim:spawned":
            passes = self.passes["sim:spawned"] = self.passes.get("sim:spawned", 0) + 1
            if passes == self.p.kill_pass:
                self.kill(call.worker, "sim:spawned", call.key)
        stall = self.p.stall
        if stall is not None and stall[0] == "sim:spawned" and not call.worker.dead:
            passes = self.passes["stall:sim:spawned"] = self.passes.get("stall:sim:spawned", 0) + 1
            if passes == stall[1]:
                self.stall(call.worker, stall[2], "sim:spawned")  # type: ignore[arg-type]
        self.sched.bound(call.worker, self.sched.now + self.world_rng.uniform(0, 0.01), self._record_child, call)
        self.sched.at(self.sched.now + before, self._command_acts, call)

    def _record_child(self, call: SimCall) -> None:
        if call.proc.alive:
            call.registry.spawned(call.registered, call.proc.pid)  # type: ignore[union-attr]
            call.gate_open = True  # runner.calls.commands writes "go" to the gate right after registering
            if self.p.helpers and self.shape_rng.random() < self.p.helpers:
                self._start_helper(call)

    def _start_helper(self, call: SimCall) -> None:
        """The command, through its gate, starts a helper in its group that will send; in one case of two its leader
        does not wait for it (a wrapper that exits early), else it waits and reports what the helper did."""
        call.helper = self.table.new_helper(call.proc)
        self.count("commands_with_a_helper")
        self.log(f"{call.id} pid {call.proc.pid} starts helper pid {call.helper.pid} in its group")
        if self.shape_rng.random() < 0.5:
            at = self.shape_rng.uniform(self.sched.now, max(self.sched.now, call.acts_at))
            self.sched.at(at, self._leader_exits, call, "it exits without waiting for its helper")

    def _leader_exits(self, call: SimCall, why: str) -> None:
        """A command's leader exits while its helper may still send. Its runner, if it can, sees the command end: it
        kills what is left of the group (``run_command``) and takes the outcome as unknown."""
        if not call.proc.alive:
            return
        call.proc.state = "dead"
        self.count("leaders_gone_before_their_helper")
        self.log(f"{call.id} leader pid {call.proc.pid} exits: {why}")
        self.sched.bound(call.worker, self.sched.now, self._command_gone, call)

    def _command_gone(self, call: SimCall) -> None:
        if self.table.members(call.proc.group):
            self.table.kill_group(call.proc.group)
            self.log(f"{call.id} what was left of its group killed by its runner")
        outcome = ("unknown", "the command exited without an answer")
        self.sched.bound(call.worker, self.sched.now, self._deliver, call, outcome)

    def _command_acts(self, call: SimCall) -> None:
        """The command sends (or looks), unless its process was killed first; it exits a moment later.

        It starts only through its gate: while its runner has not registered it, it waits; once that
        runner is dead, the gate's pipe is closed and the command exits without starting. With a helper,
        the helper sends, whether its leader still runs or not.
        """
        actor = call.helper if call.helper is not None else call.proc
        if not actor.alive:
            self.log(f"{call.id} never sent: its process was killed")
            self.count(f"{call.kind}_commands_killed_before_sending")
            return
        if not call.gate_open:
            if call.worker.dead:
                call.proc.state = "dead"
                self.log(f"{call.id} never started: its runner died before registering it")
                self.count("commands_closed_at_the_gate")
                return
            self.sched.at(self.sched.now + 0.1, self._command_acts, call)
            return
        if actor is not call.proc and not call.proc.alive:
            self.count("helpers_sending_after_their_leader")
            self.log(f"{call.id} helper pid {actor.pid} acts after its leader exited")
            if not self.p.can_find:
                self.signs.add("a-helper-outlived-its-leader-where-processes-cannot-be-read")
        outcome = self._act(call) or ("unknown", "the connection dropped after the request was sent")
        self.sched.at(self.sched.now + self._delay(), self._command_exits, call, outcome)

    def _command_exits(self, call: SimCall, outcome: Tuple[Any, ...]) -> None:
        if call.helper is not None:
            call.helper.state = "dead"
        if not call.proc.alive:
            return
        call.proc.state = "dead"
        self.sched.bound(call.worker, self.sched.now, self._deliver, call, outcome)

    def _act(self, call: SimCall) -> Optional[Tuple[Any, ...]]:
        """The target receives the call now; its answer, or None if the answer is lost on the way back."""
        if self.p.listing and call.kind in ("observe", "many"):
            return self._look_list(call.items or [(call.key, call.payload)])
        if call.kind == "observe":
            if self.world_rng.random() < self.p.lookup_fail:
                return ("lookup-failed", "the lookup failed: 503 from the search index")
            held = self._found(self._value(call.payload, call.key))
            if held:
                return ("present", {"ticket": held[0][2]})
            return ("absent", {"searched": call.key})
        if call.kind == "many":
            return self._look_many(call)
        return self._invoke(call)

    def _value(self, payload: Dict[str, Any], key: str) -> str:
        """What the target looks a call's effect up by: its item's stem when the keys are a list's, else its key."""
        return self.value_of.get(payload.get("item", ""), key)

    def _found(self, value: str) -> List[Tuple[float, float, int, str]]:
        """The effects a lookup by ``value`` finds now (those the target shows already)."""
        return [e for e in self.by_value.get(value, []) if e[1] <= self.sched.now]

    def _look_many(self, call: SimCall) -> Tuple[Any, ...]:
        """One lookup of many keys: refused (414) above the target's limit; else its matches, a page at most."""
        p = self.p
        if self.shape_rng.random() < p.lookup_fail:
            return ("lookup-failed", "the lookup failed: 503 from the search index")
        if p.many_limit is not None and len(call.items) > p.many_limit:
            self.count("lookups_many_refused")
            return ("refused", f"414 URI Too Long: at most {p.many_limit} keys")
        wanted: Dict[str, List[str]] = {}
        for key, payload in call.items:
            wanted.setdefault(self._value(payload, key), []).append(key)
        entries = sorted((e[2], value) for value in wanted for e in self._found(value))
        shown = entries[:p.page] if p.page else entries
        listed: Dict[str, int] = {}
        for ticket, value in shown:
            for key in wanted[value]:
                listed.setdefault(key, ticket)
        more = p.page is not None and len(entries) > p.page
        if more:
            self.count("lookups_many_paged")
        return ("page", {"listed": listed, "entries": len(shown), "more": more})

    def _look_list(self, items: List[Tuple[str, Dict[str, Any]]]) -> Tuple[Any, ...]:
        """One listing read to its end, or cut short: every effect the target shows, newest first, then the entries
        that are no key's, a page at a time; at most ``list_pages`` pages, and a page that cannot be read ends it. A
        page answered "not now" asks for the whole listing later."""
        p, rng = self.p, self.shape_rng
        if rng.random() < p.not_now / 2:
            self.count("listings_not_now")
            return ("not-applied", round(rng.uniform(0.1, 5.0), 3) if p.retry_after else None)
        wanted: Dict[str, List[str]] = {}
        for key, payload in items:
            wanted.setdefault(self._value(payload, key), []).append(key)
        entries = sorted(((e[2], value) for value, effects in self.by_value.items() for e in effects
                          if e[1] <= self.sched.now), reverse=True)
        pages = max(1, -(-(len(entries) + p.list_others) // p.list_page))
        read = min(pages, p.list_pages)
        cut = pages > p.list_pages
        if p.list_cut and rng.random() < p.list_cut:
            read, cut = rng.randint(0, read - 1), True  # a page that could not be read within the call's time
        listed: Dict[str, int] = {}
        matches: Dict[str, int] = {}
        for ticket, value in entries[:read * p.list_page]:
            for key in wanted.get(value, []):
                listed.setdefault(key, ticket)
                matches[key] = matches.get(key, 0) + 1
        self.count("listings")
        if cut:
            self.count("listings_cut_short")
        return ("listing", {"listed": listed, "matches": matches, "cut": cut, "pages": read})

    def _storm(self) -> bool:
        offset = self.sched.now - T0
        return any(start <= offset < start + length for start, length in self.p.storms)

    def _invoke(self, call: SimCall) -> Optional[Tuple[Any, ...]]:
        p, rng, key, now = self.p, self.world_rng, call.key, self.sched.now
        if call.payload.get("item", key) in self.before_items:
            self.violation("done-before-resent", f"{call.id} of {key} by {call.worker.name} reached the target, which "
                           "held its effect before the run began")
        if call.past_deadline(now):
            self.count("calls_sent_past_deadline")
            self.signs.add("call-sent-past-its-deadline")
        if self._storm() or rng.random() < p.not_now:
            self.count("answers_not_now")
            if key in self.resent:
                self.count("not_now_to_resends")
                self.signs.add("not-now-to-a-resend")
            return ("not-applied", round(rng.uniform(0.1, 10.0), 3) if p.retry_after else None)
        epoch = int(call.epoch or 0)
        if p.fences:
            if epoch < self.max_epoch:
                self.count("stale_epochs_refused")
                self.log(f"{call.id} refused: epoch {epoch} < {self.max_epoch}")
                return ("stale", f"epoch {epoch} is older than {self.max_epoch}")
            self.max_epoch = epoch
        item = call.payload.get("item", key)
        if item in self.rejected_items:
            return ("rejected", "422: the target refuses this ticket")
        if rng.random() < p.unknown:
            self.count("unknown_not_applied")
            return ("unknown", "502 from a proxy; the request did not reach the target")
        held = self.effects.setdefault(key, [])
        if key in self.receipted:
            self.violation("call-after-receipt",
                           f"{call.id} of {key} by {call.worker.name} reached the target after the receipt "
                           f"{self.receipted[key]} was recorded", key)
        remembered = [e for e in held if p.retention is None or e[0] > now - p.retention]
        if p.deduplicates and held and not remembered and key in self.resent:
            self.signs.add("a-resend-past-the-retention")
            if call.past_deadline(now) and not p.can_find:
                # references/batch-and-drive.md, section 7: where processes cannot be read, a command that outlives
                # its deadline is neither verified nor ended; the runner stops for a person while it runs, but what it
                # sends after the target forgot the key is a second effect no runner can prevent.
                self.beyond(key, item,
                            "a resend that a command sent past its deadline, where processes cannot be read, "
                            "reached the target after its retention", "unread-resend-past-the-retention")
        if p.deduplicates and remembered:
            self.count("deduplicated")
            receipt = {"ticket": remembered[0][2], "key": key}
        else:
            self.tickets += 1
            lag = ((p.settle if rng.random() < 0.2 else rng.uniform(0, p.settle)) if not p.over_lag
                   else rng.uniform(0, 3 * p.settle + 3))
            if p.unreadable:
                lag = 0.0  # nothing looks it up: a person sees it at the target at once
            effect = (now, now + lag, self.tickets, call.id)
            held.append(effect)
            self.by_value.setdefault(self._value(call.payload, key), []).append(effect)
            of_item = self.by_item.setdefault(item, [])
            of_item.append(effect)
            receipt = {"ticket": self.tickets, "key": key}
            self.count("effects")
            named = f"{key} ({item})" if item != key else key
            self.log(f"{call.worker.name} {call.id} APPLIED {named} ticket {self.tickets} (visible +{lag:.3f})")
            if len(of_item) > 1:
                if p.over_lag:
                    self.count("duplicates_beyond_contract")
                else:
                    calls = ", ".join(e[3] for e in of_item)
                    self.violation("duplicate", f"{item} holds {len(of_item)} effects, from calls {calls}", item)
        if rng.random() < p.drop:
            self.count("answers_dropped")
            return None
        if p.proxy and self.shape_rng.random() < p.proxy:
            self.count("answers_proxied_after_delivery")
            return ("proxied", f"{self.shape_rng.choice((502, 503, 504))} from a proxy; the target applied the call")
        if p.lies and self.shape_rng.random() < p.lies:
            self.count("not_now_after_delivery")
            self.beyond(key, item, "the target answered 'not now' after it applied a call", "not-now-after-delivery")
            return ("not-applied", round(self.shape_rng.uniform(0.1, 10.0), 3) if p.retry_after else None)
        return ("receipt", receipt)

    def _killed(self, group: int, marker: str, victims: List[Proc]) -> None:
        """A runner killed ``group`` for the call whose token is ``marker``: each process it killed must be that
        call's."""
        wrong = [proc for proc in victims if proc.env != marker]
        for proc in wrong:
            whose = "this user" if proc.mine else "another user"
            self.violation("wrong-kill", f"a runner killed pid {proc.pid} ({proc.kind}, {whose}) for a call whose "
                           "token it does not carry")

    # -- what the runner never wrote ----------------------------------------------------------------------
    def _plant(self, kind: str) -> None:
        """Put a record the runner never wrote into every registry the workers use (see :data:`GARBAGE`): one naming
        this user's or another user's process, a pid another process now has, a null start time, a deadline days
        away, text that is no JSON, a FIFO, a name the runner never gives."""
        rng, now, p = self.shape_rng, self.sched.now, self.p
        key = rng.choice(self._keys_now(self.ledger.truth))
        mine, other = self.foreign
        commands = [proc for proc in self.table.procs.values() if proc.kind == "command" and proc.alive]
        caller, child = mine, (other if kind == "another-user" else mine)
        start: Optional[str] = child.start
        if kind == "null-start" and commands:
            child, start = rng.choice(commands), None
        elif kind == "null-start":
            start = None
        elif kind == "reused-pid":
            child = rng.choice(commands) if commands else mine
            start = "1"  # the start time of a process that had the pid before
        registered = now - rng.uniform(0, 5)
        deadline = registered + (3 * 86400.0 if kind == "far-deadline" else rng.uniform(0.5, 2 * p.timeout))
        # Named as the runner names a call's record (inflight.Registry.register), by the pid it names as the caller.
        name = f"{sha256_hex(key.encode())[:20]}.{caller.pid}-{rng.randrange(1, 10 ** 6)}-{rng.getrandbits(24):06x}"
        name += ".json"
        record = {"key": key, "kind": "invoke", "attempt": 1, "owner": "someone-else", "epoch": 1,
                  "caller": [caller.pid, caller.start], "child": [child.pid, start],
                  "token": f"{rng.getrandbits(96):024x}", "registered_at": registered, "deadline": deadline,
                  "ended_at": None}
        text = json.dumps(record, sort_keys=True)
        if kind == "not-json":
            text = text[: len(text) // 2]
        elif kind == "fifo":
            text = FIFO
        elif kind == "stray-name":
            name = "notes.txt"
        self.planted.add(name)
        self.count("records_planted")
        self.log(f"a record the runner never wrote ({kind}) appears as {name}: {text[:160]!r}")
        for room in self.rooms.values():
            room[name] = text

    # -- the ledger's observer ------------------------------------------------------------------------
    def _committed(self, before: Dict[str, Any], after: Dict[str, Any], ops: List[Any], writer: Optional[str],
                   epoch: int) -> None:
        now = self.sched.now
        self.count("commits")
        touched = before["effects"]
        lease = before["lease"]
        if (any(op[1] == ["lease"] for op in ops) and lease.get("owner") is not None and
                after["lease"].get("owner") is not None):
            self.count("takeovers")
        if touched:
            holds = (lease.get("owner") == writer and lease.get("epoch") == epoch
                     and lease.get("expires_at") is not None
                     and parse_time(lease["expires_at"]) > now)
            if writer == "person" and not self._lease_live(lease, now):
                holds = True  # a person's record needs the lease only while someone holds it live
            if not holds:
                self.violation("unfenced-write",
                               f"{writer} at epoch {epoch} changed {sorted(touched)} while the lease was {lease}")
        for key, was in touched.items():
            now_record = after["effects"].get(key) or {}
            if was.get("receipt") is not None:
                if now_record.get("receipt") != was["receipt"]:
                    self.violation("receipt-lost",
                                   f"{key}: the receipt {was['receipt']} became {now_record.get('receipt')}")
                if now_record.get("state") == "absent":
                    self.violation("absence-over-receipt", f"{key} recorded absent over the receipt {was['receipt']}")
            if self.p.unreadable and now_record.get("state") == "started" and was.get("state") in UNRESOLVED:
                self.violation("unknown-resent", f"{key} was begun again by {writer} while its outcome was unknown "
                               f"({was.get('state')}), at a target that cannot be read back")
            if now_record.get("state") == "started":
                if was.get("state") == "uncertain":
                    self.resent.add(key)
                else:
                    self.resent.discard(key)
            if now_record.get("receipt") is not None and key not in self.receipted:
                self.receipted[key] = now_record["receipt"]
            if now_record.get("state") == "verified" and was.get("state") != "verified":
                self.verified_seen += 1
                self.reconciliation_exits = 0
                if self.final is not None and self.final.startswith("needs-reconciliation"):
                    self.final = None  # a worker still alive made progress after the run was left for a person
                item = self._item_of(after, key)
                if not any(e[1] <= now for e in self.by_item.get(item, [])):
                    self.violation("phantom", f"{key} verified by {writer} while the target shows none of it"
                                   + (f" (its item {item})" if item != key else ""))
            if self.trace is not None and now_record.get("state") != was.get("state"):
                self.log(f"{writer} commits {key}: {was.get('state')} -> {now_record.get('state')}")

    # -- the end ----------------------------------------------------------------------------------------
    def _finish(self) -> Dict[str, Any]:
        truth = self.ledger.truth
        for name, why in sorted(self.set_aside.items()):
            if name in self.planted:
                self.count("records_set_aside")
            else:
                self.violation("record-set-aside", f"the registry set its own record {name} aside: {why}")
        keys = self._keys_now(truth)
        for key in keys + sorted(k for k in self.effects if k not in keys):
            record = truth["effects"].get(key) or {}
            state = record.get("state")
            held = len([e for e in self.effects.get(key, []) if e[3] != "before"])  # the run's own effects
            if held and state not in ("verified",) + UNRESOLVED and not self.p.over_lag:
                self.violation("lost-acknowledgement",
                               f"the target holds {held} effect(s) of {key}; the ledger says {state}", key)
            item = self._item_of(truth, key)
            if state == "verified" and not self.by_item.get(item):
                self.violation("phantom", f"{key} is verified; the target holds none of it"
                               + (f" (its item {item})" if item != key else ""))
        if self._all_verified(truth):
            ending = "settled"
        elif self.hung:
            ending = "hung"
        elif self.sched.timed_out or self.sched.stuck:
            ending = "time-limit" if self.sched.timed_out else "stuck"
            self.violation("unsettled", f"the schedule did not end ({ending}); ledger {self._states(truth)}")
        elif self.final is None:
            ending = "unsettled"
            self.violation("unsettled", f"no worker is left and the run is not settled; ledger {self._states(truth)}")
        else:
            ending = self.final
            why = self._unexplained(ending, truth)
            if why:
                self.violation("unsettled", f"stopped with {ending} ({self.final_detail[:200]}), {why}")
        self.log(f"END {ending}; ledger {self._states(truth)}; target "
                 f"{[(k, len(v)) for k, v in sorted(self.effects.items())]}")
        self.count(f"ending:{ending}")
        return {"seed": self.seed, "ending": ending, "violations": list(self.violations), "counts": dict(self.counts),
                "signs": sorted(self.signs),
                "kills": dict(self.kills), "exits": dict(self.exits), "moves": dict(self.moves), "params": self.p,
                "trace": self.trace,
                "trace_digest": sha256_hex("\n".join(self.trace).encode()) if self.trace is not None else None}

    def _states(self, truth: Dict[str, Any]) -> Dict[str, Any]:
        return {k: (truth["effects"].get(k) or {}).get("state") for k in self._keys_now(truth)}

    def _unexplained(self, ending: str, truth: Dict[str, Any]) -> str:
        """Why the schedule's faults do not explain a stop ("" when they do)."""
        keys = self._keys_now(truth)
        open_keys = [k for k in keys if (truth["effects"].get(k) or {}).get("state") != "verified"]
        if ending == "failed":
            rejected = any(self._item_of(truth, k) in self.rejected_items for k in open_keys)
            return "" if rejected else "no key was rejected by the target"
        if ending == "limit-exhausted":
            absent = [k for k in open_keys if (truth["effects"].get(k) or {}).get("state") == "absent"]
            if not self.p.over_lag and any(self.effects.get(k) and k not in self.outside for k in absent):
                return "a key recorded absent is held by the target"
            lost = [k for k in keys
                    if int((truth["effects"].get(k) or {}).get("attempts", 0)) > (1 if k in self.receipted else 0)]
            return "" if lost else "no attempt went without its receipt recorded"
        if ending == "invalid-input":
            if self.p.shared or (self.refreeze or "").endswith("must be refused"):
                return ""
            return "no two items share a lookup value, and no list frozen anew had to move a key the ledger holds"
        if ending == "needs-reconciliation:unknown-outcome":
            return "" if any(self.final_lookups.get(k) in ("lookup-failed", "unknown") for k in open_keys) else \
                "the last lookup of every open key answered"
        if ending == "needs-reconciliation:receipt-contradiction":
            return "" if self.p.over_lag else "the target kept its settle time, yet an absence contradicted a receipt"
        if ending == "needs-reconciliation:unverifiable-command":
            return ("" if not self.p.can_find
                    else "processes can be read here, yet a command was taken for one that cannot be verified")
        if ending == "needs-reconciliation:ledger-refusal":
            return "the ledger refused what the lifecycle proposed"
        return f"no fault explains {ending}"


def run_schedule(seed: int, variant: str = "real", trace: bool = False,
                 params: Optional[Params] = None) -> Dict[str, Any]:
    """Run schedule ``seed`` and return what it did and found (``trace``: the event lines too).

    ``params``: the world to use instead of the seed's own (a hand-made scenario; the seed still drives every choice).
    """
    return Schedule(seed, variant, trace, params).run()


# -- a campaign ---------------------------------------------------------------------------------------------

def simulate(seed: int, schedules: int, variant: str = "real", trace: bool = False, progress: Optional[IO[str]] = None,
             stop_at_first: bool = False) -> Dict[str, Any]:
    """Run schedules ``seed`` .. ``seed + schedules - 1``; add up what they did; name the first failing seed.

    :param stop_at_first: end at the first schedule with a violation (a broken variant's search).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}")
    began = time.perf_counter()
    totals: Dict[str, int] = {}
    kills: Dict[str, int] = {}
    exits: Dict[str, int] = {}
    endings: Dict[str, int] = {}
    moves: Dict[str, int] = {}
    violations: Dict[str, int] = {}
    examples: List[str] = []
    traces: List[Dict[str, Any]] = []
    first: Optional[int] = None
    failing: List[int] = []
    signs: Dict[str, int] = {}
    parallel: Dict[int, int] = {}
    shapes: Dict[str, int] = {}
    done = 0
    for seed_i in range(seed, seed + schedules):
        result = run_schedule(seed_i, variant, trace)
        done += 1
        for into, table in ((totals, result["counts"]), (kills, result["kills"]), (exits, result["exits"]),
                            (moves, result["moves"])):
            for key, value in table.items():
                into[key] = into.get(key, 0) + value
        endings[result["ending"]] = endings.get(result["ending"], 0) + 1
        parallel[result["params"].parallel] = parallel.get(result["params"].parallel, 0) + 1
        for name in _shapes_of(result["params"]):
            shapes[name] = shapes.get(name, 0) + 1
        if result["trace"] is not None:
            traces.append({"seed": seed_i, "digest": result["trace_digest"], "lines": result["trace"]})
        if result["violations"]:
            failing.append(seed_i)
            sign = " and ".join(result["signs"]) or "neither"
            signs[sign] = signs.get(sign, 0) + 1
            for kind, detail in result["violations"]:
                violations[kind] = violations.get(kind, 0) + 1
                if len(examples) < 10:
                    examples.append(f"seed {seed_i}: {kind}: {detail[:300]}")
            if first is None:
                first = seed_i
                if stop_at_first:
                    break
        if progress is not None and done % 1000 == 0:
            progress.write(f"simulate: {done}/{schedules} schedules, {sum(violations.values())} violations, "
                           f"{time.perf_counter() - began:.0f}s\n")
            progress.flush()
    seconds = time.perf_counter() - began
    return {
        "variant": variant,
        "seed": seed,
        "schedules": done,
        "seconds": round(seconds, 2),
        "schedules_per_second": round(done / seconds, 1) if seconds else None,
        "workers": totals.get("workers", 0),
        "kills": sum(kills.values()),
        "kills_by_window": dict(sorted(kills.items())),
        "stalls": totals.get("stalls", 0),
        "stalled_workers_fenced": totals.get("stalled_workers_fenced", 0),
        "takeovers": totals.get("takeovers", 0),
        "lease_breaks": totals.get("lease_breaks", 0),
        "same_owner_twins": totals.get("same_owner_twins", 0),
        "calls": totals.get("calls_invoke", 0) + totals.get("calls_observe", 0),
        "invokes": totals.get("calls_invoke", 0),
        "observes": totals.get("calls_observe", 0),
        "effects_at_target": totals.get("effects", 0),
        "commits": totals.get("commits", 0),
        "faults_at_target": {k: totals.get(k, 0) for k in ("answers_dropped", "answers_not_now", "unknown_not_applied",
                                                           "stale_epochs_refused", "deduplicated")},
        "commands_killed_before_sending": totals.get("invoke_commands_killed_before_sending", 0),
        "commands_closed_at_the_gate": totals.get("commands_closed_at_the_gate", 0),
        "sends_past_deadline_refused": totals.get("sends_past_deadline_refused", 0),
        "waits_for_calls_in_flight": moves.get("wait-call", 0),
        "kills_of_calls_past_deadline": moves.get("kill-call", 0),
        "found_before_first_call": moves.get("found", 0),
        "duplicates_beyond_contract": totals.get("duplicates_beyond_contract", 0),
        "schedules_by_shape": {name: shapes.get(name, 0) for name in _SHAPE_NAMES},
        "shaped": {k: totals.get(k, 0) for k in _SHAPED},
        "beyond_promise": totals.get("beyond_promise", 0),
        "beyond_promise_by_cause": {k.split(":", 1)[1]: v for k, v in sorted(totals.items())
                                    if k.startswith("outside:")},
        "calls_started_past_deadline": totals.get("calls_started_past_deadline", 0),
        "calls_sent_past_deadline": totals.get("calls_sent_past_deadline", 0),
        "not_now_to_resends": totals.get("not_now_to_resends", 0),
        "violations": sum(violations.values()),
        "violations_by_invariant": {k: violations.get(k, 0) for k in INVARIANTS},
        "failing_schedules": len(failing),
        "failing_schedules_by_sign": dict(sorted(signs.items())),
        "failing_seeds": failing[:100],
        "endings": dict(sorted(endings.items())),
        "worker_exits": dict(sorted(exits.items())),
        "parallel": dict(sorted(parallel.items())),
        "first_failing_seed": first,
        "replay": replay_command(first, variant) if first is not None else None,
        "examples": examples,
        "traces": traces if trace else None,
    }


#: The shapes a campaign counts schedules of (``none``: a schedule that drew none, and runs as it did before they were).
_SHAPE_NAMES = ("many", "paged", "refused-many", "proxy", "lies", "helpers", "garbage", "spellings", "listed", "shared",
                "migration", "listing", "listing-cut", "unreadable", "observe-first", "done-before", "none")
#: What the schedules did with their shapes, as counted.
_SHAPED = ("calls_many", "lookups_many_paged", "lookups_many_refused", "answers_proxied_after_delivery",
           "not_now_after_delivery", "commands_with_a_helper", "leaders_gone_before_their_helper",
           "helpers_sending_after_their_leader", "records_planted", "records_set_aside", "migrations",
           "refreeze:must be refused", "refreeze:may be taken", "listings", "listings_cut_short", "listings_not_now",
           "needs-reconciliation:unreadable", "person_records", "done_before")


def _shapes_of(p: Params) -> List[str]:
    """The names of the shapes schedule ``p`` drew."""
    drawn = (("many", p.many), ("paged", p.many and p.page), ("refused-many", p.many_limit is not None),
             ("proxy", p.proxy), ("lies", p.lies), ("helpers", p.helpers), ("garbage", p.garbage),
             ("spellings", p.spellings > 1), ("listed", p.listed), ("shared", p.shared), ("migration", p.migration),
             ("listing", p.listing), ("listing-cut", p.listing and (p.list_cut or p.list_pages < 10)),
             ("unreadable", p.unreadable), ("observe-first", p.observe_first), ("done-before", p.done_before))
    return [name for name, on in drawn if on] or ["none"]


def format_report(result: Dict[str, Any]) -> str:
    """The campaign's figures as lines of text."""
    skip = ("traces", "examples", "kills_by_window", "violations_by_invariant", "endings", "worker_exits",
            "faults_at_target", "parallel",
            "failing_schedules_by_sign", "failing_seeds", "schedules_by_shape", "shaped", "beyond_promise_by_cause")
    lines = [f"{key:32} {value}" for key, value in result.items() if key not in skip]
    for title in ("kills_by_window", "endings", "worker_exits", "faults_at_target", "schedules_by_shape", "shaped",
                  "beyond_promise_by_cause", "violations_by_invariant", "failing_schedules_by_sign", "parallel"):
        lines.append(f"{title}:")
        lines += [f"  {name!s:38} {count}" for name, count in result[title].items()]
    if result["failing_seeds"]:
        lines.append("failing seeds: " + " ".join(map(str, result["failing_seeds"]))
                     + (" ..." if result["failing_schedules"] > 100 else ""))
    lines += [f"violation: {example}" for example in result["examples"]]
    for trace in result.get("traces") or []:
        lines.append(f"trace of seed {trace['seed']} (sha256 {trace['digest']}):")
        lines += ["  " + line for line in trace["lines"]]
    if result["first_failing_seed"] is not None:
        lines.append(f"first failing seed: {result['first_failing_seed']}; replay: {result['replay']}")
    lines.append("RESULT: " + ("ok" if result["violations"] == 0 else "FAILED"))
    return "\n".join(lines)
