"""Scoped approvals as pure functions: requests, answers, superseding, and which grant covers an effect."""

import unittest

from runner.ledger import approvals, effects
from runner.base.times import format_time
from runner.base.errors import AwaitingApproval, InvalidInput

from .support.ops import DIGEST, OTHER, T0, apply, at_publish, granted, plan, fresh, then

ACTION = "effect:publish:weekly-48"
STAMP = format_time(T0)


def request(state: dict, digest: str = DIGEST, action: str = ACTION, step: str = "publish", ttl: float = 600, now: float = T0, source: dict = None) -> tuple:
    rid, ops = approvals.request_ops(state, step, action, digest, ttl, now, source)
    return rid, apply(state, ops, now)


class RequestTest(unittest.TestCase):
    def setUp(self) -> None:
        self.state = at_publish()

    def test_a_request_records_its_whole_scope_and_its_payload_source(self) -> None:
        source = approvals.payload_source("/work/post.json", b'{"title": "Week 48"}\n')
        rid, ops = approvals.request_ops(self.state, "publish", ACTION, DIGEST, 600, T0, source)
        self.assertEqual(rid, f"apr-{self.state['revision'] + 1}")
        self.assertEqual(ops, [["set", ["observations", "approvals", rid], {
            "task_id": "ops-1", "plan_digest": self.state["plan_digest"], "step": "publish", "action": ACTION, "payload_digest": DIGEST,
            "payload_file": "/work/post.json", "payload_head": '{"title": "Week 48"}\n', "requested_at": STAMP, "expires_at": format_time(T0 + 600),
            "state": "pending", "by": None, "answered_at": None, "used_by": None, "superseded_by": None, "source": "approval request",
        }]])

    def test_the_payload_head_is_bounded_and_marked_when_cut(self) -> None:
        data = b"x" * (approvals.HEAD_BYTES + 5)
        self.assertEqual(approvals.payload_source(None, data), {"payload_file": None, "payload_head": "x" * approvals.HEAD_BYTES + "…"})
        cut_inside_a_character = b"a" + "é".encode() * 50  # byte 80 is the first half of an "é"
        self.assertEqual(approvals.payload_source("f", cut_inside_a_character)["payload_head"], "a" + "é" * 39 + "\ufffd…")

    def test_an_identical_pending_request_is_returned_not_repeated(self) -> None:
        rid, state = request(self.state)
        self.assertEqual(approvals.request_ops(state, "publish", ACTION, DIGEST, 600, T0 + 1), (rid, []))

    def test_refusals(self) -> None:
        for name, args in {"step not in the plan": ("deploy", ACTION, 600), "step not an id": ("a b", ACTION, 600),
                           "empty action": ("publish", "", 600), "action of two lines": ("publish", "effect:a\nb", 600),
                           "ttl zero": ("publish", ACTION, 0), "ttl not a number": ("publish", ACTION, "60"), "ttl a bool": ("publish", ACTION, True)}.items():
            with self.subTest(name):
                with self.assertRaises(InvalidInput):
                    approvals.request_ops(self.state, args[0], args[1], DIGEST, args[2], T0)  # type: ignore[arg-type]

    def test_a_new_payload_supersedes_the_older_pending_and_granted_requests(self) -> None:
        old_pending, state = request(self.state)
        state = apply(state, approvals.answer_ops(state, old_pending, "carol", True, T0))
        other_pending, state = request(state, OTHER)
        self.assertEqual(state["observations"]["approvals"][old_pending]["state"], "superseded")
        third = f"apr-{state['revision'] + 1}"
        _, ops = approvals.request_ops(state, "publish", ACTION, DIGEST, 600, T0)
        self.assertEqual(ops[:2], [["set", ["observations", "approvals", other_pending, "state"], "superseded"],
                                   ["set", ["observations", "approvals", other_pending, "superseded_by"], third]])
        self.assertEqual(len(ops), 3, "the superseded grant is not touched again")
        self.assertEqual(approvals.find_grant(state, "publish", ACTION, DIGEST, T0, "publish:weekly-48"),
                         (None, f"request {old_pending} is superseded by {other_pending}"))
        with self.assertRaises(AwaitingApproval):
            effects.begin_ops(state, "publish:weekly-48", DIGEST, T0)
        with self.assertRaises(InvalidInput):
            approvals.answer_ops(state, old_pending, "carol", True, T0)

    def test_what_a_new_request_leaves_standing(self) -> None:
        rid, state = request(self.state)
        denied = apply(state, approvals.answer_ops(state, rid, "carol", False, T0))
        other_step = granted(self.state, ACTION, step="review")
        other_action = granted(self.state, "effect:publish:weekly-49")
        used = granted(self.state, ACTION)
        used = apply(used, effects.begin_ops(used, "publish:weekly-48", DIGEST, T0))
        several = granted(at_publish(fresh(plan(effects={"several_approvals": True}))), ACTION)
        for name, state in (("denied", denied), ("another step", other_step), ("another action", other_action), ("used", used), ("several may stand", several)):
            with self.subTest(name):
                rid, ops = approvals.request_ops(state, "publish", ACTION, OTHER, 600, T0)
                self.assertEqual([op[1] for op in ops], [["observations", "approvals", rid]], "only the new request is written")


