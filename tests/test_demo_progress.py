"""The demo's progress bar against its final table: one set of figures.

The bar's last line shows every document once the run is complete, and the
crashes and recoveries (lease takeovers) the table shows; no line before it
shows more than that. Two small runs, each a few real worker processes:

* one run, through the command line: with seed 211 (every worker dies at a
  named commit window, none at a random moment) the worker filing the last
  document dies after the ticket service committed it, and the next
  worker's recovery verifies it, so no worker ever files it again;
* three runs claimed by a pool of two workers: documents that a recovery
  verified are counted with those their worker filed.
"""

import io
import json
import os
import re
import unittest
from typing import Any, Dict, List, Tuple

from runner.proof.demo import run_demo
from tests.support.util import child_env, run_cli, scratch_dir

BAR = re.compile(r"\] (\d+)/(\d+) documents \| crashes (\d+) \| recoveries (\d+) \|")


def bar_lines(stderr: str) -> List[Tuple[int, int, int, int]]:
    """Each line of the bar as (documents done, documents, crashes, recoveries), in order."""
    return [(int(a), int(b), int(c), int(d)) for a, b, c, d in BAR.findall(stderr)]


class DemoProgressTest(unittest.TestCase):
    def assert_bar_ends_with_the_table(self, stderr: str, result: Dict[str, Any]) -> None:
        lines = bar_lines(stderr)
        self.assertTrue(lines, stderr)
        final = (result["documents"], result["documents"], result["crashes"], result["recoveries"])
        self.assertEqual(lines[-1], final, stderr)
        for line in lines:
            self.assertTrue(all(shown <= last for shown, last in zip(line, final)), f"{line} is above the final {final}")

    def test_one_run_through_the_command_line(self) -> None:
        with scratch_dir("runner-demo-progress-") as scratch:
            done = run_cli("--json", "demo", "--documents", "40", "--crash-rate", "0.1", "--seed", "211", cwd=scratch,
                           env=child_env(TMPDIR=scratch), timeout=120)
            self.assertEqual(os.listdir(scratch), [])  # the demo removed its folders
        self.assertEqual(done.code, 0, done.err[-2000:])
        result = json.loads(done.out)
        self.assertEqual((result["status"], result["effects_verified"]), ("complete", 40), result)
        self.assertGreaterEqual(result["recoveries"], 1, result)
        self.assert_bar_ends_with_the_table(done.err, result)

    def test_a_pool_of_workers(self) -> None:
        stream = io.StringIO()
        result = run_demo(documents=30, seed=3, crash_rate=0.15, progress_stream=stream, workers=2, shard_size=10)
        self.assertTrue(result["ok"], result)
        self.assertEqual((result["runs"], result["effects_verified"]), (3, 30), result)
        self.assert_bar_ends_with_the_table(stream.getvalue(), result)


if __name__ == "__main__":
    unittest.main()
