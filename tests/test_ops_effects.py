"""The effect ledger's transition rules as pure functions: state in, exact operations or the exact refusal out."""

import unittest

from runner.ledger import effects, steps
from runner.base.times import format_time
from runner.base.host import local_maker
from runner.base.errors import (
    AlreadyVerified,
    AwaitingApproval,
    Cancelled,
    Failed,
    InvalidInput,
    LimitExhausted,
    NeedsReconciliation,
    RetryLater,
    RunComplete,
)

from .support.ops import DIGEST, OTHER, T0, apply, at_publish, begun, fresh, granted, plan, then, through

STAMP = format_time(T0)


def started(attempts: int = 1, step: str = "draft", started_at: str = STAMP, receipt: object = None) -> dict:
    return {"state": "started", "payload_digest": DIGEST, "attempts": attempts, "step": step, "started_at": started_at, "updated_at": STAMP,
            "receipt": receipt, "evidence": None, "reason": None, "next_attempt_at": None, "begun_by": dict(local_maker(), epoch=0)}


class BeginTest(unittest.TestCase):
    def setUp(self) -> None:
        self.drafting = then(fresh(), steps.start_ops, "draft")

    def test_a_fresh_key_commits_started_in_the_running_step(self) -> None:
        self.assertEqual(effects.begin_ops(self.drafting, "doc-1:ticket", DIGEST, T0), [
            ["set", ["effects", "doc-1:ticket"], started()],
            ["set", ["counters", "effect_attempts"], 1],
        ])
        self.assertEqual(effects.begin_ops(self.drafting, "doc-1:ticket", DIGEST, T0, step="draft")[0][2]["step"], "draft")

    def test_refusals_that_mean_fix_the_command(self) -> None:
        state = begun(self.drafting, "doc-1")
        cases = {
            "not an id": (self.drafting, "bad key!", DIGEST, {}),
            "outside the key pattern": (self.drafting, "Doc-1", DIGEST, {}),
            "another payload under the key": (state, "doc-1", OTHER, {}),
            "--step names a finished step": (then(through(fresh(), "draft"), steps.start_ops, "review"), "doc-2", DIGEST, {"step": "draft"}),
            "--step names no step of the plan": (self.drafting, "doc-2", DIGEST, {"step": "no-such-step"}),
            "--step while no step runs": (fresh(), "doc-2", DIGEST, {"step": "draft"}),
            "--step is not an id": (self.drafting, "doc-2", DIGEST, {"step": "two words"}),
        }
        for name, (before, key, digest, kwargs) in cases.items():
            with self.subTest(name):
                with self.assertRaises(InvalidInput) as caught:
                    effects.begin_ops(before, key, digest, T0, **kwargs)
                self.assertIs(type(caught.exception), InvalidInput)

    def test_a_step_other_than_the_running_one_is_named_in_the_refusal(self) -> None:
        with self.assertRaises(InvalidInput) as caught:
            effects.begin_ops(self.drafting, "doc-2", DIGEST, T0, step="review")
        self.assertEqual(caught.exception.context, {"key": "doc-2", "step": "review"})
        self.assertIn("'draft'", caught.exception.message)

    def test_before_a_gated_step_starts_nothing_may_begin(self) -> None:
        waiting = through(fresh(), "draft", "review")
        with self.assertRaises(InvalidInput) as caught:
            effects.begin_ops(waiting, "blog-48", DIGEST, T0)
        self.assertEqual(caught.exception.context, {"key": "blog-48", "step": "publish"})

    def test_with_no_step_running_and_an_ungated_next_step_the_effect_belongs_to_no_step(self) -> None:
        self.assertIsNone(effects.begin_ops(fresh(), "doc-1", DIGEST, T0)[0][2]["step"])

    def test_a_new_attempt_keeps_the_step_it_was_begun_in_when_none_runs(self) -> None:
        state = then(begun(self.drafting, "doc-1"), effects.absent_ops, "doc-1", {"found": False})
        state = apply(state, [["set", ["current_step"], None]])
        self.assertEqual(effects.begin_ops(state, "doc-1", DIGEST, T0)[0][2]["step"], "draft")

    def test_a_verified_effect_answers_already_verified_everywhere(self) -> None:
        verified = then(begun(self.drafting, "doc-1"), effects.verify_ops, "doc-1", {"seen": True})
        cancelled = then(verified, steps.cancel_ops, "ops", "no longer wanted")
        self.assertEqual(cancelled["status"], "cancelled")
        complete = apply(verified, [["set", ["status"], "complete"]])
        for name, state in (("active", verified), ("cancelled", cancelled), ("complete", complete)):
            with self.subTest(name):
                with self.assertRaises(AlreadyVerified) as caught:
                    effects.begin_ops(state, "doc-1", DIGEST, T0)
                self.assertEqual(caught.exception.context["effect"], "doc-1")
                self.assertEqual(caught.exception.context["record"], state["effects"]["doc-1"])
                self.assertEqual(caught.exception.exit_code, 14)
                with self.assertRaises(AlreadyVerified):
                    effects.begin_ops(state, "doc-1", DIGEST, T0, resend=True)

    def test_a_failed_effect_answers_failed_naming_it(self) -> None:
        failed = then(begun(self.drafting, "doc-1"), effects.failed_ops, "doc-1", "the target refused it")
        with self.assertRaises(Failed) as caught:
            effects.begin_ops(failed, "doc-1", DIGEST, T0)
        self.assertEqual((caught.exception.context, caught.exception.exit_code), ({"effect": "doc-1"}, 12))

    def test_unresolved_effects_need_reconciliation_unless_resent(self) -> None:
        state = begun(self.drafting, "doc-1")
        acked = then(state, effects.ack_ops, "doc-1", {"ticket": "T-1"})
        uncertain = then(state, effects.uncertain_ops, "doc-1", "timeout")
        cases = (("started", state, False), ("acknowledged", acked, False), ("uncertain", uncertain, False), ("acknowledged, resend", acked, True))
        for name, before, resend in cases:
            with self.subTest(name):
                with self.assertRaises(NeedsReconciliation) as caught:
                    effects.begin_ops(before, "doc-1", DIGEST, T0, resend=resend)
                self.assertEqual(caught.exception.context["key"], "doc-1")
        for name, before in (("started", state), ("uncertain", uncertain)):
            with self.subTest(f"{name}, resend"):
                ops = effects.begin_ops(before, "doc-1", DIGEST, T0 + 1, resend=True)
                self.assertEqual(ops[0][2]["attempts"], 2)
                self.assertEqual(ops[0][2]["started_at"], STAMP)

    def test_not_now_to_a_resend_leaves_the_earlier_outcome_unknown(self) -> None:
        uncertain = then(begun(self.drafting, "doc-1"), effects.uncertain_ops, "doc-1", "timeout")
        resent = begun(uncertain, "doc-1", resend=True)
        self.assertTrue(resent["effects"]["doc-1"]["resent"])
        refused = then(resent, effects.deferred_ops, "doc-1", {"status": 429}, not_before=format_time(T0 + 30))
        record = refused["effects"]["doc-1"]
        self.assertEqual((record["state"], record["deferred"], record["next_attempt_at"]), ("uncertain", 1, format_time(T0 + 30)))
        self.assertIn("still unknown", record["reason"])
        # A first call answered "not now" created nothing: that is an absence.
        fresh_call = then(begun(self.drafting, "doc-2"), effects.deferred_ops, "doc-2", {"status": 429}, not_before=format_time(T0 + 30))
        self.assertEqual(fresh_call["effects"]["doc-2"]["state"], "absent")

    def test_a_run_that_is_not_open_refuses_new_effects(self) -> None:
        cancelled = then(self.drafting, steps.cancel_ops, "ops", "stop")
        complete = apply(self.drafting, [["set", ["status"], "complete"]])
        limited = apply(self.drafting, steps.blocked_ops("spent", "max_cost", T0))
        broken = then(self.drafting, steps.fail_ops, "draft", "permanent", "the repository is gone")
        cases = (("cancelled", cancelled, Cancelled), ("complete", complete, RunComplete), ("limit", limited, LimitExhausted), ("step failed", broken, Failed))
        for name, state, error in cases:
            with self.subTest(name):
                with self.assertRaises(error) as caught:
                    effects.begin_ops(state, "doc-9", DIGEST, T0)
                self.assertIs(type(caught.exception), error)
        with self.assertRaises(Failed) as caught:
            effects.begin_ops(broken, "doc-9", DIGEST, T0)
        self.assertEqual(caught.exception.context, {"step": "draft"})

    def test_attempts_are_bounded_and_a_backoff_answers_retry_later(self) -> None:
        state = begun(self.drafting, "doc-1")
        for _ in range(2):
            state = then(state, effects.absent_ops, "doc-1", {"found": False})
            state = begun(state, "doc-1")
        state = then(state, effects.absent_ops, "doc-1", {"found": False})
        with self.assertRaises(LimitExhausted) as caught:
            effects.begin_ops(state, "doc-1", DIGEST, T0)
        self.assertEqual(caught.exception.context, {"limit": "max_effect_attempts"})
        waiting = then(begun(self.drafting, "doc-2"), effects.absent_ops, "doc-2", {"found": False})
        waiting = apply(waiting, effects.schedule_ops(waiting, "doc-2", format_time(T0 + 30)))
        with self.assertRaises(RetryLater) as caught:
            effects.begin_ops(waiting, "doc-2", DIGEST, T0 + 12.5)
        self.assertEqual(caught.exception.context, {"retry_at": format_time(T0 + 30), "wait_seconds": 17.5})
        self.assertEqual(caught.exception.exit_code, 11)
        self.assertEqual(effects.begin_ops(waiting, "doc-2", DIGEST, T0 + 30)[0][2]["attempts"], 2)

    def test_a_gated_effect_consumes_its_grant(self) -> None:
        publishing = at_publish()
        for key in ("publish:weekly-48", "notes"):  # gated by its key, and by its step
            with self.subTest(key):
                with self.assertRaises(AwaitingApproval):
                    effects.begin_ops(publishing, key, DIGEST, T0)
                state = granted(publishing, f"effect:{key}")
                rid = next(iter(state["observations"]["approvals"]))
                ops = effects.begin_ops(state, key, DIGEST, T0)
                self.assertEqual(ops[:2], [["set", ["observations", "approvals", rid, "state"], "used"],
                                           ["set", ["observations", "approvals", rid, "used_by"], key]])
                self.assertEqual(ops[2][2]["step"], "publish")
        drafting_gated_key = self.drafting
        with self.assertRaises(AwaitingApproval):
            effects.begin_ops(drafting_gated_key, "publish:weekly-48", DIGEST, T0)
        with self.assertRaises(InvalidInput):
            effects.begin_ops(fresh(plan(steps=[{"id": "only"}])), "publish:x", DIGEST, T0)


