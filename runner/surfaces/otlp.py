"""A run as an OpenTelemetry trace, in the OTLP JSON file format.

The file is JSON lines, one ``TracesData`` object per line and one line (one
trace) per run, encoded as OTLP JSON: lowerCamelCase field names, enum values
as integers, 64-bit integers as strings, trace and span ids as hex.

Spans, from :class:`runner.surfaces.history.History`:

* the run: ``invoke_agent <task>`` (GenAI agent span), the root;
* each lease holding (one worker's attempt at the run): ``attempt <owner>
  epoch <n>``; a holder that stopped without releasing ends with status
  ERROR, and its last durable write is a ``runner.crash`` event;
* each step attempt: ``step <id> attempt <n>``; a failed attempt is ERROR;
* each effect: ``execute_tool <name>`` (GenAI tool span; the call id is the
  effect key), one event per lifecycle transition (a "not now" is
  ``runner.effect.deferred`` and a person's reopening of a failed effect
  ``runner.effect.reopened``, each apart from an absence), its attempts and
  deferrals apart (``runner.effect.attempts``, ``runner.effect.deferrals``), a link to the attempt
  that began it; refused for good or left unknown is ERROR;
* each approval request: a messaging ``send`` to the approver, events for the
  answer; a denial is ERROR;
* each job: ``job <key>`` with process attributes; vanished is ERROR.

The trace covers the run's whole history. Records the run's retention
dropped are said by one ``runner.history.dropped`` event of the run's span
(their range, times and counts; the ``runner.report.*`` figures count them),
and records missing from a damaged history by ``runner.history.damage``.

Receipts, evidence, reasons given by targets and step evidence are content:
left out unless ``with_content``. Payloads are never in the journal; their
digests are. Ids are derived from the run's task id and creation time, so
the same run always gives the same trace.
"""

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..base.canonical import sha256_hex
from ..contract.spec import contract_of
from .history import History, Holding, StepAttempt
from ..ledger.states import UNRESOLVED
from ..ledger.costs import spend

__all__ = ["trace", "write", "trace_id"]

KIND_INTERNAL, KIND_SERVER, KIND_CLIENT, KIND_PRODUCER, KIND_CONSUMER = 1, 2, 3, 4, 5
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2


def _nanos(seconds: float) -> str:
    return str(int(round(seconds * 1000)) * 1000000)


def _value(value: Any) -> Dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    if isinstance(value, str):
        return {"stringValue": value}
    return {"stringValue": json.dumps(value, sort_keys=True, ensure_ascii=False)}


