"""CPU per item of model calls made by the runner's HTTP adapter, against one command per item, in the same run.

    python3 bench/model_calls.py [--items 200] [--parallel 8]

Starts the loopback OpenAI-compatible stand-in (``tests/support/standins/models.py``, no latency) and
``--items`` Markdown files, then drives the same summaries twice, each in a fresh run and a fresh
``drive`` process: through ``effects.http`` (``invoke.save`` keeps each answer; no process per call), and
through ``effects.invoke``, a ``python3 -c`` client per item that posts the payload with urllib and
writes the answer's text itself (``curl`` is not on every machine). Both targets are declared
``"observe": "none"``. It prints, for each form, the CPU seconds (user and system) of ``drive`` and every
process it started, per item, the wall time, and the ratio of the command form's CPU per item to the HTTP
adapter's, measured in the same run on the same machine. Standard library only; everything is made in a
temporary folder and removed.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from runner.contract.text import load_contract  # noqa: E402

RECIPE = os.path.join(ROOT, "templates", "recipes", "model-calls.md")
KEY = "sk-bench"

#: The command form's client: post the payload file, write the answer's text, print the answer (its receipt).
CLIENT = r'''
import json, os, sys, urllib.request
url, payload, key, out = sys.argv[1:5]
with open(payload, "rb") as handle:
    body = handle.read()
request = urllib.request.Request(url, body, {"Content-Type": "application/json", "Authorization": "Bearer " + key})
with urllib.request.urlopen(request, timeout=60) as answer:
    document = json.load(answer)
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out + ".tmp", "w", encoding="utf-8") as handle:
    handle.write(document["choices"][0]["message"]["content"])
    handle.flush()
    os.fsync(handle.fileno())
os.replace(out + ".tmp", out)
print(json.dumps(document))
'''


def children_cpu() -> float:
    """CPU seconds (user and system) of every child process waited for so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def project(folder: str, items: int, effects: Dict[str, Any], url: str) -> str:
    """A project of ``items`` documents whose contract is the recipe's with ``effects`` for its target."""
    os.makedirs(os.path.join(folder, "docs"))
    for n in range(items):
        with open(os.path.join(folder, "docs", f"doc-{n:05d}.md"), "w", encoding="utf-8") as handle:
            handle.write(f"# Document {n}\n\nIts text, a few sentences long, about topic {n % 17}.\n")
    with open(os.path.join(folder, ".model-key"), "w") as handle:
        handle.write(KEY + "\n")
    block = json.loads(json.dumps(load_contract(RECIPE)).replace("https://api.openai.com/v1", url))
    block["effects"] = dict(effects, concurrency=block["effects"]["concurrency"], timeout_seconds=60)
    path = os.path.join(folder, "contract.md")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("```json run-contract\n" + json.dumps(block, indent=1) + "\n```\n")
    return path


def drive(folder: str, contract: str, parallel: int) -> Tuple[float, float]:
    """``init`` then ``drive`` to completion in child processes; the drive's CPU seconds and wall seconds."""
    runner = [sys.executable, "-m", "runner", "--dir", os.path.join(folder, ".run")]
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run(runner + ["init", "--contract", contract], cwd=folder, env=env, check=True, capture_output=True)
    before, began = children_cpu(), time.perf_counter()
    done = subprocess.run(runner + ["drive", "--owner", "bench", "--parallel", str(parallel), "--json"], cwd=folder,
                          env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - began, children_cpu() - before
    if done.returncode != 10:
        raise SystemExit(f"drive exited {done.returncode}: {done.stdout[-2000:]} {done.stderr[-2000:]}")
    return cpu, wall


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=8)
    args = parser.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="bench-model-calls-")
    api = subprocess.Popen([sys.executable, "-m", "tests.support.standins.models", "--port", "0", "--state",
                            os.path.join(tmp, "api"), "--key", KEY, "--exit-with-parent"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert api.stdout is not None
        url = api.stdout.readline().decode().strip()
        if not url:
            raise SystemExit("the model stand-in printed no URL")
        save = {"path": "summaries/{slug}.md", "pointer": "/choices/0/message/content"}
        forms = {
            "http adapter": {"http": {"invoke": {"url": url + "/chat/completions", "save": save,
                                                 "headers": {"Authorization": "Bearer {file:.model-key}"},
                                                 "statuses": {"5xx": "not-applied"}},
                                      "observe": "none"}},
            "command per item": {"invoke": [sys.executable, "-c", CLIENT, url + "/chat/completions", "{payload_file}",
                                            KEY, "summaries/{slug}.md"], "observe": "none"},
        }
        figures: Dict[str, Tuple[float, float]] = {}
        for name, effects in forms.items():
            folder = os.path.join(tmp, name.replace(" ", "-"))
            figures[name] = drive(folder, project(folder, args.items, effects, url), args.parallel)
            saved = len(os.listdir(os.path.join(folder, "summaries")))
            if saved != args.items:
                raise SystemExit(f"{name}: {saved} summaries for {args.items} items")
        print(f"{args.items} items, {args.parallel} in flight, one drive process each; CPU of drive and its children")
        print(f"{'form':<18} {'CPU s':>8} {'CPU ms/item':>12} {'wall s':>8}")
        for name, (cpu, wall) in figures.items():
            print(f"{name:<18} {cpu:>8.2f} {cpu / args.items * 1000:>12.1f} {wall:>8.2f}")
        ratio = figures["command per item"][0] / max(figures["http adapter"][0], 1e-9)
        print(f"command per item / http adapter, CPU per item: {ratio:.1f}x")
    finally:
        api.terminate()
        api.wait(10)
        if api.stdout is not None:
            api.stdout.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
