"""The recovery procedure's decision as a pure function of state, time and owner: one action or one stop."""

import unittest
from typing import Callable, List, Optional, Tuple

from runner.ledger import approvals, effects, lease, steps
from runner.base.times import format_time
from runner.base.errors import EXIT_CODES
from runner.execution import jobs, recovery
from runner.execution.recovery import decide, decision_exit_code

from .support.ops import DIGEST, T0, apply, at_publish, begun, fresh, granted, held, plan, then, through

ACTION = "effect:publish:weekly-48"


def request(state: dict, digest: str = DIGEST) -> tuple:
    rid, ops = approvals.request_ops(state, "publish", ACTION, digest, 600, T0)
    return rid, apply(state, ops)


class DecideTest(unittest.TestCase):
    def decide(self, state: dict, now: float = T0, owner: str = "w1", epoch: int = 1) -> dict:
        decision = decide(state, now, owner, epoch)
        self.assertEqual(decision_exit_code(decision), 0 if decision["decision"] == "act" else EXIT_CODES[decision["reason"]])
        return decision

    def stop(self, state: dict, reason: str, **kwargs: object) -> dict:
        decision = self.decide(state, **kwargs)  # type: ignore[arg-type]
        self.assertEqual((decision["decision"], decision["action"], decision["reason"]), ("stop", None, reason), decision)
        return decision

    def act(self, state: dict, kind: str, **kwargs: object) -> dict:
        decision = self.decide(state, **kwargs)  # type: ignore[arg-type]
        self.assertEqual((decision["decision"], decision["action"]["kind"]), ("act", kind), decision)
        return decision["action"]

    def test_ownership_comes_first(self) -> None:
        state = held(fresh())
        self.stop(state, "already-running", owner="w2")
        self.stop(state, "fenced", owner="w1", epoch=0)
        self.stop(state, "fenced", now=T0 + 301)
        self.act(state, "start-step")

    def test_a_finished_run_is_finished_for_anyone(self) -> None:
        self.stop(apply(held(fresh()), [["set", ["status"], "complete"]]), "complete", owner="w2")
        self.stop(then(held(fresh()), steps.cancel_ops, "ops", "stop"), "cancelled", owner="w2")

    def test_unresolved_effects_before_anything_else(self) -> None:
        state = begun(then(held(fresh()), steps.start_ops, "draft"), "doc-1")
        action = self.act(state, "reconcile")
        self.assertEqual((action["key"], action["state"], action["payload_digest"]), ("doc-1", "started", DIGEST))
        uncertain = then(state, effects.uncertain_ops, "doc-1", "timeout")
        decision = self.stop(uncertain, "needs-reconciliation")
        self.assertEqual(decision["check"], {"key": "doc-1", "payload_digest": DIGEST, "step": "draft", "attempts": 1})
        self.assertEqual(decision_exit_code(decision), 8)

    def test_approvals_pending_denied_and_denied_then_granted(self) -> None:
        publishing = at_publish(held(fresh()))
        first, state = request(publishing)
        self.assertEqual(self.stop(state, "awaiting-approval")["request_id"], first)
        denied = then(state, approvals.answer_ops, first, "carol", False)
        self.assertEqual(self.stop(denied, "awaiting-approval")["request_id"], first)
        second, again = request(denied)
        self.assertEqual(self.stop(again, "awaiting-approval")["request_id"], second)
        regranted = then(again, approvals.answer_ops, second, "carol", True)
        action = self.act(regranted, "finish-step")
        self.assertEqual(action["grant"], {"request_id": second, "action": ACTION, "payload_digest": DIGEST, "payload_file": None})
        self.assertIn("effect begin publish:weekly-48", action["approval"])
        ungranted = self.act(publishing, "finish-step")
        self.assertNotIn("grant", ungranted)
        self.assertIn("approval request publish", ungranted["approval"])
        lasting = at_publish(held(fresh(), ttl=3600))
        self.assertIn("grant", self.act(granted(lasting, ACTION), "finish-step", now=T0 + 599))
        self.assertNotIn("grant", self.act(granted(lasting, ACTION), "finish-step", now=T0 + 601), "an expired grant is not named")

    def test_a_grant_used_by_an_effect_observed_absent_is_named_for_its_next_attempt(self) -> None:
        # The gate lets the same effect begin again under the grant it used; the decision must say so, not ask a person again.
        state = granted(at_publish(held(fresh(), ttl=3600)), ACTION)
        rid = next(iter(state["observations"]["approvals"]))
        key = ACTION[len("effect:"):]
        begun_once = begun(state, key, step="publish")
        absent = then(begun_once, effects.absent_ops, key, {"found": False})
        self.assertEqual(absent["observations"]["approvals"][rid]["state"], "used")
        action = self.act(absent, "finish-step", now=T0 + 1)
        self.assertEqual(action["grant"]["request_id"], rid)
        self.assertIn(f"effect begin {key}", action["approval"])
        self.assertNotIn("approval request", action["approval"])
        begun(absent, key, now=T0 + 1, step="publish")  # and the gate agrees: no AwaitingApproval
        self.assertNotIn("grant", self.act(absent, "finish-step", now=T0 + 601), "an expired grant is not named")

    def test_a_denial_for_a_finished_step_no_longer_stops(self) -> None:
        state = held(through(fresh(), "draft"))
        rid, ops = approvals.request_ops(state, "draft", "effect:notes", DIGEST, 600, T0)
        state = apply(state, ops)
        state = then(state, approvals.answer_ops, rid, "carol", False)
        self.assertEqual(self.act(state, "start-step")["step"], "review")

    def test_failed_and_limits(self) -> None:
        drafting = then(held(fresh()), steps.start_ops, "draft")
        failed = then(drafting, steps.fail_ops, "draft", "permanent", "the repository is gone")
        decision = self.stop(failed, "failed")
        self.assertEqual((decision["step"], decision_exit_code(decision)), ("draft", 12))
        blocked = apply(drafting, steps.blocked_ops("spent", "max_cost", T0))
        self.assertEqual(self.stop(blocked, "limit-exhausted")["limit"], "max_cost")
        timed = held(fresh(plan(limits={"max_elapsed_seconds": 60})))
        self.assertEqual(self.stop(timed, "limit-exhausted", now=T0 + 61)["limit"], "max_elapsed_seconds")

    def test_the_plan_running_step_backoff_next_step_complete(self) -> None:
        state = held(fresh())
        self.assertEqual(self.act(state, "start-step")["step"], "draft")
        drafting = then(state, steps.start_ops, "draft")
        self.assertEqual(self.act(drafting, "finish-step")["evidence"], ["file_sha256"])
        taken_over = apply(drafting, lease.acquire_ops(drafting, "w2", 300, T0 + 400), T0 + 400)
        self.assertEqual(self.act(taken_over, "resume-step", owner="w2", epoch=2, now=T0 + 400)["step"], "draft")
        waiting = then(drafting, steps.fail_ops, "draft", "transient", "flaky", rand=lambda: 1.0)
        action = self.act(waiting, "wait", now=T0 + 1)
        self.assertEqual((action["until"], action["then"]), (format_time(T0 + 10), {"kind": "start-step", "step": "draft"}))
        self.assertEqual(self.act(waiting, "start-step", now=T0 + 10)["step"], "draft")
        self.assertIn("approval", self.act(through(state, "draft", "review"), "start-step"))
        everything = held(through(fresh(plan(steps=[{"id": "only"}])), "only"))
        self.stop(everything, "complete")

    def test_a_takeover_in_the_millisecond_the_step_started_is_a_later_holder(self) -> None:
        # The step's start and the takeover share one timestamp: only the epochs tell the holders apart.
        drafting = then(held(fresh()), steps.start_ops, "draft")
        taken_over = apply(drafting, lease.break_ops(drafting, "supervisor", "w1 was killed", T0), T0)
        taken_over = apply(taken_over, lease.acquire_ops(taken_over, "w2", 300, T0), T0)
        self.assertEqual(taken_over["steps"]["draft"]["started_at"], taken_over["lease"]["acquired_at"])
        self.assertEqual(self.act(taken_over, "resume-step", owner="w2", epoch=2)["step"], "draft")
        self.assertEqual(self.act(drafting, "finish-step")["step"], "draft")

    def test_a_holder_whose_lease_expired_is_told_it_expired_and_when(self) -> None:
        decision = self.stop(held(fresh()), "fenced", now=T0 + 301)
        self.assertIn("expired at", decision["detail"])
        self.assertNotIn("does not hold the live lease", decision["detail"])
        expired = held(fresh())
        taken = self.stop(apply(expired, lease.acquire_ops(expired, "w2", 300, T0 + 400), T0 + 400), "fenced", now=T0 + 400, owner="w2")
        self.assertIn("does not hold the live lease", taken["detail"])


