"""The lease's transition rules as pure functions: a state in, operations or one exact error class out.

No store, no process, no file: each case builds an envelope, calls one
``*_ops`` function at a fixed time and checks the operations it returns (by
applying them) or the refusal it raises. The process-level proofs of the
same rules are in ``test_authority`` and ``test_recovery``.
"""

import copy
import unittest
from typing import Any, Dict, Optional

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

from runner.ledger import lease
from runner.ledger.envelope import apply_ops, new_envelope
from runner.base.times import format_time
from runner.base.errors import AlreadyRunning, Fenced, InvalidInput

NOW = _util.CLOCK_START
PLAN = {"contract": 1, "task_id": "lease-ops", "goal": "g", "steps": [{"id": "a"}]}


def state_with(owner: Optional[str] = None, epoch: int = 0, expires_in: Optional[float] = None) -> Dict[str, Any]:
    """A fresh envelope whose lease is held by ``owner`` at ``epoch`` until ``NOW + expires_in``."""
    state = new_envelope("lease-ops", copy.deepcopy(PLAN), "0" * 64, format_time(NOW - 100))
    state["lease"] = {
        "owner": owner,
        "epoch": epoch,
        "expires_at": None if expires_in is None else format_time(NOW + expires_in),
        "acquired_at": None if owner is None else format_time(NOW - 100),
    }
    return state


def after(state: Dict[str, Any], ops: Any) -> Dict[str, Any]:
    result = copy.deepcopy(state)
    apply_ops(result, ops)
    return result


class AcquireOps(unittest.TestCase):
    def test_a_free_lease_is_taken_at_the_next_epoch(self) -> None:
        state = state_with(epoch=4)
        new = after(state, lease.acquire_ops(state, "w1", 60, NOW))
        self.assertEqual(new["lease"], {"owner": "w1", "epoch": 5, "expires_at": format_time(NOW + 60), "acquired_at": format_time(NOW),
                                        "ttl_seconds": 60})
        self.assertEqual(new["counters"]["recoveries"], 0)

    def test_a_live_holder_refuses_another_owner(self) -> None:
        state = state_with("w1", 2, expires_in=30)
        with self.assertRaises(AlreadyRunning) as caught:
            lease.acquire_ops(state, "w2", 60, NOW)
        self.assertEqual((caught.exception.context["owner"], caught.exception.context["epoch"]), ("w1", 2))

    def test_the_holder_itself_reacquiring_is_a_recovery_too(self) -> None:
        """A restart under the same owner id takes a higher epoch over a lease nobody released: the earlier process is fenced."""
        state = state_with("w1", 2, expires_in=30)
        new = after(state, lease.acquire_ops(state, "w1", 60, NOW))
        self.assertEqual((new["lease"]["owner"], new["lease"]["epoch"], new["counters"]["recoveries"]), ("w1", 3, 1))
        released = after(new, lease.release_ops(new, "w1", 3, NOW))
        again = after(released, lease.acquire_ops(released, "w1", 60, NOW))
        self.assertEqual((again["lease"]["epoch"], again["counters"]["recoveries"]), (4, 1), "after a release, no recovery")

    def test_taking_over_an_expired_lease_counts_a_recovery_and_its_wait(self) -> None:
        state = state_with("w1", 2, expires_in=-1)
        new = after(state, lease.acquire_ops(state, "w2", 60, NOW))
        self.assertEqual((new["lease"]["owner"], new["lease"]["epoch"]), ("w2", 3))
        self.assertEqual(new["counters"]["recoveries"], 1)
        self.assertEqual(new["counters"]["recovery_wait_seconds"], 100.0)

    def test_a_lease_expiring_exactly_now_is_expired(self) -> None:
        state = state_with("w1", 2, expires_in=0)
        self.assertEqual(after(state, lease.acquire_ops(state, "w2", 60, NOW))["lease"]["owner"], "w2")

    def test_bad_owner_or_ttl_is_invalid_input(self) -> None:
        state = state_with()
        for owner, ttl in (("", 60), ("bad owner", 60), ("w1", 0), ("w1", -1), ("w1", True), ("w1", "60"),
                           ("w1", lease.MAX_TTL_SECONDS + 1), ("w1", 1e12), ("w1", float("inf")), ("w1", float("nan"))):
            with self.subTest(owner=owner, ttl=ttl), self.assertRaises(InvalidInput):
                lease.acquire_ops(state, owner, ttl, NOW)  # type: ignore[arg-type]
        self.assertEqual(after(state, lease.acquire_ops(state, "w1", lease.MAX_TTL_SECONDS, NOW))["lease"]["epoch"], 1)


