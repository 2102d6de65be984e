"""``drive --parallel``: many effects in flight against a target that does not deduplicate, with real processes.

Every claim of one effect per item is checked on the target's own ledger
(tests/test_executor.py's target program), after ``drive`` was SIGKILLed at
each effect window with several calls in flight, cancelled with 32 in
flight, asked to stop by a signal, or pushed back by a rate limit.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time
import unittest
from typing import Any, Callable, Dict, List

from runner.proof.ticketcommands import KILL_AT_WINDOW
from tests.support.fake_http import wait_until
from tests.support.util import in_parallel
from tests.test_executor import TargetCase


def interrupt_twice(drive: "subprocess.Popen[bytes]", seconds: float = 20) -> None:
    """SIGINT ``drive``, wait until it says it is stopping, then SIGINT it again.

    A second signal sent before the first was handled would be merged with it (a pending signal is not
    queued twice), so the second is sent only once the handler's line is on stderr.
    """
    drive.send_signal(signal.SIGINT)
    deadline, said = time.monotonic() + seconds, b""
    while b"drive: stopping on SIGINT" not in said:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([drive.stderr], [], [], left)[0]:
            raise AssertionError(f"drive did not say it was stopping within {seconds:g} s: {said[-500:]!r}")
        chunk = os.read(drive.stderr.fileno(), 65536)  # type: ignore[union-attr]
        if not chunk:
            raise AssertionError(f"drive ended before it said it was stopping: {said[-500:]!r}")
        said += chunk
    drive.send_signal(signal.SIGINT)

#: Put in front of a contract command: at its window, SIGKILL the runner that started it (its parent), at the Nth passage.
KILLER = r'''
# killer.sh ROLE COUNTER WINDOW NTH -- COMMAND...: run COMMAND; at WINDOW's NTH passage, SIGKILL the runner.
# A shell, not Python, whose start would be most of a call's cost. The Nth passage is the one that creates COUNTER.N:
# each takes the first number no other took, by an exclusive create (noclobber), so calls in parallel count once each.
# The numbers taken are always 1 to some M, so a passage starts at the count of those it sees (a glob: no process) plus
# one; "command" keeps a refused create from ending the shell, as it would end it for a special built-in.
role=$1 counter=$2 window=$3 nth=$4
shift 5
set -C
due() {
  [ "$1" = "$window" ] || return 1
  set -- "$counter".*
  if [ -e "$1" ]; then seen=$(($# + 1)); else seen=1; fi
  until command : 2>/dev/null > "$counter.$seen"; do seen=$((seen + 1)); done
  [ "$seen" -eq "$nth" ]
}
''' + KILL_AT_WINDOW + r'''[ "$role" = invoke ] || exec "$@"
answer=$("$@")
code=$?
# Killed after the target committed: the command still prints what the target answered, for whoever takes over.
if [ "$code" -eq 0 ] && due after-target-commit; then die; fi
printf '%s\n' "$answer"
if [ "$code" -eq 0 ] && due after-response; then die; fi
exit "$code"
'''

WINDOWS = ("before-started", "after-started", "after-target-commit", "after-response", "after-ack")
#: The command that passes each window: the payload command, the invoke or the observe.
ROLE_AT = {"before-started": "payload", "after-started": "invoke", "after-target-commit": "invoke", "after-response": "invoke",
           "after-ack": "observe"}


class ParallelCase(TargetCase):
    def killer(self, window: str, nth: int) -> Callable[[str], List[str]]:
        """The wrapper that SIGKILLs the runner at ``window``'s ``nth`` passage (see KILLER).

        Only the command that passes ``window`` is wrapped: the others would
        pass through the wrapper without ever counting.
        """
        path = os.path.join(self.root, "killer.sh")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(KILLER)
        counter = os.path.join(self.root, "kill-count")
        return lambda role: ["sh", path, role, counter, window, str(nth), "--"] if role == ROLE_AT[window] else []

    def in_flight(self) -> int:
        folder = os.path.join(self.root, ".run", "calls")
        count = 0
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            if name.endswith(".json"):
                try:
                    with open(os.path.join(folder, name), encoding="utf-8") as handle:
                        record = json.load(handle)
                except (OSError, ValueError):
                    continue
                count += record.get("kind") == "invoke" and bool(record.get("child")) and record.get("ended_at") is None
        return count

    def wait_in_flight(self, at_least: int, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while self.in_flight() < at_least:
            if time.monotonic() > deadline:
                raise AssertionError(f"fewer than {at_least} calls came in flight")
            time.sleep(0.02)

    def items(self, count: int) -> List[str]:
        return [f"i{n:03d}" for n in range(count)]

    def assert_one_each(self, items: List[str]) -> None:
        self.assertEqual({key: self.lines(key + ":ticket") for key in items}, {key: 1 for key in items})


class KilledWithCallsInFlightTest(unittest.TestCase):
    """``drive --parallel 8`` SIGKILLed at each effect window with eight calls in flight, resumed by another process: one effect per item."""

    def test_each_window(self) -> None:
        def one(window: str) -> Dict[str, Any]:
            case = ParallelCase()
            case.setUp()
            try:
                # Eight calls in flight take 32 items in hand, each with its payload made first: the 33rd
                # payload is made once calls are on their way; every other window, the ninth pass.
                nth = 33 if window == "before-started" else 9
                items = case.items(nth + 3 if window == "before-started" else 2 * nth)
                case.start(items, invoke={"send-after": 0.05, "jitter": 0.3}, timeout=10, wrapper=case.killer(window, nth=nth))
                first = case.finish(case.cli.spawn("drive", "--owner", "w1", "--parallel", "8", "--json"))
                in_flight_at_kill = len([n for n in os.listdir(os.path.join(case.root, ".run", "calls")) if n.endswith(".json")])
                broken = case.cli("lease", "break", "--by", "supervisor", "--reason", "w1 was killed", code=None)
                second = case.finish(case.cli.spawn("drive", "--owner", "w2", "--parallel", "8", "--json"))
                counts = {key: case.lines(key + ":ticket") for key in items}
                return {"window": window, "first": first["code"], "broken": broken.code, "second": second["code"], "err": second["err"],
                        "counts": counts, "at_kill": in_flight_at_kill, "left": os.listdir(os.path.join(case.root, ".run", "calls"))}
            finally:
                case.doCleanups()

        for result in in_parallel([lambda w=w: one(w) for w in WINDOWS], workers=3):  # type: ignore[misc]
            with self.subTest(window=result["window"]):
                self.assertEqual(result["first"], -signal.SIGKILL, result)
                self.assertGreaterEqual(result["at_kill"], 4, "calls were in flight when the runner died")
                print(f"{result['window']}: {result['at_kill']} calls in flight at the kill", file=sys.stderr)
                self.assertEqual((result["broken"], result["second"]), (0, 10), result["err"])
                self.assertEqual(set(result["counts"].values()), {1}, result["counts"])
                self.assertEqual(result["left"], [], "no record or payload of a call is left behind")


class StopsWithCallsInFlightTest(ParallelCase):
    def test_a_cancel_with_32_in_flight_stops_new_calls_at_once_and_ends_reconciled(self) -> None:
        items = self.items(96)
        self.start(items, invoke={"hold-until": self.gate()}, timeout=40)
        drive = self.cli.spawn("drive", "--owner", "w", "--parallel", "32", "--json")
        self.wait_in_flight(32)
        # another process than the drive's
        self.cli("cancel", "--by", "operator", "--reason", "no longer needed", "--json")
        begun = sum(self.cli.status()["effects"].values())
        began = time.monotonic()
        self.open_gate()
        result = self.finish(drive)
        self.assertEqual(result["code"], 5, result["err"])
        self.assertLess(time.monotonic() - began, 10, "within one call's timeout")
        after = self.cli.status()
        self.assertLessEqual(sum(after["effects"].values()), begun, "no effect began after the cancel was recorded")
        self.assertEqual(self.calls(), self.lines(), "every call that went out is on the target once")
        self.assertEqual(after["status"], "cancelled")
        self.assertEqual(set(after["effects"]), {"verified"}, "every call in flight was reconciled")
        self.assertEqual(after["effects"]["verified"], self.lines())

    def test_sigterm_settles_the_calls_in_flight_releases_the_lease_and_exits_15(self) -> None:
        items = self.items(16)  # 8 in flight at the signal, 8 left for the next drive
        self.start(items, invoke={"hold-until": self.gate()}, timeout=40)
        drive = self.cli.spawn("drive", "--owner", "w", "--parallel", "8", "--json")
        self.wait_in_flight(8)
        drive.send_signal(signal.SIGTERM)
        self.open_gate()
        result = self.finish(drive)
        self.assertEqual((result["code"], result["reason"]), (15, "stopped"), result["err"])
        after = self.cli.status()
        self.assertIsNone(after["lease"]["owner"], "the lease was released")
        self.assertEqual(set(after["effects"]), {"verified"}, "the calls in flight were recorded and observed")
        self.assertEqual(os.listdir(os.path.join(self.root, ".run", "calls")), [])
        again = self.finish(self.cli.spawn("drive", "--owner", "w2", "--parallel", "8", "--json"))
        self.assertEqual(again["code"], 10, again["err"])
        self.assert_one_each(items)

    def test_a_second_signal_stops_at_once_and_the_next_drive_settles_what_was_in_flight(self) -> None:
        items = self.items(16)
        self.start(items, invoke={"hold-until": self.gate()}, timeout=40)
        drive = self.cli.spawn("drive", "--owner", "w", "--parallel", "8", "--json")
        self.wait_in_flight(8)
        interrupt_twice(drive)
        drive.wait(20)  # every call is held: an exit now did not wait for one of them
        self.assertEqual(drive.returncode, -signal.SIGINT)
        self.assertGreaterEqual(self.in_flight(), 1, "the calls it left are still on their way")
        self.open_gate()
        again = self.finish(self.cli.spawn("drive", "--owner", "w", "--parallel", "8", "--json"))
        self.assertEqual(again["code"], 10, again["err"])
        self.assert_one_each(items)

    def test_calls_a_stopped_drive_left_at_the_target_count_against_the_next_drives_concurrency(self) -> None:
        items = self.items(16)
        self.start(items, invoke={"hold-until": self.gate(), "spans": 1}, timeout=40)
        first = self.cli.spawn("drive", "--owner", "w", "--parallel", "8", "--json")
        self.wait_in_flight(8)
        interrupt_twice(first)  # stops at once: the 8 calls stay at the target, held
        first.wait(20)
        second = self.cli.spawn("drive", "--owner", "w", "--parallel", "8", "--json")
        self.assertTrue(wait_until(lambda: self.cli.status()["lease"]["epoch"] == 2, 30),
                        "the second drive took the lease")
        # Time enough for a drive that ignored them to send 8 more.
        self.assertFalse(wait_until(lambda: self.calls() > 8, 1.5), "no new call while the 8 left at the target fill the 8 slots")
        self.open_gate()
        result = self.finish(second)
        self.assertEqual(result["code"], 10, result["err"])
        self.assertEqual(self.most_at_once(), 8)
        self.assert_one_each(items)

    def test_sigterm_while_waiting_out_a_retry_after_ends_the_wait_and_calls_nothing_more(self) -> None:
        # Nothing wakes the runner before the 120 s are up, not even its lease (renewed a third of the way into 300 s).
        self.start(["a"], invoke={"exits": "75", "retry-after": 120}, timeout=10, lease={"ttl_seconds": 300})
        drive = self.cli.spawn("drive", "--owner", "w", "--json")
        # The target said "not now, in 120 s": nothing runs.
        self.assertTrue(wait_until(lambda: self.cli.status()["effects"] == {"absent": 1}, 30), "the 429 was recorded")
        drive.send_signal(signal.SIGTERM)
        result = self.finish(drive, timeout=30)  # well before the 100 s to the lease's renewal, or the 120 s of the wait
        self.assertEqual((result["code"], result["reason"]), (15, "stopped"), result["err"])
        self.assertIn("stopping on SIGTERM", result["err"])
        self.assertEqual(self.calls(), 1, "no call after the signal")
        after = self.cli.status()
        self.assertEqual((after["effects"], after["lease"]["owner"]), ({"absent": 1}, None))

    def test_a_signal_during_a_steps_check_finishes_it_and_starts_nothing_after(self) -> None:
        started, gate = os.path.join(self.root, "check.started"), self.gate()
        held = ["sh", "-c", 'touch "$0"; while [ ! -e "$1" ]; do sleep 0.02; done', started, gate]
        self.start(["a"], before=[{"id": "prepare", "checks": {"held": held}, "next": "file-tickets"}])
        drive = self.cli.spawn("drive", "--owner", "w", "--json")
        self.assertTrue(wait_until(lambda: os.path.exists(started), 30), "the check began")
        drive.send_signal(signal.SIGINT)
        self.open_gate()
        result = self.finish(drive)
        self.assertEqual((result["code"], result["reason"]), (15, "stopped"), result["err"])
        after = self.cli.status()
        self.assertEqual(after["completed_steps"], ["prepare"], "the check in hand was finished and recorded")
        self.assertNotIn("file-tickets", after["steps"], "the next step never started")
        self.assertEqual((self.calls(), after["lease"]["owner"]), (0, None))


class RateLimitTest(ParallelCase):
    def test_a_target_that_answers_429_above_its_rate_gets_every_item_once(self) -> None:
        limited = os.path.join(self.root, "limited.py")
        with open(limited, "w", encoding="utf-8") as handle:
            handle.write(RATE_LIMITED)
        items = self.items(20)  # more than the 8 a second the target takes, all asked for within one second

        def wrapper(role: str) -> List[str]:
            return [sys.executable, "-S", limited, self.root, "8", "--"] if role == "invoke" else []

        self.start(items, timeout=10, wrapper=wrapper, effects={"max_rate_limited": 50})
        result = self.finish(self.cli.spawn("drive", "--owner", "w", "--parallel", "16", "--json"), timeout=120)
        self.assertEqual(result["code"], 10, result["err"])
        self.assertGreater(result["drive"]["not_now"], 0, "the target pushed back")
        self.assert_one_each(items)


#: An invoke in front of the target: above LIMIT calls a second (over all processes) it answers 429 with a retry_after.
RATE_LIMITED = r'''
import fcntl, os, sys, time
root, limit = sys.argv[1], int(sys.argv[2])
with open(os.path.join(root, "rate"), "a+") as handle:
    fcntl.flock(handle, fcntl.LOCK_EX)
    handle.seek(0)
    now = time.time()
    recent = [float(t) for t in handle.read().split() if now - float(t) < 1.0]
    if len(recent) >= limit:
        print('{"retry_after": %r}' % round(1.0 - (now - min(recent)), 3))
        sys.exit(75)
    handle.seek(0)
    handle.truncate()
    handle.write("".join("%f\n" % t for t in recent + [now]))
os.execvp(sys.argv[4], sys.argv[4:])  # the target in this process's place: its answer and exit code are this call's
'''


if __name__ == "__main__":
    unittest.main()