def _attrs(pairs: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [{"key": key, "value": _value(value)} for key, value in pairs.items() if value is not None]


def trace_id(history: History) -> str:
    """32 hex digits derived from the run's identity (task id and creation time)."""
    return sha256_hex(f"trace\n{history.task_id}\n{history.state['created_at']}".encode("utf-8"))[:32]


class _Trace:
    def __init__(self, history: History) -> None:
        self.trace = trace_id(history)
        self.spans: List[Dict[str, Any]] = []

    def span_id(self, name: str) -> str:
        return sha256_hex(f"{self.trace}\n{name}".encode("utf-8"))[:16]

    def add(self, ident: str, name: str, parent: Optional[str], start: float, end: float, kind: int,
            attributes: Dict[str, Any],
            events: Sequence[Tuple[float, str, Dict[str, Any]]] = (), status: Tuple[int, str] = (STATUS_UNSET, ""),
            links: Sequence[str] = ()) -> str:
        span: Dict[str, Any] = {
            "traceId": self.trace,
            "spanId": self.span_id(ident),
            "name": name,
            "kind": kind,
            "startTimeUnixNano": _nanos(start),
            "endTimeUnixNano": _nanos(max(start, end)),
            "attributes": _attrs(attributes),
        }
        if parent:
            span["parentSpanId"] = parent
        if events:
            span["events"] = [{"timeUnixNano": _nanos(at), "name": event, "attributes": _attrs(extra)}
                              for at, event, extra in events]
        if links:
            span["links"] = [{"traceId": self.trace, "spanId": link} for link in links]
        code, message = status
        if code != STATUS_UNSET:
            span["status"] = {"code": code, "message": message} if message else {"code": code}
        self.spans.append(span)
        return span["spanId"]


def _tool_name(key: str) -> str:
    """The business action an effect key names: its last ``:`` part (``doc-00001:ticket`` -> ``ticket``)."""
    return key.rsplit(":", 1)[-1] if ":" in key else key


def _holding_span(out: _Trace, root: str, history: History, holding: Holding) -> str:
    end = holding.end if holding.end is not None else history.end
    events: List[Tuple[float, str, Dict[str, Any]]] = [(holding.start, "runner.lease.acquired",
                                                        {"runner.takeover": holding.takeover})]
    events += [(at, "runner.recover", {"runner.decision": decision, "runner.reason": reason, "runner.action": action})
               for at, decision, reason, action in holding.recoveries]
    status = (STATUS_UNSET, "")
    if holding.crashed:
        events.append((holding.last_write, "runner.crash",
                       {"runner.in_flight": list(holding.in_flight[:50]), "runner.step": holding.step_at_end}))
        status = (STATUS_ERROR, f"stopped without releasing the lease; last durable write at {holding.last_write:.3f}; "
                                f"lease {holding.ended}")
    if holding.end is not None:
        events.append((holding.end, f"runner.lease.{holding.ended}", {"runner.lease.broken_by": holding.broken_by}))
    return out.add(f"attempt\n{holding.epoch}", f"attempt {holding.owner} epoch {holding.epoch}", root,
                   holding.start, end, KIND_INTERNAL, {
        "runner.lease.owner": holding.owner, "runner.lease.epoch": holding.epoch, "runner.lease.ended": holding.ended,
        "runner.lease.renewals": holding.renewals, "runner.lease.writes": holding.writes,
        "runner.crashed": holding.crashed,
    }, events, status)


def _step_span(out: _Trace, root: str, history: History, attempt: StepAttempt, with_content: bool) -> str:
    end = attempt.end if attempt.end is not None else history.end
    events: List[Tuple[float, str, Dict[str, Any]]] = [(attempt.start, "runner.step.started",
                                                        {"runner.epoch": attempt.epoch})]
    if attempt.end is not None:
        events.append((attempt.end, f"runner.step.{attempt.outcome}", {"error.type": attempt.error_class}))
    if attempt.wait_until is not None:
        events.append((end, "runner.retry.backoff", {"runner.retry.not_before_unix_nano": _nanos(attempt.wait_until)}))
    status = (STATUS_ERROR, f"{attempt.error_class} failure"
              + (f": {attempt.error}" if with_content and attempt.error else "")) \
        if attempt.outcome == "failed" else (STATUS_UNSET, "")
    attributes = {"runner.step.id": attempt.step, "runner.step.attempt": attempt.attempt,
                  "runner.step.outcome": attempt.outcome,
                  "error.type": attempt.error_class if attempt.outcome == "failed" else None}
    if with_content and attempt.evidence is not None:
        attributes["runner.step.evidence"] = json.dumps(attempt.evidence, sort_keys=True, ensure_ascii=False)
    return out.add(f"step\n{attempt.step}\n{attempt.attempt}\n{attempt.start}",
                   f"step {attempt.step} attempt {attempt.attempt}", root,
                   attempt.start, end, KIND_INTERNAL, attributes, events, status)


def trace(history: History, with_content: bool = False) -> Dict[str, Any]:
    """The run as one ``TracesData`` object (one trace); see the module docstring."""
    from .. import __version__

    out = _Trace(history)
    state = history.state
    summary = history.summary
    root_events: List[Tuple[float, str, Dict[str, Any]]] = [(at, f"runner.{kind}", {"runner.detail": text})
                                                            for at, kind, text in history.marks]
    if history.cancellation:
        cancel = history.cancellation
        root_events.append((cancel["at"], "runner.cancel",
                            {"runner.cancelled_by": cancel["by"], "runner.step": cancel["step"],
                             "runner.in_flight": list(cancel["in_flight"][:50]),
                             "runner.reason": cancel["reason"] if with_content else None}))
    dropped = history.dropped
    if dropped:
        # What the run's retention dropped is not in the trace: said once, with its range and counts, where it begins.
        root_events.append((history.start, "runner.history.dropped", {
            "runner.history.first": dropped.get("first"), "runner.history.through": dropped.get("through"),
            "runner.history.records": dropped.get("records"), "runner.history.first_at": dropped.get("first_at"),
            "runner.history.last_at": dropped.get("last_at")}))
    for text in history.damage:
        root_events.append((history.start, "runner.history.damage", {"runner.detail": text}))
    root_events.sort(key=lambda e: e[0])
    failed = state["status"] in ("blocked", "failed")
    detail = (state.get("next_action") or {}).get("detail") if failed else None
    root_status = ((STATUS_ERROR, f"run {state['status']}" + (f": {detail}" if detail and with_content else ""))
                   if failed else (STATUS_UNSET, ""))
    root_attributes: Dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": history.task_id,
        "gen_ai.agent.name": history.task_id, "gen_ai.conversation.id": history.task_id,
        "runner.status": state["status"], "runner.plan_digest": state["plan_digest"],
    }
    if with_content:
        root_attributes["gen_ai.agent.description"] = str(contract_of(state).goal)
    for name, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            root_attributes[f"runner.report.{name}"] = value
    for name, value in sorted(summary.get("cost", {}).items()):
        # the run's totals: no GenAI attribute names a sum over many calls
        root_attributes[f"runner.cost.{name}"] = value
    for name, figures in sorted(spend(state).items()):
        root_attributes[f"runner.cost.{name}.reserved"] = figures["reserved"]
        if figures["limit"] is not None:
            root_attributes[f"runner.cost.{name}.limit"] = figures["limit"]
    root = out.add("run", f"invoke_agent {history.task_id}", None, history.start, history.end, KIND_INTERNAL,
                   root_attributes, root_events, root_status)

    by_epoch = {h.epoch: _holding_span(out, root, history, h) for h in history.holdings}
    step_spans: List[Tuple[StepAttempt, str]] = [(a, _step_span(out, root, history, a, with_content))
                                                 for a in history.steps]

    def step_parent(step: Optional[str], at: float) -> str:
        for attempt, span in reversed(step_spans):
            if attempt.step == step and attempt.start <= at:
                return span
        return root

    for key, path in history.effects.items():
        if not path.transitions:
            continue
        start, end = path.transitions[0][0], path.transitions[-1][0]
        events: List[Tuple[float, str, Dict[str, Any]]] = [
            (at, "runner.effect.deferred" if path.deferred(at, state_) else f"runner.effect.{state_}",
             {"runner.epoch": epoch, "runner.reconciled": settled})
            for at, state_, epoch, settled in path.transitions if not path.reopened(at, state_)]
        # A person's reopening enters the ledger's absent state; it is no absence, and names who reopened it.
        events += [(at, "runner.effect.reopened", {"runner.reopened_by": by,
                                                   **({"runner.reason": why} if with_content else {})})
                   for at, by, why in path.reopenings]
        events += [(t1, "runner.retry.backoff", {"runner.retry.not_before_unix_nano": _nanos(t2)})
                   for t1, t2 in path.waits]
        events += [(t1, "runner.retry.not_now", {"runner.retry.not_before_unix_nano": _nanos(t2)})
                   for t1, t2 in path.deferrals]
        events.sort(key=lambda e: e[0])
        final = path.state
        status = (STATUS_UNSET, "")
        if final == "failed":
            status = (STATUS_ERROR, "refused by the target"
                      + (f": {path.reason}" if with_content and path.reason else ""))
        elif final in UNRESOLVED:
            status = (STATUS_ERROR, f"outcome unknown: the effect is {final}")
        attributes: Dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": _tool_name(key), "gen_ai.tool.call.id": key,
            "gen_ai.tool.type": "extension", "runner.effect.state": final, "runner.effect.attempts": path.attempts,
            "runner.effect.deferrals": path.deferral_count,
            "runner.effect.reconciled": path.reconciled, "runner.payload_digest": path.payload_digest,
            "runner.step.id": path.step,
            "error.type": "failed" if final == "failed" else ("unknown_outcome" if status[0] == STATUS_ERROR else None),
        }
        if with_content:
            attributes["gen_ai.tool.call.result"] = json.dumps({"receipt": path.receipt, "evidence": path.evidence,
                                                                "reason": path.reason},
                                                               sort_keys=True, ensure_ascii=False)
        began = by_epoch.get(path.transitions[0][2])
        out.add(f"effect\n{key}", f"execute_tool {_tool_name(key)}", step_parent(path.step, start), start, end,
                KIND_CLIENT, attributes,
                events, status, [began] if began else [])

    for rid, approval in history.approvals.items():
        events = [(approval.requested_at, "runner.approval.requested", {})]
        for at, kind, who in ((approval.answered_at, "denied" if approval.state == "denied" else "granted",
                               approval.by),
                              (approval.used_at, "used", approval.used_by),
                              (approval.superseded_at, "superseded", None)):
            if at is not None:
                events.append((at, f"runner.approval.{kind}", {"runner.by": who}))
        events.sort(key=lambda e: e[0])
        status = (STATUS_ERROR, "denied") if approval.state == "denied" else (STATUS_UNSET, "")
        out.add(f"approval\n{rid}", f"send approval {approval.step}", root, approval.requested_at,
                events[-1][0], KIND_PRODUCER, {
            "messaging.system": "runner", "messaging.operation.type": "send",
            "messaging.operation.name": "approval request",
            "messaging.destination.name": f"approvals {approval.step}", "messaging.message.id": rid,
            "runner.approval.action": approval.action, "runner.approval.state": approval.state,
            "runner.payload_digest": approval.payload_digest,
        }, events, status)

    for key, changes in history.jobs.items():
        last = changes[-1]
        details: Dict[str, Any] = {}
        for _, _, detail in changes:
            details.update(detail)
        status = (STATUS_ERROR, "vanished without an exit code") if last[1] == "vanished" else (STATUS_UNSET, "")
        out.add(f"job\n{key}", f"job {key}", root, changes[0][0],
                last[0] if last[1] not in ("submitting", "running") else history.end,
                KIND_INTERNAL, {"runner.job.key": key, "runner.job.state": last[1], "process.pid": details.get("pid"),
                                "process.exit.code": details.get("exit_code"),
                                "runner.job.attempt": details.get("attempt")},
                [(at, f"runner.job.{state_}", {}) for at, state_, _ in changes], status)

    return {"resourceSpans": [{
        "resource": {"attributes": _attrs({"service.name": "runner", "service.version": __version__,
                                           "runner.task_id": history.task_id})},
        "scopeSpans": [{"scope": {"name": "runner.otlp", "version": __version__}, "spans": out.spans}],
    }]}


def write(path: str, histories: Sequence[History], with_content: bool = False) -> int:
    """Write one line per run to ``path`` (replacing it); return the number of spans."""
    lines = []
    spans = 0
    for history in histories:
        data = trace(history, with_content)
        spans += sum(len(scope["spans"]) for resource in data["resourceSpans"] for scope in resource["scopeSpans"])
        lines.append(json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":")))
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return spans
