"""The HTTP recipes (``templates/recipes/github-issues.md``, ``templates/recipes/rest-api.md``) run against the
loopback stand-ins, killed mid-call and resumed by another process, with the faults real APIs give: no duplicate.

Each recipe's contract passes ``contract check``, its commands parse, and its "to try it" block runs as written.
Then ``drive`` runs in child processes against the stand-in (``tests/support/standins``): the stand-in creates what
it was sent and holds its answer (``stall-after``) while the test SIGKILLs ``drive``; the same one command, in a
new process, finishes the run. The stand-in's own count says how many objects each record has: one. A last test
keeps a whole URL (and its API key) and a token in secret files and reads every byte the runner wrote or printed
after such a drive: neither secret is there.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import unittest
from typing import Any, Dict, List, Tuple

from runner.contract.text import check_contract, load_contract
from runner.proof.cli import add_proof_verbs
from runner.surfaces.cli import build_parser, split_command
from tests.support.cli import RunnerCli
from tests.support.standins import rest, tracker
from tests.support.standins.harness import StandIn
from tests.support.util import child_env, REPO_ROOT, scratch_dir, wait_for
from tests.test_skill import shown_commands

RECIPES = os.path.join(REPO_ROOT, "templates", "recipes")
GITHUB = os.path.join(RECIPES, "github-issues.md")
REST = os.path.join(RECIPES, "rest-api.md")
TOKEN = "ghp-7d0e3f61a9c4b258"
API_KEY = "key-4be1f09c7a2d6e53"
CRASHES = [f"crash-{n:02d}-{word}" for n, word in enumerate(("npe", "oom", "timeout", "panic", "segv", "deadlock",
                                                             "leak", "overflow", "abort", "hang", "assert", "race"))]




def the_block(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return re.search(r"To try it.*?```sh\n(.*?)```", handle.read(), re.S).group(1)  # type: ignore[union-attr]


def stalled(server: StandIn, operation: str) -> int:
    """Requests of ``operation`` the stand-in took and has not answered (a stall-after holds them)."""
    return int(server.requests().get(operation, {}).get("0", 0))


class RecipeTest(unittest.TestCase):
    """Each recipe passes ``contract check``, its commands parse, and its "to try it" block runs as written."""

    def test_each_recipe_passes_contract_check_and_its_commands_parse(self) -> None:
        parser = build_parser((add_proof_verbs,))
        for path in (GITHUB, REST):
            with self.subTest(recipe=os.path.basename(path)):
                _, problems = check_contract(path)
                self.assertEqual(problems, [])
                with open(path, encoding="utf-8") as handle:
                    shown = shown_commands(handle.read())
                self.assertGreaterEqual(len(shown), 6)
                for command in shown:
                    parser.parse_args(split_command(shlex.split(command))[0])

    def test_each_try_it_block_runs_as_written(self) -> None:
        for path, folder, count in ((GITHUB, "tracker", tracker.count_by_first_line),
                                    (REST, "api", rest.count_by_external_id)):
            with self.subTest(recipe=os.path.basename(path)), scratch_dir("runner-recipe-") as root:
                with open(path, encoding="utf-8") as handle, open(os.path.join(root, "contract.md"), "w") as out:
                    out.write(handle.read())
                env = dict(child_env(pythonpath=False), RUNNER=REPO_ROOT)
                done = subprocess.run(["sh", "-ec", the_block(path)], cwd=root, env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
                self.assertEqual(done.returncode, 10, done.stdout.decode("utf-8", "replace")[-3000:])
                self.assertEqual(sorted(count(os.path.join(root, folder)).values()), [1, 1, 1], "one each")


class _Drive(unittest.TestCase):
    """A recipe's contract against a stand-in, run by ``drive`` in children that the test kills mid-call."""

    def project(self, path: str, base: str, real: str, **effects: Any) -> RunnerCli:
        """The recipe's contract aimed at the stand-in (``real``, the API's address in the recipe, made ``base``),
        with the times a test can wait for."""
        block = json.loads(json.dumps(load_contract(path)).replace(real, base))
        block["effects"] = dict(block["effects"], timeout_seconds=4, settle_seconds=1.0, **effects)
        block["retry"] = {"base_seconds": 0.2, "cap_seconds": 0.5}
        cli = RunnerCli(self)
        self.block = block
        return cli

    def kill_mid_call(self, cli: RunnerCli, server: StandIn, operation: str, kills: int) -> None:
        """Start ``drive`` ``kills`` times, each SIGKILLed while the stand-in holds the answer of a call it made."""
        for kill in range(kills):
            server.faults([{"fault": "stall-after", "on": operation, "seconds": 30}], add=True)
            before = stalled(server, operation)
            drive = cli.spawn("drive", "--owner", "agent-1")
            wait_for(f"kill {kill}: a {operation} held by the stand-in", lambda: stalled(server, operation) > before)
            drive.send_signal(signal.SIGKILL)
            drive.wait()

    def finish(self, cli: RunnerCli, keys: List[str]) -> Dict[str, Any]:
        """The one command, once more, in a new process: complete; every key verified."""
        done = cli.child("drive", "--owner", "agent-1", "--json", code=10, timeout=240)
        self.assertEqual(json.loads(done.out)["reason"], "complete")
        effects = cli.json("effect", "list")["effects"]
        self.assertEqual(sorted(effects), sorted(keys))
        self.assertEqual({e["state"] for e in effects.values()}, {"verified"})
        report = cli.json("report")
        self.assertGreaterEqual(report["recoveries"], 1)
        return report


