"""The lifecycle of one effect as a pure function: every rule of :func:`runner.execution.lifecycle.next_move`, one at a
time."""

import unittest
from typing import Any, Dict, Optional

from runner.base.times import format_time
from runner.execution.executor import caps_for
from runner.base.errors import Failed, Fenced, NeedsReconciliation
from runner.execution.lifecycle import LOOK_AGAIN_SECONDS, Answer, Call, Caps, Facts, Move, Seen, next_move, quiet_since
from runner.ledger.envelope import new_envelope

T0 = 1_790_000_000.0


def run_under(effects: Dict[str, Any]) -> Dict[str, Any]:
    """A run's state whose contract has the ``effects`` section given."""
    plan = {"contract": 1, "task_id": "t", "goal": "g", "steps": [{"id": "s"}], "effects": effects}
    return new_envelope("t", plan, "0" * 64, format_time(T0))


KEY = "doc-1:ticket"


def effect(state: str, at: float = T0, receipt: Optional[Dict[str, Any]] = None, **fields: Any) -> Dict[str, Any]:
    record = {"state": state, "payload_digest": "sha256:x", "attempts": 1, "started_at": format_time(T0), "updated_at": format_time(at),
              "receipt": receipt, "evidence": None, "reason": None, "next_attempt_at": None}
    record.update(fields)
    return record


def move(record: Optional[Dict[str, Any]], now: float = T0 + 100, **facts: Any) -> Move:
    return next_move(Facts(KEY, record, now=now, **facts))


class FinishedTest(unittest.TestCase):
    def test_verified_is_done_and_calls_nothing(self) -> None:
        self.assertEqual(move(effect("verified")).kind, "done")
        live = Call(True, T0 + 1000, True, None, 42)
        self.assertEqual(move(effect("verified"), calls=(live,)).kind, "done", "even with a call in flight: nothing more is done")

    def test_failed_stops_naming_the_effect(self) -> None:
        got = move(effect("failed", reason="refused"))
        self.assertEqual(got.kind, "stop")
        self.assertIsInstance(got.error, Failed)
        self.assertEqual(got.error.context, {"effect": KEY})


