"""``effect run`` and ``drive`` killed at each of the five effect windows, resumed in another process.

The target is the loopback ticket service in its own process; the contract
drives it through real commands (curl in shell scripts where the machine has
curl, the standalone Python client otherwise). A wrapper in front of each
command SIGKILLs the runner process at the chosen window, twice per window;
a different process resumes. The service must end with exactly one ticket
per key. The default suite runs ``effect run`` with the Python client and
``drive`` with curl (or Python); ``RUNNER_FULL_TESTS=1`` runs every pairing.
"""

import json
import os
import signal
import unittest

from runner.proof.ticketcommands import WINDOWS, have_curl, write_commands
from runner.proof.ticketservice import TicketServiceProcess
from runner.stores.file import RunStore
from tests._batch import batch_contract, cli, init_run, kill_env, local, make_documents, status
from tests._util import scratch_dir

#: What the ledger and the service hold when the runner dies at each window: (effect state, tickets).
AT_KILL = {
    "before-started": (None, 0),
    "after-started": ("started", 0),
    "after-target-commit": ("started", 1),
    "after-response": ("started", 1),
    "after-ack": ("acknowledged", 1),
}

FULL = os.environ.get("RUNNER_FULL_TESTS") == "1"
PAIRS = [("effect-run", "python"), ("drive", "curl" if have_curl() else "python")]
if FULL:
    PAIRS = [(verb, client) for verb in ("effect-run", "drive") for client in (("curl", "python") if have_curl() else ("python",))]


class KillAtEveryWindowTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = scratch_dir("runner-effect-run-")
        self.root = self.tmp.name
        self.service = TicketServiceProcess(os.path.join(self.root, "tickets.db"))
        self.addCleanup(self.tmp.cleanup)
        self.addCleanup(lambda: self.service.stop())

    def _start(self, client: str, documents: int) -> None:
        commands = write_commands(self.root, self.service.url, client, killable=True)
        block = batch_contract(commands, payload={"command": commands["payload"]})
        make_documents(self.root, documents)
        init_run(self.root, block)

    def _audit(self, documents: int) -> None:
        for n in range(documents):
            key = f"doc-{n:05d}:ticket"
            self.assertEqual(len(self.service.tickets_for_key(key)), 1, f"{key} must hold exactly one ticket")
        self.assertEqual(self.service.stats()["tickets"], documents)
        state = status(self.root)
        self.assertEqual(state["effects"], {"verified": documents})

    def _killed(self, result, window: str) -> None:
        self.assertEqual(result.code, -signal.SIGKILL, f"the runner was not killed at {window}: {result.code} {result.err[-500:]}")

    def _effect_run(self, client: str) -> None:
        documents = 2 * len(WINDOWS)
        self._start(client, documents)
        self.assertEqual(local(self.root, "lease", "acquire", "--owner", "agent", "--json").code, 0)
        epoch = str(status(self.root)["lease"]["epoch"])
        self.assertEqual(cli(self.root, "step", "start", "file-tickets", "--owner", "agent", "--epoch", epoch).code, 0)
        for n in range(documents):
            window = WINDOWS[n % len(WINDOWS)]
            key = f"doc-{n:05d}:ticket"
            killed = cli(self.root, "effect", "run", key, "--owner", "agent", "--epoch", epoch, env=kill_env(self.root, window))
            self._killed(killed, window)
            effect = RunStore.open(os.path.join(self.root, ".run")).state["effects"].get(key)
            self.assertEqual(((effect or {}).get("state"), len(self.service.tickets_for_key(key))), AT_KILL[window], window)
            # Another process takes the lease (the same owner id, a higher epoch) and runs the effect again.
            self.assertEqual(local(self.root, "lease", "acquire", "--owner", "agent").code, 0)
            epoch = str(status(self.root)["lease"]["epoch"])
            resumed = cli(self.root, "effect", "run", key, "--owner", "agent", "--epoch", epoch, "--json")
            self.assertEqual(resumed.code, 0, resumed.err)
            self.assertEqual(json.loads(resumed.out)["state"], "verified")
            if n == 0:
                again = cli(self.root, "effect", "run", key, "--owner", "agent", "--epoch", epoch, "--json")
                self.assertEqual((again.code, json.loads(again.out)["attempts"]), (0, json.loads(resumed.out)["attempts"]),
                                 "a verified effect runs nothing again")
        self.assertEqual(cli(self.root, "step", "done", "file-tickets", "--owner", "agent", "--epoch", epoch).code, 0)
        self._audit(documents)

    def _drive(self, client: str) -> None:
        documents = 3 * len(WINDOWS)
        self._start(client, documents)
        kills = 0
        for turn in range(2 * len(WINDOWS)):
            window = WINDOWS[turn % len(WINDOWS)]
            killed = cli(self.root, "drive", "--owner", f"driver-{turn}", "--json", env=kill_env(self.root, window))
            self._killed(killed, window)
            kills += 1
            # The supervisor saw the process end, so the next driver need not wait out the lease.
            self.assertEqual(local(self.root, "lease", "break", "--by", "supervisor", "--reason", f"driver-{turn} was killed").code, 0)
        final = cli(self.root, "drive", "--owner", "driver-last", "--json")
        self.assertEqual(final.code, 10, final.err)
        self.assertEqual(json.loads(final.out)["reason"], "complete")
        self.assertEqual(kills, 10)
        self._audit(documents)
        report = json.loads(local(self.root, "report", "--json").out)
        self.assertEqual((report["items"], report["items_verified"], report["recoveries"]), (documents, documents, 10))

    def test_effect_run_and_drive_killed_twice_at_each_window(self) -> None:
        for verb, client in PAIRS:
            with self.subTest(verb=verb, client=client):
                if verb == "effect-run":
                    self._effect_run(client)
                else:
                    self._drive(client)
            if (verb, client) != PAIRS[-1]:
                self.tearDown_between()

    def tearDown_between(self) -> None:
        """A fresh run folder and ledger for the next pairing."""
        import shutil

        self.service.stop()
        for name in os.listdir(self.root):
            path = os.path.join(self.root, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
        self.service = TicketServiceProcess(os.path.join(self.root, "tickets.db"))


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
