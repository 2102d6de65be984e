"""``drive``: what it performs, where it hands over, its progress line, what a driver refuses, and the CLI-only demo."""

import io
import json
import os
import unittest
from typing import List

from runner.execution.drive import DriveOptions, Driver, _Progress
from runner.execution.executor import Executor
from runner.proof.demo_cli import format_cli_table, run_demo_cli
from runner.execution.run import Run
from runner.stores.file import RunStore
from tests.support.batch import batch_contract, recorder_commands, script
from tests.support.cli import RunnerCli
from tests.support.util import contract_block, scratch_dir


CANCEL_ON_B = r'''
import subprocess, sys
# cancel_on_b.py REPO RUN KEY COMMAND...: a person cancels the run while item b is in flight, then COMMAND runs.
repo, run, key, command = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
if key == "b:ticket":
    subprocess.run([sys.executable, "-S", "-m", "runner", "--dir", run, "cancel", "--by", "a-person", "--reason", "no longer needed"],
                   env={"PYTHONPATH": repo}, check=True, stdout=subprocess.DEVNULL)
sys.exit(subprocess.run(command).returncode)
'''


class DriveTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = scratch_dir("runner-drive-")
        self.addCleanup(self.tmp.cleanup)
        self.root = self.tmp.name
        self.cli = RunnerCli(self, root=self.root)
        self.out = os.path.join(self.root, "out")
        os.mkdir(self.out)
        self.commands = recorder_commands(self.root)

    def _block(self, **options):
        block = batch_contract(self.commands, items=["a.md", "b.md", "c.md"], payload={"template": {"name": "{stem}"}}, workspace=self.root, **options)
        return block

    def test_drive_hands_over_a_step_that_needs_judgement(self) -> None:
        block = self._block()
        block["steps"][0]["next"] = "review"
        block["steps"].append({"id": "review", "evidence": ["verdict"], "next": "done"})
        self.cli.init(block)
        result = self.cli("drive", "--owner", "agent", "--json")
        out = json.loads(result.out)
        self.assertEqual((out["decision"], out["action"]["kind"], out["action"]["step"], out["drive"]["handed_over"]),
                         ("act", "start-step", "review", True))
        self.assertEqual(out["drive"]["effects"], 3)
        self.assertEqual(self.cli.status()["completed_steps"], ["file-tickets"])

    def test_max_actions_and_the_progress_line(self) -> None:
        self.cli.init(self._block())
        first = self.cli("drive", "--owner", "agent", "--max-actions", "2")
        self.assertIn('"key": "b:ticket"', first.out)  # the next action, as 'next' prints it
        self.assertIn("drive: file-tickets 1/3 items", first.err)
        self.assertEqual(self.cli.status()["effects"], {"verified": 1})
        rest = self.cli("drive", "--owner", "agent", "--json", code=10)
        self.assertEqual(rest.err, "", "quiet with --json")
        self.assertEqual(json.loads(rest.out)["drive"]["effects"], 2)

    def test_a_gated_effect_stops_drive_awaiting_approval(self) -> None:
        block = self._block()
        block["effects"]["approval"] = ["b:*"]
        self.cli.init(block)
        result = self.cli("drive", "--owner", "agent", "--json", code=4)
        self.assertEqual(json.loads(result.out)["reason"], "awaiting-approval")
        self.assertEqual(sorted(os.listdir(self.out)), ["a:ticket.args"], "nothing after the gated item was called")

    def test_a_checked_step_is_finished_by_drive_once_its_artifact_exists(self) -> None:
        check = script(self.root, "check.py", "import os, sys\nsys.exit(0 if os.path.exists('index.json') else 1)\n")
        block = self._block()
        block["steps"][0]["next"] = "index"
        block["steps"].append({"id": "index", "checks": {"index": check}, "artifacts": ["index.json"], "next": "done"})
        self.cli.init(block)
        waiting = self.cli("drive", "--owner", "agent", "--json")
        out = json.loads(waiting.out)
        self.assertEqual((out["action"]["kind"], out["drive"]["handed_over"]), ("finish-step", True))
        self.assertIn("check 'index' exited 1", out["detail"])
        with open(os.path.join(self.root, "index.json"), "w") as handle:
            handle.write("{}\n")
        self.cli("drive", "--owner", "agent", "--json", code=10)
        self.assertEqual(self.cli.status()["evidence"]["index"]["observed"]["checks"]["index"]["exit_code"], 0)


    def test_a_cancel_between_items_stops_drive_before_the_next_effect(self) -> None:
        from tests.support.util import REPO_ROOT

        canceller = script(self.root, "cancel_on_b.py", CANCEL_ON_B)
        self.commands["invoke"] = canceller + [REPO_ROOT, os.path.join(self.root, ".run"), "{key}"] + self.commands["invoke"]
        self.cli.init(self._block())
        self.cli("drive", "--owner", "agent", "--json", code=5)
        state = self.cli.status()
        self.assertEqual((state["status"], state["effects"]), ("cancelled", {"verified": 2}), "the effect in flight was still settled")
        self.assertEqual(sorted(os.listdir(self.out)), ["a:ticket.args", "b:ticket.args"])

    def test_until_stop_waits_out_a_persisted_backoff(self) -> None:
        block = self._block(retry={"base_seconds": 0.2, "cap_seconds": 0.2})
        self.cli.init(block)
        self.cli("lease", "acquire", "--owner", "agent")
        writer = ["--owner", "agent", "--epoch", str(self.cli.status()["lease"]["epoch"])]
        self.cli("step", "start", "file-tickets", *writer)
        self.cli("step", "fail", "file-tickets", "--class", "transient", "--error", "the disk was full", *writer)
        self.cli("drive", "--owner", "agent", "--until-stop", "--json", code=10)
        self.assertEqual(self.cli.status()["steps"]["file-tickets"]["attempts"], 2)


