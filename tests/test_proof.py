"""The proof at scale, in small: the demo, the draft scenario, a short campaign, the worker pool.

Each runs real worker processes that are SIGKILLed and resumed by other
processes against the loopback ticket service, and asserts the audited
figures: no duplicate effect, no lost commit, output equal to an uncrashed
reference run. The long versions are opt-in: ``RUNNER_FULL_TESTS=1`` runs
the 2,000-document demo and a campaign of 1,700 kills here; the command line
runs any size (``python3 -m runner demo``, ``python3 -m runner campaign --kills 10000``).
"""

import io
import os
import unittest

from runner.proof.campaign import KILL_POINTS, run_campaign
from runner.proof.demo import run_demo, run_draft_scenario

FULL = bool(os.environ.get("RUNNER_FULL_TESTS"))


class DemoTest(unittest.TestCase):
    """Killed workers resume on new owners with higher epochs; the target holds one effect per document."""

    def test_demo_with_kills_matches_the_reference(self) -> None:
        documents = 2000 if FULL else 24
        progress = io.StringIO()
        result = run_demo(documents=documents, seed=3, crash_rate=0.01 if FULL else 0.1, progress_stream=progress)
        self.assertTrue(result["ok"], result)
        self.assertGreaterEqual(result["crashes"], 1)
        self.assertGreaterEqual(result["recoveries"], 1)
        self.assertEqual(result["duplicate_effects"], 0)
        self.assertEqual(result["lost_commits"], 0)
        self.assertEqual(result["effects_applied"], documents)
        self.assertEqual(result["effects_verified"], documents)
        self.assertTrue(result["matches_reference"])
        self.assertEqual(result["status"], "complete")
        self.assertIn("documents", progress.getvalue())

    def test_cancel_stops_within_one_step(self) -> None:
        result = run_demo(documents=40, seed=5, crash_rate=0.0, cancel_at=15)
        self.assertTrue(result["ok"], result)
        self.assertEqual(result["status"], "cancelled")
        self.assertEqual(result["effects_begun_after_cancel"], 0)
        self.assertEqual(result["unresolved_after_cancel"], 0)
        self.assertLessEqual(result["documents_verified"], 16)
        self.assertEqual(result["effects_applied"], result["documents_verified"])

    def test_pool_of_workers_on_sqlite(self) -> None:
        result = run_demo(documents=30, seed=7, crash_rate=0.15, workers=2, shard_size=10)
        self.assertTrue(result["ok"], result)
        self.assertEqual(result["store"], "sqlite")
        self.assertEqual(result["runs"], 3)
        self.assertGreaterEqual(result["crashes"], 1)
        self.assertEqual(result["duplicate_effects"], 0)
        self.assertEqual(result["lost_commits"], 0)
        self.assertTrue(result["matches_reference"])


    def test_pool_of_workers_on_a_file_store(self) -> None:
        result = run_demo(documents=20, seed=9, crash_rate=0.15, workers=2, shard_size=10, store="file:" + self.scratch())
        self.assertTrue(result["ok"], result)
        self.assertEqual((result["store"], result["runs"]), ("file", 2))
        self.assertEqual(result["duplicate_effects"], 0)
        self.assertEqual(result["lost_commits"], 0)
        self.assertTrue(result["matches_reference"])

    def scratch(self) -> str:
        import shutil
        import tempfile

        root = tempfile.mkdtemp(prefix="runner-pool-test-")
        self.addCleanup(shutil.rmtree, root, True)
        return os.path.join(root, "runs")


class DraftScenarioTest(unittest.TestCase):
    """plan -> write_draft -> finish, killed after the tool committed: plan is not re-run, the receipt is reused."""

    def test_crash_after_the_tool_committed_reuses_the_receipt(self) -> None:
        log = io.StringIO()
        result = run_draft_scenario(log)
        self.assertTrue(result["ok"], result)
        lines = [line for line in log.getvalue().splitlines() if line and not line.startswith("#")]
        self.assertEqual(lines[:3], ["EXECUTE plan", "EXECUTE write_draft", lines[2]])
        self.assertTrue(lines[2].startswith("TOOL committed receipt "))
        self.assertTrue(lines[3].startswith("CRASH"))
        receipt = lines[2].split()[-1]
        self.assertEqual(lines[4:], ["EXECUTE write_draft", f"TOOL reuse receipt {receipt}", "EXECUTE finish"])
        self.assertEqual(result["plan_executions"], 1)
        self.assertEqual(result["tickets"], 1)


class CampaignTest(unittest.TestCase):
    """Forked workers die at every named commit window; every kill is followed by a clean load elsewhere."""

    def test_every_window_is_killed_without_duplicates_or_losses(self) -> None:
        kills = 100 * len(KILL_POINTS) if FULL else len(KILL_POINTS)
        result = run_campaign(kills=kills, seed=11)
        self.assertTrue(result["ok"], result)
        self.assertEqual(result["kills"], kills)
        self.assertEqual(set(result["kills_by_window"].values()), {kills // len(KILL_POINTS)}, result["kills_by_window"])
        self.assertEqual(result["duplicate_effects"], 0)
        self.assertEqual(result["lost_commits"], 0)
        self.assertEqual(result["unrecoverable"], 0)
        self.assertEqual(result["unknown_results_left"], 0)
        self.assertEqual(result["missing_effects"], 0)
        self.assertEqual(result["orphaned_jobs"], 0)
        self.assertEqual(result["recovery_success_rate"], 1.0)


if __name__ == "__main__":
    unittest.main()