class CallsInFlightTest(unittest.TestCase):
    def test_a_live_call_is_waited_for_until_its_deadline(self) -> None:
        live = Call(True, T0 + 200, True, None, 42)
        for record in (None, effect("started"), effect("acknowledged", receipt={"t": 1}), effect("uncertain"), effect("absent")):
            with self.subTest(state=(record or {}).get("state")):
                got = move(record, calls=(live,))
                self.assertEqual((got.kind, got.until, got.call), ("wait-call", T0 + 200, live))

    def test_past_its_deadline_a_command_is_killed_and_an_in_process_call_counts_as_ended(self) -> None:
        command = Call(True, T0 + 50, True, None, 42)
        self.assertEqual(move(effect("started"), calls=(command,)).kind, "kill-call")
        # Its maker checks the deadline right before sending: past it, nothing of this call can still go out.
        in_process = Call(True, T0 + 50, False, None, 42)
        self.assertEqual(move(effect("started"), calls=(in_process,)).kind, "observe")
        self.assertEqual(quiet_since(Facts(KEY, effect("started"), (in_process,))), T0 + 50)

    def test_past_its_deadline_a_command_that_could_not_be_verified_stops_the_run_while_it_runs(self) -> None:
        # No /proc (or a set-user-id command): it can be neither told to be the call's nor ended, and may still send.
        unverified = Call(True, T0 + 50, False, None, 42, "invoke", True)
        got = move(effect("started"), calls=(unverified,))
        self.assertEqual((got.kind, got.call, type(got.error).__name__), ("stop", unverified, "NeedsReconciliation"))
        self.assertIn("process group 42", got.error.message)  # type: ignore[union-attr]
        self.assertEqual(got.error.context["process_group"], 42)  # type: ignore[union-attr]
        self.assertEqual(move(effect("started"), calls=(unverified._replace(deadline=T0 + 150),)).kind, "wait-call")
        self.assertEqual(move(effect("started"), calls=(unverified._replace(alive=False, ended_at=T0 + 60),)).kind, "observe")
        lookup = unverified._replace(kind="observe")  # a lookup's command creates nothing
        self.assertEqual(move(effect("started"), calls=(lookup,)).kind, "observe")

    def test_every_live_call_of_the_key_is_weighed_not_the_first_listed(self) -> None:
        held = Call(True, T0 + 50, False, None, 41)  # past its deadline, its maker alive
        running = Call(True, T0 + 150, True, None, 42)
        overdue = Call(True, T0 + 60, True, None, 43)
        self.assertEqual(move(effect("started"), calls=(held, running)), Move("wait-call", until=T0 + 150, call=running))
        self.assertEqual(move(effect("started"), calls=(held, running, overdue)), Move("kill-call", call=overdue))

    def test_an_ended_call_dates_the_settle_time(self) -> None:
        ended = Call(False, T0 + 200, True, T0 + 90, 42)
        caps = Caps(settle=5)
        early = Seen("absent", {"looked": 1}, T0 + 91)  # one second after the call ended: looked at again after one more
        self.assertEqual(move(effect("started"), calls=(ended,), caps=caps, seen=early, now=T0 + 91.5), Move("wait", until=T0 + 92))
        self.assertEqual(move(effect("started"), calls=(ended,), caps=caps, seen=early, now=T0 + 92).kind, "observe")
        later = Seen("absent", {"looked": 2}, T0 + 93)  # the next wait would end past the settle time: it ends there
        self.assertEqual(move(effect("started"), calls=(ended,), caps=caps, seen=later, now=T0 + 93), Move("wait", until=T0 + 95))
        late = Seen("absent", {"looked": 3}, T0 + 96)
        self.assertEqual(move(effect("started"), calls=(ended,), caps=caps, seen=late, now=T0 + 96).kind, "absent")

    def test_an_early_absence_is_looked_at_again_at_doubling_waits_and_believed_only_after_the_settle_time(self) -> None:
        ended = Call(False, T0 + 200, True, T0 + 90, 42)
        for settle, most in ((0.2, 2), (1, 5), (5, 7), (60, 9), (3600, 9), (86400, 9)):
            with self.subTest(settle=settle):
                caps, now, looks = Caps(settle=settle), T0 + 90.001, []
                while True:
                    got = move(effect("acknowledged", receipt={"t": 1}), calls=(ended,), caps=caps, seen=Seen("absent", {}, now), now=now)
                    looks.append(now)
                    if got.kind != "wait":
                        break
                    self.assertLessEqual(got.until, T0 + 90 + settle, "no wait ends past the settle time")
                    self.assertGreaterEqual(got.until - now, min(max(LOOK_AGAIN_SECONDS, settle / 64), T0 + 90 + settle - now), "lookups are spaced")
                    now = got.until
                self.assertEqual(got.kind, "uncertain", "a receipt, then an absence believed: a contradiction for a person")
                self.assertGreaterEqual(looks[-1], T0 + 90 + settle, "the absence was believed only once no call could still land")
                self.assertLessEqual(len(looks), most, looks)

    def test_a_presence_seen_before_the_settle_time_is_verified_at_once(self) -> None:
        ended = Call(False, T0 + 200, True, T0 + 90, 42)
        caps = Caps(settle=30)
        early = Seen("absent", {}, T0 + 90.01)
        waited = move(effect("acknowledged", receipt={"t": 1}), calls=(ended,), caps=caps, seen=early, now=T0 + 90.01)
        self.assertEqual(waited, Move("wait", until=T0 + 90.01 + 30 / 64), "looked at again within a second, not after 30")
        seen = Seen("present", {"ticket": 7}, T0 + 91)
        self.assertEqual(move(effect("acknowledged", receipt={"t": 1}), calls=(ended,), caps=caps, seen=seen, now=T0 + 91).kind, "verify")

    def test_a_target_rationed_by_a_rate_is_looked_at_again_only_at_the_settle_time(self) -> None:
        ended = Call(False, T0 + 200, True, T0 + 90, 42)
        early = Seen("absent", {}, T0 + 90.01)
        got = move(effect("acknowledged", receipt={"t": 1}), calls=(ended,), caps=Caps(settle=30, look_early=False), seen=early, now=T0 + 90.01)
        self.assertEqual(got, Move("wait", until=T0 + 120), "each early lookup would spend a token an invoke needs")
        self.assertTrue(caps_for(run_under({"settle_seconds": 30}), object()).look_early)
        self.assertFalse(caps_for(run_under({"settle_seconds": 30, "rate": {"per_second": 2}}), object()).look_early)

    def test_a_lookup_while_an_earlier_call_may_be_on_its_way_waits_for_its_deadline_before_looking_again(self) -> None:
        caps = Caps(timeout=30, settle=5)  # a started effect the registry never saw: it may call until T0 + 30
        got = move(effect("started", at=T0), caps=caps, seen=Seen("absent", {}, T0 + 10), now=T0 + 10)
        self.assertEqual(got, Move("wait", until=T0 + 30 + LOOK_AGAIN_SECONDS), "not a lookup every quarter second for 20 seconds")

    def test_a_started_effect_the_registry_never_saw_is_assumed_to_call_until_its_deadline(self) -> None:
        caps = Caps(timeout=30)
        seen = Seen("absent", {}, T0 + 10)
        self.assertEqual(move(effect("started", at=T0), caps=caps, seen=seen, now=T0 + 10), Move("wait", until=T0 + 30))
        seen = Seen("absent", {}, T0 + 31)
        self.assertEqual(move(effect("started", at=T0), caps=caps, seen=seen, now=T0 + 31).kind, "absent")


