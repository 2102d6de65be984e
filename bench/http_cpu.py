"""CPU per item of ``drive`` through the HTTP adapter, next to the same contract written as curl commands.

    python3 bench/http_cpu.py [--items 200] [--rounds 2] [--json]

Each round runs two ``drive`` processes, one per form, on a fresh workspace of
``--items`` reports against the loopback helpdesk (``runner/proof/helpdesk.py``,
served from this process, no faults): ``effects.http`` (the calls made in the
``drive`` process) and ``effects.invoke``/``observe`` as two POSIX shell
scripts around ``curl`` (a process per call, as a contract without the HTTP
adapter must). The CPU of a form is the user and system time of its ``drive``
process and every process it waited for (``resource.getrusage`` of the
children, taken around each ``drive``), divided by the items. The forms
alternate within a round so both see the same machine; the ratio is
measured in the same run. The store's fsyncs stay on: both forms pay them alike.
Standard library only (and ``curl``); everything is made in a temporary folder
and removed.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from runner.contract import load_contract  # noqa: E402
from runner.proof.helpdesk import Helpdesk, HelpdeskServer  # noqa: E402

TOKEN = "bench-token-61f0a9"
TEMPLATE = os.path.join(ROOT, "templates", "run-contract.http.example.md")

INVOKE_SH = r'''#!/bin/sh
# invoke.sh URL PAYLOAD_FILE: POST the payload with curl; print the issue (exit 0), or the runner's exit code for the answer.
out=$(mktemp) || exit 75
trap 'rm -f "$out"' EXIT
code=$(curl -sS --noproxy '*' --max-time 20 -o "$out" -w '%{http_code}' -X POST \
  -H "Authorization: Bearer $(cat .helpdesk-token)" -H 'Content-Type: application/json' \
  --data-binary @"$2" "$1/api/issues")
sent=$?
[ "$sent" -eq 7 ] && exit 75
[ "$sent" -eq 0 ] || exit 3
case "$code" in
  2??) cat "$out"; exit 0 ;;
  429|503) exit 75 ;;
  412) exit 9 ;;
  4??) exit 2 ;;
  *) exit 3 ;;
esac
'''

OBSERVE_SH = r'''#!/bin/sh
# observe.sh URL SLUG: look the issue up by external_ref with curl; 0 and the issues found, 1 none, 3 cannot tell.
out=$(mktemp) || exit 3
trap 'rm -f "$out"' EXIT
code=$(curl -sS --noproxy '*' --max-time 20 -o "$out" -w '%{http_code}' \
  -H "Authorization: Bearer $(cat .helpdesk-token)" "$1/api/issues?external_ref=$2") || exit 3
[ "$code" = 200 ] || exit 3
body=$(cat "$out")
[ "$body" = "[]" ] && exit 1
printf '{"issues": %s}\n' "$body"
exit 0
'''


def _workspace(folder: str, url: str, items: int, form: str) -> None:
    os.makedirs(os.path.join(folder, "inbox"))
    for n in range(items):
        with open(os.path.join(folder, "inbox", f"report {n:04d}.md"), "w", encoding="utf-8") as handle:
            handle.write(f"# Report {n}\n\nSomething happened on floor {n % 9}.\n")
    with open(os.path.join(folder, ".helpdesk-token"), "w") as handle:
        handle.write(TOKEN + "\n")
    block = load_contract(TEMPLATE)
    effects = dict(block["effects"], settle_seconds=0)
    http = json.loads(json.dumps(effects.pop("http")).replace("http://127.0.0.1:8765", url))
    if form == "http":
        effects["http"] = http
    else:
        for name, text in (("invoke.sh", INVOKE_SH), ("observe.sh", OBSERVE_SH)):
            with open(os.path.join(folder, name), "w") as handle:
                handle.write(text)
        effects["invoke"] = ["sh", "invoke.sh", url, "{payload_file}"]
        effects["observe"] = ["sh", "observe.sh", url, "{slug}"]
    block["effects"] = effects
    text = "# bench contract\n\n```json run-contract\n" + json.dumps(block, indent=2) + "\n```\n"
    with open(os.path.join(folder, "contract.md"), "w", encoding="utf-8") as handle:
        handle.write(text)


def _runner(folder: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("RUNNER_DIR", None)
    env["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, "-m", "runner", "--dir", os.path.join(folder, ".run"), *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=3600)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _one(tmp: str, desk_url: str, desk: Helpdesk, items: int, form: str, number: int) -> Dict[str, Any]:
    folder = os.path.join(tmp, f"{form}-{number}")
    _workspace(folder, desk_url, items, form)
    done = _runner(folder, "init", "--contract", "contract.md")
    if done.returncode != 0:
        raise SystemExit(f"init failed: {done.stderr}")
    before_issues = sum(desk.by_ref().values())
    cpu, wall = _cpu(), time.perf_counter()
    done = _runner(folder, "drive", "--owner", "bench", "--json")
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    if done.returncode != 10:
        raise SystemExit(f"drive ({form}) exited {done.returncode}: {done.stderr[-2000:]}")
    made = sum(desk.by_ref().values()) - before_issues
    if made != items:
        raise SystemExit(f"drive ({form}) made {made} issues for {items} items")
    shutil.rmtree(folder, ignore_errors=True)
    return {"form": form, "cpu_ms_per_item": 1000 * cpu / items, "wall_ms_per_item": 1000 * wall / items}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if shutil.which("curl") is None or shutil.which("sh") is None:
        raise SystemExit("this benchmark needs curl and sh for the command form")
    desk = Helpdesk(TOKEN)
    tmp = tempfile.mkdtemp(prefix="runner-bench-http-")
    rows: List[Dict[str, Any]] = []
    try:
        with HelpdeskServer(desk) as served:
            for number in range(args.rounds):
                for form in (("http", "curl") if number % 2 == 0 else ("curl", "http")):
                    rows.append(_one(tmp, served.url, desk, args.items, form, number))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    figures: Dict[str, Any] = {"items": args.items, "rounds": args.rounds}
    for form in ("http", "curl"):
        mine = [r for r in rows if r["form"] == form]
        figures[f"{form}_cpu_ms_per_item"] = round(statistics.median(r["cpu_ms_per_item"] for r in mine), 2)
        figures[f"{form}_wall_ms_per_item"] = round(statistics.median(r["wall_ms_per_item"] for r in mine), 2)
    figures["cpu_ratio_curl_over_http"] = round(figures["curl_cpu_ms_per_item"] / figures["http_cpu_ms_per_item"], 2)
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    else:
        print(f"{'form':<8}{'CPU ms/item':>14}{'wall ms/item':>14}")
        for form in ("http", "curl"):
            print(f"{form:<8}{figures[form + '_cpu_ms_per_item']:>14.2f}{figures[form + '_wall_ms_per_item']:>14.2f}")
        print(f"curl / http CPU: {figures['cpu_ratio_curl_over_http']:.2f} ({args.items} items, {args.rounds} rounds, medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
