"""The damage campaign: copies of real run folders, damaged at random, each loaded by a real child process.

The default suite runs a small campaign (a dozen copies whose damages cover
every kind; ``RUNNER_FULL_TESTS=1``: three dozen); ``BENCHMARKS.md`` has the
figures of a large one. The classifier is shown to fail where the store
cannot help it: a whole folder restored from an older copy loads silently.
"""

import os
import random
import unittest

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

from runner.proof.damage import DAMAGES, OUTCOMES, PASSING, build_sources, damage_copy, judge_copy, run_damage_campaign

FULL = _util.FULL_TESTS


class DamageCampaignTest(unittest.TestCase):
    def test_a_small_campaign_has_no_silent_acceptance(self) -> None:
        copies = 36 if FULL else 12  # seed 11 reaches every kind of damage and every outcome asserted below within 12
        result = run_damage_campaign(copies, seed=11)
        self.assertEqual(result["silent_acceptance"], 0, result["examples"])
        self.assertTrue(result["ok"], result["examples"])
        self.assertEqual(sum(result[outcome] for outcome in OUTCOMES), copies)
        self.assertEqual(sum(result[outcome] for outcome in PASSING), copies)
        for outcome in ("exact", "quarantined", "torn_tail_dropped"):
            self.assertGreater(result[outcome], 0, f"no copy came out {outcome}: the campaign did not reach it")
        kinds = {name.split(" ", 1)[0] for name in result["by_damage"]}
        self.assertEqual(kinds, set(DAMAGES))
        self.assertEqual(result["sources"]["never-compacted"]["files"], ["head.json", "journal.jsonl", "run.json", "snapshot.json"])
        self.assertIn("backup.json", result["sources"]["compacted"]["files"])

    def test_the_command_line_reports_and_exits_0(self) -> None:
        result = _util.run_cli("--json", "campaign", "--damage", "3", "--seed", "3", timeout=300)
        self.assertEqual(result.code, 0, result.err)
        report = _util.one_json(result)
        self.assertEqual(report["copies"], 3)
        self.assertEqual(report["silent_acceptance"], 0)


class ClassifierTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        tmp = _util.scratch_dir()
        cls.addClassCleanup(tmp.cleanup)
        cls.tmp = tmp.name
        cls.sources = build_sources(os.path.join(cls.tmp, "sources"), seed=5)

    def test_a_whole_folder_rolled_back_is_a_silent_acceptance(self) -> None:
        # Nothing inside the folder can tell a consistent past from the
        # present; the classifier must say so rather than pass it.
        source = self.sources["never-compacted"]
        outcome, said = judge_copy(os.path.join(self.tmp, "rolled-back"), dict(source.older[0]), source)
        self.assertEqual(outcome, "silent_acceptance", said)

    def test_the_copy_itself_loads_exactly(self) -> None:
        for name in ("compacted", "never-compacted"):
            source = self.sources[name]
            outcome, said = judge_copy(os.path.join(self.tmp, f"intact-{name}"), dict(source.files), source)
            self.assertEqual(outcome, "exact", said)

    def test_each_damage_changes_the_files(self) -> None:
        rng = random.Random(2)
        seen = set()
        for _ in range(200):
            files, damage = damage_copy(self.sources["compacted"], self.sources["other"], rng)
            seen.add(damage.kind)
            if damage.detail != "identical bytes":
                self.assertNotEqual(files, self.sources["compacted"].files, damage)
        self.assertEqual(seen, set(DAMAGES))


if __name__ == "__main__":
    unittest.main()