class ReconcileTest(unittest.TestCase):
    def test_an_unresolved_effect_is_observed_first(self) -> None:
        for state in ("started", "acknowledged", "uncertain"):
            with self.subTest(state=state):
                self.assertEqual(move(effect(state, receipt={"t": 1} if state == "acknowledged" else None)).kind, "observe")

    def test_present_is_verified_counted_as_reconciled_unless_the_target_answered_this_pass(self) -> None:
        seen = Seen("present", {"ticket": 7}, T0 + 100)
        self.assertEqual(move(effect("started"), seen=seen), Move("verify", evidence={"ticket": 7}, reconciled=True))
        answer = Answer("receipt", receipt={"ticket": 7}, ended_at=T0 + 99)
        got = move(effect("acknowledged", receipt={"ticket": 7}), seen=seen, answer=answer)
        self.assertEqual((got.kind, got.reconciled), ("verify", False))
        lost = Answer("unknown", "the connection dropped", ended_at=T0 + 99)
        self.assertTrue(move(effect("uncertain"), seen=seen, answer=lost).reconciled, "the call's answer was lost: settled by observing")

    def test_absent_without_a_receipt_allows_another_attempt(self) -> None:
        seen = Seen("absent", {"looked": 1}, T0 + 100)
        self.assertEqual(move(effect("uncertain"), seen=seen), Move("absent", evidence={"looked": 1}, reconciled=True))

    def test_a_receipt_is_proof_an_absence_is_a_contradiction_never_a_retry(self) -> None:
        seen = Seen("absent", {"looked": 1}, T0 + 100)
        got = move(effect("acknowledged", receipt={"ticket": 7}), seen=seen)
        self.assertEqual(got.kind, "uncertain")
        self.assertIsInstance(got.error, NeedsReconciliation)
        self.assertIn('{"ticket": 7}', got.reason)
        self.assertIn('"looked": 1', got.reason)
        again = move(effect("uncertain", receipt={"ticket": 7}), seen=seen)
        self.assertEqual((again.kind, type(again.error)), ("stop", NeedsReconciliation))
        for state in ("absent", "started"):  # whatever the effect has moved to since
            with self.subTest(state=state):
                got = move(effect(state, receipt={"ticket": 7}), seen=None if state == "absent" else seen)
                self.assertNotEqual(got.kind, "invoke")
                self.assertIn(got.kind, ("stop", "uncertain"))

    def test_an_inconclusive_lookup_stops_unless_the_target_deduplicates(self) -> None:
        seen = Seen("unknown", {"reason": "exit 3"}, T0 + 100)
        self.assertEqual(move(effect("started"), seen=seen).kind, "uncertain")
        stop = move(effect("uncertain"), seen=seen)
        self.assertEqual((stop.kind, type(stop.error)), ("stop", NeedsReconciliation))
        self.assertEqual(move(effect("uncertain"), seen=seen, caps=Caps(deduplicates=True)), Move("invoke", resend=True))
        expired = Caps(deduplicates=True, retention=10)
        self.assertEqual(move(effect("uncertain"), seen=seen, caps=expired).kind, "stop", "past its retention a resend could duplicate")
        self.assertEqual(move(effect("uncertain", receipt={"t": 1}), seen=seen, caps=Caps(deduplicates=True)).kind, "stop")

    def test_a_resend_is_sent_only_if_it_arrives_within_the_retention(self) -> None:
        # The first call started at T0; a resend at T0 + 100 may arrive as late as T0 + 100 + timeout.
        seen = Seen("unknown", {"reason": "exit 3"}, T0 + 100)
        self.assertEqual(move(effect("uncertain"), seen=seen, caps=Caps(deduplicates=True, retention=161, timeout=60)).kind, "invoke")
        self.assertEqual(move(effect("uncertain"), seen=seen, caps=Caps(deduplicates=True, retention=160, timeout=60)).kind, "stop")

    def test_a_resend_answered_not_now_waits_then_looks_again_before_sending_again(self) -> None:
        caps = Caps(deduplicates=True)
        refused = effect("uncertain", next_attempt_at=format_time(T0 + 130))
        self.assertEqual(move(refused, seen=Seen("unknown", {}, T0 + 100), caps=caps), Move("wait", until=T0 + 130))
        self.assertEqual(move(refused, seen=Seen("unknown", {}, T0 + 100), caps=caps, now=T0 + 131), Move("observe"))
        self.assertEqual(move(refused, seen=Seen("unknown", {}, T0 + 131), caps=caps, now=T0 + 131), Move("invoke", resend=True))

    def test_reconciling_only_never_invokes(self) -> None:
        caps = Caps(invoke=False)
        self.assertEqual(move(None, caps=caps).kind, "settled")
        self.assertEqual(move(effect("absent"), caps=caps).kind, "settled")
        self.assertEqual(move(effect("uncertain"), caps=Caps(invoke=False, deduplicates=True), seen=Seen("unknown", {}, T0 + 100)).kind, "stop")


