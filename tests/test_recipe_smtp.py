"""The SMTP recipe (``templates/recipes/smtp-email.md``) run against the loopback mail server, killed mid-send and
resumed by another process, with the faults mail servers give: no duplicate, and an unknown stops for a person.

The recipe's contract passes ``contract check``, its commands parse, and its "to try it" block runs as written.
Then ``drive`` runs in child processes against the stand-in (``tests/support/standins/smtpd.py``): a 421 before the
message and a 451 after it are "not now" (sent again, once); a drive killed while the server holds the answer to a
message it kept, a connection dropped after the final dot, and a drive killed before the message was written each
stop the next drive with exit 8, never sending that row again. The person looks in the mailbox (the stand-in's
messages, by the ``X-Runner-Key`` header) and records what they saw with ``effect verify`` or ``effect absent``
``--by``; ``drive`` then completes with exactly one message per row.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import unittest
from typing import Any, Dict, List

from runner.contract.text import check_contract, load_contract
from runner.proof.cli import add_proof_verbs
from runner.surfaces.cli import build_parser, split_command
from tests.support.cli import RunnerCli
from tests.support.standins import smtpd
from tests.support.standins.harness import StandIn
from tests.support.util import child_env, REPO_ROOT, scratch_dir, wait_for
from tests.test_skill import shown_commands

RECIPE = os.path.join(REPO_ROOT, "templates", "recipes", "smtp-email.md")
PASSWORD = "pw-of-the-relay-3f7a"
ROWS = [(n, f"Name {n}", f"n{n}@example.invalid") for n in range(1, 9)]




def delivered(server: StandIn) -> Dict[str, int]:
    """What a person searching the mailbox finds: how many messages carry each key (``X-Runner-Key``)."""
    found: Dict[str, int] = {}
    for mail in smtpd.read_messages(server.state):
        found[str(mail["X-Runner-Key"])] = found.get(str(mail["X-Runner-Key"]), 0) + 1
    return found


class SmtpRecipeTest(unittest.TestCase):
    def test_the_recipe_passes_contract_check_its_commands_parse_and_its_try_it_block_runs(self) -> None:
        _, problems = check_contract(RECIPE)
        self.assertEqual(problems, [])
        parser = build_parser((add_proof_verbs,))
        with open(RECIPE, encoding="utf-8") as handle:
            text = handle.read()
        shown = shown_commands(text)
        self.assertGreaterEqual(len(shown), 8)
        self.assertTrue(any(c.startswith("effect verify ") and "--by" in c for c in shown), shown)
        self.assertTrue(any(c.startswith("effect absent ") and "--by" in c for c in shown), shown)
        for command in shown:
            parser.parse_args(split_command(shlex.split(command))[0])
        block = re.search(r"To try it.*?```sh\n(.*?)```", text, re.S).group(1)  # type: ignore[union-attr]
        with scratch_dir("runner-recipe-smtp-") as root:
            with open(os.path.join(root, "contract.md"), "w", encoding="utf-8") as out:
                out.write(text)
            env = dict(child_env(pythonpath=False), RUNNER=REPO_ROOT)
            done = subprocess.run(["sh", "-ec", block], cwd=root, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
            self.assertEqual(done.returncode, 10, done.stdout.decode("utf-8", "replace")[-3000:])
            self.assertEqual(sorted(smtpd.count_by_message_id(os.path.join(root, "mail")).values()), [1, 1, 1])


class SmtpRecipeDriveTest(unittest.TestCase):
    """The recipe's contract against the stand-in, driven by children the test kills mid-send."""

    def project(self, server: StandIn) -> RunnerCli:
        block = load_contract(RECIPE)
        smtp = dict(block["effects"]["smtp"], host=server.host, port=server.port, security="none",
                    not_now_seconds=0.3)
        block["effects"] = dict(block["effects"], smtp=smtp, timeout_seconds=4)
        block["retry"] = {"base_seconds": 0.2, "cap_seconds": 0.5}
        cli = RunnerCli(self)
        with open(os.path.join(cli.root, "recipients.csv"), "w", encoding="utf-8") as handle:
            handle.write("id,name,email\n" + "".join(f"{n},{name},{mail}\n" for n, name, mail in ROWS))
        with open(os.path.join(cli.root, ".smtp-password"), "w") as handle:
            handle.write(PASSWORD + "\n")
        cli.init(block)
        return cli

    def stopped_for_a_person(self, cli: RunnerCli) -> str:
        """``drive`` in a new process stops with exit 8 for a row whose send has no known outcome; that row's key,
        as ``next`` names it with the two commands."""
        stop = json.loads(cli.child("drive", "--owner", "agent-1", "--json", code=8, timeout=240).out)
        self.assertEqual(stop["reason"], "needs-reconciliation", stop)
        shown = cli("next", code=None).out
        key = re.search(r"effect verify (notice-\d+) --by NAME --evidence JSON", shown).group(1)  # type: ignore
        self.assertIn(f"effect absent {key} --by NAME --evidence JSON", shown)
        self.assertEqual(cli.json("effect", "show", key)["state"], "uncertain")
        return key

    def person_records(self, cli: RunnerCli, server: StandIn, key: str, expected: int) -> None:
        """A person searches the mailbox for the key and records what they saw, with who they are."""
        seen = delivered(server).get(key, 0)
        self.assertEqual(seen, expected, f"{key} in the mailbox")
        verb = "verify" if seen else "absent"
        evidence = json.dumps({"mailbox": "n@example.invalid", "x_runner_key": key, "found": seen})
        cli("effect", verb, key, "--by", "ops-ada", "--evidence", evidence)

    def test_killed_mid_send_and_dropped_after_the_dot_one_message_per_row_and_every_unknown_for_a_person(
            self) -> None:
        with StandIn("smtpd", ["--auth", f"releases@example.com:{PASSWORD}"]) as server:
            cli = self.project(server)
            # "Not now" before and after the message: sent again, once each.
            server.faults([{"fault": "421", "on": "mail"}, {"fault": "451"},
                           {"fault": "stall-after-dot", "seconds": 30}])
            drive = cli.spawn("drive", "--owner", "agent-1")
            wait_for("a message kept while its answer is held", lambda: sum(delivered(server).values()) >= 1)
            drive.send_signal(signal.SIGKILL)
            drive.wait()
            key = self.stopped_for_a_person(cli)
            self.person_records(cli, server, key, expected=1)

            # A connection dropped after the final dot: the message was kept, the answer lost.
            server.faults([{"fault": "drop-after-dot"}])
            key = self.stopped_for_a_person(cli)
            self.person_records(cli, server, key, expected=1)

            # Killed before the message was written (the server never answers DATA): nothing in the mailbox; the
            # person's absence sends it again, once.
            before = dict(delivered(server))
            self.assertLess(sum(before.values()), len(ROWS), "a drive stops at its first unknown: rows are left")
            server.faults([{"fault": "stall", "on": "data", "seconds": 30}])
            drive = cli.spawn("drive", "--owner", "agent-1")
            wait_for("a send recorded started",
                     lambda: "started" in {e["state"] for e in cli.json("effect", "list")["effects"].values()})
            drive.send_signal(signal.SIGKILL)
            drive.wait()
            key = self.stopped_for_a_person(cli)
            self.assertEqual(delivered(server), before, "nothing was delivered by the killed drive")
            self.person_records(cli, server, key, expected=0)

            done = json.loads(cli.child("drive", "--owner", "agent-1", "--json", code=10, timeout=240).out)
            self.assertEqual(done["reason"], "complete")
            effects: Dict[str, Any] = cli.json("effect", "list")["effects"]
            keys: List[str] = [f"notice-{n}" for n, _, _ in ROWS]
            self.assertEqual(sorted(effects), sorted(keys))
            self.assertEqual({e["state"] for e in effects.values()}, {"verified"})
            self.assertEqual(delivered(server), {k: 1 for k in keys}, "exactly one message per row")
            self.assertEqual(sorted(smtpd.count_by_message_id(server.state).values()), [1] * len(ROWS))
            people = [k for k, e in effects.items()
                      if (cli.json("effect", "show", k)["evidence"].get("observed_by") or {}).get("by") == "ops-ada"]
            self.assertEqual(len(people), 2, "two rows verified on a person's word")
            receipt = cli.json("effect", "show", "notice-8")["evidence"]
            self.assertEqual(receipt["observe"], "none")
            self.assertTrue(receipt["receipt"]["reply"].startswith("250"), receipt)
            for shown in (cli("brief").out, cli("status").out):
                self.assertNotIn(PASSWORD, shown)


if __name__ == "__main__":
    unittest.main()

