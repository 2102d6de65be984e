"""A call's command starts only once its process is registered as the call in flight.

A runner killed between starting a command and recording its process would
leave a command that no later runner can find on a machine where processes
cannot be searched by their environment; the command would send after the
call's deadline, when its key may already have been observed absent and
called again. The command waits at a gate until the registration is written.
"""

import os
import subprocess
import sys
import time
import unittest

from tests.support.util import child_env, python, scratch_dir

#: A runner that starts a call's command and dies (SIGKILL) the instant it learns the command's pid.
DIES_BEFORE_REGISTERING = r'''
import os, signal, sys
from runner.calls import inflight
from runner.calls.commands import run_command

root, marker = sys.argv[1:3]

class Dies(inflight.Registry):
    def spawned(self, call, pid):
        with open(os.path.join(root, "pid"), "w") as handle:
            handle.write(str(pid))
        os.kill(os.getpid(), signal.SIGKILL)

registry = Dies(os.path.join(root, "calls"))
call = registry.register("k", "invoke", 1, 30.0)
with inflight.calling(registry, call):
    run_command([sys.executable, "-S", "-c", "import sys; open(sys.argv[1], 'w').close()", marker], timeout=30)
'''


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(") ", 1)[-1].startswith("Z"):
                    return True  # exited, not yet reaped by its new parent
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.01)
    return False


class GateTest(unittest.TestCase):
    def test_a_runner_killed_before_registering_its_command_leaves_a_command_that_never_runs(self) -> None:
        with scratch_dir() as root:
            script, marker = os.path.join(root, "dies.py"), os.path.join(root, "sent")
            with open(script, "w", encoding="utf-8") as handle:
                handle.write(DIES_BEFORE_REGISTERING)
            done = subprocess.run(python(script, root, marker), env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
            self.assertEqual(done.returncode, -9, done.stderr.decode())
            with open(os.path.join(root, "pid")) as handle:
                pid = int(handle.read())
            self.assertTrue(_wait_gone(pid), "the command's process ended once its runner was gone")
            self.assertFalse(os.path.exists(marker), "the command ran although its process was never registered")

    def test_a_registered_command_runs_and_a_missing_program_is_refused_as_before(self) -> None:
        from runner.calls import inflight
        from runner.calls.commands import run_command
        from runner.base.errors import InvalidInput

        with scratch_dir() as root:
            registry = inflight.Registry(os.path.join(root, "calls"))
            call = registry.register("k", "invoke", 1, 30.0)
            with inflight.calling(registry, call):
                done = run_command([sys.executable, "-S", "-c", "import sys; sys.stdout.write(sys.stdin.read() or 'empty')"], timeout=30)
                self.assertEqual((done.exit_code, done.stdout), (0, b"empty"), "the command reads nothing of the gate")
                self.assertIn("child", registry.calls("k")[0][0].record, "the command's process was registered")
                for program in ("no-such-program-here", os.path.join(root, "missing")):
                    with self.subTest(program=program):
                        with self.assertRaises(InvalidInput) as caught:
                            run_command([program], timeout=5)
                        self.assertIn("No such file or directory", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
