"""The executor against a target that does not deduplicate, with real processes killed, stopped and raced.

The target is a small program: ``invoke`` may wait before it "sends" (a
client that authenticates first), appends one line per effect to a ledger,
and may answer late; ``observe`` finds a key only once its line is older than
the lookup's lag. It never deduplicates: every second line for a key is a
duplicate. Each test runs ``drive`` in child processes (the other verbs,
``effect run`` included, through the command line's entry point in this
process) and counts the ledger's lines.
"""

import json
import os
import signal
import subprocess
import sys
import time
import unittest
from typing import Any, Callable, Dict, List, Optional, Tuple

from runner.calls.commands import OUTPUT_LIMIT, run_command
from runner.base.times import parse_time
from tests.support.batch import batch_contract
from tests.support.cli import RunnerCli
from tests.support.util import child_env, in_parallel, python, scratch_dir

TARGET = r'''
# target.sh invoke|observe LEDGER KEY [OPTION VALUE]...: a target that never deduplicates.
# A shell, not Python: an interpreter's start would be most of the cost of every call the tests make.
mode=$1 ledger=$2 key=$3
shift 3
send_after=0 jitter=0 hold_until= exits= retry_after=0.05 answer_after=0 answer= lag=0 spans=
while [ $# -ge 2 ]; do
  case $1 in
    send-after) send_after=$2 ;; jitter) jitter=$2 ;; hold-until) hold_until=$2 ;; exits) exits=$2 ;;
    retry-after) retry_after=$2 ;; answer-after) answer_after=$2 ;; answer) answer=$2 ;; lag) lag=$2 ;; spans) spans=$2 ;;
    *) echo "target: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
if [ "$mode" = invoke ]; then
  echo "$key" >> "$ledger.calls"
  if [ -n "$spans" ]; then  # "TIME +1" as the call starts, "TIME -1" as it ends: how many were at the target at once
    printf '%s +1\n' "$(date +%s.%N)" >> "$ledger.spans"
    trap 'printf "%s -1\n" "$(date +%s.%N)" >> "$ledger.spans"' EXIT
    trap '' PIPE  # a call whose runner is gone ends as the target ends it, not when its answer finds no reader
  fi
  if [ "$send_after" != 0 ] || [ "$jitter" != 0 ]; then  # authenticating: nothing sent yet
    sleep "$(awk -v a="$send_after" -v j="$jitter" -v seed="$$" 'BEGIN {srand(seed); printf "%.6f", a + rand() * j}')"
  fi
  waited=0
  while [ -n "$hold_until" ] && [ ! -e "$hold_until" ] && [ "$waited" -lt 600 ]; do
    sleep 0.05  # held, nothing sent, until the test opens the gate (30 s at most)
    waited=$((waited + 1))
  done
  if [ -n "$exits" ]; then  # e.g. "75,75": the first answers, then success
    calls=$(grep -cxF -e "$key" "$ledger.calls")
    code=$(awk -v s="$exits" -v n="$calls" 'BEGIN {k = split(s, c, ","); if (n <= k) print c[n] + 0; else print 0}')
    if [ "$code" != 0 ]; then
      [ "$code" = 75 ] && printf '{"retry_after": %s}\n' "$retry_after"
      exit "$code"
    fi
  fi
  printf '%s %s\n' "$key" "$(date +%s.%N)" >> "$ledger"  # one write of one short line: appends never interleave
  [ "$answer_after" = 0 ] || sleep "$answer_after"
  if [ "$answer" = none ]; then
    echo "warning: slow"
    exit 0
  fi
  printf '{"ticket": "%s"}\n' "$key"
  exit 0
fi
[ -e "$ledger" ] || exit 1
awk -v k="$key" -v now="$(date +%s.%N)" -v lag="$lag" \
  '$1 == k && now - $2 >= lag {printf "{\"found\": \"%s\"}\n", k; found = 1; exit} END {exit !found}' "$ledger"
'''


