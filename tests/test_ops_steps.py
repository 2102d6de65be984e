"""Steps, cancellation, migration and bounded retry as pure functions: exact operations or the exact refusal."""

import json
import unittest

from runner.ledger import retry, steps
from runner.base.times import format_time
from runner.base.errors import Cancelled, InvalidInput, LimitExhausted, NeedsReconciliation, RetryLater, RunComplete

from .support.ops import EVIDENCE, T0, apply, at_publish, begun, fresh, plan, then, through

STAMP = format_time(T0)


def contract_text(block: dict) -> str:
    return "```json run-contract\n" + json.dumps(block) + "\n```\n"


class StartTest(unittest.TestCase):
    def test_the_first_step_starts_with_exact_ops(self) -> None:
        self.assertEqual(steps.start_ops(fresh(), "draft", T0), [
            ["set", ["steps", "draft"], {"state": "running", "attempts": 1, "started_at": STAMP, "epoch": 0, "finished_at": None,
                                         "evidence": None, "error": None, "class": None, "next_attempt_at": None, "approval": False}],
            ["set", ["current_step"], "draft"],
            ["set", ["next_action"], {"kind": "finish-step", "step": "draft"}],
            ["set", ["counters", "steps_started"], 1],
            ["set", ["counters", "step_attempts"], 1],
        ])
        self.assertTrue(steps.start_ops(through(fresh(), "draft", "review"), "publish", T0)[0][2]["approval"])

    def test_refusals(self) -> None:
        drafting = then(fresh(), steps.start_ops, "draft")
        cases = {
            "not in the plan": (fresh(), "deploy", InvalidInput),
            "out of plan order": (fresh(), "review", InvalidInput),
            "another step is running": (drafting, "review", InvalidInput),
            "already done": (through(fresh(), "draft"), "draft", InvalidInput),
            "cancelled": (then(fresh(), steps.cancel_ops, "ops", "stop"), "draft", Cancelled),
            "max_steps spent": (apply(fresh(plan(limits={"max_steps": 1})), [["set", ["counters", "steps_started"], 1]]), "draft", LimitExhausted),
        }
        for name, (state, step, error) in cases.items():
            with self.subTest(name):
                with self.assertRaises(error) as caught:
                    steps.start_ops(state, step, T0)
                self.assertIs(type(caught.exception), error)

    def test_a_running_step_restarts_as_a_new_attempt(self) -> None:
        drafting = then(fresh(), steps.start_ops, "draft")
        self.assertEqual(steps.start_ops(drafting, "draft", T0)[0][2]["attempts"], 2)

    def test_a_backoff_answers_retry_later_until_it_ends(self) -> None:
        failed = then(then(fresh(), steps.start_ops, "draft"), steps.fail_ops, "draft", "transient", "rate limited", rand=lambda: 0.5)
        self.assertEqual(failed["steps"]["draft"]["next_attempt_at"], format_time(T0 + 5))
        with self.assertRaises(RetryLater) as caught:
            steps.start_ops(failed, "draft", T0 + 1)
        self.assertEqual(caught.exception.context, {"retry_at": format_time(T0 + 5), "wait_seconds": 4.0})
        self.assertEqual(steps.start_ops(failed, "draft", T0 + 5)[0][2]["attempts"], 2)


class DoneTest(unittest.TestCase):
    def test_done_records_evidence_and_names_the_next_step(self) -> None:
        drafting = then(fresh(), steps.start_ops, "draft")
        self.assertEqual(steps.done_ops(drafting, "draft", EVIDENCE["draft"], T0 + 1), [
            ["set", ["steps", "draft", "state"], "done"],
            ["set", ["steps", "draft", "evidence"], EVIDENCE["draft"]],
            ["set", ["steps", "draft", "finished_at"], format_time(T0 + 1)],
            ["set", ["completed_steps"], ["draft"]],
            ["set", ["current_step"], None],
            ["set", ["counters", "last_progress_at"], format_time(T0 + 1)],
            ["set", ["next_action"], {"kind": "start-step", "step": "review"}],
        ])

    def test_refusals(self) -> None:
        drafting = then(fresh(), steps.start_ops, "draft")
        done = through(fresh(), "draft")
        with_open_effect = begun(drafting, "doc-1")
        cases = {
            "not running": (fresh(), "draft", EVIDENCE["draft"], InvalidInput),
            "evidence missing": (drafting, "draft", {"other": 1}, InvalidInput),
            "evidence not an object": (drafting, "draft", ["x"], InvalidInput),
            "done with other evidence": (done, "draft", {"file_sha256": "b" * 64}, InvalidInput),
            "an effect of the step is unresolved": (with_open_effect, "draft", EVIDENCE["draft"], NeedsReconciliation),
            "a gated step without a verified effect": (at_publish(), "publish", EVIDENCE["publish"], InvalidInput),
        }
        for name, (state, step, evidence, error) in cases.items():
            with self.subTest(name):
                with self.assertRaises(error) as caught:
                    steps.done_ops(state, step, evidence, T0)
                self.assertIs(type(caught.exception), error)
        self.assertEqual(steps.done_ops(done, "draft", EVIDENCE["draft"], T0), [])

    def test_the_last_step_completes_the_run_or_names_what_to_reconcile(self) -> None:
        block = plan(steps=[{"id": "only"}])
        running = then(fresh(block), steps.start_ops, "only")
        self.assertEqual(steps.done_ops(running, "only", {}, T0)[-2:], [["set", ["status"], "complete"], ["set", ["next_action"], None]])
        stray = begun(fresh(block), "doc-1")  # begun with no step running: it belongs to no step
        running = then(stray, steps.start_ops, "only")
        self.assertEqual(steps.done_ops(running, "only", {}, T0)[-1], ["set", ["next_action"], {"kind": "reconcile", "keys": ["doc-1"]}])