class ResolveTest(unittest.TestCase):
    def setUp(self) -> None:
        self.state = begun(then(fresh(), steps.start_ops, "draft"), "doc-1")

    def test_ack_keeps_the_receipt(self) -> None:
        self.assertEqual(effects.ack_ops(self.state, "doc-1", {"ticket": "T-1"}, T0 + 1), [
            ["set", ["effects", "doc-1", "state"], "acknowledged"],
            ["set", ["effects", "doc-1", "receipt"], {"ticket": "T-1"}],
            ["set", ["effects", "doc-1", "updated_at"], format_time(T0 + 1)],
        ])
        acked = then(self.state, effects.ack_ops, "doc-1", {"ticket": "T-1"})
        self.assertEqual(effects.ack_ops(acked, "doc-1", {"ticket": "T-1"}, T0), [])
        with self.assertRaises(InvalidInput):
            effects.ack_ops(acked, "doc-1", {"ticket": "T-2"}, T0)
        with self.assertRaises(InvalidInput):
            effects.ack_ops(self.state, "doc-1", ["not", "an", "object"], T0)  # type: ignore[arg-type]
        with self.assertRaises(InvalidInput):
            effects.ack_ops(self.state, "doc-9", {}, T0)

    def test_a_listing_that_holds_two_entries_for_one_effect_is_flagged_after_one_call(self) -> None:
        once = then(self.state, effects.ack_ops, "doc-1", {"t": 1})
        listed = {"matches": 2, "possible_duplicate": True}
        self.assertIn(["set", ["effects", "doc-1", "flags"], ["several-listed"]],
                      effects.verify_ops(once, "doc-1", listed, T0))
        again = then(then(self.state, effects.absent_ops, "doc-1", {"seen": 0}), effects.begin_ops, "doc-1", DIGEST,
                     now=T0 + 3600)
        self.assertIn(["set", ["effects", "doc-1", "flags"], ["several-matches", "several-listed"]],
                      effects.verify_ops(again, "doc-1", listed, T0 + 3600), "both, in one change")
        self.assertNotIn("flags", str(effects.verify_ops(once, "doc-1", {"matches": 1, "possible_duplicate": False}, T0)))

    def test_several_matches_after_several_calls_are_flagged_and_the_flag_is_kept(self) -> None:
        once = then(self.state, effects.ack_ops, "doc-1", {"t": 1})
        self.assertNotIn("flags", str(effects.verify_ops(once, "doc-1", {"matches": 2}, T0)), "one call: two matches are the target's own")
        again = then(then(self.state, effects.absent_ops, "doc-1", {"seen": 0}), effects.begin_ops, "doc-1", DIGEST, now=T0 + 3600)
        self.assertIn(["set", ["effects", "doc-1", "flags"], ["several-matches"]], effects.verify_ops(again, "doc-1", {"matches": 2}, T0 + 3600))
        flagged = then(self.state, effects.absent_ops, "doc-1", {"seen": 0}, flag="absent-soon-after-takeover")
        self.assertEqual(flagged["effects"]["doc-1"]["flags"], ["absent-soon-after-takeover"])
        begun_again = then(flagged, effects.begin_ops, "doc-1", DIGEST, now=T0 + 3600)
        self.assertEqual(begun_again["effects"]["doc-1"]["flags"], ["absent-soon-after-takeover"], "kept across attempts")

    def test_verify_counts_progress_and_reconciliations(self) -> None:
        self.assertEqual(effects.verify_ops(self.state, "doc-1", {"seen": 1}, T0 + 2, reconciled=True), [
            ["set", ["effects", "doc-1", "state"], "verified"],
            ["set", ["effects", "doc-1", "evidence"], {"seen": 1}],
            ["set", ["effects", "doc-1", "updated_at"], format_time(T0 + 2)],
            ["set", ["counters", "last_progress_at"], format_time(T0 + 2)],
            ["set", ["counters", "reconciled_effects"], 1],
        ])
        verified = then(self.state, effects.verify_ops, "doc-1", {"seen": 1})
        self.assertEqual(effects.verify_ops(verified, "doc-1", {"seen": 2}, T0), [])
        for rule, args in ((effects.absent_ops, ({},)), (effects.uncertain_ops, ("late",)), (effects.failed_ops, ("no",))):
            with self.subTest(rule.__name__):
                with self.assertRaises(InvalidInput):
                    rule(verified, "doc-1", *args, T0)

    def test_settling_the_last_effect_completes_or_cancels_the_run(self) -> None:
        state = begun(fresh(plan(steps=[{"id": "only"}])), "doc-1")
        state = apply(state, [["set", ["steps", "only"], {"state": "done"}]])
        self.assertEqual(effects.verify_ops(state, "doc-1", {}, T0)[-2:], [["set", ["status"], "complete"], ["set", ["next_action"], None]])
        cancelling = then(self.state, steps.cancel_ops, "ops", "stop")
        self.assertEqual(cancelling["status"], "active")
        ops = effects.absent_ops(cancelling, "doc-1", {}, T0)
        self.assertIn(["set", ["status"], "cancelled"], ops)
        self.assertIn(["set", ["steps", "draft", "state"], "cancelled"], ops)
        self.assertEqual(effects.verify_ops(begun(self.state, "doc-2"), "doc-1", {}, T0)[-1], ["set", ["counters", "last_progress_at"], STAMP])

    def test_absent_uncertain_and_failed_are_allowed_only_from_their_states(self) -> None:
        acked = then(self.state, effects.ack_ops, "doc-1", {"t": 1})
        with self.assertRaises(NeedsReconciliation):
            effects.absent_ops(acked, "doc-1", {}, T0)  # acknowledged and absent contradict: reconcile, never retry
        with self.assertRaises(NeedsReconciliation):  # a receipt stays proof whatever state the effect moved to
            effects.absent_ops(then(acked, effects.uncertain_ops, "doc-1", "lookup lags"), "doc-1", {}, T0)
        with self.assertRaises(InvalidInput):
            effects.failed_ops(acked, "doc-1", "refused", T0)
        self.assertEqual(effects.uncertain_ops(acked, "doc-1", "no answer", T0)[0], ["set", ["effects", "doc-1", "state"], "uncertain"])
        uncertain = then(acked, effects.uncertain_ops, "doc-1", "no answer")
        self.assertEqual(effects.uncertain_ops(uncertain, "doc-1", "no answer", T0), [])
        self.assertEqual(effects.uncertain_ops(uncertain, "doc-1", "still none", T0), [["set", ["effects", "doc-1", "reason"], "still none"]])
        for reason in ("", "   ", "x" * 2001):
            with self.assertRaises(InvalidInput):
                effects.uncertain_ops(self.state, "doc-1", reason, T0)



