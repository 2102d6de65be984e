"""What a verb prints is best effort: a stream nobody reads, or one that is full, never ends its work nor changes its code."""

import json
import os
import subprocess
import unittest
from typing import Any, Dict, List, Optional

try:
    from .support import util as _util
except ImportError:
    from support import util as _util


def _contract(items: List[str]) -> Dict[str, Any]:
    return {
        "contract": 1, "task_id": "unread-streams", "goal": "file one line per item", "workspace": ".",
        "steps": [{"id": "file", "items": items, "key": "k-{index}", "next": "done"}],
        "effects": {"invoke": ["sh", "-c", "echo \"$1\" >> ledger; echo '{}'", "x", "{key}"],
                    "observe": ["sh", "-c", "grep -qx \"$1\" ledger && echo '{}' || exit 1", "x", "{key}"],
                    "timeout_seconds": 10},
        "lease": {"ttl_seconds": 120},
    }


class UnreadStreams(unittest.TestCase):
    def setUp(self) -> None:
        scratch = _util.scratch_dir("runner-unread-")
        self.addCleanup(scratch.cleanup)
        self.project = scratch.name
        _util.write_contract(os.path.join(self.project, "contract.md"), _contract(["a", "b", "c"]))
        made = self.cli(["init", "--contract", "contract.md"])
        self.assertEqual(made.returncode, 0, made.stderr)

    def cli(self, argv: List[str], stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE,
            shell_redirect: Optional[str] = None) -> "subprocess.CompletedProcess[bytes]":
        """The command line in a child, in the project folder (so it names the run it found on stderr first)."""
        command = _util.python("-m", "runner", *argv)
        if shell_redirect is not None:
            command = ["sh", "-c", 'exec "$@" ' + shell_redirect, "sh"] + command
        return subprocess.run(command, cwd=self.project, env=_util.child_env(), stdin=subprocess.DEVNULL,
                              stdout=stdout, stderr=stderr, timeout=60)

    def unread_pipe(self) -> int:
        """The write end of a pipe whose reader has gone: every write to it fails with EPIPE."""
        read, write = os.pipe()
        os.close(read)
        self.addCleanup(os.close, write)
        return write

    def status(self) -> Dict[str, Any]:
        done = self.cli(["status", "--json"])
        self.assertEqual(done.returncode, 0, done.stderr)
        return json.loads(done.stdout)

    def ledger(self) -> List[str]:
        with open(os.path.join(self.project, "ledger"), encoding="utf-8") as handle:
            return handle.read().split()

    def test_drive_whose_stderr_nobody_reads_finishes_its_batch_and_releases_its_lease(self) -> None:
        # Its first line ("using the run in ...") goes to the unread stream before anything is recorded.
        done = self.cli(["drive", "--owner", "agent-1"], stderr=self.unread_pipe())
        self.assertEqual(done.returncode, 10, done.stdout)
        self.assertIn(b"stop: complete", done.stdout)
        self.assertEqual(sorted(self.ledger()), ["k-0", "k-1", "k-2"])
        status = self.status()
        self.assertEqual(status["status"], "complete")
        self.assertIsNone(status["lease"]["owner"])

    def test_a_verb_keeps_its_durable_write_and_its_code_when_neither_stream_is_read(self) -> None:
        unread = self.unread_pipe()
        taken = self.cli(["lease", "acquire", "--owner", "agent-1", "--json"], stdout=unread, stderr=unread)
        self.assertEqual(taken.returncode, 0)
        self.assertEqual(self.status()["lease"]["owner"], "agent-1")
        refused = self.cli(["lease", "acquire", "--owner", "agent-2", "--json"], stdout=unread, stderr=unread)
        self.assertEqual(refused.returncode, 3, "an error's code is the error's, whoever reads it")

    @unittest.skipUnless(os.path.exists("/dev/full"), "needs /dev/full")
    def test_a_full_stdout_and_a_closed_one_leave_the_code_as_it_is(self) -> None:
        with open("/dev/full", "wb") as full:
            shown = self.cli(["status", "--json"], stdout=full)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertNotIn(b"Traceback", shown.stderr)
        taken = self.cli(["lease", "acquire", "--owner", "agent-1"], shell_redirect=">&- 2>&-")
        self.assertEqual(taken.returncode, 0)
        self.assertEqual(self.status()["lease"]["owner"], "agent-1")


if __name__ == "__main__":
    unittest.main()