class AnswerTest(unittest.TestCase):
    def started(self, answer: Answer) -> Move:
        return move(effect("started"), answer=answer)

    def test_each_answer_of_a_call_is_recorded_as_what_it_means(self) -> None:
        self.assertEqual(self.started(Answer("receipt", receipt={"t": 1})), Move("ack", receipt={"t": 1}))
        unknown = self.started(Answer("unknown", "timed out after 5s"))
        self.assertEqual((unknown.kind, unknown.error), ("uncertain", None))
        self.assertIn("timed out", unknown.reason)
        rejected = self.started(Answer("rejected", "409 conflict"))
        self.assertEqual((rejected.kind, type(rejected.error)), ("fail", Failed))
        stale = self.started(Answer("stale-epoch", "412"))
        self.assertEqual((stale.kind, type(stale.error)), ("uncertain", Fenced))

    def test_not_now_is_deferred_after_the_delay_the_target_named(self) -> None:
        got = self.started(Answer("not-applied", "429", retry_after=7.5))
        self.assertEqual((got.kind, got.until), ("defer", T0 + 100 + 7.5))
        self.assertIsNone(self.started(Answer("not-applied", "503")).until, "no delay named: the contract's backoff")

    def test_an_answer_is_weighed_only_while_the_effect_is_started(self) -> None:
        answer = Answer("receipt", receipt={"t": 1}, ended_at=T0 + 99)
        self.assertEqual(move(effect("acknowledged", receipt={"t": 1}), answer=answer).kind, "observe")


