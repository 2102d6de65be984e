"""Read-only views of a run: the brief for a fresh model, the event stream, the report.

* :func:`brief` is bounded Markdown (2,000 characters unless told otherwise)
  built from durable facts only: goal, verified steps with their evidence,
  artifacts and hashes, jobs, unresolved effects, failures, and the next
  action. It is what a harness injects when a new session starts, so every
  text in it that the runner did not write is a labelled quotation
  (:mod:`runner.base.quoting`).
* :func:`events` returns journal records after a sequence number (the
  revision), so an observer that disconnects resumes where it left off. An
  observer only reads: its disconnecting never affects the run.
* :func:`report` computes recovery metrics for the whole run, across every
  worker and attempt.
* :func:`items` lists every item of a batch step with its key, state,
  attempts, deferrals (apart: a "not now" is no attempt) and cost.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..contract.spec import contract_of
from ..ledger.effects import FLAGS, attempt_counts
from ..ledger.states import UNRESOLVED
from ..base.errors import InvalidInput
from ..base.times import parse_time
from ..base.quoting import (APPROVAL, CONTRACT, EVIDENCE, ITEMS, NOTICE, PERSON, RECORD, TARGET, WORKER,
                            WORKER_OR_TARGET, fit, moment, name, number, quote, word)
from ..ledger.steps import plan_steps
from ..ledger.batch import ITEM_STATES, batch_of, item_state, keys_of, progress as batch_progress
from ..execution.evidence import evidence_view
from ..ledger.costs import spend, spend_line
from .stops import line as stop_line, stop_of

__all__ = ["brief", "action_text", "report", "items", "events_after", "status_view", "decision_view",
           "possible_duplicates"]


def _fit(sections: List[List[str]], order: List[int], limit: int) -> str:
    """Join ``sections`` (in display order) within ``limit`` characters.

    Sections are admitted by importance (``order``, most important first);
    the first one that does not fit whole is cut line by line, and every
    later one is left out, with one line saying so.
    """
    note = "… (cut to fit; 'status --json' has everything)"
    kept: List[List[str]] = [[] for _ in sections]
    used = 0
    cut = False
    for index in order:
        for line in sections[index]:
            cost = len(line) + 1
            if used + cost + len(note) + 1 > limit:
                cut = True
                break
            kept[index].append(line)
            used += cost
        if cut:
            break
    text = "\n".join(line for section in kept for line in section)
    if cut:
        text = (text + "\n" + note) if text else note
    return text[:limit]


def _action_target(action: Dict[str, Any]) -> str:
    """The effect key, job key or step an action is about (the kind says which)."""
    target = action.get("key") if action.get("key") is not None else action.get("step")
    return "" if target is None else " " + name(target)


def action_text(action: Dict[str, Any], decided: bool = True) -> str:
    """One action as prose: its kind and target from its fields, quoted item and artifact, and its ``why``.

    :param decided: the action comes from :func:`runner.execution.recovery.decide` just now, whose ``why`` and
        ``approval`` are the runner's prose; an action read from the run's files (a stored
        ``next_action``) has them quoted instead.
    """
    if not isinstance(action, dict):
        return quote(action, RECORD, 200)
    text = word(action.get("kind")) + _action_target(action)
    if action.get("kind") == "wait" and action.get("until"):
        text += f" until {moment(action['until'])}"
    if action.get("item") is not None:
        text += f" (item {quote(action['item'], ITEMS, 120)})"
    if action.get("artifact"):
        text += f" (artifact {quote(action['artifact'], CONTRACT, 120)})"
    why = action.get("why")
    if why:
        text += ": " + (why if decided else quote(why, RECORD, 300))
    if action.get("approval"):
        text += "; " + (action["approval"] if decided else quote(action["approval"], RECORD, 300))
    return text


def brief(state: Dict[str, Any], decision: Optional[Dict[str, Any]] = None, limit: int = 2000,
          calls: Sequence[Any] = ()) -> str:
    """Markdown context for a model that has never seen this run, from durable facts only.

    ``calls``: what :func:`runner.calls.inflight.findings` reports of the calls folder (a refused folder,
    entries that cannot be calls); named in one line among the effects, never by their names.

    The runner writes every word of it but the quotations: every value it did
    not write (the goal, ids, reasons, receipts, notes) is shown through
    :mod:`runner.base.quoting`, after a line that says what quotations are. The
    next action and the stop are built from ``decision``'s fields and its
    prose (``detail``, ``why``), which :func:`runner.execution.recovery.decide` writes
    the same way.
    """
    head = [
        f"# Run {name(state['task_id'])} (revision {number(state['revision'])}, {word(state['status'])})",
        NOTICE,
        f"Goal: {quote(contract_of(state).goal, CONTRACT, 240)}",
    ]
    if decision is not None:
        if decision["decision"] == "act":
            head.append(f"Next action: {fit(action_text(decision['action']), 700)}")
        else:
            head.append(f"Stopped: {fit(stop_line(decision, state), 700)}")
    elif state.get("next_action"):
        head.append(f"Next action (as recorded): {fit(action_text(state['next_action'], decided=False), 700)}")
    spent = spend_line(state, limited_only=False)
    if spent:
        head.append(f"Spend: {spent}")
    head.append("Facts below come from the run's durable state; a claim not listed here is not established.")
    steps = ["", "## Steps"]
    for spec in plan_steps(state):
        record = state["steps"].get(spec.id) or {}
        status = record.get("state", "pending")
        line = f"- {name(spec.id, CONTRACT)}: {word(status)}"
        items = batch_progress(state, spec.id)
        if items:
            line += (f"; items {number(items['verified'])} verified + {number(items['skipped'])} skipped of "
                     f"{number(items['total'])}")
        if status == "done" and record.get("observed"):
            seen = record["observed"]
            line += ("; observed by the runner: "
                     f"{quote({k: seen[k] for k in ('checks', 'artifacts', 'items') if k in seen}, EVIDENCE, 80)}")
        if status == "done" and record.get("evidence"):
            line += f"; claimed (not checked): {quote(record.get('evidence'), WORKER, 60)}"
        elif record.get("error"):
            line += f"; last error ({word(record.get('class'))}): {quote(record['error'], WORKER_OR_TARGET, 80)}"
        if record.get("attempts", 0) > 1:
            line += f"; attempts {number(record['attempts'])}"
        steps.append(line)
    effects = state["effects"]
    counts: Dict[str, int] = {}
    for effect in effects.values():
        counts[effect["state"]] = counts.get(effect["state"], 0) + 1
    eff = ["", "## Effects", "- " + (", ".join(f"{n} {word(k)}" for k, n in sorted(counts.items())) or "none")]
    unresolved = sorted((k, e) for k, e in effects.items() if e["state"] in UNRESOLVED)
    for key, effect in unresolved[:5]:
        line = f"- UNRESOLVED {name(key)}: {word(effect['state'])}"
        if effect.get("reason"):
            line += f" ({quote(effect['reason'], WORKER_OR_TARGET, 120)})"
        elif effect.get("receipt"):
            line += f" (receipt {quote(effect['receipt'], TARGET, 60)})"
        eff.append(line)
    if len(unresolved) > 5:
        eff.append(f"- … and {len(unresolved) - 5} more unresolved")
    flagged = possible_duplicates(state)
    for key, reasons in flagged[:5]:
        eff.append(f"- CHECK {name(key)}: it may have a duplicate at the target; a person should look "
                   f"({'; '.join(reasons)})")
    if len(flagged) > 5:
        eff.append(f"- … and {len(flagged) - 5} more to check")
    if calls:
        eff.append(_calls_line(calls))
    jobs = [f"- {name(k)}: {word(j['state'])}"
            + (f", exit {number(j['exit_code'])}" if j.get("exit_code") is not None else "")
            + f", cursor {number(j.get('cursor', 0))}" for k, j in sorted(state["jobs"].items())]
    job_part = ["", "## Jobs"] + (jobs[:5] or ["- none"])
    control = ["", "## Control"]
    cancellation = state["observations"].get("cancellation")
    if isinstance(cancellation, dict):
        control.append(f"- cancellation: by {name(cancellation.get('by'))}: "
                       f"{quote(cancellation.get('reason'), PERSON, 120)}")
    else:
        control.append("- cancellation: none")
    approvals = state["observations"]["approvals"]
    for label in ("pending", "granted", "used", "denied"):
        ids = [f"{name(rid)} ({name(a['action'], APPROVAL)})" for rid, a in sorted(approvals.items())
               if a["state"] == label]
        if ids or label == "pending":
            control.append(f"- approvals {label}: {', '.join(ids[:3]) or 'none'}")
    lease = state["lease"]
    holder = name(lease.get("owner")) if lease.get("owner") is not None else "nobody"
    control.append(f"- lease: {holder} at epoch {number(lease.get('epoch'))} until {moment(lease.get('expires_at'))}")
    # Shown in this order; kept, when space runs out, in order of importance:
    # the goal and next action, then unresolved effects, steps, control, jobs.
    return _fit([head, steps, eff, job_part, control], [0, 2, 1, 4, 3], limit)


def _calls_line(calls: Sequence[Any]) -> str:
    """One line on what the calls folder holds that the runner does not act on (the runner's words and counts only)."""
    if any(f.code == "calls-refused" for f in calls):
        return ("- CALLS IN FLIGHT REFUSED: the calls folder is not this user's own, or others may change it, or it "
                "holds calls another user began; nothing is called or observed until that is fixed ('doctor' says "
                "what was found)")
    return (f"- SET ASIDE: {number(len(calls))} item(s) in the calls folder cannot be calls of this runner; it does "
            "not act on them ('doctor' lists them and where they were moved; a person should look)")


def events_after(store: Any, after: int) -> Dict[str, Any]:
    """The journal records after sequence ``after``, from the run's whole history.

    ``truncated`` when some of those asked for are not held: ``dropped`` then
    says what the run's retention dropped (its range, times and counts), and
    ``damage`` what the store found missing or altered in its history.
    """
    records, oldest = store.records_after(after)
    truncated = after + 1 < oldest
    out = {
        "after": after,
        "truncated": truncated,
        "oldest": oldest,
        "last": store.revision,
        "events": [{"seq": r["rev"], "at": r["at"], "epoch": r["epoch"], "ops": r["ops"], "hash": r["hash"]}
                   for r in records],
    }
    history = store.state["observations"].get("history")
    dropped = history.get("dropped") if isinstance(history, dict) else None
    if isinstance(dropped, dict):
        out["dropped"] = {k: dropped.get(k) for k in ("first", "through", "records", "first_at", "last_at", "policy")}
    damage = [f.message for f in getattr(store, "history_findings", ()) if f.level == "damage"]
    if damage:
        out["damage"] = damage
    return out


def report(state: Dict[str, Any]) -> Dict[str, Any]:
    """Recovery metrics of the whole run, across every worker and attempt.

    ``effect_attempts`` and ``retries`` count calls that could have created an effect; ``effect_deferrals`` the
    "not now" answers, apart (a run journaled before they were counted apart has none, and counts every call).
    """
    counters = state["counters"]
    effects = state["effects"].values()
    steps = state["steps"].values()
    created = parse_time(state["created_at"])
    updated = parse_time(state["updated_at"])
    made = [attempt_counts(e) for e in effects]
    deferrals = sum(c["deferrals_total"] for c in made)
    return {
        "task_id": state["task_id"],
        "status": state["status"],
        "revision": state["revision"],
        "elapsed_seconds": round(updated - created, 3),
        "recoveries": int(counters.get("recoveries", 0)),
        "recovery_wait_seconds": round(float(counters.get("recovery_wait_seconds", 0.0)), 3),
        "repeated_steps": sum(max(0, int(s.get("attempts", 0)) - 1) for s in steps),
        "effects": len(state["effects"]),
        "effects_verified": sum(1 for e in effects if e["state"] == "verified"),
        "unknown_results": int(counters.get("uncertain_effects", 0)),
        "reconciled_effects": int(counters.get("reconciled_effects", 0)),
        "unresolved_effects": sum(1 for e in effects if e["state"] in UNRESOLVED),
        "retries": sum(max(0, c["attempts_total"] - 1) for c in made),
        "step_attempts": int(counters.get("step_attempts", 0)),
        # Every begin is counted; those answered "not now" created nothing and are counted apart.
        "effect_attempts": max(0, int(counters.get("effect_attempts", 0)) - deferrals),
        "effect_deferrals": deferrals,
        "effects_reopened": sum(1 for c in made if c["reopened"]),
        "orphaned_jobs": int(counters.get("jobs_orphaned", 0)),
        "possible_duplicates": sum(1 for e in effects if e.get("flags")),
        "cost": dict(counters.get("cost", {})),
        "spend": spend(state),
        **_item_counts(state),
    }


def items(state: Dict[str, Any], step: str, only: Optional[str] = None) -> Dict[str, Any]:
    """Every item of the batch ``step`` in item order (those in state ``only``, when given):
    ``{"step", "count", "total", "states", "items"}``.

    Each item has ``index``, ``item``, ``key``, ``state`` (one of :data:`runner.ledger.batch.ITEM_STATES`),
    ``attempts`` and ``deferrals`` (:func:`runner.ledger.effects.attempt_counts`, the present budget), ``cost``
    (its effect's recorded cost, ``{}`` when none), and where they apply ``reason`` (a failure's or a skip's),
    ``reopened`` (how often a person reopened it) and ``next_attempt_at``. ``states`` counts every item by state.

    :raises InvalidInput: no such step, not a batch step, not started, or ``only`` is no item state.
    """
    if only is not None and only not in ITEM_STATES:
        raise InvalidInput(f"no item state {only!r} (one of: {', '.join(ITEM_STATES)})")
    batch = batch_of(state, step)
    keys = keys_of(batch)[0]
    skipped = batch.get("skipped", {})
    counts = {name: 0 for name in ITEM_STATES}
    out = []
    for index, key in enumerate(keys):
        current = item_state(state, batch, key)
        counts[current] += 1
        if only is not None and current != only:
            continue
        effect = state["effects"].get(key) or {}
        made = attempt_counts(effect)
        row: Dict[str, Any] = {"index": index, "item": batch["items"][index], "key": key, "state": current,
                               "attempts": made["attempts"], "deferrals": made["deferrals"],
                               "cost": dict(effect.get("cost") or {})}
        reason = skipped[key]["reason"] if key in skipped else effect.get("reason") if current == "failed" else None
        if reason is not None:
            row["reason"] = reason
        if made["reopened"]:
            row["reopened"] = made["reopened"]
        if effect.get("next_attempt_at") and current not in ("verified", "skipped"):
            row["next_attempt_at"] = effect["next_attempt_at"]
        out.append(row)
    return {"step": step, "count": len(out), "total": len(keys), "states": {k: v for k, v in counts.items() if v},
            "items": out}


def _item_counts(state: Dict[str, Any]) -> Dict[str, Any]:
    """Batch items across the run, and the steps whose evidence was observed or only claimed."""
    totals = {"items": 0, "items_verified": 0, "items_skipped": 0}
    for spec in plan_steps(state):
        items = batch_progress(state, spec.id)
        if items:
            totals["items"] += items["total"]
            totals["items_verified"] += items["verified"]
            totals["items_skipped"] += items["skipped"]
    records = [r for r in state["steps"].values() if r.get("state") == "done"]
    totals["steps_evidence_observed"] = sum(1 for r in records if r.get("observed"))
    totals["steps_evidence_claimed"] = sum(1 for r in records if r.get("evidence"))
    return totals


def possible_duplicates(state: Dict[str, Any]) -> List[Tuple[str, List[str]]]:
    """Effects marked for a person to check (their ``flags``, :data:`runner.ledger.effects.FLAGS`), with why, by key."""
    out = []
    for key, effect in sorted(state["effects"].items()):
        flags = effect.get("flags") if isinstance(effect, dict) else None
        if flags:
            out.append((key, [FLAGS.get(f, quote(f, RECORD, 60)) if isinstance(f, str) else quote(f, RECORD, 60)
                              for f in flags]))
    return out


def decision_view(decision: Dict[str, Any], state: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A decision of :func:`runner.execution.recovery.decide` as the views show it: act with its action, or stop with
    its reason, and the code and sentence of :mod:`runner.surfaces.stops` (its specifics read from ``state``)."""
    if decision["decision"] == "act":
        return {"decision": "act", "action": decision["action"], "text": action_text(decision["action"])}
    stop = stop_of(decision, state)
    return {"decision": "stop", "reason": decision["reason"], "stop_code": stop.code, "sentence": stop.sentence,
            "detail": decision["detail"], "text": f"stop: {stop.code}: {stop.sentence}"}


def _without_records(steps: Dict[str, Any]) -> Dict[str, Any]:
    """The steps' records with each batch's frozen records left out: they may be megabytes, and
    ``effect show KEY --json`` shows what an item sent."""
    return {sid: dict(record, batch={k: v for k, v in record["batch"].items() if k != "records"})
            if isinstance(record, dict) and "records" in (record.get("batch") or {}) else record
            for sid, record in steps.items()}


def status_view(state: Dict[str, Any], decision: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The run at a glance, as ``status --json`` and the MCP ``status`` tool report it.

    ``next`` is ``decision`` (what ``next`` decides now, from the lease holder's side), the same
    one ``brief`` shows. ``recorded_intent`` is the state's ``next_action``: what ``recover`` or
    the last step verb persisted, which may no longer hold, so it is never shown under the name
    of the next action.
    """
    counts: Dict[str, int] = {}
    for effect in state["effects"].values():
        kind = effect.get("state", "unknown") if isinstance(effect, dict) else "unknown"
        counts[kind] = counts.get(kind, 0) + 1
    return {
        "task_id": state["task_id"],
        "schema_version": state["schema_version"],
        "plan_digest": state["plan_digest"],
        "revision": state["revision"],
        "status": state["status"],
        "created_at": state["created_at"],
        "updated_at": state["updated_at"],
        "current_step": state["current_step"],
        "completed_steps": state["completed_steps"],
        "steps": _without_records(state["steps"]),
        "recorded_intent": state["next_action"],
        "effects": counts,
        "lease": state["lease"],
        "cancellation": state["observations"].get("cancellation"),
        "next": decision_view(decision, state) if decision is not None else None,
        "items": {s.id: progress for s in plan_steps(state) for progress in [batch_progress(state, s.id)] if progress},
        "spend": spend(state),
        "evidence": {k: evidence_view(r) for k, r in state["steps"].items()
                     if isinstance(r, dict) and evidence_view(r)},
    }
