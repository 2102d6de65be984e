"""An invoke command's answer outlives the drive that started it (``runner.calls.commands``), with real processes.

The command's stdout and stderr go to files beside its call's record, and the
shell that runs it, in the command's process group, writes its exit status
there when it ends. A drive SIGKILLed while the command runs leaves the
command to finish; a drive in another process that takes over waits for the
call's process group, then reads what the command answered as the dead drive
would have: a receipt is acknowledged (and, for a target that cannot be read
back, verifies the effect), with no person and no second call. Killed together
with that shell, the command leaves no status: the outcome stays unknown, as
before. A status file is believed only whole, with the call's token and the pid
of the shell its record names.
"""

import json
import os
import signal
import sys
import unittest
from typing import Any, Dict, List

from runner.calls import commands, inflight
from runner.execution.run import Run
from runner.stores.file import RunStore
from tests.support.batch import batch_contract
from tests.support.util import scratch_dir
from tests.test_call_records import HAS_PROC, KEY, RunCase, gone, wait_for

# The command runs until the test lets it go on, then files the ticket and prints its receipt.
INVOKE = r'''
key=$1
echo "$key" >> invoked
echo "$$" > started
while [ ! -e go-on ]; do sleep 0.02; done
echo "$key" >> ledger
printf '{"ticket": "%s"}\n' "$key"
'''
LOGGED_OBSERVE = r'''
echo "$1" >> looked
grep -qx "$1" ledger 2>/dev/null && { printf '{"found": "%s"}\n' "$1"; exit 0; }
exit 1
'''


