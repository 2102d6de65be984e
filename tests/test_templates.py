"""Every template runs: the examples' "to try it" blocks, run as written, and every contract checked.

``templates/run-contract.batch.example.md`` and ``templates/tools/`` are copied into a project
folder outside the checkout as a user would copy them, and the template's own shell block runs
there: it starts the loopback ticket service, ``drive`` files one ticket per document, hands the
``index`` step over, and completes once ``tools/write_index.py`` wrote the index its check
accepts. The HTTP example's block runs in ``tests/test_http_drive.py``. The other templates pass
``contract check`` and name no file the project does not ship.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time
import unittest
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Tuple, TypeVar

from runner import history
from runner.contract import check_contract
from runner.stores.file import RunStore
from tests._batch import local
from tests._util import REPO_ROOT, child_env, scratch_dir

T = TypeVar("T")

TEMPLATES = os.path.join(REPO_ROOT, "templates")


def try_it(template: str, folder: str, files: List[str], probe: Callable[[str], T]) -> Tuple[int, str, Dict[str, Any], T]:
    """Run ``template``'s "to try it" block with ``sh``, as written, in a project folder outside the checkout.

    The project holds the template as ``contract.md``, ``templates/tools/`` as ``tools/`` and ``files``
    (short Markdown documents) in ``folder``. ``probe(project)`` runs once the block is done, while the
    service it left in the background still answers; then that service is stopped. Returns the block's
    exit code, its output, ``report --json`` of the run and what ``probe`` returned.
    """
    with open(os.path.join(TEMPLATES, template), encoding="utf-8") as handle:
        text = handle.read()
    block = re.search(r"To try it.*?```sh\n(.*?)```", text, re.S).group(1)  # type: ignore[union-attr]
    with scratch_dir("runner-try-") as root:
        shutil.copy(os.path.join(TEMPLATES, template), os.path.join(root, "contract.md"))
        shutil.copytree(os.path.join(TEMPLATES, "tools"), os.path.join(root, "tools"))
        os.mkdir(os.path.join(root, folder))
        for n, name in enumerate(files):
            with open(os.path.join(root, folder, name), "w", encoding="utf-8") as handle:
                handle.write(f"# Review {n}\n\nThe body of document {n}.\n")
        env = dict(child_env(pythonpath=False), RUNNER=REPO_ROOT)
        log = os.path.join(root, "try-it.log")  # a file, not a pipe: the service left in the background holds it open
        # The shell stays until the probe is done: the loopback services end with the shell that started them.
        script = block + '\nprintf "\\n%s %s\\n" "try-it: exit" "$?"\nwait\n'
        with open(log, "wb") as output:
            shell = subprocess.Popen(["sh", "-c", script], cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=output,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while True:
                with open(log, encoding="utf-8", errors="replace") as handle:
                    out, marker, code = handle.read().rpartition("\ntry-it: exit ")
                if marker and code.endswith("\n"):
                    break
                if shell.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the block did not finish: {out or code}")
                time.sleep(0.05)
            probed = probe(root)
        finally:
            try:
                os.killpg(shell.pid, signal.SIGTERM)  # the shell and that service, in the block's process group
            except ProcessLookupError:
                pass
            shell.wait()
        report = json.loads(local(root, "report", "--json").out)
        store = RunStore.open(os.path.join(root, ".run"))
        try:
            report["crashes_drawn"] = len(history.load(store).crashes)
        finally:
            store.close()
    return int(code), out, report, probed


class BatchExampleTest(unittest.TestCase):
    def test_the_batch_example_runs_end_to_end(self) -> None:
        names = ["alpha.md", "Beta Notes.md", "report 013 (customer's copy).md"]
        keys = ["doc-" + re.sub(r"[^a-z0-9]+", "-", os.path.splitext(name)[0].lower()).strip("-") + ":ticket" for name in names]

        def tickets(root: str) -> Dict[str, Any]:
            with open(os.path.join(root, "port"), encoding="utf-8") as handle:
                service = f"http://127.0.0.1:{handle.read().strip()}"

            def get(path: str) -> Any:
                with urllib.request.urlopen(service + path, timeout=10) as answer:
                    return json.loads(answer.read())

            return {"total": get("/stats")["tickets"], **{key: len(get("/tickets?key=" + urllib.parse.quote(key))["tickets"]) for key in keys}}

        code, out, report, found = try_it("run-contract.batch.example.md", "docs", names, tickets)
        self.assertEqual(code, 10, out)  # the second drive: complete
        self.assertIn('"kind": "finish-step", "step": "index"', out, "the first drive handed the index step over")
        self.assertNotIn("live", "".join(line for line in out.splitlines() if '"source": "lease"' in line), "each drive said it gave the lease back")
        self.assertEqual(found, {"total": 3, **{key: 1 for key in keys}}, out)
        self.assertEqual((report["status"], report["items_verified"]), ("complete", 3))
        # Nothing crashed: the hand-over and the next drive of the same owner are no recovery, and the timeline draws no crash.
        self.assertEqual((report["recoveries"], report["recovery_wait_seconds"], report["crashes_drawn"]), (0, 0.0, 0), out)


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