class DriverOptionsTest(unittest.TestCase):
    """A driver is given nothing it would ignore.

    Its executor is of the run it drives and renews the lease for the
    drive's own time; a new executor is made from the options only it uses.
    """

    def setUp(self) -> None:
        self.tmp = scratch_dir("runner-driver-")
        self.addCleanup(self.tmp.cleanup)

    def open_run(self, name: str) -> Run:
        path = os.path.join(self.tmp.name, name)
        RunStore.create(path, f"driver-{name}", contract_block(f"driver-{name}"), durability="process")
        run = Run(RunStore.open(path, durability="process"))
        self.addCleanup(run.store.close)
        return run

    def test_an_executor_that_renews_the_lease_for_another_time_is_refused(self) -> None:
        run = self.open_run("ttl")
        with self.assertRaisesRegex(ValueError, "renews the lease for 30.0 s, and the drive would take it for 60 s"):
            Driver(run, "w1", Executor(run, ttl=30), DriveOptions(60))
        self.assertEqual(Driver(run, "w1", Executor(run, ttl=60), DriveOptions(60.0)).executor.ttl, 60.0)

    def test_an_executor_of_another_run_is_refused(self) -> None:
        run, other = self.open_run("driven"), self.open_run("other")
        with self.assertRaisesRegex(ValueError, "another run"):
            Driver(run, "w1", Executor(other, ttl=60), DriveOptions(60))

    def test_parallel_and_sleep_go_only_where_they_are_used(self) -> None:
        run = self.open_run("new")
        naps: List[float] = []

        def nap(seconds: float) -> None:
            naps.append(seconds)

        driver = Driver.with_new_executor(run, "w1", DriveOptions(45), parallel=3, sleep=nap)
        self.assertIs(driver.executor.run, run)
        self.assertEqual((driver.executor.ttl, driver.executor.flow.limit), (45.0, 3))
        self.assertIs(getattr(driver.executor.world, "sleep"), nap)
        with self.assertRaises(TypeError):  # no parallel, no sleep beside an executor: the old drive() ignored them
            Driver(run, "w1", Executor(run, ttl=45), DriveOptions(45), parallel=3)  # type: ignore[call-arg]
        result = driver.drive()  # the contract's only step needs judgement: handed over, the lease given back
        self.assertEqual((result["exit_code"], result["handed_over"], result["action"]["kind"]),
                         (0, True, "start-step"))
        self.assertIsNone(run.state["lease"]["owner"])


class ProgressLineTest(unittest.TestCase):
    def test_calls_that_may_create_are_counted_apart_from_lookups(self) -> None:
        out, now = io.StringIO(), [100.0]
        progress = _Progress(out, lambda: now[0], every=2.0)
        figures = {"in_flight": 4, "looking": 11, "not_now": 0}
        now[0] = 101.0
        progress.show("file", 10, 40, 10, 0, figures)  # within the interval: nothing
        now[0] = 102.5
        progress.show("file", 10, 40, 10, 2, figures)
        progress.show("file", 40, 40, 40, 2, dict(figures, in_flight=0, looking=0), final=True)
        self.assertEqual(out.getvalue().splitlines(), [
            "drive: file 10/40 items | 4 calls in flight, 11 lookups | 4.0 items/s | 2 reconciled | 8 s left",
            "drive: file 40/40 items | 0 calls in flight | 16.0 items/s | 2 reconciled"])


class DemoViaCliTest(unittest.TestCase):
    def test_small_demo_through_drive_alone(self) -> None:
        with scratch_dir("runner-demo-cli-page-") as scratch:
            page = os.path.join(scratch, "page.html")
            result = run_demo_cli(documents=8, seed=3, crash_rate=0.3, html=page)
            with open(page, encoding="utf-8") as handle:
                drawn = handle.read()
        self.assertTrue(result["ok"], result)
        self.assertEqual((result["duplicate_effects"], result["lost_commits"], result["matches_reference"]), (0, 0, True))
        self.assertGreater(result["crashes"], 0, "the demo must have killed drive at least once")
        self.assertEqual(result["crashes_holding_the_lease"], result["recoveries"])
        # The batch run's page: one crash mark per recovery, its whole history read.
        self.assertEqual(drawn.count('<g class="crash"'), result["recoveries"])
        self.assertNotIn("compacted away", drawn)
        table = format_cli_table(result)
        wall = f"wall time                        {result['total_seconds']} s: the uncrashed reference run"
        self.assertIn(wall, table)
        if result["crashes"] > result["recoveries"]:
            self.assertIn("killed holding none", table)

    def test_small_demo_over_the_http_adapter(self) -> None:
        # The service closes each connection with its answer (HTTP/1.0): every answer must still be read whole.
        result = run_demo_cli(documents=12, seed=4, crash_rate=0.25, client="http", parallel=4)
        self.assertTrue(result["ok"], result)
        self.assertEqual((result["duplicate_effects"], result["lost_commits"], result["matches_reference"]), (0, 0, True))
        self.assertGreater(result["crashes_at_windows"], 0, "the demo must have killed drive at a window at least once")
        self.assertEqual(result["crashes_holding_the_lease"], result["recoveries"])


if __name__ == "__main__":
    unittest.main()