class FailTest(unittest.TestCase):
    def setUp(self) -> None:
        self.drafting = then(fresh(), steps.start_ops, "draft")

    def test_transient_waits_a_persisted_jittered_backoff(self) -> None:
        ops = steps.fail_ops(self.drafting, "draft", "transient", "rate limited", T0, rand=lambda: 0.25)
        when = format_time(T0 + 2.5)
        self.assertEqual(ops, [
            ["set", ["steps", "draft", "state"], "failed"],
            ["set", ["steps", "draft", "error"], "rate limited"],
            ["set", ["steps", "draft", "class"], "transient"],
            ["set", ["steps", "draft", "finished_at"], STAMP],
            ["set", ["current_step"], None],
            ["set", ["steps", "draft", "next_attempt_at"], when],
            ["set", ["next_action"], {"kind": "start-step", "step": "draft", "not_before": when}],
        ])

    def test_permanent_ends_the_run_as_failed_naming_the_step(self) -> None:
        ops = steps.fail_ops(self.drafting, "draft", "permanent", "the repository is gone", T0)
        self.assertEqual(ops[-2:], [
            ["set", ["status"], "blocked"],
            ["set", ["next_action"], {"kind": "stop", "reason": "failed", "step": "draft",
                                      "detail": "step draft failed permanently: the repository is gone", "at": STAMP}],
        ])

    def test_the_last_allowed_attempt_blocks_on_the_limit(self) -> None:
        state = self.drafting
        for _ in range(2):
            state = then(state, steps.fail_ops, "draft", "transient", "flaky", rand=lambda: 0.0)
            state = then(state, steps.start_ops, "draft")
        ops = steps.fail_ops(state, "draft", "transient", "flaky", T0)
        self.assertEqual(ops[-2], ["set", ["status"], "blocked"])
        self.assertEqual((ops[-1][2]["reason"], ops[-1][2]["limit"]), ("limit-exhausted", "max_step_attempts"))

    def test_refusals(self) -> None:
        for name, args in {"unknown class": ("draft", "sometimes", "x"), "empty error": ("draft", "transient", " "),
                           "not running": ("review", "transient", "x"), "not in the plan": ("deploy", "transient", "x")}.items():
            with self.subTest(name):
                with self.assertRaises(InvalidInput):
                    steps.fail_ops(self.drafting, *args, T0)


class CancelTest(unittest.TestCase):
    def test_cancel_with_and_without_effects_in_flight(self) -> None:
        drafting = then(fresh(), steps.start_ops, "draft")
        record = {"by": "ops", "reason": "stop", "at": STAMP, "source": "cancel"}
        self.assertEqual(steps.cancel_ops(drafting, "ops", "stop", T0), [
            ["set", ["observations", "cancellation"], record],
            ["set", ["status"], "cancelled"],
            ["set", ["next_action"], None],
            ["set", ["steps", "draft", "state"], "cancelled"],
            ["set", ["current_step"], None],
        ])
        in_flight = begun(drafting, "doc-1")
        self.assertEqual(steps.cancel_ops(in_flight, "ops", "stop", T0), [
            ["set", ["observations", "cancellation"], record],
            ["set", ["next_action"], {"kind": "reconcile", "keys": ["doc-1"], "then": "cancelled"}],
        ])
        cancelled = then(in_flight, steps.cancel_ops, "ops", "stop")
        self.assertEqual(steps.cancel_ops(cancelled, "someone", "again", T0), [])
        with self.assertRaises(RunComplete):
            steps.cancel_ops(apply(fresh(), [["set", ["status"], "complete"]]), "ops", "late", T0)
        with self.assertRaises(InvalidInput):
            steps.cancel_ops(fresh(), "ops", "", T0)