class GithubIssuesTest(_Drive):
    def test_killed_mid_call_under_rate_limits_and_faults_one_issue_per_record(self) -> None:
        # A tracker that lists an issue only 0.4 s after it was made, allows 12 requests each 2 s and says so in its
        # headers, lists 5 issues a page; it answers a secondary rate limit (403 and retry-after), a 429, a spent
        # primary limit (403, remaining 0) and a proxy's 502 after it made an issue; drive is killed twice while it
        # holds the answer of an issue it made.
        with StandIn("tracker", ["--token", TOKEN, "--lag", "0.4", "--rate-limit", "12", "--rate-window", "2"]) as hub:
            cli = self.project(GITHUB, hub.base, "https://api.github.com", concurrency=2)
            http = self.block["effects"]["http"]
            http["observe"]["list"]["url"] = http["observe"]["list"]["url"].replace("per_page=100", "per_page=5")
            os.makedirs(os.path.join(cli.root, "crashes"))
            for crash in CRASHES:
                record = {"id": crash, "title": f"Crash {crash}", "summary": "Seen in production.",
                          "labels": ["crash"], "count": 3}
                with open(os.path.join(cli.root, "crashes", f"{crash}.json"), "w", encoding="utf-8") as handle:
                    json.dump(record, handle)
            with open(os.path.join(cli.root, ".github-token"), "w") as handle:
                handle.write(TOKEN + "\n")
            cli.init(self.block)
            hub.faults([{"fault": "secondary", "on": "create", "retry_after": 1}, {"fault": "429", "on": "list"},
                        {"fault": "502-after", "on": "create"}, {"fault": "primary", "on": "list", "seconds": 1}])
            self.kill_mid_call(cli, hub, "create", kills=2)
            self.finish(cli, [f"crash-{c}" for c in CRASHES])
            counted = hub.count()
            self.assertEqual((counted["total"], counted["duplicates"]), (len(CRASHES), {}))
            self.assertEqual(sorted(counted["by_first_line"]), sorted(f"crash-group: {c}" for c in CRASHES))
            seen = hub.requests()
            self.assertGreaterEqual(seen["create"].get("403", 0) + seen["list"].get("403", 0), 2, seen)
            self.assertGreaterEqual(seen["list"].get("429", 0), 1, seen)
            self.assertGreaterEqual(seen["create"].get("502", 0), 1, seen)
            self.assertEqual(hub.json("GET", "/_faults")["faults"], [], "every fault was met")
            flagged = cli.json("status").get("possible_duplicates")
            self.assertIn(flagged, (None, 0, []))


