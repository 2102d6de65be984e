"""Every template runs: the examples' "to try it" blocks, run as written, and every contract checked.

``templates/run-contract.batch.example.md`` and ``templates/tools/`` are copied into a project
folder outside the checkout as a user would copy them, and the template's own shell block runs
there: it starts the loopback ticket service, ``drive`` files one ticket per document, hands the
``index`` step over, and completes once ``tools/write_index.py`` wrote the index its check
accepts. The HTTP example's block runs as a script, as a newcomer runs it: ``drive`` completes
(exit 10), the loopback helpdesk ends with the script's shell and leaves its port free, and with the
port taken the block exits 1 at once instead of waiting for ever (the same block, with its
helpdesk probed, runs in ``tests/test_http_drive.py``). The HTTP example names port 8765; its block
and contract run here on a port the machine has free in its place, so that the suites of two
checkouts can run at once. The other templates pass ``contract check`` and name no file the project
does not ship.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import unittest
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from runner.surfaces import history
from runner.contract.text import check_contract
from runner.stores.file import RunStore
from tests.support.util import REPO_ROOT, child_env, in_process_cli, scratch_dir

T = TypeVar("T")

TEMPLATES = os.path.join(REPO_ROOT, "templates")
#: The port the HTTP example names for the loopback helpdesk.
HELPDESK_PORT = 8765


def a_free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _on_port(text: str, port: Optional[int]) -> str:
    """``text`` with the HTTP example's port replaced by ``port`` (None: as written)."""
    return text if port is None else text.replace(str(HELPDESK_PORT), str(port))


def the_block(template: str, port: Optional[int] = None) -> str:
    """The shell block of ``template``'s "to try it" paragraph (on ``port`` in place of the HTTP example's)."""
    with open(os.path.join(TEMPLATES, template), encoding="utf-8") as handle:
        text = handle.read()
    return _on_port(re.search(r"To try it.*?```sh\n(.*?)```", text, re.S).group(1), port)  # type: ignore[union-attr]


def make_project(root: str, template: str, folder: str, files: List[str], port: Optional[int] = None) -> None:
    """``root`` as a user makes it: the template as ``contract.md`` (on ``port`` in place of the HTTP example's),
    ``templates/tools/`` as ``tools/``, ``files`` in ``folder``."""
    with open(os.path.join(TEMPLATES, template), encoding="utf-8") as handle:
        text = handle.read()
    with open(os.path.join(root, "contract.md"), "w", encoding="utf-8") as handle:
        handle.write(_on_port(text, port))
    shutil.copytree(os.path.join(TEMPLATES, "tools"), os.path.join(root, "tools"))
    os.mkdir(os.path.join(root, folder))
    for n, name in enumerate(files):
        with open(os.path.join(root, folder, name), "w", encoding="utf-8") as handle:
            handle.write(f"# Review {n}\n\nThe body of document {n}.\n")


def run_report(root: str) -> Dict[str, Any]:
    """``report --json`` of the run in ``root``, with ``crashes_drawn``: the crashes its timeline draws."""
    report = json.loads(in_process_cli(["--dir", os.path.join(root, ".run"), "report", "--json"]).out)
    store = RunStore.open(os.path.join(root, ".run"))
    try:
        report["crashes_drawn"] = len(history.load(store).crashes)
    finally:
        store.close()
    return report


def live_in_group(group: int) -> List[str]:
    """The command lines of the processes of process group ``group`` still running (an ended one waiting to be reaped is not)."""
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return []
        return [f"a process of group {group}"]
    live = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) != group or fields[0] == b"Z":
                continue
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                live.append(handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip())
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return live