class NextAttemptTest(unittest.TestCase):
    def test_a_new_or_absent_effect_is_invoked_after_its_backoff(self) -> None:
        self.assertEqual(move(None), Move("invoke"))
        waiting = effect("absent", next_attempt_at=format_time(T0 + 150))
        self.assertEqual(move(waiting, now=T0 + 100), Move("wait", until=T0 + 150))
        self.assertEqual(move(waiting, now=T0 + 150), Move("invoke"))


if __name__ == "__main__":
    unittest.main()


class UnreadableTargetTest(unittest.TestCase):
    """``"observe": "none"``: the target cannot be read back; it is never looked at and an unknown is never re-sent."""

    CAPS = Caps(readable=False)

    def test_a_receipt_verifies_the_effect_with_evidence_that_the_target_cannot_be_read(self) -> None:
        receipt = {"id": 7}
        acked = move(effect("started"), answer=Answer("receipt", ended_at=T0 + 1, receipt=receipt), caps=self.CAPS)
        self.assertEqual((acked.kind, acked.receipt), ("ack", receipt))
        verified = move(effect("acknowledged", receipt=receipt), caps=self.CAPS)
        self.assertEqual(verified.kind, "verify")
        reason = "the target cannot be read back: its receipt is the only evidence"
        self.assertEqual(verified.evidence, {"observe": "none", "receipt": receipt, "reason": reason})
        self.assertFalse(verified.reconciled)

    def test_an_unknown_answer_is_recorded_then_stops_for_a_person_never_observed_nor_sent_again(self) -> None:
        lost = Answer("unknown", ended_at=T0 + 1, detail="connection lost")
        first = move(effect("started"), answer=lost, caps=self.CAPS)
        self.assertEqual((first.kind, first.reason), ("uncertain", "unknown outcome: connection lost"))
        later = move(effect("uncertain", reason="unknown outcome: connection lost"), caps=self.CAPS)
        self.assertEqual(later.kind, "stop")
        self.assertIsInstance(later.error, NeedsReconciliation)
        self.assertEqual(later.error.exit_code, 8)
        self.assertIn(f"effect verify {KEY} --by NAME --evidence JSON", later.error.message)
        self.assertIn(f"effect absent {KEY} --by NAME --evidence JSON", later.error.message)
        # Even a target that deduplicates is not sent to again blindly: there is nothing to look at first.
        dedup = move(effect("uncertain"), caps=Caps(readable=False, deduplicates=True), now=T0 + 5)
        self.assertEqual(dedup.kind, "stop")

    def test_a_call_whose_answer_was_lost_is_recorded_uncertain_with_the_stop_once_no_call_is_alive(self) -> None:
        live = Call(True, T0 + 60, True, None, 42)
        self.assertEqual(move(effect("started"), calls=(live,), now=T0 + 10, caps=self.CAPS).kind, "wait-call",
                         "a call still alive is waited for, as at any target")
        lost = move(effect("started"), caps=self.CAPS)
        self.assertEqual(lost.kind, "uncertain")
        self.assertIn("answer was lost", lost.reason or "")
        self.assertIsInstance(lost.error, NeedsReconciliation)

    def test_not_now_and_a_refusal_are_as_at_any_target(self) -> None:
        later = move(effect("started"), answer=Answer("not-applied", ended_at=T0 + 1, detail="429", retry_after=30.0),
                     caps=self.CAPS, now=T0 + 1)
        self.assertEqual((later.kind, later.until), ("defer", T0 + 31))
        refused = move(effect("started"), answer=Answer("rejected", ended_at=T0 + 1, detail="400"), caps=self.CAPS)
        self.assertEqual(refused.kind, "fail")

    def test_a_persons_absence_leads_to_the_next_call(self) -> None:
        self.assertEqual(move(effect("absent"), caps=self.CAPS).kind, "invoke")
        self.assertEqual(move(None, caps=self.CAPS).kind, "invoke")

    def test_caps_for_reads_whether_the_adapter_can_be_read_back(self) -> None:
        class Unreadable:
            readable = False

        self.assertFalse(caps_for(run_under({}), Unreadable()).readable)  # type: ignore[arg-type]
        self.assertTrue(caps_for(run_under({}), object()).readable)  # type: ignore[arg-type]