@unittest.skipUnless(HAS_PROC, "process groups and environments are read from /proc")
class LeftAnswerTest(RunCase):
    def begin(self, readable: bool) -> None:
        for name, text in (("invoke.sh", INVOKE), ("observe.sh", LOGGED_OBSERVE)):
            with open(os.path.join(self.root, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        block = batch_contract({"invoke": ["sh", os.path.join(self.root, "invoke.sh"), "{key}"],
                                "observe": ["sh", os.path.join(self.root, "observe.sh"), "{key}"]},
                               items=["a"], payload={"template": {"item": "{item}"}}, timeout=60)
        block["steps"][0]["key"] = "{item}:ticket"
        block["effects"]["key_pattern"] = "[a-z0-9]+:ticket"
        if not readable:
            block["effects"]["observe"] = "none"
        self.cli.init(block)

    def records(self) -> List[Dict[str, Any]]:
        out = []
        for name in sorted(os.listdir(self.calls)) if os.path.isdir(self.calls) else []:
            if name.endswith(".json"):
                try:
                    with open(os.path.join(self.calls, name), encoding="utf-8") as handle:
                        out.append(json.load(handle))
                except (OSError, ValueError):
                    continue
        return out

    def kill_the_first_drive(self) -> Dict[str, Any]:
        """SIGKILL a drive while its command runs; the call's record as it left it."""
        first = self.drive("worker-a")
        wait_for("the invoke command to start", lambda: os.path.exists(os.path.join(self.root, "started")))
        [record] = wait_for("the call's command in its record", lambda: [r for r in self.records() if r.get("child")])
        first.kill()
        first.wait()
        self.assertEqual(first.returncode, -signal.SIGKILL)
        return record

    def let_it_go_on(self) -> None:
        with open(os.path.join(self.root, "go-on"), "w"):
            pass

    def take_over(self) -> Dict[str, Any]:
        self.cli("lease", "break", "--by", "supervisor", "--reason", "worker-a was killed")
        return self.finish(self.drive("worker-b"))

    def assert_adopted(self, done: Dict[str, Any]) -> Dict[str, Any]:
        self.assertIn(done["code"], (0, 10), done["err"])
        effect = self.effect()
        self.assertEqual((effect["state"], effect["attempts"], effect["receipt"]),
                         ("verified", 1, {"ticket": KEY}), "the receipt the orphaned command printed is recorded")
        self.assertEqual((self.lines("invoked"), self.lines("ledger")), ([KEY], [KEY]), "one call, one ticket")
        self.assertEqual(sorted(os.listdir(self.calls)) if os.path.isdir(self.calls) else [], [],
                         "the record and its answer files are removed once the outcome is recorded")
        return effect

    def test_a_command_that_finishes_after_its_drive_was_killed_verifies_a_target_that_cannot_be_read(self) -> None:
        self.begin(readable=False)
        record = self.kill_the_first_drive()
        self.let_it_go_on()
        wait_for("the orphaned command to end", lambda: gone(record["child"][0]))
        effect = self.assert_adopted(self.take_over())
        self.assertEqual((effect["evidence"]["observe"], effect["evidence"]["receipt"]), ("none", {"ticket": KEY}))

    def test_a_readable_target_gets_the_receipt_and_one_lookup_to_verify_it(self) -> None:
        self.begin(readable=True)
        record = self.kill_the_first_drive()
        self.let_it_go_on()
        wait_for("the orphaned command to end", lambda: gone(record["child"][0]))
        self.assert_adopted(self.take_over())
        self.assertEqual(self.lines("looked"), [KEY], "one lookup, the one that verifies a receipt")

    def test_the_successor_waits_for_an_orphan_still_running_then_adopts_its_answer(self) -> None:
        self.begin(readable=False)
        record = self.kill_the_first_drive()
        self.cli("lease", "break", "--by", "supervisor", "--reason", "worker-a was killed")
        second = self.drive("worker-b")
        wait_for("the successor to hold the lease", lambda: self.lease_owner() == "worker-b")
        self.assertFalse(gone(record["child"][0]), "the orphan still runs while the successor waits")
        self.let_it_go_on()
        self.assert_adopted(self.finish(second))

    def test_a_command_whose_keeping_shell_was_killed_too_leaves_an_unknown_outcome_for_a_person(self) -> None:
        self.begin(readable=False)
        record = self.kill_the_first_drive()
        leader = record["child"][0]
        os.kill(leader, signal.SIGKILL)  # the shell that would have written the exit status
        with open(os.path.join(self.root, "started"), encoding="utf-8") as handle:
            command = int(handle.read())
        self.let_it_go_on()
        wait_for("the command to end", lambda: gone(command))
        done = self.take_over()
        self.assertEqual(done["code"], 8, done["err"])
        self.assertIn("effect verify", json.dumps(done))
        effect = self.effect()
        self.assertEqual((effect["state"], effect.get("receipt")), ("uncertain", None))
        self.assertEqual(self.lines("ledger"), [KEY], "the ticket was filed, and only a person can see it")

    def lease_owner(self) -> Any:
        return Run(RunStore.open(self.run_dir)).state["lease"].get("owner")


class StatusFileTest(unittest.TestCase):
    """What :func:`runner.calls.commands.left_answer` believes of the files a call's command left."""

    def setUp(self) -> None:
        tmp = scratch_dir("runner-left-answer-")
        self.addCleanup(tmp.cleanup)
        self.registry = inflight.Registry(os.path.join(tmp.name, "calls"))
        self.call = self.registry.register(KEY, "invoke", 1, 30)
        self.call.record["child"] = [4242, "1"]
        self.files = self.registry.answer_files(self.call)
        self.write(self.files.stdout, b'{"ticket": 7}\n')
        self.write(self.files.stderr, b"")

    @staticmethod
    def write(path: str, data: bytes) -> None:
        with open(path, "wb") as handle:
            handle.write(data)

    def status(self, line: bytes) -> Any:
        self.write(self.files.status, line)
        return commands.left_answer(self.registry, self.call)

    def test_a_whole_status_of_the_call_and_its_shell_is_the_answer(self) -> None:
        token = self.call.record["token"].encode()
        left = self.status(b"runner-exit " + token + b" 4242 0\n")
        self.assertEqual((left.exit_code, left.json_object(), left.timed_out), (0, {"ticket": 7}, False))

    def test_anything_else_says_nothing(self) -> None:
        token = self.call.record["token"].encode()
        for line in (b"runner-exit " + token + b" 4242 0",  # cut short: no end of line
                     b"runner-exit " + b"0" * 24 + b" 4242 0\n",  # another call's
                     b"runner-exit " + token + b" 4243 0\n",  # another command's shell
                     b"runner-exit " + token + b" 4242 x\n", b""):
            self.assertIsNone(self.status(line), line)
        os.unlink(self.files.status)
        self.assertIsNone(commands.left_answer(self.registry, self.call), "no status: the shell was killed")

    def test_a_lookup_or_a_command_never_started_leaves_nothing(self) -> None:
        token = self.call.record["token"].encode()
        self.status(b"runner-exit " + token + b" 4242 0\n")
        self.call.record["kind"] = "observe"
        self.assertIsNone(commands.left_answer(self.registry, self.call))
        self.call.record.update(kind="invoke", child=None)
        self.assertIsNone(commands.left_answer(self.registry, self.call))

    def test_a_live_caller_reads_the_files_as_it_read_the_pipes(self) -> None:
        self.registry.finish(self.call)
        call = self.registry.register(KEY, "invoke", 1, 30)
        program = ("import sys; sys.stderr.write('x' * 5000); print('{\"ticket\": 8}'); sys.exit(int(sys.argv[1]))")
        with inflight.calling(self.registry, call):
            for code in (0, 75):
                done = commands.run_command([sys.executable, "-S", "-c", program, str(code)], timeout=30, limit=1000)
                self.assertEqual((done.exit_code, done.timed_out, done.json_object(), done.stderr),
                                 (code, False, {"ticket": 8}, b"x" * 1000), "the first 1000 bytes of each, as before")
            left = commands.left_answer(self.registry, call)
            self.assertEqual((left.exit_code, left.json_object()), (75, {"ticket": 8}), "the last command's answer")
            slow = commands.run_command([sys.executable, "-S", "-c", "import time; print('begun', flush=True); "
                                         "time.sleep(60)"], timeout=1)
            self.assertEqual((slow.exit_code, slow.timed_out, slow.stdout), (None, True, b"begun\n"))
            self.assertIsNone(commands.left_answer(self.registry, call), "a command killed at its timeout left none")
        self.registry.finish(call)
        self.assertEqual(os.listdir(self.registry.folder), [])

    def test_the_files_go_with_the_record(self) -> None:
        self.status(b"runner-exit " + self.call.record["token"].encode() + b" 4242 0\n")
        self.registry.finish(self.call)
        self.assertEqual(os.listdir(self.registry.folder), [])


if __name__ == "__main__":
    unittest.main()