class NumberedChecksTest(unittest.TestCase):
    """Each numbered check of the procedure alone.

    A check passes the decision on (None) where its concern does not apply,
    and decides where it does, whatever a check before it would have said.
    """

    def facts(self, state: dict, owner: Optional[str] = "w1", epoch: Optional[int] = 1, now: float = T0,
              seen: Optional[dict] = None) -> recovery._Facts:
        return recovery._observed(state, now, owner, epoch, seen or {})

    def said(self, decision: Optional[dict]) -> tuple:
        assert decision is not None
        return (decision["decision"], decision["reason"] or decision["action"]["kind"])

    def test_the_checks_are_made_in_the_order_of_the_procedure(self) -> None:
        self.assertEqual([check.__name__ for check in recovery._CHECKS],
                         ["_finished", "_1_ownership", "_3_effects_in_flight", "_4_jobs", "_5_authority", "_6_limits",
                          "_7_running_step"])

    def test_every_check_passes_on_a_run_with_nothing_to_settle(self) -> None:
        facts = self.facts(held(fresh()))
        for check in recovery._CHECKS:
            self.assertIsNone(check(facts), check.__name__)
        self.assertEqual(self.said(recovery._7_next_step(facts)), ("act", "start-step"))
        self.assertEqual([o["source"] for o in facts.ev["observations"]], ["state", "plan", "lease"])
        self.assertEqual((facts.ev["inferences"], facts.ev["unknowns"]), ([], []))

    def test_each_check_decides_its_own_concern(self) -> None:
        drafting = then(held(fresh()), steps.start_ops, "draft")
        in_flight = begun(drafting, "doc-1")
        _, submitted = jobs.submit_intent_ops(drafting, "/nowhere", "tests", ["true"], T0, nonce="n")
        cancelled = then(in_flight, steps.cancel_ops, "ops", "stop")
        cases: List[Tuple[Callable[[recovery._Facts], Optional[dict]], dict, str, Tuple[str, str]]] = [
            (recovery._finished, apply(held(fresh()), [["set", ["status"], "complete"]]), "w2", ("stop", "complete")),
            (recovery._1_ownership, drafting, "w2", ("stop", "already-running")),
            (recovery._3_effects_in_flight, in_flight, "w2", ("act", "reconcile")),
            (recovery._4_jobs, apply(drafting, submitted), "w1", ("act", "check-job")),
            (recovery._5_authority, cancelled, "w1", ("stop", "cancelled")),
            (recovery._6_limits, apply(drafting, steps.blocked_ops("spent", "max_cost", T0)), "w2",
             ("stop", "limit-exhausted")),
            (recovery._7_running_step, drafting, "w1", ("act", "finish-step")),
            (recovery._7_next_step, held(through(fresh(plan(steps=[{"id": "only"}])), "only")), "w1",
             ("act", "complete")),
        ]
        for check, state, owner, expected in cases:
            with self.subTest(check.__name__):
                self.assertEqual(self.said(check(self.facts(state, owner))), expected)
        # Where two concerns apply, the earlier check decides.
        self.assertEqual(self.said(decide(in_flight, T0, "w2", 1)), ("stop", "already-running"))
        self.assertEqual(self.said(decide(cancelled, T0, "w1", 1)), ("act", "reconcile"))

    def test_a_job_observed_running_is_observed_then_waited_for(self) -> None:
        _, submitted = jobs.submit_intent_ops(held(fresh()), "/nowhere", "tests", ["true"], T0, nonce="n")
        facts = self.facts(apply(held(fresh()), submitted), seen={"tests": {"status": "running", "pid": 42}})
        self.assertEqual(self.said(recovery._4_jobs(facts)), ("act", "wait-job"))
        self.assertEqual(facts.ev["observations"][-1]["source"], "job `tests`")

    def test_an_observer_passes_ownership_unless_another_holds_a_live_lease(self) -> None:
        self.assertIsNone(recovery._1_ownership(self.facts(fresh(), owner=None, epoch=None)))
        self.assertIsNone(recovery._1_ownership(self.facts(held(fresh()), owner=None, epoch=None, now=T0 + 301)))
        live = self.facts(held(fresh()), owner=None, epoch=None)
        self.assertEqual(self.said(recovery._1_ownership(live)), ("stop", "already-running"))

if __name__ == "__main__":
    unittest.main()