class ObserveFirstTest(unittest.TestCase):
    """``effects.observe_first``: an effect with no record is looked up before its first call; one the target holds
    already (work done before the run) is recorded verified with no call."""

    CAPS = Caps(observe_first=True, settle=30.0)

    def test_an_effect_with_no_record_is_looked_up_before_its_first_call_only_when_asked(self) -> None:
        self.assertEqual(move(None, caps=self.CAPS), Move("observe"))
        self.assertEqual(move(None, caps=self.CAPS._replace(observe_first=False)), Move("invoke"), "as before")

    def test_found_is_recorded_verified_with_no_call_its_evidence_saying_it_was_there_first(self) -> None:
        seen = Seen("present", {"ticket": 7}, T0 + 99)
        got = move(None, seen=seen, caps=self.CAPS)
        self.assertEqual(got.kind, "found")
        reason = "found at the target before any call of this run"
        self.assertEqual(got.evidence, {"ticket": 7, "observe_first": reason})
        self.assertFalse(got.reconciled)

    def test_an_absence_is_called_at_once_no_call_of_this_run_can_land_late(self) -> None:
        seen = Seen("absent", {"matches": 0}, T0 + 99)
        self.assertEqual(move(None, seen=seen, caps=self.CAPS, now=T0 + 100), Move("invoke"), "no settle time to wait")

    def test_not_now_waits_for_the_delay_then_looks_again(self) -> None:
        seen = Seen("later", {"retry_after": 20}, T0 + 90)
        self.assertEqual(move(None, seen=seen, caps=self.CAPS, now=T0 + 100), Move("wait", until=T0 + 110))
        self.assertEqual(move(None, seen=seen, caps=self.CAPS, now=T0 + 110), Move("observe"))

    def test_a_lookup_that_cannot_tell_stops_recording_nothing_and_calling_nothing(self) -> None:
        got = move(None, seen=Seen("unknown", {"error": "HTTP 500"}, T0 + 99), caps=self.CAPS)
        self.assertEqual(got.kind, "stop")
        self.assertIsInstance(got.error, NeedsReconciliation)
        self.assertEqual(got.error.exit_code, 8)  # type: ignore[union-attr]
        self.assertIn("observe_first", got.error.message)  # type: ignore[union-attr]
        self.assertIn("HTTP 500", got.error.message)  # type: ignore[union-attr]
        self.assertEqual(got.error.context, {"key": KEY, "observe_first": True})  # type: ignore[union-attr]

    def test_after_the_first_call_the_rules_are_those_of_any_effect(self) -> None:
        # Observed absent after a call: called again after its backoff, not looked up first again.
        self.assertEqual(move(effect("absent"), caps=self.CAPS), Move("invoke"))
        # An unresolved effect is reconciled as always: its absence is believed only after the settle time.
        early = move(effect("uncertain", at=T0 + 90), seen=Seen("absent", {}, T0 + 95), caps=self.CAPS, now=T0 + 96)
        self.assertEqual(early.kind, "wait")
        self.assertEqual(move(effect("verified"), caps=self.CAPS).kind, "done")

    def test_a_target_that_cannot_be_read_back_and_reconciling_alone_are_never_looked_up_first(self) -> None:
        self.assertEqual(move(None, caps=self.CAPS._replace(readable=False)), Move("invoke"))
        self.assertEqual(move(None, caps=self.CAPS._replace(invoke=False)), Move("settled"))

    def test_an_earlier_call_in_flight_is_waited_for_before_looking(self) -> None:
        live = Call(True, T0 + 200, True, None, 42)
        self.assertEqual(move(None, calls=(live,), caps=self.CAPS).kind, "wait-call")

    def test_caps_for_reads_the_contract(self) -> None:
        self.assertTrue(caps_for(run_under({"observe_first": True}), object()).observe_first)  # type: ignore[arg-type]
        self.assertFalse(caps_for(run_under({}), object()).observe_first)  # type: ignore[arg-type]