class FenceAndRenew(unittest.TestCase):
    def test_the_current_unexpired_holder_passes_the_fence(self) -> None:
        self.assertIsNone(lease.check_fence(state_with("w1", 3, expires_in=10), "w1", 3, NOW))

    def test_every_other_writer_is_fenced(self) -> None:
        for owner, epoch, state in (
            (None, 3, state_with("w1", 3, expires_in=10)),
            ("w1", None, state_with("w1", 3, expires_in=10)),
            ("w1", 2, state_with("w1", 3, expires_in=10)),
            ("w2", 3, state_with("w1", 3, expires_in=10)),
            ("w1", 3, state_with("w1", 3, expires_in=-0.001)),
            ("w1", 3, state_with(None, 3)),
        ):
            with self.subTest(owner=owner, epoch=epoch, lease=state["lease"]), self.assertRaises(Fenced):
                lease.check_fence(state, owner, epoch, NOW)

    def test_renew_moves_only_the_expiry_and_records_a_new_ttl(self) -> None:
        state = state_with("w1", 3, expires_in=10)
        state["lease"]["ttl_seconds"] = 90
        self.assertEqual(lease.renew_ops(state, "w1", 3, 90, NOW), [["set", ["lease", "expires_at"], format_time(NOW + 90)]])
        self.assertEqual(lease.renew_ops(state, "w1", 3, 30, NOW), [["set", ["lease", "expires_at"], format_time(NOW + 30)],
                                                                    ["set", ["lease", "ttl_seconds"], 30]])

    def test_an_expired_lease_cannot_be_renewed_even_if_nobody_took_it(self) -> None:
        with self.assertRaises(Fenced):
            lease.renew_ops(state_with("w1", 3, expires_in=-5), "w1", 3, 90, NOW)

    def test_renew_checks_the_ttl_before_the_fence(self) -> None:
        with self.assertRaises(InvalidInput):
            lease.renew_ops(state_with("w1", 3, expires_in=-5), "w1", 3, 1e12, NOW)


class ReleaseAndBreak(unittest.TestCase):
    def test_release_clears_the_holder_and_keeps_the_epoch(self) -> None:
        state = state_with("w1", 7, expires_in=10)
        self.assertEqual(after(state, lease.release_ops(state, "w1", 7, NOW))["lease"],
                         {"owner": None, "epoch": 7, "expires_at": None, "acquired_at": None})

    def test_release_without_an_epoch_is_fenced_not_a_crash(self) -> None:
        """Defect 18: 'lease release --owner w1' without --epoch raised a TypeError."""
        state = state_with("w1", 7, expires_in=10)
        for owner, epoch in (("w1", None), (None, 7), (None, None)):
            with self.subTest(owner=owner, epoch=epoch), self.assertRaisesRegex(Fenced, "must carry the lease"):
                lease.release_ops(state, owner, epoch, NOW)

    def test_release_by_another_owner_or_epoch_is_fenced(self) -> None:
        state = state_with("w1", 7, expires_in=10)
        for owner, epoch in (("w2", 7), ("w1", 6)):
            with self.subTest(owner=owner, epoch=epoch), self.assertRaises(Fenced):
                lease.release_ops(state, owner, epoch, NOW)

    def test_break_expires_a_live_lease_now_and_records_who_and_why(self) -> None:
        state = state_with("w1", 7, expires_in=100)
        new = after(state, lease.break_ops(state, "supervisor", "its process ended", NOW))
        self.assertEqual((new["lease"]["owner"], new["lease"]["epoch"], new["lease"]["expires_at"]), ("w1", 7, format_time(NOW)))
        record = new["observations"]["authorization"]["r1"]
        self.assertEqual((record["source"], record["by"], record["reason"], record["owner"], record["epoch"]),
                         ("lease break", "supervisor", "its process ended", "w1", 7))
        self.assertFalse(lease.lease_view(new, NOW)["live"])

    def test_break_of_a_free_or_expired_lease_changes_nothing(self) -> None:
        self.assertEqual(lease.break_ops(state_with(), "supervisor", "ended", NOW), [])
        self.assertEqual(lease.break_ops(state_with("w1", 7, expires_in=-1), "supervisor", "ended", NOW), [])

    def test_break_needs_a_supervisor_id_and_a_reason(self) -> None:
        state = state_with("w1", 7, expires_in=100)
        for by, reason in (("", "ended"), ("bad id", "ended"), ("supervisor", ""), ("supervisor", "  "), ("supervisor", "x" * 2001)):
            with self.subTest(by=by, reason=reason[:10]), self.assertRaises(InvalidInput):
                lease.break_ops(state, by, reason, NOW)