class FoundFirstTest(unittest.TestCase):
    """``effects.observe_first``: an effect the target holds before any call of the run is recorded with no call."""

    def setUp(self) -> None:
        self.drafting = then(fresh(), steps.start_ops, "draft")

    def test_it_is_recorded_verified_with_no_attempt_in_the_running_step(self) -> None:
        evidence = {"ticket": 7, "observe_first": "found at the target before any call of this run"}
        kept = {"payload": {"title": "Week 48"}}
        self.assertEqual(effects.found_ops(self.drafting, "doc-1", DIGEST, evidence, T0, kept=kept), [
            ["set", ["effects", "doc-1"], {
                "state": "verified", "payload_digest": DIGEST, "attempts": 0, "step": "draft", "started_at": STAMP,
                "updated_at": STAMP, "receipt": None, "evidence": evidence, "reason": None, "next_attempt_at": None,
                "payload": {"title": "Week 48"}}],
            ["set", ["counters", "last_progress_at"], STAMP],
        ])
        found = then(self.drafting, effects.found_ops, "doc-1", DIGEST, evidence)
        self.assertEqual(found["counters"].get("effect_attempts", 0), 0, "nothing was called")
        self.assertEqual(effects.found_ops(found, "doc-1", DIGEST, evidence, T0), [], "found again: no change")
        with self.assertRaises(AlreadyVerified):
            effects.begin_ops(found, "doc-1", DIGEST, T0)

    def test_a_listing_with_two_entries_for_it_flags_it(self) -> None:
        ops = effects.found_ops(self.drafting, "doc-1", DIGEST, {"matches": 2, "possible_duplicate": True}, T0)
        self.assertEqual(ops[0][2]["flags"], ["several-listed"])

    def test_a_key_begun_since_it_was_looked_up_is_reconciled_as_any_begun_key(self) -> None:
        state = begun(self.drafting, "doc-1")
        with self.assertRaises(NeedsReconciliation) as caught:
            effects.found_ops(state, "doc-1", DIGEST, {}, T0)
        self.assertEqual(caught.exception.context, {"key": "doc-1", "state": "started"})
        verified = then(state, effects.verify_ops, "doc-1", {"seen": 1})
        with self.assertRaises(NeedsReconciliation):
            effects.found_ops(verified, "doc-1", OTHER, {}, T0)

    def test_the_last_one_completes_the_run_and_a_closed_run_or_a_bad_key_refuses_it(self) -> None:
        state = apply(fresh(plan(steps=[{"id": "only"}])), [["set", ["steps", "only"], {"state": "done"}]])
        self.assertEqual(effects.found_ops(state, "doc-1", DIGEST, {}, T0)[-2:],
                         [["set", ["status"], "complete"], ["set", ["next_action"], None]])
        cancelled = then(self.drafting, steps.cancel_ops, "ops", "stop")
        with self.assertRaises(Cancelled):
            effects.found_ops(cancelled, "doc-1", DIGEST, {}, T0)
        for key in ("bad key!", "Doc-1"):
            with self.assertRaises(InvalidInput):
                effects.found_ops(self.drafting, key, DIGEST, {}, T0)


if __name__ == "__main__":
    unittest.main()
