"""Read-only views of a run: the brief for a fresh model, the event stream, the report.

* :func:`brief` is bounded Markdown (2,000 characters unless told otherwise)
  built from durable facts only: goal, verified steps with their evidence,
  artifacts and hashes, jobs, unresolved effects, failures, and the next
  action. It is what a harness injects when a new session starts.
* :func:`events` returns journal records after a sequence number (the
  revision), so an observer that disconnects resumes where it left off. An
  observer only reads: its disconnecting never affects the run.
* :func:`report` computes recovery metrics for the whole run, across every
  worker and attempt.
"""

from typing import Any, Dict, List, Optional

from .lifecycle import UNRESOLVED
from .envelope import parse_time
from .steps import plan_steps
from .batch import progress as batch_progress
from .evidence import evidence_view

__all__ = ["brief", "report", "events_after", "status_view"]


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


def _short(value: Any, width: int = 80) -> str:
    text = value if isinstance(value, str) else __import__("json").dumps(value, sort_keys=True)
    return text if len(text) <= width else text[: width - 1] + "…"


def brief(state: Dict[str, Any], decision: Optional[Dict[str, Any]] = None, limit: int = 2000) -> str:
    """Markdown context for a model that has never seen this run, from durable facts only."""
    plan = state["plan"]
    head = [
        f"# Run {state['task_id']} (revision {state['revision']}, {state['status']})",
        f"Goal: {_short(plan.get('goal', ''), 300)}",
    ]
    if decision is not None:
        if decision["decision"] == "act":
            head.append(f"Next action: {_short(decision['action'], 400)}")
        else:
            head.append(f"Stopped: {decision['reason']}: {_short(decision['detail'], 300)}")
    elif state.get("next_action"):
        head.append(f"Next action: {_short(state['next_action'], 400)}")
    head.append("Facts below come from the run's durable state; a claim not listed here is not established.")
    steps = ["", "## Steps"]
    for spec in plan_steps(state):
        record = state["steps"].get(spec["id"]) or {}
        status = record.get("state", "pending")
        line = f"- {spec['id']}: {status}"
        items = batch_progress(state, spec["id"])
        if items:
            line += f"; items {items['verified']} verified + {items['skipped']} skipped of {items['total']}"
        if status == "done" and record.get("observed"):
            seen = record["observed"]
            line += f"; observed by the runner: {_short({k: seen[k] for k in ('checks', 'artifacts', 'items') if k in seen}, 120)}"
        if status == "done" and record.get("evidence"):
            line += f"; claimed (not checked): {_short(record.get('evidence'), 120)}"
        elif record.get("error"):
            line += f"; last error ({record.get('class')}): {_short(record['error'], 120)}"
        if record.get("attempts", 0) > 1:
            line += f"; attempts {record['attempts']}"
        steps.append(line)
    effects = state["effects"]
    counts: Dict[str, int] = {}
    for effect in effects.values():
        counts[effect["state"]] = counts.get(effect["state"], 0) + 1
    eff = ["", "## Effects", "- " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none")]
    unresolved = sorted((k, e) for k, e in effects.items() if e["state"] in UNRESOLVED)
    for key, effect in unresolved[:5]:
        detail = effect.get("reason") or effect.get("receipt")
        eff.append(f"- UNRESOLVED {key}: {effect['state']}" + (f" ({_short(detail, 80)})" if detail else ""))
    if len(unresolved) > 5:
        eff.append(f"- … and {len(unresolved) - 5} more unresolved")
    jobs = [f"- {k}: {j['state']}" + (f", exit {j['exit_code']}" if j.get("exit_code") is not None else "") + f", cursor {j.get('cursor', 0)}" for k, j in sorted(state["jobs"].items())]
    job_part = ["", "## Jobs"] + (jobs[:5] or ["- none"])
    control = ["", "## Control"]
    cancellation = state["observations"].get("cancellation")
    control.append(f"- cancellation: {'by ' + cancellation['by'] + ': ' + _short(cancellation['reason'], 120) if cancellation else 'none'}")
    approvals = state["observations"]["approvals"]
    for label in ("pending", "granted", "used", "denied"):
        ids = [f"{rid} ({a['action']})" for rid, a in sorted(approvals.items()) if a["state"] == label]
        if ids or label == "pending":
            control.append(f"- approvals {label}: {', '.join(ids[:3]) or 'none'}")
    lease = state["lease"]
    control.append(f"- lease: {lease.get('owner') or 'nobody'} at epoch {lease.get('epoch')} until {lease.get('expires_at') or '-'}")
    # Shown in this order; kept, when space runs out, in order of importance:
    # the goal and next action, then unresolved effects, steps, control, jobs.
    return _fit([head, steps, eff, job_part, control], [0, 2, 1, 4, 3], limit)


def events_after(store: Any, after: int) -> Dict[str, Any]:
    """The journal records after sequence ``after``; ``truncated`` when older ones are gone."""
    records, oldest = store.records_after(after)
    truncated = after + 1 < oldest
    return {
        "after": after,
        "truncated": truncated,
        "oldest": oldest,
        "last": store.revision,
        "events": [{"seq": r["rev"], "at": r["at"], "epoch": r["epoch"], "ops": r["ops"], "hash": r["hash"]} for r in records],
    }


def report(state: Dict[str, Any]) -> Dict[str, Any]:
    """Recovery metrics of the whole run, across every worker and attempt."""
    counters = state["counters"]
    effects = state["effects"].values()
    steps = state["steps"].values()
    created = parse_time(state["created_at"])
    updated = parse_time(state["updated_at"])
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
        "retries": sum(max(0, int(e.get("attempts", 0)) - 1) for e in effects),
        "step_attempts": int(counters.get("step_attempts", 0)),
        "effect_attempts": int(counters.get("effect_attempts", 0)),
        "orphaned_jobs": int(counters.get("jobs_orphaned", 0)),
        "cost": dict(counters.get("cost", {})),
        **_item_counts(state),
    }


def _item_counts(state: Dict[str, Any]) -> Dict[str, Any]:
    """Batch items across the run, and the steps whose evidence was observed or only claimed."""
    totals = {"items": 0, "items_verified": 0, "items_skipped": 0}
    for spec in plan_steps(state):
        items = batch_progress(state, spec["id"])
        if items:
            totals["items"] += items["total"]
            totals["items_verified"] += items["verified"]
            totals["items_skipped"] += items["skipped"]
    records = [r for r in state["steps"].values() if r.get("state") == "done"]
    totals["steps_evidence_observed"] = sum(1 for r in records if r.get("observed"))
    totals["steps_evidence_claimed"] = sum(1 for r in records if r.get("evidence"))
    return totals


def status_view(state: Dict[str, Any]) -> Dict[str, Any]:
    """The run at a glance, as ``status --json`` and the MCP ``status`` tool report it."""
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
        "steps": state["steps"],
        "next_action": state["next_action"],
        "effects": counts,
        "lease": state["lease"],
        "cancellation": state["observations"].get("cancellation"),
        "items": {s["id"]: progress for s in state["plan"].get("steps", []) for progress in [batch_progress(state, s["id"])] if progress},
        "evidence": {k: evidence_view(r) for k, r in state["steps"].items() if isinstance(r, dict) and evidence_view(r)},
    }