class RestApiTest(_Drive):
    def test_killed_mid_call_with_lost_and_refused_answers_one_object_per_row(self) -> None:
        rows = [(n, f"Name {n}", f"n{n}@example.invalid") for n in range(1, 9)]
        with StandIn("rest", ["--token", TOKEN, "--lag", "0.4"]) as api:
            cli = self.project(REST, api.base, "https://api.example.com/v1")
            with open(os.path.join(cli.root, "customers.csv"), "w", encoding="utf-8") as handle:
                handle.write("id,name,email\n" + "".join(f"{n},{name},{mail}\n" for n, name, mail in rows))
            with open(os.path.join(cli.root, ".api-token"), "w") as handle:
                handle.write(TOKEN + "\n")
            cli.init(self.block)
            api.faults([{"fault": "429", "on": "create", "retry_after": 1}, {"fault": "500-after", "on": "create"},
                        {"fault": "503", "on": "lookup", "retry_after": 1}, {"fault": "reset-after", "on": "create"},
                        {"fault": "502-after", "on": "create"}])
            self.kill_mid_call(cli, api, "create", kills=2)
            self.finish(cli, [f"customer-{n}" for n, _, _ in rows])
            counted = api.count()
            self.assertEqual((counted["total"], counted["duplicates"]), (len(rows), {}))
            self.assertEqual(sorted(counted["by_external_id"]), sorted(f"customer-{n}" for n, _, _ in rows))
            self.assertEqual(api.json("GET", "/_faults")["faults"], [], "every fault was met")


class SecretUrlTest(_Drive):
    """A whole URL kept in a file (its API key in its query) and a token in another: after a drive killed mid-call
    and every verb that reads the run, neither secret is in any byte the runner wrote or printed."""

    def test_no_byte_the_runner_writes_or_prints_holds_the_url_or_its_key(self) -> None:
        from tests.test_http_drive import _files, _hooks, _mcp

        written: List[Tuple[str, bytes]] = []
        with StandIn("rest", ["--token", TOKEN, "--key", API_KEY, "--lag", "0.4"]) as api:
            url = f"{api.base}/items?key={API_KEY}"
            cli = self.project(REST, api.base, "https://api.example.com/v1")
            http = self.block["effects"]["http"]
            http["invoke"]["url"] = "{file:.items-url}"
            http["observe"]["url"] = "{file:.items-url}&external_id={key}"
            with open(os.path.join(cli.root, "customers.csv"), "w", encoding="utf-8") as handle:
                handle.write("id,name,email\n" + "".join(f"{n},N{n},n{n}@example.invalid\n" for n in range(1, 6)))
            for name, value in ((".api-token", TOKEN), (".items-url", url)):
                with open(os.path.join(cli.root, name), "w") as handle:
                    handle.write(value + "\n")
            cli.init(self.block)
            api.faults([{"fault": "500-after", "on": "create"}, {"fault": "429", "on": "lookup", "retry_after": 1}])

            def verb(*args: str, child: bool = False, code: Any = None) -> None:
                result = cli.child(*args, code=code, timeout=240) if child else cli(*args, code=code)
                written.append((" ".join(args), result.out.encode() + result.err.encode()))

            self.kill_mid_call(cli, api, "create", kills=1)
            written.extend(_files(cli.run_dir, "run folder after the kill"))
            verb("drive", "--owner", "agent-1", "--json", child=True, code=10)
            for args in (("status", "--json"), ("status",), ("brief",), ("next", "--json"), ("report", "--json"),
                         ("events", "--json"), ("effect", "list", "--json"), ("effect", "show", "customer-1", "--json"),
                         ("report", "--html", os.path.join(cli.root, "out.html")),
                         ("events", "--otlp", os.path.join(cli.root, "out.jsonl"), "--with-content")):
                verb(*args)
            for name in ("out.html", "out.jsonl"):
                with open(os.path.join(cli.root, name), "rb") as handle:
                    written.append((name, handle.read()))
            env = child_env()
            written.append(("mcp", _mcp(cli.root, cli.run_dir, env)))
            written.extend(_hooks(cli.root, env))
            written.extend(_files(cli.run_dir, "run folder"))
            self.assertEqual(api.count()["duplicates"], {})
            self.assertEqual(api.count()["total"], 5)
        everything = b"".join(data for _, data in written)
        self.assertIn(b"[secret]", everything, "the URL is recorded, its secret part shown as [secret]")
        for what, data in written:
            for secret in (API_KEY, TOKEN, url, api.base):
                self.assertNotIn(secret.encode(), data, f"{secret} in {what}")


if __name__ == "__main__":
    unittest.main()

