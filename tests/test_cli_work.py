"""The ``work`` verb through the real command line: a pool of worker processes drives every run of a store.

Defect 11: the verb's ``--handler`` option overwrote the command line's own
dispatch, so ``work`` always crashed, and no test had run it as a user does.
Here ``python3 -m runner work`` runs in a child process with this module's
:func:`handler`, over a file store of several runs, and every run ends
complete with each step's evidence.
"""

import os
import unittest
from typing import Any, Dict

try:
    from .support import util as _util
except ImportError:
    from support import util as _util

from runner.base.errors import AlreadyRunning
from runner.execution.run import Run

HANDLER = "tests.test_cli_work:handler"


def handler(store: Any, owner: str, ttl: float, context: Dict[str, Any], *_: Any) -> str:
    """Take the run's lease, finish each step with the evidence its contract names, release; return the run's status.

    Another worker holding the run is the pool's ordinary contention: the answer is ``already-running``.
    """
    run = Run(store)
    try:
        run.acquire(owner, ttl)
    except AlreadyRunning as exc:
        return exc.reason
    for step in run.state["plan"]["steps"]:
        if step["id"] in run.state["completed_steps"]:
            continue
        if run.state["current_step"] != step["id"]:
            run.step_start(step["id"])
        run.step_done(step["id"], {name: f"{context['mark']} {owner}" for name in step.get("evidence", [])})
    status = str(run.state["status"])
    run.release()
    return status


def contract(task: str) -> str:
    return (
        "```json run-contract\n"
        f'{{"contract": 1, "task_id": "{task}", "goal": "g",'
        ' "steps": [{"id": "build", "evidence": ["log"]}, {"id": "check", "evidence": ["report"]}]}\n'
        "```\n"
    )


class WorkVerbTest(unittest.TestCase):
    def setUp(self) -> None:
        tmp = _util.scratch_dir()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        self.root = os.path.join(self.tmp, "runs")
        os.mkdir(self.root)
        self.tasks = [f"shard-{n}" for n in range(4)]
        for task in self.tasks:
            path = os.path.join(self.tmp, task + ".md")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(contract(task))
            result = _util.in_process_cli(["--store", f"file:{os.path.join(self.root, task)}", "init", "--contract", path])
            self.assertEqual(result.code, 0, result)

    def test_the_pool_drives_every_run_to_completion(self) -> None:
        result = _util.run_cli("--json", "work", "--store", f"file:{self.root}", "--workers", "2", "--handler", HANDLER,
                               "--context", '{"mark": "done by"}', "--ttl", "60", timeout=120)
        self.assertEqual(result.code, 0, result)
        self.assertNotIn("Traceback", result.err)
        tally = _util.one_json(result)
        self.assertEqual((tally["ok"], tally["errors"], tally["crashes"]), (True, [], 0))
        self.assertGreaterEqual(tally["workers"], 2)
        owners = set()
        for task in self.tasks:
            state = _util.one_json(_util.in_process_cli(["--json", "--dir", os.path.join(self.root, task), "status"]))
            self.assertEqual((state["status"], state["completed_steps"], state["lease"]["owner"]), ("complete", ["build", "check"], None), task)
            evidence = state["steps"]["build"]["evidence"]["log"]
            self.assertRegex(evidence, r"^done by pool-.+-w[0-9]+$")
            owners.add(evidence.split()[-1])
        # One supervisor's workers: a shared prefix, then w1, w2, ... up to the number started.
        self.assertEqual(len({owner.rsplit("-w", 1)[0] for owner in owners}), 1, owners)
        self.assertLessEqual({owner.rsplit("-", 1)[1] for owner in owners}, {f"w{n}" for n in range(1, tally["workers"] + 1)})

    def test_a_handler_that_cannot_be_loaded_is_invalid_input(self) -> None:
        for spec in ("no.such.module:thing", "tests.test_cli_work:no_such_function", "tests.test_cli_work:HANDLER"):
            with self.subTest(spec=spec):
                result = _util.run_cli("work", "--store", f"file:{self.root}", "--handler", spec, timeout=60)
                self.assertEqual(result.code, 2, result)
                lines = _util.stderr_lines(result)
                self.assertEqual(len(lines), 1, lines)
                self.assertIn("handler", lines[0])
        for task in self.tasks:
            state = _util.one_json(_util.in_process_cli(["--json", "--dir", os.path.join(self.root, task), "status"]))
            self.assertEqual(state["revision"], 0)


if __name__ == "__main__":
    unittest.main()
