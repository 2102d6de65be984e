"""The chat webhook recipe (``templates/recipes/chat-webhook.md``) run against the loopback webhook, killed mid-call
and resumed by another process, with the faults chat webhooks give: no duplicate, an unknown stops for a person,
and the webhook's URL (its secret) is in no byte of the run folder nor in what the runner prints.

The recipe's contract passes ``contract check``, its commands parse, and its "to try it" block runs as written.
Then ``drive`` runs in child processes against the stand-in (``tests/support/standins/webhook.py``): a 429 with
``Retry-After`` is "not now" (posted again once); a drive killed while the webhook holds the answer of a message it
delivered, a connection reset after the request was sent, and a 500 each stop the next drive with exit 8, never
posting that line again. The person looks in the channel (the stand-in's messages) and records what they saw with
``effect verify`` or ``effect absent`` ``--by``; ``drive`` then completes with exactly one message per line.
"""

import gzip
import json
import os
import re
import shlex
import signal
import subprocess
import unittest
from typing import Dict, List, Tuple

from runner.contract.text import check_contract, load_contract
from runner.proof.cli import add_proof_verbs
from runner.surfaces.cli import build_parser, split_command
from tests.support.cli import RunnerCli
from tests.support.standins import webhook
from tests.support.standins.harness import StandIn
from tests.support.util import child_env, REPO_ROOT, scratch_dir, wait_for
from tests.test_skill import shown_commands

RECIPE = os.path.join(REPO_ROOT, "templates", "recipes", "chat-webhook.md")
LINES = [(f"REL-{100 + n}", f"svc{n}", f"change number {n}") for n in range(1, 9)]




def in_channel(hook: StandIn) -> Dict[str, int]:
    """What a person reading the channel finds: how many messages end with each line's id."""
    found: Dict[str, int] = {}
    for message in webhook.messages(hook.state):
        ident = re.search(r"\((REL-\d+)\)\Z", message["text"]).group(1)  # type: ignore[union-attr]
        found[ident] = found.get(ident, 0) + 1
    return found


def folder_bytes(folder: str) -> List[Tuple[str, bytes]]:
    """Every file under ``folder``, a gzip file's content unpacked as well."""
    out = []
    for base, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(base, name)
            with open(path, "rb") as handle:
                data = handle.read()
            out.append((os.path.relpath(path, folder), data))
            if name.endswith(".gz"):
                out.append((os.path.relpath(path, folder) + " (unpacked)", gzip.decompress(data)))
    return out


