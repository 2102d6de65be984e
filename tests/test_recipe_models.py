"""The model-call recipe (``templates/recipes/model-calls.md``) against the OpenAI-compatible stand-in, which bills
every request it processed: its contract passes ``contract check``, its commands parse, its "to try it" block
runs as written; and under 429s, 500s, slow answers, a dropped connection and three SIGKILLs of ``drive
--parallel 8`` with eight calls in flight, each resumed by another process as the recipe says, every document's
summary is on disk and matches the SHA-256 its acknowledged answer recorded, no answered call is paid twice and
the calls paid twice are at most those in flight at a kill or whose connection dropped.

The figures are printed as one line, ``model-recipe: ...``: the bill against one call per item, the calls in
flight at each kill, the tokens billed against those the run recorded and where the difference went (the
answers lost), the money spent against the contract's limit.
"""

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import unittest
from typing import Any, Dict, List, Set, Tuple

from runner.contract.text import check_contract, load_contract
from runner.proof.cli import add_proof_verbs
from runner.surfaces.cli import build_parser, split_command
from tests.support.cli import RunnerCli
from tests.support.standins import models
from tests.support.standins.harness import StandIn
from tests.support.util import child_env, REPO_ROOT, scratch_dir, wait_for
from tests.test_skill import shown_commands

RECIPE = os.path.join(REPO_ROOT, "templates", "recipes", "model-calls.md")
REAL = "https://api.openai.com/v1"
KEY = "sk-local-5e0c2b7a91d4"
#: Documents, kills of drive and the calls in flight each kill waits for.
DOCUMENTS, KILLS, IN_FLIGHT = 64, 3, 8




def the_block(path: str, title: str) -> str:
    with open(path, encoding="utf-8") as handle:
        found = re.search(title + r".*?```(?:sh|json)\n(.*?)```", handle.read(), re.S)
    assert found is not None, title
    return found.group(1)


class RecipeTest(unittest.TestCase):
    def test_the_contract_passes_contract_check_and_its_commands_parse(self) -> None:
        _, problems = check_contract(RECIPE)
        self.assertEqual(problems, [])
        with open(RECIPE, encoding="utf-8") as handle:
            shown = shown_commands(handle.read())
        self.assertGreaterEqual(len(shown), 8)
        parser = build_parser((add_proof_verbs,))
        for command in shown:
            parser.parse_args(split_command(shlex.split(command))[0])

    def test_the_try_it_block_runs_as_written(self) -> None:
        with scratch_dir("runner-recipe-models-") as root:
            with open(RECIPE, encoding="utf-8") as handle, open(os.path.join(root, "contract.md"), "w") as out:
                out.write(handle.read())
            env = dict(child_env(pythonpath=False), RUNNER=REPO_ROOT)
            done = subprocess.run(["sh", "-ec", the_block(RECIPE, "To try it")], cwd=root, env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=180)
            self.assertEqual(done.returncode, 10, done.stdout.decode("utf-8", "replace")[-3000:])
            self.assertEqual(sorted(os.listdir(os.path.join(root, "summaries"))),
                             ["outage-report.md", "release-notes.md", "team-handbook.md"])
            self.assertEqual(sorted(models.billed_by_prompt(os.path.join(root, "api")).values()), [1, 1, 1])