class TargetCase(unittest.TestCase):
    """A workspace with the target program and a batch contract over it."""

    def setUp(self) -> None:
        self.tmp = scratch_dir("runner-executor-")
        self.addCleanup(self.tmp.cleanup)
        self.root = self.tmp.name
        self.cli = RunnerCli(self, root=self.root)
        with open(os.path.join(self.root, "target.sh"), "w", encoding="utf-8") as handle:
            handle.write(TARGET)
        self.ledger = os.path.join(self.root, "ledger")

    def gate(self) -> str:
        """A file whose creation lets every held call go on (the target's ``hold-until``)."""
        return os.path.join(self.root, "gate")

    def open_gate(self) -> None:
        with open(self.gate(), "w"):
            pass

    def start(self, items: List[str], invoke: Optional[Dict[str, Any]] = None, observe: Optional[Dict[str, Any]] = None,
              timeout: float = 20, wrapper: Optional[Callable[[str], List[str]]] = None, before: Optional[List[Dict[str, Any]]] = None,
              **extra: Any) -> None:
        """Start the run over ``items``; ``wrapper(role)`` is put in front of the invoke and observe commands;
        ``before`` are steps that come before the batch step."""
        def command(mode: str, options: Optional[Dict[str, Any]]) -> List[str]:
            flat = [str(x) for pair in (options or {}).items() for x in pair]
            front = wrapper(mode) if wrapper else []
            return front + ["sh", os.path.join(self.root, "target.sh"), mode, self.ledger, "{key}"] + flat

        payload = {"template": {"item": "{item}"}}
        if wrapper is not None and wrapper("payload"):
            payload = {"command": wrapper("payload") + ["printf", '{"item": "%s"}\\n', "{item}"]}
        block = batch_contract({"invoke": command("invoke", invoke), "observe": command("observe", observe)}, items=items,
                               payload=payload, timeout=timeout)
        block["steps"][0]["key"] = "{item}:ticket"
        block["steps"][:0] = before or []
        block["effects"]["key_pattern"] = "[a-z0-9]+:ticket"
        for section, values in extra.items():
            if values is None:
                block.pop(section, None)
            else:
                block.setdefault(section, {}).update(values)
        self.cli.init(block)

    def finish(self, child: "subprocess.Popen[bytes]", timeout: float = 60) -> Dict[str, Any]:
        out, err = child.communicate(timeout=timeout)
        result = {"code": child.returncode, "err": err.decode("utf-8", "replace")}
        if out.strip():
            result.update(json.loads(out.decode().splitlines()[-1]))
        return result

    def lines(self, key: Optional[str] = None) -> int:
        try:
            with open(self.ledger, encoding="utf-8") as handle:
                rows = [line.split()[0] for line in handle if line.strip()]
        except FileNotFoundError:
            return 0
        return len(rows) if key is None else rows.count(key)

    def most_at_once(self) -> int:
        """The most invoke calls at the target at one time (the target's ``spans`` option)."""
        with open(self.ledger + ".spans", encoding="utf-8") as handle:
            events = sorted((float(at), int(step)) for at, step in (line.split() for line in handle if line.strip()))
        most = now = 0
        for _, step in events:
            now += step
            most = max(most, now)
        return most

    def calls(self) -> int:
        try:
            with open(self.ledger + ".calls", encoding="utf-8") as handle:
                return len(handle.read().split())
        except FileNotFoundError:
            return 0

    def wait_for_call_in_flight(self, seconds: float = 20) -> Dict[str, Any]:
        """The registry's record of an invoke whose own process has started (the runner is then inside the call)."""
        folder = os.path.join(self.root, ".run", "calls")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                if name.endswith(".json"):
                    try:
                        with open(os.path.join(folder, name), encoding="utf-8") as handle:
                            record = json.load(handle)
                    except (OSError, ValueError):
                        continue
                    if record.get("kind") == "invoke" and record.get("child"):
                        return record
            time.sleep(0.02)
        raise AssertionError("no invoke came in flight")

    def wait_for_lease_epoch_above(self, epoch: int, seconds: float = 20) -> None:
        """Until the run's lease is held at an epoch above ``epoch``: another holder has taken over."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            lease = json.loads(self.cli("status", "--json").out)["lease"]
            if lease.get("owner") and int(lease.get("epoch") or 0) > epoch:
                return
            time.sleep(0.05)
        raise AssertionError(f"no holder took the lease above epoch {epoch}")

    def effect(self, key: str) -> Dict[str, Any]:
        result = self.cli("effect", "show", key, "--json")
        return json.loads(result.out)


class ReceiptTest(TargetCase):
    def test_an_acknowledged_effect_whose_lookup_lags_is_never_called_again(self) -> None:
        """The documented 'run drive again' after exit 8 must not call the target a second time."""
        self.start(["a"], observe={"lag": 30})
        first = self.finish(self.cli.spawn("drive", "--owner", "w", "--json"))
        self.assertEqual(first["code"], 8, first["err"])
        self.assertIn("receipt", first["detail"])
        record = self.effect("a:ticket")
        self.assertEqual((record["state"], record["receipt"]), ("uncertain", {"ticket": "a:ticket"}))
        again = self.finish(self.cli.spawn("drive", "--owner", "w", "--json"))
        self.assertEqual(again["code"], 8, again["err"])
        self.assertIsNone(again["lease"]["owner"], "drive gave its lease back at the stop")
        taken = self.cli("lease", "acquire", "--owner", "w", "--json", code=None).json
        refused = self.cli("effect", "absent", "a:ticket", "--evidence", '{"looked": true}', "--owner", "w",
                           "--epoch", str(taken["epoch"]), code=None)
        self.assertEqual(refused.code, 8, "an absence is never recorded over a receipt")
        self.assertEqual((self.lines("a:ticket"), self.calls()), (1, 1))

    def test_a_lookup_that_lags_is_looked_at_again_and_verified_before_the_settle_time_is_out(self) -> None:
        self.start(["a"], observe={"lag": 1.0}, effects={"settle_seconds": 30})
        done = self.finish(self.cli.spawn("drive", "--owner", "w", "--json"))
        self.assertEqual(done["code"], 10, done["err"])
        record = self.effect("a:ticket")
        self.assertEqual(record["state"], "verified")
        self.assertEqual(self.lines("a:ticket"), 1)
        # Seen after the one-second lag, so verified then: a presence needs no settle time, only an absence does.
        # Times of the run's own record: one that waited the settle time out shows 30 s or more, however loaded.
        took = parse_time(record["updated_at"]) - parse_time(record["started_at"])
        self.assertLess(took, 30, f"verified {took:.1f} s after the call began: the settle time of 30 s was waited out")


class CallsInFlightTest(TargetCase):
    def test_the_lease_lives_through_a_call_longer_than_its_ttl(self) -> None:
        self.start(["a"], invoke={"hold-until": self.gate()}, lease={"ttl_seconds": 1.5}, timeout=40)
        first = self.cli.spawn("drive", "--owner", "worker-a", "--json")
        self.wait_for_call_in_flight()
        lapse = time.time() + 1.8
        while time.time() < lapse:  # past the lease's ttl, the call still held: only renewals during the call keep it
            time.sleep(0.05)
        second = self.finish(self.cli.spawn("drive", "--owner", "worker-b", "--json"))
        self.open_gate()
        self.assertEqual(second["code"], 3, second["err"])
        self.assertEqual(self.finish(first)["code"], 10)
        self.assertEqual(self.lines("a:ticket"), 1)

    def test_a_second_drive_of_the_same_owner_waits_for_the_call_in_flight(self) -> None:
        self.start(["a", "b"], invoke={"hold-until": self.gate()}, timeout=40)
        first = self.cli.spawn("drive", "--owner", "agent-1", "--json")
        held = self.wait_for_call_in_flight()
        second = self.cli.spawn("drive", "--owner", "agent-1", "--json")
        self.wait_for_lease_epoch_above(held["epoch"])  # the second has taken over; the first's call is still held
        self.open_gate()
        second = self.finish(second)
        self.assertEqual(second["code"], 10, second["err"])
        self.assertEqual(self.finish(first)["code"], 9, "the first is fenced by the second's epoch")
        self.assertEqual((self.lines("a:ticket"), self.lines("b:ticket")), (1, 1))

    def test_a_killed_drive_whose_call_is_still_on_its_way_then_a_broken_lease_and_a_drive_at_once(self) -> None:
        self.start(["a", "b"], invoke={"send-after": 1.5})
        first = self.cli.spawn("drive", "--owner", "worker-1", "--json")
        call = self.wait_for_call_in_flight()
        first.kill()
        first.wait()
        broke = self.cli("lease", "break", "--by", "supervisor", "--reason", "worker-1 was killed")
        self.assertRegex(broke.out, r"^lease of worker-1 \(epoch 1\) ended at \S+Z: its holder's writes are refused")
        os.kill(call["child"][0], 0)  # the orphaned call is still on its way
        self.assertEqual(self.lines(), 0)
        second = self.finish(self.cli.spawn("drive", "--owner", "worker-2", "--json"))
        self.assertEqual(second["code"], 10, second["err"])
        self.assertEqual((self.lines("a:ticket"), self.lines("b:ticket")), (1, 1))
        self.assertEqual(os.listdir(os.path.join(self.root, ".run", "calls")), [], "no record or payload of a call is left behind")

    def test_a_stopped_drive_whose_lease_lapsed_is_fenced_and_its_call_waited_for(self) -> None:
        self.start(["a", "b"], invoke={"send-after": 2.5}, lease={"ttl_seconds": 1})
        # A session of its own: the kernel sends a stopped process SIGHUP when its process group becomes orphaned
        # (POSIX), which a group shared with this test's other processes can, as they come and go.
        first = self.cli.spawn("drive", "--owner", "worker-1", "--json", start_new_session=True)
        self.wait_for_call_in_flight()
        os.kill(first.pid, signal.SIGSTOP)
        time.sleep(1.2)  # the stopped holder's lease lapses; its call's own process runs on
        second = self.finish(self.cli.spawn("drive", "--owner", "worker-2", "--json"))
        self.assertEqual(second["code"], 10, second["err"])
        os.kill(first.pid, signal.SIGCONT)
        self.assertEqual(self.finish(first)["code"], 9)
        self.assertEqual((self.lines("a:ticket"), self.lines("b:ticket")), (1, 1))

    def test_two_drives_of_one_owner_started_together(self) -> None:
        self.start(["a", "b", "c", "d"], invoke={"send-after": 0.3})
        drives = [self.cli.spawn("drive", "--owner", "agent-1", "--json") for _ in range(2)]
        results = in_parallel([lambda d=d: self.finish(d) for d in drives])  # type: ignore[misc]
        self.assertIn(10, [r["code"] for r in results])
        self.assertTrue(all(r["code"] in (9, 10) for r in results), results)
        self.assertEqual([self.lines(k + ":ticket") for k in "abcd"], [1, 1, 1, 1])


class CommandProtocolTest(TargetCase):
    def test_not_now_is_retried_after_the_delay_and_bounded_by_its_own_count(self) -> None:
        self.start(["a"], invoke={"exits": "75,75", "retry-after": 0.2}, effects={"max_rate_limited": 3})
        done = self.finish(self.cli.spawn("drive", "--owner", "w", "--json"))
        self.assertEqual(done["code"], 10, done["err"])
        record = self.effect("a:ticket")
        self.assertEqual((record["attempts"], record["deferred"], self.calls(), self.lines()), (3, 2, 3, 1))

    def test_not_now_past_its_bound_is_a_spent_limit(self) -> None:
        self.start(["a"], invoke={"exits": "75,75,75,75", "retry-after": 0}, effects={"max_rate_limited": 2})
        done = self.finish(self.cli.spawn("drive", "--owner", "w", "--json"))
        self.assertEqual((done["code"], done["context"]["limit"]), (6, "max_rate_limited"), done)
        self.assertEqual((self.calls(), self.lines()), (2, 0))

    def test_exit_9_stops_fenced_and_calls_nothing_more(self) -> None:
        self.start(["a", "b"], invoke={"exits": "9"})
        done = self.finish(self.cli.spawn("drive", "--owner", "w", "--json"))
        self.assertEqual(done["code"], 9, done["err"])
        self.assertEqual((self.calls(), self.lines()), (1, 0))

    def test_attempts_are_bounded_by_default_and_spaced_by_the_backoff(self) -> None:
        self.start(["a"], invoke={"answer": "none"}, observe={"lag": 3600}, limits=None, retry={"base_seconds": 0.2, "cap_seconds": 0.2})
        done = self.finish(self.cli.spawn("drive", "--owner", "w", "--json"), timeout=30)
        self.assertEqual((done["code"], done["context"]["limit"]), (6, "max_effect_attempts"), done)
        self.assertEqual(self.calls(), 3)
        # From the journal: each absence set a time no later than the cap after it, and the next attempt began no earlier
        # (the draws are random, so the waits are checked against what the run recorded, not against a clock here).
        scheduled: Optional[Tuple[str, str]] = None
        retries = []
        with open(os.path.join(self.root, ".run", "journal.jsonl"), encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)["r"]
                for op in record["ops"]:
                    if op[1] == ["effects", "a:ticket", "next_attempt_at"] and op[2] is not None:
                        scheduled = (record["at"], op[2])
                    elif op[1] == ["effects", "a:ticket"] and op[2]["attempts"] > 1:
                        self.assertIsNotNone(scheduled, f"attempt {op[2]['attempts']} began with no wait scheduled")
                        retries.append((scheduled, record["at"]))
                        scheduled = None
        self.assertEqual(len(retries), 2, retries)
        for (absent_at, not_before), attempt_at in retries:
            self.assertLessEqual(parse_time(not_before) - parse_time(absent_at), 0.2, "a wait within the cap")
            self.assertGreaterEqual(parse_time(attempt_at), parse_time(not_before), "the attempt waited its backoff")


class KeptPayloadTest(TargetCase):
    def test_an_effect_begun_by_one_session_is_run_by_another_from_the_payload_the_run_kept(self) -> None:
        # A begin the registry never saw may have its own call in flight: it is waited for until its timeout.
        self.start(["a"], timeout=1)
        payload = os.path.join(self.root, "p.json")
        with open(payload, "w", encoding="utf-8") as handle:
            json.dump({"note": "sent by the first session"}, handle)
        taken = self.cli("lease", "acquire", "--owner", "s1", "--json", code=None).json
        s1 = ["--owner", "s1", "--epoch", str(taken["epoch"])]
        self.cli("effect", "begin", "adhoc:ticket", "--payload", payload, *s1)
        self.cli("lease", "release", *s1)
        os.unlink(payload)  # the second session has nothing but the run
        kept = self.effect("adhoc:ticket")
        self.assertEqual(kept["payload"], {"note": "sent by the first session"})
        taken = self.cli("lease", "acquire", "--owner", "s2", "--json", code=None).json
        target = ["sh", os.path.join(self.root, "target.sh")]
        ran = self.cli("effect", "run", "adhoc:ticket", "--owner", "s2", "--epoch", str(taken["epoch"]), "--json",
                       "--", *target, "invoke", self.ledger, "{key}",
                       "--observe", "--", *target, "observe", self.ledger, "{key}")
        self.assertEqual((json.loads(ran.out)["state"], self.lines("adhoc:ticket")), ("verified", 1))


class FlagTest(TargetCase):
    def test_an_absence_soon_after_a_takeover_of_a_call_the_registry_never_saw_is_flagged_for_a_person(self) -> None:
        self.start(["a"], timeout=2)
        payload = os.path.join(self.root, "p.json")
        with open(payload, "w", encoding="utf-8") as handle:
            json.dump({"note": "an agent's own call"}, handle)
        taken = self.cli("lease", "acquire", "--owner", "agent", "--json", code=None).json
        creds = ["--owner", "agent", "--epoch", str(taken["epoch"])]
        self.cli("effect", "begin", "manual:ticket", "--payload", payload, *creds)
        begun = parse_time(self.effect("manual:ticket")["updated_at"])
        # The agent called the target itself (nothing the registry saw), then its session ended without a release.
        # The takeover comes a while after the begin, as in life. The absence is believed at the call's deadline
        # (begin + 2 s) or at the first lookup, whichever is later, and flagged if that is within 2 s of the takeover:
        # true whenever the takeover is later after the begin than the lookup after the deadline takes, however busy the machine.
        while time.time() < begun + 0.5:
            time.sleep(0.05)
        ran = self.cli.child("lease", "break", "--by", "supervisor", "--reason", "the agent's session ended")
        taken = self.cli("lease", "acquire", "--owner", "next", "--json", code=None).json
        target = ["sh", os.path.join(self.root, "target.sh")]
        ran = self.cli("effect", "run", "manual:ticket", "--owner", "next", "--epoch", str(taken["epoch"]), "--json",
                       "--", *target, "invoke", self.ledger, "{key}",
                       "--observe", "--", *target, "observe", self.ledger, "{key}")
        record = json.loads(ran.out)
        self.assertEqual((record["state"], record["flags"]), ("verified", ["absent-soon-after-takeover"]))
        report = self.cli("report", "--json", code=None).json
        self.assertEqual(report["possible_duplicates"], 1)
        brief = self.cli("brief", "--json", code=None).json["brief"]
        self.assertIn("CHECK `manual:ticket`", brief)

    def test_an_attempt_begun_in_the_millisecond_of_the_takeover_is_the_earlier_holders(self) -> None:
        # The begin and the takeover share one timestamp: the epochs say whose attempt it was.
        from runner.ledger import effects, lease
        from runner.execution.executor import _soon_after_takeover
        from runner.execution.lifecycle import Caps
        from tests.support.ops import T0, apply, fresh, held

        state = held(fresh())
        begun = apply(state, effects.begin_ops(state, "k1", "sha256:" + "1" * 64, T0), T0)
        broken = apply(begun, lease.break_ops(begun, "supervisor", "w1 was killed", T0), T0)
        taken = apply(broken, lease.acquire_ops(broken, "w2", 300, T0), T0)
        self.assertEqual(taken["effects"]["k1"]["updated_at"], taken["lease"]["acquired_at"])
        caps = Caps(timeout=60, settle=5)
        self.assertEqual(_soon_after_takeover(taken, "k1", caps, T0 + 1), "absent-soon-after-takeover")
        again = apply(taken, effects.absent_ops(taken, "k1", {"seen": False}, T0 + 1), T0 + 1)
        mine = apply(again, effects.begin_ops(again, "k1", "sha256:" + "1" * 64, T0 + 2), T0 + 2)
        self.assertIsNone(_soon_after_takeover(mine, "k1", caps, T0 + 3), "w2 began this attempt itself")

    def test_an_orphan_the_registry_saw_end_is_not_flagged(self) -> None:
        self.start(["a"], invoke={"send-after": 0.5})
        first = self.cli.spawn("drive", "--owner", "w1", "--json")
        self.wait_for_call_in_flight()
        first.kill()
        first.wait()
        self.cli("lease", "break", "--by", "supervisor", "--reason", "killed")
        done = self.finish(self.cli.spawn("drive", "--owner", "w2", "--json"))
        self.assertEqual(done["code"], 10, done["err"])
        self.assertNotIn("flags", self.effect("a:ticket"))


class HeldUpCallTest(unittest.TestCase):
    def test_a_command_whose_deadline_passed_before_it_started_is_not_run(self) -> None:
        # The process was stopped between registering the call and starting its command: whoever took over may
        # already have counted the call as never made, so it must not be made now.
        from runner.calls import inflight
        from runner.adapters.commands import CommandAdapter
        from runner.calls.target import NotApplied
        with scratch_dir() as root:
            now = [1_790_000_000.0]
            registry = inflight.Registry(os.path.join(root, "calls"), clock=lambda: now[0])
            marker = os.path.join(root, "sent")
            adapter = CommandAdapter([sys.executable, "-S", "-c", "import sys; open(sys.argv[1], 'w').close(); print('{}')", marker],
                                     [sys.executable, "-S", "-c", "print('{}')"], timeout=5)
            call = registry.register("k", "invoke", 1, 5.0)
            with inflight.calling(registry, call):
                now[0] += 7.0  # past the deadline (timeout plus grace)
                with self.assertRaises(NotApplied):
                    adapter.invoke("k", {"n": 1}, 1)
                self.assertFalse(os.path.exists(marker))
                now[0] -= 7.0
                self.assertEqual(adapter.invoke("k", {"n": 1}, 1), {})
            self.assertTrue(os.path.exists(marker))


#: Waits of the real world, a millisecond each, while signals land that the process handles for some other purpose.
SIGNALLED_WAITS = r'''
import os, signal, threading, time
from runner.execution.executor import ThreadWorld
world, stop = ThreadWorld(), threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: None)
def pester():
    while not stop.is_set():
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.0005)
threading.Thread(target=pester, daemon=True).start()
for n in range(300):
    world.wait(0.001)
stop.set()
print("waited", n + 1, flush=True)
# A signal whose handler wakes the world, as drive's does, ends a long wait at once.
signal.signal(signal.SIGUSR2, lambda *_: world.interrupt())
threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR2)).start()
began = time.monotonic()
print("woken" if world.wait(60) is None and time.monotonic() - began < 30 else "slept", flush=True)
'''


class SignalledWaitTest(unittest.TestCase):
    def test_a_wait_ends_at_its_timeout_whatever_signals_land_and_at_once_when_a_handler_wakes_it(self) -> None:
        # queue.SimpleQueue's get(timeout) can wait for ever once a signal lands in it (before Python 3.13): a
        # drive would stop at the first signal its process handles and never go on.
        done = subprocess.run(python("-c", SIGNALLED_WAITS), env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=90)
        self.assertEqual((done.returncode, done.stdout.split()), (0, [b"waited", b"300", b"woken"]), done.stderr.decode())


class OutputTest(unittest.TestCase):
    def test_output_past_the_kept_limit_is_never_written_to_a_file(self) -> None:
        """With RLIMIT_FSIZE at 1 MB, a command whose output went to a file would be killed by SIGXFSZ."""
        code = ("import resource, json, sys\n"
                "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
                "from runner.calls.commands import run_command\n"
                "o = run_command([sys.executable, '-S', '-c', 'import sys\\nfor _ in range(64): sys.stdout.write(\"x\" * (1 << 20))\\nsys.exit(3)'])\n"
                "print(json.dumps({'exit': o.exit_code, 'kept': len(o.stdout)}))\n")
        done = subprocess.run(python("-c", code), env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr.decode())
        self.assertEqual(json.loads(done.stdout), {"exit": 3, "kept": OUTPUT_LIMIT})

    def test_what_a_command_leaves_running_in_its_group_ends_with_it(self) -> None:
        with scratch_dir() as root:
            marker = os.path.join(root, "late")
            outcome = run_command(["sh", "-c", f"(sleep 0.3; touch {marker}) & echo started"], timeout=10)
            self.assertEqual((outcome.exit_code, outcome.stdout.strip()), (0, b"started"))
            time.sleep(0.6)
            self.assertFalse(os.path.exists(marker), "a call that returned has nothing of it still on its way")


#: A runner that dies between creating its new call record and writing it: ``os.write`` never returns.
HALF_REGISTERED = r'''
import os, sys, time
from runner.calls import inflight
inflight.os.write = lambda fd, data: (print("created", flush=True), time.sleep(600))
inflight.Registry(sys.argv[1]).register("a:ticket", "invoke", 1, 5.0)
'''


class AbandonedRecordTest(unittest.TestCase):
    def test_a_record_left_empty_by_a_killed_writer_is_swept_once_the_writer_is_dead(self) -> None:
        from runner.calls import inflight

        with scratch_dir() as root:
            folder = os.path.join(root, "calls")
            writer = subprocess.Popen(python("-c", HALF_REGISTERED, folder), env=child_env(), stdout=subprocess.PIPE)
            try:
                self.assertEqual(writer.stdout.readline().strip(), b"created")  # type: ignore[union-attr]
                [name] = os.listdir(folder)
                self.assertEqual(os.path.getsize(os.path.join(folder, name)), 0)
                registry = inflight.Registry(folder)
                self.assertEqual((registry.sweep(lambda key: False), os.listdir(folder)), (0, [name]), "its writer may still write it")
            finally:
                writer.kill()
                writer.wait()
                writer.stdout.close()  # type: ignore[union-attr]
            self.assertEqual((registry.sweep(lambda key: False), os.listdir(folder)), (1, []))


if __name__ == "__main__":
    unittest.main()