class ChatWebhookRecipeTest(unittest.TestCase):
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
        with scratch_dir("runner-recipe-chat-") as root:
            with open(os.path.join(root, "contract.md"), "w", encoding="utf-8") as out:
                out.write(text)
            env = dict(child_env(pythonpath=False), RUNNER=REPO_ROOT)
            done = subprocess.run(["sh", "-ec", block], cwd=root, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
            self.assertEqual(done.returncode, 10, done.stdout.decode("utf-8", "replace")[-3000:])
            self.assertEqual(sorted(webhook.count_by_text(os.path.join(root, "chat")).values()), [1, 1, 1])


class ChatWebhookDriveTest(unittest.TestCase):
    """The recipe's contract against the stand-in, driven by children the test kills mid-call."""

    def project(self, hook: StandIn) -> RunnerCli:
        block = load_contract(RECIPE)
        block["effects"] = dict(block["effects"], timeout_seconds=4)
        block["retry"] = {"base_seconds": 0.2, "cap_seconds": 0.5}
        cli = RunnerCli(self)
        with open(os.path.join(cli.root, "changes.txt"), "w", encoding="utf-8") as handle:
            handle.write("".join(f"{ident} {service}: {change}\n" for ident, service, change in LINES))
        with open(os.path.join(cli.root, ".webhook-url"), "w") as handle:
            handle.write(hook.url + "\n")
        cli.init(block)
        return cli

    def stopped_for_a_person(self, cli: RunnerCli) -> str:
        """``drive`` in a new process stops with exit 8 for a line whose post has no known outcome; that line's key,
        as ``next`` names it with the two commands."""
        stop = json.loads(cli.child("drive", "--owner", "agent-1", "--json", code=8, timeout=240).out)
        self.assertEqual(stop["reason"], "needs-reconciliation", stop)
        shown = cli("next", code=None).out
        key = re.search(r"effect verify (note-rel-\d+) --by NAME --evidence JSON", shown).group(1)  # type: ignore
        self.assertIn(f"effect absent {key} --by NAME --evidence JSON", shown)
        self.assertEqual(cli.json("effect", "show", key)["state"], "uncertain")
        return key

    def person_records(self, cli: RunnerCli, hook: StandIn, key: str, expected: int) -> None:
        """A person reads the channel for the line's id and records what they saw, with who they are."""
        ident = key[len("note-"):].upper()
        seen = in_channel(hook).get(ident, 0)
        self.assertEqual(seen, expected, f"{ident} in the channel")
        verb = "verify" if seen else "absent"
        cli("effect", verb, key, "--by", "ops-ada", "--evidence", json.dumps({"channel": "#releases", "found": seen}))

    def test_killed_mid_call_under_faults_one_message_per_line_and_the_url_is_never_recorded(self) -> None:
        with StandIn("webhook") as hook:
            secret = hook.url.rsplit("/", 1)[1]
            cli = self.project(hook)
            # A 429 with Retry-After posts nothing: posted again once; then the webhook holds the answer of a message
            # it delivered while the drive is killed.
            hook.faults([{"fault": "429", "on": "post", "retry_after": 1},
                         {"fault": "stall-after", "on": "post", "seconds": 30}])
            drive = cli.spawn("drive", "--owner", "agent-1")
            wait_for("a message delivered while its answer is held", lambda: sum(in_channel(hook).values()) >= 1)
            drive.send_signal(signal.SIGKILL)
            drive.wait()
            key = self.stopped_for_a_person(cli)
            self.person_records(cli, hook, key, expected=1)

            # The connection reset after the request was sent: delivered, the answer lost.
            hook.faults([{"fault": "reset-after", "on": "post"}])
            key = self.stopped_for_a_person(cli)
            self.person_records(cli, hook, key, expected=1)

            # A 500: whether it posted is unknown (it did not); the person's absence posts it again, once.
            before = dict(in_channel(hook))
            self.assertLess(sum(before.values()), len(LINES), "a drive stops at its first unknown: lines are left")
            hook.faults([{"fault": "500", "on": "post"}])
            key = self.stopped_for_a_person(cli)
            self.assertEqual(in_channel(hook), before)
            self.person_records(cli, hook, key, expected=0)

            done = json.loads(cli.child("drive", "--owner", "agent-1", "--json", code=10, timeout=240).out)
            self.assertEqual(done["reason"], "complete")
            effects = cli.json("effect", "list")["effects"]
            self.assertEqual(sorted(effects), sorted(f"note-{ident.lower()}" for ident, _, _ in LINES))
            self.assertEqual({e["state"] for e in effects.values()}, {"verified"})
            self.assertEqual(in_channel(hook), {ident: 1 for ident, _, _ in LINES}, "exactly one message per line")
            self.assertEqual(hook.count()["duplicates"], {})
            seen = hook.requests()["post"]
            self.assertGreaterEqual(seen.get("429", 0), 1, seen)
            self.assertEqual(hook.json("GET", "/_faults")["faults"], [], "every fault was met")

            written: List[Tuple[str, bytes]] = []
            for args in (("brief",), ("status",), ("status", "--json"), ("next", "--json"), ("report", "--json"),
                         ("events", "--json"), ("effect", "list", "--json"),
                         ("effect", "show", "note-rel-101", "--json"),
                         ("report", "--html", os.path.join(cli.root, "timeline.html"))):
                result = cli(*args, code=None)
                written.append((" ".join(args), result.out.encode() + result.err.encode()))
            with open(os.path.join(cli.root, "timeline.html"), "rb") as handle:
                written.append(("timeline", handle.read()))
            written.extend(folder_bytes(cli.run_dir))
        self.assertGreater(len(written), 12)
        self.assertIn(b"[secret]", b"".join(data for _, data in written), "the URL is shown as [secret]")
        for what, data in written:
            for needle in (hook.url, secret, hook.base):
                self.assertNotIn(needle.encode(), data, f"{needle} in {what}")


if __name__ == "__main__":
    unittest.main()