class AnswerTest(unittest.TestCase):
    def setUp(self) -> None:
        self.rid, self.state = request(at_publish())

    def test_grant_and_deny(self) -> None:
        for grant, word in ((True, "granted"), (False, "denied")):
            with self.subTest(word):
                self.assertEqual(approvals.answer_ops(self.state, self.rid, "carol", grant, T0 + 5), [
                    ["set", ["observations", "approvals", self.rid, "state"], word],
                    ["set", ["observations", "approvals", self.rid, "by"], "carol"],
                    ["set", ["observations", "approvals", self.rid, "answered_at"], format_time(T0 + 5)],
                ])

    def test_refusals(self) -> None:
        answered = apply(self.state, approvals.answer_ops(self.state, self.rid, "carol", False, T0))
        migrated = apply(self.state, [["set", ["plan_digest"], "sha256:" + "9" * 64]])
        for name, (state, rid, now) in {"unknown request": (self.state, "apr-999", T0), "already answered": (answered, self.rid, T0),
                                        "expired": (self.state, self.rid, T0 + 600), "another plan": (migrated, self.rid, T0)}.items():
            with self.subTest(name):
                with self.assertRaises(InvalidInput):
                    approvals.answer_ops(state, rid, "carol", True, now)
        with self.assertRaises(InvalidInput):
            approvals.answer_ops(self.state, self.rid, "two words", True, T0)


class GrantTest(unittest.TestCase):
    def setUp(self) -> None:
        self.state = granted(at_publish(), ACTION)
        self.rid = next(iter(self.state["observations"]["approvals"]))

    def test_why_a_grant_does_not_cover(self) -> None:
        pending_rid, pending = request(at_publish())
        cases = {
            "nothing requested": (at_publish(), "publish", ACTION, DIGEST, T0, "no approval was requested for it"),
            "another payload": (self.state, "publish", ACTION, OTHER, T0, f"request {self.rid} is for another payload ({DIGEST[:19]}...)"),
            "still pending": (pending, "publish", ACTION, DIGEST, T0, f"request {pending_rid} is still pending"),
            "expired": (self.state, "publish", ACTION, DIGEST, T0 + 600, f"the grant of request {self.rid} expired at {format_time(T0 + 600)}"),
            "another step": (self.state, "review", ACTION, DIGEST, T0, "no approval was requested for it"),
        }
        for name, (state, step, action, digest, now, why) in cases.items():
            with self.subTest(name):
                self.assertEqual(approvals.find_grant(state, step, action, digest, now, "publish:weekly-48"), (None, why))
                with self.assertRaises(AwaitingApproval) as caught:
                    approvals.require_grant(state, step, action, digest, now, "publish:weekly-48")
                self.assertEqual(caught.exception.context, {"step": step, "action": action, "payload_digest": digest})

    def test_a_grant_is_consumed_once_and_then_covers_only_its_own_key(self) -> None:
        ops = approvals.require_grant(self.state, "publish", ACTION, DIGEST, T0, "publish:weekly-48")
        self.assertEqual(ops, [["set", ["observations", "approvals", self.rid, "state"], "used"],
                               ["set", ["observations", "approvals", self.rid, "used_by"], "publish:weekly-48"]])
        used = apply(self.state, ops)
        self.assertEqual(approvals.require_grant(used, "publish", ACTION, DIGEST, T0, "publish:weekly-48"), [])
        self.assertEqual(approvals.find_grant(used, "publish", ACTION, DIGEST, T0, "publish:other")[0], None)

    def test_requests_are_read_in_the_order_they_were_made(self) -> None:
        self.assertLess(approvals.request_order("apr-9"), approvals.request_order("apr-10"))
        state = self.state
        while state["revision"] < 12:
            state = apply(state, [])
        rid, state = request(state, OTHER)  # apr-13 supersedes the grant made at a one-digit revision
        self.assertEqual(approvals.newest_requests(state), {("publish", ACTION): rid})
        view = approvals.approval_view(state, T0)
        self.assertEqual([(v["request_id"], v["state"], v["current"], v["superseded_by"]) for v in view],
                         [(self.rid, "superseded", False, rid), (rid, "pending", True, None)])
        self.assertEqual((view[1]["payload_file"], view[1]["payload_head"], view[1]["expired"]), (None, None, False))


class DeniedThenGrantedTest(unittest.TestCase):
    """A denial counts only while no newer request for the same step and action exists."""

    def test_the_newest_request_is_the_answer(self) -> None:
        first, state = request(at_publish())
        state = apply(state, approvals.answer_ops(state, first, "carol", False, T0))
        self.assertEqual(approvals.newest_requests(state), {("publish", ACTION): first})
        second, state = request(state)
        self.assertEqual(approvals.newest_requests(state), {("publish", ACTION): second})
        state = then(state, approvals.answer_ops, second, "carol", True)
        self.assertEqual(approvals.find_grant(state, "publish", ACTION, DIGEST, T0, "publish:weekly-48"), (second, ""))


if __name__ == "__main__":
    unittest.main()