class KilledWithCallsInFlightTest(unittest.TestCase):
    def setUp(self) -> None:
        # Every answer takes 0.6 s, so eight calls are in flight at once while drive runs.
        self.api = StandIn("models", ["--key", KEY, "--latency", "0.6"])
        self.addCleanup(self.api.stop)
        block = json.loads(json.dumps(load_contract(RECIPE)).replace(REAL, self.api.url))
        block["retry"] = {"base_seconds": 0.2, "cap_seconds": 0.5}
        block["effects"] = dict(block["effects"], timeout_seconds=5)
        self.block = block
        self.cli = RunnerCli(self)
        self.root = self.cli.root
        os.mkdir(os.path.join(self.root, "docs"))
        self.prompts: Dict[str, str] = {}  # key -> the SHA-256 the bill keeps of its messages
        template = block["steps"][0]["payload"]["template"]
        for n in range(DOCUMENTS):
            text = f"# Document {n:02d}\n\nIts {n}th paragraph says something worth {n} sentences.\n"
            with open(os.path.join(self.root, "docs", f"doc-{n:02d}.md"), "w", encoding="utf-8") as handle:
                handle.write(text)
            messages = json.loads(json.dumps(template["messages"]).replace('"{text}"', json.dumps(text)))
            self.prompts[f"doc-{n:02d}"] = models.prompt_digest(messages)
        with open(os.path.join(self.root, ".model-key"), "w") as handle:
            handle.write(KEY + "\n")
        self.cli.init(block)

    def effects(self) -> Dict[str, Any]:
        return dict(self.cli.json("effect", "list")["effects"])

    def started(self) -> Set[str]:
        return {k for k, e in self.effects().items() if e["state"] == "started"}

    def ready_to_kill(self, met: Set[str]) -> bool:
        started = self.started()
        return len(started) >= IN_FLIGHT and not started & met

    def billed(self) -> Dict[str, List[int]]:
        """Per key, the numbers of the bill's entries for its prompt."""
        keys = {digest: key for key, digest in self.prompts.items()}
        out: Dict[str, List[int]] = {}
        for entry in models.bill(self.api.state):
            out.setdefault(keys[entry["prompt"]], []).append(entry["n"])
        return out

    def drive(self) -> Tuple[int, List[str]]:
        """The recipe's command in a new process; on exit 8, each lost answer recorded absent as the recipe says.

        :returns: drive's exit code and the keys whose answers it lost.
        """
        done = self.cli.child("drive", "--owner", "agent-1", "--parallel", str(IN_FLIGHT), "--json", code=None,
                              timeout=240)
        self.assertIn(done.code, (8, 10), done.out[-3000:] + done.err[-3000:])
        lost = sorted(k for k, e in self.effects().items() if e["state"] == "uncertain")
        self.assertEqual(bool(lost), done.code == 8, done.out[-3000:])
        for key in lost:
            self.cli("effect", "absent", key, "--by", "tester", "--evidence", '{"answer": "lost, asked again"}')
        return done.code, lost

    def test_three_kills_at_eight_calls_in_flight_pay_twice_only_for_the_calls_in_flight(self) -> None:
        self.api.faults([{"fault": "slow", "seconds": 1.5}, {"fault": "slow", "seconds": 1.5}])
        in_flight: List[Set[str]] = []
        paid_at_kill: List[int] = []  # calls in flight at each kill that the API had billed: their answers are lost
        for kill in range(KILLS):
            before = {key: len(numbers) for key, numbers in self.billed().items()}
            drive = self.cli.spawn("drive", "--owner", "agent-1", "--parallel", str(IN_FLIGHT))
            # Killed with eight calls in flight, none of them met by an earlier kill (a call asked again after a kill
            # waits out the killed call's time first), so each kill meets other calls.
            met = set().union(*in_flight)
            wait_for(f"kill {kill}: {IN_FLIGHT} calls in flight", lambda met=met: self.ready_to_kill(met),
                     seconds=90.0)
            drive.send_signal(signal.SIGKILL)
            drive.wait()
            in_flight.append(self.started())
            code, lost = self.drive()
            self.assertEqual((code, set(lost)), (8, in_flight[-1]), "the calls in flight at the kill are named")
            after = self.billed()
            paid_at_kill.append(sum(1 for key in in_flight[-1] if len(after.get(key, [])) > before.get(key, 0)))
        # Then the faults the API gives: "not now" twice, a 500 twice (nothing billed), a dropped connection after
        # the answer was billed (lost: asked again once a person says so).
        self.api.faults([{"fault": "429", "retry_after": 1}, {"fault": "500"}, {"fault": "429", "retry_after": 1},
                         {"fault": "500"}, {"fault": "reset-after"}])
        dropped: List[str] = []
        for _ in range(10):
            code, lost = self.drive()
            dropped += lost
            if code == 10:
                break
        self.assertEqual(code, 10)
        self.assertEqual(len(dropped), 1, "the dropped connection's answer was lost and named")
        self.assertEqual(self.api.json("GET", "/_faults")["faults"], [], "every fault was met")

        effects = self.cli.json("effect", "list")["effects"]
        self.assertEqual(sorted(effects), sorted(self.prompts))
        self.assertEqual({e["state"] for e in effects.values()}, {"verified"})
        billed = self.billed()
        acknowledged: Dict[str, int] = {}
        recorded_tokens = 0
        matching = 0
        for key in sorted(effects):
            shown = self.cli.json("effect", "show", key)
            receipt = shown["evidence"]["receipt"]
            acknowledged[key] = int(receipt["id"].split("-")[1])
            recorded_tokens += receipt["usage"]["total_tokens"]
            with open(os.path.join(self.root, "summaries", f"{key}.md"), "rb") as handle:
                data = handle.read()
            self.assertEqual(receipt["saved"]["sha256"], hashlib.sha256(data).hexdigest(), key)
            self.assertEqual(receipt["choices"][0]["message"]["content"], f"sha256:{hashlib.sha256(data).hexdigest()}")
            self.assertIn(f"answer {acknowledged[key]}.", data.decode("utf-8"), "the file holds the acknowledged one")
            matching += 1
        answered_again = sum(1 for key, numbers in billed.items() for n in numbers if n > acknowledged[key])
        self.assertEqual(answered_again, 0, "no call is made after its answer was recorded")
        paid_twice = sum(len(numbers) - 1 for numbers in billed.values())
        flown = sum(len(keys) for keys in in_flight)
        self.assertLessEqual(paid_twice, flown + len(dropped))
        for key, numbers in billed.items():
            chances = sum(key in keys for keys in in_flight) + dropped.count(key)
            self.assertLessEqual(len(numbers) - 1, chances, f"{key}: paid again only for a call in flight or dropped")
        twice = {key for key, numbers in billed.items() if len(numbers) > 1}
        self.assertLessEqual(twice, set().union(*in_flight) | set(dropped), "only calls in flight or dropped")
        bill = models.bill(self.api.state)
        billed_tokens = sum(entry["total_tokens"] for entry in bill)
        lost_tokens = sum(entry["total_tokens"] for entry in bill if entry["n"] not in set(acknowledged.values()))
        self.assertEqual(billed_tokens, recorded_tokens + lost_tokens, "the run records every answer it got")
        self.assertEqual(len(bill), DOCUMENTS + paid_twice)
        leftovers = [n for n in os.listdir(os.path.join(self.root, "summaries")) if not n.endswith(".md")]
        self.assertEqual(leftovers, [], "no temporary file is left")
        report = self.cli.json("report")
        # Each answer's cost is recorded with it: the run's cost is its answers' own, priced; the lost ones' is not.
        spent = {name: value.get("spent", value) if isinstance(value, dict) else value
                 for name, value in report["cost"].items()}
        self.assertEqual(spent["tokens"], recorded_tokens, report["cost"])
        prices = dict(self.block["effects"]["cost"]["money"])
        usage = [(e["prompt_tokens"], e["completion_tokens"], e["n"] in set(acknowledged.values())) for e in bill]
        priced = [p * prices["/usage/prompt_tokens"] + c * prices["/usage/completion_tokens"] for p, c, _ in usage]
        recorded_money = sum(m for m, (_, _, kept) in zip(priced, usage) if kept)
        self.assertAlmostEqual(spent["money"], recorded_money, places=9)
        limit = self.block["limits"]["max_cost"]["money"]
        self.assertLessEqual(spent["money"], limit)
        budget = (f"money_spent={spent['money']:.6f}/limit={limit:g} money_billed={sum(priced):.6f} "
                  f"money_of_lost_answers={sum(priced) - recorded_money:.6f}")
        flights = "+".join(str(len(keys)) for keys in in_flight)
        self.assertEqual(paid_twice, sum(paid_at_kill) + len(dropped), "each lost answer is paid once more, no other")
        print(f"\nmodel-recipe: items={DOCUMENTS} kills={KILLS} in_flight_at_kills={flights} "
              f"billed_in_flight_at_kills={'+'.join(map(str, paid_at_kill))} dropped={len(dropped)} "
              f"billed={len(bill)} paid_twice={paid_twice} answered_paid_twice={answered_again} "
              f"artifacts_matching={matching}/{DOCUMENTS} tokens_billed={billed_tokens} "
              f"tokens_recorded={recorded_tokens} tokens_of_lost_answers={lost_tokens} "
              f"recoveries={report['recoveries']} budget={budget}", file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
