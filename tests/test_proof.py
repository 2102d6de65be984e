"""The proof at scale, in small: the demo, the draft scenario, a short campaign, the worker pool.

Each runs real worker processes that are SIGKILLed and resumed by other
processes against the loopback ticket service, and asserts the audited
figures: no duplicate effect, no lost commit, output equal to an uncrashed
reference run. The long versions are opt-in: ``RUNNER_FULL_TESTS=1`` runs
the 2,000-document demo and a campaign of 1,700 kills here; the command line
runs any size (``python3 -m runner demo``, ``python3 -m runner campaign --kills 10000``).
"""

import io
import json
import os
import re
import shutil
import tempfile
import unittest
from typing import Any, Dict, Tuple

from runner.proof.campaign import KILL_POINTS
from runner.proof.demo import format_table, run_demo, run_draft_scenario
from runner.surfaces.timeline import MAX_SECTIONS
from tests.support.page import Elements, assert_inert, parse
from tests.support.util import FULL_TESTS as FULL
from tests.support.util import run_cli


class DemoTest(unittest.TestCase):
    """Killed workers resume on new owners with higher epochs; the target holds one effect per document."""

    def test_demo_with_kills_matches_the_reference(self) -> None:
        # Through the command line, as the README runs it, with its timeline page.
        documents = 2000 if FULL else 24
        page_path = self.scratch("page.html")
        result, err = proof_cli(self, "demo", "--documents", str(documents), "--seed", "3", "--crash-rate", "0.01" if FULL else "0.1",
                                "--html", page_path, "--compact-bytes", "1")
        self.assertGreaterEqual(result["crashes"], 1)
        self.assertGreaterEqual(result["recoveries"], 1)
        # Every crash of a worker that held the lease is one recovery; the others took over from nobody.
        self.assertEqual(result["recoveries"], result["crashes"] - result["crashes_without_lease"])
        self.assertGreater(result["history_segments"], 3)  # compaction came often, and kept every journal rotated out
        total = result["wall_seconds"] + result["reference_seconds"]
        self.assertAlmostEqual(result["total_seconds"], total, delta=0.02)
        self.assertEqual(result["duplicate_effects"], 0)
        self.assertEqual(result["lost_commits"], 0)
        self.assertEqual(result["effects_applied"], documents)
        self.assertEqual(result["effects_verified"], documents)
        self.assertTrue(result["matches_reference"])
        self.assertEqual(result["status"], "complete")
        self.assertIn("documents", err)  # the progress line
        # Its timeline page: each takeover follows a holder that stopped without releasing, as the run's own counters say.
        elements, page = read_page(self, result, page_path)
        self.assertEqual(len(elements.having("run")), 1)
        self.assertNotIn("compacted away", page)  # the history folder held every record
        counts = {name: len(elements.having(name)) for name in ("crash", "takeover", "reconciled")}
        self.assertEqual(counts, {"crash": result["recoveries"], "takeover": result["recoveries"], "reconciled": result["uncertain_reconciled"]},
                         result)
        # Every document was verified once on the page: one by one up to the page's limit, above it counted per time bucket.
        self.assertEqual(verified_on_page(page), documents)
        if not elements.having("bucket"):
            keys = {a.get("data-key") for a in elements.having("effect")}
            self.assertEqual(len([k for k in keys if k and k.startswith("doc-")]), documents)

    def test_the_table_says_why_figures_differ_and_what_the_wall_time_holds(self) -> None:
        result = {"documents": 300, "workers_in_parallel": 1, "store": "file", "runs": 1, "crashes": 5,
                  "crashes_at_windows": 3, "crashes_at_random_moments": 2, "recoveries": 3, "crashes_without_lease": 2,
                  "effects_requested": 302, "effects_applied": 300, "duplicate_effects": 0, "uncertain_reconciled": 1,
                  "repeated_steps": 0, "retried_effects": 0, "lost_commits": 0, "matches_reference": True,
                  "status": "complete", "revision": 915, "wall_seconds": 16.86, "reference_seconds": 19.4,
                  "total_seconds": 36.26, "errors": [], "ok": True}
        table = dict(line.split("  ", 1) for line in format_table(result).splitlines() if "  " in line)
        self.assertIn("2 workers were killed holding none", table["recoveries (lease takeovers)"])
        self.assertIn("so those crashes are not recoveries", table["recoveries (lease takeovers)"])
        self.assertIn("2 more than the target holds", table["effects requested"])
        self.assertEqual(table["repeated steps"].strip(), "0")  # a figure that differs from nothing is said alone
        self.assertEqual(table["wall time"].strip(),
                         "36.26 s: the uncrashed reference run 19.4 s, then the crashed run 16.86 s")
        cancelled = dict(result, matches_reference=None, cancel_at=15, cancelled_by="demo-operator",
                         effects_begun_after_cancel=0, unresolved_after_cancel=0, stopped_within_one_step=True,
                         crashes=0, crashes_without_lease=0, recoveries=0)
        self.assertIn("16.86 s (no reference run", format_table(cancelled))

    def test_cancel_stops_within_one_step(self) -> None:
        result = run_demo(documents=40, seed=5, crash_rate=0.0, cancel_at=15)
        self.assertTrue(result["ok"], result)
        self.assertEqual(result["status"], "cancelled")
        self.assertEqual(result["effects_begun_after_cancel"], 0)
        self.assertEqual(result["unresolved_after_cancel"], 0)
        self.assertLessEqual(result["documents_verified"], 16)
        self.assertEqual(result["effects_applied"], result["documents_verified"])

    def test_pool_of_workers_on_sqlite(self) -> None:
        page_path = self.scratch("page.html")
        result = run_demo(documents=30, seed=7, crash_rate=0.15, workers=2, shard_size=10, html=page_path)
        self.assertTrue(result["ok"], result)
        self.assertEqual(result["store"], "sqlite")
        self.assertEqual(result["runs"], 3)
        self.assertGreaterEqual(result["crashes"], 1)
        self.assertEqual(result["duplicate_effects"], 0)
        self.assertEqual(result["lost_commits"], 0)
        self.assertTrue(result["matches_reference"])
        # Its timeline page has one lane group per run (shard).
        elements, _page = read_page(self, result, page_path)
        self.assertEqual(sorted(a["data-task"] for a in elements.having("run")), ["demo-shard-0000", "demo-shard-0001", "demo-shard-0002"])


    def test_pool_of_workers_on_a_file_store(self) -> None:
        result = run_demo(documents=20, seed=9, crash_rate=0.15, workers=2, shard_size=10, store="file:" + self.scratch("runs"))
        self.assertTrue(result["ok"], result)
        self.assertEqual((result["store"], result["runs"]), ("file", 2))
        self.assertEqual(result["duplicate_effects"], 0)
        self.assertEqual(result["lost_commits"], 0)
        self.assertTrue(result["matches_reference"])

    def scratch(self, name: str) -> str:
        """``name`` in a temporary folder of this test's own."""
        root = tempfile.mkdtemp(prefix="runner-proof-test-")
        self.addCleanup(shutil.rmtree, root, True)
        return os.path.join(root, name)


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
        root = tempfile.mkdtemp(prefix="runner-proof-test-")
        self.addCleanup(shutil.rmtree, root, True)
        page_path = os.path.join(root, "page.html")
        # Through the command line, with its timeline page.
        result, _err = proof_cli(self, "campaign", "--kills", str(kills), "--seed", "11", "--html", page_path)
        self.assertEqual(result["kills"], kills)
        self.assertEqual(set(result["kills_by_window"].values()), {kills // len(KILL_POINTS)}, result["kills_by_window"])
        self.assertEqual(result["duplicate_effects"], 0)
        self.assertEqual(result["lost_commits"], 0)
        self.assertEqual(result["unrecoverable"], 0)
        self.assertEqual(result["unknown_results_left"], 0)
        self.assertEqual(result["missing_effects"], 0)
        self.assertEqual(result["orphaned_jobs"], 0)
        self.assertEqual(result["recovery_success_rate"], 1.0)
        # Its timeline page has every run, its crashes, and the job each run's check step runs.
        elements, page = read_page(self, result, page_path)
        self.assertEqual(len(elements.having("run")), min(result["runs"], MAX_SECTIONS))
        if result["runs"] > 1:  # a page of several runs lists each in its index, drawn or not
            self.assertEqual(page.count("<td>below</td>") + page.count("<td>index only</td>"), result["runs"])
        self.assertGreaterEqual(len(elements.having("crash")), 1)
        self.assertTrue(elements.having("job"))


class HtmlRefusedTest(unittest.TestCase):
    """``--html`` where a proof draws no page is refused before any work, not ignored."""

    def test_html_with_a_damage_campaign_is_invalid_input(self) -> None:
        # The command-line demo draws its batch run's page (tests.test_drive.DemoViaCliTest); a damage campaign
        # draws none.
        root = tempfile.mkdtemp(prefix="runner-proof-test-")
        self.addCleanup(shutil.rmtree, root, True)
        page_path = os.path.join(root, "page.html")
        for args in (("campaign", "--damage", "1"),):
            with self.subTest(args[:2]):
                done = run_cli(*args, "--html", page_path, "--no-progress")
                self.assertEqual((done.code, done.out, len(done.err.splitlines())), (2, "", 1), done.err)
                self.assertIn("--html", done.err)
                self.assertEqual(os.listdir(root), [])


def proof_cli(test: unittest.TestCase, *args: str) -> Tuple[Dict[str, Any], str]:
    """``--json ARGS`` of the command line in a child, which must succeed: its result and its stderr."""
    done = run_cli("--json", *args, timeout=3600 if FULL else 300)
    try:
        result = json.loads(done.out)
    except ValueError:
        test.fail(f"exit {done.code}, no JSON on stdout: {done.err[-2000:]}")
    test.assertTrue(result.get("ok"), result)
    test.assertEqual(done.code, 0, done.err[-2000:])
    return result, done.err


def verified_on_page(page: str) -> int:
    """How many transitions to ``verified`` a timeline page shows: drawn one by one, by observation, or counted in buckets."""
    one_by_one = len(re.findall(r"<title>[^<]* verified (?:at|by observation at) ", page))
    return one_by_one + sum(int(n) for n in re.findall(r'class="bucket"><title>(\d+) verified from ', page))


def read_page(test: unittest.TestCase, result: Dict[str, Any], page_path: str) -> Tuple[Elements, str]:
    """The timeline page a proof wrote (``html=``): its elements and its text, once its size and inertness are checked."""
    with open(page_path, encoding="utf-8") as handle:
        page = handle.read()
    test.assertEqual(result["html_bytes"], len(page.encode("utf-8")))
    assert_inert(test, page)
    return parse(page), page


if __name__ == "__main__":
    unittest.main()
