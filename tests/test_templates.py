"""Every template runs: the batch example, copied into a project with the tools it ships, files its tickets.

``templates/run-contract.batch.example.md`` and ``templates/tools/`` are copied as a user would
copy them; the loopback ticket service stands in for the real one (``TICKET_SERVICE_URL``).
``drive`` files one ticket per document, hands the ``index`` step over, and completes once
``tools/write_index.py`` wrote the index its check accepts. The other templates pass ``contract
check`` and name no file the project does not ship.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import unittest

from runner.contract import check_contract
from runner.proof.ticketservice import TicketServiceProcess
from tests._batch import local
from tests._util import REPO_ROOT, scratch_dir

TEMPLATES = os.path.join(REPO_ROOT, "templates")


class BatchExampleTest(unittest.TestCase):
    def test_the_batch_example_runs_end_to_end(self) -> None:
        with scratch_dir("runner-template-") as root, TicketServiceProcess(os.path.join(root, "tickets.db")) as service:
            shutil.copy(os.path.join(TEMPLATES, "run-contract.batch.example.md"), os.path.join(root, "contract.md"))
            shutil.copytree(os.path.join(TEMPLATES, "tools"), os.path.join(root, "tools"))
            os.mkdir(os.path.join(root, "docs"))
            names = ["alpha.md", "Beta Notes.md", "report 013 (customer's copy).md"]
            for n, name in enumerate(names):
                with open(os.path.join(root, "docs", name), "w", encoding="utf-8") as handle:
                    handle.write(f"# Review {n}\n\nThe body of document {n}.\n")
            env = {"TICKET_SERVICE_URL": service.url}
            self.assertEqual(local(root, "init", "--contract", os.path.join(root, "contract.md")).code, 0)
            first = local(root, "drive", "--owner", "agent-1", "--json", env=env)
            self.assertEqual(first.code, 0, first.err)
            handed = json.loads(first.out)
            self.assertEqual((handed["action"]["kind"], handed["action"]["step"], handed["drive"]["effects"]), ("finish-step", "index", 3))
            written = subprocess.run([sys.executable, "tools/write_index.py"], cwd=root, env=dict(os.environ, **env),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.assertEqual(written.returncode, 0, written.stderr)
            done = local(root, "drive", "--owner", "agent-1", "--json", env=env)
            self.assertEqual(done.code, 10, done.err)
            for name in names:
                stem = re.sub(r"[^a-z0-9]+", "-", os.path.splitext(name)[0].lower()).strip("-")
                self.assertEqual(len(service.tickets_for_key(f"doc-{stem}:ticket")), 1, name)
            self.assertEqual(service.stats()["tickets"], 3)


class EveryTemplateTest(unittest.TestCase):
    def test_every_example_passes_contract_check_and_names_only_shipped_files(self) -> None:
        shipped = set(os.listdir(os.path.join(TEMPLATES, "tools")))
        for name in sorted(os.listdir(TEMPLATES)):
            if not (name.startswith("run-contract.") and name.endswith(".example.md")):
                continue
            with self.subTest(template=name):
                block, problems = check_contract(os.path.join(TEMPLATES, name))
                self.assertEqual(problems, [])
                text = json.dumps(block)
                for named in re.findall(r"tools/([A-Za-z0-9_.-]+)", text):
                    self.assertIn(named, shipped, f"{name} names tools/{named}, which templates/tools/ does not ship")


if __name__ == "__main__":
    unittest.main()