class MigrateTest(unittest.TestCase):
    def test_a_plan_without_the_running_step_is_refused(self) -> None:
        drafting = then(fresh(), steps.start_ops, "draft")
        without = plan(steps=[{"id": "review", "evidence": ["exit_code"]}])
        with self.assertRaises(InvalidInput) as caught:
            steps.migrate_ops(drafting, contract_text(without), "drop draft", T0)
        self.assertEqual(caught.exception.context, {"step": "draft"})
        failed = then(drafting, steps.fail_ops, "draft", "transient", "x", rand=lambda: 0.0)
        self.assertEqual(steps.migrate_ops(failed, contract_text(without), "drop draft", T0)[0], ["set", ["plan"], without])
        done = through(fresh(), "draft")
        self.assertTrue(steps.migrate_ops(done, contract_text(without), "drop draft", T0))

    def test_a_migration_records_itself_sets_budgets_and_unblocks(self) -> None:
        drafting = then(fresh(), steps.start_ops, "draft")
        wider = plan(limits={"max_step_attempts": 9})
        ops = steps.migrate_ops(drafting, contract_text(wider), "more attempts", T0)
        self.assertEqual(ops[1][0:2], ["set", ["plan_digest"]])
        self.assertEqual(ops[2][2]["reason"], "more attempts")
        self.assertIn(["set", ["budgets", "max_step_attempts"], 9], ops)
        self.assertIn(["del", ["budgets", "max_cost"]], ops)
        self.assertEqual(steps.migrate_ops(fresh(), contract_text(plan()), "same", T0), [])
        blocked = then(drafting, steps.fail_ops, "draft", "permanent", "gone")
        self.assertEqual(steps.migrate_ops(blocked, contract_text(wider), "try again", T0)[-2:], [["set", ["status"], "active"], ["set", ["next_action"], None]])
        with self.assertRaises(InvalidInput):
            steps.migrate_ops(drafting, contract_text(plan(task_id="other")), "x", T0)
        with self.assertRaises(InvalidInput):
            steps.migrate_ops(drafting, "no contract here", "x", T0)


class RetryTest(unittest.TestCase):
    def test_backoff_is_full_jitter_under_a_cap(self) -> None:
        table = [(0, 1.0, 0.0), (1, 1.0, 10.0), (2, 1.0, 20.0), (3, 0.5, 20.0), (4, 1.0, 80.0), (5, 1.0, 100.0), (10_000, 1.0, 100.0), (3, 0.0, 0.0)]
        for attempt, draw, delay in table:
            with self.subTest(attempt=attempt, draw=draw):
                self.assertEqual(retry.backoff_delay(attempt, 10.0, 100.0, lambda d=draw: d), delay)  # type: ignore[misc]
        self.assertEqual(retry.next_attempt_at(fresh(), 2, T0, lambda: 1.0), format_time(T0 + 20))

    def test_waits_attempts_and_limits(self) -> None:
        retry.check_wait({"next_attempt_at": None}, T0, "x")
        retry.check_wait({"next_attempt_at": STAMP}, T0, "x")
        with self.assertRaises(RetryLater) as caught:
            retry.check_wait({"next_attempt_at": format_time(T0 + 0.25)}, T0, "x")
        self.assertEqual(caught.exception.context, {"retry_at": format_time(T0 + 0.25), "wait_seconds": 0.25})
        retry.check_attempts(2, 3, "x", "max")
        retry.check_attempts(99, None, "x", "max")
        with self.assertRaises(LimitExhausted):
            retry.check_attempts(3, 3, "x", "max")
        limited = fresh(plan(limits={"max_elapsed_seconds": 60, "max_cost": 1, "max_steps": 2, "no_progress_seconds": 30}))
        retry.check_limits(limited, T0 + 29)
        cases = {
            "max_elapsed_seconds": (limited, T0 + 61),
            "no_progress_seconds": (limited, T0 + 31),
            "max_cost": (apply(limited, retry.cost_ops(limited, {"money": 1})), T0),
            "max_steps": (apply(limited, [["set", ["counters", "steps_started"], 2]]), T0),
        }
        for name, (state, now) in cases.items():
            with self.subTest(name):
                with self.assertRaises(LimitExhausted) as caught:
                    retry.check_limits(state, now)
                self.assertEqual(caught.exception.context, {"limit": name})

    def test_costs_add_up_and_bad_amounts_are_refused(self) -> None:
        state = apply(fresh(), retry.cost_ops(fresh(), {"tokens": 100, "money": 0.5}))
        self.assertEqual(retry.cost_ops(state, {"money": 0.25}), [["set", ["counters", "cost"], {"tokens": 100, "money": 0.75}]])
        for bad in (-1, True, "1", None):
            with self.subTest(bad=bad):
                with self.assertRaises(InvalidInput):
                    retry.cost_ops(state, {"money": bad})  # type: ignore[dict-item]


if __name__ == "__main__":
    unittest.main()
