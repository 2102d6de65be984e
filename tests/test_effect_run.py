"""``effect run`` and ``drive`` killed at each of the five effect windows, resumed in another process.

The target is the loopback ticket service in its own process; the contract
drives it through real commands (curl in shell scripts where the machine has
curl, the standalone Python client otherwise). A wrapper in front of each
command SIGKILLs the runner process at the chosen window, twice per window;
a different process resumes. The service must end with exactly one ticket
per key. The default suite runs ``effect run`` with the Python client and
``drive`` with curl (or Python); ``RUNNER_FULL_TESTS=1`` runs every pairing.
"""

import os
import signal
import time
import unittest

from runner.surfaces import views
from runner.execution.recovery import decide
from runner.execution.run import Run

from runner.proof.ticketcommands import WINDOWS, have_curl, write_commands
from runner.proof.ticketservice import TicketServiceProcess
from runner.stores.file import RunStore
from tests.support.batch import batch_contract, kill_env, make_documents
from tests.support.cli import RunnerCli
from tests.support.util import FULL_TESTS as FULL
from tests.support.util import in_parallel, scratch_dir

#: What the ledger and the service hold when the runner dies at each window: (effect state, tickets).
AT_KILL = {
    "before-started": (None, 0),
    "after-started": ("started", 0),
    "after-target-commit": ("started", 1),
    "after-response": ("started", 1),
    "after-ack": ("acknowledged", 1),
}

PAIRS = [("effect-run", "python"), ("drive", "curl" if have_curl() else "python")]
if FULL:
    PAIRS = [(verb, client) for verb in ("effect-run", "drive") for client in (("curl", "python") if have_curl() else ("python",))]


def _run(root: str) -> Run:
    """The run as a library object in this process (thread-safe, unlike the in-process command line)."""
    return Run(RunStore.open(os.path.join(root, ".run")))


class KillAtEveryWindowTest(unittest.TestCase):
    """Each pairing gets its own workspace and service; the pairings run side by side."""

    def _start(self, cli: RunnerCli, service: TicketServiceProcess, client: str, documents: int) -> None:
        commands = write_commands(cli.root, service.url, client, killable=True)
        block = batch_contract(commands, payload={"command": commands["payload"]})
        make_documents(cli.root, documents)
        cli.init(block)

    def _audit(self, root: str, service: TicketServiceProcess, documents: int) -> None:
        for n in range(documents):
            key = f"doc-{n:05d}:ticket"
            self.assertEqual(len(service.tickets_for_key(key)), 1, f"{key} must hold exactly one ticket")
        self.assertEqual(service.stats()["tickets"], documents)
        self.assertEqual({e["state"] for e in _run(root).state["effects"].values()}, {"verified"})

    def _killed(self, result, window: str) -> None:
        self.assertEqual(result.code, -signal.SIGKILL, f"the runner was not killed at {window}: {result.code} {result.err[-500:]}")

    def _effect_run(self, cli: RunnerCli, service: TicketServiceProcess, client: str) -> None:
        root, documents = cli.root, 2 * len(WINDOWS)
        self._start(cli, service, client, documents)
        agent = cli.writer("agent", _run(root).acquire("agent", 60)["epoch"])
        agent("step", "start", "file-tickets")
        for n in range(documents):
            window = WINDOWS[n % len(WINDOWS)]
            key = f"doc-{n:05d}:ticket"
            self._killed(agent.child("effect", "run", key, env=kill_env(root, window), code=None), window)
            effect = _run(root).state["effects"].get(key)
            self.assertEqual(((effect or {}).get("state"), len(service.tickets_for_key(key))), AT_KILL[window], window)
            # Another process (this one) takes the lease (the same owner id, a higher epoch) and runs the effect again.
            agent = cli.writer("agent", _run(root).acquire("agent", 60)["epoch"])
            resumed = agent.json("effect", "run", key)
            self.assertEqual(resumed["state"], "verified")
            if n == 0:
                again = agent.json("effect", "run", key)
                self.assertEqual(again["attempts"], resumed["attempts"], "a verified effect runs nothing again")
        agent("step", "done", "file-tickets")
        self._audit(root, service, documents)

    def _drive(self, cli: RunnerCli, service: TicketServiceProcess, client: str) -> None:
        root, documents = cli.root, 3 * len(WINDOWS)
        self._start(cli, service, client, documents)
        for turn in range(2 * len(WINDOWS)):
            window = WINDOWS[turn % len(WINDOWS)]
            killed = cli.child("drive", "--owner", f"driver-{turn}", "--json", env=kill_env(root, window), code=None)
            self._killed(killed, window)
            # The supervisor saw the process end, so the next driver need not wait out the lease.
            _run(root).break_lease("supervisor", f"driver-{turn} was killed")
            if turn == 2:
                decision = decide(_run(root).state, time.time())
                self.assertEqual((decision["action"]["kind"], decision["action"]["step"]), ("reconcile", "file-tickets"), decision)
                self.assertIn("effect run", decision["action"]["why"])
        self.assertEqual(cli.child("drive", "--owner", "driver-last", "--json", code=10).json["reason"], "complete")
        self._audit(root, service, documents)
        report = views.report(_run(root).state)
        self.assertEqual((report["items"], report["items_verified"], report["recoveries"]), (documents, documents, 2 * len(WINDOWS)))

    def _pairing(self, verb: str, client: str) -> None:
        with scratch_dir(f"runner-{verb}-{client}-") as root:
            with TicketServiceProcess(os.path.join(root, "tickets.db")) as service:
                (self._effect_run if verb == "effect-run" else self._drive)(RunnerCli(self, root=root), service, client)

    def test_effect_run_and_drive_killed_twice_at_each_window(self) -> None:
        in_parallel([lambda verb=verb, client=client: self._pairing(verb, client) for verb, client in PAIRS], workers=2)


class ServiceFromAnyFolderTest(unittest.TestCase):
    def test_the_service_starts_from_a_folder_outside_the_repository(self) -> None:
        with scratch_dir("runner-elsewhere-") as elsewhere:
            here = os.getcwd()
            os.chdir(elsewhere)
            try:
                with TicketServiceProcess(os.path.join(elsewhere, "tickets.db")) as service:
                    self.assertEqual(service.stats()["tickets"], 0)
            finally:
                os.chdir(here)


if __name__ == "__main__":
    unittest.main()