class LeaseView(unittest.TestCase):
    def test_live_means_held_and_unexpired(self) -> None:
        self.assertTrue(lease.lease_view(state_with("w1", 1, expires_in=1), NOW)["live"])
        self.assertFalse(lease.lease_view(state_with("w1", 1, expires_in=0), NOW)["live"])
        self.assertFalse(lease.lease_view(state_with(None, 1), NOW)["live"])

    def test_an_expiry_past_the_year_9999_is_read(self) -> None:
        state = state_with("w1", 1, expires_in=1e12)
        self.assertTrue(state["lease"]["expires_at"].startswith("33"))
        self.assertTrue(lease.lease_view(state, NOW)["live"])
        with self.assertRaises(AlreadyRunning):
            lease.acquire_ops(state, "w2", 60, NOW)


class LeaseReleaseCli(unittest.TestCase):
    def test_release_without_an_epoch_on_the_command_line(self) -> None:
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        run = tmp.name + "/run"
        self.assertEqual(_util.in_process_cli(["--dir", run, "init", "--contract", _util.TEMPLATE]).code, 0)
        self.assertEqual(_util.in_process_cli(["--dir", run, "lease", "acquire", "--owner", "w1", "--ttl", "60"]).code, 0)
        result = _util.in_process_cli(["--dir", run, "lease", "release", "--owner", "w1"])
        self.assertEqual(result.code, 9, result)
        [line] = _util.stderr_lines(result)
        self.assertTrue(line.startswith("runner: fenced: this write must carry the lease: pass --owner ID --epoch N"), line)
        # To its holder: the epoch to pass, and that an acquire would fence what runs under it.
        self.assertIn("w1 holds the live lease at epoch 1 until", line, "it says which lease is live")
        self.assertIn("pass --epoch 1", line)
        self.assertIn("fence whatever of w1 runs under this one", line)
        result = _util.in_process_cli(["--dir", run, "--json", "lease", "show"])
        self.assertEqual(_util.one_json(result)["owner"], "w1")

    def test_each_refusal_says_which_lease_is_live_and_how_this_writer_comes_to_hold_it(self) -> None:
        state = state_with("w1", 3, expires_in=60)

        def refusal(state: Dict[str, Any], owner: Optional[str], epoch: Optional[int]) -> str:
            with self.assertRaises(Fenced) as caught:
                lease.check_fence(state, owner, epoch, NOW)
            self.assertEqual(caught.exception.exit_code, 9)
            return caught.exception.message

        other = refusal(state, "w2", None)
        self.assertIn("held by w1 at epoch 3", other)
        self.assertIn("once it expires", other)
        self.assertIn("`lease break`", other)
        self.assertNotIn("--epoch 3", other, "another owner is never told the holder's epoch to pass")
        self.assertIn("w2 does not hold the lease: the lease is held by w1", refusal(state, "w2", 3))
        self.assertIn("stale writer: w1 at epoch 2, but the lease is at epoch 3: a later acquire fenced", refusal(state, "w1", 2))
        for fenced in (state, state_with(None, 3), state_with("w2", 3, expires_in=-5)):  # held, given back, expired
            message = refusal(fenced, "w1", 2)
            self.assertIn("stale writer: w1 at epoch 2", message)
            self.assertNotIn("--epoch 3", message, "a fenced writer is not told how to write again")
            self.assertNotIn("acquire --owner", message)
        self.assertIn("no acquire gave epoch 4", refusal(state, "w1", 4))
        expired = refusal(state_with("w1", 3, expires_in=-5), "w2", None)
        self.assertIn("the lease of w1 at epoch 3 expired at", expired)
        self.assertIn("takes it at epoch 4", expired)
        self.assertIn("nobody holds the lease: `lease acquire --owner ID`", refusal(state_with(None, 3), "w2", None))


if __name__ == "__main__":
    unittest.main()