def run_as_script(template: str, root: str, timeout: float = 120, port: Optional[int] = None) -> Tuple[int, str, List[str]]:
    """Run ``template``'s "to try it" block with ``sh`` as a script in the project ``root``, with nothing added.

    Returns the script's exit code, its output, and what of its process group still runs 10 seconds
    after it ended (then stopped): a service the block started in the background must end with it.
    """
    env = dict(child_env(pythonpath=False), RUNNER=REPO_ROOT)
    log = os.path.join(root, "script.log")  # a file, not a pipe: what the script leaves running would hold a pipe open
    with open(log, "wb") as output:
        shell = subprocess.Popen(["sh", "-c", the_block(template, port)], cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=output,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = shell.wait(timeout)
        deadline = time.monotonic() + 10
        while live_in_group(shell.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = live_in_group(shell.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
    with open(log, encoding="utf-8", errors="replace") as handle:
        return code, handle.read(), left


def try_it(template: str, folder: str, files: List[str], probe: Callable[[str], T],
           port: Optional[int] = None) -> Tuple[int, str, Dict[str, Any], T]:
    """Run ``template``'s "to try it" block with ``sh``, as written, in a project folder outside the checkout.

    The project holds the template as ``contract.md``, ``templates/tools/`` as ``tools/`` and ``files``
    (short Markdown documents) in ``folder``. ``probe(project)`` runs once the block is done, while the
    service it left in the background still answers; then that service is stopped. Returns the block's
    exit code, its output, ``report --json`` of the run and what ``probe`` returned. ``port`` stands in
    for the HTTP example's.
    """
    block = the_block(template, port)
    with scratch_dir("runner-try-") as root:
        make_project(root, template, folder, files, port)
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
        report = run_report(root)
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

    def test_a_service_that_cannot_start_ends_the_block_with_exit_1_and_its_reason(self) -> None:
        with scratch_dir("runner-try-") as root:
            make_project(root, "run-contract.batch.example.md", "docs", ["a.md"])
            env = dict(child_env(pythonpath=False), RUNNER=os.path.join(root, "no-checkout-here"))
            done = subprocess.run(["sh", "-c", the_block("run-contract.batch.example.md")], cwd=root, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
            self.assertFalse(os.path.exists(os.path.join(root, ".run")), "stopped before init")
        out = done.stdout.decode("utf-8", "replace")
        self.assertEqual(done.returncode, 1, out)
        self.assertIn("No module named 'runner'", out)


class HttpExampleTest(unittest.TestCase):
    def test_the_http_example_run_as_a_script_completes_and_its_helpdesk_ends_with_it(self) -> None:
        port = a_free_port()
        with scratch_dir("runner-try-") as root:
            make_project(root, "run-contract.http.example.md", "inbox", ["a.md", "b.md"], port)
            code, out, left = run_as_script("run-contract.http.example.md", root, port=port)
            self.assertEqual(code, 10, out)  # drive: complete
            self.assertEqual(left, [], f"still running after the script ended:\n{out}")
            with socket.socket() as again:
                # Free: the next try starts its own helpdesk there (which, like this, may reuse an address its closed connections hold).
                again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                again.bind(("127.0.0.1", port))
            report = run_report(root)
        self.assertEqual((report["status"], report["items_verified"], report["possible_duplicates"]), ("complete", 2, 0), out)

    def test_with_the_port_taken_the_http_example_exits_1_with_the_helpdesks_one_line(self) -> None:
        with scratch_dir("runner-try-") as root, socket.socket() as taken:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = int(taken.getsockname()[1])
            make_project(root, "run-contract.http.example.md", "inbox", ["a.md"], port)
            code, out, left = run_as_script("run-contract.http.example.md", root, timeout=60, port=port)
            self.assertFalse(os.path.exists(os.path.join(root, ".run")), out)  # stopped before init
        self.assertEqual((code, out, left), (1, f"helpdesk: cannot listen on 127.0.0.1:{port}: Address already in use\n", []))

    def test_the_wait_for_the_helpdesk_says_nothing_before_its_log_exists(self) -> None:
        # The block's background job opens helpdesk.log itself, so the first look may come before the file exists.
        # Like the helpdesk, the stand-in goes on running once it listens (one that ended would be a helpdesk that died).
        wait = next(line for line in the_block("run-contract.http.example.md").splitlines() if line.startswith("until "))
        script = "(sleep 0.3; echo listening > helpdesk.log; exec sleep 60) &\n" + wait + "\necho ready\nkill $!\n"
        with scratch_dir("runner-helpdesk-") as root:
            done = subprocess.run(["sh", "-c", script], cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=30)
        self.assertEqual((done.returncode, done.stdout.decode("utf-8", "replace")), (0, "ready\n"))

    def test_the_helpdesk_says_in_one_line_that_it_cannot_listen(self) -> None:
        with scratch_dir("runner-helpdesk-") as root, socket.socket() as taken:
            token = os.path.join(root, "token")
            with open(token, "w", encoding="utf-8") as handle:
                handle.write("local-token\n")
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            done = subprocess.run([sys.executable, "-m", "runner.proof.helpdesk", "--token-file", token, "--port", str(port)],
                                  cwd=root, env=child_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        self.assertEqual((done.returncode, done.stdout, done.stderr.decode("utf-8", "replace")),
                         (1, b"", f"helpdesk: cannot listen on 127.0.0.1:{port}: Address already in use\n"))


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
